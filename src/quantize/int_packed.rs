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

use super::scheme::{ErrorSums, Plan, Scheme, Streams, within_half};
use super::{encode_scale, stored_at_least};

fn bits(plan: &Plan) -> u32 {
    plan.scheme.bits()
}

fn columns(plan: &Plan) -> usize {
    usize::try_from(plan.columns).unwrap_or(usize::MAX).max(1)
}

fn group(plan: &Plan) -> usize {
    usize::try_from(plan.group).unwrap_or(usize::MAX).max(1)
}

/// A group's scale and zero point (0 when symmetric), the scale as stored: of the scales and
/// zero points that keep every value within half a step, the one that leaves the least error.
///
/// Symmetric: the codes reach half a step further below zero than above it (`-2^(b-1)` against
/// `2^(b-1) - 1`), so the scale is the larger of the positive side's need and the negative side's,
/// which is finer than `absmax / (2^(b-1) - 1/2)` whenever the largest magnitude is negative.
/// Asymmetric: the stored scale nearest `(max - min) / (2^b - 1)` on either side, with every zero
/// point that keeps both ends within half a step.
fn scale_and_zero(plan: &Plan, values: &[f32]) -> (f64, i32) {
    let half = f64::from(1u32 << (bits(plan) - 1));
    let (min, max) = values
        .iter()
        .fold((0.0f32, 0.0f32), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    let (min, max) = (f64::from(min), f64::from(max));
    if plan.scheme != Scheme::W4A16Asym {
        let need = (max / (half - 0.5)).max(-min / (half + 0.5));
        return (stored_at_least(plan.scale_dtype, need), 0);
    }
    let exact = (max - min) / (2.0 * half - 1.0);
    let up = stored_at_least(plan.scale_dtype, exact);
    if up == 0.0 || !up.is_finite() {
        return (up, 0);
    }
    let nearest = super::stored(plan.scale_dtype, exact);
    let mut best = (f64::INFINITY, up, 0);
    for scale in [nearest, up] {
        if scale <= 0.0 {
            continue;
        }
        // Zero points keeping `min` at or above the lowest code less half a step, and `max` at
        // or below the highest plus half a step.
        #[expect(clippy::cast_possible_truncation, reason = "within the code range")]
        let lowest = (-half - 0.5 - min / scale).ceil().max(-half) as i32;
        #[expect(clippy::cast_possible_truncation, reason = "within the code range")]
        let highest = (half - 0.5 - max / scale).floor().min(half - 1.0) as i32;
        for zero in lowest..=highest {
            let error = group_error(values, scale, zero, f32::from(1u16 << (bits(plan) - 1)));
            if error < best.0 {
                best = (error, scale, zero);
            }
        }
    }
    (best.1, best.2)
}

/// The squared error a group is left with under `scale` and `zero`.
fn group_error(values: &[f32], scale: f64, zero: i32, half: f32) -> f64 {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "scales are at most f32 here"
    )]
    let scale32 = scale as f32;
    values
        .iter()
        .map(|&x| {
            let q = ((x / scale32).round_ties_even() + zero as f32).clamp(-half, half - 1.0);
            let error = f64::from(x) - (f64::from(q) - f64::from(zero)) * scale;
            error * error
        })
        .sum()
}

/// Packs `codes` (each below `2^bits`) into a little-endian stream of 32-bit words.
fn pack_row(codes: impl Iterator<Item = u32>, bits: u32, words: usize, out: &mut Vec<u8>) {
    let start = out.len();
    out.resize(start + words * 4, 0);
    let row = &mut out[start..];
    for (index, code) in codes.enumerate() {
        let bit = index * bits as usize;
        let word = bit / 32;
        let shift = bit % 32;
        let packed = u32::from_le_bytes(row[word * 4..word * 4 + 4].try_into().unwrap_or([0; 4]))
            | (code << shift);
        row[word * 4..word * 4 + 4].copy_from_slice(&packed.to_le_bytes());
    }
}

/// The code at `index` of a packed little-endian stream of 32-bit words.
fn unpack(words: &[u8], index: usize, bits: u32) -> u32 {
    let bit = index * bits as usize;
    let word = bit / 32;
    let value = u32::from_le_bytes(words[word * 4..word * 4 + 4].try_into().unwrap_or([0; 4]));
    (value >> (bit % 32)) & ((1u32 << bits) - 1)
}

pub fn quantize(plan: &Plan, values: &[f32], out: &mut Streams) -> ErrorSums {
    let (columns, group, bits) = (columns(plan), group(plan), bits(plan));
    let half = 1i32 << (bits - 1);
    let words = (columns * bits as usize).div_ceil(32);
    let groups = columns.div_ceil(group);
    let rows = values.len() / columns;
    let mut sums = ErrorSums::default();
    let mut zeros = Vec::with_capacity(rows * groups);
    let mut codes = Vec::with_capacity(columns);
    for row in values.chunks(columns) {
        codes.clear();
        for chunk in row.chunks(group) {
            let (scale, zero) = scale_and_zero(plan, chunk);
            encode_scale(plan.scale_dtype, scale, &mut out.scales);
            zeros.push(zero);
            #[expect(
                clippy::cast_possible_truncation,
                reason = "scales are at most f32 here"
            )]
            let scale32 = scale as f32;
            for &x in chunk {
                let q = if scale32 == 0.0 || !scale32.is_finite() {
                    0
                } else {
                    #[expect(
                        clippy::cast_possible_truncation,
                        reason = "clamped to the code range"
                    )]
                    let q = ((x / scale32).round_ties_even() + zero as f32)
                        .clamp(-(half as f32), (half - 1) as f32)
                        as i32;
                    q
                };
                sums.add(x, f64::from(q - zero) * scale, scale);
                codes.push((q + half).cast_unsigned());
            }
        }
        pack_row(codes.iter().copied(), bits, words, &mut out.codes);
    }
    if plan.scheme == Scheme::W4A16Asym {
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
    sums
}

pub fn check(plan: &Plan, source: &[f32], written: &Streams) -> (ErrorSums, bool) {
    let (columns, group, bits) = (columns(plan), group(plan), bits(plan));
    let half = 1i32 << (bits - 1);
    let words = (columns * bits as usize).div_ceil(32);
    let groups = columns.div_ceil(group);
    let scales = super::scheme::decode_scales(plan.scale_dtype, &written.scales);
    let per_word = 32 / bits as usize;
    let mut sums = ErrorSums::default();
    let mut within = true;
    for (row, values) in source.chunks(columns).enumerate() {
        let packed = &written.codes[row * words * 4..(row + 1) * words * 4];
        for (column, &x) in values.iter().enumerate() {
            let k = column / group;
            let scale = scales[row * groups + k];
            let zero = if plan.scheme == Scheme::W4A16Asym {
                let word_row = row / per_word;
                let word = &written.zero_points[(word_row * groups + k) * 4..][..4];
                let code = unpack(word, row % per_word, bits);
                code.cast_signed() - half
            } else {
                0
            };
            let q = unpack(packed, column, bits).cast_signed() - half;
            let back = f64::from(q - zero) * scale;
            sums.add(x, back, scale);
            within &= within_half(x, back, scale);
        }
    }
    (sums, within)
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

    #[test]
    fn packs_codes_across_words_in_order() {
        let mut out = Vec::new();
        pack_row((0..10).map(|i| i % 16), 4, 2, &mut out);
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
    }

    #[test]
    fn every_scheme_reads_back_within_half_a_step() {
        for scheme in [Scheme::W8A16, Scheme::W4A16, Scheme::W4A16Asym] {
            let plan = plan(scheme, 16, 64, 32);
            let source = values(16, 64);
            let mut out = Streams::default();
            let sums = quantize(&plan, &source, &mut out);
            assert_eq!(out.codes.len(), 16 * 64 * scheme.bits() as usize / 8);
            assert_eq!(out.scales.len(), 16 * 2 * 4);
            let (checked, within) = check(&plan, &source, &out);
            assert!(within, "{scheme}");
            assert!(sums.max_in_steps <= 0.5 + 1e-4, "{scheme}");
            assert!((checked.noise - sums.noise).abs() <= 1e-9 * sums.noise.max(1e-30));
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
