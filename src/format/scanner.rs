//! A reader of the canonical subset of JSON that writers produce: strings without escapes or
//! control characters, non-negative integers without fraction or exponent. Every method gives up
//! (`None`) on anything outside the subset, so that a caller can hand the text to `serde_json`,
//! which stays the authority on it; the header's and the index's fast paths are built on it.

use smallvec::SmallVec;

pub(super) struct Scanner<'a> {
    text: &'a str,
    bytes: &'a [u8],
    /// The offset of the next byte to read.
    pub(super) at: usize,
}

impl<'a> Scanner<'a> {
    #[inline]
    pub(super) fn at(text: &'a str, at: usize) -> Self {
        Scanner {
            text,
            bytes: text.as_bytes(),
            at,
        }
    }

    #[inline]
    pub(super) fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    #[inline]
    pub(super) fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        self.at += usize::from(found);
        found
    }

    #[inline]
    pub(super) fn expect(&mut self, byte: u8) -> Option<()> {
        self.eat(byte).then_some(())
    }

    /// `bytes`, exactly, next.
    #[inline]
    pub(super) fn literal(&mut self, bytes: &[u8]) -> Option<()> {
        let found = self.bytes[self.at..].starts_with(bytes);
        self.at += if found { bytes.len() } else { 0 };
        found.then_some(())
    }

    #[inline]
    pub(super) fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// A string with no escapes and no control characters.
    #[inline]
    pub(super) fn string(&mut self) -> Option<&'a str> {
        self.expect(b'"')?;
        let start = self.at;
        let end = start + memchr::memchr2(b'"', b'\\', &self.bytes[start..])?;
        let content = self.text.get(start..end)?;
        // Every byte looked at, without stopping early, so that the loop is vectorized.
        if content
            .bytes()
            .fold(0u8, |control, b| control | u8::from(b < 0x20))
            != 0
        {
            return None;
        }
        self.at = end;
        self.expect(b'"')?;
        Some(content)
    }

    /// The string `text`, which holds no escape or control character, exactly, next.
    #[inline]
    pub(super) fn quoted(&mut self, text: &str) -> Option<()> {
        let rest = self.bytes[self.at..].strip_prefix(b"\"")?;
        let after = rest.strip_prefix(text.as_bytes())?;
        (after.first() == Some(&b'"')).then(|| self.at += text.len() + 2)
    }

    /// A non-negative integer as JSON writes it, that fits in `u64`, not followed by a fraction or
    /// an exponent.
    #[inline]
    pub(super) fn integer(&mut self) -> Option<u64> {
        /// Digits that cannot overflow `u64` however many nines they are.
        const SAFE_DIGITS: usize = 19;
        let rest = &self.bytes[self.at..];
        // Read and summed in one loop, up to the digits that cannot overflow.
        let mut value = 0u64;
        let mut digits = 0;
        while digits < SAFE_DIGITS
            && let Some(digit) = rest.get(digits).map(|b| b.wrapping_sub(b'0'))
            && digit <= 9
        {
            value = value * 10 + u64::from(digit);
            digits += 1;
        }
        while let Some(digit) = rest.get(digits).map(|b| b.wrapping_sub(b'0'))
            && digit <= 9
        {
            value = value.checked_mul(10)?.checked_add(u64::from(digit))?;
            digits += 1;
        }
        self.at += digits;
        let leading_zero = digits > 1 && rest[0] == b'0';
        let continues = matches!(rest.get(digits), Some(b'.' | b'e' | b'E'));
        (digits > 0 && !leading_zero && !continues).then_some(value)
    }

    #[inline]
    pub(super) fn integers(&mut self) -> Option<SmallVec<[u64; 4]>> {
        self.expect(b'[')?;
        let mut values = SmallVec::new();
        self.skip_whitespace();
        if self.eat(b']') {
            return Some(values);
        }
        loop {
            values.push(self.integer()?);
            self.skip_whitespace();
            if self.eat(b']') {
                return Some(values);
            }
            self.expect(b',')?;
            self.skip_whitespace();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn integer(text: &str) -> Option<u64> {
        Scanner::at(text, 0).integer()
    }

    #[test]
    fn a_string_is_matched_in_place_only_when_it_is_all_of_the_next_string() {
        let at = |text: &str, expected: &str| {
            let mut scanner = Scanner::at(text, 0);
            scanner.quoted(expected).map(|()| scanner.at)
        };
        assert_eq!(at(r#""a.bin","#, "a.bin"), Some(7));
        assert_eq!(at(r#""""#, ""), Some(2));
        assert_eq!(at(r#""a.bin2""#, "a.bin"), None);
        assert_eq!(at(r#""a.bi""#, "a.bin"), None);
        assert_eq!(at(r#""a.bin\"""#, "a.bin"), None);
        assert_eq!(at(r#"a.bin""#, "a.bin"), None);
        assert_eq!(at(r#""a.bin"#, "a.bin"), None);
    }

    #[test]
    fn integers_are_read_up_to_the_largest_u64() {
        assert_eq!(integer("0"), Some(0));
        assert_eq!(integer("7168,"), Some(7168));
        assert_eq!(
            integer("9999999999999999999"),
            Some(9_999_999_999_999_999_999)
        );
        assert_eq!(integer("18446744073709551615]"), Some(u64::MAX));
        for outside in [
            "18446744073709551616",
            "99999999999999999999",
            "100000000000000000000",
            "",
            "01",
            "1.0",
            "1e3",
            "-1",
        ] {
            assert_eq!(integer(outside), None, "{outside}");
        }
    }
}
