//! `ComfyUI`'s NVFP4 (`comfy_kitchen` `TensorCoreNVFP4Layout`): `weight` U8 `[R, C/2]` with the
//! FIRST element of each byte in the HIGH nibble (the opposite of compressed-tensors and
//! `ModelOpt`), `weight_scale` `F8_E4M3` per 16 columns stored in cuBLAS' blocked (swizzled)
//! layout `[roundup(R, 128), roundup(C/16, 4)]`, and `weight_scale_2` F32 that multiplies:
//! `W = v · fp8(s) · weight_scale_2`. Read row-major, the swizzled scales give garbage without
//! an error. The weight may be padded to multiples of 16; the logical shape is given.
//!
//! `ComfyUI`'s MXFP8 (`comfy_kitchen` `TensorCoreMXFP8Layout`): `weight` `F8_E4M3` `[R, C]`,
//! padded by the producer to multiples of 32 (the file keeps no other shape), and `weight_scale`
//! E8M0 per 32 columns in the same blocked layout, `[roundup(R, 128), roundup(C/32, 4)]`:
//! `W = fp8 · scale` in `f32`. comfy-kitchen reads a scale code as an `f32`'s exponent bits
//! (`e8m0_to_f32`), so code 0, which it writes for an all-zero block (and for a block too small
//! for 2^−127), is 0.0 and code 255 is +∞.
//!
//! `ComfyUI`'s `float8_e4m3fn` and `int8_tensorwise` layouts (one `weight_scale`, scalar or
//! `[N, 1]`) are read by [`super::fp8::Fp8`] and [`super::compressed_tensors::Naive`].

use super::decode::{FloatKind, Floats};
use super::grouped::{Checks, Codes, Grid, Grouped, Groups, Source, Value};
use super::{KernelError, Stored, grouped_layout, scalar};
use crate::format::Dtype;

#[derive(Clone, Debug)]
pub struct ComfyNvfp4<'a> {
    inner: Grouped<'a>,
}
grouped_layout!(ComfyNvfp4);

impl<'a> ComfyNvfp4<'a> {
    pub fn new(
        weight: Stored<'a>,
        weight_scale: Stored<'a>,
        weight_scale_2: Stored<'a>,
        [rows, cols]: [usize; 2],
    ) -> Result<Self, KernelError> {
        let factor = scalar("weight_scale_2", &weight_scale_2, &[Dtype::F32])?;
        weight.check("weight", &[Dtype::U8])?;
        if weight.shape.len() != 2 || weight.dim(0) < rows || 2 * weight.dim(1) < cols {
            return Err(KernelError::new(
                "weight",
                format!(
                    "shape {:?} does not hold [{rows}, {cols}] in FP4",
                    weight.shape
                ),
            ));
        }
        let row_bytes = weight.dim(1);
        let groups = (2 * row_bytes).div_ceil(16);
        let tiles = groups.div_ceil(4);
        weight_scale.check_shape(
            "weight_scale",
            &[Dtype::F8E4M3],
            &[weight.dim(0).div_ceil(128) * 128, tiles * 4],
        )?;
        Ok(ComfyNvfp4 {
            inner: Grouped {
                rows,
                cols,
                experts: 1,
                codes: Codes::RowsHighFirst {
                    bytes: weight.bytes,
                    row_bytes,
                },
                value: Value::E2M1,
                groups: Groups::Tiles {
                    rows: 1,
                    cols: 16,
                    expert_rows: rows,
                },
                scales: blocked_scales(weight_scale.bytes, FloatKind::E4M3, tiles),
                scale_member: "weight_scale",
                zeros: None,
                biases: None,
                factor: Some(factor),
                rounding: None,
                checks: Checks {
                    negative_scales: false,
                    zero_range: None,
                },
            },
        })
    }
}

#[derive(Clone, Debug)]
pub struct ComfyMxfp8<'a> {
    inner: Grouped<'a>,
}
grouped_layout!(ComfyMxfp8);

impl<'a> ComfyMxfp8<'a> {
    pub fn new(weight: Stored<'a>, weight_scale: Stored<'a>) -> Result<Self, KernelError> {
        weight.check("weight", &[Dtype::F8E4M3])?;
        if weight.shape.len() != 2 || !weight.dim(1).is_multiple_of(32) {
            return Err(KernelError::new(
                "weight",
                format!(
                    "shape {:?}, expected [rows, columns] with columns a multiple of 32",
                    weight.shape
                ),
            ));
        }
        let (rows, cols) = (weight.dim(0), weight.dim(1));
        let tiles = (cols / 32).div_ceil(4);
        weight_scale.check_shape(
            "weight_scale",
            &[Dtype::U8, Dtype::F8E8M0],
            &[rows.div_ceil(128) * 128, tiles * 4],
        )?;
        Ok(ComfyMxfp8 {
            inner: Grouped {
                rows,
                cols,
                experts: 1,
                codes: Codes::Bytes(weight.bytes),
                value: Value::E4M3,
                groups: Groups::Tiles {
                    rows: 1,
                    cols: 32,
                    expert_rows: rows,
                },
                scales: blocked_scales(weight_scale.bytes, FloatKind::E8M0Exponent, tiles),
                scale_member: "weight_scale",
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

/// Scales of `kind` in `bytes`, in the cuBLAS blocked layout comfy-kitchen stores them in,
/// `tiles` tiles of 4 groups to a row; the layout places each scale, not a stride.
fn blocked_scales(bytes: &[u8], kind: FloatKind, tiles: usize) -> Grid<'_> {
    Grid {
        values: Source::Blocked {
            floats: Floats::new(bytes, kind),
            tiles,
        },
        row_stride: 0,
        group_stride: 0,
    }
}

#[cfg(test)]
mod tests {
    #![expect(
        clippy::cast_possible_truncation,
        reason = "fixtures of small, known sizes and values"
    )]
    use super::super::testing::{Owned, Rng, assert_same, dequantize_all, e2m1_value, e4m3_value};
    use super::super::{Dequantize, FusedRow, FusedScratch, Problem};
    use super::*;

    /// `to_blocked`: `logical` `[rows, groups]` padded to `[roundup(rows, 128), roundup(groups,
    /// 4)]`, cut into 128×4 tiles, each stored as `[32, 4, 4]` → 512 bytes.
    fn blocked(logical: &[u8], rows: usize, groups: usize) -> (Vec<u8>, [usize; 2]) {
        let padded = [rows.div_ceil(128) * 128, groups.div_ceil(4) * 4];
        let mut out = vec![0u8; padded[0] * padded[1]];
        for r in 0..rows {
            for c in 0..groups {
                let tile = (r / 128) * (padded[1] / 4) + c / 4;
                let within = (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4;
                out[tile * 512 + within] = logical[r * groups + c];
            }
        }
        (out, padded)
    }

    #[test]
    fn mxfp8_scales_are_unswizzled_and_read_as_exponent_bits() {
        // 160 rows cross a 128-row tile; 96 columns make 3 groups, padded to 4.
        let (rows, cols) = (160, 96);
        let groups = cols / 32;
        let mut rng = Rng::new(72);
        let mut codes: Vec<u8> = (0..rows * cols).map(|_| rng.below(256) as u8).collect();
        let mut logical: Vec<u8> = (0..rows * groups)
            .map(|_| 100 + rng.below(40) as u8)
            .collect();
        // Row 3: an all-zero group with scale code 0 (as comfy-kitchen writes one), a group of
        // nonzero codes that code 0 zeroes, and code 255.
        codes[3 * cols..3 * cols + 32].fill(0);
        codes[3 * cols + 32..3 * cols + 64].fill(0x38);
        logical[3 * groups..3 * groups + 3].copy_from_slice(&[0, 0, 255]);
        let weight = Owned::new(Dtype::F8E4M3, &[rows, cols], codes.clone());
        let (bytes, padded) = blocked(&logical, rows, groups);
        let scales = Owned::new(Dtype::F8E8M0, &padded, bytes);
        let kernel = ComfyMxfp8::new(weight.stored(), scales.stored()).unwrap();
        let scale = |code: u8| f32::from_bits(u32::from(code) << 23);
        let expected: Vec<f32> = (0..rows * cols)
            .map(|k| e4m3_value(codes[k]) * scale(logical[(k / cols) * groups + (k % cols) / 32]))
            .collect();
        assert_same(&dequantize_all(&kernel), &expected, cols);
        assert_eq!(expected[3 * cols + 40], 0.0);
        assert!(
            expected[3 * cols + 64..4 * cols]
                .iter()
                .all(|v| v.is_infinite() || v.is_nan())
        );
        let mut scratch = FusedScratch::default();
        for row in [0, 3, 130] {
            let Some(FusedRow::E4m3 { scales, .. }) = kernel.fused_row(row, &mut scratch) else {
                panic!("row {row} has no fused form");
            };
            let wanted: Vec<f32> = (0..groups)
                .map(|g| scale(logical[row * groups + g]))
                .collect();
            assert_same(scales, &wanted, groups);
        }
        let problems = kernel.scale_problems();
        let found: Vec<_> = problems
            .first
            .iter()
            .map(|p| (p.problem, p.rows.clone(), p.group))
            .collect();
        assert_eq!(
            found,
            [(Problem::Zero, 3..4, 1), (Problem::Infinite, 3..4, 2)]
        );
        let row_major = Owned::new(Dtype::F8E8M0, &[rows, groups], logical);
        assert_eq!(
            ComfyMxfp8::new(weight.stored(), row_major.stored())
                .unwrap_err()
                .to_string(),
            "weight_scale: shape [160, 3], expected [256, 4]"
        );
        let ragged = Owned::new(Dtype::F8E4M3, &[2, 40], vec![0; 80]);
        assert!(
            ComfyMxfp8::new(ragged.stored(), scales.stored())
                .unwrap_err()
                .to_string()
                .contains("a multiple of 32")
        );
    }

    #[test]
    fn swizzled_block_scales_and_high_nibbles_first() {
        // 130 rows cross a 128-row tile; 96 columns make 6 groups, padded to 8.
        let (rows, cols) = (130, 96);
        let groups = cols / 16;
        let mut rng = Rng::new(71);
        let bytes: Vec<u8> = (0..rows * cols / 2).map(|_| rng.below(256) as u8).collect();
        let weight = Owned::new(Dtype::U8, &[rows, cols / 2], bytes.clone());
        let logical: Vec<u8> = (0..rows * groups)
            .map(|_| 0x20 + rng.below(0x40) as u8)
            .collect();
        let (blocked_bytes, padded) = blocked(&logical, rows, groups);
        assert_eq!(padded, [256, 8]);
        let scales = Owned::new(Dtype::F8E4M3, &padded, blocked_bytes);
        let scale_2 = Owned::f32(&[], &[0.37 / 2688.0]);
        let kernel = ComfyNvfp4::new(
            weight.stored(),
            scales.stored(),
            scale_2.stored(),
            [rows, cols],
        )
        .unwrap();
        let expected: Vec<f32> = (0..rows * cols)
            .map(|k| {
                let byte = bytes[k / 2];
                let code = if k % 2 == 0 { byte >> 4 } else { byte & 15 };
                let s = e4m3_value(logical[(k / cols) * groups + (k % cols) / 16]);
                e2m1_value(code) * s * (0.37 / 2688.0)
            })
            .collect();
        assert_same(&dequantize_all(&kernel), &expected, cols);
        let row_major = Owned::new(Dtype::F8E4M3, &[rows, groups], logical);
        assert_eq!(
            ComfyNvfp4::new(
                weight.stored(),
                row_major.stored(),
                scale_2.stored(),
                [rows, cols]
            )
            .unwrap_err()
            .to_string(),
            "weight_scale: shape [130, 6], expected [256, 8]"
        );
    }
}
