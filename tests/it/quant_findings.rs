//! The consistency findings of a quantized checkpoint, each planted in a copy of a real
//! producer's checkpoint (its bytes edited in place or its config changed) and named on the
//! weight it concerns; the untouched checkpoint has none.

use serde_json::Value;
use std::path::{Path, PathBuf};
use stui::arch::open_reviewed;
use stui::finding::{Code, Severity};
use stui::format::Model;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/quant")
        .join(name)
}

/// A copy of a fixture's checkpoint and config in a temporary folder.
fn copy(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap();
        if file != "reference.safetensors" && path.is_file() {
            std::fs::copy(&path, dir.path().join(file)).unwrap();
        }
    }
    dir
}

/// Overwrites the bytes of tensor `tensor` of the checkpoint in `dir` with `bytes`, from its
/// `at`th byte.
fn overwrite(dir: &Path, tensor: &str, at: usize, bytes: &[u8]) {
    let path = dir.join("model.safetensors");
    let model = Model::open(&path).unwrap();
    let entry = model.tensors.iter().find(|t| t.name() == tensor).unwrap();
    let (start, len) = model.file_range(entry);
    assert!(at + bytes.len() <= usize::try_from(len).unwrap());
    let mut file = std::fs::read(&path).unwrap();
    let start = usize::try_from(start).unwrap() + at;
    file[start..start + bytes.len()].copy_from_slice(bytes);
    std::fs::write(&path, file).unwrap();
}

/// Changes the checkpoint's `config.json` in `dir`.
fn edit_config(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
}

/// The findings of `code` on the checkpoint in `dir`: severity, tensor and message.
fn findings(dir: &Path, code: Code) -> Vec<(Severity, Option<String>, String)> {
    let (model, _) = open_reviewed(&dir.join("model.safetensors"), None).unwrap();
    model
        .findings
        .iter()
        .filter(|f| f.code == code)
        .map(|f| (f.severity, f.tensor.clone(), f.message.clone()))
        .collect()
}

fn quant_findings(dir: &Path) -> usize {
    let (model, _) = open_reviewed(&dir.join("model.safetensors"), None).unwrap();
    model
        .findings
        .iter()
        .filter(|f| f.code.as_str().starts_with("quant-"))
        .count()
}

#[test]
fn a_weight_shape_that_disagrees_with_the_packed_width_is_named() {
    let dir = copy("ct-w4a16");
    assert_eq!(quant_findings(dir.path()), 0);
    // q_proj's `weight_shape` says 120 columns where 16 words of 8 codes hold 128.
    overwrite(
        dir.path(),
        "model.layers.0.self_attn.q_proj.weight_shape",
        8,
        &120i64.to_le_bytes(),
    );
    let found = findings(dir.path(), Code::QuantPackedWidth);
    assert_eq!(found.len(), 1, "{found:?}");
    let (severity, tensor, message) = &found[0];
    assert_eq!(*severity, Severity::Error);
    assert_eq!(
        tensor.as_deref(),
        Some("model.layers.0.self_attn.q_proj.weight")
    );
    assert!(message.contains("120"), "{message}");
}

#[test]
fn a_g_idx_that_is_no_group_assignment_is_named() {
    let dir = copy("autoround-gptq-4bit");
    assert_eq!(quant_findings(dir.path()), 0);
    // Column 5 of q_proj assigned to group 9 of 2.
    overwrite(
        dir.path(),
        "model.layers.0.self_attn.q_proj.g_idx",
        5 * 4,
        &9i32.to_le_bytes(),
    );
    let found = findings(dir.path(), Code::QuantGroupIndex);
    assert_eq!(found.len(), 1, "{found:?}");
    let (_, tensor, message) = &found[0];
    assert_eq!(
        tensor.as_deref(),
        Some("model.layers.0.self_attn.q_proj.weight")
    );
    assert!(message.contains("column 5 group 9"), "{message}");
    // Every column of one group: more than its 64.
    let dir = copy("autoround-gptq-4bit");
    overwrite(
        dir.path(),
        "model.layers.0.self_attn.k_proj.g_idx",
        0,
        &[0u8; 128 * 4],
    );
    let found = findings(dir.path(), Code::QuantGroupIndex);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].2.contains("more than the group size 64"),
        "{found:?}"
    );
}

#[test]
fn the_ignore_list_and_the_stored_weights_must_agree() {
    let dir = copy("ct-w4a16");
    // down_proj is left BF16, but the ignore list no longer names it; q_proj is named but
    // stored quantized.
    edit_config(dir.path(), |config| {
        config["quantization_config"]["ignore"] = serde_json::json!(["lm_head", "re:.*q_proj$"]);
    });
    let mut found = findings(dir.path(), Code::QuantIgnore);
    found.sort();
    let tensors: Vec<Option<&str>> = found.iter().map(|f| f.1.as_deref()).collect();
    assert_eq!(
        tensors,
        [
            Some("model.layers.0.mlp.down_proj.weight"),
            Some("model.layers.0.self_attn.q_proj.weight")
        ],
        "{found:?}"
    );
    assert!(found.iter().all(|f| f.0 == Severity::Warning));
    assert!(found[0].2.contains("left unquantized"), "{found:?}");
    assert!(found[1].2.contains("names it"), "{found:?}");
}

#[test]
fn a_config_that_disagrees_with_the_stored_scheme_is_a_finding() {
    // The config says GPTQ, the tensors are compressed-tensors'.
    let dir = copy("ct-w4a16");
    edit_config(dir.path(), |config| {
        config["quantization_config"]["quant_method"] = "gptq".into();
    });
    let found = findings(dir.path(), Code::QuantConfig);
    assert!(
        found
            .iter()
            .any(|f| f.2.contains("`gptq`") && f.2.contains("compressed-tensors layout")),
        "{found:?}"
    );
    // No quantization in the config at all.
    let dir = copy("ct-w4a16");
    edit_config(dir.path(), |config| {
        config
            .as_object_mut()
            .unwrap()
            .remove("quantization_config");
    });
    let found = findings(dir.path(), Code::QuantConfig);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].2.contains("declares no quantization"), "{found:?}");
    // A quantized config over a model whose tensors are all plain.
    let dir = copy("source");
    let quantized: Value =
        serde_json::from_slice(&std::fs::read(fixture("ct-w4a16").join("config.json")).unwrap())
            .unwrap();
    edit_config(dir.path(), |config| {
        config["quantization_config"] = quantized["quantization_config"].clone();
    });
    let found = findings(dir.path(), Code::QuantConfig);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].2.contains("no tensor is stored quantized"),
        "{found:?}"
    );
}

/// Variants whose packing or scale direction stui does not read are said to be unread, on the
/// model and on each weight, never dequantized the wrong way.
#[test]
fn variants_whose_values_are_not_read_say_so_instead_of_reading_them_wrongly() {
    for (name, key, value, variant) in [
        (
            "autoround-gptq-4bit",
            "checkpoint_format",
            "gptq_p",
            "planar `gptq_p`",
        ),
        ("autoround-awq-4bit", "version", "gemv", "GEMV"),
    ] {
        let dir = copy(name);
        edit_config(dir.path(), |config| {
            config["quantization_config"][key] = value.into();
        });
        let found = findings(dir.path(), Code::QuantOpaque);
        assert_eq!(found.len(), 1, "{name}: {found:?}");
        assert!(found[0].2.contains(variant), "{name}: {found:?}");
        let run = crate::support::run_within(
            crate::support::stui(dir.path(), ["stats", "model.safetensors"]),
            std::time::Duration::from_secs(60),
        );
        assert_eq!(run.code, Some(1), "{}", run.stderr);
        let text = format!("{}{}", String::from_utf8_lossy(&run.stdout), run.stderr);
        assert!(
            text.contains(
                "`model.layers.0.self_attn.q_proj.weight`: cannot dequantize: stui does not read \
                 the values of"
            ),
            "{name}: {text}"
        );
    }
}
