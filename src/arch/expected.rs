//! The tensors a checkpoint holds, as data: per architecture class (`architectures[0]` of the
//! config, `LlamaForCausalLM`), the names outside the layer stack, and per layer kind the names
//! within each layer (experts numbered `{E}`). `templates.json` is derived from the checkpoints
//! the producers themselves wrote (`tests/fixtures/arch`) by
//! `STUI_UPDATE_TEMPLATES=1 cargo test --test it arch::templates`, which otherwise checks that
//! it still matches them: a new family is a new fixture and a data change, not code.

use super::layers::split_at_layer;
use super::pattern::{LayerKind, LayerPattern, Mlp, tensor_kind};
use crate::finding::{Code, Finding};
use crate::format::TensorInfo;
use crate::text::escape;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// How many more experts than a layer holds tensors a config may declare and still be checked
/// expert by expert.
const MAX_EXPERTS_UNHELD: u64 = 1024;

/// One architecture's tensors.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Template {
    /// Names outside any numbered stack.
    pub top: Vec<String>,
    /// Names that are there only when not tied to another (`lm_head.weight`): never missing.
    pub tied: Vec<String>,
    /// Per stack of layers the config declares (`model.layers`, `model.encoder.layers`,
    /// `vision_tower.encoder.layers`), per layer kind ([`kind_key`]), the names below the
    /// layer number.
    pub stacks: BTreeMap<String, Kinds>,
}

/// Per layer kind, the names below the layer number.
pub type Kinds = BTreeMap<String, Vec<String>>;

pub type Templates = BTreeMap<String, Template>;

impl Template {
    /// Whether a layer's tensor (its name below the layer number) is of a module some layer
    /// kind of the stack has; any is, in a stack the template does not know.
    pub fn knows_module(&self, stack: &str, suffix: &str) -> bool {
        let Some(kinds) = self.stacks.get(stack) else {
            return true;
        };
        let kind = tensor_kind(suffix);
        let wanted = module(&kind);
        kinds.values().flatten().any(|name| module(name) == wanted)
    }
}

/// The committed templates.
pub fn templates() -> &'static Templates {
    static TEMPLATES: OnceLock<Templates> = OnceLock::new();
    TEMPLATES
        .get_or_init(|| serde_json::from_str(include_str!("templates.json")).unwrap_or_default())
}

/// A layer kind as templates key it: what mixes tokens (its structure: the attention variants
/// hold the same tensors) and the feed-forward part.
pub fn kind_key(kind: &LayerKind) -> String {
    let mlp = match kind.mlp {
        Mlp::None => "none",
        Mlp::Dense => "dense",
        Mlp::Moe { .. } => "moe",
    };
    format!("{}/{mlp}", kind.mixer_structure())
}

/// A name's module: all but its last part.
fn module(name: &str) -> &str {
    name.rsplit_once('.').map_or("", |(module, _)| module)
}

/// Derives a template from a checkpoint's names, the stacks its patterns describe, and the
/// names its class ties to others (transformers' `_tied_weights_keys`).
pub fn derive<'a>(
    names: impl Iterator<Item = &'a str>,
    stacks: &[(&LayerPattern, &str)],
    tied: &[String],
) -> Template {
    let mut template = Template {
        tied: tied.to_vec(),
        ..Template::default()
    };
    for name in names {
        match split_at_layer(name) {
            Some((prefix, layer, suffix)) => {
                let Some(&(pattern, stack)) = stacks.iter().find(|(_, stack)| *stack == prefix)
                else {
                    continue;
                };
                let Some(kind) = pattern.kind(layer).filter(|k| !k.next_token_prediction) else {
                    continue;
                };
                if pattern.irregular(suffix) {
                    continue;
                }
                template
                    .stacks
                    .entry(stack.to_owned())
                    .or_default()
                    .entry(kind_key(kind))
                    .or_default()
                    .push(tensor_kind(suffix).into_owned());
            }
            None if tied.iter().any(|t| t == name) => {}
            None => template.top.push(name.to_owned()),
        }
    }
    template.top.sort();
    template.tied.sort();
    for names in template.stacks.values_mut().flat_map(BTreeMap::values_mut) {
        names.sort();
        names.dedup();
    }
    template
}

/// What the tensors hold against the template: a finding for each name the template expects
/// that no layer of its kind (or the model, outside the layers) holds, and for each name it
/// does not know, in each of `stacks` (a pattern and the stack it describes) the template
/// knows. A name one layer lacks is left to the layer checks, which name it; a missing
/// `weight` whose module holds other tensors (a quantized layout) is not missing.
pub fn check<'a>(
    template: &Template,
    class: &str,
    stacks: &[(&LayerPattern, &str)],
    tensors: impl Iterator<Item = &'a TensorInfo>,
) -> Vec<Finding> {
    let checked: Vec<(&LayerPattern, &str, &Kinds)> = stacks
        .iter()
        .filter_map(|&(pattern, stack)| Some((pattern, stack, template.stacks.get(stack)?)))
        .collect();
    let mut top: Vec<&str> = Vec::new();
    // (stack, layer, name below it) of the checked stacks' tensors.
    let mut layered: Vec<(usize, u64, &str)> = Vec::new();
    for tensor in tensors {
        match split_at_layer(&tensor.name) {
            Some((prefix, layer, suffix)) => {
                if let Some(at) = checked.iter().position(|&(_, stack, _)| stack == prefix) {
                    layered.push((at, layer, suffix));
                }
            }
            None => top.push(&tensor.name),
        }
    }
    top.sort_unstable();
    layered.sort_unstable();
    let class = escape(class);
    let mut findings = Vec::new();
    let known_modules: Vec<&str> = template
        .top
        .iter()
        .chain(&template.tied)
        .map(|name| module(name))
        .collect();
    for name in &template.top {
        if top.binary_search(&name.as_str()).is_err() && !stored_otherwise(&top, name) {
            findings.push(Finding::warning(
                Code::TensorMissing,
                format!(
                    "`{}` is missing: a {class} checkpoint holds it",
                    escape(name)
                ),
            ));
        }
    }
    for name in &top {
        if !template.top.iter().chain(&template.tied).any(|t| t == name)
            && !known_modules.contains(&module(name))
        {
            findings.push(
                Finding::warning(
                    Code::TensorUnexpected,
                    format!(
                        "`{}` is not a tensor of {class}: loaders leave it unused",
                        escape(name)
                    ),
                )
                .for_tensor(*name),
            );
        }
    }
    for (at, &(pattern, stack, kinds)) in checked.iter().enumerate() {
        let start = layered.partition_point(|&(s, _, _)| s < at);
        let end = layered.partition_point(|&(s, _, _)| s <= at);
        findings.extend(check_layers(
            stack,
            kinds,
            &class,
            pattern,
            &layered[start..end],
        ));
    }
    findings
}

/// Whether a weight missing from a sorted list of names is stored in other tensors of its
/// module (a quantized layout).
fn stored_otherwise(sorted: &[&str], name: &str) -> bool {
    let is_weight = name == "weight" || name.ends_with(".weight");
    is_weight && holds_module(sorted, module(name))
}

/// Whether a sorted list of names holds one in `module`.
fn holds_module(sorted: &[&str], module: &str) -> bool {
    if module.is_empty() {
        return false;
    }
    let start = sorted.partition_point(|name| *name < module);
    sorted[start..]
        .iter()
        .take_while(|name| name.starts_with(module))
        .any(|name| name.as_bytes().get(module.len()) == Some(&b'.'))
}

fn check_layers(
    stack: &str,
    kinds: &Kinds,
    class: &str,
    pattern: &LayerPattern,
    layered: &[(usize, u64, &str)],
) -> Vec<Finding> {
    let stack = escape(stack);
    let layers = layered.last().map_or(0, |&(_, last, _)| last + 1);
    // name below the layer -> (how many layers of its kind, layers lacking it); hashed, as a
    // MoE stack looks up every expert's names in every layer
    let mut missing: foldhash::HashMap<String, (usize, Vec<u64>)> = foldhash::HashMap::default();
    // tensor kind -> layers holding it unexpectedly
    let mut unexpected: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for layer in 0..layers.min(pattern.hidden_layers) {
        let Some(kind) = pattern.kind(layer) else {
            continue;
        };
        let Some(expected) = kinds.get(&kind_key(kind)) else {
            continue;
        };
        let start = layered.partition_point(|&(_, l, _)| l < layer);
        let held: Vec<&str> = layered[start..]
            .iter()
            .take_while(|&&(_, l, _)| l == layer)
            .map(|&(_, _, suffix)| suffix)
            .collect();
        if held.is_empty() {
            continue;
        }
        let experts = match kind.mlp {
            Mlp::Moe { experts, .. } => experts,
            _ => 0,
        };
        // A config that declares more experts than a layer holds tensors is not checked name
        // by name: each would be listed.
        if experts > held.len() as u64 + MAX_EXPERTS_UNHELD {
            continue;
        }
        for name in expected {
            for expanded in expand(name, experts) {
                if !missing.contains_key(&expanded) {
                    missing.insert(expanded.clone(), (0, Vec::new()));
                }
                let Some(entry) = missing.get_mut(&expanded) else {
                    continue;
                };
                entry.0 += 1;
                if held.binary_search(&expanded.as_str()).is_err()
                    && !stored_otherwise(&held, &expanded)
                    && !pattern.irregular(&expanded)
                {
                    entry.1.push(layer);
                }
            }
        }
        let modules: Vec<&str> = expected.iter().map(|name| module(name)).collect();
        for suffix in held {
            let kind = tensor_kind(suffix);
            let known =
                expected.iter().any(|name| *name == kind) || modules.contains(&module(&kind));
            let in_range = expert_number(suffix).is_none_or(|e| e < experts);
            if (!known || !in_range) && !pattern.irregular(suffix) {
                let key = if in_range {
                    kind.into_owned()
                } else {
                    suffix.to_owned()
                };
                unexpected.entry(key).or_default().push(layer);
            }
        }
    }
    let mut missing: Vec<(String, (usize, Vec<u64>))> = missing.into_iter().collect();
    missing.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut findings = Vec::new();
    for (name, (of_kind, lacking)) in missing {
        // Lacking in some layers only: the layer checks name each.
        if !lacking.is_empty() && lacking.len() == of_kind {
            findings.push(Finding::warning(
                Code::TensorMissing,
                format!(
                    "`{stack}.*.{}` is missing from {}: a {class} checkpoint holds it in each",
                    escape(&name),
                    layers_named(&lacking)
                ),
            ));
        }
    }
    for (name, layers) in unexpected {
        findings.push(Finding::warning(
            Code::TensorUnexpected,
            format!(
                "`{stack}.*.{}` (in {}) is not a tensor of {class}: loaders leave it unused",
                escape(&name),
                layers_named(&layers)
            ),
        ));
    }
    findings
}

/// `layer 3` or `layers 0-2, 5`.
fn layers_named(layers: &[u64]) -> String {
    let word = if layers.len() == 1 { "layer" } else { "layers" };
    format!("{word} {}", super::layers::spans(layers))
}

/// `mlp.experts.{E}.w` for experts 0 to `experts - 1`; other names as they are.
fn expand(name: &str, experts: u64) -> Vec<String> {
    match name.split_once("{E}") {
        Some((before, after)) => (0..experts)
            .map(|e| format!("{before}{e}{after}"))
            .collect(),
        None => vec![name.to_owned()],
    }
}

/// The expert number in a name below the layer number (`mlp.experts.12.w` -> 12,
/// `mlp.experts.expert_12.w` -> 12).
fn expert_number(suffix: &str) -> Option<u64> {
    let mut parts = suffix.split('.');
    while let Some(part) = parts.next() {
        if part == "experts" {
            return Some(super::pattern::expert_part(parts.next()?)?.0);
        }
    }
    None
}
