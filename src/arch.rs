//! The model a checkpoint encodes. Its `config.json` is the first authority: it names the
//! architecture (`model_type`, `architectures`, diffusers' `_class_name`, timm's
//! `architecture`, a PEFT adapter's type) and declares the layer pattern each layer is checked
//! against. Without a config, the tensor names and shapes give a guess, said to be one.

mod config;
pub mod expected;
pub mod family;
mod layers;
pub mod pattern;
mod recognise;
mod sizes;

pub use config::{Adapter, ConfigError, ModelConfig, config_path, find_config};
pub use layers::{LayerReview, Stored, layer_findings, split_at_layer};
pub use pattern::{LayerKind, LayerPattern, Mlp, Part, Run, expert_part, tensor_kind};
pub use recognise::Architecture;

use crate::finding::{Code, Finding, Findings};
use crate::format::{Model, TensorInfo};
use crate::quant::{Beside, Quantization, SideFiles};
use crate::text::escape;
use serde::Serialize;
use std::fmt;
use std::path::Path;

/// What stui knows the model to be.
#[derive(Clone, Debug, Serialize)]
pub struct ModelInfo {
    /// The config's `model_type` (or diffusers' `_class_name`, timm's `architecture`); without
    /// a config, the family the tensor names follow.
    pub model_type: Option<String>,
    /// The config's `architectures` (`LlamaForCausalLM`, ...).
    pub architectures: Vec<String>,
    /// `config` when a config names the model, `tensor names` when it is a guess.
    pub named_by: &'static str,
    /// The config read, if any.
    pub config: Option<String>,
    pub adapter: Option<Adapter>,
    /// The pattern of the main stack of layers (an encoder-decoder's encoder).
    pub layer_pattern: Option<PatternInfo>,
    /// The patterns of the other stacks the config declares and the checkpoint stores (an
    /// encoder-decoder's decoder, a vision tower).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub other_patterns: Vec<PatternInfo>,
    /// What the names and shapes show (the decoder-only families stui knows).
    #[serde(flatten)]
    pub shapes: Option<Architecture>,
}

/// A layer pattern as `inspect --json` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct PatternInfo {
    /// `layers 0-2: dense MLP; 3-60: MoE, 256 experts + 1 shared`
    pub summary: String,
    pub part: Part,
    /// The stack of layers it describes (`model.layers`), when the model has it.
    pub stack: Option<String>,
    /// How many layers the stack stores (one more than its highest layer number).
    pub stored_layers: Option<u64>,
    pub hidden_layers: u64,
    pub kinds: Vec<LayerKind>,
    pub runs: Vec<Run>,
    #[serde(skip)]
    pub pattern: LayerPattern,
}

impl PatternInfo {
    fn new(pattern: LayerPattern, stored: Option<Stored>) -> PatternInfo {
        let stored_layers = stored.as_ref().map(|stored| stored.layers);
        let mut summary = String::new();
        // Writing to a String cannot fail.
        let _ = pattern.describe(&mut summary, stored_layers);
        PatternInfo {
            summary,
            part: pattern.part,
            stack: stored.map(|stored| stored.stack),
            stored_layers,
            hidden_layers: pattern.hidden_layers,
            kinds: pattern.kinds.clone(),
            runs: pattern.runs(),
            pattern,
        }
    }
}

impl ModelInfo {
    /// Every layer pattern shown: the main one, then the others.
    pub fn patterns(&self) -> impl Iterator<Item = &PatternInfo> {
        self.layer_pattern.iter().chain(&self.other_patterns)
    }

    /// The model's name and where it comes from: `deepseek_v3 (DeepseekV3ForCausalLM, from
    /// config.json)` or `llama (guessed from tensor names)`.
    pub fn name(&self) -> String {
        let name = self.model_type.as_deref().unwrap_or("?");
        match &self.config {
            Some(config) => {
                let file = Path::new(config)
                    .file_name()
                    .map_or_else(|| config.clone(), |f| f.to_string_lossy().into_owned());
                let mut from = self.architectures.join(", ");
                if !from.is_empty() {
                    from.push_str(", ");
                }
                format!("{} ({from}from {})", escape(name), escape(&file))
            }
            None => format!("{} (guessed from tensor names)", escape(name)),
        }
    }
}

impl fmt::Display for ModelInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())?;
        if let Some(adapter) = &self.adapter {
            write!(f, ", {adapter}")?;
        }
        if let Some(shapes) = &self.shapes {
            write!(f, ", {shapes}")?;
        }
        Ok(())
    }
}

/// Reads the config and recognises what it can without the layer checks: for the explorer's
/// header, which shows the name before anything else is worked out.
pub fn identify(model: &Model, explicit: Option<&Path>) -> Option<ModelInfo> {
    let config = find_config(model, explicit).and_then(Result::ok);
    let patterns = config
        .as_ref()
        .map(LayerPattern::declared)
        .unwrap_or_default();
    let stacks = layers::stacks_for(tensors(model), &patterns);
    let shapes = Architecture::recognise(tensors(model));
    model_info(config.as_ref(), shapes, patterns, stacks, tensors(model))
}

fn tensors(model: &Model) -> impl Iterator<Item = &TensorInfo> + Clone {
    model.tensors.iter().map(|t| &t.info)
}

fn model_info<'a>(
    config: Option<&ModelConfig>,
    shapes: Option<Architecture>,
    patterns: Vec<LayerPattern>,
    stacks: Vec<Option<Stored>>,
    tensors: impl Iterator<Item = &'a TensorInfo>,
) -> Option<ModelInfo> {
    let Some(config) = config else {
        return shapes.map(|shapes| ModelInfo {
            model_type: Some(shapes.family.to_owned()),
            architectures: Vec::new(),
            named_by: "tensor names",
            config: None,
            adapter: None,
            layer_pattern: None,
            other_patterns: Vec::new(),
            shapes: Some(shapes),
        });
    };
    let adapter = config.adapter().map(|mut adapter| {
        adapter.pairs = Some(adapter::pairs(tensors));
        adapter
    });
    // The patterns of the stacks the checkpoint stores; without any, the first declared.
    let mut shown: Vec<PatternInfo> = Vec::new();
    let mut first = None;
    for (pattern, stored) in patterns
        .into_iter()
        .zip(stacks.into_iter().chain(std::iter::repeat(None)))
    {
        match stored {
            Some(stored) => shown.push(PatternInfo::new(pattern, Some(stored))),
            None if first.is_none() => first = Some(pattern),
            None => {}
        }
    }
    if shown.is_empty() {
        shown.extend(first.map(|pattern| PatternInfo::new(pattern, None)));
    }
    let mut shown = shown.into_iter();
    Some(ModelInfo {
        model_type: config.name(),
        architectures: config
            .architectures()
            .into_iter()
            .map(str::to_owned)
            .collect(),
        named_by: "config",
        config: Some(config.path.display().to_string()),
        adapter,
        layer_pattern: shown.next(),
        other_patterns: shown.collect(),
        shapes,
    })
}

mod adapter;

/// What reviewing a model finds: what the model is, its quantization, and the findings on its
/// layers, its config and its quantized weights.
#[derive(Debug)]
pub struct Reviewed {
    pub info: Option<ModelInfo>,
    pub quantization: Option<Quantization>,
    pub findings: Findings,
}

/// Checks the model against its config (see [`config_path`]) and its layers against each
/// other, over its logical weights when it is quantized (a packed weight's stored shape is not
/// the layer's): the findings, what the model is, and how it is quantized.
pub fn review_model(model: &Model, explicit: Option<&Path>) -> Reviewed {
    let recognised = recognise(model, explicit);
    let (info, findings) = review(&recognised, model);
    Reviewed {
        info,
        quantization: recognised.quantization,
        findings,
    }
}

/// The first part of [`review_model`]: the config and the quantization, which decide what the
/// rest reviews (and how a model is listed), with the findings on them.
#[derive(Debug)]
pub struct Recognised {
    config: Option<ModelConfig>,
    pub quantization: Option<Quantization>,
    findings: Findings,
}

/// Reads the config and recognises the quantization (see [`review_model`]).
pub fn recognise(model: &Model, explicit: Option<&Path>) -> Recognised {
    let mut findings = Findings::new();
    let config = match find_config(model, explicit) {
        Some(Ok(config)) => Some(config),
        Some(Err(error)) => {
            let label = escape(&error.path.display().to_string()).into_owned();
            findings.push(Finding::warning(Code::ConfigInvalid, error.to_string()).in_file(&label));
            None
        }
        None => None,
    };
    let quantization = recognise_quantization(model, config.as_ref(), &mut findings);
    Recognised {
        config,
        quantization,
        findings,
    }
}

/// The rest of [`review_model`] once the quantization is known: what the model is, and every
/// finding of the review (those of [`recognise`] first).
pub fn review(recognised: &Recognised, model: &Model) -> (Option<ModelInfo>, Findings) {
    let mut findings = recognised.findings.clone();
    let config = recognised.config.as_ref();
    let info = match &recognised.quantization {
        Some(quantization) => {
            let logical = quantization.logical_infos(model);
            // A weight whose rows are not stored (quanto's packed codes) has its element count
            // for a shape: its name counts, its shape does not.
            let flat: std::collections::HashSet<&str> = quantization
                .weights
                .iter()
                .filter(|weight| weight.flat)
                .map(|weight| weight.info.name.as_str())
                .collect();
            let infos = logical.iter().copied();
            let shaped = infos
                .clone()
                .filter(|info| !flat.contains(info.name.as_str()));
            review_tensors(config, infos, shaped, &mut findings)
        }
        None => review_tensors(config, tensors(model), tensors(model), &mut findings),
    };
    (info, findings)
}

/// How the model is quantized, from its config and side files, without the other checks.
pub fn quantization(model: &Model) -> Option<Quantization> {
    let config = find_config(model, None).and_then(Result::ok);
    recognise_quantization(model, config.as_ref(), &mut Findings::new())
}

/// The quantization from the config and the side files beside the model, with the findings on
/// both.
fn recognise_quantization(
    model: &Model,
    config: Option<&ModelConfig>,
    findings: &mut Findings,
) -> Option<Quantization> {
    let folder = match config {
        Some(config) => config.path.parent().map(Path::to_path_buf),
        None => match model.source {
            crate::format::model::Source::Folder => Some(model.path.clone()),
            _ => model.path.parent().map(Path::to_path_buf),
        },
    };
    let beside = match &model.remote {
        Some(remote) => Beside::Fetched(&remote.side_files),
        None => Beside::Folder(folder.as_deref()),
    };
    let mut side_findings = Vec::new();
    let side = SideFiles::read(
        &beside,
        config.map(|config| config.json.clone()),
        &mut side_findings,
    );
    let (quantization, quant_findings) = Quantization::recognise(model, &side);
    findings.extend(side_findings);
    findings.extend(quant_findings);
    quantization
}

/// The layer checks, the config checks and the expected tensors over `tensors`; the
/// architecture recognised from the shapes of `with_shapes`.
fn review_tensors<'a>(
    config: Option<&ModelConfig>,
    tensors: impl Iterator<Item = &'a TensorInfo> + Clone + Send + Sync,
    with_shapes: impl Iterator<Item = &'a TensorInfo> + Clone + Send + Sync,
    findings: &mut Findings,
) -> Option<ModelInfo> {
    let patterns = config.map(LayerPattern::declared).unwrap_or_default();
    let class = config.and_then(|config| config.architectures().first().map(|c| (*c).to_owned()));
    let template = class
        .as_deref()
        .and_then(|class| expected::templates().get(class));
    // The expected tensors are checked beside the layer checks, over the stacks the patterns
    // describe (found on their own: the layer checks find them too, but only at their end).
    let ((layer_review, shapes), expected) = rayon::join(
        || {
            rayon::join(
                || layer_findings(tensors.clone(), &patterns, template),
                || Architecture::recognise(with_shapes),
            )
        },
        || {
            let (class, template) = (class.as_deref()?, template?);
            config?;
            Some(expected::check(template, class, &patterns, tensors.clone()))
        },
    );
    findings.append(layer_review.findings);
    let stored = stored_stacks(&patterns, &layer_review.stacks);
    if let Some(config) = config {
        let label = escape(&config.path.display().to_string()).into_owned();
        for (pattern, stored) in patterns.iter().zip(&layer_review.stacks) {
            if let Some(stored) = stored
                && stored.layers != pattern.hidden_layers
                && stored.layers != pattern.len()
            {
                findings.push(
                    Finding::warning(
                        Code::ConfigMismatch,
                        format!(
                            "{} is {} in the config, but `{}` has {} layer{}",
                            pattern.count_key(),
                            pattern.hidden_layers,
                            escape(&stored.stack),
                            stored.layers,
                            if stored.layers == 1 { "" } else { "s" }
                        ),
                    )
                    .in_file(&label),
                );
            }
        }
        if let Some(shapes) = &shapes {
            findings.extend(shapes.check_config(config, &label));
        }
        findings.extend(sizes::check(config, &stored, tensors.clone(), &label));
        findings.extend(expected.into_iter().flatten());
        if let Some(adapter) = config.adapter() {
            findings.extend(adapter::check(&adapter, tensors.clone(), &label));
        }
    }
    model_info(config, shapes, patterns, layer_review.stacks, tensors)
}

/// Each pattern's stack, for the patterns whose stack the checkpoint stores.
fn stored_stacks<'p>(
    patterns: &'p [LayerPattern],
    stacks: &'p [Option<Stored>],
) -> Vec<(&'p LayerPattern, &'p str)> {
    patterns
        .iter()
        .zip(stacks)
        .filter_map(|(pattern, stored)| Some((pattern, stored.as_ref()?.stack.as_str())))
        .collect()
}

/// Opens a model and adds the findings of [`review_model`] to its own; gives its quantization
/// too.
pub fn open_reviewed(
    path: &Path,
    config: Option<&Path>,
) -> crate::error::Result<(Model, Option<Quantization>)> {
    Ok(reviewed(Model::open(path)?, config))
}

/// `model` with the findings of [`review_model`] added to its own, and its quantization.
pub fn reviewed(mut model: Model, config: Option<&Path>) -> (Model, Option<Quantization>) {
    let reviewed = review_model(&model, config);
    model.findings.append(reviewed.findings);
    (model, reviewed.quantization)
}
