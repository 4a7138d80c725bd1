//! `stui diff` through dequantization: a quantized checkpoint compared with its source by the
//! weights it encodes. The expected figures are worked out here from the producers' own
//! dequantization (`reference.safetensors` beside each checkpoint of `tests/fixtures/quant`)
//! and the source's BF16 values, read with the `safetensors` crate.

use crate::support;
use safetensors::SafeTensors;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant")
}

/// `stui diff --json ARGS` in `dir`: the exit code and the document.
fn diff_json(dir: &Path, args: &[&str]) -> (i32, Value) {
    let mut all = vec!["diff", "--json"];
    all.extend_from_slice(args);
    let run = support::run_within(support::stui(dir, all), std::time::Duration::from_secs(60));
    assert!(run.no_panic(), "{}", run.stderr);
    let json = serde_json::from_slice(&run.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&run.stdout)));
    (run.code.unwrap(), json)
}

fn entry<'j>(json: &'j Value, name: &str) -> &'j Value {
    json["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not in the diff: {json}"))
}

/// `(max |a - b|, ‖a - b‖ / ‖a‖)` over positions where both are finite.
fn error_of(a: &[f32], b: &[f32]) -> (f64, f64) {
    let (mut max, mut diff_sq, mut a_sq) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        if x.is_finite() && y.is_finite() {
            let d = f64::from(x) - f64::from(y);
            max = max.max(d.abs());
            diff_sq += d * d;
            a_sq += f64::from(x) * f64::from(x);
        }
    }
    (max, (diff_sq / a_sq).sqrt())
}

/// Each producer's checkpoint against the source it quantized: every quantized weight is paired
/// by its name, and its error is the producer's own (the largest difference exactly, the
/// relative L2 to rounding of the sums).
#[test]
fn a_quantized_checkpoint_against_its_source_gives_the_producers_error() {
    let source = fixtures().join("source/model.safetensors");
    let source_values = support::float_tensors(&source);
    let folders = [
        "ct-w4a16",
        "ct-w4a16-asym",
        "ct-w8a16",
        "ct-w8a8",
        "ct-fp8-dynamic",
        "ct-fp8-block",
        "ct-nvfp4a16",
        "ct-mxfp4a16",
        "ct-mxfp8a16",
        "mlx-affine-4bit-g64",
        "mlx-affine-3bit-g128",
        "mlx-mxfp4",
        "bnb-int8",
        "bnb-nf4-nested",
        "bnb-fp4",
        "autoround-gptq-4bit",
        "autoround-gptq-3bit-asym",
        "autoround-awq-4bit",
        "fp8-block-transformers",
        "quanto-qint8",
        "quanto-qint4",
        "hqq-4bit-g64",
        "hqq-3bit-g64",
    ];
    for folder in folders {
        let quantized = fixtures().join(folder).join("model.safetensors");
        let (code, json) = diff_json(
            &fixtures(),
            &[source.to_str().unwrap(), quantized.to_str().unwrap()],
        );
        assert_eq!(code, 1, "{folder}");
        let references =
            support::float_tensors(&fixtures().join(folder).join("reference.safetensors"));
        assert!(!references.is_empty(), "{folder}");
        for (name, dequantized) in &references {
            let (_, original) = source_values.iter().find(|(n, _)| n == name).unwrap();
            let (max, relative) = error_of(original, dequantized);
            let found = entry(&json, name);
            assert_eq!(found["status"], "changed", "{folder} {name}: {found}");
            let change = &found["change"];
            // Equal but for the last digit the JSON writer prints.
            let largest = change["max_abs_diff"].as_f64().unwrap();
            assert!(
                (largest - max).abs() <= 1e-14 * max,
                "{folder} {name}: {largest} against {max}"
            );
            let measured = change["relative_l2"].as_f64().unwrap();
            assert!(
                (measured - relative).abs() <= 1e-9 * relative,
                "{folder} {name}: {measured} against {relative}"
            );
            assert!(change["snr_db"].as_f64().unwrap() > 10.0, "{folder} {name}");
        }
        // Members are not listed: they are compared through the weight they encode.
        for tensor in json["tensors"].as_array().unwrap() {
            assert!(
                matches!(tensor["status"].as_str(), Some("same" | "changed")),
                "{folder}: {tensor}"
            );
        }
    }
}

/// Two quantized versions of one model compared by what they compute with: the difference of
/// the two producers' dequantized weights.
#[test]
fn two_quantized_checkpoints_compare_their_dequantized_weights() {
    let (a, b) = ("ct-w4a16", "ct-fp8-block");
    let model = |folder: &str| fixtures().join(folder).join("model.safetensors");
    let (_, json) = diff_json(
        &fixtures(),
        &[model(a).to_str().unwrap(), model(b).to_str().unwrap()],
    );
    let reference = |folder: &str| {
        support::float_tensors(&fixtures().join(folder).join("reference.safetensors"))
    };
    let (ra, rb) = (reference(a), reference(b));
    let mut compared = 0;
    for (name, x) in &ra {
        let Some((_, y)) = rb.iter().find(|(n, _)| n == name) else {
            continue;
        };
        let found = entry(&json, name);
        assert_eq!(
            found["dtype"],
            serde_json::json!(["int4 (compressed-tensors)", "fp8 e4m3 (compressed-tensors)"]),
            "{name}"
        );
        let (largest, expected) = (
            found["change"]["max_abs_diff"].as_f64().unwrap(),
            error_of(x, y).0,
        );
        assert!((largest - expected).abs() <= 1e-14 * expected, "{name}");
        compared += 1;
    }
    assert!(compared >= 5, "{compared}");
}

/// `--raw` compares the stored tensors: members are tensors of their own again.
#[test]
fn raw_diff_compares_members_as_stored() {
    let source = fixtures().join("source/model.safetensors");
    let quantized = fixtures().join("ct-w4a16/model.safetensors");
    let (_, json) = diff_json(
        &fixtures(),
        &[
            "--raw",
            source.to_str().unwrap(),
            quantized.to_str().unwrap(),
        ],
    );
    let packed = entry(&json, "model.layers.0.self_attn.q_proj.weight_packed");
    assert_eq!(packed["status"], "added");
    let weight = entry(&json, "model.layers.0.self_attn.q_proj.weight");
    assert_eq!(weight["status"], "removed");
}

/// A checkpoint stored in a rotated basis is not compared element by element with an unrotated
/// one: the diff says so instead of printing numbers.
#[test]
fn a_rotated_checkpoint_is_not_compared_element_by_element() {
    let dir = tempfile::tempdir().unwrap();
    let from = fixtures().join("ct-w4a16");
    for file in ["model.safetensors", "model.safetensors.index.json"] {
        std::fs::copy(from.join(file), dir.path().join(file)).unwrap();
    }
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(from.join("config.json")).unwrap()).unwrap();
    config["quantization_config"]["transform_config"] = serde_json::json!({
        "config_groups": {"R1": {"type": "hadamard", "apply": [{"targets": ["Linear"], "location": "weight_input"}]}}
    });
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_vec(&config).unwrap(),
    )
    .unwrap();
    let source = fixtures().join("source/model.safetensors");
    let (code, json) = diff_json(dir.path(), &[source.to_str().unwrap(), "model.safetensors"]);
    assert_eq!(code, 1);
    let weight = entry(&json, "model.layers.0.self_attn.q_proj.weight");
    assert!(weight["change"].is_null(), "{weight}");
    assert!(
        weight["unaligned"]
            .as_str()
            .unwrap()
            .contains("rotated basis"),
        "{weight}"
    );
    let text = support::run_within(
        support::stui(
            dir.path(),
            [source.to_str().unwrap(), "--diff", "model.safetensors"],
        ),
        std::time::Duration::from_secs(60),
    );
    let text = String::from_utf8_lossy(&text.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("q_proj.weight"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("not element-aligned"), "{line}");
    assert!(!line.contains("max|a-b|"), "{line}");
}

/// stui's own quantized output read back. Its codes are within half a scale of the source
/// (`|x - q·s| ≤ s/2`, worked out here from the stored codes and scales); dequantized as its
/// loaders compute it, the product rounded to the scales' BF16, the diff's largest difference
/// is within half the weight's largest scale plus half a BF16 step at the weight's largest value.
#[test]
fn stuis_own_int8_output_is_within_half_a_scale_of_its_source() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(support::demo_path(), dir.path().join("demo.safetensors")).unwrap();
    for (output, extra) in [
        ("demo.int8.safetensors", None),
        ("demo.int8-tensor.safetensors", Some("--per-tensor")),
    ] {
        let mut args = vec![
            "quantize",
            "--skip-nonfinite",
            "demo.safetensors",
            "-o",
            output,
        ];
        args.extend(extra);
        let run = support::run_within(
            support::stui(dir.path(), args),
            std::time::Duration::from_secs(60),
        );
        assert_eq!(run.code, Some(0), "{}", run.stderr);
        let (code, json) = diff_json(dir.path(), &["demo.safetensors", output]);
        assert_eq!(code, 1);
        let stored = support::float_tensors(&dir.path().join(output));
        let bytes = std::fs::read(dir.path().join(output)).unwrap();
        let file = SafeTensors::deserialize(&bytes).unwrap();
        let source = support::float_tensors(&dir.path().join("demo.safetensors"));
        let mut weights = 0;
        for (name, scales) in stored.iter().filter(|(n, _)| n.ends_with(".weight_scale")) {
            let weight = name.strip_suffix("_scale").unwrap();
            let codes = file.tensor(weight).unwrap();
            assert_eq!(codes.dtype(), safetensors::Dtype::I8);
            let (_, original) = source.iter().find(|(n, _)| n == weight).unwrap();
            let cols = original.len() / codes.shape()[0];
            for (k, (&x, &q)) in original.iter().zip(codes.data()).enumerate() {
                let scale = f64::from(scales[if scales.len() == 1 { 0 } else { k / cols }]);
                let exact = f64::from(q.cast_signed()) * scale;
                assert!(
                    (f64::from(x) - exact).abs() <= scale / 2.0,
                    "{output} {weight} element {k}: {x} stored as {q} x {scale}"
                );
            }
            let largest = scales.iter().copied().fold(0f32, f32::max);
            let largest_scale = f64::from(largest);
            let max = entry(&json, weight)["change"]["max_abs_diff"]
                .as_f64()
                .unwrap();
            if largest_scale == 0.0 {
                assert_eq!(max, 0.0, "{output} {weight}: a weight of zeros");
                continue;
            }
            // Half a BF16 step at the largest value: its power of two over 2^8.
            let power_of_two = f32::from_bits((largest * 127.0).to_bits() & 0x7f80_0000);
            let half_step = f64::from(power_of_two) / 256.0;
            assert!(
                max <= largest_scale / 2.0 + half_step,
                "{output} {weight}: max |a-b| {max} against the scale {largest_scale}"
            );
            assert!(max > 0.0, "{output} {weight}");
            weights += 1;
        }
        assert!(weights >= 20, "{output}: {weights}");
    }
}
