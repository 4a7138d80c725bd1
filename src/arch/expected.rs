//! The tensors a checkpoint holds, as data: per architecture class (`architectures[0]` of the
//! config, `LlamaForCausalLM`), the names outside the layer stack, and per layer kind the names
//! within each layer (experts numbered `{E}`). `templates.json` is derived from the checkpoints
//! the producers themselves wrote (`tests/fixtures/arch`) by
//! `STUI_UPDATE_TEMPLATES=1 cargo test --test it arch::templates`, which otherwise checks that
//! it still matches them: a new family is a new fixture and a data change, not code.

use super::layers::{self, split_at_layer};
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
/// does not know, in each stack of layers `patterns` describe that the template knows (none
/// when it knows none of them). A name one layer lacks is left to the layer checks, which name it; a missing
/// `weight` whose module holds other tensors (a quantized layout) is not missing.
pub fn check<'a>(
    template: &Template,
    class: &str,
    patterns: &[LayerPattern],
    tensors: impl Iterator<Item = &'a TensorInfo>,
) -> Vec<Finding> {
    let mut top: Vec<&str> = Vec::new();
    // (before the layer number, layer, below it) of every name that has one.
    let mut split: Vec<(&str, u64, &str)> = Vec::new();
    for tensor in tensors {
        match split_at_layer(&tensor.name) {
            Some(parts) => split.push(parts),
            None => top.push(&tensor.name),
        }
    }
    let stacks = layers::stacks_of_layers(
        split.iter().map(|&(prefix, layer, _)| (prefix, layer)),
        patterns,
    );
    let stacks = super::stored_stacks(patterns, &stacks);
    let checked: Vec<(&LayerPattern, &str, &Kinds)> = stacks
        .iter()
        .filter_map(|&(pattern, stack)| Some((pattern, stack, template.stacks.get(stack)?)))
        .collect();
    if checked.is_empty() {
        return Vec::new();
    }
    // (stack, layer, name below it) of the checked stacks' tensors.
    let mut layered: Vec<(usize, u64, &str)> = split
        .into_iter()
        .filter_map(|(prefix, layer, suffix)| {
            let at = checked.iter().position(|&(_, stack, _)| stack == prefix)?;
            Some((at, layer, suffix))
        })
        .collect();
    top.sort_unstable();
    // By stack and layer only: a layer's names are sorted when one is looked for among them,
    // which only a missing name needs.
    layered.sort_unstable_by_key(|&(stack, layer, _)| (stack, layer));
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
    // Every name a kind expects, once; a name with `{E}` stands for a tensor per expert, so a
    // MoE stack's names are counted by (name, expert) rather than spelled out layer by layer.
    let mut names: Vec<&str> = kinds.values().flatten().map(String::as_str).collect();
    names.sort_unstable();
    names.dedup();
    let mut slots: Vec<Vec<Slot>> = vec![Vec::new(); names.len()];
    // tensor kind -> layers holding it unexpectedly
    let mut unexpected: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    // What each name below the layer number is, worked out once: the layers of a stack hold
    // the same names.
    let mut seen: foldhash::HashMap<&str, Held> = foldhash::HashMap::default();
    for layer in 0..layers.min(pattern.hidden_layers) {
        let Some(layer_kind) = pattern.kind(layer) else {
            continue;
        };
        let Some(expected) = kinds.get(&kind_key(layer_kind)) else {
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
        let experts = match layer_kind.mlp {
            Mlp::Moe { experts, .. } => experts,
            _ => 0,
        };
        if experts > held.len() as u64 + MAX_EXPERTS_UNHELD {
            continue;
        }
        let modules: Vec<&str> = expected.iter().map(|name| module(name)).collect();
        let mut expected_ids: Vec<usize> = expected
            .iter()
            .filter_map(|name| names.binary_search(&name.as_str()).ok())
            .collect();
        expected_ids.sort_unstable();
        for &suffix in &held {
            let held = seen
                .entry(suffix)
                .or_insert_with(|| Held::new(suffix, &names, pattern));
            if let Some(id) = held.id
                && let Some(expert) = held.expansion
                && expert < experts.max(1)
            {
                slot(&mut slots[id], expert).held_in = Some(layer);
            }
            let known = held
                .id
                .is_some_and(|id| expected_ids.binary_search(&id).is_ok())
                || modules.contains(&module(&held.kind));
            let flagged = !known || held.expert.is_some_and(|e| e >= experts);
            if flagged && !held.irregular {
                let in_range = held.expert.is_none_or(|e| e < experts);
                let key = if in_range {
                    held.kind.clone()
                } else {
                    suffix.to_owned()
                };
                unexpected.entry(key).or_default().push(layer);
            }
        }
        let mut sorted_held: Option<Vec<&str>> = None;
        for name in expected {
            let Ok(id) = names.binary_search(&name.as_str()) else {
                continue;
            };
            let expansions = if name.contains("{E}") { experts } else { 1 };
            for expert in 0..expansions {
                let slot = slot(&mut slots[id], expert);
                slot.layers += 1;
                if slot.held_in != Some(layer) {
                    let expanded = expand(name, expert);
                    let sorted = sorted_held.get_or_insert_with(|| {
                        let mut sorted = held.clone();
                        sorted.sort_unstable();
                        sorted
                    });
                    if !stored_otherwise(sorted, &expanded) && !pattern.irregular(&expanded) {
                        slot.lacking.push(layer);
                    }
                }
            }
        }
    }
    findings_of(&stack, class, &names, &slots, unexpected)
}

/// A name below the layer number, as [`check_layers`] sees it.
struct Held {
    /// Its [`tensor_kind`].
    kind: String,
    /// The expected name of its kind, by its place among the names.
    id: Option<usize>,
    /// Which expert's expansion of that name it is (see [`expansion_of`]).
    expansion: Option<u64>,
    /// The expert it is of, if it is an expert's.
    expert: Option<u64>,
    /// Whether the pattern says its layers hold it irregularly.
    irregular: bool,
}

impl Held {
    fn new(suffix: &str, names: &[&str], pattern: &LayerPattern) -> Held {
        let mut kind = String::new();
        write_kind(suffix, &mut kind);
        let id = names.binary_search(&kind.as_str()).ok();
        Held {
            expansion: id.and_then(|id| expansion_of(names[id], suffix)),
            id,
            kind,
            expert: expert_number(suffix),
            irregular: pattern.irregular(suffix),
        }
    }
}

/// The findings of [`check_layers`]: each expected name lacking from every layer that should
/// hold it (in name order), then each unexpected kind.
fn findings_of(
    stack: &str,
    class: &str,
    names: &[&str],
    slots: &[Vec<Slot>],
    unexpected: BTreeMap<String, Vec<u64>>,
) -> Vec<Finding> {
    // Lacking in some layers only: the layer checks name each.
    let mut missing: Vec<(String, &[u64])> = names
        .iter()
        .zip(slots)
        .flat_map(|(name, slots)| {
            (0u64..)
                .zip(slots)
                .filter(|(_, slot)| !slot.lacking.is_empty() && slot.lacking.len() == slot.layers)
                .map(|(expert, slot)| (expand(name, expert), slot.lacking.as_slice()))
        })
        .collect();
    missing.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut findings = Vec::new();
    for (name, lacking) in missing {
        findings.push(Finding::warning(
            Code::TensorMissing,
            format!(
                "`{stack}.*.{}` is missing from {}: a {class} checkpoint holds it in each",
                escape(&name),
                layers_named(lacking)
            ),
        ));
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

/// One expected name (for one expert, if it is an expert's) across the layers checked.
#[derive(Clone, Default)]
struct Slot {
    /// The layers whose kind expects it.
    layers: usize,
    /// Those of them lacking it.
    lacking: Vec<u64>,
    /// The last layer found holding it.
    held_in: Option<u64>,
}

/// The slot of expert `expert` (0 for a name that is not an expert's).
fn slot(slots: &mut Vec<Slot>, expert: u64) -> &mut Slot {
    let at = usize::try_from(expert).unwrap_or(usize::MAX);
    if slots.len() <= at {
        slots.resize_with(at + 1, Slot::default);
    }
    &mut slots[at]
}

/// [`tensor_kind`] of `suffix`, written into `kind`.
fn write_kind(suffix: &str, kind: &mut String) {
    kind.clear();
    let mut previous = None;
    for part in suffix.split('.') {
        if previous.is_some() {
            kind.push('.');
        }
        if previous == Some("experts")
            && let Some((_, digits)) = super::pattern::expert_part(part)
        {
            kind.push_str(&part[..digits]);
            kind.push_str("{E}");
        } else {
            kind.push_str(part);
        }
        previous = Some(part);
    }
}

/// Which expert's expansion of `name` (see [`expand`]) `suffix` is: `Some(0)` for a name
/// without `{E}` that is `suffix`; `None` when `suffix` is no expansion of it.
fn expansion_of(name: &str, suffix: &str) -> Option<u64> {
    let Some((before, after)) = name.split_once("{E}") else {
        return (name == suffix).then_some(0);
    };
    let number = suffix.strip_prefix(before)?.strip_suffix(after)?;
    let canonical =
        crate::text::is_numeric_part(number) && (number == "0" || !number.starts_with('0'));
    canonical.then(|| number.parse().ok()).flatten()
}

/// `layer 3` or `layers 0-2, 5`.
fn layers_named(layers: &[u64]) -> String {
    let word = if layers.len() == 1 { "layer" } else { "layers" };
    format!("{word} {}", super::layers::spans(layers))
}

/// `mlp.experts.{E}.w` for expert `expert`; other names as they are.
fn expand(name: &str, expert: u64) -> String {
    match name.split_once("{E}") {
        Some((before, after)) => format!("{before}{expert}{after}"),
        None => name.to_owned(),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A held name counts for an expected one when its kind is that name and it is that name's
    /// expansion: exactly when it equals the expansion, for every name the templates hold.
    #[test]
    fn an_expansion_is_found_by_its_kind() {
        let names = templates()
            .values()
            .flat_map(|t| t.stacks.values().flat_map(|kinds| kinds.values().flatten()));
        let mut kind = String::new();
        for name in names {
            for expert in [0, 1, 9, 10, 255] {
                let expanded = expand(name, expert);
                write_kind(&expanded, &mut kind);
                assert_eq!(kind, tensor_kind(&expanded), "{expanded}");
                assert_eq!(kind, *name, "{expanded}");
                let expected = if name.contains("{E}") { expert } else { 0 };
                assert_eq!(expansion_of(name, &expanded), Some(expected), "{expanded}");
            }
        }
    }

    #[test]
    fn only_the_expansion_itself_is_one() {
        let name = "mlp.experts.{E}.down_proj.weight";
        assert_eq!(
            expansion_of(name, "mlp.experts.12.down_proj.weight"),
            Some(12)
        );
        for other in [
            "mlp.experts.012.down_proj.weight",
            "mlp.experts.+1.down_proj.weight",
            "mlp.experts..down_proj.weight",
            "mlp.experts.1.up_proj.weight",
            "mlp.experts.99999999999999999999.down_proj.weight",
        ] {
            assert_eq!(expansion_of(name, other), None, "{other}");
        }
        assert_eq!(
            expansion_of("self_attn.q_proj.weight", "self_attn.q_proj.weight"),
            Some(0)
        );
        let mut kind = String::new();
        for suffix in [
            "experts.3",
            "a.experts.3.experts.4.b",
            "experts",
            "x.experts.{E}.y",
            "",
        ] {
            write_kind(suffix, &mut kind);
            assert_eq!(kind, tensor_kind(suffix), "{suffix}");
        }
    }
}
