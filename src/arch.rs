//! The model's architecture, recognised from tensor names and shapes, and compared with the
//! `config.json` beside it.

use crate::finding::{Code, Finding, Findings};
use crate::format::{Model, TensorInfo};
use crate::quant::{Quantization, SideFiles};
use crate::text::escape;
use serde_json::Value;
use std::fmt;
use std::path::{Path, PathBuf};

/// What the names and shapes say about the model. Sizes the tensors do not show are `None`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Architecture {
    /// The family the tensor names follow (`llama` also covers Mistral and others that share
    /// its names; the config's `model_type` tells them apart).
    pub family: &'static str,
    pub layers: u64,
    pub hidden_size: Option<u64>,
    pub intermediate_size: Option<u64>,
    pub vocab_size: Option<u64>,
    /// Rows of the query projection: attention heads times head size.
    pub query_width: Option<u64>,
    /// Rows of the key projection: key-value heads times head size.
    pub key_value_width: Option<u64>,
    /// From a per-head norm (`q_norm`), when the model has one.
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

/// The tensors recognition reads: those of `TOP_LEVEL`, and the tensors of layer 0 by name below
/// the layer number. Nothing is kept per tensor of other names, so a hostile header of a million
/// names costs little here.
struct Names<'a> {
    top_level: [Option<&'a TensorInfo>; TOP_LEVEL.len()],
    /// Sorted by suffix; a repeated suffix keeps its first tensor.
    layer_zero: Vec<(&'a str, &'a TensorInfo)>,
    /// Every layer number, once each once `new` returns (a list: 8 bytes a layer where a
    /// hostile header can number a million).
    layers: Vec<u64>,
}

impl<'a> Names<'a> {
    fn new(tensors: impl Iterator<Item = &'a TensorInfo>) -> Self {
        let mut names = Names {
            top_level: [None; TOP_LEVEL.len()],
            layer_zero: Vec::new(),
            layers: Vec::new(),
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
        if !fused && !names.has_layer("self_attn.q_proj.weight") {
            return None;
        }
        let experts = names
            .layer_zero
            .iter()
            .filter_map(|(suffix, _)| {
                let rest = suffix
                    .strip_prefix("block_sparse_moe.experts.")
                    .or_else(|| suffix.strip_prefix("mlp.experts."))?;
                rest.split_once('.')?.0.parse::<u64>().ok()
            })
            .max()
            .map(|last| last + 1);
        let family = if names.has_layer("block_sparse_moe.gate.weight") {
            "mixtral"
        } else if fused {
            "phi3"
        } else if names.has_layer("pre_feedforward_layernorm.weight") {
            "gemma2"
        } else if names.has_layer("self_attn.q_proj.bias") {
            "qwen2"
        } else if names.has_layer("self_attn.q_norm.weight") {
            "qwen3"
        } else if experts.is_some() {
            "moe"
        } else {
            "llama"
        };
        let intermediate_size = if fused {
            names
                .layer_dim("mlp.gate_up_proj.weight", 0)
                .map(|rows| rows / 2)
        } else {
            [
                "mlp.gate_proj.weight",
                "mlp.up_proj.weight",
                "block_sparse_moe.experts.0.w1.weight",
                "mlp.experts.0.gate_proj.weight",
            ]
            .iter()
            .find_map(|suffix| names.layer_dim(suffix, 0))
        };
        Some(Architecture {
            family,
            layers,
            hidden_size: names
                .first(&["model.embed_tokens.weight"], 1)
                .or_else(|| names.layer_dim("input_layernorm.weight", 0)),
            intermediate_size,
            vocab_size: names.first(&["model.embed_tokens.weight", "lm_head.weight"], 0),
            query_width: (!fused)
                .then(|| names.layer_dim("self_attn.q_proj.weight", 0))
                .flatten(),
            key_value_width: (!fused)
                .then(|| names.layer_dim("self_attn.k_proj.weight", 0))
                .flatten(),
            head_dim: names.layer_dim("self_attn.q_norm.weight", 0),
            experts,
            tied_embeddings: names.top_level("lm_head.weight").is_none(),
            parameters,
        })
    }

    /// Compares the sizes with a `config.json`; a finding for each that disagrees, naming both
    /// values.
    pub fn check_config(&self, config: &Value, label: &str) -> Vec<Finding> {
        let number = |keys: &[&str]| keys.iter().find_map(|key| config.get(key)?.as_u64());
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
        let hidden = number(&["hidden_size", "n_embd"]);
        compare("hidden_size", hidden, self.hidden_size);
        compare(
            "num_hidden_layers",
            number(&["num_hidden_layers", "n_layer"]),
            Some(self.layers),
        );
        compare(
            "intermediate_size",
            number(&["intermediate_size", "n_inner"]),
            self.intermediate_size,
        );
        compare("vocab_size", number(&["vocab_size"]), self.vocab_size);
        let heads = number(&["num_attention_heads", "n_head"]);
        let head_dim = number(&["head_dim"]).or_else(|| Some(hidden? / heads.filter(|&h| h > 0)?));
        compare("head_dim", head_dim, self.head_dim);
        if let (Some(head_dim), Some(width)) = (head_dim, self.query_width) {
            compare("num_attention_heads", heads, Some(width / head_dim.max(1)));
        }
        if let (Some(head_dim), Some(width)) = (head_dim, self.key_value_width) {
            let kv_heads = number(&["num_key_value_heads"]).or(heads);
            compare(
                "num_key_value_heads",
                kv_heads,
                Some(width / head_dim.max(1)),
            );
        }
        if let Some(experts) = number(&["num_local_experts", "num_experts", "n_routed_experts"]) {
            compare("num_local_experts", Some(experts), self.experts);
        }
        if let Some(tied) = config.get("tie_word_embeddings").and_then(Value::as_bool)
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

impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |value: Option<u64>| value.map_or("?".to_string(), |v| v.to_string());
        write!(
            f,
            "{}, {} layers, hidden {}, intermediate {}, vocabulary {}",
            self.family,
            self.layers,
            show(self.hidden_size),
            show(self.intermediate_size),
            show(self.vocab_size)
        )?;
        if let (Some(q), Some(kv)) = (self.query_width, self.key_value_width) {
            write!(f, ", attention {q} wide, key-value {kv}")?;
            if let Some(head_dim) = self.head_dim.filter(|&d| d > 0) {
                write!(f, " ({} heads, {} kv heads)", q / head_dim, kv / head_dim)?;
            }
        }
        if let Some(experts) = self.experts {
            write!(f, ", {experts} experts")?;
        }
        if self.tied_embeddings {
            f.write_str(", tied embeddings")?;
        }
        Ok(())
    }
}

/// The config to compare with: `explicit`, else `config.json` in the model's folder.
pub fn config_path(model: &Model, explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(path) = explicit {
        return Some(path.to_path_buf());
    }
    let folder = match model.source {
        crate::format::model::Source::Folder => model.path.clone(),
        _ => model.path.parent()?.to_path_buf(),
    };
    let path = folder.join("config.json");
    path.is_file().then_some(path)
}

/// The config beside a model (see [`config_path`]): its label and its JSON, or why it could
/// not be read.
fn read_config(
    model: &Model,
    explicit: Option<&Path>,
) -> Option<(PathBuf, String, Result<Value, String>)> {
    let path = config_path(model, explicit)?;
    let label = escape(&path.display().to_string()).into_owned();
    let config = std::fs::read_to_string(&path)
        .map_err(|error| error.to_string())
        .and_then(|text| serde_json::from_str::<Value>(&text).map_err(|e| e.to_string()));
    Some((path, label, config))
}

/// Compares the model with its config (see [`config_path`]); a finding when the config cannot
/// be read, is not JSON, or disagrees with the tensors. Recognises the quantization from the
/// config and the side files beside it, and the architecture from the logical weights (a
/// packed weight's stored shape is not the layer's). Returns both.
pub fn review(
    model: &Model,
    explicit: Option<&Path>,
) -> (Option<Architecture>, Option<Quantization>, Vec<Finding>) {
    let mut findings = Vec::new();
    let config = read_config(model, explicit);
    let (folder, parsed) = match &config {
        Some((path, label, Err(error))) => {
            findings.push(
                Finding::warning(
                    Code::ConfigInvalid,
                    format!("cannot read the config: {error}"),
                )
                .in_file(label),
            );
            (path.parent().map(Path::to_path_buf), None)
        }
        Some((path, _, Ok(value))) => (path.parent().map(Path::to_path_buf), Some(value.clone())),
        None => (model_folder(model), None),
    };
    let side = SideFiles::read(folder.as_deref(), parsed, &mut findings);
    let (quantization, quant_findings) = Quantization::recognise(model, &side);
    findings.extend(quant_findings);
    let architecture = match &quantization {
        Some(quantization) => {
            let logical: Vec<TensorInfo> = quantization.logical_infos(model).collect();
            Architecture::recognise(&logical)
        }
        None => Architecture::recognise(model.tensors.iter().map(|t| &t.info)),
    };
    if let (Some((_, label, Ok(config))), Some(architecture)) = (&config, &architecture) {
        findings.extend(architecture.check_config(config, label));
    }
    (architecture, quantization, findings)
}

/// The folder a model's side files are looked for in.
fn model_folder(model: &Model) -> Option<PathBuf> {
    match model.source {
        crate::format::model::Source::Folder => Some(model.path.clone()),
        _ => model.path.parent().map(Path::to_path_buf),
    }
}

/// What reviewing a model finds: its architecture, its quantization, and the findings on its
/// layers and its config.
#[derive(Debug)]
pub struct Reviewed {
    pub architecture: Option<Architecture>,
    pub quantization: Option<Quantization>,
    pub findings: Findings,
}

/// The findings on a model's layers ([`crate::format::layers::layer_findings`]) and those of
/// [`review`], worked out side by side.
pub fn review_model(model: &Model, config: Option<&Path>) -> Reviewed {
    let (mut findings, (architecture, quantization, config_findings)) = rayon::join(
        || crate::format::layers::layer_findings(model.tensors.iter().map(|t| &t.info)),
        || review(model, config),
    );
    if let Some(quantization) = &quantization {
        let logical: Vec<TensorInfo> = quantization.logical_infos(model).collect();
        findings = crate::format::layers::layer_findings(logical.iter());
    }
    findings.extend(config_findings);
    Reviewed {
        architecture,
        quantization,
        findings,
    }
}

/// Opens a model and adds the findings of [`review_model`] to its own; gives its quantization
/// too.
pub fn open_reviewed(
    path: &Path,
    config: Option<&Path>,
) -> crate::error::Result<(Model, Option<Quantization>)> {
    let mut model = Model::open(path)?;
    let reviewed = review_model(&model, config);
    model.findings.append(reviewed.findings);
    Ok((model, reviewed.quantization))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Dtype;

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
        let config = serde_json::json!({
            "model_type": "bitnet", "hidden_size": 4096, "num_hidden_layers": 32,
            "intermediate_size": 11008, "vocab_size": 32000, "num_attention_heads": 32,
            "num_key_value_heads": 32, "tie_word_embeddings": false
        });
        assert!(arch.check_config(&config, "config.json").is_empty());
    }

    #[test]
    fn reports_each_config_mismatch_with_both_values() {
        let arch = Architecture::recognise(&bitnet_7b()).expect("recognised");
        let config = serde_json::json!({
            "hidden_size": 4096, "num_hidden_layers": 30, "intermediate_size": 11008,
            "vocab_size": 32001, "num_attention_heads": 32, "num_key_value_heads": 8,
            "tie_word_embeddings": true
        });
        let messages: Vec<String> = arch
            .check_config(&config, "config.json")
            .into_iter()
            .map(|f| f.message)
            .collect();
        assert_eq!(
            messages,
            [
                "`num_hidden_layers` is 30 in the config, 32 in the tensors",
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
        assert_eq!(family(&[("encoder.conv.weight", &[8])]), None);
    }
}
