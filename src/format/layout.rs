//! Checks of where tensors lie in the data section: the reference's strict walk, and a lenient
//! walk that names every hole, overlap and size problem instead of stopping at the first.

use super::{LENGTH_PREFIX, Rejection, Tensor, TensorInfo};
use crate::finding::{Code, Finding, Findings};
use crate::text::{Shape, escape, format_bytes};

/// Tensor indices in data order: by `(begin, end)`, ties broken by name so results are stable.
pub fn data_order(tensors: &[Tensor]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_unstable_by(|&a, &b| {
        let (a, b) = (&tensors[a].info, &tensors[b].info);
        a.data_offsets
            .cmp(&b.data_offsets)
            .then_with(|| a.name.cmp(&b.name))
    });
    order
}

/// The reference's semantic validation (its `Metadata::validate` and coverage check), with every
/// sum checked. `order` is [`data_order`]. Every dtype must be known (an unknown one is rejected
/// earlier, with the header).
pub fn strict_check(
    tensors: &[Tensor],
    order: &[usize],
    header_len: u64,
    file_len: u64,
) -> Result<(), Rejection> {
    let mut cursor = 0u64;
    for &index in order {
        let tensor = &tensors[index].info;
        let [begin, end] = tensor.data_offsets;
        if begin != cursor || end < begin {
            return Err(Rejection::InvalidOffset(tensor.name.to_string()));
        }
        cursor = end;
        let count = tensor
            .element_count()
            .ok_or(Rejection::ValidationOverflow)?;
        let bits = tensor
            .dtype
            .known()
            .and_then(|dtype| count.checked_mul(u64::from(dtype.bits())))
            .ok_or(Rejection::ValidationOverflow)?;
        if bits % 8 != 0 {
            return Err(Rejection::MisalignedSlice);
        }
        if end - begin != bits / 8 {
            return Err(Rejection::TensorInvalidInfo);
        }
    }
    let covered = cursor
        .checked_add(LENGTH_PREFIX)
        .and_then(|sum| sum.checked_add(header_len));
    if covered == Some(file_len) {
        Ok(())
    } else {
        Err(Rejection::MetadataIncompleteBuffer)
    }
}

/// Every layout problem, each a finding. `data_len` is how many bytes the file really holds after
/// the header.
pub fn lenient_check(tensors: &[Tensor], order: &[usize], data_len: u64) -> Findings {
    let mut findings = Findings::new();
    let mut cursor = 0u64;
    let mut previous: Option<&TensorInfo> = None;
    let mut past_end = 0usize;
    for &index in order {
        let tensor = &tensors[index].info;
        let name = tensor.name.as_str();
        let [begin, end] = tensor.data_offsets;
        let error = |code, message: String| Finding::error(code, message).for_tensor(name);

        if end < begin {
            findings.push(error(
                Code::OffsetReversed,
                format!("data_offsets [{begin}, {end}] end before they begin"),
            ));
        } else if begin > cursor {
            let after = previous.map_or_else(
                || "the start of the data section".to_owned(),
                |p| format!("`{}`", escape(&p.name)),
            );
            findings.push(error(
                Code::OffsetGap,
                format!(
                    "data bytes {cursor}..{begin} ({}) between {after} and this tensor belong to no tensor",
                    format_bytes(begin - cursor)
                ),
            ));
        } else if begin < cursor
            && let Some(previous) = previous
        {
            let overlap = cursor.min(end) - begin;
            let what = if previous.data_offsets == tensor.data_offsets {
                "shares its whole byte range with".to_owned()
            } else {
                format!("overlaps by {}", format_bytes(overlap.max(1)))
            };
            findings.push(error(
                Code::OffsetOverlap,
                format!(
                    "data_offsets [{begin}, {end}] {what} `{}`",
                    escape(&previous.name)
                ),
            ));
        }
        if end >= begin {
            cursor = cursor.max(end);
        }
        previous = Some(tensor);

        if let Some(finding) = size_problem(tensor) {
            findings.push(finding);
        }
        if end > data_len {
            past_end += 1;
            if past_end <= 1 {
                findings.push(error(
                    Code::OffsetPastEnd,
                    format!(
                        "data ends {} past the end of the file",
                        format_bytes(end - data_len)
                    ),
                ));
            }
        }
    }
    if past_end > 1 {
        findings.push(Finding::error(
            Code::OffsetPastEnd,
            format!("{past_end} tensors in all end past the end of the file"),
        ));
    }
    match data_len.cmp(&cursor) {
        std::cmp::Ordering::Less => findings.push(Finding::error(
            Code::DataTruncated,
            format!(
                "the file ends {} before the last tensor's data does ({data_len} of {cursor} data \
                 bytes present): a truncated download or copy",
                format_bytes(cursor - data_len)
            ),
        )),
        std::cmp::Ordering::Greater => findings.push(Finding::error(
            Code::TrailingBytes,
            format!(
                "{} after the last tensor's data belong to no tensor (appended data, or a \
                 header that lost entries)",
                format_bytes(data_len - cursor)
            ),
        )),
        std::cmp::Ordering::Equal => {}
    }
    findings
}

fn size_problem(tensor: &TensorInfo) -> Option<Finding> {
    let dtype = tensor.dtype.known()?;
    let name = tensor.name.as_str();
    let shape = Shape(&tensor.shape);
    let Some(bits) = tensor
        .element_count()
        .and_then(|count| count.checked_mul(u64::from(dtype.bits())))
    else {
        return Some(
            Finding::error(
                Code::ShapeOverflow,
                format!("{dtype} {shape} needs more than 2^64 bits; the size cannot be computed"),
            )
            .for_tensor(name),
        );
    };
    if bits % 8 != 0 {
        return Some(
            Finding::error(
                Code::SubByteMisaligned,
                format!(
                    "{dtype} {shape} is {bits} bits, not a whole number of bytes; packed \
                     sub-byte tensors must fill their last byte"
                ),
            )
            .for_tensor(name),
        );
    }
    let [begin, end] = tensor.data_offsets;
    let needed = bits / 8;
    (end >= begin && end - begin != needed).then(|| {
        Finding::error(
            Code::SizeMismatch,
            format!(
                "{dtype} {shape} needs {needed} bytes but data_offsets [{begin}, {end}] span {}",
                end - begin
            ),
        )
        .for_tensor(name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Dtype;

    fn tensor(name: &str, dtype: Dtype, shape: &[u64], offsets: [u64; 2]) -> Tensor {
        TensorInfo {
            name: name.into(),
            dtype: dtype.into(),
            shape: shape.into(),
            data_offsets: offsets,
        }
        .into()
    }

    fn check(tensors: &[Tensor], data_len: u64) -> (Result<(), Rejection>, Vec<&'static str>) {
        let order = data_order(tensors);
        let strict = strict_check(tensors, &order, 8, 16 + data_len);
        let codes = lenient_check(tensors, &order, data_len)
            .iter()
            .map(|f| f.code.as_str())
            .collect();
        (strict, codes)
    }

    #[test]
    fn a_packed_layout_passes_both_checks() {
        let tensors = [
            tensor("b", Dtype::F32, &[2], [0, 8]),
            tensor("empty", Dtype::F32, &[0, 4], [8, 8]),
            tensor("a", Dtype::F4, &[2, 1], [8, 9]),
        ];
        assert_eq!(check(&tensors, 9), (Ok(()), vec![]));
    }

    #[test]
    fn holes_overlaps_and_sizes_are_all_listed() {
        let tensors = [
            tensor("a", Dtype::F32, &[1], [0, 4]),
            tensor("b", Dtype::F32, &[1], [8, 12]),
            tensor("c", Dtype::F32, &[2], [10, 18]),
            tensor("d", Dtype::F4, &[3], [18, 20]),
        ];
        let (strict, codes) = check(&tensors, 20);
        assert_eq!(strict, Err(Rejection::InvalidOffset("b".into())));
        assert_eq!(
            codes,
            ["offset-gap", "offset-overlap", "sub-byte-misaligned"]
        );
    }

    #[test]
    fn coverage_reports_truncation_and_trailing_bytes() {
        let tensors = [tensor("a", Dtype::U8, &[10], [0, 10])];
        assert_eq!(
            check(&tensors, 6),
            (
                Err(Rejection::MetadataIncompleteBuffer),
                vec!["offset-past-end", "data-truncated"]
            )
        );
        assert_eq!(
            check(&tensors, 14),
            (
                Err(Rejection::MetadataIncompleteBuffer),
                vec!["trailing-bytes"]
            )
        );
    }

    #[test]
    fn the_coverage_sum_cannot_overflow() {
        let step = (1u64 << 61) - 1;
        let tensors: Vec<_> = (0..8)
            .map(|i| {
                tensor(
                    &format!("t{i}"),
                    Dtype::U8,
                    &[step],
                    [i * step, (i + 1) * step],
                )
            })
            .collect();
        let order = data_order(&tensors);
        assert_eq!(
            strict_check(&tensors, &order, 8, 100),
            Err(Rejection::MetadataIncompleteBuffer)
        );
    }

    #[test]
    fn overflow_is_checked_left_to_right() {
        let hidden = tensor("a", Dtype::F32, &[0, 1 << 63, 4], [0, 0]);
        assert_eq!(check(std::slice::from_ref(&hidden), 0), (Ok(()), vec![]));
        let visible = tensor("a", Dtype::F32, &[1 << 63, 4, 0], [0, 0]);
        assert_eq!(
            check(&[visible], 0),
            (Err(Rejection::ValidationOverflow), vec!["shape-overflow"])
        );
    }
}
