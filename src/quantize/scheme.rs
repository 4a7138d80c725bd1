//! The schemes stui writes, named as the compressed-tensors presets, and what each one writes
//! for a weight: its members (tensors beside or in place of `P.weight`), their dtypes and shapes,
//! and its `quantization_config`.

use super::lanes::Loaded;
use super::{fp8, int_packed, lanes, nvfp4};
use crate::format::{Dtype, Shape};
use crate::quant::kernels::Half;
use crate::recycle::Recycled;
use serde::Serialize;

/// A quantization scheme, as the compressed-tensors preset of the same name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Scheme {
    /// int8 weights per channel or per tensor, int8 dynamic activations (`int-quantized`).
    #[serde(rename = "W8A8")]
    W8A8,
    /// int8 weight-only in groups (`pack-quantized`).
    #[serde(rename = "W8A16")]
    W8A16,
    /// int4 weight-only in groups, symmetric (`pack-quantized`).
    #[serde(rename = "W4A16")]
    W4A16,
    /// int4 weight-only in groups with zero points (`pack-quantized`).
    #[serde(rename = "W4A16_ASYM")]
    W4A16Asym,
    /// FP8 E4M3 weights per channel, dynamic per-token activations (`float-quantized`).
    #[serde(rename = "FP8_DYNAMIC")]
    Fp8Dynamic,
    /// FP8 E4M3 weights in 128x128 blocks, dynamic per-group activations (`float-quantized`).
    #[serde(rename = "FP8_BLOCK")]
    Fp8Block,
    /// FP4 E2M1 in groups of 16 with FP8 group scales and a global scale
    /// (`nvfp4-pack-quantized`).
    #[serde(rename = "NVFP4A16")]
    Nvfp4A16,
}

/// The default group of the grouped int schemes, as in the presets.
pub const DEFAULT_GROUP: u64 = 128;
/// The `FP8_BLOCK` block's side.
pub const BLOCK: u64 = 128;
/// The NVFP4 group.
pub const NVFP4_GROUP: u64 = 16;

impl Scheme {
    pub const ALL: [Scheme; 7] = [
        Scheme::W8A8,
        Scheme::W8A16,
        Scheme::W4A16,
        Scheme::W4A16Asym,
        Scheme::Fp8Dynamic,
        Scheme::Fp8Block,
        Scheme::Nvfp4A16,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Scheme::W8A8 => "W8A8",
            Scheme::W8A16 => "W8A16",
            Scheme::W4A16 => "W4A16",
            Scheme::W4A16Asym => "W4A16_ASYM",
            Scheme::Fp8Dynamic => "FP8_DYNAMIC",
            Scheme::Fp8Block => "FP8_BLOCK",
            Scheme::Nvfp4A16 => "NVFP4A16",
        }
    }

    /// The scheme named `name` (case-insensitive).
    pub fn from_name(name: &str) -> Option<Scheme> {
        Scheme::ALL
            .into_iter()
            .find(|scheme| scheme.name().eq_ignore_ascii_case(name))
    }

    /// The scheme after this one, for cycling through them.
    #[must_use]
    pub fn next(self) -> Scheme {
        let index = Scheme::ALL.iter().position(|&s| s == self).unwrap_or(0);
        Scheme::ALL[(index + 1) % Scheme::ALL.len()]
    }

    /// The compressed-tensors `format` of the output.
    pub const fn format(self) -> &'static str {
        match self {
            Scheme::W8A8 => "int-quantized",
            Scheme::W8A16 | Scheme::W4A16 | Scheme::W4A16Asym => "pack-quantized",
            Scheme::Fp8Dynamic | Scheme::Fp8Block => "float-quantized",
            Scheme::Nvfp4A16 => "nvfp4-pack-quantized",
        }
    }

    /// The bits of one quantized value.
    pub const fn bits(self) -> u32 {
        match self {
            Scheme::W4A16 | Scheme::W4A16Asym | Scheme::Nvfp4A16 => 4,
            _ => 8,
        }
    }
}

impl std::fmt::Display for Scheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a member of a quantized weight holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The quantized values, one output row for each row of the weight.
    Codes,
    /// The scales, one output row for each `rows` rows of the weight.
    Scales { rows: u64 },
    /// Zero points packed down the rows: one output row for each `rows` rows of the weight.
    ZeroPoints { rows: u64 },
    /// The weight's shape, `[out, in]` as I64.
    Shape,
    /// The tensor's FP32 global scale.
    GlobalScale,
}

/// One tensor written for a quantized weight `P.weight`: named `P.weight` + `suffix`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub suffix: &'static str,
    pub role: Role,
    pub dtype: Dtype,
    pub shape: Shape,
}

impl Member {
    /// Rows of the weight that make one row of this member, `None` for a member written whole.
    pub fn rows_per_row(&self) -> Option<u64> {
        match self.role {
            Role::Codes => Some(1),
            Role::Scales { rows } | Role::ZeroPoints { rows } => Some(rows),
            Role::Shape | Role::GlobalScale => None,
        }
    }

    /// Bytes of one row of this member.
    pub fn row_bytes(&self) -> u64 {
        let width = self.shape.get(1).unwrap_or(1);
        width * u64::from(self.dtype.bits() / 8)
    }

    pub fn byte_len(&self) -> u64 {
        self.dtype
            .byte_len(self.shape.iter().product())
            .unwrap_or(0)
    }
}

/// A weight to quantize under a scheme: everything its kernels need.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub scheme: Scheme,
    /// Columns of a group (the grouped int schemes).
    pub group: u64,
    pub rows: u64,
    pub columns: u64,
    /// The dtype scales are stored in.
    pub scale_dtype: Dtype,
    /// The global scale (NVFP4): `448 * 6 / absmax`.
    pub global_scale: f32,
    /// The weight's largest magnitude, 0 when not known.
    pub absmax: f64,
}

impl Plan {
    /// The plan for a `[rows, columns]` weight of `source` dtype whose largest magnitude is
    /// `absmax`. Not for W8A8, which has its own writer.
    pub fn new(
        scheme: Scheme,
        group: u64,
        [rows, columns]: [u64; 2],
        source: Dtype,
        absmax: f64,
    ) -> Plan {
        let scale_dtype = match scheme {
            Scheme::Nvfp4A16 => Dtype::F8E4M3,
            _ => super::scale_dtype(source),
        };
        Plan {
            scheme,
            group: group.max(1),
            rows,
            columns,
            scale_dtype,
            global_scale: nvfp4::global_scale(absmax),
            absmax,
        }
    }

    /// The type the loaders work the weight's values out in ([`Loaded`]): its scales' type;
    /// BF16 for NVFP4, whose loader (compressed-tensors') works in `f32` and rounds to BF16
    /// whatever the model's type.
    pub fn loaded(&self) -> Loaded {
        if self.scheme == Scheme::Nvfp4A16 {
            Loaded::Half(Half::Bf16)
        } else {
            Loaded::of(self.scale_dtype)
        }
    }

    /// The tensors written for the weight, in place of `P.weight`.
    pub fn members(&self) -> Vec<Member> {
        let (out, columns) = (self.rows, self.columns);
        let member = |suffix, role, dtype, shape: Shape| Member {
            suffix,
            role,
            dtype,
            shape,
        };
        match self.scheme {
            Scheme::W8A8 => vec![
                member("", Role::Codes, Dtype::I8, Shape::from([out, columns])),
                member(
                    "_scale",
                    Role::Scales { rows: 1 },
                    self.scale_dtype,
                    Shape::from([out, 1]),
                ),
            ],
            Scheme::W8A16 | Scheme::W4A16 | Scheme::W4A16Asym => {
                let bits = u64::from(self.scheme.bits());
                let groups = columns.div_ceil(self.group);
                let mut members = vec![
                    member(
                        "_packed",
                        Role::Codes,
                        Dtype::I32,
                        Shape::from([out, (columns * bits).div_ceil(32)]),
                    ),
                    member(
                        "_scale",
                        Role::Scales { rows: 1 },
                        self.scale_dtype,
                        Shape::from([out, groups]),
                    ),
                    member("_shape", Role::Shape, Dtype::I64, Shape::from([2])),
                ];
                if self.scheme == Scheme::W4A16Asym {
                    members.push(member(
                        "_zero_point",
                        Role::ZeroPoints { rows: 32 / bits },
                        Dtype::I32,
                        Shape::from([(out * bits).div_ceil(32), groups]),
                    ));
                }
                members
            }
            Scheme::Fp8Dynamic => vec![
                member("", Role::Codes, Dtype::F8E4M3, Shape::from([out, columns])),
                member(
                    "_scale",
                    Role::Scales { rows: 1 },
                    self.scale_dtype,
                    Shape::from([out, 1]),
                ),
            ],
            Scheme::Fp8Block => vec![
                member("", Role::Codes, Dtype::F8E4M3, Shape::from([out, columns])),
                member(
                    "_scale",
                    Role::Scales { rows: BLOCK },
                    self.scale_dtype,
                    Shape::from([out.div_ceil(BLOCK), columns.div_ceil(BLOCK)]),
                ),
            ],
            Scheme::Nvfp4A16 => vec![
                member(
                    "_packed",
                    Role::Codes,
                    Dtype::U8,
                    Shape::from([out, columns.div_ceil(2)]),
                ),
                member(
                    "_scale",
                    Role::Scales { rows: 1 },
                    Dtype::F8E4M3,
                    Shape::from([out, columns.div_ceil(NVFP4_GROUP)]),
                ),
                member(
                    "_global_scale",
                    Role::GlobalScale,
                    Dtype::F32,
                    Shape::from([1]),
                ),
            ],
        }
    }

    /// Rows read at a time must be a multiple of this, so that every member's rows for them
    /// are whole.
    pub fn row_multiple(&self) -> u64 {
        self.members()
            .iter()
            .filter_map(Member::rows_per_row)
            .max()
            .unwrap_or(1)
    }

    /// Quantizes `values`, whole rows of the weight from a multiple of [`Plan::row_multiple`],
    /// appending each streamed member's bytes for them to `out` (codes, scales, zero points).
    pub fn quantize(&self, values: &[f32], out: &mut Streams) {
        self.reserve(values, out);
        match self.scheme {
            Scheme::W8A16 | Scheme::W4A16 | Scheme::W4A16Asym => {
                int_packed::quantize(self, values, out);
            }
            Scheme::Fp8Dynamic | Scheme::Fp8Block => fp8::quantize(self, values, out),
            Scheme::Nvfp4A16 => nvfp4::quantize(self, values, out),
            Scheme::W8A8 => {}
        }
    }

    /// Room in `out` for every streamed member's bytes of `values`: streams taken back from
    /// another weight's blocks, grown as the kernels appended, were reallocated several times a
    /// block, the workers contending for the allocator's lock.
    fn reserve(&self, values: &[f32], out: &mut Streams) {
        let rows = values.len() as u64 / self.columns.max(1);
        for member in self.members() {
            if let (Some(rows_per_row), Some(stream)) =
                (member.rows_per_row(), out.of_mut(member.role))
            {
                let bytes = rows.div_ceil(rows_per_row) * member.row_bytes();
                stream.reserve(usize::try_from(bytes).unwrap_or(0));
            }
        }
    }

    /// [`Plan::quantize`], with at least the scales: FP8's alone, which need no codes.
    pub fn quantize_scales(&self, values: &[f32], out: &mut Streams) {
        match self.scheme {
            Scheme::Fp8Dynamic | Scheme::Fp8Block => fp8::quantize_scales(self, values, out),
            _ => self.quantize(values, out),
        }
    }

    /// The error quantizing `values` (as for [`Plan::quantize`]) leaves, as [`Plan::check`]
    /// would measure it of what [`Plan::quantize`] writes, without writing the codes; `streams`
    /// serves only weights whose errors `f32` does not measure (`F64` scales, magnitudes far
    /// from 1: see [`lanes::tensor_measured_in_f32`]), measured that way. `signal` is the sum of
    /// the values' squares, which every scheme shares; the largest error in steps is measured
    /// only that way, 0 otherwise (see [`lanes::Tally`]). `ranges`, where a comparison worked
    /// them out for the block, spare the int schemes working them out again, and FP8 its blocks'
    /// largest magnitudes.
    pub fn error(
        &self,
        values: &[f32],
        signal: f64,
        ranges: Option<&int_packed::BlockRanges>,
        streams: &mut Streams,
    ) -> ErrorSums {
        match self.scheme {
            _ if self.scale_dtype == Dtype::F64 || !lanes::tensor_measured_in_f32(self.absmax) => {
                streams.clear();
                self.quantize(values, streams);
                self.check(values, streams).0
            }
            Scheme::W8A16 | Scheme::W4A16 | Scheme::W4A16Asym => {
                int_packed::error(self, values, signal, ranges)
            }
            Scheme::Fp8Dynamic | Scheme::Fp8Block => fp8::error(self, values, signal, ranges),
            Scheme::Nvfp4A16 => nvfp4::error(self, values, signal),
            Scheme::W8A8 => ErrorSums::default(),
        }
    }

    /// Dequantizes the members read back for whole rows and compares them with `source`, the
    /// same rows of the source: the error left, and whether every value is within half a step
    /// of the grid (scales as stored) of its source.
    pub fn check(&self, source: &[f32], written: &Streams) -> (ErrorSums, bool) {
        match self.scheme {
            Scheme::W8A16 | Scheme::W4A16 | Scheme::W4A16Asym => {
                int_packed::check(self, source, written)
            }
            Scheme::Fp8Dynamic | Scheme::Fp8Block => fp8::check(self, source, written),
            Scheme::Nvfp4A16 => nvfp4::check(self, source, written),
            Scheme::W8A8 => (ErrorSums::default(), false),
        }
    }

    /// The bytes of a member written whole (the shape, the global scale).
    pub fn whole(&self, role: Role) -> Vec<u8> {
        match role {
            Role::Shape => [self.rows, self.columns]
                .iter()
                .flat_map(|&d| i64::try_from(d).unwrap_or(i64::MAX).to_le_bytes())
                .collect(),
            Role::GlobalScale => self.global_scale.to_le_bytes().to_vec(),
            Role::Codes | Role::Scales { .. } | Role::ZeroPoints { .. } => Vec::new(),
        }
    }
}

/// The bytes of a run of rows, one buffer for each streamed member.
#[derive(Debug, Default)]
pub struct Streams {
    pub codes: Vec<u8>,
    pub scales: Vec<u8>,
    pub zero_points: Vec<u8>,
}

impl Streams {
    pub fn of(&self, role: Role) -> &[u8] {
        match role {
            Role::Codes => &self.codes,
            Role::Scales { .. } => &self.scales,
            Role::ZeroPoints { .. } => &self.zero_points,
            Role::Shape | Role::GlobalScale => &[],
        }
    }

    pub fn of_mut(&mut self, role: Role) -> Option<&mut Vec<u8>> {
        match role {
            Role::Codes => Some(&mut self.codes),
            Role::Scales { .. } => Some(&mut self.scales),
            Role::ZeroPoints { .. } => Some(&mut self.zero_points),
            Role::Shape | Role::GlobalScale => None,
        }
    }

    pub fn clear(&mut self) {
        self.codes.clear();
        self.scales.clear();
        self.zero_points.clear();
    }

    /// Streams given back before (emptied, with their room), or new ones.
    pub fn take() -> Streams {
        let mut streams = RECYCLED.take();
        streams.clear();
        streams
    }

    /// Gives the streams' room back for [`Streams::take`].
    pub fn give(self) {
        RECYCLED.give(self);
    }
}

static RECYCLED: Recycled<Streams> = Recycled::new();

/// Sums of the error a quantization leaves, merged over rows.
#[derive(Clone, Copy, Debug, Default)]
pub struct ErrorSums {
    pub signal: f64,
    pub noise: f64,
    pub max_abs: f64,
    /// Worst `|x - x'|` over the local grid step.
    pub max_in_steps: f64,
}

impl ErrorSums {
    pub fn merge(&mut self, other: &ErrorSums) {
        self.signal += other.signal;
        self.noise += other.noise;
        self.max_abs = self.max_abs.max(other.max_abs);
        self.max_in_steps = self.max_in_steps.max(other.max_in_steps);
    }
}

/// Scales decoded from their stored bytes.
pub fn decode_scales(dtype: Dtype, bytes: &[u8]) -> Vec<f64> {
    if dtype == Dtype::F8E4M3 {
        return bytes.iter().map(|&b| f64::from(fp8::decode(b))).collect();
    }
    let mut out = Vec::with_capacity(bytes.len());
    super::decode_f64(dtype, bytes, &mut out);
    out
}

/// The compressed-tensors `quantization_config` of a scheme other than W8A8, as llm-compressor
/// writes it for the preset; `ignore` names the modules left as they were.
pub fn config(scheme: Scheme, group: u64, ignore: &[&str]) -> serde_json::Value {
    use serde_json::{Value, json};
    let arguments = |bits: u32, kind: &str, strategy: &str| {
        json!({
            "actorder": null, "block_structure": null, "dynamic": false, "group_size": null,
            "num_bits": bits, "observer": null, "observer_kwargs": {}, "scale_dtype": null,
            "strategy": strategy, "symmetric": true, "type": kind, "zp_dtype": null
        })
    };
    let mut weights = arguments(scheme.bits(), "float", "channel");
    let mut input = Value::Null;
    match scheme {
        Scheme::W8A16 | Scheme::W4A16 | Scheme::W4A16Asym | Scheme::W8A8 => {
            weights = arguments(scheme.bits(), "int", "group");
            weights["group_size"] = json!(group);
            if scheme == Scheme::W4A16Asym {
                weights["symmetric"] = json!(false);
                weights["zp_dtype"] = json!("torch.int8");
            }
        }
        Scheme::Fp8Dynamic => {
            input = arguments(8, "float", "token");
            input["dynamic"] = json!(true);
        }
        Scheme::Fp8Block => {
            weights["strategy"] = json!("block");
            weights["block_structure"] = json!([BLOCK, BLOCK]);
            input = arguments(8, "float", "group");
            input["dynamic"] = json!(true);
            input["group_size"] = json!(BLOCK);
        }
        Scheme::Nvfp4A16 => {
            weights["strategy"] = json!("tensor_group");
            weights["group_size"] = json!(NVFP4_GROUP);
            weights["scale_dtype"] = json!("torch.float8_e4m3fn");
        }
    }
    json!({
        "config_groups": {
            scheme.name(): {
                "format": scheme.format(),
                "input_activations": input,
                "output_activations": null,
                "targets": ["Linear"],
                "weights": weights,
            }
        },
        "format": scheme.format(),
        "global_compression_ratio": null,
        "ignore": ignore,
        "kv_cache_scheme": null,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "transform_config": {},
        "version": COMPRESSED_TENSORS_VERSION,
    })
}

/// The compressed-tensors version whose layouts are written (dense packing, packed zero points).
const COMPRESSED_TENSORS_VERSION: &str = "0.19.0";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for scheme in Scheme::ALL {
            assert_eq!(Scheme::from_name(scheme.name()), Some(scheme));
        }
        assert_eq!(Scheme::from_name("w4a16_asym"), Some(Scheme::W4A16Asym));
        assert_eq!(Scheme::from_name("W3A16"), None);
    }

    #[test]
    fn members_have_the_preset_shapes() {
        let plan = Plan::new(Scheme::W4A16Asym, 128, [128, 256], Dtype::Bf16, 1.0);
        let members = plan.members();
        let shapes: Vec<(&str, Dtype, Vec<u64>)> = members
            .iter()
            .map(|m| (m.suffix, m.dtype, m.shape.to_vec()))
            .collect();
        assert_eq!(
            shapes,
            [
                ("_packed", Dtype::I32, vec![128, 32]),
                ("_scale", Dtype::Bf16, vec![128, 2]),
                ("_shape", Dtype::I64, vec![2]),
                ("_zero_point", Dtype::I32, vec![16, 2]),
            ]
        );
        assert_eq!(plan.row_multiple(), 8);
        let block = Plan::new(Scheme::Fp8Block, 128, [128, 192], Dtype::Bf16, 1.0);
        assert_eq!(block.members()[1].shape.to_vec(), [1, 2]);
        let nvfp4 = Plan::new(Scheme::Nvfp4A16, 128, [128, 192], Dtype::Bf16, 1.0);
        let shapes: Vec<Vec<u64>> = nvfp4.members().iter().map(|m| m.shape.to_vec()).collect();
        assert_eq!(shapes, [vec![128, 96], vec![128, 12], vec![1]]);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// The error worked out without codes is the one measured of the codes written.
        #[test]
        fn the_error_without_codes_is_the_one_written(
            scheme in proptest::sample::select(&Scheme::ALL[1..]),
            (group, groups) in (proptest::sample::select(&[16u64, 24, 32, 128][..]), 1u64..4),
            rows in proptest::prop_oneof![1u64..20, 120u64..140],
            source in proptest::sample::select(&[Dtype::Bf16, Dtype::F16, Dtype::F32][..]),
            magnitude in proptest::sample::select(&[1e-6f32, 0.02, 3.0, 1e4][..]),
            seed: u64,
        ) {
            let columns = group * groups;
            proptest::prop_assume!(scheme != Scheme::Nvfp4A16 || columns.is_multiple_of(16));
            let count = usize::try_from(rows * columns).unwrap();
            let width = usize::try_from(columns).unwrap();
            let mut state = seed | 1;
            let values: Vec<f32> = (0..count)
                .map(|i| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    #[expect(clippy::cast_precision_loss, reason = "a test pattern")]
                    let unit = (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                    // Some zeros, some groups of one sign, rows of values far below their
                    // largest (FP8's subnormals), the rest centred.
                    let x = match i % 97 {
                        _ if (i / width) % 4 == 1 && i % width > 0 => {
                            unit * magnitude / 8192.0
                        }
                        0..=4 => 0.0,
                        5..=40 if (i / 128) % 3 == 0 => unit.abs() * magnitude,
                        _ => unit * magnitude,
                    };
                    match source {
                        Dtype::Bf16 => half::bf16::from_f32(x).to_f32(),
                        Dtype::F16 => half::f16::from_f32(x).to_f32(),
                        _ => x,
                    }
                })
                .collect();
            let absmax = values.iter().fold(0f32, |m, x| m.max(x.abs()));
            let plan = Plan::new(scheme, group, [rows, columns], source, f64::from(absmax));
            let mut written = Streams::default();
            plan.quantize(&values, &mut written);
            let (measured, _) = plan.check(&values, &written);
            let signal = values.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
            let worked_out = plan.error(&values, signal, None, &mut Streams::default());
            // A comparison leaves the largest error in steps unmeasured, but where it measures
            // as the check does.
            let in_f32 = plan.scale_dtype != Dtype::F64
                && super::super::lanes::tensor_measured_in_f32(plan.absmax);
            if in_f32 {
                proptest::prop_assert_eq!(worked_out.max_in_steps, 0.0);
            }
            let worked_out = ErrorSums {
                max_in_steps: measured.max_in_steps,
                ..worked_out
            };
            super::super::lanes::assert_agree(&measured, &worked_out, false)?;
        }
    }
}
