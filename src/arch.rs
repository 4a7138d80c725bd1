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

pub use config::{Adapter, ConfigError, ModelConfig, config_path, find_config};
pub use layers::{LayerReview, layer_findings, split_at_layer};
pub use pattern::{LayerKind, LayerPattern, Mlp, Run, tensor_kind};
pub use recognise::Architecture;

use crate::finding::{Code, Finding, Findings};
use crate::format::{Model, TensorInfo};
use crate::quant::{Quantization, SideFiles};
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
    pub layer_pattern: Option<PatternInfo>,
    /// What the names and shapes show (the decoder-only families stui knows).
    #[serde(flatten)]
    pub shapes: Option<Architecture>,
}

/// A layer pattern as `inspect --json` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct PatternInfo {
    /// `layers 0-2: dense MLP; 3-60: MoE, 256 experts + 1 shared`
    pub summary: String,
    /// The stack of layers it describes (`model.layers`), when the model has it.
    pub stack: Option<String>,
    pub hidden_layers: u64,
    pub kinds: Vec<LayerKind>,
    pub runs: Vec<Run>,
    #[serde(skip)]
    pub pattern: LayerPattern,
}

impl PatternInfo {
    fn new(pattern: LayerPattern, stack: Option<String>) -> PatternInfo {
        PatternInfo {
            summary: pattern.to_string(),
            stack,
            hidden_layers: pattern.hidden_layers,
            kinds: pattern.kinds.clone(),
            runs: pattern.runs(),
            pattern,
        }
    }
}

impl ModelInfo {
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
    let pattern = config.as_ref().and_then(LayerPattern::from_config);
    let stack = pattern
        .as_ref()
        .and_then(|pattern| layers::stack_for(tensors(model), pattern));
    let shapes = Architecture::recognise(tensors(model));
    model_info(config.as_ref(), shapes, pattern, stack, tensors(model))
}

fn tensors(model: &Model) -> impl Iterator<Item = &TensorInfo> + Clone {
    model.tensors.iter().map(|t| &t.info)
}

fn model_info<'a>(
    config: Option<&ModelConfig>,
    shapes: Option<Architecture>,
    pattern: Option<LayerPattern>,
    stack: Option<String>,
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
            shapes: Some(shapes),
        });
    };
    let adapter = config.adapter().map(|mut adapter| {
        adapter.pairs = Some(adapter::pairs(tensors));
        adapter
    });
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
        layer_pattern: pattern.map(|pattern| PatternInfo::new(pattern, stack)),
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
    let info = match &quantization {
        Some(quantization) => {
            let logical: Vec<std::borrow::Cow<'_, TensorInfo>> =
                quantization.logical_infos(model).collect();
            // A weight whose rows are not stored (quanto's packed codes) has its element count
            // for a shape: its name counts, its shape does not.
            let flat: std::collections::HashSet<&str> = quantization
                .weights
                .iter()
                .filter(|weight| weight.flat)
                .map(|weight| weight.name.as_str())
                .collect();
            let infos = logical.iter().map(|info| &**info);
            let shaped = infos
                .clone()
                .filter(|info| !flat.contains(info.name.as_str()));
            review_tensors(config.as_ref(), infos, shaped, &mut findings)
        }
        None => review_tensors(
            config.as_ref(),
            tensors(model),
            tensors(model),
            &mut findings,
        ),
    };
    Reviewed {
        info,
        quantization,
        findings,
    }
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
    let mut side_findings = Vec::new();
    let side = SideFiles::read(
        folder.as_deref(),
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
    let pattern = config.and_then(LayerPattern::from_config);
    let class = config.and_then(|config| config.architectures().first().map(|c| (*c).to_owned()));
    let template = class
        .as_deref()
        .and_then(|class| expected::templates().get(class));
    let (layer_review, shapes) = rayon::join(
        || layer_findings(tensors.clone(), pattern.as_ref(), template),
        || Architecture::recognise(with_shapes),
    );
    findings.append(layer_review.findings);
    if let Some(config) = config {
        let label = escape(&config.path.display().to_string()).into_owned();
        if let (Some(pattern), Some(stack), Some(found)) =
            (&pattern, &layer_review.stack, layer_review.stack_layers)
            && found != pattern.hidden_layers
            && found != pattern.len()
        {
            findings.push(
                Finding::warning(
                    Code::ConfigMismatch,
                    format!(
                        "`num_hidden_layers` is {} in the config, but `{}` has {found} layers",
                        pattern.hidden_layers,
                        escape(stack)
                    ),
                )
                .in_file(&label),
            );
        }
        if let Some(shapes) = &shapes {
            findings.extend(shapes.check_config(config, &label));
        }
        if let (Some(pattern), Some(stack), Some(class), Some(template)) =
            (&pattern, &layer_review.stack, &class, template)
            && template.stack == *stack
        {
            findings.extend(expected::check(template, class, pattern, tensors.clone()));
        }
        if let Some(adapter) = config.adapter() {
            findings.extend(adapter::check(&adapter, tensors.clone(), &label));
        }
    }
    model_info(config, shapes, pattern, layer_review.stack, tensors)
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
