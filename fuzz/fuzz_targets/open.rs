//! Any bytes as a whole file: the strict verdict must equal the reference crate's, the lenient
//! reading must agree with it (an error finding exactly when rejected), and nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stui::finding::Severity;
use stui::format::SafetensorsFile;

fuzz_target!(|data: &[u8]| {
    let file = SafetensorsFile::from_bytes(std::path::Path::new("fuzz.safetensors"), data);
    let has_error = file.findings.iter().any(|f| f.severity == Severity::Error);
    assert_eq!(has_error, !file.is_valid());
    let reference = safetensors::SafeTensors::deserialize(data);
    assert_eq!(
        file.is_valid(),
        reference.is_ok(),
        "stui: {:?}, reference: {:?}",
        file.findings.first(),
        reference.err()
    );
});
