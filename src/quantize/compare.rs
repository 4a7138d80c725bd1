//! Every scheme evaluated on the same weights without writing anything: each weight read once
//! into memory (up to a bound, beyond which it is read twice), for its largest magnitude (NVFP4's
//! global scale and W8A8's per-tensor scale need it), then each block of its rows measured under
//! every scheme in turn, without codes (see [`Plan::error`]).

use super::int_packed;
use super::lanes::{Compared, Loaded, SquareSum, tensor_measured_in_f32, wide_chunks};
use super::magnitude::Bits;
use super::scheme::{ErrorSums, Plan, Scheme, Streams};
use super::{
    Choice, Control, Element, Error8, Granularity, Kept, Options, choose, finish, map_rows_aligned,
    scale_for, scales_dtype_of, tensor_absmax,
};
use crate::error::{Error, Result};
use crate::format::{Dtype, Model, Tensor};
use multiversion::multiversion;
use serde::Serialize;
use std::fs::File;
use std::sync::atomic::Ordering;

/// One scheme's result over the weights compared.
#[derive(Clone, Debug, Serialize)]
pub struct SchemeResult {
    pub scheme: Scheme,
    /// Weights this scheme would quantize (the others it keeps: columns not in whole groups).
    pub weights: usize,
    /// Bytes of the tensors written: quantized weights' members and every tensor kept.
    pub output_bytes: u64,
    /// Bits per quantized weight value, scales and zero points included; `None` (as the SNRs)
    /// when the scheme quantizes none of the weights compared.
    pub bits_per_weight: Option<f64>,
    pub worst_snr_db: Option<f64>,
    pub median_snr_db: Option<f64>,
    /// The weight with the lowest SNR, by index among the model's tensors.
    #[serde(skip)]
    pub worst: Option<usize>,
    /// Each weight's error, by index among the model's tensors.
    #[serde(skip)]
    pub errors: Vec<(usize, Error8)>,
}

/// Every scheme side by side over the chosen weights.
#[derive(Clone, Debug)]
pub struct Comparison {
    pub schemes: Vec<SchemeResult>,
    /// Weights left out of every scheme for holding NaN or Inf.
    pub non_finite: Vec<usize>,
}

/// Whether `scheme` quantizes `tensor` (chosen by name and dtype) or keeps it whole: its columns
/// must divide into the scheme's groups, and `FP8_BLOCK`'s blocks must not be too wide.
pub fn scheme_quantizes(scheme: Scheme, group: u64, tensor: &Tensor) -> bool {
    let columns = tensor.info.shape.get(1).unwrap_or(0);
    match scheme {
        Scheme::W8A16 | Scheme::W4A16 | Scheme::W4A16Asym => {
            super::int_packed::fits(columns, group)
        }
        Scheme::Nvfp4A16 => columns.is_multiple_of(super::scheme::NVFP4_GROUP),
        // A run of rows holds a whole row of blocks: kept within bounds by its width.
        Scheme::Fp8Block => columns <= MAX_BLOCK_COLUMNS,
        Scheme::W8A8 | Scheme::Fp8Dynamic => true,
    }
}

/// The widest weight `FP8_BLOCK` quantizes: 128 of its rows as `f32` take at most 64 MiB.
const MAX_BLOCK_COLUMNS: u64 = 1 << 17;

/// The plan for `tensor` (whose largest magnitude is `absmax`) under `scheme`.
pub(super) fn plan_for(scheme: Scheme, group: u64, tensor: &Tensor, absmax: f64) -> Plan {
    let [rows, columns] = tensor.info.shape.matrix().unwrap_or([1, 1]);
    Plan::new(
        scheme,
        group,
        [rows, columns],
        tensor.info.dtype.known().unwrap_or(Dtype::F32),
        absmax,
    )
}

/// A weight's error under each scheme evaluated, `None` where the scheme keeps it.
type PerScheme = Vec<Option<ErrorSums>>;

/// Weights of at most this many bytes (16 M values of `f32`, 32 M of BF16) are read once, into
/// memory as stored, for both their largest magnitude and every scheme; larger ones are read
/// twice.
const HELD_BYTES: u64 = 64 << 20;

/// Each of `tensors`' error under each of `schemes` (`None` where a scheme keeps it), and the
/// tensors holding NaN or Inf. Reads each tensor once (twice when it is larger than
/// [`HELD_BYTES`]): for its largest magnitude, which NVFP4's global scale and W8A8's per-tensor
/// scale need before any value is quantized, and for its rows under every scheme.
pub(super) fn evaluate(
    model: &Model,
    files: &[File],
    tensors: &[usize],
    schemes: &[Scheme],
    options: &Options,
    control: &Control,
) -> Result<(Vec<PerScheme>, Vec<usize>)> {
    let held_whole = |tensor: &Tensor| tensor.info.byte_len() <= HELD_BYTES;
    let total: u64 = tensors
        .iter()
        .map(|&t| {
            let tensor = &model.tensors[t];
            tensor.info.byte_len() * if held_whole(tensor) { 1 } else { 2 }
        })
        .sum();
    control.bytes_total.fetch_add(total, Ordering::Relaxed);
    let mut results = Vec::with_capacity(tensors.len());
    let mut non_finite = Vec::new();
    // One buffer handed from weight to weight, whatever their shapes: blocks sized for each
    // weight's rows were grown, shrunk and dropped as the shapes changed, and their fresh memory,
    // a page fault every 4 KiB, had taken a tenth of a comparison's time.
    let mut held = Vec::new();
    for &index in tensors {
        let tensor = &model.tensors[index];
        let path = &model.shard_of(tensor).path;
        let fitting = |scheme: Scheme| scheme_quantizes(scheme, options.group_size, tensor);
        let align = schemes
            .iter()
            .filter(|&&scheme| fitting(scheme))
            .map(|&scheme| plan_for(scheme, options.group_size, tensor, 0.0).row_multiple())
            .max()
            .unwrap_or(1);
        let (absmax, stored) = if held_whole(tensor) {
            let (absmax, stored) = read_whole(model, files, tensor, control, &mut held)
                .map_err(|e| Error::io(path, e))?;
            (absmax, Some(stored))
        } else {
            let absmax = tensor_absmax(model, files, tensor, false, control)
                .map_err(|e| Error::io(path, e))?
                .map(|(largest, _)| largest);
            (absmax, None)
        };
        let Some(absmax) = absmax else {
            non_finite.push(index);
            results.push(vec![None; schemes.len()]);
            continue;
        };
        let plans: Vec<Option<Plan>> = schemes
            .iter()
            .map(|&scheme| {
                fitting(scheme).then(|| plan_for(scheme, options.group_size, tensor, absmax))
            })
            .collect();
        let source = tensor.info.dtype.known().unwrap_or(Dtype::F32);
        let int8_scales = match options.granularity {
            Granularity::PerChannel => None,
            Granularity::PerTensor => Some(scale_for(scales_dtype_of(tensor), absmax)),
        };
        let columns = usize::try_from(tensor.info.shape.get(1).unwrap_or(1))
            .unwrap_or(1)
            .max(1);
        let errors = |values: &[f32]| -> Vec<ErrorSums> {
            let mut streams = Streams::take();
            let signal = signal(values, absmax);
            let ranges = shared_ranges(&plans, values, columns, options.group_size);
            let ranges = ranges.as_ref();
            let sums = plans
                .iter()
                .map(|plan| match plan {
                    Some(plan) if plan.scheme == Scheme::W8A8 => {
                        let sums = (absmax, signal);
                        int8_sums(source, (values, columns), int8_scales, ranges, sums)
                    }
                    Some(plan) => plan.error(values, signal, ranges, &mut streams),
                    None => ErrorSums::default(),
                })
                .collect();
            streams.give();
            sums
        };
        let sums = if let Some(stored) = stored {
            let block_values = super::block_rows(columns, align) * columns;
            evaluate_held(
                (stored, source),
                block_values,
                control,
                errors,
                schemes.len(),
            )
        } else {
            let streamed = (model, files, tensor, align);
            evaluate_streamed(streamed, control, errors, schemes.len())
        }
        .map_err(|e| Error::io(path, e))?;
        results.push(
            plans
                .iter()
                .zip(sums)
                .map(|(plan, sums)| plan.is_some().then_some(sums))
                .collect(),
        );
    }
    Ok((results, non_finite))
}

/// The ranges of a block's groups where an int scheme is among `plans`, worked out once for all
/// of them (and for W8A8 and FP8, whose rows' and blocks' largest magnitudes they give).
fn shared_ranges(
    plans: &[Option<Plan>],
    values: &[f32],
    columns: usize,
    group: u64,
) -> Option<int_packed::BlockRanges> {
    let int_schemes = [Scheme::W8A16, Scheme::W4A16, Scheme::W4A16Asym];
    let shared = plans
        .iter()
        .flatten()
        .any(|plan| int_schemes.contains(&plan.scheme));
    let group = usize::try_from(group).unwrap_or(usize::MAX);
    shared.then(|| int_packed::BlockRanges::of(values, columns, group))
}

/// Adds each scheme's sums of a run of rows to its total.
fn merge(totals: &mut [ErrorSums], chunk: &[ErrorSums]) {
    for (total, chunk) in totals.iter_mut().zip(chunk) {
        total.merge(chunk);
    }
}

/// `errors` of every block of rows (from a multiple of `align`) of a weight read from `files` a
/// run at a time, summed.
fn evaluate_streamed(
    (model, files, tensor, align): (&Model, &[File], &Tensor, u64),
    control: &Control,
    errors: impl Fn(&[f32]) -> Vec<ErrorSums> + Sync,
    schemes: usize,
) -> std::io::Result<Vec<ErrorSums>> {
    let mut sums = vec![ErrorSums::default(); schemes];
    map_rows_aligned(
        model,
        files,
        tensor,
        align,
        control,
        |_, values: &[f32]| Ok(errors(values)),
        |chunk| {
            merge(&mut sums, &chunk);
            Ok(())
        },
    )?;
    Ok(sums)
}

/// `errors` of every block of `block_values` values (whole rows) of a weight held in memory as
/// stored (elements of `dtype`), each block decoded as it is worked on, on the rayon pool,
/// summed.
fn evaluate_held(
    (stored, dtype): (&[u8], Dtype),
    block_values: usize,
    control: &Control,
    errors: impl Fn(&[f32]) -> Vec<ErrorSums> + Sync,
    schemes: usize,
) -> std::io::Result<Vec<ErrorSums>> {
    use rayon::prelude::*;
    let block_bytes = block_values.max(1) * element_size(dtype);
    let chunks: Vec<Vec<ErrorSums>> = stored
        .par_chunks(block_bytes)
        .map(|block| {
            control.check()?;
            Ok(with_decoded(dtype, block, &errors))
        })
        .collect::<std::io::Result<_>>()?;
    let mut sums = vec![ErrorSums::default(); schemes];
    for chunk in &chunks {
        merge(&mut sums, chunk);
    }
    Ok(sums)
}

/// Bytes of one element of `dtype` (a float type a weight is compared in).
fn element_size(dtype: Dtype) -> usize {
    (dtype.bits() as usize / 8).max(1)
}

/// The most values a decoded block given back for the next keeps (16 MiB); a larger one (of a
/// weight so wide that 128 of its rows pass it) is dropped.
const DECODED_KEPT: usize = 4 << 20;

/// Runs `work` on `bytes` (elements of `dtype`) as `f32`: where they lie for `f32` (see
/// [`super::in_place`]), decoded otherwise into a buffer handed on from block to block.
fn with_decoded<T>(dtype: Dtype, bytes: &[u8], work: impl FnOnce(&[f32]) -> T) -> T {
    if let Some(values) = super::in_place::<f32>(dtype, bytes) {
        return work(values);
    }
    let mut block = <f32 as Element>::buffers().take();
    <f32 as Element>::decode(dtype, bytes, &mut block);
    let result = work(&block);
    if block.capacity() <= DECODED_KEPT {
        <f32 as Element>::buffers().give(block);
    }
    result
}

/// A weight's largest magnitude (`None` when it holds NaN or Inf) and its bytes as stored, read
/// once into the start of `held`, each run of its rows straight into its place on the rayon
/// pool. Held as stored rather than decoded: BF16 and F16 take half the room, and a block
/// decoded as it is worked on stays in the core's cache for every scheme's pass, where a weight
/// decoded whole (up to 64 MiB) went out to memory and came back for the first.
fn read_whole<'a>(
    model: &Model,
    files: &[File],
    tensor: &Tensor,
    control: &Control,
    held: &'a mut Vec<f32>,
) -> std::io::Result<(Option<f64>, &'a [u8])> {
    use rayon::prelude::*;
    let dtype = tensor
        .info
        .dtype
        .known()
        .ok_or_else(|| std::io::Error::other("unknown dtype"))?;
    let shape = tensor
        .info
        .shape
        .matrix()
        .ok_or_else(|| std::io::Error::other("not a matrix"))?;
    let (start, len) = model.file_range(tensor);
    let len = usize::try_from(len).map_err(std::io::Error::other)?;
    // `f32`s, so that stored `f32` values are aligned as such. Grown, never shrunk: only what the
    // buffer grows by is zeroed before being written over.
    if held.len() < len.div_ceil(4) {
        held.resize(len.div_ceil(4), 0.0);
    }
    let stored = &mut bytemuck::cast_slice_mut::<f32, u8>(held)[..len];
    let runs = super::row_runs(shape, dtype, 1);
    let row_bytes = dtype.byte_len(shape[1]).unwrap_or(0);
    let run_rows = runs.first().map_or(1, |&(_, rows)| rows);
    let run_bytes = usize::try_from(run_rows * row_bytes).map_err(std::io::Error::other)?;
    let file = &files[tensor.shard];
    // Read from the bits as stored where they order as the magnitudes (half as many for BF16),
    // from the decoded values otherwise.
    let stored_bits = Bits::of(dtype);
    let largest = runs
        .par_iter()
        .zip(stored.par_chunks_mut(run_bytes.max(1)))
        .map(|(&(row, _), bytes)| {
            control.check()?;
            crate::format::read_exact_at(file, bytes, start + row * row_bytes)?;
            control
                .bytes_done
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            Ok::<_, std::io::Error>(match stored_bits {
                Some(stored) => stored.largest_bits(bytes),
                None => with_decoded(dtype, bytes, |values| {
                    Bits::F32.largest_bits(bytemuck::cast_slice(values))
                }),
            })
        })
        .try_reduce(|| 0, |a, b| Ok(a.max(b)))?;
    Ok((
        stored_bits.unwrap_or(Bits::F32).magnitude(largest),
        &bytemuck::cast_slice::<f32, u8>(held)[..len],
    ))
}

/// The sum of the squares of `values`, of a weight whose largest magnitude is `absmax`: in `f32`
/// lanes as the schemes' measures sum theirs where it holds them, in `f64` otherwise.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn signal(values: &[f32], absmax: f64) -> f64 {
    if !tensor_measured_in_f32(absmax) {
        return values.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    }
    let mut sum = SquareSum::default();
    for xs in wide_chunks(values) {
        sum.add(&xs);
    }
    sum.total()
}

/// W8A8's error on whole rows of `columns` values, with each row's own scale (from its largest
/// magnitude, which `ranges` give where the block's were worked out) or `shared`, as its writer's
/// measure gives it, without codes (see [`int_packed::error`]) where `f32` holds the scales and
/// measures the weight, whose largest magnitude is `absmax` and the sum of whose squares is
/// `signal`.
fn int8_sums(
    source: Dtype,
    (values, columns): (&[f32], usize),
    shared: Option<f64>,
    ranges: Option<&int_packed::BlockRanges>,
    (absmax, signal): (f64, f64),
) -> ErrorSums {
    let dtype = super::scale_dtype(source);
    let scale_of =
        |row: &[f32]| shared.unwrap_or_else(|| scale_for(dtype, super::absmax_of(row).0));
    if dtype == Dtype::F64 || !tensor_measured_in_f32(absmax) {
        return int8_sums_written(source, values, columns, scale_of);
    }
    let mut tally = Compared::new(Loaded::of(dtype));
    for (index, row) in values.chunks(columns).enumerate() {
        let scale = match (shared, ranges) {
            (None, Some(ranges)) => scale_for(dtype, f64::from(ranges.row_absmax(index))),
            _ => scale_of(row),
        };
        #[expect(
            clippy::cast_possible_truncation,
            reason = "scales are at most f32 here"
        )]
        let scale = scale as f32;
        int_packed::tally_row(row, columns, &[(scale, 0.0)], (-127.0, 127.0), &mut tally);
    }
    tally.finish(signal)
}

/// [`int8_sums`] from the codes its writer makes.
fn int8_sums_written(
    source: Dtype,
    values: &[f32],
    columns: usize,
    scale_of: impl Fn(&[f32]) -> f64,
) -> ErrorSums {
    let narrow = source.is_float() && source.bits() <= 16;
    let loaded = Loaded::of(super::scale_dtype(source));
    let mut out = vec![0u8; columns];
    let mut sums = ErrorSums::default();
    for row in values.chunks(columns) {
        let row_sums = <f32 as super::Element>::quantize(
            row,
            scale_of(row),
            &mut out[..row.len()],
            narrow,
            loaded,
        );
        sums.merge(&ErrorSums {
            signal: row_sums.signal,
            noise: row_sums.noise,
            max_abs: row_sums.max_abs,
            max_in_steps: row_sums.max_in_scales,
        });
    }
    sums
}

/// Every scheme on the weights `options` chooses; a model already quantized is refused.
pub fn compare(model: &Model, options: &Options, control: &Control) -> Result<Comparison> {
    super::ensure_quantizable(model)?;
    let files: Vec<File> = model
        .shards
        .iter()
        .map(|s| crate::paths::open_file(&s.path).map_err(|e| Error::io(&s.path, e)))
        .collect::<Result<_>>()?;
    let chosen: Vec<usize> = (0..model.tensors.len())
        .filter(|&t| choose(&model.tensors[t], options) == Choice::Quantize)
        .collect();
    let (results, non_finite) = evaluate(model, &files, &chosen, &Scheme::ALL, options, control)?;
    let all_bytes: u64 = model.tensors.iter().map(|t| t.info.byte_len()).sum();
    let schemes = Scheme::ALL
        .iter()
        .enumerate()
        .map(|(s, &scheme)| {
            let mut errors = Vec::new();
            let (mut written, mut replaced, mut elements) = (0u64, 0u64, 0u64);
            for (&tensor, result) in chosen.iter().zip(&results) {
                let Some(sums) = result[s] else { continue };
                let entry = &model.tensors[tensor];
                let members: u64 = if scheme == Scheme::W8A8 {
                    let rows = match options.granularity {
                        Granularity::PerChannel => entry.info.shape.get(0).unwrap_or(1),
                        Granularity::PerTensor => 1,
                    };
                    entry.info.element_count().unwrap_or(0)
                        + scales_dtype_of(entry).byte_len(rows).unwrap_or(0)
                } else {
                    plan_for(scheme, options.group_size, entry, 0.0)
                        .members()
                        .iter()
                        .map(super::scheme::Member::byte_len)
                        .sum()
                };
                written += members;
                replaced += entry.info.byte_len();
                elements += entry.info.element_count().unwrap_or(0);
                errors.push((tensor, finish(&sums)));
            }
            let mut snrs: Vec<f64> = errors.iter().map(|(_, e)| e.snr_db).collect();
            snrs.sort_by(f64::total_cmp);
            let worst = errors
                .iter()
                .min_by(|a, b| a.1.snr_db.total_cmp(&b.1.snr_db))
                .map(|&(t, _)| t);
            #[expect(clippy::cast_precision_loss, reason = "a ratio")]
            let bits_per_weight = (elements > 0).then(|| written as f64 * 8.0 / elements as f64);
            SchemeResult {
                scheme,
                weights: errors.len(),
                output_bytes: all_bytes - replaced + written,
                bits_per_weight,
                worst_snr_db: snrs.first().copied(),
                median_snr_db: snrs.get(snrs.len() / 2).copied(),
                worst,
                errors,
            }
        })
        .collect();
    Ok(Comparison {
        schemes,
        non_finite,
    })
}

/// The weights whose SNR under `options.scheme` falls below `threshold`.
pub(super) fn below_snr(
    model: &Model,
    files: &[File],
    choices: &[Choice],
    options: &Options,
    threshold: f64,
    control: &Control,
) -> Result<Vec<usize>> {
    let chosen: Vec<usize> = (0..model.tensors.len())
        .filter(|&t| choices[t] == Choice::Quantize)
        .collect();
    let (results, _) = evaluate(model, files, &chosen, &[options.scheme], options, control)?;
    Ok(chosen
        .into_iter()
        .zip(results)
        .filter_map(|(tensor, result)| {
            let sums = result[0]?;
            (finish(&sums).snr_db < threshold).then_some(tensor)
        })
        .collect())
}

/// Marks the weights below the threshold as kept.
pub(super) fn keep_below(choices: &mut [Choice], below: &[usize]) {
    for &tensor in below {
        choices[tensor] = Choice::Keep(Kept::BelowSnr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Weights of several dtypes and widths, each read whole into the one buffer handed from
    /// weight to weight (several runs of rows for the largest), come back as their values with
    /// their largest magnitude, and NaN as none; the buffer keeps the largest weight's room.
    #[test]
    #[expect(
        clippy::cast_possible_truncation,
        reason = "F64 weights are compared as f32"
    )]
    fn weights_read_whole_into_one_buffer_are_their_values() {
        use crate::demo::{Fill, SyntheticModel};
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("model.safetensors");
        let normal = Fill::Normal {
            mean: 0.0,
            std: 1.0,
        };
        // Tensors are laid out by dtype, then name: F64, F32, F16, BF16. `a` is read in runs
        // of several rows.
        SyntheticModel::new(5)
            .tensor("a.weight", Dtype::Bf16, &[1100, 2048], normal.clone())
            .tensor("b.weight", Dtype::F32, &[3, 5], normal.clone())
            .tensor("c.weight", Dtype::F16, &[1500, 1500], normal.clone())
            .tensor("d.weight", Dtype::F64, &[20, 7], normal.clone())
            .tensor("e.weight", Dtype::Bf16, &[4, 300], normal)
            .plant("e.weight", 555, f64::NAN)
            .write(&source)
            .unwrap();
        let model = Model::open(&source).unwrap();
        let files = [File::open(&source).unwrap()];
        let bytes = std::fs::read(&source).unwrap();
        let mut held = Vec::new();
        let mut largest_room = 0;
        for tensor in &model.tensors {
            let (start, len) = model.file_range(tensor);
            let expected =
                &bytes[usize::try_from(start).unwrap()..][..usize::try_from(len).unwrap()];
            let dtype = tensor.info.dtype.known().unwrap();
            let values: Vec<f32> = match Bits::of(dtype) {
                Some(bits) => super::super::magnitude::tests::decoded(bits, expected),
                None => expected
                    .chunks(8)
                    .map(|b| f64::from_le_bytes(b.try_into().unwrap()) as f32)
                    .collect(),
            };
            let (absmax, stored) =
                read_whole(&model, &files, tensor, &Control::default(), &mut held).unwrap();
            assert_eq!(stored, expected, "{}", tensor.name());
            // Decoded a block at a time as the comparison does, a block not a multiple of the
            // runs read.
            let block = 3 * tensor.info.shape.get(1).unwrap() as usize * element_size(dtype);
            for (index, part) in stored.chunks(block).enumerate() {
                let start = index * block / element_size(dtype);
                with_decoded(dtype, part, |decoded| {
                    assert_eq!(decoded.len(), part.len() / element_size(dtype));
                    let want = &values[start..][..decoded.len()];
                    for (got, want) in decoded.iter().zip(want) {
                        assert_eq!(got.to_bits(), want.to_bits(), "{}", tensor.name());
                    }
                });
            }
            let largest = values
                .iter()
                .try_fold(0f32, |m, x| x.is_finite().then(|| m.max(x.abs())));
            assert_eq!(absmax, largest.map(f64::from), "{}", tensor.name());
            largest_room = largest_room.max(expected.len());
            assert!(
                held.capacity() * 4 <= largest_room.next_power_of_two() * 2,
                "{}",
                tensor.name()
            );
        }
        assert_eq!(largest_room, 1100 * 2048 * 2);
    }

    proptest::proptest! {
        /// W8A8's error worked out without codes is the one its writer measures, its rows'
        /// largest magnitudes found on their own or from the ranges of their groups.
        #[test]
        fn the_int8_error_without_codes_is_the_one_written(
            values in super::super::lanes::test_values(1..2000),
            columns in 1usize..300,
            source in proptest::sample::select(&[Dtype::Bf16, Dtype::F16, Dtype::F32][..]),
            shared: bool,
            ranges_of_groups in proptest::option::of(1usize..300),
        ) {
            let values: Vec<f32> = values
                .into_iter()
                .map(|x| match source {
                    Dtype::Bf16 => half::bf16::from_f32(x).to_f32(),
                    Dtype::F16 => half::f16::from_f32(x).to_f32(),
                    _ => x,
                })
                .collect();
            let dtype = super::super::scale_dtype(source);
            let shared = shared.then(|| scale_for(dtype, super::super::absmax_of(&values).0));
            let scale_of = |row: &[f32]| {
                shared.unwrap_or_else(|| scale_for(dtype, super::super::absmax_of(row).0))
            };
            let written = int8_sums_written(source, &values, columns, scale_of);
            let absmax = super::super::absmax_of(&values).0;
            let ranges = ranges_of_groups
                .map(|group| int_packed::BlockRanges::of(&values, columns, group));
            let worked_out = int8_sums(
                source,
                (&values, columns),
                shared,
                ranges.as_ref(),
                (absmax, signal(&values, absmax)),
            );
            // Not measured by a comparison (see `Compared`).
            let worked_out = ErrorSums {
                max_in_steps: written.max_in_steps,
                ..worked_out
            };
            super::super::lanes::assert_agree(&written, &worked_out, false)?;
        }
    }
}
