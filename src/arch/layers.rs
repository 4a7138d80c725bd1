//! Layer completeness and consistency, from names, shapes and dtypes alone: each layer is compared
//! with the layers of its kind. The config's layer pattern says which those are; without one, a
//! part that a contiguous run of layers has and another lacks is a layout, not a gap.

use super::expected::Template;
use super::pattern::{LayerKind, LayerPattern, Mlp, Part};
use crate::finding::{Code, Finding, Findings};
use crate::format::TensorInfo;
use crate::text::{Counted, Shape, escape, is_numeric_part, natural_cmp};
use foldhash::HashMap;
use std::collections::BTreeMap;
use std::fmt::Display;

/// Without a config, a tensor is flagged as missing or odd only when at most this share of the
/// layers differ: more than that is a model whose layers differ by design.
const ODD_SHARE: usize = 10;

/// The first part of a layer's tensor names that says which part of the layer it is in: its
/// feed-forward part, or what mixes tokens (attention, Mamba, ...). Tensors of other modules
/// (norms) are compared across layers of the same whole kind.
const MLP_MODULES: &[&str] = &["mlp", "feed_forward", "block_sparse_moe", "moe", "ffn"];
const MIXER_MODULES: &[&str] = &[
    "self_attn",
    "attention",
    "attn",
    "linear_attn",
    "self_attention",
    "mamba",
    "mixer",
];

/// A name split at its first numeric part: `model.layers.12.mlp.w` is `model.layers`, 12,
/// `mlp.w`.
pub fn split_at_layer(name: &str) -> Option<(&str, u64, &str)> {
    // Parts are short: a byte loop finds each dot sooner than a search tuned for long text.
    let bytes = name.as_bytes();
    let mut start = 0;
    loop {
        let rest = &bytes[start..];
        let len = rest.iter().position(|&b| b == b'.').unwrap_or(rest.len());
        let end = start + len;
        let part = &name[start..end];
        if is_numeric_part(part) {
            let layer = part.parse().ok()?;
            let prefix = name[..start].strip_suffix('.')?;
            let suffix = name.get(end + 1..).filter(|s| !s.is_empty())?;
            return Some((prefix, layer, suffix));
        }
        if end == bytes.len() {
            return None;
        }
        start = end + 1;
    }
}

fn tolerated(odd: usize, layers: usize) -> bool {
    odd <= (layers / ODD_SHARE).max(1)
}

/// What a layer's tensor is compared across, under a layer pattern: layers with the same
/// feed-forward part for an MLP tensor, with the same mixer for an attention tensor, of the same
/// kind for anything else.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Peers<'p> {
    Mlp(&'p Mlp, bool),
    Mixer(&'p str, bool),
    Kind(&'p str, &'p Mlp, bool),
}

/// Which of [`Peers`] a tensor below a layer is compared across, by the module it is in.
#[derive(Clone, Copy)]
enum Compared {
    Mlp,
    Mixer,
    Kind,
}

impl Compared {
    fn of(suffix: &str) -> Compared {
        let module = suffix.split('.').next().unwrap_or_default();
        if MLP_MODULES.contains(&module) {
            Compared::Mlp
        } else if MIXER_MODULES.contains(&module) {
            Compared::Mixer
        } else {
            Compared::Kind
        }
    }
}

fn peers_key(pattern: &LayerPattern, layer: u64, compared: Compared) -> Option<Peers<'_>> {
    let index = usize::from(*pattern.layers.get(usize::try_from(layer).ok()?)?);
    let kind: &LayerKind = &pattern.kinds[index];
    Some(match compared {
        Compared::Mlp => Peers::Mlp(&kind.mlp, kind.next_token_prediction),
        Compared::Mixer => Peers::Mixer(kind.mixer_structure(), kind.next_token_prediction),
        Compared::Kind => Peers::Kind(
            kind.mixer_structure(),
            &kind.mlp,
            kind.next_token_prediction,
        ),
    })
}

/// Words in the name of a stack of a vision or audio tower.
const TOWER_WORDS: [&str; 4] = ["vision", "visual", "audio", "image"];

/// Whether a stack (`model.encoder.layers`) can be of a part of the model: an encoder's or a
/// decoder's is named so by the first part of its name that says which (an encoder-decoder's
/// decoder can be `decoder.bert.encoder.layer`); a tower's holds a tower word.
fn can_be(prefix: &str, part: Part) -> bool {
    let tower = TOWER_WORDS.iter().any(|word| prefix.contains(word));
    let side = prefix
        .split('.')
        .find(|name| matches!(*name, "encoder" | "decoder"));
    match part {
        Part::Main => true,
        Part::Encoder => !tower && side == Some("encoder"),
        Part::Decoder => !tower && side == Some("decoder"),
        Part::Vision => tower,
    }
}

/// The stack each of the config's patterns describes, in their order: of the stacks that can be
/// of its part and whose layers it covers (at least half of them present), the one with the
/// most tensors, a language model's before a tower's; each stack described once.
fn assign_stacks<'a>(
    layers: &HashMap<&'a str, Vec<u64>>,
    tensors: &HashMap<&'a str, usize>,
    patterns: &[LayerPattern],
) -> Vec<Option<&'a str>> {
    let mut assigned: Vec<Option<&str>> = Vec::with_capacity(patterns.len());
    for pattern in patterns {
        let stack = layers
            .iter()
            .filter(|&(prefix, numbers)| {
                let count = numbers.len() as u64;
                count * 2 >= pattern.hidden_layers
                    && count <= pattern.len() * 2 + 1
                    && can_be(prefix, pattern.part)
                    && !assigned.contains(&Some(*prefix))
            })
            .max_by_key(|&(&prefix, _)| {
                let tower = TOWER_WORDS.iter().any(|word| prefix.contains(word));
                (!tower, tensors.get(prefix).copied().unwrap_or(0), prefix)
            })
            .map(|(&prefix, _)| prefix);
        assigned.push(stack);
    }
    assigned
}

/// A stack of layers a pattern describes, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// `model.layers`
    pub stack: String,
    /// One more than its highest layer number.
    pub layers: u64,
}

fn stored<'a>(
    assigned: &[Option<&'a str>],
    layers: &HashMap<&'a str, Vec<u64>>,
) -> Vec<Option<Stored>> {
    assigned
        .iter()
        .map(|prefix| {
            let prefix = (*prefix)?;
            Some(Stored {
                stack: prefix.to_owned(),
                layers: layers[prefix].last().map_or(0, |last| last + 1),
            })
        })
        .collect()
}

/// The stacks of layers the config's patterns describe (see [`layer_findings`]), in their
/// order.
pub fn stacks_for<'a>(
    tensors: impl IntoIterator<Item = &'a TensorInfo>,
    patterns: &[LayerPattern],
) -> Vec<Option<Stored>> {
    // Split as they are counted: without patterns, not at all.
    let layered = tensors.into_iter().filter_map(|tensor| {
        let (prefix, layer, _) = split_at_layer(&tensor.name)?;
        Some((prefix, layer))
    });
    stacks_of_layers(layered, patterns)
}

/// [`stacks_for`] the names split at their layer numbers: each name's part before its layer
/// number, and the number.
pub fn stacks_of_layers<'a>(
    layered: impl IntoIterator<Item = (&'a str, u64)>,
    patterns: &[LayerPattern],
) -> Vec<Option<Stored>> {
    if patterns.is_empty() {
        return Vec::new();
    }
    let mut layers: HashMap<&str, Vec<u64>> = HashMap::default();
    let mut counts: HashMap<&str, usize> = HashMap::default();
    for (prefix, layer) in layered {
        let numbers = layers.entry(prefix).or_default();
        if numbers.last() != Some(&layer) {
            numbers.push(layer);
        }
        *counts.entry(prefix).or_default() += 1;
    }
    for numbers in layers.values_mut() {
        numbers.sort_unstable();
        numbers.dedup();
    }
    stored(&assign_stacks(&layers, &counts, patterns), &layers)
}

/// What the layer checks found, and which stacks the patterns were applied to.
#[derive(Debug, Default)]
pub struct LayerReview {
    pub findings: Findings,
    /// The stack of layers each of the config's patterns describes, in their order.
    pub stacks: Vec<Option<Stored>>,
}

/// How a group of missing tensors reads.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Gap<'a> {
    /// Missing from layers of their kind (by the pattern), or from a module the layer has.
    Incomplete,
    /// A whole part (`ancestor`) the layer lacks, without a pattern to say if it should.
    Absent(&'a str),
}

/// A stack's tensors of one name below the layer number, with their layers.
type Stack<'a> = ((&'a str, &'a str), Vec<(u64, &'a TensorInfo)>);

/// Tensors missing from some layers: (prefix, how, layers) -> the names below the layer.
type Gaps<'a> = BTreeMap<(&'a str, Gap<'a>, Vec<u64>), Vec<&'a str>>;

/// Findings for tensors missing from some layers, for layers missing entirely, and for a
/// layer's tensor whose shape or dtype differs from the same tensor in its peers.
pub fn layer_findings<'a>(
    tensors: impl IntoIterator<Item = &'a TensorInfo>,
    patterns: &[LayerPattern],
    template: Option<&Template>,
) -> LayerReview {
    let mut stacks: HashMap<(&str, &str), Vec<(u64, &TensorInfo)>> = HashMap::default();
    for tensor in tensors {
        if let Some((prefix, layer, suffix)) = split_at_layer(&tensor.name) {
            stacks
                .entry((prefix, suffix))
                .or_default()
                .push((layer, tensor));
        }
    }
    // Each prefix's layers, sorted, once each: lists rather than hash sets, as a hostile header
    // can number a million layers.
    let mut layers: HashMap<&str, Vec<u64>> = HashMap::default();
    let mut counts: HashMap<&str, usize> = HashMap::default();
    for (&(prefix, _), present) in &stacks {
        layers
            .entry(prefix)
            .or_default()
            .extend(present.iter().map(|&(layer, _)| layer));
        *counts.entry(prefix).or_default() += present.len();
    }
    for numbers in layers.values_mut() {
        numbers.sort_unstable();
        numbers.dedup();
        numbers.shrink_to_fit();
    }
    let assigned = assign_stacks(&layers, &counts, patterns);
    let mut stacks: Vec<Stack> = stacks.into_iter().collect();
    stacks.sort_unstable_by(|((p1, s1), _), ((p2, s2), _)| {
        natural_cmp(p1, p2).then_with(|| natural_cmp(s1, s2))
    });
    let declared = |prefix: &str| {
        let at = assigned.iter().position(|&stack| stack == Some(prefix))?;
        patterns.get(at)
    };
    // A tensor of a module the template does not know is not missing elsewhere: it is
    // unexpected where it is (see `expected::check`).
    let known = |prefix: &str, suffix: &str| {
        template.is_none_or(|t| declared(prefix).is_none() || t.knows_module(prefix, suffix))
    };
    let (gaps, mixed) = find_gaps(&mut stacks, &layers, &declared, &known);
    let gaps = classify_gaps(gaps, &stacks, &mixed);
    let mut findings = Findings::new();
    let kinds = report_gaps(gaps, &stacks, &layers, &mut findings);
    for ((prefix, _), present) in &stacks {
        let by_pattern = declared(prefix).is_some();
        let by_kind: Vec<(u64, &TensorInfo)>;
        let groups: Vec<&[(u64, &TensorInfo)]> = match kinds.get(prefix) {
            Some(kinds) if !by_pattern => {
                by_kind = {
                    let mut sorted = present.clone();
                    sorted.sort_by_key(|&(layer, _)| (kinds.kind(layer), layer));
                    sorted
                };
                by_kind
                    .chunk_by(|a, b| kinds.kind(a.0) == kinds.kind(b.0))
                    .collect()
            }
            _ => vec![present.as_slice()],
        };
        let least = if by_pattern { 2 } else { 3 };
        for group in groups.into_iter().filter(|group| group.len() >= least) {
            findings.extend(odd_siblings(group, |t| Shape(&t.shape), "shape"));
            findings.extend(odd_siblings(group, |t| t.dtype.name(), "dtype"));
        }
    }
    for (&prefix, all) in &layers {
        findings.extend(missing_layers(
            prefix,
            all,
            declared(prefix),
            mixed.contains(&prefix),
        ));
    }
    LayerReview {
        findings,
        stacks: stored(&assigned, &layers),
    }
}

/// The tensors each layer lacks that its peers have, and the stacks whose numbered children are
/// different modules (`stem.0` a convolution, `stem.1` a norm: a tensor of the same name has a
/// different rank from one to the next).
fn find_gaps<'a, 'p>(
    stacks: &mut [Stack<'a>],
    layers: &HashMap<&'a str, Vec<u64>>,
    declared: &dyn Fn(&str) -> Option<&'p LayerPattern>,
    known: &dyn Fn(&str, &str) -> bool,
) -> (Gaps<'a>, Vec<&'a str>) {
    let mut mixed: Vec<&str> = Vec::new();
    let mut gaps = Gaps::new();
    for ((prefix, suffix), present) in stacks {
        let (prefix, suffix) = (*prefix, *suffix);
        let all = &layers[prefix];
        present.sort_unstable_by_key(|&(layer, _)| layer);
        present.dedup_by_key(|&mut (layer, _)| layer);
        if present
            .iter()
            .any(|(_, t)| t.shape.len() != present[0].1.shape.len())
            && mixed.last() != Some(&prefix)
        {
            mixed.push(prefix);
        }
        let by_pattern = declared(prefix);
        let missing_count = all.len() - present.len();
        // Listed only when few are missing, which keeps the work linear: without a pattern, no
        // more than are present (a tensor that few layers have is a design, not a gap); with
        // one, when the layers of its kind could be most of the stack.
        let missing: Vec<u64> = match by_pattern {
            Some(pattern)
                if missing_count > 0
                    && all.len() <= 4 * present.len() + 64
                    && !pattern.irregular(suffix)
                    && known(prefix, suffix) =>
            {
                let compared = Compared::of(suffix);
                let mut keys: Vec<Peers> = present
                    .iter()
                    .filter_map(|&(layer, _)| peers_key(pattern, layer, compared))
                    .collect();
                keys.dedup();
                all.iter()
                    .copied()
                    .filter(|&layer| {
                        peers_key(pattern, layer, compared).is_some_and(|k| keys.contains(&k))
                            && present.binary_search_by_key(&layer, |&(l, _)| l).is_err()
                    })
                    .collect()
            }
            None if missing_count > 0 && missing_count <= present.len() => all
                .iter()
                .copied()
                .filter(|layer| present.binary_search_by_key(layer, |&(l, _)| l).is_err())
                .collect(),
            _ => Vec::new(),
        };
        if !missing.is_empty() {
            let gap = if by_pattern.is_some() {
                Gap::Incomplete
            } else {
                Gap::Absent("")
            };
            gaps.entry((prefix, gap, missing)).or_default().push(suffix);
        }
    }
    (gaps, mixed)
}

/// Each layer's kind in a stack without a pattern, as its layout notes tell them apart: layers
/// that lack a part others have are of another kind, and compared only with their own.
#[derive(Default)]
struct InferredKinds {
    /// (layer, one bit per layout note that names it as lacking the part), sorted.
    layers: Vec<(u64, u64)>,
}

impl InferredKinds {
    fn kind(&self, layer: u64) -> u64 {
        self.layers
            .binary_search_by_key(&layer, |&(l, _)| l)
            .map_or(0, |at| self.layers[at].1)
    }
}

/// Adds a finding for each gap and a note for each layout, and returns the kinds the layouts
/// tell apart.
fn report_gaps<'a>(
    gaps: Gaps<'a>,
    stacks: &[Stack<'a>],
    layers: &HashMap<&'a str, Vec<u64>>,
    findings: &mut Findings,
) -> HashMap<&'a str, InferredKinds> {
    // Parts a run of layers lacks, one note for all those the same layers lack.
    let mut layouts: BTreeMap<(&str, Vec<u64>), Vec<&str>> = BTreeMap::new();
    for ((prefix, gap, missing), suffixes) in gaps {
        let all = &layers[prefix];
        if let Gap::Absent(ancestor) = gap
            && is_layout(all, &missing)
        {
            let parts = layouts.entry((prefix, missing)).or_default();
            if !parts.contains(&ancestor) {
                parts.push(ancestor);
            }
            continue;
        }
        // The layers that have the first of the tensors (those of a group have the same).
        let having: Vec<u64> = stacks
            .binary_search_by(|((p, s), _)| {
                natural_cmp(p, prefix).then_with(|| natural_cmp(s, suffixes[0]))
            })
            .map(|at| stacks[at].1.iter().map(|&(layer, _)| layer).collect())
            .unwrap_or_default();
        findings.push(gap_finding(prefix, &missing, &suffixes, &having));
    }
    let mut kinds: HashMap<&str, InferredKinds> = HashMap::default();
    for (note, ((prefix, missing), parts)) in layouts.into_iter().enumerate() {
        let all = &layers[prefix];
        let present: Vec<u64> = all
            .iter()
            .copied()
            .filter(|layer| missing.binary_search(layer).is_err())
            .collect();
        let inferred = kinds.entry(prefix).or_default();
        if inferred.layers.is_empty() {
            inferred.layers = all.iter().map(|&layer| (layer, 0)).collect();
        }
        for (layer, bits) in &mut inferred.layers {
            if missing.binary_search(layer).is_ok() {
                *bits |= 1 << (note % 64);
            }
        }
        let mut shown: Vec<String> = parts
            .iter()
            .take(LAYOUT_PARTS_SHOWN)
            .map(|part| format!("`{}.*.{}`", escape(prefix), escape(part)))
            .collect();
        if parts.len() > LAYOUT_PARTS_SHOWN {
            shown.push(format!("{} more", parts.len() - LAYOUT_PARTS_SHOWN));
        }
        let parts = shown;
        let verb = if parts.len() == 1 { "is" } else { "are" };
        findings.push(Finding::info(
            Code::LayerLayout,
            format!(
                "{} {verb} in layers {} only, not in {}: a layout, not a gap",
                parts.join(", "),
                spans(&present),
                spans(&missing)
            ),
        ));
    }
    kinds
}

/// The layers of a stack a gap is in, and what those layers hold: (layer, name below it).
type Queried<'a> = (Vec<u64>, Vec<(u64, &'a str)>);

/// How many parts a layout note names.
const LAYOUT_PARTS_SHOWN: usize = 8;

/// Without a pattern, splits each group of tensors missing from some layers into those whose
/// module the layer has (a gap) and those whose whole part it lacks (a layout, or a gap if it
/// is a hole in a run), worked out per layer from what the layer holds.
fn classify_gaps<'a>(gaps: Gaps<'a>, stacks: &[Stack<'a>], mixed: &[&str]) -> Gaps<'a> {
    // The layers lacking something unexplained, per prefix, and the (layer, suffix) pairs of
    // those layers only, sorted: what the layers in question hold.
    let mut queried: HashMap<&str, Queried> = HashMap::default();
    for (prefix, gap, missing) in gaps.keys() {
        if *gap == Gap::Absent("") {
            queried.entry(prefix).or_default().0.extend(missing);
        }
    }
    for (layers, _) in queried.values_mut() {
        layers.sort_unstable();
        layers.dedup();
    }
    if !queried.is_empty() {
        for ((prefix, suffix), present) in stacks {
            if let Some((layers, list)) = queried.get_mut(prefix) {
                list.extend(
                    present
                        .iter()
                        .filter(|(layer, _)| layers.binary_search(layer).is_ok())
                        .map(|&(layer, _)| (layer, *suffix)),
                );
            }
        }
        for (_, list) in queried.values_mut() {
            list.sort_unstable();
        }
    }
    let mut out = Gaps::new();
    for ((prefix, gap, missing), suffixes) in gaps {
        if gap != Gap::Absent("") {
            out.entry((prefix, gap, missing))
                .or_default()
                .extend(suffixes);
            continue;
        }
        if mixed.contains(&prefix) {
            continue;
        }
        let list = &queried[prefix].1;
        for suffix in suffixes {
            let mut split: BTreeMap<Gap, Vec<u64>> = BTreeMap::new();
            for &layer in &missing {
                let gap = match outermost_absent(list, layer, suffix) {
                    Some(ancestor) => Gap::Absent(ancestor),
                    None => Gap::Incomplete,
                };
                split.entry(gap).or_default().push(layer);
            }
            for (gap, layers) in split {
                out.entry((prefix, gap, layers)).or_default().push(suffix);
            }
        }
    }
    out
}

/// The outermost module on `suffix`'s path of which `layer` holds nothing, or `None` when the
/// layer holds the module the tensor belongs to (so the tensor alone is missing).
fn outermost_absent<'s>(list: &[(u64, &str)], layer: u64, suffix: &'s str) -> Option<&'s str> {
    let holds = |module: &str| {
        let start = list.partition_point(|&(l, s)| (l, s) < (layer, module));
        list[start..]
            .iter()
            .take_while(|&&(l, s)| l == layer && s.starts_with(module))
            .any(|&(_, s)| s.as_bytes().get(module.len()) == Some(&b'.'))
    };
    let parent = suffix.rfind('.').map(|dot| &suffix[..dot])?;
    if holds(parent) {
        return None;
    }
    suffix
        .match_indices('.')
        .map(|(dot, _)| &suffix[..dot])
        .find(|module| !holds(module))
}

pub(super) fn spans(layers: &[u64]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut start = 0;
    for i in 1..=layers.len() {
        if i == layers.len() || layers[i] != layers[i - 1] + 1 {
            parts.push(if i - 1 == start {
                layers[start].to_string()
            } else {
                format!("{}-{}", layers[start], layers[i - 1])
            });
            start = i;
        }
    }
    if parts.len() > 10 {
        let more = parts.len() - 10;
        parts.truncate(10);
        parts.push(format!("and {more} more"));
    }
    parts.join(", ")
}

fn named(suffixes: &[&str]) -> String {
    crate::text::listed_in_backticks(suffixes, 8)
}

/// Whether a part the `missing` layers lack is a layout: the layers that have it are one run,
/// or too many lack it for a gap.
fn is_layout(all: &[u64], missing: &[u64]) -> bool {
    let present: Vec<u64> = all
        .iter()
        .copied()
        .filter(|layer| missing.binary_search(layer).is_err())
        .collect();
    let start = all.iter().position(|l| Some(l) == present.first());
    let contiguous = start.is_some_and(|start| all[start..start + present.len()] == present);
    contiguous || !tolerated(missing.len(), all.len())
}

fn gap_finding(prefix: &str, missing: &[u64], suffixes: &[&str], having: &[u64]) -> Finding {
    let escaped = escape(prefix);
    let message = match (missing, suffixes) {
        ([layer], [suffix]) => format!(
            "`{escaped}.{layer}.{}` is missing: the other layers of its kind have it ({})",
            escape(suffix),
            spans(having)
        ),
        ([layer], _) => format!(
            "{} tensors are missing from `{escaped}.{layer}` that the other layers of its kind \
             have ({}): {}",
            suffixes.len(),
            spans(having),
            named(suffixes)
        ),
        (_, _) => format!(
            "{} of `{escaped}.*` missing in layers {} (present in {}): {}",
            Counted(suffixes.len(), "tensor"),
            spans(missing),
            spans(having),
            named(suffixes)
        ),
    };
    Finding::warning(Code::LayerIncomplete, message)
}

/// Layers missing entirely: numbers skipped below the highest, when the config declares the
/// layers or the stack is a run of alike layers.
fn missing_layers(
    prefix: &str,
    all: &[u64],
    pattern: Option<&LayerPattern>,
    mixed: bool,
) -> Vec<Finding> {
    let Some(&last) = all.last() else {
        return Vec::new();
    };
    let skipped = (last + 1).saturating_sub(all.len() as u64);
    if skipped == 0
        || (pattern.is_none()
            && (mixed
                || all.len() < 3
                || !tolerated(usize::try_from(skipped).unwrap_or(usize::MAX), all.len())))
    {
        return Vec::new();
    }
    let mut gaps = Vec::new();
    let mut expected = 0;
    for &layer in all {
        if layer > expected {
            gaps.extend(expected..layer);
        }
        expected = layer + 1;
        if gaps.len() > 10 {
            break;
        }
    }
    let escaped = escape(prefix);
    gaps.iter()
        .take(10)
        .map(|layer| {
            Finding::warning(
                Code::LayerMissing,
                format!(
                    "layer {layer} is missing: no tensor is named `{escaped}.{layer}.*`, and \
                     the model has layers {}",
                    spans(all)
                ),
            )
        })
        .collect()
}

/// The tensors of a stack whose `property` differs from the most common value; of two, the
/// later one.
fn odd_siblings<'t, K: Ord + Display>(
    present: &[(u64, &'t TensorInfo)],
    property: impl Fn(&'t TensorInfo) -> K,
    what: &str,
) -> Vec<Finding> {
    let first = property(present[0].1);
    if present.iter().all(|(_, tensor)| property(tensor) == first) {
        return Vec::new();
    }
    let mut counts: BTreeMap<K, usize> = BTreeMap::new();
    for (_, tensor) in present {
        *counts.entry(property(tensor)).or_default() += 1;
    }
    if counts.len() < 2 {
        return Vec::new();
    }
    let usual_count = counts.values().copied().max().unwrap_or(0);
    // The most common value; of values as common, the first layer's.
    let usual = if counts[&first] == usual_count {
        first
    } else {
        let Some((usual, _)) = counts.into_iter().find(|&(_, count)| count == usual_count) else {
            return Vec::new();
        };
        usual
    };
    if !tolerated(present.len() - usual_count, present.len()) {
        return Vec::new();
    }
    let others = if usual_count == 1 {
        "the layer before".to_owned()
    } else {
        format!("the other {usual_count} layers")
    };
    present
        .iter()
        .filter(|(_, tensor)| property(tensor) != usual)
        .map(|(_, tensor)| {
            Finding::warning(
                Code::LayerMismatch,
                format!(
                    "{what} {} differs from {} in {others}",
                    escape(&property(tensor).to_string()),
                    escape(&usual.to_string())
                ),
            )
            .for_tensor(tensor.name.as_str())
        })
        .collect()
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::config::ModelConfig;
    use crate::format::Dtype;

    fn tensor(name: &str, dtype: Dtype, shape: &[u64]) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            dtype: dtype.into(),
            shape: shape.into(),
            data_offsets: [0, 0],
        }
    }

    fn model(layers: u64, skip: impl Fn(u64, &str) -> bool) -> Vec<TensorInfo> {
        let mut tensors = vec![tensor("model.embed_tokens.weight", Dtype::F16, &[32, 8])];
        for layer in 0..layers {
            for part in ["mlp.down_proj.weight", "self_attn.q_proj.weight"] {
                if !skip(layer, part) {
                    let name = format!("model.layers.{layer}.{part}");
                    tensors.push(tensor(&name, Dtype::F16, &[8, 8]));
                }
            }
        }
        tensors
    }

    fn messages(review: &LayerReview) -> Vec<(Code, &str)> {
        review
            .findings
            .iter()
            .map(|f| (f.code, f.message.as_str()))
            .collect()
    }

    fn pattern(json: serde_json::Value) -> LayerPattern {
        let config = ModelConfig::from_json(std::path::Path::new("config.json"), json);
        LayerPattern::from_config(&config).unwrap()
    }

    #[test]
    fn splits_names_at_the_layer_number() {
        assert_eq!(
            split_at_layer("model.layers.12.mlp.w"),
            Some(("model.layers", 12, "mlp.w"))
        );
        assert_eq!(split_at_layer("lm_head.weight"), None);
        assert_eq!(split_at_layer("layers.3"), None);
    }

    proptest::proptest! {
        /// The name split at its first part that is all digits, as the parts `split('.')` gives.
        #[test]
        fn splits_at_the_first_numeric_part(name in "[a1.]{0,12}|[a-c0-9.]{0,8}|x\\.99999999999999999999\\.y") {
            let mut start = 0;
            let mut expected = None;
            for part in name.split('.') {
                let end = start + part.len();
                if is_numeric_part(part) {
                    expected = part.parse().ok().and_then(|layer| {
                        let prefix = name[..start].strip_suffix('.')?;
                        let suffix = name.get(end + 1..).filter(|s| !s.is_empty())?;
                        Some((prefix, layer, suffix))
                    });
                    break;
                }
                start = end + 1;
            }
            proptest::prop_assert_eq!(split_at_layer(&name), expected);
        }
    }

    #[test]
    fn a_whole_model_has_no_findings() {
        assert!(
            layer_findings(&model(32, |_, _| false), &[], None)
                .findings
                .is_empty()
        );
    }

    #[test]
    fn names_the_tensor_missing_from_a_layer() {
        let tensors = model(32, |layer, part| layer == 17 && part.starts_with("mlp"));
        let review = layer_findings(&tensors, &[], None);
        assert_eq!(
            messages(&review),
            [(
                Code::LayerIncomplete,
                "`model.layers.17.mlp.down_proj.weight` is missing: the other layers of its \
                 kind have it (0-16, 18-31)"
            )]
        );
    }

    #[test]
    fn a_module_lacking_one_of_its_parameters_is_a_gap_even_in_two_layers() {
        let mut tensors = model(2, |_, _| false);
        tensors.push(tensor(
            "model.layers.0.self_attn.q_proj.bias",
            Dtype::F16,
            &[8],
        ));
        let review = layer_findings(&tensors, &[], None);
        assert_eq!(
            messages(&review),
            [(
                Code::LayerIncomplete,
                "`model.layers.1.self_attn.q_proj.bias` is missing: the other layers of its \
                 kind have it (0)"
            )]
        );
    }

    #[test]
    fn a_part_only_a_run_of_layers_has_is_a_layout_note() {
        let mut tensors = Vec::new();
        for stage in 0..4 {
            tensors.push(tensor(
                &format!("stages.{stage}.blocks.0.conv_dw.weight"),
                Dtype::F32,
                &[8, 1, 7, 7],
            ));
            if stage > 0 {
                for part in ["0.weight", "0.bias", "1.weight"] {
                    tensors.push(tensor(
                        &format!("stages.{stage}.downsample.{part}"),
                        Dtype::F32,
                        &[8],
                    ));
                }
            }
        }
        let review = layer_findings(&tensors, &[], None);
        assert_eq!(
            messages(&review),
            [(
                Code::LayerLayout,
                "`stages.*.downsample` is in layers 1-3 only, not in 0: a layout, not a gap"
            )]
        );
    }

    #[test]
    fn flags_the_odd_layer_but_not_a_hybrid_design() {
        let mut tensors = model(32, |_, _| false);
        tensors[5].shape = crate::format::Shape::from_slice(&[8, 9]);
        tensors[7].dtype = Dtype::F32.into();
        let review = layer_findings(&tensors, &[], None);
        let flagged: Vec<_> = review
            .findings
            .iter()
            .map(|f| {
                (
                    f.code,
                    f.tensor.as_deref().unwrap_or_default(),
                    f.message.as_str(),
                )
            })
            .collect();
        assert_eq!(
            flagged,
            [
                (
                    Code::LayerMismatch,
                    tensors[5].name.as_str(),
                    "shape [8, 9] differs from [8, 8] in the other 31 layers"
                ),
                (
                    Code::LayerMismatch,
                    tensors[7].name.as_str(),
                    "dtype F32 differs from F16 in the other 31 layers"
                ),
            ]
        );
        let hybrid = model(32, |layer, part| layer % 4 == 0 && part.starts_with("self"));
        let review = layer_findings(&hybrid, &[], None);
        assert!(
            review
                .findings
                .iter()
                .all(|f| f.severity == crate::finding::Severity::Info),
            "{:?}",
            review.findings
        );
    }

    #[test]
    fn a_layer_missing_entirely_is_named() {
        let tensors = model(8, |layer, _| layer == 3);
        assert_eq!(
            messages(&layer_findings(&tensors, &[], None)),
            [(
                Code::LayerMissing,
                "layer 3 is missing: no tensor is named `model.layers.3.*`, and the model has \
                 layers 0-2, 4-7"
            )]
        );
    }

    /// Layers 0-1 dense, 2-4 with 4 experts, as a DeepSeek-V3 config declares.
    fn mixed(skip: impl Fn(u64, &str) -> bool) -> Vec<TensorInfo> {
        let mut tensors = Vec::new();
        for layer in 0..5 {
            let mut parts = vec![
                "input_layernorm.weight".to_owned(),
                "self_attn.o_proj.weight".to_owned(),
            ];
            if layer < 2 {
                parts.push("mlp.down_proj.weight".into());
            } else {
                parts.extend((0..4).map(|e| format!("mlp.experts.{e}.down_proj.weight")));
                parts.push("mlp.gate.weight".into());
            }
            for part in parts {
                if !skip(layer, &part) {
                    tensors.push(tensor(
                        &format!("model.layers.{layer}.{part}"),
                        Dtype::F16,
                        &[8, 8],
                    ));
                }
            }
        }
        tensors
    }

    #[test]
    fn each_layer_is_checked_against_its_own_kind() {
        let deepseek = pattern(serde_json::json!({"model_type": "deepseek_v3",
            "num_hidden_layers": 5, "first_k_dense_replace": 2, "n_routed_experts": 4}));
        let review = layer_findings(&mixed(|_, _| false), std::slice::from_ref(&deepseek), None);
        assert!(review.findings.is_empty(), "{:?}", review.findings);
        assert_eq!(
            review.stacks,
            [Some(Stored {
                stack: "model.layers".into(),
                layers: 5
            })]
        );
        let review = layer_findings(
            &mixed(|layer, part| layer == 4 && part.starts_with("mlp.experts.2.")),
            std::slice::from_ref(&deepseek),
            None,
        );
        assert_eq!(
            messages(&review),
            [(
                Code::LayerIncomplete,
                "`model.layers.4.mlp.experts.2.down_proj.weight` is missing: the other layers \
                 of its kind have it (2-3)"
            )]
        );
        let review = layer_findings(
            &mixed(|layer, part| layer == 1 && part.starts_with("mlp")),
            std::slice::from_ref(&deepseek),
            None,
        );
        assert_eq!(
            messages(&review),
            [(
                Code::LayerIncomplete,
                "`model.layers.1.mlp.down_proj.weight` is missing: the other layers of its kind \
                 have it (0)"
            )]
        );
    }

    #[test]
    fn of_two_layers_of_a_kind_the_later_one_is_named_odd() {
        let llama = pattern(serde_json::json!({"model_type": "llama", "num_hidden_layers": 2}));
        let mut tensors = model(2, |_, _| false);
        tensors[3].shape = crate::format::Shape::from_slice(&[4, 8]);
        let review = layer_findings(&tensors, std::slice::from_ref(&llama), None);
        assert_eq!(
            messages(&review),
            [(
                Code::LayerMismatch,
                "shape [4, 8] differs from [8, 8] in the layer before"
            )]
        );
        assert_eq!(
            review.findings[0].tensor.as_deref(),
            Some(tensors[3].name.as_str())
        );
    }
}
