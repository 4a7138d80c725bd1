//! Statistics of a quantized model's logical weights: their rows dequantized by the layout's
//! kernel a block at a time, on all workers, into the same sinks as a stored tensor's values.
//! The codes member is read through a map, the other members (scales, zero points: a small
//! fraction of it) are copied; no whole dequantized weight is ever held.

use super::{builder_for, guarded};
use crate::analysis::values::Sink;
use crate::analysis::{Histogram, HistogramBuilder, Moments};
use crate::finding::{Code, Finding};
use crate::format::mapped::with_mapped;
use crate::format::{Dtype, Model};
use crate::quant::kernels::{Dequantize, Stored};
use crate::quant::{Quantization, Role};
use crate::text::escape;
use rayon::prelude::*;
use std::fs::File;

/// Values dequantized per block of rows, per worker.
const BLOCK: usize = 1 << 16;

/// What the statistics of one logical weight found.
#[derive(Debug)]
pub struct WeightStats {
    pub moments: Moments,
    pub histogram: Option<Histogram>,
    /// Scales and zero points that break their group, as error findings on the weight.
    pub findings: Vec<Finding>,
}

/// The statistics of logical weight `weight` of `model`, with its histogram when asked for; an
/// error says why its values cannot be read (a member that does not fit its layout, a file
/// that cannot be read).
pub fn weight_stats(
    model: &Model,
    quantization: &Quantization,
    weight: usize,
    histogram: bool,
) -> Result<WeightStats, String> {
    let logical = &quantization.weights[weight];
    let members = quantization.members(weight);
    let codes = members
        .iter()
        .find(|m| m.role.is_codes())
        .ok_or("the weight has no codes")?;
    let described = |tensor: usize| -> Result<(Dtype, Vec<u64>), String> {
        let info = &model.tensors[tensor].info;
        let dtype = info
            .dtype
            .known()
            .ok_or_else(|| format!("{}: dtype not read", escape(&info.name)))?;
        Ok((dtype, info.shape.iter().collect()))
    };
    let mut others = Vec::with_capacity(members.len());
    for member in members.iter().filter(|m| m.tensor != codes.tensor) {
        let tensor = member.tensor as usize;
        let (dtype, shape) = described(tensor)?;
        let bytes = read(model, tensor, <[u8]>::to_vec)?;
        others.push((member.role, dtype, shape, bytes));
    }
    let (codes_dtype, codes_shape) = described(codes.tensor as usize)?;
    read(model, codes.tensor as usize, |bytes| {
        let mut stored: Vec<(Role, Stored<'_>)> = others
            .iter()
            .map(|(role, dtype, shape, bytes)| {
                (
                    *role,
                    Stored {
                        bytes,
                        dtype: *dtype,
                        shape,
                    },
                )
            })
            .collect();
        stored.push((
            codes.role,
            Stored {
                bytes,
                dtype: codes_dtype,
                shape: &codes_shape,
            },
        ));
        let kernel = crate::quant::dequantize::kernel(logical, &stored)
            .map_err(|error| error.to_string())?;
        guarded(|| statistics(kernel.as_ref(), &logical.name, histogram))
    })
    .and_then(|result| result)
}

/// Runs `work` on the bytes of stored tensor `tensor`.
fn read<T>(model: &Model, tensor: usize, work: impl FnOnce(&[u8]) -> T) -> Result<T, String> {
    let tensor = &model.tensors[tensor];
    let shard = model.shard_of(tensor);
    let file = File::open(&shard.path).map_err(|e| format!("{}: {e}", shard.label))?;
    let [begin, _] = tensor.info.data_offsets;
    let len = usize::try_from(tensor.info.byte_len()).map_err(|e| e.to_string())?;
    with_mapped(&file, shard.data_start + begin, len, work)
        .map_err(|e| format!("{}: {e}", escape(&tensor.info.name)))
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
    let histogram = histogram.then(|| {
        blocks()
            .fold(
                || (Vec::new(), builder_for(&moments)),
                |(mut buffer, mut builder), range| {
                    dequantized(&mut buffer, range);
                    builder.f32s(&buffer);
                    (buffer, builder)
                },
            )
            .map(|(_, builder)| builder)
            .reduce(
                || builder_for(&moments),
                |mut a: HistogramBuilder, b| {
                    a.merge(&b);
                    a
                },
            )
            .finish()
    });
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
        findings,
    }
}
