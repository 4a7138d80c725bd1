//! The safetensors format: reading headers leniently, the reference's strict verdict, sharded
//! models, and writing files laid out as the reference writer lays them out.

pub mod dtype;
pub mod file;
pub mod folder;
pub mod header;
pub mod index;
pub mod layout;
pub mod lint;
pub mod mapped;
pub mod model;
pub mod remote;
mod scanner;
pub mod shape;
pub mod sniff;
pub mod string_map;
pub mod writer;

pub use dtype::{Dtype, OtherDtype, TensorDtype};
pub use file::SafetensorsFile;
pub use model::Model;
pub use shape::Shape;
pub use string_map::StringMap;

use compact_str::CompactString;
use std::fmt;
use std::fs::File;
use std::io;

/// The largest header the reference accepts: 100,000,000 bytes (decimal).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// Bytes of the little-endian header length that starts every file.
pub const LENGTH_PREFIX: u64 = 8;

/// One tensor entry of a header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: CompactString,
    pub dtype: TensorDtype,
    pub shape: Shape,
    /// `[begin, end)`, relative to the start of the data section.
    pub data_offsets: [u64; 2],
}

/// A tensor entry and the file holding it: its index among the model's files (shards), 0 for a
/// file read on its own. Headers are read straight into this form, so a model made of one file
/// takes its tensor list over without copying it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tensor {
    pub info: TensorInfo,
    pub shard: usize,
}

impl Tensor {
    pub fn name(&self) -> &str {
        &self.info.name
    }
}

/// An entry of a file read on its own.
impl From<TensorInfo> for Tensor {
    fn from(info: TensorInfo) -> Tensor {
        Tensor { info, shard: 0 }
    }
}

impl TensorInfo {
    /// The number of elements, `None` if the product overflows 64 bits. Multiplied left to right,
    /// as the reference does, so a zero dimension only rescues the dimensions after it.
    pub fn element_count(&self) -> Option<u64> {
        self.shape.iter().try_fold(1u64, u64::checked_mul)
    }

    /// Bytes the entry claims in the data section.
    pub fn byte_len(&self) -> u64 {
        self.data_offsets[1].saturating_sub(self.data_offsets[0])
    }
}

/// Why the reference implementation rejects a file: its error variants that a file's bytes can
/// raise, in the order it checks them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rejection {
    HeaderTooSmall,
    HeaderTooLarge,
    InvalidHeaderLength,
    InvalidHeader,
    InvalidHeaderDeserialization,
    InvalidOffset(String),
    ValidationOverflow,
    MisalignedSlice,
    TensorInvalidInfo,
    MetadataIncompleteBuffer,
}

impl Rejection {
    /// The reference's variant name, as in the conformance labels.
    pub const fn variant(&self) -> &'static str {
        match self {
            Rejection::HeaderTooSmall => "HeaderTooSmall",
            Rejection::HeaderTooLarge => "HeaderTooLarge",
            Rejection::InvalidHeaderLength => "InvalidHeaderLength",
            Rejection::InvalidHeader => "InvalidHeader",
            Rejection::InvalidHeaderDeserialization => "InvalidHeaderDeserialization",
            Rejection::InvalidOffset(_) => "InvalidOffset",
            Rejection::ValidationOverflow => "ValidationOverflow",
            Rejection::MisalignedSlice => "MisalignedSlice",
            Rejection::TensorInvalidInfo => "TensorInvalidInfo",
            Rejection::MetadataIncompleteBuffer => "MetadataIncompleteBuffer",
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::HeaderTooSmall => f.write_str("header too small"),
            Rejection::HeaderTooLarge => f.write_str("header too large"),
            Rejection::InvalidHeaderLength => f.write_str("invalid header length"),
            Rejection::InvalidHeader => f.write_str("invalid UTF-8 in header"),
            Rejection::InvalidHeaderDeserialization => f.write_str("invalid JSON in header"),
            Rejection::InvalidOffset(name) => {
                write!(
                    f,
                    "invalid offset for tensor `{}`",
                    crate::text::escape(name)
                )
            }
            Rejection::ValidationOverflow => {
                f.write_str("overflow computing buffer size from shape and/or element type")
            }
            Rejection::MisalignedSlice => {
                f.write_str("sub-byte tensor does not end on a byte boundary")
            }
            Rejection::TensorInvalidInfo => {
                f.write_str("invalid shape, data type, or offset for tensor")
            }
            Rejection::MetadataIncompleteBuffer => {
                f.write_str("incomplete metadata, file not fully covered")
            }
        }
    }
}

/// Reads exactly `buffer.len()` bytes at `offset`, without moving a file position (so threads
/// can share the file). A file that ends first gives `UnexpectedEof`.
#[cfg(unix)]
pub fn read_exact_at(file: &File, buffer: &mut [u8], offset: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buffer, offset)
}

/// Writes all of `bytes` at `offset`, without moving a file position (so threads can share the
/// file).
#[cfg(unix)]
pub fn write_all_at(file: &File, bytes: &[u8], offset: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, bytes, offset)
}

/// Copies up to `len` bytes of `source` from `start` into `out` at `at` inside the kernel
/// (`copy_file_range`), never through this process's memory: how many it copied, at least one
/// where `len` is not zero. A system or a pair of files that cannot copy this way gives
/// `Unsupported`, for the caller to read and write itself; so does a copy of nothing, which is
/// what a source that ends first gives, but also what some file systems answer for files they
/// cannot copy (reading tells the two apart).
#[cfg(target_os = "linux")]
#[expect(unsafe_code, reason = "a call into the C library")]
pub fn copy_range_at(
    source: &File,
    start: u64,
    out: &File,
    at: u64,
    len: usize,
) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let (Ok(mut from), Ok(mut to)) = (i64::try_from(start), i64::try_from(at)) else {
        return Err(io::ErrorKind::Unsupported.into());
    };
    loop {
        // SAFETY: both descriptors are open for as long as the files are borrowed, and the call
        // writes only the two offsets, which are ours.
        let copied = unsafe {
            libc::copy_file_range(
                source.as_raw_fd(),
                &raw mut from,
                out.as_raw_fd(),
                &raw mut to,
                len,
                0,
            )
        };
        return match copied {
            0 if len > 0 => Err(io::ErrorKind::Unsupported.into()),
            // Non-negative, so the conversion holds.
            0.. => Ok(copied.unsigned_abs()),
            _ => {
                let error = io::Error::last_os_error();
                match error.raw_os_error() {
                    // A signal, not a cancellation (which `Interrupted` means to the callers).
                    Some(libc::EINTR) => continue,
                    // The ones the standard library's own copy falls back on.
                    Some(
                        libc::ENOSYS
                        | libc::EXDEV
                        | libc::EINVAL
                        | libc::EPERM
                        | libc::EOPNOTSUPP
                        | libc::EBADF,
                    ) => Err(io::ErrorKind::Unsupported.into()),
                    _ => Err(error),
                }
            }
        };
    }
}

/// Copying inside the kernel is Linux's alone: elsewhere the caller reads and writes.
#[cfg(not(target_os = "linux"))]
pub fn copy_range_at(_: &File, _: u64, _: &File, _: u64, _: usize) -> io::Result<usize> {
    Err(io::ErrorKind::Unsupported.into())
}

/// Writes all of `bytes` at `offset`.
#[cfg(windows)]
pub fn write_all_at(file: &File, mut bytes: &[u8], mut offset: u64) -> io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !bytes.is_empty() {
        match file.seek_write(bytes, offset)? {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            n => {
                bytes = &bytes[n..];
                offset += n as u64;
            }
        }
    }
    Ok(())
}

/// Reads exactly `buffer.len()` bytes at `offset`; a file that ends first gives `UnexpectedEof`.
#[cfg(windows)]
pub fn read_exact_at(file: &File, mut buffer: &mut [u8], mut offset: u64) -> io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buffer.is_empty() {
        match file.seek_read(buffer, offset)? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => {
                buffer = &mut buffer[n..];
                offset += n as u64;
            }
        }
    }
    Ok(())
}
