//! The explorer in a real terminal (tmux): it opens, scans, marks the NaN layer, `n` lands on
//! it, `q` leaves, and the shell gets its terminal back as it was.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Numbers the sessions of this process, which run side by side.
static SESSIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

struct Tmux {
    session: String,
}

impl Tmux {
    fn start(width: u16, height: u16) -> Option<Tmux> {
        if Command::new("tmux").arg("-V").output().is_err() {
            assert!(
                std::env::var_os("CI").is_none(),
                "tmux is missing; .ci/run installs it"
            );
            eprintln!("tmux is not installed here: the real-terminal test cannot run");
            return None;
        }
        let number = SESSIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let session = format!("stui-test-{}-{number}", std::process::id());
        let start = || {
            Command::new("tmux")
                .args([
                    "new-session",
                    "-d",
                    "-s",
                    &session,
                    "-x",
                    &width.to_string(),
                    "-y",
                    &height.to_string(),
                ])
                .args([
                    "env",
                    "PS1=$ ",
                    "TERM=xterm-256color",
                    "bash",
                    "--norc",
                    "--noprofile",
                ])
                .status()
                .unwrap()
                .success()
        };
        // Tests start sessions side by side; one may find the tmux server of another starting
        // up or shutting down, and fail. It succeeds when tried again.
        let started = (0..5).any(|attempt| {
            std::thread::sleep(Duration::from_millis(200 * attempt));
            start()
        });
        assert!(started, "tmux new-session failed five times");
        Some(Tmux { session })
    }

    fn send(&self, keys: &[&str]) {
        let status = Command::new("tmux")
            .args(["send-keys", "-t", &self.session])
            .args(keys)
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn screen(&self) -> String {
        let output = Command::new("tmux")
            .args(["capture-pane", "-p", "-t", &self.session])
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Waits until the screen satisfies `test`, and returns it.
    fn wait_for(&self, what: &str, test: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let screen = self.screen();
            if test(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.session])
            .status();
    }
}

#[test]
fn the_explorer_in_a_real_terminal() {
    let Some(tmux) = Tmux::start(80, 24) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let before = dir.path().join("before");
    let after = dir.path().join("after");
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo.safetensors");
    tmux.send(&[&format!("stty -g > {}", before.display()), "Enter"]);
    tmux.wait_for("the shell", |_| before.exists());
    tmux.send(&[
        &format!("{} {}", env!("CARGO_BIN_EXE_stui"), demo.display()),
        "Enter",
    ]);
    let screen = tmux.wait_for("the scan to finish", |s| s.contains("scan done"));
    assert!(
        screen.lines().any(|l| l.contains("✖1 model")),
        "the NaN mark climbs to the top:\n{screen}"
    );
    tmux.send(&["n"]);
    let screen = tmux.wait_for("the NaN tensor", |s| {
        s.contains("NaN 3") || s.contains("✖1 weight")
    });
    assert!(
        screen.contains("model.layers.2.mlp.down_proj"),
        "n selects the NaN tensor:\n{screen}"
    );
    tmux.send(&["q"]);
    tmux.wait_for("the shell prompt", |s| {
        !s.contains("scan done") && s.contains("$ ")
    });
    tmux.send(&[&format!("stty -g > {}", after.display()), "Enter"]);
    tmux.wait_for("the terminal settings", |_| {
        after.exists() && std::fs::metadata(&after).is_ok_and(|m| m.len() > 0)
    });
    assert_eq!(
        std::fs::read_to_string(&before).unwrap(),
        std::fs::read_to_string(&after).unwrap()
    );
}

#[test]
fn sigterm_and_sighup_give_the_terminal_back() {
    for signal in ["TERM", "HUP"] {
        let Some(tmux) = Tmux::start(80, 24) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        // A copy under a unique path, so that this process alone matches it.
        let model = dir.path().join(format!("signal-{signal}.safetensors"));
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo.safetensors"),
            &model,
        )
        .unwrap();
        let (before, after) = (dir.path().join("before"), dir.path().join("after"));
        tmux.send(&[&format!("stty -g > {}", before.display()), "Enter"]);
        tmux.wait_for("the shell", |_| before.exists());
        tmux.send(&[
            &format!("{} {}", env!("CARGO_BIN_EXE_stui"), model.display()),
            "Enter",
        ]);
        tmux.wait_for("the explorer", |s| s.contains("scan done"));
        let status = Command::new("pkill")
            .args([&format!("-{signal}"), "-f", &model.display().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "the explorer was found and signalled");
        tmux.wait_for("the shell prompt", |s| {
            !s.contains("scan done") && s.contains("$ ")
        });
        tmux.send(&[&format!("stty -g > {}", after.display()), "Enter"]);
        tmux.wait_for("the terminal settings", |_| {
            std::fs::metadata(&after).is_ok_and(|m| m.len() > 0)
        });
        assert_eq!(
            std::fs::read_to_string(&before).unwrap(),
            std::fs::read_to_string(&after).unwrap(),
            "SIG{signal}"
        );
    }
}

/// The terminal settings of the shell in `tmux`, as `stty -g` prints them.
fn terminal_settings(tmux: &Tmux, dir: &Path, label: &str) -> String {
    let file = dir.join(label);
    tmux.send(&[&format!("stty -g > {}", file.display()), "Enter"]);
    tmux.wait_for("the terminal settings", |_| {
        std::fs::metadata(&file).is_ok_and(|m| m.len() > 0)
    });
    std::fs::read_to_string(&file).unwrap()
}

#[test]
fn the_layer_map_in_a_real_terminal_and_enter_lands_on_the_tensor() {
    let Some(tmux) = Tmux::start(80, 24) else {
        return;
    };
    explore_demo(&tmux, "");
    tmux.wait_for("the scan to finish", |s| s.contains("scan done"));
    tmux.send(&["M"]);
    let screen = tmux.wait_for("the layer map", |s| s.contains("layer map · std"));
    assert!(
        screen.contains("mlp.down_proj.weight") && screen.contains("0123"),
        "kinds down, layers across:\n{screen}"
    );
    tmux.send(&["j", "l", "l"]);
    let screen = tmux.wait_for("the cursor on layer 2's down_proj", |s| {
        s.contains("layer 2 · model.layers.2.mlp.down_proj.weight")
    });
    assert!(screen.contains("NaN/Inf"), "{screen}");
    tmux.send(&["Enter"]);
    // Waited for whole: a screen caught mid-redraw can show the tree without the tensor yet.
    tmux.wait_for(
        "the tree on the tensor, its statistics shown (NaN 3)",
        |s| !s.contains("layer map ·") && s.contains("down_proj.weight") && s.contains("NaN 3"),
    );
    tmux.send(&["q"]);
    tmux.wait_for("the shell prompt", |s| {
        !s.contains("scan done") && s.contains("$ ")
    });
}

/// Runs the explorer on the demo in `tmux`'s shell, after `prefix` (a command and variables).
fn explore_demo(tmux: &Tmux, prefix: &str) {
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo.safetensors");
    let stui = env!("CARGO_BIN_EXE_stui");
    tmux.send(&[&format!("{prefix} {stui} {}", demo.display()), "Enter"]);
}

#[test]
fn a_panic_in_the_explorer_gives_the_terminal_back_and_is_printed_after_it() {
    let Some(tmux) = Tmux::start(80, 24) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let before = terminal_settings(&tmux, dir.path(), "before");
    explore_demo(&tmux, "clear; RUST_BACKTRACE=0 STUI_FAULT=draw");
    // Printed on the main screen: had it gone to the explorer's screen, it would have left with it.
    tmux.wait_for("the panic message and the prompt", |s| {
        s.contains("fault injected at `draw`") && s.trim_end().ends_with('$')
    });
    assert_eq!(before, terminal_settings(&tmux, dir.path(), "after"));
}

#[test]
fn a_panic_in_a_scan_worker_is_a_finding_and_the_explorer_goes_on() {
    let Some(tmux) = Tmux::start(120, 40) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let before = terminal_settings(&tmux, dir.path(), "before");
    explore_demo(&tmux, "STUI_FAULT=scan");
    let screen = tmux.wait_for("the failed scans among the findings", |s| {
        s.contains("scan-failed") || s.contains("internal error")
    });
    assert!(
        !screen.contains("panicked at"),
        "no panic message over the screen:\n{screen}"
    );
    tmux.send(&["q"]);
    tmux.wait_for("the shell prompt", |s| s.trim_end().ends_with('$'));
    assert_eq!(before, terminal_settings(&tmux, dir.path(), "after"));
}

#[test]
fn with_stdout_redirected_the_report_goes_to_the_file_and_tui_draws_on_the_terminal() {
    let Some(tmux) = Tmux::start(80, 24) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let before = terminal_settings(&tmux, dir.path(), "before");
    let stui = env!("CARGO_BIN_EXE_stui");
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo.safetensors");
    let (printed, drawn) = (dir.path().join("printed.txt"), dir.path().join("drawn.txt"));
    tmux.send(&[
        &format!("clear; {stui} {} > {}", demo.display(), printed.display()),
        "Enter",
    ]);
    tmux.wait_for("the note on stderr", |s| {
        s.contains("--tui opens the explorer")
    });
    let text = std::fs::read_to_string(&printed).unwrap();
    assert!(text.starts_with("file "), "{text}");
    assert!(!text.contains('\u{1b}'), "{text:?}");
    tmux.send(&[
        &format!(
            "clear; {stui} --tui {} > {}",
            demo.display(),
            drawn.display()
        ),
        "Enter",
    ]);
    tmux.wait_for("the explorer", |s| s.contains("scan done"));
    tmux.send(&["q"]);
    tmux.wait_for("the shell prompt", |s| {
        !s.contains("scan done") && s.trim_end().ends_with('$')
    });
    assert_eq!(
        std::fs::read(&drawn).unwrap(),
        b"",
        "nothing but the report goes to stdout"
    );
    assert_eq!(before, terminal_settings(&tmux, dir.path(), "after"));
}

/// Starts the explorer on `repo` of `hub`, with no proxy or token from this environment and the
/// caches in `dir`.
fn explore_from_the_hub(tmux: &Tmux, hub: &crate::fake_hub::FakeHub, repo: &str, dir: &Path) {
    tmux.send(&[
        &format!(
            "env -u HTTP_PROXY -u HTTPS_PROXY -u ALL_PROXY -u http_proxy -u https_proxy \
             -u all_proxy -u HF_TOKEN HF_ENDPOINT={} HF_HUB_CACHE={} STUI_CACHE_DIR={} {} hf://{repo}",
            hub.endpoint(),
            dir.join("hf").display(),
            dir.join("stui").display(),
            env!("CARGO_BIN_EXE_stui")
        ),
        "Enter",
    ]);
}

#[test]
fn the_explorer_on_a_model_read_from_the_hub() {
    let Some(tmux) = Tmux::start(100, 30) else {
        return;
    };
    let hub = crate::fake_hub::FakeHub::start();
    let demo = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo.safetensors"))
        .unwrap();
    hub.add_repo(
        "org/demo",
        "abcdefabcdefabcdefabcdefabcdefabcdefabcd",
        &[("model.safetensors", demo)],
    );
    let dir = tempfile::tempdir().unwrap();
    explore_from_the_hub(&tmux, &hub, "org/demo", dir.path());
    let screen = tmux.wait_for("the tree", |s| s.contains("lm_head.weight"));
    assert!(screen.contains("hf://org/demo@abcdef"), "{screen}");
    // The selected tensor's statistics, fetched by one Range request for its bytes.
    tmux.wait_for("the selected tensor's statistics", |s| s.contains("absmax"));
    let log = hub.take_log();
    let reads: Vec<_> = log.iter().filter(|l| l.contains("/cdn/")).collect();
    assert_eq!(reads.len(), 2, "the header, then the tensor: {log:#?}");
    assert!(
        !tmux.screen().contains("scanning"),
        "nothing else is read: the background scan does not run on a remote model"
    );
    // Nothing being downloaded, Esc quits.
    tmux.send(&["Escape"]);
    tmux.wait_for("the shell prompt", |s| !s.contains("lm_head.weight"));
}

/// An FP8 weight of 48 MiB on a Hub that answers each request for data after 1.5 s: Esc while
/// its members download stops them between two requests, as it stops a plain tensor's; without
/// it, its scales and four 12 MiB pieces of codes would all be asked for.
#[test]
fn esc_stops_a_quantized_weights_download_between_two_requests() {
    let Some(tmux) = Tmux::start(100, 30) else {
        return;
    };
    let (rows, columns) = (4096usize, 12288usize);
    let codes = vec![0x38u8; rows * columns];
    let scales: Vec<u8> = (0..rows / 128 * columns / 128)
        .flat_map(|_| 0.01f32.to_le_bytes())
        .collect();
    let weight = "model.layers.0.mlp.down_proj.weight";
    let views = [
        (
            weight.to_owned(),
            safetensors::Dtype::F8_E4M3,
            vec![rows, columns],
            &codes,
        ),
        (
            format!("{weight}_scale_inv"),
            safetensors::Dtype::F32,
            vec![rows / 128, columns / 128],
            &scales,
        ),
    ]
    .map(|(name, dtype, shape, bytes)| {
        let view = safetensors::tensor::TensorView::new(dtype, shape, bytes).unwrap();
        (name, view)
    });
    let file = safetensors::serialize(views, None).unwrap();
    let config = br#"{"model_type":"llama","quantization_config":{"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic","weight_block_size":[128,128]}}"#;
    let hub = crate::fake_hub::FakeHub::start();
    hub.add_repo(
        "org/fp8",
        "abcdefabcdefabcdefabcdefabcdefabcdefabcd",
        &[
            ("model.safetensors", file),
            ("config.json", config.to_vec()),
        ],
    );
    hub.set_fault(Some(crate::fake_hub::Fault::SlowData(
        Duration::from_millis(1500),
    )));
    let dir = tempfile::tempdir().unwrap();
    explore_from_the_hub(&tmux, &hub, "org/fp8", dir.path());
    tmux.wait_for("the weight", |s| s.contains("fp8 e4m3 block 128x128"));
    let data_reads = |log: &[String]| {
        log.iter()
            .filter(|l| l.contains("/cdn/") && !l.contains("bytes=0-"))
            .count()
    };
    let mut log = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while data_reads(&log) == 0 {
        assert!(Instant::now() < deadline, "no download began: {log:#?}");
        std::thread::sleep(Duration::from_millis(20));
        log.extend(hub.take_log());
    }
    tmux.send(&["Escape"]);
    // The whole download would end in 7.5 s: wait for longer.
    std::thread::sleep(Duration::from_secs(9));
    log.extend(hub.take_log());
    assert!(data_reads(&log) <= 2, "{log:#?}");
    tmux.send(&["q"]);
    tmux.wait_for("the shell prompt", |s| !s.contains("fp8 e4m3"));
}

#[test]
fn a_quantized_model_by_its_weights_and_r_lists_the_stored_tensors() {
    let Some(tmux) = Tmux::start(120, 40) else {
        return;
    };
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant/ct-w4a16");
    let stui = env!("CARGO_BIN_EXE_stui");
    tmux.send(&[&format!("{stui} {}", model.display()), "Enter"]);
    let screen = tmux.wait_for("the scan to finish", |s| {
        s.contains("scan done: 12 tensors")
    });
    assert!(screen.contains("int4 g128, compressed-tensors"), "{screen}");
    assert!(!screen.contains("weight_packed"), "{screen}");
    tmux.send(&["R"]);
    let screen = tmux.wait_for("the stored tensors", |s| {
        s.contains("compressed-tensors, stored") && s.contains("scan done")
    });
    assert!(screen.contains("26 tensors"), "{screen}");
    // Listed as stored, its codes are still not quantized again.
    tmux.send(&["Q"]);
    tmux.wait_for("the notice that it is quantized", |s| {
        s.contains("already quantized (int4 g128")
    });
    tmux.send(&["e"]);
    tmux.wait_for("the members in the tree", |s| {
        s.contains("weight_packed  I32")
    });
    tmux.send(&["R"]);
    tmux.wait_for("the logical weights again", |s| {
        s.contains("scan done: 12 tensors") && !s.contains("weight_packed")
    });
    tmux.send(&["q"]);
    tmux.wait_for("the shell prompt", |s| {
        !s.contains("scan done") && s.contains("$ ")
    });
}

/// SIGTERM during a save in the explorer stops the save, which removes what it wrote before the
/// process ends: no temporary and no output are left beside the model.
#[test]
fn a_signal_during_a_save_in_the_explorer_leaves_nothing() {
    let Some(tmux) = Tmux::start(80, 24) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("saving.safetensors");
    crate::support::write_model_of_64_mib(&model, 5);
    let others = || -> Vec<String> {
        std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| name != "saving.safetensors")
            .collect()
    };
    tmux.send(&[
        &format!("{} {}", env!("CARGO_BIN_EXE_stui"), model.display()),
        "Enter",
    ]);
    tmux.wait_for("the explorer", |s| s.contains("scan done"));
    tmux.send(&["Q"]);
    tmux.wait_for("the quantize dialog", |s| s.contains("Enter saves"));
    tmux.send(&["Enter"]);
    let started = Instant::now();
    while others().is_empty() && started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        others().iter().any(|name| name.starts_with(".stui-tmp-")),
        "the save began writing: {:?}",
        others()
    );
    let status = Command::new("pkill")
        .args(["-TERM", "-f", &model.display().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "the explorer was found and signalled");
    tmux.wait_for("the shell prompt", |s| {
        !s.contains("quantize") && s.contains("$ ")
    });
    assert_eq!(
        others(),
        Vec::<String>::new(),
        "nothing left beside the model"
    );
}

/// `--variant` in the explorer: the variant's file is the model shown; a variant the folder lacks
/// is an error on the shell's terminal, with nothing drawn.
#[test]
fn the_explorer_opens_the_variant_asked_for() {
    let Some(tmux) = Tmux::start(80, 24) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo.safetensors");
    std::fs::copy(&demo, dir.path().join("model.fp16.safetensors")).unwrap();
    let header = br#"{"only.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let mut default_save = (header.len() as u64).to_le_bytes().to_vec();
    default_save.extend_from_slice(header);
    default_save.extend_from_slice(&[0; 8]);
    std::fs::write(dir.path().join("model.safetensors"), default_save).unwrap();
    let stui = env!("CARGO_BIN_EXE_stui");
    let folder = dir.path().display();
    tmux.send(&[&format!("{stui} --variant fp16 {folder}"), "Enter"]);
    let screen = tmux.wait_for("the variant's tree", |s| s.contains("lm_head.weight"));
    assert!(
        screen.contains("model.fp16.safet") && !screen.contains("only.weight"),
        "{screen}"
    );
    tmux.send(&["q"]);
    tmux.wait_for("the shell prompt", |s| !s.contains("lm_head.weight"));
    tmux.send(&[&format!("clear; {stui} --variant bf16 {folder}"), "Enter"]);
    // The message wraps at the terminal's width.
    let unwrapped = |screen: &str| screen.replace('\n', "");
    let screen = tmux.wait_for("the error", |s| unwrapped(s).contains("no `bf16` variant"));
    assert!(
        unwrapped(&screen).contains("its variants: `fp16`"),
        "{screen}"
    );
}
