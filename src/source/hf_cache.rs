//! The local Hugging Face cache, read as `huggingface_hub` lays it out and never written:
//! `models--ORG--NAME/{blobs,refs,snapshots}`, a revision read from `refs/` unless it is a
//! commit, the snapshot's links followed into `blobs/`.

use super::{Environment, RepoRef, expand_home};
use crate::text::{Counted, escape, escape_path, format_bytes};
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

/// The cache folder and the variable it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheDir {
    pub path: PathBuf,
    /// `HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`, `HF_HOME`, `XDG_CACHE_HOME` or `HOME`.
    pub from: &'static str,
}

impl CacheDir {
    /// Where `huggingface_hub` keeps its cache, in its order of precedence; `None` only when no
    /// variable is set, not even `HOME`.
    pub fn find(env: &dyn Environment) -> Option<CacheDir> {
        let at = |from, path: PathBuf| {
            Some(CacheDir {
                path: expand_home(&path, env).into_owned(),
                from,
            })
        };
        for name in ["HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"] {
            if let Some(value) = env.var(name) {
                return at(name, value.into());
            }
        }
        if let Some(home) = env.var("HF_HOME") {
            return at("HF_HOME", PathBuf::from(home).join("hub"));
        }
        if let Some(cache) = env.var("XDG_CACHE_HOME") {
            return at(
                "XDG_CACHE_HOME",
                PathBuf::from(cache).join("huggingface/hub"),
            );
        }
        let home = env.var("HOME")?;
        at("HOME", PathBuf::from(home).join(".cache/huggingface/hub"))
    }

    /// The folder of a model repository: `models--ORG--NAME`.
    pub fn repo_folder(&self, id: &str) -> PathBuf {
        self.path.join(format!("models--{}", id.replace('/', "--")))
    }
}

impl fmt::Display for CacheDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = match self.from {
            "HOME" => "the default",
            variable => variable,
        };
        write!(f, "{} (from {how})", escape_path(&self.path))
    }
}

/// Why a repository could not be found in the cache; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error(
        "`{repo}` is not in the Hugging Face cache at {cache}: download it with `hf download {repo}`, \
         or set HF_HUB_CACHE to the cache that holds it"
    )]
    NotCached { repo: String, cache: CacheDir },
    #[error(
        "`{repo}` has no revision `{}` in the cache at {}; {}. Download it with \
         `hf download {repo} --revision {}`",
        escape(.revision), escape_path(.folder), known_revisions(.refs, .snapshots), escape(.revision)
    )]
    UnknownRevision {
        repo: String,
        revision: String,
        folder: PathBuf,
        refs: Vec<(String, String)>,
        snapshots: Vec<String>,
    },
    #[error(
        "`{repo}`: {} holds `{}`, not a 40-hex commit: the cache is damaged; download the revision again \
         with `hf download {repo} --revision {}`",
        escape_path(.file), escape(.content), escape(.revision)
    )]
    BadRef {
        repo: String,
        revision: String,
        file: PathBuf,
        content: String,
    },
    #[error(
        "`{repo}` revision `{}` is commit {commit}, which has no snapshot in the cache ({} is missing): \
         download it with `hf download {repo} --revision {commit}`",
        escape(.revision), escape_path(.folder)
    )]
    NoSnapshot {
        repo: String,
        revision: String,
        commit: String,
        folder: PathBuf,
    },
    #[error(
        "`{}` is not in the cached snapshot of `{repo}` at commit {commit} ({}): check the path, or \
         download it with `hf download {repo} {} --revision {commit}`",
        escape(.path), escape_path(.folder), escape(.path)
    )]
    PathMissing {
        repo: String,
        path: String,
        commit: String,
        folder: PathBuf,
    },
}

fn known_revisions(refs: &[(String, String)], snapshots: &[String]) -> String {
    if refs.is_empty() && snapshots.is_empty() {
        return "it has no refs and no snapshots".into();
    }
    let mut parts = Vec::new();
    if !refs.is_empty() {
        let list: Vec<String> = refs
            .iter()
            .map(|(name, commit)| format!("{} → {}", escape(name), short(commit)))
            .collect();
        parts.push(format!("its refs: {}", list.join(", ")));
    }
    if !snapshots.is_empty() {
        let list: Vec<&str> = snapshots.iter().map(|c| short(c)).collect();
        parts.push(format!("its snapshots: {}", list.join(", ")));
    }
    parts.join("; ")
}

/// The first 12 hex digits of a commit, as listings show it.
pub fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}

/// Whether `text` is a full commit hash as the Hub writes it: 40 lower-case hex digits.
pub fn is_commit(text: &str) -> bool {
    text.len() == 40 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A repository's revision found in the cache.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub repo: RepoRef,
    /// `models--ORG--NAME`.
    pub repo_folder: PathBuf,
    pub commit: String,
    /// `snapshots/<commit>`.
    pub folder: PathBuf,
}

impl Snapshot {
    /// Finds `repo` in the cache: the revision mapped to a commit (a 40-hex commit as it is,
    /// anything else through `refs/`), the commit to its snapshot, and the path asked for in it.
    pub fn find(cache: &CacheDir, repo: &RepoRef) -> Result<Snapshot, CacheError> {
        let repo_folder = cache.repo_folder(&repo.id);
        if !repo_folder.is_dir() {
            return Err(CacheError::NotCached {
                repo: repo.id.clone(),
                cache: cache.clone(),
            });
        }
        let revision = repo.revision();
        let commit = if is_commit(revision) {
            revision.to_owned()
        } else {
            let file = repo_folder.join("refs").join(revision);
            match fs::read_to_string(&file) {
                Ok(content) if is_commit(content.trim()) => content.trim().to_owned(),
                Ok(content) => {
                    return Err(CacheError::BadRef {
                        repo: repo.id.clone(),
                        revision: revision.to_owned(),
                        file,
                        content: content.chars().take(60).collect(),
                    });
                }
                Err(_) => {
                    return Err(CacheError::UnknownRevision {
                        repo: repo.id.clone(),
                        revision: revision.to_owned(),
                        refs: refs(&repo_folder),
                        snapshots: snapshots(&repo_folder),
                        folder: repo_folder,
                    });
                }
            }
        };
        let folder = repo_folder.join("snapshots").join(&commit);
        if !folder.is_dir() {
            return Err(CacheError::NoSnapshot {
                repo: repo.id.clone(),
                revision: revision.to_owned(),
                commit,
                folder,
            });
        }
        let snapshot = Snapshot {
            repo: repo.clone(),
            repo_folder,
            commit,
            folder,
        };
        let target = snapshot.target();
        if fs::symlink_metadata(&target).is_err() {
            return Err(CacheError::PathMissing {
                repo: repo.id.clone(),
                path: repo.path.clone().unwrap_or_default(),
                commit: snapshot.commit,
                folder: snapshot.folder,
            });
        }
        Ok(snapshot)
    }

    /// The file or folder the argument names inside the snapshot.
    pub fn target(&self) -> PathBuf {
        match &self.repo.path {
            Some(path) => self.folder.join(path),
            None => self.folder.clone(),
        }
    }

    /// What to do about a file of the snapshot that cannot be opened because it is not there:
    /// a link whose blob was deleted, a download still `.incomplete`, or one never made.
    pub fn explain_missing(&self, missing: &Path) -> String {
        let in_repo = missing.strip_prefix(&self.folder).map_or_else(
            |_| missing.display().to_string(),
            |p| p.to_string_lossy().replace('\\', "/"),
        );
        let fetch = format!(
            "`hf download {} {} --revision {}`",
            self.repo.id,
            escape(&in_repo),
            self.commit
        );
        if fs::symlink_metadata(missing).is_ok_and(|m| m.is_symlink()) {
            let target = fs::read_link(missing).unwrap_or_default();
            return format!(
                "a dangling link: the cache has lost the blob it points to ({}); fetch it again with {fetch}",
                escape_path(&target)
            );
        }
        if let Some((blob, held, size)) = self.incomplete_blob_of(&in_repo) {
            let of = size.map_or_else(String::new, |size| format!(" of {}", format_bytes(size)));
            return format!(
                "its download is unfinished: blobs/{}.incomplete holds {}{of}; finish it with {fetch}",
                escape(&blob),
                format_bytes(held)
            );
        }
        let incomplete = incomplete_blobs(&self.repo_folder);
        if incomplete.is_empty() {
            format!("not downloaded; fetch it with {fetch}")
        } else {
            let names: Vec<String> = incomplete
                .iter()
                .take(3)
                .map(|(name, _)| format!("blobs/{}", escape(name)))
                .collect();
            format!(
                "not downloaded yet, and {} into this repository {} unfinished ({}{}); \
                 finish them with `hf download {} --revision {}`",
                Counted(incomplete.len(), "download"),
                if incomplete.len() == 1 { "is" } else { "are" },
                names.join(", "),
                if incomplete.len() > 3 { ", …" } else { "" },
                self.repo.id,
                self.commit
            )
        }
    }

    /// The `.incomplete` blob of a file, when the commit's file list (`trees/<commit>.json`,
    /// written by newer `huggingface_hub`) names its blob: `(blob, bytes held, file size)`.
    fn incomplete_blob_of(&self, in_repo: &str) -> Option<(String, u64, Option<u64>)> {
        let tree = self
            .repo_folder
            .join("trees")
            .join(format!("{}.json", self.commit));
        let tree: serde_json::Value = serde_json::from_slice(&fs::read(tree).ok()?).ok()?;
        let entry = tree.get("files")?.get(in_repo)?;
        let blob = entry
            .get("lfs_sha256")
            .or_else(|| entry.get("blob_id"))?
            .as_str()?;
        let partial = self
            .repo_folder
            .join("blobs")
            .join(format!("{blob}.incomplete"));
        let held = fs::metadata(partial).ok()?.len();
        let size = entry
            .get("lfs_size")
            .or_else(|| entry.get("size"))
            .and_then(serde_json::Value::as_u64);
        Some((blob.to_owned(), held, size))
    }
}

/// Every ref of a repository (`main`, `v1.0`, `refs/pr/1`) and its commit, sorted by name.
pub fn refs(repo_folder: &Path) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let root = repo_folder.join("refs");
    let mut pending = vec![root.clone()];
    while let Some(folder) = pending.pop() {
        let Ok(entries) = fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                pending.push(path);
            } else if let Ok(content) = fs::read_to_string(&path)
                && let Ok(name) = path.strip_prefix(&root)
            {
                let name = name.to_string_lossy().replace('\\', "/");
                found.push((name, content.trim().to_owned()));
            }
        }
    }
    found.sort();
    found
}

/// The commits of a repository's snapshots, sorted.
pub fn snapshots(repo_folder: &Path) -> Vec<String> {
    let mut found: Vec<String> = fs::read_dir(repo_folder.join("snapshots"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    found
}

/// The `.incomplete` blobs of a repository: name and bytes held so far.
pub fn incomplete_blobs(repo_folder: &Path) -> Vec<(String, u64)> {
    let mut found: Vec<(String, u64)> = fs::read_dir(repo_folder.join("blobs"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            name.ends_with(".incomplete")
                .then(|| (name, entry.metadata().map_or(0, |m| m.len())))
        })
        .collect();
    found.sort();
    found
}

/// A model repository of the cache that holds safetensors files.
#[derive(Clone, Debug)]
pub struct CachedRepo {
    pub id: String,
    pub folder: PathBuf,
    /// Bytes of the distinct blobs its snapshots link to.
    pub size: u64,
    pub revisions: Vec<CachedRevision>,
    /// `.incomplete` blobs: downloads unfinished or interrupted.
    pub incomplete: Vec<(String, u64)>,
}

/// One snapshot of a cached repository.
#[derive(Clone, Debug)]
pub struct CachedRevision {
    pub commit: String,
    /// The refs that point at it (`main`, `v1.0`, `refs/pr/1`).
    pub refs: Vec<String>,
    pub folder: PathBuf,
    /// The `.safetensors` files present (their links resolve), relative to the snapshot.
    pub safetensors: Vec<String>,
    /// Every `*.safetensors.index.json` in the snapshot, relative to it.
    pub indexes: Vec<String>,
    /// `.safetensors` files whose link is dangling.
    pub dangling: Vec<String>,
    /// Bytes of its safetensors files.
    pub size: u64,
}

/// The Hugging Face cache `path` lies in, or would lie in once written: the cache folder
/// `huggingface_hub` uses here, or a repository folder of a cache's layout anywhere (named
/// `models--…`, `datasets--…` or `spaces--…`, holding `blobs` or `snapshots`). Links are
/// followed as far as the path exists.
pub fn cache_holding(path: &Path, env: &dyn Environment) -> Option<PathBuf> {
    let resolved = resolved(path);
    if let Some(cache) = CacheDir::find(env) {
        let cache = fs::canonicalize(&cache.path).unwrap_or(cache.path);
        if resolved.starts_with(&cache) {
            return Some(cache);
        }
    }
    repo_folder_above(&resolved)
}

/// The name of the repository whose cache folder holds `path` (`NAME` of `models--ORG--NAME`).
pub fn cached_repo_name(path: &Path) -> Option<String> {
    repo_folder_above(&resolved(path))?
        .file_name()?
        .to_string_lossy()
        .rsplit("--")
        .next()
        .map(str::to_owned)
}

/// The nearest folder at or above `resolved` (a path with its links resolved) that is a
/// repository's in a cache.
fn repo_folder_above(resolved: &Path) -> Option<PathBuf> {
    resolved
        .ancestors()
        .find(|folder| is_repo_folder(folder))
        .map(Path::to_path_buf)
}

fn is_repo_folder(folder: &Path) -> bool {
    let Some(name) = folder.file_name().map(|name| name.to_string_lossy()) else {
        return false;
    };
    ["models--", "datasets--", "spaces--"]
        .iter()
        .any(|kind| name.starts_with(kind))
        && (folder.join("snapshots").is_dir() || folder.join("blobs").is_dir())
}

/// `path` made absolute, with the links of its longest part that exists resolved.
fn resolved(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    let mut existing = absolute.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = fs::canonicalize(existing) {
            return rest.iter().rev().fold(real, |path, name| path.join(name));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_owned());
                existing = parent;
            }
            _ => return absolute,
        }
    }
}

/// Lists the model repositories of the cache holding at least one `.safetensors` file or
/// index in a snapshot, sorted by id. Folders that are not repositories are passed over.
pub fn scan(cache: &Path) -> std::io::Result<Vec<CachedRepo>> {
    let mut repos = Vec::new();
    for entry in fs::read_dir(cache)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(id) = name.strip_prefix("models--") else {
            continue;
        };
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if let Some(repo) = scan_repo(id.replace("--", "/"), &entry.path()) {
            repos.push(repo);
        }
    }
    repos.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(repos)
}

fn scan_repo(id: String, folder: &Path) -> Option<CachedRepo> {
    let refs = refs(folder);
    let mut blobs = std::collections::HashMap::new();
    let mut revisions = Vec::new();
    for commit in snapshots(folder) {
        let snapshot = folder.join("snapshots").join(&commit);
        let mut revision = CachedRevision {
            refs: refs
                .iter()
                .filter(|(_, c)| *c == commit)
                .map(|(name, _)| name.clone())
                .collect(),
            commit,
            folder: snapshot.clone(),
            safetensors: Vec::new(),
            indexes: Vec::new(),
            dangling: Vec::new(),
            size: 0,
        };
        for (relative, path) in files_below(&snapshot) {
            let metadata = fs::metadata(&path);
            if let Ok(metadata) = &metadata {
                let blob = fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
                blobs.insert(blob, metadata.len());
            }
            if relative.ends_with(".safetensors.index.json") {
                revision.indexes.push(relative);
            } else if relative.ends_with(".safetensors") {
                match metadata {
                    Ok(metadata) => {
                        revision.size += metadata.len();
                        revision.safetensors.push(relative);
                    }
                    Err(_) => revision.dangling.push(relative),
                }
            }
        }
        let holds_model = !revision.safetensors.is_empty()
            || !revision.indexes.is_empty()
            || !revision.dangling.is_empty();
        if holds_model {
            revisions.push(revision);
        }
    }
    if revisions.is_empty() {
        return None;
    }
    Some(CachedRepo {
        id,
        size: blobs.values().sum(),
        revisions,
        incomplete: incomplete_blobs(folder),
        folder: folder.to_owned(),
    })
}

/// Every file below `folder` (links included, followed or not), as `(relative path, path)`.
fn files_below(folder: &Path) -> Vec<(String, PathBuf)> {
    let mut found = Vec::new();
    let mut pending = vec![folder.to_owned()];
    while let Some(current) = pending.pop() {
        let Ok(entries) = fs::read_dir(&current) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            // A link is a file of the snapshot whatever it points to; only real folders are walked.
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                pending.push(path);
            } else if let Ok(relative) = path.strip_prefix(folder) {
                found.push((relative.to_string_lossy().replace('\\', "/"), path));
            }
        }
    }
    found.sort();
    found
}
