//! stui's strict verdict equals the reference implementation's on every labelled file of the
//! conformance corpus, and the lenient reading explains every rejection with an error finding.

use crate::support;
use stui::finding::Severity;
use stui::format::Model;

#[test]
fn strict_verdict_equals_the_reference_on_every_labelled_file() {
    let dir = support::conformance_dir();
    let labels = std::fs::read_to_string(dir.join("labels.tsv")).unwrap();
    let mut checked = 0;
    let mut mismatches = Vec::new();
    for line in labels.lines().skip(1) {
        let mut columns = line.split('\t');
        let (Some(file), Some(expected)) = (columns.next(), columns.next()) else {
            continue;
        };
        let model = Model::open(&dir.join("corpus").join(file)).unwrap();
        let verdict = match model.first_rejection() {
            None => "ok".to_owned(),
            Some((_, rejection)) => format!("err:{}", rejection.variant()),
        };
        if verdict != expected {
            mismatches.push(format!(
                "{file}: reference says {expected}, stui says {verdict}"
            ));
        }
        let has_error = model.findings.iter().any(|f| f.severity == Severity::Error);
        if has_error == model.is_valid() {
            mismatches.push(format!(
                "{file}: valid={} but error findings={has_error}",
                model.is_valid()
            ));
        }
        checked += 1;
    }
    assert!(checked >= 80, "only {checked} labelled files found");
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
fn a_rejected_file_still_shows_the_tensors_it_could_read() {
    let dir = support::conformance_dir().join("corpus");
    let model = Model::open(&dir.join("151_offsets_hole.safetensors")).unwrap();
    assert!(!model.is_valid());
    assert_eq!(model.tensors.len(), 2);
    let model = Model::open(&dir.join("115_dtype_unknown.safetensors")).unwrap();
    assert_eq!(model.tensors[0].info.dtype.name(), "F128");
}
