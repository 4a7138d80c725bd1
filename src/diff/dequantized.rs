//! A logical weight compared with its counterpart through dequantization: both sides read a
//! block of rows at a time as the model computes with them, the blocks in parallel, so memory
//! stays at two blocks of `f32` values per worker.

use super::{CHUNK_ELEMENTS, Change, Changed, Collect, Side, Status, Sums, TensorBytes};
use crate::analysis::values;
use crate::format::Dtype;
use crate::quant::kernels::Dequantize;
use crate::text::escape;
use rayon::prelude::*;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

/// Compares listed tensor `i` of `a` with listed tensor `j` of `b`, one of them (or both) a
/// logical weight.
pub(super) fn compare(
    (a, i): (&Side<'_>, usize),
    (b, j): (&Side<'_>, usize),
    progress: &AtomicU64,
) -> Status {
    let (ta, tb) = (&a.tensors()[i], &b.tensors()[j]);
    let (dtype, shape) = super::layout_changes(ta, tb);
    let changed = |change: Option<Change>, unaligned: Option<Box<str>>| {
        Status::Changed(Box::new(Changed {
            dtype: dtype.clone(),
            shape: shape.clone(),
            change,
            unaligned,
        }))
    };
    if let Some(reason) = unaligned((a, i), (b, j)) {
        return changed(None, Some(reason.into()));
    }
    let count = ta.info.element_count();
    if count.is_none() || count != tb.info.element_count() {
        return changed(None, None);
    }
    let measured = with_values(a, i, |x| {
        with_values(b, j, |y| measure(&x, &y, count.unwrap_or(0), progress))
    });
    match measured.and_then(|inner| inner).and_then(|inner| inner) {
        Ok(Some(change)) if dtype.is_none() && shape.is_none() && change.changed_values == 0 => {
            Status::Same
        }
        Ok(change) => changed(change, None),
        Err(error) => Status::Unreadable {
            error: error.into(),
        },
    }
}

/// Why positions do not hold the same weights on both sides: one side is stored rotated.
fn unaligned((a, i): (&Side<'_>, usize), (b, j): (&Side<'_>, usize)) -> Option<String> {
    let rotated =
        |side: &Side<'_>, index: usize| side.weight(index).is_some_and(|(q, _)| q.rotated);
    let which = match (rotated(a, i), rotated(b, j)) {
        (true, false) => "a",
        (false, true) => "b",
        _ => return None,
    };
    Some(format!(
        "not element-aligned: the weights of {which} are stored in a rotated basis, so a \
         position does not hold the same weight on both sides"
    ))
}

/// Where a side's values come from.
enum Values<'v> {
    Stored {
        bytes: TensorBytes<'v>,
        dtype: Dtype,
    },
    Dequantized {
        kernel: &'v dyn Dequantize,
        /// The stored bytes of its members, for the progress.
        bytes: u64,
    },
}

/// Runs `work` on the values of listed tensor `index` of `side`.
fn with_values<T>(
    side: &Side<'_>,
    index: usize,
    work: impl FnOnce(Values<'_>) -> T,
) -> Result<T, String> {
    if let Some((quantization, weight)) = side.weight(index) {
        let bytes = quantization.weights[weight].stored_bytes();
        let stored = (side.model, quantization, weight);
        return crate::quant::read::with_kernel(stored, &|| false, |kernel| {
            work(Values::Dequantized { kernel, bytes })
        })
        .map_err(|error| format!("cannot dequantize: {error}"));
    }
    let tensor = side.stored_tensor(index);
    let dtype = tensor.info.dtype.known().ok_or_else(|| {
        format!(
            "{}: dtype {} is not read as numbers",
            escape(tensor.name()),
            escape(tensor.info.dtype.name())
        )
    })?;
    let bytes = TensorBytes::open(side.model, tensor)?;
    Ok(work(Values::Stored { bytes, dtype }))
}

/// The change from `a` to `b`, `count` elements each, a block of whole rows at a time; `None`
/// when their rows are not the same length.
fn measure(
    a: &Values<'_>,
    b: &Values<'_>,
    count: u64,
    progress: &AtomicU64,
) -> Result<Option<Change>, String> {
    let cols = match (a, b) {
        (Values::Dequantized { kernel: x, .. }, Values::Dequantized { kernel: y, .. })
            if x.cols() != y.cols() =>
        {
            return Ok(None);
        }
        (Values::Dequantized { kernel, .. }, _) | (_, Values::Dequantized { kernel, .. }) => {
            kernel.cols()
        }
        (Values::Stored { .. }, Values::Stored { .. }) => return Ok(None),
    };
    if cols == 0 || count == 0 {
        return Ok(Some(Sums::default().finish()));
    }
    let rows = usize::try_from(count).map_err(|e| e.to_string())? / cols;
    let block = (usize::try_from(CHUNK_ELEMENTS).unwrap_or(usize::MAX) / cols).max(1);
    let parts = (0..rows.div_ceil(block))
        .into_par_iter()
        .map_init(
            || (Collect::default(), Collect::default()),
            |(x, y), index| {
                let range = index * block..((index + 1) * block).min(rows);
                fill(a, range.clone(), cols, rows, x, progress)?;
                fill(b, range, cols, rows, y, progress)?;
                Ok::<_, String>(super::sums_of_collected(x, y))
            },
        )
        .collect::<Result<Vec<Sums>, String>>()?;
    // Merged in order, as the stored tensors' chunks are: reduced as the workers split the
    // blocks, the sums were grouped differently from run to run.
    let mut total = Sums::default();
    for part in &parts {
        total.merge(part);
    }
    Ok(Some(total.finish()))
}

/// Decodes rows `range` of a side of `rows` rows and `cols` columns into `out`.
fn fill(
    values: &Values<'_>,
    range: Range<usize>,
    cols: usize,
    rows: usize,
    out: &mut Collect,
    progress: &AtomicU64,
) -> Result<(), String> {
    out.clear();
    match values {
        Values::Dequantized { kernel, bytes } => {
            out.narrow.resize(range.len() * cols, 0.0);
            kernel.dequantize_rows(range.clone(), &mut out.narrow);
            let share = u128::from(*bytes) * range.len() as u128 / rows.max(1) as u128;
            progress.fetch_add(u64::try_from(share).unwrap_or(0), Ordering::Relaxed);
        }
        Values::Stored { bytes, dtype } => {
            let bits = u64::from(dtype.bits());
            let first = (range.start * cols) as u64 * bits;
            let len = (range.len() * cols) as u64 * bits;
            if !first.is_multiple_of(8) || !len.is_multiple_of(8) {
                return Err(format!(
                    "{} values do not end on a byte at a row",
                    dtype.name()
                ));
            }
            bytes.with(first / 8, len / 8, |stored| {
                values::feed(*dtype, stored, out);
            })?;
            progress.fetch_add(len / 8, Ordering::Relaxed);
        }
    }
    Ok(())
}
