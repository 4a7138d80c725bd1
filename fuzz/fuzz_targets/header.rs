//! Any bytes as a whole file: the lenient reading and the strict verdict must agree (an error
//! finding exactly when rejected) and never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stui::finding::Severity;
use stui::format::SafetensorsFile;

fuzz_target!(|data: &[u8]| {
    let file = SafetensorsFile::from_bytes(std::path::Path::new("fuzz.safetensors"), data);
    let has_error = file.findings.iter().any(|f| f.severity == Severity::Error);
    assert_eq!(has_error, !file.is_valid());
});
