//! Steps the schemes' kernels share, written so that the loops calling them vectorize: rounding
//! without a call to `rint` (x86-64 has no SIMD rounding before SSE4.1), clamping without
//! `f32::clamp`'s NaN rules, and the error measures summed lane by lane.
#![expect(
    clippy::inline_always,
    reason = "inlined into the kernels, whose copies for AVX2 and AVX-512 they must share"
)]

use super::scheme::ErrorSums;
use crate::format::Dtype;
use crate::quant::kernels::Half;

/// Values handled side by side.
pub const LANES: usize = 8;

/// The type the loaders work a weight's values out in from its codes and scales: the scales'
/// own (`crate::quant::kernels` reads them so; `stui diff` and `o` with it), BF16 for NVFP4.
/// A model decompressed to dense weights computes with these values, so the errors the schemes
/// report are theirs: a BF16 or F16 value is the grid's value rounded once more, by up to half
/// a step of that type, which for 8-bit codes reaches half a step of the grid at the largest
/// values. The half-step check and the largest error in steps stay on the grid itself, what
/// the codes and scales hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Loaded {
    /// `F64` scales: the exact product.
    #[default]
    F64,
    /// `F32` scales: the product rounded to `f32`, as the `f32` kernels work it out.
    F32,
    /// 16-bit scales: the product rounded to their type.
    Half(Half),
}

/// How the `f32` kernels round the values they measure to the loader's type, as a constant
/// each kernel is compiled for (see [`for_loaded`]): chosen for every [`WIDE`] values instead,
/// the rounded values passed through memory and a comparison took a tenth more time.
pub type Rounding = u8;
/// No rounding: `F32` (and `F64`) scales.
pub const AS_IS: Rounding = 0;
/// To BF16.
pub const TO_BF16: Rounding = 1;
/// To F16.
pub const TO_F16: Rounding = 2;

/// Runs `$body` with the constant `$rounding` of [`Loaded`] `$loaded`, compiled once for each.
macro_rules! for_loaded {
    ($loaded:expr, $rounding:ident => $body:expr) => {
        match $loaded.rounding() {
            $crate::quantize::lanes::TO_BF16 => {
                const $rounding: $crate::quantize::lanes::Rounding =
                    $crate::quantize::lanes::TO_BF16;
                $body
            }
            $crate::quantize::lanes::TO_F16 => {
                const $rounding: $crate::quantize::lanes::Rounding =
                    $crate::quantize::lanes::TO_F16;
                $body
            }
            _ => {
                const $rounding: $crate::quantize::lanes::Rounding = $crate::quantize::lanes::AS_IS;
                $body
            }
        }
    };
}
pub(crate) use for_loaded;

/// Values `backs`, worked out in `f32`, rounded as `ROUNDING` says.
#[inline(always)]
pub fn round<const ROUNDING: Rounding>(backs: &[f32; WIDE]) -> [f32; WIDE] {
    let mut loaded = *backs;
    match ROUNDING {
        // `Half::round` without its care for NaN, whose select kept the loop from
        // vectorizing: a NaN product stays NaN (but for payloads no product has).
        TO_BF16 => {
            for back in &mut loaded {
                *back = f32::from_bits(Half::bf16_bits(back.to_bits()));
            }
        }
        // F16's normal values keep 10 bits of the mantissa; below `2^-14` its values are
        // whole multiples of `2^-24`; beyond 65504 it rounds to infinity.
        TO_F16 => {
            for back in &mut loaded {
                let bits = back.to_bits();
                let normal = bits.wrapping_add(0xFFF + ((bits >> 13) & 1)) & 0xFFFF_E000;
                let subnormal = round_even(*back * F16_UNITS) * (1.0 / F16_UNITS);
                let rounded = if back.abs() < F16_NORMAL {
                    subnormal
                } else {
                    f32::from_bits(normal)
                };
                *back = if rounded.abs() > F16_LARGEST {
                    f32::INFINITY.copysign(*back)
                } else {
                    rounded
                };
            }
        }
        _ => {}
    }
    loaded
}

/// F16's smallest normal value.
const F16_NORMAL: f32 = 1.0 / 16_384.0;
/// The inverse of the step of F16's subnormal values.
const F16_UNITS: f32 = 16_777_216.0;
/// F16's largest value.
const F16_LARGEST: f32 = 65_504.0;

impl Loaded {
    /// How values on a grid of scales stored as `scales` are loaded.
    pub fn of(scales: Dtype) -> Loaded {
        match scales {
            Dtype::F64 => Loaded::F64,
            other => Half::of(other).map_or(Loaded::F32, Loaded::Half),
        }
    }

    /// The [`Rounding`] constant of this type, which the kernels are compiled for.
    pub fn rounding(self) -> Rounding {
        match self {
            Loaded::F64 | Loaded::F32 => AS_IS,
            Loaded::Half(Half::Bf16) => TO_BF16,
            Loaded::Half(Half::F16) => TO_F16,
        }
    }

    /// A value `back` worked out exactly in `f64`, as the loaders give it. A product of a code
    /// and a 16-bit scale is exact in `f32` (at most 19 significant bits), so that rounding to
    /// `f32` first rounds nothing twice; NVFP4's loader itself works in `f32` before BF16.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "rounding to the loader's type is the point"
    )]
    pub fn round_wide(self, back: f64) -> f64 {
        match self {
            Loaded::F64 => back,
            Loaded::F32 => f64::from(back as f32),
            Loaded::Half(half) => f64::from(half.round(back as f32)),
        }
    }
}

/// Adding and taking away 1.5 · 2^23 rounds an `f32` of magnitude below 2^22 to the nearest
/// whole number, ties to even, as `round_ties_even` does.
pub const ROUNDER: f32 = 12_582_912.0;

/// `value` (of magnitude at most 2^22) rounded to the nearest whole number, ties to even. A
/// larger value comes back beyond 2^22 still, with its sign (infinities as they are): clamped to
/// a range of codes, as the kernels clamp it, it gives the range's end as the exact rounding
/// would.
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

/// The larger of `a` and `b`, `b` when they do not compare (a running maximum `b` keeps it
/// through NaN), as one compare and select, which vectorizes where `f32::max`'s NaN rules do
/// not.
#[inline(always)]
pub fn larger<T: PartialOrd>(a: T, b: T) -> T {
    if a > b { a } else { b }
}

/// `value` held within `[low, high]`.
#[inline(always)]
pub fn clamp(value: f32, low: f32, high: f32) -> f32 {
    let value = if value < low { low } else { value };
    if value > high { high } else { value }
}

/// The rounding of the `f32` quotient allowed for in the half-step check (see `add_lanes`).
const EXACT_SLACK: f32 = 1.0 / 4_194_304.0;

/// The half step's share of that check in `f32` for values wider than BF16, whose back value
/// and error are each rounded once (at most `2^-24` of the step each near the half step).
const HALF_STEP_SLACK: f32 = 1.0 + 1.0 / 2_097_152.0;

/// Values whose squares [`Squares`] sums in `f32` at most (a lane's sum of 64 terms then loses
/// at most `2^-18` of itself) before adding them into its `f64` sums.
pub const GROUP_VALUES: usize = 1024;

/// `scale` as `f32` when `f32` holds it exactly and it is a step whose group can be measured in
/// `f32` (see [`measured_in_f32`]).
pub fn scale_in_f32(scale: f64) -> Option<f32> {
    #[expect(clippy::cast_possible_truncation, reason = "kept only when exact")]
    let narrow = scale as f32;
    (f64::from(narrow) == scale && measured_in_f32(narrow)).then_some(narrow)
}

/// The smallest and largest step of a grid whose values' and errors' squares [`Checked`] and
/// [`Tally`] sum in `f32`. A group's values are then within `2^49` (448 steps, FP8's widest
/// grid), whose squares summed [`GROUP_VALUES`] at a time stay below `2^108`, and its errors
/// near a step or a part of one (a quarter, on average) are above `2^-45`, whose squares stay
/// normal (above `2^-126`). Beyond these the squares would overflow to infinity or fall to 0:
/// such groups are measured in `f64`.
const F32_STEPS: (f32, f32) = (1.0 / 1_099_511_627_776.0, 1_099_511_627_776.0);

/// Whether a group on a grid of step `scale` can be measured in `f32` (see [`F32_STEPS`]).
#[inline(always)]
pub fn measured_in_f32(scale: f32) -> bool {
    (F32_STEPS.0..=F32_STEPS.1).contains(&scale)
}

/// Whether the values of a tensor whose largest magnitude is `absmax` can be measured in `f32`
/// under any scheme ([`Tally`]): within `2^30` of 1 either way, the squares of its values and
/// of their errors are below `2^60`, and those that fall out of `f32`'s normal range (of values
/// or errors below `2^-63`) are below `2^-66` of its largest: no share of its sums to tell.
pub fn tensor_measured_in_f32(absmax: f64) -> bool {
    (1.0 / 1_073_741_824.0..=1_073_741_824.0).contains(&absmax)
}

/// The error measures of [`ErrorSums`] and the half-step check, summed lane by lane, in `f64`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Measure {
    loaded: Loaded,
    signal: [f64; LANES],
    noise: [f64; LANES],
    max_abs: [f64; LANES],
    max_in_steps: [f64; LANES],
    beyond: [u32; LANES],
}

impl Measure {
    pub fn new(loaded: Loaded) -> Measure {
        Measure {
            loaded,
            ..Measure::default()
        }
    }

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
        let (mut errors, mut loaded_errors) = ([0f64; LANES], [0f64; LANES]);
        for lane in 0..LANES {
            wide[lane] = f64::from(xs[lane]);
            errors[lane] = (wide[lane] - backs[lane]).abs();
            loaded_errors[lane] = (wide[lane] - self.loaded.round_wide(backs[lane])).abs();
        }
        for lane in 0..LANES {
            self.signal[lane] += wide[lane] * wide[lane];
            self.noise[lane] += loaded_errors[lane] * loaded_errors[lane];
        }
        for lane in 0..LANES {
            self.max_abs[lane] = larger(loaded_errors[lane], self.max_abs[lane]);
            let in_steps = errors[lane] * inverse_steps[lane];
            self.max_in_steps[lane] = larger(in_steps, self.max_in_steps[lane]);
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

/// Values a [`Tally`] or a [`Compared`] takes side by side: one AVX-512 register, two AVX2 ones.
pub const WIDE: usize = 16;

/// A sum of squares, [`WIDE`] lanes side by side: summed in `f32` for at most [`GROUP_VALUES`]
/// values, then added into `f64` sums.
#[derive(Clone, Copy, Debug, Default)]
pub struct SquareSum {
    lanes: [f32; WIDE],
    pending: usize,
    total: [f64; WIDE],
}

impl SquareSum {
    /// Adds the squares of `xs`.
    #[inline(always)]
    pub fn add(&mut self, xs: &[f32; WIDE]) {
        for (sum, &x) in self.lanes.iter_mut().zip(xs) {
            *sum += x * x;
        }
        self.pending += WIDE;
        if self.pending >= GROUP_VALUES {
            self.flush();
        }
    }

    /// Adds the `f32` sums into the `f64` ones.
    fn flush(&mut self) {
        for lane in 0..WIDE {
            self.total[lane] += f64::from(self.lanes[lane]);
        }
        (self.lanes, self.pending) = ([0.0; WIDE], 0);
    }

    /// The sum of the squares.
    pub fn total(mut self) -> f64 {
        self.flush();
        self.total.iter().sum()
    }
}

/// Squares of values and of their errors, as [`SquareSum`] sums them, with one count of the
/// values summed in `f32` for both. Written out rather than as two `SquareSum`s or one generic
/// sum of `N` quantities: with either, the compiler kept a save's sums in memory in some builds,
/// and its check took from a third more to twice the time.
#[derive(Clone, Copy, Debug, Default)]
struct Squares {
    signal: [f32; WIDE],
    noise: [f32; WIDE],
    pending: usize,
    total_signal: [f64; WIDE],
    total_noise: [f64; WIDE],
}

impl Squares {
    /// Adds the squares of `xs` and of their `errors`.
    #[inline(always)]
    fn add(&mut self, xs: &[f32; WIDE], errors: &[f32; WIDE]) {
        for lane in 0..WIDE {
            self.signal[lane] += xs[lane] * xs[lane];
            self.noise[lane] += errors[lane] * errors[lane];
        }
        self.pending += WIDE;
        if self.pending >= GROUP_VALUES {
            self.flush();
        }
    }

    /// Adds the `f32` sums into the `f64` ones.
    fn flush(&mut self) {
        for lane in 0..WIDE {
            self.total_signal[lane] += f64::from(self.signal[lane]);
            self.total_noise[lane] += f64::from(self.noise[lane]);
        }
        (self.signal, self.noise, self.pending) = ([0.0; WIDE], [0.0; WIDE], 0);
    }

    /// The sums of the squares of the values and of their errors.
    fn totals(mut self) -> (f64, f64) {
        self.flush();
        (
            self.total_signal.iter().sum(),
            self.total_noise.iter().sum(),
        )
    }
}

/// The errors of values as they are loaded, [`WIDE`] lanes side by side: the squares of the
/// values and of their errors ([`Squares`]) and the largest error in each lane, what [`Tally`]
/// and [`Checked`] share.
#[derive(Clone, Copy, Debug, Default)]
struct LoadedErrors {
    loaded: Loaded,
    squares: Squares,
    largest: [f32; WIDE],
}

impl LoadedErrors {
    /// Adds values `xs` that came back as `backs` on the grid, loaded as `ROUNDING` (the
    /// constant of `self.loaded`) says; gives their errors on the grid, `|x - back|` (worked out
    /// in the same loop: in a loop of the caller's own, a save took 5% more CPU time).
    #[inline(always)]
    fn add<const ROUNDING: Rounding>(
        &mut self,
        xs: &[f32; WIDE],
        backs: &[f32; WIDE],
    ) -> [f32; WIDE] {
        debug_assert_eq!(ROUNDING, self.loaded.rounding());
        self.add_loaded(xs, backs, &round::<ROUNDING>(backs))
    }

    /// [`LoadedErrors::add`] of values whose `backs` are `loaded` in the loader's type.
    #[inline(always)]
    fn add_loaded(
        &mut self,
        xs: &[f32; WIDE],
        backs: &[f32; WIDE],
        loaded: &[f32; WIDE],
    ) -> [f32; WIDE] {
        let (mut errors, mut on_grid) = ([0f32; WIDE], [0f32; WIDE]);
        for lane in 0..WIDE {
            errors[lane] = xs[lane] - loaded[lane];
            self.largest[lane] = larger(errors[lane].abs(), self.largest[lane]);
            on_grid[lane] = (xs[lane] - backs[lane]).abs();
        }
        self.squares.add(xs, &errors);
        on_grid
    }

    /// The sums of the squares of the values and of their errors, and the largest error.
    fn finish(self) -> (f64, f64, f64) {
        let (signal, noise) = self.squares.totals();
        let largest = self.largest.into_iter().fold(0.0, f32::max);
        (signal, noise, f64::from(largest))
    }
}

/// The error measures of [`ErrorSums`] for values measured as they are quantized, lane by lane
/// (W8A8's writer; a comparison of schemes takes [`Compared`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Tally {
    errors: LoadedErrors,
    max_in_steps: [f32; WIDE],
}

impl Tally {
    pub fn new(loaded: Loaded) -> Tally {
        Tally {
            errors: LoadedErrors {
                loaded,
                ..LoadedErrors::default()
            },
            ..Tally::default()
        }
    }

    /// Adds values `xs`, which would come back as `backs` on the grid, each on a grid whose
    /// local step's inverse is `inverse_steps[lane]`, loaded as `ROUNDING` (the constant of
    /// `Tally::new`'s type) says. Padding of zeros coming back as zeros adds nothing.
    #[inline(always)]
    pub fn add<const ROUNDING: Rounding>(
        &mut self,
        xs: &[f32; WIDE],
        backs: &[f32; WIDE],
        inverse_steps: &[f32; WIDE],
    ) {
        let on_grid = self.errors.add::<ROUNDING>(xs, backs);
        for lane in 0..WIDE {
            let in_steps = on_grid[lane] * inverse_steps[lane];
            self.max_in_steps[lane] = larger(in_steps, self.max_in_steps[lane]);
        }
    }

    pub fn finish(self) -> ErrorSums {
        let (signal, noise, max_abs) = self.errors.finish();
        ErrorSums {
            signal,
            noise,
            max_abs,
            max_in_steps: f64::from(self.max_in_steps.into_iter().fold(0.0, f32::max)),
        }
    }
}

/// What a comparison of schemes measures of values quantized without codes (it writes
/// nothing), lane by lane: the squares of their errors as loaded, and the largest. The squares
/// of the values themselves, the same for every scheme, the comparison sums once
/// ([`SquareSum`]); the largest error in steps, which no comparison shows, is not measured.
#[derive(Clone, Copy, Debug, Default)]
pub struct Compared {
    loaded: Loaded,
    noise: SquareSum,
    largest: [f32; WIDE],
}

impl Compared {
    pub fn new(loaded: Loaded) -> Compared {
        Compared {
            loaded,
            ..Compared::default()
        }
    }

    /// The type the values are loaded in.
    pub fn loaded(&self) -> Loaded {
        self.loaded
    }

    /// Adds values `xs`, which would come back as `backs` on the grid, loaded as `ROUNDING` (the
    /// constant of [`Compared::loaded`]) says. Padding of zeros coming back as zeros adds nothing.
    #[inline(always)]
    pub fn add<const ROUNDING: Rounding>(&mut self, xs: &[f32; WIDE], backs: &[f32; WIDE]) {
        debug_assert_eq!(ROUNDING, self.loaded.rounding());
        self.add_loaded(xs, &round::<ROUNDING>(backs));
    }

    /// Adds values `xs` that come back as `loaded`, already in the loader's type.
    #[inline(always)]
    pub fn add_loaded(&mut self, xs: &[f32; WIDE], loaded: &[f32; WIDE]) {
        let mut errors = [0f32; WIDE];
        for lane in 0..WIDE {
            errors[lane] = xs[lane] - loaded[lane];
            self.largest[lane] = larger(errors[lane].abs(), self.largest[lane]);
        }
        self.noise.add(&errors);
    }

    /// The sums, with `signal` the values' squares summed apart; the largest error in steps
    /// left at 0 (not measured).
    pub fn finish(self, signal: f64) -> ErrorSums {
        ErrorSums {
            signal,
            noise: self.noise.total(),
            max_abs: f64::from(self.largest.into_iter().fold(0.0, f32::max)),
            max_in_steps: 0.0,
        }
    }
}

/// The measures of values read back from a file, as [`Measure`] takes them, in `f32`, for whole
/// rows of groups, [`WIDE`] values side by side with no reduction across the lanes until the
/// end (measured group by group, each ending in a reduction, the measure took twice the time).
///
/// The error `x - back` is exact in `f32` for BF16 values on a grid of BF16 scales times small
/// whole numbers or powers of two, the one `f64` gives; for wider values the back value and the
/// error are each rounded once, which the half-step check allows for ([`HALF_STEP_SLACK`]). The
/// squares are summed in `f32` for at most [`GROUP_VALUES`] values (as in [`Tally`]), then in
/// `f64`. The largest error over the steps is found in the group's unit (each step a power of
/// two times it, so that by monotone rounding the largest error times `per_steps` is the largest
/// error over its step, in units), then in `f64` over the unit when the group ends.
#[derive(Clone, Copy, Debug, Default)]
pub struct Checked {
    errors: LoadedErrors,
    group_in_units: [f32; WIDE],
    in_steps: [f64; WIDE],
    beyond: [u32; WIDE],
}

impl Checked {
    pub fn new(loaded: Loaded) -> Checked {
        Checked {
            errors: LoadedErrors {
                loaded,
                ..LoadedErrors::default()
            },
            ..Checked::default()
        }
    }

    /// The type the values are loaded in.
    pub fn loaded(&self) -> Loaded {
        self.errors.loaded
    }

    /// Adds values `xs` of the group under way that came back as `backs` on the grid, whose
    /// local step around `backs[lane]` is `steps[lane]`, that step a power of two
    /// `1 / per_steps[lane]` times the group's unit, loaded as `ROUNDING` (the constant of
    /// [`Checked::loaded`]) says. Padding of zeros coming back as zeros adds nothing.
    #[inline(always)]
    pub fn add<const ROUNDING: Rounding>(
        &mut self,
        xs: &[f32; WIDE],
        backs: &[f32; WIDE],
        steps: &[f32; WIDE],
        per_steps: &[f32; WIDE],
    ) {
        debug_assert_eq!(ROUNDING, self.errors.loaded.rounding());
        self.add_loaded(xs, backs, &round::<ROUNDING>(backs), steps, per_steps);
    }

    /// [`Checked::add`] of values whose `backs` are `loaded` in the loader's type.
    #[inline(always)]
    pub fn add_loaded(
        &mut self,
        xs: &[f32; WIDE],
        backs: &[f32; WIDE],
        loaded: &[f32; WIDE],
        steps: &[f32; WIDE],
        per_steps: &[f32; WIDE],
    ) {
        let on_grid = self.errors.add_loaded(xs, backs, loaded);
        for lane in 0..WIDE {
            let on_grid = on_grid[lane];
            self.group_in_units[lane] =
                larger(on_grid * per_steps[lane], self.group_in_units[lane]);
            // As in `Measure::add_lanes`.
            let limit = 0.5 * steps[lane] * HALF_STEP_SLACK
                + xs[lane].abs() * EXACT_SLACK
                + f32::MIN_POSITIVE;
            self.beyond[lane] += u32::from(on_grid.is_nan()) + u32::from(on_grid > limit);
        }
    }

    /// Ends the group under way, whose unit's inverse is `inverse_unit`.
    #[inline(always)]
    pub fn end_group(&mut self, inverse_unit: f64) {
        for lane in 0..WIDE {
            let in_steps = f64::from(self.group_in_units[lane]) * inverse_unit;
            self.in_steps[lane] = larger(in_steps, self.in_steps[lane]);
        }
        self.group_in_units = [0.0; WIDE];
    }

    /// The sums, and whether every value was within half a step.
    pub fn finish(self) -> (ErrorSums, bool) {
        let (signal, noise, max_abs) = self.errors.finish();
        let sums = ErrorSums {
            signal,
            noise,
            max_abs,
            max_in_steps: self.in_steps.into_iter().fold(0.0, f64::max),
        };
        (sums, self.beyond == [0; WIDE])
    }
}

/// What a measure without codes divides a scale's values by. Dividing, as the writers do, gives
/// their very codes: a product by the inverse rounds to another code where a value lies within
/// its rounding of a tie, and that can move the value to another grid step. A scale of 0 or
/// beyond `f32` codes every value as 0, as the writers do: the quotient by an infinite divisor.
#[inline(always)]
pub fn divisor(scale: f32) -> f32 {
    if scale > 0.0 && scale.is_finite() {
        scale
    } else {
        f32::INFINITY
    }
}

/// `values` as chunks of [`WIDE`], the last padded with zeros.
#[inline(always)]
pub fn wide_chunks(values: &[f32]) -> impl Iterator<Item = [f32; WIDE]> + '_ {
    let (chunks, rest) = values.as_chunks::<WIDE>();
    let padded = (!rest.is_empty()).then(|| {
        let mut chunk = [0f32; WIDE];
        chunk[..rest.len()].copy_from_slice(rest);
        chunk
    });
    chunks.iter().copied().chain(padded)
}

/// Holds the sums of a [`Checked`] to those of [`Measure::add_lanes`] on the same values.
/// When `exact` (BF16 values and scales) the errors are the same, so the largest are the same to
/// the bit and the sums of squares within their `f32` rounding. Otherwise each error may be off
/// by `d`, up to about `2^-23 · |x|` (the back value's and the error's rounding): a sum of squares
/// moves by at most `2 √(noise · Σd²) + Σd²` besides, with `Σd² ≤ 2^-46 · signal`, and the
/// largest error by `2^-23 · √signal` (here with a factor of two to spare).
#[cfg(test)]
pub fn assert_agree(
    plain: &ErrorSums,
    in_f32: &ErrorSums,
    exact: bool,
) -> Result<(), proptest::test_runner::TestCaseError> {
    let close = |a: f64, b: f64, relative: f64, absolute: f64| {
        (a - b).abs() <= a.abs().max(b.abs()) * relative + absolute
    };
    let (signal, noise) = (plain.signal, plain.noise);
    let rounding = if exact {
        0.0
    } else {
        2f64.powi(-21) * (noise * signal).sqrt() + 2f64.powi(-44) * signal
    };
    for (name, a, b, absolute) in [
        ("signal", plain.signal, in_f32.signal, 0.0),
        ("noise", plain.noise, in_f32.noise, rounding),
    ] {
        proptest::prop_assert!(
            close(a, b, 2f64.powi(-16), absolute),
            "{name}: {a} against {b}"
        );
    }
    for (name, a, b, absolute) in [
        (
            "largest error",
            plain.max_abs,
            in_f32.max_abs,
            2f64.powi(-22) * signal.sqrt(),
        ),
        (
            "largest in steps",
            plain.max_in_steps,
            in_f32.max_in_steps,
            2f64.powi(-14),
        ),
    ] {
        if exact {
            proptest::prop_assert_eq!(a.to_bits(), b.to_bits(), "{}", name);
        } else {
            proptest::prop_assert!(
                close(a, b, 2f64.powi(-14), absolute),
                "{name}: {a} against {b}"
            );
        }
    }
    Ok(())
}

/// Values for the kernels' property tests: mostly of the size of weights, some tiny, some 0.
#[cfg(test)]
pub fn test_values(
    lengths: std::ops::Range<usize>,
) -> impl proptest::strategy::Strategy<Value = Vec<f32>> {
    proptest::collection::vec(
        proptest::prop_oneof![
            8 => -4.0f32..4.0,
            2 => -1e-3f32..1e-3,
            1 => proptest::strategy::Just(0.0f32)
        ],
        lengths,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loaders' rounding in lanes is `half`'s, for every value but NaN (a spread of all
    /// `f32` bit patterns, and every value near each type's steps, subnormals and largest).
    #[test]
    fn loaded_values_round_as_half_rounds_them() {
        let spread = (0..=u32::MAX).step_by(4_099).map(f32::from_bits);
        let near = |low: u32, high: u32| (low..high).step_by(7).map(f32::from_bits);
        let edges = near(0x3800_0000, 0x3880_0000) // F16's subnormals and smallest normals
            .chain(near(0x3300_0000, 0x3400_0000)) // around 2^-25, F16's rounding to 0
            .chain(near(0x477f_0000, 0x4780_1000)) // around 65504, F16's largest
            .chain(near(0x7f7f_0000, 0x7f80_0001)) // around BF16's largest and infinity
            .chain(near(0, 0x0001_0000)); // BF16's (and F32's) subnormals
        let values: Vec<f32> = spread.chain(edges).filter(|x| !x.is_nan()).collect();
        for chunk in values.chunks_exact(WIDE) {
            let chunk: [f32; WIDE] = chunk.try_into().unwrap();
            for (loaded, half) in [
                (Loaded::Half(Half::Bf16), Half::Bf16),
                (Loaded::Half(Half::F16), Half::F16),
            ] {
                let rounded = for_loaded!(loaded, ROUNDING => round::<ROUNDING>(&chunk));
                for lane in 0..WIDE {
                    let (x, got) = (chunk[lane], rounded[lane]);
                    let expected = half.round(x);
                    // As numbers: F16's subnormals may round a negative value to +0, which
                    // changes no error.
                    assert!(
                        got == expected,
                        "{half:?} {x:e}: {got:e} against {expected:e}"
                    );
                    assert!(
                        loaded.round_wide(f64::from(x)) == f64::from(expected),
                        "{x:e}"
                    );
                }
            }
        }
    }

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
