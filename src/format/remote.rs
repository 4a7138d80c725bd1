//! A model read from the Hub: the revision pinned to one commit, the index fetched whole and the
//! shards' headers by Range requests in parallel, each header kept in stui's own cache by its
//! blob id; tensor data fetched only on demand, one Range request per tensor.

use super::SafetensorsFile;
use super::folder::{self, Choice, Files};
use super::index::ShardIndex;
use super::model::{Builder, Components, Model, Source};
use crate::error::{Error, Result};
use crate::source::RepoRef;
use crate::source::header_cache;
use crate::source::hub::{Hub, RemoteError, RepoFile};
use crate::text::escape;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Requests to shards at once: a 163-shard model in three waves of round trips (each a redirect
/// and a range), few enough to stay inside the Hub's rate limits.
pub const PARALLEL_REQUESTS: usize = 64;

/// The first Range request of a header when nothing says how long it is (`huggingface_hub`'s
/// figure: 97% of the headers of the Hub's top models are shorter).
pub const FIRST_RANGE: u64 = 100_000;

/// The longest index read (the largest seen on the Hub are near 60 MB).
const MAX_INDEX_LEN: u64 = 512 << 20;

/// The longest `config.json` read (as for a local one).
const MAX_CONFIG_LEN: u64 = 16 << 20;

/// Where a remote model's bytes are: the Hub, the repository at its pinned commit, and each
/// shard's path in it.
#[derive(Debug)]
pub struct RemoteModel {
    pub hub: Arc<Hub>,
    pub repo: RepoRef,
    pub commit: String,
    /// Each shard's path in the repository, by shard index.
    pub files: Vec<String>,
    /// Each shard's blob id (the sha256 of an LFS file's bytes), when the Hub gave one.
    pub blobs: Vec<Option<String>>,
    /// The `config.json` beside the model, as shown (`hf://…/config.json`) and its text, when the
    /// repository has one there.
    pub config: Option<(PathBuf, Vec<u8>)>,
}

impl RemoteModel {
    /// `len` bytes of shard `shard` from `start`, in one Range request.
    pub fn read(
        &self,
        shard: usize,
        start: u64,
        len: u64,
    ) -> std::result::Result<Vec<u8>, RemoteError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let path = &self.files[shard];
        let reply = self.hub.range(&self.repo, &self.commit, path, start, len)?;
        if reply.bytes.len() as u64 != len {
            return Err(RemoteError(format!(
                "`{}` of `{}` ends {} bytes after offset {start}, short of the {len} asked for",
                escape(path),
                self.repo.id,
                reply.bytes.len()
            )));
        }
        Ok(reply.bytes)
    }
}

/// Opens `repo` from the Hub. `cache` is stui's header cache, if there is one.
pub fn open(repo: &RepoRef, hub: Hub, cache: Option<&Path>) -> Result<Model> {
    let fail = |error: RemoteError| Error::Invalid(error.0);
    let info = hub.repo_info(repo).map_err(fail)?;
    let commit = info.commit.clone();
    let files: HashMap<&str, &RepoFile> = info.files.iter().map(|f| (f.path.as_str(), f)).collect();
    let shown = format!("hf://{}@{commit}", repo.id);
    let layout = choose(repo, &commit, &info.files, &files)?;
    let hub = Arc::new(hub);
    let Plan {
        model_path,
        source,
        folder,
        labels,
        index,
        chosen,
        beside_index,
    } = plan(repo, &hub, &commit, layout, &files, cache).map_err(fail)?;
    let prefix = in_folder_prefix(&folder);
    let in_repo = |label: &str| format!("{prefix}{label}");
    let likely = likely_header_sizes(index.as_ref().map(|(index, _)| index), &labels);
    // `config.json` is fetched beside the headers: one round trip less.
    let config_path = in_repo("config.json");
    let (headers, config) = std::thread::scope(|scope| {
        let config = scope.spawn(|| {
            files
                .get(config_path.as_str())
                .map(|file| whole_file(&hub, repo, &commit, file, cache, MAX_CONFIG_LEN))
                .transpose()
        });
        let headers = fetch_headers(&labels, |i, label| {
            let path = in_repo(label);
            let Some(file) = files.get(path.as_str()) else {
                return Ok(None);
            };
            cached_or(cache, "headers", file, |_| {
                hub.header(repo, &commit, &path, likely[i])
            })
            .map(Some)
        });
        let config = config
            .join()
            .unwrap_or_else(|_| Err(RemoteError("reading `config.json` failed".into())));
        (headers, config)
    });
    let headers = headers.map_err(fail)?;
    let config = config
        .map_err(fail)?
        .map(|bytes| (PathBuf::from(format!("{shown}/{config_path}")), bytes));
    let model_path = PathBuf::from(model_path);
    let mut builder = Builder::new(&model_path, source, None);
    let mut blobs = Vec::new();
    let mut paths = Vec::new();
    for (label, header) in labels.into_iter().zip(headers) {
        let path = in_repo(&label);
        let shown_path = PathBuf::from(format!("{shown}/{path}"));
        let file = match header {
            Some((bytes, file_len)) => {
                SafetensorsFile::from_header_bytes(&shown_path, &bytes, file_len)
            }
            None => Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("not in the repository at commit {commit}"),
            )),
        };
        blobs.push(files.get(path.as_str()).and_then(|f| f.blob.clone()));
        paths.push(path);
        builder.add_opened(label, shown_path, file);
    }
    if let Some((index, index_path)) = &index {
        let label = index_path[folder.len()..].trim_start_matches('/');
        builder.add_index_findings(index, label);
        builder.check_against_index(index, label);
        builder.note_beside_index(label, &beside_index);
    }
    let components = Components {
        shown: as_given(repo),
        inside: if source == Source::Folder {
            components_below(&info.files, &folder)
        } else {
            Vec::new()
        },
    };
    let mut model = if let Some(chosen) = &chosen {
        builder.finish_folder(chosen, &components)?
    } else {
        builder.note_components(&components);
        builder.finish()
    };
    model.remote = Some(Arc::new(RemoteModel {
        hub,
        repo: repo.clone(),
        commit,
        files: paths,
        blobs,
        config,
    }));
    Ok(model)
}

/// What the chosen files make: where the model is shown, how it was given, its folder in the
/// repository, its shards, and its index (with its path) when it has one.
struct Plan {
    model_path: String,
    source: Source,
    folder: String,
    labels: Vec<String>,
    index: Option<(ShardIndex, String)>,
    /// The files chosen in a folder with no index.
    chosen: Option<Files>,
    /// The folder's files and indexes left out by the index it was read through.
    beside_index: Vec<String>,
}

fn plan(
    repo: &RepoRef,
    hub: &Hub,
    commit: &str,
    layout: Layout,
    files: &HashMap<&str, &RepoFile>,
    cache: Option<&Path>,
) -> std::result::Result<Plan, RemoteError> {
    let shown = format!("hf://{}@{commit}", repo.id);
    let mut chosen = None;
    let mut beside_index = Vec::new();
    let (model_path, source, folder, labels, index) = match layout {
        Layout::Index(index_path) => {
            let file = files[index_path.as_str()];
            let bytes = whole_file(hub, repo, commit, file, cache, MAX_INDEX_LEN)?;
            let name = index_path.rsplit('/').next().unwrap_or_default();
            if super::index::is_beside_a_model(name, &bytes) {
                return Err(RemoteError(super::index::beside_a_model(
                    &format!("{shown}/{}", escape(&index_path)),
                    &join(&format!("hf://{}", repo.id), &escape(&parent(&index_path))),
                )));
            }
            let index = ShardIndex::from_slice(&bytes);
            drop(bytes);
            let folder = parent(&index_path);
            let source = if repo.path.as_deref() == Some(index_path.as_str()) {
                Source::Index
            } else {
                Source::Folder
            };
            let model_path = match source {
                Source::Index => format!("{shown}/{index_path}"),
                _ => join(&shown, &folder),
            };
            let labels = index.shards.clone();
            if source == Source::Folder {
                let prefix = in_folder_prefix(&folder);
                let names = names_in(files.keys().copied(), &prefix);
                let index_name = &index_path[prefix.len()..];
                beside_index = folder::beside_index(names, index_name, &labels);
            }
            (
                model_path,
                source,
                folder,
                labels,
                Some((index, index_path)),
            )
        }
        Layout::Files(folder, files) => {
            let labels = files.read.clone();
            chosen = Some(files);
            (join(&shown, &folder), Source::Folder, folder, labels, None)
        }
        Layout::File(path) => {
            let folder = parent(&path);
            let label = path[folder.len()..].trim_start_matches('/').to_owned();
            (
                format!("{shown}/{path}"),
                Source::File,
                folder,
                vec![label],
                None,
            )
        }
    };
    Ok(Plan {
        model_path,
        source,
        folder,
        labels,
        index,
        chosen,
        beside_index,
    })
}

/// The subfolders of `folder` in the repository's `listing` that hold models.
fn components_below(listing: &[RepoFile], folder: &str) -> Vec<String> {
    let prefix = in_folder_prefix(folder);
    let below = listing
        .iter()
        .filter_map(|file| file.path.strip_prefix(&prefix));
    folder::subfolders_with_models(below)
}

/// What paths in `folder` of the repository start with (nothing at its top).
fn in_folder_prefix(folder: &str) -> String {
    if folder.is_empty() {
        String::new()
    } else {
        format!("{folder}/")
    }
}

/// The names of the files directly in the folder whose paths start with `prefix`
/// ([`in_folder_prefix`]), among the repository's `paths`.
fn names_in<'a>(
    paths: impl IntoIterator<Item = &'a str>,
    prefix: &'a str,
) -> impl Iterator<Item = &'a str> {
    paths
        .into_iter()
        .filter_map(move |path| path.strip_prefix(prefix).filter(|name| !name.contains('/')))
}

/// The repository as the user named it, for the messages that tell what to open.
fn as_given(repo: &RepoRef) -> String {
    format!("{}{repo}", if repo.remote { "hf://" } else { "" })
}

/// Which files of the repository make the model.
enum Layout {
    /// An index, by its path.
    Index(String),
    /// A folder (`""` for the top) and the files of its model.
    Files(String, Files),
    /// One file.
    File(String),
}

/// The model the path names at `commit`, as a local folder would be read (`format::folder`).
fn choose(
    repo: &RepoRef,
    commit: &str,
    listing: &[RepoFile],
    files: &HashMap<&str, &RepoFile>,
) -> Result<Layout> {
    if let Some(path) = &repo.path
        && files.contains_key(path.as_str())
    {
        let is_index = Path::new(path).extension().is_some_and(|ext| ext == "json");
        return Ok(if is_index {
            Layout::Index(path.clone())
        } else {
            Layout::File(path.clone())
        });
    }
    let folder = repo.path.clone().unwrap_or_default();
    let prefix = in_folder_prefix(&folder);
    let paths = listing.iter().map(|file| file.path.as_str());
    match folder::choose(names_in(paths, &prefix)) {
        Some(Choice::Index(name)) => Ok(Layout::Index(format!("{prefix}{name}"))),
        Some(Choice::Files(chosen)) => Ok(Layout::Files(folder, chosen)),
        Some(Choice::Indexes(indexes)) => Err(Error::Invalid(folder::several_indexes(
            &join(&format!("hf://{}@{commit}", repo.id), &folder),
            &indexes,
        ))),
        None => {
            let inside = components_below(listing, &folder);
            let advice = if inside.is_empty() {
                ": check the name and path".to_owned()
            } else {
                let given = as_given(repo);
                crate::error::models_inside(&given, &inside)
            };
            Err(Error::Invalid(format!(
                "`{repo}` at commit {commit} holds no .safetensors file or index{}{advice}",
                repo.path
                    .as_deref()
                    .map_or_else(String::new, |p| format!(" at `{}`", escape(p)))
            )))
        }
    }
}

/// The first Range request of each shard: its header's size as the index's names suggest
/// (a name and about 100 bytes of dtype, shape and offsets per tensor), and at least
/// [`FIRST_RANGE`].
fn likely_header_sizes(index: Option<&ShardIndex>, labels: &[String]) -> Vec<u64> {
    let mut estimate: HashMap<&str, u64> = HashMap::new();
    if let Some(index) = index {
        for (name, shard) in index.weight_map.iter() {
            *estimate.entry(shard).or_default() += name.len() as u64 + 100;
        }
    }
    labels
        .iter()
        .map(|label| {
            let estimate = estimate.get(label.as_str()).copied().unwrap_or(0);
            (estimate + estimate / 4 + 4096).clamp(FIRST_RANGE, 16 << 20)
        })
        .collect()
}

/// Runs `fetch` for every label on [`PARALLEL_REQUESTS`] threads, keeping the order; stops at
/// the first error.
fn fetch_headers<T: Send>(
    labels: &[String],
    fetch: impl Fn(usize, &str) -> std::result::Result<T, RemoteError> + Sync,
) -> std::result::Result<Vec<T>, RemoteError> {
    let next = AtomicUsize::new(0);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let results: Vec<std::sync::Mutex<Option<std::result::Result<T, RemoteError>>>> =
        labels.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..PARALLEL_REQUESTS.min(labels.len()) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= labels.len() || failed.load(Ordering::Relaxed) {
                        break;
                    }
                    let result = fetch(i, &labels[i]);
                    failed.fetch_or(result.is_err(), Ordering::Relaxed);
                    if let Ok(mut slot) = results[i].lock() {
                        *slot = Some(result);
                    }
                }
            });
        }
    });
    let mut done = Vec::with_capacity(labels.len());
    for slot in results {
        match slot.into_inner().ok().flatten() {
            Some(Ok(value)) => done.push(value),
            Some(Err(error)) => return Err(error),
            // Not asked for, because a request before it failed: that error comes first.
            None => {}
        }
    }
    Ok(done)
}

/// The bytes kept in stui's cache for `file`, else those `fetch` gets (then kept).
fn cached_or(
    cache: Option<&Path>,
    kind: &str,
    file: &RepoFile,
    fetch: impl FnOnce(&RepoFile) -> std::result::Result<(Vec<u8>, u64), RemoteError>,
) -> std::result::Result<(Vec<u8>, u64), RemoteError> {
    if let (Some(cache), Some(blob)) = (cache, &file.blob)
        && let Some(kept) = header_cache::load(cache, kind, blob)
    {
        return Ok(kept);
    }
    let (bytes, file_len) = fetch(file)?;
    if let (Some(cache), Some(blob)) = (cache, &file.blob) {
        header_cache::store(cache, kind, blob, &bytes, file_len);
    }
    Ok((bytes, file_len))
}

/// A whole file of the repository of at most `max_len` bytes (the index, `config.json`),
/// through stui's cache.
fn whole_file(
    hub: &Hub,
    repo: &RepoRef,
    commit: &str,
    file: &RepoFile,
    cache: Option<&Path>,
    max_len: u64,
) -> std::result::Result<Vec<u8>, RemoteError> {
    let (bytes, _) = cached_or(cache, "files", file, |file| {
        let bytes = hub.file(repo, commit, &file.path, max_len)?;
        let len = bytes.len() as u64;
        Ok((bytes, len))
    })?;
    Ok(bytes)
}

fn parent(path: &str) -> String {
    path.rsplit_once('/')
        .map_or_else(String::new, |(folder, _)| folder.to_owned())
}

fn join(base: &str, folder: &str) -> String {
    if folder.is_empty() {
        base.to_owned()
    } else {
        format!("{base}/{folder}")
    }
}
