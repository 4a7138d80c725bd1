//! MLX (mlx, `mlx-lm`): U32 `weight` words holding codes as one LSB-first bit stream per row,
//! with `scales` (and, in the affine mode, `biases`) per group of columns.
//!
//! Affine: `W = u · s + b`, computed in the scales' type, the product and the sum each rounded
//! to it (`mlx/ops.cpp affine_dequantize`: a multiply, then an add; checked against
//! `mx.dequantize`). Scales are negative wherever a group's largest magnitude is negative, so a
//! negative scale is no problem here. The mx modes: `mxfp4` (E2M1 codes, E8M0 scales, groups
//! of 32), `nvfp4` (E2M1, E4M3 scales stored as U8, groups of 16) and `mxfp8` (E4M3 bytes,
//! E8M0 scales, groups of 32).

use super::bits::Packing;
use super::decode::{FloatKind, Floats};
use super::grouped::{Checks, Codes, Grid, Grouped, Groups, Half, Source, Value};
use super::{FLOAT_SCALES, KernelError, Stored, floats, grouped_layout, matrix, with_experts};
use crate::format::Dtype;

/// The affine mode: `bits` 2 to 8, `group_size` 32, 64 or 128 (any size is read).
#[derive(Clone, Debug)]
pub struct Affine<'a> {
    inner: Grouped<'a>,
}
grouped_layout!(Affine);

impl<'a> Affine<'a> {
    pub fn new(
        weight: Stored<'a>,
        scales: Stored<'a>,
        biases: Stored<'a>,
        bits: u32,
        group_size: usize,
    ) -> Result<Self, KernelError> {
        if !(1..=8).contains(&bits) || group_size == 0 {
            return Err(KernelError::new(
                "weight",
                format!("{bits} bits in groups of {group_size}"),
            ));
        }
        let (experts, rows, words, cols) = words_and_cols(&weight, bits)?;
        let experts_dim = (weight.shape.len() == 3).then_some(experts);
        let shape = with_experts(experts_dim, &[rows, cols.div_ceil(group_size)]);
        scales.check_shape("scales", &FLOAT_SCALES, &shape)?;
        biases.check_shape("biases", &[scales.dtype], &shape)?;
        let grid = |values| Grid {
            values,
            row_stride: cols.div_ceil(group_size),
            group_stride: 1,
        };
        Ok(Affine {
            inner: Grouped {
                rows: experts * rows,
                cols,
                experts,
                codes: Codes::Rows {
                    bytes: weight.bytes,
                    bits,
                    packing: Packing::Dense,
                    row_bytes: 4 * words,
                },
                value: Value::Unsigned { bits, offset: 0.0 },
                groups: Groups::Tiles {
                    rows: 1,
                    cols: group_size,
                    expert_rows: rows,
                },
                scales: grid(Source::Stored(floats("scales", &scales)?)),
                scale_member: "scales",
                zeros: None,
                biases: Some((grid(Source::Stored(floats("biases", &biases)?)), "biases")),
                factor: None,
                rounding: Half::of(scales.dtype),
                checks: Checks {
                    negative_scales: true,
                    zero_range: None,
                },
            },
        })
    }
}

/// `[…, rows, words]` U32 words and the columns their `bits`-bit codes make.
fn words_and_cols(
    weight: &Stored<'_>,
    bits: u32,
) -> Result<(usize, usize, usize, usize), KernelError> {
    weight.check("weight", &[Dtype::U32])?;
    let (experts, rows, words) = matrix("weight", weight)?;
    if (words * 32) % bits as usize != 0 {
        return Err(KernelError::new(
            "weight",
            format!("{words} words a row do not hold whole {bits}-bit codes"),
        ));
    }
    Ok((experts, rows, words, words * 32 / bits as usize))
}

/// MLX's float modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Mxfp4,
    Nvfp4,
    Mxfp8,
}

/// `mxfp4`, `nvfp4` or `mxfp8`: float codes times per-group scales.
#[derive(Clone, Debug)]
pub struct Float<'a> {
    inner: Grouped<'a>,
}
grouped_layout!(Float);

impl<'a> Float<'a> {
    pub fn new(weight: Stored<'a>, scales: Stored<'a>, mode: Mode) -> Result<Self, KernelError> {
        let (bits, group, value, scale_kind) = match mode {
            Mode::Mxfp4 => (4, 32, Value::E2M1, FloatKind::E8M0),
            Mode::Nvfp4 => (4, 16, Value::E2M1, FloatKind::E4M3),
            Mode::Mxfp8 => (8, 32, Value::E4M3, FloatKind::E8M0),
        };
        let (experts, rows, words, cols) = words_and_cols(&weight, bits)?;
        let experts_dim = (weight.shape.len() == 3).then_some(experts);
        scales.check_shape(
            "scales",
            &[Dtype::U8],
            &with_experts(experts_dim, &[rows, cols.div_ceil(group)]),
        )?;
        Ok(Float {
            inner: Grouped {
                rows: experts * rows,
                cols,
                experts,
                codes: if bits == 8 {
                    Codes::Bytes(weight.bytes)
                } else {
                    Codes::Rows {
                        bytes: weight.bytes,
                        bits,
                        packing: Packing::Dense,
                        row_bytes: 4 * words,
                    }
                },
                value,
                groups: Groups::Tiles {
                    rows: 1,
                    cols: group,
                    expert_rows: rows,
                },
                scales: Grid {
                    values: Source::Stored(Floats::new(scales.bytes, scale_kind)),
                    row_stride: cols.div_ceil(group),
                    group_stride: 1,
                },
                scale_member: "scales",
                zeros: None,
                biases: None,
                factor: None,
                rounding: None,
                checks: Checks {
                    negative_scales: false,
                    zero_range: None,
                },
            },
        })
    }
}

#[cfg(test)]
mod tests {
    #![expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "fixtures of small, known sizes and values"
    )]
    use super::super::Dequantize;
    use super::super::testing::{
        Owned, Rng, assert_same, dequantize_all, e2m1_value, e4m3_value, e8m0_value, pack,
        round_to, word_bytes,
    };
    use super::*;
    use proptest::prelude::{Just, ProptestConfig, any, prop_oneof, proptest};

    /// MLX's affine quantization (`affine_quantize`): per group, `Δ = (max − min) / n`; the
    /// bias is the edge of larger magnitude, and the scale `Δ` from the minimum or `−Δ` from
    /// the maximum; `u = round((w − bias) / scale)`.
    fn affine_case(
        bits: u32,
        group: usize,
        (experts, rows, cols): (usize, usize, usize),
        dtype: Dtype,
        seed: u64,
    ) {
        let mut rng = Rng::new(seed);
        let all_rows = experts * rows;
        let groups = cols / group;
        let levels = ((1u32 << bits) - 1) as f32;
        let w: Vec<f32> = (0..all_rows * cols).map(|_| rng.signed() * 0.1).collect();
        let (mut scales, mut biases) = (vec![], vec![]);
        for run in w.chunks(group) {
            let (min, max) = run
                .iter()
                .fold((f32::MAX, f32::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
            let delta = ((max - min) / levels).max(1e-7);
            let (scale, edge) = if min.abs() > max.abs() {
                (delta, min)
            } else {
                (-delta, max)
            };
            scales.push(scale);
            biases.push(edge);
        }
        let scales_member = Owned::floats(dtype, &[all_rows, groups], &scales);
        let biases_member = Owned::floats(dtype, &[all_rows, groups], &biases);
        let codes: Vec<u8> = w
            .iter()
            .enumerate()
            .map(|(k, &x)| {
                let cell = k / group;
                ((x - biases_member.float(cell)) / scales_member.float(cell))
                    .round()
                    .clamp(0.0, levels) as u8
            })
            .collect();
        let words = cols * bits as usize / 32;
        let bytes: Vec<u8> = codes
            .chunks(cols)
            .flat_map(|row| word_bytes(&pack(Packing::Dense, bits, row)))
            .collect();
        let shape = |last: usize| {
            if experts > 1 {
                vec![experts, rows, last]
            } else {
                vec![rows, last]
            }
        };
        let weight = Owned::new(Dtype::U32, &shape(words), bytes);
        let scales_member = Owned {
            shape: shape(groups).iter().map(|&d| d as u64).collect(),
            ..scales_member
        };
        let biases_member = Owned {
            shape: scales_member.shape.clone(),
            ..biases_member
        };
        let kernel = Affine::new(
            weight.stored(),
            scales_member.stored(),
            biases_member.stored(),
            bits,
            group,
        )
        .unwrap();
        // Computed in the scales' type: the product, then the sum, each rounded to it.
        let expected: Vec<f32> = (0..all_rows * cols)
            .map(|k| {
                let cell = k / group;
                let product = round_to(dtype, f32::from(codes[k]) * scales_member.float(cell));
                round_to(dtype, product + biases_member.float(cell))
            })
            .collect();
        assert_same(&dequantize_all(&kernel), &expected, cols);
        // Negative scales are MLX's convention, not a problem.
        assert!(kernel.scale_problems().is_empty());
    }

    #[test]
    fn affine_codes_straddle_words_and_round_in_the_scales_type() {
        for (bits, dtype) in [
            (3, Dtype::Bf16),
            (4, Dtype::F16),
            (6, Dtype::F32),
            (5, Dtype::Bf16),
        ] {
            affine_case(bits, 32, (1, 4, 128), dtype, u64::from(bits));
        }
        affine_case(2, 64, (3, 2, 128), Dtype::Bf16, 9);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn affine_round_trips(
            bits in prop_oneof![Just(2u32), Just(3), Just(4), Just(5), Just(6), Just(8)],
            group in prop_oneof![Just(32usize), Just(64), Just(128)],
            rows in 1usize..6,
            width in 1usize..3,
            bf16 in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let dtype = if bf16 { Dtype::Bf16 } else { Dtype::F16 };
            affine_case(bits, group, (1, rows, 128 * width), dtype, seed);
        }
    }

    #[test]
    fn float_modes() {
        let (rows, cols) = (3, 64);
        let mut rng = Rng::new(41);
        let nibbles = rng.codes(4, rows * cols);
        let fp4 = Owned::new(
            Dtype::U32,
            &[rows, cols / 8],
            nibbles
                .chunks(cols)
                .flat_map(|row| word_bytes(&pack(Packing::Dense, 4, row)))
                .collect(),
        );
        let exponents: Vec<u8> = (0..rows * 2).map(|_| 120 + rng.below(14) as u8).collect();
        let e8m0 = Owned::new(Dtype::U8, &[rows, 2], exponents.clone());
        let kernel = Float::new(fp4.stored(), e8m0.stored(), Mode::Mxfp4).unwrap();
        let expected: Vec<f32> = (0..rows * cols)
            .map(|k| e2m1_value(nibbles[k]) * e8m0_value(exponents[k / 32]))
            .collect();
        assert_same(&dequantize_all(&kernel), &expected, cols);

        let e4m3_scales: Vec<u8> = (0..rows * 4)
            .map(|_| 0x28 + rng.below(0x30) as u8)
            .collect();
        let nv = Owned::new(Dtype::U8, &[rows, 4], e4m3_scales.clone());
        let kernel = Float::new(fp4.stored(), nv.stored(), Mode::Nvfp4).unwrap();
        let expected: Vec<f32> = (0..rows * cols)
            .map(|k| e2m1_value(nibbles[k]) * e4m3_value(e4m3_scales[k / 16]))
            .collect();
        assert_same(&dequantize_all(&kernel), &expected, cols);

        let bytes: Vec<u8> = (0..rows * cols).map(|_| rng.below(0x7f) as u8).collect();
        let fp8 = Owned::new(Dtype::U32, &[rows, cols / 4], bytes.clone());
        let kernel = Float::new(fp8.stored(), e8m0.stored(), Mode::Mxfp8).unwrap();
        let expected: Vec<f32> = (0..rows * cols)
            .map(|k| e4m3_value(bytes[k]) * e8m0_value(exponents[k / 32]))
            .collect();
        assert_same(&dequantize_all(&kernel), &expected, cols);
        assert_eq!(
            Float::new(fp8.stored(), nv.stored(), Mode::Mxfp8)
                .unwrap_err()
                .to_string(),
            "scales: shape [3, 4], expected [3, 2]"
        );
    }
}
