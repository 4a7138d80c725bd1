//! A fast path for headers in the canonical form writers produce: tensor entries that are objects
//! of exactly `dtype`, `shape` and `data_offsets`, strings without escapes, plain integers.
//!
//! It accepts only a subset of JSON on which it is certain to agree with `serde_json` and the
//! reference's schema, and gives up (returns `None`) on anything else: escapes, floats, unknown
//! fields, repeated fields, nesting, a number past `u64`. The caller then reads the header with
//! the full lenient parser, which stays the authority on every verdict. Tests check the two agree.

use super::super::dtype::{Dtype, TensorDtype};
use super::super::mapped::{Pages, Passing};
use super::super::scanner::Scanner;
use super::super::string_map::{StringMap, StringMapBuilder};
use super::super::{Shape, Tensor, TensorInfo};
use super::{ENTRY_BYTES, METADATA_KEY, NameIndex, ParsedHeader};

/// Headers of this many bytes are read in two halves side by side. Joining the halves copies the
/// second one's entries, which the memory bound (twice the header plus 64 MiB) has room for only
/// while the header is small against 64 MiB; larger headers, rare outside hostile files, are read
/// in one pass.
const SPLIT: std::ops::Range<usize> = (1 << 20)..(16 << 20);

/// Parses a canonical header, or `None` if the text is not entirely in the canonical form.
pub fn parse(text: &str) -> Option<ParsedHeader> {
    parse_passing(text, &mut Passing::new(Pages::of(text.as_bytes())))
}

/// [`parse`], handing back the pages of the text it has passed.
pub(super) fn parse_passing(text: &str, passing: &mut Passing<'_>) -> Option<ParsedHeader> {
    let mut scanner = Scanner::at(text, 0);
    scanner.skip_whitespace();
    scanner.expect(b'{')?;
    scanner.skip_whitespace();
    let part = if scanner.eat(b'}') {
        scanner.skip_whitespace();
        if scanner.at != text.len() {
            return None;
        }
        Part::new(0)
    } else {
        let first = scanner.at;
        let halves = split_point(text, first).and_then(|comma| {
            // Too small to hand pages back.
            let (head, tail) = rayon::join(
                || Part::read(text, first, Some(comma), text.len(), &mut |_| ()),
                || Part::read(text, comma + 1, None, text.len() - comma, &mut |_| ()),
            );
            head?.join(tail?)
        });
        // A cut that was not between two entries (a name holding `},"`, say) or a name in
        // both halves: read the whole in one pass, which decides.
        match halves {
            Some(part) => part,
            None => Part::read(text, first, None, text.len(), &mut |at| passing.reached(at))?,
        }
    };
    Some(ParsedHeader {
        metadata: part.metadata,
        tensors: part.tensors,
        findings: crate::finding::Findings::new(),
        all_entries_read: true,
    })
}

/// Where to cut a large header in two: the `,` of a `},"` past its middle. It is a boundary
/// between two entries exactly when reading the first half from the start stops on it, which
/// [`Part::read`] checks; otherwise the header is not read this way.
fn split_point(text: &str, first: usize) -> Option<usize> {
    let middle = (text.len() / 2).max(first);
    SPLIT
        .contains(&text.len())
        .then(|| memchr::memmem::find(&text.as_bytes()[middle..], b"},\""))
        .flatten()
        .map(|at| middle + at + 1)
}

/// The entries of a run of the top-level object.
struct Part {
    tensors: Vec<Tensor>,
    metadata: Option<StringMap>,
    names: NameIndex,
}

impl Part {
    /// Room for the entries of about `text_len` bytes of header.
    fn new(text_len: usize) -> Part {
        Part {
            tensors: Vec::with_capacity(text_len / ENTRY_BYTES),
            metadata: None,
            names: NameIndex::for_header(text_len),
        }
    }

    /// Reads `key: value` pairs from `from` (the start of a key): up to the `,` at `until` if
    /// given, which must fall between two pairs; else to the object's closing `}` and the end of
    /// the text. `room` is the bytes of header this part is expected to hold. `passed` is told
    /// where each pair ends.
    fn read(
        text: &str,
        from: usize,
        until: Option<usize>,
        room: usize,
        passed: &mut dyn FnMut(usize),
    ) -> Option<Part> {
        let mut scanner = Scanner::at(text, from);
        let mut part = Part::new(room);
        loop {
            let key = scanner.string()?;
            scanner.skip_whitespace();
            scanner.expect(b':')?;
            scanner.skip_whitespace();
            if key == METADATA_KEY {
                if part.metadata.is_some() {
                    return None;
                }
                part.metadata = Some(scanner.metadata(passed)?);
            } else {
                let (dtype, shape, data_offsets) = scanner.entry()?;
                if part.names.find_or_insert(&part.tensors, key).is_some() {
                    return None;
                }
                part.tensors.push(
                    TensorInfo {
                        name: key.into(),
                        dtype: TensorDtype::Known(dtype),
                        shape,
                        data_offsets,
                    }
                    .into(),
                );
            }
            scanner.skip_whitespace();
            passed(scanner.at);
            if let Some(comma) = until {
                if scanner.at == comma {
                    return Some(part);
                }
                if scanner.at > comma {
                    return None;
                }
            }
            if scanner.eat(b'}') {
                break;
            }
            scanner.expect(b',')?;
            scanner.skip_whitespace();
        }
        scanner.skip_whitespace();
        (until.is_none() && scanner.at == text.len()).then_some(part)
    }

    /// The two halves of a header as one; `None` if a name or `__metadata__` is in both.
    fn join(mut self, tail: Part) -> Option<Part> {
        use rayon::prelude::*;
        if self.metadata.is_some() && tail.metadata.is_some() {
            return None;
        }
        // Two halves each in ascending order, the second starting past the first, cannot share
        // a name.
        let in_order = self.names.ascending()
            && tail.names.ascending()
            && self
                .tensors
                .last()
                .zip(tail.tensors.first())
                .is_none_or(|(last, first)| last.name() < first.name());
        let repeated = !in_order
            && tail
                .tensors
                .par_iter()
                .any(|tensor| self.names.find(&self.tensors, tensor.name()).is_some());
        if repeated {
            return None;
        }
        self.metadata = self.metadata.or(tail.metadata);
        // Moved on both cores: the copy is mostly first touches of fresh pages.
        self.tensors.par_extend(tail.tensors);
        Some(self)
    }
}

impl Scanner<'_> {
    #[inline]
    fn entry(&mut self) -> Option<(Dtype, Shape, [u64; 2])> {
        let start = self.at;
        if let Some(entry) = self.entry_as_written() {
            return Some(entry);
        }
        self.at = start;
        self.entry_in_any_order()
    }

    /// An entry exactly as the reference writes it: its fields in their order, no whitespace;
    /// `None` for any other (which [`Scanner::entry_in_any_order`] then reads).
    #[inline]
    fn entry_as_written(&mut self) -> Option<(Dtype, Shape, [u64; 2])> {
        self.literal(b"{\"dtype\":")?;
        let dtype = Dtype::from_name(self.string()?)?;
        self.literal(b",\"shape\":")?;
        let shape = Shape::from_slice(&self.integers()?);
        self.literal(b",\"data_offsets\":")?;
        let [begin, end] = self.integers()?[..] else {
            return None;
        };
        self.literal(b"}")?;
        Some((dtype, shape, [begin, end]))
    }

    #[inline]
    fn entry_in_any_order(&mut self) -> Option<(Dtype, Shape, [u64; 2])> {
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
                "shape" => shape
                    .replace(Shape::from_slice(&self.integers()?))
                    .is_none(),
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

    /// `__metadata__`'s object; `passed` is told where each entry ends (a header can be all
    /// metadata).
    fn metadata(&mut self, passed: &mut dyn FnMut(usize)) -> Option<StringMap> {
        let mut map = StringMapBuilder::new();
        self.expect(b'{')?;
        self.skip_whitespace();
        if self.eat(b'}') {
            return Some(map.finish());
        }
        loop {
            let key = self.string()?;
            self.skip_whitespace();
            self.expect(b':')?;
            self.skip_whitespace();
            let value = self.string()?;
            map.insert(key, value);
            passed(self.at);
            self.skip_whitespace();
            if self.eat(b'}') {
                return Some(map.finish());
            }
            self.expect(b',')?;
            self.skip_whitespace();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A field of a tensor entry, as written: its key, the text around the colon, its value.
    fn field(key: &str, value: &str, space: &str) -> String {
        format!("{space}\"{key}\"{space}:{space}{value}{space}")
    }

    /// One entry's text: the fields in the order `order` picks, `space` around each token, a
    /// dtype that may be unknown, numbers that may be written as the subset does not allow.
    fn entry_text(
        order: usize,
        space: &str,
        dtype: &str,
        shape: &[u64],
        offsets: [u64; 2],
        number_form: &str,
    ) -> String {
        let number = |n: u64| format!("{number_form}{n}");
        let list = |values: &[u64]| {
            let values: Vec<String> = values.iter().map(|&n| number(n)).collect();
            format!(
                "[{space}{}{space}]",
                values.join(&format!("{space},{space}"))
            )
        };
        let mut fields = [
            field("dtype", &format!("\"{dtype}\""), space),
            field("shape", &list(shape), space),
            field("data_offsets", &list(&offsets), space),
        ];
        fields.rotate_left(order % 3);
        if order >= 3 {
            fields.swap(1, 2);
        }
        format!("{{{}}}", fields.join(","))
    }

    proptest! {
        /// Whatever the fast path reads, it reads as the lenient parser does; and it reads every
        /// header written as the reference writes it.
        #[test]
        fn agrees_with_the_lenient_parser(
            entries in prop::collection::vec(
                (
                    "[a-c][a-c.]{0,4}",
                    prop_oneof![4 => Just(0usize), 1 => 1..6usize],
                    prop_oneof![4 => Just(""), 1 => Just(" "), 1 => Just("\n")],
                    prop_oneof![
                        4 => prop::sample::select(vec!["F32", "BF16", "F8_E4M3", "I64"]),
                        1 => prop::sample::select(vec!["F128", "F\\u0033", "f32"]),
                    ],
                    prop::collection::vec(prop_oneof![0..5u64, any::<u64>()], 0..5),
                    prop_oneof![8 => Just(""), 1 => Just("0"), 1 => Just("-")],
                ),
                0..8,
            ),
        ) {
            let mut at = 0u64;
            let mut written_as_the_reference = true;
            let mut names = std::collections::HashSet::new();
            let texts: Vec<String> = entries
                .iter()
                .map(|(name, order, space, dtype, shape, number_form)| {
                    let size = 4;
                    let text = format!(
                        "\"{name}\":{}",
                        entry_text(*order, space, dtype, shape, [at, at + size], number_form)
                    );
                    written_as_the_reference &= *order == 0
                        && space.is_empty()
                        && Dtype::from_name(dtype).is_some()
                        && number_form.is_empty()
                        && names.insert(name.clone());
                    at += size;
                    text
                })
                .collect();
            let header = format!("{{{}}}", texts.join(","));
            let fast = parse(&header);
            if let Some(fast) = &fast {
                let lenient = super::super::parse_leniently(&header, true);
                prop_assert!(lenient.findings.is_empty(), "{header}");
                prop_assert_eq!(&fast.tensors, &lenient.tensors);
                prop_assert_eq!(&fast.metadata, &lenient.metadata);
            }
            prop_assert!(fast.is_some() || !written_as_the_reference, "{header}");
        }
    }

    #[test]
    fn reads_the_canonical_form() {
        let parsed = parse(
            r#"{"__metadata__":{"format":"pt"},"a.b":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"c":{"shape":[],"data_offsets":[12,16],"dtype":"F32"}}   "#,
        )
        .unwrap();
        assert_eq!(parsed.tensors.len(), 2);
        assert_eq!(parsed.tensors[1].info.data_offsets, [12, 16]);
        assert_eq!(parsed.metadata.unwrap().get("format"), Some("pt"));
    }

    /// A canonical header of `count` entries, whose names are `name(i)`.
    fn header_of(count: usize, name: impl Fn(usize) -> String) -> String {
        let entries: Vec<String> = (0..count)
            .map(|i| {
                format!(
                    r#""{}":{{"dtype":"F32","shape":[2],"data_offsets":[{},{}]}}"#,
                    name(i),
                    8 * i,
                    8 * i + 8
                )
            })
            .collect();
        format!("{{{}}}", entries.join(","))
    }

    #[test]
    fn a_large_header_read_in_halves_is_read_exactly_as_in_one_pass() {
        let header = header_of(40_000, |i| format!("model.layers.{i}.weight"));
        assert!(SPLIT.contains(&header.len()));
        assert!(
            split_point(&header, 1).is_some(),
            "this header is cut in two"
        );
        let halves = parse(&header).unwrap();
        let whole = super::super::parse_leniently(&header, true);
        assert_eq!(halves, whole);
    }

    #[test]
    fn a_cut_inside_a_name_or_a_name_in_both_halves_is_still_read_right() {
        // Names ending in `},` hold a `},"` with their closing quote: the cut falls inside a
        // name, where the first half never stops.
        let tricky = header_of(40_000, |i| format!("w{i}}},"));
        let inside_a_name =
            tricky.len() / 2 + tricky[tricky.len() / 2..].find("},\":").unwrap() + 1;
        assert!(Part::read(&tricky, 1, Some(inside_a_name), tricky.len(), &mut |_| ()).is_none());
        let parsed = parse(&tricky).unwrap();
        assert_eq!(parsed, super::super::parse_leniently(&tricky, true));
        // The same name at the start and at the end: the fast path gives up, as on any repeat.
        let repeated = header_of(40_000, |i| {
            if i == 39_999 {
                "w0".to_owned()
            } else {
                format!("w{i}")
            }
        });
        assert!(parse(&repeated).is_none());
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
