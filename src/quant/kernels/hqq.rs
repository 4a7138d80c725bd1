//! HQQ (`quant_method: hqq`): `P.W_q` packed unsigned codes, `P.scale` and `P.zero` (floats:
//! the zero point is no integer), `P.shape` the logical shape.
//!
//! The weight, flattened, is a matrix of groups of `g`: with `axis = 1` `[numel/g, g]`, a group
//! a row (`scale`, `zero` `[numel/g, 1]`); with `axis = 0` `[g, numel/g]`, a group a column
//! (`scale`, `zero` `[1, numel/g]`). `W_q` packs that matrix along its rows in `8/b` chunks,
//! the first chunk in the **high** bits (`4bit_u8`: rows `[0, R/2)` in the high nibble). Values
//! are `((u − zero) · scale)` computed in the scales' type, the difference and the product each
//! rounded to it (`Quantizer.dequantize`). The U8 packings hold 1, 2, 4 or 8 bits; `3bit_32`
//! packs 3-bit codes in I32 words, ten chunks at shifts 27, 24, ..., 0, the group matrix's rows
//! padded to a multiple of ten (`BitPack.pack_3bit_32`).

use super::decode::Floats;
use super::grouped::Half;
use super::{
    CodeKind, CodeSpace, Dequantize, FLOAT_SCALES, KernelError, Problem, ScaleProblem,
    ScaleProblems, Stored, floats,
};
use crate::format::Dtype;
use std::ops::Range;

#[derive(Clone, Debug)]
pub struct Hqq<'a> {
    codes: &'a [u8],
    /// Bytes of a stored word: 1 (U8 packings) or 4 (`3bit_32`, little-endian).
    word_bytes: usize,
    /// Chunks of the group matrix's rows a word holds, the first in its highest bits.
    per_word: usize,
    scale: Floats<'a>,
    zero: Floats<'a>,
    rows: usize,
    cols: usize,
    bits: u32,
    /// Rows of the group matrix stored in each chunk (the rows of `W_q`).
    chunk_rows: usize,
    /// Columns of the group matrix.
    width: usize,
    /// A group is a column of the group matrix (`axis = 0`), not a row.
    by_column: bool,
    groups: usize,
    rounding: Option<Half>,
}

impl<'a> Hqq<'a> {
    /// The weight of logical shape `[rows, cols]` from its `W_q`, `scale` and `zero`.
    pub fn new(
        w_q: Stored<'a>,
        scale: Stored<'a>,
        zero: Stored<'a>,
        [rows, cols]: [usize; 2],
    ) -> Result<Self, KernelError> {
        w_q.check("W_q", &[Dtype::U8, Dtype::I32])?;
        if w_q.shape.len() != 2 || scale.shape.len() != 2 {
            return Err(KernelError::new(
                "W_q",
                format!(
                    "shapes {:?} and scale {:?}, expected 2 dimensions each",
                    w_q.shape, scale.shape
                ),
            ));
        }
        let count = rows
            .checked_mul(cols)
            .ok_or_else(|| KernelError::new("W_q", "the shape overflows"))?;
        let by_column = scale.dim(0) == 1 && scale.dim(1) != 1;
        let groups = if by_column {
            scale.dim(1)
        } else {
            scale.dim(0)
        };
        scale.check("scale", &FLOAT_SCALES)?;
        zero.check_shape("zero", &FLOAT_SCALES, &[scale.dim(0), scale.dim(1)])?;
        if groups == 0 || !count.is_multiple_of(groups) {
            return Err(KernelError::new(
                "scale",
                format!("{groups} groups do not divide [{rows}, {cols}]"),
            ));
        }
        let size = count / groups;
        // The group matrix: groups as rows (axis 1) or as columns (axis 0).
        let (matrix_rows, width) = if by_column {
            (size, groups)
        } else {
            (groups, size)
        };
        let (chunk_rows, stored_width) = (w_q.dim(0), w_q.dim(1));
        let (word_bytes, per_word, bits, fits) = if w_q.dtype == Dtype::I32 {
            (4, 10, 3, chunk_rows == matrix_rows.div_ceil(10))
        } else {
            let per_byte = matrix_rows.checked_div(chunk_rows).unwrap_or(0);
            let bits = match per_byte {
                1 => 8,
                2 => 4,
                4 => 2,
                8 => 1,
                _ => 0,
            };
            (
                1,
                per_byte,
                bits,
                bits > 0 && chunk_rows * per_byte == matrix_rows,
            )
        };
        if !fits || stored_width != width {
            return Err(KernelError::new(
                "W_q",
                format!(
                    "shape {:?} ({}) does not pack a [{matrix_rows}, {width}] matrix of codes \
                     in 1, 2, 4 or 8 bits (U8) or 3 bits (I32)",
                    w_q.shape,
                    w_q.dtype.name()
                ),
            ));
        }
        Ok(Hqq {
            codes: w_q.bytes,
            word_bytes,
            per_word,
            scale: floats("scale", &scale)?,
            zero: floats("zero", &zero)?,
            rows,
            cols,
            bits,
            chunk_rows,
            width,
            by_column,
            groups,
            rounding: Half::of(scale.dtype),
        })
    }

    /// The code of flat element `k` and its group.
    #[inline]
    fn code(&self, k: usize) -> (u8, usize) {
        let (m, j) = (k / self.width, k % self.width);
        let chunk = m / self.chunk_rows;
        let shift = self.bits * u32::try_from(self.per_word - 1 - chunk).unwrap_or(0);
        let at = ((m % self.chunk_rows) * self.width + j) * self.word_bytes;
        let word = self.codes[at..at + self.word_bytes]
            .iter()
            .rev()
            .fold(0u32, |word, &byte| word << 8 | u32::from(byte));
        let code = u8::try_from(word >> shift & ((1 << self.bits) - 1)).unwrap_or(0);
        (code, if self.by_column { j } else { m })
    }

    fn round(&self, value: f32) -> f32 {
        self.rounding.map_or(value, |half| half.round(value))
    }
}

impl Dequantize for Hqq<'_> {
    fn rows(&self) -> usize {
        self.rows
    }

    fn cols(&self) -> usize {
        self.cols
    }

    fn dequantize_rows(&self, rows: Range<usize>, out: &mut [f32]) {
        assert!(rows.end <= self.rows, "rows {rows:?} of {}", self.rows);
        assert_eq!(out.len(), rows.len() * self.cols, "output length");
        let start = rows.start * self.cols;
        for (i, value) in out.iter_mut().enumerate() {
            let (code, group) = self.code(start + i);
            let difference = self.round(f32::from(code) - self.zero.get(group));
            *value = self.round(difference * self.scale.get(group));
        }
    }

    fn codes(&self) -> Option<CodeSpace> {
        Some(CodeSpace {
            levels: 1 << self.bits,
            kind: CodeKind::Unsigned { bits: self.bits },
        })
    }

    fn count_codes(&self, rows: Range<usize>, counts: &mut [u64]) {
        assert_eq!(counts.len(), 1 << self.bits, "levels");
        for k in rows.start * self.cols..rows.end * self.cols {
            counts[usize::from(self.code(k).0)] += 1;
        }
    }

    fn scale_problems(&self) -> ScaleProblems {
        let mut problems = ScaleProblems::default();
        let size = self.rows * self.cols / self.groups;
        for group in 0..self.groups {
            // The logical rows the group touches: a run of flat elements, or (a column of the
            // group matrix) every row.
            let rows = if self.by_column {
                0..self.rows
            } else {
                let first = group * size;
                first / self.cols..(first + size).div_ceil(self.cols)
            };
            let (s, z) = (self.scale.get(group), self.zero.get(group));
            let mut note = |member: &'static str, problem: Problem, value: f32| {
                problems.push(ScaleProblem {
                    member,
                    problem,
                    rows: rows.clone(),
                    group,
                    value: f64::from(value),
                });
            };
            if s.is_nan() {
                note("scale", Problem::NaN, s);
            } else if s.is_infinite() {
                note("scale", Problem::Infinite, s);
            } else if s == 0.0 {
                note("scale", Problem::Zero, s);
            }
            if z.is_nan() {
                note("zero", Problem::NaN, z);
            } else if z.is_infinite() {
                note("zero", Problem::Infinite, z);
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Owned, Rng, assert_same, dequantize_all, round_bf16};
    use super::*;

    /// BF16 scales and zero points of `groups` row groups (`axis = 1`), zero points up to
    /// `largest_zero`.
    fn row_groups(rng: &mut Rng, groups: usize, largest_zero: f32) -> (Owned, Owned) {
        let scales: Vec<f32> = (0..groups).map(|_| rng.signed().abs() * 0.01).collect();
        let zeros: Vec<f32> = (0..groups)
            .map(|_| rng.signed().abs() * largest_zero)
            .collect();
        (
            Owned::bf16(&[groups, 1], &scales),
            Owned::bf16(&[groups, 1], &zeros),
        )
    }

    /// The values of `codes` in row groups of `group`, each step rounded to BF16 as hqq does.
    fn by_rows(codes: &[u8], group: usize, scale: &Owned, zero: &Owned) -> Vec<f32> {
        (0..codes.len())
            .map(|k| {
                let m = k / group;
                round_bf16(round_bf16(f32::from(codes[k]) - zero.float(m)) * scale.float(m))
            })
            .collect()
    }

    #[test]
    fn four_bit_rows_keep_the_first_half_in_the_high_nibble() {
        let (rows, cols, group) = (4, 16, 8);
        let groups = rows * cols / group; // 8 rows of 8: 4 byte rows
        let mut rng = Rng::new(5);
        let codes = rng.codes(4, rows * cols);
        let mut packed = vec![0u8; groups / 2 * group];
        for (k, &code) in codes.iter().enumerate() {
            let (m, j) = (k / group, k % group);
            let shift = if m < groups / 2 { 4 } else { 0 };
            packed[(m % (groups / 2)) * group + j] |= code << shift;
        }
        let (scale, zero) = row_groups(&mut rng, groups, 15.0);
        let w_q = Owned::new(Dtype::U8, &[groups / 2, group], packed);
        let kernel = Hqq::new(w_q.stored(), scale.stored(), zero.stored(), [rows, cols]).unwrap();
        let expected = by_rows(&codes, group, &scale, &zero);
        assert_same(&dequantize_all(&kernel), &expected, cols);
        let mut counts = vec![0; 16];
        kernel.count_codes(0..rows, &mut counts);
        assert_eq!(counts.iter().sum::<u64>(), (rows * cols) as u64);
    }

    #[test]
    fn three_bit_words_hold_ten_row_chunks_with_the_rows_padded() {
        // [4, 16] in groups of 8: an [8, 8] group matrix, padded to 10 rows: one word row.
        let (rows, cols, group) = (4, 16, 8);
        let groups = rows * cols / group;
        let mut rng = Rng::new(3);
        let codes = rng.codes(3, rows * cols);
        let mut words = vec![0u32; group];
        for (k, &code) in codes.iter().enumerate() {
            let (m, j) = (k / group, k % group);
            words[j] |= u32::from(code) << (27 - 3 * m);
        }
        let packed: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let (scale, zero) = row_groups(&mut rng, groups, 7.0);
        let w_q = Owned::new(Dtype::I32, &[1, group], packed);
        let kernel = Hqq::new(w_q.stored(), scale.stored(), zero.stored(), [rows, cols]).unwrap();
        let expected = by_rows(&codes, group, &scale, &zero);
        assert_same(&dequantize_all(&kernel), &expected, cols);
        assert_eq!(kernel.codes().unwrap().levels, 8);
        let mut counts = vec![0; 8];
        kernel.count_codes(0..rows, &mut counts);
        let mut expected_counts = vec![0; 8];
        for &code in &codes {
            expected_counts[usize::from(code)] += 1;
        }
        assert_eq!(counts, expected_counts);
        // Words for fewer rows than the padded matrix needs are refused.
        let short = Owned::new(Dtype::I32, &[1, group / 2], vec![0; group / 2 * 4]);
        assert!(Hqq::new(short.stored(), scale.stored(), zero.stored(), [rows, cols]).is_err());
    }

    #[test]
    fn axis_zero_groups_are_columns_of_the_group_matrix() {
        // [2, 8] = 16 values in groups of 4: a [4, 4] group matrix whose columns are groups.
        let (rows, cols, size) = (2, 8, 4);
        let groups = rows * cols / size;
        let mut rng = Rng::new(9);
        let codes = rng.codes(2, rows * cols);
        // 2-bit codes: rows of the group matrix in four chunks of one, the first the highest.
        let mut packed = vec![0u8; groups];
        for (k, &code) in codes.iter().enumerate() {
            let (m, j) = (k / groups, k % groups);
            packed[j] |= code << (2 * (3 - m));
        }
        let scales: Vec<f32> = (0..groups).map(|g| 0.5 + g as f32).collect();
        let zeros: Vec<f32> = (0..groups).map(|g| 0.25 * g as f32).collect();
        let (scale, zero) = (
            Owned::f32(&[1, groups], &scales),
            Owned::f32(&[1, groups], &zeros),
        );
        let w_q = Owned::new(Dtype::U8, &[1, groups], packed);
        let kernel = Hqq::new(w_q.stored(), scale.stored(), zero.stored(), [rows, cols]).unwrap();
        let expected: Vec<f32> = (0..rows * cols)
            .map(|k| {
                let g = k % groups;
                (f32::from(codes[k]) - zeros[g]) * scales[g]
            })
            .collect();
        assert_same(&dequantize_all(&kernel), &expected, cols);
        assert_eq!(kernel.codes().unwrap().levels, 4);
    }

    #[test]
    fn a_zero_scale_and_a_nan_zero_point_name_their_group() {
        let w_q = Owned::new(Dtype::U8, &[1, 8], vec![0; 8]);
        let scale = Owned::f32(&[2, 1], &[0.0, 1.0]);
        let zero = Owned::f32(&[2, 1], &[1.0, f32::NAN]);
        let kernel = Hqq::new(w_q.stored(), scale.stored(), zero.stored(), [2, 8]).unwrap();
        let problems = kernel.scale_problems();
        assert_eq!(problems.total, 2);
        assert_eq!(
            (
                problems.first[0].member,
                problems.first[0].problem,
                problems.first[0].rows.clone()
            ),
            ("scale", Problem::Zero, 0..1)
        );
        assert_eq!(
            (
                problems.first[1].member,
                problems.first[1].problem,
                problems.first[1].group
            ),
            ("zero", Problem::NaN, 1)
        );
    }
}
