//! Tensor names as members of a quantized weight: which module a stored tensor belongs to and
//! what it holds there (`P.qweight` is the codes of `P.weight`, `P.weight_scale` its scales).

use serde::Serialize;

/// What a stored tensor holds for its weight, by the name suffix producers give it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// `P.weight`: the codes in most layouts, or a plain weight.
    Weight,
    WeightPacked,
    WeightShape,
    WeightScale,
    WeightScaleInv,
    /// `ModelOpt`'s multiplying second-level scale.
    WeightScale2,
    /// compressed-tensors' dividing global scale.
    WeightGlobalScale,
    WeightZeroPoint,
    WeightGIdx,
    QWeight,
    QZeros,
    Scales,
    Biases,
    GIdx,
    Scb,
    Absmax,
    QuantMap,
    NestedAbsmax,
    NestedQuantMap,
    QuantState,
    QuantoData,
    QuantoScale,
    QuantoShift,
    HqqCodes,
    /// `P.scale`: HQQ's scale, or `DeepSeek`-V4's FP8 multiplier.
    Scale,
    HqqZero,
    HqqShape,
    Exl2Codes,
    Exl3Codes,
    /// gpt-oss `P_blocks`.
    Blocks,
    /// gpt-oss `P_scales`.
    BlockScales,
    /// Activation scales and format markers, kept with the weight, never dequantized.
    Auxiliary,
}

impl Role {
    /// The codes of a weight, whose presence makes a group of tensors a quantized weight.
    pub const fn is_codes(self) -> bool {
        matches!(
            self,
            Role::Weight
                | Role::WeightPacked
                | Role::QWeight
                | Role::QuantoData
                | Role::HqqCodes
                | Role::Exl2Codes
                | Role::Exl3Codes
                | Role::Blocks
        )
    }

    /// Members that exist only beside quantized codes: their presence without the codes means
    /// the weight itself is missing.
    pub const fn needs_codes(self) -> bool {
        matches!(
            self,
            Role::WeightShape
                | Role::WeightScale
                | Role::WeightScaleInv
                | Role::WeightScale2
                | Role::WeightGlobalScale
                | Role::WeightZeroPoint
                | Role::WeightGIdx
                | Role::QZeros
                | Role::Scb
                | Role::Absmax
                | Role::QuantState
        )
    }

    /// Members whose values, not only their shapes, say what the weight is (its logical shape,
    /// its quant state, its order of groups): read whole as the weights are worked out.
    pub const fn read_for_values(self) -> bool {
        matches!(
            self,
            Role::WeightShape | Role::GIdx | Role::WeightGIdx | Role::QuantState | Role::HqqShape
        )
    }

    /// Members whose values are a weight's settings rather than its numbers (its shape, group
    /// order, zero points, lookup tables and flags): constant or zero by design, so that a
    /// scan of the stored tensors does not report them as such.
    pub const fn holds_settings(self) -> bool {
        matches!(
            self,
            Role::WeightShape
                | Role::GIdx
                | Role::WeightGIdx
                | Role::QuantState
                | Role::HqqShape
                | Role::QZeros
                | Role::WeightZeroPoint
                | Role::QuantMap
                | Role::NestedQuantMap
                | Role::QuantoShift
                | Role::Auxiliary
        )
    }

    /// Whether the name alone says a model is quantized (a plain `.weight` or `.scale` does not).
    pub const fn marks_quantized(self) -> bool {
        self.needs_codes()
            || matches!(
                self,
                Role::WeightPacked
                    | Role::QWeight
                    | Role::QuantoData
                    | Role::HqqCodes
                    | Role::Exl2Codes
                    | Role::Exl3Codes
                    | Role::Blocks
            )
    }
}

/// How a member's name maps to its weight's: the module prefix, the role, and whether the
/// logical weight is named `prefix.weight` (all but gpt-oss, whose experts are `prefix`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Membership<'a> {
    pub prefix: &'a str,
    pub role: Role,
    pub dotted_weight: bool,
}

/// The module a tensor name belongs to and its role there; `None` for names no layout uses.
pub fn classify(name: &str) -> Option<Membership<'_>> {
    let (head, last) = name.rsplit_once('.')?;
    let member = |prefix, role| {
        Some(Membership {
            prefix,
            role,
            dotted_weight: true,
        })
    };
    let role = match last {
        "weight" => Role::Weight,
        "weight_packed" => Role::WeightPacked,
        "weight_shape" => Role::WeightShape,
        "weight_scale" => Role::WeightScale,
        "weight_scale_inv" => Role::WeightScaleInv,
        "weight_scale_2" => Role::WeightScale2,
        "weight_global_scale" => Role::WeightGlobalScale,
        "weight_zero_point" => Role::WeightZeroPoint,
        "weight_g_idx" => Role::WeightGIdx,
        "qweight" => Role::QWeight,
        "qzeros" => Role::QZeros,
        "scales" => Role::Scales,
        "biases" => Role::Biases,
        "g_idx" => Role::GIdx,
        "SCB" => Role::Scb,
        "W_q" => Role::HqqCodes,
        "scale" => Role::Scale,
        "zero" => Role::HqqZero,
        "shape" => Role::HqqShape,
        "q_weight" => Role::Exl2Codes,
        "trellis" => Role::Exl3Codes,
        "weight_format"
        | "input_scale"
        | "input_zero_point"
        | "input_global_scale"
        | "output_scale"
        | "comfy_quant"
        | "q_scale"
        | "q_scale_max"
        | "q_groups"
        | "q_invperm"
        | "q_perm"
        | "suh"
        | "svh"
        | "mcg"
        | "mul1"
        | "nbits"
        | "group_size"
        | "axis"
        | "packing"
        | "unpack_view_dtype"
        | "compute_dtype"
        | "view_as_float"
        | "channel_wise"
        | "optimize"
        | "round_zero"
        | "encoded_state_dict"
        | "stores_quant_config"
        | "quant_scale"
        | "quant_zero"
        | "offload_meta" => Role::Auxiliary,
        _ => {
            if last == "_data"
                && let Some(prefix) = head.strip_suffix(".weight._data")
            {
                // quanto's packed 2- and 4-bit codes sit one level deeper.
                return member(prefix, Role::QuantoData);
            }
            if let Some(prefix) = head.strip_suffix(".weight") {
                let role = match last {
                    "absmax" => Role::Absmax,
                    "quant_map" => Role::QuantMap,
                    "nested_absmax" => Role::NestedAbsmax,
                    "nested_quant_map" => Role::NestedQuantMap,
                    "_data" => Role::QuantoData,
                    "_scale" => Role::QuantoScale,
                    "_shift" => Role::QuantoShift,
                    _ => return None,
                };
                return member(prefix, role);
            }
            if let Some(prefix) = head.strip_suffix(".weight.quant_state")
                && last.starts_with("bitsandbytes__")
            {
                return member(prefix, Role::QuantState);
            }
            let (prefix, role) = if let Some(stem) = name.strip_suffix("_blocks") {
                (stem, Role::Blocks)
            } else {
                (name.strip_suffix("_scales")?, Role::BlockScales)
            };
            return Some(Membership {
                prefix,
                role,
                dotted_weight: false,
            });
        }
    };
    member(head, role)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_module_and_role_of_every_layouts_names() {
        let of = |name| classify(name).map(|m| (m.prefix, m.role, m.dotted_weight));
        assert_eq!(
            of("m.q_proj.qweight"),
            Some(("m.q_proj", Role::QWeight, true))
        );
        assert_eq!(
            of("m.q_proj.weight.quant_state.bitsandbytes__nf4"),
            Some(("m.q_proj", Role::QuantState, true))
        );
        assert_eq!(
            of("m.q_proj.weight.absmax"),
            Some(("m.q_proj", Role::Absmax, true))
        );
        assert_eq!(
            of("m.experts.down_proj_blocks"),
            Some(("m.experts.down_proj", Role::Blocks, false))
        );
        assert_eq!(
            of("m.q_proj.weight._data"),
            Some(("m.q_proj", Role::QuantoData, true))
        );
        assert_eq!(of("m.q_proj.bias"), None);
        assert_eq!(of("embed"), None);
    }
}
