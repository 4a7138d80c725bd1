//! Paths that are not model files: named pipes, sockets, devices, symbolic links to nothing,
//! folders where a file is needed. Each is named for what it is, with exit code 2, at once, by
//! every command and the explorer; among a model's shards each is a finding.

use crate::support::{self, Run};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::time::Duration;

/// "At once": far more than stui takes to look at a path, far less than a hang.
const AT_ONCE: Duration = Duration::from_secs(1);

/// A temporary folder holding a copy of the demo and every kind of odd path beside it.
struct OddPaths {
    dir: tempfile::TempDir,
    _socket: UnixListener,
}

impl OddPaths {
    fn new() -> OddPaths {
        let dir = tempfile::tempdir().unwrap();
        let at = |name: &str| dir.path().join(name);
        std::fs::copy(support::demo_path(), at("demo.safetensors")).unwrap();
        support::make_fifo(&at("fifo.safetensors"));
        let socket = UnixListener::bind(at("socket.safetensors")).unwrap();
        std::os::unix::fs::symlink("gone.safetensors", at("dangling.safetensors")).unwrap();
        std::os::unix::fs::symlink("fifo.safetensors", at("link-to-fifo.safetensors")).unwrap();
        std::fs::create_dir(at("empty")).unwrap();
        // A folder whose second file is a named pipe.
        std::fs::create_dir(at("folder")).unwrap();
        support::small_model()
            .write(&at("folder/a.safetensors"))
            .unwrap();
        support::make_fifo(&at("folder/b.safetensors"));
        // An index naming a real shard, a named pipe and a folder.
        std::fs::create_dir(at("index")).unwrap();
        support::small_model()
            .write(&at("index/a.safetensors"))
            .unwrap();
        support::make_fifo(&at("index/pipe.safetensors"));
        std::fs::create_dir(at("index/folder.safetensors")).unwrap();
        let index = serde_json::json!({ "weight_map": {
            "model.layers.0.mlp.weight": "a.safetensors",
            "model.layers.0.attn.weight": "a.safetensors",
            "model.layers.1.mlp.weight": "a.safetensors",
            "model.layers.1.attn.weight": "a.safetensors",
            "x": "pipe.safetensors",
            "y": "folder.safetensors",
        }});
        std::fs::write(at("index/model.safetensors.index.json"), index.to_string()).unwrap();
        OddPaths {
            dir,
            _socket: socket,
        }
    }

    fn run(&self, args: &[&str], limit: Duration) -> Run {
        support::run_within(support::stui(self.dir.path(), args), limit)
    }
}

/// Every place a path is given to stui, with `path` in it: as the model of each command and of
/// the explorer (whose report stands in for it without a terminal), as the second model, as the
/// config, as the output, as the explorer's log.
fn uses(path: &str) -> Vec<Vec<&str>> {
    let demo = "demo.safetensors";
    vec![
        vec![path],
        vec!["--tui", path],
        vec!["inspect", path],
        vec!["inspect", "--json", "--flat", path],
        vec!["check", path],
        vec!["check", "--json", path],
        vec!["stats", path],
        vec!["stats", "--json", path],
        vec!["hash", "--per-tensor", path],
        vec!["quantize", path, "-o", "out.safetensors"],
        vec!["diff", path, demo],
        vec!["diff", demo, path],
        vec![demo, "--diff", path],
        vec!["--tui", demo, "--diff", path],
        vec!["inspect", demo, "--config", path],
        vec!["check", demo, "--config", path],
        vec!["quantize", demo, "-o", path, "--yes"],
        vec!["--tui", demo, "--log", path],
    ]
}

/// Every use of `path` ends at once with exit code 2 and `message` on stderr, nothing on stdout.
fn every_use_is_refused(path: &str, message: &str) {
    let odd = OddPaths::new();
    for args in uses(path) {
        let run = odd.run(&args, AT_ONCE);
        assert_eq!(run.code, Some(2), "stui {args:?}: {run:?}");
        assert!(
            run.stderr.contains(message),
            "stui {args:?}: {}",
            run.stderr
        );
        assert_eq!(
            run.stderr.lines().count(),
            1,
            "stui {args:?}: {}",
            run.stderr
        );
        assert!(run.stdout.is_empty(), "stui {args:?}: {run:?}");
    }
}

#[test]
fn a_named_pipe_is_named_at_once_by_every_command() {
    every_use_is_refused(
        "fifo.safetensors",
        "fifo.safetensors: a named pipe (FIFO), not a regular file",
    );
    every_use_is_refused(
        "link-to-fifo.safetensors",
        "link-to-fifo.safetensors: a named pipe (FIFO), not a regular file",
    );
}

#[test]
fn a_socket_is_named_at_once_by_every_command() {
    every_use_is_refused(
        "socket.safetensors",
        "socket.safetensors: a socket, not a regular file",
    );
}

#[test]
fn devices_are_not_regular_files() {
    for device in ["/dev/zero", "/dev/null"] {
        every_use_is_refused(
            device,
            &format!("{device}: a character device, not a regular file"),
        );
    }
}

#[test]
fn a_link_to_nothing_names_its_target() {
    every_use_is_refused(
        "dangling.safetensors",
        "dangling.safetensors: a symbolic link to gone.safetensors, which does not exist",
    );
}

#[test]
fn a_folder_is_a_model_but_not_a_file() {
    let odd = OddPaths::new();
    let run = odd.run(&["check", "empty"], AT_ONCE);
    assert_eq!(run.code, Some(2));
    assert!(
        run.stderr
            .contains("empty: no .safetensors file or index in this folder"),
        "{}",
        run.stderr
    );
    for args in [
        &["check", "demo.safetensors", "--config", "empty"][..],
        &["inspect", "demo.safetensors", "--config", "empty"],
        &["--tui", "demo.safetensors", "--log", "empty"],
        &["quantize", "demo.safetensors", "-o", "empty", "--yes"],
    ] {
        let run = odd.run(args, AT_ONCE);
        assert_eq!(run.code, Some(2), "stui {args:?}: {run:?}");
        assert!(
            run.stderr.contains("empty: a folder, not a regular file"),
            "stui {args:?}: {}",
            run.stderr
        );
    }
    // A folder's model is written into a folder.
    let sharded = odd.dir.path().join("sharded");
    std::fs::create_dir(&sharded).unwrap();
    support::small_model()
        .write(&sharded.join("model.safetensors"))
        .unwrap();
    let run = odd.run(&["check", "sharded"], AT_ONCE);
    assert_eq!(run.code, Some(0), "a folder is a model: {run:?}");
    let run = odd.run(
        &["quantize", "sharded", "-o", "demo.safetensors", "--yes"],
        AT_ONCE,
    );
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(
        run.stderr
            .contains("demo.safetensors: a regular file, not a folder"),
        "{}",
        run.stderr
    );
}

/// A named pipe (or a folder) among a model's files is a finding on that file: the rest of the
/// model is read, and nothing waits for a writer.
#[test]
fn odd_shards_are_findings_at_once() {
    let odd = OddPaths::new();
    for (model, shard, what) in [
        (
            "folder",
            "b.safetensors",
            "a named pipe (FIFO), not a regular file",
        ),
        (
            "index",
            "pipe.safetensors",
            "a named pipe (FIFO), not a regular file",
        ),
        (
            "index",
            "folder.safetensors",
            "a folder, not a regular file",
        ),
    ] {
        for command in ["check", "inspect", "stats"] {
            let run = odd.run(&[command, model], AT_ONCE);
            assert_eq!(run.code, Some(1), "stui {command} {model}: {run:?}");
            let stdout = String::from_utf8_lossy(&run.stdout);
            let expected = match command {
                "inspect" => "NOT VALID".to_owned(),
                "stats" => "shard-unreadable".to_owned(),
                _ => format!("shard-unreadable         {shard}: cannot read `{shard}`: {what}"),
            };
            assert!(stdout.contains(&expected), "{command}: {stdout}");
        }
        let run = odd.run(&["check", "--json", model], AT_ONCE);
        let json: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
        assert_eq!(json["valid"], false);
        // Hashing needs every file's bytes: the odd one stops it.
        let run = odd.run(&["hash", model], AT_ONCE);
        assert_eq!(run.code, Some(2), "{run:?}");
    }
}

/// However an odd path reaches stui (as the model, the second model, the config, the output or
/// the log; directly, through a link, spelled with `./` or in full), no command panics or hangs:
/// each ends with exit code 1 (a model with an odd shard) or 2 (anything else).
#[test]
fn no_command_panics_on_any_odd_path() {
    let odd = OddPaths::new();
    let paths = [
        "fifo.safetensors",
        "socket.safetensors",
        "dangling.safetensors",
        "link-to-fifo.safetensors",
        "empty",
        "folder",
        "index",
        "index/pipe.safetensors",
        "folder/b.safetensors",
        "/dev/zero",
        "/dev/null",
        "/dev/tty",
    ];
    let spellings: [fn(&str, &Path) -> String; 4] = [
        |path: &str, _: &Path| path.to_owned(),
        |path: &str, _: &Path| format!("./{path}"),
        |path: &str, dir: &Path| dir.join(path).display().to_string(),
        |path: &str, _: &Path| format!("{path}/"),
    ];
    let use_count = uses("").len();
    let case = (0..paths.len(), 0..spellings.len(), 0..use_count);
    let mut runner = TestRunner::new(Config::with_cases(96));
    runner
        .run(&case, |(path, spelling, place)| {
            let path = spellings[spelling](paths[path], odd.dir.path());
            let args = uses(&path).swap_remove(place);
            // Where it can, in a session of its own, so that no case reaches a terminal.
            let command = support::stui(odd.dir.path(), &args);
            let command = support::without_terminal(&command).unwrap_or(command);
            let run = support::run_within(command, Duration::from_secs(10));
            prop_assert!(run.no_panic(), "stui {:?}: {}", args, run.stderr);
            prop_assert!(
                matches!(run.code, Some(1 | 2)),
                "stui {:?}: {:?}",
                args,
                run
            );
            prop_assert!(!run.stdout.contains(&0x1b), "stui {:?}: escape bytes", args);
            Ok(())
        })
        .unwrap();
}
