//! Statistics of a quantized model's logical weights: their rows dequantized by the layout's
//! kernel ([`crate::quant::read`]) a block at a time, on all workers, into the same sinks as a
//! stored tensor's values; no whole dequantized weight is ever held.

use super::{builder_for, guarded};
use crate::analysis::simd::{self, Rounding};
use crate::analysis::values::Sink;
use crate::analysis::{Histogram, HistogramBuilder, Moments};
use crate::finding::{Code, Finding};
use crate::format::Model;
use crate::quant::Quantization;
use crate::quant::kernels::{CodeCounts, Dequantize, FusedRow, FusedScratch, Half};
use crate::text::escape;
use rayon::prelude::*;
use std::ops::Range;

/// Values dequantized per block of rows, per worker.
const BLOCK: usize = 1 << 16;

/// What the statistics of one logical weight found.
#[derive(Debug)]
pub struct WeightStats {
    pub moments: Moments,
    pub histogram: Option<Histogram>,
    /// How many elements hold each code, counted with the histogram.
    pub codes: Option<CodeCounts>,
    /// Scales and zero points that break their group, as error findings on the weight.
    pub findings: Vec<Finding>,
}

/// The statistics of logical weight `weight` of `model`, with its histogram and its code counts
/// when asked for; an
/// error says why its values cannot be read (a member that does not fit its layout, a file
/// that cannot be read, a fetch from the Hub `stopped` ended).
pub fn weight_stats(
    (model, quantization, weight): (&Model, &Quantization, usize),
    histogram: bool,
    stopped: &dyn Fn() -> bool,
) -> Result<WeightStats, String> {
    let logical = &quantization.weights[weight];
    crate::quant::read::with_kernel((model, quantization, weight), stopped, |kernel| {
        guarded(|| statistics(kernel, &logical.info.name, histogram))
    })
    .and_then(|result| result)
}

/// The statistics of a fused row's values, when the lanes can take them all.
fn fused_moments(row: &FusedRow<'_>) -> Option<Moments> {
    match *row {
        FusedRow::Nibbles { codes, tables } => simd::nibble_moments(codes, tables),
        FusedRow::E4m3 {
            codes,
            scales,
            rounding,
        } => simd::e4m3_moments(
            codes,
            scales,
            match rounding {
                None => Rounding::None,
                Some(Half::Bf16) => Rounding::Bf16,
                Some(Half::F16) => Rounding::F16,
            },
        ),
    }
}

/// The statistics of rows `range`: from their fused form row by row when the layout has one,
/// a row the lanes cannot take (a value that is not finite) dequantized; else dequantized.
fn block_moments(
    kernel: &dyn Dequantize,
    fused: bool,
    (buffer, scratch): (&mut Vec<f32>, &mut FusedScratch),
    range: Range<usize>,
) -> Moments {
    let dequantized = |buffer: &mut Vec<f32>, range: Range<usize>| {
        buffer.resize(range.len() * kernel.cols(), 0.0);
        kernel.dequantize_rows(range, buffer);
        Moments::of_f32(buffer)
    };
    if !fused {
        return dequantized(buffer, range);
    }
    let mut total = Moments::EMPTY;
    for row in range {
        let moments = kernel
            .fused_row(row, scratch)
            .and_then(|row| fused_moments(&row))
            .unwrap_or_else(|| dequantized(buffer, row..row + 1));
        total.merge(&moments);
    }
    total
}

fn statistics(kernel: &dyn Dequantize, name: &str, histogram: bool) -> WeightStats {
    let (rows, cols) = (kernel.rows(), kernel.cols());
    let block = (BLOCK / cols.max(1)).max(1);
    let blocks = || {
        (0..rows.div_ceil(block))
            .into_par_iter()
            .map(move |b| b * block..((b + 1) * block).min(rows))
    };
    let dequantized = |buffer: &mut Vec<f32>, range: Range<usize>| {
        buffer.resize(range.len() * cols, 0.0);
        kernel.dequantize_rows(range, buffer);
    };
    let fused = rows > 0 && kernel.fused_row(0, &mut FusedScratch::default()).is_some();
    let block_moments = |(buffer, scratch): &mut (Vec<f32>, FusedScratch), range| {
        block_moments(kernel, fused, (buffer, scratch), range)
    };
    // The scales are checked while the rows are read.
    let (moments, problems) = rayon::join(
        || {
            // Merged in order, as the scan merges its pieces: reduced as the workers split the
            // blocks, the sums were grouped differently from run to run, and the means' last
            // digits moved.
            let blocks: Vec<Moments> = blocks()
                .map_init(|| (Vec::new(), FusedScratch::default()), block_moments)
                .collect();
            super::merged(blocks)
        },
        || kernel.scale_problems(),
    );
    let space = kernel.codes().filter(|_| histogram);
    let counts = || space.map(CodeCounts::new);
    let (histogram, codes) = if histogram {
        let (builder, codes) = blocks()
            .fold(
                || (Vec::new(), builder_for(&moments), counts()),
                |(mut buffer, mut builder, mut codes), range| {
                    if let Some(codes) = codes.as_mut() {
                        kernel.count_codes(range.clone(), &mut codes.counts);
                    }
                    dequantized(&mut buffer, range);
                    builder.f32s(&buffer);
                    (buffer, builder, codes)
                },
            )
            .map(|(_, builder, codes)| (builder, codes))
            .reduce(
                || (builder_for(&moments), counts()),
                |(mut a, mut codes_a): (HistogramBuilder, _), (b, codes_b)| {
                    a.merge(&b);
                    if let (Some(x), Some(y)) = (codes_a.as_mut(), codes_b.as_ref()) {
                        x.merge(y);
                    }
                    (a, codes_a)
                },
            );
        (Some(builder.finish()), codes)
    } else {
        (None, None)
    };
    let mut findings: Vec<Finding> = problems
        .first
        .iter()
        .map(|p| {
            Finding::error(
                Code::QuantScale,
                format!(
                    "{} of group {} (rows {}..{}) is {}: {}",
                    p.member, p.group, p.rows.start, p.rows.end, p.problem, p.value
                ),
            )
            .for_tensor(escape(name).into_owned())
        })
        .collect();
    let more = problems.total.saturating_sub(problems.first.len() as u64);
    if more > 0 {
        findings.push(
            Finding::error(
                Code::QuantScale,
                format!("and {more} more scales or zero points like these"),
            )
            .for_tensor(escape(name).into_owned()),
        );
    }
    WeightStats {
        moments,
        histogram,
        codes,
        findings,
    }
}

#[cfg(test)]
mod tests {
    #![expect(
        clippy::cast_possible_truncation,
        clippy::cast_possible_wrap,
        reason = "fixtures of small, known sizes and values"
    )]
    use super::*;
    use crate::format::Dtype;
    use crate::quant::kernels::Packing;
    use crate::quant::kernels::compressed_tensors::{Naive, Packed, PackedMembers, Strategy};
    use crate::quant::kernels::testing::{Owned, Rng, pack, word_bytes};
    use proptest::prelude::*;

    /// The statistics of every row dequantized, the way without fused rows.
    fn plain(kernel: &dyn Dequantize) -> Moments {
        let mut values = vec![0.0; kernel.rows() * kernel.cols()];
        kernel.dequantize_rows(0..kernel.rows(), &mut values);
        Moments::of_f32(&values)
    }

    /// Counts and range equal; mean and standard deviation equal but for the fused first
    /// pass's `f32` partial sums (within 2^-12 of the spread, see `analysis::simd`'s tests).
    fn assert_agree(fused: &Moments, plain: &Moments) -> Result<(), TestCaseError> {
        let exact = |m: &Moments| {
            (
                (m.count, m.nan, m.pos_inf, m.neg_inf, m.zeros, m.subnormals),
                (m.finite(), m.min, m.max, m.absmax()),
            )
        };
        prop_assert_eq!(exact(fused), exact(plain));
        let spread = plain.std().unwrap_or(0.0);
        for (a, b) in [(fused.mean(), plain.mean()), (fused.std(), plain.std())] {
            prop_assert_eq!(a.is_some(), b.is_some());
            if let (Some(a), Some(b)) = (a, b) {
                let tolerance = 2f64.powi(-12) * (a.abs().max(b.abs()) + spread);
                prop_assert!((a - b).abs() <= tolerance, "{a} against {b}");
            }
        }
        Ok(())
    }

    /// A scale drawn mostly from the usual range, sometimes at an edge: zero, negative, NaN,
    /// infinite, so small that products are subnormal or zero, so large that they overflow.
    fn scale(rng: &mut Rng, edges: bool) -> f32 {
        let usual = rng.signed().abs() * 0.02 + 1e-4;
        if !edges || rng.below(4) > 0 {
            return usual;
        }
        match rng.below(7) {
            0 => 0.0,
            1 => -usual,
            2 => f32::NAN,
            3 => f32::INFINITY,
            4 => 1e-39,
            5 => 1e-44,
            _ => 3e37,
        }
    }

    fn scales(dtype: Dtype, shape: &[usize], rng: &mut Rng, edges: bool) -> Owned {
        let values: Vec<f32> = (0..shape.iter().product())
            .map(|_| scale(rng, edges))
            .collect();
        Owned::floats(dtype, shape, &values)
    }

    const SCALE_DTYPES: [Dtype; 3] = [Dtype::Bf16, Dtype::F16, Dtype::F32];

    /// A `rows` x `cols` weight's 4-bit `codes` packed eight to an I32 word, as
    /// compressed-tensors packs them, and its shape member.
    fn packed_nibbles(codes: &[u8], rows: usize, cols: usize) -> (Owned, Owned) {
        let bytes: Vec<u8> = codes
            .chunks(cols)
            .flat_map(|row| word_bytes(&pack(Packing::Dense, 4, row)))
            .collect();
        let shape = [rows as i64, cols as i64];
        (
            Owned::new(Dtype::I32, &[rows, cols / 8], bytes),
            Owned::new(
                Dtype::I64,
                &[2],
                shape.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
        )
    }

    /// A weight of many blocks has the statistics of its blocks merged in order, to the bit, on
    /// every run, however the workers split the blocks.
    #[test]
    fn a_weights_blocks_are_merged_in_order() {
        let (rows, group, groups) = (1024, 128, 8);
        let cols = group * groups;
        let mut rng = Rng::new(7);
        let codes = rng.codes(4, rows * cols);
        let (weight_packed, weight_shape) = packed_nibbles(&codes, rows, cols);
        let scale = scales(Dtype::F32, &[rows, groups], &mut rng, false);
        let members = PackedMembers {
            weight_packed: weight_packed.stored(),
            weight_shape: weight_shape.stored(),
            weight_scale: scale.stored(),
            weight_zero_point: None,
            weight_g_idx: None,
        };
        let kernel = Packed::new(members, 4, Strategy::Group { size: group }, None).unwrap();
        let block = BLOCK / cols;
        let mut room = (Vec::new(), FusedScratch::default());
        let in_order = crate::jobs::merged((0..rows).step_by(block).map(|first| {
            block_moments(
                &kernel,
                true,
                (&mut room.0, &mut room.1),
                first..first + block,
            )
        }));
        assert!(rows / block >= 16, "{} blocks", rows / block);
        for _ in 0..8 {
            assert_eq!(statistics(&kernel, "w", false).moments, in_order);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Four-bit packed codes (compressed-tensors' W4A16, with and without zero points)
        /// read through their tables give the statistics of their dequantized values.
        #[test]
        fn fused_nibbles_match_the_dequantized_values(
            seed in any::<u64>(),
            rows in 1usize..6,
            group in prop::sample::select(vec![8usize, 16, 32, 64, 128]),
            groups in 1usize..5,
            dtype in prop::sample::select(SCALE_DTYPES.to_vec()),
            zero_points in any::<bool>(),
            edges in any::<bool>(),
        ) {
            let mut rng = Rng::new(seed);
            let cols = group * groups;
            let codes = rng.codes(4, rows * cols);
            let (weight_packed, weight_shape) = packed_nibbles(&codes, rows, cols);
            let scale = scales(dtype, &[rows, groups], &mut rng, edges);
            let zeros: Vec<i8> = (0..rows * groups).map(|_| rng.below(16) as i8 - 8).collect();
            let zero_point = Owned::i8(&[rows, groups], &zeros);
            let members = PackedMembers {
                weight_packed: weight_packed.stored(),
                weight_shape: weight_shape.stored(),
                weight_scale: scale.stored(),
                weight_zero_point: zero_points.then(|| zero_point.stored()),
                weight_g_idx: None,
            };
            let kernel = Packed::new(members, 4, Strategy::Group { size: group }, None).unwrap();
            prop_assert!(kernel.fused_row(0, &mut FusedScratch::default()).is_some());
            let fused = statistics(&kernel, "w", false).moments;
            assert_agree(&fused, &plain(&kernel))?;
        }

        /// E4M3 codes in blocks with a scale each (FP8-block), NaN codes among them.
        #[test]
        fn fused_e4m3_matches_the_dequantized_values(
            seed in any::<u64>(),
            block_rows in 1usize..4,
            block_cols in prop::sample::select(vec![16usize, 32, 64, 128]),
            blocks in (1usize..3, 1usize..4),
            dtype in prop::sample::select(SCALE_DTYPES.to_vec()),
            nan_codes in any::<bool>(),
            edges in any::<bool>(),
        ) {
            let mut rng = Rng::new(seed);
            let (rows, cols) = (block_rows * blocks.0, block_cols * blocks.1);
            let codes: Vec<u8> = (0..rows * cols)
                .map(|_| {
                    let code = rng.below(256) as u8;
                    if !nan_codes && code & 0x7f == 0x7f { 0x7e } else { code }
                })
                .collect();
            let weight = Owned::new(Dtype::F8E4M3, &[rows, cols], codes);
            let scale = scales(dtype, &[blocks.0, blocks.1], &mut rng, edges);
            let strategy = Strategy::Block { rows: block_rows, cols: block_cols };
            let kernel =
                Naive::new(weight.stored(), scale.stored(), None, None, strategy, 8).unwrap();
            prop_assert!(kernel.fused_row(0, &mut FusedScratch::default()).is_some());
            let fused = statistics(&kernel, "w", false).moments;
            assert_agree(&fused, &plain(&kernel))?;
        }
    }
}
