//! Differential property tests: on random headers, random JSON and mutated valid files, stui
//! never panics and its strict verdict equals the reference crate's.

use proptest::prelude::*;
use std::path::Path;
use stui::demo::{Fill, SyntheticModel};
use stui::finding::Severity;
use stui::format::{Dtype, SafetensorsFile};

/// The reference crate's verdict: "ok" or its error variant's name.
fn reference_verdict(bytes: &[u8]) -> String {
    match safetensors::SafeTensors::deserialize(bytes) {
        Ok(_) => "ok".into(),
        Err(error) => {
            let debug = format!("{error:?}");
            debug.split('(').next().unwrap_or_default().to_owned()
        }
    }
}

fn stui_verdict(bytes: &[u8]) -> String {
    let file = SafetensorsFile::from_bytes(Path::new("case.safetensors"), bytes);
    let has_error = file.findings.iter().any(|f| f.severity == Severity::Error);
    assert_eq!(
        has_error,
        !file.is_valid(),
        "an error finding exactly when rejected: {:?}",
        file.findings
    );
    file.rejection
        .as_ref()
        .map_or_else(|| "ok".into(), |r| r.variant().to_owned())
}

/// Compares verdicts. Where tensors share identical offsets the reference walks them in hash-map
/// order, which differs from one map to the next, so its verdict may vary: stui's must be one of
/// those it gives.
fn assert_same_verdict(bytes: &[u8]) -> Result<(), TestCaseError> {
    let actual = stui_verdict(bytes);
    let mut seen = Vec::new();
    for _ in 0..32 {
        let expected = reference_verdict(bytes);
        if expected == actual {
            return Ok(());
        }
        if !seen.contains(&expected) {
            seen.push(expected);
        }
    }
    Err(TestCaseError::fail(format!(
        "stui says {actual}, the reference {seen:?}; file bytes: {:?}",
        String::from_utf8_lossy(bytes)
    )))
}

const NAMES: [&str; 6] = ["a", "b", "w.0", "w.10", "\\u0061", "__metadata__"];

fn dtype_name() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(Dtype::ALL.to_vec()).prop_map(|d| d.name().to_owned()),
        1 => prop::sample::select(vec!["F128", " F32", "f32", "float8_e4m3fn", ""]).prop_map(str::to_owned),
    ]
}

fn dim() -> impl Strategy<Value = u64> {
    prop_oneof![
        10 => 0u64..5,
        1 => Just(1u64 << 63),
        1 => Just(u64::MAX),
        1 => Just((1u64 << 61) - 1),
    ]
}

#[derive(Clone, Debug)]
struct EntryPlan {
    name: &'static str,
    dtype: String,
    shape: Vec<u64>,
    form: u8,
    offset_error: i8,
}

fn entry() -> impl Strategy<Value = EntryPlan> {
    (
        prop::sample::select(NAMES.to_vec()),
        dtype_name(),
        prop::collection::vec(dim(), 0..4),
        0u8..8,
        prop_oneof![6 => Just(0i8), 1 => -2i8..=2],
    )
        .prop_map(|(name, dtype, shape, form, offset_error)| EntryPlan {
            name,
            dtype,
            shape,
            form,
            offset_error,
        })
}

/// Builds a header's text from planned entries, laid out back to back, with the quirks each
/// entry's `form` asks for; returns the text and the data length it implies.
fn header_text(entries: &[EntryPlan], metadata: u8) -> (String, u64) {
    let mut parts = Vec::new();
    match metadata {
        1 => parts.push(r#""__metadata__":{"format":"pt"}"#.to_owned()),
        2 => parts.push(r#""__metadata__":null"#.to_owned()),
        3 => parts.push(r#""__metadata__":{"n":1}"#.to_owned()),
        _ => {}
    }
    let mut cursor = 0u64;
    for entry in entries {
        let count = entry.shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
        let bits = Dtype::from_name(&entry.dtype).map_or(32, |d| u64::from(d.bits()));
        let len = count
            .and_then(|n| n.checked_mul(bits))
            .map_or(4, |b| b.div_ceil(8))
            .min(64);
        let begin = cursor.saturating_add_signed(i64::from(entry.offset_error));
        let end = begin.saturating_add(len);
        cursor = end;
        let shape = entry
            .shape
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let dtype = &entry.dtype;
        let value = match entry.form {
            0 => format!(r#"["{dtype}",[{shape}],[{begin},{end}]]"#),
            1 => format!(
                r#"{{"dtype":{{"{dtype}":null}},"shape":[{shape}],"data_offsets":[{begin},{end}]}}"#
            ),
            2 => format!(
                r#"{{"data_offsets":[{begin},{end}],"x":{{"y":[1,2.5,null]}},"shape":[{shape}],"dtype":"{dtype}"}}"#
            ),
            3 => format!(r#"{{"dtype":"{dtype}","shape":[{shape}]}}"#),
            4 => format!(
                r#"{{"dtype":"{dtype}","shape":[{shape}],"data_offsets":[{begin},{end}],"shape":[1]}}"#
            ),
            5 => {
                format!(r#"{{"dtype":"{dtype}","shape":"{shape}","data_offsets":[{begin},{end}]}}"#)
            }
            _ => {
                format!(r#"{{"dtype":"{dtype}","shape":[{shape}],"data_offsets":[{begin},{end}]}}"#)
            }
        };
        parts.push(format!(r#""{}":{value}"#, entry.name));
    }
    (format!("{{{}}}", parts.join(",")), cursor)
}

fn file_from(header: &str, padding: &[u8], data_len: u64, data_delta: i8) -> Vec<u8> {
    let mut text = header.as_bytes().to_vec();
    text.extend_from_slice(padding);
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&text);
    let data = data_len
        .saturating_add_signed(i64::from(data_delta))
        .min(4096);
    bytes.resize(bytes.len() + usize::try_from(data).unwrap_or(0), 0x3c);
    bytes
}

fn valid_file() -> impl Strategy<Value = Vec<u8>> {
    (0u64..1000, 1usize..5).prop_map(|(seed, count)| {
        let dtypes = [Dtype::F32, Dtype::Bf16, Dtype::U8, Dtype::F4, Dtype::I64];
        let mut model = SyntheticModel::new(seed);
        for i in 0..count {
            let dtype = dtypes[(usize::try_from(seed).unwrap() + i) % dtypes.len()];
            model = model.tensor(
                &format!("t.{i}"),
                dtype,
                &[2, (seed % 3) + 1 + i as u64],
                Fill::Zeros,
            );
        }
        if seed % 2 == 0 {
            model = model.metadata("format", "pt");
        }
        model.to_bytes().unwrap()
    })
}

#[derive(Clone, Debug)]
enum Mutation {
    SetByte { at: usize, value: u8 },
    Truncate { at: usize },
    Insert { at: usize, bytes: Vec<u8> },
    Remove { at: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let at = 0usize..600;
    let interesting = prop_oneof![
        Just(b'{'),
        Just(b'}'),
        Just(b'['),
        Just(b']'),
        Just(b'"'),
        Just(b','),
        Just(b':'),
        Just(b' '),
        Just(0u8),
        Just(b'0'),
        Just(b'9'),
        Just(b'-'),
        Just(b'e'),
        Just(0xff),
        any::<u8>()
    ];
    prop_oneof![
        4 => (at.clone(), interesting.clone()).prop_map(|(at, value)| Mutation::SetByte { at, value }),
        1 => at.clone().prop_map(|at| Mutation::Truncate { at }),
        2 => (at.clone(), prop::collection::vec(interesting, 1..4)).prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        2 => at.prop_map(|at| Mutation::Remove { at }),
    ]
}

fn apply(bytes: &mut Vec<u8>, mutation: &Mutation) {
    let len = bytes.len().max(1);
    match mutation {
        Mutation::SetByte { at, value } => {
            let at = at % len;
            if let Some(byte) = bytes.get_mut(at) {
                *byte = *value;
            }
        }
        Mutation::Truncate { at } => bytes.truncate(at % len),
        Mutation::Insert { at, bytes: new } => {
            let at = at % len;
            bytes.splice(at..at, new.iter().copied());
        }
        Mutation::Remove { at } => {
            if !bytes.is_empty() {
                bytes.remove(at % len);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    #[test]
    fn random_headers_get_the_reference_verdict(
        entries in prop::collection::vec(entry(), 0..5),
        metadata in 0u8..5,
        padding in prop::sample::select(vec![&b""[..], b"  ", b"\t\n", b"\0\0", b" \x0c"]),
        data_delta in prop_oneof![4 => Just(0i8), 1 => -3i8..=3],
        leading in prop::bool::weighted(0.1),
    ) {
        let (header, data_len) = header_text(&entries, metadata);
        let header = if leading { format!("\n {header}") } else { header };
        assert_same_verdict(&file_from(&header, padding, data_len, data_delta))?;
    }

    #[test]
    fn mutated_valid_files_get_the_reference_verdict(
        file in valid_file(),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        let mut bytes = file;
        for mutation in &mutations {
            apply(&mut bytes, mutation);
        }
        assert_same_verdict(&bytes)?;
    }

    #[test]
    fn json_like_noise_gets_the_reference_verdict(
        text in "[{}\\[\\]\",: 0-9a-zA-Z_.\\-\\\\]{0,80}",
        data in 0u64..16,
    ) {
        assert_same_verdict(&file_from(&text, b"", data, 0))?;
    }

    #[test]
    fn arbitrary_bytes_get_the_reference_verdict(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        assert_same_verdict(&bytes)?;
    }
}

#[test]
fn serde_quirks_the_reference_accepts_are_accepted() {
    for header in [
        r#"{"a":{"dtype":{"F32":null},"shape":[1],"data_offsets":[0,4]}}"#,
        r#"{"a":["F32",[1],[0,4]]}"#,
        r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":[[[1]]]}}"#,
        "\r\n\t {\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} \t",
        r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
    ] {
        let bytes = file_from(header, b"", 4, 0);
        assert_eq!(reference_verdict(&bytes), "ok", "{header}");
        assert_eq!(stui_verdict(&bytes), "ok", "{header}");
    }
    let empty_object_variant = file_from(
        r#"{"a":{"dtype":{"F32":{}},"shape":[1],"data_offsets":[0,4]}}"#,
        b"",
        4,
        0,
    );
    assert_eq!(
        reference_verdict(&empty_object_variant),
        "InvalidHeaderDeserialization"
    );
    assert_eq!(
        stui_verdict(&empty_object_variant),
        "InvalidHeaderDeserialization"
    );
}
