//! The index of a sharded model (`model.safetensors.index.json`, the Hugging Face layout).

use super::scanner::Scanner;
use super::string_map::{StringMapBuilder, StringPairs};
use crate::finding::{Code, Finding, Findings};
use crate::text::{Counted, escape};
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
    /// Tensor name to shard file name, each name once (the last shard given for a name given
    /// twice); in the order written unless a name is given twice.
    pub weight_map: StringPairs,
    /// Shard file names in the order they first appear, each checked to stay inside the folder.
    pub shards: Vec<String>,
    pub findings: Findings,
}

#[derive(Deserialize)]
struct IndexJson {
    #[serde(default)]
    metadata: Option<IndexMetadata>,
    weight_map: StringPairs,
}

/// Shard files an index may name; an index naming more is refused past them (every shard is
/// opened, and a real model has at most a few thousand).
pub const MAX_SHARDS: usize = 100_000;

#[derive(Deserialize)]
struct IndexMetadata {
    #[serde(default)]
    total_size: Option<serde_json::Value>,
}

/// Whether a JSON file named `name` holding `bytes` sits beside a model rather than indexing it
/// (its `config.json`, a tokenizer's, a pipeline's `model_index.json`): an object with no
/// `weight_map`, in a file whose name is not an index's. Anything else given as an index is read
/// as one, a malformed one for its finding.
pub fn is_beside_a_model(name: &str, bytes: &[u8]) -> bool {
    !is_named_as_an_index(name)
        && serde_json::from_slice::<serde_json::Value>(bytes)
            .is_ok_and(|json| json.is_object() && json.get("weight_map").is_none())
}

/// Whether `name` is that of a shard index (`model.safetensors.index.json`, a variant's
/// `model.safetensors.index.fp16.json`).
pub fn is_named_as_an_index(name: &str) -> bool {
    name.contains(".index.")
}

/// What is said of `file`, a JSON file [`is_beside_a_model`], and the folder to open instead.
pub fn beside_a_model(file: &str, folder: &str) -> String {
    format!(
        "{file}: not a .safetensors file or a sharded model's index (it holds no `weight_map`): \
         open the folder of the model it belongs to, stui {folder}"
    )
}

impl ShardIndex {
    /// Parses an index's text. A malformed index is a finding, and yields no shards.
    pub fn parse(text: &str) -> ShardIndex {
        ShardIndex::from_slice(text.as_bytes())
    }

    /// Parses an index held in memory (several times faster than through a reader): in the
    /// canonical form writers produce by [`canonical`], anything else by `serde_json`.
    pub fn from_slice(bytes: &[u8]) -> ShardIndex {
        ShardIndex::from_slice_naming(bytes, &mut |_| ())
    }

    /// [`ShardIndex::from_slice`], telling `named` each shard file that stays inside the folder
    /// the first time the index names it, as it reads the index in the canonical form (so that
    /// the shards can be opened meanwhile). A shard told of is not necessarily one of
    /// [`ShardIndex::shards`]: the index may turn out to be in another form, or to name a
    /// tensor twice.
    pub fn from_slice_naming(bytes: &[u8], named: &mut dyn FnMut(&str)) -> ShardIndex {
        // More shards than a real model has (a few thousand) are opened after the index is
        // read, once it is known which of them are opened at all (a hostile index may name far
        // more than [`MAX_SHARDS`], and which are kept depends on the whole index).
        const TOLD_AT_MOST: usize = 4096;
        let mut told = HashSet::new();
        let mut tell = |shard: &str| {
            if told.len() < TOLD_AT_MOST
                && stays_inside(Path::new(shard))
                && told.insert(shard.to_owned())
            {
                named(shard);
            }
        };
        match canonical(bytes, &mut tell) {
            Some(json) => ShardIndex::from_json(Ok(json)),
            None => ShardIndex::from_json(serde_json::from_slice(bytes)),
        }
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
        let (mut shards, mut refused, mut past_limit) = named_shards(json.weight_map.values());
        if past_limit > 0 {
            // Which shards are opened depends on the order of the names: theirs.
            let mut by_name: Vec<(&str, &str)> = json.weight_map.iter().collect();
            by_name.sort_unstable_by(|a, b| a.0.cmp(b.0));
            (shards, refused, past_limit) = named_shards(by_name.into_iter().map(|(_, s)| s));
        }
        index.shards = shards;
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
                        "the index maps {} to `{}`, a path outside the index's folder; \
                         refused (not opened)",
                        Counted(count, "tensor"),
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

/// The shard files `shards` names, in the order they are first named: the first [`MAX_SHARDS`]
/// that stay inside the folder; those that do not, with how many entries name each; how many
/// more there are past the limit.
fn named_shards<'a>(
    shards: impl Iterator<Item = &'a str>,
) -> (Vec<String>, BTreeMap<&'a str, usize>, usize) {
    let (mut kept, mut refused, mut past_limit) = (Vec::new(), BTreeMap::new(), 0);
    let mut seen = HashSet::new();
    let mut previous = None;
    for shard in shards {
        // The names of one shard mostly follow each other: a repeat is seen at once.
        if previous != Some(shard) && seen.insert(shard) {
            if !stays_inside(Path::new(shard)) {
                refused.insert(shard, 1);
            } else if kept.len() < MAX_SHARDS {
                kept.push(shard.to_owned());
            } else {
                past_limit += 1;
            }
        } else if let Some(count) = refused.get_mut(shard) {
            *count += 1;
        }
        previous = Some(shard);
    }
    (kept, refused, past_limit)
}

/// An index in the canonical form writers produce: `metadata` (whose `total_size`, if any, is a
/// plain integer and whose other members are plain integers or strings) and `weight_map`, each
/// once and nothing else, every string without escapes or control characters. `None` for
/// anything else, which `serde_json` then reads, and judges.
fn canonical(bytes: &[u8], named: &mut dyn FnMut(&str)) -> Option<IndexJson> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut scanner = Scanner::at(text, 0);
    scanner.skip_whitespace();
    scanner.expect(b'{')?;
    let (mut metadata, mut weight_map) = (None, None);
    loop {
        scanner.skip_whitespace();
        let key = scanner.string()?;
        scanner.skip_whitespace();
        scanner.expect(b':')?;
        scanner.skip_whitespace();
        match key {
            "metadata" if metadata.is_none() => metadata = Some(canonical_metadata(&mut scanner)?),
            "weight_map" if weight_map.is_none() => {
                weight_map = Some(canonical_weight_map(&mut scanner, text.len(), named)?);
            }
            _ => return None,
        }
        scanner.skip_whitespace();
        if scanner.eat(b'}') {
            break;
        }
        scanner.expect(b',')?;
    }
    scanner.skip_whitespace();
    if scanner.at != text.len() {
        return None;
    }
    Some(IndexJson {
        metadata,
        weight_map: weight_map?,
    })
}

fn canonical_metadata(scanner: &mut Scanner<'_>) -> Option<IndexMetadata> {
    let mut total_size = None;
    scanner.expect(b'{')?;
    scanner.skip_whitespace();
    if !scanner.eat(b'}') {
        loop {
            let key = scanner.string()?;
            scanner.skip_whitespace();
            scanner.expect(b':')?;
            scanner.skip_whitespace();
            if key == "total_size" {
                if total_size.is_some() {
                    return None;
                }
                total_size = Some(serde_json::Value::from(scanner.integer()?));
            } else if scanner.peek() == Some(b'"') {
                scanner.string()?;
            } else {
                scanner.integer()?;
            }
            scanner.skip_whitespace();
            if scanner.eat(b'}') {
                break;
            }
            scanner.expect(b',')?;
            scanner.skip_whitespace();
        }
    }
    Some(IndexMetadata { total_size })
}

/// `weight_map`'s object, out of an index of `text_len` bytes; `named` is told each shard
/// that is not the one of the entry before.
fn canonical_weight_map(
    scanner: &mut Scanner<'_>,
    text_len: usize,
    named: &mut dyn FnMut(&str),
) -> Option<StringPairs> {
    let mut previous = "";
    // An entry takes at least 8 bytes of text besides its strings (`"":"",\n`), most over 60.
    let mut map = StringMapBuilder::with_capacity(text_len, text_len / 64);
    scanner.expect(b'{')?;
    scanner.skip_whitespace();
    if !scanner.eat(b'}') {
        loop {
            let name = scanner.string()?;
            scanner.skip_whitespace();
            scanner.expect(b':')?;
            scanner.skip_whitespace();
            // Most entries name the shard of the entry before: its text is compared in place.
            let shard = if scanner.quoted(previous).is_some() {
                previous
            } else {
                let shard = scanner.string()?;
                named(shard);
                shard
            };
            previous = shard;
            map.insert(name, shard);
            scanner.skip_whitespace();
            if scanner.eat(b'}') {
                break;
            }
            scanner.expect(b',')?;
            scanner.skip_whitespace();
        }
    }
    Some(map.finish_unsorted())
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

    /// The index as `serde_json` alone reads it.
    fn through_serde(text: &str) -> ShardIndex {
        ShardIndex::from_json(serde_json::from_str(text))
    }

    fn same(a: &ShardIndex, b: &ShardIndex) -> bool {
        a.total_size == b.total_size
            && a.shards == b.shards
            && a.findings == b.findings
            && a.weight_map.iter().eq(b.weight_map.iter())
    }

    #[test]
    fn the_canonical_form_is_read_as_serde_json_reads_it() {
        for text in [
            "{\n  \"metadata\": {\n    \"total_size\": 24\n  },\n  \"weight_map\": {\n    \"b\": \"s2\",\n    \"a\": \"s1\"\n  }\n}\n",
            r#"{"weight_map":{},"metadata":{"format":"pt","total_parameters":12}}"#,
            r#"{"metadata":{},"weight_map":{"a":"../x","b":"s","c":"../x"}}"#,
            r#"{"weight_map":{"b":"s1","a":"s2","b":"s3"}}"#,
            r#" { "weight_map" : { "é" : "s" } } "#,
        ] {
            let json = canonical(text.as_bytes(), &mut |_| ()).expect(text);
            assert!(
                same(&ShardIndex::from_json(Ok(json)), &through_serde(text)),
                "{text}"
            );
        }
    }

    #[test]
    fn a_name_given_twice_keeps_its_last_shard() {
        let index = ShardIndex::parse(r#"{"weight_map":{"b":"s1","a":"s2","b":"s3"}}"#);
        assert!(index.weight_map.iter().eq([("a", "s2"), ("b", "s3")]));
        assert_eq!(index.shards, ["s2", "s3"]);
        let in_order = ShardIndex::parse(r#"{"weight_map":{"b":"s1","a":"s2"}}"#);
        assert!(in_order.weight_map.iter().eq([("b", "s1"), ("a", "s2")]));
    }

    #[test]
    fn anything_else_is_left_to_serde_json() {
        for text in [
            r#"{"weight_map":{"\u0061":"s"}}"#,
            r#"{"weight_map":{"a":"s"},"weight_map":{}}"#,
            r#"{"weight_map":{"a":"s"},"other":1}"#,
            r#"{"metadata":{"total_size":1.5e3},"weight_map":{}}"#,
            r#"{"metadata":{"total_size":"24"},"weight_map":{}}"#,
            r#"{"metadata":{"total_size":1,"total_size":2},"weight_map":{}}"#,
            r#"{"metadata":null,"weight_map":{}}"#,
            r#"{"metadata":{"n":[1]},"weight_map":{}}"#,
            r#"{"weight_map":{"a":1}}"#,
            r#"{"weight_map":{"a":"s"}} x"#,
            r#"{"metadata":{}}"#,
            "{\"weight_map\":{\"a\t\":\"s\"}}",
            "{}",
            "",
        ] {
            assert!(canonical(text.as_bytes(), &mut |_| ()).is_none(), "{text}");
        }
        assert!(canonical(b"{\"weight_map\":{\"\xff\":\"s\"}}", &mut |_| ()).is_none());
        let serde_says = through_serde(r#"{"metadata":{"total_size":"24"},"weight_map":{}}"#);
        assert_eq!(serde_says.findings[0].code, Code::IndexInvalid);
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
