//! Hostile input: headers and folders built to hurt a reader. Each must give findings, in bounded
//! time and memory, and never a panic or a hang.

use crate::support;
use std::time::{Duration, Instant};
use stui::finding::{Code, Finding, Findings};
use stui::format::{Model, SafetensorsFile};

fn read(bytes: &[u8]) -> SafetensorsFile {
    SafetensorsFile::from_bytes(std::path::Path::new("hostile.safetensors"), bytes)
}

#[test]
fn a_rank_100000_shape_is_read_quickly() {
    let shape = vec!["1"; 100_000].join(",");
    let header = format!(r#"{{"a":{{"dtype":"U8","shape":[{shape}],"data_offsets":[0,1]}}}}"#);
    let started = Instant::now();
    let file = read(&support::raw_file(&header, &[7]));
    assert!(file.is_valid(), "{:?}", file.findings);
    assert_eq!(file.tensors[0].info.shape.len(), 100_000);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn huge_metadata_values_and_names_are_read_and_shown_cut() {
    let value = "v".repeat(10 << 20);
    let name = "n".repeat(1 << 20);
    let header = format!(
        r#"{{"__metadata__":{{"big":"{value}"}},"{name}":{{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}}}"#
    );
    let file = read(&support::raw_file(&header, &[0]));
    assert!(file.is_valid());
    assert_eq!(
        file.metadata.as_ref().unwrap().get("big").unwrap().len(),
        10 << 20
    );
    assert_eq!(file.tensors[0].name().len(), 1 << 20);
}

#[test]
fn shapes_and_lengths_that_overflow_are_findings() {
    for header in [
        r#"{"a":{"dtype":"F64","shape":[18446744073709551615,18446744073709551615],"data_offsets":[0,8]}}"#,
        r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551615,18446744073709551615]}}"#,
        r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,18446744073709551615]}}"#,
    ] {
        let file = read(&support::raw_file(header, &[0; 8]));
        assert!(!file.is_valid());
        assert!(
            file.findings
                .iter()
                .any(|f| f.severity == stui::finding::Severity::Error)
        );
    }
    let mut huge_length = u64::MAX.to_le_bytes().to_vec();
    huge_length.extend_from_slice(b"{}");
    assert_eq!(
        read(&huge_length).findings.last().unwrap().code,
        Code::HeaderTooLarge
    );
}

#[test]
fn an_index_naming_10000_missing_shards_is_reported_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let map: serde_json::Map<String, serde_json::Value> = (0..10_000)
        .map(|i| {
            (
                format!("t{i}"),
                serde_json::Value::from(format!("shard-{i}.safetensors")),
            )
        })
        .collect();
    let index = serde_json::json!({ "weight_map": map });
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let started = Instant::now();
    let model = Model::open(dir.path()).unwrap();
    // The first thousand listed, the rest counted in one more finding.
    let missing: Vec<&Finding> = model
        .findings
        .iter()
        .filter(|f| f.code == Code::ShardMissing)
        .collect();
    assert_eq!(missing.len(), Findings::KEPT + 1);
    assert!(
        missing[Findings::KEPT]
            .message
            .starts_with("9000 more `shard-missing` findings are not listed"),
        "{:?}",
        missing[Findings::KEPT]
    );
    assert!(!model.is_valid());
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[cfg(unix)]
#[test]
fn a_symlink_loop_in_a_model_folder_is_a_finding() {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        dir.path().join("b.safetensors"),
        dir.path().join("a.safetensors"),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        dir.path().join("a.safetensors"),
        dir.path().join("b.safetensors"),
    )
    .unwrap();
    let model = Model::open(dir.path()).unwrap();
    assert_eq!(
        model
            .findings
            .iter()
            .filter(|f| f.code == Code::ShardUnreadable)
            .count(),
        2
    );
    assert!(model.tensors.is_empty());
}

#[test]
fn deep_nesting_and_a_million_tensors_are_findings_in_bounded_time() {
    for depth in [10_000, 1_000_000] {
        let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        for header in [
            format!(r#"{{"a":{nested}}}"#),
            format!(r#"{{"__metadata__":{{"k":{nested}}}}}"#),
            format!(r#"{{"a":{{"dtype":"U8","shape":{nested},"data_offsets":[0,0]}}}}"#),
        ] {
            let file = read(&support::raw_file(&header, &[]));
            assert!(!file.is_valid(), "depth {depth}");
            assert!(!file.findings.is_empty());
        }
    }
    let tensors: Vec<String> = (0..1_000_000)
        .map(|i| {
            format!(
                r#""t.{i}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{}]}}"#,
                i + 1
            )
        })
        .collect();
    let header = format!("{{{}}}", tensors.join(","));
    let started = Instant::now();
    let file = read(&support::raw_file(&header, &vec![0; 1_000_000]));
    assert!(file.is_valid(), "{:?}", file.findings.first());
    assert_eq!(file.tensors.len(), 1_000_000);
    assert!(started.elapsed() < Duration::from_secs(60));
}
