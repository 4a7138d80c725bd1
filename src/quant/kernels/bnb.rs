//! bitsandbytes: `LLM.int8` (`SCB`) and 4-bit NF4/FP4 with optional double quantization.
//!
//! `LLM.int8`: `W = q · SCB[o] · (1/127 as f32)` (`int8_vectorwise_dequant`, in that order).
//! 4-bit: the flattened `[out, in]` weight, two codes a byte with the first in the HIGH nibble;
//! `W[j] = quant_map[code_j] · absmax[j / blocksize]` in F32 (`_dequantize_4bit_compute`),
//! a last partial block taking the last absmax. With double quantization `absmax` is U8 codes:
//! `nested_quant_map[a] · nested_absmax[t / nested_blocksize] + nested_offset`, a multiply
//! then an add in F32 (`dequantize_4bit`). The table is always the stored `quant_map`:
//! bitsandbytes' "fp4" is not E2M1.

use super::decode::{FloatKind, Floats};
use super::grouped::{Checks, Codes, Grid, Grouped, Groups, Source, Value};
use super::{KernelError, Stored, grouped_layout};
use crate::format::Dtype;
use serde::Deserialize;

/// The constant bitsandbytes multiplies by, a Python float that torch rounds to `f32`.
#[expect(
    clippy::cast_possible_truncation,
    reason = "torch multiplies an F32 tensor by the Python float rounded to f32"
)]
const ONE_OVER_127: f32 = 7.874_015_718_698_502e-3_f64 as f32;

/// `LLM.int8`: an I8 `weight` `[out, in]` and its F32 row absmax `SCB` `[out]`.
#[derive(Clone, Debug)]
pub struct Int8<'a> {
    inner: Grouped<'a>,
}
grouped_layout!(Int8);

impl<'a> Int8<'a> {
    pub fn new(weight: Stored<'a>, scb: Stored<'a>) -> Result<Self, KernelError> {
        weight.check("weight", &[Dtype::I8])?;
        if weight.shape.len() != 2 {
            return Err(KernelError::new(
                "weight",
                format!("shape {:?}, expected [out, in]", weight.shape),
            ));
        }
        let (rows, cols) = (weight.dim(0), weight.dim(1));
        scb.check_shape("SCB", &[Dtype::F32], &[rows])?;
        Ok(Int8 {
            inner: Grouped {
                rows,
                cols,
                experts: 1,
                codes: Codes::Bytes(weight.bytes),
                value: Value::Signed,
                groups: Groups::Tiles {
                    rows: 1,
                    cols: cols.max(1),
                    expert_rows: rows,
                },
                scales: Grid {
                    values: Source::Stored(Floats::new(scb.bytes, FloatKind::F32)),
                    row_stride: 1,
                    group_stride: 0,
                },
                scale_member: "SCB",
                zeros: None,
                biases: None,
                factor: Some(ONE_OVER_127),
                rounding: None,
                checks: Checks {
                    negative_scales: false,
                    zero_range: None,
                },
            },
        })
    }
}

/// The JSON held by `weight.quant_state.bitsandbytes__nf4` (or `__fp4`).
#[derive(Clone, Debug, Deserialize)]
pub struct QuantState {
    pub quant_type: String,
    pub blocksize: usize,
    pub shape: Vec<usize>,
    #[serde(default)]
    pub dtype: Option<String>,
    #[serde(default)]
    pub nested_blocksize: Option<usize>,
    #[serde(default)]
    pub nested_offset: Option<f32>,
}

impl QuantState {
    /// Parses the `quant_state` member's bytes.
    pub fn parse(stored: &Stored<'_>) -> Result<QuantState, KernelError> {
        stored.check("quant_state", &[Dtype::U8])?;
        serde_json::from_slice(stored.bytes).map_err(|error| {
            KernelError::new("quant_state", format!("not the expected JSON: {error}"))
        })
    }
}

/// Members of a 4-bit weight.
#[derive(Clone, Copy, Debug)]
pub struct FourBitMembers<'a> {
    /// Packed codes, whatever dtype they are stored as (`quant_storage`).
    pub weight: Stored<'a>,
    pub absmax: Stored<'a>,
    pub quant_map: Stored<'a>,
    /// `nested_absmax` and `nested_quant_map`, with double quantization.
    pub nested: Option<(Stored<'a>, Stored<'a>)>,
    pub quant_state: Stored<'a>,
}

/// 4-bit NF4 or FP4.
#[derive(Clone, Debug)]
pub struct FourBit<'a> {
    inner: Grouped<'a>,
    state: QuantState,
}
grouped_layout!(FourBit);

impl<'a> FourBit<'a> {
    pub fn new(members: FourBitMembers<'a>) -> Result<Self, KernelError> {
        let state = QuantState::parse(&members.quant_state)?;
        let [rows, cols] = state.shape[..] else {
            return Err(KernelError::new(
                "quant_state",
                format!("shape {:?}, expected [out, in]", state.shape),
            ));
        };
        if state.blocksize == 0 {
            return Err(KernelError::new("quant_state", "blocksize 0"));
        }
        let count = rows.checked_mul(cols).ok_or_else(|| {
            KernelError::new(
                "quant_state",
                format!("shape {:?} is too large", state.shape),
            )
        })?;
        let weight = members.weight;
        if weight.bytes.len() != count.div_ceil(2) {
            return Err(KernelError::new(
                "weight",
                format!(
                    "{} bytes, {count} 4-bit codes of shape {:?} take {}",
                    weight.bytes.len(),
                    state.shape,
                    count.div_ceil(2)
                ),
            ));
        }
        members
            .quant_map
            .check_shape("quant_map", &[Dtype::F32], &[16])?;
        let map = Floats::new(members.quant_map.bytes, FloatKind::F32);
        let table = std::array::from_fn(|k| map.get(k));
        let blocks = count.div_ceil(state.blocksize);
        let scales = match (members.nested, state.nested_blocksize) {
            (Some((nested_absmax, nested_map)), Some(nested_block)) if nested_block > 0 => {
                members
                    .absmax
                    .check_shape("absmax", &[Dtype::U8], &[blocks])?;
                nested_absmax.check_shape(
                    "nested_absmax",
                    &[Dtype::F32],
                    &[blocks.div_ceil(nested_block)],
                )?;
                nested_map.check_shape("nested_quant_map", &[Dtype::F32], &[256])?;
                let nested = Floats::new(nested_map.bytes, FloatKind::F32);
                Source::Nested {
                    codes: members.absmax.bytes,
                    map: (0..256).map(|k| nested.get(k)).collect(),
                    absmax: Floats::new(nested_absmax.bytes, FloatKind::F32),
                    block: nested_block,
                    offset: state.nested_offset.unwrap_or(0.0),
                }
            }
            (None, None) => {
                members
                    .absmax
                    .check_shape("absmax", &[Dtype::F32], &[blocks])?;
                Source::Stored(Floats::new(members.absmax.bytes, FloatKind::F32))
            }
            _ => {
                return Err(KernelError::new(
                    "nested_absmax",
                    "nested members and quant_state's nested_blocksize disagree",
                ));
            }
        };
        Ok(FourBit {
            inner: Grouped {
                rows,
                cols,
                experts: 1,
                codes: Codes::FlatHighFirst(weight.bytes),
                value: Value::Table(table),
                groups: Groups::Flat {
                    size: state.blocksize,
                },
                scales: Grid {
                    values: scales,
                    row_stride: 0,
                    group_stride: 1,
                },
                scale_member: "absmax",
                zeros: None,
                biases: None,
                factor: None,
                rounding: None,
                checks: Checks {
                    negative_scales: false,
                    zero_range: None,
                },
            },
            state,
        })
    }

    /// The parsed `quant_state` (quant type, block size, the original dtype).
    pub fn quant_state(&self) -> &QuantState {
        &self.state
    }
}

#[cfg(test)]
mod tests {
    #![expect(
        clippy::cast_possible_truncation,
        reason = "fixtures of small, known sizes and values"
    )]
    use super::super::testing::{Owned, Rng, assert_same, dequantize_all};
    use super::*;

    #[test]
    fn int8_rows_scale_by_scb_over_127() {
        let (rows, cols) = (3, 10);
        let mut rng = Rng::new(51);
        let w: Vec<f32> = (0..rows * cols).map(|_| rng.signed()).collect();
        // `int8_vectorwise_quant`: round(w · 127 / rowmax).
        let scb: Vec<f32> = w
            .chunks(cols)
            .map(|r| r.iter().fold(0f32, |m, x| m.max(x.abs())))
            .collect();
        let q: Vec<i8> = (0..rows * cols)
            .map(|k| (w[k] * 127.0 / scb[k / cols]).round() as i8)
            .collect();
        let weight = Owned::i8(&[rows, cols], &q);
        let scb_member = Owned::f32(&[rows], &scb);
        let kernel = Int8::new(weight.stored(), scb_member.stored()).unwrap();
        let expected: Vec<f32> = (0..rows * cols)
            .map(|k| f32::from(q[k]) * scb[k / cols] * 7.874_016e-3)
            .collect();
        assert_same(&dequantize_all(&kernel), &expected, cols);
    }

    fn state(shape: [usize; 2], blocksize: usize, nested: Option<(usize, f32)>) -> Owned {
        let mut json = serde_json::json!({
            "quant_type": "nf4", "blocksize": blocksize, "dtype": "bfloat16", "shape": shape,
        });
        if let Some((block, offset)) = nested {
            json["nested_blocksize"] = block.into();
            json["nested_offset"] = offset.into();
            json["nested_dtype"] = "float32".into();
        }
        let bytes = serde_json::to_vec(&json).unwrap();
        Owned::new(Dtype::U8, &[bytes.len()], bytes)
    }

    #[test]
    fn four_bit_codes_high_nibble_first_through_nested_absmax() {
        let (rows, cols, blocksize, nested_block) = (5usize, 13usize, 8usize, 3usize);
        let count = rows * cols;
        let blocks = count.div_ceil(blocksize);
        let mut rng = Rng::new(52);
        let codes = rng.codes(4, count);
        // Packed as bitsandbytes does: `q[::2] << 4 | q[1::2]`, an odd last code alone.
        let packed: Vec<u8> = codes
            .chunks(2)
            .map(|p| p[0] << 4 | p.get(1).copied().unwrap_or(0))
            .collect();
        let weight = Owned::new(Dtype::U8, &[packed.len(), 1], packed);
        let table: Vec<f32> = (0..16)
            .map(|k| (k as f32 - 7.5) / 7.5 + rng.signed() * 0.01)
            .collect();
        let quant_map = Owned::f32(&[16], &table);
        let nested_map: Vec<f32> = (0..256)
            .map(|k| k as f32 / 255.0 + rng.signed() * 1e-3)
            .collect();
        let absmax_codes: Vec<u8> = (0..blocks).map(|_| rng.below(256) as u8).collect();
        let nested_absmax: Vec<f32> = (0..blocks.div_ceil(nested_block))
            .map(|_| rng.signed().abs() * 0.1)
            .collect();
        let offset = 0.0371;
        let members = (
            Owned::new(Dtype::U8, &[blocks], absmax_codes.clone()),
            Owned::f32(&[nested_absmax.len()], &nested_absmax),
            Owned::f32(&[256], &nested_map),
            state([rows, cols], blocksize, Some((nested_block, offset))),
        );
        let kernel = FourBit::new(FourBitMembers {
            weight: weight.stored(),
            absmax: members.0.stored(),
            quant_map: quant_map.stored(),
            nested: Some((members.1.stored(), members.2.stored())),
            quant_state: members.3.stored(),
        })
        .unwrap();
        let expected: Vec<f32> = (0..count)
            .map(|j| {
                let t = j / blocksize;
                let product =
                    nested_map[usize::from(absmax_codes[t])] * nested_absmax[t / nested_block];
                let absmax = product + offset;
                table[usize::from(codes[j])] * absmax
            })
            .collect();
        assert_same(&dequantize_all(&kernel), &expected, cols);
        assert_eq!(kernel.quant_state().quant_type, "nf4");

        // Plain F32 absmax.
        let plain: Vec<f32> = (0..blocks).map(|_| rng.signed().abs()).collect();
        let absmax = Owned::f32(&[blocks], &plain);
        let plain_state = state([rows, cols], blocksize, None);
        let kernel = FourBit::new(FourBitMembers {
            weight: weight.stored(),
            absmax: absmax.stored(),
            quant_map: quant_map.stored(),
            nested: None,
            quant_state: plain_state.stored(),
        })
        .unwrap();
        let expected: Vec<f32> = (0..count)
            .map(|j| table[usize::from(codes[j])] * plain[j / blocksize])
            .collect();
        assert_same(&dequantize_all(&kernel), &expected, cols);

        let broken = Owned::new(Dtype::U8, &[3], b"{x}".to_vec());
        let error = FourBit::new(FourBitMembers {
            weight: weight.stored(),
            absmax: absmax.stored(),
            quant_map: quant_map.stored(),
            nested: None,
            quant_state: broken.stored(),
        })
        .unwrap_err();
        assert_eq!(error.member, "quant_state");
        assert!(
            error.message.starts_with("not the expected JSON"),
            "{error}"
        );
    }
}
