//! What changed between two checkpoints: tensors added and removed, dtype and shape changes,
//! metadata differences, and for each tensor both hold the size of the numeric change.
//!
//! Tensors are compared in parallel; each is read in bounded chunks from both files, through
//! short-lived memory maps ([`crate::format::mapped`]), so memory stays at a few chunks' decoded
//! values per thread whatever the model size.
//!
//! A quantized model is compared by its logical weights ([`Side::logical`]): each is paired
//! with the weight of the same name on the other side and both are read as the model computes
//! with them, dequantized a block of rows at a time ([`dequantized`]).

mod dequantized;

use crate::analysis::simd;
use crate::analysis::values::{self, Sink};
use crate::format::mapped::with_mapped;
use crate::format::{Dtype, Model, Shape, StringMap, Tensor};
use crate::quant::{LogicalTensors, Quantization};
use crate::recycle::Recycled;
use crate::text::natural_cmp;
use multiversion::multiversion;
use rayon::prelude::*;
use serde::Serialize;

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};

/// Elements read per chunk (4 MiB of F32): a multiple of 8, so that every dtype's chunk is whole
/// bytes.
const CHUNK_ELEMENTS: u64 = 1 << 20;

/// The size of the change between two tensors of the same element count. Values are compared
/// as numbers (complex values by magnitude), so a dtype change shows as its rounding error.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Change {
    /// The largest `|a - b|` over positions where both values are finite.
    pub max_abs_diff: f64,
    /// `‖a - b‖ / ‖a‖` over those positions (infinite when `a` is all zeros and `b` is not).
    pub relative_l2: f64,
    /// `a·b / (‖a‖ ‖b‖)`; null when either side is all zeros.
    pub cosine: Option<f64>,
    /// Positions where exactly one side is finite, or both are NaN/Inf but differ.
    pub nonfinite_mismatches: u64,
    /// Positions whose values differ.
    pub changed_values: u64,
    /// `10 log10(‖a‖² / ‖a - b‖²)`, the signal-to-noise ratio of `b` as a copy of `a`; null
    /// when they agree everywhere or `a` is all zeros.
    pub snr_db: Option<f64>,
}

/// `max|a-b| 1.2e-3  rel L2 4.5e-4  cosine 0.999990`
impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "max|a-b| {:.3e}  rel L2 {:.3e}  cosine ",
            self.max_abs_diff, self.relative_l2
        )?;
        match self.cosine {
            Some(cosine) => write!(f, "{cosine:.6}")?,
            None => f.write_str("-")?,
        }
        match self.snr_db {
            Some(snr) => write!(f, "  SNR {snr:.1} dB"),
            None => Ok(()),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum Status {
    /// Identical bytes, dtype and shape.
    Same,
    /// Boxed, so that the many tensors that did not change take little room.
    Changed(Box<Changed>),
    Added,
    Removed,
    /// The bytes of one side could not be read.
    Unreadable {
        error: Box<str>,
    },
}

/// How a tensor in both models differs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Changed {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<(String, String)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shape: Option<(Shape, Shape)>,
    /// Null when the element counts differ or a dtype cannot be read as numbers.
    pub change: Option<Change>,
    /// Why the values are not compared although both can be read: one side's weights are
    /// stored in a rotated basis, so positions do not hold the same weight.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unaligned: Option<Box<str>>,
}

/// One tensor of either model: where it is in each (a few bytes, as models can have millions of
/// tensors; [`TensorDiff::name`] finds its name) and how it differs.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorDiff {
    in_a: u32,
    in_b: u32,
    pub status: Status,
}

/// Marks a tensor absent from one side in a [`TensorDiff`].
const NONE: u32 = u32::MAX;

impl TensorDiff {
    /// The tensor's index in the first model's list, if it is there.
    pub fn in_a(&self) -> Option<usize> {
        (self.in_a != NONE).then_some(self.in_a as usize)
    }

    /// The tensor's index in the second model's list, if it is there.
    pub fn in_b(&self) -> Option<usize> {
        (self.in_b != NONE).then_some(self.in_b as usize)
    }

    /// The tensor's name; `a` and `b` are the sides compared.
    pub fn name<'m>(&self, a: &'m Side<'_>, b: &'m Side<'_>) -> &'m str {
        match self.in_a() {
            Some(index) => a.tensors()[index].name(),
            None => b.tensors()[self.in_b().unwrap_or_default()].name(),
        }
    }
}

/// A model as it is compared: as stored, or a quantized model as it computes, its logical
/// weights in the place of their members. [`TensorDiff`]'s indexes are into [`Side::tensors`].
#[derive(Debug)]
pub struct Side<'a> {
    pub model: &'a Model,
    logical: Option<(&'a Quantization, LogicalTensors)>,
}

impl<'a> Side<'a> {
    /// Every tensor as stored.
    pub fn stored(model: &'a Model) -> Side<'a> {
        Side {
            model,
            logical: None,
        }
    }

    /// A quantized model by its logical weights; with no quantization, as stored.
    pub fn logical(model: &'a Model, quantization: Option<&'a Quantization>) -> Side<'a> {
        Side {
            model,
            logical: quantization.map(|q| (q, LogicalTensors::new(model, q))),
        }
    }

    /// The tensors compared: a logical weight in the place of its members.
    pub fn tensors(&self) -> &[Tensor] {
        match &self.logical {
            Some((_, listed)) => &listed.tensors,
            None => &self.model.tensors,
        }
    }

    /// The logical weight listed tensor `index` is, with the model's quantization.
    fn weight(&self, index: usize) -> Option<(&'a Quantization, usize)> {
        let (quantization, listed) = self.logical.as_ref()?;
        listed.weight(index).map(|weight| (*quantization, weight))
    }

    /// The stored tensor listed tensor `index` is, when it is no logical weight.
    fn stored_tensor(&self, index: usize) -> &Tensor {
        match &self.logical {
            Some((_, listed)) => &self.model.tensors[listed.stored(index).unwrap_or(usize::MAX)],
            None => &self.model.tensors[index],
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MetadataDiff {
    pub key: String,
    pub a: Option<String>,
    pub b: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelDiff {
    /// Every tensor of either model, in natural name order.
    pub tensors: Vec<TensorDiff>,
    pub metadata: Vec<MetadataDiff>,
    /// False when either model is read from the Hub: then only the layout is compared
    /// (names, dtypes, shapes, metadata), never the values, which would mean downloading them.
    pub values_compared: bool,
}

impl ModelDiff {
    pub fn identical(&self) -> bool {
        self.metadata.is_empty() && self.tensors.iter().all(|t| t.status == Status::Same)
    }
}

/// Compares `a` with `b`; `progress` counts the bytes read from both.
pub fn diff(a: &Side<'_>, b: &Side<'_>, progress: &AtomicU64) -> ModelDiff {
    let (side_a, side_b) = (a, b);
    let (a, b) = (a.tensors(), b.tensors());
    // Tensors paired by name through two lists of indexes sorted by name, walked side by side:
    // a few bytes a tensor, as a model can have millions.
    let by_name = |tensors: &[Tensor]| -> Vec<u32> {
        let name = |i: u32| tensors[i as usize].name();
        let mut order: Vec<u32> = (0..tensors.len())
            .filter_map(|i| u32::try_from(i).ok())
            .collect();
        order.sort_unstable_by(|&x, &y| name(x).cmp(name(y)));
        order
    };
    let (in_a, in_b) = (by_name(a), by_name(b));
    let (name_a, name_b) = (|i: u32| a[i as usize].name(), |j: u32| b[j as usize].name());
    let mut pairs: Vec<(u32, u32)> = Vec::with_capacity(in_a.len().max(in_b.len()));
    let (mut left, mut right) = (in_a.iter().peekable(), in_b.iter().peekable());
    loop {
        let pair = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(&&here), Some(&&there)) => match name_a(here).cmp(name_b(there)) {
                std::cmp::Ordering::Less => (here, NONE),
                std::cmp::Ordering::Greater => (NONE, there),
                std::cmp::Ordering::Equal => (here, there),
            },
            (Some(&&here), None) => (here, NONE),
            (None, Some(&&there)) => (NONE, there),
        };
        if pair.0 != NONE {
            left.next();
        }
        if pair.1 != NONE {
            right.next();
        }
        pairs.push(pair);
    }
    drop((in_a, in_b));
    let values = side_a.model.remote.is_none() && side_b.model.remote.is_none();
    let name = |&(here, there): &(u32, u32)| {
        if here == NONE {
            name_b(there)
        } else {
            name_a(here)
        }
    };
    pairs.sort_unstable_by(|p, q| natural_cmp(name(p), name(q)).then(name(p).cmp(name(q))));
    let tensors = pairs
        .par_iter()
        .map(|pair| {
            let status = match *pair {
                (_, NONE) => Status::Removed,
                (NONE, _) => Status::Added,
                (i, j) => {
                    let (i, j) = (i as usize, j as usize);
                    let logical = side_a.weight(i).is_some() || side_b.weight(j).is_some();
                    match (values, logical) {
                        (false, _) => compare_layout(&a[i], &b[j]),
                        (true, true) => dequantized::compare((side_a, i), (side_b, j), progress),
                        (true, false) => compare(
                            side_a.model,
                            side_a.stored_tensor(i),
                            side_b.model,
                            side_b.stored_tensor(j),
                            progress,
                        ),
                    }
                }
            };
            TensorDiff {
                in_a: pair.0,
                in_b: pair.1,
                status,
            }
        })
        .collect();
    ModelDiff {
        tensors,
        metadata: metadata_diff(&side_a.model.metadata, &side_b.model.metadata),
        values_compared: values,
    }
}

/// The dtypes and the shapes of two tensors, where they differ.
type LayoutChanges = (Option<(String, String)>, Option<(Shape, Shape)>);

fn layout_changes(ta: &Tensor, tb: &Tensor) -> LayoutChanges {
    let dtype = (ta.info.dtype != tb.info.dtype).then(|| {
        (
            ta.info.dtype.name().to_owned(),
            tb.info.dtype.name().to_owned(),
        )
    });
    let shape =
        (ta.info.shape != tb.info.shape).then(|| (ta.info.shape.clone(), tb.info.shape.clone()));
    (dtype, shape)
}

/// Dtype and shape only.
fn compare_layout(ta: &Tensor, tb: &Tensor) -> Status {
    let (dtype, shape) = layout_changes(ta, tb);
    if dtype.is_none() && shape.is_none() {
        Status::Same
    } else {
        Status::Changed(Box::new(Changed {
            dtype,
            shape,
            change: None,
            unaligned: None,
        }))
    }
}

/// The keys whose values differ, in key order: both maps walked side by side, as both are in
/// key order.
fn metadata_diff(a: &StringMap, b: &StringMap) -> Vec<MetadataDiff> {
    let differ = |key: &str, x: Option<&str>, y: Option<&str>| MetadataDiff {
        key: key.to_owned(),
        a: x.map(str::to_owned),
        b: y.map(str::to_owned),
    };
    let (mut a, mut b) = (a.iter().peekable(), b.iter().peekable());
    let mut diffs = Vec::new();
    loop {
        let diff = match (a.peek(), b.peek()) {
            (None, None) => return diffs,
            (Some(&(key, x)), Some(&(other, _))) if key < other => {
                a.next();
                differ(key, Some(x), None)
            }
            (Some(&(key, x)), None) => {
                a.next();
                differ(key, Some(x), None)
            }
            (Some(&(key, x)), Some(&(other, y))) if key == other => {
                a.next();
                b.next();
                if x == y {
                    continue;
                }
                differ(key, Some(x), Some(y))
            }
            (_, Some(&(key, y))) => {
                b.next();
                differ(key, None, Some(y))
            }
        };
        diffs.push(diff);
    }
}

fn compare(a: &Model, ta: &Tensor, b: &Model, tb: &Tensor, progress: &AtomicU64) -> Status {
    let (dtype, shape) = layout_changes(ta, tb);
    let numbers = ta.info.dtype.known().zip(tb.info.dtype.known());
    let count = ta.info.element_count();
    let change = match numbers {
        Some(dtypes) if count.is_some() && count == tb.info.element_count() => {
            match measure(a, ta, b, tb, dtypes, count.unwrap_or(0), progress) {
                Ok(change) => change,
                Err(error) => {
                    return Status::Unreadable {
                        error: error.into(),
                    };
                }
            }
        }
        // Values that cannot be decoded are compared as bytes: a change has no size then.
        _ if dtype.is_none() && shape.is_none() => match same_bytes(a, ta, b, tb, progress) {
            Ok(true) => return Status::Same,
            Ok(false) => {
                return Status::Changed(Box::new(Changed {
                    dtype,
                    shape,
                    change: None,
                    unaligned: None,
                }));
            }
            Err(error) => {
                return Status::Unreadable {
                    error: error.into(),
                };
            }
        },
        _ => None,
    };
    if dtype.is_none() && shape.is_none() && change.is_none() {
        Status::Same
    } else {
        Status::Changed(Box::new(Changed {
            dtype,
            shape,
            change,
            unaligned: None,
        }))
    }
}

/// A tensor's bytes in its file, read a chunk at a time; errors name the file.
struct TensorBytes<'a> {
    file: File,
    start: u64,
    label: &'a str,
}

impl<'a> TensorBytes<'a> {
    fn open(model: &'a Model, tensor: &Tensor) -> Result<Self, String> {
        let shard = model.shard_of(tensor);
        let file =
            crate::paths::open_file(&shard.path).map_err(|e| format!("{}: {e}", shard.label))?;
        Ok(TensorBytes {
            file,
            start: model.file_range(tensor).0,
            label: &shard.label,
        })
    }

    /// Runs `work` on `len` bytes from `offset` within the tensor.
    fn with<T>(&self, offset: u64, len: u64, work: impl FnOnce(&[u8]) -> T) -> Result<T, String> {
        let len = usize::try_from(len).map_err(|e| e.to_string())?;
        with_mapped(&self.file, self.start + offset, len, work)
            .map_err(|e| format!("{}: {e}", self.label))
    }
}

/// Whether two tensors' bytes are identical, read a chunk at a time, counting the bytes read
/// in `progress`.
pub fn same_bytes(
    a: &Model,
    ta: &Tensor,
    b: &Model,
    tb: &Tensor,
    progress: &AtomicU64,
) -> Result<bool, String> {
    const CHUNK: u64 = 4 << 20;
    let (len, len_b) = (a.file_range(ta).1, b.file_range(tb).1);
    if len != len_b {
        return Ok(false);
    }
    let (reader_a, reader_b) = (TensorBytes::open(a, ta)?, TensorBytes::open(b, tb)?);
    let mut done = 0;
    while done < len {
        let size = CHUNK.min(len - done);
        let same = reader_a.with(done, size, |x| reader_b.with(done, size, |y| x == y))??;
        progress.fetch_add(2 * size, Ordering::Relaxed);
        if !same {
            return Ok(false);
        }
        done += size;
    }
    Ok(true)
}

/// One chunk's decoded values: as f32 while every value came as one, else widened to f64.
#[derive(Default)]
struct Collect {
    narrow: Vec<f32>,
    wide: Vec<f64>,
}

impl Collect {
    fn clear(&mut self) {
        self.narrow.clear();
        self.wide.clear();
    }

    fn widen(&mut self) {
        self.wide.extend(self.narrow.drain(..).map(f64::from));
    }
}

impl Sink for Collect {
    fn f32s(&mut self, values: &[f32]) {
        if self.wide.is_empty() {
            self.narrow.extend_from_slice(values);
        } else {
            self.wide.extend(values.iter().map(|&v| f64::from(v)));
        }
    }

    fn f64s(&mut self, values: &[f64]) {
        self.widen();
        self.wide.extend_from_slice(values);
    }
}

const LANES: usize = 8;

/// Pairs compared at a time: blocks of finite values take the hand-written kernel.
const BLOCK: usize = 4096;

/// [`Sums::add`] over pairs of f32 values: blocks where every value is finite through the
/// SIMD kernel, the others in branch-free lanes.
fn add_f32_pairs(a: &[f32], b: &[f32]) -> Sums {
    let mut sums = Sums::default();
    for (x, y) in a.chunks(BLOCK).zip(b.chunks(BLOCK)) {
        let block = match simd::finite_pairs(x, y) {
            Some(pairs) => Sums {
                diff_sq: pairs.diff_sq,
                a_sq: pairs.a_sq,
                b_sq: pairs.b_sq,
                dot: pairs.dot,
                max_abs: pairs.max_abs,
                nonfinite_mismatches: 0,
                changed: pairs.changed,
            },
            None => add_f32_pairs_in_lanes(x, y),
        };
        sums.merge(&block);
    }
    sums
}

/// [`Sums::add`] over pairs of f32 values, in branch-free lanes the compiler vectorizes.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn add_f32_pairs_in_lanes(a: &[f32], b: &[f32]) -> Sums {
    let mut diff_sq = [0f64; LANES];
    let mut a_sq = [0f64; LANES];
    let mut b_sq = [0f64; LANES];
    let mut dot = [0f64; LANES];
    let mut max_abs = [0f64; LANES];
    let mut mismatches = [0u64; LANES];
    let mut changed = [0u64; LANES];
    let (pairs_a, rest_a) = a.as_chunks::<LANES>();
    let (pairs_b, rest_b) = b.as_chunks::<LANES>();
    for (xs, ys) in pairs_a.iter().zip(pairs_b) {
        for i in 0..LANES {
            let (x, y) = (xs[i], ys[i]);
            let finite = x.is_finite() & y.is_finite();
            let (x64, y64) = if finite {
                (f64::from(x), f64::from(y))
            } else {
                (0.0, 0.0)
            };
            let d = x64 - y64;
            diff_sq[i] += d * d;
            a_sq[i] += x64 * x64;
            b_sq[i] += y64 * y64;
            dot[i] += x64 * y64;
            max_abs[i] = if d.abs() > max_abs[i] {
                d.abs()
            } else {
                max_abs[i]
            };
            let mismatch = !finite & (x.to_bits() != y.to_bits()) & !(x.is_nan() & y.is_nan());
            mismatches[i] += u64::from(mismatch);
            changed[i] += u64::from(mismatch) | u64::from(d != 0.0);
        }
    }
    let mut sums = Sums {
        diff_sq: diff_sq.iter().sum(),
        a_sq: a_sq.iter().sum(),
        b_sq: b_sq.iter().sum(),
        dot: dot.iter().sum(),
        max_abs: max_abs.iter().copied().fold(0.0, f64::max),
        nonfinite_mismatches: mismatches.iter().sum(),
        changed: changed.iter().sum(),
    };
    for (&x, &y) in rest_a.iter().zip(rest_b) {
        sums.add(f64::from(x), f64::from(y));
    }
    sums
}

#[derive(Debug, Default, PartialEq)]
struct Sums {
    diff_sq: f64,
    a_sq: f64,
    b_sq: f64,
    dot: f64,
    max_abs: f64,
    nonfinite_mismatches: u64,
    changed: u64,
}

impl Sums {
    fn merge(&mut self, other: &Sums) {
        self.diff_sq += other.diff_sq;
        self.a_sq += other.a_sq;
        self.b_sq += other.b_sq;
        self.dot += other.dot;
        self.max_abs = self.max_abs.max(other.max_abs);
        self.nonfinite_mismatches += other.nonfinite_mismatches;
        self.changed += other.changed;
    }

    fn add(&mut self, x: f64, y: f64) {
        if x.is_finite() && y.is_finite() {
            let d = x - y;
            if d != 0.0 {
                self.changed += 1;
            }
            self.diff_sq += d * d;
            self.a_sq += x * x;
            self.b_sq += y * y;
            self.dot += x * y;
            self.max_abs = self.max_abs.max(d.abs());
        } else if !(x.to_bits() == y.to_bits() || x.is_nan() && y.is_nan()) {
            self.nonfinite_mismatches += 1;
            self.changed += 1;
        }
    }

    fn finish(self) -> Change {
        let relative_l2 = if self.a_sq > 0.0 {
            (self.diff_sq / self.a_sq).sqrt()
        } else if self.diff_sq > 0.0 {
            f64::INFINITY
        } else {
            0.0
        };
        let norms = (self.a_sq * self.b_sq).sqrt();
        Change {
            max_abs_diff: self.max_abs,
            relative_l2,
            cosine: (norms > 0.0).then(|| self.dot / norms),
            nonfinite_mismatches: self.nonfinite_mismatches,
            changed_values: self.changed,
            snr_db: (self.diff_sq > 0.0 && self.a_sq > 0.0)
                .then(|| 10.0 * (self.a_sq / self.diff_sq).log10()),
        }
    }
}

/// Reads both tensors a chunk at a time, the chunks in parallel; `None` when their bytes (and
/// dtypes) are identical.
fn measure(
    a: &Model,
    ta: &Tensor,
    b: &Model,
    tb: &Tensor,
    dtypes: (Dtype, Dtype),
    count: u64,
    progress: &AtomicU64,
) -> Result<Option<Change>, String> {
    let readers = (TensorBytes::open(a, ta)?, TensorBytes::open(b, tb)?);
    let chunks = count.div_ceil(CHUNK_ELEMENTS);
    let same_dtype = dtypes.0 == dtypes.1;
    let outcomes: Vec<Option<Sums>> = (0..chunks)
        .into_par_iter()
        .map(|chunk| {
            with_chunk(&readers, dtypes, (chunk, count), progress, |x, y| {
                (!same_dtype || x != y).then(|| Decoded::sums_here(dtypes, x, y))
            })
        })
        .collect::<Result<_, String>>()?;
    if outcomes.iter().all(Option::is_none) {
        return Ok(None);
    }
    // The chunks found byte-equal still count in the norms and the cosine: measured now (a
    // second read, not counted again in the progress).
    let equal: Vec<u64> = (0..chunks)
        .zip(&outcomes)
        .filter_map(|(chunk, outcome)| outcome.is_none().then_some(chunk))
        .collect();
    let reread = AtomicU64::new(0);
    let unchanged = equal
        .into_par_iter()
        .map(|chunk| {
            with_chunk(&readers, dtypes, (chunk, count), &reread, |x, y| {
                Decoded::sums_here(dtypes, x, y)
            })
        })
        .collect::<Result<Vec<Sums>, String>>()?;
    let mut sums = Sums::default();
    for part in outcomes.iter().flatten().chain(&unchanged) {
        sums.merge(part);
    }
    Ok(Some(sums.finish()))
}

/// Runs `work` on the bytes of chunk `chunk` of two tensors of `count` elements.
fn with_chunk<T>(
    (reader_a, reader_b): &(TensorBytes<'_>, TensorBytes<'_>),
    (dtype_a, dtype_b): (Dtype, Dtype),
    (chunk, count): (u64, u64),
    progress: &AtomicU64,
    work: impl FnOnce(&[u8], &[u8]) -> T,
) -> Result<T, String> {
    let first = chunk * CHUNK_ELEMENTS;
    let elements = CHUNK_ELEMENTS.min(count - first);
    let bytes_for = |dtype: Dtype, elements: u64| elements * u64::from(dtype.bits()) / 8;
    let (len_a, len_b) = (bytes_for(dtype_a, elements), bytes_for(dtype_b, elements));
    let result = reader_a.with(bytes_for(dtype_a, first), len_a, |x| {
        reader_b.with(bytes_for(dtype_b, first), len_b, |y| work(x, y))
    })??;
    progress.fetch_add(len_a + len_b, Ordering::Relaxed);
    Ok(result)
}

/// One worker's buffers for the decoded values of a chunk of both tensors.
#[derive(Default)]
struct Decoded {
    a: Collect,
    b: Collect,
}

impl Decoded {
    /// [`Decoded::sums`] with buffers handed on from chunk to chunk and tensor to tensor.
    fn sums_here(dtypes: (Dtype, Dtype), x: &[u8], y: &[u8]) -> Sums {
        static BUFFERS: Recycled<Decoded> = Recycled::new();
        let mut decoded = BUFFERS.take();
        let sums = decoded.sums(dtypes, x, y);
        BUFFERS.give(decoded);
        sums
    }

    /// The sums over a chunk of both tensors' bytes.
    fn sums(&mut self, (dtype_a, dtype_b): (Dtype, Dtype), x: &[u8], y: &[u8]) -> Sums {
        if let (Dtype::F32, Dtype::F32, Ok(xs), Ok(ys)) = (
            dtype_a,
            dtype_b,
            bytemuck::try_cast_slice::<u8, f32>(x),
            bytemuck::try_cast_slice::<u8, f32>(y),
        ) {
            return add_f32_pairs(xs, ys);
        }
        let (values_a, values_b) = (&mut self.a, &mut self.b);
        values_a.clear();
        values_b.clear();
        values::feed(dtype_a, x, values_a);
        values::feed(dtype_b, y, values_b);
        sums_of_collected(values_a, values_b)
    }
}

/// The sums over two chunks of decoded values: in `f32` while both are, else in `f64`.
fn sums_of_collected(a: &mut Collect, b: &mut Collect) -> Sums {
    if a.wide.is_empty() && b.wide.is_empty() {
        return add_f32_pairs(&a.narrow, &b.narrow);
    }
    a.widen();
    b.widen();
    let mut sums = Sums::default();
    for (&x, &y) in a.wide.iter().zip(&b.wide) {
        sums.add(x, y);
    }
    sums
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_in_the_last_chunk_is_measured_against_the_whole_tensor() {
        use crate::demo::{Fill, SyntheticModel};
        let dir = tempfile::tempdir().unwrap();
        let count = 3 * CHUNK_ELEMENTS + 5;
        let values: Vec<f64> = (0..count).map(|i| (i % 97) as f64 * 0.01 + 0.5).collect();
        let mut changed = values.clone();
        *changed.last_mut().unwrap() += 1.0;
        let write = |name: &str, values: Vec<f64>| {
            let path = dir.path().join(name);
            SyntheticModel::new(0)
                .tensor("w", Dtype::F32, &[count], Fill::Values(values))
                .write(&path)
                .unwrap();
            Model::open(&path).unwrap()
        };
        let (a, b) = (
            write("a.safetensors", values.clone()),
            write("b.safetensors", changed.clone()),
        );
        let result = diff(&Side::stored(&a), &Side::stored(&b), &AtomicU64::new(0));
        let Status::Changed(what) = &result.tensors[0].status else {
            panic!("{:?}", result.tensors[0]);
        };
        let Some(change) = &what.change else {
            panic!("{:?}", result.tensors[0]);
        };
        #[expect(clippy::cast_possible_truncation, reason = "stored as F32")]
        let stored = |v: f64| f64::from(v as f32);
        let norm_a = values
            .iter()
            .map(|&v| stored(v).powi(2))
            .sum::<f64>()
            .sqrt();
        let last = (stored(values[values.len() - 1]) - stored(changed[changed.len() - 1])).abs();
        // Sums of 3 million squares, in different orders, agree to about 1e-10.
        assert!((change.relative_l2 - last / norm_a).abs() <= 1e-9 * change.relative_l2);
        assert_eq!(change.changed_values, 1);
    }

    #[test]
    fn the_f32_kernels_agree_with_the_plain_sums() {
        // The NaN sends the first block to the lane kernel; the others take the SIMD one.
        let a: Vec<f32> = (0..3 * BLOCK + 11)
            .map(|i| (i as f32 * 0.37).sin())
            .collect();
        let mut b = a.clone();
        b[5] = 2.0;
        b[700] = f32::NAN;
        b[1001] = -0.5;
        b[1027] = 0.25;
        b[2065] = -0.0;
        b[3005] = 7.0;
        b[BLOCK + 3] = -0.0;
        b[2 * BLOCK + 100] = 9.5;
        b[3 * BLOCK + 7] = -3.0;
        let mut plain = Sums::default();
        for (&x, &y) in a.iter().zip(&b) {
            plain.add(f64::from(x), f64::from(y));
        }
        let fast = add_f32_pairs(&a, &b);
        assert_eq!(fast.changed, plain.changed);
        assert_eq!(fast.nonfinite_mismatches, 1);
        assert_eq!(fast.max_abs, plain.max_abs);
        for (x, y) in [
            (fast.diff_sq, plain.diff_sq),
            (fast.a_sq, plain.a_sq),
            (fast.b_sq, plain.b_sq),
            (fast.dot, plain.dot),
        ] {
            assert!((x - y).abs() <= 1e-12 * y.abs(), "{x} {y}");
        }
    }

    #[test]
    fn sums_give_the_usual_measures() {
        let mut sums = Sums::default();
        for (x, y) in [
            (1.0, 1.0),
            (2.0, 2.5),
            (-3.0, -3.0),
            (f64::NAN, f64::NAN),
            (f64::INFINITY, 1.0),
        ] {
            sums.add(x, y);
        }
        let change = sums.finish();
        assert_eq!(change.max_abs_diff, 0.5);
        assert!((change.relative_l2 - (0.25f64 / 14.0).sqrt()).abs() < 1e-12);
        let cosine = (1.0 + 5.0 + 9.0) / (14.0f64.sqrt() * (1.0f64 + 6.25 + 9.0).sqrt());
        assert!((change.cosine.unwrap() - cosine).abs() < 1e-12);
        assert_eq!(change.nonfinite_mismatches, 1);
        assert_eq!(change.changed_values, 2);
    }
}
