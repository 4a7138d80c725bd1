//! Codes of 1 to 8 bits unpacked from 32-bit little-endian words.
//!
//! Two packings exist. In the dense one (compressed-tensors since 0.17, MLX, GPTQ's 3-bit) the
//! words are one bit stream, LSB first, and code `i` occupies bits `i·b .. i·b+b`, straddling two
//! words when it must. In the per-word one (compressed-tensors before 0.17) each word holds
//! `⌊32/b⌋` codes, code `i` in word `i / ⌊32/b⌋` at bit `(i mod ⌊32/b⌋)·b`, and the rest of the
//! word is padding. For 1, 2, 4 and 8 bits they are the same.

#![expect(
    clippy::cast_possible_truncation,
    reason = "codes are masked to at most 8 bits before they are narrowed to bytes"
)]

use super::decode::word;
use multiversion::multiversion;

/// How codes are laid out in words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packing {
    /// One bit stream: codes may straddle two words.
    Dense,
    /// `⌊32/b⌋` codes per word, none straddling.
    PerWord,
}

impl Packing {
    /// Words holding `count` codes of `bits` bits.
    pub fn words(self, bits: u32, count: usize) -> usize {
        match self {
            Packing::Dense => (count * bits as usize).div_ceil(32),
            Packing::PerWord => count.div_ceil(32 / bits as usize),
        }
    }

    /// The word holding code `index` and the bit it starts at.
    #[inline]
    pub fn place(self, bits: u32, index: usize) -> (usize, u32) {
        let bits = bits as usize;
        let (word, shift) = match self {
            Packing::Dense => ((index * bits) / 32, (index * bits) % 32),
            Packing::PerWord => (index / (32 / bits), (index % (32 / bits)) * bits),
        };
        (word, u32::try_from(shift).unwrap_or(0))
    }

    /// Code `index` of `bits` bits, reading word `w` through `word_at(w)`.
    #[inline]
    pub fn code(self, bits: u32, index: usize, word_at: impl Fn(usize) -> u32) -> u8 {
        let (at, shift) = self.place(bits, index);
        let mut pair = u64::from(word_at(at)) >> shift;
        if self == Packing::Dense && shift + bits > 32 {
            pair |= u64::from(word_at(at + 1)) << (32 - shift);
        }
        (pair & ((1 << bits) - 1)) as u8
    }
}

/// Unpacks `out.len()` codes of `bits` bits (1 to 8) from the start of `bytes`.
pub fn unpack(packing: Packing, bits: u32, bytes: &[u8], out: &mut [u8]) {
    match (packing, bits) {
        (_, 8) => {
            let n = out.len().min(bytes.len());
            out[..n].copy_from_slice(&bytes[..n]);
            out[n..].fill(0);
        }
        (_, 1) => per_word::<1>(bytes, out),
        (_, 2) => per_word::<2>(bytes, out),
        (_, 4) => per_word::<4>(bytes, out),
        (Packing::Dense, 3) => stream::<3>(bytes, out),
        (Packing::Dense, 5) => stream::<5>(bytes, out),
        (Packing::Dense, 6) => stream::<6>(bytes, out),
        (Packing::Dense, 7) => stream::<7>(bytes, out),
        (Packing::PerWord, 3) => per_word::<3>(bytes, out),
        (Packing::PerWord, 5) => per_word::<5>(bytes, out),
        (Packing::PerWord, 6) => per_word::<6>(bytes, out),
        (Packing::PerWord, 7) => per_word::<7>(bytes, out),
        _ => unreachable!("layouts accept 1 to 8 bits only"),
    }
}

/// `⌊32/B⌋` codes per word.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn per_word<const B: usize>(bytes: &[u8], out: &mut [u8]) {
    let per = 32 / B;
    let mask = (1u32 << B) - 1;
    let (whole, _) = bytes.as_chunks::<4>();
    let mut chunks = out.chunks_exact_mut(per);
    for (codes, w) in (&mut chunks).zip(whole) {
        let w = u32::from_le_bytes(*w);
        for (j, code) in codes.iter_mut().enumerate() {
            *code = (w >> (B * j) & mask) as u8;
        }
    }
    let done = (out.len() / per).min(whole.len()) * per;
    for (i, code) in out.iter_mut().enumerate().skip(done) {
        *code = Packing::PerWord.code(B as u32, i, |w| word(bytes, w));
    }
}

/// A dense stream: 32 codes in every `B` words.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn stream<const B: usize>(bytes: &[u8], out: &mut [u8]) {
    let mask = (1u64 << B) - 1;
    let mut chunks = out.chunks_exact_mut(32);
    let mut done = 0;
    for (codes, words) in (&mut chunks).zip(bytes.chunks_exact(4 * B)) {
        let mut w = [0u64; 9];
        for (k, slot) in w.iter_mut().take(B).enumerate() {
            *slot = u64::from(u32::from_le_bytes([
                words[4 * k],
                words[4 * k + 1],
                words[4 * k + 2],
                words[4 * k + 3],
            ]));
        }
        for (j, code) in codes.iter_mut().enumerate() {
            let bit = j * B;
            let pair = w[bit / 32] | w[bit / 32 + 1] << 32;
            *code = (pair >> (bit % 32) & mask) as u8;
        }
        done += 32;
    }
    for (i, code) in out.iter_mut().enumerate().skip(done) {
        *code = Packing::Dense.code(B as u32, i, |w| word(bytes, w));
    }
}

#[cfg(test)]
mod tests {
    #![expect(
        clippy::cast_sign_loss,
        reason = "fixtures of small, known sizes and values"
    )]
    use super::*;
    use proptest::prelude::*;

    /// Packs codes the way the producers do, one bit at a time.
    pub fn pack(packing: Packing, bits: u32, codes: &[u8]) -> Vec<u8> {
        let mut words = vec![0u32; packing.words(bits, codes.len())];
        for (i, &code) in codes.iter().enumerate() {
            for bit in 0..bits as usize {
                if code >> bit & 1 == 1 {
                    let position = match packing {
                        Packing::Dense => i * bits as usize + bit,
                        Packing::PerWord => {
                            let per = 32 / bits as usize;
                            (i / per) * 32 + (i % per) * bits as usize + bit
                        }
                    };
                    words[position / 32] |= 1 << (position % 32);
                }
            }
        }
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn three_bit_codes_straddle_words_in_the_dense_packing_only() {
        let codes: Vec<u8> = (0..40).map(|i| (i * 5 % 8) as u8).collect();
        let dense = pack(Packing::Dense, 3, &codes);
        assert_eq!(dense.len(), 4 * 4); // 120 bits
        // Code 10 takes bits 30, 31 of word 0 and bit 0 of word 1.
        let w0 = word(&dense, 0);
        let w1 = word(&dense, 1);
        assert_eq!(u32::from(codes[10]), (w0 >> 30) | (w1 & 1) << 2);
        let per_word = pack(Packing::PerWord, 3, &codes);
        assert_eq!(per_word.len(), 4 * 4); // ⌈40/10⌉ words
        assert_eq!(word(&per_word, 1) & 7, u32::from(codes[10]));
        let mut out = vec![0; 40];
        unpack(Packing::Dense, 3, &dense, &mut out);
        assert_eq!(out, codes);
        unpack(Packing::PerWord, 3, &per_word, &mut out);
        assert_eq!(out, codes);
    }

    proptest! {
        #[test]
        fn unpacking_inverts_packing(
            bits in 1u32..=8,
            dense in any::<bool>(),
            seeds in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let packing = if dense { Packing::Dense } else { Packing::PerWord };
            let codes: Vec<u8> = seeds.iter().map(|s| s & ((1u16 << bits) - 1) as u8).collect();
            let bytes = pack(packing, bits, &codes);
            let mut out = vec![0xaa; codes.len()];
            unpack(packing, bits, &bytes, &mut out);
            prop_assert_eq!(&out, &codes);
            for (i, &code) in codes.iter().enumerate() {
                prop_assert_eq!(packing.code(bits, i, |w| word(&bytes, w)), code);
            }
        }
    }
}
