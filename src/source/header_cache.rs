//! stui's own cache of what it read from the Hub: a file's header (and an index whole), keyed by
//! the file's blob id, which names its bytes: a second open of the same commit asks for no
//! header again. Kept in `STUI_CACHE_DIR`, else `$XDG_CACHE_HOME/stui`, else `~/.cache/stui`;
//! never in the Hugging Face cache, whose blobs must be whole files.

use super::Environment;
use std::io::Write;
use std::path::{Path, PathBuf};

/// What starts every entry, before the file's size and the bytes.
const MAGIC: &[u8; 8] = b"stuihdr1";

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
    let bytes = std::fs::read(entry(folder, kind, blob)?).ok()?;
    let rest = bytes.strip_prefix(MAGIC)?;
    let (size, rest) = rest.split_first_chunk::<8>()?;
    Some((rest.to_vec(), u64::from_le_bytes(*size)))
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
}
