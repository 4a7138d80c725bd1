//! Writing safetensors files laid out as the reference writer lays them out, atomically.
//!
//! Tensors go in order of dtype rank (largest first) then name, back to back from offset 0, so
//! each starts aligned to its element size; the header is compact JSON with `__metadata__` first,
//! padded with spaces to a multiple of 8. Unlike the reference writer, an empty metadata map with
//! no tensors gives a valid header, and a repeated name is an error, not a panic.

use super::{Dtype, MAX_HEADER_LEN, StringMap};
use crate::error::{Error, Result};
use serde::ser::{Serialize, SerializeMap, SerializeStruct, Serializer};
use std::io::{self, BufWriter, Write};
use std::path::Path;

/// A tensor to write: everything but its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
}

impl TensorSpec {
    pub fn new(name: impl Into<String>, dtype: Dtype, shape: &[u64]) -> Self {
        TensorSpec {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
        }
    }

    /// Bytes of data, `None` when the shape overflows or does not fill whole bytes.
    pub fn byte_len(&self) -> Option<u64> {
        let count = self.shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d))?;
        self.dtype.byte_len(count)
    }
}

/// Where each tensor goes, and the header bytes (length prefix included) that describe it.
#[derive(Debug)]
pub struct FileLayout {
    /// The length prefix and the padded JSON header.
    pub header: Vec<u8>,
    /// Indices into the specs, in the order their data is written.
    pub order: Vec<usize>,
    /// `[begin, end)` of each spec's data, by spec index.
    pub offsets: Vec<[u64; 2]>,
    /// Bytes of the data section.
    pub data_len: u64,
}

impl FileLayout {
    pub fn plan(specs: &[TensorSpec], metadata: Option<&StringMap>) -> Result<Self> {
        if specs.iter().any(|spec| spec.name == "__metadata__") {
            return Err(Error::Invalid("`__metadata__` cannot name a tensor".into()));
        }
        // Repeated names found by sorting indexes, not through a set of the names: a header can
        // hold a million.
        let mut by_name: Vec<u32> = (0..specs.len())
            .filter_map(|i| u32::try_from(i).ok())
            .collect();
        by_name.sort_unstable_by(|&a, &b| specs[a as usize].name.cmp(&specs[b as usize].name));
        if let Some(pair) = by_name
            .windows(2)
            .find(|pair| specs[pair[0] as usize].name == specs[pair[1] as usize].name)
        {
            return Err(Error::Invalid(format!(
                "tensor `{}` is given twice",
                specs[pair[0] as usize].name
            )));
        }
        drop(by_name);
        let mut order: Vec<usize> = (0..specs.len()).collect();
        order.sort_by(|&a, &b| {
            let (a, b) = (&specs[a], &specs[b]);
            b.dtype
                .rank()
                .cmp(&a.dtype.rank())
                .then_with(|| a.name.cmp(&b.name))
        });
        let mut offsets = vec![[0, 0]; specs.len()];
        let mut cursor = 0u64;
        for &index in &order {
            let spec = &specs[index];
            let len = spec.byte_len().ok_or_else(|| {
                Error::Invalid(format!(
                    "tensor `{}`: {} of shape {:?} does not fill a whole number of bytes",
                    spec.name, spec.dtype, spec.shape
                ))
            })?;
            let end = cursor
                .checked_add(len)
                .ok_or_else(|| Error::Invalid("the tensors' total size overflows".into()))?;
            offsets[index] = [cursor, end];
            cursor = end;
        }
        // The JSON written after room for the length prefix, which is filled in once known: no
        // second copy of a header that can be 100 MB.
        let mut header = vec![0u8; 8];
        serde_json::to_writer(
            &mut header,
            &HeaderJson {
                specs,
                order: &order,
                offsets: &offsets,
                metadata,
            },
        )
        .map_err(|e| Error::Invalid(format!("cannot encode the header: {e}")))?;
        let padded_len = (header.len() - 8).next_multiple_of(8);
        if padded_len as u64 > MAX_HEADER_LEN {
            return Err(Error::Invalid(format!(
                "the header would be {padded_len} bytes, over the format's limit of {MAX_HEADER_LEN}"
            )));
        }
        header[..8].copy_from_slice(&(padded_len as u64).to_le_bytes());
        header.resize(8 + padded_len, b' ');
        header.shrink_to_fit();
        Ok(FileLayout {
            header,
            order,
            offsets,
            data_len: cursor,
        })
    }

    /// Bytes of the whole file.
    pub fn file_len(&self) -> u64 {
        self.header.len() as u64 + self.data_len
    }

    /// Writes the file to `out`: the header, then each tensor's bytes from `write_tensor(spec
    /// index, out)`, which must write exactly that tensor's length.
    pub fn write<W: Write>(
        &self,
        out: &mut W,
        mut write_tensor: impl FnMut(usize, &mut W) -> io::Result<()>,
    ) -> io::Result<()> {
        out.write_all(&self.header)?;
        for &index in &self.order {
            write_tensor(index, out)?;
        }
        Ok(())
    }
}

/// Writes `path` through a temporary file in the same folder, synced and then renamed into place,
/// so the path holds either its old contents or the whole new file, never a part.
pub fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<&std::fs::File>) -> io::Result<()>,
) -> Result<()> {
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
    {
        let mut out = BufWriter::with_capacity(1 << 20, temp.as_file());
        write(&mut out).map_err(|e| Error::io(path, e))?;
        out.flush().map_err(|e| Error::io(path, e))?;
    }
    temp.as_file().sync_all().map_err(|e| Error::io(path, e))?;
    temp.persist(path).map_err(|e| Error::io(path, e.error))?;
    Ok(())
}

/// `tempfile` adds the temporary file's name to its errors; the user never asked for that file,
/// so the error is told by its kind, beside the folder.
fn without_temporary_name(error: io::Error) -> io::Error {
    if error.get_ref().is_some() {
        io::Error::from(error.kind())
    } else {
        error
    }
}

struct HeaderJson<'a> {
    specs: &'a [TensorSpec],
    order: &'a [usize],
    offsets: &'a [[u64; 2]],
    metadata: Option<&'a StringMap>,
}

impl Serialize for HeaderJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.order.len() + 1))?;
        if let Some(metadata) = self.metadata {
            map.serialize_entry("__metadata__", metadata)?;
        }
        for &index in self.order {
            map.serialize_entry(
                &self.specs[index].name,
                &EntryJson {
                    spec: &self.specs[index],
                    offsets: self.offsets[index],
                },
            )?;
        }
        map.end()
    }
}

struct EntryJson<'a> {
    spec: &'a TensorSpec,
    offsets: [u64; 2],
}

impl Serialize for EntryJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut entry = serializer.serialize_struct("TensorInfo", 3)?;
        entry.serialize_field("dtype", self.spec.dtype.name())?;
        entry.serialize_field("shape", &self.spec.shape)?;
        entry.serialize_field("data_offsets", &self.offsets)?;
        entry.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_layout_byte_for_byte() {
        // The reference's own example: one I32 [2, 2] tensor "test" gives a 60-byte JSON padded to 64.
        let layout =
            FileLayout::plan(&[TensorSpec::new("test", Dtype::I32, &[2, 2])], None).unwrap();
        assert_eq!(&layout.header[..8], &64u64.to_le_bytes());
        assert_eq!(
            std::str::from_utf8(&layout.header[8..]).unwrap(),
            "{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}    "
        );
        let empty = FileLayout::plan(&[], None).unwrap();
        assert_eq!(empty.header, b"\x08\0\0\0\0\0\0\0{}      ");
    }

    #[test]
    fn orders_by_dtype_rank_then_name() {
        let specs = [
            TensorSpec::new("b", Dtype::U8, &[3]),
            TensorSpec::new("a", Dtype::F32, &[1]),
            TensorSpec::new("c", Dtype::F64, &[1]),
            TensorSpec::new("a2", Dtype::F32, &[1]),
        ];
        let layout = FileLayout::plan(&specs, None).unwrap();
        assert_eq!(layout.order, [2, 1, 3, 0]);
        assert_eq!(layout.offsets, [[16, 19], [8, 12], [0, 8], [12, 16]]);
    }

    #[test]
    fn refuses_a_name_given_twice_or_naming_the_metadata() {
        let twice = [
            TensorSpec::new("a", Dtype::U8, &[1]),
            TensorSpec::new("b", Dtype::F32, &[1]),
            TensorSpec::new("a", Dtype::F32, &[1]),
        ];
        let error = FileLayout::plan(&twice, None).unwrap_err().to_string();
        assert!(error.contains("`a` is given twice"), "{error}");
        let metadata = [TensorSpec::new("__metadata__", Dtype::U8, &[1])];
        assert!(FileLayout::plan(&metadata, None).is_err());
    }

    #[test]
    fn avoids_the_reference_writer_bugs() {
        let empty_metadata = StringMap::default();
        let layout = FileLayout::plan(&[], Some(&empty_metadata)).unwrap();
        assert!(layout.header[8..].starts_with(b"{\"__metadata__\":{}}"));
        let twice = [
            TensorSpec::new("a", Dtype::U8, &[1]),
            TensorSpec::new("a", Dtype::U8, &[1]),
        ];
        assert!(FileLayout::plan(&twice, None).is_err());
        assert!(FileLayout::plan(&[TensorSpec::new("a", Dtype::F4, &[3])], None).is_err());
    }
}
