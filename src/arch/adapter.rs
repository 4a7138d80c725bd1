//! A PEFT `LoRA` adapter's tensors: its A/B pairs, each A with its B, of the rank the adapter's
//! config gives.

use super::config::Adapter;
use crate::finding::{Code, Finding};
use crate::format::TensorInfo;
use crate::text::escape;

/// `...q_proj.lora_A.weight` -> (`...q_proj`, A); `lora_B` -> B.
fn split(name: &str) -> Option<(&str, bool, &str)> {
    for (marker, is_a) in [(".lora_A.", true), (".lora_B.", false)] {
        if let Some(at) = name.find(marker) {
            return Some((&name[..at], is_a, &name[at + marker.len()..]));
        }
    }
    None
}

/// The number of modules with a `lora_A` tensor.
pub fn pairs<'a>(tensors: impl Iterator<Item = &'a TensorInfo>) -> u64 {
    tensors
        .filter(|t| split(&t.name).is_some_and(|(_, is_a, _)| is_a))
        .count() as u64
}

/// An A without its B (or a B without its A), and a pair whose inner size is not the rank.
pub fn check<'a>(
    adapter: &Adapter,
    tensors: impl Iterator<Item = &'a TensorInfo>,
    label: &str,
) -> Vec<Finding> {
    // (module, rest, is_a) for every A and B: a few per target module.
    let mut halves: Vec<(&str, &str, bool, &TensorInfo)> = tensors
        .filter_map(|t| {
            let (module, is_a, rest) = split(&t.name)?;
            Some((module, rest, is_a, t))
        })
        .collect();
    halves.sort_unstable_by(|a, b| (a.0, a.1, !a.2).cmp(&(b.0, b.1, !b.2)));
    let mut findings = Vec::new();
    let mut i = 0;
    while i < halves.len() {
        let (module, rest, is_a, tensor) = halves[i];
        let partner = halves
            .get(i + 1)
            .filter(|&&(m, r, a, _)| m == module && r == rest && a != is_a);
        let Some(&(_, _, _, other)) = partner else {
            let (have, lack) = if is_a {
                ("lora_A", "lora_B")
            } else {
                ("lora_B", "lora_A")
            };
            findings.push(
                Finding::warning(
                    Code::TensorMissing,
                    format!(
                        "`{}.{lack}.{}` is missing: its `{have}` has no partner",
                        escape(module),
                        escape(rest)
                    ),
                )
                .for_tensor(tensor.name.as_str()),
            );
            i += 1;
            continue;
        };
        // A is [rank, in], B is [out, rank].
        let rank_a = tensor.shape.get(0);
        let rank_b = other.shape.get(1);
        if let Some(rank) = adapter.rank
            && rest == "weight"
        {
            for (rank_found, t) in [(rank_a, tensor), (rank_b, other)] {
                if let Some(found) = rank_found
                    && found != rank
                {
                    findings.push(
                        Finding::warning(
                            Code::ConfigMismatch,
                            format!(
                                "`r` is {rank} in the adapter config, {found} in `{}`",
                                escape(&t.name)
                            ),
                        )
                        .in_file(label),
                    );
                }
            }
        }
        i += 2;
    }
    findings
}
