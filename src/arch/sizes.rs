//! The config's sizes against the tensors of the families whose layers the decoder-only
//! recognition ([`super::Architecture`]) does not read: encoders, encoder-decoders and vision
//! towers. Each stack of layers the config declares is measured with its family's row, in the
//! section of the config that describes it (`text_config`, `vision_config`, an encoder-decoder's
//! `encoder`); a key the family does not read is not compared.

use super::config::ModelConfig;
use super::layers::split_at_layer;
use super::pattern::{LayerPattern, Part};
use crate::finding::{Code, Finding};
use crate::format::TensorInfo;
use crate::text::escape;
use serde_json::Value;

/// A size a config declares, and the tensors that show it.
struct Size {
    /// The config keys, the first the section has wins: `{side}` stands for the stack's side
    /// (`encoder_ffn_dim`), `a*b` for the product of two keys.
    keys: &'static [&'static str],
    /// Names (below the layer number, or the end of a name outside the layers) and the axis
    /// that gives the size; the first the checkpoint holds wins.
    tensors: &'static [(&'static str, usize)],
}

/// One family's sizes: those its layers show, and those tensors outside the layers show.
struct Sizes {
    model_types: &'static [&'static str],
    layer: &'static [Size],
    top: &'static [Size],
}

const fn size(keys: &'static [&'static str], tensors: &'static [(&'static str, usize)]) -> Size {
    Size { keys, tensors }
}

const FAMILIES: &[Sizes] = &[
    Sizes {
        model_types: &["bert", "roberta", "xlm-roberta", "camembert", "electra"],
        layer: &[
            size(&["hidden_size"], &[("attention.self.query.weight", 1)]),
            size(&["intermediate_size"], &[("intermediate.dense.weight", 0)]),
        ],
        top: &[size(&["vocab_size"], &[("word_embeddings.weight", 0)])],
    },
    Sizes {
        model_types: &["t5", "mt5", "umt5", "longt5"],
        layer: &[
            size(&["d_model"], &[("layer.0.SelfAttention.q.weight", 1)]),
            size(
                &["d_kv*num_heads"],
                &[("layer.0.SelfAttention.q.weight", 0)],
            ),
            // The encoder's feed-forward is its blocks' second layer, the decoder's its third.
            size(
                &["d_ff"],
                &[
                    ("layer.1.DenseReluDense.wi.weight", 0),
                    ("layer.1.DenseReluDense.wi_0.weight", 0),
                    ("layer.2.DenseReluDense.wi.weight", 0),
                    ("layer.2.DenseReluDense.wi_0.weight", 0),
                ],
            ),
        ],
        top: &[size(&["vocab_size"], &[("shared.weight", 0)])],
    },
    Sizes {
        model_types: &[
            "whisper",
            "bart",
            "mbart",
            "marian",
            "m2m_100",
            "pegasus",
            "plbart",
            "blenderbot",
        ],
        layer: &[
            size(&["d_model"], &[("self_attn.q_proj.weight", 1)]),
            size(&["{side}_ffn_dim"], &[("fc1.weight", 0)]),
        ],
        top: &[
            size(
                &["vocab_size"],
                &[("embed_tokens.weight", 0), ("shared.weight", 0)],
            ),
            // Whisper's audio encoder: one input channel per mel bin.
            size(&["num_mel_bins"], &[("conv1.weight", 1)]),
        ],
    },
    Sizes {
        model_types: &[
            "clip_text_model",
            "clip_vision_model",
            "siglip_text_model",
            "siglip_vision_model",
            "llama4_vision_model",
        ],
        layer: &[
            size(&["hidden_size"], &[("self_attn.q_proj.weight", 1)]),
            size(&["intermediate_size"], &[("mlp.fc1.weight", 0)]),
        ],
        top: &[size(&["vocab_size"], &[("token_embedding.weight", 0)])],
    },
    Sizes {
        model_types: &["qwen2_5_vl_vision", "qwen3_5_moe_vision"],
        layer: &[
            size(&["hidden_size"], &[("attn.qkv.weight", 1)]),
            size(
                &["intermediate_size"],
                &[("mlp.gate_proj.weight", 0), ("mlp.linear_fc1.weight", 0)],
            ),
        ],
        top: &[],
    },
];

/// One stack being measured.
struct Measured<'a> {
    sizes: &'static Sizes,
    section: &'a Value,
    /// How findings name the section: `vision_config`, or nothing for the top level.
    section_name: Option<&'static str>,
    side: &'static str,
    stack: &'a str,
    /// Names outside the layers that start so are this stack's model's.
    root: &'a str,
    layer: Vec<Option<u64>>,
    top: Vec<Option<u64>>,
}

impl<'a> Measured<'a> {
    fn new(config: &'a ModelConfig, pattern: &LayerPattern, stack: &'a str) -> Option<Self> {
        let (section, section_name) = match pattern.count_key.0 {
            Some(name) => (config.json.get(name)?, Some(name)),
            None if config.text().is_object() && config.json.get("text_config").is_some() => {
                (config.text(), Some("text_config"))
            }
            None => (&config.json, None),
        };
        let model_type = section
            .get("model_type")
            .and_then(Value::as_str)
            .or(config.model_type())?;
        let sizes = FAMILIES
            .iter()
            .find(|sizes| sizes.model_types.contains(&model_type))?;
        let side = match pattern.part {
            Part::Encoder => "encoder",
            Part::Decoder => "decoder",
            Part::Main | Part::Vision => "",
        };
        // An encoder-decoder's sides are under `encoder.` and `decoder.`; otherwise the stack's
        // model is the part of its name before its side (`model.` of `model.encoder.layers`),
        // or before its last part.
        let root = match section_name {
            Some(name @ ("encoder" | "decoder")) => stack
                .get(..=name.len())
                .filter(|r| *r == format!("{name}.")),
            _ => None,
        }
        .unwrap_or_else(|| {
            let end = std::iter::once(0)
                .chain(stack.match_indices('.').map(|(dot, _)| dot + 1))
                .find(|&start| {
                    let part = stack[start..].split('.').next().unwrap_or_default();
                    matches!(part, "encoder" | "decoder")
                })
                .or_else(|| stack.rfind('.').map(|dot| dot + 1))
                .unwrap_or(0);
            &stack[..end]
        });
        Some(Measured {
            sizes,
            section,
            section_name,
            side,
            stack,
            root,
            layer: vec![None; sizes.layer.len()],
            top: vec![None; sizes.top.len()],
        })
    }

    fn see(&mut self, tensor: &TensorInfo) {
        let name = tensor.name.as_str();
        if let Some(rest) = name.strip_prefix(self.stack)
            && rest.starts_with('.')
        {
            if let Some((_, _, suffix)) = split_at_layer(name) {
                measure(self.sizes.layer, &mut self.layer, tensor, |t| t == suffix);
            }
            return;
        }
        if let Some(rest) = name.strip_prefix(self.root) {
            measure(self.sizes.top, &mut self.top, tensor, |t| {
                rest.strip_suffix(t)
                    .is_some_and(|before| before.is_empty() || before.ends_with('.'))
            });
        }
    }

    /// The section's value of a size's first key it has.
    fn declared(&self, keys: &[&str]) -> Option<(String, u64)> {
        keys.iter().find_map(|&key| {
            let key = key.replace("{side}", self.side);
            if key.starts_with('_') {
                return None;
            }
            let value = key.split('*').try_fold(1u64, |product, factor| {
                product.checked_mul(self.section.get(factor)?.as_u64()?)
            })?;
            Some((key, value))
        })
    }

    fn compare(&self, label: &str, findings: &mut Vec<Finding>) {
        let measured = self
            .sizes
            .layer
            .iter()
            .zip(&self.layer)
            .chain(self.sizes.top.iter().zip(&self.top));
        for (size, found) in measured {
            let (Some(found), Some((key, expected))) = (found, self.declared(size.keys)) else {
                continue;
            };
            if *found == expected {
                continue;
            }
            let key = match self.section_name {
                Some(section) => format!("`{}` (of `{section}`)", key.replace('*', "` × `")),
                None => format!("`{}`", key.replace('*', "` × `")),
            };
            let message = format!("{key} is {expected} in the config, {found} in the tensors");
            if !findings.iter().any(|f| f.message == message) {
                findings.push(
                    Finding::warning(Code::ConfigMismatch, escape(&message).into_owned())
                        .in_file(label),
                );
            }
        }
    }
}

/// Records in `slots` the size each of `sizes` reads from `tensor`, if `is` says the tensor is
/// one it reads and no earlier tensor gave it.
fn measure(
    sizes: &[Size],
    slots: &mut [Option<u64>],
    tensor: &TensorInfo,
    is: impl Fn(&str) -> bool,
) {
    for (size, slot) in sizes.iter().zip(slots) {
        if slot.is_none()
            && let Some(&(_, axis)) = size.tensors.iter().find(|(name, _)| is(name))
        {
            *slot = tensor.shape.get(axis);
        }
    }
}

/// A finding for each size of `stacks` (a pattern and the stack it describes) whose family is
/// listed and whose config value differs from the tensors'. Reads the tensors once, and only
/// when some stack is of a listed family.
pub fn check<'a>(
    config: &ModelConfig,
    stacks: &[(&LayerPattern, &str)],
    tensors: impl Iterator<Item = &'a TensorInfo>,
    label: &str,
) -> Vec<Finding> {
    let mut measured: Vec<Measured> = stacks
        .iter()
        .filter_map(|&(pattern, stack)| Measured::new(config, pattern, stack))
        .collect();
    if measured.is_empty() {
        return Vec::new();
    }
    for tensor in tensors {
        for stack in &mut measured {
            stack.see(tensor);
        }
    }
    let mut findings = Vec::new();
    for stack in &measured {
        stack.compare(label, &mut findings);
    }
    findings
}
