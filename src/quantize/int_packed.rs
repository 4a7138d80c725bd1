//! Grouped int weights in the compressed-tensors `pack-quantized` layout (W8A16, W4A16,
//! `W4A16_ASYM`):
//!
//! - `P.weight_packed` I32 `[out, ceil(in·b/32)]`: the code `u = q + 2^(b-1)` of column `i` at bit
//!   `i·b` of the row's little-endian stream of words;
//! - `P.weight_scale` `[out, ceil(in/g)]` in the source's float dtype;
//! - `P.weight_zero_point` I32 `[ceil(out·b/32), ceil(in/g)]` (asymmetric only): zero point codes
//!   packed down each column, row `o` at bit `o·b`;
//! - `P.weight_shape` I64 `[out, in]`.
//!
//! Symmetric: `scale = absmax / (2^(b-1) - 1/2)`, `q = clamp(round(x / scale))`. Asymmetric:
//! `scale = (max - min) / (2^b - 1)` over a range holding 0, `zp = round(-2^(b-1) - min / scale)`,
//! `q = clamp(round(x / scale + zp))`; `x' = (q - zp) · scale`. As the presets compute them, with
//! one difference: a scale that storing rounded below its exact value is rounded up instead, so
//! that no value is clipped by more than half a step.

use super::code_table;
use super::lanes::{
    Checked, Compared, LANES, Loaded, Measure, Rounding, WIDE, byte_of, clamp, divisor, for_loaded,
    larger, measured_in_f32, round_even, scale_in_f32, wide_chunks,
};
use super::scheme::{ErrorSums, Plan, Scheme, Streams};
use super::{bf16_at_least, encode_scale, stored_at_least};
use crate::format::Dtype;
use multiversion::multiversion;
use multiversion::target::match_target;
use smallvec::SmallVec;

fn bits(plan: &Plan) -> u32 {
    plan.scheme.bits()
}

fn columns(plan: &Plan) -> usize {
    usize::try_from(plan.columns).unwrap_or(usize::MAX).max(1)
}

fn group(plan: &Plan) -> usize {
    usize::try_from(plan.group).unwrap_or(usize::MAX).max(1)
}

/// Values [`range`] compares side by side: one AVX-512 register, two AVX2 ones.
const RANGE_LANES: usize = 16;

/// The smallest and largest value (and 0) of each group of `group` values of `row`, into
/// `extremes`.
fn ranges(row: &[f32], group: usize, extremes: &mut Vec<(f32, f32)>) {
    extremes.clear();
    extremes.extend(row.chunks(group).map(range));
}

/// The ranges (see [`range`]) of every group of every row of a block of finite values, worked
/// out once for all the schemes compared that start from them: the three int schemes, and W8A8
/// and FP8, whose rows' and blocks' largest magnitudes they give.
#[derive(Debug)]
pub struct BlockRanges {
    group: usize,
    groups_per_row: usize,
    extremes: Vec<(f32, f32)>,
}

impl BlockRanges {
    pub fn of(values: &[f32], columns: usize, group: usize) -> BlockRanges {
        let group = group.max(1);
        let mut extremes = Vec::with_capacity(values.len().div_ceil(group));
        for row in values.chunks(columns.max(1)) {
            extremes.extend(row.chunks(group).map(range));
        }
        BlockRanges {
            group,
            groups_per_row: columns.max(1).div_ceil(group),
            extremes,
        }
    }

    /// Row `row`'s groups' ranges, where its groups are of `group` values.
    fn row(&self, row: usize, group: usize) -> Option<&[(f32, f32)]> {
        (group == self.group).then(|| self.of_row(row))
    }

    /// The values in each group.
    pub fn group(&self) -> usize {
        self.group
    }

    /// Row `row`'s groups' ranges (fewer for a last row cut short).
    fn of_row(&self, row: usize) -> &[(f32, f32)] {
        let at = (row * self.groups_per_row).min(self.extremes.len());
        &self.extremes[at..(at + self.groups_per_row).min(self.extremes.len())]
    }

    /// Row `row`'s largest magnitude.
    pub fn row_absmax(&self, row: usize) -> f32 {
        self.of_row(row)
            .iter()
            .fold(0f32, |largest, &range| largest.max(magnitude(range)))
    }

    /// The largest magnitude of each column of groups over rows `rows`.
    pub fn columns_absmax(&self, rows: std::ops::Range<usize>) -> Vec<f32> {
        let mut maxima = vec![0f32; self.groups_per_row];
        for row in rows {
            for (max, &range) in maxima.iter_mut().zip(self.of_row(row)) {
                *max = max.max(magnitude(range));
            }
        }
        maxima
    }
}

/// The largest magnitude of a range holding 0.
fn magnitude((low, high): (f32, f32)) -> f32 {
    (-low).max(high)
}

/// The smallest and largest of `values` and 0. The lanes are reduced one after the other at the
/// end: folded onto each other in halves, they led the compiler to put the whole function's lanes
/// four to a register, and the ranges took more time.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn range(values: &[f32]) -> (f32, f32) {
    let (chunks, rest) = values.as_chunks::<RANGE_LANES>();
    // Two loops: in one, the compiler packed both ends' lanes into one register and shuffled
    // them apart at every step.
    let mut low = [0f32; RANGE_LANES];
    for chunk in chunks {
        for lane in 0..RANGE_LANES {
            low[lane] = if chunk[lane] < low[lane] {
                chunk[lane]
            } else {
                low[lane]
            };
        }
    }
    let mut high = [0f32; RANGE_LANES];
    for chunk in chunks {
        for lane in 0..RANGE_LANES {
            high[lane] = if chunk[lane] > high[lane] {
                chunk[lane]
            } else {
                high[lane]
            };
        }
    }
    for &x in rest {
        low[0] = if x < low[0] { x } else { low[0] };
        high[0] = larger(x, high[0]);
    }
    // No lane holds NaN (a comparison with NaN keeps what the lane held): plain comparisons
    // rather than `f32::min` and `f32::max`, whose care for NaN took two steps for each of the
    // lanes, and the reduction was most of the work for a group of 128.
    (
        low.into_iter()
            .fold(0.0, |low, x| if x < low { x } else { low }),
        high.into_iter().fold(0.0, |high, x| larger(x, high)),
    )
}

/// A group's scale and zero point (0 when symmetric), the scale as stored, from its `values`
/// and their [`range`]: of the scales and zero points that keep every value within half a step,
/// the one that leaves the least error.
///
/// Symmetric: the codes reach half a step further below zero than above it (`-2^(b-1)` against
/// `2^(b-1) - 1`), so the scale is the larger of the positive side's need and the negative side's,
/// which is finer than `absmax / (2^(b-1) - 1/2)` whenever the largest magnitude is negative.
/// Asymmetric: the stored scale nearest `(max - min) / (2^b - 1)` on either side, with every zero
/// point that keeps both ends within half a step.
fn scale_and_zero(plan: &Plan, values: &[f32], (min, max): (f32, f32)) -> (f64, i32) {
    let half = f64::from(1u32 << (bits(plan) - 1));
    let (min, max) = (f64::from(min), f64::from(max));
    if min == 0.0 && max == 0.0 {
        // An all-zero group: the presets store the scale dtype's epsilon, not 0 (a zero scale
        // reads as a group zeroed by mistake), every value at the zero point (`-2^(b-1)` when
        // asymmetric, as theirs).
        let zero = if plan.scheme == Scheme::W4A16Asym {
            -(1i32 << (bits(plan) - 1))
        } else {
            0
        };
        return (epsilon(plan.scale_dtype), zero);
    }
    if plan.scheme != Scheme::W4A16Asym {
        let need = (max / (half - 0.5)).max(-min / (half + 0.5));
        let scale = stored_at_least(plan.scale_dtype, need);
        return (scale_within(plan.scale_dtype, (min, max), scale, half), 0);
    }
    let exact = (max - min) / (2.0 * half - 1.0);
    let up = stored_at_least(plan.scale_dtype, exact);
    if up == 0.0 || !up.is_finite() {
        return (up, 0);
    }
    let nearest = super::stored(plan.scale_dtype, exact);
    let mut scales: SmallVec<[f64; 2]> = SmallVec::new();
    scales.push(nearest);
    if up != nearest {
        scales.push(up);
    }
    // The codes reach `2^b - 1` steps from 0 either side, less the zero point.
    if grid_may_pass(plan.scale_dtype, up, 2.0 * half) {
        scales.retain(|scale| extremes_within(plan.scale_dtype, (min, max), *scale));
        if scales.is_empty() {
            scales.push(scale_within(plan.scale_dtype, (min, max), up, 2.0 * half));
        }
    }
    let mut candidates: SmallVec<[(f64, i32); CANDIDATES]> = SmallVec::new();
    for &scale in &scales {
        if scale <= 0.0 {
            continue;
        }
        let (lowest, highest) = zero_points(half, (min, max), scale);
        if lowest <= highest {
            #[expect(clippy::cast_possible_truncation, reason = "within the code range")]
            candidates.push((scale, lowest as i32));
        }
    }
    // The one candidate there is most often (the nearest scale rounded down leaves none).
    if let [only] = candidates[..] {
        return only;
    }
    let mut best = (f32::INFINITY, scales[scales.len() - 1], 0);
    #[expect(clippy::cast_possible_truncation, reason = "2^(b-1), at most 128")]
    let half = half as f32;
    // Far from 1, the candidates' squared errors would overflow `f32` or vanish in it: the
    // values and the scales tried are then taken times a power of two near 1 / `up`, which
    // changes no quotient and no comparison of errors.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "scales are at most f32 here"
    )]
    let unit = if measured_in_f32(up as f32) {
        1.0
    } else {
        2f64.powi(-(up.log2().floor() as i32))
    };
    #[expect(
        clippy::cast_possible_truncation,
        reason = "f32 values times a power of two"
    )]
    let in_units_values: SmallVec<[f32; 256]> = if unit == 1.0 {
        SmallVec::new()
    } else {
        values
            .iter()
            .map(|&x| (f64::from(x) * unit) as f32)
            .collect()
    };
    if let [nearest, up] = candidates[..] {
        let errors = if unit == 1.0 {
            group_errors(values, [nearest, up], half)
        } else {
            let in_units = |(scale, zero): (f64, i32)| (scale * unit, zero);
            group_errors(&in_units_values, [in_units(nearest), in_units(up)], half)
        };
        for (&(scale, zero), &error) in [nearest, up].iter().zip(&errors) {
            if error < best.0 {
                best = (error, scale, zero);
            }
        }
    }
    (best.1, best.2)
}

/// What [`row_grid`] works in, handed from row to row: allocated for each row, it had been 4% of
/// a `W4A16_ASYM` save's time.
#[derive(Debug, Default)]
struct GridRoom {
    ups: Vec<(f64, i32)>,
    choices: Vec<ScaleChoice>,
}

/// Each group's scale and zero point of a row whose groups' ranges are `extremes`, into `grid`,
/// as [`scale_and_zero`] chooses them.
fn row_grid(
    plan: &Plan,
    row: &[f32],
    group: usize,
    extremes: &[(f32, f32)],
    grid: &mut Vec<(f64, i32)>,
    room: &mut GridRoom,
) {
    grid.clear();
    let half = f64::from(1u32 << (bits(plan) - 1));
    match (plan.scheme, plan.scale_dtype) {
        (Scheme::W4A16Asym, Dtype::Bf16) => {
            grid.resize(extremes.len(), (0.0, 0));
            let GridRoom { ups, choices } = room;
            ups.clear();
            ups.resize(extremes.len(), (0.0, 0));
            choices.clear();
            choices.resize(extremes.len(), ScaleChoice::Settled);
            asymmetric_bf16_scales(extremes, half, grid, ups, choices);
            #[expect(clippy::cast_possible_truncation, reason = "2^(b-1), at most 128")]
            let half32 = half as f32;
            for ((((cell, &up), chunk), &range), &choice) in grid
                .iter_mut()
                .zip(ups.iter())
                .zip(row.chunks(group))
                .zip(extremes)
                .zip(choices.iter())
            {
                match choice {
                    ScaleChoice::Settled => {}
                    // As `scale_and_zero` measures them: its units are 1 for such scales.
                    #[expect(clippy::cast_possible_truncation, reason = "a BF16 scale")]
                    ScaleChoice::NearestOrUp if measured_in_f32(up.0 as f32) => {
                        let errors = group_errors(chunk, [*cell, up], half32);
                        if errors[1] < errors[0] {
                            *cell = up;
                        }
                    }
                    ScaleChoice::NearestOrUp | ScaleChoice::Unsure => {
                        *cell = scale_and_zero(plan, chunk, range);
                        continue;
                    }
                }
                // A grid near the top of BF16's range, whose extremes `scale_and_zero` keeps
                // within it.
                if grid_may_pass(Dtype::Bf16, cell.0, 2.0 * half) {
                    *cell = scale_and_zero(plan, chunk, range);
                }
            }
        }
        (_, Dtype::Bf16) => {
            grid.resize(extremes.len(), (0.0, 0));
            symmetric_bf16_scales(extremes, half, grid);
            for (cell, &(min, max)) in grid.iter_mut().zip(extremes) {
                let range = (f64::from(min), f64::from(max));
                cell.0 = scale_within(Dtype::Bf16, range, cell.0, half);
            }
        }
        _ => {
            for (chunk, &range) in row.chunks(group).zip(extremes) {
                grid.push(scale_and_zero(plan, chunk, range));
            }
        }
    }
}

/// [`scale_and_zero`] of symmetric groups whose scales are stored as BF16 (a BF16 model's), from
/// their `extremes`, into `grid`: the smallest BF16 value at or above each group's need (as
/// `stored_at_least` finds it, from the bits), BF16's epsilon for a group of zeros. In one loop
/// over a row's groups without a branch (the compiler pairs its divisions): group by group, the
/// choice of a scale was as much work as coding the group.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn symmetric_bf16_scales(extremes: &[(f32, f32)], half: f64, grid: &mut [(f64, i32)]) {
    for (cell, &(min, max)) in grid.iter_mut().zip(extremes) {
        let (low, high) = (f64::from(min), f64::from(max));
        let need = larger(high / (half - 0.5), -low / (half + 0.5));
        let scale = bf16_at_least(need);
        let zeros = min == 0.0 && max == 0.0;
        *cell = (if zeros { epsilon(Dtype::Bf16) } else { scale }, 0);
    }
}

/// What [`asymmetric_bf16_scales`] leaves of a group's choice of a scale.
#[derive(Clone, Copy, Debug, PartialEq)]
enum ScaleChoice {
    /// A single candidate: the one given.
    Settled,
    /// The nearest scale, given, or the one above, given beside it, whichever leaves the least
    /// error.
    NearestOrUp,
    /// Left to [`scale_and_zero`].
    Unsure,
}

/// [`scale_and_zero`] of asymmetric groups whose scales are stored as BF16, from their
/// `extremes`, into `grid`, for the groups that have a single candidate scale and zero point
/// (more than half of the benchmark corpus's), which are then settled; for those with two, the
/// nearest scale's candidate into `grid` and the one above's into `ups`, for the caller to
/// measure. In one loop over a row's groups, with the scales either side of
/// `(max - min) / (2^b - 1)` from their bits, for quotients in BF16's normal range (the others
/// are left to [`scale_and_zero`]): a call for each group of 128, with its choices, cost as much
/// as the scales. Eight groups a step at a time, so that the steps run in `f64` lanes: group by
/// group, the loop's five divisions and its roundings were scalar, and a third slower.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn asymmetric_bf16_scales(
    extremes: &[(f32, f32)],
    half: f64,
    grid: &mut [(f64, i32)],
    ups: &mut [(f64, i32)],
    choices: &mut [ScaleChoice],
) {
    for (((cells, up_cells), choices), extremes) in grid
        .chunks_mut(SCALES_BATCH)
        .zip(ups.chunks_mut(SCALES_BATCH))
        .zip(choices.chunks_mut(SCALES_BATCH))
        .zip(extremes.chunks(SCALES_BATCH))
    {
        let (mut low, mut high) = ([0f64; SCALES_BATCH], [0f64; SCALES_BATCH]);
        for (lane, &(min, max)) in extremes.iter().enumerate() {
            (low[lane], high[lane]) = (f64::from(min), f64::from(max));
        }
        let (mut exact, mut up, mut nearest) = (
            [0f64; SCALES_BATCH],
            [0f64; SCALES_BATCH],
            [0f64; SCALES_BATCH],
        );
        for lane in 0..SCALES_BATCH {
            exact[lane] = (high[lane] - low[lane]) / (2.0 * half - 1.0);
            up[lane] = bf16_at_least(exact[lane]);
            // To BF16's 8 significant bits, ties to even, from the `f64`'s high 32 bits alone, as
            // `half::bf16::from_f64` (the writer's `stored`) rounds it: a value just above a tie
            // by less than those bits hold rounds as the tie.
            let high_word = exact[lane].to_bits() >> 32;
            let rounded_word = (high_word + 0xFFF + ((high_word >> 13) & 1)) & 0xFFFF_E000;
            nearest[lane] = f64::from_bits(rounded_word << 32);
        }
        let (mut nearest_lowest, mut nearest_highest) =
            ([0f64; SCALES_BATCH], [0f64; SCALES_BATCH]);
        let (mut up_lowest, mut up_highest) = ([0f64; SCALES_BATCH], [0f64; SCALES_BATCH]);
        for lane in 0..SCALES_BATCH {
            let range = (low[lane], high[lane]);
            (nearest_lowest[lane], nearest_highest[lane]) = zero_points(half, range, nearest[lane]);
            (up_lowest[lane], up_highest[lane]) = zero_points(half, range, up[lane]);
        }
        for (lane, ((cell, up_cell), choice)) in cells
            .iter_mut()
            .zip(up_cells.iter_mut())
            .zip(choices.iter_mut())
            .enumerate()
        {
            // Values selected one by one, not as pairs, which were chosen by branches: whether
            // the nearest scale fits is a toss of a coin from group to group, and the branches
            // were mispredicted half of the time.
            let nearest_fits = nearest_lowest[lane] <= nearest_highest[lane];
            let up_fits = up_lowest[lane] <= up_highest[lane] && up[lane] != nearest[lane];
            let normal = exact[lane] >= f64::from(f32::MIN_POSITIVE) && up[lane].is_finite();
            let zero_range = low[lane] == 0.0 && high[lane] == 0.0;
            let settled = zero_range || (normal && nearest_fits != up_fits);
            let measured = !settled && normal && nearest_fits && up_fits;
            *choice = [
                ScaleChoice::Unsure,
                ScaleChoice::NearestOrUp,
                ScaleChoice::Settled,
            ][usize::from(settled) * 2 + usize::from(measured)];
            let scale = if nearest_fits {
                nearest[lane]
            } else {
                up[lane]
            };
            let zero = if nearest_fits {
                nearest_lowest[lane]
            } else {
                up_lowest[lane]
            };
            let scale = if zero_range {
                epsilon(Dtype::Bf16)
            } else {
                scale
            };
            let zero = if zero_range { -half } else { zero };
            #[expect(
                clippy::cast_possible_truncation,
                reason = "a zero point, within the codes"
            )]
            let (zero, up_zero) = (zero as i32, up_lowest[lane] as i32);
            *cell = (scale, zero);
            *up_cell = (up[lane], up_zero);
        }
    }
}

/// Groups whose scales [`asymmetric_bf16_scales`] works out side by side, a step at a time:
/// `f64` lanes of an AVX-512 register.
const SCALES_BATCH: usize = 8;

/// The lowest and highest zero point (`2^(b-1)` being `half`) that keep a group's extremes
/// `(min, max)` within half a step of the codes on a grid of step `scale`: `min` at or above the
/// lowest code less half a step, `max` at or below the highest plus half a step.
#[expect(
    clippy::inline_always,
    reason = "inlined into the kernels, whose copies for AVX2 and AVX-512 it must share"
)]
#[inline(always)]
fn zero_points(half: f64, (min, max): (f64, f64), scale: f64) -> (f64, f64) {
    let lowest = (-floor(half + 0.5 + min / scale)).max(-half);
    let highest = floor(half - 0.5 - max / scale).min(half - 1.0);
    (lowest, highest)
}

/// `value.floor()` for a quotient of a group's extremes by its scale (within a few codes of the
/// range; larger ones come back beyond it still), without the call to `floor` that x86-64's
/// baseline, with no instruction to round an `f64`, makes of it.
fn floor(value: f64) -> f64 {
    #[expect(clippy::cast_possible_truncation, reason = "rounding is the point")]
    #[expect(
        clippy::cast_precision_loss,
        reason = "a whole number within the code range"
    )]
    let toward_zero = value as i64 as f64;
    if toward_zero > value {
        toward_zero - 1.0
    } else {
        toward_zero
    }
}

/// The gap between 1 and the next value of a scale dtype (`torch.finfo(dtype).eps`).
fn epsilon(dtype: Dtype) -> f64 {
    match dtype {
        Dtype::Bf16 => 2f64.powi(-7),
        Dtype::F16 => 2f64.powi(-10),
        Dtype::F64 => f64::EPSILON,
        _ => f64::from(f32::EPSILON),
    }
}

/// Whether `finite` holds of the values a loader works out for a group's extremes `min` and
/// `max` on a grid of step `scale` (their quotients rounded as the writer rounds them, times the
/// scale, in `f64`).
fn extremes_load_finite(min: f64, max: f64, scale: f64, finite: impl Fn(f64) -> bool) -> bool {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "as the writer divides, in f32"
    )]
    let (low, high, scale32) = (min as f32, max as f32, scale as f32);
    [low, high].iter().all(|&x| {
        let steps = round_even(x / scale32);
        finite(f64::from(steps) * scale)
    })
}

/// The largest value a loader of weights on a grid of scales stored as `dtype` works out, `None`
/// for F64, whose products of `f32` values never pass it.
fn largest_loaded(dtype: Dtype) -> Option<f64> {
    match dtype {
        Dtype::F16 => Some(::half::f16::MAX.to_f64()),
        Dtype::Bf16 => Some(::half::bf16::MAX.to_f64()),
        Dtype::F32 => Some(f64::from(f32::MAX)),
        _ => None,
    }
}

/// Whether a grid of step `scale` (stored as `dtype`) whose codes reach `steps` steps from 0 can
/// come near the largest value its loader works out; below a hundredth of it, no value does.
fn grid_may_pass(dtype: Dtype, scale: f64, steps: f64) -> bool {
    largest_loaded(dtype).is_some_and(|largest| scale * steps >= largest * 0.99)
}

/// Whether a group's extremes `range` load finite on a grid of step `scale` stored as `dtype`:
/// beyond 65504 an F16 loader reads ±Inf.
fn extremes_within(dtype: Dtype, (min, max): (f64, f64), scale: f64) -> bool {
    let loaded = Loaded::of(dtype);
    extremes_load_finite(min, max, scale, |back| {
        if dtype == Dtype::F16 {
            ::half::f16::from_f64(back).is_finite()
        } else {
            loaded.round_wide(back).is_finite()
        }
    })
}

/// A group's scale `up` (stored as `dtype`, for a group whose extremes are `range`, its codes
/// reaching `steps` steps from 0), raised where needed so that its extremes load finite. A
/// symmetric scale covers `-2^(b-1) - 1/2` steps below 0 and `2^(b-1) - 1/2` above, so a group
/// reaching both ends of the range of F32 (or of BF16) can have its lowest value coded
/// `-2^(b-1)`, beyond the range; an asymmetric group's highest value can land half a step
/// beyond it. A coarser grid codes such a value one step closer to 0, still within half a step.
fn scale_within(dtype: Dtype, range: (f64, f64), up: f64, steps: f64) -> f64 {
    if !grid_may_pass(dtype, up, steps) {
        return up;
    }
    // F16's values one at a time, the smallest that serves; BF16's one at a time too, and F32's
    // a thousand at a time, by 2^-10 of the scale: enough for the 1/15 at most that int4's lowest
    // code can go beyond.
    let (tries, next): (usize, fn(Dtype, f64) -> f64) = if dtype == Dtype::F16 {
        (1024, super::next_stored_up)
    } else {
        (128, |dtype, scale| {
            stored_at_least(dtype, scale * (1.0 + 1.0 / 1024.0))
        })
    };
    let mut scale = up;
    for _ in 0..tries {
        if extremes_within(dtype, range, scale) {
            return scale;
        }
        scale = next(dtype, scale);
    }
    up
}

/// The candidates for an asymmetric group's scale and zero point: the stored scales either side
/// of the exact one, each with the lowest zero point that keeps both ends within half a step.
/// Every zero point that does leaves the same error, since no value's code then reaches the
/// clamp but at a tie, whose error is half a step either way.
const CANDIDATES: usize = 2;

/// The squared error a group is left with under each `(scale, zero)` of `candidates`, in `f32`
/// throughout, [`WIDE`] values side by side: close to the exact sums to `2^-16` of themselves
/// for groups of up to 128, which only a near tie between the two could feel, and either then
/// serves as well. (Both candidates in one pass over the values took half as long again.)
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn group_errors(
    values: &[f32],
    candidates: [(f64, i32); CANDIDATES],
    half: f32,
) -> [f32; CANDIDATES] {
    let mut sums = [0f32; CANDIDATES];
    for (sum, (scale, zero)) in sums.iter_mut().zip(candidates) {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "scales are at most f32 here"
        )]
        let scale = scale as f32;
        #[expect(clippy::cast_precision_loss, reason = "a code, within 2^7")]
        let zero = zero as f32;
        // Multiplied by the inverse rather than divided: a division a value for each candidate
        // would be most of the work, and a quotient a rounding off moves a value to the next
        // code only at a tie, where the sum barely moves.
        let inverse = 1.0 / scale;
        // The codes' range taken less the zero point, which then never needs adding.
        let (low, high) = (-half - zero, half - 1.0 - zero);
        let mut lanes = [0f32; WIDE];
        // Padding of zeros codes as the zero point: no error.
        for xs in wide_chunks(values) {
            for lane in 0..WIDE {
                let steps = clamp(round_even(xs[lane] * inverse), low, high);
                let error = xs[lane] - steps * scale;
                lanes[lane] += error * error;
            }
        }
        *sum = lanes.iter().sum();
    }
    sums
}

/// [`encode_group`] for each group of `group` values of `row` with its `(scale, zero)` of
/// `grid`, in one call for the row.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn encode_row(row: &[f32], group: usize, grid: &[(f64, i32)], half: i32, codes: &mut [u8]) {
    for ((values, codes), &(scale, zero)) in
        row.chunks(group).zip(codes.chunks_mut(group)).zip(grid)
    {
        encode_group(values, scale, zero, half, codes);
    }
}

/// Each value's code `clamp(round(x / scale) + zero) + 2^(b-1)`; every code `2^(b-1)` (the
/// value 0) when the scale is 0 or not finite.
#[expect(
    clippy::inline_always,
    reason = "inlined into its caller, whose copies for AVX2 and AVX-512 it must share"
)]
#[inline(always)]
fn encode_group(values: &[f32], scale: f64, zero: i32, half: i32, codes: &mut [u8]) {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "scales are at most f32 here"
    )]
    let scale32 = scale as f32;
    #[expect(clippy::cast_precision_loss, reason = "codes within 2^7")]
    let (zero, half) = (zero as f32, half as f32);
    if scale32 == 0.0 || !scale32.is_finite() {
        codes.fill(byte_of(half));
        return;
    }
    for (&x, code) in values.iter().zip(codes.iter_mut()) {
        let q = clamp(round_even(x / scale32) + zero, -half, half - 1.0);
        *code = byte_of(q + half);
    }
}

/// Packs `codes` (each below `2^bits`, 4 or 8) into a little-endian stream of `words` 32-bit
/// words.
fn pack_row(codes: &[u8], bits: u32, words: usize, out: &mut Vec<u8>) {
    let start = out.len();
    out.resize(start + words * 4, 0);
    let row = &mut out[start..];
    if bits == 8 {
        row[..codes.len()].copy_from_slice(codes);
    } else {
        let (pairs, rest) = codes.as_chunks::<2>();
        pack_pairs(pairs, &mut row[..pairs.len()]);
        if let [last] = rest {
            row[pairs.len()] = *last;
        }
    }
}

/// Each pair of 4-bit codes as one byte, the first in the low half.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn pack_pairs(pairs: &[[u8; 2]], out: &mut [u8]) {
    for (byte, &pair) in out.iter_mut().zip(pairs) {
        // The pair as a 16-bit word: shifting it down by 4 puts the second code above the
        // first, in the low byte (in 16-bit lanes, which vectorize).
        let word = u16::from_le_bytes(pair);
        *byte = (word | (word >> 4)).to_le_bytes()[0];
    }
}

/// The codes of a row packed by [`pack_row`], into `codes`.
fn unpack_row(words: &[u8], bits: u32, codes: &mut [u8]) {
    if bits == 8 {
        codes.copy_from_slice(&words[..codes.len()]);
        return;
    }
    let (pairs, rest) = codes.as_chunks_mut::<2>();
    for (pair, &byte) in pairs.iter_mut().zip(words) {
        *pair = [byte & 15, byte >> 4];
    }
    if let [last] = rest {
        *last = words[pairs.len()] & 15;
    }
}

/// The code at `index` of a packed little-endian stream of 32-bit words.
fn unpack(words: &[u8], index: usize, bits: u32) -> u32 {
    let bit = index * bits as usize;
    let word = bit / 32;
    let value = u32::from_le_bytes(words[word * 4..word * 4 + 4].try_into().unwrap_or([0; 4]));
    (value >> (bit % 32)) & ((1u32 << bits) - 1)
}

pub fn quantize(plan: &Plan, values: &[f32], out: &mut Streams) {
    let (columns, group, bits) = (columns(plan), group(plan), bits(plan));
    let half = 1i32 << (bits - 1);
    let words = (columns * bits as usize).div_ceil(32);
    let groups = columns.div_ceil(group);
    let rows = values.len() / columns;
    let asymmetric = plan.scheme == Scheme::W4A16Asym;
    let mut zeros = Vec::with_capacity(if asymmetric { rows * groups } else { 0 });
    let mut codes = vec![0u8; columns];
    let (mut extremes, mut grid) = (Vec::with_capacity(groups), Vec::with_capacity(groups));
    let mut room = GridRoom::default();
    for row in values.chunks(columns) {
        let codes = &mut codes[..row.len()];
        ranges(row, group, &mut extremes);
        row_grid(plan, row, group, &extremes, &mut grid, &mut room);
        for &(scale, zero) in &grid {
            encode_scale(plan.scale_dtype, scale, &mut out.scales);
            if asymmetric {
                zeros.push(zero);
            }
        }
        encode_row(row, group, &grid, half, codes);
        pack_row(codes, bits, words, &mut out.codes);
    }
    if asymmetric {
        // Zero points go down the rows: a run of `32 / bits` rows fills a word of each column.
        let per_word = 32 / bits as usize;
        for block in zeros.chunks(per_word * groups) {
            let block_rows = block.len() / groups;
            let mut words = vec![0u32; groups];
            for (row, zeros) in block.chunks(groups).enumerate().take(block_rows) {
                for (word, &zero) in words.iter_mut().zip(zeros) {
                    *word |= (zero + half).cast_unsigned() << (row * bits as usize);
                }
            }
            for word in words {
                out.zero_points.extend_from_slice(&word.to_le_bytes());
            }
        }
    }
}

/// Adds a group's values, which came back from `codes` as `(code - offset) · scale`.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn measure_group(values: &[f32], codes: &[u8], offset: i32, scale: f64, measure: &mut Measure) {
    let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    let back = |code: u8| f64::from(i32::from(code) - offset) * scale;
    let mut local = *measure;
    let (chunks, rest) = values.as_chunks::<LANES>();
    let (code_chunks, code_rest) = codes.as_chunks::<LANES>();
    for (xs, cs) in chunks.iter().zip(code_chunks) {
        let mut backs = [0f64; LANES];
        for (back_value, &code) in backs.iter_mut().zip(cs) {
            *back_value = back(code);
        }
        local.add_lanes(xs, &backs, &[scale; LANES], &[inverse; LANES]);
    }
    for (&x, &code) in rest.iter().zip(code_rest) {
        local.add(x, back(code), scale, inverse);
    }
    *measure = local;
}

/// Adds a row's values, each group's come back from its codes as `(code - offset) · scale`
/// with its `(scale, offset)` of `grid`, to `checked`, in `f32`; groups whose scale there is 0
/// are left out (measured in `f64`, [`measure_group`]). For BF16 values and a BF16 scale,
/// `(code - offset) · scale` is a whole number below 2^8 times 8 significant bits and the value's
/// distance from it is exact in `f32`, so the errors are [`measure_group`]'s; for wider values
/// each is rounded once more (see [`Checked`]).
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn check_row_in_f32(
    values: &[f32],
    codes: &[u8],
    group: usize,
    grid: &[(f32, f32)],
    four_bits: bool,
    checked: &mut Checked,
) {
    for_loaded!(checked.loaded(), ROUNDING => {
        if four_bits {
            match_target! {
                "x86_64+avx512f" => {
                    code_table::check_row_avx512::<ROUNDING>(values, codes, group, grid, checked);
                }
                _ => check_row_in_f32_as::<ROUNDING>(values, codes, group, grid, checked),
            }
        } else {
            check_row_in_f32_as::<ROUNDING>(values, codes, group, grid, checked);
        }
    });
}

/// [`check_row_in_f32`] for values loaded as `ROUNDING` says.
#[expect(
    clippy::inline_always,
    reason = "inlined into its caller, whose copies for AVX2 and AVX-512 it must share"
)]
#[inline(always)]
fn check_row_in_f32_as<const ROUNDING: Rounding>(
    values: &[f32],
    codes: &[u8],
    group: usize,
    grid: &[(f32, f32)],
    checked: &mut Checked,
) {
    let mut local = *checked;
    for ((values, codes), &(scale, offset)) in
        values.chunks(group).zip(codes.chunks(group)).zip(grid)
    {
        if scale == 0.0 {
            continue;
        }
        let (chunks, rest) = values.as_chunks::<WIDE>();
        let (code_chunks, code_rest) = codes.as_chunks::<WIDE>();
        for (xs, cs) in chunks.iter().zip(code_chunks) {
            let mut backs = [0f32; WIDE];
            for lane in 0..WIDE {
                backs[lane] = (f32::from(cs[lane]) - offset) * scale;
            }
            local.add::<ROUNDING>(xs, &backs, &[scale; WIDE], &[1.0; WIDE]);
        }
        if !rest.is_empty() {
            // Padded with zeros coming back as zeros.
            let (mut xs, mut backs) = ([0f32; WIDE], [0f32; WIDE]);
            for (lane, (&x, &code)) in rest.iter().zip(code_rest).enumerate() {
                xs[lane] = x;
                backs[lane] = (f32::from(code) - offset) * scale;
            }
            local.add::<ROUNDING>(&xs, &backs, &[scale; WIDE], &[1.0; WIDE]);
        }
        local.end_group(1.0 / f64::from(scale));
    }
    *checked = local;
}

pub fn check(plan: &Plan, source: &[f32], written: &Streams) -> (ErrorSums, bool) {
    let (columns, group, bits) = (columns(plan), group(plan), bits(plan));
    let half = 1i32 << (bits - 1);
    let words = (columns * bits as usize).div_ceil(32);
    let groups = columns.div_ceil(group);
    let scales = super::scheme::decode_scales(plan.scale_dtype, &written.scales);
    let per_word = 32 / bits as usize;
    let (mut measure, mut checked) = (Measure::new(plan.loaded()), Checked::new(plan.loaded()));
    let mut codes = vec![0u8; columns];
    let mut grid = Vec::with_capacity(groups);
    for (row, values) in source.chunks(columns).enumerate() {
        let codes = &mut codes[..values.len()];
        unpack_row(
            &written.codes[row * words * 4..(row + 1) * words * 4],
            bits,
            codes,
        );
        grid.clear();
        for (k, (values, codes)) in values.chunks(group).zip(codes.chunks(group)).enumerate() {
            let scale = scales[row * groups + k];
            let zero = if plan.scheme == Scheme::W4A16Asym {
                let word_row = row / per_word;
                let word = &written.zero_points[(word_row * groups + k) * 4..][..4];
                unpack(word, row % per_word, bits).cast_signed() - half
            } else {
                0
            };
            if let Some(scale32) = scale_in_f32(scale) {
                #[expect(clippy::cast_precision_loss, reason = "a code offset, within 2^8")]
                grid.push((scale32, (half + zero) as f32));
            } else {
                grid.push((0.0, 0.0));
                measure_group(values, codes, half + zero, scale, &mut measure);
            }
        }
        check_row_in_f32(values, codes, group, &grid, bits == 4, &mut checked);
    }
    let ((mut sums, within), (in_f32, within_in_f32)) = (measure.finish(), checked.finish());
    sums.merge(&in_f32);
    (sums, within && within_in_f32)
}

/// The error [`check`] would measure of what [`quantize`] writes for `values` (whole rows),
/// worked out without codes: each group's scale and zero point as [`quantize`] chooses them, each
/// value's code from its quotient by the scale, as [`quantize`] codes it. For scales `f32`
/// holds (see [`Plan::error`]).
pub fn error(
    plan: &Plan,
    values: &[f32],
    signal: f64,
    block_ranges: Option<&BlockRanges>,
) -> ErrorSums {
    let (columns, group) = (columns(plan), group(plan));
    #[expect(clippy::cast_precision_loss, reason = "2^(b-1), at most 128")]
    let half = (1u32 << (bits(plan) - 1)) as f32;
    let codes = (-half, half - 1.0);
    let mut tally = Compared::new(plan.loaded());
    let (mut grid, mut narrow) = (Vec::new(), Vec::new());
    let mut extremes = Vec::with_capacity(columns.div_ceil(group));
    let mut room = GridRoom::default();
    for (index, row) in values.chunks(columns).enumerate() {
        let extremes =
            if let Some(shared) = block_ranges.and_then(|ranges| ranges.row(index, group)) {
                shared
            } else {
                ranges(row, group, &mut extremes);
                &extremes
            };
        row_grid(plan, row, group, extremes, &mut grid, &mut room);
        narrow.clear();
        narrow.extend(grid.iter().map(|&(scale, zero)| {
            #[expect(
                clippy::cast_possible_truncation,
                reason = "scales are at most f32 here"
            )]
            #[expect(clippy::cast_precision_loss, reason = "a code, within 2^7")]
            (scale as f32, zero as f32)
        }));
        tally_row(row, group, &narrow, codes, &mut tally);
    }
    tally.finish(signal)
}

/// Adds a row's values, each group's coded with its `(scale, zero)` of `grid` as the whole
/// numbers from `low` to `high`, to `tally`.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
pub(super) fn tally_row(
    row: &[f32],
    group: usize,
    grid: &[(f32, f32)],
    (low, high): (f32, f32),
    tally: &mut Compared,
) {
    #[expect(clippy::cast_precision_loss, reason = "15")]
    let four_bits = high - low == (code_table::CODES - 1) as f32;
    for_loaded!(tally.loaded(), ROUNDING => {
        if four_bits {
            match_target! {
                "x86_64+avx512f" => {
                    code_table::tally_row_avx512::<ROUNDING>(row, group, grid, low, tally);
                }
                _ => tally_row_as::<ROUNDING>(row, group, grid, (low, high), tally),
            }
        } else {
            tally_row_as::<ROUNDING>(row, group, grid, (low, high), tally);
        }
    });
}

/// [`tally_row`] for values loaded as `ROUNDING` says.
#[expect(
    clippy::inline_always,
    reason = "inlined into its caller, whose copies for AVX2 and AVX-512 it must share"
)]
#[inline(always)]
fn tally_row_as<const ROUNDING: Rounding>(
    row: &[f32],
    group: usize,
    grid: &[(f32, f32)],
    (low, high): (f32, f32),
    tally: &mut Compared,
) {
    let mut local = *tally;
    for (values, &(scale, zero)) in row.chunks(group).zip(grid) {
        // A degenerate scale's zero point is 0: its values come back as 0.
        let by = divisor(scale);
        let (low, high) = (low - zero, high - zero);
        for xs in wide_chunks(values) {
            // One step a loop: written as one, the compiler cut the lanes into pieces of four
            // and eight and put them back together.
            let mut quotients = [0f32; WIDE];
            for lane in 0..WIDE {
                quotients[lane] = xs[lane] / by;
            }
            let mut backs = [0f32; WIDE];
            for lane in 0..WIDE {
                backs[lane] = clamp(round_even(quotients[lane]), low, high) * scale;
            }
            local.add::<ROUNDING>(&xs, &backs);
        }
    }
    *tally = local;
}

/// Whether `columns` can be cut into the scheme's groups: the presets' loaders want whole
/// groups.
pub fn fits(columns: u64, group: u64) -> bool {
    group > 0 && columns.is_multiple_of(group)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Dtype;

    fn plan(scheme: Scheme, rows: u64, columns: u64, group: u64) -> Plan {
        Plan::new(scheme, group, [rows, columns], Dtype::F32, 1.0)
    }

    fn values(rows: usize, columns: usize) -> Vec<f32> {
        (0..rows * columns)
            .map(|i| ((i * 7919 % 1000) as f32 - 480.0) / 1000.0)
            .collect()
    }

    use proptest::strategy::Strategy as _;

    /// Values, rounded to BF16 unless `wide`.
    fn source_values(wide: bool) -> impl proptest::strategy::Strategy<Value = Vec<f32>> {
        use proptest::prelude::*;
        let value = prop_oneof![
            8 => -4.0f32..4.0,
            2 => -1e-3f32..1e-3,
            1 => Just(0.0f32),
        ];
        prop::collection::vec(value, 1..3000).prop_map(move |values| {
            values
                .into_iter()
                .map(|x| {
                    if wide {
                        x
                    } else {
                        half::bf16::from_f32(x).to_f32()
                    }
                })
                .collect()
        })
    }

    /// Ranges of groups (the smallest value and the largest, with 0): of magnitude up to 1000,
    /// or up to `tiny`, or 0.
    fn group_ranges(tiny: f32) -> impl proptest::strategy::Strategy<Value = Vec<(f32, f32)>> {
        use proptest::prelude::*;
        let low = prop_oneof![-1e3f32..=0.0, -tiny..=0.0, Just(0.0f32)];
        let high = prop_oneof![0.0f32..1e3, 0.0f32..tiny, Just(0.0f32)];
        prop::collection::vec((low, high), 1..50)
    }

    /// Ranges like a weight's groups' settle about half of the time (so that the property test
    /// on what is settled is not empty), and what they settle is `scale_and_zero`'s.
    #[test]
    fn asymmetric_bf16_scales_settle_about_half_of_a_weights_groups() {
        let plan = Plan::new(Scheme::W4A16Asym, 128, [1, 128], Dtype::Bf16, 1.0);
        let extremes: Vec<(f32, f32)> = (0..1000u16)
            .map(|i| {
                let spread = 0.05 + f32::from(i % 97) / 970.0;
                (-spread * (1.0 + f32::from(i % 13) / 26.0), spread)
            })
            .collect();
        let mut grid = vec![(0.0, 0); extremes.len()];
        let mut ups = grid.clone();
        let mut choices = vec![ScaleChoice::Unsure; extremes.len()];
        asymmetric_bf16_scales(&extremes, 8.0, &mut grid, &mut ups, &mut choices);
        let count = |wanted| choices.iter().filter(|&&c| c == wanted).count();
        let settled = count(ScaleChoice::Settled);
        assert!((200..=800).contains(&settled), "{settled} settled");
        assert_eq!(settled + count(ScaleChoice::NearestOrUp), extremes.len());
        for ((&range, &cell), _) in extremes
            .iter()
            .zip(&grid)
            .zip(&choices)
            .filter(|(_, c)| **c == ScaleChoice::Settled)
        {
            assert_eq!(cell, scale_and_zero(&plan, &[], range), "{range:?}");
        }
    }

    proptest::proptest! {
        /// A comparison's ranges worked out once for a block give each int scheme the error its
        /// own ranges give, to the bit, and W8A8 each row's largest magnitude.
        #[test]
        fn a_blocks_shared_ranges_give_the_same_errors(
            values in super::super::lanes::test_values(1..1500),
            columns in 1usize..200,
            group in 1usize..70,
            other_group: bool,
        ) {
            let values: Vec<f32> = values
                .iter()
                .cycle()
                .take(values.len().div_ceil(columns) * columns)
                .map(|&x| half::bf16::from_f32(x).to_f32())
                .collect();
            let rows = (values.len() / columns) as u64;
            let absmax = values.iter().fold(0f32, |m, x| m.max(x.abs()));
            let cut_short = &values[..values.len() - 1];
            let cut_ranges = BlockRanges::of(cut_short, columns, group);
            for (index, row) in cut_short.chunks(columns).enumerate() {
                proptest::prop_assert_eq!(f64::from(cut_ranges.row_absmax(index)), super::super::absmax_of(row).0);
            }
            let shared_group = if other_group { group + 1 } else { group };
            let shared = BlockRanges::of(&values, columns, shared_group);
            for scheme in [Scheme::W8A16, Scheme::W4A16, Scheme::W4A16Asym] {
                let plan = Plan::new(scheme, group as u64, [rows, columns as u64], Dtype::Bf16, f64::from(absmax));
                let signal = values.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
                let own = error(&plan, &values, signal, None);
                let from_shared = error(&plan, &values, signal, Some(&shared));
                proptest::prop_assert_eq!(own.noise.to_bits(), from_shared.noise.to_bits());
                proptest::prop_assert_eq!(own.max_abs.to_bits(), from_shared.max_abs.to_bits());
            }
            for (index, row) in values.chunks(columns).enumerate() {
                proptest::prop_assert_eq!(f64::from(shared.row_absmax(index)), super::super::absmax_of(row).0);
            }
        }

        /// The symmetric BF16 scales worked out for a row at once are `scale_and_zero`'s.
        #[test]
        fn symmetric_bf16_scales_are_scale_and_zeros(
            extremes in group_ranges(1e-38),
            scheme in proptest::sample::select(vec![Scheme::W8A16, Scheme::W4A16]),
        ) {
            let plan = Plan::new(scheme, 128, [1, 128], Dtype::Bf16, 1.0);
            let mut grid = vec![(0.0, 0); extremes.len()];
            symmetric_bf16_scales(&extremes, f64::from(1u32 << (bits(&plan) - 1)), &mut grid);
            for (&range, &cell) in extremes.iter().zip(&grid) {
                proptest::prop_assert_eq!(cell, scale_and_zero(&plan, &[], range), "{:?}", range);
            }
        }

        /// The asymmetric BF16 scales a row's loop settles are `scale_and_zero`'s.
        #[test]
        fn asymmetric_bf16_scales_settled_are_scale_and_zeros(extremes in group_ranges(1e-37)) {
            let plan = Plan::new(Scheme::W4A16Asym, 128, [1, 128], Dtype::Bf16, 1.0);
            let mut grid = vec![(0.0, 0); extremes.len()];
            let mut ups = grid.clone();
            let mut choices = vec![ScaleChoice::Unsure; extremes.len()];
            asymmetric_bf16_scales(&extremes, 8.0, &mut grid, &mut ups, &mut choices);
            for ((&range, &cell), &choice) in extremes.iter().zip(&grid).zip(&choices) {
                if choice == ScaleChoice::Settled {
                    proptest::prop_assert_eq!(cell, scale_and_zero(&plan, &[], range), "{:?}", range);
                }
            }
        }

        /// Each group's scale and zero point in a row of BF16 values, worked out for the row at
        /// once, is the one `scale_and_zero` chooses for the group alone.
        #[test]
        fn a_rows_asymmetric_bf16_grid_is_its_groups_scale_and_zeros(
            row in source_values(false),
            shift in -2f32..2.0,
            group in proptest::sample::select(vec![16usize, 32, 128]),
        ) {
            let row: Vec<f32> = row
                .iter()
                .map(|&x| half::bf16::from_f32(x + shift).to_f32())
                .collect();
            let plan = Plan::new(Scheme::W4A16Asym, group as u64, [1, row.len() as u64], Dtype::Bf16, 1.0);
            let (mut extremes, mut grid) = (Vec::new(), Vec::new());
            ranges(&row, group, &mut extremes);
            row_grid(&plan, &row, group, &extremes, &mut grid, &mut GridRoom::default());
            for ((values, &range), &cell) in row.chunks(group).zip(&extremes).zip(&grid) {
                proptest::prop_assert_eq!(cell, scale_and_zero(&plan, values, range), "{:?}", range);
            }
        }

        /// Of the zero points that keep a group's ends within half a step of a scale's codes,
        /// each leaves the same error: `scale_and_zero` measures the lowest alone.
        #[test]
        fn every_zero_point_within_half_a_step_leaves_the_same_error(
            row in source_values(false),
            shift in -2f32..2.0,
            up in proptest::bool::ANY,
        ) {
            let values: Vec<f32> = row
                .iter()
                .take(128)
                .map(|&x| half::bf16::from_f32(x + shift).to_f32())
                .collect();
            let (min, max) = range(&values);
            let exact = (f64::from(max) - f64::from(min)) / 15.0;
            let scale = if up { bf16_at_least(exact) } else { super::super::stored(Dtype::Bf16, exact) };
            proptest::prop_assume!(scale > 0.0);
            let (lowest, highest) = zero_points(8.0, (f64::from(min), f64::from(max)), scale);
            let plan = Plan::new(Scheme::W4A16Asym, 128, [1, values.len() as u64], Dtype::Bf16, 1.0);
            let mut errors = Vec::new();
            #[expect(clippy::cast_possible_truncation, reason = "within the code range")]
            for zero in lowest as i32..=highest as i32 {
                let mut codes = vec![0u8; values.len()];
                encode_row(&values, values.len(), &[(scale, zero)], 8, &mut codes);
                let mut measure = Measure::new(plan.loaded());
                measure_group(&values, &codes, 8 + zero, scale, &mut measure);
                errors.push(measure.finish().0.noise);
            }
            proptest::prop_assert!(errors.windows(2).all(|pair| pair[0] == pair[1]), "{:?}", errors);
        }

        /// Each group's range is its smallest and largest value, with 0.
        #[test]
        fn ranges_are_each_groups_extremes_with_zero(
            row in proptest::collection::vec(-1e3f32..1e3, 1..700),
            group in 1usize..300,
        ) {
            let mut extremes = Vec::new();
            ranges(&row, group, &mut extremes);
            proptest::prop_assert_eq!(extremes.len(), row.len().div_ceil(group));
            for (values, &(low, high)) in row.chunks(group).zip(&extremes) {
                let folded = values.iter().fold((0f32, 0f32), |(l, h), &x| (l.min(x), h.max(x)));
                proptest::prop_assert_eq!((low, high), folded);
            }
        }

        /// A 4-bit row's measure and its check, with each code's values looked up in its
        /// group's tables (on processors with AVX-512), are those worked out value by value, to
        /// the bit.
        #[test]
        fn looked_up_codes_measure_and_check_as_worked_out(
            (wide, values) in proptest::bool::ANY.prop_flat_map(|wide| (proptest::strategy::Just(wide), source_values(wide))),
            scheme in proptest::sample::select(vec![Scheme::W4A16, Scheme::W4A16Asym]),
            dtype in proptest::sample::select(vec![Dtype::Bf16, Dtype::F16, Dtype::F32]),
            group in proptest::sample::select(vec![16usize, 24, 128]),
        ) {
            let dtype = if wide { Dtype::F32 } else { dtype };
            let plan = Plan::new(scheme, group as u64, [1, values.len() as u64], dtype, 1.0);
            let half = 1i32 << (bits(&plan) - 1);
            let loaded = super::super::lanes::Loaded::of(plan.scale_dtype);
            let mut codes = vec![0u8; values.len()];
            let (mut grid, mut measured_grid) = (Vec::new(), Vec::new());
            for (chunk, out) in values.chunks(group).zip(codes.chunks_mut(group)) {
                let (scale, zero) = scale_and_zero(&plan, chunk, range(chunk));
                encode_row(chunk, chunk.len(), &[(scale, zero)], half, out);
                #[expect(clippy::cast_possible_truncation, reason = "a test's scales")]
                #[expect(clippy::cast_precision_loss, reason = "a code")]
                grid.push((scale as f32, zero as f32));
                #[expect(clippy::cast_precision_loss, reason = "a code offset")]
                measured_grid.push((scale_in_f32(scale).unwrap_or(0.0), (half + zero) as f32));
            }

            let (mut looked_up, mut worked_out) = (Compared::new(loaded), Compared::new(loaded));
            tally_row(&values, group, &grid, (-8.0, 7.0), &mut looked_up);
            for_loaded!(loaded, ROUNDING => {
                tally_row_as::<ROUNDING>(&values, group, &grid, (-8.0, 7.0), &mut worked_out);
            });
            let (a, b) = (looked_up.finish(0.0), worked_out.finish(0.0));
            proptest::prop_assert_eq!(a.noise.to_bits(), b.noise.to_bits());
            proptest::prop_assert_eq!(a.max_abs.to_bits(), b.max_abs.to_bits());

            let (mut looked_up, mut worked_out) = (Checked::new(loaded), Checked::new(loaded));
            check_row_in_f32(&values, &codes, group, &measured_grid, true, &mut looked_up);
            for_loaded!(loaded, ROUNDING => {
                check_row_in_f32_as::<ROUNDING>(&values, &codes, group, &measured_grid, &mut worked_out);
            });
            let ((a, a_within), (b, b_within)) = (looked_up.finish(), worked_out.finish());
            for (x, y) in [(a.signal, b.signal), (a.noise, b.noise), (a.max_abs, b.max_abs), (a.max_in_steps, b.max_in_steps)] {
                proptest::prop_assert_eq!(x.to_bits(), y.to_bits());
            }
            proptest::prop_assert_eq!(a_within, b_within);
        }

        #[test]
        fn the_f32_measure_agrees_with_the_plain_one(
            (wide, values) in proptest::bool::ANY.prop_flat_map(|wide| (proptest::strategy::Just(wide), source_values(wide))),
            scheme in proptest::sample::select(vec![Scheme::W8A16, Scheme::W4A16, Scheme::W4A16Asym]),
        ) {
            let dtype = if wide { Dtype::F32 } else { Dtype::Bf16 };
            let plan = Plan::new(scheme, 128, [1, values.len() as u64], dtype, 1.0);
            let half = 1i32 << (bits(&plan) - 1);
            let (scale, zero) = scale_and_zero(&plan, &values, range(&values));
            let mut codes = vec![0u8; values.len()];
            encode_row(&values, values.len(), &[(scale, zero)], half, &mut codes);
            let loaded = super::super::lanes::Loaded::of(dtype);
            let (mut plain, mut in_f32) = (Measure::new(loaded), Checked::new(loaded));
            measure_group(&values, &codes, half + zero, scale, &mut plain);
            #[expect(clippy::cast_possible_truncation, reason = "a BF16 or F32 scale")]
            let scale32 = scale as f32;
            proptest::prop_assume!(scale32 > 0.0);
            #[expect(clippy::cast_precision_loss, reason = "a code offset, within 2^8")]
            let grid = [(scale32, (half + zero) as f32)];
            check_row_in_f32(&values, &codes, values.len(), &grid, bits(&plan) == 4, &mut in_f32);
            let ((a, a_within), (b, b_within)) = (plain.finish(), in_f32.finish());
            super::super::lanes::assert_agree(&a, &b, !wide)?;
            proptest::prop_assert!(a_within);
            proptest::prop_assert!(b_within);
        }
    }

    #[test]
    fn packs_codes_across_words_in_order() {
        let mut out = Vec::new();
        let codes: Vec<u8> = (0..10).collect();
        pack_row(&codes, 4, 2, &mut out);
        assert_eq!(
            u32::from_le_bytes(out[0..4].try_into().unwrap()),
            0x7654_3210
        );
        assert_eq!(
            u32::from_le_bytes(out[4..8].try_into().unwrap()),
            0x0000_0098
        );
        for i in 0..10 {
            assert_eq!(unpack(&out, i, 4), u32::try_from(i % 16).unwrap());
        }
        let mut back = vec![0u8; 10];
        unpack_row(&out, 4, &mut back);
        assert_eq!(back, codes);
    }

    #[test]
    fn every_scheme_reads_back_within_half_a_step() {
        for scheme in [Scheme::W8A16, Scheme::W4A16, Scheme::W4A16Asym] {
            let plan = plan(scheme, 16, 64, 32);
            let source = values(16, 64);
            let mut out = Streams::default();
            quantize(&plan, &source, &mut out);
            assert_eq!(out.codes.len(), 16 * 64 * scheme.bits() as usize / 8);
            assert_eq!(out.scales.len(), 16 * 2 * 4);
            let (checked, within) = check(&plan, &source, &out);
            assert!(within, "{scheme}");
            assert!(checked.max_in_steps <= 0.5 + 1e-4, "{scheme}");
            assert!(checked.noise > 0.0);
        }
    }

    #[test]
    fn zero_points_are_packed_down_the_rows() {
        let plan = plan(Scheme::W4A16Asym, 8, 4, 4);
        // Row r holds values from 0 up to r + 1: its minimum is 0, so its zero point is -8.
        let source: Vec<f32> = (0..8)
            .flat_map(|r| (0..4).map(move |c| (c as f32) * (r as f32 + 1.0) / 3.0))
            .collect();
        let mut out = Streams::default();
        quantize(&plan, &source, &mut out);
        assert_eq!(out.zero_points, [0, 0, 0, 0]);
        let shifted: Vec<f32> = source.iter().map(|x| x - 1.0).collect();
        out.clear();
        quantize(&plan, &shifted, &mut out);
        assert_eq!(out.zero_points.len(), 4);
        assert!(check(&plan, &shifted, &out).1);
    }
}
