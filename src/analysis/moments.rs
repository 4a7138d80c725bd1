//! Running statistics of a tensor's values: counts by class, range, mean and variance, kept so
//! that any two can be merged exactly (blocks, chunks and threads combine in any order).
//!
//! Values arrive in blocks of at most [`BLOCK`] elements. Each block is read twice while it sits
//! in L1 cache: once for the counts and the finite range (branch-free lanes that vectorize), then
//! for the sums of deviations from the block's midpoint, in `f64`, scaled by a power of two so
//! that squares can neither overflow nor lose the small spread of values far from zero. Blocks
//! merge with Chan's pairwise formula, so a tensor of a billion elements keeps its mean and
//! standard deviation to near `f64` precision.

use super::{simd, values};
use multiversion::multiversion;

/// Elements per block.
pub const BLOCK: usize = 4096;

const LANES: usize = 16;

/// Statistics of some values. `m2` is the sum of squared deviations from the mean, in units of
/// `4^scale` (the deviations were divided by `2^scale`), which keeps it finite for any `f64` data.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Moments {
    pub count: u64,
    pub nan: u64,
    pub pos_inf: u64,
    pub neg_inf: u64,
    pub zeros: u64,
    pub subnormals: u64,
    /// Smallest and largest finite values; `+inf` and `-inf` when there is none.
    pub min: f64,
    pub max: f64,
    finite: u64,
    mean: f64,
    m2: f64,
    scale: i32,
}

impl Default for Moments {
    fn default() -> Self {
        Moments::EMPTY
    }
}

impl Moments {
    pub const EMPTY: Moments = Moments {
        count: 0,
        nan: 0,
        pos_inf: 0,
        neg_inf: 0,
        zeros: 0,
        subnormals: 0,
        min: f64::INFINITY,
        max: f64::NEG_INFINITY,
        finite: 0,
        mean: 0.0,
        m2: 0.0,
        scale: 0,
    };

    /// Elements that are neither NaN nor infinite.
    pub fn finite(&self) -> u64 {
        self.finite
    }

    /// Mean of the finite values.
    pub fn mean(&self) -> Option<f64> {
        (self.finite > 0).then_some(self.mean)
    }

    /// Population standard deviation of the finite values.
    pub fn std(&self) -> Option<f64> {
        (self.finite > 0)
            .then(|| times_exp2((self.m2 / self.finite as f64).max(0.0).sqrt(), self.scale))
    }

    /// Largest magnitude among the finite values.
    pub fn absmax(&self) -> Option<f64> {
        (self.finite > 0).then(|| self.min.abs().max(self.max.abs()))
    }

    /// Combines the statistics of two disjoint sets of values.
    pub fn merge(&mut self, other: &Moments) {
        self.count += other.count;
        self.nan += other.nan;
        self.pos_inf += other.pos_inf;
        self.neg_inf += other.neg_inf;
        self.zeros += other.zeros;
        self.subnormals += other.subnormals;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        if other.finite == 0 {
            return;
        }
        if self.finite == 0 {
            (self.finite, self.mean, self.m2, self.scale) =
                (other.finite, other.mean, other.m2, other.scale);
            return;
        }
        let scale = self.scale.max(other.scale);
        let (na, nb) = (self.finite as f64, other.finite as f64);
        let n = na + nb;
        let delta = times_exp2(other.mean, -scale) - times_exp2(self.mean, -scale);
        let m2 = self.m2 * exp2(2 * (self.scale - scale))
            + other.m2 * exp2(2 * (other.scale - scale))
            + delta * delta * (na * nb / n);
        self.mean = self.mean * (na / n) + other.mean * (nb / n);
        (self.finite, self.m2, self.scale) = (self.finite + other.finite, m2, scale);
    }

    /// Statistics of `f32` values, counting as subnormal the nonzero magnitudes below `f32`'s
    /// smallest normal.
    pub fn of_f32(values: &[f32]) -> Moments {
        Moments::of_f32_above(values, f32::MIN_POSITIVE)
    }

    /// Statistics of `f32` values that hold a narrower dtype's, whose smallest normal
    /// magnitude is `smallest_normal` (nonzero magnitudes below it count as subnormal).
    pub fn of_f32_above(values: &[f32], smallest_normal: f32) -> Moments {
        let mut total = Moments::EMPTY;
        for block in values.chunks(BLOCK) {
            let fast = simd::finite_block(
                simd::Lanes::F32,
                bytemuck::cast_slice(block),
                smallest_normal,
            );
            total.merge(&fast.unwrap_or_else(|| block_f32(block, smallest_normal)));
        }
        total
    }

    /// Statistics of elements as stored (little-endian), widened inside the kernel.
    pub fn of_halves(lanes: simd::Lanes, bytes: &[u8], smallest_normal: f32) -> Moments {
        let mut total = Moments::EMPTY;
        let mut widened = [0f32; BLOCK];
        for block in bytes.chunks(BLOCK * lanes.size()) {
            let moments = simd::finite_block(lanes, block, smallest_normal).unwrap_or_else(|| {
                let values = &mut widened[..block.len() / lanes.size()];
                values::widen(lanes, block, values);
                block_f32(values, smallest_normal)
            });
            total.merge(&moments);
        }
        total
    }

    /// Statistics of `f64` values, counting as subnormal the nonzero magnitudes below
    /// `smallest_normal` (`f64::MIN_POSITIVE` for F64 data, 0 for integers).
    pub fn of_f64(values: &[f64], smallest_normal: f64) -> Moments {
        let mut total = Moments::EMPTY;
        for block in values.chunks(BLOCK) {
            total.merge(&block_f64(block, smallest_normal));
        }
        total
    }

    /// Adds the deviations of a block whose counts and range are already in `self`: `sums`
    /// gets `unit` and `offset` and returns the sums of `x * unit - offset` and of its squares
    /// over the finite values `x`.
    fn with_sums(mut self, sums: impl FnOnce(f64, f64) -> (f64, f64)) -> Moments {
        if self.finite == 0 {
            return self;
        }
        let midpoint = self.min * 0.5 + self.max * 0.5;
        let half_range = self.max * 0.5 - self.min * 0.5;
        let scale = exponent_above(half_range);
        let unit = exp2(-scale);
        let (s1, s2) = sums(unit, midpoint * unit);
        let n = self.finite as f64;
        self.mean = midpoint + times_exp2(s1 / n, scale);
        self.m2 = (s2 - s1 * s1 / n).max(0.0);
        self.scale = scale;
        self
    }
}

/// A block of finite values whose counts and range are known, waiting for its sums.
#[derive(Clone, Copy, Debug)]
pub(super) struct FiniteBlock {
    pub count: u64,
    pub zeros: u64,
    pub subnormals: u64,
    pub min: f64,
    pub max: f64,
}

impl FiniteBlock {
    /// The block's statistics from the sums of `x - offset` and of its squares (`f32` values,
    /// whose squares `f64` holds without scaling).
    pub fn with_sums_about(self, offset: f64, sum: f64, squares: f64) -> Moments {
        let n = self.count as f64;
        Moments {
            count: self.count,
            finite: self.count,
            zeros: self.zeros,
            subnormals: self.subnormals,
            min: self.min,
            max: self.max,
            mean: offset + sum / n,
            m2: (squares - sum * sum / n).max(0.0),
            ..Moments::EMPTY
        }
    }
}

/// The smallest `e` with `2^e > value` (0 for zero), for a finite non-negative value.
fn exponent_above(value: f64) -> i32 {
    if value == 0.0 || !value.is_finite() {
        return 0;
    }
    let bits = value.to_bits();
    let biased = i32::try_from((bits >> 52) & 0x7ff).unwrap_or(0);
    if biased == 0 { -1022 } else { biased - 1022 }
}

/// `value * 2^e`, applied in two steps so that the factor itself never overflows.
fn times_exp2(value: f64, e: i32) -> f64 {
    let first = e / 2;
    value * exp2(first) * exp2(e - first)
}

/// `2^e` for any `e` an `f64` can scale by (clamped to the representable range).
fn exp2(e: i32) -> f64 {
    let e = e.clamp(-1074, 1023);
    if e >= -1022 {
        f64::from_bits(u64::try_from(e + 1023).unwrap_or(0) << 52)
    } else {
        f64::from_bits(1u64 << (e + 1074))
    }
}

macro_rules! block_kernel {
    ($name:ident, $float:ty) => {
        /// Counts, range and sums of one block, in branch-free lanes the compiler vectorizes
        /// (dispatched at run time to the best instruction set the CPU has).
        #[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
        fn $name(values: &[$float], smallest_normal: $float) -> Moments {
            let mut low = [<$float>::INFINITY; LANES];
            let mut high = [<$float>::NEG_INFINITY; LANES];
            let mut nan = [0u32; LANES];
            let mut pos_inf = [0u32; LANES];
            let mut neg_inf = [0u32; LANES];
            let mut zeros = [0u32; LANES];
            let mut subnormals = [0u32; LANES];
            let mut finite = [0u32; LANES];
            let mut lanes = values.chunks_exact(LANES);
            for chunk in lanes.by_ref() {
                for i in 0..LANES {
                    let x = chunk[i];
                    let magnitude = x.abs();
                    let is_finite = magnitude < <$float>::INFINITY;
                    nan[i] += u32::from(x.is_nan());
                    pos_inf[i] += u32::from(x == <$float>::INFINITY);
                    neg_inf[i] += u32::from(x == <$float>::NEG_INFINITY);
                    zeros[i] += u32::from(x == 0.0);
                    subnormals[i] += u32::from(magnitude < smallest_normal && magnitude != 0.0);
                    finite[i] += u32::from(is_finite);
                    let for_low = if is_finite { x } else { <$float>::INFINITY };
                    let for_high = if is_finite { x } else { <$float>::NEG_INFINITY };
                    low[i] = if for_low < low[i] { for_low } else { low[i] };
                    high[i] = if for_high > high[i] {
                        for_high
                    } else {
                        high[i]
                    };
                }
            }
            let mut moments = Moments::EMPTY;
            for &x in lanes.remainder() {
                let magnitude = x.abs();
                moments.nan += u64::from(x.is_nan());
                moments.pos_inf += u64::from(x == <$float>::INFINITY);
                moments.neg_inf += u64::from(x == <$float>::NEG_INFINITY);
                moments.zeros += u64::from(x == 0.0);
                moments.subnormals += u64::from(magnitude < smallest_normal && magnitude != 0.0);
                if magnitude < <$float>::INFINITY {
                    moments.finite += 1;
                    moments.min = moments.min.min(f64::from(x));
                    moments.max = moments.max.max(f64::from(x));
                }
            }
            for i in 0..LANES {
                moments.nan += u64::from(nan[i]);
                moments.pos_inf += u64::from(pos_inf[i]);
                moments.neg_inf += u64::from(neg_inf[i]);
                moments.zeros += u64::from(zeros[i]);
                moments.subnormals += u64::from(subnormals[i]);
                moments.finite += u64::from(finite[i]);
                moments.min = moments.min.min(f64::from(low[i]));
                moments.max = moments.max.max(f64::from(high[i]));
            }
            moments.count = values.len() as u64;
            let all_finite = moments.finite == moments.count;
            moments.with_sums(|unit, offset| {
                // Array-valued steps (rather than indexed updates) are what the vectorizer
                // turns into SIMD for the f64 sums.
                let mut s1 = [0f64; LANES / 2];
                let mut s2 = [0f64; LANES / 2];
                let mut lanes = values.chunks_exact(LANES / 2);
                for chunk in lanes.by_ref() {
                    let d: [f64; LANES / 2] = if all_finite {
                        std::array::from_fn(|i| f64::from(chunk[i]) * unit - offset)
                    } else {
                        std::array::from_fn(|i| {
                            let x = chunk[i];
                            if x.abs() < <$float>::INFINITY {
                                f64::from(x) * unit - offset
                            } else {
                                0.0
                            }
                        })
                    };
                    s1 = std::array::from_fn(|i| s1[i] + d[i]);
                    s2 = std::array::from_fn(|i| s2[i] + d[i] * d[i]);
                }
                let (mut sum, mut squares) = (0.0, 0.0);
                for &x in lanes.remainder() {
                    if x.abs() < <$float>::INFINITY {
                        let d = f64::from(x) * unit - offset;
                        sum += d;
                        squares += d * d;
                    }
                }
                (
                    sum + s1.iter().sum::<f64>(),
                    squares + s2.iter().sum::<f64>(),
                )
            })
        }
    };
}

block_kernel!(block_f32, f32);
block_kernel!(block_f64, f64);

#[cfg(test)]
mod tests {
    use super::*;

    /// Mean and population std in plain f64, two passes.
    fn reference(values: &[f64]) -> (f64, f64) {
        let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        let n = finite.len() as f64;
        let mean = finite.iter().sum::<f64>() / n;
        let var = finite.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
        (mean, var.sqrt())
    }

    fn close(a: f64, b: f64, tolerance: f64) -> bool {
        a == b || (a - b).abs() <= tolerance * a.abs().max(b.abs())
    }

    #[test]
    fn counts_every_class() {
        let values = [
            1.0f32,
            -2.0,
            0.0,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e-40,
            3.0,
        ];
        let m = Moments::of_f32(&values);
        assert_eq!(
            (m.count, m.nan, m.pos_inf, m.neg_inf, m.zeros, m.subnormals),
            (9, 1, 1, 1, 2, 1)
        );
        assert_eq!((m.min, m.max, m.finite()), (-2.0, 3.0, 6));
        assert_eq!(m.absmax(), Some(3.0));
    }

    #[test]
    fn mean_and_std_survive_a_large_offset_and_huge_values() {
        let values: Vec<f64> = (0..100_000)
            .map(|i| 1e6 + f64::from(i % 7) * 1e-3)
            .collect();
        let m = Moments::of_f64(&values, f64::MIN_POSITIVE);
        let (mean, std) = reference(&values);
        assert!(close(m.mean().unwrap(), mean, 1e-12));
        assert!(
            close(m.std().unwrap(), std, 1e-9),
            "{} vs {std}",
            m.std().unwrap()
        );
        let huge = [f64::MAX, -f64::MAX, f64::MAX / 2.0];
        let m = Moments::of_f64(&huge, f64::MIN_POSITIVE);
        assert!(m.std().unwrap().is_finite());
        assert!(close(
            m.std().unwrap(),
            f64::MAX * (78.0f64 / 108.0).sqrt(),
            1e-12
        ));
    }

    #[test]
    fn merging_in_any_order_gives_the_same_result() {
        let values: Vec<f32> = (0..50_000)
            .map(|i| ((i * 7919) % 1000) as f32 * 0.01 - 3.0)
            .collect();
        let whole = Moments::of_f32(&values);
        let mut parts = Moments::EMPTY;
        for chunk in values.chunks(1234).rev() {
            parts.merge(&Moments::of_f32(chunk));
        }
        let as_f64: Vec<f64> = values.iter().map(|&v| f64::from(v)).collect();
        let (mean, std) = reference(&as_f64);
        for m in [whole, parts] {
            assert!(close(m.mean().unwrap(), mean, 1e-12));
            assert!(close(m.std().unwrap(), std, 1e-12));
        }
    }

    #[test]
    fn no_finite_value_means_no_mean() {
        let m = Moments::of_f32(&[f32::NAN, f32::INFINITY]);
        assert_eq!((m.mean(), m.std(), m.absmax()), (None, None, None));
        assert_eq!(Moments::of_f32(&[]).count, 0);
    }
}
