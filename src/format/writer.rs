//! Writing safetensors files laid out as the reference writer lays them out, atomically.
//!
//! Tensors go in order of dtype rank (largest first) then name, back to back from offset 0, so
//! each starts aligned to its element size; the header is compact JSON with `__metadata__` first,
//! padded with spaces to a multiple of 8. Unlike the reference writer, an empty metadata map with
//! no tensors gives a valid header, and a repeated name is an error, not a panic.
//!
//! Nothing of a header is held in memory: the writer asks its [`Specs`] for each tensor's name,
//! dtype and shape when it needs them, measures the header's JSON by writing it to a counter,
//! and writes it again straight into the file. A header can be 100 MB and a model's tensor list
//! is already in memory; a second copy of either would double what writing costs.

use super::{Dtype, MAX_HEADER_LEN, Shape};
use crate::error::{Error, Result};
use serde::de::{self, DeserializeSeed, MapAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeStruct, Serializer};
use std::cmp::Ordering;
use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// A tensor's name: a stem and a fixed suffix (`….weight` and `_scale`), so a name derived from
/// another needs no string of its own.
#[derive(Clone, Copy, Debug)]
pub struct Name<'a> {
    pub stem: &'a str,
    pub suffix: &'static str,
}

impl<'a> Name<'a> {
    pub fn new(name: &'a str) -> Self {
        Name {
            stem: name,
            suffix: "",
        }
    }

    fn bytes(self) -> impl Iterator<Item = u8> + 'a {
        self.stem.bytes().chain(self.suffix.bytes())
    }

    fn is(self, text: &str) -> bool {
        text.len() == self.stem.len() + self.suffix.len()
            && text.starts_with(self.stem)
            && text.ends_with(self.suffix)
    }
}

impl Ord for Name<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        if self.suffix.is_empty() && other.suffix.is_empty() {
            self.stem.cmp(other.stem)
        } else {
            self.bytes().cmp(other.bytes())
        }
    }
}

impl PartialOrd for Name<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Name<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Name<'_> {}

impl fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.stem)?;
        f.write_str(self.suffix)
    }
}

impl Serialize for Name<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// The tensors of a file to write, by index: everything but their bytes.
pub trait Specs {
    fn count(&self) -> usize;
    fn name(&self, index: usize) -> Name<'_>;
    fn dtype(&self, index: usize) -> Dtype;
    fn shape(&self, index: usize) -> Shape;

    /// Bytes of data, `None` when the shape overflows or does not fill whole bytes.
    fn byte_len(&self, index: usize) -> Option<u64> {
        let count = self.shape(index).iter().try_fold(1u64, u64::checked_mul)?;
        self.dtype(index).byte_len(count)
    }
}

/// A tensor to write, held whole: for models built in memory (the demo, tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Shape,
}

impl TensorSpec {
    pub fn new(name: impl Into<String>, dtype: Dtype, shape: &[u64]) -> Self {
        TensorSpec {
            name: name.into(),
            dtype,
            shape: Shape::from_slice(shape),
        }
    }
}

impl Specs for [TensorSpec] {
    fn count(&self) -> usize {
        self.len()
    }
    fn name(&self, index: usize) -> Name<'_> {
        Name::new(&self[index].name)
    }
    fn dtype(&self, index: usize) -> Dtype {
        self[index].dtype
    }
    fn shape(&self, index: usize) -> Shape {
        self[index].shape.clone()
    }
}

/// `__metadata__`'s entries, each key once, in the order to write them; cloned to go over them
/// again (measuring, writing, reading back).
pub trait Metadata<'a>: Iterator<Item = (&'a str, &'a str)> + Clone {}

impl<'a, I: Iterator<Item = (&'a str, &'a str)> + Clone> Metadata<'a> for I {}

/// Where each tensor goes and how long the header is; the header itself is written from the
/// specs when the file is.
pub struct FileLayout<'a, S: ?Sized, M> {
    specs: &'a S,
    metadata: Option<M>,
    /// Indices into the specs, in the order their data is written.
    order: Vec<u32>,
    /// Bytes of the header's JSON, and of it padded.
    json_len: u64,
    header_len: u64,
    /// Bytes of the data section.
    data_len: u64,
}

impl<'a, S: Specs + ?Sized, M: Metadata<'a>> FileLayout<'a, S, M> {
    /// Plans a file of `specs`, with `__metadata__` first when `metadata` is given.
    pub fn plan(specs: &'a S, metadata: Option<M>) -> Result<Self> {
        let count = specs.count();
        if (0..count).any(|i| specs.name(i).is("__metadata__")) {
            return Err(Error::Invalid("`__metadata__` cannot name a tensor".into()));
        }
        let count32 = u32::try_from(count)
            .map_err(|_| Error::Invalid("too many tensors for one file".into()))?;
        let mut order: Vec<u32> = (0..count32).collect();
        // Repeated names found by sorting, not through a set of the names: a header can hold a
        // million.
        order.sort_unstable_by(|&a, &b| specs.name(a as usize).cmp(&specs.name(b as usize)));
        if let Some(pair) = order
            .windows(2)
            .find(|pair| specs.name(pair[0] as usize) == specs.name(pair[1] as usize))
        {
            return Err(Error::Invalid(format!(
                "tensor `{}` is given twice",
                crate::text::escape(&specs.name(pair[0] as usize).to_string())
            )));
        }
        // Names are unique, so a stable sort by rank keeps name order within a rank.
        order.sort_by_key(|&i| std::cmp::Reverse(specs.dtype(i as usize).rank()));
        let mut data_len = 0u64;
        for &index in &order {
            let index = index as usize;
            let len = specs.byte_len(index).ok_or_else(|| {
                Error::Invalid(format!(
                    "tensor `{}`: {} of shape {:?} does not fill a whole number of bytes",
                    crate::text::escape(&specs.name(index).to_string()),
                    specs.dtype(index),
                    specs.shape(index)
                ))
            })?;
            data_len = data_len
                .checked_add(len)
                .ok_or_else(|| Error::Invalid("the tensors' total size overflows".into()))?;
        }
        let mut layout = FileLayout {
            specs,
            metadata,
            order,
            json_len: 0,
            header_len: 0,
            data_len,
        };
        let mut counter = Counted {
            inner: io::sink(),
            bytes: 0,
        };
        serde_json::to_writer(&mut counter, &HeaderJson(&layout))
            .map_err(|e| Error::Invalid(format!("cannot encode the header: {e}")))?;
        layout.json_len = counter.bytes;
        layout.header_len = counter.bytes.next_multiple_of(8);
        if layout.header_len > MAX_HEADER_LEN {
            return Err(Error::Invalid(format!(
                "the header would be {} bytes, over the format's limit of {MAX_HEADER_LEN}",
                layout.header_len
            )));
        }
        Ok(layout)
    }

    /// Pads the header with spaces to `header_len` bytes (a multiple of 8), as a file written
    /// before with a header that long was: false, and the layout left as it was, where the
    /// header's JSON does not fit.
    pub fn pad_header_to(&mut self, header_len: u64) -> bool {
        let fits = self.json_len <= header_len && header_len.is_multiple_of(8);
        if fits {
            self.header_len = header_len;
        }
        fits
    }

    pub fn specs(&self) -> &'a S {
        self.specs
    }

    /// Bytes of the padded JSON header, without its length prefix.
    pub fn header_len(&self) -> u64 {
        self.header_len
    }

    /// Bytes of the whole file.
    pub fn file_len(&self) -> u64 {
        super::LENGTH_PREFIX + self.header_len + self.data_len
    }

    /// Each spec's index and `[begin, end)` in the data section, in the order the data is written.
    pub fn placed(&self) -> impl Iterator<Item = (usize, [u64; 2])> + '_ {
        self.order.iter().scan(0u64, |cursor, &index| {
            let index = index as usize;
            // Planning found every length.
            let begin = *cursor;
            *cursor += self.specs.byte_len(index).unwrap_or(0);
            Some((index, [begin, *cursor]))
        })
    }

    /// Each spec's bytes in the file, by spec index: `(offset from the file's start, length)`.
    pub fn ranges_in_file(&self) -> Vec<(u64, u64)> {
        let data_start = super::LENGTH_PREFIX + self.header_len;
        let mut ranges = vec![(0, 0); self.specs.count()];
        for (spec, [begin, end]) in self.placed() {
            ranges[spec] = (data_start + begin, end - begin);
        }
        ranges
    }

    /// Writes the file to `out`: the header, then each tensor's bytes from `write_tensor(spec
    /// index, out)`, which must write exactly that tensor's length.
    pub fn write<W: Write>(
        &self,
        out: &mut W,
        mut write_tensor: impl FnMut(usize, &mut W) -> io::Result<()>,
    ) -> io::Result<()> {
        out.write_all(&self.header_len.to_le_bytes())?;
        let mut counted = Counted {
            inner: &mut *out,
            bytes: 0,
        };
        serde_json::to_writer(&mut counted, &HeaderJson(self))?;
        if counted.bytes != self.json_len {
            return Err(io::Error::other(
                "the header came out a different length than planned",
            ));
        }
        let mut padding = self.header_len - self.json_len;
        while padding > 0 {
            let spaces = [b' '; 64];
            let run = usize::try_from(padding).map_or(spaces.len(), |p| p.min(spaces.len()));
            out.write_all(&spaces[..run])?;
            padding -= run as u64;
        }
        for &index in &self.order {
            write_tensor(index as usize, out)?;
        }
        Ok(())
    }

    /// Reads `file` (the file at `path`) back and says how it differs from this layout, `None`
    /// when it holds exactly the planned header (every entry in order, the metadata, the
    /// padding) and is exactly as long as planned. A planned layout is valid by construction
    /// (unique names, lengths from shapes, offsets back to back from 0), so a file that matches
    /// it is valid too.
    pub fn differences(&self, file: File, path: &Path) -> Result<Option<String>> {
        let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        if file_len != self.file_len() {
            return Ok(Some(format!(
                "{file_len} bytes long, not the {} planned",
                self.file_len()
            )));
        }
        let mut reader = BufReader::new(file);
        let mut prefix = [0u8; 8];
        reader
            .read_exact(&mut prefix)
            .map_err(|e| Error::io(path, e))?;
        if u64::from_le_bytes(prefix) != self.header_len {
            return Ok(Some("the header length is not the planned one".into()));
        }
        let mut json = serde_json::Deserializer::from_reader(reader.take(self.header_len));
        let read = HeaderBack(self)
            .deserialize(&mut json)
            .and_then(|()| json.end());
        match read {
            Ok(()) => Ok(None),
            Err(error) if error.is_io() => Err(Error::io(path, error.into())),
            Err(error) => Ok(Some(format!("the header read back differs: {error}"))),
        }
    }
}

impl<S: ?Sized, M> fmt::Debug for FileLayout<'_, S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileLayout")
            .field("tensors", &self.order.len())
            .field("header_len", &self.header_len)
            .field("data_len", &self.data_len)
            .finish_non_exhaustive()
    }
}

/// Counts the bytes written through it.
struct Counted<W> {
    inner: W,
    bytes: u64,
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.bytes += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Writes `path` through a temporary file in the same folder, synced and then renamed into place,
/// so the path holds either its old contents or the whole new file, never a part.
pub fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<WriteBehind<'_>>) -> io::Result<()>,
) -> Result<()> {
    let file = AtomicFile::create(path)?;
    file.write(write).map_err(|e| Error::io(path, e))?;
    file.persist()
}

/// A file written through a temporary file in the same folder (see [`write_atomically`]), which
/// can be written more than once before it is put in place: a write that stopped part of the way
/// leaves what it wrote for the next to go on from. Dropped without [`AtomicFile::persist`], the
/// temporary file is removed and `path` left as it was.
#[derive(Debug)]
pub struct AtomicFile {
    path: PathBuf,
    temp: tempfile::NamedTempFile,
}

impl AtomicFile {
    pub fn create(path: &Path) -> Result<Self> {
        let folder = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        let mut builder = tempfile::Builder::new();
        builder.prefix(".stui-tmp-").suffix(".partial");
        #[cfg(unix)]
        builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644));
        let temp = builder
            .tempfile_in(folder)
            .map_err(|e| Error::io(folder, without_temporary_name(e)))?;
        // Held while the file is written, so that another save into the same folder, which
        // clears the temporaries an interrupted save left there, leaves this one alone. Where
        // the file system has no locks the write goes on unguarded.
        let _ = temp.as_file().try_lock();
        Ok(AtomicFile {
            path: path.to_owned(),
            temp,
        })
    }

    /// Writes from the file's start through `write`, which may pass over parts written before.
    /// What `write` wrote reaches the file even when it fails; where that fails too, its error
    /// is the one given, so that an error of `write`'s own says all it wrote is in the file.
    pub fn write(
        &self,
        write: impl FnOnce(&mut BufWriter<WriteBehind<'_>>) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut out = BufWriter::with_capacity(1 << 20, WriteBehind::new(self.temp.as_file()));
        let written = write(&mut out);
        match (written, out.flush()) {
            (Ok(()), flushed) => flushed,
            (Err(error), Ok(())) => Err(error),
            (Err(_), Err(unflushed)) => Err(unflushed),
        }
    }

    /// Cuts the file to `len` bytes: a write that went on from an earlier one can leave bytes of
    /// it past its own end.
    pub fn set_len(&self, len: u64) -> Result<()> {
        self.temp
            .as_file()
            .set_len(len)
            .map_err(|e| Error::io(&self.path, e))
    }

    /// The file as written so far, opened afresh for reading it back before it is in place.
    pub fn reopen(&self) -> Result<File> {
        self.temp.reopen().map_err(|e| Error::io(&self.path, e))
    }

    /// Where the file is written until it is put in place.
    pub fn temporary_path(&self) -> &Path {
        self.temp.path()
    }

    /// Syncs the file and renames it into place.
    pub fn persist(self) -> Result<()> {
        self.stage()?.persist()
    }

    /// Syncs and closes the file, to be put in place later, with others written beside it.
    pub fn stage(self) -> Result<Staged> {
        self.temp
            .as_file()
            .sync_all()
            .map_err(|e| Error::io(&self.path, e))?;
        Ok(Staged {
            path: self.path,
            temp: self.temp.into_temp_path(),
        })
    }
}

/// A file written and synced but not yet in place (see [`AtomicFile::stage`]): it holds no open
/// file, so that the files of a model of many shards can wait together; dropped, its temporary
/// file is removed.
#[derive(Debug)]
pub struct Staged {
    path: PathBuf,
    temp: tempfile::TempPath,
}

impl Staged {
    /// Renames the file into place.
    pub fn persist(self) -> Result<()> {
        self.temp
            .persist(&self.path)
            .map_err(|e| Error::io(&self.path, e.error))
    }
}

/// A file written from its start, whose every written part is sent on to the disk at once
/// rather than left in the page cache until the closing sync: the disk then writes while the rest
/// of the file is being made, and the sync waits only for the last part. (Saving a quantized
/// model, the sync of a file left whole to the end was a fifth of the time.)
#[derive(Debug)]
pub struct WriteBehind<'f> {
    file: &'f std::fs::File,
    written: u64,
    sent: u64,
}

impl<'f> WriteBehind<'f> {
    /// Written bytes are sent on to the disk in parts of this size.
    const PART: u64 = 16 << 20;

    fn new(file: &'f std::fs::File) -> Self {
        WriteBehind {
            file,
            written: 0,
            sent: 0,
        }
    }

    /// The file written, for bytes written at their offsets by another thread
    /// ([`crate::format::write_all_at`], then [`start_disk_write`]).
    pub fn file(&self) -> &'f std::fs::File {
        self.file
    }

    /// Moves on past the next `len` bytes, left to be written at their offsets.
    pub fn skip(&mut self, len: u64) {
        self.written += len;
    }
}

impl Write for WriteBehind<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // At its offset, not through the file's position: skipping a part costs no call.
        super::write_all_at(self.file, buf, self.written)?;
        let written = buf.len();
        self.written += written as u64;
        if self.written - self.sent >= Self::PART {
            start_disk_write(self.file, self.sent, self.written - self.sent);
            self.sent = self.written;
        }
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// Starts writing `len` bytes of `file` from `offset` to the disk, without waiting for them.
#[cfg(target_os = "linux")]
#[expect(unsafe_code, reason = "a call into the C library")]
pub fn start_disk_write(file: &std::fs::File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    // SAFETY: the descriptor is open for as long as `file` is borrowed, and the call only reads
    // its arguments. A failure leaves the bytes to the closing sync, which reports any error.
    let _ = unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE)
    };
}

#[cfg(not(target_os = "linux"))]
pub fn start_disk_write(_: &std::fs::File, _: u64, _: u64) {}

/// Allocates the first `len` bytes of `file` on the disk before they are written. ext4 then finds
/// the blocks once, where it otherwise reserved each one as its page of the cache was written, and
/// allocated them as the pages went to the disk: a save took a tenth less time (BENCHMARKS.md). A
/// file system that allocates no blocks ahead is left to do as before.
#[cfg(target_os = "linux")]
#[expect(unsafe_code, reason = "a call into the C library")]
pub fn allocate(file: &std::fs::File, len: u64) {
    use std::os::fd::AsRawFd;
    let Ok(len) = i64::try_from(len) else {
        return;
    };
    // SAFETY: the descriptor is open for as long as `file` is borrowed, and the call only reads
    // its arguments. A failure (no room, no support) leaves the writes to find out for
    // themselves, as they would have without it.
    let _ = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
}

#[cfg(not(target_os = "linux"))]
pub fn allocate(_: &std::fs::File, _: u64) {}

/// `tempfile` adds the temporary file's name to its errors; the user never asked for that file,
/// so the error is told by its kind, beside the folder.
fn without_temporary_name(error: io::Error) -> io::Error {
    if error.get_ref().is_some() {
        io::Error::from(error.kind())
    } else {
        error
    }
}

struct HeaderJson<'l, 'a, S: ?Sized, M>(&'l FileLayout<'a, S, M>);

impl<'a, S: Specs + ?Sized, M: Metadata<'a>> Serialize for HeaderJson<'_, 'a, S, M> {
    fn serialize<Z: Serializer>(&self, serializer: Z) -> Result<Z::Ok, Z::Error> {
        let layout = self.0;
        let mut map = serializer.serialize_map(Some(layout.order.len() + 1))?;
        if let Some(metadata) = &layout.metadata {
            map.serialize_entry("__metadata__", &MetadataJson(metadata.clone()))?;
        }
        for (index, offsets) in layout.placed() {
            map.serialize_entry(
                &layout.specs.name(index),
                &EntryJson {
                    dtype: layout.specs.dtype(index),
                    shape: layout.specs.shape(index),
                    offsets,
                },
            )?;
        }
        map.end()
    }
}

struct MetadataJson<M>(M);

impl<'a, M: Metadata<'a>> Serialize for MetadataJson<M> {
    fn serialize<Z: Serializer>(&self, serializer: Z) -> Result<Z::Ok, Z::Error> {
        serializer.collect_map(self.0.clone())
    }
}

struct EntryJson {
    dtype: Dtype,
    shape: Shape,
    offsets: [u64; 2],
}

impl Serialize for EntryJson {
    fn serialize<Z: Serializer>(&self, serializer: Z) -> Result<Z::Ok, Z::Error> {
        let mut entry = serializer.serialize_struct("TensorInfo", 3)?;
        entry.serialize_field("dtype", self.dtype.name())?;
        entry.serialize_field("shape", &self.shape)?;
        entry.serialize_field("data_offsets", &self.offsets)?;
        entry.end()
    }
}

/// Reads a header back, entry by entry, against its layout; fails at the first difference.
struct HeaderBack<'l, 'a, S: ?Sized, M>(&'l FileLayout<'a, S, M>);

impl<'de, 'a, S: Specs + ?Sized, M: Metadata<'a>> DeserializeSeed<'de>
    for HeaderBack<'_, 'a, S, M>
{
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, 'a, S: Specs + ?Sized, M: Metadata<'a>> Visitor<'de> for HeaderBack<'_, 'a, S, M> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the planned header")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let layout = self.0;
        let differs = |what: String| de::Error::custom(what);
        if let Some(metadata) = &layout.metadata {
            match map.next_key::<String>()?.as_deref() {
                Some("__metadata__") => map.next_value_seed(MetadataBack(metadata.clone()))?,
                _ => return Err(differs("the metadata is not first".into())),
            }
        }
        for (index, offsets) in layout.placed() {
            let name = layout.specs.name(index);
            let named = |what: &str| {
                differs(format!(
                    "`{}` {what}",
                    crate::text::escape(&name.to_string())
                ))
            };
            match map.next_key::<String>()? {
                Some(key) if name.is(&key) => {}
                Some(_) => return Err(named("is not where it was planned")),
                None => return Err(named("is missing")),
            }
            let entry: EntryBack = map.next_value()?;
            let shape = layout.specs.shape(index);
            if entry.dtype != layout.specs.dtype(index).name()
                || !entry.shape.iter().copied().eq(shape.iter())
                || entry.data_offsets != offsets
            {
                return Err(named("is not as planned"));
            }
        }
        match map.next_key::<String>()? {
            Some(key) => Err(differs(format!(
                "`{}` was not planned",
                crate::text::escape(&key)
            ))),
            None => Ok(()),
        }
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryBack {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

struct MetadataBack<M>(M);

impl<'de, 'a, M: Metadata<'a>> DeserializeSeed<'de> for MetadataBack<M> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, 'a, M: Metadata<'a>> Visitor<'de> for MetadataBack<M> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the planned metadata")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        for (key, value) in self.0 {
            let same =
                map.next_key_seed(Same(key))? == Some(true) && map.next_value_seed(Same(value))?;
            if !same {
                return Err(de::Error::custom(format!(
                    "the metadata's `{}` is not as planned",
                    crate::text::escape(key)
                )));
            }
        }
        match map.next_key::<de::IgnoredAny>()? {
            Some(_) => Err(de::Error::custom("the metadata has entries not planned")),
            None => Ok(()),
        }
    }
}

/// Whether a string read is this one, compared where the parser holds it: a metadata value can
/// be 100 MB.
struct Same<'a>(&'a str);

impl<'de> DeserializeSeed<'de> for Same<'_> {
    type Value = bool;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for Same<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<bool, E> {
        Ok(text == self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::StringMap;

    fn plan<'a>(
        specs: &'a [TensorSpec],
        metadata: Option<&'a StringMap>,
    ) -> Result<FileLayout<'a, [TensorSpec], impl Metadata<'a>>> {
        FileLayout::plan(specs, metadata.map(StringMap::iter))
    }

    fn bytes<'a>(layout: &FileLayout<'a, [TensorSpec], impl Metadata<'a>>) -> Vec<u8> {
        let mut bytes = Vec::new();
        layout
            .write(&mut bytes, |index, out| {
                let len = layout.specs.byte_len(index).unwrap();
                out.extend(std::iter::repeat_n(7, usize::try_from(len).unwrap()));
                Ok(())
            })
            .unwrap();
        assert_eq!(bytes.len() as u64, layout.file_len());
        bytes
    }

    #[test]
    fn matches_the_reference_layout_byte_for_byte() {
        // The reference's own example: one I32 [2, 2] tensor "test" gives a 60-byte JSON padded to 64.
        let specs = [TensorSpec::new("test", Dtype::I32, &[2, 2])];
        let file = bytes(&plan(&specs, None).unwrap());
        assert_eq!(&file[..8], &64u64.to_le_bytes());
        assert_eq!(
            std::str::from_utf8(&file[8..72]).unwrap(),
            "{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}    "
        );
        assert_eq!(file.len(), 72 + 16);
        let empty = bytes(&plan(&[], None).unwrap());
        assert_eq!(empty, b"\x08\0\0\0\0\0\0\0{}      ");
    }

    #[test]
    fn orders_by_dtype_rank_then_name() {
        let specs = [
            TensorSpec::new("b", Dtype::U8, &[3]),
            TensorSpec::new("a", Dtype::F32, &[1]),
            TensorSpec::new("c", Dtype::F64, &[1]),
            TensorSpec::new("a2", Dtype::F32, &[1]),
        ];
        let layout = plan(&specs, None).unwrap();
        assert_eq!(
            layout.placed().collect::<Vec<_>>(),
            [(2, [0, 8]), (1, [8, 12]), (3, [12, 16]), (0, [16, 19])]
        );
    }

    #[test]
    fn names_with_suffixes_sort_and_compare_as_the_whole_name() {
        let scale = Name {
            stem: "a.weight",
            suffix: "_scale",
        };
        assert!(Name::new("a.weight") < scale);
        assert!(scale < Name::new("a.weight_t"));
        assert!(Name::new("a.weight_scale") == scale);
        assert!(scale.is("a.weight_scale") && !scale.is("a.weight_scal"));
        assert_eq!(scale.to_string(), "a.weight_scale");
    }

    #[test]
    fn refuses_a_name_given_twice_or_naming_the_metadata() {
        let twice = [
            TensorSpec::new("a", Dtype::U8, &[1]),
            TensorSpec::new("b", Dtype::F32, &[1]),
            TensorSpec::new("a", Dtype::F32, &[1]),
        ];
        let error = plan(&twice, None).err().unwrap().to_string();
        assert!(error.contains("`a` is given twice"), "{error}");
        let metadata = [TensorSpec::new("__metadata__", Dtype::U8, &[1])];
        assert!(plan(&metadata, None).is_err());
    }

    #[test]
    fn avoids_the_reference_writer_bugs() {
        let empty_metadata = StringMap::default();
        let file = bytes(&plan(&[], Some(&empty_metadata)).unwrap());
        assert!(file[8..].starts_with(b"{\"__metadata__\":{}}"));
        let twice = [
            TensorSpec::new("a", Dtype::U8, &[1]),
            TensorSpec::new("a", Dtype::U8, &[1]),
        ];
        assert!(plan(&twice, None).is_err());
        assert!(plan(&[TensorSpec::new("a", Dtype::F4, &[3])], None).is_err());
    }

    #[test]
    fn a_file_read_back_matches_its_layout_and_any_change_is_found() {
        let metadata: StringMap = [("format", "pt"), ("note", "\u{1b}[31m")]
            .into_iter()
            .collect();
        let specs = [
            TensorSpec::new("w", Dtype::F32, &[2, 3]),
            TensorSpec::new("b\"q", Dtype::U8, &[5]),
        ];
        let layout = plan(&specs, Some(&metadata)).unwrap();
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("m.safetensors");
        let file = bytes(&layout);
        std::fs::write(&path, &file).unwrap();
        assert_eq!(
            layout
                .differences(File::open(&path).unwrap(), &path)
                .unwrap(),
            None
        );
        let header_end = 8 + usize::try_from(layout.header_len()).unwrap();
        let header = std::str::from_utf8(&file[8..header_end]).unwrap();
        for (from, to) in [
            ("[2,3]", "[3,2]"),
            ("\"U8\"", "\"I8\""),
            ("[24,29]", "[24,28]"),
            ("\"pt\"", "\"np\""),
            ("\"w\"", "\"v\""),
        ] {
            let mut changed = file.clone();
            changed[8..header_end].copy_from_slice(header.replacen(from, to, 1).as_bytes());
            std::fs::write(&path, &changed).unwrap();
            assert!(
                layout
                    .differences(File::open(&path).unwrap(), &path)
                    .unwrap()
                    .is_some(),
                "{from} -> {to}"
            );
        }
        std::fs::write(&path, &file[..file.len() - 1]).unwrap();
        assert!(
            layout
                .differences(File::open(&path).unwrap(), &path)
                .unwrap()
                .is_some()
        );
        let valid = crate::format::SafetensorsFile::from_bytes(&path, &file);
        assert!(valid.is_valid());
    }
}
