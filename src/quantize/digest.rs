//! A fast digest of a member's bytes, fed in runs of any length: what the writer computed for a
//! member, taken while it was made, is compared with what the file written holds, read back.
//!
//! Not a cryptographic hash: it guards against a file that changed between the write and the
//! read-back (a disk, a file system, another process), not against a forger. Each 8-byte word
//! is mixed with its place (a folded 128-bit product) and the mixed words are added, so that
//! the digest does not depend on how the bytes were cut into runs, and the length is mixed in
//! at the end.

const SEED: u64 = 0x243f_6a88_85a3_08d3;
const PLACE: u64 = 0x9e37_79b9_7f4a_7c15;
const MULTIPLIER: u64 = 0xbf58_476d_1ce4_e5b9;
const LENGTH: u64 = 0x94d0_49bb_1331_11eb;

#[derive(Clone, Debug, Default)]
pub struct Digest {
    sum: u64,
    /// Bytes fed so far.
    len: u64,
    /// The bytes of a word begun and not yet whole.
    pending: [u8; 8],
}

#[inline]
fn mix(word: u64, place: u64) -> u64 {
    let product = u128::from(word ^ SEED ^ place.wrapping_mul(PLACE)) * u128::from(MULTIPLIER);
    let [low, high] = bytemuck::cast::<u128, [u64; 2]>(product);
    low ^ high
}

impl Digest {
    pub fn update(&mut self, mut bytes: &[u8]) {
        let begun = (self.len % 8) as usize;
        if begun != 0 {
            let take = (8 - begun).min(bytes.len());
            self.pending[begun..begun + take].copy_from_slice(&bytes[..take]);
            self.len += take as u64;
            bytes = &bytes[take..];
            if !self.len.is_multiple_of(8) {
                return;
            }
            self.sum = self
                .sum
                .wrapping_add(mix(u64::from_le_bytes(self.pending), self.len / 8 - 1));
        }
        let mut words = bytes.chunks_exact(8);
        for (place, word) in (self.len / 8..).zip(&mut words) {
            let word = u64::from_le_bytes(word.try_into().unwrap_or_default());
            self.sum = self.sum.wrapping_add(mix(word, place));
        }
        let rest = words.remainder();
        self.pending = [0; 8];
        self.pending[..rest.len()].copy_from_slice(rest);
        self.len += bytes.len() as u64;
    }

    /// The digest of the bytes fed.
    pub fn finish(&self) -> u64 {
        let mut sum = self.sum;
        if !self.len.is_multiple_of(8) {
            let mut last = [0; 8];
            last[..(self.len % 8) as usize]
                .copy_from_slice(&self.pending[..(self.len % 8) as usize]);
            sum = sum.wrapping_add(mix(u64::from_le_bytes(last), self.len / 8));
        }
        mix(sum, self.len ^ LENGTH)
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> u64 {
        let mut digest = Digest::default();
        digest.update(bytes);
        digest.finish()
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
