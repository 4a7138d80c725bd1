//! Exact dequantization of quantized weights, one file per layout family.
//!
//! A layout is built from its member tensors (borrowed bytes with their dtype and shape) and the
//! scheme's parameters; its constructor checks every member against them and names the member
//! and what is wrong. It then gives the logical weight's rows a block at a time (callers stream:
//! no whole tensor is ever dequantized into memory), counts the stored codes (levels used, codes
//! clipped at the extremes), and lists the scales and zero points that break a group.
//!
//! Values are the producer's own, bit for bit: its operations in its order, each rounded to
//! the type it computes in. The torch producers compute in the scales' type (BF16 or F16 gives
//! `bf16((q − zp) · s)`, F32 gives the F32 product), MLX rounds its product and then its sum to
//! the scales' type, bitsandbytes computes in F32, compressed-tensors' NVFP4 rounds to BF16.
//! A final cast to the model's dtype that a loader may add is not applied. The checkpoints of
//! `tests/fixtures/quant`, written by the producers themselves, are checked against their own
//! dequantization (`tests/it/quant_kernels.rs`).
//!
//! This module knows nothing of files, configs or names: recognising a scheme and finding its
//! members is done above it.

pub mod awq;
mod bits;
pub mod bnb;
pub mod comfy;
pub mod compressed_tensors;
mod decode;
pub mod fp8;
pub mod gptq;
mod grouped;
pub mod hqq;
pub mod mlx;
pub mod mx;
pub mod quanto;

pub use bits::Packing;

use crate::format::Dtype;
use std::fmt;
use std::ops::Range;

/// A member tensor as stored: its bytes (little-endian, as in the file) and how they are stored.
#[derive(Clone, Copy, Debug)]
pub struct Stored<'a> {
    pub bytes: &'a [u8],
    pub dtype: Dtype,
    pub shape: &'a [u64],
}

/// A member that does not fit the layout: which member, and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{member}: {message}")]
pub struct KernelError {
    /// The member's role in the layout (`weight_scale`, `qzeros`...).
    pub member: &'static str,
    pub message: String,
}

impl KernelError {
    pub(crate) fn new(member: &'static str, message: impl Into<String>) -> Self {
        KernelError {
            member,
            message: message.into(),
        }
    }
}

/// A logical weight's dequantization.
pub trait Dequantize: Send + Sync {
    /// Logical rows: `out` of `[out, in]`; for `MoE` weights `experts · out`.
    fn rows(&self) -> usize;
    /// Logical columns: `in` of `[out, in]`.
    fn cols(&self) -> usize;
    /// `MoE` experts folded into the rows (1 for a plain weight).
    fn experts(&self) -> usize {
        1
    }
    /// Writes logical rows `rows` (row-major, `rows.len() · cols()` values) into `out`, equal to
    /// the producer's own dequantization in `f32`.
    ///
    /// # Panics
    /// When `rows` goes past [`Dequantize::rows`] or `out` has another length.
    fn dequantize_rows(&self, rows: Range<usize>, out: &mut [f32]);
    /// The codes the weight is stored as, if it has codes.
    fn codes(&self) -> Option<CodeSpace>;
    /// Adds how many elements of `rows` hold each level to `counts` (`codes().levels` long).
    ///
    /// # Panics
    /// When the weight has no codes, `counts` has another length or `rows` goes too far.
    fn count_codes(&self, rows: Range<usize>, counts: &mut [u64]);
    /// The scales, zero points and biases that break their group.
    fn scale_problems(&self) -> ScaleProblems;
    /// Logical row `row` as codes and what each group's codes stand for, made in `scratch`,
    /// for statistics taken without writing its values out; `None` when the layout has no such
    /// form.
    ///
    /// # Panics
    /// When `row` goes past [`Dequantize::rows`].
    fn fused_row<'s>(&'s self, row: usize, scratch: &'s mut FusedScratch) -> Option<FusedRow<'s>> {
        let _ = (row, scratch);
        None
    }
}

/// A row of a weight as its codes and, per group of columns (runs of equal length, in order),
/// what they stand for: each value is the one [`Dequantize::dequantize_rows`] gives.
#[derive(Debug)]
pub enum FusedRow<'a> {
    /// Packed four-bit codes, each byte's low half first; each group's codes index its table.
    Nibbles {
        codes: &'a [u8],
        tables: &'a [[f32; 16]],
    },
    /// E4M3 codes; each value is `e4m3(c) · scale` in `f32`, then rounded to `rounding`.
    E4m3 {
        codes: &'a [u8],
        scales: &'a [f32],
        rounding: Option<Half>,
    },
}

pub use grouped::{FusedScratch, Half};

/// The codes of a weight: how many levels, and what level `k` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeSpace {
    pub levels: usize,
    pub kind: CodeKind,
}

/// How many of a weight's elements hold each level of its codes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeCounts {
    pub space: CodeSpace,
    /// `space.levels` counts.
    pub counts: Vec<u64>,
}

impl CodeCounts {
    pub fn new(space: CodeSpace) -> CodeCounts {
        CodeCounts {
            space,
            counts: vec![0; space.levels],
        }
    }

    pub fn merge(&mut self, other: &CodeCounts) {
        for (count, more) in self.counts.iter_mut().zip(&other.counts) {
            *count += more;
        }
    }

    /// Levels that hold at least one element.
    pub fn used(&self) -> usize {
        self.counts.iter().filter(|&&c| c > 0).count()
    }

    /// Elements at the lowest and the highest integer code, where rounding clips (`None` for
    /// float codes and tables, whose extremes are no clipping).
    pub fn clipped(&self) -> Option<(u64, u64)> {
        match self.space.kind {
            CodeKind::Unsigned { .. } | CodeKind::Signed { .. } => Some((
                self.counts.first().copied().unwrap_or(0),
                self.counts.last().copied().unwrap_or(0),
            )),
            CodeKind::Float(_) | CodeKind::Table => None,
        }
    }
}

/// What the levels of a [`CodeSpace`] are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeKind {
    /// Level `k` is the unsigned code `k` (`0` and `2^bits − 1` are the clipped extremes).
    Unsigned { bits: u32 },
    /// Level `k` is the signed code `k − 2^(bits−1)` (level 0 is the most negative).
    Signed { bits: u32 },
    /// Level `k` is the float code with bits `k` (an F8 byte, an FP4 nibble).
    Float(Dtype),
    /// Level `k` indexes the layout's own table of values (bitsandbytes' `quant_map`).
    Table,
}

/// A scale, zero point or bias that is not a usable number for its group.
#[derive(Clone, Debug, PartialEq)]
pub struct ScaleProblem {
    /// The member's role (`weight_scale`, `qzeros`...).
    pub member: &'static str,
    pub problem: Problem,
    /// The logical rows it applies to.
    pub rows: Range<usize>,
    /// Its group (column group, block column, or flat block for bitsandbytes).
    pub group: usize,
    /// The value read (for zero points, in code units).
    pub value: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Problem {
    NaN,
    Infinite,
    /// A zero scale, which zeroes its whole group.
    Zero,
    /// A negative scale where the scheme only makes positive ones.
    Negative,
    /// A zero point outside the codes' range.
    OutOfRange,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Problem::NaN => "NaN",
            Problem::Infinite => "infinite",
            Problem::Zero => "zero (zeroes the group)",
            Problem::Negative => "negative",
            Problem::OutOfRange => "out of range",
        })
    }
}

/// The problems found: the first [`ScaleProblems::KEPT`] of them, and how many in all.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScaleProblems {
    pub first: Vec<ScaleProblem>,
    pub total: u64,
}

impl ScaleProblems {
    /// Problems kept with their place; a broken scale tensor can have millions.
    pub const KEPT: usize = 64;

    fn push(&mut self, problem: ScaleProblem) {
        if self.first.len() < Self::KEPT {
            self.first.push(problem);
        }
        self.total += 1;
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }
}

/// Implements [`Dequantize`] for a layout struct holding a [`grouped::Grouped`] as `inner`.
macro_rules! grouped_layout {
    ($layout:ident) => {
        impl $crate::quant::kernels::Dequantize for $layout<'_> {
            fn rows(&self) -> usize {
                self.inner.rows
            }
            fn cols(&self) -> usize {
                self.inner.cols
            }
            fn experts(&self) -> usize {
                self.inner.experts
            }
            fn dequantize_rows(&self, rows: std::ops::Range<usize>, out: &mut [f32]) {
                self.inner.dequantize_rows(rows, out);
            }
            fn codes(&self) -> Option<$crate::quant::kernels::CodeSpace> {
                Some(self.inner.codes())
            }
            fn count_codes(&self, rows: std::ops::Range<usize>, counts: &mut [u64]) {
                self.inner.count_codes(rows, counts);
            }
            fn scale_problems(&self) -> $crate::quant::kernels::ScaleProblems {
                self.inner.scale_problems()
            }
            fn fused_row<'s>(
                &'s self,
                row: usize,
                scratch: &'s mut $crate::quant::kernels::FusedScratch,
            ) -> Option<$crate::quant::kernels::FusedRow<'s>> {
                self.inner.fused_row(row, scratch)
            }
        }
    };
}
use grouped_layout;

/// Shape checks shared by the layouts.
impl Stored<'_> {
    /// Elements, when the shape's product fits.
    fn count(&self) -> Option<usize> {
        self.shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
    }

    /// The dimension `index` as `usize`.
    fn dim(&self, index: usize) -> usize {
        usize::try_from(self.shape[index]).unwrap_or(usize::MAX)
    }

    /// Checks the dtype is one of `dtypes` and the bytes hold the shape exactly.
    fn check(&self, member: &'static str, dtypes: &[Dtype]) -> Result<(), KernelError> {
        if !dtypes.contains(&self.dtype) {
            let names: Vec<&str> = dtypes.iter().map(|d| d.name()).collect();
            return Err(KernelError::new(
                member,
                format!("dtype {}, expected {}", self.dtype, names.join(" or ")),
            ));
        }
        let bytes = self
            .count()
            .and_then(|n| self.dtype.byte_len(u64::try_from(n).ok()?))
            .and_then(|n| usize::try_from(n).ok());
        if bytes != Some(self.bytes.len()) {
            return Err(KernelError::new(
                member,
                format!(
                    "{} bytes do not hold shape {:?} of {}",
                    self.bytes.len(),
                    self.shape,
                    self.dtype
                ),
            ));
        }
        Ok(())
    }

    /// Checks dtype, bytes and that the shape is `shape`.
    fn check_shape(
        &self,
        member: &'static str,
        dtypes: &[Dtype],
        shape: &[usize],
    ) -> Result<(), KernelError> {
        self.check(member, dtypes)?;
        let matches = self.shape.len() == shape.len()
            && self
                .shape
                .iter()
                .zip(shape)
                .all(|(&d, &e)| usize::try_from(d).ok() == Some(e));
        if matches {
            Ok(())
        } else {
            Err(KernelError::new(
                member,
                format!("shape {:?}, expected {shape:?}", self.shape),
            ))
        }
    }

    /// Checks dtype and bytes and that the member holds a single value (shape `[]`, `[1]`...).
    fn check_scalar(&self, member: &'static str, dtypes: &[Dtype]) -> Result<(), KernelError> {
        self.check(member, dtypes)?;
        if self.count() == Some(1) {
            Ok(())
        } else {
            Err(KernelError::new(
                member,
                format!("shape {:?}, expected a single value", self.shape),
            ))
        }
    }
}

/// The float parameter encodings accepted for scales (F32, BF16, F16).
const FLOAT_SCALES: [Dtype; 3] = [Dtype::F32, Dtype::Bf16, Dtype::F16];

/// A parameter member as [`decode::Floats`], once checked.
fn floats<'a>(
    member: &'static str,
    stored: &Stored<'a>,
) -> Result<decode::Floats<'a>, KernelError> {
    let kind = decode::FloatKind::of(stored.dtype, true).ok_or_else(|| {
        KernelError::new(
            member,
            format!("dtype {} is not a parameter type", stored.dtype),
        )
    })?;
    Ok(decode::Floats::new(stored.bytes, kind))
}

/// E8M0 block scales, stored as U8 bytes or as `F8_E8M0`.
fn e8m0_scales<'a>(
    member: &'static str,
    stored: &Stored<'a>,
) -> Result<decode::Floats<'a>, KernelError> {
    stored.check(member, &[Dtype::U8, Dtype::F8E8M0])?;
    Ok(decode::Floats::new(stored.bytes, decode::FloatKind::E8M0))
}

/// The single value of a scalar member.
fn scalar(member: &'static str, stored: &Stored<'_>, dtypes: &[Dtype]) -> Result<f32, KernelError> {
    stored.check_scalar(member, dtypes)?;
    Ok(floats(member, stored)?.get(0))
}

/// `[rows, cols]` or `[experts, rows, cols]` of a weight-like member: (experts, rows, cols).
fn matrix(member: &'static str, stored: &Stored<'_>) -> Result<(usize, usize, usize), KernelError> {
    let dims = match stored.shape.len() {
        2 => (1, stored.dim(0), stored.dim(1)),
        3 => (stored.dim(0), stored.dim(1), stored.dim(2)),
        _ => {
            return Err(KernelError::new(
                member,
                format!("shape {:?}, expected 2 or 3 dimensions", stored.shape),
            ));
        }
    };
    // Logical sizes are products of these, and of up to 32 codes a stored element.
    let fits = dims
        .0
        .checked_mul(dims.1)
        .and_then(|n| n.checked_mul(dims.2))
        .and_then(|n| n.checked_mul(32))
        .is_some();
    if fits {
        Ok(dims)
    } else {
        Err(KernelError::new(
            member,
            format!("shape {:?} is too large", stored.shape),
        ))
    }
}

/// `dims` with the experts' dimension in front, for a 3-D weight.
fn with_experts(experts: Option<usize>, dims: &[usize]) -> Vec<usize> {
    experts.into_iter().chain(dims.iter().copied()).collect()
}

#[cfg(test)]
pub(crate) mod testing;
