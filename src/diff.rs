//! What changed between two checkpoints: tensors added and removed, dtype and shape changes,
//! metadata differences, and for each tensor both hold the size of the numeric change.
//!
//! Tensors are compared in parallel; each is read in bounded chunks from both files, so memory
//! stays at a few chunks per thread whatever the model size.

use crate::analysis::values::{self, Sink};
use crate::format::{Model, Tensor, read_exact_at};
use crate::text::natural_cmp;
use rayon::prelude::*;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// Elements read per chunk: a multiple of 8, so that every dtype's chunk is whole bytes.
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
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum Status {
    /// Identical bytes, dtype and shape.
    Same,
    Changed {
        #[serde(skip_serializing_if = "Option::is_none")]
        dtype: Option<(String, String)>,
        #[serde(skip_serializing_if = "Option::is_none")]
        shape: Option<(Vec<u64>, Vec<u64>)>,
        /// Null when the element counts differ or a dtype cannot be read as numbers.
        change: Option<Change>,
    },
    Added,
    Removed,
    /// The bytes of one side could not be read.
    Unreadable {
        error: String,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TensorDiff {
    pub name: String,
    #[serde(flatten)]
    pub status: Status,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MetadataDiff {
    pub key: String,
    pub a: Option<String>,
    pub b: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ModelDiff {
    /// Every tensor of either model, in natural name order.
    pub tensors: Vec<TensorDiff>,
    pub metadata: Vec<MetadataDiff>,
}

impl ModelDiff {
    pub fn identical(&self) -> bool {
        self.metadata.is_empty() && self.tensors.iter().all(|t| t.status == Status::Same)
    }
}

/// Compares `a` with `b`; `progress` counts the bytes read from both.
pub fn diff(a: &Model, b: &Model, progress: &AtomicU64) -> ModelDiff {
    let by_name = |model: &Model| -> BTreeMap<String, usize> {
        model
            .tensors
            .iter()
            .enumerate()
            .map(|(index, tensor)| (tensor.name().to_owned(), index))
            .collect()
    };
    let (in_a, in_b) = (by_name(a), by_name(b));
    let mut names: Vec<&String> = in_a
        .keys()
        .chain(in_b.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    names.sort_by(|x, y| natural_cmp(x, y));
    let tensors = names
        .par_iter()
        .map(|name| {
            let status = match (in_a.get(*name), in_b.get(*name)) {
                (Some(&i), Some(&j)) => compare(a, &a.tensors[i], b, &b.tensors[j], progress),
                (Some(_), None) => Status::Removed,
                (None, _) => Status::Added,
            };
            TensorDiff {
                name: (*name).clone(),
                status,
            }
        })
        .collect();
    let keys: BTreeSet<&String> = a.metadata.keys().chain(b.metadata.keys()).collect();
    let metadata = keys
        .into_iter()
        .filter_map(|key| {
            let (x, y) = (a.metadata.get(key), b.metadata.get(key));
            (x != y).then(|| MetadataDiff {
                key: key.clone(),
                a: x.cloned(),
                b: y.cloned(),
            })
        })
        .collect();
    ModelDiff { tensors, metadata }
}

fn compare(a: &Model, ta: &Tensor, b: &Model, tb: &Tensor, progress: &AtomicU64) -> Status {
    let dtype = (ta.info.dtype != tb.info.dtype).then(|| {
        (
            ta.info.dtype.name().to_owned(),
            tb.info.dtype.name().to_owned(),
        )
    });
    let shape =
        (ta.info.shape != tb.info.shape).then(|| (ta.info.shape.clone(), tb.info.shape.clone()));
    let numbers = ta.info.dtype.known().zip(tb.info.dtype.known());
    let count = ta.info.element_count();
    let change = match numbers {
        Some(dtypes) if count.is_some() && count == tb.info.element_count() => {
            match measure(a, ta, b, tb, dtypes, count.unwrap_or(0), progress) {
                Ok(change) => change,
                Err(error) => return Status::Unreadable { error },
            }
        }
        _ => None,
    };
    if dtype.is_none() && shape.is_none() && change.is_none() {
        Status::Same
    } else {
        Status::Changed {
            dtype,
            shape,
            change,
        }
    }
}

/// Decoded values, widened to f64.
#[derive(Default)]
struct Collect(Vec<f64>);

impl Sink for Collect {
    fn f32s(&mut self, values: &[f32]) {
        self.0.extend(values.iter().map(|&v| f64::from(v)));
    }

    fn f64s(&mut self, values: &[f64]) {
        self.0.extend_from_slice(values);
    }
}

#[derive(Default)]
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
        }
    }
}

/// Reads both tensors chunk by chunk; `None` when their bytes (and dtypes) are identical.
fn measure(
    a: &Model,
    ta: &Tensor,
    b: &Model,
    tb: &Tensor,
    (dtype_a, dtype_b): (crate::format::Dtype, crate::format::Dtype),
    count: u64,
    progress: &AtomicU64,
) -> Result<Option<Change>, String> {
    let open = |model: &Model, tensor: &Tensor| {
        let shard = model.shard_of(tensor);
        File::open(&shard.path)
            .map(|file| (file, model.file_range(tensor).0))
            .map_err(|e| format!("{}: {e}", shard.label))
    };
    let ((file_a, start_a), (file_b, start_b)) = (open(a, ta)?, open(b, tb)?);
    let bytes_for =
        |dtype: crate::format::Dtype, elements: u64| elements * u64::from(dtype.bits()) / 8;
    let (mut buf_a, mut buf_b) = (Vec::new(), Vec::new());
    let (mut values_a, mut values_b) = (Collect::default(), Collect::default());
    let mut sums = Sums::default();
    let mut identical = dtype_a == dtype_b;
    let mut done = 0;
    while done < count {
        let elements = CHUNK_ELEMENTS.min(count - done);
        let read = |file: &File, start: u64, dtype, buffer: &mut Vec<u8>, label: &str| {
            let len = usize::try_from(bytes_for(dtype, elements)).map_err(|e| e.to_string())?;
            buffer.resize(len, 0);
            read_exact_at(file, buffer, start + bytes_for(dtype, done))
                .map_err(|e: io::Error| format!("{label}: {e}"))
        };
        read(&file_a, start_a, dtype_a, &mut buf_a, &a.shard_of(ta).label)?;
        read(&file_b, start_b, dtype_b, &mut buf_b, &b.shard_of(tb).label)?;
        progress.fetch_add((buf_a.len() + buf_b.len()) as u64, Ordering::Relaxed);
        done += elements;
        if identical && buf_a == buf_b {
            continue;
        }
        identical = false;
        values_a.0.clear();
        values_b.0.clear();
        values::feed(dtype_a, &buf_a, &mut values_a);
        values::feed(dtype_b, &buf_b, &mut values_b);
        for (&x, &y) in values_a.0.iter().zip(&values_b.0) {
            sums.add(x, y);
        }
    }
    Ok((!identical).then(|| sums.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;

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
