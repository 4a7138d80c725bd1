//! A model read from the Hub: the revision pinned to one commit, the index fetched whole and the
//! shards' headers by Range requests in parallel, each header kept in stui's own cache by its
//! blob id; tensor data fetched only on demand, one Range request per tensor.

use super::SafetensorsFile;
use super::dtype::Kind;
use super::folder::{self, Choice, Files};
use super::index::ShardIndex;
use super::model::{Builder, Components, Model, Source};
use crate::error::{Error, Result};
use crate::source::RepoRef;
use crate::source::header_cache;
use crate::source::hub::{Header, Hub, RemoteError, RepoFile};
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

/// Bytes of a tensor asked for in one Range request: a multiple of every element size and of
/// the 3-byte F6 group.
pub const RANGE_BYTES: usize = 12 << 20;

/// Small ranges of one shard at most this far apart are asked for in one request, the bytes
/// between them dropped: a writer that sorts its tensors by dtype puts a model's shape members
/// side by side.
const NEAR: u64 = 64 << 10;

/// The longest request that gathers several small ranges.
const GATHERED_MAX: u64 = 16 << 20;

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
    /// The side files beside the model that say how it is quantized
    /// ([`super::folder::QUANT_SIDE_FILES`]) the repository has: each one's name, its path as
    /// shown and its bytes.
    pub side_files: Vec<(String, PathBuf, Vec<u8>)>,
    /// stui's cache, where the small ranges read are kept by their shard's blob id.
    pub cache: Option<PathBuf>,
    /// Small tensors whose bytes came with their shard's header (see [`keep_small_integers`]).
    pub prefetched: Prefetched,
}

/// Bytes of tensors by `(shard, start, length)`.
pub type Prefetched = HashMap<(usize, u64, u64), Vec<u8>>;

/// The largest tensor kept from the bytes that came with a header: the members read for their
/// values ([`crate::quant`]'s shapes, quant states and group orders) are a few bytes to a few
/// KiB, and a writer that sorts its tensors by dtype, widest first, puts the `I64` shapes right
/// after the header.
const PREFETCHED_MAX: u64 = 16 << 10;

impl RemoteModel {
    /// The command that downloads the model, at the revision it was named with.
    pub fn download_command(&self) -> String {
        match &self.repo.revision {
            Some(revision) => format!("hf download {} --revision {revision}", self.repo.id),
            None => format!("hf download {}", self.repo.id),
        }
    }

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

    /// `len` bytes of shard `shard` from `start`, a Range request per [`RANGE_BYTES`], each
    /// piece handed to `sink` in order.
    pub fn read_pieces(
        &self,
        shard: usize,
        (start, len): (u64, u64),
        mut sink: impl FnMut(&[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let mut done = 0;
        while done < len {
            let piece = (len - done).min(RANGE_BYTES as u64);
            let bytes = self
                .read(shard, start + done, piece)
                .map_err(|error| std::io::Error::other(error.0))?;
            sink(&bytes)?;
            done += piece;
        }
        Ok(())
    }

    /// The bytes of each of `wanted` (shard, start, length: small tensors read whole), in
    /// order: from stui's cache where their shard's entry holds them, or from the bytes that came
    /// with their shard's header ([`RemoteModel::prefetched`]), else fetched, ranges of a
    /// shard near each other in one request ([`NEAR`]), [`PARALLEL_REQUESTS`] at once, and then
    /// kept in the cache with those it held. `None`, and nothing asked for, when that would take
    /// more than `max_requests` requests.
    pub fn read_small(
        &self,
        wanted: &[(usize, u64, u64)],
        max_requests: usize,
    ) -> std::result::Result<Option<Vec<Vec<u8>>>, RemoteError> {
        let mut kept: HashMap<usize, HashMap<(u64, u64), Vec<u8>>> = HashMap::new();
        let mut missing: Vec<(usize, u64, u64)> = Vec::new();
        let mut grown: Vec<usize> = Vec::new();
        for &(shard, start, len) in wanted {
            let ranges = kept
                .entry(shard)
                .or_insert_with(|| self.kept_ranges(shard).unwrap_or_default());
            if len == 0 || ranges.contains_key(&(start, len)) {
                continue;
            }
            if let Some(bytes) = self.prefetched.get(&(shard, start, len)) {
                ranges.insert((start, len), bytes.clone());
                grown.push(shard);
            } else {
                missing.push((shard, start, len));
            }
        }
        missing.sort_unstable();
        missing.dedup();
        let spans = gathered(&missing);
        if spans.len() > max_requests {
            return Ok(None);
        }
        let fetched = fetch_all(spans.len(), |i| {
            let (shard, start, end) = spans[i];
            self.read(shard, start, end - start)
        })?;
        // The ranges in order, each inside the first request whose end it does not pass.
        let mut next = 0;
        for (&(shard, from, to), bytes) in spans.iter().zip(&fetched) {
            let ranges = kept.entry(shard).or_default();
            while let Some(&(s, start, len)) = missing.get(next)
                && s == shard
                && start + len <= to
            {
                let at = usize::try_from(start - from).unwrap_or(usize::MAX);
                let end = usize::try_from(len).map_or(usize::MAX, |len| at.saturating_add(len));
                if let Some(range) = bytes.get(at..end) {
                    ranges.insert((start, len), range.to_vec());
                }
                next += 1;
            }
        }
        grown.extend(spans.iter().map(|&(shard, ..)| shard));
        grown.sort_unstable();
        grown.dedup();
        for shard in grown {
            self.keep_ranges(shard, &kept[&shard]);
        }
        Ok(Some(
            wanted
                .iter()
                .map(|&(shard, start, len)| {
                    kept.get(&shard)
                        .and_then(|ranges| ranges.get(&(start, len)))
                        .cloned()
                        .unwrap_or_default()
                })
                .collect(),
        ))
    }

    /// The small ranges kept in stui's cache for shard `shard`'s blob.
    fn kept_ranges(&self, shard: usize) -> Option<HashMap<(u64, u64), Vec<u8>>> {
        let blob = self.blobs.get(shard)?.as_deref()?;
        let (bytes, _) = header_cache::load(self.cache.as_deref()?, "ranges", blob)?;
        let mut ranges = HashMap::new();
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let (start, after) = rest.split_first_chunk::<8>()?;
            let (len, after) = after.split_first_chunk::<8>()?;
            let (start, len) = (u64::from_le_bytes(*start), u64::from_le_bytes(*len));
            let range = after.get(..usize::try_from(len).ok()?)?;
            ranges.insert((start, len), range.to_vec());
            rest = &after[range.len()..];
        }
        Some(ranges)
    }

    /// Keeps `ranges` of shard `shard` in stui's cache, by its blob id.
    fn keep_ranges(&self, shard: usize, ranges: &HashMap<(u64, u64), Vec<u8>>) {
        let (Some(cache), Some(Some(blob))) = (self.cache.as_deref(), self.blobs.get(shard)) else {
            return;
        };
        let mut bytes = Vec::new();
        for (&(start, len), range) in ranges {
            bytes.extend_from_slice(&start.to_le_bytes());
            bytes.extend_from_slice(&len.to_le_bytes());
            bytes.extend_from_slice(range);
        }
        header_cache::store(cache, "ranges", blob, &bytes, 0);
    }
}

/// The requests that fetch `ranges` (shard, start, length; sorted, none empty): `(shard, start,
/// end)`, ranges of a shard at most [`NEAR`] apart gathered into one of at most
/// [`GATHERED_MAX`] bytes.
fn gathered(ranges: &[(usize, u64, u64)]) -> Vec<(usize, u64, u64)> {
    let mut spans: Vec<(usize, u64, u64)> = Vec::new();
    for &(shard, start, len) in ranges {
        let end = start + len;
        match spans.last_mut() {
            // Inside the request before it (tensors that overlap, in a broken file).
            Some((s, _, to)) if *s == shard && end <= *to => {}
            Some((s, from, to))
                if *s == shard
                    && start <= to.saturating_add(NEAR)
                    && end.max(*to) - *from <= GATHERED_MAX =>
            {
                *to = end.max(*to);
            }
            _ => spans.push((shard, start, end)),
        }
    }
    spans
}

/// Opens `repo` from the Hub. `cache` is stui's header cache, if there is one.
pub fn open(
    repo: &RepoRef,
    hub: Hub,
    cache: Option<&Path>,
    variant: Option<&str>,
) -> Result<Model> {
    let fail = |error: RemoteError| Error::Invalid(error.0);
    let info = hub.repo_info(repo).map_err(fail)?;
    let commit = info.commit.clone();
    let files: HashMap<&str, &RepoFile> = info.files.iter().map(|f| (f.path.as_str(), f)).collect();
    let shown = format!("hf://{}@{commit}", repo.id);
    let layout = choose(repo, (&commit, variant), &info.files, &files)?;
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
    let (headers, (config, side_files)) = headers_and_beside(
        &hub,
        (repo, &commit),
        &files,
        (&prefix, &labels),
        &likely,
        cache,
    )
    .map_err(fail)?;
    let model_path = PathBuf::from(model_path);
    let mut builder = Builder::new(&model_path, source, None);
    let mut blobs = Vec::new();
    let mut paths = Vec::new();
    let mut prefetched = Prefetched::new();
    for (shard, (label, header)) in labels.into_iter().zip(headers).enumerate() {
        let path = in_repo(&label);
        let shown_path = PathBuf::from(format!("{shown}/{path}"));
        let file = match header {
            Some(header) => {
                let file = SafetensorsFile::from_header_bytes(
                    &shown_path,
                    header.bytes(),
                    header.file_len,
                );
                if let Ok(file) = &file {
                    keep_small_integers(shard, file, header.after(), &mut prefetched);
                }
                file
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
        side_files,
        cache: cache.map(Path::to_path_buf),
        prefetched,
    }));
    Ok(model)
}

/// The headers of the shards `labels` (in the folder whose paths start with `prefix`) and,
/// beside them (one round trip less), `config.json` and the side files.
fn headers_and_beside(
    hub: &Hub,
    (repo, commit): (&RepoRef, &str),
    files: &HashMap<&str, &RepoFile>,
    (prefix, labels): (&str, &[String]),
    likely: &[u64],
    cache: Option<&Path>,
) -> std::result::Result<(Vec<Option<Header>>, BesideFiles), RemoteError> {
    let shown = format!("hf://{}@{commit}", repo.id);
    std::thread::scope(|scope| {
        let config = scope.spawn(|| {
            let fetched = |name: &str| {
                let path = format!("{prefix}{name}");
                let bytes = files
                    .get(path.as_str())
                    .map(|file| whole_file(hub, repo, commit, file, cache, MAX_CONFIG_LEN))
                    .transpose()?;
                Ok(bytes.map(|bytes| (PathBuf::from(format!("{shown}/{path}")), bytes)))
            };
            beside_files(fetched)
        });
        let headers = fetch_all(labels.len(), |i| {
            let path = format!("{prefix}{}", labels[i]);
            files
                .get(path.as_str())
                .map(|file| shard_header(hub, (repo, commit), file, likely[i], cache))
                .transpose()
        });
        let config = config
            .join()
            .unwrap_or_else(|_| Err(RemoteError("reading `config.json` failed".into())));
        Ok((headers?, config?))
    })
}

/// A shard's header through stui's cache, with the bytes its request brought past it (none when
/// the cache held it).
fn shard_header(
    hub: &Hub,
    (repo, commit): (&RepoRef, &str),
    file: &RepoFile,
    likely: u64,
    cache: Option<&Path>,
) -> std::result::Result<Header, RemoteError> {
    let cached = cache.zip(file.blob.as_deref());
    if let Some((cache, blob)) = cached
        && let Some((bytes, file_len)) = header_cache::load(cache, "headers", blob)
    {
        return Ok(Header::alone(bytes, file_len));
    }
    let header = hub.header(repo, commit, &file.path, likely)?;
    if let Some((cache, blob)) = cached {
        header_cache::store(cache, "headers", blob, header.bytes(), header.file_len);
    }
    Ok(header)
}

/// Keeps in `prefetched` the tensors of integers of at most [`PREFETCHED_MAX`] bytes of `file`,
/// shard `shard`, that lie whole in `after`, the bytes its header's request brought past the
/// header: the members read for their values are integers (shapes, group orders) and bytes
/// (quant states), and the small floats a writer also puts first, such as the block scales of an
/// FP8 model, would be held for nothing.
fn keep_small_integers(
    shard: usize,
    file: &SafetensorsFile,
    after: &[u8],
    prefetched: &mut Prefetched,
) {
    for tensor in &file.tensors {
        let [begin, end] = tensor.info.data_offsets;
        let len = end.saturating_sub(begin);
        let integers = tensor
            .info
            .dtype
            .known()
            .is_some_and(|dtype| matches!(dtype.kind(), Kind::SignedInt | Kind::UnsignedInt));
        if !integers || len == 0 || len > PREFETCHED_MAX {
            continue;
        }
        let within = usize::try_from(begin)
            .ok()
            .and_then(|at| after.get(at..at.checked_add(usize::try_from(len).ok()?)?));
        if let Some(bytes) = within {
            let start = file.data_start().saturating_add(begin);
            prefetched.insert((shard, start, len), bytes.to_vec());
        }
    }
}

/// `config.json` and the quantization side files there are beside the model, each as shown and
/// its bytes, from `fetched` (`None` for a file the repository does not have).
type BesideFiles = (Option<(PathBuf, Vec<u8>)>, Vec<(String, PathBuf, Vec<u8>)>);

fn beside_files(
    fetched: impl Fn(&str) -> std::result::Result<Option<(PathBuf, Vec<u8>)>, RemoteError>,
) -> std::result::Result<BesideFiles, RemoteError> {
    let config = fetched("config.json")?;
    let mut side_files = Vec::new();
    for name in super::folder::QUANT_SIDE_FILES {
        if let Some((path, bytes)) = fetched(name)? {
            side_files.push((name.to_owned(), path, bytes));
        }
    }
    Ok((config, side_files))
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
    (commit, variant): (&str, Option<&str>),
    listing: &[RepoFile],
    files: &HashMap<&str, &RepoFile>,
) -> Result<Layout> {
    if let Some(path) = &repo.path
        && files.contains_key(path.as_str())
    {
        if let Some(variant) = variant {
            return Err(super::model::not_a_folder(&format!("`{repo}`"), variant));
        }
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
    let shown = || join(&format!("hf://{}@{commit}", repo.id), &folder);
    let choice = folder::choose_save(names_in(paths, &prefix), variant)
        .map_err(|why| Error::Invalid(format!("{}: {why}", shown())))?;
    match choice {
        Some(Choice::Index(name)) => Ok(Layout::Index(format!("{prefix}{name}"))),
        Some(Choice::Files(chosen)) => Ok(Layout::Files(folder, chosen)),
        Some(Choice::Indexes(indexes)) => {
            Err(Error::Invalid(folder::several_indexes(&shown(), &indexes)))
        }
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

/// Runs `fetch` for each of `count` requests on [`PARALLEL_REQUESTS`] threads, keeping the
/// order; stops at the first error.
fn fetch_all<T: Send>(
    count: usize,
    fetch: impl Fn(usize) -> std::result::Result<T, RemoteError> + Sync,
) -> std::result::Result<Vec<T>, RemoteError> {
    let next = AtomicUsize::new(0);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let results: Vec<std::sync::Mutex<Option<std::result::Result<T, RemoteError>>>> =
        (0..count).map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..PARALLEL_REQUESTS.min(count) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count || failed.load(Ordering::Relaxed) {
                        break;
                    }
                    let result = fetch(i);
                    failed.fetch_or(result.is_err(), Ordering::Relaxed);
                    if let Ok(mut slot) = results[i].lock() {
                        *slot = Some(result);
                    }
                }
            });
        }
    });
    let mut done = Vec::with_capacity(count);
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every range (tensors of a file, which do not overlap) lies whole inside one request
        /// of its shard; no request is longer than [`GATHERED_MAX`] unless it is one range
        /// alone; the requests of a shard do not overlap, and two ranges are asked for apart
        /// only when they are more than [`NEAR`] apart or together they would pass the limit.
        #[test]
        fn requests_cover_every_range_within_their_limits(
            steps in prop::collection::vec(
                (
                    0usize..3,
                    prop_oneof![0u64..64, 0u64..(1 << 20)],
                    prop_oneof![1u64..64, 1u64..(20 << 20)],
                ),
                1..60,
            ),
        ) {
            let mut ends = [0u64; 3];
            let mut ranges: Vec<(usize, u64, u64)> = steps
                .iter()
                .map(|&(shard, gap, len)| {
                    let start = ends[shard] + gap;
                    ends[shard] = start + len;
                    (shard, start, len)
                })
                .collect();
            ranges.sort_unstable();
            let spans = gathered(&ranges);
            for &(shard, start, len) in &ranges {
                let inside = spans
                    .iter()
                    .any(|&(s, from, to)| s == shard && from <= start && start + len <= to);
                prop_assert!(inside);
            }
            for pair in spans.windows(2) {
                let [(a, _, a_end), (b, b_start, b_end)] = [pair[0], pair[1]];
                if a == b {
                    prop_assert!(a_end <= b_start || b_end <= a_end);
                    let near = b_start <= a_end + NEAR;
                    prop_assert!(!near || b_end.max(a_end) - pair[0].1 > GATHERED_MAX);
                }
            }
            for &(_, from, to) in &spans {
                let alone = ranges.iter().any(|&(_, start, len)| start == from && start + len == to);
                prop_assert!(to - from <= GATHERED_MAX || alone);
            }
        }
    }

    #[test]
    fn ranges_side_by_side_make_one_request_and_far_ones_two() {
        let side_by_side = [(0, 100, 16), (0, 116, 16), (0, 140, 16), (1, 100, 16)];
        assert_eq!(gathered(&side_by_side), [(0, 100, 156), (1, 100, 116)]);
        let far = [(0, 0, 16), (0, NEAR + 17, 16)];
        assert_eq!(gathered(&far), [(0, 0, 16), (0, NEAR + 17, NEAR + 33)]);
    }

    /// Of the bytes that came after a header, only the small tensors of integers lying whole in
    /// them are kept, each with its own bytes.
    #[test]
    fn small_tensors_whole_in_the_bytes_after_a_header_are_kept() {
        use safetensors::tensor::TensorView;
        fn view(dtype: safetensors::Dtype, len: usize, bytes: &[u8]) -> TensorView<'_> {
            TensorView::new(dtype, vec![len], bytes).unwrap()
        }
        let path = Path::new("model.safetensors");
        let large = vec![2u8; usize::try_from(2 * PREFETCHED_MAX).unwrap()];
        let (shape, scale, state) = (vec![1u8; 16], [3u8; 16], [4u8; 64]);
        // Placed by dtype, widest first: the two I64, the F32, the U8.
        let bytes = safetensors::serialize(
            [
                ("a.weight_shape", view(safetensors::Dtype::I64, 2, &shape)),
                (
                    "b.large",
                    view(safetensors::Dtype::I64, large.len() / 8, &large),
                ),
                ("c.scale", view(safetensors::Dtype::F32, 4, &scale)),
                ("d.quant_state", view(safetensors::Dtype::U8, 64, &state)),
            ],
            None,
        )
        .unwrap();
        let file = SafetensorsFile::from_bytes(path, &bytes);
        let data_start = file.data_start();
        let at = usize::try_from(data_start).unwrap();
        // To the middle of `d.quant_state`: `b.large` is whole but too large, `c.scale` holds
        // floats, `d.quant_state` is not whole.
        let mut kept = Prefetched::new();
        let cut = at + 16 + large.len() + 16 + 32;
        keep_small_integers(3, &file, &bytes[at..cut], &mut kept);
        assert_eq!(kept.len(), 1, "{:?}", kept.keys());
        assert_eq!(kept[&(3, data_start, 16)], shape);
        let mut whole = Prefetched::new();
        keep_small_integers(3, &file, &bytes[at..], &mut whole);
        let state_start = data_start + 16 + large.len() as u64 + 16;
        assert_eq!(whole.len(), 2, "{:?}", whole.keys());
        assert_eq!(whole[&(3, state_start, 64)], state);
    }
}
