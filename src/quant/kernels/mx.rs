//! FP4 and FP8 block formats outside compressed-tensors: `ModelOpt` NVFP4 and gpt-oss MXFP4.
//!
//! `ModelOpt`'s `weight_scale_2` multiplies (`W = v · fp8(weight_scale) · weight_scale_2`), where
//! compressed-tensors' `weight_global_scale` divides. gpt-oss stores its `MoE` experts as
//! `_blocks` `[E, out, in/32, 16]` (two E2M1 codes a byte, low nibble first) and `_scales`
//! `[E, out, in/32]` (E8M0): `W = v · 2^(s − 127)`.

use super::compressed_tensors::{check_group_scales, fp4};
use super::decode::{FloatKind, Floats};
use super::grouped::{Grouped, Source};
use super::{KernelError, Stored, e8m0_scales, grouped_layout, scalar};
use crate::format::Dtype;

/// `ModelOpt` NVFP4: `weight` U8 `[out, in/2]`, `weight_scale` `F8_E4M3` `[out, in/16]`,
/// `weight_scale_2` F32 scalar.
#[derive(Clone, Debug)]
pub struct ModelOptNvfp4<'a> {
    inner: Grouped<'a>,
}
grouped_layout!(ModelOptNvfp4);

impl<'a> ModelOptNvfp4<'a> {
    /// `cols` is the logical width (twice the packed width unless the input was odd).
    pub fn new(
        weight: Stored<'a>,
        weight_scale: Stored<'a>,
        weight_scale_2: Stored<'a>,
        cols: usize,
    ) -> Result<Self, KernelError> {
        let factor = scalar("weight_scale_2", &weight_scale_2, &[Dtype::F32])?;
        let scales = Source::Stored(Floats::new(weight_scale.bytes, FloatKind::E4M3));
        let mut inner = fp4(
            "weight",
            &weight,
            weight.bytes,
            cols,
            16,
            scales,
            "weight_scale",
        )?;
        check_group_scales("weight_scale", &weight_scale, &inner, 16, &[Dtype::F8E4M3])?;
        inner.factor = Some(factor);
        Ok(ModelOptNvfp4 { inner })
    }
}

/// gpt-oss MXFP4 experts (`quant_method: mxfp4`): the logical weight is `[E, out, in]`.
#[derive(Clone, Debug)]
pub struct GptOssMxfp4<'a> {
    inner: Grouped<'a>,
}
grouped_layout!(GptOssMxfp4);

impl<'a> GptOssMxfp4<'a> {
    pub fn new(blocks: Stored<'a>, scales: Stored<'a>) -> Result<Self, KernelError> {
        blocks.check("blocks", &[Dtype::U8])?;
        if blocks.shape.len() != 4 || blocks.shape[3] != 16 {
            return Err(KernelError::new(
                "blocks",
                format!(
                    "shape {:?}, expected [experts, out, in/32, 16]",
                    blocks.shape
                ),
            ));
        }
        let (experts, rows, groups) = (blocks.dim(0), blocks.dim(1), blocks.dim(2));
        let shape = [experts as u64, rows as u64, (groups * 16) as u64];
        let folded = Stored {
            bytes: blocks.bytes,
            dtype: Dtype::U8,
            shape: &shape,
        };
        let values = Source::Stored(e8m0_scales("scales", &scales)?);
        let inner = fp4(
            "blocks",
            &folded,
            blocks.bytes,
            groups * 32,
            32,
            values,
            "scales",
        )?;
        check_group_scales("scales", &scales, &inner, 32, &[Dtype::U8, Dtype::F8E8M0])?;
        Ok(GptOssMxfp4 { inner })
    }
}

#[cfg(test)]
mod tests {
    #![expect(
        clippy::cast_possible_truncation,
        reason = "fixtures of small, known sizes and values"
    )]
    use super::super::Dequantize;
    use super::super::testing::{
        Owned, Rng, assert_same, dequantize_all, e2m1_value, e4m3_value, e8m0_value,
    };
    use super::*;

    #[test]
    fn modelopt_nvfp4_multiplies_by_weight_scale_2() {
        let (rows, cols) = (3, 32);
        let mut rng = Rng::new(31);
        let bytes: Vec<u8> = (0..rows * cols / 2).map(|_| rng.below(256) as u8).collect();
        let weight = Owned::new(Dtype::U8, &[rows, cols / 2], bytes.clone());
        let scale_codes: Vec<u8> = (0..rows * 2)
            .map(|_| 0x20 + rng.below(0x40) as u8)
            .collect();
        let scales = Owned::new(Dtype::F8E4M3, &[rows, 2], scale_codes.clone());
        let scale_2 = 0.37 / (448.0 * 6.0);
        let global = Owned::f32(&[], &[scale_2]);
        let kernel =
            ModelOptNvfp4::new(weight.stored(), scales.stored(), global.stored(), cols).unwrap();
        let expected: Vec<f32> = (0..rows * cols)
            .map(|k| {
                let byte = bytes[k / 2];
                let code = if k % 2 == 0 { byte & 15 } else { byte >> 4 };
                let s = e4m3_value(scale_codes[(k / cols) * 2 + (k % cols) / 16]);
                e2m1_value(code) * s * scale_2
            })
            .collect();
        assert_same(&dequantize_all(&kernel), &expected, cols);
    }

    #[test]
    fn gpt_oss_blocks_hold_two_codes_a_byte_low_first() {
        let (experts, rows, groups) = (2, 3, 2);
        let mut rng = Rng::new(32);
        let bytes: Vec<u8> = (0..experts * rows * groups * 16)
            .map(|_| rng.below(256) as u8)
            .collect();
        let blocks = Owned::new(Dtype::U8, &[experts, rows, groups, 16], bytes.clone());
        let exponents: Vec<u8> = (0..experts * rows * groups)
            .map(|_| 117 + rng.below(20) as u8)
            .collect();
        let scales = Owned::new(Dtype::U8, &[experts, rows, groups], exponents.clone());
        let kernel = GptOssMxfp4::new(blocks.stored(), scales.stored()).unwrap();
        let cols = groups * 32;
        assert_eq!(
            (kernel.rows(), kernel.cols(), kernel.experts()),
            (experts * rows, cols, experts)
        );
        // Element [e, n, t, j]: low nibble is column 32t + 2j, high nibble 32t + 2j + 1.
        let mut expected = vec![0f32; experts * rows * cols];
        for (index, &byte) in bytes.iter().enumerate() {
            let (j, t, row) = (index % 16, (index / 16) % groups, index / (16 * groups));
            let s = e8m0_value(exponents[row * groups + t]);
            expected[row * cols + 32 * t + 2 * j] = e2m1_value(byte & 15) * s;
            expected[row * cols + 32 * t + 2 * j + 1] = e2m1_value(byte >> 4) * s;
        }
        assert_same(&dequantize_all(&kernel), &expected, cols);
        let wrong = Owned::new(
            Dtype::U8,
            &[experts, rows, groups, 8],
            vec![0; experts * rows * groups * 8],
        );
        assert_eq!(
            GptOssMxfp4::new(wrong.stored(), scales.stored())
                .unwrap_err()
                .to_string(),
            "blocks: shape [2, 3, 2, 8], expected [experts, out, in/32, 16]"
        );
    }
}
