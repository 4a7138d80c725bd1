//! stui's own cache of what it read from the Hub: a file's header (and an index whole), keyed by
//! the file's blob id, which names its bytes: a second open of the same commit asks for no
//! header again. Kept in `STUI_CACHE_DIR`, else `$XDG_CACHE_HOME/stui`, else `~/.cache/stui`;
//! never in the Hugging Face cache, whose blobs must be whole files.

use super::Environment;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What starts every entry, before the file's size, the bytes' checksum and the bytes.
const MAGIC: &[u8; 8] = b"stuihdr2";

/// A checksum of an entry's bytes, so that an entry cut short or altered on disk is read as
/// missing (and the Hub asked again) rather than given to the parser as the file's header. Any
/// change of it across versions of stui only costs a fetch.
fn checksum(bytes: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    foldhash::quality::FixedState::with_seed(0x7374_7569_6864_7232).hash_one(bytes)
}

/// The cache folder, `None` when no variable says where it is.
pub fn folder(env: &dyn Environment) -> Option<PathBuf> {
    if let Some(dir) = env.var("STUI_CACHE_DIR") {
        return Some(super::expand_home(Path::new(&dir), env).into_owned());
    }
    if let Some(cache) = env.var("XDG_CACHE_HOME") {
        return Some(PathBuf::from(cache).join("stui"));
    }
    Some(PathBuf::from(env.var("HOME")?).join(".cache/stui"))
}

/// The entry of a blob: a hex id only (anything else is not looked up).
fn entry(folder: &Path, kind: &str, blob: &str) -> Option<PathBuf> {
    let hex = (8..=64).contains(&blob.len()) && blob.bytes().all(|b| b.is_ascii_hexdigit());
    hex.then(|| folder.join(kind).join(blob))
}

/// The bytes kept for a blob and the whole file's size; `None` when absent or damaged.
pub fn load(folder: &Path, kind: &str, blob: &str) -> Option<(Vec<u8>, u64)> {
    let mut bytes = std::fs::read(entry(folder, kind, blob)?).ok()?;
    let rest = bytes.strip_prefix(MAGIC)?;
    let (size, rest) = rest.split_first_chunk::<8>()?;
    let (sum, rest) = rest.split_first_chunk::<8>()?;
    if checksum(rest) != u64::from_le_bytes(*sum) {
        return None;
    }
    let size = u64::from_le_bytes(*size);
    bytes.drain(..MAGIC.len() + 16);
    Some((bytes, size))
}

/// Keeps the bytes read of a blob, through a temporary file renamed into place; a cache that
/// cannot be written is passed over (the next open reads the Hub again).
pub fn store(folder: &Path, kind: &str, blob: &str, bytes: &[u8], file_len: u64) {
    let Some(path) = entry(folder, kind, blob) else {
        return;
    };
    let Some(parent) = path.parent() else {
        return;
    };
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(parent)?;
        let mut file = tempfile::NamedTempFile::new_in(parent)?;
        file.write_all(MAGIC)?;
        file.write_all(&file_len.to_le_bytes())?;
        file.write_all(&checksum(bytes).to_le_bytes())?;
        file.write_all(bytes)?;
        file.persist(&path).map_err(|e| e.error)?;
        Ok(())
    };
    let _ = write();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_and_gives_back_a_blob() {
        let dir = tempfile::tempdir().unwrap();
        let blob = "ab".repeat(32);
        assert_eq!(load(dir.path(), "headers", &blob), None);
        store(dir.path(), "headers", &blob, b"header", 1234);
        assert_eq!(
            load(dir.path(), "headers", &blob),
            Some((b"header".to_vec(), 1234))
        );
        store(dir.path(), "headers", "../escape", b"x", 1);
        assert!(!dir.path().join("escape").exists());
    }

    #[test]
    fn a_damaged_entry_reads_as_missing() {
        let dir = tempfile::tempdir().unwrap();
        let blob = "cd".repeat(32);
        let path = dir.path().join("headers").join(&blob);
        let header = br#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
        store(dir.path(), "headers", &blob, header, 4096);
        let kept = std::fs::read(&path).unwrap();
        let mut altered = kept.clone();
        let middle = altered.len() - header.len() / 2;
        altered[middle] ^= 0x20;
        let cut = &kept[..kept.len() - 1];
        for damaged in [
            &altered[..],
            cut,
            &kept[..20],
            b"stuihdr1\0\0\0\0\0\0\0\0{}",
        ] {
            std::fs::write(&path, damaged).unwrap();
            assert_eq!(load(dir.path(), "headers", &blob), None);
        }
        std::fs::write(&path, &kept).unwrap();
        assert_eq!(
            load(dir.path(), "headers", &blob),
            Some((header.to_vec(), 4096))
        );
    }
}
