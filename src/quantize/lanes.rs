//! Steps the schemes' kernels share, written so that the loops calling them vectorize: rounding
//! without a call to `rint` (x86-64 has no SIMD rounding before SSE4.1), clamping without
//! `f32::clamp`'s NaN rules, and the error measures summed lane by lane.
#![expect(
    clippy::inline_always,
    reason = "inlined into the kernels, whose copies for AVX2 and AVX-512 they must share"
)]

use super::scheme::ErrorSums;

/// Values handled side by side.
pub const LANES: usize = 8;

/// Adding and taking away 1.5 · 2^23 rounds an `f32` of magnitude below 2^22 to the nearest
/// whole number, ties to even, as `round_ties_even` does.
const ROUNDER: f32 = 12_582_912.0;

/// `value` (of magnitude at most 2^22) rounded to the nearest whole number, ties to even.
#[inline(always)]
pub fn round_even(value: f32) -> f32 {
    (value + ROUNDER) - ROUNDER
}

/// The whole number `value` (from 0 to 255) as a byte.
#[inline(always)]
pub fn byte_of(value: f32) -> u8 {
    // Above 1.5 · 2^23 the mantissa's low bits are the whole number added.
    (value + ROUNDER).to_bits().to_le_bytes()[0]
}

/// `value` held within `[low, high]`.
#[inline(always)]
pub fn clamp(value: f32, low: f32, high: f32) -> f32 {
    let value = if value < low { low } else { value };
    if value > high { high } else { value }
}

/// The rounding of the `f32` quotient allowed for in the half-step check (see `add_lanes`).
const EXACT_SLACK: f32 = 1.0 / 4_194_304.0;

/// The largest errors of a group of values, lane by lane, in `f32`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Worst {
    abs: [f32; LANES],
    in_steps: [f32; LANES],
}

/// The error measures of [`ErrorSums`] and the half-step check, summed lane by lane.
#[derive(Clone, Copy, Debug, Default)]
pub struct Measure {
    signal: [f64; LANES],
    noise: [f64; LANES],
    max_abs: [f64; LANES],
    max_in_steps: [f64; LANES],
    beyond: [u32; LANES],
}

impl Measure {
    /// Adds value `x`, which came back as `back` on a grid of local step `step` (whose inverse
    /// is `inverse_step`, 0 when the step is), in lane 0.
    #[inline(always)]
    pub fn add(&mut self, x: f32, back: f64, step: f64, inverse_step: f64) {
        let mut xs = [0.0; LANES];
        let mut backs = [0.0; LANES];
        let (mut steps, mut inverses) = ([0.0; LANES], [0.0; LANES]);
        (xs[0], backs[0], steps[0], inverses[0]) = (x, back, step, inverse_step);
        self.add_lanes(&xs, &backs, &steps, &inverses);
    }

    /// [`Measure::add`] of a value in each lane, in one short loop a step, so that each
    /// vectorizes.
    #[inline(always)]
    pub fn add_lanes(
        &mut self,
        xs: &[f32; LANES],
        backs: &[f64; LANES],
        steps: &[f64; LANES],
        inverse_steps: &[f64; LANES],
    ) {
        let mut wide = [0f64; LANES];
        let mut errors = [0f64; LANES];
        for lane in 0..LANES {
            wide[lane] = f64::from(xs[lane]);
            errors[lane] = (wide[lane] - backs[lane]).abs();
        }
        for lane in 0..LANES {
            self.signal[lane] += wide[lane] * wide[lane];
            self.noise[lane] += errors[lane] * errors[lane];
        }
        for lane in 0..LANES {
            let error = errors[lane];
            self.max_abs[lane] = if error > self.max_abs[lane] {
                error
            } else {
                self.max_abs[lane]
            };
            let in_steps = error * inverse_steps[lane];
            self.max_in_steps[lane] = if in_steps > self.max_in_steps[lane] {
                in_steps
            } else {
                self.max_in_steps[lane]
            };
        }
        for lane in 0..LANES {
            // Within half a step, allowing for the rounding of the `f32` quotient `x / scale`
            // the kernels round: off by at most `|x| · 2^-24` in value, which can send a value
            // that close to the middle between two steps to the farther one. NaN counts as
            // beyond.
            let limit = 0.5 * steps[lane]
                + wide[lane].abs() * 2f64.powi(-22)
                + f64::from(f32::MIN_POSITIVE);
            let error = errors[lane];
            self.beyond[lane] += u32::from(error.is_nan()) + u32::from(error > limit);
        }
    }

    /// [`Measure::add_lanes`] for values whose error `x - back` is exact in `f32` (BF16 values
    /// on a grid of BF16 scales times small whole numbers or powers of two): the error is then
    /// the one `f64` gives, and the sums, added in the same order, are the same to the bit.
    /// `steps` are the local steps in `f32`; `per_step` a power of two, the step's ratio to the
    /// group's `unit` (see [`Measure::end_group`]). The largest errors, and the largest over
    /// `per_step`, are kept in `worst` until the group ends: by monotone rounding, the largest
    /// of the errors times the group's inverse step is the largest of the products.
    #[inline(always)]
    pub fn add_exact_lanes(
        &mut self,
        xs: &[f32; LANES],
        backs: &[f32; LANES],
        steps: &[f32; LANES],
        per_step: &[f32; LANES],
        worst: &mut Worst,
    ) {
        let mut errors = [0f32; LANES];
        for lane in 0..LANES {
            errors[lane] = (xs[lane] - backs[lane]).abs();
        }
        for lane in 0..LANES {
            let wide = f64::from(xs[lane]);
            let error = f64::from(errors[lane]);
            self.signal[lane] += wide * wide;
            self.noise[lane] += error * error;
        }
        for lane in 0..LANES {
            let error = errors[lane];
            worst.abs[lane] = if error > worst.abs[lane] {
                error
            } else {
                worst.abs[lane]
            };
            let in_steps = error * per_step[lane];
            worst.in_steps[lane] = if in_steps > worst.in_steps[lane] {
                in_steps
            } else {
                worst.in_steps[lane]
            };
        }
        for lane in 0..LANES {
            // As in `add_lanes`, in `f32`.
            let limit = 0.5 * steps[lane] + xs[lane].abs() * EXACT_SLACK + f32::MIN_POSITIVE;
            let error = errors[lane];
            self.beyond[lane] += u32::from(error.is_nan()) + u32::from(error > limit);
        }
    }

    /// [`Measure::add_exact_lanes`] of one value, in lane 0.
    #[inline(always)]
    pub fn add_exact(&mut self, x: f32, back: f32, step: f32, per_step: f32, worst: &mut Worst) {
        let mut xs = [0.0; LANES];
        let mut backs = [0.0; LANES];
        let (mut steps, mut per_steps) = ([0.0; LANES], [0.0; LANES]);
        (xs[0], backs[0], steps[0], per_steps[0]) = (x, back, step, per_step);
        self.add_exact_lanes(&xs, &backs, &steps, &per_steps, worst);
    }

    /// Ends a group of [`Measure::add_exact_lanes`] whose unit step's inverse is
    /// `inverse_unit` (0 when the step is).
    #[inline(always)]
    pub fn end_group(&mut self, worst: &Worst, inverse_unit: f64) {
        for lane in 0..LANES {
            let error = f64::from(worst.abs[lane]);
            self.max_abs[lane] = if error > self.max_abs[lane] {
                error
            } else {
                self.max_abs[lane]
            };
            let in_steps = f64::from(worst.in_steps[lane]) * inverse_unit;
            self.max_in_steps[lane] = if in_steps > self.max_in_steps[lane] {
                in_steps
            } else {
                self.max_in_steps[lane]
            };
        }
    }

    /// The sums, and whether every value was within half a step.
    pub fn finish(&self) -> (ErrorSums, bool) {
        let sums = ErrorSums {
            signal: self.signal.iter().sum(),
            noise: self.noise.iter().sum(),
            max_abs: self.max_abs.iter().copied().fold(0.0, f64::max),
            max_in_steps: self.max_in_steps.iter().copied().fold(0.0, f64::max),
        };
        (sums, self.beyond == [0; LANES])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_as_round_ties_even() {
        for value in [
            0.5f32,
            1.5,
            2.5,
            -0.5,
            -1.5,
            0.499_999_97,
            7.5,
            -8.5,
            1e6 + 0.5,
            3.7,
        ] {
            assert_eq!(round_even(value), value.round_ties_even(), "{value}");
        }
        assert_eq!(byte_of(0.0), 0);
        assert_eq!(byte_of(255.0), 255);
        assert_eq!(clamp(9.0, -8.0, 7.0), 7.0);
        assert_eq!(clamp(-9.0, -8.0, 7.0), -8.0);
    }
}
