//! AWQ GEMM (`AutoAWQ`, `GPTQModel`): `qweight` `[in, out/8]` packed along the output dimension in
//! the nibble order `[0, 4, 1, 5, 2, 6, 3, 7]`, `qzeros` `[in/g, out/8]` in the same order (raw
//! codes, no offset), F16 `scales` `[in/g, out]`.
//!
//! `W[n, k] = (q[k, n] − z[k/g, n]) · s[k/g, n]` (`packing_utils.py dequantize_gemm`).

use super::grouped::{
    Checks, Codes, Grid, Grouped, Groups, Half, PackedCodes, PackedZeros, Source, Value,
};
use super::{FLOAT_SCALES, KernelError, Packing, Stored, floats, grouped_layout};
use crate::format::Dtype;

#[derive(Clone, Debug)]
pub struct Awq<'a> {
    inner: Grouped<'a>,
}
grouped_layout!(Awq);

impl<'a> Awq<'a> {
    /// 4-bit GEMM. Without `qzeros` every zero is 8 (as `mlx-lm` reads such exports).
    pub fn new(
        qweight: Stored<'a>,
        qzeros: Option<Stored<'a>>,
        scales: Stored<'a>,
    ) -> Result<Self, KernelError> {
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
        let (cols, words) = (qweight.dim(0), qweight.dim(1));
        let (groups, rows) = (scales.dim(0), scales.dim(1));
        if rows != words * 8 {
            return Err(KernelError::new(
                "scales",
                format!(
                    "{rows} columns, qweight's {words} words a row hold {}",
                    words * 8
                ),
            ));
        }
        if groups == 0 || cols % groups != 0 {
            return Err(KernelError::new(
                "scales",
                format!("{groups} groups do not divide {cols} input columns"),
            ));
        }
        let zeros = match qzeros {
            Some(qzeros) => {
                qzeros.check_shape("qzeros", &[Dtype::I32], &[groups, words])?;
                Grid {
                    values: Source::Packed(PackedCodes {
                        bytes: qzeros.bytes,
                        bits: 4,
                        packing: Packing::Dense,
                        offset: 0.0,
                        layout: PackedZeros::Awq { words },
                    }),
                    row_stride: 0,
                    group_stride: 0,
                }
            }
            None => Grid::constant(8.0),
        };
        Ok(Awq {
            inner: Grouped {
                rows,
                cols,
                experts: 1,
                codes: Codes::Awq {
                    bytes: qweight.bytes,
                    rows,
                },
                value: Value::Unsigned {
                    bits: 4,
                    offset: 0.0,
                },
                groups: Groups::Tiles {
                    rows: 1,
                    cols: cols / groups,
                    expert_rows: rows,
                },
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
    use super::super::testing::{Owned, Rng, assert_same, dequantize_all, round_f16};
    use super::*;

    /// `AutoAWQ`'s packing: nibble `p` of word `c` holds output `8c + ORDER[p]`.
    const ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

    fn pack_awq(codes: &[u8], rows: usize, lines: usize) -> Vec<i32> {
        // `codes[line][n]`, `lines` input rows (or groups) of `rows` outputs.
        let mut words = vec![0u32; lines * rows / 8];
        for line in 0..lines {
            for c in 0..rows / 8 {
                for (p, &offset) in ORDER.iter().enumerate() {
                    let code = u32::from(codes[line * rows + 8 * c + offset]);
                    words[line * rows / 8 + c] |= code << (4 * p);
                }
            }
        }
        words.into_iter().map(u32::cast_signed).collect()
    }

    #[test]
    fn nibbles_follow_awq_order_and_zeros_are_raw_codes() {
        let (rows, cols, group) = (24, 64, 16);
        let groups = cols / group;
        let mut rng = Rng::new(5);
        let codes = rng.codes(4, cols * rows); // [k][n]
        let zeros = rng.codes(4, groups * rows); // [g][n]
        let scale_values: Vec<f32> = (0..groups * rows)
            .map(|_| rng.signed().abs() * 0.01 + 1e-3)
            .collect();
        let qweight = Owned::i32(&[cols, rows / 8], &pack_awq(&codes, rows, cols));
        let qzeros = Owned::i32(&[groups, rows / 8], &pack_awq(&zeros, rows, groups));
        let scales = Owned::f16(&[groups, rows], &scale_values);
        let kernel = Awq::new(qweight.stored(), Some(qzeros.stored()), scales.stored()).unwrap();
        let expected: Vec<f32> = (0..rows * cols)
            .map(|e| {
                let (n, k) = (e / cols, e % cols);
                let cell = (k / group) * rows + n;
                let q = f32::from(codes[k * rows + n]) - f32::from(zeros[cell]);
                round_f16(q * scales.float(cell))
            })
            .collect();
        assert_same(&dequantize_all(&kernel), &expected, cols);
        // Without qzeros, every zero is 8.
        let kernel = Awq::new(qweight.stored(), None, scales.stored()).unwrap();
        let expected: Vec<f32> = (0..rows * cols)
            .map(|e| {
                let (n, k) = (e / cols, e % cols);
                let cell = (k / group) * rows + n;
                round_f16((f32::from(codes[k * rows + n]) - 8.0) * scales.float(cell))
            })
            .collect();
        assert_same(&dequantize_all(&kernel), &expected, cols);
        let wrong = Owned::f16(&[groups, rows + 8], &vec![0.1; groups * (rows + 8)]);
        assert_eq!(
            Awq::new(qweight.stored(), None, wrong.stored())
                .unwrap_err()
                .to_string(),
            "scales: 32 columns, qweight's 3 words a row hold 24"
        );
    }
}
