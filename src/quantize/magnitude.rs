//! The largest magnitude of stored floats read from their bits, without decoding them: for IEEE
//! formats the magnitude's bits (sign cleared) order as the magnitudes do, and NaN and Inf have
//! the largest bits of all, so one integer maximum gives both the largest magnitude and whether
//! every value is finite. BF16 widened to `f32` in lanes for the kernels that want values.

use crate::format::Dtype;
use multiversion::multiversion;

/// Elements compared side by side, so that the loops vectorize.
const LANES: usize = 16;

/// A float dtype whose magnitudes can be read from their bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bits {
    F32,
    Bf16,
    F16,
}

impl Bits {
    pub fn of(dtype: Dtype) -> Option<Bits> {
        match dtype {
            Dtype::F32 => Some(Bits::F32),
            Dtype::Bf16 => Some(Bits::Bf16),
            Dtype::F16 => Some(Bits::F16),
            _ => None,
        }
    }

    /// Bytes of one element.
    pub const fn size(self) -> usize {
        match self {
            Bits::F32 => 4,
            Bits::Bf16 | Bits::F16 => 2,
        }
    }

    /// The bits of the smallest non-finite magnitude (Inf).
    const fn infinity(self) -> u32 {
        match self {
            Bits::F32 => 0x7F80_0000,
            Bits::Bf16 => 0x7F80,
            Bits::F16 => 0x7C00,
        }
    }

    /// The largest magnitude of the little-endian elements in `bytes`: its bits, sign cleared.
    pub fn largest_bits(self, bytes: &[u8]) -> u32 {
        match self {
            Bits::F32 => match bytemuck::try_cast_slice::<u8, u32>(bytes) {
                Ok(words) if cfg!(target_endian = "little") => largest_word(words),
                _ => bytes
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) & 0x7FFF_FFFF)
                    .max()
                    .unwrap_or(0),
            },
            Bits::Bf16 | Bits::F16 => match bytemuck::try_cast_slice::<u8, u16>(bytes) {
                Ok(halves) if cfg!(target_endian = "little") => u32::from(largest_half(halves)),
                _ => bytes
                    .chunks_exact(2)
                    .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]]) & 0x7FFF))
                    .max()
                    .unwrap_or(0),
            },
        }
    }

    /// The magnitude whose bits [`Bits::largest_bits`] gave, `None` for NaN or Inf.
    pub fn magnitude(self, bits: u32) -> Option<f64> {
        if bits >= self.infinity() {
            return None;
        }
        let half = u16::try_from(bits).unwrap_or(0);
        Some(match self {
            Bits::F32 => f64::from(f32::from_bits(bits)),
            Bits::Bf16 => half::bf16::from_bits(half).to_f64(),
            Bits::F16 => half::f16::from_bits(half).to_f64(),
        })
    }
}

#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn largest_half(halves: &[u16]) -> u16 {
    let mut max = [0u16; LANES];
    let (chunks, rest) = halves.as_chunks::<LANES>();
    for chunk in chunks {
        for lane in 0..LANES {
            max[lane] = max[lane].max(chunk[lane] & 0x7FFF);
        }
    }
    let rest = rest.iter().map(|&h| h & 0x7FFF).max().unwrap_or(0);
    max.into_iter().fold(rest, u16::max)
}

#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn largest_word(words: &[u32]) -> u32 {
    let mut max = [0u32; LANES];
    let (chunks, rest) = words.as_chunks::<LANES>();
    for chunk in chunks {
        for lane in 0..LANES {
            max[lane] = max[lane].max(chunk[lane] & 0x7FFF_FFFF);
        }
    }
    let rest = rest.iter().map(|&w| w & 0x7FFF_FFFF).max().unwrap_or(0);
    max.into_iter().fold(rest, u32::max)
}

/// BF16 elements (`bytes`, little-endian) widened into `values`, one per element.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
pub fn widen_bf16(bytes: &[u8], values: &mut [f32]) {
    match bytemuck::try_cast_slice::<u8, u16>(bytes) {
        Ok(halves) if cfg!(target_endian = "little") => {
            for (value, &bits) in values.iter_mut().zip(halves) {
                *value = f32::from_bits(u32::from(bits) << 16);
            }
        }
        _ => {
            for (value, b) in values.iter_mut().zip(bytes.chunks_exact(2)) {
                *value = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
            }
        }
    }
}

#[cfg(test)]
pub(in crate::quantize) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The largest magnitude decoded value by value, `None` when any is NaN or Inf.
    fn plain(values: &[f32]) -> Option<f64> {
        let mut largest = 0.0f64;
        for &x in values {
            if !x.is_finite() {
                return None;
            }
            largest = largest.max(f64::from(x.abs()));
        }
        Some(largest)
    }

    fn bytes_of(bits: Bits, values: &[f32]) -> Vec<u8> {
        values
            .iter()
            .flat_map(|&x| match bits {
                Bits::F32 => x.to_le_bytes().to_vec(),
                Bits::Bf16 => half::bf16::from_f32(x).to_le_bytes().to_vec(),
                Bits::F16 => half::f16::from_f32(x).to_le_bytes().to_vec(),
            })
            .collect()
    }

    /// The little-endian elements in `bytes` as `f32`, converted one by one.
    pub(in crate::quantize) fn decoded(bits: Bits, bytes: &[u8]) -> Vec<f32> {
        match bits {
            Bits::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Bits::Bf16 => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Bits::F16 => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
        }
    }

    fn value() -> impl Strategy<Value = f32> {
        prop_oneof![
            8 => -1e4f32..1e4,
            2 => -1e-6f32..1e-6,
            1 => Just(-0.0f32),
            1 => Just(f32::NAN),
            1 => Just(f32::NEG_INFINITY),
            1 => Just(f32::INFINITY),
            1 => any::<f32>(),
        ]
    }

    proptest! {
        #[test]
        fn the_largest_bits_are_the_largest_magnitude(
            values in prop::collection::vec(value(), 0..200),
            offset in 0usize..2,
        ) {
            for bits in [Bits::F32, Bits::Bf16, Bits::F16] {
                // Shifted by a byte too, so that the unaligned path is taken.
                let mut bytes = vec![0u8; offset];
                bytes.extend(bytes_of(bits, &values));
                let bytes = &bytes[offset..];
                let expected = plain(&decoded(bits, bytes));
                prop_assert_eq!(bits.magnitude(bits.largest_bits(bytes)), expected);
            }
        }

        #[test]
        fn bf16_widens_as_decoded(values in prop::collection::vec(value(), 0..200), offset in 0usize..2) {
            let mut bytes = vec![0u8; offset];
            bytes.extend(bytes_of(Bits::Bf16, &values));
            let bytes = &bytes[offset..];
            let mut widened = vec![0f32; values.len()];
            widen_bf16(bytes, &mut widened);
            let expected = decoded(Bits::Bf16, bytes);
            let same = widened.iter().zip(&expected).all(|(a, b)| a.to_bits() == b.to_bits());
            prop_assert!(same);
        }
    }
}
