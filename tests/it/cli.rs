//! The command line as users and scripts see it: output snapshots and exit codes.

use crate::support;
use std::path::Path;
use std::process::Command;
use stui::demo::Fill;
use stui::format::Dtype;

/// Runs stui in `dir` and renders what it did: exit code, stdout and stderr.
pub fn run(dir: &Path, args: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_stui"))
        .args(args)
        .current_dir(dir)
        .env_remove("NO_COLOR")
        .output()
        .unwrap();
    let code = output.status.code().unwrap_or(-1);
    let mut text = format!("$ stui {}\nexit code: {code}\n", args.join(" "));
    text.push_str(&String::from_utf8_lossy(&output.stdout));
    if !output.stderr.is_empty() {
        text.push_str("--- stderr\n");
        text.push_str(&String::from_utf8_lossy(&output.stderr));
    }
    (code, text)
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A folder of broken files, each named for what is wrong with it.
fn broken_files() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let demo = std::fs::read(support::demo_path()).unwrap();
    support::write(
        dir.path(),
        "truncated.safetensors",
        &demo[..demo.len() - 100_000],
    );
    let mut trailing = support::small_model().to_bytes().unwrap();
    trailing.extend_from_slice(b"appended");
    support::write(dir.path(), "trailing.safetensors", &trailing);
    support::write(
        dir.path(),
        "pointer.safetensors",
        b"version https://git-lfs.github.com/spec/v1\noid sha256:4d7a2146\nsize 4943162336\n",
    );
    support::write(
        dir.path(),
        "page.safetensors",
        b"<!DOCTYPE html>\n<html><body>Access denied</body></html>\n",
    );
    support::write(dir.path(), "empty.safetensors", b"");
    support::write(
        dir.path(),
        "hole.safetensors",
        &support::raw_file(
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},"c":{"dtype":"Q4","shape":[2],"data_offsets":[12,13]},"d":{"dtype":"F32","shape":[3],"data_offsets":[13,21]}}"#,
            &[0; 21],
        ),
    );
    support::write(
        dir.path(),
        "hostile.safetensors",
        &support::raw_file(
            r#"{"__metadata__":{"note":"\u001b[2J\u001b]0;pwned\u0007"},"evil\u001b[31m\u202ename":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
            &[0],
        ),
    );
    dir
}

#[test]
fn inspect_the_demo() {
    let (code, text) = run(repo(), &["inspect", "assets/demo.safetensors"]);
    assert_eq!(code, 0);
    insta::assert_snapshot!(text);
}

#[test]
fn stats_of_the_demo() {
    // One thread: findings in the order of the tensors.
    let (code, text) = run(
        repo(),
        &["stats", "--threads", "1", "assets/demo.safetensors"],
    );
    assert_eq!(code, 1, "the demo holds NaN and Inf");
    insta::with_settings!({filters => vec![(r"scanned in [0-9.]+ s", "scanned in [time] s")]}, {
        insta::assert_snapshot!(text);
    });
}

#[test]
fn stats_json_lists_tensors_with_nan_or_inf_first() {
    let (code, text) = run(
        repo(),
        &[
            "stats",
            "--json",
            "--filter",
            "mlp.down_proj",
            "assets/demo.safetensors",
        ],
    );
    assert_eq!(code, 1);
    let json: serde_json::Value =
        serde_json::from_str(text.split_once('\n').unwrap().1.split_once('\n').unwrap().1).unwrap();
    let names: Vec<&str> = json["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [2, 0, 1, 3].map(|layer| format!("model.layers.{layer}.mlp.down_proj.weight"))
    );
    let broken = &json["tensors"][0];
    assert_eq!(
        (broken["nan"].as_u64(), broken["pos_inf"].as_u64()),
        (Some(3), Some(1))
    );
    assert_eq!(broken["histogram"]["counts"].as_array().unwrap().len(), 64);
    assert_eq!(json["summary"]["errors"], 2);
    let codes: Vec<&str> = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["code"].as_str().unwrap())
        .collect();
    assert!(
        codes.contains(&"values-nan") && codes.contains(&"values-inf"),
        "{codes:?}"
    );
}

#[test]
fn inspect_flat_filtered() {
    let (code, text) = run(
        repo(),
        &[
            "inspect",
            "assets/demo.safetensors",
            "--flat",
            "--filter",
            "LAYERS.2.MLP",
        ],
    );
    assert_eq!(code, 0);
    insta::assert_snapshot!(text);
}

#[test]
fn inspect_json_has_the_documented_fields() {
    let (code, text) = run(repo(), &["inspect", "--json", "assets/demo.safetensors"]);
    assert_eq!(code, 0);
    let json: serde_json::Value =
        serde_json::from_str(text.split_once('\n').unwrap().1.split_once('\n').unwrap().1).unwrap();
    for field in [
        "tensors",
        "metadata",
        "parameters",
        "total_bytes",
        "files",
        "valid",
        "dtypes",
    ] {
        assert!(json.get(field).is_some(), "missing {field}");
    }
    let tensors = json["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 39);
    let first = &tensors[0];
    for field in ["name", "dtype", "shape", "data_offsets", "file"] {
        assert!(first.get(field).is_some(), "tensor missing {field}");
    }
    assert_eq!(json["parameters"], 1_250_432);
    assert_eq!(json["architecture"]["family"], "llama");
    assert_eq!(json["architecture"]["layers"], 4);
    assert_eq!(json["metadata"]["format"], "pt");
}

#[test]
fn check_the_demo() {
    let (code, text) = run(repo(), &["check", "assets/demo.safetensors"]);
    assert_eq!(code, 0);
    insta::assert_snapshot!(text);
}

#[test]
fn check_broken_files() {
    let dir = broken_files();
    let mut all = String::new();
    for name in [
        "truncated",
        "trailing",
        "pointer",
        "page",
        "empty",
        "hole",
        "hostile",
    ] {
        let file = format!("{name}.safetensors");
        let (code, text) = run(dir.path(), &["check", &file]);
        let expected = i32::from(name != "hostile");
        assert_eq!(code, expected, "{text}");
        all.push_str(&text);
        all.push('\n');
    }
    insta::assert_snapshot!(all);
}

#[test]
fn check_json_of_a_broken_file() {
    let dir = broken_files();
    let (code, text) = run(dir.path(), &["check", "--json", "hole.safetensors"]);
    assert_eq!(code, 1);
    insta::assert_snapshot!(text);
}

#[test]
fn inspect_lists_what_a_truncated_file_holds() {
    let dir = broken_files();
    let (code, text) = run(dir.path(), &["inspect", "--flat", "truncated.safetensors"]);
    assert_eq!(code, 1);
    assert!(text.contains("NOT VALID"));
    assert!(text.contains("model.layers.3.self_attn.v_proj.weight"));
}

/// A folder is summed up as a model in its files, counted in the singular for one.
#[test]
fn inspect_counts_a_folders_files() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = support::small_model().to_bytes().unwrap();
    for folder in ["one", "two"] {
        std::fs::create_dir(dir.path().join(folder)).unwrap();
    }
    support::write(dir.path(), "one/model.safetensors", &bytes);
    let (code, text) = run(dir.path(), &["inspect", "one"]);
    assert_eq!(code, 0, "{text}");
    let summary = text.lines().nth(2).unwrap();
    assert!(summary.contains(" in 1 file, header "), "{text}");
    support::write(dir.path(), "two/a.safetensors", &bytes);
    let other = stui::demo::SyntheticModel::new(2)
        .tensor("other.weight", Dtype::F32, &[4, 4], Fill::Zeros)
        .to_bytes()
        .unwrap();
    support::write(dir.path(), "two/b.safetensors", &other);
    let (code, text) = run(dir.path(), &["inspect", "two"]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.lines()
            .nth(2)
            .unwrap()
            .contains(" in 2 files, headers "),
        "{text}"
    );
}

/// A model's `config.json` (or a tokenizer's file) given for the model is named for what it is
/// and the folder is offered, exit code 2; a JSON file holding a `weight_map` is read as an
/// index whatever its name, and a malformed index stays a finding.
#[test]
fn a_json_file_beside_a_model_is_not_taken_for_its_index() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("m")).unwrap();
    let bytes = support::small_model().to_bytes().unwrap();
    support::write(dir.path(), "m/model.safetensors", &bytes);
    support::write(
        dir.path(),
        "m/config.json",
        br#"{"model_type": "llama", "quantization_config": {"quant_method": "fp8"}}"#,
    );
    let (code, text) = run(dir.path(), &["check", "m/config.json"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains(
            "m/config.json: not a .safetensors file or a sharded model's index (it holds no \
             `weight_map`): open the folder of the model it belongs to, stui m"
        ),
        "{text}"
    );
    support::write(
        dir.path(),
        "m/weights.json",
        br#"{"weight_map": {"model.layers.0.mlp.weight": "model.safetensors"}}"#,
    );
    let (_, text) = run(dir.path(), &["inspect", "--flat", "m/weights.json"]);
    assert!(text.contains("model.layers.0.mlp.weight"), "{text}");
    support::write(dir.path(), "m/model.safetensors.index.json", b"{}");
    let (code, text) = run(dir.path(), &["check", "m/model.safetensors.index.json"]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("index-invalid"), "{text}");
}

#[test]
fn strict_mode_judges_by_the_reference_verdict_only() {
    let dir = broken_files();
    let (code, _) = run(dir.path(), &["check", "--strict", "hole.safetensors"]);
    assert_eq!(code, 1);
    let (code, _) = run(repo(), &["check", "--strict", "assets/demo.safetensors"]);
    assert_eq!(code, 0);
}

#[test]
fn hostile_names_never_reach_the_terminal_raw() {
    let dir = broken_files();
    for args in [
        &["inspect", "hostile.safetensors"][..],
        &["check", "hostile.safetensors"],
        &["inspect", "--flat", "hostile.safetensors"],
        &["inspect", "--json", "hostile.safetensors"],
        &["check", "--json", "hostile.safetensors"],
    ] {
        let (_, text) = run(dir.path(), args);
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{202e}') && !text.contains('\u{7}'),
            "{text:?}"
        );
        if args == ["inspect", "hostile.safetensors"] {
            assert!(text.contains("\\u{1b}[31m\\u{202e}name"), "{text}");
        }
        if args[1] == "--json" && args[0] == "inspect" {
            assert!(
                text.contains(r"evil\u001b[31m\u202ename"),
                "the exact name, escaped: {text}"
            );
        }
    }
}

#[test]
fn usage_errors_and_missing_files_exit_2() {
    let (code, text) = run(repo(), &["check", "no/such/file.safetensors"]);
    assert_eq!(code, 2);
    assert!(text.contains("no/such/file.safetensors"), "{text}");
    let (code, _) = run(repo(), &["inspect", "--no-such-flag", "x"]);
    assert_eq!(code, 2);
    let (code, _) = run(repo(), &[]);
    assert_eq!(code, 2);
    // A command mistyped is named, rather than taken for the model's path.
    let (code, text) = run(repo(), &["chek", "assets/demo.safetensors"]);
    assert_eq!(code, 2);
    assert!(
        text.contains(
            "`chek` is neither a command nor a file or folder: did you mean `stui check`?"
        ),
        "{text}"
    );
}

#[test]
fn help_explains_the_commands() {
    let (code, text) = run(repo(), &["--help"]);
    assert_eq!(code, 0);
    insta::assert_snapshot!(text);
    let (_, text) = run(repo(), &["check", "--help"]);
    insta::assert_snapshot!("check_help", text);
}

#[test]
fn the_demo_asset_is_what_the_generator_makes() {
    let committed = std::fs::read(support::demo_path()).unwrap();
    let generated = stui::demo::demo_model().to_bytes().unwrap();
    assert!(
        committed == generated,
        "assets/demo.safetensors is stale: run `cargo run --example make_demo`"
    );
    assert!(committed.len() < 4_000_000);
}

#[test]
fn the_readme_documents_every_finding_code() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    for code in stui::finding::Code::ALL {
        assert!(
            readme.contains(&format!("| `{}` |", code.as_str())),
            "README lacks {code}"
        );
    }
}

#[test]
fn hash_matches_sha256sum_and_the_tensor_bytes() {
    use sha2::Digest;
    let (code, text) = run(
        repo(),
        &["hash", "--per-tensor", "--json", "assets/demo.safetensors"],
    );
    assert_eq!(code, 0);
    let json: serde_json::Value =
        serde_json::from_str(text.splitn(3, '\n').nth(2).unwrap()).unwrap();
    let bytes = std::fs::read(support::demo_path()).unwrap();
    let file_digest = format!("{:x}", sha2::Sha256::digest(&bytes));
    assert_eq!(json["files"][0]["sha256"], file_digest.as_str());
    if let Ok(output) = Command::new("sha256sum").arg(support::demo_path()).output() {
        assert!(String::from_utf8_lossy(&output.stdout).starts_with(&file_digest));
    }
    let reference = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for tensor in json["tensors"].as_array().unwrap() {
        let name = tensor["name"].as_str().unwrap();
        let digest = format!(
            "{:x}",
            sha2::Sha256::digest(reference.tensor(name).unwrap().data())
        );
        assert_eq!(tensor["sha256"], digest.as_str(), "{name}");
    }
    let (_, inspect) = run(repo(), &["inspect", "--json", "assets/demo.safetensors"]);
    assert!(inspect.contains(json["structural_id"].as_str().unwrap()));
}

#[test]
fn check_compares_the_tensors_with_the_config_beside_them() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(support::demo_path(), dir.path().join("model.safetensors")).unwrap();
    let config = r#"{"model_type": "llama", "hidden_size": 128, "num_hidden_layers": 6,
        "intermediate_size": 344, "vocab_size": 2048, "num_attention_heads": 4,
        "num_key_value_heads": 2, "tie_word_embeddings": false}"#;
    support::write(dir.path(), "config.json", config.as_bytes());
    let (code, beside) = run(dir.path(), &["check", "model.safetensors"]);
    assert_eq!(code, 0, "a mismatch is a warning: {beside}");
    insta::assert_snapshot!(beside);
    support::write(dir.path(), "other.json", b"{\"num_hidden_layers\": 4}");
    let (_, explicit) = run(
        dir.path(),
        &["check", "model.safetensors", "--config", "other.json"],
    );
    assert!(!explicit.contains("config-mismatch"), "{explicit}");
    support::write(dir.path(), "config.json", b"{not json");
    let (_, broken) = run(dir.path(), &["check", "model.safetensors"]);
    assert!(broken.contains("config-invalid"), "{broken}");
}

#[test]
fn diff_lists_every_change_and_measures_it() {
    let dir = tempfile::tempdir().unwrap();
    let a = support::small_model();
    a.write(&dir.path().join("a.safetensors")).unwrap();
    // b: one tensor converted to BF16, one value changed, one tensor removed and one added.
    let mut b = a.clone();
    b.tensors[1].spec.dtype = Dtype::Bf16;
    b.tensors.pop();
    b.tensor("lm_head.weight", Dtype::F32, &[2, 4], Fill::Zeros)
        .plant("model.layers.1.mlp.weight", 3, 1.5)
        .metadata("note", "fine-tuned")
        .write(&dir.path().join("b.safetensors"))
        .unwrap();
    let (code, same) = run(dir.path(), &["diff", "a.safetensors", "a.safetensors"]);
    assert_eq!(code, 0, "{same}");
    let (code, text) = run(dir.path(), &["diff", "a.safetensors", "b.safetensors"]);
    assert_eq!(code, 1);
    insta::assert_snapshot!(text);
    let (_, json) = run(
        dir.path(),
        &["diff", "--json", "a.safetensors", "b.safetensors"],
    );
    let json: serde_json::Value =
        serde_json::from_str(json.splitn(3, '\n').nth(2).unwrap()).unwrap();
    assert_eq!(json["identical"], false);
    let status = |name: &str| {
        json["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(status("model.layers.0.mlp.weight")["status"], "same");
    assert_eq!(status("model.layers.1.attn.weight")["status"], "removed");
    assert_eq!(status("lm_head.weight")["status"], "added");
    let planted = status("model.layers.1.mlp.weight");
    assert_eq!(planted["change"]["changed_values"], 1);
    assert!(planted["change"]["max_abs_diff"].as_f64().unwrap() > 1.4);
    let converted = status("model.layers.0.attn.weight");
    assert_eq!(converted["dtype"], serde_json::json!(["F32", "BF16"]));
    assert!(converted["change"]["cosine"].as_f64().unwrap() > 0.999);
    assert_eq!(json["metadata"][0]["key"], "note");
}

#[test]
fn diff_compares_tensors_of_unknown_dtype_by_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let header = r#"{"a":{"dtype":"Q9","shape":[4],"data_offsets":[0,4]}}"#;
    support::write(
        dir.path(),
        "a.safetensors",
        &support::raw_file(header, &[1, 2, 3, 4]),
    );
    support::write(
        dir.path(),
        "b.safetensors",
        &support::raw_file(header, &[1, 2, 3, 4]),
    );
    support::write(
        dir.path(),
        "c.safetensors",
        &support::raw_file(header, &[1, 2, 3, 5]),
    );
    let (same, text) = run(dir.path(), &["diff", "a.safetensors", "b.safetensors"]);
    assert_eq!(same, 0, "{text}");
    let (differ, text) = run(dir.path(), &["diff", "a.safetensors", "c.safetensors"]);
    assert_eq!(differ, 1, "{text}");
    assert!(text.contains("changed  a\n"), "{text}");
}

/// Numbered siblings that each hold one tensor (`blocks.0.scale`, `blocks.1.scale`, …) list as
/// one row when their shapes match, and apart where they do not.
#[test]
fn inspect_lists_a_run_of_single_tensor_layers_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = stui::demo::SyntheticModel::new(1);
    for layer in 0..4 {
        let shape: &[u64] = if layer == 3 { &[8] } else { &[4] };
        model = model.tensor(
            &format!("blocks.{layer}.scale"),
            Dtype::F32,
            shape,
            Fill::Zeros,
        );
    }
    model = model.tensor("head.weight", Dtype::F32, &[4, 4], Fill::Zeros);
    model.write(&dir.path().join("model.safetensors")).unwrap();
    let (code, text) = run(dir.path(), &["inspect", "model.safetensors"]);
    assert_eq!(code, 0, "{text}");
    let rows: Vec<&str> = text
        .lines()
        .skip_while(|line| !line.starts_with("NAME"))
        .skip(1)
        .map(|line| line.split("  ").next().unwrap_or_default())
        .collect();
    assert_eq!(
        rows,
        ["blocks", "├─ 0-2.scale ×3", "└─ 3.scale", "head.weight"],
        "{text}"
    );
}

/// The explorer's options are in the explorer's help, and in no command's.
#[test]
fn each_option_is_in_the_help_of_the_commands_it_applies_to() {
    use clap::CommandFactory;
    let explorer_only = ["--tui", "--diff", "--color", "--log", "STUI_LOG"];
    let (_, help) = run(repo(), &["--help"]);
    for option in explorer_only {
        assert!(help.contains(option), "stui --help lacks {option}");
    }
    for command in stui::cli::Cli::command().get_subcommands() {
        let name = command.get_name();
        let (code, help) = run(repo(), &[name, "--help"]);
        assert_eq!(code, 0);
        for option in explorer_only {
            assert!(
                !help.contains(option),
                "stui {name} --help offers {option}:\n{help}"
            );
        }
        // And each option the command declares is in its help.
        for argument in command.get_arguments() {
            if let Some(long) = argument.get_long() {
                assert!(help.contains(&format!("--{long}")), "{name}: --{long}");
            }
        }
    }
    let (code, text) = run(
        repo(),
        &["check", "--color", "never", "assets/demo.safetensors"],
    );
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("unexpected argument '--color'"), "{text}");
}

/// Without a terminal on stdout (a pipe, a file, CI), `stui PATH` prints what `stui inspect PATH`
/// prints, with its exit code, and says once on stderr how to get the explorer.
#[test]
fn without_a_terminal_stui_path_prints_the_inspect_report() {
    let dir = broken_files();
    std::fs::copy(support::demo_path(), dir.path().join("demo.safetensors")).unwrap();
    for (model, code) in [("demo.safetensors", 0), ("truncated.safetensors", 1)] {
        let limit = std::time::Duration::from_secs(20);
        let report = support::run_within(support::stui(dir.path(), [model]), limit);
        let inspect = support::run_within(support::stui(dir.path(), ["inspect", model]), limit);
        assert_eq!(report.code, Some(code), "{report:?}");
        assert_eq!(report.code, inspect.code);
        assert!(report.stdout == inspect.stdout, "{report:?}");
        assert!(
            !report.stdout.contains(&0x1b),
            "no escape bytes: {report:?}"
        );
        assert_eq!(
            report.stderr,
            "stui: standard output is not a terminal, so this is the report of `stui inspect`; \
             --tui opens the explorer\n"
        );
        assert!(inspect.stderr.is_empty());
    }
    let limit = std::time::Duration::from_secs(20);
    let args = ["demo.safetensors", "--diff", "truncated.safetensors"];
    let report = support::run_within(support::stui(dir.path(), args), limit);
    let diff = support::run_within(
        support::stui(
            dir.path(),
            ["diff", "demo.safetensors", "truncated.safetensors"],
        ),
        limit,
    );
    assert_eq!((report.code, diff.code), (Some(1), Some(1)), "{report:?}");
    assert!(report.stdout == diff.stdout);
    assert!(
        report.stderr.contains("the report of `stui diff`"),
        "{report:?}"
    );
}

/// A reader that stops early (`stui PATH | head`) ends the report quietly.
#[test]
fn a_reader_that_leaves_early_ends_the_report_quietly() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    // Thousands of tensors: more report than a pipe holds.
    let model = (0..4000).fold(stui::demo::SyntheticModel::new(1), |model, i| {
        model.tensor(
            &format!("blocks.{i}.weight"),
            Dtype::F32,
            &[1 + i % 7],
            Fill::Zeros,
        )
    });
    model.write(&dir.path().join("model.safetensors")).unwrap();
    let mut child = support::stui(dir.path(), ["model.safetensors", "--color", "always"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("file "), "{first}");
    assert!(
        !first.contains('\u{1b}'),
        "no colour into a pipe: {first:?}"
    );
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `--tui` where there is no terminal at all (no terminal on any standard stream, no controlling
/// terminal): a message and exit code 2, never a panic, nothing on stdout.
#[test]
fn tui_without_any_terminal_fails_with_a_message() {
    let stui = support::stui(repo(), ["--tui", "assets/demo.safetensors"]);
    let command = match support::without_terminal(&stui) {
        Some(command) => command,
        // Without `setsid`, this process must have no terminal itself.
        None if std::fs::File::open("/dev/tty").is_err() => stui,
        None => {
            assert!(
                std::env::var_os("CI").is_none(),
                "setsid is missing and this process has a terminal"
            );
            eprintln!("no setsid, and a terminal: the test of --tui without one cannot run here");
            return;
        }
    };
    let run = support::run_within(command, std::time::Duration::from_secs(10));
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.no_panic(), "{}", run.stderr);
    assert!(run.stdout.is_empty(), "{run:?}");
    assert!(
        run.stderr.starts_with(
            "stui: the explorer needs a terminal and there is none (standard output is not a \
             terminal, and /dev/tty: "
        ),
        "{}",
        run.stderr
    );
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
}

/// Every subcommand's name, as `stui --help` lists them.
fn subcommand_names() -> Vec<String> {
    use clap::CommandFactory;
    stui::cli::Cli::command()
        .get_subcommands()
        .map(|c| c.get_name().to_owned())
        .collect()
}

#[test]
fn completions_for_every_shell_name_every_subcommand() {
    let names = subcommand_names();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let output = Command::new(env!("CARGO_BIN_EXE_stui"))
            .args(["completions", shell])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{shell}");
        let script = String::from_utf8(output.stdout).unwrap();
        for name in &names {
            assert!(script.contains(name.as_str()), "{shell} lacks {name}");
        }
        assert!(
            script.contains("per-tensor") && script.contains("tui"),
            "{shell}"
        );
        // Where the shell is installed, it reads the script without a syntax error.
        let check = match shell {
            "bash" => Some(("bash", "-n")),
            "zsh" => Some(("zsh", "-n")),
            "fish" => Some(("fish", "--no-execute")),
            _ => None,
        };
        if let Some((program, flag)) = check
            && let Ok(mut child) = Command::new(program)
                .arg(flag)
                .stdin(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
        {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(script.as_bytes())
                .unwrap();
            let checked = child.wait_with_output().unwrap();
            assert!(
                checked.status.success(),
                "{program} {flag}: {}",
                String::from_utf8_lossy(&checked.stderr)
            );
        }
    }
}

#[test]
fn the_man_page_names_every_subcommand() {
    let (code, page) = run(repo(), &["man"]);
    assert_eq!(code, 0);
    assert!(page.contains(".TH stui 1"), "{page}");
    for name in subcommand_names() {
        assert!(
            page.contains(&format!("stui\\-{name}(1)")),
            "stui(1) lacks {name}"
        );
        let (code, own) = run(repo(), &["man", &name]);
        assert_eq!(code, 0, "{own}");
        let version = env!("CARGO_PKG_VERSION");
        assert!(
            own.contains(&format!(".TH stui-{name} 1  \"stui {version}\"")),
            "{own}"
        );
    }
    // The README's install loop writes every command's page.
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let install: Vec<&str> = readme
        .lines()
        .find_map(|line| line.strip_prefix("for command in "))
        .unwrap()
        .split([' ', ';'])
        .collect();
    for name in subcommand_names() {
        assert!(install.contains(&name.as_str()), "README: {install:?}");
    }
    let (code, text) = run(repo(), &["man", "nope"]);
    assert_eq!(code, 2);
    assert!(
        text.contains("no command `nope`; the commands are inspect, check"),
        "{text}"
    );
}

/// A scheme that quantizes none of the weights compared (the demo's `down_proj` weights are 344
/// wide: no whole groups of 128, or of 16) shows dashes, in the text as in the explorer, and
/// nulls in JSON: not zero bits per weight and infinite SNRs.
#[test]
fn compare_shows_dashes_where_a_scheme_quantizes_nothing() {
    let demo = support::demo_path();
    let demo = demo.to_str().unwrap();
    let args = ["quantize", demo, "--compare", "--include", "*down_proj*"];
    let (code, text) = run(repo(), &args);
    assert_eq!(code, 0, "{text}");
    let row = |scheme: &str| {
        text.lines()
            .find(|line| line.split_whitespace().next() == Some(scheme))
            .unwrap_or_else(|| panic!("no {scheme} row: {text}"))
            .to_owned()
    };
    for scheme in ["W8A16", "W4A16", "W4A16_ASYM", "NVFP4A16"] {
        let row = row(scheme);
        assert_eq!(row.split_whitespace().nth(1), Some("0"), "{row}");
        assert_eq!(row.matches('–').count(), 3, "{row}");
    }
    assert_eq!(row("W8A8").split_whitespace().nth(1), Some("3"), "{text}");
    assert!(!row("W8A8").contains('–'), "{text}");
    assert!(!text.contains("inf"), "{text}");
    let (code, json) = run(repo(), &[&args[..], &["--json"]].concat());
    assert_eq!(code, 0, "{json}");
    let (_, json) = json.split_once("exit code: 0\n").unwrap();
    let json: serde_json::Value = serde_json::from_str(json).unwrap();
    let schemes = json["schemes"].as_array().unwrap();
    let w4a16 = schemes.iter().find(|s| s["scheme"] == "W4A16").unwrap();
    assert_eq!(w4a16["weights"], 0);
    for field in [
        "bits_per_weight",
        "worst_snr_db",
        "median_snr_db",
        "worst_tensor",
    ] {
        assert!(w4a16[field].is_null(), "{field}: {w4a16}");
    }
    let w8a8 = schemes.iter().find(|s| s["scheme"] == "W8A8").unwrap();
    assert!(w8a8["bits_per_weight"].as_f64().unwrap() > 8.0, "{w8a8}");
}
