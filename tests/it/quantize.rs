//! Quantize-and-save: the output is what loaders expect, read by the reference crate and the
//! Python package, within half a scale of the source everywhere, and no fault leaves a partial file.

use crate::support;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use stui::demo::{Fill, SyntheticModel};
use stui::finding::Severity;
use stui::format::{Dtype, Model};
use stui::quantize::scheme::Scheme;
use stui::quantize::{self, Control, Granularity, NonFinite, Options};

fn model(dtype: Dtype) -> SyntheticModel {
    SyntheticModel::new(11)
        .tensor(
            "model.layers.0.mlp.down_proj.weight",
            dtype,
            &[8, 16],
            Fill::Normal {
                mean: 0.0,
                std: 0.5,
            },
        )
        .tensor(
            "model.layers.0.mlp.up_proj.weight",
            dtype,
            &[16, 8],
            Fill::Normal {
                mean: 0.1,
                std: 2.0,
            },
        )
        .tensor(
            "model.layers.0.mlp.up_proj.bias",
            dtype,
            &[16],
            Fill::Normal {
                mean: 0.0,
                std: 0.1,
            },
        )
        .tensor(
            "model.layers.0.input_layernorm.weight",
            dtype,
            &[8],
            Fill::Normal {
                mean: 1.0,
                std: 0.02,
            },
        )
        .tensor(
            "model.embed_tokens.weight",
            dtype,
            &[32, 8],
            Fill::Normal {
                mean: 0.0,
                std: 1.0,
            },
        )
        .tensor(
            "model.layers.0.self_attn.o_proj.weight",
            dtype,
            &[4, 4],
            Fill::Zeros,
        )
        .metadata("format", "pt")
        .metadata("note", "kept")
}

/// The value of every element of a tensor in a file read by the reference crate.
fn reference_values(bytes: &[u8], name: &str) -> (safetensors::Dtype, Vec<usize>, Vec<f64>) {
    let file = safetensors::SafeTensors::deserialize(bytes).unwrap();
    let view = file.tensor(name).unwrap();
    let dtype = match view.dtype() {
        safetensors::Dtype::F32 => Dtype::F32,
        safetensors::Dtype::BF16 => Dtype::Bf16,
        safetensors::Dtype::F16 => Dtype::F16,
        safetensors::Dtype::F64 => Dtype::F64,
        safetensors::Dtype::I8 => Dtype::I8,
        other => panic!("unexpected {other:?}"),
    };
    let size = (dtype.bits() / 8) as usize;
    let values = view
        .data()
        .chunks(size)
        .map(|bytes| stui::analysis::values::element(dtype, bytes, 0).unwrap())
        .collect();
    (view.dtype(), view.shape().to_vec(), values)
}

fn run(source: &Path, output: &Path, granularity: Granularity) -> quantize::Summary {
    let model = Model::open(source).unwrap();
    let options = Options {
        granularity,
        ..Options::default()
    };
    quantize::quantize(&model, output, &options, &Control::default()).unwrap()
}

#[test]
fn the_reference_crate_reads_the_output_and_values_round_trip() {
    for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16, Dtype::F64] {
        for granularity in [Granularity::PerChannel, Granularity::PerTensor] {
            let dir = tempfile::tempdir().unwrap();
            let source = dir.path().join("model.safetensors");
            model(dtype).write(&source).unwrap();
            let output = dir.path().join("model.int8.safetensors");
            let summary = run(&source, &output, granularity);
            assert!(summary.verified, "{dtype} {granularity:?}");
            assert_eq!(
                summary.quantized.len(),
                3,
                "down_proj, up_proj and the zero o_proj"
            );
            let (source_bytes, output_bytes) = (
                std::fs::read(&source).unwrap(),
                std::fs::read(&output).unwrap(),
            );
            let reference = safetensors::SafeTensors::deserialize(&output_bytes).unwrap();
            assert_eq!(reference.len(), 9);
            // Kept tensors are copied byte for byte.
            let original = safetensors::SafeTensors::deserialize(&source_bytes).unwrap();
            for name in [
                "model.layers.0.mlp.up_proj.bias",
                "model.layers.0.input_layernorm.weight",
                "model.embed_tokens.weight",
            ] {
                assert_eq!(
                    reference.tensor(name).unwrap().data(),
                    original.tensor(name).unwrap().data(),
                    "{name}"
                );
            }
            for name in [
                "model.layers.0.mlp.down_proj.weight",
                "model.layers.0.mlp.up_proj.weight",
            ] {
                let (q_dtype, shape, q) = reference_values(&output_bytes, name);
                let (s_dtype, scale_shape, scales) =
                    reference_values(&output_bytes, &format!("{name}_scale"));
                let (_, _, x) = reference_values(&source_bytes, name);
                assert_eq!(q_dtype, safetensors::Dtype::I8);
                assert_eq!(s_dtype.to_string(), dtype.name());
                let expected_scale_shape = if granularity == Granularity::PerChannel {
                    vec![shape[0], 1]
                } else {
                    vec![1]
                };
                assert_eq!(scale_shape, expected_scale_shape);
                for (i, (&x, &q)) in x.iter().zip(&q).enumerate() {
                    let scale = if scales.len() == 1 {
                        scales[0]
                    } else {
                        scales[i / shape[1]]
                    };
                    assert!(
                        (x - q * scale).abs() <= scale * 0.5 * (1.0 + 1e-9),
                        "{name}[{i}]: {x} vs {q} * {scale}"
                    );
                    assert!((-127.0..=127.0).contains(&q));
                }
            }
            let file = safetensors::SafeTensors::read_metadata(&output_bytes)
                .unwrap()
                .1;
            let metadata: BTreeMap<_, _> = file.metadata().clone().unwrap().into_iter().collect();
            assert_eq!(metadata["format"], "pt");
            assert_eq!(metadata["note"], "kept");
            let config: serde_json::Value =
                serde_json::from_str(&metadata["quantization_config"]).unwrap();
            assert_eq!(config["quant_method"], "compressed-tensors");
        }
    }
}

#[test]
fn the_file_is_laid_out_as_the_reference_writer_lays_it_out() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("model.safetensors");
    model(Dtype::Bf16).write(&source).unwrap();
    let output = dir.path().join("out.safetensors");
    run(&source, &output, Granularity::PerChannel);
    let bytes = std::fs::read(&output).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    assert_eq!(header_len % 8, 0, "header padded to 8 bytes");
    let file = Model::open(&output).unwrap();
    let mut order: Vec<_> = file
        .tensors
        .iter()
        .map(|t| {
            (
                t.info.data_offsets[0],
                t.info.dtype.known().unwrap(),
                t.name().to_owned(),
            )
        })
        .collect();
    order.sort();
    let ranks: Vec<usize> = order.iter().map(|(_, d, _)| d.rank()).collect();
    assert!(
        ranks.windows(2).all(|w| w[0] >= w[1]),
        "larger dtypes first: {order:?}"
    );
}

#[test]
fn nan_stops_or_is_skipped_and_the_source_is_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("model.safetensors");
    model(Dtype::F32)
        .plant("model.layers.0.mlp.down_proj.weight", 3, f64::NAN)
        .write(&source)
        .unwrap();
    let loaded = Model::open(&source).unwrap();
    let output = dir.path().join("out.safetensors");
    assert!(
        quantize::quantize(&loaded, &output, &Options::default(), &Control::default()).is_err()
    );
    assert!(!output.exists(), "nothing written when it stops");
    let options = Options {
        non_finite: NonFinite::Skip,
        ..Options::default()
    };
    let summary = quantize::quantize(&loaded, &output, &options, &Control::default()).unwrap();
    assert!(summary.kept().any(|(tensor, why)| {
        loaded.tensors[tensor].name() == "model.layers.0.mlp.down_proj.weight"
            && why == quantize::Kept::NonFinite
    }));
    let before = std::fs::read(&source).unwrap();
    assert!(quantize::quantize(&loaded, &source, &options, &Control::default()).is_err());
    assert_eq!(std::fs::read(&source).unwrap(), before);
}

/// Every scheme refuses a weight holding Inf late in it (past its first block of rows), leaving
/// nothing, or keeps it as it is when told to skip such weights.
#[test]
fn every_scheme_stops_at_a_late_nan_or_leaves_its_weight_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("model.safetensors");
    let mut model = SyntheticModel::new(5);
    for layer in 0..3 {
        model = model.tensor(
            &format!("model.layers.{layer}.mlp.down_proj.weight"),
            Dtype::Bf16,
            &[256, 256],
            Fill::Normal {
                mean: 0.0,
                std: 0.02,
            },
        );
    }
    let poisoned = "model.layers.1.mlp.down_proj.weight";
    model
        .plant(poisoned, 250 * 256 + 7, f64::INFINITY)
        .write(&source)
        .unwrap();
    let loaded = Model::open(&source).unwrap();
    for scheme in Scheme::ALL {
        let output = dir.path().join(format!("{scheme}.safetensors"));
        let stop = Options {
            scheme,
            ..Options::default()
        };
        let refused = quantize::quantize(&loaded, &output, &stop, &Control::default());
        let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains(poisoned), "{scheme}: {message}");
        assert!(!output.exists(), "{scheme}: nothing written when it stops");
        let skip = Options {
            non_finite: NonFinite::Skip,
            ..stop
        };
        let summary = quantize::quantize(&loaded, &output, &skip, &Control::default()).unwrap();
        let kept: Vec<_> = summary
            .kept()
            .map(|(t, why)| (loaded.tensors[t].name(), why))
            .collect();
        assert_eq!(kept, [(poisoned, quantize::Kept::NonFinite)], "{scheme}");
        assert_eq!(summary.quantized.len(), 2, "{scheme}");
        let written = Model::open(&output).unwrap();
        let as_it_was = written
            .tensors
            .iter()
            .find(|t| t.name() == poisoned)
            .unwrap();
        assert_eq!(as_it_was.info.dtype.known(), Some(Dtype::Bf16), "{scheme}");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with(".stui-tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{scheme}: no temporary file left");
    }
}

/// When every weight chosen holds NaN or Inf and is kept as it is, nothing is left to quantize:
/// every scheme says so and writes nothing (the copy would declare a quantization it does not
/// hold), into a folder of its own or beside the source.
#[test]
fn every_scheme_refuses_when_skipping_nan_leaves_nothing_to_quantize() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("model.safetensors");
    let mut model = SyntheticModel::new(6);
    for layer in 0..2 {
        let name = format!("model.layers.{layer}.mlp.down_proj.weight");
        model = model
            .tensor(
                &name,
                Dtype::Bf16,
                &[256, 256],
                Fill::Normal {
                    mean: 0.0,
                    std: 0.02,
                },
            )
            .plant(&name, 200 * 256 + layer, f64::NAN);
    }
    model.write(&source).unwrap();
    let loaded = Model::open(&source).unwrap();
    for scheme in Scheme::ALL {
        for output in [
            dir.path().join(format!("{scheme}.safetensors")),
            dir.path().join(format!("{scheme}/model.safetensors")),
        ] {
            let skip = Options {
                scheme,
                non_finite: NonFinite::Skip,
                ..Options::default()
            };
            let refused = quantize::quantize(&loaded, &output, &skip, &Control::default());
            let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(
                message.contains("every weight left to quantize holds NaN or Inf"),
                "{scheme}: {message}"
            );
            let left: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| name != "model.safetensors")
                .collect();
            assert!(left.is_empty(), "{scheme}: nothing written, {left:?}");
        }
    }
}

#[test]
fn a_sharded_model_gives_sharded_output_with_its_index_and_config() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("model");
    std::fs::create_dir(&folder).unwrap();
    model(Dtype::Bf16)
        .write(&folder.join("model-00001-of-00002.safetensors"))
        .unwrap();
    SyntheticModel::new(2)
        .tensor(
            "lm_head.weight",
            Dtype::Bf16,
            &[32, 8],
            Fill::Normal {
                mean: 0.0,
                std: 1.0,
            },
        )
        .tensor(
            "model.layers.1.mlp.down_proj.weight",
            Dtype::Bf16,
            &[8, 16],
            Fill::Normal {
                mean: 0.0,
                std: 1.0,
            },
        )
        .write(&folder.join("model-00002-of-00002.safetensors"))
        .unwrap();
    std::fs::write(
        folder.join("config.json"),
        r#"{"model_type": "llama", "hidden_size": 8}"#,
    )
    .unwrap();
    std::fs::write(folder.join("tokenizer.json"), "{}").unwrap();
    // A variant's index names shards the output does not hold.
    std::fs::write(folder.join("model.safetensors.index.fp16.json"), "{}").unwrap();
    let output = dir.path().join("model-int8");
    let summary = run(&folder, &output, Granularity::PerChannel);
    assert!(summary.verified);
    let written = Model::open(&output).unwrap();
    let unwanted: Vec<_> = written
        .findings
        .iter()
        .filter(|f| f.severity != Severity::Info)
        .collect();
    assert!(unwanted.is_empty(), "{unwanted:?}");
    assert_eq!(written.shards.len(), 2);
    assert!(output.join("tokenizer.json").is_file());
    assert!(!output.join("model.safetensors.index.fp16.json").exists());
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(output.join("config.json")).unwrap())
            .unwrap();
    let quantization = &config["quantization_config"];
    assert_eq!(quantization["format"], "int-quantized");
    assert_eq!(
        quantization["config_groups"]["group_0"]["weights"]["strategy"],
        "channel"
    );
    let ignore: Vec<&str> = quantization["ignore"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    for module in [
        "lm_head",
        "model.embed_tokens",
        "model.layers.0.input_layernorm",
    ] {
        assert!(ignore.contains(&module), "{module} in {ignore:?}");
    }
    assert_eq!(config["hidden_size"], 8);
}

/// A model whose int8 copy takes about 256 KiB.
/// A single file's companions are copied only from a model's own folder (its `config.json`
/// beside it): the small files of a folder shared with other things are not the model's.
#[test]
fn a_file_in_a_shared_folder_takes_no_other_files_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("downloads");
    std::fs::create_dir(&shared).unwrap();
    model(Dtype::Bf16)
        .write(&shared.join("model.safetensors"))
        .unwrap();
    std::fs::write(shared.join("notes.txt"), "private").unwrap();
    std::fs::write(shared.join("tokenizer.json"), "{}").unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let summary = run(
        &shared.join("model.safetensors"),
        &out.join("model.int8.safetensors"),
        Granularity::PerChannel,
    );
    assert!(summary.verified);
    let written: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(written, ["model.int8.safetensors"]);

    std::fs::write(shared.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
    let summary = run(
        &shared.join("model.safetensors"),
        &out.join("model.int8.safetensors"),
        Granularity::PerChannel,
    );
    assert!(summary.verified);
    for name in ["config.json", "tokenizer.json", "notes.txt"] {
        assert!(out.join(name).is_file(), "{name}");
    }
}

fn model_of_a_quarter_mebibyte(path: &Path) {
    let mut model = SyntheticModel::new(5);
    for layer in 0..4 {
        model = model.tensor(
            &format!("model.layers.{layer}.mlp.down_proj.weight"),
            Dtype::F32,
            &[256, 256],
            Fill::Normal {
                mean: 0.0,
                std: 0.02,
            },
        );
    }
    model.write(path).unwrap();
}

/// What a `stui quantize` into `folder` gave, run by `unshare` with `unshare_args` after the
/// shell command `setup` (which may mount something on the folder, `$2`).
struct Refused {
    code: Option<i32>,
    stderr: String,
    left_in_folder: String,
}

impl Refused {
    /// Exit code 2, a message holding each of `words`, and no partial output.
    fn assert_clear_and_clean(&self, words: &[&str]) {
        assert_eq!(self.code, Some(2), "{}", self.stderr);
        for word in words {
            assert!(self.stderr.contains(word), "`{word}` in: {}", self.stderr);
        }
        assert_eq!(self.left_in_folder, "", "nothing is left in the folder");
    }
}

fn quantize_in_namespace(unshare_args: &[&str], setup: &str) -> Refused {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("model.safetensors");
    model_of_a_quarter_mebibyte(&source);
    let folder = dir.path().join("out");
    std::fs::create_dir(&folder).unwrap();
    let script = format!(
        r#"{setup} || exit 99
"$0" quantize "$1" -o "$2/out.safetensors"
code=$?
echo "$(ls -A "$2")"
exit $code"#
    );
    let output = Command::new("unshare")
        .args(unshare_args)
        .args(["sh", "-c", &script, env!("CARGO_BIN_EXE_stui")])
        .arg(&source)
        .arg(&folder)
        .output()
        .unwrap();
    assert_ne!(output.status.code(), Some(99), "the setup `{setup}` failed");
    Refused {
        code: output.status.code(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        left_in_folder: String::from_utf8_lossy(&output.stdout).trim().to_owned(),
    }
}

#[test]
fn a_full_disk_is_a_clear_error_and_leaves_nothing() {
    let refused = quantize_in_namespace(
        &["--map-root-user", "--mount"],
        r#"mount -t tmpfs -o size=64k tmpfs "$2""#,
    );
    refused.assert_clear_and_clean(&["out.safetensors", "No space left"]);
}

#[test]
fn a_read_only_folder_is_a_clear_error_and_leaves_nothing() {
    let refused = quantize_in_namespace(
        &["--map-root-user", "--mount"],
        r#"mount -t tmpfs -o ro,size=1m tmpfs "$2""#,
    );
    refused.assert_clear_and_clean(&["out: read-only filesystem"]);
}

#[test]
fn a_folder_without_write_permission_is_a_clear_error_and_leaves_nothing() {
    // An unprivileged user in its own namespace: permissions bind even when the tests run as root.
    let refused = quantize_in_namespace(
        &["--map-user=65534", "--map-group=65534"],
        r#"chmod 0555 "$2""#,
    );
    refused.assert_clear_and_clean(&["out: permission denied"]);
}

#[test]
fn the_cli_refuses_to_replace_without_yes_and_reports_json() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("model.safetensors");
    model(Dtype::F32).write(&source).unwrap();
    let out = dir.path().join("out.safetensors");
    std::fs::write(&out, b"existing").unwrap();
    let stui = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_stui"))
            .args([
                "quantize",
                source.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
            ])
            .args(extra)
            .output()
            .unwrap()
    };
    let refused = stui(&[]);
    assert_eq!(refused.status.code(), Some(2));
    assert_eq!(std::fs::read(&out).unwrap(), b"existing");
    let done = stui(&["--yes", "--json", "--per-tensor"]);
    assert_eq!(
        done.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&done.stdout).unwrap();
    assert_eq!(summary["granularity"], "per-tensor");
    assert_eq!(summary["quantized"].as_array().unwrap().len(), 3);
    assert!(summary["bytes_after"].as_u64().unwrap() < summary["bytes_before"].as_u64().unwrap());
}

/// The Python `safetensors` package with numpy loads the output and dequantizes it within half
/// a scale of the source. Runs where `STUI_PYTHON` names a Python with both (`.ci/run` sets one up).
#[test]
fn python_safetensors_loads_the_output() {
    let Some(python) = crate::support::interop_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("model.safetensors");
    model(Dtype::F32).write(&source).unwrap();
    let output = dir.path().join("out.safetensors");
    run(&source, &output, Granularity::PerChannel);
    let script = support::python_check_script();
    let result = Command::new(python)
        .args([
            "-c",
            script,
            source.to_str().unwrap(),
            output.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        result.status.success(),
        "{}{}",
        String::from_utf8_lossy(&result.stdout),
        String::from_utf8_lossy(&result.stderr)
    );
    assert!(String::from_utf8_lossy(&result.stdout).contains("checked 3 quantized tensors"));
}

#[test]
fn rows_of_subnormal_values_still_verify() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("tiny.safetensors");
    SyntheticModel::new(0)
        .tensor(
            "layer.proj.weight",
            Dtype::F32,
            &[5, 1],
            Fill::Values(vec![2.8e-44, -1.4e-45, 0.0, 1e-40, 2.8e-44]),
        )
        .write(&source)
        .unwrap();
    for granularity in [Granularity::PerChannel, Granularity::PerTensor] {
        let summary = run(&source, &dir.path().join("out.safetensors"), granularity);
        assert!(summary.verified, "{granularity:?}");
    }
}

/// `stui quantize --scheme SCHEME -o OUTPUT SOURCE EXTRA...` run in `dir`: its exit code, its
/// output and the output's name.
fn quantize_in(
    dir: &Path,
    scheme: &str,
    source: &str,
    extra: &[&str],
) -> (Option<i32>, String, String) {
    let output = format!("{scheme}-{}-{source}", extra.len());
    let mut args = vec!["quantize", "--scheme", scheme, "-o", &output, source];
    args.extend_from_slice(extra);
    let run = support::run_within(support::stui(dir, args), std::time::Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    (run.code, stdout, output)
}

/// How many values of the model `file` in `dir` are ±Inf, as `stui stats` counts them.
fn infinite_values(dir: &Path, file: &str) -> u64 {
    support::stui_json(dir, &["stats", file])["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["pos_inf"].as_u64().unwrap() + t["neg_inf"].as_u64().unwrap())
        .sum()
}

/// Whether a save of `source` in `dir` under `scheme` exits 0 with an output that verifies and
/// reads back without ±Inf.
fn saves_finite(dir: &Path, scheme: &str, source: &str) {
    let (code, stdout, output) = quantize_in(dir, scheme, source, &[]);
    assert_eq!(code, Some(0), "{scheme} {source}: {stdout}");
    assert!(
        stdout.contains("the output is valid"),
        "{scheme} {source}: {stdout}"
    );
    assert_eq!(infinite_values(dir, &output), 0, "{scheme} {source}");
}

/// BF16 and F32 weights reaching the largest value their dtype holds: every scheme's scales keep
/// its grid within the dtype (W8A8's and FP8's one step lower than the nearest), so the save
/// verifies and the output reads back without ±Inf. But NVFP4A16 loads weights in BF16, which
/// cannot hold an F32 weight beyond BF16's range: that save does not verify, says why, and
/// verifies with the weight kept as the message advises.
#[test]
fn weights_at_the_top_of_their_range_quantize_and_read_back_finite() {
    let dir = tempfile::tempdir().unwrap();
    let top = |dtype, value: f64| {
        SyntheticModel::new(0)
            .tensor(
                "layer.proj.weight",
                dtype,
                &[4, 128],
                Fill::Values(vec![value, 1.0, -2.0]),
            )
            .tensor(
                "layer.other.weight",
                dtype,
                &[4, 128],
                Fill::Values(vec![0.5, 1.0, -2.0]),
            )
    };
    top(Dtype::Bf16, 3.389_531_4e38)
        .write(&dir.path().join("bf16.safetensors"))
        .unwrap();
    top(Dtype::F32, f64::from(f32::MAX))
        .write(&dir.path().join("f32.safetensors"))
        .unwrap();
    let schemes = [
        "W8A8",
        "W8A16",
        "W4A16",
        "W4A16_ASYM",
        "FP8_DYNAMIC",
        "FP8_BLOCK",
        "NVFP4A16",
    ];
    for source in ["bf16.safetensors", "f32.safetensors"] {
        for scheme in schemes {
            if scheme == "NVFP4A16" && source == "f32.safetensors" {
                let (code, stdout, _) = quantize_in(dir.path(), scheme, source, &[]);
                assert_eq!(code, Some(1), "{stdout}");
                assert!(
                    stdout.contains(
                        "read back as Inf, values beyond the range of the dtype they load in: \
                         `layer.proj.weight`; keep it with --keep-below-snr"
                    ),
                    "{stdout}"
                );
                let extra = ["--keep-below-snr", "0"];
                let (code, stdout, _) = quantize_in(dir.path(), scheme, source, &extra);
                assert_eq!(code, Some(0), "{stdout}");
                assert!(stdout.contains("1 kept") && stdout.contains("the output is valid"));
                continue;
            }
            saves_finite(dir.path(), scheme, source);
        }
    }
}

/// Groups spanning from the lowest value of their dtype to its highest. The symmetric schemes'
/// lowest code is one step further from 0 than their highest: the scale that keeps the highest
/// value within half a step would code the lowest one a step beyond the dtype's range. The
/// asymmetric scheme's highest value can land half a step beyond it. Each raises such a group's
/// scale until its grid stays within the range.
#[test]
fn groups_spanning_their_whole_range_keep_a_finite_grid() {
    let dir = tempfile::tempdir().unwrap();
    let span = |dtype, name: &str, values: Vec<f64>| {
        SyntheticModel::new(0)
            .tensor("layer.proj.weight", dtype, &[1, 128], Fill::Values(values))
            .write(&dir.path().join(name))
            .unwrap();
    };
    span(
        Dtype::Bf16,
        "bf16.safetensors",
        vec![3.389_531_4e38, -3.389_531_4e38],
    );
    let f32_max = f64::from(f32::MAX);
    span(
        Dtype::F32,
        "f32.safetensors",
        vec![f32_max, -f32_max, 3e38, 1.0],
    );
    for source in ["bf16.safetensors", "f32.safetensors"] {
        for scheme in ["W8A16", "W4A16", "W4A16_ASYM"] {
            saves_finite(dir.path(), scheme, source);
        }
    }
}

/// A weight of one row (a reward or classification head, `score.weight` [1, hidden]) in a
/// single group has a single scale, like a weight quantized per tensor: read back as the group it
/// is (an asymmetric group's zero point packed, not stored as a tensor's), its error as `stui
/// diff` reads it is the one its save reported, under every scheme.
#[test]
fn a_weight_of_one_row_reads_back_as_saved() {
    let dir = tempfile::tempdir().unwrap();
    SyntheticModel::new(3)
        .tensor(
            "score.weight",
            Dtype::Bf16,
            &[1, 128],
            Fill::Values(vec![-1.0, -0.3, 0.2, 0.7, 1.5, 3.0, 0.1]),
        )
        .write(&dir.path().join("head.safetensors"))
        .unwrap();
    for scheme in Scheme::ALL {
        let (name, output) = (scheme.to_string(), format!("{scheme}.safetensors"));
        let args = [
            "quantize",
            "head.safetensors",
            "-o",
            &output,
            "--scheme",
            &name,
        ];
        let saved = support::stui_json(dir.path(), &[&args[..], &["--yes"]].concat());
        let diff = support::stui_json(dir.path(), &["diff", "head.safetensors", &output]);
        let saved = saved["quantized"][0]["snr_db"].as_f64().unwrap();
        let read = diff["tensors"][0]["change"]["snr_db"].as_f64().unwrap();
        assert!(
            (saved - read).abs() < 1e-4,
            "{scheme}: SNR {saved} saved, {read} read back"
        );
    }
}

/// Rows of one value, more of them than one run of rows holds, each with its own scale, read back
/// from the file a run at a time. A weight without values is kept as it is.
#[test]
fn narrow_and_empty_weights() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("narrow.safetensors");
    let values = Fill::Values(vec![3.0, -0.25, 0.0, 1e-3, -7.5, 65504.0, 6e-5]);
    let shapes = [("layer.a.weight", 150_000), ("layer.b.weight", 70_000)];
    let mut model = SyntheticModel::new(5);
    for (name, rows) in shapes {
        model = model.tensor(name, Dtype::F16, &[rows, 1], values.clone());
    }
    model
        .tensor("layer.empty.weight", Dtype::F32, &[0, 5], Fill::Zeros)
        .write(&source)
        .unwrap();
    let output = dir.path().join("out.safetensors");
    let summary = run(&source, &output, Granularity::PerChannel);
    assert!(summary.verified);
    assert_eq!(summary.quantized.len(), 2);
    let model = Model::open(&source).unwrap();
    assert!(
        summary
            .kept()
            .any(|(t, why)| model.tensors[t].name() == "layer.empty.weight"
                && why == quantize::Kept::Empty)
    );
    let (source, output) = (
        std::fs::read(&source).unwrap(),
        std::fs::read(&output).unwrap(),
    );
    for (name, rows) in shapes {
        let (_, _, x) = reference_values(&source, name);
        let (_, shape, q) = reference_values(&output, name);
        let (_, scale_shape, scales) = reference_values(&output, &format!("{name}_scale"));
        let rows = usize::try_from(rows).unwrap();
        assert_eq!((x.len(), q.len(), scales.len()), (rows, rows, rows));
        assert_eq!(shape, [rows, 1]);
        assert_eq!(scale_shape, [rows, 1]);
        for ((x, q), scale) in x.iter().zip(&q).zip(&scales) {
            assert!((x - q * scale).abs() <= scale * 0.5, "{x} vs {q} * {scale}");
            // One value a row: it is its row's largest, so it lands at the end of the range
            // (but for the rounding of scales too small for F16 to hold closely).
            assert!(x.abs() < 1e-3 || q.abs() >= 126.0, "{x} -> {q}");
        }
    }
}

/// A save clears the temporaries an interrupted save left in its folder, but not one that
/// another save is still writing (which holds it locked).
#[test]
fn a_save_leaves_another_saves_temporary_alone() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("model.safetensors");
    model(Dtype::F32).write(&source).unwrap();
    let loaded = Model::open(&source).unwrap();
    let others = dir.path().join(".stui-tmp-other.partial");
    let left = dir.path().join(".stui-tmp-left.partial");
    std::fs::write(&others, b"in progress").unwrap();
    std::fs::write(&left, b"interrupted").unwrap();
    let held = std::fs::File::open(&others).unwrap();
    held.lock().unwrap();
    let output = dir.path().join("out.safetensors");
    quantize::quantize(&loaded, &output, &Options::default(), &Control::default()).unwrap();
    assert!(others.exists(), "another save's temporary is left alone");
    assert!(!left.exists(), "a left-over temporary is cleared");
    drop(held);
    quantize::quantize(&loaded, &output, &Options::default(), &Control::default()).unwrap();
    assert!(!others.exists(), "cleared once no save holds it");
}

/// SIGTERM, SIGINT (Ctrl-C) or SIGHUP during a save stops it cleanly: no temporary, no output,
/// no folder made for it, a message, and the process ends as the signal ends it.
#[test]
fn a_signal_during_a_save_leaves_nothing_and_ends_the_process_as_the_signal_would() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    support::write_model_of_64_mib(&dir.path().join("model.safetensors"), 4);
    for (signal, name, scheme) in [
        (libc::SIGTERM, "TERM", "W8A8"),
        (libc::SIGINT, "INT", "W4A16"),
        (libc::SIGHUP, "HUP", "FP8_BLOCK"),
    ] {
        let folder = dir.path().join(format!("out-{scheme}"));
        let temporary_made = || !support::temporaries_in(&folder).is_empty();
        let child = Command::new(env!("CARGO_BIN_EXE_stui"))
            .args(["quantize", "model.safetensors", "--scheme", scheme, "-o"])
            .arg(folder.join("model.safetensors"))
            .current_dir(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        while !temporary_made() && started.elapsed() < std::time::Duration::from_secs(30) {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert!(temporary_made(), "{scheme}: the save began writing");
        let sent = Command::new("kill")
            .args(["-s", name, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let output = child.wait_with_output().unwrap();
        assert_eq!(output.status.signal(), Some(signal), "{scheme}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("stui: stopped by SIG") && stderr.contains("nothing was written"),
            "{scheme}: {stderr}"
        );
        assert!(
            !folder.exists(),
            "{scheme}: no folder, no temporary, no output"
        );
    }
}

#[test]
fn kill_9_during_a_save_leaves_the_source_and_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("model.safetensors");
    support::write_model_of_64_mib(&source, 3);
    let before = std::fs::read(&source).unwrap();
    let output = dir.path().join("out.safetensors");
    let temporaries = || support::temporaries_in(dir.path());
    let mut child = Command::new(env!("CARGO_BIN_EXE_stui"))
        .args(["quantize", "model.safetensors", "-o", "out.safetensors"])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while temporaries().is_empty() && started.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success(), "the save was killed before it finished");
    assert!(
        std::fs::read(&source).unwrap() == before,
        "the source is unchanged"
    );
    assert!(!output.exists(), "nothing at the target path");
    assert!(
        !temporaries().is_empty(),
        "the partial file is recognisable"
    );
    let status = Command::new(env!("CARGO_BIN_EXE_stui"))
        .args(["quantize", "model.safetensors", "-o", "out.safetensors"])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    assert!(temporaries().is_empty(), "the next run cleans up");
    assert!(Model::open(&output).unwrap().is_valid());
}

/// A model given as a folder is written as a folder (its files and config.json): an output
/// named like a file is refused with the folder to name instead, and nothing is written. As a
/// mixture of experts' routers are kept (vLLM reads them unquantized), the output's
/// `ignore` names them.
#[test]
fn a_folder_is_written_as_a_folder_and_a_mixtures_routers_are_kept() {
    let folder = tempfile::tempdir().unwrap();
    let router = Fill::Normal {
        mean: 0.0,
        std: 0.1,
    };
    model(Dtype::Bf16)
        .tensor(
            "model.layers.0.mlp.gate.weight",
            Dtype::Bf16,
            &[4, 8],
            router,
        )
        .write(&folder.path().join("model.safetensors"))
        .unwrap();
    std::fs::write(
        folder.path().join("config.json"),
        br#"{"model_type":"llama"}"#,
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let named_as_a_file = out.path().join("quantized.safetensors");
    let run = |output: &Path| {
        Command::new(env!("CARGO_BIN_EXE_stui"))
            .arg("quantize")
            .arg(folder.path())
            .arg("-o")
            .arg(output)
            .output()
            .unwrap()
    };
    let refused = run(&named_as_a_file);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("would be a folder") && stderr.contains("name the folder, e.g."),
        "{stderr}"
    );
    assert!(!named_as_a_file.exists());
    let written = run(&out.path().join("quantized"));
    assert_eq!(
        written.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&written.stderr)
    );
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("quantized/config.json")).unwrap())
            .unwrap();
    let ignore = config["quantization_config"]["ignore"].as_array().unwrap();
    assert!(
        ignore.iter().any(|name| name == "model.layers.0.mlp.gate"),
        "{ignore:?}"
    );
}
