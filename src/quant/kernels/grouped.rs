//! The engine every layout is built on: codes, and per group a scale, a zero point or a bias.
//!
//! A logical element `(r, i)` (`MoE` experts folded into the rows) is
//! `((c − z) · s) · t` or, for MLX's affine mode and quanto, `c · s + b`, where `c` is its code's
//! value (an integer, or a small float decoded exactly), `s`, `z` and `b` belong to its group and
//! `t` is a tensor-wide factor (1 when absent). The operations and their order are the
//! producers' own, in `f32`; where a producer computes in BF16 or F16 each result is rounded to
//! it (`Grouped::rounding`), so the values are the producer's bit for bit.
//!
//! A row is dequantized in two passes over memory that stays in L1: its codes are unpacked into
//! bytes, then each group's run is mapped to values in a loop with no branch and no bounds check,
//! which the compiler vectorizes (compiled for AVX2 and AVX-512 by `multiversion`).

#![expect(
    clippy::inline_always,
    reason = "what the row loops call must be inlined into them, compiled for each instruction set"
)]

use super::bits::Packing;
use super::decode::{Floats, e2m1, e4m3, e5m2, word};
use super::{CodeKind, CodeSpace, FusedRow, Problem, ScaleProblem, ScaleProblems};
use multiversion::multiversion;
use std::ops::Range;

/// Where a row's codes are stored.
#[derive(Clone, Debug)]
pub enum Codes<'a> {
    /// One byte per element, row-major.
    Bytes(&'a [u8]),
    /// Each row's codes in its own run of `row_bytes` bytes, packed as `packing` says.
    Rows {
        bytes: &'a [u8],
        bits: u32,
        packing: Packing,
        row_bytes: usize,
    },
    /// Packed down the columns of a `[words, rows]` word matrix (GPTQ's `qweight`): row `r`'s
    /// codes are the dense stream of word column `r`.
    Columns {
        bytes: &'a [u8],
        bits: u32,
        words: usize,
        rows: usize,
    },
    /// AWQ's `qweight` `[cols, rows/8]`: row `r`'s code for column `i` is nibble
    /// `AWQ_NIBBLE[r % 8]` of word `(i, r / 8)`.
    Awq { bytes: &'a [u8], rows: usize },
    /// Nibbles of the flattened tensor, the first of each byte in the high half (bitsandbytes).
    FlatHighFirst(&'a [u8]),
    /// Each row's nibbles in its own run of `row_bytes` bytes, the first of each byte in the
    /// high half (`ComfyUI`'s NVFP4).
    RowsHighFirst { bytes: &'a [u8], row_bytes: usize },
    /// optimum-quanto: the flattened tensor as a `[R, width]` matrix whose rows are stored in
    /// `8 / bits` chunks of `chunk_rows` rows, chunk `k` at bit `bits · k` of `[chunk_rows,
    /// width]` bytes.
    Chunks {
        bytes: &'a [u8],
        bits: u32,
        chunk_rows: usize,
        width: usize,
    },
}

/// Where AWQ puts output column `8c + k` among the eight nibbles of word `c`.
pub const AWQ_NIBBLE: [u32; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// What a code stands for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    /// An unsigned code `u`, standing for `u − offset`.
    Unsigned {
        bits: u32,
        offset: f32,
    },
    /// A two's complement byte (an I8 weight).
    Signed,
    E4M3,
    E5M2,
    /// FP4 in the low four bits.
    E2M1,
    /// A four-bit index into a table (bitsandbytes' `quant_map`).
    Table([f32; 16]),
}

impl Value {
    fn space(self) -> CodeSpace {
        match self {
            Value::Unsigned { bits, .. } => CodeSpace {
                levels: 1 << bits,
                kind: CodeKind::Unsigned { bits },
            },
            Value::Signed => CodeSpace {
                levels: 256,
                kind: CodeKind::Signed { bits: 8 },
            },
            Value::E4M3 => CodeSpace {
                levels: 256,
                kind: CodeKind::Float(crate::format::Dtype::F8E4M3),
            },
            Value::E5M2 => CodeSpace {
                levels: 256,
                kind: CodeKind::Float(crate::format::Dtype::F8E5M2),
            },
            Value::E2M1 => CodeSpace {
                levels: 16,
                kind: CodeKind::Float(crate::format::Dtype::F4),
            },
            Value::Table(_) => CodeSpace {
                levels: 16,
                kind: CodeKind::Table,
            },
        }
    }
}

/// How columns fall into groups, and rows into the rows of the parameter grids.
#[derive(Clone, Debug)]
pub enum Groups {
    /// Tiles of `rows × cols` logical elements. Rows fold experts: row `r` is row
    /// `r % expert_rows` of expert `r / expert_rows`, and the tiles restart at every expert.
    Tiles {
        rows: usize,
        cols: usize,
        expert_rows: usize,
    },
    /// Column `i` of every row in group `index[i]` (act-order), of `count` groups.
    Indexed { index: Vec<u32>, count: usize },
    /// Runs of `size` consecutive elements of the flattened tensor.
    Flat { size: usize },
}

/// A parameter grid: cell `(row, group)` at `row · row_stride + group · group_stride`.
#[derive(Clone, Debug)]
pub struct Grid<'a> {
    pub values: Source<'a>,
    pub row_stride: usize,
    pub group_stride: usize,
}

/// Where a grid's values come from.
#[derive(Clone, Debug)]
pub enum Source<'a> {
    Stored(Floats<'a>),
    /// Stored values divided by a constant (compressed-tensors' NVFP4 global scale).
    Divided(Floats<'a>, f32),
    /// Stored values negated (a shift subtracted, as an exactly equal bias added).
    Negated(Floats<'a>),
    /// cuBLAS' blocked layout of a scale matrix (`ComfyUI`'s `to_blocked`): tiles of 128 rows
    /// by 4 columns, `tiles` to a row of tiles, each stored as 32 rows of 4 × 4.
    Blocked {
        floats: Floats<'a>,
        tiles: usize,
    },
    /// Packed unsigned codes minus `offset` (packed zero points).
    Packed(PackedCodes<'a>),
    /// bitsandbytes' double quantization: `map[code[t]] · absmax[t / block] + offset`.
    Nested {
        codes: &'a [u8],
        map: Vec<f32>,
        absmax: Floats<'a>,
        block: usize,
        offset: f32,
    },
    /// The same value everywhere.
    Constant(f32),
}

/// Zero points packed into 32-bit words.
#[derive(Clone, Debug)]
pub struct PackedCodes<'a> {
    pub bytes: &'a [u8],
    pub bits: u32,
    pub packing: Packing,
    pub offset: f32,
    pub layout: PackedZeros,
}

/// Where the zero point of `(row, group)` sits among the words.
#[derive(Clone, Copy, Debug)]
pub enum PackedZeros {
    /// Down the rows (compressed-tensors): `[experts, words, groups]`, row `r % expert_rows` of
    /// expert `r / expert_rows` in column `group`'s stream.
    DownRows {
        words: usize,
        groups: usize,
        expert_rows: usize,
    },
    /// Along the rows (GPTQ `qzeros` `[groups, words]`), with v1's `zero − 1` undone.
    AlongRows { words: usize, v1: bool },
    /// AWQ's `qzeros` `[groups, rows/8]`, in its nibble order.
    Awq { words: usize },
}

impl Source<'_> {
    #[inline]
    fn get(&self, index: usize) -> f32 {
        match self {
            Source::Stored(floats) => floats.get(index),
            Source::Divided(floats, divisor) => floats.get(index) / divisor,
            Source::Negated(floats) => -floats.get(index),
            Source::Packed(_) | Source::Constant(_) | Source::Blocked { .. } => {
                unreachable!("read through Grid::get")
            }
            Source::Nested {
                codes,
                map,
                absmax,
                block,
                offset,
            } => map[usize::from(codes[index])] * absmax.get(index / block) + offset,
        }
    }
}

impl Grid<'_> {
    /// The values of groups `0..out.len()` of grid row `row`, each as [`Grid::get`] gives it.
    pub fn row_into(&self, row: usize, out: &mut [f32]) {
        match &self.values {
            Source::Stored(floats) if self.group_stride == 1 => {
                floats.get_into(row * self.row_stride, out);
            }
            _ => {
                for (group, out) in out.iter_mut().enumerate() {
                    *out = self.get(row, group);
                }
            }
        }
    }

    pub fn constant(value: f32) -> Grid<'static> {
        Grid {
            values: Source::Constant(value),
            row_stride: 0,
            group_stride: 0,
        }
    }

    /// The value of cell `(row, group)`; for packed codes, `row` is the logical row.
    #[inline]
    pub fn get(&self, row: usize, group: usize) -> f32 {
        match &self.values {
            Source::Constant(value) => *value,
            Source::Packed(packed) => packed.get(row, group),
            Source::Blocked { floats, tiles } => floats.get(
                ((row / 128) * tiles + group / 4) * 512
                    + (row % 32) * 16
                    + ((row % 128) / 32) * 4
                    + group % 4,
            ),
            source => source.get(row * self.row_stride + group * self.group_stride),
        }
    }
}

impl PackedCodes<'_> {
    fn get(&self, row: usize, group: usize) -> f32 {
        let bits = self.bits;
        let code = match self.layout {
            PackedZeros::DownRows {
                words,
                groups,
                expert_rows,
            } => {
                let (expert, row) = (row / expert_rows, row % expert_rows);
                self.packing.code(bits, row, |w| {
                    word(self.bytes, (expert * words + w) * groups + group)
                })
            }
            PackedZeros::AlongRows { words, v1 } => {
                let read = |w: usize| word(self.bytes, group * words + w);
                if v1 && 32u32.is_multiple_of(bits) {
                    // The producer subtracted 0x11111111 (4-bit) from whole words: borrows
                    // cross fields, so the constant is added back to the word first.
                    let ones = (0..32 / bits).fold(0u32, |acc, k| acc | 1 << (k * bits));
                    self.packing.code(bits, row, |w| read(w).wrapping_add(ones))
                } else if v1 {
                    let field = self.packing.code(bits, row, read);
                    (field + 1) & ((1 << bits) - 1)
                } else {
                    self.packing.code(bits, row, read)
                }
            }
            PackedZeros::Awq { words } => {
                let w = word(self.bytes, group * words + row / 8);
                u8::try_from(w >> (4 * AWQ_NIBBLE[row % 8]) & 15).unwrap_or(0)
            }
        };
        f32::from(code) - self.offset
    }
}

/// A 16-bit float type results are rounded to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    Bf16,
    F16,
}

impl Half {
    /// The type a producer computing in `dtype` rounds to, if it is a 16-bit one.
    pub fn of(dtype: crate::format::Dtype) -> Option<Half> {
        match dtype {
            crate::format::Dtype::Bf16 => Some(Half::Bf16),
            crate::format::Dtype::F16 => Some(Half::F16),
            _ => None,
        }
    }

    /// `value` rounded to this type (to nearest, ties to even), as `f32`.
    #[inline(always)]
    pub fn round(self, value: f32) -> f32 {
        match self {
            Half::Bf16 => {
                let bits = value.to_bits();
                // NaN kept as it is; a select on the bits, which vectorizes where a branch on
                // the float would not.
                let nan = bits & 0x7fff_ffff > 0x7f80_0000;
                f32::from_bits(if nan { bits } else { Half::bf16_bits(bits) })
            }
            Half::F16 => half::f16::from_f32(value).to_f32(),
        }
    }

    /// The bits of the `f32` of bits `bits` rounded to BF16 (to nearest, ties to even), for any
    /// value but a NaN whose low 16 bits are near all ones, which wraps to another value.
    #[inline(always)]
    pub fn bf16_bits(bits: u32) -> u32 {
        bits.wrapping_add(0x7fff + (bits >> 16 & 1)) & 0xffff_0000
    }
}

/// What a problem is, per parameter grid.
#[derive(Clone, Copy, Debug)]
pub struct Checks {
    /// Negative scales are expected (MLX affine and GPTQ store them).
    pub negative_scales: bool,
    /// The zero points' valid range, if checked.
    pub zero_range: Option<(f32, f32)>,
}

/// A dequantizer over the engine.
#[derive(Clone, Debug)]
pub struct Grouped<'a> {
    pub rows: usize,
    pub cols: usize,
    pub experts: usize,
    pub codes: Codes<'a>,
    pub value: Value,
    pub groups: Groups,
    pub scales: Grid<'a>,
    pub scale_member: &'static str,
    pub zeros: Option<(Grid<'a>, &'static str)>,
    pub biases: Option<(Grid<'a>, &'static str)>,
    /// A tensor-wide factor applied last.
    pub factor: Option<f32>,
    /// The 16-bit type the producer computes in (its scales' type), each step rounded to it.
    pub rounding: Option<Half>,
    pub checks: Checks,
}

impl Grouped<'_> {
    pub fn codes(&self) -> CodeSpace {
        self.value.space()
    }

    /// Unpacks row `row`'s codes into `out` (`cols` bytes).
    fn unpack_row(&self, row: usize, out: &mut [u8]) {
        let cols = self.cols;
        match &self.codes {
            Codes::Bytes(bytes) => out.copy_from_slice(&bytes[row * cols..(row + 1) * cols]),
            Codes::Rows {
                bytes,
                bits,
                packing,
                row_bytes,
            } => super::bits::unpack(
                *packing,
                *bits,
                &bytes[row * row_bytes..(row + 1) * row_bytes],
                out,
            ),
            Codes::Columns {
                bytes,
                bits,
                words,
                rows,
            } => {
                let column: Vec<u8> = (0..*words)
                    .flat_map(|w| word(bytes, w * rows + row).to_le_bytes())
                    .collect();
                super::bits::unpack(Packing::Dense, *bits, &column, out);
            }
            Codes::Awq { bytes, rows } => {
                let (stride, column) = (rows / 8, row / 8);
                let shift = 4 * AWQ_NIBBLE[row % 8];
                for (i, code) in out.iter_mut().enumerate() {
                    *code = nibble(word(bytes, i * stride + column) >> shift);
                }
            }
            Codes::Chunks {
                bytes,
                bits,
                chunk_rows,
                width,
            } => {
                let start = row * cols;
                for (i, code) in out.iter_mut().enumerate() {
                    let (r, c) = ((start + i) / width, (start + i) % width);
                    let shift = bits * u32::try_from(r / chunk_rows).unwrap_or(0);
                    let byte = u32::from(bytes[(r % chunk_rows) * width + c]);
                    *code = u8::try_from(byte >> shift & ((1 << bits) - 1)).unwrap_or(0);
                }
            }
            Codes::RowsHighFirst { bytes, row_bytes } => {
                let row = &bytes[row * row_bytes..(row + 1) * row_bytes];
                for (i, code) in out.iter_mut().enumerate() {
                    let shift = if i.is_multiple_of(2) { 4 } else { 0 };
                    *code = nibble(u32::from(row[i / 2]) >> shift);
                }
            }
            Codes::FlatHighFirst(bytes) => {
                let start = row * cols;
                for (i, code) in out.iter_mut().enumerate() {
                    let j = start + i;
                    let shift = if j.is_multiple_of(2) { 4 } else { 0 };
                    *code = nibble(u32::from(bytes[j / 2]) >> shift);
                }
            }
        }
    }

    /// The scale row (of the grids) that logical row `row` reads, for tiles.
    fn grid_row(&self, row: usize) -> usize {
        match self.groups {
            Groups::Tiles {
                rows, expert_rows, ..
            } => {
                let per_expert = expert_rows.div_ceil(rows);
                (row / expert_rows) * per_expert + (row % expert_rows) / rows
            }
            Groups::Indexed { .. } => row,
            Groups::Flat { .. } => 0,
        }
    }

    /// Group `group`'s parameters for logical row `row`: scale, zero point, bias.
    #[inline]
    fn parameters(&self, row: usize, grid_row: usize, group: usize) -> (f32, f32, f32) {
        self.parameters_with(self.scales.get(grid_row, group), row, grid_row, group)
    }

    /// [`Grouped::parameters`] with the scale `s` already read.
    #[inline]
    fn parameters_with(
        &self,
        s: f32,
        row: usize,
        grid_row: usize,
        group: usize,
    ) -> (f32, f32, f32) {
        let z = self.zeros.as_ref().map_or(0.0, |(zeros, _)| {
            if matches!(zeros.values, Source::Packed(_)) {
                zeros.get(row, group)
            } else {
                zeros.get(grid_row, group)
            }
        });
        let b = self
            .biases
            .as_ref()
            .map_or(0.0, |(b, _)| b.get(grid_row, group));
        (s, z, b)
    }

    pub fn dequantize_rows(&self, rows: Range<usize>, out: &mut [f32]) {
        let cols = self.cols;
        assert!(rows.end <= self.rows, "rows {rows:?} of {}", self.rows);
        assert_eq!(out.len(), rows.len() * cols, "output length");
        let mut codes = vec![0u8; cols];
        let mut segments = Vec::new();
        let mut indexed = Vec::new();
        for (row, out) in rows.zip(out.chunks_exact_mut(cols.max(1))) {
            // Bytes are read where they lie; packed codes are unpacked first.
            let codes: &[u8] = if let Codes::Bytes(bytes) = self.codes {
                &bytes[row * cols..(row + 1) * cols]
            } else {
                self.unpack_row(row, &mut codes);
                &codes
            };
            let grid_row = self.grid_row(row);
            segments.clear();
            match &self.groups {
                Groups::Tiles { cols: width, .. } => {
                    segments.extend((0..cols.div_ceil(*width)).map(|group| {
                        let end = ((group + 1) * width).min(cols);
                        Segment::new(end, self.parameters(row, grid_row, group))
                    }));
                }
                Groups::Flat { size } => {
                    let mut start = 0;
                    while start < cols {
                        let flat = row * cols + start;
                        let end = (start + size - flat % size).min(cols);
                        let parameters = self.parameters(row, grid_row, flat / size);
                        segments.push(Segment::new(end, parameters));
                        start = end;
                    }
                }
                Groups::Indexed { index, count } => {
                    indexed.clear();
                    indexed.extend((0..*count).map(|g| self.parameters(row, grid_row, g)));
                    for ((value, &code), &group) in out.iter_mut().zip(codes).zip(index) {
                        let (s, z, b) = indexed[group as usize];
                        let c = self.code_value(code);
                        *value = match (self.biases.is_some(), self.rounding) {
                            (true, Some(half)) => half.round(half.round(c * s) + b),
                            (true, None) => c * s + b,
                            (false, Some(half)) => half.round((c - z) * s),
                            (false, None) => (c - z) * s,
                        };
                    }
                }
            }
            if !segments.is_empty() {
                self.run(codes, out, &mut segments);
            }
            if let Some(factor) = self.factor {
                scale_by(out, factor);
            }
        }
    }

    /// Row `row` as a [`FusedRow`]: four-bit codes with a table per group (made by
    /// [`Grouped::run`] from the codes 0 to 15, so that every value is the dequantization's),
    /// or E4M3 codes with a scale per group when nothing else enters the formula. `None` for
    /// other layouts, and for groups that do not tile the row.
    pub fn fused_row<'s>(
        &'s self,
        row: usize,
        scratch: &'s mut FusedScratch,
    ) -> Option<FusedRow<'s>> {
        assert!(row < self.rows, "row {row} of {}", self.rows);
        let Groups::Tiles { cols: width, .. } = self.groups else {
            return None;
        };
        let cols = self.cols;
        if width == 0 || cols == 0 || !cols.is_multiple_of(width) {
            return None;
        }
        let groups = cols / width;
        let grid_row = self.grid_row(row);
        match (&self.codes, self.value) {
            (
                Codes::Rows {
                    bytes,
                    bits: 4,
                    row_bytes,
                    ..
                },
                Value::Unsigned { bits: 4, .. } | Value::E2M1 | Value::Table(_),
            ) if row_bytes * 2 == cols => {
                let FusedScratch {
                    values,
                    scales,
                    codes,
                    segments,
                    scales_of,
                } = scratch;
                let scales = self.row_scales(grid_row, groups, scales, scales_of);
                segments.clear();
                segments.extend(scales.iter().enumerate().map(|(group, &s)| {
                    let parameters = self.parameters_with(s, row, grid_row, group);
                    Segment::new((group + 1) * 16, parameters)
                }));
                // Every code, once per group: the same for every row.
                if codes.len() != groups * 16 {
                    codes.clear();
                    for _ in 0..groups {
                        codes.extend(0..16u8);
                    }
                }
                // Every value is written by `run`.
                values.resize(groups * 16, 0.0);
                self.run(codes, values, segments);
                if let Some(factor) = self.factor {
                    scale_by(values, factor);
                }
                Some(FusedRow::Nibbles {
                    codes: &bytes[row * row_bytes..(row + 1) * row_bytes],
                    tables: bytemuck::cast_slice(values),
                })
            }
            // `(e4m3(c) − 0) · s` is `e4m3(c) · s` for every code, signed zeros included.
            (Codes::Bytes(bytes), Value::E4M3)
                if self.zeros.is_none() && self.biases.is_none() && self.factor.is_none() =>
            {
                Some(FusedRow::E4m3 {
                    codes: &bytes[row * cols..(row + 1) * cols],
                    scales: self.row_scales(
                        grid_row,
                        groups,
                        &mut scratch.scales,
                        &mut scratch.scales_of,
                    ),
                    rounding: self.rounding,
                })
            }
            _ => None,
        }
    }

    /// The scales of grid row `grid_row`'s `groups` groups, read in one pass into `scales`
    /// unless it holds them already (the rows of a block share them), as `scales_of` says.
    fn row_scales<'s>(
        &self,
        grid_row: usize,
        groups: usize,
        scales: &'s mut Vec<f32>,
        scales_of: &mut Option<(usize, usize)>,
    ) -> &'s [f32] {
        let key = (std::ptr::from_ref(self) as usize, grid_row);
        if *scales_of != Some(key) || scales.len() != groups {
            scales.resize(groups, 0.0);
            self.scales.row_into(grid_row, scales);
            *scales_of = Some(key);
        }
        scales
    }

    fn code_value(&self, code: u8) -> f32 {
        match self.value {
            Value::Unsigned { offset, .. } => f32::from(code) - offset,
            Value::Signed => f32::from(code.cast_signed()),
            Value::E4M3 => e4m3(code),
            Value::E5M2 => e5m2(code),
            Value::E2M1 => e2m1(code),
            Value::Table(table) => table[usize::from(code & 15)],
        }
    }

    /// A row's runs of groups, through one loop chosen for the code type, the rounding and
    /// the formula.
    fn run(&self, codes: &[u8], out: &mut [f32], segments: &mut [Segment]) {
        if let (Value::Unsigned { offset, .. }, None) = (self.value, &self.biases) {
            // `u − (offset + z)`, one subtraction: exact, as every term is a small integer.
            for segment in segments.iter_mut() {
                segment.z += offset;
            }
        }
        match self.rounding {
            None => self.run_with(codes, out, segments, |x| x),
            Some(Half::Bf16) => self.run_with(codes, out, segments, |x| Half::Bf16.round(x)),
            Some(Half::F16) => self.run_with(codes, out, segments, |x| Half::F16.round(x)),
        }
    }

    fn run_with<R: Fn(f32) -> f32 + Copy>(
        &self,
        codes: &[u8],
        out: &mut [f32],
        segments: &[Segment],
        round: R,
    ) {
        let bias = self.biases.is_some();
        macro_rules! with_value {
            ($value:expr) => {
                if bias {
                    segments_bias(codes, out, segments, $value, round)
                } else {
                    segments_zero(codes, out, segments, $value, round)
                }
            };
        }
        match self.value {
            Value::Unsigned { offset, .. } if bias => {
                with_value!(move |c: u8| f32::from(c) - offset);
            }
            // The offset is in the segments' zero points (see `run`).
            Value::Unsigned { .. } => with_value!(f32::from),
            Value::Signed => with_value!(|c: u8| f32::from(c.cast_signed())),
            Value::E4M3 => with_value!(e4m3),
            Value::E5M2 => with_value!(e5m2),
            Value::E2M1 => with_value!(e2m1),
            Value::Table(table) => with_value!(move |c: u8| table[usize::from(c & 15)]),
        }
    }

    pub fn count_codes(&self, rows: Range<usize>, counts: &mut [u64]) {
        let space = self.codes();
        assert_eq!(counts.len(), space.levels, "one count per level");
        let flip = if self.value == Value::Signed { 0x80 } else { 0 };
        let mut codes = vec![0u8; self.cols];
        for row in rows {
            self.unpack_row(row, &mut codes);
            for &code in &codes {
                counts[usize::from(code ^ flip)] += 1;
            }
        }
    }

    /// The grid's shape: grid rows and groups.
    fn grid_shape(&self) -> (usize, usize) {
        match &self.groups {
            Groups::Tiles {
                rows,
                cols,
                expert_rows,
            } => (
                self.experts * expert_rows.div_ceil(*rows),
                self.cols.div_ceil(*cols),
            ),
            Groups::Indexed { count, .. } => (self.rows, *count),
            Groups::Flat { size } => (1, (self.rows * self.cols).div_ceil(*size)),
        }
    }

    /// The logical rows grid row `grid_row` (group `group` for flat groups) covers.
    fn rows_of(&self, grid_row: usize, group: usize) -> Range<usize> {
        match &self.groups {
            Groups::Tiles {
                rows, expert_rows, ..
            } => {
                let per_expert = expert_rows.div_ceil(*rows);
                let (expert, tile) = (grid_row / per_expert, grid_row % per_expert);
                let start = expert * expert_rows + tile * rows;
                start..(start + rows).min((expert + 1) * expert_rows)
            }
            Groups::Indexed { .. } => grid_row..grid_row + 1,
            Groups::Flat { size } => {
                let cols = self.cols.max(1);
                let start = group * size;
                let end = ((group + 1) * size).min(self.rows * self.cols);
                start / cols..end.div_ceil(cols)
            }
        }
    }

    /// Whether group `group` of `rows` is zero whatever its scale: no zero point or bias enters,
    /// and every code stands for zero. A zero scale there zeroes nothing (comfy-kitchen's MXFP8
    /// writes one for every all-zero block, its padding included). Read for codes stored a byte
    /// each only, where it costs the group's bytes: unpacking a row for each group of a file
    /// whose scales are all zero would take time quadratic in its width.
    fn zero_whatever_the_scale(&self, rows: Range<usize>, group: usize) -> bool {
        let (&Groups::Tiles { cols: width, .. }, &Codes::Bytes(bytes)) =
            (&self.groups, &self.codes)
        else {
            return false;
        };
        if self.zeros.is_some() || self.biases.is_some() {
            return false;
        }
        let columns = (group * width).min(self.cols)..((group + 1) * width).min(self.cols);
        rows.into_iter().all(|row| {
            let start = row * self.cols;
            bytes
                .get(start + columns.start..start + columns.end)
                .is_some_and(|codes| codes.iter().all(|&code| self.code_value(code) == 0.0))
        })
    }

    pub fn scale_problems(&self) -> ScaleProblems {
        let mut problems = ScaleProblems::default();
        // Usually every stored scale is fine and there is nothing else to check: one pass over
        // them says so (a cell of the grid is one of them).
        if let (Source::Stored(scales), None, None) =
            (&self.scales.values, &self.zeros, &self.biases)
        {
            let negative = self.checks.negative_scales;
            if scales.all(|s| s.is_finite() && s != 0.0 && (negative || s > 0.0)) {
                return problems;
            }
        }
        let (grid_rows, groups) = self.grid_shape();
        for grid_row in 0..grid_rows {
            for group in 0..groups {
                let rows = self.rows_of(grid_row, group);
                let s = self.scales.get(grid_row, group);
                let problem = if s.is_nan() {
                    Some(Problem::NaN)
                } else if s.is_infinite() {
                    Some(Problem::Infinite)
                } else if s == 0.0 {
                    (!self.zero_whatever_the_scale(rows.clone(), group)).then_some(Problem::Zero)
                } else if s < 0.0 && !self.checks.negative_scales {
                    Some(Problem::Negative)
                } else {
                    None
                };
                if let Some(problem) = problem {
                    problems.push(ScaleProblem {
                        member: self.scale_member,
                        problem,
                        rows: rows.clone(),
                        group,
                        value: f64::from(s),
                    });
                }
                for (grid, member, range) in [
                    self.zeros
                        .as_ref()
                        .map(|(g, m)| (g, *m, self.checks.zero_range)),
                    self.biases.as_ref().map(|(g, m)| (g, *m, None)),
                ]
                .into_iter()
                .flatten()
                {
                    let zero_rows: Vec<usize> = if matches!(grid.values, Source::Packed(_)) {
                        rows.clone().collect()
                    } else {
                        vec![grid_row]
                    };
                    for at in zero_rows {
                        let z = grid.get(at, group);
                        let problem = if z.is_nan() {
                            Some(Problem::NaN)
                        } else if z.is_infinite() {
                            Some(Problem::Infinite)
                        } else {
                            range
                                .filter(|&(lo, hi)| z < lo || z > hi)
                                .map(|_| Problem::OutOfRange)
                        };
                        if let Some(problem) = problem {
                            let rows = if matches!(grid.values, Source::Packed(_)) {
                                at..at + 1
                            } else {
                                rows.clone()
                            };
                            problems.push(ScaleProblem {
                                member,
                                problem,
                                rows,
                                group,
                                value: f64::from(z),
                            });
                        }
                    }
                }
            }
        }
        problems
    }
}

#[inline(always)]
fn nibble(value: u32) -> u8 {
    u8::try_from(value & 15).unwrap_or(0)
}

/// Buffers a [`FusedRow`] is made in, handed from row to row.
#[derive(Debug, Default)]
pub struct FusedScratch {
    values: Vec<f32>,
    /// A grid row's scales.
    scales: Vec<f32>,
    codes: Vec<u8>,
    segments: Vec<Segment>,
    /// The kernel (its address) and grid row whose scales `scales` holds.
    scales_of: Option<(usize, usize)>,
}

/// A run of a row's elements sharing a group: it ends at `end` (and starts where the one
/// before ended).
#[derive(Clone, Copy, Debug)]
struct Segment {
    end: usize,
    s: f32,
    z: f32,
    b: f32,
}

impl Segment {
    fn new(end: usize, (s, z, b): (f32, f32, f32)) -> Segment {
        Segment { end, s, z, b }
    }
}

/// `round((value(c) − z) · s)` over each segment.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn segments_zero<V: Fn(u8) -> f32, R: Fn(f32) -> f32>(
    codes: &[u8],
    out: &mut [f32],
    segments: &[Segment],
    value: V,
    round: R,
) {
    let mut start = 0;
    for segment in segments {
        let (s, z) = (segment.s, segment.z);
        let run = start..segment.end;
        for (out, &code) in out[run.clone()].iter_mut().zip(&codes[run]) {
            *out = round((value(code) - z) * s);
        }
        start = segment.end;
    }
}

/// `round(round(value(c) · s) + b)` over each segment: MLX's multiply, then add, each
/// rounded to the type it computes in (never fused).
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn segments_bias<V: Fn(u8) -> f32, R: Fn(f32) -> f32>(
    codes: &[u8],
    out: &mut [f32],
    segments: &[Segment],
    value: V,
    round: R,
) {
    let mut start = 0;
    for segment in segments {
        let (s, b) = (segment.s, segment.b);
        let run = start..segment.end;
        for (out, &code) in out[run.clone()].iter_mut().zip(&codes[run]) {
            *out = round(round(value(code) * s) + b);
        }
        start = segment.end;
    }
}

#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn scale_by(out: &mut [f32], factor: f32) {
    for value in out {
        *value *= factor;
    }
}
