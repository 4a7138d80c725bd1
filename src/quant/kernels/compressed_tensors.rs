//! compressed-tensors (vLLM, llm-compressor): naive/int/float-quantized, pack-quantized and the
//! NVFP4, MXFP4 and MXFP8 formats.
//!
//! `W = (q − zp) · s` with `s`, `zp` chosen by the strategy (`forward_helpers.py _dequantize`:
//! the code is cast to the scale's dtype, the zero point subtracted, then multiplied by the
//! scale; a global scale first divides the scale).

use super::bits::Packing;
use super::decode::{FloatKind, Floats};
use super::grouped::{
    Checks, Codes, Grid, Grouped, Groups, Half, PackedCodes, PackedZeros, Source, Value,
};
use super::{
    FLOAT_SCALES, KernelError, Stored, e8m0_scales, floats, grouped_layout, matrix, scalar,
    with_experts,
};
use crate::format::Dtype;

/// How a weight's scales are laid out (`strategy` in the quantization args).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// One scale: `[1]`.
    Tensor,
    /// One scale per output row: `[out, 1]`.
    Channel,
    /// One scale per row and `size` columns: `[out, ⌈in/size⌉]` (also `tensor_group`).
    Group { size: usize },
    /// One scale per `rows × cols` block: `[⌈out/rows⌉, ⌈in/cols⌉]`.
    Block { rows: usize, cols: usize },
}

/// The groups and the scale grid's shape and strides of a strategy, checked against `scale`.
struct Layout {
    groups: Groups,
    /// The scale member's shape (without the experts' dimension).
    shape: Vec<usize>,
    row_stride: usize,
    group_stride: usize,
}

fn layout(
    strategy: Strategy,
    rows: usize,
    cols: usize,
    g_idx: Option<&Stored<'_>>,
) -> Result<Layout, KernelError> {
    let tiles = |r: usize, c: usize| Groups::Tiles {
        rows: r,
        cols: c,
        expert_rows: rows,
    };
    Ok(match strategy {
        Strategy::Tensor => Layout {
            groups: tiles(rows.max(1), cols.max(1)),
            shape: vec![1],
            row_stride: 0,
            group_stride: 0,
        },
        Strategy::Channel => Layout {
            groups: tiles(1, cols.max(1)),
            shape: vec![rows, 1],
            row_stride: 1,
            group_stride: 0,
        },
        Strategy::Group { size } => {
            if size == 0 {
                return Err(KernelError::new("weight_scale", "group size 0"));
            }
            let count = cols.div_ceil(size);
            let groups = match g_idx {
                Some(g_idx) => group_index(g_idx, cols, count)?
                    .map_or_else(|| tiles(1, size), |index| Groups::Indexed { index, count }),
                None => tiles(1, size),
            };
            Layout {
                groups,
                shape: vec![rows, count],
                row_stride: count,
                group_stride: 1,
            }
        }
        Strategy::Block { rows: r, cols: c } => {
            if r == 0 || c == 0 {
                return Err(KernelError::new("weight_scale", "block of size 0"));
            }
            Layout {
                groups: tiles(r, c),
                shape: vec![rows.div_ceil(r), cols.div_ceil(c)],
                row_stride: cols.div_ceil(c),
                group_stride: 1,
            }
        }
    })
}

/// `weight_g_idx` read: `None` when it holds a −1 (no act-order: compressed-tensors then uses
/// `i // g`) or is exactly `i // size` anyway.
fn group_index(
    g_idx: &Stored<'_>,
    cols: usize,
    count: usize,
) -> Result<Option<Vec<u32>>, KernelError> {
    g_idx.check_shape("weight_g_idx", &[Dtype::I32], &[cols])?;
    let values: Vec<i32> = g_idx
        .bytes
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    if values.contains(&-1) {
        return Ok(None);
    }
    let index = values
        .iter()
        .enumerate()
        .map(|(i, &g)| {
            u32::try_from(g)
                .ok()
                .filter(|&g| (g as usize) < count)
                .ok_or_else(|| {
                    KernelError::new(
                        "weight_g_idx",
                        format!("column {i} in group {g}, of {count} groups"),
                    )
                })
        })
        .collect::<Result<Vec<u32>, _>>()?;
    Ok(Some(index))
}

/// Checks a parameter member laid out like the scales.
fn check_like_scale(
    member: &'static str,
    stored: &Stored<'_>,
    dtypes: &[Dtype],
    experts: Option<usize>,
    shape: &[usize],
) -> Result<(), KernelError> {
    if shape == [1] {
        return stored.check_scalar(member, dtypes);
    }
    match stored.check_shape(member, dtypes, &with_experts(experts, shape)) {
        // `[out]` for a channel scale, as some exporters write it.
        Err(error) if shape.len() == 2 && shape[1] == 1 => stored
            .check_shape(member, dtypes, &with_experts(experts, &shape[..1]))
            .map_err(|_| error),
        result => result,
    }
}

/// The experts of a 3-D weight (`Some`) or `None` for a 2-D one.
fn experts_of(weight: &Stored<'_>) -> Option<usize> {
    (weight.shape.len() == 3).then(|| weight.dim(0))
}

/// naive-quantized, int-quantized and float-quantized: an I8 or FP8 `weight` with its scale
/// (and, asymmetric, its zero point), every strategy, act-order through `weight_g_idx`.
#[derive(Clone, Debug)]
pub struct Naive<'a> {
    inner: Grouped<'a>,
}
grouped_layout!(Naive);

impl<'a> Naive<'a> {
    /// `bits` is the int codes' width (2 to 8, stored in I8) for the zero points' range; FP8
    /// weights ignore it.
    pub fn new(
        weight: Stored<'a>,
        weight_scale: Stored<'a>,
        weight_zero_point: Option<Stored<'a>>,
        weight_g_idx: Option<Stored<'a>>,
        strategy: Strategy,
        bits: u32,
    ) -> Result<Self, KernelError> {
        let inner = scaled(
            weight,
            ("weight_scale", weight_scale, &FLOAT_SCALES),
            weight_zero_point,
            weight_g_idx,
            strategy,
            bits,
        )?;
        Ok(Naive { inner })
    }
}

/// A weight of one byte per element (I8 or FP8) times scales laid out by `strategy`: the
/// naive formats here, and the FP8 checkpoints (`fp8.rs`). Scales of U8 dtype are E8M0.
pub(super) fn scaled<'a>(
    weight: Stored<'a>,
    (scale_member, scale, scale_dtypes): (&'static str, Stored<'a>, &[Dtype]),
    zero_point: Option<Stored<'a>>,
    g_idx: Option<Stored<'a>>,
    strategy: Strategy,
    bits: u32,
) -> Result<Grouped<'a>, KernelError> {
    weight.check("weight", &[Dtype::I8, Dtype::F8E4M3, Dtype::F8E5M2])?;
    let (experts, rows, cols) = matrix("weight", &weight)?;
    let value = match weight.dtype {
        Dtype::I8 => Value::Signed,
        Dtype::F8E4M3 => Value::E4M3,
        _ => Value::E5M2,
    };
    if value == Value::Signed && !(1..=8).contains(&bits) {
        return Err(KernelError::new("weight", format!("{bits} bits in I8")));
    }
    let layout = layout(strategy, rows, cols, g_idx.as_ref())?;
    let e = experts_of(&weight);
    check_like_scale(scale_member, &scale, scale_dtypes, e, &layout.shape)?;
    let grid = |values| Grid {
        values,
        row_stride: layout.row_stride,
        group_stride: layout.group_stride,
    };
    let zeros = match zero_point {
        Some(zp) => {
            let dtypes = [Dtype::I8, Dtype::I32, Dtype::F32, Dtype::Bf16, Dtype::F16];
            check_like_scale("weight_zero_point", &zp, &dtypes, e, &layout.shape)?;
            Some((
                grid(Source::Stored(floats("weight_zero_point", &zp)?)),
                "weight_zero_point",
            ))
        }
        None => None,
    };
    let scales = if scale.dtype == Dtype::U8 {
        Floats::new(scale.bytes, FloatKind::E8M0)
    } else {
        floats(scale_member, &scale)?
    };
    let half = f32::from(1u16 << (bits.clamp(1, 8) - 1));
    Ok(Grouped {
        rows: experts * rows,
        cols,
        experts,
        codes: Codes::Bytes(weight.bytes),
        value,
        groups: layout.groups.clone(),
        scales: grid(Source::Stored(scales)),
        scale_member,
        zeros,
        biases: None,
        factor: None,
        rounding: Half::of(scale.dtype),
        checks: Checks {
            negative_scales: false,
            zero_range: Some((-half, half - 1.0)),
        },
    })
}

/// pack-quantized: int codes of 1 to 8 bits packed into I32 `weight_packed`, with
/// `weight_shape`, scales, and for asymmetric schemes zero points (packed down the rows in I32
/// since 0.10, unpacked I8 before).
#[derive(Clone, Debug)]
pub struct Packed<'a> {
    inner: Grouped<'a>,
}
grouped_layout!(Packed);

/// Members of a pack-quantized weight.
#[derive(Clone, Copy, Debug)]
pub struct PackedMembers<'a> {
    pub weight_packed: Stored<'a>,
    pub weight_shape: Stored<'a>,
    pub weight_scale: Stored<'a>,
    pub weight_zero_point: Option<Stored<'a>>,
    pub weight_g_idx: Option<Stored<'a>>,
}

impl Packing {
    /// The packing of `count` codes of `bits` bits in `words` words: the dense one (0.17 and
    /// later) or the per-word one (before). `None` when neither width fits, or both do and they
    /// place the codes differently (then the compressed-tensors version decides).
    pub fn of_width(bits: u32, count: usize, words: usize) -> Option<Packing> {
        let dense = Packing::Dense.words(bits, count) == words;
        let per_word = Packing::PerWord.words(bits, count) == words;
        match (dense, per_word) {
            (true, true) if 32 % bits == 0 || count <= 32 / bits as usize => Some(Packing::Dense),
            (true, false) => Some(Packing::Dense),
            (false, true) => Some(Packing::PerWord),
            _ => None,
        }
    }
}

impl<'a> Packed<'a> {
    /// `packing` is needed only where the width does not tell (see [`Packing::of_width`]).
    pub fn new(
        members: PackedMembers<'a>,
        bits: u32,
        strategy: Strategy,
        packing: Option<Packing>,
    ) -> Result<Self, KernelError> {
        if !(1..=8).contains(&bits) {
            return Err(KernelError::new("weight_packed", format!("{bits} bits")));
        }
        let PackedMembers {
            weight_packed,
            weight_shape,
            weight_scale,
            weight_zero_point,
            weight_g_idx,
        } = members;
        weight_packed.check("weight_packed", &[Dtype::I32])?;
        let (experts, rows, words) = matrix("weight_packed", &weight_packed)?;
        let e = experts_of(&weight_packed);
        let shape = logical_shape(&weight_shape)?;
        if shape[..shape.len() - 1] != with_experts(e, &[rows]) {
            return Err(KernelError::new(
                "weight_shape",
                format!(
                    "{shape:?} disagrees with weight_packed {:?}",
                    weight_packed.shape
                ),
            ));
        }
        let cols = shape[shape.len() - 1];
        let packing = resolve_packing(packing, bits, cols, words)?;
        let layout = layout(strategy, rows, cols, weight_g_idx.as_ref())?;
        check_like_scale(
            "weight_scale",
            &weight_scale,
            &FLOAT_SCALES,
            e,
            &layout.shape,
        )?;
        let grid = |values| Grid {
            values,
            row_stride: layout.row_stride,
            group_stride: layout.group_stride,
        };
        let offset = f32::from(1u8 << (bits - 1));
        let zeros = match weight_zero_point {
            Some(zp) if zp.dtype == Dtype::I32 && layout.shape != [1] => {
                let groups = layout.shape[1..].iter().product::<usize>().max(1);
                let zp_words = packing.words(bits, rows);
                let expected = with_experts(e, &[zp_words, groups]);
                zp.check_shape("weight_zero_point", &[Dtype::I32], &expected)?;
                Some(Grid {
                    values: Source::Packed(PackedCodes {
                        bytes: zp.bytes,
                        bits,
                        packing,
                        offset,
                        layout: PackedZeros::DownRows {
                            words: zp_words,
                            groups,
                            expert_rows: rows,
                        },
                    }),
                    row_stride: 0,
                    group_stride: 0,
                })
            }
            Some(zp) => {
                check_like_scale(
                    "weight_zero_point",
                    &zp,
                    &[Dtype::I8, Dtype::I32],
                    e,
                    &layout.shape,
                )?;
                Some(grid(Source::Stored(floats("weight_zero_point", &zp)?)))
            }
            None => None,
        };
        Ok(Packed {
            inner: Grouped {
                rows: experts * rows,
                cols,
                experts,
                codes: Codes::Rows {
                    bytes: weight_packed.bytes,
                    bits,
                    packing,
                    row_bytes: 4 * words,
                },
                value: Value::Unsigned { bits, offset },
                groups: layout.groups.clone(),
                scales: grid(Source::Stored(floats("weight_scale", &weight_scale)?)),
                scale_member: "weight_scale",
                zeros: zeros.map(|z| (z, "weight_zero_point")),
                biases: None,
                factor: None,
                rounding: Half::of(weight_scale.dtype),
                checks: Checks {
                    negative_scales: false,
                    zero_range: Some((-offset, offset - 1.0)),
                },
            },
        })
    }
}

/// The packing given, checked against the width, or the one the width tells.
fn resolve_packing(
    packing: Option<Packing>,
    bits: u32,
    cols: usize,
    words: usize,
) -> Result<Packing, KernelError> {
    match packing {
        Some(packing) if packing.words(bits, cols) == words => Ok(packing),
        Some(packing) => Err(KernelError::new(
            "weight_packed",
            format!(
                "{words} words a row, {packing:?} packing of {cols} {bits}-bit codes takes {}",
                packing.words(bits, cols)
            ),
        )),
        None => Packing::of_width(bits, cols, words).ok_or_else(|| {
            KernelError::new(
                "weight_packed",
                format!(
                    "{words} words a row fit {cols} {bits}-bit codes in {}",
                    if Packing::Dense.words(bits, cols) == words {
                        "both the dense and the per-word packing: the version decides"
                    } else {
                        "neither the dense nor the per-word packing"
                    }
                ),
            )
        }),
    }
}

/// `weight_shape`'s values (I64, or I32 in older writers): 2 or 3 dimensions.
fn logical_shape(stored: &Stored<'_>) -> Result<Vec<usize>, KernelError> {
    stored.check("weight_shape", &[Dtype::I64, Dtype::I32])?;
    let size = if stored.dtype == Dtype::I64 { 8 } else { 4 };
    let values: Vec<i64> = stored
        .bytes
        .chunks_exact(size)
        .map(|b| {
            let mut word = [0u8; 8];
            word[..size].copy_from_slice(b);
            if size == 4 {
                i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            } else {
                i64::from_le_bytes(word)
            }
        })
        .collect();
    let shape: Option<Vec<usize>> = values.iter().map(|&d| usize::try_from(d).ok()).collect();
    match shape {
        Some(shape) if (2..=3).contains(&shape.len()) => Ok(shape),
        _ => Err(KernelError::new(
            "weight_shape",
            format!("holds {values:?}, expected 2 or 3 dimensions"),
        )),
    }
}

/// FP4 (E2M1) codes two to a byte, the first in the low nibble, with per-group scales.
pub(super) fn fp4<'a>(
    member: &'static str,
    packed: &Stored<'_>,
    bytes: &'a [u8],
    cols: usize,
    group: usize,
    scales: Source<'a>,
    scale_member: &'static str,
) -> Result<Grouped<'a>, KernelError> {
    packed.check(member, &[Dtype::U8])?;
    let (experts, rows, row_bytes) = matrix(member, packed)?;
    if cols.div_ceil(2) != row_bytes {
        return Err(KernelError::new(
            member,
            format!("{row_bytes} bytes a row do not hold {cols} FP4 codes"),
        ));
    }
    Ok(Grouped {
        rows: experts * rows,
        cols,
        experts,
        codes: Codes::Rows {
            bytes,
            bits: 4,
            packing: Packing::Dense,
            row_bytes,
        },
        value: Value::E2M1,
        groups: Groups::Tiles {
            rows: 1,
            cols: group,
            expert_rows: rows,
        },
        scales: Grid {
            values: scales,
            row_stride: cols.div_ceil(group),
            group_stride: 1,
        },
        scale_member,
        zeros: None,
        biases: None,
        factor: None,
        rounding: None,
        checks: Checks {
            negative_scales: false,
            zero_range: None,
        },
    })
}

/// Checks a `[…, rows, ⌈cols/group⌉]` scale member beside an FP4 or FP8 weight.
pub(super) fn check_group_scales(
    member: &'static str,
    scale: &Stored<'_>,
    inner: &Grouped<'_>,
    group: usize,
    dtypes: &[Dtype],
) -> Result<(), KernelError> {
    let experts = (inner.experts > 1 || scale.shape.len() == 3).then_some(inner.experts);
    let shape = with_experts(
        experts,
        &[inner.rows / inner.experts, inner.cols.div_ceil(group)],
    );
    scale.check_shape(member, dtypes, &shape)
}

/// nvfp4-pack-quantized: `W = v · (fp8(weight_scale) / weight_global_scale)`, groups of 16,
/// the quotient in F32 and the product rounded to BF16: the decompressor unpacks the codes
/// to BF16 and casts its result back to their type (`nvfp4/base.py decompress`).
#[derive(Clone, Debug)]
pub struct Nvfp4<'a> {
    inner: Grouped<'a>,
}
grouped_layout!(Nvfp4);

impl<'a> Nvfp4<'a> {
    /// `cols` is the logical width (`weight_shape`'s last value, or twice the packed width).
    pub fn new(
        weight_packed: Stored<'a>,
        weight_scale: Stored<'a>,
        weight_global_scale: Stored<'a>,
        cols: usize,
    ) -> Result<Self, KernelError> {
        let global = scalar("weight_global_scale", &weight_global_scale, &[Dtype::F32])?;
        let scales = Source::Divided(Floats::new(weight_scale.bytes, FloatKind::E4M3), global);
        let mut inner = fp4(
            "weight_packed",
            &weight_packed,
            weight_packed.bytes,
            cols,
            16,
            scales,
            "weight_scale",
        )?;
        check_group_scales("weight_scale", &weight_scale, &inner, 16, &[Dtype::F8E4M3])?;
        inner.rounding = Some(Half::Bf16);
        Ok(Nvfp4 { inner })
    }
}

/// mxfp4-pack-quantized: `W = v · 2^(s − 127)`, groups of 32, E8M0 scales in U8.
#[derive(Clone, Debug)]
pub struct Mxfp4<'a> {
    inner: Grouped<'a>,
}
grouped_layout!(Mxfp4);

impl<'a> Mxfp4<'a> {
    pub fn new(
        weight_packed: Stored<'a>,
        weight_scale: Stored<'a>,
        cols: usize,
    ) -> Result<Self, KernelError> {
        let scales = Source::Stored(e8m0_scales("weight_scale", &weight_scale)?);
        let inner = fp4(
            "weight_packed",
            &weight_packed,
            weight_packed.bytes,
            cols,
            32,
            scales,
            "weight_scale",
        )?;
        check_group_scales(
            "weight_scale",
            &weight_scale,
            &inner,
            32,
            &[Dtype::U8, Dtype::F8E8M0],
        )?;
        Ok(Mxfp4 { inner })
    }
}

/// mxfp8-quantized: an `F8_E4M3` `weight`, `W = fp8 · 2^(s − 127)`, groups of 32.
#[derive(Clone, Debug)]
pub struct Mxfp8<'a> {
    inner: Grouped<'a>,
}
grouped_layout!(Mxfp8);

impl<'a> Mxfp8<'a> {
    pub fn new(weight: Stored<'a>, weight_scale: Stored<'a>) -> Result<Self, KernelError> {
        weight.check("weight", &[Dtype::F8E4M3])?;
        let (experts, rows, cols) = matrix("weight", &weight)?;
        let inner = Grouped {
            rows: experts * rows,
            cols,
            experts,
            codes: Codes::Bytes(weight.bytes),
            value: Value::E4M3,
            groups: Groups::Tiles {
                rows: 1,
                cols: 32,
                expert_rows: rows,
            },
            scales: Grid {
                values: Source::Stored(e8m0_scales("weight_scale", &weight_scale)?),
                row_stride: cols.div_ceil(32),
                group_stride: 1,
            },
            scale_member: "weight_scale",
            zeros: None,
            biases: None,
            factor: None,
            rounding: None,
            checks: Checks {
                negative_scales: false,
                zero_range: None,
            },
        };
        check_group_scales(
            "weight_scale",
            &weight_scale,
            &inner,
            32,
            &[Dtype::U8, Dtype::F8E8M0],
        )?;
        Ok(Mxfp8 { inner })
    }
}

#[cfg(test)]
mod tests {
    #![expect(
        clippy::cast_possible_truncation,
        clippy::cast_possible_wrap,
        clippy::cast_sign_loss,
        clippy::similar_names,
        clippy::type_complexity,
        clippy::needless_range_loop,
        reason = "fixtures of small, known sizes and values"
    )]
    use super::super::testing::{
        Owned, Rng, assert_same, dequantize_all, e2m1_encode, e2m1_value, e4m3_encode, e4m3_value,
        e8m0_value, pack, round_to, word_bytes,
    };
    use super::super::{Dequantize, Problem};
    use super::*;
    use proptest::prelude::{
        Just, ProptestConfig, TestCaseError, any, prop_assert_eq, prop_oneof, proptest,
    };

    /// A weight quantized as compressed-tensors does (`calculate_qparams`, `_quantize`), per
    /// row and group of `group` columns: codes, scales as stored, zero points.
    struct Quantized {
        q: Vec<i32>,
        scales: Owned,
        zeros: Vec<i32>,
        groups: usize,
    }

    fn quantize(
        w: &[f32],
        (rows, cols): (usize, usize),
        group: usize,
        bits: u32,
        symmetric: bool,
        scale_dtype: Dtype,
    ) -> Quantized {
        let (qmin, qmax) = (-(1i32 << (bits - 1)), (1i32 << (bits - 1)) - 1);
        let groups = cols.div_ceil(group);
        let (mut scales, mut zeros) = (vec![], vec![]);
        for o in 0..rows {
            for g in 0..groups {
                let run = &w[o * cols + g * group..o * cols + ((g + 1) * group).min(cols)];
                let min = run.iter().copied().fold(0f32, f32::min);
                let max = run.iter().copied().fold(0f32, f32::max);
                let (scale, zero) = if symmetric {
                    (max.abs().max(min.abs()) / ((qmax - qmin) as f32 / 2.0), 0)
                } else {
                    let scale = (max - min) / (qmax - qmin) as f32;
                    let zero = (qmin as f32 - min / scale).round() as i32;
                    (scale, zero.clamp(qmin, qmax))
                };
                scales.push(if scale == 0.0 { 1.0 } else { scale });
                zeros.push(zero);
            }
        }
        let scales = Owned::floats(scale_dtype, &[rows, groups], &scales);
        let q = (0..rows * cols)
            .map(|k| {
                let (o, i) = (k / cols, k % cols);
                let cell = o * groups + i / group;
                let scaled = w[k] / scales.float(cell) + zeros[cell] as f32;
                (scaled.round() as i32).clamp(qmin, qmax)
            })
            .collect();
        Quantized {
            q,
            scales,
            zeros,
            groups,
        }
    }

    /// `(q − zp) · s` by hand, rounded to the scale's type.
    fn reference(
        quantized: &Quantized,
        cols: usize,
        group_of: impl Fn(usize) -> usize,
        with_zeros: bool,
    ) -> Vec<f32> {
        (0..quantized.q.len())
            .map(|k| {
                let cell = (k / cols) * quantized.groups + group_of(k % cols);
                let zero = if with_zeros { quantized.zeros[cell] } else { 0 };
                let product = (quantized.q[k] - zero) as f32 * quantized.scales.float(cell);
                round_to(quantized.scales.dtype, product)
            })
            .collect()
    }

    fn weights(rng: &mut Rng, count: usize) -> Vec<f32> {
        (0..count).map(|_| rng.signed() * 0.05).collect()
    }

    #[test]
    fn int8_groups_with_zero_points_and_a_partial_last_group() {
        let (rows, cols, group) = (3, 40, 16);
        let w = weights(&mut Rng::new(1), rows * cols);
        let quantized = quantize(&w, (rows, cols), group, 8, false, Dtype::Bf16);
        let weight = Owned::i8(
            &[rows, cols],
            &quantized.q.iter().map(|&q| q as i8).collect::<Vec<_>>(),
        );
        let zeros: Vec<i8> = quantized.zeros.iter().map(|&z| z as i8).collect();
        let zero_point = Owned::i8(&[rows, quantized.groups], &zeros);
        let kernel = Naive::new(
            weight.stored(),
            quantized.scales.stored(),
            Some(zero_point.stored()),
            None,
            Strategy::Group { size: group },
            8,
        )
        .unwrap();
        let expected = reference(&quantized, cols, |i| i / group, true);
        assert_same(&dequantize_all(&kernel), &expected, cols);
        // Within a step of the source everywhere (half a step but where the zero point rounds
        // the range's edge past the clamp).
        for (k, (&x, &y)) in w.iter().zip(&expected).enumerate() {
            let step = quantized.scales.float((k / cols) * 3 + (k % cols) / group);
            assert!((x - y).abs() <= step * 1.01, "element {k}");
        }
    }

    #[test]
    fn act_order_reads_each_column_s_group_from_g_idx() {
        let (rows, cols, group) = (2, 12, 4);
        let w = weights(&mut Rng::new(2), rows * cols);
        // Columns assigned to groups out of order, as act-order writes them.
        let g_idx: Vec<i32> = vec![2, 0, 1, 2, 0, 1, 1, 2, 0, 0, 2, 1];
        let mut quantized = quantize(&w, (rows, cols), group, 4, true, Dtype::F32);
        let scales: Vec<f32> = (0..rows * 3).map(|k| 0.01 * (k + 1) as f32).collect();
        quantized.scales = Owned::f32(&[rows, 3], &scales);
        quantized.q = (0..rows * cols).map(|k| (k as i32 % 16) - 8).collect();
        let weight = Owned::i8(
            &[rows, cols],
            &quantized.q.iter().map(|&q| q as i8).collect::<Vec<_>>(),
        );
        let g_idx_member = Owned::i32(&[cols], &g_idx);
        let kernel = Naive::new(
            weight.stored(),
            quantized.scales.stored(),
            None,
            Some(g_idx_member.stored()),
            Strategy::Group { size: group },
            4,
        )
        .unwrap();
        let expected = reference(&quantized, cols, |i| g_idx[i] as usize, false);
        assert_same(&dequantize_all(&kernel), &expected, cols);
        // A −1 in g_idx means no act-order: groups are `i / g`.
        let none = Owned::i32(&[cols], &[-1; 12]);
        let kernel = Naive::new(
            weight.stored(),
            quantized.scales.stored(),
            None,
            Some(none.stored()),
            Strategy::Group { size: group },
            4,
        )
        .unwrap();
        let expected = reference(&quantized, cols, |i| i / group, false);
        assert_same(&dequantize_all(&kernel), &expected, cols);
    }

    #[test]
    fn fp8_tensor_channel_and_block_strategies() {
        let (rows, cols) = (5, 7);
        let mut rng = Rng::new(3);
        let codes: Vec<u8> = (0..rows * cols)
            .map(|_| e4m3_encode(rng.signed() * 448.0))
            .collect();
        let weight = Owned::new(Dtype::F8E4M3, &[rows, cols], codes.clone());
        let cases: [(Strategy, Vec<usize>, Box<dyn Fn(usize, usize) -> usize>); 3] = [
            (Strategy::Tensor, vec![1], Box::new(|_, _| 0)),
            (Strategy::Channel, vec![rows, 1], Box::new(|o, _| o)),
            (
                Strategy::Block { rows: 2, cols: 3 },
                vec![3, 3],
                Box::new(|o, i| (o / 2) * 3 + i / 3),
            ),
        ];
        for (strategy, shape, cell) in cases {
            for dtype in [Dtype::F32, Dtype::Bf16] {
                let count: usize = shape.iter().product();
                let values: Vec<f32> = (0..count).map(|k| 1e-4 * (k as f32 + 1.5)).collect();
                let scale = Owned::floats(dtype, &shape, &values);
                let kernel =
                    Naive::new(weight.stored(), scale.stored(), None, None, strategy, 8).unwrap();
                let expected: Vec<f32> = (0..rows * cols)
                    .map(|k| {
                        let s = scale.float(cell(k / cols, k % cols));
                        round_to(dtype, e4m3_value(codes[k]) * s)
                    })
                    .collect();
                assert_same(&dequantize_all(&kernel), &expected, cols);
            }
        }
    }

    /// Packs `[experts, rows, cols]` codes row by row.
    fn pack_rows(packing: Packing, bits: u32, codes: &[u8], cols: usize) -> (Vec<u8>, usize) {
        let words = packing.words(bits, cols);
        let bytes = codes
            .chunks(cols)
            .flat_map(|row| word_bytes(&pack(packing, bits, row)))
            .collect();
        (bytes, words)
    }

    /// Packs zero points `[experts, rows, groups]` down the rows, per expert.
    fn pack_zeros(
        packing: Packing,
        bits: u32,
        zeros: &[u8],
        (experts, rows, groups): (usize, usize, usize),
    ) -> (Vec<i32>, usize) {
        let words = packing.words(bits, rows);
        let mut out = vec![0i32; experts * words * groups];
        for e in 0..experts {
            for g in 0..groups {
                let column: Vec<u8> = (0..rows)
                    .map(|o| zeros[(e * rows + o) * groups + g])
                    .collect();
                for (w, value) in pack(packing, bits, &column).into_iter().enumerate() {
                    out[(e * words + w) * groups + g] = value.cast_signed();
                }
            }
        }
        (out, words)
    }

    /// One pack-quantized case: random codes, scales and zero points, checked against the
    /// reference. `zeros`: none, packed I32, or unpacked I8.
    fn packed_case(
        (experts, rows, cols): (usize, usize, usize),
        bits: u32,
        group: usize,
        packing: Packing,
        zeros: Option<bool>,
        seed: u64,
    ) -> Result<(), TestCaseError> {
        let mut rng = Rng::new(seed);
        let total_rows = experts * rows;
        let groups = cols.div_ceil(group);
        let codes = rng.codes(bits, total_rows * cols);
        let (bytes, words) = pack_rows(packing, bits, &codes, cols);
        let dims = |last: usize| {
            if experts > 1 {
                vec![experts, rows, last]
            } else {
                vec![rows, last]
            }
        };
        let weight_packed = Owned::new(Dtype::I32, &dims(words), bytes);
        let shape_values: Vec<i64> = dims(cols).iter().map(|&d| d as i64).collect();
        let weight_shape = Owned::new(
            Dtype::I64,
            &[shape_values.len()],
            shape_values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        );
        let scale_values: Vec<f32> = (0..total_rows * groups)
            .map(|_| rng.signed().abs() * 0.01 + 1e-4)
            .collect();
        let scale = Owned::bf16(&dims(groups), &scale_values);
        let zero_codes = rng.codes(bits, total_rows * groups);
        let offset = 1i32 << (bits - 1);
        let zero_point = match zeros {
            Some(true) => {
                let (packed, zero_words) =
                    pack_zeros(packing, bits, &zero_codes, (experts, rows, groups));
                let shape = if experts > 1 {
                    vec![experts, zero_words, groups]
                } else {
                    vec![zero_words, groups]
                };
                Some(Owned::i32(&shape, &packed))
            }
            Some(false) => {
                let signed: Vec<i8> = zero_codes
                    .iter()
                    .map(|&u| (i32::from(u) - offset) as i8)
                    .collect();
                Some(Owned::i8(&dims(groups), &signed))
            }
            None => None,
        };
        let members = PackedMembers {
            weight_packed: weight_packed.stored(),
            weight_shape: weight_shape.stored(),
            weight_scale: scale.stored(),
            weight_zero_point: zero_point.as_ref().map(Owned::stored),
            weight_g_idx: None,
        };
        let kernel = Packed::new(
            members,
            bits,
            Strategy::Group { size: group },
            Some(packing),
        )
        .unwrap();
        prop_assert_eq!(kernel.rows(), total_rows);
        prop_assert_eq!(kernel.experts(), experts);
        let expected: Vec<f32> = (0..total_rows * cols)
            .map(|k| {
                let (r, i) = (k / cols, k % cols);
                let cell = r * groups + i / group;
                let q = i32::from(codes[k]) - offset;
                let zp = if zeros.is_some() {
                    i32::from(zero_codes[cell]) - offset
                } else {
                    0
                };
                round_to(Dtype::Bf16, (q - zp) as f32 * scale.float(cell))
            })
            .collect();
        assert_same(&dequantize_all(&kernel), &expected, cols);
        let mut counts = vec![0u64; 1 << bits];
        kernel.count_codes(0..total_rows, &mut counts);
        for level in 0..1usize << bits {
            let stored = codes.iter().filter(|&&c| usize::from(c) == level).count();
            prop_assert_eq!(counts[level], stored as u64);
        }
        Ok(())
    }

    #[test]
    fn three_bit_codes_and_zero_points_in_both_packings() {
        for packing in [Packing::Dense, Packing::PerWord] {
            for zeros in [None, Some(true), Some(false)] {
                packed_case((1, 37, 70), 3, 32, packing, zeros, 7).unwrap();
            }
        }
    }

    #[test]
    fn moe_weights_fold_experts_into_rows_with_zero_points_packed_per_expert() {
        packed_case((3, 5, 64), 4, 32, Packing::Dense, Some(true), 8).unwrap();
        packed_case((2, 11, 48), 5, 16, Packing::Dense, Some(true), 9).unwrap();
        packed_case((2, 11, 48), 6, 16, Packing::PerWord, Some(true), 10).unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn packing_then_the_kernel_gives_the_codes_values_back(
            bits in 1u32..=8,
            experts in 1usize..3,
            rows in 1usize..12,
            cols in 1usize..90,
            group in prop_oneof![Just(8usize), Just(16), Just(32), Just(128)],
            dense in any::<bool>(),
            zeros in prop_oneof![Just(None), Just(Some(true)), Just(Some(false))],
            seed in any::<u64>(),
        ) {
            let packing = if dense { Packing::Dense } else { Packing::PerWord };
            packed_case((experts, rows, cols), bits, group, packing, zeros, seed)?;
        }
    }

    #[test]
    fn the_width_tells_the_packing_unless_both_fit() {
        assert_eq!(Packing::of_width(4, 64, 8), Some(Packing::Dense));
        assert_eq!(Packing::of_width(3, 64, 6), Some(Packing::Dense));
        assert_eq!(Packing::of_width(3, 64, 7), Some(Packing::PerWord));
        // 20 3-bit codes take 2 words either way, placed differently.
        assert_eq!(Packing::of_width(3, 20, 2), None);
        assert_eq!(Packing::of_width(3, 10, 1), Some(Packing::Dense));
        assert_eq!(Packing::of_width(3, 64, 9), None);
    }

    #[test]
    fn constructors_name_the_member_and_the_fault() {
        let weight = Owned::i8(&[4, 8], &[1; 32]);
        let scale = Owned::f32(&[4, 2], &[0.1; 8]);
        let group = Strategy::Group { size: 4 };
        let error = |result: Result<Naive<'_>, KernelError>| result.unwrap_err().to_string();
        let wrong = Owned::f32(&[4, 3], &[0.1; 12]);
        assert_eq!(
            error(Naive::new(
                weight.stored(),
                wrong.stored(),
                None,
                None,
                group,
                8
            )),
            "weight_scale: shape [4, 3], expected [4, 2]"
        );
        let u8_weight = Owned::new(Dtype::U8, &[4, 8], vec![0; 32]);
        assert_eq!(
            error(Naive::new(
                u8_weight.stored(),
                scale.stored(),
                None,
                None,
                group,
                8
            )),
            "weight: dtype U8, expected I8 or F8_E4M3 or F8_E5M2"
        );
        let g_idx = Owned::i32(&[8], &[0, 1, 2, 0, 1, 0, 1, 0]);
        assert_eq!(
            error(Naive::new(
                weight.stored(),
                scale.stored(),
                None,
                Some(g_idx.stored()),
                group,
                8
            )),
            "weight_g_idx: column 2 in group 2, of 2 groups"
        );
        let short = Owned::new(Dtype::I8, &[4, 8], vec![0; 31]);
        assert_eq!(
            error(Naive::new(
                short.stored(),
                scale.stored(),
                None,
                None,
                group,
                8
            )),
            "weight: 31 bytes do not hold shape [4, 8] of I8"
        );
        let zp = Owned::i8(&[4, 1], &[0; 4]);
        assert_eq!(
            error(Naive::new(
                weight.stored(),
                scale.stored(),
                Some(zp.stored()),
                None,
                group,
                8
            )),
            "weight_zero_point: shape [4, 1], expected [4, 2]"
        );

        let packed = Owned::i32(&[4, 2], &[0; 8]);
        let shape = Owned::new(
            Dtype::I64,
            &[2],
            [4i64, 20].iter().flat_map(|v| v.to_le_bytes()).collect(),
        );
        let scale = Owned::f32(&[4, 1], &[0.1; 4]);
        let members = PackedMembers {
            weight_packed: packed.stored(),
            weight_shape: shape.stored(),
            weight_scale: scale.stored(),
            weight_zero_point: None,
            weight_g_idx: None,
        };
        assert_eq!(
            Packed::new(members, 3, Strategy::Channel, None)
                .unwrap_err()
                .to_string(),
            "weight_packed: 2 words a row fit 20 3-bit codes in both the dense and the per-word packing: the version decides"
        );
        assert!(Packed::new(members, 3, Strategy::Channel, Some(Packing::PerWord)).is_ok());
        let other = Owned::new(
            Dtype::I64,
            &[2],
            [5i64, 20].iter().flat_map(|v| v.to_le_bytes()).collect(),
        );
        let members = PackedMembers {
            weight_shape: other.stored(),
            ..members
        };
        assert_eq!(
            Packed::new(members, 3, Strategy::Channel, None)
                .unwrap_err()
                .to_string(),
            "weight_shape: [5, 20] disagrees with weight_packed [4, 2]"
        );
    }

    #[test]
    fn shapes_whose_sizes_overflow_are_an_error_not_a_panic() {
        let huge = 1usize << 62;
        let weight = Owned::new(Dtype::I8, &[huge, huge, 0], vec![]);
        let scale = Owned::f32(&[1], &[1.0]);
        let error = Naive::new(
            weight.stored(),
            scale.stored(),
            None,
            None,
            Strategy::Tensor,
            8,
        )
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("weight: 0 bytes do not hold shape [{huge}, {huge}, 0] of I8")
        );
    }

    #[test]
    fn broken_scales_and_zero_points_are_named_by_row_and_group() {
        let weight = Owned::i8(&[4, 8], &[1; 32]);
        let scale = Owned::f32(
            &[4, 2],
            &[0.1, f32::NAN, 0.1, 0.1, 0.0, 0.1, -0.1, f32::INFINITY],
        );
        let zp = Owned::i8(&[4, 2], &[0, 0, 9, 0, 0, 0, 0, -8]);
        let kernel = Naive::new(
            weight.stored(),
            scale.stored(),
            Some(zp.stored()),
            None,
            Strategy::Group { size: 4 },
            4,
        )
        .unwrap();
        let problems = kernel.scale_problems();
        let found: Vec<(&str, Problem, std::ops::Range<usize>, usize)> = problems
            .first
            .iter()
            .map(|p| (p.member, p.problem, p.rows.clone(), p.group))
            .collect();
        assert_eq!(
            found,
            [
                ("weight_scale", Problem::NaN, 0..1, 1),
                ("weight_zero_point", Problem::OutOfRange, 1..2, 0),
                ("weight_scale", Problem::Zero, 2..3, 0),
                ("weight_scale", Problem::Negative, 3..4, 0),
                ("weight_scale", Problem::Infinite, 3..4, 1),
            ]
        );
        assert_eq!(problems.total, 5);
    }

    #[test]
    fn nvfp4_global_scale_divides_and_mx_scales_are_powers_of_two() {
        let (rows, cols) = (3, 40);
        let mut rng = Rng::new(11);
        let w: Vec<f32> = (0..rows * cols).map(|_| rng.signed() * 6.0).collect();
        let codes: Vec<u8> = w.iter().map(|&x| e2m1_encode(x)).collect();
        let packed: Vec<u8> = codes
            .chunks(cols)
            .flat_map(|row| {
                row.chunks(2)
                    .map(|p| p[0] | p.get(1).copied().unwrap_or(0) << 4)
                    .collect::<Vec<_>>()
            })
            .collect();
        let weight_packed = Owned::new(Dtype::U8, &[rows, cols / 2], packed);
        // NVFP4: groups of 16 (3 a row, the last partial), E4M3 scales, a global scale.
        let scale_codes: Vec<u8> = (0..rows * 3).map(|k| 0x30 + k as u8).collect();
        let scales = Owned::new(Dtype::F8E4M3, &[rows, 3], scale_codes.clone());
        let global = 448.0 * 6.0 / 0.37;
        let global_scale = Owned::f32(&[1], &[global]);
        let kernel = Nvfp4::new(
            weight_packed.stored(),
            scales.stored(),
            global_scale.stored(),
            cols,
        )
        .unwrap();
        let expected: Vec<f32> = (0..rows * cols)
            .map(|k| {
                let s = e4m3_value(scale_codes[(k / cols) * 3 + (k % cols) / 16]) / global;
                round_to(Dtype::Bf16, e2m1_value(codes[k]) * s)
            })
            .collect();
        assert_same(&dequantize_all(&kernel), &expected, cols);
        // MXFP4: groups of 32 (2 a row), E8M0 scales.
        let exponents: Vec<u8> = (0..rows * 2).map(|k| 120 + k as u8).collect();
        let mx_scales = Owned::new(Dtype::U8, &[rows, 2], exponents.clone());
        let kernel = Mxfp4::new(weight_packed.stored(), mx_scales.stored(), cols).unwrap();
        let expected: Vec<f32> = (0..rows * cols)
            .map(|k| e2m1_value(codes[k]) * e8m0_value(exponents[(k / cols) * 2 + (k % cols) / 32]))
            .collect();
        assert_same(&dequantize_all(&kernel), &expected, cols);
        // MXFP8: E4M3 weights, groups of 32.
        let fp8: Vec<u8> = w.iter().map(|&x| e4m3_encode(x * 50.0)).collect();
        let weight = Owned::new(Dtype::F8E4M3, &[rows, cols], fp8.clone());
        let kernel = Mxfp8::new(weight.stored(), mx_scales.stored()).unwrap();
        let expected: Vec<f32> = (0..rows * cols)
            .map(|k| e4m3_value(fp8[k]) * e8m0_value(exponents[(k / cols) * 2 + (k % cols) / 32]))
            .collect();
        assert_same(&dequantize_all(&kernel), &expected, cols);
        assert_eq!(
            Mxfp4::new(weight_packed.stored(), scales.stored(), cols)
                .unwrap_err()
                .to_string(),
            "weight_scale: dtype F8_E4M3, expected U8 or F8_E8M0"
        );
        // An E8M0 scale of 0xFF is NaN.
        let nan = Owned::new(Dtype::U8, &[rows, 2], vec![127, 127, 255, 127, 127, 127]);
        let kernel = Mxfp4::new(weight_packed.stored(), nan.stored(), cols).unwrap();
        let problems = kernel.scale_problems();
        assert_eq!(problems.total, 1);
        assert_eq!(
            (problems.first[0].rows.clone(), problems.first[0].group),
            (1..2, 0)
        );
    }
}
