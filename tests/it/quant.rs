//! Quantized checkpoints written by their real producers (llm-compressor, MLX, bitsandbytes,
//! optimum-quanto; `tests/fixtures/quant`, with each producer's own dequantized weights in
//! `reference.safetensors`): the scheme recognised, one logical weight per quantized Linear
//! with the shape of the weight it encodes, and no finding on a clean checkpoint.

use std::path::{Path, PathBuf};
use stui::arch::open_reviewed;
use stui::finding::{Code, Severity};
use stui::format::Model;
use stui::quant::{Layout, Quantization};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant")
}

fn open(name: &str) -> (Model, Quantization) {
    let folder = fixtures().join(name);
    let single = folder.join("model.safetensors");
    let index = folder.join("model.safetensors.index.json");
    let path = if single.exists() { single } else { index };
    let (model, quantization) = open_reviewed(&path, None).unwrap();
    (
        model,
        quantization.unwrap_or_else(|| panic!("{name}: not recognised")),
    )
}

/// Every fixture with its expected layout and scheme text (of its first weight).
const FIXTURES: &[(&str, Layout, &str)] = &[
    // A reward model's score head of one row beside an ordinary weight (`make_one_row.py`).
    (
        "ct-one-row-w4a16-asym",
        Layout::CompressedPacked,
        "int4 g128 asym, compressed-tensors",
    ),
    (
        "ct-one-row-int4-channel-asym",
        Layout::CompressedPacked,
        "int4 per channel asym, compressed-tensors",
    ),
    (
        "ct-w4a16",
        Layout::CompressedPacked,
        "int4 g128, compressed-tensors",
    ),
    (
        "ct-w4a16-sharded",
        Layout::CompressedPacked,
        "int4 g128, compressed-tensors",
    ),
    (
        "ct-w4a16-moe-sharded",
        Layout::CompressedPacked,
        "int4 g128, compressed-tensors",
    ),
    (
        "ct-w4a16-asym",
        Layout::CompressedPacked,
        "int4 g128 asym, compressed-tensors",
    ),
    (
        "ct-w8a16",
        Layout::CompressedPacked,
        "int8 g128, compressed-tensors",
    ),
    (
        "ct-w8a8",
        Layout::CompressedInt,
        "int8 per channel, compressed-tensors",
    ),
    (
        "ct-fp8-block",
        Layout::CompressedFloat,
        "fp8 e4m3 block 128x128, compressed-tensors",
    ),
    (
        "ct-fp8-dynamic",
        Layout::CompressedFloat,
        "fp8 e4m3 per channel, compressed-tensors",
    ),
    (
        "ct-nvfp4a16",
        Layout::CompressedNvfp4,
        "nvfp4 g16, compressed-tensors",
    ),
    (
        "ct-mxfp4a16",
        Layout::CompressedMxfp4,
        "mxfp4 g32, compressed-tensors",
    ),
    (
        "ct-mxfp8a16",
        Layout::CompressedMxfp8,
        "fp8 e4m3 g32, compressed-tensors",
    ),
    (
        "mlx-affine-4bit-g64",
        Layout::MlxAffine,
        "int4 g64 affine, MLX",
    ),
    (
        "mlx-affine-8bit-g32",
        Layout::MlxAffine,
        "int8 g32 affine, MLX",
    ),
    (
        "mlx-affine-3bit-g128",
        Layout::MlxAffine,
        "int3 g128 affine, MLX",
    ),
    ("mlx-mxfp4", Layout::MlxMxfp4, "mxfp4 g32, MLX"),
    ("mlx-nvfp4", Layout::MlxNvfp4, "nvfp4 g16, MLX"),
    ("mlx-mxfp8", Layout::MlxMxfp8, "fp8 e4m3 g32, MLX"),
    (
        "bnb-nf4-nested",
        Layout::BnbNf4,
        "nf4 g64 double-quant, bitsandbytes",
    ),
    ("bnb-fp4", Layout::BnbFp4, "fp4 g64, bitsandbytes"),
    (
        "bnb-int8",
        Layout::BnbInt8,
        "int8 per channel, bitsandbytes",
    ),
    ("quanto-qint8", Layout::Quanto, "int8 per channel, quanto"),
    ("quanto-qint4", Layout::Quanto, "int4 g96 affine, quanto"),
    ("comfy-mxfp8", Layout::ComfyMxfp8, "fp8 e4m3 g32, ComfyUI"),
    ("autoround-awq-4bit", Layout::Awq, "int4 g64 asym, AWQ"),
    (
        "autoround-gptq-3bit-asym",
        Layout::GptqV1,
        "int3 g32 asym, GPTQ v1",
    ),
    ("autoround-gptq-4bit", Layout::GptqV1, "int4 g64, GPTQ v1"),
    ("autoround-native-4bit", Layout::GptqV1, "int4 g64, GPTQ v1"),
    (
        "fp8-block-transformers",
        Layout::Fp8ScaleInv,
        "fp8 e4m3 block 128x128",
    ),
    ("hqq-4bit-g64", Layout::Hqq, "int4 g64 affine, HQQ"),
    ("hqq-3bit-g64", Layout::Hqq, "int3 g64 affine, HQQ"),
];

#[test]
fn every_real_producers_checkpoint_is_recognised_without_a_finding() {
    for &(name, layout, scheme) in FIXTURES {
        let (model, quantization) = open(name);
        let problems: Vec<String> = model
            .findings
            .iter()
            .filter(|f| f.severity != Severity::Info || f.code.as_str().starts_with("quant-"))
            .map(|f| format!("{} {}", f.code, f.message))
            .collect();
        assert!(problems.is_empty(), "{name}: {problems:?}");
        assert!(
            !model
                .findings
                .iter()
                .any(|f| f.code == Code::ConfigMismatch),
            "{name}"
        );
        assert!(
            quantization
                .weights
                .iter()
                .all(|w| w.scheme.layout == layout),
            "{name}: {:?}",
            quantization.schemes()
        );
        assert_eq!(quantization.weights[0].scheme.to_string(), scheme, "{name}");
        // ComfyUI marks each quantized layer with a `comfy_quant` tensor, and HQQ's own save
        // keeps each layer's settings in its tensors, neither with a config.
        assert_eq!(
            quantization.declared.is_some(),
            !layout.described_by_its_tensors(),
            "{name}"
        );
    }
}

#[test]
fn logical_weights_have_the_names_and_shapes_of_the_producers_dequantized_weights() {
    for &(name, ..) in FIXTURES {
        let (_, quantization) = open(name);
        let reference = Model::open(&fixtures().join(name).join("reference.safetensors")).unwrap();
        let mut expected: Vec<(String, Vec<u64>)> = reference
            .tensors
            .iter()
            .map(|t| (t.name().to_string(), t.info.shape.to_vec()))
            .collect();
        let mut found: Vec<(String, Vec<u64>)> = quantization
            .weights
            .iter()
            .map(|w| (w.info.name.to_string(), w.info.shape.to_vec()))
            .collect();
        expected.sort();
        found.sort();
        if name == "quanto-qint4" {
            // quanto's packed codes do not keep the weight's rows: only the element count.
            let count = |list: &[(String, Vec<u64>)]| -> Vec<(String, u64)> {
                list.iter()
                    .map(|(n, s)| (n.clone(), s.iter().product()))
                    .collect()
            };
            assert_eq!(count(&found), count(&expected), "{name}");
        } else {
            assert_eq!(found, expected, "{name}");
        }
    }
}

#[test]
fn bits_per_weight_count_every_member() {
    let (model, quantization) = open("ct-w4a16");
    for (index, weight) in quantization.weights.iter().enumerate() {
        let bytes: u64 = quantization
            .members(index)
            .iter()
            .map(|m| model.tensors[m.tensor as usize].info.byte_len())
            .sum();
        let elements: u64 = weight.info.shape.iter().product();
        assert_eq!(
            weight.bits_per_weight(),
            bytes as f64 * 8.0 / elements as f64
        );
        // int4 codes plus one BF16 scale per 128 columns, and the shape's 16 bytes.
        assert!(weight.bits_per_weight() > 4.125, "{}", weight.info.name);
        assert!(weight.bits_per_weight() < 4.2, "{}", weight.info.name);
    }
}

#[test]
fn the_source_model_is_not_quantized() {
    let (model, quantization) =
        open_reviewed(&fixtures().join("source/model.safetensors"), None).unwrap();
    assert!(quantization.is_none());
    assert!(model.findings.is_empty(), "{:?}", &model.findings[..]);
}

#[test]
fn members_missing_or_misshapen_are_findings_on_the_weight() {
    use stui::demo::{Fill, SyntheticModel};
    use stui::format::Dtype;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.safetensors");
    let scale = Fill::Normal {
        mean: 0.01,
        std: 0.0,
    };
    SyntheticModel::new(7)
        // A per-row scale with one row too few.
        .tensor("m.layers.0.q_proj.weight", Dtype::I8, &[4, 8], Fill::Zeros)
        .tensor(
            "m.layers.0.q_proj.weight_scale",
            Dtype::F32,
            &[3, 1],
            scale.clone(),
        )
        // A scale whose weight is not stored.
        .tensor("m.layers.0.k_proj.weight_scale", Dtype::F32, &[4, 1], scale)
        .write(&path)
        .unwrap();
    let (model, quantization) = open_reviewed(&path, None).unwrap();
    let quantization = quantization.unwrap();
    assert_eq!(quantization.weights.len(), 1);
    let about = |code: Code| -> Vec<Option<String>> {
        model
            .findings
            .iter()
            .filter(|f| f.code == code)
            .map(|f| f.tensor.clone())
            .collect()
    };
    assert_eq!(
        about(Code::QuantMemberShape),
        [Some("m.layers.0.q_proj.weight".to_string())]
    );
    assert_eq!(
        about(Code::QuantMemberMissing),
        [Some("m.layers.0.k_proj.weight".to_string())]
    );
}

/// A logical shape read from a member's values (HQQ's `.shape`, compressed-tensors'
/// `.weight_shape`, the JSON of bitsandbytes' quant state) that counts more values than the codes hold, up to more than `u64` counts,
/// is an error finding on the weight, not an overflow.
#[test]
fn shapes_read_from_members_beyond_their_codes_are_findings() {
    use stui::demo::{Fill, SyntheticModel};
    use stui::format::Dtype;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hostile.safetensors");
    let huge = 2f64.powi(40);
    let state =
        r#"{"quant_type": "nf4", "blocksize": 64, "shape": [1099511627776, 1099511627776]}"#;
    let scale = || Fill::Normal {
        mean: 0.01,
        std: 0.0,
    };
    let shape = |values: Vec<f64>| (Dtype::I64, vec![2], Fill::Values(values));
    let members = [
        ("q_proj.W_q", (Dtype::U8, vec![4, 8], Fill::Zeros)),
        ("q_proj.scale", (Dtype::Bf16, vec![8, 1], scale())),
        ("q_proj.zero", (Dtype::Bf16, vec![8, 1], Fill::Zeros)),
        ("q_proj.shape", shape(vec![huge, huge])),
        (
            "k_proj.weight_packed",
            (Dtype::I32, vec![4, 2], Fill::Zeros),
        ),
        ("k_proj.weight_scale", (Dtype::Bf16, vec![4, 1], scale())),
        ("k_proj.weight_shape", shape(vec![4.0, 2f64.powi(62)])),
        // No values at all, but a width whose products overflow.
        (
            "o_proj.weight_packed",
            (Dtype::I32, vec![4, 2], Fill::Zeros),
        ),
        ("o_proj.weight_scale", (Dtype::Bf16, vec![4, 1], scale())),
        ("o_proj.weight_shape", shape(vec![0.0, 2f64.powi(62)])),
        ("v_proj.weight", (Dtype::U8, vec![32, 1], Fill::Zeros)),
        ("v_proj.weight.absmax", (Dtype::F32, vec![1], Fill::Zeros)),
        (
            "v_proj.weight.quant_map",
            (Dtype::F32, vec![16], Fill::Zeros),
        ),
        (
            "v_proj.weight.quant_state.bitsandbytes__nf4",
            (
                Dtype::U8,
                vec![state.len() as u64],
                Fill::Values(state.bytes().map(f64::from).collect()),
            ),
        ),
    ];
    let mut model = SyntheticModel::new(7);
    for (name, (dtype, dims, fill)) in members {
        model = model.tensor(&format!("m.layers.0.{name}"), dtype, &dims, fill);
    }
    model.write(&path).unwrap();
    let (model, _) = open_reviewed(&path, None).unwrap();
    let shapes: Vec<(Option<String>, String)> = model
        .findings
        .iter()
        .filter(|f| f.code == Code::QuantMemberShape)
        .map(|f| (f.tensor.clone(), f.message.clone()))
        .collect();
    for (weight, member) in [
        ("q_proj", "q_proj.shape"),
        ("k_proj", "k_proj.weight_shape"),
        ("o_proj", "o_proj.weight_shape"),
        ("v_proj", "v_proj.weight.quant_state.*"),
    ] {
        let weight = format!("m.layers.0.{weight}.weight");
        let member = format!("`m.layers.0.{member}` gives");
        assert!(
            shapes
                .iter()
                .any(|(tensor, message)| tensor.as_deref() == Some(&weight)
                    && message.starts_with(&member)
                    && message.ends_with("which its 32 bytes of codes cannot hold")),
            "{shapes:?}"
        );
    }
}

/// Runs `stui` with `args` and gives its standard output.
fn stui(args: &[&str]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_stui"))
        .args(args)
        .output()
        .unwrap();
    String::from_utf8(output.stdout).unwrap()
}

/// Their codes would be taken for plain values (FP8 codes without their scales) and the new
/// config would misdescribe the weights copied as they are: every real producer's checkpoint is
/// refused, by `quantize` and `--compare`, with what to do, and nothing is written.
#[test]
fn a_quantized_checkpoint_is_not_quantized_again() {
    let out = tempfile::tempdir().unwrap();
    for &(name, ..) in FIXTURES {
        let path = fixtures().join(name);
        let summary = open(name).1.summary();
        let target = out.path().join(format!("{name}.safetensors"));
        for args in [
            vec!["-o", target.to_str().unwrap(), "--scheme", "W4A16", "--yes"],
            vec!["--compare"],
        ] {
            let run = std::process::Command::new(env!("CARGO_BIN_EXE_stui"))
                .arg("quantize")
                .arg(&path)
                .args(&args)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&run.stderr);
            assert_eq!(run.status.code(), Some(2), "{name} {args:?}: {stderr}");
            assert!(
                stderr.contains(&format!("is already quantized ({summary}):"))
                    && stderr.contains("quantize the model it was made from"),
                "{name} {args:?}: {stderr}"
            );
            assert!(run.stdout.is_empty(), "{name} {args:?}");
        }
    }
    let written: Vec<_> = std::fs::read_dir(out.path()).unwrap().collect();
    assert!(written.is_empty(), "{written:?}");
}

#[test]
fn inspect_lists_logical_weights_and_raw_lists_what_is_stored() {
    let path = fixtures().join("ct-w4a16");
    let path = path.to_str().unwrap();
    let (model, quantization) = open("ct-w4a16");
    let logical_parameters: u64 = model
        .tensors
        .iter()
        .enumerate()
        .filter(|(i, _)| quantization.weight_of(*i).is_none())
        .map(|(_, t)| t.info.element_count().unwrap())
        .chain(
            quantization
                .weights
                .iter()
                .map(|w| w.info.shape.iter().product()),
        )
        .sum();
    let json: serde_json::Value =
        serde_json::from_str(&stui(&["inspect", "--json", path])).unwrap();
    assert_eq!(json["parameters"], logical_parameters);
    let tensors = json["tensors"].as_array().unwrap();
    assert_eq!(
        tensors.len(),
        model.tensors.len() - quantization_member_count(&quantization) + quantization.weights.len()
    );
    let q_proj = tensors
        .iter()
        .find(|t| t["name"] == "model.layers.0.self_attn.q_proj.weight")
        .unwrap();
    assert_eq!(q_proj["dtype"], "int4 (compressed-tensors)");
    assert_eq!(q_proj["shape"], serde_json::json!([128, 128]));
    assert_eq!(
        q_proj["members"],
        serde_json::json!([
            "model.layers.0.self_attn.q_proj.weight_packed",
            "model.layers.0.self_attn.q_proj.weight_shape",
            "model.layers.0.self_attn.q_proj.weight_scale"
        ])
    );
    let mix: Vec<&str> = json["dtypes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["dtype"].as_str().unwrap())
        .collect();
    assert_eq!(mix, ["BF16", "int4 (compressed-tensors)"]);

    let expanded = stui(&["inspect", "--expand", path]);
    // The columns after the name.
    let row = |text: &str, name: &str| {
        text.lines()
            .find_map(|l| l.split_once(name))
            .unwrap_or_else(|| panic!("no row {name} in\n{text}"))
            .1
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        row(&expanded, "q_proj.weight ")[..3],
        ["int4", "(compressed-tensors)", "[128,"]
    );
    assert_eq!(
        row(&expanded, "weight_packed")[..3],
        ["I32", "[128,", "16]"]
    );
    assert!(!stui(&["inspect", path]).contains("weight_packed"));

    let raw: serde_json::Value =
        serde_json::from_str(&stui(&["inspect", "--json", "--raw", path])).unwrap();
    assert_eq!(
        raw["tensors"].as_array().unwrap().len(),
        model.tensors.len()
    );
    assert!(
        raw["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t.get("members").is_none())
    );
    assert!(stui(&["inspect", "--flat", "--raw", path]).contains("q_proj.weight_packed"));
}

fn quantization_member_count(quantization: &Quantization) -> usize {
    (0..quantization.weights.len())
        .map(|w| quantization.members(w).len())
        .sum()
}

#[test]
fn stats_are_of_the_dequantized_weights_as_their_producers_compute_them() {
    for (name, ..) in FIXTURES {
        let folder = fixtures().join(name);
        let producer: serde_json::Value =
            serde_json::from_slice(&std::fs::read(folder.join("producer.json")).unwrap()).unwrap();
        let stats: serde_json::Value =
            serde_json::from_str(&stui(&["stats", "--json", folder.to_str().unwrap()])).unwrap();
        let rows = stats["tensors"].as_array().unwrap();
        let weights = producer["weights"].as_object().unwrap();
        assert!(!weights.is_empty(), "{name}");
        for (weight, expected) in weights {
            let row = rows
                .iter()
                .find(|r| r["name"] == weight.as_str())
                .unwrap_or_else(|| panic!("{name}: no row for {weight}"));
            for key in ["min", "max", "absmax", "zeros"] {
                assert_eq!(row[key], expected[key], "{name} {weight} {key}");
            }
            for key in ["mean", "std"] {
                let (a, e) = (row[key].as_f64().unwrap(), expected[key].as_f64().unwrap());
                assert!(
                    (a - e).abs() <= 1e-6 * e.abs().max(1e-3),
                    "{name} {weight} {key}: {a} against the producer's {e}"
                );
            }
            assert!(
                row["histogram"].is_object(),
                "{name} {weight}: no histogram"
            );
        }
    }
}

/// `ComfyUI`'s `int8_tensorwise`: `W = q · s` with a scale per row or one for the tensor, each
/// weight marked by its `comfy_quant` JSON. The values expected are worked out here from the
/// codes and scales written.
#[test]
fn comfyui_int8_weights_are_dequantized_per_row_and_per_tensor() {
    use stui::demo::{Fill, SyntheticModel};
    use stui::format::Dtype;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("comfy.safetensors");
    let marker: Vec<f64> =
        br#"{"format": "int8_tensorwise"}"#.iter().map(|&b| f64::from(b)).collect();
    let codes: Vec<f64> = (0..32).map(|k| f64::from(k * 8 - 127)).collect();
    let row_scales = [0.5, 0.25, 0.125, 1.0];
    SyntheticModel::new(3)
        .tensor(
            "m.layers.0.q.weight",
            Dtype::I8,
            &[4, 8],
            Fill::Values(codes.clone()),
        )
        .tensor(
            "m.layers.0.q.weight_scale",
            Dtype::F32,
            &[4, 1],
            Fill::Values(row_scales.to_vec()),
        )
        .tensor(
            "m.layers.0.q.comfy_quant",
            Dtype::U8,
            &[marker.len() as u64],
            Fill::Values(marker.clone()),
        )
        .tensor(
            "m.layers.0.k.weight",
            Dtype::I8,
            &[4, 8],
            Fill::Values(codes.clone()),
        )
        .tensor(
            "m.layers.0.k.weight_scale",
            Dtype::F32,
            &[1],
            Fill::Values(vec![0.01]),
        )
        .tensor(
            "m.layers.0.k.comfy_quant",
            Dtype::U8,
            &[marker.len() as u64],
            Fill::Values(marker),
        )
        .write(&path)
        .unwrap();
    let stats: serde_json::Value =
        serde_json::from_str(&stui(&["stats", "--json", path.to_str().unwrap()])).unwrap();
    let row = |name: &str| {
        stats["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no row for {name}: {stats}"))
    };
    #[expect(
        clippy::cast_possible_truncation,
        reason = "codes and scales held in f32"
    )]
    let expected = |scale: &dyn Fn(usize) -> f64| -> Vec<f64> {
        (0..32)
            .map(|k| f64::from(codes[k] as f32 * scale(k / 8) as f32))
            .collect()
    };
    for (name, values) in [
        ("m.layers.0.q.weight", expected(&|r| row_scales[r])),
        ("m.layers.0.k.weight", expected(&|_| 0.01)),
    ] {
        let found = row(name);
        assert!(
            found["dtype"].as_str().unwrap().contains("ComfyUI"),
            "{found}"
        );
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mean = values.iter().sum::<f64>() / 32.0;
        assert_eq!(found["min"].as_f64().unwrap(), min, "{name}");
        assert_eq!(found["max"].as_f64().unwrap(), max, "{name}");
        assert!(
            (found["mean"].as_f64().unwrap() - mean).abs() < 1e-9,
            "{name}"
        );
    }
}

/// comfy-kitchen writes E8M0 code 0, which it reads as a zero scale, for every all-zero block
/// (the padding to multiples of 32 among them) and for a block too small for 2^−127: only the
/// latter, whose nonzero codes the zero scale wipes out, is a finding.
#[test]
fn comfyui_mxfp8_zero_scales_are_findings_only_where_they_zero_codes() {
    let path = fixtures().join("comfy-mxfp8/model.safetensors");
    let stats: serde_json::Value =
        serde_json::from_str(&stui(&["stats", "--json", path.to_str().unwrap()])).unwrap();
    let scale_findings: Vec<(&str, &str)> = stats["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["code"] == "quant-scale")
        .map(|f| {
            (
                f["tensor"].as_str().unwrap(),
                f["message"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        scale_findings,
        [(
            "blocks.0.attn.proj.weight",
            "weight_scale of group 1 (rows 5..6) is zero (zeroes the group): 0"
        )]
    );
}

/// `stats --json` counts each logical weight's codes with its histogram: every element once,
/// and for compressed-tensors' symmetric ints the middle level (code 0) as often as the
/// producer's dequantized weight holds zeros.
#[test]
fn code_counts_cover_every_element_and_zero_is_the_middle_level() {
    for name in ["ct-w4a16", "ct-w8a16"] {
        let folder = fixtures().join(name);
        let producer: serde_json::Value =
            serde_json::from_slice(&std::fs::read(folder.join("producer.json")).unwrap()).unwrap();
        let stats: serde_json::Value =
            serde_json::from_str(&stui(&["stats", "--json", folder.to_str().unwrap()])).unwrap();
        let mut checked = 0;
        for (weight, expected) in producer["weights"].as_object().unwrap() {
            let row = stats["tensors"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["name"] == weight.as_str())
                .unwrap();
            let codes = &row["codes"];
            let counts: Vec<u64> = codes["counts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_u64().unwrap())
                .collect();
            let levels = usize::try_from(codes["levels"].as_u64().unwrap()).unwrap();
            assert_eq!(counts.len(), levels, "{name} {weight}");
            assert_eq!(levels, if name == "ct-w4a16" { 16 } else { 256 });
            assert_eq!(counts.iter().sum::<u64>(), row["count"].as_u64().unwrap());
            assert_eq!(
                counts[levels / 2],
                expected["zeros"].as_u64().unwrap(),
                "{name} {weight}"
            );
            assert_eq!(codes["clipped_low"].as_u64(), Some(counts[0]));
            assert_eq!(codes["clipped_high"].as_u64(), Some(counts[levels - 1]));
            checked += 1;
        }
        assert!(checked >= 6, "{name}: {checked}");
    }
}

/// Listed as stored (`--raw`), a quantized checkpoint's settings members (compressed-tensors'
/// `weight_shape`, GPTQ's packed zero points of a symmetric grid, HQQ's flags, bitsandbytes'
/// lookup tables) are constant or zero by design: no real producer's checkpoint has a finding
/// on one. The untrained source's norms (all 1) still have theirs.
#[test]
fn settings_members_listed_as_stored_are_not_reported_as_constant() {
    for &(name, ..) in FIXTURES {
        let folder = fixtures().join(name);
        let stats: serde_json::Value = serde_json::from_str(&stui(&[
            "stats",
            "--raw",
            "--json",
            folder.to_str().unwrap(),
        ]))
        .unwrap();
        let findings = stats["findings"].as_array().unwrap();
        let on_values: Vec<&serde_json::Value> = findings
            .iter()
            .filter(|f| f["code"].as_str().unwrap().starts_with("values-"))
            .collect();
        assert!(
            on_values
                .iter()
                .all(|f| f["tensor"].as_str().unwrap().contains("norm")),
            "{name}: {on_values:#?}"
        );
        assert!(
            !on_values.is_empty(),
            "{name}: the norms' findings are kept"
        );
    }
}
