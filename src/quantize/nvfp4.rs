//! NVFP4 in the compressed-tensors `nvfp4-pack-quantized` layout:
//!
//! - `P.weight_packed` U8 `[out, in/2]`: FP4 E2M1 codes, element `2j` in the low nibble of byte
//!   `j`, `2j+1` in the high one (sign in bit 3, magnitude `[0, .5, 1, 1.5, 2, 3, 4, 6][n & 7]`);
//! - `P.weight_scale` `F8_E4M3` `[out, in/16]`: each group of 16's scale times the global scale;
//! - `P.weight_global_scale` F32 `[1]`: `448 · 6 / absmax`, which divides.
//!
//! `scale = e4m3(group absmax / 6 · global)`, `x' = fp4(x / (scale / global)) · scale / global`.
//! As the preset computes them, except that a group scale that FP8 rounded so far down that its
//! group's largest value would land more than half a step beyond 6 is rounded up instead.

use super::fp8;
use super::lanes::{
    Checked, Compared, Measure, TO_BF16, WIDE, divisor, larger, tensor_measured_in_f32,
};
use super::scheme::{ErrorSums, Plan, Streams};
use super::transpose::{self, Square};
use multiversion::multiversion;
use multiversion::target::match_target;

/// The NVFP4 group, as a length.
const GROUP: usize = 16;

/// The global scale of a tensor whose largest magnitude is `absmax`: `448 · 6 / absmax` in
/// FP32; `2^127` where that passes FP32's range (a tensor of values below `2^-115`, whose group
/// scales then still reach up to 448), and 1 for a tensor of zeros.
pub fn global_scale(absmax: f64) -> f32 {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the preset stores it as F32"
    )]
    let scale = (f64::from(fp8::MAX) * 6.0 / absmax) as f32;
    if scale.is_finite() && scale > 0.0 {
        scale
    } else if absmax > 0.0 {
        2f32.powi(127)
    } else {
        1.0
    }
}

/// The code of `value` rounded to the nearest E2M1 value (clamped to ±6), ties to the even code.
/// Comes back 7 (±6) for NaN, which no quotient the kernels code is.
#[expect(
    clippy::inline_always,
    reason = "inlined into the kernels, whose copies for AVX2 and AVX-512 it must share"
)]
#[inline(always)]
fn encode(value: f32) -> u32 {
    let (sum, shifter, power) = shifted(value.abs());
    // The grid's codes run 0 to 3 in steps of 1/2, 4 and 5 in steps of 1 from 2, then 6 and
    // 7 in steps of 2 from 4: the value's whole number of steps, plus twice its power's
    // exponent.
    let steps = sum.to_bits().wrapping_sub(shifter.to_bits());
    let code = steps + (power >> 22) - 254;
    (if code < 7 { code } else { 7 }) + ((value.to_bits() >> 28) & 8)
}

/// The magnitude [`encode`] rounds `a` (a magnitude) to. NaN comes back NaN.
#[expect(
    clippy::inline_always,
    reason = "inlined into the kernels, whose copies for AVX2 and AVX-512 it must share"
)]
#[inline(always)]
fn rounded_magnitude(a: f32) -> f32 {
    let (sum, shifter, _) = shifted(a);
    let rounded = sum - shifter;
    if rounded > 6.0 { 6.0 } else { rounded }
}

/// The magnitude `a` plus a shifter that rounds it to the E2M1 grid, that shifter, and the bits
/// of the power of two at or below `a`, at least 1 (below which the grid's step stays 1/2). The
/// shifter is 1.5 · 2^22 times that power: the sum's `f32` step is the grid's step there, so the
/// sum, rounded ties to even, holds a whole number of the grid's steps above the shifter, and
/// taking the shifter away leaves `a` rounded. Magnitudes beyond 8 are taken as 8, which rounds
/// to 6 as they do. A choice among powers of two by the bits rather than a chain of seven
/// thresholds: fewer steps for the lanes.
#[expect(
    clippy::inline_always,
    reason = "inlined into the kernels, whose copies for AVX2 and AVX-512 it must share"
)]
#[inline(always)]
fn shifted(a: f32) -> (f32, f32, u32) {
    let capped = if a > 8.0 { 8.0 } else { a };
    let power = (capped.to_bits() & 0x7F80_0000).max(ONE_BITS);
    let shifter = f32::from_bits(power + SHIFT_TO_STEPS);
    (capped + shifter, shifter, power)
}

/// The bits of 1.
const ONE_BITS: u32 = 0x3F80_0000;

/// Added to the bits of a power of two, those of 1.5 · 2^22 times it.
const SHIFT_TO_STEPS: u32 = (22 << 23) + 0x40_0000;

/// The value of a code (sign in bit 3, magnitude `[0, .5, 1, 1.5, 2, 3, 4, 6][n & 7]`) and its
/// grid's step (0.5 below 2, 1 below 4, 2 above), without a table.
#[expect(
    clippy::inline_always,
    reason = "inlined into the kernels, whose copies for AVX2 and AVX-512 it must share"
)]
#[inline(always)]
fn value_and_step(code: u8) -> (f32, f32) {
    let n = f32::from(code & 7);
    let magnitude = if n < 4.0 {
        n * 0.5
    } else if n < 6.0 {
        n - 2.0
    } else if n < 7.0 {
        4.0
    } else {
        6.0
    };
    let step = if n < 4.0 {
        0.5
    } else if n < 6.0 {
        1.0
    } else {
        2.0
    };
    (if code & 8 == 0 { magnitude } else { -magnitude }, step)
}

fn columns(plan: &Plan) -> usize {
    usize::try_from(plan.columns).unwrap_or(usize::MAX).max(1)
}

/// The squared error each of up to [`WIDE`] groups is left with under `scales[lane]`, from the
/// magnitudes of its values (`magnitudes[row][lane]`, zeros past the last group), in `f32`
/// throughout so that each step vectorizes across the lanes whole (a mix of `f32` and `f64`
/// halves the lanes): a sum of 16 squares, close to the exact one to `2^-19` of itself, which
/// only a near tie between the two scales tried could feel, and either scale then serves as
/// well. A value's error is its magnitude's, but for the sign, to the last bit (a quotient and
/// a difference round alike either side of 0): magnitudes taken once for both scales spare
/// each value the clearing of its quotient's sign and the copying back of its own. With
/// `KEEP`, each value's magnitude on the grid, in units of its scale, is left in `rounded`: a
/// comparison then has every value's error at hand for the scale it chooses.
#[expect(
    clippy::inline_always,
    reason = "inlined into the kernels, whose copies for AVX2 and AVX-512 it must share"
)]
#[inline(always)]
fn group_errors<const KEEP: bool>(
    magnitudes: &[[f32; WIDE]; GROUP],
    scales: &[f32; WIDE],
    rounded: &mut [[f32; WIDE]; GROUP],
) -> [f32; WIDE] {
    let mut sums = [0f32; WIDE];
    for (xs, kept) in magnitudes.iter().zip(rounded) {
        let mut backs = [0f32; WIDE];
        for lane in 0..WIDE {
            backs[lane] = rounded_magnitude(xs[lane] / scales[lane]);
        }
        for lane in 0..WIDE {
            let error = xs[lane] - backs[lane] * scales[lane];
            sums[lane] += error * error;
        }
        if KEEP {
            *kept = backs;
        }
    }
    sums
}

/// Up to [`WIDE`] groups side by side, so that each step of their scales' choice runs across
/// the groups: row `r` holds each group's `r`-th value.
struct Batch {
    /// The groups' values, zeros past the last group.
    values: [[f32; WIDE]; GROUP],
    /// Their magnitudes, times a power of two where [`group_scales`] measures in its units.
    magnitudes: [[f32; WIDE]; GROUP],
    /// Each value's magnitude rounded to the E2M1 grid under the nearer of its group's
    /// candidate scales, and under the other, where `rounded_kept` says so.
    nearest: [[f32; WIDE]; GROUP],
    other: [[f32; WIDE]; GROUP],
    /// All ones for each group whose scale is the other candidate, zeros for the nearer.
    take_other: [u32; WIDE],
    /// Whether `nearest` and `other` hold the magnitudes under the scales chosen, as [`encode`]
    /// and [`rounded_magnitude`] would round each value's quotient by its scale: not when the
    /// groups were measured in units of a power of two, a scale was raised past both its
    /// candidates, or a scale is 0.
    rounded_kept: bool,
}

impl Batch {
    /// The magnitude of row `row`'s values rounded under their scales as chosen.
    #[expect(
        clippy::inline_always,
        reason = "inlined into the kernels, whose copies for AVX2 and AVX-512 it must share"
    )]
    #[inline(always)]
    fn rounded(&self, row: usize, lane: usize) -> f32 {
        let mask = self.take_other[lane];
        f32::from_bits(
            (self.other[row][lane].to_bits() & mask) | (self.nearest[row][lane].to_bits() & !mask),
        )
    }

    fn new() -> Batch {
        Batch {
            values: [[0.0; WIDE]; GROUP],
            magnitudes: [[0.0; WIDE]; GROUP],
            nearest: [[0.0; WIDE]; GROUP],
            other: [[0.0; WIDE]; GROUP],
            take_other: [0; WIDE],
            rounded_kept: false,
        }
    }

    /// Takes in `groups` (at most [`WIDE`], zeros past the last), turned by `turn`: the kernels
    /// pass the turn in registers their target has (`match_target!` works only in their own
    /// bodies).
    #[expect(
        clippy::inline_always,
        reason = "inlined into the kernels, whose copies for AVX2 and AVX-512 it must share"
    )]
    #[inline(always)]
    fn fill(&mut self, groups: &[[f32; GROUP]], turn: impl Fn(&Square) -> Square) {
        self.values = if let Ok(whole) = <&Square>::try_from(groups) {
            turn(whole)
        } else {
            let mut padded = [[0.0; GROUP]; WIDE];
            padded[..groups.len()].copy_from_slice(groups);
            turn(&padded)
        };
    }
}

/// The scales of up to [`WIDE`] groups, each as stored (an E4M3 byte) and as its values are
/// divided by: of the two E4M3 values either side of `absmax / 6 · global`, the one that leaves
/// the group the least error while keeping its largest value within half a step of 6 (the
/// nearer on a tie). Lane by lane, in steps that vectorize across the groups.
#[expect(
    clippy::inline_always,
    reason = "inlined into the kernels, whose copies for AVX2 and AVX-512 it must share"
)]
#[inline(always)]
fn group_scales<const KEEP: bool>(
    batch: &mut Batch,
    tensor_global: f32,
) -> ([u8; WIDE], [f32; WIDE]) {
    // Far from 1, the squared errors of the scales tried would overflow `f32` or vanish in it:
    // the values and the scales are then taken times a power of two near the global scale,
    // which changes no quotient, no choice and no comparison of errors (the scales chosen are
    // worked out again from their bytes).
    let mut global = tensor_global;
    let in_units = !(GLOBAL_AS_IS.0..=GLOBAL_AS_IS.1).contains(&global);
    let unit = if in_units {
        f32::from_bits(global.to_bits() & 0xFF80_0000)
    } else {
        1.0
    };
    global /= unit;
    let mut absmax = [0f32; WIDE];
    for (magnitudes, values) in batch.magnitudes.iter_mut().zip(&batch.values) {
        for lane in 0..WIDE {
            magnitudes[lane] = (values[lane] * unit).abs();
            absmax[lane] = larger(magnitudes[lane], absmax[lane]);
        }
    }
    let (mut nearest, mut other) = ([0u32; WIDE], [0u32; WIDE]);
    for lane in 0..WIDE {
        // Not negative: `encode` without its clamp and NaN check.
        let ideal = (absmax[lane] / 6.0 * global).min(fp8::MAX);
        let byte = u32::from(fp8::encode_clamped(ideal));
        nearest[lane] = byte;
        other[lane] = if fp8_value(byte) > ideal {
            byte.saturating_sub(1)
        } else {
            (byte + 1).min(0x7E)
        };
    }
    // Closures here would be compiled apart from this kernel's target features: plain loops.
    let (mut nearest_scales, mut other_scales) = ([0f32; WIDE], [0f32; WIDE]);
    for lane in 0..WIDE {
        nearest_scales[lane] = fp8_value(nearest[lane]) / global;
        other_scales[lane] = fp8_value(other[lane]) / global;
    }
    let nearest_errors =
        group_errors::<KEEP>(&batch.magnitudes, &nearest_scales, &mut batch.nearest);
    let other_errors = group_errors::<KEEP>(&batch.magnitudes, &other_scales, &mut batch.other);
    let mut take_other = [false; WIDE];
    let (mut bytes, mut scales) = (nearest, nearest_scales);
    let mut neither_within = false;
    for lane in 0..WIDE {
        let nearest_within = within(absmax[lane], nearest_scales[lane]);
        let other_within = within(absmax[lane], other_scales[lane]);
        // A scale of 0 leaves an error beyond any other, chosen here rather than in a loop of
        // its own, which was compiled into a branch per lane and scale.
        let nearest_error = if nearest_scales[lane] == 0.0 {
            f32::INFINITY
        } else {
            nearest_errors[lane]
        };
        let other_error = if other_scales[lane] == 0.0 {
            f32::INFINITY
        } else {
            other_errors[lane]
        };
        take_other[lane] = other_within && (!nearest_within || other_error < nearest_error);
        if take_other[lane] {
            (bytes[lane], scales[lane]) = (other[lane], other_scales[lane]);
        }
        neither_within |= !nearest_within && !other_within;
    }
    for (mask, &take) in batch.take_other.iter_mut().zip(&take_other) {
        *mask = 0u32.wrapping_sub(u32::from(take));
    }
    let mut zero_scale = false;
    for &scale in &scales {
        zero_scale |= scale == 0.0;
    }
    batch.rounded_kept = KEEP && !in_units && !neither_within && !zero_scale;
    if neither_within {
        for lane in 0..WIDE {
            // Up one code at a time while the largest value would land past 6 and half a step.
            while bytes[lane] < 0x7E && !within(absmax[lane], scales[lane]) {
                bytes[lane] += 1;
                scales[lane] = fp8_value(bytes[lane]) / global;
            }
        }
    }
    if in_units {
        for lane in 0..WIDE {
            scales[lane] = fp8_value(bytes[lane]) / tensor_global;
        }
    }
    // Two arrays, not one of pairs, whose building was compiled into a store per byte and scale.
    let mut stored = [0u8; WIDE];
    for lane in 0..WIDE {
        stored[lane] = bytes[lane].to_le_bytes()[0];
    }
    (stored, scales)
}

/// The global scales whose groups [`group_scales`] measures as they are: their scales are
/// within `2^±29`, their squared errors within `2^±60`.
const GLOBAL_AS_IS: (f32, f32) = (1.0 / 1_048_576.0, 1_048_576.0);

/// The value of the E4M3 byte `byte`, from its bits.
#[expect(
    clippy::inline_always,
    reason = "inlined into the kernels, whose copies for AVX2 and AVX-512 it must share"
)]
#[inline(always)]
fn fp8_value(byte: u32) -> f32 {
    fp8::value_and_step(byte.to_le_bytes()[0]).0
}

/// Whether a group whose largest magnitude is `absmax` lands within half a step of 6 under
/// `scale`.
#[expect(
    clippy::inline_always,
    reason = "inlined into the kernels, whose copies for AVX2 and AVX-512 it must share"
)]
#[inline(always)]
fn within(absmax: f32, scale: f32) -> bool {
    absmax == 0.0 || absmax / scale <= 7.0
}

/// Each of `row`'s groups coded under the scale chosen for it, two codes to a byte, onto the
/// end of `codes`, and its scale's byte onto the end of `scale_bytes`.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn quantize_row(row: &[[f32; GROUP]], global: f32, codes: &mut Vec<u8>, scale_bytes: &mut Vec<u8>) {
    let mut batch = Batch::new();
    for groups in row.chunks(WIDE) {
        batch.fill(groups, |rows| {
            match_target! {
                "x86_64+avx512f" => transpose::transposed_avx512(rows),
                "x86_64+avx2" => transpose::transposed_avx(rows),
                _ => transpose::transposed(rows),
            }
        });
        let (stored, scales) = group_scales::<false>(&mut batch, global);
        scale_bytes.extend_from_slice(&stored[..groups.len()]);
        let start = codes.len();
        codes.resize(start + groups.len() * GROUP / 2, 0);
        let (out, _) = codes[start..].as_chunks_mut::<{ GROUP / 2 }>();
        for ((group, &scale), bytes) in groups.iter().zip(&scales).zip(out) {
            // A scale of 0 or beyond `f32` codes every value as 0.
            let usable = scale != 0.0 && scale.is_finite();
            let mut group_codes = [0u32; GROUP];
            for (code, &x) in group_codes.iter_mut().zip(group) {
                *code = if usable { encode(x / scale) } else { 0 };
            }
            // Each pair of codes as one `u64` (the first in its low half), both moved into its
            // low byte by one shift: a shift, an or and a narrowing for the group, where the pairs
            // taken apart were compiled into seven shuffles and shifts.
            let pairs: [u64; GROUP / 2] = bytemuck::cast(group_codes);
            for (byte, pair) in bytes.iter_mut().zip(pairs) {
                *byte = (pair | (pair >> 28)).to_le_bytes()[0];
            }
        }
    }
}

pub fn quantize(plan: &Plan, values: &[f32], out: &mut Streams) {
    let columns = columns(plan);
    for row in values.chunks(columns) {
        // The model's weights are cut into whole groups (see `fits`).
        let (groups, _) = row.as_chunks::<GROUP>();
        quantize_row(groups, plan.global_scale, &mut out.codes, &mut out.scales);
    }
}

/// Adds a row's values, which came back from `codes` (two to a byte) under each group's
/// `scales`, to `checked`, in `f32`: the back value `e2m1 · scale` and the error are rounded once
/// each, at most `2^-24 · |x|` beside the exact ones, well within the half-step check's slack and
/// far below the errors the sums report. Each value's step is taken in units of 1 (its inverse
/// the group's inverse scale over the E2M1 step, a power of two).
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn check_row_in_f32(values: &[f32], codes: &[u8], scales: &[f32], checked: &mut Checked) {
    const { assert!(GROUP == WIDE) };
    let mut local = *checked;
    for ((xs, bytes), &scale) in values
        .as_chunks::<GROUP>()
        .0
        .iter()
        .zip(codes.as_chunks::<{ GROUP / 2 }>().0)
        .zip(scales)
    {
        let (backs, steps, per_steps) = match_target! {
            "x86_64+avx512f" => decode_group_avx512(*bytes, scale),
            _ => decode_group(bytes, scale),
        };
        local.add::<TO_BF16>(xs, &backs, &steps, &per_steps);
    }
    *checked = local;
}

/// [`check_row_in_f32`] in `f64`, for a weight whose squares `f32` does not hold (see
/// [`tensor_measured_in_f32`]).
fn check_row_in_f64(values: &[f32], codes: &[u8], scales: &[f32], measure: &mut Measure) {
    for ((values, bytes), &scale) in values
        .as_chunks::<GROUP>()
        .0
        .iter()
        .zip(codes.as_chunks::<{ GROUP / 2 }>().0)
        .zip(scales)
    {
        let scale = f64::from(scale);
        let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        for (pair, &byte) in values.as_chunks::<2>().0.iter().zip(bytes) {
            for (&x, code) in pair.iter().zip([byte & 15, byte >> 4]) {
                let (value, step) = value_and_step(code);
                let step = f64::from(step);
                measure.add(x, f64::from(value) * scale, step * scale, inverse / step);
            }
        }
    }
}

/// A group's values as they come back from its codes `bytes` under `scale`, the grid's step
/// around each and the inverse of that step, in loops over the group that vectorize.
#[expect(
    clippy::inline_always,
    reason = "inlined into the kernels, whose copies for AVX2 and AVX-512 it must share"
)]
#[inline(always)]
fn decode_group(bytes: &[u8; GROUP / 2], scale: f32) -> ([f32; GROUP], [f32; GROUP], [f32; GROUP]) {
    let (mut backs, mut steps, mut per_steps) = ([0f32; GROUP], [0f32; GROUP], [0f32; GROUP]);
    let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    let mut codes = [0u8; GROUP];
    for (pair, &byte) in codes.as_chunks_mut::<2>().0.iter_mut().zip(bytes) {
        *pair = [byte & 15, byte >> 4];
    }
    for lane in 0..GROUP {
        let (value, step) = value_and_step(codes[lane]);
        backs[lane] = value * scale;
        steps[lane] = step * scale;
        // The step is 1/2, 1 or 2: its inverse is exact.
        per_steps[lane] = inverse * (1.0 / step);
    }
    (backs, steps, per_steps)
}

/// [`decode_group`] in AVX-512 registers: each byte's two codes spread to their lanes, and each
/// code's value, step and inverse step looked up in tables of [`value_and_step`] for the 16
/// codes (`vpermps`), where the choices among the codes took a dozen steps.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn decode_group_avx512(
    bytes: [u8; GROUP / 2],
    scale: f32,
) -> ([f32; GROUP], [f32; GROUP], [f32; GROUP]) {
    use core::arch::x86_64::{
        __m128i, __m512, __m512i, _mm_unpacklo_epi8, _mm512_cvtepu8_epi32, _mm512_mul_ps,
        _mm512_permutexvar_ps, _mm512_set1_ps, _mm512_srlv_epi32,
    };
    const { assert!(GROUP == 16) };
    let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    let mut wide = [0u8; 16];
    wide[..GROUP / 2].copy_from_slice(&bytes);
    let wide: __m128i = bytemuck::cast(wide);
    // Each byte twice, in the lanes of its low code and its high one; the tables read only the
    // low four bits of a lane, so the high code needs only its shift.
    let lanes = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(wide, wide));
    let shifts: __m512i = bytemuck::cast([0u32, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4]);
    let codes = _mm512_srlv_epi32(lanes, shifts);
    // Constants once compiled: `value_and_step` of each code.
    let table = |of: fn((f32, f32)) -> f32| -> __m512 {
        bytemuck::cast::<[f32; 16], _>(core::array::from_fn(|code| {
            of(value_and_step(u8::try_from(code).unwrap_or(0)))
        }))
    };
    let look_up = |of: fn((f32, f32)) -> f32| _mm512_permutexvar_ps(codes, table(of));
    let backs = _mm512_mul_ps(look_up(|(value, _)| value), _mm512_set1_ps(scale));
    let steps = _mm512_mul_ps(look_up(|(_, step)| step), _mm512_set1_ps(scale));
    let per_steps = _mm512_mul_ps(look_up(|(_, step)| 1.0 / step), _mm512_set1_ps(inverse));
    (
        bytemuck::cast(backs),
        bytemuck::cast(steps),
        bytemuck::cast(per_steps),
    )
}

pub fn check(plan: &Plan, source: &[f32], written: &Streams) -> (ErrorSums, bool) {
    let columns = columns(plan);
    let groups = columns / GROUP;
    let bytes = columns / 2;
    let (mut measure, mut checked) = (Measure::new(plan.loaded()), Checked::new(plan.loaded()));
    let mut scales = Vec::with_capacity(groups);
    for (row, values) in source.chunks(columns).enumerate() {
        let codes = &written.codes[row * bytes..][..bytes];
        scales.clear();
        scales.extend(
            written.scales[row * groups..][..groups]
                .iter()
                .map(|&byte| fp8::decode(byte) / plan.global_scale),
        );
        let values = &values[..groups * GROUP];
        // The squares of a weight far from 1 would pass `f32`'s range, or vanish in it.
        if tensor_measured_in_f32(plan.absmax) {
            check_row_in_f32(values, codes, &scales, &mut checked);
        } else {
            check_row_in_f64(values, codes, &scales, &mut measure);
        }
    }
    checked.end_group(1.0);
    let ((mut sums, within), (in_f32, within_in_f32)) = (measure.finish(), checked.finish());
    sums.merge(&in_f32);
    (sums, within && within_in_f32)
}

/// The error [`check`] would measure of what [`quantize`] writes for `values` (whole rows),
/// worked out without codes: each group's scale as [`quantize`] chooses it, each value rounded to
/// the E2M1 grid from its quotient by the scale, as [`quantize`] codes it.
pub fn error(plan: &Plan, values: &[f32], signal: f64) -> ErrorSums {
    let columns = columns(plan);
    let mut tally = Compared::new(plan.loaded());
    for row in values.chunks(columns) {
        // The model's weights are cut into whole groups (see `fits`).
        let (groups, _) = row.as_chunks::<GROUP>();
        tally_row(groups, plan.global_scale, &mut tally);
    }
    tally.finish(signal)
}

/// Adds `row`'s groups, each under the scale [`quantize`] chooses for it, to `tally`.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn tally_row(row: &[[f32; GROUP]], global: f32, tally: &mut Compared) {
    const { assert!(GROUP == WIDE) };
    let mut local = *tally;
    let mut batch = Batch::new();
    for groups in row.chunks(WIDE) {
        batch.fill(groups, |rows| {
            match_target! {
                "x86_64+avx512f" => transpose::transposed_avx512(rows),
                "x86_64+avx2" => transpose::transposed_avx(rows),
                _ => transpose::transposed(rows),
            }
        });
        let (_, scales) = group_scales::<true>(&mut batch, global);
        if batch.rounded_kept {
            // Side by side, each lane a group: the errors' magnitudes are those of the values,
            // and their squares the same.
            for (row, magnitudes) in batch.magnitudes.iter().enumerate() {
                let mut backs = [0f32; WIDE];
                for lane in 0..WIDE {
                    backs[lane] = batch.rounded(row, lane) * scales[lane];
                }
                local.add::<TO_BF16>(magnitudes, &backs);
            }
            continue;
        }
        for (xs, &scale) in groups.iter().zip(&scales) {
            let by = divisor(scale);
            let mut backs = [0f32; WIDE];
            for lane in 0..WIDE {
                let rounded = rounded_magnitude((xs[lane] / by).abs());
                backs[lane] = (rounded * scale).copysign(xs[lane]);
            }
            local.add::<TO_BF16>(xs, &backs);
        }
    }
    *tally = local;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Dtype;
    use crate::quantize::scheme::Scheme;

    fn decode(code: u8) -> f32 {
        value_and_step(code).0
    }

    #[test]
    fn codes_decode_to_the_e2m1_grid() {
        let magnitudes = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        let steps = [0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 2.0, 2.0];
        for code in 0..16u8 {
            let sign = if code < 8 { 1.0 } else { -1.0 };
            let n = usize::from(code & 7);
            assert_eq!(value_and_step(code), (sign * magnitudes[n], steps[n]));
            assert_eq!(rounded_magnitude(magnitudes[n]), magnitudes[n]);
        }
    }

    /// A group decoded as this processor's check decodes it (through the tables with AVX-512).
    #[multiversion(targets("x86_64+avx512f", "x86_64+avx2"))]
    fn decoded_as_checked(
        bytes: &[u8; GROUP / 2],
        scale: f32,
    ) -> ([f32; GROUP], [f32; GROUP], [f32; GROUP]) {
        match_target! {
            "x86_64+avx512f" => decode_group_avx512(*bytes, scale),
            _ => decode_group(bytes, scale),
        }
    }

    #[test]
    fn groups_decode_through_the_tables_as_code_by_code() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for scale in [0.0f32, 1.0, 0.013_671_875, 3.0e-9, 448.0 / 3.0] {
            for _ in 0..64 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let bytes = state.to_le_bytes();
                let (a, b) = (
                    decoded_as_checked(&bytes, scale),
                    decode_group(&bytes, scale),
                );
                for (x, y) in [(a.0, b.0), (a.1, b.1), (a.2, b.2)] {
                    assert_eq!(
                        x.map(f32::to_bits),
                        y.map(f32::to_bits),
                        "{bytes:?} {scale}"
                    );
                }
            }
        }
    }

    /// The code nearest `value` by E2M1's thresholds (the midpoints between its values), a tie
    /// to the even code.
    fn code_by_thresholds(value: f32) -> u32 {
        let a = value.abs();
        let passed = [
            a > 0.25,
            a >= 0.75,
            a > 1.25,
            a >= 1.75,
            a > 2.5,
            a >= 3.5,
            a > 5.0,
        ];
        passed.iter().map(|&p| u32::from(p)).sum::<u32>() + ((value.to_bits() >> 28) & 8)
    }

    /// Every magnitude whose bits are a multiple of `stride`, and those next to each threshold.
    fn magnitudes(stride: u32) -> impl Iterator<Item = f32> {
        let thresholds = [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 8.0];
        let near = thresholds
            .into_iter()
            .flat_map(|t| (0..=8).map(move |k| f32::from_bits(t.to_bits() - 4 + k)));
        (0..=f32::INFINITY.to_bits())
            .step_by(stride as usize)
            .map(f32::from_bits)
            .chain(near)
            .chain([f32::MAX, f32::INFINITY, f32::MIN_POSITIVE, 1e-45])
    }

    #[test]
    fn codes_and_magnitudes_are_those_of_the_thresholds() {
        for a in magnitudes(4099) {
            for value in [a, -a] {
                let code = code_by_thresholds(value);
                assert_eq!(encode(value), code, "{value:e}");
                let code = u8::try_from(code).unwrap_or(u8::MAX);
                assert_eq!(rounded_magnitude(a), decode(code).abs(), "{a:e}");
            }
        }
    }

    #[test]
    fn codes_round_to_nearest() {
        for code in 0..16u8 {
            if code == 8 {
                continue;
            }
            assert_eq!(encode(decode(code)), u32::from(code));
        }
        assert_eq!(encode(0.25), 0);
        assert_eq!(encode(0.75), 2);
        assert_eq!(encode(2.5), 4);
        assert_eq!(encode(5.0), 6);
        assert_eq!(encode(-100.0), 15);
    }

    proptest::proptest! {
        /// The `f32` measure of a row gives the `f64` one's figures: the values as loaded
        /// (rounded to BF16) alike, the errors and their squares to `f32`'s rounding.
        #[test]
        fn the_f32_measure_agrees_with_the_plain_one(
            values in super::super::lanes::test_values(1..64),
            bf16: bool,
        ) {
            let values: Vec<f32> = values
                .iter()
                .cycle()
                .take(values.len() * GROUP)
                .map(|&x| if bf16 { half::bf16::from_f32(x).to_f32() } else { x })
                .collect();
            let absmax = values.iter().fold(0f32, |m, x| m.max(x.abs()));
            let dtype = if bf16 { Dtype::Bf16 } else { Dtype::F32 };
            let columns = values.len() as u64;
            let plan = Plan::new(Scheme::Nvfp4A16, 16, [1, columns], dtype, f64::from(absmax));
            let mut out = Streams::default();
            quantize(&plan, &values, &mut out);
            let scales: Vec<f32> = out
                .scales
                .iter()
                .map(|&byte| fp8::decode(byte) / plan.global_scale)
                .collect();
            let (mut plain, mut in_f32) = (Measure::new(plan.loaded()), Checked::new(plan.loaded()));
            check_row_in_f64(&values, &out.codes, &scales, &mut plain);
            check_row_in_f32(&values, &out.codes, &scales, &mut in_f32);
            in_f32.end_group(1.0);
            let ((a, a_within), (b, b_within)) = (plain.finish(), in_f32.finish());
            super::super::lanes::assert_agree(&a, &b, false)?;
            proptest::prop_assert!(a_within);
            proptest::prop_assert!(b_within);
        }
    }

    proptest::proptest! {
        /// The error worked out without codes, from the grid values met while choosing each
        /// group's scale (or, for weights far from 1, worked out again), is the one measured
        /// of the codes written.
        #[test]
        fn the_error_without_codes_is_the_one_written(
            values in super::super::lanes::test_values(1..600),
            groups in 1u64..40,
            magnitude in proptest::sample::select(&[1f32, 1e-12, 1e12][..]),
        ) {
            let columns = groups * GROUP as u64;
            let columns_len = usize::try_from(columns).unwrap_or(usize::MAX);
            let values: Vec<f32> = values
                .iter()
                .cycle()
                .take(values.len().div_ceil(columns_len) * columns_len)
                .map(|&x| half::bf16::from_f32(x * magnitude).to_f32())
                .collect();
            let rows = (values.len() / columns_len) as u64;
            let absmax = values.iter().fold(0f32, |m, x| m.max(x.abs()));
            let plan = Plan::new(Scheme::Nvfp4A16, 16, [rows, columns], Dtype::Bf16, f64::from(absmax));
            let mut out = Streams::default();
            quantize(&plan, &values, &mut out);
            let (written, _) = check(&plan, &values, &out);
            let worked_out = error(&plan, &values, written.signal);
            // Not measured by a comparison (see `Compared`).
            let worked_out = ErrorSums {
                max_in_steps: written.max_in_steps,
                ..worked_out
            };
            super::super::lanes::assert_agree(&written, &worked_out, false)?;
        }
    }

    #[test]
    fn reads_back_within_half_a_step_with_the_low_nibble_first() {
        let source: Vec<f32> = (0..8 * 64)
            .map(|i| (((i * 7919) % 2000) as f32 - 1000.0) / 1234.0)
            .collect();
        let absmax = source.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let plan = Plan::new(
            Scheme::Nvfp4A16,
            16,
            [8, 64],
            Dtype::Bf16,
            f64::from(absmax),
        );
        let mut out = Streams::default();
        quantize(&plan, &source, &mut out);
        assert_eq!((out.codes.len(), out.scales.len()), (8 * 32, 8 * 4));
        let (checked, within) = check(&plan, &source, &out);
        assert!(within);
        assert!(checked.max_in_steps <= 0.5 + 1e-4);
        let scale = fp8::decode(out.scales[0]) / plan.global_scale;
        assert_eq!(u32::from(out.codes[0] & 15), encode(source[0] / scale));
        assert_eq!(u32::from(out.codes[0] >> 4), encode(source[1] / scale));
    }
}
