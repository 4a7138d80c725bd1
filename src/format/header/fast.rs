//! A fast path for headers in the canonical form writers produce: tensor entries that are objects
//! of exactly `dtype`, `shape` and `data_offsets`, strings without escapes, plain integers.
//!
//! It accepts only a subset of JSON on which it is certain to agree with `serde_json` and the
//! reference's schema, and gives up (returns `None`) on anything else: escapes, floats, unknown
//! fields, repeated fields, nesting, a number past `u64`. The caller then reads the header with
//! the full lenient parser, which stays the authority on every verdict. Tests check the two agree.

use super::super::dtype::{Dtype, TensorDtype};
use super::super::{Shape, Tensor, TensorInfo};
use super::{ENTRY_BYTES, METADATA_KEY, NameIndex, ParsedHeader};
use std::collections::BTreeMap;

/// Parses a canonical header, or `None` if the text is not entirely in the canonical form.
pub fn parse(text: &str) -> Option<ParsedHeader> {
    let mut scanner = Scanner {
        text,
        bytes: text.as_bytes(),
        at: 0,
    };
    // Reserving avoids regrowing a large list.
    let mut parsed = ParsedHeader {
        all_entries_read: true,
        tensors: Vec::with_capacity(text.len() / ENTRY_BYTES),
        ..ParsedHeader::default()
    };
    let mut names = NameIndex::for_header(text.len());
    scanner.skip_whitespace();
    scanner.expect(b'{')?;
    scanner.skip_whitespace();
    if !scanner.eat(b'}') {
        loop {
            let key = scanner.string()?;
            scanner.skip_whitespace();
            scanner.expect(b':')?;
            scanner.skip_whitespace();
            if key == METADATA_KEY {
                if parsed.metadata.is_some() {
                    return None;
                }
                parsed.metadata = Some(scanner.metadata()?);
            } else {
                let (dtype, shape, data_offsets) = scanner.entry()?;
                if names.find_or_insert(&parsed.tensors, key).is_some() {
                    return None;
                }
                parsed.tensors.push(Tensor {
                    info: TensorInfo {
                        name: key.into(),
                        dtype: TensorDtype::Known(dtype),
                        shape,
                        data_offsets,
                    },
                    shard: 0,
                });
            }
            scanner.skip_whitespace();
            if scanner.eat(b'}') {
                break;
            }
            scanner.expect(b',')?;
            scanner.skip_whitespace();
        }
    }
    scanner.skip_whitespace();
    (scanner.at == scanner.bytes.len()).then_some(parsed)
}

struct Scanner<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Scanner<'a> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        self.at += usize::from(found);
        found
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        self.eat(byte).then_some(())
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// A string with no escapes and no control characters.
    fn string(&mut self) -> Option<&'a str> {
        self.expect(b'"')?;
        let start = self.at;
        let end = start + memchr::memchr2(b'"', b'\\', &self.bytes[start..])?;
        let content = self.text.get(start..end)?;
        if content.bytes().any(|b| b < 0x20) {
            return None;
        }
        self.at = end;
        self.expect(b'"')?;
        Some(content)
    }

    /// A non-negative integer as JSON writes it, that fits in `u64`, not followed by a fraction or
    /// an exponent.
    fn integer(&mut self) -> Option<u64> {
        let start = self.at;
        let mut value = 0u64;
        while let Some(digit @ b'0'..=b'9') = self.peek() {
            value = value
                .checked_mul(10)?
                .checked_add(u64::from(digit - b'0'))?;
            self.at += 1;
        }
        let digits = self.at - start;
        let leading_zero = digits > 1 && self.bytes[start] == b'0';
        let continues = matches!(self.peek(), Some(b'.' | b'e' | b'E'));
        (digits > 0 && !leading_zero && !continues).then_some(value)
    }

    fn integers(&mut self) -> Option<Shape> {
        self.expect(b'[')?;
        let mut values = Shape::new();
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

    fn entry(&mut self) -> Option<(Dtype, Shape, [u64; 2])> {
        let (mut dtype, mut shape, mut offsets) = (None, None, None);
        self.expect(b'{')?;
        self.skip_whitespace();
        for field in 0..3 {
            if field > 0 {
                self.expect(b',')?;
                self.skip_whitespace();
            }
            let key = self.string()?;
            self.skip_whitespace();
            self.expect(b':')?;
            self.skip_whitespace();
            let fresh = match key {
                "dtype" => dtype.replace(Dtype::from_name(self.string()?)?).is_none(),
                "shape" => shape.replace(self.integers()?).is_none(),
                "data_offsets" => match self.integers()?[..] {
                    [begin, end] => offsets.replace([begin, end]).is_none(),
                    _ => return None,
                },
                _ => return None,
            };
            if !fresh {
                return None;
            }
            self.skip_whitespace();
        }
        self.expect(b'}')?;
        Some((dtype?, shape?, offsets?))
    }

    fn metadata(&mut self) -> Option<BTreeMap<String, String>> {
        let mut map = BTreeMap::new();
        self.expect(b'{')?;
        self.skip_whitespace();
        if self.eat(b'}') {
            return Some(map);
        }
        loop {
            let key = self.string()?;
            self.skip_whitespace();
            self.expect(b':')?;
            self.skip_whitespace();
            let value = self.string()?;
            map.insert(key.to_owned(), value.to_owned());
            self.skip_whitespace();
            if self.eat(b'}') {
                return Some(map);
            }
            self.expect(b',')?;
            self.skip_whitespace();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_canonical_form() {
        let parsed = parse(
            r#"{"__metadata__":{"format":"pt"},"a.b":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"c":{"shape":[],"data_offsets":[12,16],"dtype":"F32"}}   "#,
        )
        .unwrap();
        assert_eq!(parsed.tensors.len(), 2);
        assert_eq!(parsed.tensors[1].info.data_offsets, [12, 16]);
        assert_eq!(parsed.metadata.unwrap()["format"], "pt");
    }

    #[test]
    fn gives_up_on_anything_else() {
        for header in [
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}}"#,
            r#"{"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F32","shape":[01],"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F32","shape":[1e0],"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,4]}}"#,
            r#"{"\u0061":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F128","shape":[1],"data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F32","dtype":"F32","data_offsets":[0,4]}}"#,
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}"#,
            r#"{"a":["F32",[1],[0,4]]}"#,
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
            r#"{"__metadata__":{"n":1}}"#,
            r#"{"__metadata__":null}"#,
            r#"{"__metadata__":{},"__metadata__":{}}"#,
            r#"{},"__metadata__":{}}"#,
            "{}\0",
            "\u{feff}{}",
            "{",
        ] {
            assert!(parse(header).is_none(), "{header}");
        }
    }
}
