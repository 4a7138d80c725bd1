//! Opening one `.safetensors` file: its header only, never its tensor data.

use super::header::{self, ParsedHeader};
use super::layout::{self, data_order};
use super::lint;
use super::mapped::Pages;
use super::sniff::{self, SNIFF_LEN};
use super::{LENGTH_PREFIX, MAX_HEADER_LEN, Rejection, StringMap, Tensor};
use crate::finding::{Code, Finding, Findings, Severity};
use crate::text::format_bytes;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// A file's header as read, with every finding about its structure and the reference's verdict.
#[derive(Debug)]
pub struct SafetensorsFile {
    pub path: PathBuf,
    pub file_len: u64,
    /// The header length the first 8 bytes declare, if the file has 8 bytes.
    pub header_len: Option<u64>,
    /// `__metadata__`, `None` when absent or null.
    pub metadata: Option<StringMap>,
    /// Every tensor whose entry could be read, in header order.
    pub tensors: Vec<Tensor>,
    pub findings: Findings,
    /// Why the reference rejects the file; `None` when it accepts it.
    pub rejection: Option<Rejection>,
}

impl SafetensorsFile {
    /// Reads the header of the file at `path`. Only I/O failures are errors: every problem with
    /// the file's contents is a finding.
    pub fn open(path: &Path) -> io::Result<SafetensorsFile> {
        let file = crate::paths::open_file(path)?;
        let file_len = file.metadata()?.len();
        read(path, &file, file_len)
    }

    /// Reads a whole file held in memory, exactly as [`SafetensorsFile::open`] reads one on disk.
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> SafetensorsFile {
        match read(path, &bytes, bytes.len() as u64) {
            Ok(file) => file,
            Err(error) => unreachable!("reading from memory cannot fail: {error}"),
        }
    }

    /// Reads a file of `file_len` bytes from its first `bytes` only (a file read remotely: the
    /// length prefix and the header). An error when the header needs bytes past them.
    pub fn from_header_bytes(
        path: &Path,
        bytes: &[u8],
        file_len: u64,
    ) -> io::Result<SafetensorsFile> {
        read(path, &bytes, file_len)
    }

    pub fn is_valid(&self) -> bool {
        self.rejection.is_none()
    }

    /// Where the data section starts in the file.
    pub fn data_start(&self) -> u64 {
        LENGTH_PREFIX.saturating_add(self.header_len.unwrap_or(0))
    }

    /// Bytes of the file after the header.
    pub fn data_len(&self) -> u64 {
        self.file_len.saturating_sub(self.data_start())
    }
}

/// Where a file's bytes come from: disk or memory.
trait Source {
    /// Runs `work` on exactly `len` bytes from `offset`; `UnexpectedEof` if the source ends first.
    fn with_pages<T>(
        &self,
        offset: u64,
        len: u64,
        work: impl FnOnce(Pages<'_>) -> T,
    ) -> io::Result<T>;

    fn with_bytes<T>(&self, offset: u64, len: u64, work: impl FnOnce(&[u8]) -> T) -> io::Result<T> {
        self.with_pages(offset, len, |pages| work(pages.bytes()))
    }
}

impl Source for File {
    /// Through a map: a header of megabytes is parsed where it lies in the page cache rather
    /// than copied into fresh memory first. Up to [`COPIED_HEADER`] bytes, a copy into the buffer
    /// the thread keeps.
    fn with_pages<T>(
        &self,
        offset: u64,
        len: u64,
        work: impl FnOnce(Pages<'_>) -> T,
    ) -> io::Result<T> {
        let len = usize::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
        if len <= COPIED_HEADER {
            return super::mapped::with_copied(self, offset, len, work);
        }
        super::mapped::with_mapped_pages(self, offset, len, work)
    }
}

/// Headers up to this size are copied rather than mapped. A sharded model has a hundred headers
/// or more of some tens of KiB each, for which copying costs less than a map's two system
/// calls, its page faults and the flush of every core's TLB when it is unmapped.
const COPIED_HEADER: usize = 1 << 20;

impl Source for &[u8] {
    fn with_pages<T>(
        &self,
        offset: u64,
        len: u64,
        work: impl FnOnce(Pages<'_>) -> T,
    ) -> io::Result<T> {
        let range = usize::try_from(offset)
            .ok()
            .zip(
                offset
                    .checked_add(len)
                    .and_then(|end| usize::try_from(end).ok()),
            )
            .and_then(|(start, end)| self.get(start..end))
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        Ok(work(Pages::of(range)))
    }
}

fn read(path: &Path, source: &impl Source, file_len: u64) -> io::Result<SafetensorsFile> {
    let mut file = SafetensorsFile {
        path: path.to_owned(),
        file_len,
        header_len: None,
        metadata: None,
        tensors: Vec::new(),
        findings: Findings::new(),
        rejection: None,
    };
    if file_len < LENGTH_PREFIX {
        file.findings
            .extend(source.with_bytes(0, file_len, sniff::identify)?);
        let finding = if file_len == 0 {
            Finding::error(
                Code::FileEmpty,
                "the file is empty (0 bytes): an interrupted download or a failed save",
            )
        } else {
            Finding::error(
                Code::FileTooSmall,
                format!(
                    "the file has only {file_len} bytes; a safetensors file starts with an 8-byte header length"
                ),
            )
        };
        file.reject(Rejection::HeaderTooSmall, finding);
        return Ok(file);
    }
    let mut prefix = [0u8; 8];
    source.with_bytes(0, LENGTH_PREFIX, |bytes| prefix.copy_from_slice(bytes))?;
    let header_len = u64::from_le_bytes(prefix);
    file.header_len = Some(header_len);
    if header_len > MAX_HEADER_LEN {
        let sniffed = source.with_bytes(0, file_len.min(SNIFF_LEN as u64), sniff::identify)?;
        file.findings.extend(sniffed);
        file.reject(
            Rejection::HeaderTooLarge,
            Finding::error(
                Code::HeaderTooLarge,
                format!(
                    "the first 8 bytes declare a header of {header_len} bytes, over the format's limit of \
                     {MAX_HEADER_LEN}: this is not the start of a safetensors file"
                ),
            ),
        );
        return Ok(file);
    }
    let available = file_len - LENGTH_PREFIX;
    let truncated = header_len > available;
    let whole_header_read =
        source.with_pages(LENGTH_PREFIX, header_len.min(available), |pages| {
            let header_bytes = pages.bytes();
            let sniff = || {
                let mut start = prefix.to_vec();
                start.extend_from_slice(&header_bytes[..header_bytes.len().min(SNIFF_LEN)]);
                sniff::identify(&start)
            };
            if truncated {
                file.findings.extend(sniff());
                file.reject(
                    Rejection::InvalidHeaderLength,
                    Finding::error(
                        Code::HeaderPastEnd,
                        format!(
                            "the header is declared as {header_len} bytes but only {available} follow \
                             the length prefix: the file is cut short by at least {} (a truncated \
                             download?)",
                            format_bytes(header_len - available)
                        ),
                    ),
                );
            }
            file.read_header(pages, !truncated, sniff)
        })?;
    if whole_header_read {
        file.check_layout(header_len);
    }
    debug_assert_eq!(
        file.rejection.is_some(),
        file.findings.iter().any(|f| f.severity == Severity::Error),
        "{}: every rejection is explained by an error finding",
        path.display()
    );
    Ok(file)
}

impl SafetensorsFile {
    /// Records why the reference rejects the file, unless an earlier check already did.
    fn reject(&mut self, rejection: Rejection, finding: Finding) {
        self.findings.push(finding);
        self.rejection.get_or_insert(rejection);
    }

    /// Parses the header bytes read; returns whether every tensor entry could be read.
    fn read_header(
        &mut self,
        pages: Pages<'_>,
        complete: bool,
        sniff: impl FnOnce() -> Option<Finding>,
    ) -> bool {
        let bytes = pages.bytes();
        let (text, complete) = match std::str::from_utf8(bytes) {
            Ok(text) => (text, complete),
            Err(error) => {
                self.reject(
                    Rejection::InvalidHeader,
                    Finding::error(
                        Code::HeaderNotUtf8,
                        format!("the header is not valid UTF-8: {error}"),
                    ),
                );
                let valid = &bytes[..error.valid_up_to()];
                (std::str::from_utf8(valid).unwrap_or_default(), false)
            }
        };
        // Checking the text mapped all of it in; the parser maps it in again as it goes.
        pages.release(0..text.len());
        let parsed = header::parse_pages(text, pages, complete);
        if parsed.first_error().is_some() && self.rejection.is_none() {
            self.rejection = Some(Rejection::InvalidHeaderDeserialization);
            if parsed.tensors.is_empty() && parsed.metadata.is_none() {
                self.findings.extend(sniff());
            }
        }
        let ParsedHeader {
            metadata,
            tensors,
            findings,
            all_entries_read,
        } = parsed;
        self.findings.append(findings);
        if complete {
            self.findings.extend(lint::header_padding(text));
        }
        self.metadata = metadata;
        self.tensors = tensors;
        complete && all_entries_read
    }

    /// Checks where the tensors lie, once the whole header is known.
    fn check_layout(&mut self, header_len: u64) {
        let order = data_order(&self.tensors);
        if self.rejection.is_none() {
            self.rejection =
                layout::strict_check(&self.tensors, &order, header_len, self.file_len).err();
        }
        let data_len = self.file_len - LENGTH_PREFIX - header_len;
        self.findings
            .append(layout::lenient_check(&self.tensors, &order, data_len));
        if !header_len.is_multiple_of(8) && !self.tensors.is_empty() {
            self.findings.push(Finding::info(
                Code::HeaderLengthUnaligned,
                format!(
                    "the header is {header_len} bytes, not a multiple of 8, so tensor data is not \
                     8-byte aligned in the file (the reference writer pads to 8)"
                ),
            ));
        }
        self.findings
            .append(lint::red_flags(&self.tensors, self.metadata.as_ref()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with_header(header: &str, data: &[u8]) -> Vec<u8> {
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(data);
        bytes
    }

    fn open(bytes: &[u8]) -> SafetensorsFile {
        SafetensorsFile::from_bytes(Path::new("test.safetensors"), bytes)
    }

    /// A header past the size whose pages are handed back as it is parsed: read from disk, it
    /// gives what it gives read from memory, in each parser and on each error path.
    #[test]
    fn a_large_header_on_disk_reads_as_in_memory() {
        use std::io::Write;
        let filler = "x".repeat(super::super::mapped::RELEASABLE + 1);
        let entries = r#""a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}"#;
        let canonical = format!(r#"{{"__metadata__":{{"fill":"{filler}"}},{entries}}}"#);
        let spaced = canonical.replace(':', ": ");
        let nul_padded = format!("{canonical}\0\0\0");
        let cut_short = canonical[..canonical.len() - 2].to_owned();
        for header in [canonical, spaced, nul_padded, cut_short] {
            let bytes = file_with_header(&header, &[1, 2]);
            let mut on_disk = tempfile::NamedTempFile::new().unwrap();
            on_disk.write_all(&bytes).unwrap();
            let read = SafetensorsFile::open(on_disk.path()).unwrap();
            let held = SafetensorsFile::from_bytes(on_disk.path(), &bytes);
            assert_eq!(read.tensors, held.tensors);
            assert_eq!(read.metadata, held.metadata);
            assert_eq!(read.rejection, held.rejection);
            let messages = |file: &SafetensorsFile| {
                file.findings
                    .iter()
                    .map(|f| f.message.clone())
                    .collect::<Vec<_>>()
            };
            assert_eq!(messages(&read), messages(&held));
        }
    }

    #[test]
    fn a_valid_file_has_no_errors() {
        let header = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}           "#;
        let file = open(&file_with_header(header, &[1, 2, 3, 4]));
        assert!(file.is_valid(), "{:?}", file.findings);
        assert!(file.findings.is_empty(), "{:?}", file.findings);
        assert_eq!(file.data_start(), 8 + 64);
        assert_eq!(file.tensors.len(), 1);
    }

    #[test]
    fn a_truncated_header_still_lists_what_it_holds() {
        let mut bytes = file_with_header(
            r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}"#,
            &[0; 8],
        );
        bytes.truncate(70);
        let file = open(&bytes);
        assert_eq!(file.rejection, Some(Rejection::InvalidHeaderLength));
        assert_eq!(file.tensors.len(), 1);
        let codes: Vec<_> = file.findings.iter().map(|f| f.code).collect();
        assert_eq!(
            codes,
            [Code::HeaderPastEnd],
            "running out of text is the cut, not a JSON error"
        );
    }

    #[test]
    fn invalid_utf8_keeps_the_tensors_before_it() {
        let mut bytes = file_with_header(
            r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b?":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#,
            &[0; 2],
        );
        let at = bytes.iter().position(|&b| b == b'?').unwrap();
        bytes[at] = 0xff;
        let file = open(&bytes);
        assert_eq!(file.rejection, Some(Rejection::InvalidHeader));
        assert_eq!(file.tensors.len(), 1);
    }

    #[test]
    fn an_lfs_pointer_is_named() {
        let file = open(b"version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 10\n");
        assert_eq!(file.rejection, Some(Rejection::HeaderTooLarge));
        assert_eq!(file.findings[0].code, Code::NotSafetensors);
    }
}
