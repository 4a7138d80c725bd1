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

/// Values of a [`Group`] at most: their squares are summed in `f32` (a lane's sum of 128 terms then loses at most
/// 2^-17 of itself), the group's sums added into the `f64` ones once.
pub const GROUP_VALUES: usize = 1024;

/// The sums and largest errors of a group of values, lane by lane, in `f32`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Group {
    signal: [f32; LANES],
    noise: [f32; LANES],
    abs: [f32; LANES],
    in_steps: [f32; LANES],
    beyond: [u32; LANES],
}

impl Group {
    /// [`Measure::add_lanes`] for values whose error `x - back` is exact in `f32` (BF16 values
    /// on a grid of BF16 scales times small whole numbers or powers of two): the error is then
    /// the one `f64` gives. Its square and the value's are summed in `f32` (at most
    /// [`GROUP_VALUES`] values a group) and added into the `f64` sums when the group ends.
    /// `steps` are the local steps in `f32`; `per_step` a power of two, the step's ratio to the
    /// group's `unit` (see [`Measure::end_group`]). The largest errors, and the largest over
    /// `per_step`, are kept until the group ends: by monotone rounding, the largest
    /// of the errors times the group's inverse step is the largest of the products.
    #[inline(always)]
    pub fn add_lanes(
        &mut self,
        xs: &[f32; LANES],
        backs: &[f32; LANES],
        steps: &[f32; LANES],
        per_step: &[f32; LANES],
    ) {
        let mut errors = [0f32; LANES];
        for lane in 0..LANES {
            errors[lane] = (xs[lane] - backs[lane]).abs();
        }
        for lane in 0..LANES {
            self.signal[lane] += xs[lane] * xs[lane];
            self.noise[lane] += errors[lane] * errors[lane];
        }
        for lane in 0..LANES {
            let error = errors[lane];
            self.abs[lane] = if error > self.abs[lane] {
                error
            } else {
                self.abs[lane]
            };
            let in_steps = error * per_step[lane];
            self.in_steps[lane] = if in_steps > self.in_steps[lane] {
                in_steps
            } else {
                self.in_steps[lane]
            };
        }
        for lane in 0..LANES {
            // As in `Measure::add_lanes`, in `f32`.
            let limit = 0.5 * steps[lane] + xs[lane].abs() * EXACT_SLACK + f32::MIN_POSITIVE;
            let error = errors[lane];
            self.beyond[lane] += u32::from(error.is_nan()) + u32::from(error > limit);
        }
    }

    /// [`Group::add_lanes`] of one value, in lane 0.
    #[inline(always)]
    pub fn add(&mut self, x: f32, back: f32, step: f32, per_step: f32) {
        let mut xs = [0.0; LANES];
        let mut backs = [0.0; LANES];
        let (mut steps, mut per_steps) = ([0.0; LANES], [0.0; LANES]);
        (xs[0], backs[0], steps[0], per_steps[0]) = (x, back, step, per_step);
        self.add_lanes(&xs, &backs, &steps, &per_steps);
    }

    /// Adds values `xs` that came back as `backs` on a grid of one step, `step`, the error
    /// `x - back` exact in `f32` (see [`Group::add_lanes`]): the error over the step is
    /// then the error itself, scaled when the group ends ([`Measure::end_group`] with the
    /// step's inverse). At most [`GROUP_VALUES`] values a group.
    ///
    /// The largest error and the count beyond half a step are integer reductions (a
    /// non-negative `f32`'s bits order as it does), which vectorize as whole loops; the sums of
    /// squares lane by lane in a loop of their own.
    #[inline(always)]
    pub fn add_on_grid(&mut self, xs: &[f32], backs: &[f32], step: f32) {
        let half_step = 0.5 * step + f32::MIN_POSITIVE;
        let (mut largest, mut beyond) = (0u32, 0u32);
        for (&x, &back) in xs.iter().zip(backs) {
            let error = (x - back).abs();
            largest = largest.max(error.to_bits());
            // As in `Measure::add_lanes`.
            let limit = half_step + x.abs() * EXACT_SLACK;
            beyond += u32::from(error.is_nan()) + u32::from(error > limit);
        }
        let (chunks, rest) = xs.as_chunks::<LANES>();
        let (back_chunks, back_rest) = backs.as_chunks::<LANES>();
        for (xs, backs) in chunks.iter().zip(back_chunks) {
            for lane in 0..LANES {
                let error = xs[lane] - backs[lane];
                self.signal[lane] += xs[lane] * xs[lane];
                self.noise[lane] += error * error;
            }
        }
        for (&x, &back) in rest.iter().zip(back_rest) {
            let error = x - back;
            self.signal[0] += x * x;
            self.noise[0] += error * error;
        }
        // A NaN error is counted beyond, and left out of the largest, as in `Group::add_lanes`.
        let largest = f32::from_bits(largest);
        if largest > self.abs[0] {
            self.abs[0] = largest;
        }
        if largest > self.in_steps[0] {
            self.in_steps[0] = largest;
        }
        self.beyond[0] += beyond;
    }
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

    /// Ends a [`Group`] whose unit step's inverse is
    /// `inverse_unit` (0 when the step is).
    #[inline(always)]
    pub fn end_group(&mut self, group: &Group, inverse_unit: f64) {
        for lane in 0..LANES {
            self.signal[lane] += f64::from(group.signal[lane]);
            self.noise[lane] += f64::from(group.noise[lane]);
            self.beyond[lane] += group.beyond[lane];
            let error = f64::from(group.abs[lane]);
            self.max_abs[lane] = if error > self.max_abs[lane] {
                error
            } else {
                self.max_abs[lane]
            };
            let in_steps = f64::from(group.in_steps[lane]) * inverse_unit;
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

/// Holds the sums of [`Measure::add_exact_lanes`] to those of [`Measure::add_lanes`] on the
/// same values: the largest errors the same to the bit, the sums of squares within their
/// `f32` rounding.
#[cfg(test)]
pub fn assert_agree(
    plain: &ErrorSums,
    exact: &ErrorSums,
) -> Result<(), proptest::test_runner::TestCaseError> {
    for (name, a, b) in [
        ("signal", plain.signal, exact.signal),
        ("noise", plain.noise, exact.noise),
    ] {
        proptest::prop_assert!(
            (a - b).abs() <= a.abs() * 2f64.powi(-16),
            "{name}: {a} against {b}"
        );
    }
    proptest::prop_assert_eq!(plain.max_abs.to_bits(), exact.max_abs.to_bits());
    proptest::prop_assert_eq!(plain.max_in_steps.to_bits(), exact.max_in_steps.to_bits());
    Ok(())
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
