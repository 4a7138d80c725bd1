//! optimum-quanto: `weight._data` with `weight._scale` (and `weight._shift` for 2 and 4 bits).
//!
//! qint8 and qfloat8: `_data` I8 or `F8_E4M3` `[out, in]`, `_scale` `[out, 1]`: `W = s · q`.
//! qint4 and qint2: the flattened weight is a `[R, g]` matrix of groups (`R = out·in/g`);
//! `_data` U8 `[⌈R/(8/b)⌉, g]` holds its rows in chunks, chunk `k` at bit `b·k` (the first
//! half of the rows in the low nibble for 4 bits); `_scale` and `_shift` `[R, 1]`:
//! `W = s · u − shift`, computed in the scales' type, the product and the difference each
//! rounded to it (`QBitsDequantizer`). quanto stores no logical shape: it is the dense
//! original's.

use super::compressed_tensors::{Strategy, scaled};
use super::grouped::{Checks, Codes, Grid, Grouped, Groups, Half, Source, Value};
use super::{FLOAT_SCALES, KernelError, Stored, floats, grouped_layout};
use crate::format::Dtype;

#[derive(Clone, Debug)]
pub struct Quanto<'a> {
    inner: Grouped<'a>,
}
grouped_layout!(Quanto);

impl<'a> Quanto<'a> {
    /// qint8 (I8) or qfloat8 (F8) `_data` with its row scales.
    pub fn bytes(data: Stored<'a>, scale: Stored<'a>) -> Result<Self, KernelError> {
        let inner = scaled(
            data,
            ("_scale", scale, &FLOAT_SCALES),
            None,
            None,
            Strategy::Channel,
            8,
        )?;
        Ok(Quanto { inner })
    }

    /// qint4 or qint2 (`bits` 4 or 2) of logical shape `[out, in]`.
    pub fn packed(
        data: Stored<'a>,
        scale: Stored<'a>,
        shift: Stored<'a>,
        bits: u32,
        [rows, cols]: [usize; 2],
    ) -> Result<Self, KernelError> {
        if ![2, 4].contains(&bits) {
            return Err(KernelError::new("_data", format!("{bits} bits")));
        }
        data.check("_data", &[Dtype::U8])?;
        if data.shape.len() != 2 || scale.shape.len() != 2 {
            return Err(KernelError::new(
                "_data",
                format!(
                    "shapes {:?} and _scale {:?}, expected 2 dimensions each",
                    data.shape, scale.shape
                ),
            ));
        }
        let (chunk_rows, width) = (data.dim(0), data.dim(1));
        let groups = scale.dim(0);
        scale.check_shape("_scale", &FLOAT_SCALES, &[groups, 1])?;
        shift.check_shape("_shift", &[scale.dtype], &[groups, 1])?;
        let per_byte = (8 / bits) as usize;
        if width == 0 || groups * width != rows * cols || groups.div_ceil(per_byte) != chunk_rows {
            return Err(KernelError::new(
                "_data",
                format!(
                    "shape {:?} with {groups} groups does not hold [{rows}, {cols}] in {bits}-bit codes",
                    data.shape
                ),
            ));
        }
        let grid = |values| Grid {
            values,
            row_stride: 0,
            group_stride: 1,
        };
        Ok(Quanto {
            inner: Grouped {
                rows,
                cols,
                experts: 1,
                codes: Codes::Chunks {
                    bytes: data.bytes,
                    bits,
                    chunk_rows,
                    width,
                },
                value: Value::Unsigned { bits, offset: 0.0 },
                groups: Groups::Flat { size: width },
                scales: grid(Source::Stored(floats("_scale", &scale)?)),
                scale_member: "_scale",
                zeros: None,
                biases: Some((grid(Source::Negated(floats("_shift", &shift)?)), "_shift")),
                factor: None,
                rounding: Half::of(scale.dtype),
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
    use super::super::testing::{Owned, Rng, assert_same, dequantize_all, round_bf16};
    use super::*;

    #[test]
    fn two_bit_rows_are_stored_in_four_chunks_lowest_first() {
        let (rows, cols, group) = (6, 32, 16);
        let groups = rows * cols / group; // 12 rows of 16, in 4 chunks of 3 byte rows
        let mut rng = Rng::new(61);
        let codes = rng.codes(2, groups * group);
        let mut data = vec![0u8; 3 * group];
        for (k, &code) in codes.iter().enumerate() {
            let (r, c) = (k / group, k % group);
            data[(r % 3) * group + c] |= code << (2 * (r / 3));
        }
        let scales: Vec<f32> = (0..groups)
            .map(|_| rng.signed().abs() * 0.01 + 1e-3)
            .collect();
        let shifts: Vec<f32> = (0..groups).map(|_| rng.signed() * 0.01).collect();
        let data = Owned::new(Dtype::U8, &[3, group], data);
        let scale = Owned::bf16(&[groups, 1], &scales);
        let shift = Owned::bf16(&[groups, 1], &shifts);
        let kernel = Quanto::packed(
            data.stored(),
            scale.stored(),
            shift.stored(),
            2,
            [rows, cols],
        )
        .unwrap();
        let expected: Vec<f32> = (0..rows * cols)
            .map(|k| {
                let r = k / group;
                round_bf16(round_bf16(scale.float(r) * f32::from(codes[k])) - shift.float(r))
            })
            .collect();
        assert_same(&dequantize_all(&kernel), &expected, cols);
        assert_eq!(
            Quanto::packed(
                data.stored(),
                scale.stored(),
                shift.stored(),
                2,
                [rows, cols + 1]
            )
            .unwrap_err()
            .to_string(),
            "_data: shape [3, 16] with 12 groups does not hold [6, 33] in 2-bit codes"
        );
    }
}
