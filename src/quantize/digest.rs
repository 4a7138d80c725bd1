//! A fast digest of a member's bytes, fed in runs of any length: what the writer computed for a
//! member, taken while it was made, is compared with what the file written holds, read back.
//!
//! XXH3 (64 bits): not a cryptographic hash. It guards against a file that changed between the
//! write and the read-back (a disk, a file system, another process), not against a forger.

use super::Control;
use crate::error::{Error, Result};
use crate::format::mapped::with_mapped;
use crate::text::{escape, escape_path};
use std::fs::File;
use std::path::Path;
use xxhash_rust::xxh3::Xxh3Default;

/// Bytes of a file digested at a time when it is read back.
const READ_BACK_RUN: u64 = 4 << 20;

#[derive(Default)]
pub struct Digest(Xxh3Default);

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Digest({:016x})", self.finish())
    }
}

impl Digest {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The digest of the bytes fed.
    pub fn finish(&self) -> u64 {
        self.0.digest()
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> u64 {
        xxhash_rust::xxh3::xxh3_64(bytes)
    }

    /// The digest of the `len` bytes of `file` from `begin`, read a run at a time.
    pub fn of_file(file: &File, begin: u64, len: u64, control: &Control) -> std::io::Result<u64> {
        let mut digest = Digest::default();
        let mut at = 0;
        while at < len {
            control.check()?;
            let run = READ_BACK_RUN.min(len - at);
            let run_len = usize::try_from(run).map_err(std::io::Error::other)?;
            with_mapped(file, begin + at, run_len, |bytes| digest.update(bytes))?;
            at += run;
        }
        Ok(digest.finish())
    }

    /// Reads `(begin, len)` of `written` (the file at `path`) back: an error naming `member`
    /// when its digest is not `expected`, the digest of the bytes made.
    pub fn check_file(
        written: &File,
        path: &Path,
        (begin, len): (u64, u64),
        expected: u64,
        member: impl std::fmt::Display,
        control: &Control,
    ) -> Result<()> {
        let found =
            Digest::of_file(written, begin, len, control).map_err(|e| Error::io(path, e))?;
        if found == expected {
            return Ok(());
        }
        Err(Error::Invalid(format!(
            "{}: `{}` read back differs from the bytes written",
            escape_path(path),
            escape(&member.to_string())
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn does_not_depend_on_the_runs(bytes in proptest::collection::vec(any::<u8>(), 0..200),
                                       cuts in proptest::collection::vec(0usize..200, 0..6)) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            cuts.sort_unstable();
            let mut digest = Digest::default();
            let mut from = 0;
            for cut in cuts.into_iter().chain([bytes.len()]) {
                digest.update(&bytes[from..cut]);
                from = cut;
            }
            prop_assert_eq!(digest.finish(), Digest::of(&bytes));
        }

        #[test]
        fn sees_a_changed_byte(bytes in proptest::collection::vec(any::<u8>(), 1..200),
                               at in any::<prop::sample::Index>(), flip in 1u8..=255) {
            let mut changed = bytes.clone();
            changed[at.index(bytes.len())] ^= flip;
            prop_assert_ne!(Digest::of(&changed), Digest::of(&bytes));
        }
    }

    #[test]
    fn sees_swapped_words_and_a_zero_byte_more() {
        let bytes: Vec<u8> = (0..64).collect();
        let mut swapped = bytes.clone();
        swapped[..8].copy_from_slice(&bytes[8..16]);
        swapped[8..16].copy_from_slice(&bytes[..8]);
        assert_ne!(Digest::of(&swapped), Digest::of(&bytes));
        let mut longer = bytes.clone();
        longer.push(0);
        assert_ne!(Digest::of(&longer), Digest::of(&bytes));
    }
}
