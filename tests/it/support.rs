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

/// The Python with numpy and safetensors that `.ci/run` sets up (`STUI_PYTHON`); `None`, said on
/// standard error, outside CI where none is named (CI must name one).
pub fn interop_python() -> Option<std::ffi::OsString> {
    let python = std::env::var_os("STUI_PYTHON");
    if python.is_none() {
        assert!(std::env::var_os("CI").is_none(), "CI must set STUI_PYTHON");
        eprintln!("STUI_PYTHON is not set: the Python interop test cannot run here");
    }
    python
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

/// Writes to `path` a model of 64 MiB, sixteen F32 weights of 1024 x 1024 drawn with `seed`: a
/// save of it lasts long enough, even in a debug build, to be stopped part of the way.
pub fn write_model_of_64_mib(path: &Path, seed: u64) {
    let mut model = SyntheticModel::new(seed);
    for layer in 0..16 {
        model = model.tensor(
            &format!("model.layers.{layer}.mlp.down_proj.weight"),
            Dtype::F32,
            &[1024, 1024],
            Fill::Normal {
                mean: 0.0,
                std: 0.02,
            },
        );
    }
    model.write(path).unwrap();
}

/// The names in `folder` that a save's temporary files take; none when there is no folder.
pub fn temporaries_in(folder: &Path) -> Vec<String> {
    std::fs::read_dir(folder).map_or_else(
        |_| Vec::new(),
        |entries| {
            entries
                .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
                .filter(|name| name.starts_with(".stui-tmp-"))
                .collect()
        },
    )
}

/// Writes `bytes` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// A Python check of a quantized file against its source, with `safetensors` and numpy:
/// `python -c SCRIPT SOURCE OUTPUT`.
pub fn python_check_script() -> &'static str {
    r#"
import sys
import numpy as np
from safetensors.numpy import load_file
source, output = load_file(sys.argv[1]), load_file(sys.argv[2])
checked = 0
for name, q in output.items():
    if name.endswith("_scale") and name[: -len("_scale")] in output:
        continue
    if q.dtype != np.int8:
        assert np.array_equal(q, source[name]), name
        continue
    scale = output[name + "_scale"].astype(np.float64)
    x = source[name].astype(np.float64)
    error = np.abs(x - q.astype(np.float64) * scale)
    assert np.all(error <= scale * 0.5 * (1 + 1e-9)), name
    checked += 1
print(f"checked {checked} quantized tensors")
"#
}

/// How a run of a program ended.
#[derive(Debug)]
pub struct Run {
    /// The exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl Run {
    /// True when nothing says the program panicked.
    pub fn no_panic(&self) -> bool {
        !self.stderr.contains("panicked") && !self.stderr.contains("stack backtrace")
    }
}

/// Runs `command` with standard input empty and standard output and error piped, and fails the
/// test if it has not ended `limit` after it started (killing it), so that a hang fails at once.
pub fn run_within(mut command: std::process::Command, limit: std::time::Duration) -> Run {
    use std::io::Read;
    use std::process::Stdio;
    let started = std::time::Instant::now();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut stdout, mut stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        stdout.read_to_end(&mut bytes).map(|_| bytes)
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        stderr.read_to_string(&mut text).map(|_| text)
    });
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{command:?} was still running after {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    Run {
        code: status.code(),
        stdout: out.join().unwrap().unwrap(),
        stderr: err.join().unwrap().unwrap(),
    }
}

/// A command that runs the stui binary in `dir` with `args`.
pub fn stui<S: AsRef<std::ffi::OsStr>>(
    dir: &Path,
    args: impl IntoIterator<Item = S>,
) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_stui"));
    command
        .args(args)
        .current_dir(dir)
        .env("RUST_BACKTRACE", "1");
    command
}

/// Makes a named pipe at `path` (with the `mkfifo` every Unix has).
pub fn make_fifo(path: &Path) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(made.success(), "mkfifo {}", path.display());
}

/// `command` run in a session of its own (`setsid`), where no terminal can be reached: no
/// controlling terminal, and the standard streams that [`run_within`] gives. `None` where
/// `setsid` is missing.
pub fn without_terminal(command: &std::process::Command) -> Option<std::process::Command> {
    std::process::Command::new("setsid")
        .arg("--version")
        .output()
        .ok()?;
    let mut detached = std::process::Command::new("setsid");
    detached
        .arg("-w")
        .arg(command.get_program())
        .args(command.get_args())
        .envs(
            command
                .get_envs()
                .filter_map(|(key, value)| Some((key, value?))),
        );
    if let Some(dir) = command.get_current_dir() {
        detached.current_dir(dir);
    }
    Some(detached)
}

/// A 61-layer model of small F32 tensors with four experts a layer, and planted faults: layer
/// 30's `mlp.down_proj.weight` has ten times the std of the others, expert 2 of layer 40 is all
/// zeros, and layer 50's `self_attn.q_proj.weight` holds a NaN.
pub fn planted_layers() -> SyntheticModel {
    let weight = |std| Fill::Normal { mean: 0.0, std };
    let mut model = SyntheticModel::new(61).tensor(
        "model.embed_tokens.weight",
        Dtype::F32,
        &[64, 16],
        weight(0.02),
    );
    for layer in 0..61 {
        let p = format!("model.layers.{layer}.");
        model = model
            .tensor(
                &format!("{p}input_layernorm.weight"),
                Dtype::F32,
                &[16],
                Fill::Normal {
                    mean: 1.0,
                    std: 0.02,
                },
            )
            .tensor(
                &format!("{p}self_attn.q_proj.weight"),
                Dtype::F32,
                &[16, 16],
                weight(0.02),
            )
            .tensor(
                &format!("{p}mlp.down_proj.weight"),
                Dtype::F32,
                &[16, 32],
                weight(if layer == 30 { 0.2 } else { 0.02 }),
            );
        for expert in 0..4 {
            let fill = if layer == 40 && expert == 2 {
                Fill::Zeros
            } else {
                weight(0.02)
            };
            model = model.tensor(
                &format!("{p}mlp.experts.{expert}.up_proj.weight"),
                Dtype::F32,
                &[8, 16],
                fill,
            );
        }
    }
    model
        .plant("model.layers.50.self_attn.q_proj.weight", 3, f64::NAN)
        .tensor(
            "model.norm.weight",
            Dtype::F32,
            &[16],
            Fill::Normal {
                mean: 1.0,
                std: 0.02,
            },
        )
        .tensor("lm_head.weight", Dtype::F32, &[64, 16], weight(0.02))
}

/// The checkpoints the real producers wrote, one folder per family (`tests/fixtures/arch`).
pub fn arch_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/arch")
}

/// The families of [`arch_fixtures`], sorted.
pub fn arch_families() -> Vec<String> {
    let mut families: Vec<String> = std::fs::read_dir(arch_fixtures())
        .unwrap()
        .map(|entry| entry.unwrap())
        .filter(|entry| entry.path().join("producer.json").is_file())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    families.sort();
    families
}

/// A header as `<file>.safetensors.header` keeps it: the 8-byte length and the JSON.
pub fn read_header(path: &Path) -> serde_json::Map<String, serde_json::Value> {
    let bytes = std::fs::read(path).unwrap();
    let len = usize::try_from(u64::from_le_bytes(bytes[..8].try_into().unwrap())).unwrap();
    serde_json::from_slice(&bytes[8..8 + len]).unwrap()
}

/// Writes a safetensors file of `header` with zeroed data (a sparse file: the data takes no
/// room). The header is written as given, its entries in the map's order.
pub fn write_zeroed(path: &Path, header: &serde_json::Map<String, serde_json::Value>) {
    // Back to back in their first order, so that a removed tensor leaves no hole.
    let mut header = header.clone();
    let mut order: Vec<(u64, String)> = header
        .iter()
        .filter(|(name, _)| *name != "__metadata__")
        .map(|(name, entry)| (entry["data_offsets"][0].as_u64().unwrap(), name.clone()))
        .collect();
    order.sort();
    let mut offset = 0;
    for (_, name) in order {
        let offsets = &mut header[&name]["data_offsets"];
        let len = offsets[1].as_u64().unwrap() - offsets[0].as_u64().unwrap();
        *offsets = serde_json::json!([offset, offset + len]);
        offset += len;
    }
    let header = &header;
    let text = serde_json::to_string(header).unwrap();
    let padded = text.len().div_ceil(8) * 8;
    let mut bytes = (padded as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(text.as_bytes());
    bytes.resize(8 + padded, b' ');
    let end = header
        .iter()
        .filter(|(name, _)| *name != "__metadata__")
        .filter_map(|(_, entry)| entry["data_offsets"][1].as_u64())
        .max()
        .unwrap_or(0);
    let file = std::fs::File::create(path).unwrap();
    std::io::Write::write_all(&mut &file, &bytes).unwrap();
    file.set_len(8 + padded as u64 + end).unwrap();
}

/// A family's checkpoint rebuilt in a temporary folder: every `.safetensors.header` as a file
/// of zeroed data with the header exactly as written, every JSON file copied. `change` may
/// alter each header (by file name) and the config first.
pub fn rebuild_fixture(
    family: &str,
    change: &mut dyn FnMut(&str, &mut serde_json::Map<String, serde_json::Value>),
) -> tempfile::TempDir {
    rebuild_folder(&arch_fixtures().join(family), change)
}

/// [`rebuild_fixture`] of any folder of headers, its subfolders rebuilt alike.
pub fn rebuild_folder(
    fixture: &Path,
    change: &mut dyn FnMut(&str, &mut serde_json::Map<String, serde_json::Value>),
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    rebuild_into(fixture, dir.path(), change);
    dir
}

fn rebuild_into(
    fixture: &Path,
    into: &Path,
    change: &mut dyn FnMut(&str, &mut serde_json::Map<String, serde_json::Value>),
) {
    for entry in std::fs::read_dir(fixture).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            std::fs::create_dir(into.join(&name)).unwrap();
            rebuild_into(&path, &into.join(&name), change);
        } else if let Some(file) = name.strip_suffix(".header") {
            let bytes = std::fs::read(&path).unwrap();
            let mut header = read_header(&path);
            let original = header.clone();
            change(file, &mut header);
            if header == original {
                // Unchanged: the producer's exact bytes (spacing, order), data zeroed.
                let out = into.join(file);
                std::fs::write(&out, &bytes).unwrap();
                let end = header
                    .iter()
                    .filter(|(name, _)| *name != "__metadata__")
                    .filter_map(|(_, entry)| entry["data_offsets"][1].as_u64())
                    .max()
                    .unwrap_or(0);
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&out)
                    .unwrap()
                    .set_len(bytes.len() as u64 + end)
                    .unwrap();
            } else {
                write_zeroed(&into.join(file), &header);
            }
        } else if name == "config.json" {
            let mut config: serde_json::Map<String, serde_json::Value> =
                serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
            change(&name, &mut config);
            std::fs::write(
                into.join(&name),
                serde_json::to_string_pretty(&config).unwrap(),
            )
            .unwrap();
        } else if path.extension().is_some_and(|e| e == "json") && name != "producer.json" {
            std::fs::copy(&path, into.join(&name)).unwrap();
        }
    }
}

/// Every tensor of a file as `f32` values (BF16 widened, F32 as is), by name.
pub fn float_tensors(path: &Path) -> Vec<(String, Vec<f32>)> {
    let bytes = std::fs::read(path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    file.tensors()
        .into_iter()
        .filter_map(|(name, view)| {
            let data = view.data();
            let values: Vec<f32> = match view.dtype() {
                safetensors::Dtype::BF16 => data
                    .chunks_exact(2)
                    .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
                    .collect(),
                safetensors::Dtype::F32 => data
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
                _ => return None,
            };
            Some((name, values))
        })
        .collect()
}

/// `stui ARGS --json` in `dir`, which must succeed: its document.
pub fn stui_json(dir: &Path, args: &[&str]) -> serde_json::Value {
    let run = run_within(
        stui(dir, args.iter().chain(&["--json"])),
        std::time::Duration::from_secs(120),
    );
    assert!(run.no_panic(), "{args:?}: {}", run.stderr);
    assert!(matches!(run.code, Some(0 | 1)), "{args:?}: {}", run.stderr);
    serde_json::from_slice(&run.stdout).unwrap()
}

/// The diff of `model` against the model at `other`, both as stored, as the explorer's
/// `--diff` computes it.
pub fn stored_diff(model: &stui::format::Model, other: &Path) -> stui::diff::ModelDiff {
    let other = stui::format::Model::open(other).unwrap();
    let progress = std::sync::atomic::AtomicU64::new(0);
    stui::diff::diff(
        &stui::diff::Side::stored(model),
        &stui::diff::Side::stored(&other),
        &progress,
    )
}
