//! GPTQ (`AutoGPTQ`, `GPTQModel`, `AutoRound`'s GPTQ-like exports): `qweight` packed down the input
//! dimension, `qzeros` packed along the output one, F16 `scales`, and `g_idx`.
//!
//! `W[n, k] = scales[g, n] · (q[k, n] − z[g, n])` with `g = g_idx[k]`
//! (`GPTQModel` `_dequantize_from_codes`). Codes are a dense LSB-first stream down each column of
//! `qweight` (for 3 bits they straddle words). Checkpoint format v1 (`gptq`, and the default)
//! stores `zero − 1`, subtracted from whole words (`0x11111111` for 4 bits), so a zero of 0
//! borrows from the next field: the constant is added back to each word before the fields are
//! read; 3-bit zeros are corrected field by field (`(f + 1) & 7`), as every loader does.

use super::bits::Packing;
use super::grouped::{
    Checks, Codes, Grid, Grouped, Groups, Half, PackedCodes, PackedZeros, Source, Value,
};
use super::{FLOAT_SCALES, KernelError, Stored, floats, grouped_layout};
use crate::format::Dtype;

/// How `qzeros` are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// `gptq` (or no `checkpoint_format`): `zero − 1`; `AutoRound`'s `auto_round:auto_gptq`.
    V1,
    /// `gptq_v2`: the zero itself; `AutoRound`'s `auto_round`.
    V2,
}

/// Members of a GPTQ weight.
#[derive(Clone, Copy, Debug)]
pub struct GptqMembers<'a> {
    pub qweight: Stored<'a>,
    /// Absent in some `AutoRound` exports: then every zero is `2^(bits−1)`.
    pub qzeros: Option<Stored<'a>>,
    pub scales: Stored<'a>,
    /// Absent: column `k` is in group `k / group_size`.
    pub g_idx: Option<Stored<'a>>,
}

#[derive(Clone, Debug)]
pub struct Gptq<'a> {
    inner: Grouped<'a>,
}
grouped_layout!(Gptq);

impl<'a> Gptq<'a> {
    /// `bits` 2, 3, 4 or 8; `group_size` `None` for one group (`-1`) or when `g_idx` gives the
    /// groups.
    pub fn new(
        members: GptqMembers<'a>,
        bits: u32,
        group_size: Option<usize>,
        version: Version,
    ) -> Result<Self, KernelError> {
        let GptqMembers {
            qweight,
            qzeros,
            scales,
            g_idx,
        } = members;
        if ![2, 3, 4, 8].contains(&bits) {
            return Err(KernelError::new("qweight", format!("{bits} bits")));
        }
        qweight.check("qweight", &[Dtype::I32])?;
        scales.check("scales", &FLOAT_SCALES)?;
        if qweight.shape.len() != 2 || scales.shape.len() != 2 {
            return Err(KernelError::new(
                "qweight",
                format!(
                    "shapes {:?} and scales {:?}, expected 2 dimensions each",
                    qweight.shape, scales.shape
                ),
            ));
        }
        let (words, rows) = (qweight.dim(0), qweight.dim(1));
        let groups = scales.dim(0);
        scales.check_shape("scales", &FLOAT_SCALES, &[groups, rows])?;
        let cols = match &g_idx {
            Some(g_idx) => {
                g_idx.check("g_idx", &[Dtype::I32])?;
                g_idx.bytes.len() / 4
            }
            None if (words * 32) % bits as usize == 0 => words * 32 / bits as usize,
            None => {
                return Err(KernelError::new(
                    "qweight",
                    format!("{words} words of {bits}-bit codes do not make whole columns"),
                ));
            }
        };
        if Packing::Dense.words(bits, cols) != words {
            return Err(KernelError::new(
                "qweight",
                format!(
                    "{words} rows of words, {cols} {bits}-bit codes take {}",
                    Packing::Dense.words(bits, cols)
                ),
            ));
        }
        let groups_layout = group_layout(g_idx.as_ref(), group_size, (rows, cols), groups)?;
        let zeros = match qzeros {
            Some(qzeros) => {
                let zero_words = Packing::Dense.words(bits, rows);
                qzeros.check_shape("qzeros", &[Dtype::I32], &[groups, zero_words])?;
                Grid {
                    values: Source::Packed(PackedCodes {
                        bytes: qzeros.bytes,
                        bits,
                        packing: Packing::Dense,
                        offset: 0.0,
                        layout: PackedZeros::AlongRows {
                            words: zero_words,
                            v1: version == Version::V1,
                        },
                    }),
                    row_stride: 0,
                    group_stride: 0,
                }
            }
            None => Grid::constant(f32::from(1u8 << (bits - 1))),
        };
        Ok(Gptq {
            inner: Grouped {
                rows,
                cols,
                experts: 1,
                codes: Codes::Columns {
                    bytes: qweight.bytes,
                    bits,
                    words,
                    rows,
                },
                value: Value::Unsigned { bits, offset: 0.0 },
                groups: groups_layout,
                scales: Grid {
                    values: Source::Stored(floats("scales", &scales)?),
                    row_stride: 1,
                    group_stride: rows,
                },
                scale_member: "scales",
                zeros: Some((zeros, "qzeros")),
                biases: None,
                factor: None,
                rounding: Half::of(scales.dtype),
                // Symmetric exports hold negative scales (auto-round: about half of them), which
                // the loaders use as they are.
                checks: Checks {
                    negative_scales: true,
                    zero_range: None,
                },
            },
        })
    }
}

/// The columns' groups: from `g_idx` when it is not simply `k / group_size`.
fn group_layout(
    g_idx: Option<&Stored<'_>>,
    group_size: Option<usize>,
    (rows, cols): (usize, usize),
    groups: usize,
) -> Result<Groups, KernelError> {
    let size = group_size.unwrap_or(cols).max(1);
    let index = match g_idx {
        Some(g_idx) => read_g_idx(g_idx, groups)?,
        None => None,
    };
    Ok(match index {
        Some(index)
            if index
                .iter()
                .enumerate()
                .any(|(k, &g)| g as usize != k / size) =>
        {
            Groups::Indexed {
                index,
                count: groups,
            }
        }
        _ => {
            if cols.div_ceil(size) != groups {
                return Err(KernelError::new(
                    "scales",
                    format!(
                        "{groups} groups, {cols} columns in groups of {size} make {}",
                        cols.div_ceil(size)
                    ),
                ));
            }
            Groups::Tiles {
                rows: 1,
                cols: size,
                expert_rows: rows,
            }
        }
    })
}

/// `g_idx` as group numbers, each below `groups`.
fn read_g_idx(g_idx: &Stored<'_>, groups: usize) -> Result<Option<Vec<u32>>, KernelError> {
    g_idx
        .bytes
        .chunks_exact(4)
        .enumerate()
        .map(|(k, b)| {
            let g = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            u32::try_from(g)
                .ok()
                .filter(|&g| (g as usize) < groups)
                .ok_or_else(|| {
                    KernelError::new("g_idx", format!("column {k} in group {g}, of {groups}"))
                })
        })
        .collect::<Result<Vec<u32>, _>>()
        .map(Some)
}

#[cfg(test)]
mod tests {
    #![expect(
        clippy::cast_possible_truncation,
        clippy::cast_possible_wrap,
        reason = "fixtures of small, known sizes and values"
    )]
    use super::super::testing::{Owned, Rng, assert_same, dequantize_all, pack, round_f16};
    use super::super::{Dequantize, Packing};
    use super::*;
    use proptest::prelude::{Just, ProptestConfig, any, prop_oneof, proptest};

    /// A GPTQ weight built as `GPTQModel` packs it, with the values it stands for.
    struct Case {
        qweight: Owned,
        qzeros: Owned,
        scales: Owned,
        g_idx: Owned,
        expected: Vec<f32>,
    }

    /// `codes[n][k]` of `rows` outputs and `cols` inputs; `zeros[g][n]`; `groups[k]`.
    fn build(
        bits: u32,
        (rows, cols): (usize, usize),
        groups: &[usize],
        version: Version,
        seed: u64,
        zero_codes: Option<Vec<u8>>,
    ) -> Case {
        let mut rng = Rng::new(seed);
        let count = groups.iter().max().map_or(0, |g| g + 1);
        let codes = rng.codes(bits, rows * cols);
        let zeros = zero_codes.unwrap_or_else(|| rng.codes(bits, count * rows));
        let scale_values: Vec<f32> = (0..count * rows)
            .map(|_| rng.signed().abs() * 0.02 + 1e-3)
            .collect();
        let scales = Owned::f16(&[count, rows], &scale_values);
        // qweight [words, rows]: each output's codes packed down its column.
        let words = Packing::Dense.words(bits, cols);
        let mut qweight = vec![0u32; words * rows];
        for n in 0..rows {
            let column: Vec<u8> = (0..cols).map(|k| codes[n * cols + k]).collect();
            for (w, value) in pack(Packing::Dense, bits, &column).into_iter().enumerate() {
                qweight[w * rows + n] = value;
            }
        }
        // qzeros [groups, words]: along the row; v1 stores zero − 1.
        let zero_words = Packing::Dense.words(bits, rows);
        let mut qzeros = Vec::with_capacity(count * zero_words);
        for g in 0..count {
            let row = &zeros[g * rows..(g + 1) * rows];
            let packed = match (version, bits) {
                (Version::V2, _) => pack(Packing::Dense, bits, row),
                // AutoGPTQ's 3-bit v1: each field minus one.
                (Version::V1, 3) => {
                    let fields: Vec<u8> = row.iter().map(|&z| z.wrapping_sub(1) & 7).collect();
                    pack(Packing::Dense, bits, &fields)
                }
                // GPTQModel's v1: a constant subtracted from whole words.
                (Version::V1, _) => {
                    let ones = match bits {
                        2 => 0x5555_5555u32,
                        4 => 0x1111_1111,
                        _ => 0x0101_0101,
                    };
                    pack(Packing::Dense, bits, row)
                        .into_iter()
                        .map(|w| w.wrapping_sub(ones))
                        .collect()
                }
            };
            qzeros.extend(packed.into_iter().map(u32::cast_signed));
        }
        let expected = (0..rows * cols)
            .map(|e| {
                let (n, k) = (e / cols, e % cols);
                let cell = groups[k] * rows + n;
                let q = f32::from(codes[e]) - f32::from(zeros[cell]);
                round_f16(scales.float(cell) * q)
            })
            .collect();
        Case {
            qweight: Owned::i32(
                &[words, rows],
                &qweight
                    .into_iter()
                    .map(u32::cast_signed)
                    .collect::<Vec<_>>(),
            ),
            qzeros: Owned::i32(&[count, zero_words], &qzeros),
            scales,
            g_idx: Owned::i32(
                &[cols],
                &groups.iter().map(|&g| g as i32).collect::<Vec<_>>(),
            ),
            expected,
        }
    }

    fn check(case: &Case, bits: u32, group: Option<usize>, version: Version, with_g_idx: bool) {
        let members = GptqMembers {
            qweight: case.qweight.stored(),
            qzeros: Some(case.qzeros.stored()),
            scales: case.scales.stored(),
            g_idx: with_g_idx.then(|| case.g_idx.stored()),
        };
        let kernel = Gptq::new(members, bits, group, version).unwrap();
        assert_same(&dequantize_all(&kernel), &case.expected, kernel.cols());
    }

    #[test]
    fn v1_zero_points_borrow_across_fields_and_are_added_back_per_word() {
        // Zeros of 0 next to others: subtracting 0x11111111 borrows from the next field.
        let (rows, cols) = (16, 8);
        let zeros: Vec<u8> = vec![0, 3, 0, 0, 15, 8, 0, 1, 7, 0, 0, 2, 0, 15, 0, 0];
        let groups = vec![0; cols];
        let case = build(4, (rows, cols), &groups, Version::V1, 1, Some(zeros));
        // The stored word really has borrowed: field 1 no longer reads zero − 1.
        let first = case.qzeros.bytes[..4]
            .try_into()
            .map(u32::from_le_bytes)
            .unwrap();
        assert_ne!((first >> 4) & 15, 2);
        check(&case, 4, None, Version::V1, false);
        check(&case, 4, None, Version::V1, true);
    }

    #[test]
    fn three_bit_codes_cross_words_down_the_columns() {
        let (rows, cols, group) = (13, 96, 40);
        let groups: Vec<usize> = (0..cols).map(|k| k / group).collect();
        for version in [Version::V1, Version::V2] {
            let case = build(3, (rows, cols), &groups, version, 2, None);
            check(&case, 3, Some(group), version, true);
            check(&case, 3, Some(group), version, false);
        }
    }

    #[test]
    fn act_order_groups_come_from_g_idx() {
        let (rows, cols) = (8, 64);
        let mut rng = Rng::new(3);
        let groups: Vec<usize> = (0..cols).map(|_| rng.below(4) as usize).collect();
        let case = build(4, (rows, cols), &groups, Version::V2, 4, None);
        check(&case, 4, Some(16), Version::V2, true);
        let bad = Owned::i32(&[cols], &[4; 64]);
        let members = GptqMembers {
            qweight: case.qweight.stored(),
            qzeros: Some(case.qzeros.stored()),
            scales: case.scales.stored(),
            g_idx: Some(bad.stored()),
        };
        assert_eq!(
            Gptq::new(members, 4, Some(16), Version::V2)
                .unwrap_err()
                .to_string(),
            "g_idx: column 0 in group 4, of 4"
        );
        let members = GptqMembers {
            g_idx: None,
            ..members
        };
        assert_eq!(
            Gptq::new(members, 4, Some(32), Version::V2)
                .unwrap_err()
                .to_string(),
            "scales: 4 groups, 64 columns in groups of 32 make 2"
        );
        assert_eq!(
            Gptq::new(members, 5, Some(32), Version::V2)
                .unwrap_err()
                .to_string(),
            "qweight: 5 bits"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn packed_codes_and_zeros_read_back_exactly(
            bits in prop_oneof![Just(2u32), Just(3), Just(4), Just(8)],
            rows in 1usize..40,
            cols in 1usize..100,
            group in 1usize..40,
            v1 in any::<bool>(),
            act_order in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let cols = if bits == 3 { cols.div_ceil(32) * 32 } else { cols.div_ceil(32 / bits as usize) * (32 / bits as usize) };
            let version = if v1 { Version::V1 } else { Version::V2 };
            let count = cols.div_ceil(group);
            let mut rng = Rng::new(seed ^ 1);
            let groups: Vec<usize> = (0..cols)
                .map(|k| if act_order { rng.below(count as u64) as usize } else { k / group })
                .collect();
            let groups = if groups.iter().max() == Some(&(count - 1)) { groups } else { (0..cols).map(|k| k / group).collect() };
            let case = build(bits, (rows, cols), &groups, version, seed, None);
            check(&case, bits, Some(group), version, act_order);
        }
    }
}
