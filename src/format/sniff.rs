//! Telling what a file that is not safetensors really is, from its first bytes.

use crate::finding::{Code, Finding};
use crate::text::format_bytes;

/// How many leading bytes [`identify`] looks at.
pub const SNIFF_LEN: usize = 1024;

/// Names the format of a file that does not parse as safetensors, with what to do about it.
pub fn identify(prefix: &[u8]) -> Option<Finding> {
    let message = if prefix.starts_with(b"version https://git-lfs") {
        let size = lfs_size(prefix)
            .map(|size| format!(" of {}", format_bytes(size)))
            .unwrap_or_default();
        format!(
            "this is a Git LFS pointer, not the model: the real file{size} was never downloaded \
             (run `git lfs pull`, or download the file itself)"
        )
    } else if looks_like_html(prefix) {
        "this is an HTML page, not a safetensors file: the download saved an error or login page \
         (check the URL and any access token)"
            .to_owned()
    } else if prefix.starts_with(b"PK\x03\x04") {
        "this is a zip archive: PyTorch `.pt`/`.bin` checkpoints are zip files of pickles; \
         convert it to safetensors (loading pickles can run code)"
            .to_owned()
    } else if prefix.len() >= 2 && prefix[0] == 0x80 && (2..=5).contains(&prefix[1]) {
        "this is a Python pickle (a legacy PyTorch checkpoint); loading it can run arbitrary code, \
         so convert it to safetensors in a sandbox"
            .to_owned()
    } else if prefix.starts_with(b"GGUF") {
        "this is a GGUF file (llama.cpp), not safetensors".to_owned()
    } else if prefix.starts_with(b"\x93NUMPY") {
        "this is a NumPy .npy array file, not safetensors".to_owned()
    } else if prefix.starts_with(b"\x89HDF\r\n\x1a\n") {
        "this is an HDF5 file (Keras .h5 weights?), not safetensors".to_owned()
    } else if prefix.starts_with(&[0x1f, 0x8b]) {
        "this is a gzip-compressed file; decompress it first".to_owned()
    } else if let Some(json) = json_kind(prefix) {
        json.to_owned()
    } else {
        return None;
    };
    Some(Finding::error(Code::NotSafetensors, message))
}

fn lfs_size(prefix: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(prefix).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("size ")?.trim().parse().ok())
}

fn looks_like_html(prefix: &[u8]) -> bool {
    let start = prefix.trim_ascii_start();
    let head = &start[..start.len().min(15)];
    let lower = head.to_ascii_lowercase();
    lower.starts_with(b"<!doctype html")
        || lower.starts_with(b"<html")
        || lower.starts_with(b"<?xml")
}

fn json_kind(prefix: &[u8]) -> Option<&'static str> {
    let start = prefix.trim_ascii_start();
    if !start.starts_with(b"{") {
        return None;
    }
    let has = |needle: &[u8]| prefix.windows(needle.len()).any(|window| window == needle);
    Some(if has(b"\"weight_map\"") {
        "this is the index (.index.json) of a sharded model, not a safetensors file: open the \
         index itself, e.g. `stui model.safetensors.index.json`, or its folder"
    } else if has(b"\"architectures\"") || has(b"\"model_type\"") {
        "this is a model's config.json, not a safetensors file"
    } else {
        "this is a JSON text file, not a safetensors file (a safetensors file starts with an \
         8-byte header length)"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(bytes: &[u8]) -> String {
        identify(bytes).map(|f| f.message).unwrap_or_default()
    }

    #[test]
    fn names_common_impostors() {
        let lfs = b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 4943162336\n";
        assert!(message(lfs).contains("Git LFS pointer"));
        assert!(message(lfs).contains("4.60 GiB"));
        assert!(message(b"\n<!DOCTYPE html><html>").contains("HTML page"));
        assert!(message(b"PK\x03\x04rest").contains("zip archive"));
        assert!(message(b"\x80\x02}q\x00").contains("pickle"));
        assert!(message(b"GGUF\x03\x00").contains("GGUF"));
        assert!(message(b"{\n  \"metadata\": {}, \"weight_map\": {}}").contains("index"));
        assert!(identify(b"\x10\x00\x00\x00\x00\x00\x00\x00{}").is_none());
    }
}
