//! Small float codes and stored parameters decoded to `f32`, exactly.
//!
//! The element decoders are branch-free bit arithmetic (no table), so the row loops that call
//! them vectorize: an E4M3 or E2M1 code's exponent and mantissa bits are placed where an `f32`'s
//! go and the result multiplied by the power of two that moves the exponent bias; subnormal codes
//! land on `f32` subnormals, which the multiplication makes normal. Every step is exact.

#![expect(
    clippy::inline_always,
    reason = "the decoders must be inlined into the row loops compiled for each instruction set"
)]

use crate::format::Dtype;

/// `2^120`: the E4M3 bias (7) moved to the `f32` bias (127).
const E4M3_REBIAS: f32 = f32::from_bits((127 + 120) << 23);
/// `2^126`: the E2M1 bias (1) moved to the `f32` bias (127).
const E2M1_REBIAS: f32 = f32::from_bits((127 + 126) << 23);

/// OCP E4M3 (the `float8_e4m3fn` of torch): no infinities, `S.1111.111` is NaN.
#[inline(always)]
pub fn e4m3(code: u8) -> f32 {
    let code = u32::from(code);
    let magnitude = f32::from_bits((code & 0x7f) << 20) * E4M3_REBIAS;
    let value = f32::from_bits(magnitude.to_bits() | (code & 0x80) << 24);
    if code & 0x7f == 0x7f { f32::NAN } else { value }
}

/// OCP E5M2: IEEE-like, with infinities and NaNs.
#[inline(always)]
pub fn e5m2(code: u8) -> f32 {
    // E5M2 is the top byte of an F16.
    half::f16::from_bits(u16::from(code) << 8).to_f32()
}

/// OCP E2M1 (FP4) in the low four bits of `code`: sign, two exponent bits, one mantissa bit.
#[inline(always)]
pub fn e2m1(code: u8) -> f32 {
    let code = u32::from(code);
    let magnitude = f32::from_bits((code & 7) << 22) * E2M1_REBIAS;
    f32::from_bits(magnitude.to_bits() | (code & 8) << 28)
}

/// E8M0 (the MX block scale): `2^(code − 127)`, `0xFF` is NaN.
#[inline(always)]
pub fn e8m0(code: u8) -> f32 {
    match code {
        0 => f32::from_bits(1 << 22),
        0xff => f32::NAN,
        _ => f32::from_bits(u32::from(code) << 23),
    }
}

/// E8M0 as comfy-kitchen's `e8m0_to_f32` reads it: the code put in an `f32`'s exponent bits, so
/// 0 is 0.0 (not `2^−127`) and `0xFF` is +∞ (not NaN).
#[inline(always)]
pub fn e8m0_exponent(code: u8) -> f32 {
    f32::from_bits(u32::from(code) << 23)
}

/// A float parameter member (scales, biases, float zero points): its bytes and how to read them.
#[derive(Clone, Copy, Debug)]
pub struct Floats<'a> {
    bytes: &'a [u8],
    kind: FloatKind,
}

/// The stored encodings a parameter member may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloatKind {
    F32,
    Bf16,
    F16,
    E4M3,
    E8M0,
    /// E8M0 read by [`e8m0_exponent`] (`ComfyUI`'s MXFP8).
    E8M0Exponent,
    I8,
    I32,
}

impl FloatKind {
    /// The encoding of a member stored as `dtype`, integer dtypes only where `integers` allows
    /// them. (Layouts whose E8M0 scales are stored as U8 say so themselves.)
    pub fn of(dtype: Dtype, integers: bool) -> Option<FloatKind> {
        Some(match dtype {
            Dtype::F32 => FloatKind::F32,
            Dtype::Bf16 => FloatKind::Bf16,
            Dtype::F16 => FloatKind::F16,
            Dtype::F8E4M3 => FloatKind::E4M3,
            Dtype::F8E8M0 => FloatKind::E8M0,
            Dtype::I8 if integers => FloatKind::I8,
            Dtype::I32 if integers => FloatKind::I32,
            _ => return None,
        })
    }
}

impl<'a> Floats<'a> {
    pub fn new(bytes: &'a [u8], kind: FloatKind) -> Self {
        Floats { bytes, kind }
    }

    /// Element `index`, as `f32` (every kind here is exact in `f32` but large `I32` values).
    #[inline]
    pub fn get(&self, index: usize) -> f32 {
        let b = self.bytes;
        match self.kind {
            FloatKind::F32 => {
                let at = index * 4;
                f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
            }
            FloatKind::Bf16 => {
                let at = index * 2;
                f32::from_bits(u32::from(u16::from_le_bytes([b[at], b[at + 1]])) << 16)
            }
            FloatKind::F16 => {
                let at = index * 2;
                half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
            }
            FloatKind::E4M3 => e4m3(b[index]),
            FloatKind::E8M0 => e8m0(b[index]),
            FloatKind::E8M0Exponent => e8m0_exponent(b[index]),
            FloatKind::I8 => f32::from(b[index].cast_signed()),
            FloatKind::I32 => {
                let at = index * 4;
                #[expect(clippy::cast_precision_loss, reason = "zero points are small integers")]
                let value = i32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as f32;
                value
            }
        }
    }
}

impl Floats<'_> {
    /// Whether `test` holds for every element, in one pass over the bytes.
    pub fn all(&self, test: impl Fn(f32) -> bool) -> bool {
        self.visit_from(0, test)
    }

    /// Elements `start..start + out.len()`, each as [`Floats::get`] gives it, the kind matched
    /// once.
    pub fn get_into(&self, start: usize, out: &mut [f32]) {
        let mut slots = out.iter_mut();
        self.visit_from(start, |value| {
            slots.next().map(|slot| *slot = value).is_some()
        });
    }

    /// Hands `visit` each element from `start` in order, the kind matched once, until it says
    /// to stop; whether it never did.
    fn visit_from(&self, start: usize, mut visit: impl FnMut(f32) -> bool) -> bool {
        let b = self.bytes;
        match self.kind {
            FloatKind::F32 => b[start * 4..]
                .chunks_exact(4)
                .all(|x| visit(f32::from_le_bytes([x[0], x[1], x[2], x[3]]))),
            FloatKind::Bf16 => b[start * 2..].chunks_exact(2).all(|x| {
                visit(f32::from_bits(
                    u32::from(u16::from_le_bytes([x[0], x[1]])) << 16,
                ))
            }),
            _ => (start..self.len()).all(|i| visit(self.get(i))),
        }
    }

    /// Elements stored.
    fn len(&self) -> usize {
        match self.kind {
            FloatKind::F32 | FloatKind::I32 => self.bytes.len() / 4,
            FloatKind::Bf16 | FloatKind::F16 => self.bytes.len() / 2,
            FloatKind::E4M3 | FloatKind::E8M0 | FloatKind::E8M0Exponent | FloatKind::I8 => {
                self.bytes.len()
            }
        }
    }
}

/// The 32-bit little-endian word `index` of `bytes`, zero past the end (a partial last word).
#[inline]
pub fn word(bytes: &[u8], index: usize) -> u32 {
    let at = index * 4;
    if let Some(w) = bytes.get(at..at + 4) {
        return u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
    }
    let mut w = [0u8; 4];
    if let Some(rest) = bytes.get(at..) {
        w[..rest.len()].copy_from_slice(rest);
    }
    u32::from_le_bytes(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minifloat decoded from its definition, in `f64`.
    fn reference(code: u32, exponent_bits: u32, mantissa_bits: u32, bias: i32) -> f64 {
        let mantissa = f64::from(code & ((1 << mantissa_bits) - 1));
        let exponent = i32::try_from((code >> mantissa_bits) & ((1 << exponent_bits) - 1)).unwrap();
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

    #[test]
    fn every_e4m3_code_decodes_to_its_definition() {
        for code in 0..=255u8 {
            let value = e4m3(code);
            if code & 0x7f == 0x7f {
                assert!(value.is_nan());
            } else {
                let expected = reference(u32::from(code), 4, 3, 7);
                assert_eq!(f64::from(value), expected, "code {code:#x}");
                assert_eq!(value.is_sign_negative(), code & 0x80 != 0);
            }
        }
        assert_eq!(e4m3(0x7e), 448.0);
        assert_eq!(e4m3(0x01), 2f32.powi(-9));
    }

    #[test]
    fn every_e2m1_e5m2_and_e8m0_code_decodes_to_its_definition() {
        let table = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for code in 0..16u8 {
            let magnitude = table[usize::from(code & 7)];
            let expected = if code & 8 == 0 { magnitude } else { -magnitude };
            assert_eq!(e2m1(code), expected);
            assert_eq!(e2m1(code).is_sign_negative(), code & 8 != 0);
        }
        for code in 0..=255u8 {
            let value = e5m2(code);
            match code & 0x7f {
                0x7c => assert!(value.is_infinite()),
                0x7d..=0x7f => assert!(value.is_nan()),
                _ => assert_eq!(f64::from(value), reference(u32::from(code), 5, 2, 15)),
            }
            let scale = e8m0(code);
            let exponent = e8m0_exponent(code);
            match code {
                0xff => {
                    assert!(scale.is_nan());
                    assert_eq!(exponent, f32::INFINITY);
                }
                0 => {
                    assert_eq!(f64::from(scale), 2f64.powi(-127));
                    assert_eq!(exponent.to_bits(), 0);
                }
                _ => {
                    assert_eq!(f64::from(scale), 2f64.powi(i32::from(code) - 127));
                    assert_eq!(exponent, scale);
                }
            }
        }
    }

    #[test]
    fn parameters_read_every_encoding() {
        let f32s = [1.5f32, -2.25].map(f32::to_le_bytes).concat();
        assert_eq!(Floats::new(&f32s, FloatKind::F32).get(1), -2.25);
        let bf16s = [half::bf16::from_f32(0.375)]
            .map(half::bf16::to_le_bytes)
            .concat();
        assert_eq!(Floats::new(&bf16s, FloatKind::Bf16).get(0), 0.375);
        let f16s = [half::f16::from_f32(-0.1)]
            .map(half::f16::to_le_bytes)
            .concat();
        assert_eq!(
            Floats::new(&f16s, FloatKind::F16).get(0),
            half::f16::from_f32(-0.1).to_f32()
        );
        assert_eq!(Floats::new(&[0xf8], FloatKind::I8).get(0), -8.0);
        assert_eq!(
            Floats::new(&(-300i32).to_le_bytes(), FloatKind::I32).get(0),
            -300.0
        );
        assert_eq!(Floats::new(&[130], FloatKind::E8M0).get(0), 8.0);
        assert_eq!(word(&[1, 2, 3], 0), 0x0003_0201);
        assert_eq!(word(&[1, 2, 3], 1), 0);
    }
}
