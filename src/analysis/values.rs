//! Turning a tensor's bytes into numbers, for every dtype of the format.
//!
//! Values are handed on in blocks of `f32` (every dtype whose values `f32` holds exactly) or
//! `f64` (F64, 32- and 64-bit integers, C64 magnitudes). F32 and F64 data are used in place;
//! every other dtype is widened a block at a time into a small reused buffer (BF16 by a shift),
//! never into a copy of the tensor.
//!
//! Encodings: the F8 types follow the OCP 8-bit float and AMD FNUZ definitions (E4M3 has no
//! infinity and one NaN pattern per sign; the FNUZ types have no infinity, no negative zero and
//! `0x80` as their only NaN; E5M2 is IEEE-like; E8M0 is `2^(e-127)` with `0xFF` as NaN). F4 is
//! OCP MX E2M1 and F6 is OCP MX E2M3 or E3M2, none with infinities or NaN. The format does not
//! define how sub-byte values are packed; stui reads F4 as two values per byte, the first in the
//! low nibble (as torch's `float4_e2m1fn_x2`), and F6 as four values per three bytes, value `i`
//! in bits `6i..6i+6` of the bytes read as a little-endian 24-bit number. BOOL counts every
//! nonzero byte as 1. C64 is reduced to each element's magnitude.

use super::moments::BLOCK;
use super::simd::Lanes;
use crate::format::Dtype;
use half::slice::HalfFloatSliceExt;
use std::sync::OnceLock;

/// Receives values block by block.
pub trait Sink {
    fn f32s(&mut self, values: &[f32]);
    fn f64s(&mut self, values: &[f64]);

    /// BF16 or F16 elements as stored; widened to `f32` a block at a time unless the sink
    /// reads them itself.
    fn halves(&mut self, lanes: Lanes, bytes: &[u8])
    where
        Self: Sized,
    {
        let mut block = [0f32; BLOCK];
        for chunk in bytes.chunks(lanes.size() * BLOCK) {
            let values = &mut block[..chunk.len() / lanes.size()];
            widen(lanes, chunk, values);
            self.f32s(values);
        }
    }
}

/// Decodes the elements in `bytes` into `values` (one per element).
pub fn widen(lanes: Lanes, bytes: &[u8], values: &mut [f32]) {
    match (lanes, cast::<half::f16>(bytes)) {
        (Lanes::F16, Some(halves)) => halves.convert_to_f32_slice(values),
        (Lanes::F16, None) => {
            for (value, element) in values.iter_mut().zip(bytes.chunks_exact(2)) {
                *value = half::f16::from_le_bytes([element[0], element[1]]).to_f32();
            }
        }
        (Lanes::Bf16, _) => match cast::<u16>(bytes) {
            Some(halves) => {
                for (value, &bits) in values.iter_mut().zip(halves) {
                    *value = f32::from_bits(u32::from(bits) << 16);
                }
            }
            None => {
                for (value, element) in values.iter_mut().zip(bytes.chunks_exact(2)) {
                    let bits = u16::from_le_bytes([element[0], element[1]]);
                    *value = f32::from_bits(u32::from(bits) << 16);
                }
            }
        },
        (Lanes::F32, _) => {
            for (value, element) in values.iter_mut().zip(bytes.chunks_exact(4)) {
                *value = f32::from_le_bytes(array(element));
            }
        }
    }
}

/// Feeds the values held in `bytes` (whole elements of `dtype`; for F4 whole bytes, for F6 whole
/// groups of three bytes) to `sink`.
pub fn feed(dtype: Dtype, bytes: &[u8], sink: &mut impl Sink) {
    match dtype {
        Dtype::F32 => match cast::<f32>(bytes) {
            Some(values) => sink.f32s(values),
            None => widen_f32(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                sink,
            ),
        },
        Dtype::F64 => match cast::<f64>(bytes) {
            Some(values) => sink.f64s(values),
            None => widen_f64(
                bytes.chunks_exact(8).map(|b| f64::from_le_bytes(array(b))),
                sink,
            ),
        },
        Dtype::Bf16 => sink.halves(Lanes::Bf16, bytes),
        Dtype::F16 => sink.halves(Lanes::F16, bytes),
        Dtype::I16 => widen_f32_from(bytes, |b: [u8; 2]| f32::from(i16::from_le_bytes(b)), sink),
        Dtype::U16 => widen_f32_from(bytes, |b: [u8; 2]| f32::from(u16::from_le_bytes(b)), sink),
        Dtype::I32 => widen_f64(
            bytes
                .chunks_exact(4)
                .map(|b| f64::from(i32::from_le_bytes(array(b)))),
            sink,
        ),
        Dtype::U32 => widen_f64(
            bytes
                .chunks_exact(4)
                .map(|b| f64::from(u32::from_le_bytes(array(b)))),
            sink,
        ),
        #[expect(
            clippy::cast_precision_loss,
            reason = "64-bit integers are shown as the nearest f64"
        )]
        Dtype::I64 => widen_f64(
            bytes
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(array(b)) as f64),
            sink,
        ),
        #[expect(
            clippy::cast_precision_loss,
            reason = "64-bit integers are shown as the nearest f64"
        )]
        Dtype::U64 => widen_f64(
            bytes
                .chunks_exact(8)
                .map(|b| u64::from_le_bytes(array(b)) as f64),
            sink,
        ),
        Dtype::C64 => widen_f64(
            bytes.chunks_exact(8).map(|b| {
                let re = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                let im = f32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                f64::from(re).hypot(f64::from(im))
            }),
            sink,
        ),
        Dtype::F4
        | Dtype::F6E2M3
        | Dtype::F6E3M2
        | Dtype::Bool
        | Dtype::U8
        | Dtype::I8
        | Dtype::F8E5M2
        | Dtype::F8E4M3
        | Dtype::F8E8M0
        | Dtype::F8E4M3Fnuz
        | Dtype::F8E5M2Fnuz => feed_small(dtype, bytes, sink),
    }
}

/// Feeds the dtypes of a byte or less per element, through lookup tables.
fn feed_small(dtype: Dtype, bytes: &[u8], sink: &mut impl Sink) {
    match dtype {
        Dtype::F4 => {
            let table = f4_table();
            widen_f32(
                bytes
                    .iter()
                    .flat_map(|&b| [table[usize::from(b & 0xf)], table[usize::from(b >> 4)]]),
                sink,
            );
        }
        Dtype::F6E2M3 | Dtype::F6E3M2 => {
            let table = f6_table(dtype);
            widen_f32(
                bytes.chunks_exact(3).flat_map(|b| {
                    let word = u32::from(b[0]) | u32::from(b[1]) << 8 | u32::from(b[2]) << 16;
                    [0, 6, 12, 18].map(|shift| table[((word >> shift) & 0x3f) as usize])
                }),
                sink,
            );
        }
        _ => {
            let table = byte_table(dtype);
            widen_f32(bytes.iter().map(|&b| table[usize::from(b)]), sink);
        }
    }
}

/// The value of one element, for tests and single lookups.
pub fn element(dtype: Dtype, bytes: &[u8], index: usize) -> Option<f64> {
    struct First(Option<f64>, usize);
    impl Sink for First {
        fn f32s(&mut self, values: &[f32]) {
            self.f64s(&values.iter().map(|&v| f64::from(v)).collect::<Vec<_>>());
        }
        fn f64s(&mut self, values: &[f64]) {
            if self.0.is_none() && self.1 < values.len() {
                self.0 = Some(values[self.1]);
            }
            self.1 = self.1.saturating_sub(values.len());
        }
    }
    let mut first = First(None, index);
    feed(dtype, bytes, &mut first);
    first.0
}

/// `bytes` as a slice of `T`, when it is aligned for `T` (and the machine is little-endian).
fn cast<T: bytemuck::Pod>(bytes: &[u8]) -> Option<&[T]> {
    if cfg!(target_endian = "little") {
        bytemuck::try_cast_slice(bytes).ok()
    } else {
        None
    }
}

fn array<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut array = [0u8; N];
    array.copy_from_slice(&bytes[..N]);
    array
}

/// Decodes fixed-size elements a block at a time, in a loop simple enough to vectorize.
fn widen_f32_from<const N: usize>(
    bytes: &[u8],
    decode: impl Fn([u8; N]) -> f32,
    sink: &mut impl Sink,
) {
    let mut block = [0f32; BLOCK];
    for chunk in bytes.chunks(N * BLOCK) {
        let count = chunk.len() / N;
        for (slot, element) in block.iter_mut().zip(chunk.chunks_exact(N)) {
            *slot = decode(array(element));
        }
        sink.f32s(&block[..count]);
    }
}

fn widen_f32(values: impl Iterator<Item = f32>, sink: &mut impl Sink) {
    let mut block = [0f32; BLOCK];
    let mut filled = 0;
    for value in values {
        block[filled] = value;
        filled += 1;
        if filled == BLOCK {
            sink.f32s(&block);
            filled = 0;
        }
    }
    if filled > 0 {
        sink.f32s(&block[..filled]);
    }
}

fn widen_f64(values: impl Iterator<Item = f64>, sink: &mut impl Sink) {
    let mut block = [0f64; BLOCK / 2];
    let mut filled = 0;
    for value in values {
        block[filled] = value;
        filled += 1;
        if filled == block.len() {
            sink.f64s(&block);
            filled = 0;
        }
    }
    if filled > 0 {
        sink.f64s(&block[..filled]);
    }
}

/// A small float format: sign bit, `exponent_bits`, `mantissa_bits`, with subnormals; `code`
/// holds the bits.
fn minifloat(code: u32, exponent_bits: u32, mantissa_bits: u32, bias: i32) -> f32 {
    let mantissa = code & ((1 << mantissa_bits) - 1);
    let exponent = (code >> mantissa_bits) & ((1 << exponent_bits) - 1);
    let negative = code >> (exponent_bits + mantissa_bits) & 1 == 1;
    let fraction = mantissa as f32 / (1u32 << mantissa_bits) as f32;
    let exponent = i32::try_from(exponent).unwrap_or(0);
    let magnitude = if exponent == 0 {
        fraction * 2f32.powi(1 - bias)
    } else {
        (1.0 + fraction) * 2f32.powi(exponent - bias)
    };
    if negative { -magnitude } else { magnitude }
}

fn byte_table(dtype: Dtype) -> &'static [f32; 256] {
    static TABLES: [OnceLock<[f32; 256]>; 8] = [const { OnceLock::new() }; 8];
    let (slot, decode): (usize, fn(u8) -> f32) = match dtype {
        Dtype::Bool => (0, |b| f32::from(u8::from(b != 0))),
        Dtype::U8 => (1, f32::from),
        Dtype::I8 => (2, |b| f32::from(b.cast_signed())),
        Dtype::F8E5M2 => (3, |b| match b & 0x7f {
            0x7c => {
                if b & 0x80 == 0 {
                    f32::INFINITY
                } else {
                    f32::NEG_INFINITY
                }
            }
            0x7d..=0x7f => f32::NAN,
            _ => minifloat(u32::from(b), 5, 2, 15),
        }),
        Dtype::F8E4M3 => (4, |b| {
            if b & 0x7f == 0x7f {
                f32::NAN
            } else {
                minifloat(u32::from(b), 4, 3, 7)
            }
        }),
        Dtype::F8E8M0 => (5, |b| {
            if b == 0xff {
                f32::NAN
            } else {
                2f32.powi(i32::from(b) - 127)
            }
        }),
        Dtype::F8E4M3Fnuz => (6, |b| {
            if b == 0x80 {
                f32::NAN
            } else {
                minifloat(u32::from(b), 4, 3, 8)
            }
        }),
        _ => (7, |b| {
            if b == 0x80 {
                f32::NAN
            } else {
                minifloat(u32::from(b), 5, 2, 16)
            }
        }),
    };
    TABLES[slot].get_or_init(|| std::array::from_fn(|b| decode(u8::try_from(b).unwrap_or(0))))
}

fn f4_table() -> &'static [f32; 16] {
    static TABLE: OnceLock<[f32; 16]> = OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|b| minifloat(u32::try_from(b).unwrap_or(0), 2, 1, 1)))
}

fn f6_table(dtype: Dtype) -> &'static [f32; 64] {
    static E2M3: OnceLock<[f32; 64]> = OnceLock::new();
    static E3M2: OnceLock<[f32; 64]> = OnceLock::new();
    let bits = |b: usize| u32::try_from(b).unwrap_or(0);
    if dtype == Dtype::F6E2M3 {
        E2M3.get_or_init(|| std::array::from_fn(|b| minifloat(bits(b), 2, 3, 1)))
    } else {
        E3M2.get_or_init(|| std::array::from_fn(|b| minifloat(bits(b), 3, 2, 3)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(dtype: Dtype, bytes: &[u8]) -> f64 {
        element(dtype, bytes, 0).unwrap()
    }

    #[test]
    fn eight_bit_floats_follow_their_definitions() {
        assert_eq!(one(Dtype::F8E4M3, &[0x7e]), 448.0);
        assert!(one(Dtype::F8E4M3, &[0xff]).is_nan());
        assert_eq!(one(Dtype::F8E4M3, &[0x01]), 2f64.powi(-9));
        assert_eq!(one(Dtype::F8E5M2, &[0x7b]), 57344.0);
        assert_eq!(one(Dtype::F8E5M2, &[0xfc]), f64::NEG_INFINITY);
        assert!(one(Dtype::F8E5M2, &[0x7e]).is_nan());
        assert_eq!(one(Dtype::F8E4M3Fnuz, &[0x7f]), 240.0);
        assert!(one(Dtype::F8E4M3Fnuz, &[0x80]).is_nan());
        assert_eq!(one(Dtype::F8E5M2Fnuz, &[0x7f]), 57344.0);
        assert_eq!(one(Dtype::F8E8M0, &[127]), 1.0);
        assert_eq!(one(Dtype::F8E8M0, &[0]), 2f64.powi(-127));
        assert!(one(Dtype::F8E8M0, &[0xff]).is_nan());
    }

    #[test]
    fn sub_byte_floats_unpack_low_bits_first() {
        // F4 E2M1: 0x7 = 6.0 in the low nibble, 0x9 = -0.5 in the high one.
        assert_eq!(element(Dtype::F4, &[0x97], 0), Some(6.0));
        assert_eq!(element(Dtype::F4, &[0x97], 1), Some(-0.5));
        // F6 E2M3: 0x1f = 7.5 (max), F6 E3M2: 0x1f = 28.0 (max), in value 0 and value 3.
        assert_eq!(element(Dtype::F6E2M3, &[0x1f, 0, 0], 0), Some(7.5));
        assert_eq!(element(Dtype::F6E3M2, &[0, 0, 0x1f << 2], 3), Some(28.0));
        assert_eq!(element(Dtype::F6E3M2, &[0x01, 0, 0], 0), Some(0.0625));
    }

    #[test]
    fn integers_bools_and_complex_numbers() {
        assert_eq!(one(Dtype::I8, &[0xff]), -1.0);
        assert_eq!(one(Dtype::Bool, &[7]), 1.0);
        assert_eq!(one(Dtype::I16, &(-300i16).to_le_bytes()), -300.0);
        assert_eq!(
            one(Dtype::U64, &u64::MAX.to_le_bytes()),
            18_446_744_073_709_551_615.0
        );
        let mut c64 = 3f32.to_le_bytes().to_vec();
        c64.extend_from_slice(&(-4f32).to_le_bytes());
        assert_eq!(one(Dtype::C64, &c64), 5.0);
        assert_eq!(one(Dtype::Bf16, &[0x80, 0x3f]), 1.0);
        assert_eq!(one(Dtype::F16, &[0x00, 0x3c]), 1.0);
    }
}
