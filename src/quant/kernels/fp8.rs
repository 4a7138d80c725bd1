//! FP8 checkpoints outside compressed-tensors: fine-grained block scales (`quant_method: fp8`,
//! `DeepSeek-V3`, `Qwen3`, Mistral), per-tensor FP8 (`AutoFP8`, `ModelOpt` FP8) and fbgemm's row-wise
//! FP8.
//!
//! Every one multiplies: `W = fp8 · s`. `weight_scale_inv`, despite its name, multiplies too in
//! these checkpoints (transformers' and vLLM's kernels, compressed-tensors' converter).

use super::compressed_tensors::{Strategy, scaled};
use super::grouped::Grouped;
use super::{FLOAT_SCALES, KernelError, Stored, grouped_layout};
use crate::format::Dtype;

/// An `F8_E4M3` (or E5M2) `weight` times scales.
#[derive(Clone, Debug)]
pub struct Fp8<'a> {
    inner: Grouped<'a>,
}
grouped_layout!(Fp8);

/// Block scales: F32 (`DeepSeek-V3`), BF16 (`Qwen3`, Mistral), F16, or UE8M0 exponents (U8).
const BLOCK_SCALES: [Dtype; 5] = [
    Dtype::F32,
    Dtype::Bf16,
    Dtype::F16,
    Dtype::U8,
    Dtype::F8E8M0,
];

impl<'a> Fp8<'a> {
    /// `weight_scale_inv` `[⌈out/r⌉, ⌈in/c⌉]` for blocks of `[r, c]` (`weight_block_size`,
    /// usually `[128, 128]`); edge blocks may be partial. 3-D expert weights take
    /// `[experts, …]` scales.
    pub fn block(
        weight: Stored<'a>,
        weight_scale_inv: Stored<'a>,
        block: [usize; 2],
    ) -> Result<Self, KernelError> {
        fp8_weight(&weight)?;
        let inner = scaled(
            weight,
            ("weight_scale_inv", weight_scale_inv, &BLOCK_SCALES),
            None,
            None,
            Strategy::Block {
                rows: block[0],
                cols: block[1],
            },
            8,
        )?;
        Ok(Fp8 { inner })
    }

    /// One `weight_scale` for the whole weight (shape `[]` or `[1]`).
    pub fn per_tensor(weight: Stored<'a>, weight_scale: Stored<'a>) -> Result<Self, KernelError> {
        fp8_weight(&weight)?;
        let inner = scaled(
            weight,
            ("weight_scale", weight_scale, &FLOAT_SCALES),
            None,
            None,
            Strategy::Tensor,
            8,
        )?;
        Ok(Fp8 { inner })
    }

    /// One `weight_scale` per output row: `[out, 1]` (fbgemm, `ModelOpt` per-channel) or `[out]`.
    pub fn row_wise(weight: Stored<'a>, weight_scale: Stored<'a>) -> Result<Self, KernelError> {
        fp8_weight(&weight)?;
        let inner = scaled(
            weight,
            ("weight_scale", weight_scale, &FLOAT_SCALES),
            None,
            None,
            Strategy::Channel,
            8,
        )?;
        Ok(Fp8 { inner })
    }
}

fn fp8_weight(weight: &Stored<'_>) -> Result<(), KernelError> {
    weight.check("weight", &[Dtype::F8E4M3, Dtype::F8E5M2])
}

#[cfg(test)]
mod tests {
    #![expect(
        clippy::cast_possible_truncation,
        reason = "fixtures of small, known sizes and values"
    )]
    use super::super::testing::{
        Owned, Rng, assert_same, dequantize_all, e4m3_encode, e4m3_value, e8m0_value, round_to,
    };
    use super::super::{Dequantize, Problem};
    use super::*;

    fn fp8_codes(rng: &mut Rng, count: usize) -> Vec<u8> {
        (0..count)
            .map(|_| e4m3_encode(rng.signed() * 448.0))
            .collect()
    }

    #[test]
    fn block_scales_multiply_with_partial_edge_blocks_and_experts() {
        let (experts, rows, cols, block) = (2, 5, 7, [2, 3]);
        let mut rng = Rng::new(21);
        let codes = fp8_codes(&mut rng, experts * rows * cols);
        let weight = Owned::new(Dtype::F8E4M3, &[experts, rows, cols], codes.clone());
        let (block_rows, block_cols) = (3, 3);
        let count = experts * block_rows * block_cols;
        let cell = |r: usize, i: usize| {
            let (e, o) = (r / rows, r % rows);
            (e * block_rows + o / block[0]) * block_cols + i / block[1]
        };
        for dtype in [Dtype::F32, Dtype::Bf16] {
            let values: Vec<f32> = (0..count)
                .map(|_| rng.signed().abs() * 1e-3 + 1e-5)
                .collect();
            let scale = Owned::floats(dtype, &[experts, block_rows, block_cols], &values);
            let kernel = Fp8::block(weight.stored(), scale.stored(), block).unwrap();
            assert_eq!((kernel.rows(), kernel.experts()), (experts * rows, experts));
            let expected: Vec<f32> = (0..experts * rows * cols)
                .map(|k| {
                    round_to(
                        dtype,
                        e4m3_value(codes[k]) * scale.float(cell(k / cols, k % cols)),
                    )
                })
                .collect();
            assert_same(&dequantize_all(&kernel), &expected, cols);
        }
        // UE8M0 exponents in U8.
        let exponents: Vec<u8> = (0..count).map(|_| 110 + rng.below(20) as u8).collect();
        let scale = Owned::new(
            Dtype::U8,
            &[experts, block_rows, block_cols],
            exponents.clone(),
        );
        let kernel = Fp8::block(weight.stored(), scale.stored(), block).unwrap();
        let expected: Vec<f32> = (0..experts * rows * cols)
            .map(|k| e4m3_value(codes[k]) * e8m0_value(exponents[cell(k / cols, k % cols)]))
            .collect();
        assert_same(&dequantize_all(&kernel), &expected, cols);
        let wrong = Owned::f32(&[experts, 2, 3], &[1.0; 12]);
        assert_eq!(
            Fp8::block(weight.stored(), wrong.stored(), block)
                .unwrap_err()
                .to_string(),
            "weight_scale_inv: shape [2, 2, 3], expected [2, 3, 3]"
        );
    }

    #[test]
    fn per_tensor_and_row_wise_scales() {
        let (rows, cols) = (4, 9);
        let mut rng = Rng::new(22);
        let codes = fp8_codes(&mut rng, rows * cols);
        let weight = Owned::new(Dtype::F8E4M3, &[rows, cols], codes.clone());
        let scalar = Owned::f32(&[], &[0.0123]);
        let kernel = Fp8::per_tensor(weight.stored(), scalar.stored()).unwrap();
        let expected: Vec<f32> = codes.iter().map(|&c| e4m3_value(c) * 0.0123).collect();
        assert_same(&dequantize_all(&kernel), &expected, cols);
        let rows_scale: Vec<f32> = (0..rows).map(|r| 0.001 * (r + 1) as f32).collect();
        for shape in [vec![rows, 1], vec![rows]] {
            let scale = Owned::f32(&shape, &rows_scale);
            let kernel = Fp8::row_wise(weight.stored(), scale.stored()).unwrap();
            let expected: Vec<f32> = (0..rows * cols)
                .map(|k| e4m3_value(codes[k]) * rows_scale[k / cols])
                .collect();
            assert_same(&dequantize_all(&kernel), &expected, cols);
        }
        let mut counts = vec![0u64; 256];
        kernel.count_codes(0..rows, &mut counts);
        assert_eq!(counts.iter().sum::<u64>(), (rows * cols) as u64);
        assert!(counts[usize::from(codes[0])] > 0);
        let zero = Owned::f32(&[1], &[0.0]);
        let kernel = Fp8::per_tensor(weight.stored(), zero.stored()).unwrap();
        let problems = kernel.scale_problems();
        assert_eq!(
            (problems.total, problems.first[0].problem),
            (1, Problem::Zero)
        );
        assert_eq!(problems.first[0].rows, 0..rows);
    }
}
