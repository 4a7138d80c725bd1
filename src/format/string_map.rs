//! Strings keyed by strings, kept in one buffer.

use crate::text::byte_order;
use hashbrown::HashTable;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, Serializer};
use std::borrow::Cow;
use std::fmt;
use std::hash::BuildHasher;

/// Strings keyed by strings, in key order, their text back to back in one buffer.
///
/// A header's `__metadata__` or an index's `weight_map` can hold millions of short entries, which
/// as a map of `String`s would take ten times their text (two allocations and a tree node each);
/// here an entry takes its text and 12 bytes.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StringMap {
    text: String,
    /// Each entry's key start, key length and value length in `text`, in key order.
    entries: Vec<[u32; 3]>,
}

impl StringMap {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries
            .binary_search_by(|&entry| self.key(entry).cmp(key))
            .ok()
            .map(|at| self.value(self.entries[at]))
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The entries in key order.
    pub fn iter(
        &self,
    ) -> impl DoubleEndedIterator<Item = (&str, &str)> + ExactSizeIterator + Clone + '_ {
        self.entries
            .iter()
            .map(|&entry| (self.key(entry), self.value(entry)))
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &str> + ExactSizeIterator + '_ {
        self.iter().map(|(key, _)| key)
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &str> + ExactSizeIterator + '_ {
        self.iter().map(|(_, value)| value)
    }

    fn key(&self, [start, key_len, _]: [u32; 3]) -> &str {
        let start = start as usize;
        &self.text[start..start + key_len as usize]
    }

    fn value(&self, [start, key_len, value_len]: [u32; 3]) -> &str {
        let start = start as usize + key_len as usize;
        &self.text[start..start + value_len as usize]
    }
}

/// Collects entries in any order into a [`StringMap`]; a key given twice keeps its last value,
/// as JSON readers do.
#[derive(Debug, Default)]
pub struct StringMapBuilder {
    map: StringMap,
    sorted: bool,
}

impl StringMapBuilder {
    pub fn new() -> StringMapBuilder {
        StringMapBuilder {
            map: StringMap::default(),
            sorted: true,
        }
    }

    /// Room for `entries` entries of `text` bytes in all.
    pub fn with_capacity(text: usize, entries: usize) -> StringMapBuilder {
        StringMapBuilder {
            map: StringMap {
                text: String::with_capacity(text),
                entries: Vec::with_capacity(entries),
            },
            sorted: true,
        }
    }

    /// Adds an entry, unless the text would pass 4 GiB (a header holds at most 100 MB).
    pub fn insert(&mut self, key: &str, value: &str) {
        let map = &mut self.map;
        let (Ok(start), Ok(key_len), Ok(value_len)) = (
            u32::try_from(map.text.len()),
            u32::try_from(key.len()),
            u32::try_from(value.len()),
        ) else {
            return;
        };
        if start
            .checked_add(key_len)
            .and_then(|end| end.checked_add(value_len))
            .is_none()
        {
            return;
        }
        if self.sorted
            && let Some(&last) = map.entries.last()
        {
            self.sorted = map.key(last) < key;
        }
        map.text.push_str(key);
        map.text.push_str(value);
        map.entries.push([start, key_len, value_len]);
    }

    pub fn finish(self) -> StringMap {
        let mut map = self.map;
        if !self.sorted {
            // By key, and for a key given twice by the order given, keeping the last. An entry
            // starts where the one before it ends, so only an empty key with an empty value
            // starts where the next does: the start and then the length give the order.
            let StringMap { text, entries } = &mut map;
            let key = |[start, key_len, _]: [u32; 3]| {
                &text[start as usize..start as usize + key_len as usize]
            };
            entries.sort_unstable_by(|&a, &b| {
                byte_order(key(a).as_bytes(), key(b).as_bytes())
                    .then(a[0].cmp(&b[0]))
                    .then(a[2].cmp(&b[2]))
            });
            entries.dedup_by(|later, earlier| {
                let same = key(*later) == key(*earlier);
                if same {
                    *earlier = *later;
                }
                same
            });
        }
        map.text.shrink_to_fit();
        map.entries.shrink_to_fit();
        map
    }

    /// The entries, each key once, without sorting them when no key is given twice: then in the
    /// order given; else, as [`StringMapBuilder::finish`] gives them, in key order with a key
    /// given twice keeping its last value.
    pub fn finish_unsorted(mut self) -> StringPairs {
        if !self.sorted && self.repeats_a_key() {
            return StringPairs { map: self.finish() };
        }
        self.map.text.shrink_to_fit();
        self.map.entries.shrink_to_fit();
        StringPairs { map: self.map }
    }

    fn repeats_a_key(&self) -> bool {
        let map = &self.map;
        let key = |at: u32| map.key(map.entries[at as usize]);
        let hasher = foldhash::fast::FixedState::default();
        let mut seen = HashTable::<u32>::with_capacity(map.entries.len());
        for at in 0..map.entries.len() {
            let Ok(at) = u32::try_from(at) else {
                return true;
            };
            let hash = hasher.hash_one(key(at));
            if seen.find(hash, |&other| key(other) == key(at)).is_some() {
                return true;
            }
            seen.insert_unique(hash, at, |&other| hasher.hash_one(key(other)));
        }
        false
    }
}

/// Strings paired with strings, each key once, not necessarily in key order: what is gone
/// through rather than looked up (an index's `weight_map`) is spared the sort of a
/// [`StringMap`].
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StringPairs {
    /// Its entries in the order given, not in key order.
    map: StringMap,
}

impl StringPairs {
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The entries, in the order [`StringMapBuilder::finish_unsorted`] gives.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + Clone + '_ {
        self.map.iter()
    }

    pub fn values(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.map.values()
    }
}

impl fmt::Debug for StringPairs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// A JSON object of strings, read straight into the buffer.
impl<'de> Deserialize<'de> for StringPairs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<StringPairs, D::Error> {
        deserializer
            .deserialize_map(Entries)
            .map(StringMapBuilder::finish_unsorted)
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for StringMap {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(entries: I) -> StringMap {
        let mut builder = StringMapBuilder::new();
        for (key, value) in entries {
            builder.insert(key.as_ref(), value.as_ref());
        }
        builder.finish()
    }
}

/// A JSON object of strings, read straight into the buffer.
impl<'de> Deserialize<'de> for StringMap {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<StringMap, D::Error> {
        deserializer
            .deserialize_map(Entries)
            .map(StringMapBuilder::finish)
    }
}

/// The entries of a JSON object of strings, as given.
struct Entries;

impl<'de> Visitor<'de> for Entries {
    type Value = StringMapBuilder;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of strings")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StringMapBuilder, A::Error> {
        let mut builder = StringMapBuilder::new();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            let value = map.next_value::<Cow<'de, str>>()?;
            builder.insert(&key, &value);
        }
        Ok(builder)
    }
}

impl fmt::Debug for StringMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Serialize for StringMap {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.len()))?;
        for (key, value) in self.iter() {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        /// The same entries, in the same order, as a `BTreeMap` filled in the order given.
        #[test]
        fn agrees_with_a_btree_map(entries in prop::collection::vec(("[a-c]{0,3}", ".{0,3}"), 0..40)) {
            let map: StringMap = entries.iter().map(|(k, v)| (k, v)).collect();
            let expected: BTreeMap<&str, &str> =
                entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            prop_assert_eq!(map.len(), expected.len());
            prop_assert!(map.iter().eq(expected.iter().map(|(k, v)| (*k, *v))));
            for (key, value) in &expected {
                prop_assert_eq!(map.get(key), Some(*value));
            }
            prop_assert_eq!(map.get("d"), None);
        }
    }

    #[test]
    fn reads_a_json_object_of_strings() {
        let map: StringMap =
            serde_json::from_str(r#"{"b":"2","a":"1","b":"3","\u0063":"x"}"#).unwrap();
        assert_eq!(
            serde_json::to_string(&map).unwrap(),
            r#"{"a":"1","b":"3","c":"x"}"#
        );
        assert!(serde_json::from_str::<StringMap>(r#"{"a":1}"#).is_err());
        let read: StringMap = serde_json::from_reader(r#"{"k":"v"}"#.as_bytes()).unwrap();
        assert_eq!(read.get("k"), Some("v"));
    }

    #[test]
    fn serializes_as_a_json_object() {
        let map: StringMap = [("b", "2"), ("a", "1")].into_iter().collect();
        assert_eq!(serde_json::to_string(&map).unwrap(), r#"{"a":"1","b":"2"}"#);
        assert_eq!(map.get("b"), Some("2"));
    }
}
