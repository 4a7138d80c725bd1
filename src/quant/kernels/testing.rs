//! Helpers for the layouts' tests: owned members, encoders written from the formats'
//! definitions (independent of the kernels), and a reference packer that places one bit at a
//! time.

#![expect(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    reason = "fixtures of small, known sizes and values"
)]

use super::{Dequantize, Packing, Stored};
use crate::format::Dtype;

/// A member owned by a test.
#[derive(Clone, Debug)]
pub struct Owned {
    pub bytes: Vec<u8>,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
}

impl Owned {
    pub fn new(dtype: Dtype, shape: &[usize], bytes: Vec<u8>) -> Owned {
        Owned {
            bytes,
            dtype,
            shape: shape.iter().map(|&d| d as u64).collect(),
        }
    }

    pub fn stored(&self) -> Stored<'_> {
        Stored {
            bytes: &self.bytes,
            dtype: self.dtype,
            shape: &self.shape,
        }
    }

    pub fn f32(shape: &[usize], values: &[f32]) -> Owned {
        Owned::new(
            Dtype::F32,
            shape,
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
    }

    /// `values` rounded to BF16 (by the `half` crate).
    pub fn bf16(shape: &[usize], values: &[f32]) -> Owned {
        let bytes = values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect();
        Owned::new(Dtype::Bf16, shape, bytes)
    }

    pub fn f16(shape: &[usize], values: &[f32]) -> Owned {
        let bytes = values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect();
        Owned::new(Dtype::F16, shape, bytes)
    }

    pub fn i32(shape: &[usize], values: &[i32]) -> Owned {
        Owned::new(
            Dtype::I32,
            shape,
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
    }

    pub fn i8(shape: &[usize], values: &[i8]) -> Owned {
        Owned::new(
            Dtype::I8,
            shape,
            values.iter().map(|&v| v.cast_unsigned()).collect(),
        )
    }

    /// Scale values as stored in `dtype` (F32, BF16 or F16).
    pub fn floats(dtype: Dtype, shape: &[usize], values: &[f32]) -> Owned {
        match dtype {
            Dtype::F32 => Owned::f32(shape, values),
            Dtype::Bf16 => Owned::bf16(shape, values),
            _ => Owned::f16(shape, values),
        }
    }

    /// Element `index` of an F32, BF16 or F16 member, as stored.
    pub fn float(&self, index: usize) -> f32 {
        let b = &self.bytes;
        match self.dtype {
            Dtype::F32 => f32::from_le_bytes(b[4 * index..4 * index + 4].try_into().unwrap()),
            Dtype::Bf16 => half::bf16::from_le_bytes([b[2 * index], b[2 * index + 1]]).to_f32(),
            _ => half::f16::from_le_bytes([b[2 * index], b[2 * index + 1]]).to_f32(),
        }
    }
}

/// A fixed pseudo-random sequence (xorshift).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in `[-1, 1)`.
    pub fn signed(&mut self) -> f32 {
        (self.below(1 << 24) as f32 / (1 << 23) as f32) - 1.0
    }

    pub fn codes(&mut self, bits: u32, count: usize) -> Vec<u8> {
        (0..count).map(|_| self.below(1 << bits) as u8).collect()
    }
}

/// Packs `codes` into 32-bit little-endian words one bit at a time.
pub fn pack(packing: Packing, bits: u32, codes: &[u8]) -> Vec<u32> {
    let mut words = vec![0u32; packing.words(bits, codes.len())];
    let per = 32 / bits as usize;
    for (i, &code) in codes.iter().enumerate() {
        for bit in 0..bits as usize {
            if code >> bit & 1 == 1 {
                let position = match packing {
                    Packing::Dense => i * bits as usize + bit,
                    Packing::PerWord => (i / per) * 32 + (i % per) * bits as usize + bit,
                };
                words[position / 32] |= 1 << (position % 32);
            }
        }
    }
    words
}

pub fn word_bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// A minifloat decoded from its definition, in `f64` (no NaN handling).
pub fn minifloat(code: u32, exponent_bits: u32, mantissa_bits: u32, bias: i32) -> f64 {
    let mantissa = f64::from(code & ((1 << mantissa_bits) - 1));
    let exponent = ((code >> mantissa_bits) & ((1 << exponent_bits) - 1)) as i32;
    let sign = if code >> (exponent_bits + mantissa_bits) & 1 == 1 {
        -1.0
    } else {
        1.0
    };
    let scale = f64::from(1u32 << mantissa_bits);
    if exponent == 0 {
        sign * mantissa / scale * 2f64.powi(1 - bias)
    } else {
        sign * (1.0 + mantissa / scale) * 2f64.powi(exponent - bias)
    }
}

/// E4M3 from its definition, NaN for `S.1111.111`.
pub fn e4m3_value(code: u8) -> f32 {
    if code & 0x7f == 0x7f {
        f32::NAN
    } else {
        minifloat(u32::from(code), 4, 3, 7) as f32
    }
}

/// The E4M3 code nearest `x` (ties to the even code), saturating at ±448, as torch's cast
/// after the producers' clamp.
pub fn e4m3_encode(x: f32) -> u8 {
    nearest(x, (0..=255u8).filter(|c| c & 0x7f != 0x7f), e4m3_value)
}

/// E2M1 from its definition.
pub fn e2m1_value(code: u8) -> f32 {
    minifloat(u32::from(code & 15), 2, 1, 1) as f32
}

/// The E2M1 code nearest `x` (ties to even).
pub fn e2m1_encode(x: f32) -> u8 {
    nearest(x, 0..16u8, e2m1_value)
}

fn nearest(x: f32, codes: impl Iterator<Item = u8>, value: impl Fn(u8) -> f32) -> u8 {
    let mut best = (f64::INFINITY, 0u8);
    for code in codes {
        let v = value(code);
        if v == 0.0 && v.is_sign_negative() != x.is_sign_negative() {
            continue;
        }
        let distance = (f64::from(v) - f64::from(x)).abs();
        if distance < best.0 || (distance == best.0 && code & 1 == 0) {
            best = (distance, code);
        }
    }
    best.1
}

/// `2^(code − 127)` (E8M0).
pub fn e8m0_value(code: u8) -> f32 {
    if code == 255 {
        f32::NAN
    } else {
        2f64.powi(i32::from(code) - 127) as f32
    }
}

pub fn round_bf16(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

pub fn round_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// Rounds to the 16-bit type `dtype` names (no rounding for F32).
pub fn round_to(dtype: Dtype, x: f32) -> f32 {
    match dtype {
        Dtype::Bf16 => round_bf16(x),
        Dtype::F16 => round_f16(x),
        _ => x,
    }
}

/// Every row, read in two blocks (so a range not starting at 0 is exercised).
pub fn dequantize_all(kernel: &dyn Dequantize) -> Vec<f32> {
    let (rows, cols) = (kernel.rows(), kernel.cols());
    let mut out = vec![f32::NAN; rows * cols];
    let split = rows / 2;
    kernel.dequantize_rows(0..split, &mut out[..split * cols]);
    kernel.dequantize_rows(split..rows, &mut out[split * cols..]);
    out
}

/// Bit-for-bit equality (NaN equal to NaN), naming the first element that differs.
pub fn assert_same(actual: &[f32], expected: &[f32], cols: usize) {
    assert_eq!(actual.len(), expected.len(), "lengths");
    for (k, (a, e)) in actual.iter().zip(expected).enumerate() {
        let same = a.to_bits() == e.to_bits() || (a.is_nan() && e.is_nan());
        assert!(
            same,
            "element [{}, {}]: {a:e} ({:#x}), expected {e:e} ({:#x})",
            k / cols.max(1),
            k % cols.max(1),
            a.to_bits(),
            e.to_bits()
        );
    }
}
