//! `stui cache`: the models of the local Hugging Face cache that stui can open.

use super::{Report, write_json};
use crate::format::index::ShardIndex;
use crate::source::hf_cache::{CacheDir, CachedRepo, CachedRevision, short};
use crate::text::{Counted, escape, escape_path, format_bytes};
use serde::Serialize;
use std::collections::HashSet;
use std::io::{self, Write};
use std::path::Path;

/// The cache's repositories holding safetensors, each revision's shards checked against its
/// indexes.
#[derive(Debug, Serialize)]
pub struct CacheListing {
    pub cache: String,
    /// The variable the cache folder came from (`HOME` for the default).
    pub from: &'static str,
    pub repos: Vec<RepoRow>,
}

#[derive(Debug, Serialize)]
pub struct RepoRow {
    pub repo: String,
    /// Bytes of the distinct blobs its snapshots link to.
    pub size: u64,
    pub revisions: Vec<RevisionRow>,
    /// `.incomplete` blobs: downloads unfinished or interrupted.
    pub incomplete: Vec<IncompleteBlob>,
}

#[derive(Debug, Serialize)]
pub struct IncompleteBlob {
    pub blob: String,
    pub bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct RevisionRow {
    pub commit: String,
    pub refs: Vec<String>,
    /// `.safetensors` files present.
    pub files: usize,
    pub size: u64,
    /// Shards the indexes name, when the snapshot has an index.
    pub shards_listed: Option<usize>,
    /// Files an index names that the snapshot does not hold, and files whose link is dangling.
    pub missing: Vec<String>,
    pub complete: bool,
}

impl CacheListing {
    pub fn new(cache: &CacheDir, repos: &[CachedRepo]) -> CacheListing {
        CacheListing {
            cache: cache.path.to_string_lossy().into_owned(),
            from: cache.from,
            repos: repos
                .iter()
                .map(|repo| RepoRow {
                    repo: repo.id.clone(),
                    size: repo.size,
                    revisions: repo.revisions.iter().map(revision_row).collect(),
                    incomplete: repo
                        .incomplete
                        .iter()
                        .map(|(blob, bytes)| IncompleteBlob {
                            blob: blob.clone(),
                            bytes: *bytes,
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

fn revision_row(revision: &CachedRevision) -> RevisionRow {
    let present: HashSet<&str> = revision.safetensors.iter().map(String::as_str).collect();
    let mut listed = HashSet::new();
    let mut missing = Vec::new();
    for index in &revision.indexes {
        let Ok(file) = std::fs::File::open(revision.folder.join(index)) else {
            missing.push(index.clone());
            continue;
        };
        let folder = Path::new(index)
            .parent()
            .map(|p| p.to_string_lossy().replace('\\', "/"))
            .unwrap_or_default();
        for shard in ShardIndex::read(file).shards {
            let in_snapshot = if folder.is_empty() {
                shard
            } else {
                format!("{folder}/{shard}")
            };
            if !present.contains(in_snapshot.as_str()) && !missing.contains(&in_snapshot) {
                missing.push(in_snapshot.clone());
            }
            listed.insert(in_snapshot);
        }
    }
    for dangling in &revision.dangling {
        if !missing.contains(dangling) {
            missing.push(dangling.clone());
        }
    }
    missing.sort();
    RevisionRow {
        commit: revision.commit.clone(),
        refs: revision.refs.clone(),
        files: revision.safetensors.len(),
        size: revision.size,
        shards_listed: (!revision.indexes.is_empty()).then_some(listed.len()),
        complete: missing.is_empty(),
        missing,
    }
}

impl Report for CacheListing {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        let from = if self.from == "HOME" {
            "the default"
        } else {
            self.from
        };
        writeln!(
            out,
            "Hugging Face cache: {} (from {from})",
            escape_path(Path::new(&self.cache))
        )?;
        if self.repos.is_empty() {
            return writeln!(out, "no model holding safetensors files");
        }
        for repo in &self.repos {
            writeln!(out)?;
            writeln!(out, "{}  {}", escape(&repo.repo), format_bytes(repo.size))?;
            for revision in &repo.revisions {
                let refs = if revision.refs.is_empty() {
                    "(no ref)".to_owned()
                } else {
                    escape(&revision.refs.join(", ")).into_owned()
                };
                let files = match revision.shards_listed {
                    Some(listed) => format!(
                        "{} of {listed} shards",
                        listed.saturating_sub(revision.missing.len())
                    ),
                    None => Counted(revision.files, "file").to_string(),
                };
                let state = if revision.complete {
                    "complete".to_owned()
                } else {
                    let names: Vec<_> =
                        revision.missing.iter().take(3).map(|m| escape(m)).collect();
                    let more = if revision.missing.len() > 3 {
                        ", …"
                    } else {
                        ""
                    };
                    format!("INCOMPLETE (missing {}{more})", names.join(", "))
                };
                writeln!(
                    out,
                    "  {}  {refs}  {files}, {}  {state}",
                    short(&revision.commit),
                    format_bytes(revision.size)
                )?;
            }
            if !repo.incomplete.is_empty() {
                let held: u64 = repo.incomplete.iter().map(|b| b.bytes).sum();
                writeln!(
                    out,
                    "  {} in blobs/ ({} so far)",
                    Counted(repo.incomplete.len(), "unfinished download"),
                    format_bytes(held)
                )?;
            }
        }
        Ok(())
    }

    fn write_json(&self, out: &mut dyn Write) -> io::Result<()> {
        write_json(out, self)
    }
}
