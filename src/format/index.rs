//! The index of a sharded model (`model.safetensors.index.json`, the Hugging Face layout).

use super::StringMap;
use crate::finding::{Code, Finding, Findings};
use crate::text::escape;
use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};
use std::io;
use std::path::{Component, Path};

/// The conventional index file name.
pub const INDEX_FILE_NAME: &str = "model.safetensors.index.json";

/// An index as read: which shard holds each tensor.
#[derive(Debug, Default)]
pub struct ShardIndex {
    /// `metadata.total_size`: the bytes of every tensor, summed.
    pub total_size: Option<u64>,
    /// Tensor name to shard file name, as written.
    pub weight_map: StringMap,
    /// Shard file names in the order they first appear, each checked to stay inside the folder.
    pub shards: Vec<String>,
    pub findings: Findings,
}

#[derive(Deserialize)]
struct IndexJson {
    #[serde(default)]
    metadata: Option<IndexMetadata>,
    weight_map: StringMap,
}

/// Shard files an index may name; an index naming more is refused past them (every shard is
/// opened, and a real model has at most a few thousand).
pub const MAX_SHARDS: usize = 100_000;

#[derive(Deserialize)]
struct IndexMetadata {
    #[serde(default)]
    total_size: Option<serde_json::Value>,
}

impl ShardIndex {
    /// Parses an index's text. A malformed index is a finding, and yields no shards.
    pub fn parse(text: &str) -> ShardIndex {
        ShardIndex::from_slice(text.as_bytes())
    }

    /// Parses an index held in memory (several times faster than through a reader).
    pub fn from_slice(bytes: &[u8]) -> ShardIndex {
        ShardIndex::from_json(serde_json::from_slice(bytes))
    }

    /// Reads an index from `reader` as it parses it: the entries are kept, not the text.
    pub fn read(reader: impl io::Read) -> ShardIndex {
        ShardIndex::from_json(serde_json::from_reader(io::BufReader::new(reader)))
    }

    fn from_json(json: serde_json::Result<IndexJson>) -> ShardIndex {
        let json = match json {
            Ok(json) => json,
            Err(error) => {
                return ShardIndex {
                    findings: Findings::from_iter([Finding::error(
                        Code::IndexInvalid,
                        format!(
                            "the index is not a sharded-model index (an object with a weight_map of \
                             tensor names to shard files): {error}"
                        ),
                    )]),
                    ..ShardIndex::default()
                };
            }
        };
        let mut index = ShardIndex::default();
        if let Some(value) = json.metadata.and_then(|m| m.total_size) {
            match value.as_u64().or_else(|| whole_number(value.as_f64()?)) {
                Some(size) => index.total_size = Some(size),
                None => index.findings.push(Finding::warning(
                    Code::IndexInvalid,
                    format!("metadata.total_size is {value}, not a byte count"),
                )),
            }
        }
        let mut refused = BTreeMap::<&str, usize>::new();
        let mut seen = HashSet::new();
        let mut past_limit = 0;
        for shard in json.weight_map.values() {
            if !seen.insert(shard) {
                if let Some(count) = refused.get_mut(shard) {
                    *count += 1;
                }
                continue;
            }
            if !stays_inside(Path::new(shard)) {
                refused.insert(shard, 1);
            } else if index.shards.len() < MAX_SHARDS {
                index.shards.push(shard.to_owned());
            } else {
                past_limit += 1;
            }
        }
        drop(seen);
        if past_limit > 0 {
            index.findings.push(Finding::error(
                Code::IndexInvalid,
                format!(
                    "the index names {} shard files; at most {MAX_SHARDS} are opened, the other \
                     {past_limit} are not",
                    MAX_SHARDS + past_limit
                ),
            ));
        }
        for (shard, count) in refused {
            index.findings.push(
                Finding::error(
                    Code::IndexPathEscapes,
                    format!(
                        "the index maps {count} tensor(s) to `{}`, a path outside the index's folder; \
                         refused (not opened)",
                        escape(shard)
                    ),
                )
                .in_file(shard),
            );
        }
        index.weight_map = json.weight_map;
        index.shards.sort_by(|a, b| crate::text::natural_cmp(a, b));
        index
    }
}

fn whole_number(value: f64) -> Option<u64> {
    let in_range = value.fract() == 0.0 && (0.0..1.8e19).contains(&value);
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "checked to be a whole number in range just above"
    )]
    in_range.then_some(value as u64)
}

/// A relative path of plain names only: no root, drive, `..` or empty name.
fn stays_inside(path: &Path) -> bool {
    !path.as_os_str().is_empty()
        && path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        && path.components().any(|c| matches!(c, Component::Normal(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_hugging_face_layout() {
        let index = ShardIndex::parse(
            r#"{"metadata":{"total_size":24},"weight_map":{"a":"model-00002-of-00002.safetensors",
                "b":"model-00001-of-00002.safetensors","c":"model-00001-of-00002.safetensors"}}"#,
        );
        assert!(index.findings.is_empty());
        assert_eq!(index.total_size, Some(24));
        assert_eq!(
            index.shards,
            [
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"
            ]
        );
    }

    #[test]
    fn refuses_paths_that_leave_the_folder() {
        let index = ShardIndex::parse(
            r#"{"weight_map":{"a":"../secret.safetensors","b":"/etc/passwd","c":"sub/ok.safetensors","d":""}}"#,
        );
        assert_eq!(index.shards, ["sub/ok.safetensors"]);
        let refused: Vec<_> = index
            .findings
            .iter()
            .filter(|f| f.code == Code::IndexPathEscapes)
            .collect();
        assert_eq!(refused.len(), 3);
    }

    #[test]
    fn a_malformed_index_is_a_finding() {
        let index = ShardIndex::parse(r#"{"metadata":{}}"#);
        assert_eq!(index.findings[0].code, Code::IndexInvalid);
        assert!(index.shards.is_empty());
    }

    #[test]
    fn opens_at_most_max_shards() {
        let entries: Vec<String> = (0..=MAX_SHARDS)
            .map(|i| format!(r#""t{i}":"s{i}.safetensors""#))
            .collect();
        let index = ShardIndex::parse(&format!(r#"{{"weight_map":{{{}}}}}"#, entries.join(",")));
        assert_eq!(index.shards.len(), MAX_SHARDS);
        assert_eq!(index.weight_map.len(), MAX_SHARDS + 1);
        assert_eq!(index.findings.len(), 1);
        assert!(index.findings[0].message.contains("the other 1 are not"));
    }
}
