//! Every scheme on a tiny BF16 Llama, beside llm-compressor's own `model_free_ptq` output of the
//! same preset on the same weights (tests/fixtures/quant, with the producer's versions in each
//! `producer.json`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use stui::format::{Dtype, Model};
use stui::quantize::scheme::{Plan, Role, Scheme, Streams};
use stui::quantize::{self, Control, Options};

const PRESETS: [(Scheme, &str); 6] = [
    (Scheme::W8A16, "ct-w8a16"),
    (Scheme::W4A16, "ct-w4a16"),
    (Scheme::W4A16Asym, "ct-w4a16-asym"),
    (Scheme::Fp8Dynamic, "ct-fp8-dynamic"),
    (Scheme::Fp8Block, "ct-fp8-block"),
    (Scheme::Nvfp4A16, "ct-nvfp4a16"),
];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant")
}

fn source() -> PathBuf {
    fixtures().join("source/model.safetensors")
}

/// Quantizes the fixture's source into `folder` (with its config.json).
fn quantize_into(folder: &Path, scheme: Scheme) -> quantize::Summary {
    let model = Model::open(&source()).unwrap();
    let options = Options {
        scheme,
        ..Options::default()
    };
    quantize::quantize(
        &model,
        &folder.join("model.safetensors"),
        &options,
        &Control::default(),
    )
    .unwrap()
}

/// Every tensor's dtype and shape, as the reference crate reads them.
fn layout(bytes: &[u8]) -> BTreeMap<String, (String, Vec<usize>)> {
    let file = safetensors::SafeTensors::deserialize(bytes).unwrap();
    file.tensors()
        .into_iter()
        .map(|(name, view)| (name, (format!("{:?}", view.dtype()), view.shape().to_vec())))
        .collect()
}

fn quantization_config(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap();
    let config: serde_json::Value = serde_json::from_str(&text).unwrap();
    config["quantization_config"].clone()
}

/// The source's values of `name`, as f32.
fn source_values(bytes: &[u8], name: &str) -> Vec<f32> {
    let file = safetensors::SafeTensors::deserialize(bytes).unwrap();
    let view = file.tensor(name).unwrap();
    assert_eq!(view.dtype(), safetensors::Dtype::BF16);
    view.data()
        .chunks(2)
        .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
}

/// The SNR of weight `name` as written in `output` (the whole tensor at once), dequantized by
/// the scheme's own read-back.
fn snr_of(output: &[u8], source: &[f32], name: &str, scheme: Scheme) -> f64 {
    let file = safetensors::SafeTensors::deserialize(output).unwrap();
    let source_file =
        safetensors::SafeTensors::deserialize(&std::fs::read(self::source()).unwrap())
            .unwrap()
            .tensor(name)
            .unwrap()
            .shape()
            .to_vec();
    let [rows, columns] = [source_file[0] as u64, source_file[1] as u64];
    let absmax = source.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let mut plan = Plan::new(
        scheme,
        quantize::scheme::DEFAULT_GROUP,
        [rows, columns],
        Dtype::Bf16,
        f64::from(absmax),
    );
    let mut streams = Streams::default();
    for member in plan.members() {
        let data = file
            .tensor(&format!("{name}{}", member.suffix))
            .unwrap()
            .data()
            .to_vec();
        match member.role {
            Role::GlobalScale => plan.global_scale = f32::from_le_bytes(data.try_into().unwrap()),
            Role::Shape => {}
            role => *streams.of_mut(role).unwrap() = data,
        }
    }
    let (sums, _) = plan.check(source, &streams);
    10.0 * (sums.signal / sums.noise).log10()
}

/// The same tensors (names, dtypes, shapes) as llm-compressor's output, but for the embedding
/// that stui keeps as it is by default; the same `format`, `config_groups` and keys in
/// `quantization_config`, in config.json and in the metadata; every weight at least as accurate,
/// both outputs dequantized the same way.
#[test]
fn each_scheme_writes_the_presets_layout_at_least_as_accurately() {
    let source_bytes = std::fs::read(source()).unwrap();
    for (scheme, preset) in PRESETS {
        let dir = tempfile::tempdir().unwrap();
        let summary = quantize_into(dir.path(), scheme);
        assert!(summary.verified, "{scheme}");
        let ours = std::fs::read(dir.path().join("model.safetensors")).unwrap();
        let theirs = std::fs::read(fixtures().join(preset).join("model.safetensors")).unwrap();
        let outside_embedding = |layout: BTreeMap<String, (String, Vec<usize>)>| {
            layout
                .into_iter()
                .filter(|(name, _)| !name.starts_with("model.embed_tokens."))
                .collect::<BTreeMap<_, _>>()
        };
        assert_eq!(
            outside_embedding(layout(&ours)),
            outside_embedding(layout(&theirs)),
            "{scheme}"
        );
        let expected = quantization_config(&fixtures().join(preset).join("config.json"));
        let written = quantization_config(&dir.path().join("config.json"));
        let metadata = safetensors::SafeTensors::read_metadata(&ours).unwrap().1;
        let in_metadata: serde_json::Value =
            serde_json::from_str(&metadata.metadata().as_ref().unwrap()["quantization_config"])
                .unwrap();
        assert_eq!(written, in_metadata, "{scheme}");
        assert_eq!(written["format"], expected["format"], "{scheme}");
        assert_eq!(
            written["config_groups"], expected["config_groups"],
            "{scheme}"
        );
        let keys =
            |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&written), keys(&expected), "{scheme}");
        let model = Model::open(&source()).unwrap();
        for quantized in &summary.quantized {
            let name = model.tensors[quantized.tensor].name();
            let values = source_values(&source_bytes, name);
            if theirs_has(&theirs, name) {
                let their_snr = snr_of(&theirs, &values, name, scheme);
                let our_snr = snr_of(&ours, &values, name, scheme);
                assert!(
                    (our_snr - quantized.error.snr_db).abs() < 1e-9,
                    "{scheme} {name}"
                );
                assert!(
                    our_snr >= their_snr,
                    "{scheme} {name}: {our_snr} < {their_snr}"
                );
            }
        }
    }
}

fn theirs_has(theirs: &[u8], name: &str) -> bool {
    let file = safetensors::SafeTensors::deserialize(theirs).unwrap();
    file.tensor(&format!("{name}_scale")).is_ok()
}

/// What `tests/interop/schemes_numpy.py` prints of `output` against `source`, run in `python`;
/// it must succeed.
fn schemes_numpy(python: &std::ffi::OsStr, source: &Path, output: &Path) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/schemes_numpy.py");
    let result = Command::new(python)
        .arg(&script)
        .arg(source)
        .arg(output)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&result.stdout).into_owned();
    assert!(
        result.status.success(),
        "{}: {stdout}{}",
        output.display(),
        String::from_utf8_lossy(&result.stderr)
    );
    stdout
}

/// Holds the SNR of each weight of `summary` to the one `schemes_numpy.py` printed of it
/// (`stdout`), to its four decimals.
fn assert_numpy_snrs(model: &Model, summary: &quantize::Summary, stdout: &str) {
    let scheme = summary.scheme;
    for quantized in &summary.quantized {
        let name = model.tensors[quantized.tensor].name();
        let theirs: f64 = stdout
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name}  snr ")))
            .and_then(|rest| rest.split(' ').next())
            .and_then(|snr| snr.parse().ok())
            .unwrap_or_else(|| panic!("{scheme}: no SNR for {name} in {stdout}"));
        let ours = quantized.error.snr_db;
        assert!(
            ours.is_finite() && (ours - theirs).abs() < 1e-3,
            "{scheme} {name}: stui {ours} dB, numpy {theirs} dB"
        );
    }
}

/// The Python `safetensors` package reads every scheme's output, and numpy alone dequantizes it
/// from the layout within half a step of the source, with the SNRs `stui` reports
/// (`tests/interop/schemes_numpy.py`). Runs where `STUI_PYTHON` names a Python with both
/// (`.ci/run` sets one up).
#[test]
fn numpy_dequantizes_every_scheme_within_half_a_step() {
    let Some(python) = crate::support::interop_python() else {
        return;
    };
    let model = Model::open(&source()).unwrap();
    for scheme in Scheme::ALL {
        let dir = tempfile::tempdir().unwrap();
        let summary = quantize_into(dir.path(), scheme);
        let stdout = schemes_numpy(&python, &source(), &dir.path().join("model.safetensors"));
        assert!(
            stdout.contains(&format!(
                "checked {} quantized weights",
                summary.quantized.len()
            )),
            "{scheme}: {stdout}"
        );
        assert_numpy_snrs(&model, &summary, &stdout);
    }
}

/// Weights far from 1 (near `2^70`, `2^-100` and `2^-122`), quantized under every scheme, are
/// read by numpy alone from the layout within half a step, with the SNRs `stui` reports.
#[test]
fn numpy_reads_weights_far_from_1_as_stui_reports_them() {
    use stui::demo::{Fill, SyntheticModel};
    let Some(python) = crate::support::interop_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("far.safetensors");
    let normal = |power: i32| Fill::Normal {
        mean: 0.0,
        std: 2f64.powi(power),
    };
    SyntheticModel::new(17)
        .tensor("big.weight", Dtype::Bf16, &[64, 256], normal(70))
        .tensor("small.weight", Dtype::F32, &[64, 256], normal(-100))
        .tensor("tiny.weight", Dtype::F32, &[64, 256], normal(-122))
        .write(&source)
        .unwrap();
    let model = Model::open(&source).unwrap();
    for scheme in Scheme::ALL {
        let output = dir.path().join(scheme.name()).join("model.safetensors");
        let options = Options {
            scheme,
            ..Options::default()
        };
        let summary = quantize::quantize(&model, &output, &options, &Control::default()).unwrap();
        assert!(summary.verified, "{scheme}");
        let stdout = schemes_numpy(&python, &source, &output);
        assert!(
            stdout.contains("checked 3 quantized weights"),
            "{scheme}: {stdout}"
        );
        assert_numpy_snrs(&model, &summary, &stdout);
    }
}

/// A weight whose columns do not divide into groups is kept as it is, and said so.
#[test]
fn weights_without_whole_groups_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let summary = quantize_into(dir.path(), Scheme::W4A16);
    let model = Model::open(&source()).unwrap();
    let kept: Vec<&str> = summary
        .kept()
        .filter(|&(_, why)| why == quantize::Kept::Ungrouped)
        .map(|(t, _)| model.tensors[t].name())
        .collect();
    assert_eq!(kept, ["model.layers.0.mlp.down_proj.weight"]);
    let config = quantization_config(&dir.path().join("config.json"));
    assert!(
        config["ignore"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("model.layers.0.mlp.down_proj"))
    );
}

/// The command line: `--scheme` by its preset name, an unknown one refused with the list.
#[test]
fn the_command_line_takes_the_preset_names() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("out.safetensors");
    let done = Command::new(env!("CARGO_BIN_EXE_stui"))
        .args([
            "quantize",
            "--json",
            "--scheme",
            "w4a16_asym",
            "--group-size",
            "64",
        ])
        .arg(source())
        .arg("-o")
        .arg(&output)
        .output()
        .unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&done.stdout).unwrap();
    assert_eq!(summary["scheme"], "W4A16_ASYM");
    assert_eq!(summary["verified"], true);
    let bytes = std::fs::read(&output).unwrap();
    let layout = layout(&bytes);
    assert_eq!(
        layout["model.layers.0.mlp.down_proj.weight_scale"].1,
        [128, 3]
    );
    let refused = Command::new(env!("CARGO_BIN_EXE_stui"))
        .args(["quantize", "--scheme", "W3A16"])
        .arg(source())
        .arg("-o")
        .arg(dir.path().join("other.safetensors"))
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("NVFP4A16"));
    // `--per-tensor` is W8A8's: with another scheme it is refused, not ignored; with
    // `--compare` it sets W8A8's row.
    let other = dir.path().join("per-tensor.safetensors");
    let refused = Command::new(env!("CARGO_BIN_EXE_stui"))
        .args(["quantize", "--scheme", "W4A16", "--per-tensor"])
        .arg(source())
        .arg("-o")
        .arg(&other)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains("--per-tensor is W8A8's: W4A16 has its own scales (groups of 128)"),
        "{message}"
    );
    assert!(!other.exists());
    let compared = Command::new(env!("CARGO_BIN_EXE_stui"))
        .args(["quantize", "--compare", "--json", "--per-tensor"])
        .arg(source())
        .output()
        .unwrap();
    assert!(compared.status.success());
}

/// `--compare` gives each scheme the very errors that writing it reads back from the file: the
/// same codes, their squares summed in another order (SNR within 10^-4 dB, shown to 10^-2).
#[test]
fn the_comparison_matches_what_each_scheme_writes() {
    let model = Model::open(&source()).unwrap();
    let comparison = quantize::compare(&model, &Options::default(), &Control::default()).unwrap();
    assert_eq!(comparison.schemes.len(), Scheme::ALL.len());
    for result in &comparison.schemes {
        let dir = tempfile::tempdir().unwrap();
        let summary = quantize_into(dir.path(), result.scheme);
        assert_eq!(result.weights, summary.quantized.len(), "{}", result.scheme);
        for (quantized, &(tensor, error)) in summary.quantized.iter().zip(&result.errors) {
            assert_eq!(quantized.tensor, tensor);
            let name = model.tensors[tensor].name();
            assert!(
                (quantized.error.snr_db - error.snr_db).abs() < 1e-4,
                "{} {name}: {} against {}",
                result.scheme,
                quantized.error.snr_db,
                error.snr_db
            );
            assert!(
                (quantized.error.max_abs_error - error.max_abs_error).abs()
                    <= quantized.error.max_abs_error * 1e-6,
                "{} {name}: largest error {} against {}",
                result.scheme,
                quantized.error.max_abs_error,
                error.max_abs_error
            );
        }
        let data: u64 = std::fs::metadata(dir.path().join("model.safetensors"))
            .unwrap()
            .len();
        assert!(result.output_bytes <= data && data < result.output_bytes + (16 << 10));
    }
}

/// `--keep-below-snr`: the weights below the threshold stay as they were, listed as kept and in
/// `ignore`; the others are quantized.
#[test]
fn weights_below_the_threshold_are_kept() {
    let model = Model::open(&source()).unwrap();
    let comparison = quantize::compare(&model, &Options::default(), &Control::default()).unwrap();
    let nvfp4 = &comparison.schemes[6];
    assert_eq!(nvfp4.scheme, Scheme::Nvfp4A16);
    let threshold = nvfp4.median_snr_db.unwrap();
    let expected: Vec<&str> = nvfp4
        .errors
        .iter()
        .filter(|(_, e)| e.snr_db < threshold)
        .map(|&(t, _)| model.tensors[t].name())
        .collect();
    assert!(!expected.is_empty());
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        scheme: Scheme::Nvfp4A16,
        keep_below_snr: Some(threshold),
        ..Options::default()
    };
    let summary = quantize::quantize(
        &model,
        &dir.path().join("model.safetensors"),
        &options,
        &Control::default(),
    )
    .unwrap();
    assert!(summary.verified);
    let kept: Vec<&str> = summary
        .kept()
        .filter(|&(_, why)| why == quantize::Kept::BelowSnr)
        .map(|(t, _)| model.tensors[t].name())
        .collect();
    assert_eq!(kept, expected);
    assert_eq!(summary.quantized.len(), nvfp4.weights - kept.len());
    let config = quantization_config(&dir.path().join("config.json"));
    let ignore = config["ignore"].as_array().unwrap();
    for name in kept {
        assert!(ignore.contains(&serde_json::json!(name.strip_suffix(".weight").unwrap())));
    }
}

/// `stui::quant::kernels`, written from compressed-tensors' decompressors (and equal to them on
/// llm-compressor's own checkpoints), dequantizes every scheme's output to the errors the save
/// reported: the same worst error and SNR (its sums to their rounding).
#[test]
fn the_dequantization_kernels_read_every_scheme_back() {
    use stui::quant::kernels::compressed_tensors::{Naive, Nvfp4, Packed, PackedMembers, Strategy};
    use stui::quant::kernels::{Dequantize, Stored};
    let source_bytes = std::fs::read(source()).unwrap();
    let model = Model::open(&source()).unwrap();
    for (scheme, _) in PRESETS {
        let dir = tempfile::tempdir().unwrap();
        let summary = quantize_into(dir.path(), scheme);
        let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let shapes: BTreeMap<String, Vec<u64>> = file
            .tensors()
            .into_iter()
            .map(|(name, view)| (name, view.shape().iter().map(|&d| d as u64).collect()))
            .collect();
        for quantized in &summary.quantized {
            let name = model.tensors[quantized.tensor].name();
            let get = |suffix: &str| {
                let key = format!("{name}{suffix}");
                let view = file.tensor(&key).ok()?;
                let dtype = Dtype::from_name(&format!("{:?}", view.dtype())).unwrap();
                Some(Stored {
                    bytes: view.data(),
                    dtype,
                    shape: shapes[&key].as_slice(),
                })
            };
            let kernel: Box<dyn Dequantize> = match scheme {
                Scheme::W8A16 | Scheme::W4A16 | Scheme::W4A16Asym => Box::new(
                    Packed::new(
                        PackedMembers {
                            weight_packed: get("_packed").unwrap(),
                            weight_shape: get("_shape").unwrap(),
                            weight_scale: get("_scale").unwrap(),
                            weight_zero_point: get("_zero_point"),
                            weight_g_idx: None,
                        },
                        scheme.bits(),
                        Strategy::Group { size: 128 },
                        None,
                    )
                    .unwrap(),
                ),
                Scheme::Fp8Dynamic | Scheme::Fp8Block => Box::new(
                    Naive::new(
                        get("").unwrap(),
                        get("_scale").unwrap(),
                        None,
                        None,
                        if scheme == Scheme::Fp8Block {
                            Strategy::Block {
                                rows: 128,
                                cols: 128,
                            }
                        } else {
                            Strategy::Channel
                        },
                        8,
                    )
                    .unwrap(),
                ),
                _ => Box::new(
                    Nvfp4::new(
                        get("_packed").unwrap(),
                        get("_scale").unwrap(),
                        get("_global_scale").unwrap(),
                        usize::try_from(model.tensors[quantized.tensor].info.shape.get(1).unwrap())
                            .unwrap(),
                    )
                    .unwrap(),
                ),
            };
            let mut values = vec![0f32; kernel.rows() * kernel.cols()];
            kernel.dequantize_rows(0..kernel.rows(), &mut values);
            let x = source_values(&source_bytes, name);
            let (mut signal, mut noise, mut worst) = (0f64, 0f64, 0f64);
            for (&x, &y) in x.iter().zip(&values) {
                let error = f64::from(x) - f64::from(y);
                signal += f64::from(x) * f64::from(x);
                noise += error * error;
                worst = worst.max(error.abs());
            }
            let snr = 10.0 * (signal / noise).log10();
            let error = quantized.error;
            assert_eq!(worst, error.max_abs_error, "{scheme} {name}");
            assert!(
                (snr - error.snr_db).abs() < 1e-4,
                "{scheme} {name}: {snr} against {}",
                error.snr_db
            );
        }
    }
}

/// An F64 source is quantized through `f32`: every scheme writes it, reads it back within half a
/// step (scales stored as F64), and leaves the error the same values rounded to F32 leave.
#[test]
fn f64_sources_are_quantized_through_f32() {
    let bytes = std::fs::read(source()).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let names: Vec<String> = file.names().into_iter().map(str::to_owned).collect();
    // Each value nudged off the f32 grid, so that the F64 file holds more than its F32 twin.
    let values: Vec<(String, Vec<usize>, Vec<f64>)> = names
        .iter()
        .map(|name| {
            let view = file.tensor(name).unwrap();
            let values = source_values(&bytes, name)
                .into_iter()
                .map(|x| f64::from(x) * (1.0 + 2f64.powi(-40)))
                .collect();
            (name.clone(), view.shape().to_vec(), values)
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let write = |path: &Path, dtype: safetensors::Dtype, encode: &dyn Fn(f64) -> Vec<u8>| {
        let data: Vec<Vec<u8>> = values
            .iter()
            .map(|(_, _, v)| v.iter().flat_map(|&x| encode(x)).collect())
            .collect();
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = values
            .iter()
            .zip(&data)
            .map(|((name, shape, _), data)| {
                let view = safetensors::tensor::TensorView::new(dtype, shape.clone(), data);
                (name.clone(), view.unwrap())
            })
            .collect();
        safetensors::serialize_to_file(views, None, path).unwrap();
    };
    let wide = dir.path().join("f64.safetensors");
    let narrow = dir.path().join("f32.safetensors");
    write(&wide, safetensors::Dtype::F64, &|x| {
        x.to_le_bytes().to_vec()
    });
    #[expect(clippy::cast_possible_truncation, reason = "the F32 twin")]
    write(&narrow, safetensors::Dtype::F32, &|x| {
        (x as f32).to_le_bytes().to_vec()
    });
    for scheme in Scheme::ALL {
        let run = |source: &Path, name: &str| {
            let model = Model::open(source).unwrap();
            let options = Options {
                scheme,
                ..Options::default()
            };
            let output = dir.path().join(format!("{scheme}-{name}.safetensors"));
            let summary =
                quantize::quantize(&model, &output, &options, &Control::default()).unwrap();
            assert!(summary.verified, "{scheme} {name}");
            (model, summary, output)
        };
        let (model, wide_summary, output) = run(&wide, "f64");
        let (_, narrow_summary, _) = run(&narrow, "f32");
        assert!(!wide_summary.quantized.is_empty(), "{scheme}");
        let written = std::fs::read(&output).unwrap();
        let written = safetensors::SafeTensors::deserialize(&written).unwrap();
        for (wide, narrow) in wide_summary.quantized.iter().zip(&narrow_summary.quantized) {
            let name = model.tensors[wide.tensor].name();
            assert!(
                wide.error.max_error_in_scales <= 0.5 + 1e-6,
                "{scheme} {name}: {:?}",
                wide.error
            );
            assert!(
                (wide.error.snr_db - narrow.error.snr_db).abs() < 0.01,
                "{scheme} {name}: {} dB against {} dB",
                wide.error.snr_db,
                narrow.error.snr_db
            );
            let scale = written.tensor(&format!("{name}_scale")).unwrap();
            let expected = if scheme == Scheme::Nvfp4A16 {
                safetensors::Dtype::F8_E4M3
            } else {
                safetensors::Dtype::F64
            };
            assert_eq!(scale.dtype(), expected, "{scheme} {name}");
        }
    }
}

/// All-zero groups (a weight's first group of every row, and a whole weight) under every
/// scheme read back without a zero-scale finding: the int schemes store the scale dtype's
/// epsilon there, as the presets do (`calculate_qparams` puts it in place of 0), and those
/// values still come back 0.
#[test]
fn all_zero_groups_read_back_without_a_zero_scale() {
    use stui::demo::{Fill, SyntheticModel};
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("model.safetensors");
    let half_zero: Vec<f64> = (0..256)
        .map(|i| {
            if i < 128 {
                0.0
            } else {
                f64::from(i - 190) / 64.0
            }
        })
        .collect();
    SyntheticModel::new(3)
        .tensor("a.weight", Dtype::Bf16, &[16, 256], Fill::Values(half_zero))
        .tensor("z.weight", Dtype::Bf16, &[16, 256], Fill::Zeros)
        .write(&source)
        .unwrap();
    let model = Model::open(&source).unwrap();
    for scheme in Scheme::ALL {
        let output = dir.path().join(format!("{scheme}.safetensors"));
        let options = Options {
            scheme,
            ..Options::default()
        };
        let summary = quantize::quantize(&model, &output, &options, &Control::default()).unwrap();
        assert!(summary.verified, "{scheme}");
        assert_eq!(summary.quantized.len(), 2, "{scheme}");
        let run = crate::support::run_within(
            crate::support::stui(dir.path(), ["stats".as_ref(), output.as_os_str()]),
            std::time::Duration::from_secs(60),
        );
        let text = String::from_utf8_lossy(&run.stdout);
        assert!(!text.contains("quant-scale"), "{scheme}: {text}");
        assert_eq!(run.code, Some(0), "{scheme}: {text}");
        if matches!(scheme, Scheme::W8A16 | Scheme::W4A16 | Scheme::W4A16Asym) {
            let bytes = std::fs::read(&output).unwrap();
            let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            let scales = file.tensor("z.weight_scale").unwrap();
            for pair in scales.data().chunks(2) {
                let scale = half::bf16::from_le_bytes([pair[0], pair[1]]).to_f32();
                assert_eq!(scale, 2f32.powi(-7), "{scheme}");
            }
        }
    }
}

/// The fixture's source with every tensor stored as `dtype` (BF16 values widened, or rounded to
/// F16), in `dir`.
fn source_as(dir: &Path, dtype: safetensors::Dtype) -> PathBuf {
    let tensors = crate::support::float_tensors(&source());
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = {
        let source_bytes = std::fs::read(source()).unwrap();
        let file = safetensors::SafeTensors::deserialize(&source_bytes).unwrap();
        tensors
            .into_iter()
            .map(|(name, values)| {
                let shape = file.tensor(&name).unwrap().shape().to_vec();
                let data = match dtype {
                    safetensors::Dtype::F32 => {
                        values.iter().flat_map(|v| v.to_le_bytes()).collect()
                    }
                    safetensors::Dtype::F16 => values
                        .iter()
                        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                        .collect(),
                    _ => values
                        .iter()
                        .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                        .collect(),
                };
                (name, shape, data)
            })
            .collect()
    };
    let views: Vec<(&str, safetensors::tensor::TensorView<'_>)> = bytes
        .iter()
        .map(|(name, shape, data)| {
            let view = safetensors::tensor::TensorView::new(dtype, shape.clone(), data).unwrap();
            (name.as_str(), view)
        })
        .collect();
    let path = dir.join(format!("{dtype:?}.safetensors"));
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
    path
}

/// What a save reports of each weight is what `stui diff SOURCE OUTPUT` then reads from the
/// file, as the loaders dequantize it (in the scales' type: BF16 and F16 round each value once
/// more, by up to half a step of the grid at the largest values of 8-bit codes): the same SNR
/// and the same largest error, for every scheme and every float type of source.
#[test]
fn the_save_reports_what_stui_diff_reads() {
    let dir = tempfile::tempdir().unwrap();
    for dtype in [
        safetensors::Dtype::BF16,
        safetensors::Dtype::F16,
        safetensors::Dtype::F32,
    ] {
        let source = source_as(dir.path(), dtype);
        let source = source.to_str().unwrap();
        for scheme in Scheme::ALL {
            let output = dir.path().join(format!("{dtype:?}-{scheme}.safetensors"));
            let output = output.to_str().unwrap();
            let name = scheme.to_string();
            let summary = crate::support::stui_json(
                dir.path(),
                &["quantize", source, "-o", output, "--scheme", &name, "--yes"],
            );
            let diff = crate::support::stui_json(dir.path(), &["diff", source, output]);
            let quantized = summary["quantized"].as_array().unwrap();
            assert!(quantized.len() >= 6, "{dtype:?} {scheme}");
            for weight in quantized {
                let tensor = &weight["name"];
                let change = &diff["tensors"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|t| &t["name"] == tensor)
                    .unwrap()["change"];
                let (snr, read) = (weight["snr_db"].as_f64(), change["snr_db"].as_f64());
                let (snr, read) = (snr.unwrap(), read.unwrap());
                assert!(
                    (snr - read).abs() < 1e-4,
                    "{dtype:?} {scheme} {tensor}: SNR {snr} saved, {read} read back"
                );
                let largest = weight["max_abs_error"].as_f64().unwrap();
                let read = change["max_abs_diff"].as_f64().unwrap();
                assert!(
                    (largest - read).abs() <= read * 1e-6,
                    "{dtype:?} {scheme} {tensor}: largest error {largest} saved, {read} read back"
                );
            }
        }
    }
}

/// A save that would quantize nothing is refused before anything is written, saying why: no
/// weight in whole groups, every weight below the threshold, or no weight chosen at all.
#[test]
fn a_save_that_would_quantize_nothing_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("out.safetensors");
    for (args, says) in [
        (
            &["--scheme", "W4A16", "--group-size", "5"][..],
            "no weight chosen has columns that divide into W4A16's groups of 5",
        ),
        (
            &["--scheme", "NVFP4A16", "--keep-below-snr", "1000"][..],
            "every weight chosen falls below 1000 dB under NVFP4A16",
        ),
        (&["--include", "nothing.*"][..], "no tensor to quantize"),
        (&["--keep-below-snr", "nan"][..], "not a number of dB"),
    ] {
        let refused = Command::new(env!("CARGO_BIN_EXE_stui"))
            .arg("quantize")
            .args(args)
            .arg(source())
            .arg("-o")
            .arg(&output)
            .output()
            .unwrap();
        let message = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(2), "{args:?}: {message}");
        assert!(message.contains(says), "{args:?}: {message}");
        assert!(!output.exists(), "{args:?}");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "{args:?}"
        );
    }
    // A threshold below zero is a number like any other.
    let saved = Command::new(env!("CARGO_BIN_EXE_stui"))
        .args(["quantize", "--keep-below-snr", "-5"])
        .arg(source())
        .arg("-o")
        .arg(&output)
        .output()
        .unwrap();
    assert!(
        saved.status.success(),
        "{}",
        String::from_utf8_lossy(&saved.stderr)
    );
}

/// An F16 weight whose rows reach from 20,000 to F16's largest value (65504) is quantized by
/// every scheme to a grid an F16 loader reads without ±Inf (a scale one F16 step lower for W8A8
/// and FP8, coarser for a group whose extreme would round past 65504), with every value within
/// half a step and the save's figures finite and `stui diff`'s.
#[test]
fn f16_weights_at_f16s_largest_value_load_finite() {
    let dir = tempfile::tempdir().unwrap();
    let (rows, columns) = (256usize, 512usize);
    let values: Vec<f32> = (0..rows * columns)
        .map(|i| {
            let (row, column) = (i / columns, i % columns);
            let reach = 20_000.0 + 45_504.0 * row as f32 / (rows - 1) as f32;
            let unit = ((i * 7919) % 2001) as f32 / 1000.0 - 1.0;
            match column {
                0 => reach,
                1 => -reach,
                _ => unit * reach,
            }
        })
        .collect();
    let data: Vec<u8> = values
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F16, vec![rows, columns], &data)
            .unwrap();
    let source = dir.path().join("big.safetensors");
    std::fs::write(
        &source,
        safetensors::serialize([("big.weight", view)], None).unwrap(),
    )
    .unwrap();
    let source = source.to_str().unwrap();
    for scheme in Scheme::ALL {
        let output = dir.path().join(format!("{scheme}.safetensors"));
        let output = output.to_str().unwrap();
        let name = scheme.to_string();
        let summary = crate::support::stui_json(
            dir.path(),
            &["quantize", source, "-o", output, "--scheme", &name, "--yes"],
        );
        assert_eq!(summary["verified"], true, "{scheme}");
        let weight = &summary["quantized"][0];
        let snr = weight["snr_db"].as_f64();
        assert!(snr.is_some_and(f64::is_finite), "{scheme}: {weight}");
        assert!(
            weight["max_error_in_scales"].as_f64().unwrap() <= 0.5,
            "{scheme}"
        );
        let diff = crate::support::stui_json(dir.path(), &["diff", source, output]);
        let change = &diff["tensors"][0]["change"];
        assert_eq!(change["nonfinite_mismatches"], 0, "{scheme}: {change}");
        assert!(
            (change["snr_db"].as_f64().unwrap() - snr.unwrap()).abs() < 1e-4,
            "{scheme}"
        );
    }
}
