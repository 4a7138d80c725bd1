//! Layer completeness and consistency, from names, shapes and dtypes alone: a tensor missing from
//! a few layers, or one layer's tensor shaped or typed unlike its siblings.

use super::TensorInfo;
use crate::finding::{Code, Finding, Findings};
use crate::text::{Shape, escape, is_numeric_part, natural_cmp};
use foldhash::HashMap;
use std::collections::BTreeMap;
use std::fmt::Display;

/// A tensor is flagged as missing or odd only when at most this share of the layers differ:
/// more than that is a model whose layers differ by design (hybrid or pruned architectures).
const ODD_SHARE: usize = 10;

/// A name split at its first numeric part: `model.layers.12.mlp.w` is `model.layers`, 12,
/// `mlp.w`.
pub fn split_at_layer(name: &str) -> Option<(&str, u64, &str)> {
    let mut start = 0;
    for part in name.split('.') {
        let end = start + part.len();
        if is_numeric_part(part) {
            let layer = part.parse().ok()?;
            let prefix = name[..start].strip_suffix('.')?;
            let suffix = name.get(end + 1..).filter(|s| !s.is_empty())?;
            return Some((prefix, layer, suffix));
        }
        start = end + 1;
    }
    None
}

fn tolerated(odd: usize, layers: usize) -> bool {
    odd <= (layers / ODD_SHARE).max(1)
}

/// Findings for tensors missing from some layers, and for a layer's tensor whose shape or dtype
/// differs from the same tensor in the other layers.
pub fn layer_findings<'a>(tensors: impl IntoIterator<Item = &'a TensorInfo>) -> Findings {
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
    for (&(prefix, _), present) in &stacks {
        layers
            .entry(prefix)
            .or_default()
            .extend(present.iter().map(|&(layer, _)| layer));
    }
    for numbers in layers.values_mut() {
        numbers.sort_unstable();
        numbers.dedup();
        numbers.shrink_to_fit();
    }
    let mut stacks: Vec<_> = stacks.into_iter().collect();
    stacks.sort_unstable_by(|((p1, s1), _), ((p2, s2), _)| {
        natural_cmp(p1, p2).then_with(|| natural_cmp(s1, s2))
    });
    // (prefix, missing layers) -> suffixes missing from exactly those layers
    let mut gaps: BTreeMap<(&str, Vec<u64>), Vec<&str>> = BTreeMap::new();
    let mut findings = Findings::new();
    for ((prefix, suffix), mut present) in stacks {
        let all = &layers[prefix];
        if all.len() < 3 {
            continue;
        }
        present.sort_unstable_by_key(|&(layer, _)| layer);
        present.dedup_by_key(|&mut (layer, _)| layer);
        // Listed only when few are missing, which keeps the work linear: a stack missing from
        // few layers holds most of them.
        let missing_count = all.len() - present.len();
        if missing_count > 0 && tolerated(missing_count, all.len()) {
            let missing: Vec<u64> = all
                .iter()
                .copied()
                .filter(|layer| present.binary_search_by_key(layer, |&(l, _)| l).is_err())
                .collect();
            gaps.entry((prefix, missing)).or_default().push(suffix);
        }
        if present.len() >= 3 {
            findings.extend(odd_siblings(&present, |t| Shape(&t.shape), "shape"));
            findings.extend(odd_siblings(&present, |t| t.dtype.name(), "dtype"));
        }
    }
    for ((prefix, missing), suffixes) in gaps {
        let total = layers[prefix].len();
        let in_layers = total - missing.len();
        let list: Vec<String> = missing.iter().map(u64::to_string).collect();
        let where_missing = format!(
            "in {in_layers} of {total} layers (missing in layer {})",
            list.join(", ")
        );
        let prefix = escape(prefix);
        let message = if let [suffix] = suffixes.as_slice() {
            format!("`{prefix}.*.{}` is {where_missing}", escape(suffix))
        } else {
            let shown: Vec<String> = suffixes
                .iter()
                .take(3)
                .map(|suffix| format!("`{}`", escape(suffix)))
                .collect();
            let more = match suffixes.len() - shown.len() {
                0 => String::new(),
                more => format!(" and {more} more"),
            };
            format!(
                "{} tensors of `{prefix}.*` are {where_missing}: {}{more}",
                suffixes.len(),
                shown.join(", ")
            )
        };
        findings.push(Finding::warning(Code::LayerIncomplete, message));
    }
    findings
}

/// The tensors of a stack whose `property` differs from the most common value.
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
    let Some((usual, &usual_count)) = counts.iter().max_by_key(|&(_, count)| *count) else {
        return Vec::new();
    };
    if !tolerated(present.len() - usual_count, present.len()) {
        return Vec::new();
    }
    present
        .iter()
        .filter(|(_, tensor)| property(tensor) != *usual)
        .map(|(_, tensor)| {
            Finding::warning(
                Code::LayerMismatch,
                format!(
                    "{what} {} differs from {} in the other {usual_count} layers",
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

    #[test]
    fn splits_names_at_the_layer_number() {
        assert_eq!(
            split_at_layer("model.layers.12.mlp.w"),
            Some(("model.layers", 12, "mlp.w"))
        );
        assert_eq!(split_at_layer("lm_head.weight"), None);
        assert_eq!(split_at_layer("layers.3"), None);
    }

    #[test]
    fn a_whole_model_has_no_findings() {
        assert!(layer_findings(&model(32, |_, _| false)).is_empty());
    }

    #[test]
    fn names_the_layer_a_tensor_is_missing_from() {
        let tensors = model(32, |layer, part| layer == 17 && part.starts_with("mlp"));
        let findings = layer_findings(&tensors);
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert_eq!(findings[0].code, Code::LayerIncomplete);
        assert_eq!(
            findings[0].message,
            "`model.layers.*.mlp.down_proj.weight` is in 31 of 32 layers (missing in layer 17)"
        );
    }

    #[test]
    fn flags_the_odd_layer_but_not_a_hybrid_design() {
        let mut tensors = model(32, |_, _| false);
        tensors[5].shape = crate::format::Shape::from_slice(&[8, 9]);
        tensors[7].dtype = Dtype::F32.into();
        let findings = layer_findings(&tensors);
        let flagged: Vec<_> = findings
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
        assert!(layer_findings(&hybrid).is_empty());
    }

    #[test]
    fn one_finding_for_a_layer_missing_many_tensors() {
        let tensors = model(8, |layer, _| layer == 7);
        let cut = layer_findings(&tensors[..tensors.len() - 1]);
        let messages: Vec<_> = cut.iter().map(|f| f.message.as_str()).collect();
        assert_eq!(
            messages,
            ["`model.layers.*.self_attn.q_proj.weight` is in 6 of 7 layers (missing in layer 6)"]
        );
        let mut tensors = model(8, |_, _| false);
        tensors.retain(|t| !t.name.starts_with("model.layers.3."));
        tensors.push(tensor(
            "model.layers.3.mlp.up_proj.weight",
            Dtype::F16,
            &[8, 8],
        ));
        let messages: Vec<_> = layer_findings(&tensors)
            .into_iter()
            .map(|f| f.message)
            .collect();
        assert_eq!(
            messages,
            [
                "2 tensors of `model.layers.*` are in 7 of 8 layers (missing in layer 3): \
                 `mlp.down_proj.weight`, `self_attn.q_proj.weight`"
            ],
            "a tensor only one layer has is a design, not a gap"
        );
    }
}
