//! Helpers shared by the integration tests: small models written into temporary folders.

use std::path::{Path, PathBuf};
use stui::demo::{Fill, SyntheticModel};
use stui::format::Dtype;

/// The conformance corpus shipped beside the repository.
pub fn conformance_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance");
    assert!(
        dir.join("labels.tsv").is_file(),
        "the conformance corpus is missing at {}",
        dir.display()
    );
    dir
}

/// The demo model in the repository.
pub fn demo_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo.safetensors")
}

/// A small valid model: two layers of two F32 weights.
pub fn small_model() -> SyntheticModel {
    let weight = Fill::Normal {
        mean: 0.0,
        std: 0.02,
    };
    SyntheticModel::new(1)
        .tensor(
            "model.layers.0.mlp.weight",
            Dtype::F32,
            &[4, 4],
            weight.clone(),
        )
        .tensor(
            "model.layers.0.attn.weight",
            Dtype::F32,
            &[4, 4],
            weight.clone(),
        )
        .tensor(
            "model.layers.1.mlp.weight",
            Dtype::F32,
            &[4, 4],
            weight.clone(),
        )
        .tensor("model.layers.1.attn.weight", Dtype::F32, &[4, 4], weight)
        .metadata("format", "pt")
}

/// A file whose header is `header` (padded with spaces to `pad_to` bytes if longer) and whose data
/// section is `data`.
pub fn raw_file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

/// Writes `bytes` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}
