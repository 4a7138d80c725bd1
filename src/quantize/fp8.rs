//! FP8 E4M3 weights in the compressed-tensors `float-quantized` layout: `P.weight` `F8_E4M3`
//! `[out, in]` and `P.weight_scale` in the source's float dtype, `[out, 1]` per channel
//! (`FP8_DYNAMIC`) or `[ceil(out/128), ceil(in/128)]` per 128x128 block (`FP8_BLOCK`).
//! `scale = absmax / 448`, `q = e4m3(clamp(x / scale, ±448))` rounded to nearest, ties to even;
//! `x' = q · scale`.

use super::int_packed::BlockRanges;
use super::lanes::{
    Checked, Compared, LANES, Measure, Rounding, WIDE, byte_of, clamp, divisor, for_loaded, larger,
    scale_in_f32, wide_chunks,
};
use super::scheme::{BLOCK, ErrorSums, Plan, Scheme, Streams, decode_scales};
use super::{encode_scale, loadable, stored_at_least};
use multiversion::multiversion;

/// The largest finite E4M3 value.
pub const MAX: f32 = 448.0;

/// `value` rounded to the nearest E4M3 value (clamped to ±448), ties to even, as its byte. NaN
/// becomes 0.
#[cfg(test)]
fn encode(value: f32) -> u8 {
    if value.is_nan() {
        return 0;
    }
    encode_clamped(clamp(value, -MAX, MAX))
}

/// [`encode`] of a value already within ±448, without branches.
#[expect(
    clippy::inline_always,
    reason = "inlined into the kernels, whose copies for AVX2 and AVX-512 it must share"
)]
#[inline(always)]
pub(super) fn encode_clamped(value: f32) -> u8 {
    let bits = value.to_bits();
    let sign = if bits >> 31 == 0 { 0 } else { 0x80 };
    let magnitude_bits = bits & 0x7FFF_FFFF;
    let magnitude = f32::from_bits(magnitude_bits);
    // Below the smallest normal (2^-6) the grid is even, in steps of 2^-9; its codes run on
    // into the normal ones (code 8 is 2^-6).
    let subnormal = byte_of(magnitude * 512.0);
    // Round the f32 mantissa to 3 bits, ties to even, carrying into the exponent: the exponent
    // and mantissa bits, less the exponents' difference of bias (120 = 127 - 7).
    let rounded = magnitude_bits + 0x7_FFFF + ((magnitude_bits >> 20) & 1);
    let normal = ((rounded >> 20).wrapping_sub(120 << 3))
        .min(0x7E)
        .to_le_bytes()[0];
    sign | if magnitude < 1.0 / 64.0 {
        subnormal
    } else {
        normal
    }
}

/// The values of the E4M3 bytes (0x7F and 0xFF, NaN, read as NaN).
static DECODED: [f32; 256] = {
    let mut table = [0f32; 256];
    let mut byte = 0;
    while byte < 256 {
        let exponent = (byte >> 3) & 15;
        let mantissa = byte & 7;
        #[expect(clippy::cast_possible_truncation, reason = "a byte")]
        let magnitude = if byte & 0x7F == 0x7F {
            f32::NAN
        } else if exponent == 0 {
            mantissa as f32 / 512.0
        } else {
            f32::from_bits(((exponent as u32 + 120) << 23) | ((mantissa as u32) << 20))
        };
        table[byte] = if byte & 0x80 == 0 {
            magnitude
        } else {
            -magnitude
        };
        byte += 1;
    }
    table
};

/// The spacing of each E4M3 byte's binade, as a power of two: `2^(max(e, 1) - 10)`.
static STEP: [f32; 256] = {
    let mut table = [0f32; 256];
    let mut byte = 0;
    while byte < 256 {
        let exponent = (byte >> 3) & 15;
        let exponent = if exponent == 0 { 1 } else { exponent };
        #[expect(clippy::cast_possible_truncation, reason = "an exponent of 1 to 15")]
        let biased = (exponent + 127 - 10) as u32;
        table[byte] = f32::from_bits(biased << 23);
        byte += 1;
    }
    table
};

/// The value of an E4M3 byte (0x7F and 0xFF, NaN, read as NaN).
pub fn decode(byte: u8) -> f32 {
    DECODED[usize::from(byte)]
}

/// The grid's step around an E4M3 byte's value: the spacing of its binade.
pub fn step(byte: u8) -> f32 {
    STEP[usize::from(byte)]
}

fn columns(plan: &Plan) -> usize {
    usize::try_from(plan.columns).unwrap_or(usize::MAX).max(1)
}

fn block_columns(plan: &Plan) -> usize {
    match plan.scheme {
        Scheme::Fp8Block => usize::try_from(BLOCK).unwrap_or(128),
        _ => columns(plan),
    }
}

fn block_rows(plan: &Plan) -> usize {
    match plan.scheme {
        Scheme::Fp8Block => usize::try_from(BLOCK).unwrap_or(128),
        _ => 1,
    }
}

/// The largest magnitude of `values`.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn absmax(values: &[f32]) -> f32 {
    let mut max = [0f32; LANES];
    let (chunks, rest) = values.as_chunks::<LANES>();
    for chunk in chunks {
        for lane in 0..LANES {
            let x = chunk[lane].abs();
            max[lane] = larger(x, max[lane]);
        }
    }
    for &x in rest {
        max[0] = larger(x.abs(), max[0]);
    }
    // No lane holds NaN (see `larger`): `f32::max`'s care for it doubled the reduction's steps,
    // a good part of the work for a block's 128 values.
    max.into_iter().fold(0.0, |max, x| larger(x, max))
}

/// Quantizes `row` with `scale` (as stored) onto the end of `out`.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn encode_block(row: &[f32], scale: f64, out: &mut Vec<u8>) {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "scales are at most f32 here"
    )]
    let scale32 = scale as f32;
    let start = out.len();
    out.resize(start + row.len(), 0);
    if scale32 == 0.0 || !scale32.is_finite() {
        return;
    }
    for (&x, code) in row.iter().zip(&mut out[start..]) {
        *code = encode_clamped(clamp(x / scale32, -MAX, MAX));
    }
}

/// The scales, as stored, of a run of whole rows of blocks, onto the end of `out` (encoded)
/// and of `scales`.
fn block_scales(plan: &Plan, rows: &[f32], out: &mut Vec<u8>, scales: &mut Vec<f64>) {
    let columns = columns(plan);
    let block_columns = block_columns(plan);
    let mut maxima = vec![0f32; columns.div_ceil(block_columns)];
    for row in rows.chunks(columns) {
        for (block, max) in row.chunks(block_columns).zip(&mut maxima) {
            *max = max.max(absmax(block));
        }
    }
    scales_of(plan, maxima, out, scales);
}

/// [`block_scales`] of rows `rows` of a block whose groups' ranges are `ranges`, where they
/// give the blocks' largest magnitudes (each row's, or groups as wide as a block).
fn block_scales_from_ranges(
    plan: &Plan,
    rows: std::ops::Range<usize>,
    ranges: &BlockRanges,
    out: &mut Vec<u8>,
    scales: &mut Vec<f64>,
) -> bool {
    let maxima: Vec<f32> = match plan.scheme {
        Scheme::Fp8Block if ranges.group() == block_columns(plan) => ranges.columns_absmax(rows),
        Scheme::Fp8Dynamic => vec![ranges.row_absmax(rows.start)],
        _ => return false,
    };
    scales_of(plan, maxima, out, scales);
    true
}

/// The scales, as stored, of blocks whose largest magnitudes are `maxima`, onto the end of `out`
/// (encoded) and of `scales`.
fn scales_of(plan: &Plan, maxima: Vec<f32>, out: &mut Vec<u8>, scales: &mut Vec<f64>) {
    for max in maxima {
        let scale = stored_at_least(plan.scale_dtype, f64::from(max) / f64::from(MAX));
        let scale = loadable(plan.scale_dtype, scale, f64::from(MAX));
        encode_scale(plan.scale_dtype, scale, out);
        scales.push(scale);
    }
}

pub fn quantize(plan: &Plan, values: &[f32], out: &mut Streams) {
    let columns = columns(plan);
    let (block_rows, block_columns) = (block_rows(plan), block_columns(plan));
    let mut scales = Vec::new();
    for rows in values.chunks(columns * block_rows) {
        scales.clear();
        block_scales(plan, rows, &mut out.scales, &mut scales);
        for row in rows.chunks(columns) {
            for (block, &scale) in row.chunks(block_columns).zip(&scales) {
                encode_block(block, scale, &mut out.codes);
            }
        }
    }
}

/// The scales alone of [`quantize`].
pub fn quantize_scales(plan: &Plan, values: &[f32], out: &mut Streams) {
    let mut scales = Vec::new();
    for rows in values.chunks(columns(plan) * block_rows(plan)) {
        block_scales(plan, rows, &mut out.scales, &mut scales);
    }
}

/// Adds a block's values, which came back from `codes` under `scale`.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn measure_block(values: &[f32], codes: &[u8], scale: f64, measure: &mut Measure) {
    let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    let mut local = *measure;
    let (chunks, rest) = values.as_chunks::<LANES>();
    let (code_chunks, code_rest) = codes.as_chunks::<LANES>();
    for (xs, cs) in chunks.iter().zip(code_chunks) {
        let (mut backs, mut steps, mut inverses) = ([0f64; LANES], [0f64; LANES], [0f64; LANES]);
        for lane in 0..LANES {
            let step = f64::from(step(cs[lane]));
            backs[lane] = f64::from(decode(cs[lane])) * scale;
            steps[lane] = step * scale;
            inverses[lane] = inverse / step;
        }
        local.add_lanes(xs, &backs, &steps, &inverses);
    }
    for (&x, &code) in rest.iter().zip(code_rest) {
        let step = f64::from(step(code));
        local.add(
            x,
            f64::from(decode(code)) * scale,
            step * scale,
            inverse / step,
        );
    }
    *measure = local;
}

/// Adds a row's values, each block's come back from its codes under its scale of `scales`, to
/// `checked`, in `f32`; blocks whose scale there is 0 are left out (measured in `f64`,
/// [`measure_block`]). For BF16 values and a BF16 scale, an E4M3 value (4 significant bits)
/// times the scale has at most 12, and the value's distance from it is exact in `f32`, so the
/// errors are [`measure_block`]'s; for wider values each is rounded once more (see
/// [`Checked`]).
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn check_row_in_f32(
    values: &[f32],
    codes: &[u8],
    block_columns: usize,
    scales: &[f32],
    checked: &mut Checked,
) {
    for_loaded!(checked.loaded(), ROUNDING => {
        check_row_in_f32_as::<ROUNDING>(values, codes, block_columns, scales, checked);
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
    block_columns: usize,
    scales: &[f32],
    checked: &mut Checked,
) {
    let mut local = *checked;
    for ((values, codes), &scale) in values
        .chunks(block_columns)
        .zip(codes.chunks(block_columns))
        .zip(scales)
    {
        if scale == 0.0 {
            continue;
        }
        let (chunks, rest) = values.as_chunks::<WIDE>();
        let (code_chunks, code_rest) = codes.as_chunks::<WIDE>();
        // The rest padded with zeros, whose code 0 comes back as 0.
        let (mut rest_values, mut rest_codes) = ([0f32; WIDE], [0u8; WIDE]);
        rest_values[..rest.len()].copy_from_slice(rest);
        rest_codes[..code_rest.len()].copy_from_slice(code_rest);
        let padded = (!rest.is_empty()).then_some((&rest_values, &rest_codes));
        for (xs, cs) in chunks.iter().zip(code_chunks).chain(padded) {
            let (mut backs, mut steps, mut per_steps) = ([0f32; WIDE], [0f32; WIDE], [0f32; WIDE]);
            // Decoded without tables, which vectorizes.
            for lane in 0..WIDE {
                let (value, step, per_step) = value_and_step(cs[lane]);
                backs[lane] = value * scale;
                steps[lane] = step * scale;
                per_steps[lane] = per_step;
            }
            local.add::<ROUNDING>(xs, &backs, &steps, &per_steps);
        }
        local.end_group(1.0 / f64::from(scale));
    }
    *checked = local;
}

/// An E4M3 byte's value, its [`step`] and the step's inverse, worked out from its bits (as
/// [`decode`] and [`step`] look them up) so that a loop of them vectorizes.
#[expect(
    clippy::inline_always,
    reason = "inlined into the kernels, whose copies for AVX2 and AVX-512 it must share"
)]
#[inline(always)]
pub(super) fn value_and_step(code: u8) -> (f32, f32, f32) {
    let byte = u32::from(code);
    let (exponent, mantissa) = ((byte >> 3) & 15, byte & 7);
    #[expect(clippy::cast_precision_loss, reason = "a mantissa of 3 bits")]
    let subnormal = mantissa as f32 / 512.0;
    let normal = f32::from_bits(((exponent + 120) << 23) | (mantissa << 20));
    let magnitude = if byte & 0x7F == 0x7F {
        f32::NAN
    } else if exponent == 0 {
        subnormal
    } else {
        normal
    };
    let value = if byte & 0x80 == 0 {
        magnitude
    } else {
        -magnitude
    };
    let binade = exponent.max(1);
    (
        value,
        f32::from_bits((binade + 117) << 23),
        f32::from_bits((137 - binade) << 23),
    )
}

pub fn check(plan: &Plan, source: &[f32], written: &Streams) -> (ErrorSums, bool) {
    let columns = columns(plan);
    let (block_rows, block_columns) = (block_rows(plan), block_columns(plan));
    let scales = decode_scales(plan.scale_dtype, &written.scales);
    let blocks = columns.div_ceil(block_columns);
    let (mut measure, mut checked) = (Measure::new(plan.loaded()), Checked::new(plan.loaded()));
    // Each block's scale as `f32`, 0 where its block is measured in `f64`.
    let mut narrow_scales = Vec::with_capacity(blocks);
    for ((rows, codes), scales) in source
        .chunks(columns * block_rows)
        .zip(written.codes.chunks(columns * block_rows))
        .zip(scales.chunks(blocks))
    {
        narrow_scales.clear();
        narrow_scales.extend(
            scales
                .iter()
                .map(|&scale| scale_in_f32(scale).unwrap_or(0.0)),
        );
        let some_wide = narrow_scales.contains(&0.0);
        for (values, codes) in rows.chunks(columns).zip(codes.chunks(columns)) {
            if some_wide {
                for (((values, codes), &scale), &narrow) in values
                    .chunks(block_columns)
                    .zip(codes.chunks(block_columns))
                    .zip(scales)
                    .zip(&narrow_scales)
                {
                    if narrow == 0.0 {
                        measure_block(values, codes, scale, &mut measure);
                    }
                }
            }
            check_row_in_f32(values, codes, block_columns, &narrow_scales, &mut checked);
        }
    }
    let ((mut sums, within), (in_f32, within_in_f32)) = (measure.finish(), checked.finish());
    sums.merge(&in_f32);
    (sums, within && within_in_f32)
}

/// The error [`check`] would measure of what [`quantize`] writes for `values` (whole rows of
/// blocks), worked out without codes: each block's scale as [`quantize`] chooses it, each value
/// rounded to the E4M3 grid from its quotient by the scale, as [`quantize`] codes it. For
/// scales `f32` holds (see [`Plan::error`]).
pub fn error(plan: &Plan, values: &[f32], signal: f64, ranges: Option<&BlockRanges>) -> ErrorSums {
    let columns = columns(plan);
    let (block_rows, block_columns) = (block_rows(plan), block_columns(plan));
    let (mut scales, mut encoded, mut narrow) = (Vec::new(), Vec::new(), Vec::new());
    let mut tally = Compared::new(plan.loaded());
    for (run, rows) in values.chunks(columns * block_rows).enumerate() {
        scales.clear();
        let first = run * block_rows;
        let from_ranges = ranges.is_some_and(|ranges| {
            let run_rows = first..first + rows.len().div_ceil(columns);
            block_scales_from_ranges(plan, run_rows, ranges, &mut encoded, &mut scales)
        });
        if !from_ranges {
            block_scales(plan, rows, &mut encoded, &mut scales);
        }
        encoded.clear();
        narrow.clear();
        #[expect(
            clippy::cast_possible_truncation,
            reason = "scales are at most f32 here"
        )]
        narrow.extend(scales.iter().map(|&scale| scale as f32));
        for row in rows.chunks(columns) {
            tally_row(row, block_columns, &narrow, &mut tally);
        }
    }
    tally.finish(signal)
}

/// Adds a row's values, each block's under its scale of `scales`, to `tally`.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn tally_row(row: &[f32], block_columns: usize, scales: &[f32], tally: &mut Compared) {
    for_loaded!(tally.loaded(), ROUNDING => {
        tally_row_as::<ROUNDING>(row, block_columns, scales, tally);
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
    block_columns: usize,
    scales: &[f32],
    tally: &mut Compared,
) {
    let mut local = *tally;
    for (values, &scale) in row.chunks(block_columns).zip(scales) {
        let by = divisor(scale);
        for xs in wide_chunks(values) {
            let mut backs = [0f32; WIDE];
            for lane in 0..WIDE {
                backs[lane] = rounded(clamp(xs[lane] / by, -MAX, MAX)) * scale;
            }
            local.add::<ROUNDING>(&xs, &backs);
        }
    }
    *tally = local;
}

/// A quotient within ±448 rounded to the E4M3 grid as [`encode_clamped`] rounds it (a zero's
/// sign aside). Adding and taking away 1.5 · 2^20 times the power of two at or below it (at least
/// 2^-6, below which the grid's step stays 2^-9), with its sign, leaves a whole number of its
/// binade's steps, ties to even, as the sum is rounded: one rounding for the normal and the
/// subnormal grid alike, rather than both and a choice.
#[expect(
    clippy::inline_always,
    reason = "inlined into the kernels, whose copies for AVX2 and AVX-512 it must share"
)]
#[inline(always)]
fn rounded(quotient: f32) -> f32 {
    let bits = quotient.to_bits();
    let power = (bits & 0x7F80_0000).max(SMALLEST_NORMAL_BITS);
    let shifter = f32::from_bits((power + SHIFT_TO_STEPS) | (bits & 0x8000_0000));
    (quotient + shifter) - shifter
}

/// The bits of 2^-6, E4M3's smallest normal value.
const SMALLEST_NORMAL_BITS: u32 = 121 << 23;

/// Added to the bits of a power of two, those of 1.5 · 2^20 times it: the power whose `f32` step
/// is E4M3's step in the binade of the first, times 1.5.
const SHIFT_TO_STEPS: u32 = (20 << 23) + 0x40_0000;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Dtype;

    proptest::proptest! {
        /// A comparison's block maxima taken from the int schemes' ranges give the error the
        /// blocks' own maxima give, to the bit.
        #[test]
        fn maxima_from_shared_ranges_give_the_same_errors(
            values in super::super::lanes::test_values(1..3000),
            columns in 1usize..400,
            rows in 1usize..300,
            group in proptest::sample::select(&[128usize, 64, 100][..]),
        ) {
            let values: Vec<f32> = values
                .iter()
                .cycle()
                .take(rows * columns)
                .map(|&x| half::bf16::from_f32(x).to_f32())
                .collect();
            let absmax = values.iter().fold(0f32, |m, x| m.max(x.abs()));
            let ranges = BlockRanges::of(&values, columns, group);
            let signal = values.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
            for scheme in [Scheme::Fp8Dynamic, Scheme::Fp8Block] {
                let shape = [rows as u64, columns as u64];
                let plan = Plan::new(scheme, 128, shape, Dtype::Bf16, f64::from(absmax));
                let own = error(&plan, &values, signal, None);
                let shared = error(&plan, &values, signal, Some(&ranges));
                proptest::prop_assert_eq!(own.noise.to_bits(), shared.noise.to_bits());
                proptest::prop_assert_eq!(own.max_abs.to_bits(), shared.max_abs.to_bits());
            }
        }

        #[test]
        fn the_f32_measure_agrees_with_the_plain_one(
            values in super::super::lanes::test_values(1..3000),
            wide: bool,
        ) {
            let (values, dtype): (Vec<f32>, _) = if wide {
                (values, Dtype::F32)
            } else {
                (values.into_iter().map(|x| half::bf16::from_f32(x).to_f32()).collect(), Dtype::Bf16)
            };
            let scale = stored_at_least(dtype, f64::from(absmax(&values)) / f64::from(MAX));
            #[expect(clippy::cast_possible_truncation, reason = "a BF16 or F32 scale")]
            let scale32 = scale as f32;
            proptest::prop_assume!(scale32 > 0.0);
            let mut codes = Vec::new();
            encode_block(&values, scale, &mut codes);
            let loaded = super::super::lanes::Loaded::of(dtype);
            let (mut plain, mut in_f32) = (Measure::new(loaded), Checked::new(loaded));
            measure_block(&values, &codes, scale, &mut plain);
            check_row_in_f32(&values, &codes, values.len(), &[scale32], &mut in_f32);
            let ((a, a_within), (b, b_within)) = (plain.finish(), in_f32.finish());
            super::super::lanes::assert_agree(&a, &b, !wide)?;
            proptest::prop_assert!(a_within);
            proptest::prop_assert!(b_within);
        }
    }

    #[test]
    fn every_byte_is_worked_out_from_its_bits_as_the_tables_give_it() {
        for byte in 0..=255u8 {
            let (value, step_of, per_step) = value_and_step(byte);
            assert_eq!(value.to_bits(), decode(byte).to_bits(), "{byte:#04x}");
            assert_eq!(step_of, step(byte), "{byte:#04x}");
            assert_eq!(per_step, 1.0 / step(byte), "{byte:#04x}");
        }
    }

    #[test]
    fn every_byte_encodes_back_to_itself() {
        for byte in 0..=255u8 {
            if byte & 0x7F == 0x7F {
                continue;
            }
            let value = decode(byte);
            let back = encode(value);
            // -0 encodes as 0x80, its own byte.
            assert_eq!(back, byte, "{byte:#x} = {value}");
        }
        assert_eq!(decode(0x7E), 448.0);
        assert_eq!(decode(0x01), 2f32.powi(-9));
    }

    #[test]
    fn the_branch_free_encoding_rounds_as_the_exact_one() {
        // The exact rounding, from the value's binade and the E4M3 grid's spacing there.
        let exact = |value: f32| {
            let magnitude = f64::from(value.abs());
            #[expect(clippy::cast_possible_truncation, reason = "a binade's exponent")]
            let step = if magnitude < 1.0 / 64.0 {
                2f64.powi(-9)
            } else {
                2f64.powi(magnitude.log2().floor() as i32 - 3)
            };
            let grid = (magnitude / step).round_ties_even() * step;
            let code = (0..=0x7Eu8)
                .find(|&b| f64::from(decode(b)) == grid.min(448.0))
                .unwrap();
            code | if value.is_sign_negative() { 0x80 } else { 0 }
        };
        for i in 0..20_000 {
            let value = ((i * 7919 % 20_000) as f32 - 10_000.0) / 10_000.0 * 448.0;
            let tiny = value / 65_536.0;
            for v in [value, tiny, -0.0, 0.0] {
                assert_eq!(encode(v), exact(v), "{v}");
            }
        }
    }

    #[test]
    fn the_comparisons_rounding_gives_the_values_coded() {
        // Each midpoint between neighbouring values of the grid and the floats either side.
        let midpoints = (0..0x7Eu8).flat_map(|byte| {
            let middle = f32::midpoint(decode(byte), decode(byte + 1));
            (0..=8).map(move |k| f32::from_bits(middle.to_bits() - 4 + k))
        });
        let spread = (0..=MAX.to_bits()).step_by(4099).map(f32::from_bits);
        for magnitude in midpoints.chain(spread).chain([0.0, 1e-45, MAX]) {
            for quotient in [magnitude, -magnitude] {
                // A zero's sign aside, which no error feels.
                assert_eq!(rounded(quotient), decode(encode(quotient)), "{quotient:e}");
            }
        }
    }

    #[test]
    fn rounds_to_nearest_ties_to_even() {
        // Between 1.0 (0x38) and 1.125 (0x39): the tie goes to the even 1.0.
        assert_eq!(encode(1.0625), 0x38);
        assert_eq!(encode(1.07), 0x39);
        // Between 1.125 and 1.25 (0x3A): the tie goes to the even 1.25.
        assert_eq!(encode(1.1875), 0x3A);
        // Rounding carries into the exponent.
        assert_eq!(encode(1.97), 0x40);
        assert_eq!(encode(1000.0), 0x7E);
        assert_eq!(encode(-0.5), 0x80 | 0x30);
    }

    #[test]
    fn blocks_and_channels_read_back_within_half_a_step() {
        let source: Vec<f32> = (0..256 * 160)
            .map(|i| (((i * 7919) % 2000) as f32 - 1000.0) / 777.0)
            .collect();
        for scheme in [Scheme::Fp8Dynamic, Scheme::Fp8Block] {
            let plan = Plan::new(scheme, 128, [256, 160], Dtype::Bf16, 1.3);
            let mut out = Streams::default();
            quantize(&plan, &source, &mut out);
            let scales = if scheme == Scheme::Fp8Block {
                2 * 2
            } else {
                256
            };
            assert_eq!(out.scales.len(), scales * 2);
            let (checked, within) = check(&plan, &source, &out);
            assert!(within);
            assert!(checked.max_in_steps <= 0.5 + 1e-4);
            let mut scales_alone = Streams::default();
            quantize_scales(&plan, &source, &mut scales_alone);
            assert_eq!(scales_alone.scales, out.scales);
        }
    }
}
