//! Statistics of a quantized model's logical weights: their rows dequantized by the layout's
//! kernel ([`crate::quant::read`]) a block at a time, on all workers, into the same sinks as a
//! stored tensor's values; no whole dequantized weight is ever held.

use super::{builder_for, guarded};
use crate::analysis::values::Sink;
use crate::analysis::{Histogram, HistogramBuilder, Moments};
use crate::finding::{Code, Finding};
use crate::format::Model;
use crate::quant::Quantization;
use crate::quant::kernels::{CodeCounts, Dequantize};
use crate::text::escape;
use rayon::prelude::*;

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
/// that cannot be read).
pub fn weight_stats(
    model: &Model,
    quantization: &Quantization,
    weight: usize,
    histogram: bool,
) -> Result<WeightStats, String> {
    let logical = &quantization.weights[weight];
    crate::quant::read::with_kernel(model, quantization, weight, |kernel| {
        guarded(|| statistics(kernel, &logical.name, histogram))
    })
    .and_then(|result| result)
}

fn statistics(kernel: &dyn Dequantize, name: &str, histogram: bool) -> WeightStats {
    let (rows, cols) = (kernel.rows(), kernel.cols());
    let block = (BLOCK / cols.max(1)).max(1);
    let blocks = || {
        (0..rows.div_ceil(block))
            .into_par_iter()
            .map(move |b| b * block..((b + 1) * block).min(rows))
    };
    let dequantized = |buffer: &mut Vec<f32>, range: std::ops::Range<usize>| {
        buffer.resize(range.len() * cols, 0.0);
        kernel.dequantize_rows(range, buffer);
    };
    let moments = blocks()
        .map_init(Vec::new, |buffer, range| {
            dequantized(buffer, range);
            Moments::of_f32(buffer)
        })
        .reduce(
            || Moments::EMPTY,
            |mut a, b| {
                a.merge(&b);
                a
            },
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
    let problems = kernel.scale_problems();
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
