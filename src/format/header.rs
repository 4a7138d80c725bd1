//! Lenient parsing of the JSON header.
//!
//! The header is read with `serde_json`, the parser the reference uses, so syntax, string escapes,
//! number forms and the 128-level nesting limit behave exactly as they do there. The schema is
//! checked by visitors that never give up on a bad entry: each problem becomes a finding and
//! parsing goes on, and entries are stored as they are read, so a header cut short by a syntax
//! error still yields every tensor before the cut.

pub mod fast;

use super::dtype::TensorDtype;
use super::mapped::{Pages, Passing};
use super::string_map::{StringMap, StringMapBuilder};
use super::{Shape, Tensor, TensorInfo};
use crate::finding::{Code, Finding, Findings, Severity};
use hashbrown::{HashTable, hash_table};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use smallvec::SmallVec;
use std::borrow::Cow;
use std::fmt;
use std::hash::BuildHasher;
use std::io;
use std::marker::PhantomData;

const METADATA_KEY: &str = "__metadata__";

/// What the header holds, as far as it could be read.
#[derive(Debug, Default, PartialEq)]
pub struct ParsedHeader {
    /// `None` when `__metadata__` is absent or null.
    pub metadata: Option<StringMap>,
    /// Every tensor entry that could be read, in header order; a repeated name keeps the last entry,
    /// at the place of the first.
    pub tensors: Vec<Tensor>,
    /// Problems found. Any error here means the reference rejects the header as a whole.
    pub findings: Findings,
    /// False when some entry could not be read (a syntax error, or an entry without its fields),
    /// so where the tensors lie cannot be judged from the ones that were.
    pub all_entries_read: bool,
}

impl ParsedHeader {
    /// The first error, which is what makes the reference reject the header.
    pub fn first_error(&self) -> Option<&Finding> {
        self.findings.iter().find(|f| f.severity == Severity::Error)
    }
}

/// Parses header text (already known to be UTF-8). `complete` is false when the text is only the
/// start of the header (the file was cut short, or the rest is not UTF-8): running out of text is
/// then not reported, as the cut has been already.
pub fn parse(text: &str, complete: bool) -> ParsedHeader {
    parse_pages(text, Pages::of(text.as_bytes()), complete)
}

/// [`parse`] for text that starts `pages`, whose pages are handed back as the parser passes them.
pub fn parse_pages(text: &str, pages: Pages<'_>, complete: bool) -> ParsedHeader {
    let mut parsed = complete
        .then(|| fast::parse_passing(text, &mut Passing::new(pages)))
        .flatten()
        .unwrap_or_else(|| parse_leniently_pages(text, pages, complete));
    // The list was reserved from the header's length and grown by doubling: give back what a
    // header of short entries left unused (40% of a million-tensor list). Large lists shrink in
    // place, without a copy.
    parsed.tensors.shrink_to_fit();
    if text.starts_with([' ', '\t', '\n', '\r']) {
        parsed.findings.push_first(Finding::info(
            Code::HeaderLeadingWhitespace,
            "the header starts with whitespace before '{' (accepted by the reference, unusual)",
        ));
    }
    parsed
}

/// Parses any header text, reporting every problem in it, without the canonical fast path: the
/// authority the fast path is checked against.
pub fn parse_leniently(text: &str, complete: bool) -> ParsedHeader {
    parse_leniently_pages(text, Pages::of(text.as_bytes()), complete)
}

fn parse_leniently_pages(text: &str, pages: Pages<'_>, complete: bool) -> ParsedHeader {
    let mut parsed = ParsedHeader {
        all_entries_read: true,
        ..ParsedHeader::default()
    };
    let names = NameIndex::for_header(text.len());
    let outcome = if pages.releasable() {
        read_entries(PassingReader::deserializer(text, pages), &mut parsed, names)
    } else {
        read_entries(serde_json::Deserializer::from_str(text), &mut parsed, names)
    };
    if let Err(error) = outcome {
        parsed.all_entries_read = false;
        if complete || !error.is_eof() {
            parsed
                .findings
                .push(describe_json_error(text, pages, &error));
        }
    }
    parsed
}

fn read_entries<'de, R: serde_json::de::Read<'de>>(
    mut deserializer: serde_json::Deserializer<R>,
    out: &mut ParsedHeader,
    names: NameIndex,
) -> serde_json::Result<()> {
    HeaderSeed { out, names }
        .deserialize(&mut deserializer)
        .and_then(|()| deserializer.end())
}

/// Whether `text` is one JSON value.
fn is_json(text: &str, pages: Pages<'_>) -> bool {
    fn read<'de, R: serde_json::de::Read<'de>>(
        mut deserializer: serde_json::Deserializer<R>,
    ) -> bool {
        <de::IgnoredAny as de::Deserialize>::deserialize(&mut deserializer)
            .and_then(|_| deserializer.end())
            .is_ok()
    }
    if pages.releasable() {
        read(PassingReader::deserializer(text, pages))
    } else {
        read(serde_json::Deserializer::from_str(text))
    }
}

/// Header text read through [`io::Read`], handing back its pages as `serde_json` passes them.
/// Slower than reading the text in place (every string is copied), so only for large maps.
struct PassingReader<'a> {
    rest: &'a [u8],
    read: usize,
    passing: Passing<'a>,
}

impl<'a> PassingReader<'a> {
    /// A deserializer of `text`, which starts `pages`. Buffered, as `serde_json` reads a byte at
    /// a time.
    fn deserializer(
        text: &'a str,
        pages: Pages<'a>,
    ) -> serde_json::Deserializer<serde_json::de::IoRead<io::BufReader<PassingReader<'a>>>> {
        serde_json::Deserializer::from_reader(io::BufReader::new(PassingReader {
            rest: text.as_bytes(),
            read: 0,
            passing: Passing::new(pages),
        }))
    }
}

impl io::Read for PassingReader<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let count = self.rest.read(buffer)?;
        self.read += count;
        self.passing.reached(self.read);
        Ok(count)
    }
}

fn describe_json_error(text: &str, pages: Pages<'_>, error: &serde_json::Error) -> Finding {
    if error.is_data() {
        return Finding::error(
            Code::HeaderNotObject,
            format!("the header must be a JSON object: {error}"),
        );
    }
    let nul_padding = text.trim_end_matches('\0');
    if nul_padding.len() < text.len() && is_json(nul_padding, pages) {
        let count = text.len() - nul_padding.len();
        return Finding::error(
            Code::HeaderNulPadding,
            format!(
                "the header JSON is followed by {count} NUL bytes of padding; the format allows only \
                 spaces there, so the reference rejects the file (the writer padded with zeros)"
            ),
        );
    }
    let hint = if text.starts_with('\u{feff}') {
        " (the header starts with a UTF-8 byte-order mark)"
    } else {
        ""
    };
    Finding::error(
        Code::HeaderJson,
        format!("the header is not valid JSON: {error}{hint}"),
    )
}

/// A JSON object key, borrowed from the header text when it holds no escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// The outcome of reading one JSON value leniently: the value, or what was found instead.
/// Either way the whole value has been consumed and checked for syntax.
enum Lenient<T> {
    Good(T),
    Bad(Cow<'static, str>),
}

/// A type read leniently from any JSON value. Each method handles one JSON form; the defaults
/// consume the value and report it as the wrong form.
trait FromJson<'de>: Sized {
    fn from_str(_: Cow<'de, str>) -> Lenient<Self> {
        Lenient::Bad("a string".into())
    }
    fn from_u64(value: u64) -> Lenient<Self> {
        Lenient::Bad(format!("the number {value}").into())
    }
    fn from_i64(value: i64) -> Lenient<Self> {
        Lenient::Bad(format!("the number {value}").into())
    }
    fn from_f64(value: f64) -> Lenient<Self> {
        Lenient::Bad(format!("the number {value:?}").into())
    }
    fn from_bool(value: bool) -> Lenient<Self> {
        Lenient::Bad(format!("`{value}`").into())
    }
    fn from_null() -> Lenient<Self> {
        Lenient::Bad("null".into())
    }
    fn from_seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Lenient<Self>, A::Error> {
        while seq.next_element::<Lenient<Ignored>>()?.is_some() {}
        Ok(Lenient::Bad("an array".into()))
    }
    fn from_map<A: MapAccess<'de>>(mut map: A) -> Result<Lenient<Self>, A::Error> {
        while map
            .next_entry::<Lenient<Ignored>, Lenient<Ignored>>()?
            .is_some()
        {}
        Ok(Lenient::Bad("an object".into()))
    }
}

impl<'de, T: FromJson<'de>> de::Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(LenientVisitor(PhantomData))
    }
}

struct LenientVisitor<T>(PhantomData<T>);

impl<'de, T: FromJson<'de>> Visitor<'de> for LenientVisitor<T> {
    type Value = Lenient<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(T::from_bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(T::from_i64(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(T::from_u64(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(T::from_f64(v))
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(T::from_str(Cow::Borrowed(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(T::from_str(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(T::from_str(Cow::Owned(v)))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(T::from_null())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        T::from_seq(seq)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::from_map(map)
    }
}

/// Any value, read in full (unlike `serde::de::IgnoredAny`, which skips nesting-limit checks).
struct Ignored;

impl FromJson<'_> for Ignored {}

/// A string value.
struct Text(String);

impl<'de> FromJson<'de> for Text {
    fn from_str(value: Cow<'de, str>) -> Lenient<Self> {
        Lenient::Good(Text(value.into_owned()))
    }
}

/// A non-negative integer, as the reference's `usize` fields accept.
struct Count(u64);

impl FromJson<'_> for Count {
    fn from_u64(value: u64) -> Lenient<Self> {
        Lenient::Good(Count(value))
    }
}

/// A shape: an array of non-negative integers.
struct Counts(Shape);

impl<'de> FromJson<'de> for Counts {
    fn from_seq<A: SeqAccess<'de>>(seq: A) -> Result<Lenient<Self>, A::Error> {
        let mut values = SmallVec::<[u64; 4]>::new();
        Ok(read_counts(seq, |value| values.push(value))?
            .map(|()| Counts(Shape::from_slice(&values))))
    }
}

/// `data_offsets`: an array of non-negative integers that should hold exactly two.
struct Offsets {
    values: [u64; 2],
    len: usize,
}

impl<'de> FromJson<'de> for Offsets {
    fn from_seq<A: SeqAccess<'de>>(seq: A) -> Result<Lenient<Self>, A::Error> {
        let mut offsets = Offsets {
            values: [0; 2],
            len: 0,
        };
        let outcome = read_counts(seq, |value| {
            if let Some(slot) = offsets.values.get_mut(offsets.len) {
                *slot = value;
            }
            offsets.len += 1;
        })?;
        Ok(outcome.map(|()| offsets))
    }
}

/// Reads an array of non-negative integers, handing each to `push`; consumes the whole array
/// even when an element is of the wrong form.
fn read_counts<'de, A: SeqAccess<'de>>(
    mut seq: A,
    mut push: impl FnMut(u64),
) -> Result<Lenient<()>, A::Error> {
    let mut bad = None;
    while let Some(element) = seq.next_element::<Lenient<Count>>()? {
        match element {
            Lenient::Good(Count(value)) => push(value),
            Lenient::Bad(found) => {
                bad.get_or_insert(found);
            }
        }
    }
    Ok(match bad {
        None => Lenient::Good(()),
        Some(found) => Lenient::Bad(
            format!("an array holding {found}, where only non-negative integers fit").into(),
        ),
    })
}

impl<T> Lenient<T> {
    fn map<U>(self, f: impl FnOnce(T) -> U) -> Lenient<U> {
        match self {
            Lenient::Good(value) => Lenient::Good(f(value)),
            Lenient::Bad(found) => Lenient::Bad(found),
        }
    }
}

/// A dtype: its name as a string, or the enum-map form `{"NAME": null}` serde also accepts.
struct DtypeSpec {
    dtype: TensorDtype,
    enum_form: bool,
}

impl DtypeSpec {
    fn new(name: &str, enum_form: bool) -> Self {
        DtypeSpec {
            dtype: TensorDtype::named(name),
            enum_form,
        }
    }
}

impl<'de> FromJson<'de> for DtypeSpec {
    fn from_str(value: Cow<'de, str>) -> Lenient<Self> {
        Lenient::Good(DtypeSpec::new(&value, false))
    }

    fn from_map<A: MapAccess<'de>>(mut map: A) -> Result<Lenient<Self>, A::Error> {
        let Some(Key(name)) = map.next_key::<Key>()? else {
            return Ok(Lenient::Bad("an empty object".into()));
        };
        let unit = map.next_value::<Lenient<UnitValue>>()?;
        let mut extra_keys = false;
        while map
            .next_entry::<Lenient<Ignored>, Lenient<Ignored>>()?
            .is_some()
        {
            extra_keys = true;
        }
        Ok(match (extra_keys, unit) {
            (true, _) => Lenient::Bad("an object with more than one key".into()),
            (false, Lenient::Bad(found)) => {
                Lenient::Bad(format!("{{\"{name}\": ...}} holding {found} instead of null").into())
            }
            (false, Lenient::Good(UnitValue)) => Lenient::Good(DtypeSpec::new(&name, true)),
        })
    }
}

/// The value of an enum-map dtype: only null (the reference rejects `{}` and `[]` here).
struct UnitValue;

impl FromJson<'_> for UnitValue {
    fn from_null() -> Lenient<Self> {
        Lenient::Good(UnitValue)
    }
}

/// One field of a tensor entry as read.
enum Field<T> {
    Missing,
    Present(T),
    Invalid(Cow<'static, str>),
}

impl<T> Field<T> {
    fn set(&mut self, value: Lenient<T>) {
        *self = match value {
            Lenient::Good(value) => Field::Present(value),
            Lenient::Bad(found) => Field::Invalid(found),
        };
    }
}

/// A tensor entry as read, with every problem in it.
struct Entry {
    dtype: Field<DtypeSpec>,
    shape: Field<Counts>,
    offsets: Field<Offsets>,
    positional: bool,
    duplicate_fields: Vec<&'static str>,
    unknown_fields: Vec<String>,
    extra_elements: usize,
}

impl Entry {
    fn new(positional: bool) -> Self {
        Entry {
            dtype: Field::Missing,
            shape: Field::Missing,
            offsets: Field::Missing,
            positional,
            duplicate_fields: Vec::new(),
            unknown_fields: Vec::new(),
            extra_elements: 0,
        }
    }
}

impl<'de> FromJson<'de> for Entry {
    fn from_map<A: MapAccess<'de>>(mut map: A) -> Result<Lenient<Self>, A::Error> {
        let mut entry = Entry::new(false);
        while let Some(Key(key)) = map.next_key::<Key>()? {
            let (name, present) = match key.as_ref() {
                "dtype" => ("dtype", !matches!(entry.dtype, Field::Missing)),
                "shape" => ("shape", !matches!(entry.shape, Field::Missing)),
                "data_offsets" => ("data_offsets", !matches!(entry.offsets, Field::Missing)),
                _ => {
                    map.next_value::<Lenient<Ignored>>()?;
                    entry.unknown_fields.push(key.into_owned());
                    continue;
                }
            };
            if present {
                entry.duplicate_fields.push(name);
            }
            match name {
                "dtype" => entry.dtype.set(map.next_value()?),
                "shape" => entry.shape.set(map.next_value()?),
                _ => entry.offsets.set(map.next_value()?),
            }
        }
        Ok(Lenient::Good(entry))
    }

    fn from_seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Lenient<Self>, A::Error> {
        let mut entry = Entry::new(true);
        if let Some(dtype) = seq.next_element()? {
            entry.dtype.set(dtype);
            if let Some(shape) = seq.next_element()? {
                entry.shape.set(shape);
                if let Some(offsets) = seq.next_element()? {
                    entry.offsets.set(offsets);
                }
            }
        }
        while seq.next_element::<Lenient<Ignored>>()?.is_some() {
            entry.extra_elements += 1;
        }
        Ok(Lenient::Good(entry))
    }
}

/// The `__metadata__` value: null, or an object of strings (bad values are reported one by one).
struct MetadataValue {
    map: Option<StringMap>,
    /// A finding for each value that is not a string.
    bad_values: Findings,
}

impl<'de> FromJson<'de> for MetadataValue {
    fn from_null() -> Lenient<Self> {
        Lenient::Good(MetadataValue {
            map: None,
            bad_values: Findings::new(),
        })
    }

    fn from_map<A: MapAccess<'de>>(mut map: A) -> Result<Lenient<Self>, A::Error> {
        let mut entries = StringMapBuilder::new();
        let mut bad_values = Findings::new();
        while let Some(Key(key)) = map.next_key::<Key>()? {
            match map.next_value::<Lenient<Text>>()? {
                Lenient::Good(Text(value)) => entries.insert(&key, &value),
                Lenient::Bad(found) => bad_values.push(Finding::error(
                    Code::MetadataInvalid,
                    format!(
                        "`__metadata__` value of `{key}` is {found}; every value must be a string"
                    ),
                )),
            }
        }
        Ok(Lenient::Good(MetadataValue {
            map: Some(entries.finish()),
            bad_values,
        }))
    }
}

/// About how many bytes of header text a canonical tensor entry takes.
const ENTRY_BYTES: usize = 100;

/// The tensors read so far, found by name.
///
/// While names arrive in ascending byte order, as writers sort them, a new name greater than the
/// last cannot have been read before, and the list itself is searched by bisection: no table
/// is kept. The first name out of order builds a hash table of every name so far, which answers
/// from then on. The table holds indexes into the tensor list, not names: a header of a million
/// entries would otherwise keep every name twice.
struct NameIndex {
    table: Option<HashTable<u32>>,
    /// Entries the header is likely to hold, to size the table.
    expected: usize,
    hasher: foldhash::fast::RandomState,
}

impl NameIndex {
    /// For a header of `text_len` bytes (canonical entries take about 100 bytes), so that a
    /// typical header is indexed without rehashing.
    fn for_header(text_len: usize) -> NameIndex {
        NameIndex {
            table: None,
            expected: text_len / ENTRY_BYTES,
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    /// Whether the names read so far are in ascending byte order.
    fn ascending(&self) -> bool {
        self.table.is_none()
    }

    /// The index of the tensor named `name`, if one was read.
    fn find(&self, tensors: &[Tensor], name: &str) -> Option<usize> {
        match &self.table {
            None => tensors.binary_search_by(|t| t.name().cmp(name)).ok(),
            Some(table) => table
                .find(self.hasher.hash_one(name), |&i| {
                    tensors[i as usize].name() == name
                })
                .map(|&i| i as usize),
        }
    }

    /// The index of the tensor named `name` if one was read; otherwise records `name` at
    /// `tensors.len()`, where the caller is about to push it.
    fn find_or_insert(&mut self, tensors: &[Tensor], name: &str) -> Option<usize> {
        if self.table.is_none() {
            if tensors.last().is_none_or(|last| last.name() < name) {
                return None;
            }
            self.hash_every_name(tensors);
        }
        let hasher = &self.hasher;
        let table = self.table.as_mut()?;
        let entry = table.entry(
            hasher.hash_one(name),
            |&i| tensors[i as usize].name() == name,
            |&i| hasher.hash_one(tensors[i as usize].name()),
        );
        match entry {
            hash_table::Entry::Occupied(found) => Some(*found.get() as usize),
            hash_table::Entry::Vacant(slot) => {
                slot.insert(to_index(tensors.len()));
                None
            }
        }
    }

    fn hash_every_name(&mut self, tensors: &[Tensor]) {
        let hash = |tensor: &Tensor| self.hasher.hash_one(tensor.name());
        let mut table = HashTable::with_capacity(self.expected.max(tensors.len() + 1));
        for (i, tensor) in tensors.iter().enumerate() {
            table.insert_unique(hash(tensor), to_index(i), |&i| hash(&tensors[i as usize]));
        }
        self.table = Some(table);
    }
}

/// A header holds at most 100,000,000 bytes: far fewer entries than `u32::MAX`.
fn to_index(position: usize) -> u32 {
    u32::try_from(position).unwrap_or(u32::MAX)
}

/// Reads the top-level object, storing what it reads into `out` as it goes.
struct HeaderSeed<'a> {
    out: &'a mut ParsedHeader,
    names: NameIndex,
}

impl<'de> DeserializeSeed<'de> for HeaderSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for HeaderSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object of tensor entries")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        let mut metadata_seen = false;
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            if key == METADATA_KEY {
                let value = map.next_value::<Lenient<MetadataValue>>()?;
                self.metadata(value, metadata_seen);
                metadata_seen = true;
            } else {
                let entry = map.next_value::<Lenient<Entry>>()?;
                self.tensor(&key, entry);
            }
        }
        Ok(())
    }
}

impl HeaderSeed<'_> {
    fn metadata(&mut self, value: Lenient<MetadataValue>, seen_before: bool) {
        let findings = &mut self.out.findings;
        if seen_before {
            findings.push(Finding::error(
                Code::MetadataDuplicate,
                "`__metadata__` appears twice in the header; the reference rejects it (the last one is shown)",
            ));
        }
        match value {
            Lenient::Good(metadata) => {
                findings.append(metadata.bad_values);
                self.out.metadata = metadata.map;
            }
            Lenient::Bad(found) => findings.push(Finding::error(
                Code::MetadataInvalid,
                format!("`__metadata__` is {found}; it must be an object of strings or null"),
            )),
        }
    }

    fn tensor(&mut self, name: &str, entry: Lenient<Entry>) {
        let findings = &mut self.out.findings;
        let entry = match entry {
            Lenient::Good(entry) => entry,
            Lenient::Bad(found) => {
                findings.push(
                    Finding::error(
                        Code::TensorEntryInvalid,
                        format!(
                            "the entry is {found}; a tensor entry must be an object with dtype, shape and data_offsets"
                        ),
                    )
                    .for_tensor(name),
                );
                self.out.all_entries_read = false;
                return;
            }
        };
        let Some(info) = check_entry(name, entry, findings) else {
            self.out.all_entries_read = false;
            return;
        };
        if let Some(index) = self.names.find_or_insert(&self.out.tensors, name) {
            let earlier = &mut self.out.tensors[index].info;
            let finding = if *earlier == info {
                Finding::warning(
                    Code::DuplicateTensorName,
                    "the name appears twice in the header with identical entries",
                )
            } else {
                Finding::warning(
                    Code::DuplicateTensorName,
                    "the name appears twice in the header with different entries; the last one wins \
                     (as in the reference), so the first entry is ignored",
                )
            };
            findings.push(finding.for_tensor(name));
            *earlier = info;
        } else {
            self.out.tensors.push(info.into());
        }
    }
}

/// Turns a read entry into a tensor, or reports why it cannot be one.
fn check_entry(name: &str, entry: Entry, findings: &mut Findings) -> Option<TensorInfo> {
    let mut problem =
        |code, message: String| findings.push(Finding::error(code, message).for_tensor(name));
    for field in &entry.duplicate_fields {
        problem(
            Code::TensorEntryInvalid,
            format!("the field `{field}` is given twice"),
        );
    }
    if entry.extra_elements > 0 {
        problem(
            Code::TensorEntryInvalid,
            format!(
                "the positional entry has {} elements; it must be exactly [dtype, shape, data_offsets]",
                3 + entry.extra_elements
            ),
        );
    }
    let dtype = entry
        .dtype
        .require("dtype", "a dtype name such as \"F32\"", &mut problem);
    let shape = entry
        .shape
        .require("shape", "an array of non-negative integers", &mut problem);
    let offsets = entry.offsets.require(
        "data_offsets",
        "[begin, end] as non-negative integers",
        &mut problem,
    );
    let data_offsets = offsets.and_then(|offsets| {
        if offsets.len == 2 {
            Some(offsets.values)
        } else {
            problem(
                Code::TensorEntryInvalid,
                format!(
                    "`data_offsets` has {} values; it must be exactly [begin, end]",
                    offsets.len
                ),
            );
            None
        }
    });
    if let Some(DtypeSpec {
        dtype: TensorDtype::Unknown(name),
        ..
    }) = &dtype
    {
        problem(
            Code::DtypeUnknown,
            format!(
                "the dtype `{}` is not one the format defines",
                name.escape_debug()
            ),
        );
    }
    if entry.positional {
        findings.push(
            Finding::warning(
                Code::TensorEntryPositional,
                "the entry is written as a [dtype, shape, data_offsets] array; the reference accepts \
                 it, other readers may not",
            )
            .for_tensor(name),
        );
    }
    if let Some(DtypeSpec {
        dtype,
        enum_form: true,
    }) = &dtype
    {
        findings.push(
            Finding::warning(
                Code::DtypeEnumForm,
                format!(
                    "the dtype is written as {{\"{}\": null}}; the reference accepts it, other readers may not",
                    dtype.name().escape_debug()
                ),
            )
            .for_tensor(name),
        );
    }
    for field in &entry.unknown_fields {
        findings.push(
            Finding::info(
                Code::TensorFieldUnknown,
                format!(
                    "the entry has a field `{}` that the format does not define",
                    field.escape_debug()
                ),
            )
            .for_tensor(name),
        );
    }
    let (DtypeSpec { dtype, .. }, Counts(shape), data_offsets) = (dtype?, shape?, data_offsets?);
    Some(TensorInfo {
        name: name.into(),
        dtype,
        shape,
        data_offsets,
    })
}

impl<T> Field<T> {
    /// The field's value, or `None` after reporting it missing or of the wrong form.
    fn require(
        self,
        field: &str,
        expected: &str,
        problem: &mut impl FnMut(Code, String),
    ) -> Option<T> {
        match self {
            Field::Present(value) => Some(value),
            Field::Missing => {
                problem(
                    Code::TensorEntryInvalid,
                    format!("the field `{field}` is missing"),
                );
                None
            }
            Field::Invalid(found) => {
                problem(
                    Code::TensorEntryInvalid,
                    format!("`{field}` is {found}; it must be {expected}"),
                );
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Dtype;

    fn parse_all(text: &str) -> ParsedHeader {
        parse(text, true)
    }

    fn codes(parsed: &ParsedHeader) -> Vec<&'static str> {
        parsed.findings.iter().map(|f| f.code.as_str()).collect()
    }

    #[test]
    fn reads_a_plain_header() {
        let parsed = parse_all(
            r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#,
        );
        assert!(parsed.findings.is_empty(), "{:?}", parsed.findings);
        assert_eq!(parsed.metadata.unwrap().get("format"), Some("pt"));
        assert_eq!(parsed.tensors.len(), 1);
        let tensor = &parsed.tensors[0];
        assert_eq!(tensor.name(), "a");
        assert_eq!(tensor.info.dtype, TensorDtype::Known(Dtype::F32));
        assert_eq!(tensor.info.shape.to_vec(), [2, 2]);
        assert_eq!(tensor.info.data_offsets, [0, 16]);
    }

    #[test]
    fn keeps_going_after_a_bad_entry() {
        let parsed = parse_all(
            r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]},
                "b":{"dtype":"F128","shape":[1],"data_offsets":[0,16]},
                "c":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}}"#,
        );
        assert_eq!(codes(&parsed), ["tensor-entry-invalid", "dtype-unknown"]);
        let names: Vec<_> = parsed.tensors.iter().map(Tensor::name).collect();
        assert_eq!(names, ["b", "c"]);
        assert_eq!(parsed.tensors[0].info.dtype.name(), "F128");
    }

    #[test]
    fn keeps_tensors_read_before_a_syntax_error() {
        let parsed =
            parse_all(r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype""#);
        assert_eq!(parsed.tensors.len(), 1);
        assert_eq!(codes(&parsed), ["header-json"]);
    }

    #[test]
    fn accepts_the_reference_quirks() {
        let parsed = parse_all(
            "\t\n{\"a\":[\"F32\",[1],[0,4]],\"b\":{\"dtype\":{\"F32\":null},\"shape\":[1],\"data_offsets\":[4,8]},\
             \"c\":{\"dtype\":{\"F32\":null},\"shape\":[],\"data_offsets\":[8,12],\"x\":[[1]]},\
             \"\\u005f_metadata__\":{\"k\":\"1\",\"k\":\"2\"}}",
        );
        assert!(parsed.first_error().is_none(), "{:?}", parsed.findings);
        assert_eq!(parsed.tensors.len(), 3);
        assert_eq!(parsed.metadata.as_ref().unwrap().get("k"), Some("2"));
        assert_eq!(
            codes(&parsed),
            [
                "header-leading-whitespace",
                "tensor-entry-positional",
                "dtype-enum-form",
                "dtype-enum-form",
                "tensor-field-unknown"
            ]
        );
    }

    #[test]
    fn rejects_what_serde_rejects() {
        for (header, code) in [
            (
                r#"{"a":{"dtype":{"F32":[]},"shape":[1],"data_offsets":[0,4]}}"#,
                "tensor-entry-invalid",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[-0],"data_offsets":[0,4]}}"#,
                "tensor-entry-invalid",
            ),
            (
                r#"{"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
                "tensor-entry-invalid",
            ),
            (r#"{"a":["F32",[1],[0,4],0]}"#, "tensor-entry-invalid"),
            (r#"{"a":"F32"}"#, "tensor-entry-invalid"),
            (r#"{"__metadata__":{"a":1}}"#, "metadata-invalid"),
            (
                r#"{"__metadata__":{},"__metadata__":{}}"#,
                "metadata-duplicate",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1e400}}"#,
                "header-json",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":"\ud800"}}"#,
                "header-json",
            ),
            ("null", "header-not-object"),
            ("{}\0\0\0", "header-nul-padding"),
        ] {
            let parsed = parse_all(header);
            let error = parsed
                .first_error()
                .unwrap_or_else(|| panic!("accepted {header}"));
            assert_eq!(error.code.as_str(), code, "{header}");
        }
    }

    #[test]
    fn nesting_limit_matches_serde_json() {
        let nested = |depth: usize| {
            format!(
                r#"{{"a":{{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":{}{}}}}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            )
        };
        assert!(parse_all(&nested(125)).first_error().is_none());
        assert_eq!(
            parse_all(&nested(126)).first_error().unwrap().code,
            Code::HeaderJson
        );
        assert_eq!(
            parse_all(&nested(10_000)).first_error().unwrap().code,
            Code::HeaderJson
        );
    }

    #[test]
    fn the_fast_path_agrees_with_the_lenient_parser() {
        let header = r#" {"__metadata__":{"format":"pt","x":"y"},"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},
            "a":{"shape":[],"data_offsets":[12,16],"dtype":"F32"},"日本":{"dtype":"U8","shape":[0],"data_offsets":[16,16]}} "#;
        let fast = fast::parse(header).unwrap();
        let lenient = parse_leniently(header, true);
        assert_eq!(fast.tensors, lenient.tensors);
        assert_eq!(fast.metadata, lenient.metadata);
        assert!(lenient.findings.is_empty());
        assert_eq!(
            parse(header, true).findings.len(),
            1,
            "the leading space is noted either way"
        );
    }

    #[test]
    fn duplicate_names_keep_the_last_entry() {
        let parsed = parse_all(
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
        );
        assert_eq!(parsed.tensors.len(), 1);
        assert_eq!(parsed.tensors[0].info.data_offsets, [4, 8]);
        assert_eq!(parsed.findings[0].severity, Severity::Warning);
    }

    #[test]
    fn a_repeated_name_is_found_in_and_out_of_name_order() {
        let entry = |name: &str, at: u64| {
            format!(
                r#""{name}":{{"dtype":"U8","shape":[1],"data_offsets":[{at},{}]}}"#,
                at + 1
            )
        };
        for names in [
            ["a", "b", "c", "b"],
            ["a", "b", "b", "c"],
            ["c", "b", "a", "b"],
            ["b", "c", "a", "c"],
        ] {
            let entries: Vec<String> = (0u64..).zip(names).map(|(at, n)| entry(n, at)).collect();
            let parsed = parse_all(&format!("{{{}}}", entries.join(",")));
            let codes: Vec<Code> = parsed.findings.iter().map(|f| f.code).collect();
            assert_eq!(codes, [Code::DuplicateTensorName], "{names:?}");
            assert_eq!(parsed.tensors.len(), 3, "{names:?}");
        }
    }
}
