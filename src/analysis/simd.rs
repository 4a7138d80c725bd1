//! Hand-written AVX2 kernels for the common block: every value finite, normal and nonzero, as in
//! the bulk of any weight tensor. One pass finds the range (and, from the magnitudes' bit
//! patterns, whether anything else is in the block); a second pass, while the block is still in
//! L1, sums the deviations from its midpoint in `f64`. A block holding NaN, an infinity, a zero
//! or a subnormal returns `None` and goes to the general kernel, which counts every class.
//!
//! BF16 and F16 are widened inside the kernels (a shift; the F16C conversion), so they never go
//! through a buffer. The kernels are chosen at run time: the release binary targets plain x86-64.

#![expect(
    unsafe_code,
    reason = "SIMD intrinsics: each kernel runs only on a CPU that has its features, and every load stays inside the slice it reads"
)]

use super::moments::Moments;

/// How a block's elements are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lanes {
    F32,
    Bf16,
    F16,
}

impl Lanes {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Lanes::F32 => 4,
            Lanes::Bf16 | Lanes::F16 => 2,
        }
    }

    /// The element starting at `bytes[at..]`.
    pub fn decode(self, bytes: &[u8], at: usize) -> f32 {
        match self {
            Lanes::F32 => {
                f32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
            }
            Lanes::Bf16 => {
                f32::from_bits(u32::from(u16::from_le_bytes([bytes[at], bytes[at + 1]])) << 16)
            }
            Lanes::F16 => half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32(),
        }
    }
}

/// Statistics of the elements in `bytes` (little-endian, whole elements) when all of them are
/// finite, nonzero and at least `smallest_normal` in magnitude; `None` when one is not, or when
/// the CPU lacks the instructions.
pub fn finite_block(lanes: Lanes, bytes: &[u8], smallest_normal: f32) -> Option<Moments> {
    #[cfg(target_arch = "x86_64")]
    if avx2::available(lanes) {
        // SAFETY: `available` checked that the CPU has AVX2, FMA and F16C.
        return unsafe {
            match lanes {
                Lanes::F32 => avx2::block_f32(bytes, smallest_normal),
                Lanes::Bf16 => avx2::block_bf16(bytes, smallest_normal),
                Lanes::F16 => avx2::block_f16(bytes, smallest_normal),
            }
        };
    }
    let _ = (lanes, bytes, smallest_normal);
    None
}

#[cfg(target_arch = "x86_64")]
#[expect(
    clippy::inline_always,
    reason = "the helpers must be inlined into the functions that enable AVX2 to be compiled with it"
)]
#[expect(
    clippy::cast_ptr_alignment,
    reason = "the unaligned loads take a pointer of the vector's type at any alignment"
)]
mod avx2 {
    use super::super::moments::FiniteBlock;
    use super::{Lanes, Moments};
    use std::arch::x86_64::{
        __m128i, __m256, __m256d, __m256i, _MM_HINT_T0, _mm_loadu_si128, _mm_prefetch,
        _mm256_add_pd, _mm256_and_si256, _mm256_castps_si256, _mm256_castps256_ps128,
        _mm256_castsi256_ps, _mm256_cmpeq_epi32, _mm256_cmpgt_epi32, _mm256_cvtepu16_epi32,
        _mm256_cvtph_ps, _mm256_cvtps_pd, _mm256_extractf128_ps, _mm256_fmadd_pd, _mm256_loadu_ps,
        _mm256_max_epu32, _mm256_max_ps, _mm256_min_epu32, _mm256_min_ps, _mm256_set1_epi32,
        _mm256_set1_pd, _mm256_set1_ps, _mm256_setzero_pd, _mm256_setzero_si256, _mm256_slli_epi32,
        _mm256_sub_epi32, _mm256_sub_pd,
    };

    /// How far ahead of the pass to ask for data, in bytes.
    const PREFETCH: usize = 4096;

    /// Bits of the smallest magnitude that is not finite.
    const INFINITY_BITS: u32 = 0x7f80_0000;

    pub fn available(lanes: Lanes) -> bool {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && (lanes != Lanes::F16 || is_x86_feature_detected!("f16c"))
    }

    /// Eight elements starting at `bytes[at..]` as `f32` lanes.
    trait Load {
        const LANES: Lanes;
        /// # Safety
        /// `at + 8 * size` must not pass the end of `bytes`, and the CPU must have AVX2 and F16C.
        unsafe fn load(bytes: &[u8], at: usize) -> __m256;
    }

    struct F32;
    struct Bf16;
    struct F16;

    impl Load for F32 {
        const LANES: Lanes = Lanes::F32;
        #[inline(always)]
        unsafe fn load(bytes: &[u8], at: usize) -> __m256 {
            debug_assert!(at + 32 <= bytes.len());
            // SAFETY: the caller keeps the 32 bytes inside the slice; loadu takes any alignment.
            unsafe { _mm256_loadu_ps(bytes.as_ptr().add(at).cast()) }
        }
    }

    impl Load for Bf16 {
        const LANES: Lanes = Lanes::Bf16;
        #[inline(always)]
        unsafe fn load(bytes: &[u8], at: usize) -> __m256 {
            debug_assert!(at + 16 <= bytes.len());
            // SAFETY: as for F32; the caller's CPU has AVX2.
            unsafe {
                let halves = _mm_loadu_si128(bytes.as_ptr().add(at).cast::<__m128i>());
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(halves)))
            }
        }
    }

    impl Load for F16 {
        const LANES: Lanes = Lanes::F16;
        #[inline(always)]
        unsafe fn load(bytes: &[u8], at: usize) -> __m256 {
            debug_assert!(at + 16 <= bytes.len());
            // SAFETY: as for F32; the caller's CPU has F16C.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(bytes.as_ptr().add(at).cast::<__m128i>())) }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn block_f32(bytes: &[u8], smallest_normal: f32) -> Option<Moments> {
        finite_block::<F32>(bytes, smallest_normal)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn block_bf16(bytes: &[u8], smallest_normal: f32) -> Option<Moments> {
        finite_block::<Bf16>(bytes, smallest_normal)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn block_f16(bytes: &[u8], smallest_normal: f32) -> Option<Moments> {
        finite_block::<F16>(bytes, smallest_normal)
    }

    fn lanes_ps(v: __m256) -> [f32; 8] {
        // SAFETY: both are 32 bytes of plain data.
        unsafe { std::mem::transmute(v) }
    }

    fn lanes_epu32(v: __m256i) -> [u32; 8] {
        // SAFETY: both are 32 bytes of plain data.
        unsafe { std::mem::transmute(v) }
    }

    fn lanes_pd(v: __m256d) -> [f64; 4] {
        // SAFETY: both are 32 bytes of plain data.
        unsafe { std::mem::transmute(v) }
    }

    /// One pass over the block: the range, the magnitudes' least and greatest bit patterns
    /// (which tell whether anything but finite normal nonzero values is there), and the sums of
    /// deviations from the block's first value. That offset is one of the values, so its
    /// squared distance from the mean is at most `count` times the variance, and the variance
    /// taken from these sums loses at most `log2(count + 1)` bits (12 for a block) of `f64`'s 53.
    #[inline(always)]
    fn finite_block<L: Load>(bytes: &[u8], smallest_normal: f32) -> Option<Moments> {
        let size = L::LANES.size();
        let count = bytes.len() / size;
        if count == 0 {
            return None;
        }
        let vectors = count / 8;
        let stride = 8 * size;
        let offset = f64::from(L::LANES.decode(bytes, 0));
        // SAFETY (every `L::load` in this module): vector `v` covers bytes
        // `v * stride..(v + 1) * stride`, inside `bytes` for every `v < vectors`; the functions
        // calling this enable AVX2, FMA and F16C.
        let mut pass = unsafe {
            let magnitude = _mm256_set1_epi32(0x7fff_ffff);
            let shift = _mm256_set1_pd(offset);
            let mut least = _mm256_set1_epi32(-1);
            let mut most = _mm256_setzero_si256();
            let mut low = _mm256_set1_ps(f32::INFINITY);
            let mut high = _mm256_set1_ps(f32::NEG_INFINITY);
            let mut s1 = [_mm256_setzero_pd(); 2];
            let mut s2 = [_mm256_setzero_pd(); 2];
            for v in 0..vectors {
                if (v * stride) % 64 == 0 {
                    _mm_prefetch::<_MM_HINT_T0>(
                        bytes.as_ptr().wrapping_add(v * stride + PREFETCH).cast(),
                    );
                }
                let x = L::load(bytes, v * stride);
                let bits = _mm256_and_si256(_mm256_castps_si256(x), magnitude);
                least = _mm256_min_epu32(least, bits);
                most = _mm256_max_epu32(most, bits);
                low = _mm256_min_ps(low, x);
                high = _mm256_max_ps(high, x);
                for (h, half) in widen(x).into_iter().enumerate() {
                    let d = _mm256_sub_pd(half, shift);
                    s1[h] = _mm256_add_pd(s1[h], d);
                    s2[h] = _mm256_fmadd_pd(d, d, s2[h]);
                }
            }
            Pass {
                least: lanes_epu32(least).into_iter().min().unwrap_or(u32::MAX),
                most: lanes_epu32(most).into_iter().max().unwrap_or(0),
                low: lanes_ps(low).into_iter().fold(f32::INFINITY, f32::min),
                high: lanes_ps(high).into_iter().fold(f32::NEG_INFINITY, f32::max),
                sum: s1.map(lanes_pd).into_iter().flatten().sum(),
                squares: s2.map(lanes_pd).into_iter().flatten().sum(),
            }
        };
        for i in vectors * 8..count {
            let x = L::LANES.decode(bytes, i * size);
            let bits = x.to_bits() & 0x7fff_ffff;
            pass.least = pass.least.min(bits);
            pass.most = pass.most.max(bits);
            pass.low = pass.low.min(x);
            pass.high = pass.high.max(x);
            let d = f64::from(x) - offset;
            pass.sum += d;
            pass.squares += d * d;
        }
        if pass.most >= INFINITY_BITS {
            return None;
        }
        // A zero's bits are 0, below any floor but a zero one.
        let floor = smallest_normal.to_bits().max(1);
        let (zeros, subnormals) = if pass.least < floor {
            small_values::<L>(bytes, floor)
        } else {
            (0, 0)
        };
        let block = FiniteBlock {
            count: count as u64,
            zeros,
            subnormals,
            min: f64::from(pass.low),
            max: f64::from(pass.high),
        };
        Some(block.with_sums_about(offset, pass.sum, pass.squares))
    }

    struct Pass {
        least: u32,
        most: u32,
        low: f32,
        high: f32,
        sum: f64,
        squares: f64,
    }

    /// The eight lanes of `x` as two vectors of `f64`.
    #[inline(always)]
    fn widen(x: __m256) -> [__m256d; 2] {
        // SAFETY: register operations; the callers enable AVX2.
        unsafe {
            [
                _mm256_cvtps_pd(_mm256_castps256_ps128(x)),
                _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(x)),
            ]
        }
    }

    /// Zeros and nonzero magnitudes whose bits are below `floor`, in a block of finite values.
    #[inline(always)]
    fn small_values<L: Load>(bytes: &[u8], floor: u32) -> (u64, u64) {
        let size = L::LANES.size();
        let count = bytes.len() / size;
        let vectors = count / 8;
        let floor_signed = i32::try_from(floor).unwrap_or(i32::MAX);
        // SAFETY: as in `finite_block`. Finite magnitudes are below 2^31, so signed compares
        // order them.
        let (mut zeros, mut below) = unsafe {
            let magnitude = _mm256_set1_epi32(0x7fff_ffff);
            let floor = _mm256_set1_epi32(floor_signed);
            let zero = _mm256_setzero_si256();
            let mut zeros = _mm256_setzero_si256();
            let mut below = _mm256_setzero_si256();
            for v in 0..vectors {
                let x = L::load(bytes, v * 8 * size);
                let bits = _mm256_and_si256(_mm256_castps_si256(x), magnitude);
                zeros = _mm256_sub_epi32(zeros, _mm256_cmpeq_epi32(bits, zero));
                below = _mm256_sub_epi32(below, _mm256_cmpgt_epi32(floor, bits));
            }
            (
                lanes_epu32(zeros).into_iter().map(u64::from).sum::<u64>(),
                lanes_epu32(below).into_iter().map(u64::from).sum::<u64>(),
            )
        };
        for i in vectors * 8..count {
            let bits = L::LANES.decode(bytes, i * size).to_bits() & 0x7fff_ffff;
            zeros += u64::from(bits == 0);
            below += u64::from(bits < floor);
        }
        (zeros, below - zeros)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
    }

    #[test]
    fn matches_the_general_kernel_on_finite_blocks_of_every_length() {
        for len in [1, 7, 8, 9, 31, 32, 33, 100, 4096] {
            let values: Vec<f32> = (0..len)
                .map(|i| ((i * 7919) % 1013) as f32 * 0.37 - 150.5)
                .collect();
            let fast = finite_block(Lanes::F32, &bytes_of(&values), f32::MIN_POSITIVE);
            let Some(fast) = fast else {
                assert!(!avx2_available(), "no fast result for {len} values");
                continue;
            };
            let general = Moments::of_f32(&values);
            assert_eq!(
                (fast.count, fast.finite(), fast.min, fast.max),
                (general.count, general.finite(), general.min, general.max)
            );
            assert!(close(fast.mean().unwrap(), general.mean().unwrap()));
            assert!(close(fast.std().unwrap(), general.std().unwrap()));
        }
    }

    #[test]
    fn leaves_nan_and_infinities_to_the_general_kernel() {
        for (at, odd) in [(3, f32::NAN), (39, f32::INFINITY), (0, f32::NEG_INFINITY)] {
            let mut block = [1.0f32; 40];
            block[at] = odd;
            assert_eq!(
                finite_block(Lanes::F32, &bytes_of(&block), f32::MIN_POSITIVE),
                None
            );
        }
    }

    #[test]
    fn counts_zeros_and_subnormals_of_the_dtype() {
        let mut values: Vec<f32> = (0..45).map(|i| i as f32 - 20.5).collect();
        values[0] = 0.0;
        values[9] = -0.0;
        values[44] = 1e-40;
        values[30] = -1e-39;
        values[12] = 3e-5;
        let Some(fast) = finite_block(Lanes::F32, &bytes_of(&values), f32::MIN_POSITIVE) else {
            assert!(!avx2_available());
            return;
        };
        let general = Moments::of_f32(&values);
        assert_eq!((fast.zeros, fast.subnormals), (2, 2));
        assert_eq!(
            (fast.count, fast.finite(), fast.min, fast.max),
            (general.count, general.finite(), general.min, general.max)
        );
        assert!(close(fast.mean().unwrap(), general.mean().unwrap()));
        assert!(close(fast.std().unwrap(), general.std().unwrap()));
        // Below F16's smallest normal (2^-14), 3e-5 is subnormal too.
        let fast = finite_block(Lanes::F32, &bytes_of(&values), 2f32.powi(-14)).unwrap();
        assert_eq!((fast.zeros, fast.subnormals), (2, 3));
    }

    #[test]
    fn values_far_from_the_first_keep_their_spread() {
        let mut values: Vec<f32> = (0..4096).map(|i| 1e6 + (i % 7) as f32 * 0.0625).collect();
        values[0] = -1e6;
        let as_f64: Vec<f64> = values.iter().map(|&v| f64::from(v)).collect();
        let n = as_f64.len() as f64;
        let mean = as_f64.iter().sum::<f64>() / n;
        let std = (as_f64.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
        let Some(fast) = finite_block(Lanes::F32, &bytes_of(&values), f32::MIN_POSITIVE) else {
            assert!(!avx2_available());
            return;
        };
        assert!(close(fast.mean().unwrap(), mean));
        assert!((fast.std().unwrap() - std).abs() <= 1e-9 * std);
    }

    #[test]
    fn widens_bf16_and_f16_in_the_kernel() {
        let bf16: Vec<u8> = (0..37u16)
            .flat_map(|i| (0x3f80 + i * 3).to_le_bytes())
            .collect();
        let f16: Vec<u8> = (0..37u16)
            .flat_map(|i| (0x3c00 + i * 5).to_le_bytes())
            .collect();
        let widened = |bytes: &[u8], decode: fn(u16) -> f32| -> Vec<f32> {
            bytes
                .chunks_exact(2)
                .map(|b| decode(u16::from_le_bytes([b[0], b[1]])))
                .collect()
        };
        for (lanes, bytes, values) in [
            (
                Lanes::Bf16,
                &bf16,
                widened(&bf16, |h| f32::from_bits(u32::from(h) << 16)),
            ),
            (
                Lanes::F16,
                &f16,
                widened(&f16, |h| half::f16::from_bits(h).to_f32()),
            ),
        ] {
            let Some(fast) = finite_block(lanes, bytes, f32::MIN_POSITIVE) else {
                assert!(!avx2_available());
                continue;
            };
            let general = Moments::of_f32(&values);
            assert_eq!((fast.min, fast.max), (general.min, general.max));
            assert!(close(fast.mean().unwrap(), general.mean().unwrap()));
            assert!(close(fast.std().unwrap(), general.std().unwrap()));
        }
    }

    fn avx2_available() -> bool {
        #[cfg(target_arch = "x86_64")]
        return avx2::available(Lanes::F16);
        #[cfg(not(target_arch = "x86_64"))]
        false
    }
}
