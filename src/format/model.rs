//! A model: one `.safetensors` file, or the shards named by an index, or a folder's files, read
//! as one set of tensors that each know their shard.

use super::folder::{self, Choice, Files};
use super::index::ShardIndex;
use super::remote::RemoteModel;
use super::{Rejection, SafetensorsFile, StringMap, Tensor};
use crate::error::{Error, Result};
use crate::finding::{Code, Finding, Findings};
use crate::source::hf_cache::{CacheDir, Snapshot};
use crate::source::hub::Hub;
use crate::source::{ProcessEnvironment, RepoRef};
use crate::text::{escape, escape_path};
use fixedbitset::FixedBitSet;
use foldhash::{HashMap, HashSet};
use hashbrown::HashTable;
use std::fs;
use std::hash::BuildHasher;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The largest index parsed from a map rather than through a reader (several times faster); a
/// larger one is read as it is parsed, so that its text does not count beside its entries
/// against the memory bound.
const MAPPED_INDEX: usize = 16 << 20;

/// How the model was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    File,
    Index,
    Folder,
}

/// One file of a model.
#[derive(Clone, Debug)]
pub struct Shard {
    pub path: PathBuf,
    /// The file's name relative to the model's folder, for display.
    pub label: String,
    pub file_len: u64,
    pub header_len: Option<u64>,
    /// Where the data section starts in the file.
    pub data_start: u64,
    pub metadata: Option<Arc<StringMap>>,
    /// Why the reference rejects this file; `None` when it accepts it.
    pub rejection: Option<Rejection>,
    /// False when the file is missing or could not be read at all.
    pub readable: bool,
}

#[derive(Debug)]
pub struct Model {
    /// The path as given.
    pub path: PathBuf,
    pub source: Source,
    pub shards: Vec<Shard>,
    /// Every tensor, in the order of the files and their headers ([`crate::tree::LayerTree`]
    /// gives the natural name order).
    pub tensors: Vec<Tensor>,
    /// `__metadata__`, merged over the shards (the first shard's value wins); the one shard's own
    /// when there is one.
    pub metadata: Arc<StringMap>,
    pub findings: Findings,
    /// Where the bytes are when the model was read from the Hub; `None` for local files.
    pub remote: Option<Arc<RemoteModel>>,
}

/// Those of `folder`'s `subfolders` that hold a model; unreadable ones are passed over, as this
/// only words an error or a note.
fn models_in_subfolders(folder: &Path, subfolders: &[String]) -> Vec<String> {
    let mut paths = Vec::new();
    for sub in subfolders {
        if let Ok(inner) = fs::read_dir(folder.join(sub)) {
            for name in inner.flatten().take(folder::NAMES_LOOKED_AT) {
                paths.push(format!("{sub}/{}", name.file_name().to_string_lossy()));
            }
        }
    }
    folder::subfolders_with_models(paths.iter().map(String::as_str))
}

impl Model {
    /// The same files listing `tensors` in place of the stored ones: a quantized model as it
    /// computes, its logical weights in the place of their members.
    #[must_use]
    pub fn listing(&self, tensors: Vec<Tensor>) -> Model {
        Model {
            path: self.path.clone(),
            source: self.source,
            shards: self.shards.clone(),
            tensors,
            metadata: Arc::clone(&self.metadata),
            findings: self.findings.clone(),
            remote: self.remote.clone(),
        }
    }

    /// Opens a `.safetensors` file, an index `.json`, or a folder; or, when no local path of
    /// that spelling exists, a Hub repository (`ORG/NAME[@REVISION][/PATH]`) from the local
    /// Hugging Face cache. Fails only when there is nothing to read (no such path or repository,
    /// unreadable, or a folder with no model); problems inside the files are findings.
    pub fn open(path: &Path) -> Result<Model> {
        Model::open_variant(path, None)
    }

    /// [`Model::open`], reading a folder's (or a repository's) save `variant` (`fp16`) where one
    /// is given, as `from_pretrained(..., variant=V)` does (see [`folder::choose_variant`]).
    pub fn open_variant(path: &Path, variant: Option<&str>) -> Result<Model> {
        match crate::source::repo_named(path) {
            Some(repo) => Model::open_repo(&repo, variant),
            None => Model::open_local(path, None, None, variant),
        }
    }

    /// [`Model::open_variant`] of one of two models compared: where it is a file (a
    /// `.safetensors` or `.json` path) it is read as it is, the variant being the other's.
    pub fn open_compared(path: &Path, variant: Option<&str>) -> Result<Model> {
        let is_file = path
            .extension()
            .is_some_and(|extension| extension == "safetensors" || extension == "json");
        Model::open_variant(path, variant.filter(|_| !is_file))
    }

    /// A repository from the local cache; from the Hub when the cache does not hold the
    /// revision asked for, or when it is named with `hf://`, unless `HF_HUB_OFFLINE` is set.
    fn open_repo(repo: &RepoRef, variant: Option<&str>) -> Result<Model> {
        let env = ProcessEnvironment;
        let offline = crate::source::hub::offline(&env);
        let mut not_cached = None;
        if !repo.remote || offline {
            let cache = CacheDir::find(&env).ok_or_else(|| {
                Error::Invalid(format!(
                    "cannot look for `{repo}` in the Hugging Face cache: neither HF_HUB_CACHE, \
                     HF_HOME nor HOME is set"
                ))
            })?;
            match Snapshot::find(&cache, repo) {
                Ok(snapshot) => {
                    let target = snapshot.target();
                    let given_as = repo.to_string();
                    return Model::open_local(
                        &target,
                        Some(&|missing| snapshot.explain_missing(missing)),
                        Some(&given_as),
                        variant,
                    )
                    .map_err(|error| match error {
                        // Components are named as the user named the repository.
                        Error::NoModel { folder, inside } if !inside.is_empty() => {
                            Error::Invalid(format!(
                                "`{repo}` in the Hugging Face cache ({}) holds no .safetensors \
                                 file or index{}",
                                escape_path(&folder),
                                crate::error::models_inside(&repo.to_string(), &inside)
                            ))
                        }
                        error => error,
                    });
                }
                Err(error) if offline => {
                    return Err(Error::Invalid(format!(
                        "{error} (HF_HUB_OFFLINE is set: the Hub is not asked)"
                    )));
                }
                Err(error) => not_cached = Some(error),
            }
        }
        // When the Hub cannot help either, both are said: the user may have meant the cache.
        let also = |error: Error| match &not_cached {
            Some(cache) => Error::Invalid(format!("{error}; and {cache}")),
            None => error,
        };
        let hub = Hub::from_env(&env).map_err(|e| also(Error::Invalid(e.0)))?;
        let headers = crate::source::header_cache::folder(&env);
        super::remote::open(repo, hub, headers.as_deref(), variant).map_err(also)
    }

    /// `given_as` is how the user named `path` when it is not the path itself (a repository in
    /// the cache), for the messages that name its subfolders.
    fn open_local(
        path: &Path,
        hint: Hint<'_>,
        given_as: Option<&str>,
        variant: Option<&str>,
    ) -> Result<Model> {
        let kind = crate::paths::look_at(path).map_err(|error| match hint {
            Some(hint) if error.kind() == io::ErrorKind::NotFound => {
                Error::Invalid(format!("{}: {}", escape_path(path), hint(path)))
            }
            _ => Error::io(path, error),
        })?;
        if kind == crate::paths::Kind::Folder {
            return Model::open_folder(path, hint, given_as, variant);
        }
        if let Some(variant) = variant {
            return Err(not_a_folder(&escape_path(path), variant));
        }
        let is_index = path.extension().is_some_and(|ext| ext == "json");
        if is_index {
            if let Some(error) = not_an_index(path) {
                return Err(error);
            }
            return Model::open_index(path, Source::Index, hint);
        }
        let file = SafetensorsFile::open(path).map_err(|source| Error::io(path, source))?;
        let label = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let mut builder = Builder::new(path, Source::File, hint);
        builder.add_file(label, file);
        Ok(builder.finish())
    }

    fn open_folder(
        folder: &Path,
        hint: Hint<'_>,
        given_as: Option<&str>,
        variant: Option<&str>,
    ) -> Result<Model> {
        let entries = fs::read_dir(folder).map_err(|source| Error::io(folder, source))?;
        let mut names = Vec::new();
        // The first few subfolders (or links to folders), looked into for components. A cache
        // snapshot's files are links: only links are followed to see what they are.
        let mut subfolders = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| Error::io(folder, source))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if subfolders.len() < folder::SUBFOLDERS_LOOKED_AT
                && entry
                    .file_type()
                    .is_ok_and(|t| t.is_dir() || (t.is_symlink() && entry.path().is_dir()))
            {
                subfolders.push(name.clone());
            }
            names.push(name);
        }
        let shown = given_as.map_or_else(|| escape_path(folder), str::to_owned);
        let components = || Components {
            shown: shown.clone(),
            inside: models_in_subfolders(folder, &subfolders),
        };
        let choice = folder::choose_save(names.iter().map(String::as_str), variant)
            .map_err(|why| Error::Invalid(format!("{shown}: {why}")))?;
        match choice {
            None => Err(Error::NoModel {
                folder: folder.to_owned(),
                inside: components().inside,
            }),
            Some(Choice::Index(index)) => {
                let mut model = Model::open_index(&folder.join(&index), Source::Folder, hint)?;
                folder.clone_into(&mut model.path);
                let shards: Vec<String> = model.shards.iter().map(|s| s.label.clone()).collect();
                let left = folder::beside_index(names.iter().map(String::as_str), &index, &shards);
                model.findings.extend(beside_index_note(&index, &left));
                model.findings.extend(components().note());
                Ok(model)
            }
            Some(Choice::Indexes(indexes)) => Err(Error::Invalid(folder::several_indexes(
                &escape_path(folder),
                &indexes,
            ))),
            Some(Choice::Files(files)) => {
                let mut builder = Builder::new(folder, Source::Folder, hint);
                builder.add_paths(folder, files.read.clone());
                builder.finish_folder(&files, &components())
            }
        }
    }

    fn open_index(path: &Path, source: Source, hint: Hint<'_>) -> Result<Model> {
        let file = crate::paths::open_file(path).map_err(|source| Error::io(path, source))?;
        let len = file
            .metadata()
            .map_err(|source| Error::io(path, source))?
            .len();
        let folder = path.parent().unwrap_or(Path::new(""));
        let index_label = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let add_shards = |index: &ShardIndex, early: &mut Early| {
            let mut builder = Builder::new(path, source, hint);
            builder.add_index_findings(index, &index_label);
            builder.follow_index(index);
            builder.expect_tensors(index.weight_map.len());
            // Added in the index's order, each as soon as it is read; those not told of early
            // (all of them for an index not in the canonical form) opened a batch at a time,
            // so that few are held at once.
            let mut unopened: Vec<String> = Vec::new();
            for label in &index.shards {
                match early.take(label) {
                    Some((path, file)) => {
                        builder.add_paths(folder, std::mem::take(&mut unopened));
                        builder.add_opened(label.clone(), path, file);
                    }
                    None => unopened.push(label.clone()),
                }
            }
            builder.add_paths(folder, unopened);
            builder.check_against_index(index, &index_label);
            builder.finish()
        };
        // Parsed where it lies in the page cache, up to a size, each shard read on the other
        // core as soon as the index names it, and added once the index is read; a larger index
        // as it is read, the shards after.
        match usize::try_from(len).ok().filter(|&len| len <= MAPPED_INDEX) {
            Some(len) => rayon::scope(|scope| {
                let (sender, receiver) = std::sync::mpsc::channel();
                let mut told = HashSet::default();
                // Mapped, not copied into the thread's buffer, which would keep its room after.
                let index = super::mapped::with_mapped_pages(&file, 0, len, |pages| {
                    ShardIndex::from_slice_naming(pages.bytes(), &mut |label| {
                        let label = label.to_owned();
                        told.insert(label.clone());
                        let sender = sender.clone();
                        scope.spawn(move |_| {
                            let path = folder.join(&label);
                            let file = SafetensorsFile::open(&path);
                            // The receiver is gone only when the index could not be read.
                            let _ = sender.send((label, (path, file)));
                        });
                    })
                })
                .map_err(|source| Error::io(path, source))?;
                drop(sender);
                let mut early = Early {
                    told,
                    receiver: Some(receiver),
                    arrived: HashMap::default(),
                };
                Ok(add_shards(&index, &mut early))
            }),
            None => Ok(add_shards(&ShardIndex::read(file), &mut Early::none())),
        }
    }

    /// True when the model has files and the reference accepts every one of them.
    pub fn is_valid(&self) -> bool {
        !self.shards.is_empty()
            && self
                .shards
                .iter()
                .all(|shard| shard.readable && shard.rejection.is_none())
    }

    /// The first file the reference rejects, and why.
    pub fn first_rejection(&self) -> Option<(&Shard, &Rejection)> {
        self.shards
            .iter()
            .find_map(|shard| shard.rejection.as_ref().map(|r| (shard, r)))
    }

    pub fn parameter_count(&self) -> u64 {
        self.tensors
            .iter()
            .map(|t| t.info.element_count().unwrap_or(0))
            .fold(0, u64::saturating_add)
    }

    pub fn total_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .map(|t| t.info.byte_len())
            .fold(0, u64::saturating_add)
    }

    /// The sum of the files' sizes.
    pub fn file_bytes(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.file_len)
            .fold(0, u64::saturating_add)
    }

    pub fn shard_of(&self, tensor: &Tensor) -> &Shard {
        &self.shards[tensor.shard]
    }

    /// Where a tensor's bytes are in its file: `(offset, length)`.
    pub fn file_range(&self, tensor: &Tensor) -> (u64, u64) {
        let shard = self.shard_of(tensor);
        let [begin, _] = tensor.info.data_offsets;
        (
            shard.data_start.saturating_add(begin),
            tensor.info.byte_len(),
        )
    }
}

/// Shard files opened side by side and held until added to the model.
const OPEN_BATCH: usize = 64;

/// The error for a variant asked of a file (shown as `shown`): a variant is one of a folder's
/// saves.
pub(super) fn not_a_folder(shown: &str, variant: &str) -> Error {
    Error::Invalid(format!(
        "{shown} is a file: a variant (`{variant}`) is one of a folder's saves; open the folder, \
         or the variant's own file by its path"
    ))
}

/// The error for a JSON file that sits beside a model rather than indexing it (see
/// [`super::index::is_beside_a_model`]); `None` for one read as an index.
fn not_an_index(path: &Path) -> Option<Error> {
    use std::io::Read;
    let name = path.file_name()?.to_string_lossy();
    if super::index::is_named_as_an_index(&name) {
        return None;
    }
    let mut bytes = Vec::new();
    crate::paths::open_file(path)
        .ok()?
        .take(MAPPED_INDEX as u64 + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    if !super::index::is_beside_a_model(&name, &bytes) {
        return None;
    }
    let folder = path
        .parent()
        .filter(|folder| !folder.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    Some(Error::Invalid(super::index::beside_a_model(
        &escape_path(path),
        &escape_path(folder),
    )))
}

/// A shard file read, or why it could not be.
type Opened = (PathBuf, io::Result<SafetensorsFile>);

/// The shards read while the index was read, as they arrive.
struct Early {
    told: HashSet<String>,
    receiver: Option<std::sync::mpsc::Receiver<(String, Opened)>>,
    arrived: HashMap<String, Opened>,
}

impl Early {
    fn none() -> Early {
        Early {
            told: HashSet::default(),
            receiver: None,
            arrived: HashMap::default(),
        }
    }

    /// Shard `label`, once it has been read, if it was told of early. Meanwhile this thread reads
    /// the shards still to read; once none is left to take, it waits.
    fn take(&mut self, label: &str) -> Option<Opened> {
        if !self.told.contains(label) {
            return None;
        }
        loop {
            if let Some(opened) = self.arrived.remove(label) {
                return Some(opened);
            }
            let receiver = self.receiver.as_ref()?;
            let (told, opened) = match receiver.try_recv() {
                Ok(next) => next,
                // Every reader has sent what it read: this one was not read, and is opened
                // again.
                Err(std::sync::mpsc::TryRecvError::Disconnected) => return None,
                Err(std::sync::mpsc::TryRecvError::Empty) => {
                    if rayon::yield_now() == Some(rayon::Yield::Executed) {
                        continue;
                    }
                    receiver.recv().ok()?
                }
            };
            self.arrived.insert(told, opened);
        }
    }
}

/// What the model's source knows of a file that is not there (a snapshot of the Hugging Face
/// cache tells a dangling link from an unfinished download), added to the finding.
type Hint<'a> = Option<&'a (dyn Fn(&Path) -> String + Sync)>;

pub(super) struct Builder<'a> {
    path: PathBuf,
    source: Source,
    shards: Vec<Shard>,
    tensors: Vec<Tensor>,
    metadata: Arc<StringMap>,
    findings: Findings,
    /// Every tensor's index in `tensors`, found by the hash of its name (indexes rather than
    /// names: no name is copied).
    by_name: HashTable<u32>,
    hasher: foldhash::fast::RandomState,
    /// The index's entries not yet met, while the shards added follow them name for name.
    following: Option<Following<'a>>,
    hint: Hint<'a>,
}

/// An index's entries, names and shard labels, in its order.
type Following<'a> = Box<dyn Iterator<Item = (&'a str, &'a str)> + 'a>;

impl<'a> Builder<'a> {
    pub(super) fn new(path: &Path, source: Source, hint: Hint<'a>) -> Self {
        Builder {
            path: path.to_owned(),
            source,
            shards: Vec::new(),
            tensors: Vec::new(),
            metadata: Arc::default(),
            findings: Findings::new(),
            by_name: HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
            following: None,
            hint,
        }
    }

    /// Makes room for `count` tensors at once, as an index says how many its shards hold: the
    /// list and the table of names then grow neither shard by shard nor by rehashing every name.
    pub(super) fn expect_tensors(&mut self, count: usize) {
        if self.following.is_none() {
            let (tensors, hasher) = (&self.tensors, &self.hasher);
            self.by_name
                .reserve(count, |&i| hasher.hash_one(tensors[i as usize].name()));
        }
        self.tensors.reserve(count);
    }

    /// Compares the shards about to be added with the index's entries, in order. While every
    /// tensor added is the index's next entry, in the shard the entry names, the tensors' names
    /// are the index's and so all different: none is looked up, and the table of names is built
    /// only once a shard strays from the index (or a name must be found), from the tensors
    /// added by then. For a model whose index lists its shards' tensors as they are stored,
    /// adding them is then a copy.
    pub(super) fn follow_index(&mut self, index: &'a ShardIndex) {
        if self.tensors.is_empty() {
            self.following = Some(Box::new(index.weight_map.iter()));
        }
    }

    /// Whether the table of names holds every tensor (it holds all or none of them: the tensors
    /// of a single file, and those added while following an index, are left out of it).
    fn indexed(&self) -> bool {
        self.by_name.len() == self.tensors.len()
    }

    /// Puts every tensor added so far in the table of names.
    fn index_every_name(&mut self) {
        if self.indexed() {
            return;
        }
        debug_assert!(self.by_name.is_empty(), "the table holds all names or none");
        let (tensors, hasher) = (&self.tensors, &self.hasher);
        let hash = |i: u32| hasher.hash_one(tensors[i as usize].name());
        self.by_name.reserve(tensors.capacity(), |&i| hash(i));
        for i in 0..tensors.len() {
            let i = u32::try_from(i).unwrap_or(u32::MAX);
            self.by_name.insert_unique(hash(i), i, |&i| hash(i));
        }
    }

    /// Whether `tensors`, of the shard `label`, are the index's next entries (see
    /// [`Builder::follow_index`]); once they are not, no later shard is compared.
    fn in_step_with_index(&mut self, tensors: &[Tensor], label: &str) -> bool {
        let Some(entries) = &mut self.following else {
            return false;
        };
        let in_step = tensors.iter().all(|tensor| {
            entries
                .next()
                .is_some_and(|(name, shard)| name == tensor.name() && shard == label)
        });
        if !in_step {
            self.following = None;
        }
        in_step
    }

    /// The index's own findings, said to be about the index file where they name no file.
    pub(super) fn add_index_findings(&mut self, index: &ShardIndex, index_label: &str) {
        self.findings
            .extend(index.findings.iter().cloned().map(|f| {
                if f.file.is_some() {
                    f
                } else {
                    f.in_file(index_label)
                }
            }));
    }

    /// Opens the files `labels` of `folder`, their headers read in parallel, and adds them in
    /// the order given. A batch at a time, so that the tensor lists read and not yet added stay
    /// a small part of the model's.
    fn add_paths(&mut self, folder: &Path, labels: Vec<String>) {
        use rayon::prelude::*;
        let mut labels = labels.into_iter().peekable();
        while labels.peek().is_some() {
            let batch: Vec<String> = labels.by_ref().take(OPEN_BATCH).collect();
            let opened: Vec<(PathBuf, io::Result<SafetensorsFile>)> = batch
                .par_iter()
                .map(|label| {
                    let path = folder.join(label);
                    let file = SafetensorsFile::open(&path);
                    (path, file)
                })
                .collect();
            for (label, (path, file)) in batch.into_iter().zip(opened) {
                self.add_opened(label, path, file);
            }
        }
    }

    pub(super) fn add_opened(
        &mut self,
        label: String,
        path: PathBuf,
        file: io::Result<SafetensorsFile>,
    ) {
        match file {
            Ok(file) => self.add_file(label, file),
            Err(error) => {
                // The index's entries for this shard are not met: the next shard strays.
                self.following = None;
                let missing = error.kind() == io::ErrorKind::NotFound;
                let code = if missing {
                    Code::ShardMissing
                } else {
                    Code::ShardUnreadable
                };
                let why = match self.hint {
                    Some(hint) if missing => hint(&path),
                    _ if missing && fs::symlink_metadata(&path).is_ok_and(|m| m.is_symlink()) => {
                        format!(
                            "{error}: a dangling link to {}",
                            escape_path(&fs::read_link(&path).unwrap_or_default())
                        )
                    }
                    _ => error.to_string(),
                };
                self.findings.push(
                    Finding::error(code, format!("cannot read `{}`: {why}", escape(&label)))
                        .in_file(&label),
                );
                self.shards.push(Shard {
                    path,
                    label,
                    file_len: 0,
                    header_len: None,
                    data_start: 0,
                    metadata: None,
                    rejection: None,
                    readable: false,
                });
            }
        }
    }

    fn add_file(&mut self, label: String, file: SafetensorsFile) {
        let shard_index = self.shards.len();
        let several = self.source != Source::File;
        let mut findings = file.findings;
        if several {
            findings.in_file(&label);
        }
        self.findings.append(findings);
        let metadata = file.metadata.map(Arc::new);
        if let Some(metadata) = &metadata {
            self.merge_metadata(metadata, &label);
        }
        if several {
            self.add_tensors(file.tensors, shard_index, &label);
        } else {
            // One file: its header already resolved repeated names.
            debug_assert!(self.tensors.is_empty() && shard_index == 0);
            self.tensors = file.tensors;
        }
        self.shards.push(Shard {
            path: file.path,
            label,
            file_len: file.file_len,
            header_len: file.header_len,
            data_start: super::LENGTH_PREFIX.saturating_add(file.header_len.unwrap_or(0)),
            metadata,
            rejection: file.rejection,
            readable: true,
        });
    }

    /// Adds a shard's metadata to the model's: shared when it is the first, merged (a new map,
    /// when it adds keys) after that.
    fn merge_metadata(&mut self, metadata: &Arc<StringMap>, label: &str) {
        if self.metadata.is_empty() {
            self.metadata = Arc::clone(metadata);
            return;
        }
        let mut added = false;
        for (key, value) in metadata.iter() {
            match self.metadata.get(key) {
                None => added = true,
                Some(existing) if existing != value => self.findings.push(
                    Finding::info(
                        Code::MetadataMismatch,
                        format!(
                            "`__metadata__` key `{}` is `{}` here but `{}` in an earlier shard",
                            escape(key),
                            escape(value),
                            escape(existing)
                        ),
                    )
                    .in_file(label),
                ),
                Some(_) => {}
            }
        }
        if added {
            // The earlier shards' values last, so that they win.
            let merged: StringMap = metadata.iter().chain(self.metadata.iter()).collect();
            self.metadata = Arc::new(merged);
        }
    }

    /// The index of the tensor named `name`.
    fn find(&self, name: &str) -> Option<usize> {
        debug_assert!(self.indexed(), "names are looked up once they are indexed");
        let tensors = &self.tensors;
        self.by_name
            .find(self.hasher.hash_one(name), |&i| {
                tensors[i as usize].name() == name
            })
            .map(|&i| i as usize)
    }

    /// Adds the tensors of one shard among several, except those an earlier shard holds (a
    /// shard's own header has already resolved its repeated names): moved in one block, their
    /// names indexed without being copied.
    fn add_tensors(&mut self, mut tensors: Vec<Tensor>, shard: usize, label: &str) {
        if self.in_step_with_index(&tensors, label) && self.by_name.is_empty() {
            for tensor in &mut tensors {
                tensor.shard = shard;
            }
            self.tensors.append(&mut tensors);
            return;
        }
        self.index_every_name();
        let build = &self.hasher;
        let mut name_hashes: Vec<u64> = tensors.iter().map(|t| build.hash_one(t.name())).collect();
        let mut repeated = Vec::new();
        for (i, (tensor, &hash)) in tensors.iter().zip(&name_hashes).enumerate() {
            let earlier = &self.tensors;
            if let Some(&existing) = self
                .by_name
                .find(hash, |&j| earlier[j as usize].name() == tensor.name())
            {
                let first = &self.shards[earlier[existing as usize].shard].label;
                self.findings.push(
                    Finding::error(
                        Code::TensorInTwoShards,
                        format!(
                            "also stored in `{}`; the first copy is shown",
                            escape(first)
                        ),
                    )
                    .for_tensor(tensor.name())
                    .in_file(label),
                );
                repeated.push(i);
            }
        }
        if !repeated.is_empty() {
            let mut at = 0;
            tensors.retain(|_| {
                at += 1;
                repeated.binary_search(&(at - 1)).is_err()
            });
            let mut at = 0;
            name_hashes.retain(|_| {
                at += 1;
                repeated.binary_search(&(at - 1)).is_err()
            });
        }
        for tensor in &mut tensors {
            tensor.shard = shard;
        }
        let start = self.tensors.len();
        self.tensors.append(&mut tensors);
        let (all, hasher) = (&self.tensors, &self.hasher);
        self.by_name.reserve(name_hashes.len(), |&i| {
            hasher.hash_one(all[i as usize].name())
        });
        for (offset, hash) in name_hashes.into_iter().enumerate() {
            let index = u32::try_from(start + offset).unwrap_or(u32::MAX);
            self.by_name
                .insert_unique(hash, index, |&i| hasher.hash_one(all[i as usize].name()));
        }
    }

    pub(super) fn check_against_index(&mut self, index: &ShardIndex, index_label: &str) {
        // Shards that followed the index to its last entry hold its names in its order, each in
        // the shard the index names, and nothing else: there is nothing to walk.
        let followed_to_the_end = self
            .following
            .take()
            .is_some_and(|mut rest| rest.next().is_none());
        if !followed_to_the_end {
            self.index_every_name();
            self.check_index_entries(index, index_label);
        }
        if let Some(declared) = index.total_size {
            let actual = self
                .tensors
                .iter()
                .map(|t| t.info.byte_len())
                .fold(0, u64::saturating_add);
            let all_read = self.shards.iter().all(|s| s.readable);
            if declared != actual && all_read {
                self.findings.push(
                    Finding::warning(
                        Code::IndexTotalSize,
                        format!(
                            "metadata.total_size is {declared} but the tensors hold {actual} bytes"
                        ),
                    )
                    .in_file(index_label),
                );
            }
        }
    }

    /// Each of the index's entries against the shard that holds its tensor, and each tensor
    /// that no entry names.
    fn check_index_entries(&mut self, index: &ShardIndex, index_label: &str) {
        let shard_by_label: HashMap<&str, usize> = self
            .shards
            .iter()
            .enumerate()
            .map(|(i, s)| (s.label.as_str(), i))
            .collect();
        let mut mapped = FixedBitSet::with_capacity(self.tensors.len());
        // The names the index maps to a shard that does not hold them; told in name order.
        let mut misplaced: Vec<(&str, Finding)> = Vec::new();
        // The same shard follows itself in runs: its label is looked up once a run.
        let mut last: Option<(&str, Option<usize>)> = None;
        // Writers list a shard's names in the index as in its header, so the tensor after the one
        // found last is tried first: names are unique, so a match is the one a lookup would find.
        let mut next = 0;
        for (name, shard_label) in index.weight_map.iter() {
            let found = match self.tensors.get(next) {
                Some(tensor) if tensor.name() == name => Some(next),
                _ => self.find(name),
            };
            next = found.map_or(next, |i| i + 1);
            if let Some(i) = found {
                mapped.insert(i);
            }
            let shard = match last {
                Some((label, shard)) if label == shard_label => shard,
                _ => {
                    let shard = shard_by_label.get(shard_label).copied();
                    last = Some((shard_label, shard));
                    shard
                }
            };
            let Some(shard) = shard else {
                continue;
            };
            if !self.shards[shard].readable {
                continue;
            }
            let held = found.map(|i| self.tensors[i].shard);
            if held != Some(shard) {
                let elsewhere = held.map_or_else(String::new, |other| {
                    format!(" (it is in `{}`)", escape(&self.shards[other].label))
                });
                let finding = Finding::error(
                    Code::IndexTensorMissing,
                    format!(
                        "the index maps this tensor to `{}`, which does not hold it{elsewhere}",
                        escape(shard_label)
                    ),
                )
                .for_tensor(name)
                .in_file(index_label);
                misplaced.push((name, finding));
            }
        }
        misplaced.sort_unstable_by(|a, b| a.0.cmp(b.0));
        self.findings
            .extend(misplaced.into_iter().map(|(_, finding)| finding));
        mapped.toggle_range(..);
        for tensor in mapped.ones().map(|i| &self.tensors[i]) {
            self.findings.push(
                Finding::warning(
                    Code::TensorNotInIndex,
                    "stored in a shard but not in the index's weight_map: loaders that follow the index will not find it",
                )
                .for_tensor(tensor.info.name.as_str())
                .in_file(&self.shards[tensor.shard].label),
            );
        }
    }

    /// Finishes a model read from a folder's `files` with no index: notes the files passed
    /// over, and refuses parts that hold the same tensor, which are separate models.
    pub(super) fn finish_folder(mut self, files: &Files, components: &Components) -> Result<Model> {
        if let [read] = &files.read[..]
            && !files.left.is_empty()
        {
            let beside = format!("`{}`", escape(read));
            self.findings
                .push(other_files(&beside, "that file alone", &files.left));
        }
        if files.parts
            && let Some(twice) = self
                .findings
                .iter()
                .find(|f| f.code == Code::TensorInTwoShards)
        {
            let name = twice.tensor.as_deref().unwrap_or_default();
            let second = twice.file.as_deref().unwrap_or_default();
            let hash = self.hasher.hash_one(name);
            let first = self
                .by_name
                .find(hash, |&j| self.tensors[j as usize].name() == name)
                .map_or("", |&j| {
                    self.shards[self.tensors[j as usize].shard].label.as_str()
                });
            return Err(Error::Invalid(format!(
                "{}: {} .safetensors files and no index, and they are separate models (`{}` and \
                 `{}` both hold `{}`): open one of them by its path, e.g. {}{}",
                escape_path(&self.path),
                files.read.len(),
                escape(first),
                escape(second),
                escape(name),
                escape_path(&self.path.join(first)),
                crate::error::models_inside(&components.shown, &components.inside),
            )));
        }
        if files.parts {
            self.findings.push(Finding::info(
                Code::FolderParts,
                format!(
                    "read side by side as one model, with no index to say they are one: {} (each \
                     opens alone by its path)",
                    folder::listed(&files.read)
                ),
            ));
        }
        self.note_components(components);
        Ok(self.finish())
    }

    /// Notes the files and indexes of the folder that a model read through the index
    /// `index_label` leaves out ([`folder::beside_index`]).
    pub(super) fn note_beside_index(&mut self, index_label: &str, left: &[String]) {
        self.findings.extend(beside_index_note(index_label, left));
    }

    pub(super) fn note_components(&mut self, components: &Components) {
        self.findings.extend(components.note());
    }

    pub(super) fn finish(self) -> Model {
        Model {
            path: self.path,
            source: self.source,
            shards: self.shards,
            tensors: self.tensors,
            metadata: self.metadata,
            findings: self.findings,
            remote: None,
        }
    }
}

/// The note naming a folder's `.safetensors` files (and indexes) that its model, read from
/// `beside` as its loaders read it (`loaders_read`), leaves out.
fn other_files(beside: &str, loaders_read: &str, left: &[String]) -> Finding {
    let variants = folder::variants_in(left.iter().map(String::as_str));
    let or_variant = if variants.is_empty() {
        String::new()
    } else {
        format!(
            ", or a variant with --variant: {}",
            folder::listed(&variants)
        )
    };
    Finding::info(
        Code::FolderOtherFiles,
        format!(
            "not read beside {beside}: {} (loaders read {loaders_read}; open another by its \
             path{or_variant})",
            folder::listed(left)
        ),
    )
}

/// The note naming what a folder's `index` leaves out; `None` when it leaves nothing out.
fn beside_index_note(index: &str, left: &[String]) -> Option<Finding> {
    (!left.is_empty()).then(|| {
        let beside = format!("`{}` and the shards it names", escape(index));
        other_files(&beside, "those alone", left)
    })
}

/// A folder's subfolders that hold models of their own (a diffusers pipeline's components), and
/// the folder as the user named it.
pub(super) struct Components {
    pub(super) shown: String,
    pub(super) inside: Vec<String>,
}

impl Components {
    /// The note naming them beside the folder's own model; `None` when there are none.
    pub(super) fn note(&self) -> Option<Finding> {
        crate::error::subfolders_hold_models(&self.shown, &self.inside, ", not read with this one")
            .map(|said| Finding::info(Code::FolderComponents, said))
    }
}
