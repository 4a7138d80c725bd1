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
