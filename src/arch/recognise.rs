//! The architecture as tensor names and shapes show it (a guess when there is no config), and
//! its sizes compared with the config's, key by key as the family reads them.

use super::config::ModelConfig;
use super::family::Family;
use crate::finding::{Code, Finding};
use crate::format::TensorInfo;
use crate::text::Counted;
use std::fmt;

/// What the names and shapes say about the model. Sizes the tensors do not show are `None`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Architecture {
    /// The family the tensor names follow (`llama` also covers Mistral and others that share
    /// its names; the config's `model_type` tells them apart).
    pub family: &'static str,
    pub layers: u64,
    pub hidden_size: Option<u64>,
    /// The dense feed-forward width, from the first layer that has a dense MLP.
    pub intermediate_size: Option<u64>,
    /// One expert's feed-forward width, from the first layer that has experts.
    pub expert_intermediate_size: Option<u64>,
    pub vocab_size: Option<u64>,
    /// Rows of the query projection: attention heads times head size.
    pub query_width: Option<u64>,
    /// Rows of the key projection: key-value heads times head size.
    pub key_value_width: Option<u64>,
    /// The width of the query norm (`q_norm`), when the model has one: one head's, or all
    /// heads' in the families whose norm spans them.
    pub head_dim: Option<u64>,
    pub experts: Option<u64>,
    /// No separate output projection: the embedding is reused.
    pub tied_embeddings: bool,
    pub parameters: u64,
}

/// The tensors outside the layers that recognition reads.
const TOP_LEVEL: [&str; 4] = [
    "lm_head.weight",
    "model.embed_tokens.weight",
    "transformer.wte.weight",
    "wte.weight",
];

/// The layer tensors whose first occurrence in any layer recognition reads (for the widths of
/// dense and expert MLPs, which are in different layers of models that mix them): the name
/// before and after an expert's number (none for the others), the axis and divisor that give
/// the width, and which MLP it is the width of.
struct Width {
    before: &'static str,
    after: Option<&'static str>,
    axis: usize,
    divisor: u64,
    mlp: Mlp,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mlp {
    Dense,
    /// One expert, numbered in the name.
    Expert,
    /// Every expert in one tensor whose first axis counts them.
    ExpertsFused,
}

const fn dense(name: &'static str, axis: usize, divisor: u64) -> Width {
    Width {
        before: name,
        after: None,
        axis,
        divisor,
        mlp: Mlp::Dense,
    }
}

const fn expert(before: &'static str, after: &'static str) -> Width {
    Width {
        before,
        after: Some(after),
        axis: 0,
        divisor: 1,
        mlp: Mlp::Expert,
    }
}

const fn experts_fused(name: &'static str, axis: usize, divisor: u64) -> Width {
    Width {
        mlp: Mlp::ExpertsFused,
        ..dense(name, axis, divisor)
    }
}

const WIDTHS: [Width; 11] = [
    dense("mlp.gate_proj.weight", 0, 1),
    dense("feed_forward.gate_proj.weight", 0, 1),
    dense("mlp.gate_up_proj.weight", 0, 2),
    // MLPs without a gate, [width, hidden] then back: Phi's and StarCoder2's.
    dense("mlp.fc1.weight", 0, 1),
    dense("mlp.c_fc.weight", 0, 1),
    expert("mlp.experts.", ".gate_proj.weight"),
    expert("block_sparse_moe.experts.", ".w1.weight"),
    expert("feed_forward.experts.", ".gate_proj.weight"),
    // [experts, hidden, 2 x width].
    experts_fused("mlp.experts.gate_up_proj", 2, 2),
    experts_fused("feed_forward.experts.gate_up_proj", 2, 2),
    // Granite MoE's, [experts, 2 x width, hidden].
    experts_fused("block_sparse_moe.input_linear.weight", 1, 2),
];

impl Width {
    fn matches(&self, suffix: &str) -> bool {
        match self.after {
            None => suffix == self.before,
            Some(after) => suffix
                .strip_prefix(self.before)
                .and_then(|rest| rest.strip_suffix(after))
                .is_some_and(crate::text::is_numeric_part),
        }
    }
}

/// The tensors recognition reads: those of `TOP_LEVEL`, the tensors of layer 0 by name below
/// the layer number, and the first of each of `WIDTHS`. Nothing is kept per tensor of other
/// names, so a hostile header of a million names costs little here.
struct Names<'a> {
    top_level: [Option<&'a TensorInfo>; TOP_LEVEL.len()],
    widths: [Option<&'a TensorInfo>; WIDTHS.len()],
    /// Sorted by suffix; a repeated suffix keeps its first tensor.
    layer_zero: Vec<(&'a str, &'a TensorInfo)>,
    /// Every layer number, once each once `new` returns (a list: 8 bytes a layer where a
    /// hostile header can number a million).
    layers: Vec<u64>,
    /// The highest expert number in any layer.
    last_expert: Option<u64>,
}

fn expert_number(suffix: &str) -> Option<u64> {
    let rest = [
        "mlp.experts.",
        "block_sparse_moe.experts.",
        "feed_forward.experts.",
    ]
    .iter()
    .find_map(|prefix| suffix.strip_prefix(prefix))?;
    rest.split_once('.')?.0.parse().ok()
}

impl<'a> Names<'a> {
    fn new(tensors: impl Iterator<Item = &'a TensorInfo>) -> Self {
        let mut names = Names {
            top_level: [None; TOP_LEVEL.len()],
            widths: [None; WIDTHS.len()],
            layer_zero: Vec::new(),
            layers: Vec::new(),
            last_expert: None,
        };
        for tensor in tensors {
            if let Some((_, rest)) = split_layers(&tensor.name)
                && let Some((layer, suffix)) = rest.split_once('.')
                && let Ok(layer) = layer.parse::<u64>()
            {
                if names.layers.last() != Some(&layer) {
                    names.layers.push(layer);
                }
                if layer == 0 {
                    names.layer_zero.push((suffix, tensor));
                }
                if let Some(expert) = expert_number(suffix) {
                    names.last_expert = names.last_expert.max(Some(expert));
                }
                for (slot, width) in WIDTHS.iter().enumerate() {
                    if names.widths[slot].is_none() && width.matches(suffix) {
                        names.widths[slot] = Some(tensor);
                    }
                }
            } else if let Some(slot) = TOP_LEVEL.iter().position(|&n| n == tensor.name) {
                names.top_level[slot] = Some(tensor);
            }
        }
        names.layers.sort_unstable();
        names.layers.dedup();
        names.layers.shrink_to_fit();
        names.layer_zero.sort_by_key(|&(suffix, _)| suffix);
        names.layer_zero.dedup_by_key(|&mut (suffix, _)| suffix);
        names
    }

    fn top_level(&self, name: &str) -> Option<&'a TensorInfo> {
        let slot = TOP_LEVEL.iter().position(|&n| n == name);
        debug_assert!(slot.is_some(), "`{name}` is missing from TOP_LEVEL");
        self.top_level[slot?]
    }

    fn dim(&self, name: &str, axis: usize) -> Option<u64> {
        self.top_level(name)?.shape.get(axis)
    }

    fn layer(&self, suffix: &str) -> Option<&'a TensorInfo> {
        let at = self
            .layer_zero
            .binary_search_by_key(&suffix, |&(s, _)| s)
            .ok()?;
        Some(self.layer_zero[at].1)
    }

    fn layer_dim(&self, suffix: &str, axis: usize) -> Option<u64> {
        self.layer(suffix)?.shape.get(axis)
    }

    fn has_layer(&self, suffix: &str) -> bool {
        self.layer(suffix).is_some()
    }

    fn first(&self, names: &[&str], axis: usize) -> Option<u64> {
        names.iter().find_map(|name| self.dim(name, axis))
    }

    /// The first width `WIDTHS` gives of dense MLPs (`expert` false) or of experts.
    fn width(&self, expert: bool) -> Option<u64> {
        WIDTHS
            .iter()
            .zip(&self.widths)
            .filter(|&(width, _)| (width.mlp != Mlp::Dense) == expert)
            .find_map(|(width, tensor)| {
                Some(tensor.as_ref()?.shape.get(width.axis)? / width.divisor)
            })
    }
}

/// `model.layers.3.x` -> (`model.layers`, `3.x`), for the decoder stacks of the known families.
fn split_layers(name: &str) -> Option<(&str, &str)> {
    ["model.layers.", "transformer.h.", "h.", "layers."]
        .iter()
        .find_map(|prefix| name.strip_prefix(prefix).map(|rest| (*prefix, rest)))
}

impl Architecture {
    /// Recognises a decoder-only transformer of a known family; `None` for anything else.
    pub fn recognise<'a, I>(tensors: I) -> Option<Architecture>
    where
        I: IntoIterator<Item = &'a TensorInfo> + Clone,
    {
        let names = Names::new(tensors.clone().into_iter());
        let layers = names.layers.len() as u64;
        if layers == 0 {
            return None;
        }
        let parameters = tensors
            .into_iter()
            .map(|t| t.element_count().unwrap_or(0))
            .fold(0u64, u64::saturating_add);
        if names.has_layer("attn.c_attn.weight") {
            // GPT-2 stores Conv1D weights as [in, out].
            let hidden = names.layer_dim("attn.c_attn.weight", 0);
            return Some(Architecture {
                family: "gpt2",
                layers,
                hidden_size: hidden,
                intermediate_size: names.layer_dim("mlp.c_fc.weight", 1),
                expert_intermediate_size: None,
                vocab_size: names.first(&["wte.weight", "transformer.wte.weight"], 0),
                query_width: hidden,
                key_value_width: hidden,
                head_dim: None,
                experts: None,
                tied_embeddings: names.top_level("lm_head.weight").is_none(),
                parameters,
            });
        }
        let fused = names.has_layer("self_attn.qkv_proj.weight");
        let latent = names.has_layer("self_attn.kv_a_proj_with_mqa.weight");
        if !fused && !latent && !names.has_layer("self_attn.q_proj.weight") {
            return None;
        }
        // Experts numbered one by one, or fused in one tensor whose first axis counts them.
        let experts = names.last_expert.map(|last| last + 1).or_else(|| {
            WIDTHS
                .iter()
                .zip(&names.widths)
                .filter(|(width, _)| width.mlp == Mlp::ExpertsFused)
                .find_map(|(_, tensor)| tensor.as_ref()?.shape.get(0))
        });
        let family = if latent {
            "deepseek"
        } else if names.has_layer("block_sparse_moe.gate.weight") {
            "mixtral"
        } else if fused {
            "phi3"
        } else if names.has_layer("pre_feedforward_layernorm.weight") {
            "gemma2"
        } else if names.has_layer("self_attn.dense.weight") && names.has_layer("mlp.fc1.weight") {
            "phi"
        } else if names.has_layer("mlp.c_fc.weight") {
            "starcoder2"
        } else if names.has_layer("block_sparse_moe.input_linear.weight") {
            "granitemoe"
        } else if names.has_layer("self_attn.q_proj.bias") {
            "qwen2"
        } else if names.has_layer("self_attn.q_norm.weight") {
            "qwen3"
        } else if experts.is_some() {
            "moe"
        } else {
            "llama"
        };
        let separate = !fused && !latent;
        Some(Architecture {
            family,
            layers,
            hidden_size: names
                .first(&["model.embed_tokens.weight"], 1)
                .or_else(|| names.layer_dim("input_layernorm.weight", 0)),
            intermediate_size: names.width(false),
            expert_intermediate_size: names.width(true),
            vocab_size: names.first(&["model.embed_tokens.weight", "lm_head.weight"], 0),
            query_width: separate
                .then(|| names.layer_dim("self_attn.q_proj.weight", 0))
                .flatten(),
            key_value_width: separate
                .then(|| names.layer_dim("self_attn.k_proj.weight", 0))
                .flatten(),
            head_dim: names.layer_dim("self_attn.q_norm.weight", 0),
            experts,
            tied_embeddings: names.top_level("lm_head.weight").is_none(),
            parameters,
        })
    }

    /// Compares the sizes with a config, each with the key the family reads (the experts'
    /// width with `moe_intermediate_size`, GPT-2's with `n_inner`, ...); a finding for each
    /// that disagrees, naming both values. A key the config does not have is not compared.
    pub fn check_config(&self, config: &ModelConfig, label: &str) -> Vec<Finding> {
        let family = Family::of(config.text_model_type());
        let text = config.text();
        let number = |keys: &[&str]| config.number(keys);
        let first_key = |keys: &'static [&'static str]| {
            keys.iter().copied().find(|key| text.get(key).is_some())
        };
        let mut findings = Vec::new();
        let mut compare = |key: &str, from_config: Option<u64>, from_tensors: Option<u64>| {
            if let (Some(expected), Some(found)) = (from_config, from_tensors)
                && expected != found
            {
                findings.push(
                    Finding::warning(
                        Code::ConfigMismatch,
                        format!("`{key}` is {expected} in the config, {found} in the tensors"),
                    )
                    .in_file(label),
                );
            }
        };
        let hidden = number(&["hidden_size", "n_embd", "d_model"]);
        compare("hidden_size", hidden, self.hidden_size);
        if let Some(key) = first_key(family.dense_width) {
            let width = match text.get(key) {
                // GPT-2's `n_inner: null` means four times the width.
                Some(serde_json::Value::Null) if key == "n_inner" => hidden.map(|h| 4 * h),
                Some(value) => value.as_u64(),
                None => None,
            };
            compare(key, width, self.intermediate_size);
        }
        if let Some(key) = first_key(family.expert_width) {
            compare(key, number(&[key]), self.expert_intermediate_size);
        }
        compare("vocab_size", number(&["vocab_size"]), self.vocab_size);
        let heads = number(&["num_attention_heads", "n_head"]);
        let head_dim = number(&["head_dim"]).or_else(|| Some(hidden? / heads.filter(|&h| h > 0)?));
        if family.qk_norm_spans_heads {
            if let (Some(heads), Some(head_dim)) = (heads, head_dim) {
                compare(
                    "num_attention_heads × head_dim",
                    Some(heads * head_dim),
                    self.head_dim,
                );
            }
        } else {
            compare("head_dim", head_dim, self.head_dim);
        }
        if let (Some(head_dim), Some(width)) = (head_dim, self.query_width) {
            compare("num_attention_heads", heads, Some(width / head_dim.max(1)));
        }
        if let (Some(head_dim), Some(width), Some(kv_heads)) = (
            head_dim,
            self.key_value_width,
            number(&["num_key_value_heads"]),
        ) {
            compare(
                "num_key_value_heads",
                Some(kv_heads),
                Some(width / head_dim.max(1)),
            );
        }
        let experts_keys = [
            "num_local_experts",
            "num_experts",
            "n_routed_experts",
            "moe_num_experts",
        ];
        if let Some(key) = experts_keys.iter().find(|key| text.get(**key).is_some()) {
            compare(key, number(&[key]), self.experts);
        }
        if let Some(tied) = config.flag("tie_word_embeddings")
            && tied != self.tied_embeddings
        {
            let tensors = if self.tied_embeddings {
                "the tensors have no lm_head (tied)"
            } else {
                "the tensors have their own lm_head (not tied)"
            };
            findings.push(
                Finding::warning(
                    Code::ConfigMismatch,
                    format!("`tie_word_embeddings` is {tied} in the config, but {tensors}"),
                )
                .in_file(label),
            );
        }
        findings
    }
}

/// The sizes: `32 layers, hidden 4096, intermediate 11008, ...` (the family is named by
/// [`super::ModelInfo`]).
impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |value: Option<u64>| value.map_or("?".to_string(), |v| v.to_string());
        write!(
            f,
            "{}, hidden {}",
            Counted(self.layers, "layer"),
            show(self.hidden_size),
        )?;
        if self.intermediate_size.is_some() || self.expert_intermediate_size.is_none() {
            write!(f, ", intermediate {}", show(self.intermediate_size))?;
        }
        write!(f, ", vocabulary {}", show(self.vocab_size))?;
        if let (Some(q), Some(kv)) = (self.query_width, self.key_value_width) {
            write!(f, ", attention {q} wide, key-value {kv}")?;
            if let Some(head_dim) = self.head_dim.filter(|&d| d > 0 && q % d == 0 && q > d) {
                write!(f, " ({} heads, {} kv heads)", q / head_dim, kv / head_dim)?;
            }
        }
        if let Some(experts) = self.experts {
            write!(f, ", {experts} experts")?;
            if let Some(width) = self.expert_intermediate_size {
                write!(f, " {width} wide")?;
            }
        }
        if self.tied_embeddings {
            f.write_str(", tied embeddings")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Dtype;
    use std::path::Path;

    fn config(json: serde_json::Value) -> ModelConfig {
        ModelConfig::from_json(Path::new("config.json"), json)
    }

    fn tensor(name: &str, shape: &[u64]) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            dtype: Dtype::F16.into(),
            shape: shape.into(),
            data_offsets: [0, 0],
        }
    }

    /// The tensors of `BitNet` b1.58 7B (Llama names): 32 layers, hidden 4096, intermediate
    /// 11008, vocabulary 32000, 291 tensors.
    fn bitnet_7b() -> Vec<TensorInfo> {
        let (hidden, inter, vocab) = (4096, 11008, 32000);
        let mut model = vec![tensor("model.embed_tokens.weight", &[vocab, hidden])];
        for layer in 0..32 {
            let p = format!("model.layers.{layer}.");
            for (part, shape) in [
                ("self_attn.q_proj.weight", [hidden, hidden]),
                ("self_attn.k_proj.weight", [hidden, hidden]),
                ("self_attn.v_proj.weight", [hidden, hidden]),
                ("self_attn.o_proj.weight", [hidden, hidden]),
                ("mlp.gate_proj.weight", [inter, hidden]),
                ("mlp.up_proj.weight", [inter, hidden]),
                ("mlp.down_proj.weight", [hidden, inter]),
            ] {
                model.push(tensor(&format!("{p}{part}"), &shape));
            }
            for norm in ["input_layernorm.weight", "post_attention_layernorm.weight"] {
                model.push(tensor(&format!("{p}{norm}"), &[hidden]));
            }
        }
        model.push(tensor("model.norm.weight", &[hidden]));
        model.push(tensor("lm_head.weight", &[vocab, hidden]));
        model
    }

    #[test]
    fn recognises_bitnet_7b_from_its_header() {
        let model = bitnet_7b();
        assert_eq!(model.len(), 291);
        let arch = Architecture::recognise(&model).expect("recognised");
        assert_eq!(arch.family, "llama");
        assert_eq!(arch.layers, 32);
        assert_eq!(arch.hidden_size, Some(4096));
        assert_eq!(arch.intermediate_size, Some(11008));
        assert_eq!(arch.vocab_size, Some(32000));
        assert!(!arch.tied_embeddings);
        let config = config(serde_json::json!({
            "model_type": "bitnet", "hidden_size": 4096, "num_hidden_layers": 32,
            "intermediate_size": 11008, "vocab_size": 32000, "num_attention_heads": 32,
            "num_key_value_heads": 32, "tie_word_embeddings": false
        }));
        assert!(arch.check_config(&config, "config.json").is_empty());
    }

    #[test]
    fn a_single_layer_is_counted_in_the_singular() {
        let model: Vec<TensorInfo> = bitnet_7b()
            .into_iter()
            .filter(|t| {
                !t.name.starts_with("model.layers.") || t.name.starts_with("model.layers.0.")
            })
            .collect();
        let arch = Architecture::recognise(&model).expect("recognised");
        assert!(
            arch.to_string().starts_with("1 layer, hidden 4096"),
            "{arch}"
        );
        let arch = Architecture::recognise(&bitnet_7b()).expect("recognised");
        assert!(
            arch.to_string().starts_with("32 layers, hidden 4096"),
            "{arch}"
        );
    }

    #[test]
    fn reports_each_config_mismatch_with_both_values() {
        let arch = Architecture::recognise(&bitnet_7b()).expect("recognised");
        let config = config(serde_json::json!({
            "hidden_size": 4096, "intermediate_size": 11008,
            "vocab_size": 32001, "num_attention_heads": 32, "num_key_value_heads": 8,
            "tie_word_embeddings": true
        }));
        let messages: Vec<String> = arch
            .check_config(&config, "config.json")
            .into_iter()
            .map(|f| f.message)
            .collect();
        assert_eq!(
            messages,
            [
                "`vocab_size` is 32001 in the config, 32000 in the tensors",
                "`num_key_value_heads` is 8 in the config, 32 in the tensors",
                "`tie_word_embeddings` is true in the config, but the tensors have their own \
                 lm_head (not tied)",
            ]
        );
    }

    #[test]
    fn recognises_other_families_by_their_names() {
        let family = |names: &[(&str, &[u64])]| {
            let tensors: Vec<_> = names
                .iter()
                .map(|(name, shape)| tensor(name, shape))
                .collect();
            Architecture::recognise(&tensors).map(|a| a.family)
        };
        assert_eq!(
            family(&[("h.0.attn.c_attn.weight", &[8, 24])]),
            Some("gpt2")
        );
        assert_eq!(
            family(&[("model.layers.0.self_attn.qkv_proj.weight", &[24, 8])]),
            Some("phi3")
        );
        assert_eq!(
            family(&[
                ("model.layers.0.self_attn.q_proj.weight", &[8, 8]),
                ("model.layers.0.block_sparse_moe.gate.weight", &[4, 8]),
                (
                    "model.layers.0.block_sparse_moe.experts.3.w1.weight",
                    &[16, 8]
                ),
            ]),
            Some("mixtral")
        );
        let gateless = |attention: &'static str, mlp: &'static str| {
            family(&[
                ("model.layers.0.self_attn.q_proj.weight", &[8, 8]),
                ("model.layers.0.self_attn.q_proj.bias", &[8]),
                (attention, &[8, 8]),
                (mlp, &[32, 8]),
            ])
        };
        assert_eq!(
            gateless(
                "model.layers.0.self_attn.dense.weight",
                "model.layers.0.mlp.fc1.weight"
            ),
            Some("phi")
        );
        assert_eq!(
            gateless(
                "model.layers.0.self_attn.o_proj.weight",
                "model.layers.0.mlp.c_fc.weight"
            ),
            Some("starcoder2")
        );
        assert_eq!(
            family(&[
                ("model.layers.0.self_attn.q_proj.weight", &[8, 8]),
                (
                    "model.layers.0.block_sparse_moe.input_linear.weight",
                    &[4, 32, 8]
                ),
            ]),
            Some("granitemoe")
        );
        assert_eq!(family(&[("encoder.conv.weight", &[8])]), None);
    }

    /// A Qwen3-MoE-like model: layer 0 with 8 experts 16 wide, layer 1 dense 64 wide, and a
    /// per-head query norm of width `q_norm`.
    fn moe(q_norm: u64) -> Vec<TensorInfo> {
        let mut model = vec![tensor("model.embed_tokens.weight", &[128, 32])];
        for e in 0..8 {
            model.push(tensor(
                &format!("model.layers.0.mlp.experts.{e}.gate_proj.weight"),
                &[16, 32],
            ));
        }
        for layer in 0..2 {
            let p = format!("model.layers.{layer}.self_attn.");
            model.push(tensor(&format!("{p}q_proj.weight"), &[32, 32]));
            model.push(tensor(&format!("{p}k_proj.weight"), &[16, 32]));
            model.push(tensor(&format!("{p}q_norm.weight"), &[q_norm]));
        }
        model.push(tensor("model.layers.1.mlp.gate_proj.weight", &[64, 32]));
        model
    }

    #[test]
    fn each_width_is_compared_with_the_key_the_family_reads() {
        let arch = Architecture::recognise(&moe(8)).expect("recognised");
        assert_eq!(arch.intermediate_size, Some(64));
        assert_eq!(arch.expert_intermediate_size, Some(16));
        let qwen3_moe = config(
            serde_json::json!({"model_type": "qwen3_moe", "hidden_size": 32,
            "intermediate_size": 64, "moe_intermediate_size": 16, "num_experts": 8,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "vocab_size": 128}),
        );
        assert!(arch.check_config(&qwen3_moe, "c").is_empty());
        let wrong = config(serde_json::json!({"model_type": "qwen3_moe",
            "intermediate_size": 64, "moe_intermediate_size": 32, "num_experts": 8}));
        let messages: Vec<String> = arch
            .check_config(&wrong, "c")
            .into_iter()
            .map(|f| f.message)
            .collect();
        assert_eq!(
            messages,
            ["`moe_intermediate_size` is 32 in the config, 16 in the tensors"]
        );
        // OLMo-2's query norm spans all heads: 4 heads of 8.
        let olmo = Architecture::recognise(&moe(32)).expect("recognised");
        let olmo2 = config(serde_json::json!({"model_type": "olmo2", "hidden_size": 32,
            "num_attention_heads": 4, "num_key_value_heads": 2}));
        assert!(olmo.check_config(&olmo2, "c").is_empty());
        let llama = config(serde_json::json!({"model_type": "llama", "hidden_size": 32,
            "num_attention_heads": 4}));
        let messages: Vec<String> = olmo
            .check_config(&llama, "c")
            .into_iter()
            .map(|f| f.message)
            .collect();
        assert_eq!(
            messages,
            ["`head_dim` is 8 in the config, 32 in the tensors"]
        );
    }

    #[test]
    fn gpt2_reads_n_inner_and_four_times_the_width_when_it_is_null() {
        let tensors = [
            tensor("h.0.attn.c_attn.weight", &[32, 96]),
            tensor("h.0.mlp.c_fc.weight", &[32, 128]),
        ];
        let arch = Architecture::recognise(&tensors).expect("recognised");
        let null = config(serde_json::json!({"model_type": "gpt2", "n_embd": 32,
            "n_inner": null}));
        assert!(arch.check_config(&null, "c").is_empty());
        let set = config(serde_json::json!({"model_type": "gpt2", "n_embd": 32, "n_inner": 64}));
        let messages: Vec<String> = arch
            .check_config(&set, "c")
            .into_iter()
            .map(|f| f.message)
            .collect();
        assert_eq!(
            messages,
            ["`n_inner` is 64 in the config, 128 in the tensors"]
        );
    }
}
