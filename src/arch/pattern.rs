//! Layer patterns: which layers of a model are of which kind (dense or mixture-of-experts,
//! full or linear attention, Mamba...), as the config declares it. Plain data, for the checks,
//! the listings and the explorer alike.

use super::config::ModelConfig;
use super::family::Family;
use serde::Serialize;
use serde_json::Value;
use std::fmt;
use std::ops::RangeInclusive;

/// The kind of a tensor within its layer: its name below the layer number, with an expert's
/// number written `{E}` (`mlp.experts.{E}.down_proj.weight`), so that every layer of a kind
/// has the same tensor kinds.
pub fn tensor_kind(suffix: &str) -> std::borrow::Cow<'_, str> {
    let parts: Vec<&str> = suffix.split('.').collect();
    let expert = |i: usize| {
        (i > 0 && parts[i - 1] == "experts")
            .then(|| expert_part(parts[i]))
            .flatten()
    };
    if !(0..parts.len()).any(|i| expert(i).is_some()) {
        return std::borrow::Cow::Borrowed(suffix);
    }
    let kind: Vec<String> = (0..parts.len())
        .map(|i| match expert(i) {
            Some((_, digits)) => format!("{}{{E}}", &parts[i][..digits]),
            None => parts[i].to_owned(),
        })
        .collect();
    std::borrow::Cow::Owned(kind.join("."))
}

/// The expert number in the part of a name after `experts`: `17`, or Switch Transformers'
/// `expert_17`; with where its digits start in the part.
pub fn expert_part(part: &str) -> Option<(u64, usize)> {
    let digits = if part.starts_with("expert_") { 7 } else { 0 };
    let number = &part[digits..];
    if !crate::text::is_numeric_part(number) {
        return None;
    }
    Some((number.parse().ok()?, digits))
}

/// More layers than this in a config is not a model but a hostile or broken file: no pattern.
const MAX_LAYERS: u64 = 1 << 16;

/// The feed-forward part of a layer.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Mlp {
    None,
    Dense,
    Moe { experts: u64, shared: u64 },
}

/// What one layer is.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct LayerKind {
    /// What mixes tokens, as the config names it: `attention` (or `full_attention`,
    /// `sliding_attention`, ... from `layer_types`), `linear_attention`, `mamba`, ...
    pub mixer: String,
    pub mlp: Mlp,
    /// A layer past `num_hidden_layers`: the multi-token-prediction layers some checkpoints
    /// store after the others (`num_nextn_predict_layers`).
    pub next_token_prediction: bool,
}

impl LayerKind {
    /// The mixer's structure: the attention variants (full, sliding, chunked) hold the same
    /// tensors, so layers that differ only there are compared with each other.
    pub fn mixer_structure(&self) -> &str {
        let mixer = self.mixer.as_str();
        if mixer != "linear_attention" && mixer.ends_with("attention") {
            "attention"
        } else {
            mixer
        }
    }
}

impl fmt::Display for Mlp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mlp::None => f.write_str("no MLP"),
            Mlp::Dense => f.write_str("dense MLP"),
            Mlp::Moe { experts, shared: 0 } => write!(f, "MoE, {experts} experts"),
            Mlp::Moe { experts, shared } => write!(f, "MoE, {experts} experts + {shared} shared"),
        }
    }
}

/// The part of a model a stack of layers belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    /// The model itself, or the language model of a composite one.
    Main,
    Encoder,
    Decoder,
    /// A vision tower (`vision_config`).
    Vision,
}

/// Every layer's kind: `layers[i]` is the index in `kinds` of layer `i`'s.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LayerPattern {
    pub kinds: Vec<LayerKind>,
    pub layers: Vec<u16>,
    /// `num_hidden_layers`: the layers from here on are multi-token prediction.
    pub hidden_layers: u64,
    pub part: Part,
    /// Where the config gives the layer count: the key, and the section it is in
    /// (`vision_config`, an encoder-decoder's `encoder`), if not the top level or `text_config`.
    #[serde(skip)]
    pub count_key: (Option<&'static str>, &'static str),
    /// The family's modules that not every layer of a kind has ([`Family::irregular`]).
    #[serde(skip)]
    pub irregular: &'static [&'static str],
}

/// A run of consecutive layers of one kind.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Run {
    pub first: u64,
    pub last: u64,
    pub kind: usize,
}

/// The first of `keys` that `section` has as a whole number, with the key.
fn count(section: &Value, keys: &[&'static str]) -> Option<(&'static str, u64)> {
    keys.iter()
        .find_map(|&key| Some((key, section.get(key)?.as_u64()?)))
}

impl LayerPattern {
    /// The pattern of the model's main stack of layers (see [`LayerPattern::declared`]).
    pub fn from_config(config: &ModelConfig) -> Option<LayerPattern> {
        Self::declared(config).into_iter().next()
    }

    /// Every stack of layers the config declares, the main one (or an encoder-decoder's
    /// encoder, then its decoder) first, then a vision tower's; each with its own layer count
    /// and pattern.
    pub fn declared(config: &ModelConfig) -> Vec<LayerPattern> {
        // diffusers' and timm's configs name their layers otherwise (`num_layers` of a
        // transformer whose last block differs): they have no pattern.
        if config.class_name().is_some() || config.timm_architecture().is_some() {
            return Vec::new();
        }
        let json = &config.json;
        let model_type = config.model_type();
        let sides = |encoder: &[&'static str], decoder: &[&'static str]| {
            let family = Family::of(model_type);
            let encoder = count(json, encoder);
            let decoder = count(json, decoder).or(encoder);
            [(Part::Encoder, encoder), (Part::Decoder, decoder)]
                .into_iter()
                .filter_map(|(part, counted)| {
                    let (key, layers) = counted?;
                    Self::build(json, family, layers, 0, part, (None, key))
                })
                .collect::<Vec<_>>()
        };
        let mut patterns = if json.get("encoder_layers").is_some() {
            // BART, Whisper, Marian, M2M-100, ...
            sides(&["encoder_layers"], &["decoder_layers"])
        } else if json.get("num_decoder_layers").is_some() {
            // T5 and its kin: `num_decoder_layers` null is as many as the encoder's.
            sides(&["num_layers"], &["num_decoder_layers"])
        } else if let (Some(encoder), Some(decoder)) = (
            json.get("encoder").filter(|v| v.is_object()),
            json.get("decoder").filter(|v| v.is_object()),
        ) {
            [
                (Part::Encoder, "encoder", encoder),
                (Part::Decoder, "decoder", decoder),
            ]
            .into_iter()
            .filter_map(|(part, name, section)| {
                let (key, layers) = count(section, &["num_hidden_layers", "n_layer"])?;
                let family = Family::of(section.get("model_type").and_then(Value::as_str));
                Self::build(section, family, layers, 0, part, (Some(name), key))
            })
            .collect()
        } else {
            Self::main(config).into_iter().collect()
        };
        if let Some(vision) = json.get("vision_config").filter(|v| v.is_object())
            && let Some((key, layers)) = count(vision, &["num_hidden_layers", "depth"])
        {
            let family = Family::of(vision.get("model_type").and_then(Value::as_str));
            patterns.extend(Self::build(
                vision,
                family,
                layers,
                0,
                Part::Vision,
                (Some("vision_config"), key),
            ));
        }
        patterns
    }

    /// The pattern of a model's one stack, or of a composite model's language model.
    fn main(config: &ModelConfig) -> Option<LayerPattern> {
        let text = config.text();
        let listed = |key: &str| text.get(key).and_then(Value::as_array).map(Vec::len);
        let (key, hidden_layers) = count(text, &["num_hidden_layers", "n_layer", "num_layers"])
            .or_else(|| {
                let count = listed("layers_block_type").or_else(|| listed("layer_types"))?;
                Some(("num_hidden_layers", count as u64))
            })
            .or_else(|| {
                let pattern = text.get("hybrid_override_pattern")?.as_str()?;
                Some(("num_hidden_layers", pattern.chars().count() as u64))
            })?;
        let extra = config.number(&["num_nextn_predict_layers"]).unwrap_or(0);
        let family = Family::of(config.text_model_type());
        Self::build(text, family, hidden_layers, extra, Part::Main, (None, key))
    }

    /// The pattern `section` of a config declares for `hidden_layers` layers and `extra`
    /// multi-token-prediction layers after them.
    fn build(
        section: &Value,
        family: &'static Family,
        hidden_layers: u64,
        extra: u64,
        part: Part,
        count_key: (Option<&'static str>, &'static str),
    ) -> Option<LayerPattern> {
        if hidden_layers.checked_add(extra)? > MAX_LAYERS {
            return None;
        }
        let declared = Declared::read(section, family, part);
        let mut pattern = LayerPattern {
            kinds: Vec::new(),
            layers: Vec::new(),
            hidden_layers,
            part,
            count_key,
            irregular: family.irregular,
        };
        for layer in 0..hidden_layers + extra {
            let next_token_prediction = layer >= hidden_layers;
            let kind = LayerKind {
                mixer: declared.mixer(layer.min(hidden_layers.saturating_sub(1))),
                mlp: if next_token_prediction {
                    declared.experts_mlp()
                } else {
                    declared.mlp(layer)
                },
                next_token_prediction,
            };
            let index = if let Some(index) = pattern.kinds.iter().position(|k| *k == kind) {
                index
            } else {
                pattern.kinds.push(kind);
                pattern.kinds.len() - 1
            };
            pattern.layers.push(u16::try_from(index).ok()?);
        }
        Some(pattern)
    }

    /// The config key that gives the layer count, as a finding names it: `encoder_layers`,
    /// `num_hidden_layers` (of `vision_config`).
    pub fn count_key(&self) -> String {
        match self.count_key {
            (Some(section), key) => format!("`{key}` (of `{section}`)"),
            (None, key) => format!("`{key}`"),
        }
    }

    /// Whether a layer's tensor (its name below the layer number) is of a module that not
    /// every layer of its kind has ([`Family::irregular`]).
    pub fn irregular(&self, suffix: &str) -> bool {
        self.irregular.iter().any(|module| {
            suffix
                .strip_prefix(module)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
        })
    }

    pub fn kind(&self, layer: u64) -> Option<&LayerKind> {
        let index = *self.layers.get(usize::try_from(layer).ok()?)?;
        self.kinds.get(usize::from(index))
    }

    pub fn len(&self) -> u64 {
        self.layers.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Runs of consecutive layers of the same kind, in order.
    pub fn runs(&self) -> Vec<Run> {
        let mut runs: Vec<Run> = Vec::new();
        for (layer, &kind) in self.layers.iter().enumerate() {
            let (layer, kind) = (layer as u64, usize::from(kind));
            match runs.last_mut() {
                Some(run) if run.kind == kind => run.last = layer,
                _ => runs.push(Run {
                    first: layer,
                    last: layer,
                    kind,
                }),
            }
        }
        runs
    }

    /// Whether every layer is of one kind.
    pub fn is_uniform(&self) -> bool {
        self.kinds.len() <= 1
    }
}

/// The pattern in words (see [`LayerPattern::describe`]).
impl fmt::Display for LayerPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.describe(f, None)
    }
}

impl LayerPattern {
    /// The pattern in words: `layers 0-2: dense MLP; 3-60: MoE, 256 experts + 1 shared`. The
    /// mixer is named only where layers differ in it. Long alternations (a kind every fourth
    /// layer) are shown as the list of each kind's layers. Given how many layers the checkpoint
    /// stores, multi-token-prediction layers past them are said to be not stored (published
    /// checkpoints hold them, transformers does not save them): the layer checks expect
    /// nothing of them.
    pub fn describe(&self, f: &mut impl fmt::Write, stored: Option<u64>) -> fmt::Result {
        let mixers_differ = self
            .kinds
            .iter()
            .any(|kind| kind.mixer != self.kinds[0].mixer);
        let unstored = |run: &Run| stored.is_some_and(|stored| run.first >= stored);
        let describe = |kind: &LayerKind, unstored: bool| {
            let mut text = String::new();
            if kind.next_token_prediction {
                text.push_str("multi-token prediction");
                if unstored {
                    text.push_str(" (not stored)");
                }
                text.push_str(", ");
            }
            if mixers_differ || self.is_uniform() {
                text.push_str(&kind.mixer.replace('_', " "));
                text.push_str(", ");
            }
            text.push_str(&kind.mlp.to_string());
            text
        };
        let runs = self.runs();
        if runs.len() <= 6 {
            let parts: Vec<String> = runs
                .iter()
                .map(|run| {
                    format!(
                        "{}: {}",
                        span(run.first..=run.last),
                        describe(&self.kinds[run.kind], unstored(run))
                    )
                })
                .collect();
            return write!(f, "layers {}", parts.join("; "));
        }
        let parts: Vec<String> = self
            .kinds
            .iter()
            .enumerate()
            .map(|(index, kind)| {
                let of_kind = || runs.iter().filter(|run| run.kind == index);
                let layers: Vec<String> = of_kind().map(|run| span(run.first..=run.last)).collect();
                format!(
                    "{}: {}",
                    shorten(&layers),
                    describe(kind, of_kind().all(unstored))
                )
            })
            .collect();
        write!(f, "layers {}", parts.join("; "))
    }
}

fn span(range: RangeInclusive<u64>) -> String {
    if range.start() == range.end() {
        range.start().to_string()
    } else {
        format!("{}-{}", range.start(), range.end())
    }
}

fn shorten(parts: &[String]) -> String {
    const SHOWN: usize = 8;
    if parts.len() <= SHOWN {
        parts.join(", ")
    } else {
        format!("{}, ... ({} runs)", parts[..SHOWN].join(", "), parts.len())
    }
}

/// The keys of a config that say how its layers differ.
struct Declared<'a> {
    family: &'static Family,
    text: &'a Value,
    experts: u64,
    shared: u64,
    /// Switch Transformers' `encoder_sparse_step` or `decoder_sparse_step`, for the stack it
    /// is read for: block `i` has experts when `i % step == 1`, or every block when the step
    /// is 1 (`SwitchTransformersStack`).
    switch_step: Option<u64>,
}

impl<'a> Declared<'a> {
    fn read(text: &'a Value, family: &'static Family, part: Part) -> Declared<'a> {
        let number = |key: &str| text.get(key).and_then(Value::as_u64);
        let experts = [
            "n_routed_experts",
            "num_local_experts",
            "num_experts",
            "moe_num_experts",
        ]
        .iter()
        .find_map(|key| number(key))
        .unwrap_or(0);
        let shared = [
            "n_shared_experts",
            "moe_num_shared_experts",
            "num_shared_experts",
        ]
        .iter()
        .find_map(|key| number(key))
        .or_else(|| number("shared_expert_intermediate_size").map(|w| u64::from(w > 0)))
        .unwrap_or(0);
        let switch_step = match part {
            Part::Encoder => number("encoder_sparse_step"),
            Part::Decoder => number("encoder_sparse_step").and(number("decoder_sparse_step")),
            Part::Main | Part::Vision => None,
        };
        Declared {
            family,
            text,
            experts,
            shared,
            switch_step,
        }
    }

    fn number(&self, key: &str) -> Option<u64> {
        self.text.get(key)?.as_u64()
    }

    fn list(&self, key: &str) -> Option<&'a Vec<Value>> {
        self.text.get(key)?.as_array()
    }

    fn list_entry(&self, key: &str, layer: u64) -> Option<&'a Value> {
        self.list(key)?.get(usize::try_from(layer).ok()?)
    }

    /// Nemotron-H's `hybrid_override_pattern`: one character a layer.
    fn hybrid_char(&self, layer: u64) -> Option<char> {
        let pattern = self.text.get("hybrid_override_pattern")?.as_str()?;
        pattern.chars().nth(usize::try_from(layer).ok()?)
    }

    /// A layer's block type where the config lists them (`layers_block_type`): the token
    /// mixer, or the feed-forward part in models whose layers hold one or the other
    /// (Nemotron-H's `mlp` and `moe` layers).
    fn block_type(&self, layer: u64) -> Option<&'a str> {
        self.list_entry("layers_block_type", layer)?.as_str()
    }

    fn mixer(&self, layer: u64) -> String {
        if let Some(name) = self
            .list_entry("layer_types", layer)
            .and_then(Value::as_str)
        {
            return name.to_owned();
        }
        if let Some(block) = self.block_type(layer) {
            return if matches!(block, "mlp" | "moe") {
                "none"
            } else {
                block
            }
            .to_owned();
        }
        if let Some(indices) = self.list("attn_layer_indices") {
            let attention = indices.iter().any(|v| v.as_u64() == Some(layer));
            return if attention { "attention" } else { "mamba" }.to_owned();
        }
        if let Some(c) = self.hybrid_char(layer) {
            return match c {
                'M' => "mamba",
                '*' => "attention",
                _ => "none",
            }
            .to_owned();
        }
        if let Some(period) = self.number("attn_layer_period").filter(|&p| p > 0) {
            let offset = self.number("attn_layer_offset").unwrap_or(0);
            return if layer % period == offset {
                "attention"
            } else {
                "mamba"
            }
            .to_owned();
        }
        self.family.mixer.to_owned()
    }

    fn experts_mlp(&self) -> Mlp {
        if self.experts > 0 {
            Mlp::Moe {
                experts: self.experts,
                shared: self.shared,
            }
        } else if self.family.mlp {
            Mlp::Dense
        } else {
            Mlp::None
        }
    }

    fn mlp(&self, layer: u64) -> Mlp {
        if let Some(block) = self.block_type(layer) {
            return match block {
                "moe" => self.experts_mlp(),
                "mlp" => Mlp::Dense,
                _ => Mlp::None,
            };
        }
        if let Some(c) = self.hybrid_char(layer) {
            return match c {
                'E' => self.experts_mlp(),
                '-' => Mlp::Dense,
                _ => Mlp::None,
            };
        }
        let dense = if self.family.mlp {
            Mlp::Dense
        } else {
            Mlp::None
        };
        if self.experts == 0 {
            return dense;
        }
        if self.is_moe(layer) {
            self.experts_mlp()
        } else {
            dense
        }
    }

    /// Whether `layer` has experts, by the first key of the config that says.
    fn is_moe(&self, layer: u64) -> bool {
        let listed = |key: &str| {
            self.list(key)
                .map(|list| list.iter().any(|v| v.as_u64() == Some(layer)))
        };
        if let Some(step) = self.switch_step {
            return step == 1 || (step > 0 && layer % step == 1);
        }
        if let Some(listed) = listed("moe_layers") {
            return listed;
        }
        if let Some(kind) = self
            .list_entry("mlp_layer_types", layer)
            .and_then(Value::as_str)
        {
            return matches!(kind, "sparse" | "moe");
        }
        if let Some(period) = self.number("expert_layer_period").filter(|&p| p > 0) {
            return layer % period == self.number("expert_layer_offset").unwrap_or(0);
        }
        if let Some(step) = self.number("interleave_moe_layer_step").filter(|&s| s > 0) {
            return (layer + 1).is_multiple_of(step);
        }
        if self.text.get("first_k_dense_replace").is_some()
            || self.text.get("moe_layer_freq").is_some()
        {
            let first = self.number("first_k_dense_replace").unwrap_or(0);
            let freq = self
                .number("moe_layer_freq")
                .filter(|&f| f > 0)
                .unwrap_or(1);
            return layer >= first && layer.is_multiple_of(freq);
        }
        if let Some(start) = self.number("moe_layer_start_index") {
            let end = self.number("moe_layer_end_index").unwrap_or(u64::MAX);
            let interval = self
                .number("moe_layer_interval")
                .filter(|&i| i > 0)
                .unwrap_or(1);
            return layer >= start && layer <= end && (layer + 1).is_multiple_of(interval);
        }
        if listed("mlp_only_layers") == Some(true) {
            return false;
        }
        let step = self
            .number("decoder_sparse_step")
            .filter(|&s| s > 0)
            .unwrap_or(1);
        (layer + 1).is_multiple_of(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::path::Path;

    fn pattern(json: Value) -> LayerPattern {
        LayerPattern::from_config(&ModelConfig::from_json(Path::new("config.json"), json))
            .expect("a pattern")
    }

    #[test]
    fn tensor_kinds_number_experts_with_a_placeholder() {
        assert_eq!(
            tensor_kind("mlp.experts.17.down_proj.weight"),
            "mlp.experts.{E}.down_proj.weight"
        );
        assert_eq!(
            tensor_kind("layer.1.mlp.experts.expert_3.wi.weight"),
            "layer.1.mlp.experts.expert_{E}.wi.weight"
        );
        assert_eq!(
            tensor_kind("mlp.experts.expert_x.w"),
            "mlp.experts.expert_x.w"
        );
        assert_eq!(
            tensor_kind("mlp.shared_experts.up_proj.weight"),
            "mlp.shared_experts.up_proj.weight"
        );
        assert_eq!(
            tensor_kind("mlp.experts.gate_up_proj"),
            "mlp.experts.gate_up_proj"
        );
        assert_eq!(
            tensor_kind("self_attn.q_proj.weight"),
            "self_attn.q_proj.weight"
        );
    }

    #[test]
    fn switch_transformers_has_experts_every_sparse_step_in_each_stack() {
        let json = json!({"model_type": "switch_transformers", "num_layers": 6,
            "num_decoder_layers": 4, "encoder_sparse_step": 3, "decoder_sparse_step": 2,
            "num_experts": 4});
        let patterns = LayerPattern::declared(&ModelConfig::from_json(Path::new("c"), json));
        let moe = |pattern: &LayerPattern| -> Vec<u64> {
            (0..pattern.len())
                .filter(|&l| matches!(pattern.kind(l).unwrap().mlp, Mlp::Moe { .. }))
                .collect()
        };
        assert_eq!(patterns[0].part, Part::Encoder);
        assert_eq!(moe(&patterns[0]), [1, 4]);
        assert_eq!(patterns[1].part, Part::Decoder);
        assert_eq!(moe(&patterns[1]), [1, 3]);
        // No sparse layer asked for: the step is the layer count, which still makes block 1
        // sparse in the modelling code.
        let json = json!({"model_type": "switch_transformers", "num_layers": 4,
            "num_decoder_layers": 4, "encoder_sparse_step": 4, "decoder_sparse_step": 1,
            "num_experts": 2});
        let patterns = LayerPattern::declared(&ModelConfig::from_json(Path::new("c"), json));
        assert_eq!(moe(&patterns[0]), [1]);
        assert_eq!(moe(&patterns[1]), [0, 1, 2, 3]);
    }

    #[test]
    fn deepseek_v3_has_dense_layers_first_then_experts_and_a_prediction_layer() {
        let p = pattern(json!({"model_type": "deepseek_v3", "num_hidden_layers": 61,
            "first_k_dense_replace": 3, "moe_layer_freq": 1, "n_routed_experts": 256,
            "n_shared_experts": 1, "num_nextn_predict_layers": 1}));
        assert_eq!(
            p.to_string(),
            "layers 0-2: dense MLP; 3-60: MoE, 256 experts + 1 shared; \
             61: multi-token prediction, MoE, 256 experts + 1 shared"
        );
        assert_eq!(p.len(), 62);
    }

    #[test]
    fn a_prediction_layer_the_checkpoint_does_not_store_is_said_so() {
        let p = pattern(json!({"model_type": "deepseek_v3", "num_hidden_layers": 4,
            "first_k_dense_replace": 1, "n_routed_experts": 4, "num_nextn_predict_layers": 1}));
        let described = |stored| {
            let mut text = String::new();
            p.describe(&mut text, stored).unwrap();
            text
        };
        assert_eq!(
            described(Some(4)),
            "layers 0: dense MLP; 1-3: MoE, 4 experts; \
             4: multi-token prediction (not stored), MoE, 4 experts"
        );
        assert_eq!(described(Some(5)), p.to_string());
        assert!(!p.to_string().contains("not stored"));
    }

    #[test]
    fn encoder_decoders_and_towers_declare_a_stack_each_with_its_own_count() {
        let declared = |json: Value| {
            LayerPattern::declared(&ModelConfig::from_json(Path::new("config.json"), json))
                .iter()
                .map(|p| (p.part, p.count_key(), p.hidden_layers))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            declared(
                json!({"model_type": "whisper", "encoder_layers": 4, "decoder_layers": 2,
                "num_hidden_layers": 4})
            ),
            [
                (Part::Encoder, "`encoder_layers`".to_owned(), 4),
                (Part::Decoder, "`decoder_layers`".to_owned(), 2),
            ]
        );
        // T5's `num_decoder_layers: null` is as many as the encoder's `num_layers`.
        assert_eq!(
            declared(json!({"model_type": "t5", "num_layers": 6, "num_decoder_layers": null})),
            [
                (Part::Encoder, "`num_layers`".to_owned(), 6),
                (Part::Decoder, "`num_layers`".to_owned(), 6),
            ]
        );
        assert_eq!(
            declared(json!({"model_type": "encoder-decoder",
                "encoder": {"model_type": "bert", "num_hidden_layers": 3},
                "decoder": {"model_type": "gpt2", "n_layer": 2}})),
            [
                (
                    Part::Encoder,
                    "`num_hidden_layers` (of `encoder`)".to_owned(),
                    3
                ),
                (Part::Decoder, "`n_layer` (of `decoder`)".to_owned(), 2),
            ]
        );
        assert_eq!(
            declared(json!({"model_type": "qwen2_5_vl",
                "text_config": {"num_hidden_layers": 28}, "vision_config": {"depth": 32}})),
            [
                (Part::Main, "`num_hidden_layers`".to_owned(), 28),
                (Part::Vision, "`depth` (of `vision_config`)".to_owned(), 32),
            ]
        );
    }

    #[test]
    fn qwen3_next_interleaves_linear_and_full_attention() {
        let types: Vec<&str> = (0..48)
            .map(|i| {
                if i % 4 == 3 {
                    "full_attention"
                } else {
                    "linear_attention"
                }
            })
            .collect();
        let p = pattern(json!({"model_type": "qwen3_next", "num_hidden_layers": 48,
            "layer_types": types, "num_experts": 512, "shared_expert_intermediate_size": 512,
            "decoder_sparse_step": 1, "mlp_only_layers": []}));
        assert_eq!(p.kinds.len(), 2);
        assert_eq!(
            p.to_string(),
            "layers 0-2, 4-6, 8-10, 12-14, 16-18, 20-22, 24-26, 28-30, ... (12 runs): \
             linear attention, MoE, 512 experts + 1 shared; \
             3, 7, 11, 15, 19, 23, 27, 31, ... (12 runs): full attention, MoE, 512 experts + 1 shared"
        );
    }

    #[test]
    fn jamba_alternates_mamba_and_attention_and_experts() {
        let p = pattern(json!({"model_type": "jamba", "num_hidden_layers": 8,
            "attn_layer_period": 8, "attn_layer_offset": 4, "expert_layer_period": 2,
            "expert_layer_offset": 1, "num_experts": 16}));
        let kinds: Vec<(String, Mlp)> = (0..8)
            .map(|l| {
                let kind = p.kind(l).unwrap();
                (kind.mixer.clone(), kind.mlp.clone())
            })
            .collect();
        let moe = Mlp::Moe {
            experts: 16,
            shared: 0,
        };
        assert_eq!(kinds[0], ("mamba".into(), Mlp::Dense));
        assert_eq!(kinds[1], ("mamba".into(), moe.clone()));
        assert_eq!(kinds[4], ("attention".into(), Mlp::Dense));
        assert_eq!(kinds[5], ("mamba".into(), moe));
    }

    #[test]
    fn llama4_gpt_oss_and_qwen3_moe_declare_their_experts_each_their_way() {
        let llama4 = pattern(json!({"model_type": "llama4_text", "num_hidden_layers": 4,
            "interleave_moe_layer_step": 2, "num_local_experts": 16}));
        assert_eq!(
            llama4.to_string(),
            "layers 0: dense MLP; 1: MoE, 16 experts; 2: dense MLP; 3: MoE, 16 experts"
        );
        let listed = pattern(json!({"model_type": "llama4_text", "num_hidden_layers": 4,
            "moe_layers": [3], "interleave_moe_layer_step": 2, "num_local_experts": 16}));
        assert_eq!(
            listed.to_string(),
            "layers 0-2: dense MLP; 3: MoE, 16 experts"
        );
        let gpt_oss = pattern(json!({"model_type": "gpt_oss", "num_hidden_layers": 2,
            "layer_types": ["sliding_attention", "full_attention"], "num_local_experts": 32}));
        assert_eq!(
            gpt_oss.to_string(),
            "layers 0: sliding attention, MoE, 32 experts; 1: full attention, MoE, 32 experts"
        );
        assert_eq!(
            gpt_oss.kind(0).unwrap().mixer_structure(),
            gpt_oss.kind(1).unwrap().mixer_structure()
        );
        let qwen3_moe = pattern(json!({"model_type": "qwen3_moe", "num_hidden_layers": 3,
            "mlp_only_layers": [1], "decoder_sparse_step": 1, "num_experts": 8}));
        assert_eq!(
            qwen3_moe.to_string(),
            "layers 0: MoE, 8 experts; 1: dense MLP; 2: MoE, 8 experts"
        );
        let mamba = pattern(json!({"model_type": "mamba2", "num_hidden_layers": 2}));
        assert_eq!(mamba.to_string(), "layers 0-1: mamba, no MLP");
    }
}
