//! Models read from a Hub over HTTP Range, against the fake Hub on loopback: every good case
//! gives the report the same files give opened locally, every failure a message that says what
//! to do, and the requests stay within their budget.

use crate::fake_hub::{FakeHub, Fault};
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

const COMMIT: &str = "abcdefabcdefabcdefabcdefabcdefabcdefabcd";

/// A safetensors file written by the reference crate: a tensor per name, F32, shape `[4]`,
/// values from `seed`; `metadata` as its `__metadata__`.
fn safetensors_file(names: &[&str], seed: f32, metadata: Option<(&str, String)>) -> Vec<u8> {
    let data: Vec<Vec<u8>> = (0..names.len())
        .map(|i| {
            (0..4)
                .flat_map(|j| (seed + i as f32 + j as f32 * 0.25).to_le_bytes())
                .collect()
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = names
        .iter()
        .zip(&data)
        .map(|(name, bytes)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![4], bytes)
                    .unwrap();
            ((*name).to_owned(), view)
        })
        .collect();
    let metadata = metadata.map(|(k, v)| std::iter::once((k.to_owned(), v)).collect());
    safetensors::serialize(views, metadata).unwrap()
}

/// A file whose header is exactly `len` bytes: one tensor and a `__metadata__` padding value.
fn file_with_header_of(len: usize) -> Vec<u8> {
    let tensor = r#""w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}"#;
    let frame = format!(r#"{{"__metadata__":{{"pad":""}},{tensor}}}"#);
    let header = format!(
        r#"{{"__metadata__":{{"pad":"{}"}},{tensor}}}"#,
        "x".repeat(len - frame.len())
    );
    assert_eq!(header.len(), len);
    let mut bytes = (len as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&[0; 8]);
    bytes
}

/// Two shards and their index (`extra` more names mapped to the second shard in the index only).
fn sharded(extra: usize) -> Vec<(&'static str, Vec<u8>)> {
    let first = ["model.layers.0.mlp.weight", "model.layers.0.attn.weight"];
    let second = ["model.layers.1.mlp.weight", "model.layers.1.attn.weight"];
    let mut map = serde_json::Map::new();
    for name in first {
        map.insert(name.into(), "model-00001-of-00002.safetensors".into());
    }
    for name in second {
        map.insert(name.into(), "model-00002-of-00002.safetensors".into());
    }
    for i in 0..extra {
        map.insert(
            format!("model.layers.{i}.block_sparse_moe.experts.{i}.w1.weight_scale"),
            "model-00002-of-00002.safetensors".into(),
        );
    }
    let index = serde_json::json!({"metadata": {"total_size": 64}, "weight_map": map});
    vec![
        (
            "model-00001-of-00002.safetensors",
            safetensors_file(&first, 1.0, Some(("format", "pt".into()))),
        ),
        (
            "model-00002-of-00002.safetensors",
            safetensors_file(&second, 2.0, Some(("format", "pt".into()))),
        ),
        (
            "model.safetensors.index.json",
            index.to_string().into_bytes(),
        ),
        ("config.json", br#"{"model_type":"llama"}"#.to_vec()),
    ]
}

/// A place for stui's header cache, the Hugging Face cache (empty) and the home folder.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        let scratch = Scratch {
            dir: tempfile::tempdir().unwrap(),
        };
        for folder in ["stui-cache", "hf-cache", "home"] {
            std::fs::create_dir_all(scratch.dir.path().join(folder)).unwrap();
        }
        scratch
    }

    /// Runs stui against `hub`, no proxy, no token unless given: exit code, stdout, stderr.
    fn run(&self, hub: &FakeHub, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_stui"));
        command.args(args);
        for name in [
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "NO_PROXY",
            "http_proxy",
            "https_proxy",
            "all_proxy",
            "no_proxy",
            "HF_TOKEN",
            "HUGGING_FACE_HUB_TOKEN",
            "HF_TOKEN_PATH",
            "HF_HOME",
            "HF_HUB_OFFLINE",
            "TRANSFORMERS_OFFLINE",
            "HUGGINGFACE_HUB_CACHE",
            "XDG_CACHE_HOME",
        ] {
            command.env_remove(name);
        }
        let path = |name: &str| self.dir.path().join(name);
        command
            .env("HF_ENDPOINT", hub.endpoint())
            .env("HF_HUB_CACHE", path("hf-cache"))
            .env("STUI_CACHE_DIR", path("stui-cache"))
            .env("HOME", path("home"));
        for (name, value) in env {
            command.env(name, value);
        }
        let output = command.output().unwrap();
        (
            output.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }
}

/// The files written into a folder, as a local model.
fn local_copy(files: &[(&str, Vec<u8>)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, bytes) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
    dir
}

/// A JSON report without the fields that name where the files are.
fn without_paths(json: &str) -> serde_json::Value {
    fn strip(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                map.remove("path");
                // The config's path: a local file on one side, `hf://…/config.json` on the other.
                if map.get("config").is_some_and(serde_json::Value::is_string) {
                    map.remove("config");
                }
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut value: serde_json::Value = serde_json::from_str(json).unwrap();
    strip(&mut value);
    value
}

fn local_json(dir: &Path, args: &[&str]) -> serde_json::Value {
    let output = Command::new(env!("CARGO_BIN_EXE_stui"))
        .args(args)
        .arg(dir)
        .output()
        .unwrap();
    without_paths(&String::from_utf8_lossy(&output.stdout))
}

/// The top-level fields that differ, shortened.
fn differences(a: &serde_json::Value, b: &serde_json::Value) -> String {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return "not objects".into();
    };
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.dedup();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .fold(String::new(), |mut text, k| {
            let show = |v: Option<&serde_json::Value>| {
                let text = v.map_or("absent".into(), ToString::to_string);
                text.chars().take(300).collect::<String>()
            };
            let _ = writeln!(text, "{k}: {} vs {}", show(a.get(k)), show(b.get(k)));
            text
        })
}

/// Requests that are not the redirects' second hop (to the CDN host).
fn hub_requests(log: &[String]) -> Vec<&String> {
    log.iter().filter(|line| !line.contains(" /cdn/")).collect()
}

#[test]
fn a_sharded_model_reads_as_it_does_locally() {
    let hub = FakeHub::start();
    let files = sharded(0);
    hub.add_repo("org/name", COMMIT, &files);
    let local = local_copy(&files);
    let scratch = Scratch::new();
    for command in [&["inspect", "--json"][..], &["check", "--json"]] {
        let args: Vec<&str> = command.iter().copied().chain(["hf://org/name"]).collect();
        let (code, out, err) = scratch.run(&hub, &args, &[]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(without_paths(&out), local_json(local.path(), command));
    }
    let log = hub.take_log();
    // The first open: the metadata call, the index, one Range request a shard (each redirected
    // to the CDN host, which alone is asked for the bytes) and the config; the second: the
    // metadata call only.
    let first_open: Vec<&String> = log.iter().take(7).collect();
    assert_eq!(hub_requests(&log).len(), 5 + 1, "{log:#?}");
    assert!(
        first_open[0].contains("/api/models/org/name/revision/main"),
        "{log:#?}"
    );
    let ranges: Vec<_> = log.iter().filter(|l| l.contains("/cdn/")).collect();
    assert_eq!(ranges.len(), 2, "{log:#?}");
    assert!(
        ranges
            .iter()
            .all(|l| l.starts_with("localhost:") && l.contains("bytes=0-"))
    );
    assert!(
        log.iter()
            .all(|l| !l.contains("/resolve/main/") || l.contains("/api/")),
        "every file is read at the pinned commit: {log:#?}"
    );
}

/// A diffusers folder `unet` with its default save and an `fp16` variant of other values.
fn unet_and_its_fp16_variant() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (
            "unet/diffusion_pytorch_model.safetensors",
            safetensors_file(&UNET_NAMES, 1.0, None),
        ),
        (
            "unet/diffusion_pytorch_model.fp16.safetensors",
            safetensors_file(&UNET_NAMES, 2.0, None),
        ),
    ]
}

const UNET_NAMES: [&str; 2] = ["conv_in.weight", "conv_in.bias"];

#[test]
fn a_folder_of_the_repo_is_read_as_its_loader_reads_it_as_locally() {
    let hub = FakeHub::start();
    let mut files = unet_and_its_fp16_variant();
    files.extend([
        (
            "sd_xl_base_1.0.safetensors",
            safetensors_file(&UNET_NAMES, 3.0, None),
        ),
        (
            "sd_xl_base_1.0_0.9vae.safetensors",
            safetensors_file(&UNET_NAMES, 4.0, None),
        ),
    ]);
    hub.add_repo("org/name", COMMIT, &files);
    let local = local_copy(&files);
    let scratch = Scratch::new();
    let (code, out, err) = scratch.run(&hub, &["check", "--json", "hf://org/name/unet"], &[]);
    assert_eq!(code, 0, "{err}");
    let remote = without_paths(&out);
    assert_eq!(
        remote,
        local_json(&local.path().join("unet"), &["check", "--json"])
    );
    assert!(out.contains("folder-other-files"), "{out}");
    let variant_requests = |log: &[String]| log.iter().filter(|l| l.contains("fp16")).count();
    assert_eq!(
        variant_requests(&hub.take_log()),
        0,
        "the variant is never read"
    );
    let (code, _, err) = scratch.run(&hub, &["check", "hf://org/name"], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("separate models") && err.contains("hf://org/name@"),
        "{err}"
    );
}

#[test]
fn a_variant_is_read_from_the_hub_as_locally_and_the_default_save_never() {
    let hub = FakeHub::start();
    let files = unet_and_its_fp16_variant();
    hub.add_repo("org/name", COMMIT, &files);
    let local = local_copy(&files);
    let scratch = Scratch::new();
    let args = ["stats", "--json", "--variant", "fp16"];
    let (code, out, err) = scratch.run(&hub, &[&args[..], &["hf://org/name/unet"]].concat(), &[]);
    assert_eq!(code, 0, "{err}");
    let untimed = |mut stats: serde_json::Value| {
        stats.as_object_mut().unwrap().remove("seconds");
        stats
    };
    let remote = untimed(without_paths(&out));
    let unet = local.path().join("unet");
    assert_eq!(remote, untimed(local_json(&unet, &args)));
    assert_ne!(
        remote,
        untimed(local_json(&unet, &["stats", "--json"])),
        "the variant's values are not the default save's"
    );
    let log = hub.take_log();
    let default_requests = log
        .iter()
        .filter(|l| l.contains("diffusion_pytorch_model.safetensors"))
        .count();
    assert_eq!(default_requests, 0, "{log:#?}");
    assert!(log.iter().any(|l| l.contains("fp16")), "{log:#?}");
    let (code, _, err) = scratch.run(
        &hub,
        &["inspect", "--variant", "bf16", "hf://org/name/unet"],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("no `bf16` variant") && err.contains("its variants: `fp16`"),
        "{err}"
    );
    let (code, _, err) = scratch.run(
        &hub,
        &[
            "inspect",
            "--variant",
            "fp16",
            "hf://org/name/unet/diffusion_pytorch_model.safetensors",
        ],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("is a file"), "{err}");
}

/// Mistral's layout, at the top of the repository and in a folder of it: the index is read, the
/// file beside it is named as locally and never fetched.
#[test]
fn a_repo_read_through_its_index_names_what_it_leaves_out_as_locally() {
    for folder in ["", "text_encoder/"] {
        let hub = FakeHub::start();
        let owned: Vec<(String, Vec<u8>)> = sharded(0)
            .into_iter()
            .chain([(
                "consolidated.safetensors",
                safetensors_file(&["tok_embeddings.weight"], 3.0, None),
            )])
            .map(|(name, bytes)| (format!("{folder}{name}"), bytes))
            .collect();
        let files: Vec<(&str, Vec<u8>)> = owned
            .iter()
            .map(|(name, bytes)| (name.as_str(), bytes.clone()))
            .collect();
        hub.add_repo("org/name", COMMIT, &files);
        let local = local_copy(&files);
        let scratch = Scratch::new();
        let given = format!("hf://org/name/{folder}");
        let (code, out, err) = scratch.run(&hub, &["check", "--json", &given], &[]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(
            without_paths(&out),
            local_json(&local.path().join(folder), &["check", "--json"]),
            "{folder}"
        );
        assert!(
            out.contains("`consolidated.safetensors`"),
            "{folder}: {out}"
        );
        let log = hub.take_log();
        assert!(
            log.iter().all(|l| !l.contains("consolidated")),
            "{folder}: {log:#?}"
        );
    }
}

#[test]
fn a_repo_of_components_names_them_and_each_opens() {
    let hub = FakeHub::start();
    let files = [
        ("model_index.json", b"{}".to_vec()),
        (
            "unet/diffusion_pytorch_model.safetensors",
            safetensors_file(&["conv_in.weight"], 1.0, None),
        ),
        (
            "vae/diffusion_pytorch_model.safetensors",
            safetensors_file(&["decoder.conv_in.weight"], 2.0, None),
        ),
        ("scheduler/scheduler_config.json", b"{}".to_vec()),
    ];
    hub.add_repo("org/name", COMMIT, &files);
    let scratch = Scratch::new();
    let (code, _, err) = scratch.run(&hub, &["check", "hf://org/name"], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(
            "holds no .safetensors file or index; its folders `unet`, `vae` hold models: open \
             one by its path, e.g. hf://org/name/unet"
        ),
        "{err}"
    );
    let (code, _, err) = scratch.run(&hub, &["check", "hf://org/name/unet"], &[]);
    assert_eq!(code, 0, "{err}");
    // A file beside the models, given for one, is named for what it is.
    for (file, folder) in [
        ("model_index.json", "hf://org/name"),
        ("scheduler/scheduler_config.json", "hf://org/name/scheduler"),
    ] {
        let (code, _, err) = scratch.run(&hub, &["check", &format!("hf://org/name/{file}")], &[]);
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains(&format!(
                "hf://org/name@{COMMIT}/{file}: not a .safetensors file or a sharded model's \
                 index (it holds no `weight_map`): open the folder of the model it belongs to, \
                 stui {folder}"
            )),
            "{err}"
        );
    }
    // With a checkpoint of its own at the top, the components are a note, named the same way.
    let with_checkpoint: Vec<(&str, Vec<u8>)> = files
        .iter()
        .cloned()
        .chain([(
            "flux1-dev.safetensors",
            safetensors_file(&["img_in.weight"], 3.0, None),
        )])
        .collect();
    let hub = FakeHub::start();
    hub.add_repo("org/name", COMMIT, &with_checkpoint);
    let (code, out, err) = scratch.run(&hub, &["check", "hf://org/name"], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(
            "its folders `unet`, `vae` hold models, not read with this one: open one by its \
             path, e.g. hf://org/name/unet"
        ),
        "{out}"
    );
}

#[test]
fn a_repo_id_not_in_the_cache_is_read_from_the_hub_and_a_token_stays_on_the_hub() {
    let hub = FakeHub::start();
    hub.add_repo("org/name", COMMIT, &sharded(0));
    let scratch = Scratch::new();
    let (code, out, err) = scratch.run(
        &hub,
        &["hash", "--json", "org/name"],
        &[("HF_TOKEN", "secret")],
    );
    assert_eq!(code, 0, "{err}");
    let local = local_copy(&sharded(0));
    let local_hash = local_json(local.path(), &["hash", "--json"]);
    let remote_hash = without_paths(&out);
    assert_eq!(remote_hash["structural_id"], local_hash["structural_id"]);
    let digests = |json: &serde_json::Value| -> Vec<String> {
        json["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["sha256"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        digests(&remote_hash),
        digests(&local_hash),
        "an LFS blob id is the SHA-256 of the file"
    );
    let log = hub.take_log();
    for line in &log {
        let to_cdn = line.contains("/cdn/");
        assert_eq!(line.ends_with(" auth"), !to_cdn, "{line}");
    }
}

/// A tensor larger than a request (12 MiB) has the same statistics from the Hub as from a local
/// copy, read in chunks of 1.5 MiB, to the last digit: both merge the same pieces in order.
#[test]
fn a_tensor_of_several_requests_has_the_statistics_of_its_local_copy() {
    let values: Vec<u8> = (0..3_500_000u32)
        .flat_map(|i| {
            let spread = u16::try_from(i.wrapping_mul(2_654_435_761) >> 16).unwrap();
            (f32::from(spread) / 65_536.0 - 0.37).to_le_bytes()
        })
        .collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![3_500_000], &values)
            .unwrap();
    let file = safetensors::serialize([("w.weight".to_owned(), view)], None).unwrap();
    let hub = FakeHub::start();
    hub.add_repo("org/big", COMMIT, &[("model.safetensors", file.clone())]);
    let scratch = Scratch::new();
    let (code, out, err) = scratch.run(&hub, &["stats", "--json", "hf://org/big"], &[]);
    assert_eq!(code, 0, "{err}");
    let log = hub.take_log();
    let tensor_reads = log
        .iter()
        .filter(|l| l.contains("/cdn/") && !l.contains("bytes=0-"))
        .count();
    assert!(tensor_reads >= 2, "{:#?}", hub_requests(&log));
    let local = local_copy(&[("model.safetensors", file)]);
    let local = local_json(local.path(), &["stats", "--json"]);
    let remote = without_paths(&out);
    assert!(local["tensors"][0]["mean"].is_f64());
    assert_eq!(remote["tensors"], local["tensors"]);
}

#[test]
fn headers_of_100000_and_100001_bytes_and_small_ones() {
    for (header, requests) in [(100_000, 2), (100_001, 2), (99_992, 1), (2_000, 1)] {
        let hub = FakeHub::start();
        let file = file_with_header_of(header);
        hub.add_repo("org/one", COMMIT, &[("model.safetensors", file.clone())]);
        let scratch = Scratch::new();
        let (code, out, err) = scratch.run(&hub, &["inspect", "--json", "hf://org/one"], &[]);
        assert_eq!(code, 0, "{header}: {err}");
        let local = local_copy(&[("model.safetensors", file)]);
        let local = local_json(local.path(), &["inspect", "--json"]);
        let remote = without_paths(&out);
        assert!(
            remote == local,
            "{header}: {}",
            differences(&remote, &local)
        );
        let log = hub.take_log();
        let ranges = log.iter().filter(|l| l.contains("/cdn/")).count();
        assert_eq!(ranges, requests, "a header of {header} bytes: {log:#?}");
    }
}

#[test]
fn an_index_of_20_mb() {
    let files = sharded(200_000);
    assert!(files[2].1.len() > 20_000_000, "{}", files[2].1.len());
    let hub = FakeHub::start();
    hub.add_repo("org/big", COMMIT, &files);
    let scratch = Scratch::new();
    let (code, out, err) = scratch.run(&hub, &["check", "--json", "hf://org/big"], &[]);
    assert_eq!(code, 1, "the index names tensors no shard holds: {err}");
    let local = local_copy(&files);
    let (remote, local) = (
        without_paths(&out),
        local_json(local.path(), &["check", "--json"]),
    );
    assert!(remote == local, "{}", differences(&remote, &local));
}

#[test]
fn a_second_open_asks_for_no_header() {
    let hub = FakeHub::start();
    hub.add_repo("org/name", COMMIT, &sharded(0));
    let scratch = Scratch::new();
    let (first, _, _) = scratch.run(&hub, &["inspect", "--json", "hf://org/name"], &[]);
    hub.take_log();
    let (second, _, err) = scratch.run(&hub, &["inspect", "--json", "hf://org/name"], &[]);
    assert_eq!((first, second), (0, 0), "{err}");
    let log = hub.take_log();
    assert_eq!(log.len(), 1, "{log:#?}");
    assert!(log[0].contains("/api/models/"));
    // Nothing was written into the Hugging Face cache.
    assert_eq!(
        std::fs::read_dir(scratch.dir.path().join("hf-cache"))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn a_damaged_cache_entry_is_fetched_again() {
    let hub = FakeHub::start();
    hub.add_repo("org/name", COMMIT, &sharded(0));
    let scratch = Scratch::new();
    let args = ["inspect", "--json", "hf://org/name"];
    let (first, expected, _) = scratch.run(&hub, &args, &[]);
    hub.take_log();
    let headers = scratch.dir.path().join("stui-cache/headers");
    let mut damaged = 0;
    for entry in std::fs::read_dir(&headers).unwrap() {
        let path = entry.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        if damaged == 0 {
            // Cut short, as by a full disk.
            bytes.truncate(bytes.len() - 10);
        } else {
            // One byte of the header altered: still JSON of the same length.
            let last = bytes.len() - 3;
            bytes[last] ^= 0x01;
        }
        std::fs::write(&path, bytes).unwrap();
        damaged += 1;
    }
    assert_eq!(damaged, 2, "one entry a shard");
    let (second, out, err) = scratch.run(&hub, &args, &[]);
    assert_eq!((first, second), (0, 0), "{err}");
    assert_eq!(out, expected);
    let log = hub.take_log();
    let ranges = log.iter().filter(|l| l.contains("/cdn/")).count();
    assert_eq!(ranges, damaged, "each damaged header read again: {log:#?}");
    let (third, _, _) = scratch.run(&hub, &args, &[]);
    assert_eq!(third, 0);
    assert_eq!(hub.take_log().len(), 1, "the entries were written again");
}

#[test]
fn tensor_values_come_one_range_request_each() {
    let hub = FakeHub::start();
    let files = sharded(0);
    hub.add_repo("org/name", COMMIT, &files);
    let scratch = Scratch::new();
    let args = [
        "stats",
        "--json",
        "--filter",
        "layers.1.mlp",
        "hf://org/name",
    ];
    let (code, out, err) = scratch.run(&hub, &args, &[]);
    assert_eq!(code, 0, "{err}");
    let local = local_copy(&files);
    let local = local_json(
        local.path(),
        &["stats", "--json", "--filter", "layers.1.mlp"],
    );
    let remote = without_paths(&out);
    assert_eq!(remote["tensors"], local["tensors"]);
    let log = hub.take_log();
    let tensor_reads: Vec<_> = log
        .iter()
        .filter(|l| l.contains("/cdn/") && !l.contains("bytes=0-"))
        .collect();
    assert_eq!(tensor_reads.len(), 1, "{:#?}", hub_requests(&log));
    // Past the limit, refused before anything is read.
    let (code, _, err) = scratch.run(&hub, &["stats", "--fetch-limit", "8", "hf://org/name"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("more than --fetch-limit"), "{err}");
}

#[test]
fn a_remote_model_against_a_local_one_compares_the_layout() {
    let hub = FakeHub::start();
    let files = sharded(0);
    hub.add_repo("org/name", COMMIT, &files);
    let local = local_copy(&files);
    let scratch = Scratch::new();
    let local_path = local.path().to_str().unwrap();
    let (code, out, err) = scratch.run(&hub, &["diff", "hf://org/name", local_path], &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("identical: 4 same"), "{out}");
    assert!(out.contains("layout only"), "{out}");
    std::fs::remove_file(local.path().join("model-00002-of-00002.safetensors")).unwrap();
    let (code, out, _) = scratch.run(&hub, &["diff", "hf://org/name", local_path], &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("removed  model.layers.1.mlp.weight"), "{out}");
}

/// Runs `inspect hf://org/one` with the fault set: the exit code and stderr.
fn with_fault(fault: Fault, header: usize, env: &[(&str, &str)]) -> (i32, String, FakeHub) {
    let hub = FakeHub::start();
    hub.add_repo(
        "org/one",
        COMMIT,
        &[("model.safetensors", file_with_header_of(header))],
    );
    hub.set_fault(Some(fault));
    let scratch = Scratch::new();
    let (code, _, err) = scratch.run(&hub, &["inspect", "hf://org/one"], env);
    (code, err, hub)
}

#[test]
fn gated_private_and_missing_say_what_to_do() {
    let (code, err, hub) = with_fault(Fault::Status(401, "GatedRepo"), 1000, &[]);
    assert_eq!(code, 2);
    let page = format!("{}/org/one", hub.endpoint());
    assert!(
        err.contains(&format!(
            "`org/one` is a gated model: accept its licence on {page}"
        )),
        "{err}"
    );
    assert!(
        err.contains("set HF_TOKEN") && err.contains("no token was sent"),
        "{err}"
    );
    let (code, err, _) = with_fault(Fault::Status(403, "GatedRepo"), 1000, &[("HF_TOKEN", "t")]);
    assert_eq!(code, 2);
    assert!(err.contains("the token sent has no access yet"), "{err}");
    let (code, err, _) = with_fault(Fault::Status(403, ""), 1000, &[("HF_TOKEN", "t")]);
    assert_eq!(code, 2);
    assert!(err.contains("access refused (403)"), "{err}");
    let (code, err, _) = with_fault(Fault::Status(404, "EntryNotFound"), 1000, &[]);
    assert_eq!(code, 2);
    assert!(
        err.contains("`model.safetensors` of `org/one` does not exist (404)"),
        "{err}"
    );
    let hub = FakeHub::start();
    let scratch = Scratch::new();
    let (code, _, err) = scratch.run(&hub, &["inspect", "hf://org/nothing"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("`org/nothing` was not found on"), "{err}");
    assert!(
        err.contains("check the name") && err.contains("set HF_TOKEN"),
        "{err}"
    );
    hub.add_repo(
        "org/one",
        COMMIT,
        &[("model.safetensors", file_with_header_of(1000))],
    );
    let (code, _, err) = scratch.run(&hub, &["inspect", "hf://org/one@v9"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("`org/one` has no revision `v9`"), "{err}");
    let (code, _, err) = scratch.run(
        &hub,
        &["inspect", "hf://org/one"],
        &[("HF_HUB_OFFLINE", "1")],
    );
    assert_eq!(code, 2);
    assert!(err.contains("HF_HUB_OFFLINE is set"), "{err}");
}

#[test]
fn rate_limits_and_server_errors_are_waited_out() {
    let started = std::time::Instant::now();
    let (code, err, hub) = with_fault(Fault::RateLimitedOnce, 1000, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(1),
        "waited as RateLimit said"
    );
    assert_eq!(
        hub.take_log()
            .iter()
            .filter(|l| l.contains("/resolve/"))
            .count(),
        2
    );
    let (code, err, _) = with_fault(Fault::ServerErrorOnce, 1000, &[]);
    assert_eq!(code, 0, "{err}");
    let (code, err, hub) = with_fault(Fault::Status(500, ""), 1000, &[]);
    assert_eq!(code, 2);
    assert!(
        err.contains("answered 500") && err.contains("try again later"),
        "{err}"
    );
    assert_eq!(
        hub.take_log()
            .iter()
            .filter(|l| l.contains("/resolve/"))
            .count(),
        4,
        "bounded"
    );
}

#[test]
fn broken_replies_are_errors_never_a_wrong_header() {
    for (fault, header, expected) in [
        (
            Fault::IgnoresRange,
            1000,
            "the server sent the whole file (200) for a Range request",
        ),
        (Fault::ChangingEtag, 150_000, "changed between two requests"),
        (Fault::ShortBody, 1000, "the reply ended after"),
        (Fault::CutConnection, 1000, "the connection was cut"),
    ] {
        let (code, err, _) = with_fault(fault.clone(), header, &[]);
        assert_eq!(code, 2, "{fault:?}: {err}");
        assert!(err.contains(expected), "{fault:?}: {err}");
        assert!(
            err.contains("`model.safetensors` of `org/one`"),
            "{fault:?}: {err}"
        );
    }
}

/// A folder's files: each one's name and bytes.
type Files = Vec<(String, Vec<u8>)>;

/// Each of `tests/fixtures/quant`'s checkpoints (a real producer's output each, and their source
/// model), as `(name, files)`.
fn quantized_checkpoints() -> Vec<(String, Files)> {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant");
    let mut checkpoints: Vec<_> = std::fs::read_dir(&fixtures)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_dir())
        .map(|folder| {
            let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&folder)
                .unwrap()
                .map(|entry| entry.unwrap().path())
                .map(|path| {
                    let name = path.file_name().unwrap().to_string_lossy().into_owned();
                    (name, std::fs::read(&path).unwrap())
                })
                .collect();
            files.sort();
            let name = folder.file_name().unwrap().to_string_lossy().into_owned();
            (name, files)
        })
        .collect();
    checkpoints.sort();
    checkpoints
}

/// A quantized checkpoint on the Hub is the model it is locally: its logical weights, its
/// findings (members whose values say what the weight is, such as compressed-tensors'
/// `weight_shape` or bitsandbytes' quant state, are fetched for it) and its dequantized
/// statistics. Those members come in one request per shard where they lie side by side, and a
/// second open asks the Hub for nothing but the metadata call.
#[test]
fn quantized_checkpoints_read_from_the_hub_as_locally() {
    let hub = FakeHub::start();
    let scratch = Scratch::new();
    let checkpoints = quantized_checkpoints();
    assert!(checkpoints.len() >= 29, "{}", checkpoints.len());
    for (name, files) in &checkpoints {
        let files: Vec<(&str, Vec<u8>)> = files
            .iter()
            .map(|(path, bytes)| (path.as_str(), bytes.clone()))
            .collect();
        hub.add_repo(&format!("quant/{name}"), COMMIT, &files);
    }
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant");
    for (name, _) in &checkpoints {
        let repo = format!("hf://quant/{name}");
        for command in [&["inspect", "--json"][..], &["check", "--json"]] {
            let args: Vec<&str> = command.iter().copied().chain([repo.as_str()]).collect();
            let (_, out, err) = scratch.run(&hub, &args, &[]);
            let (remote, local) = (
                without_paths(&out),
                local_json(&fixtures.join(name), command),
            );
            assert!(
                remote == local,
                "{name} {command:?}: {err}\n{}",
                differences(&remote, &local)
            );
        }
        let (_, out, err) = scratch.run(&hub, &["stats", "--json", &repo], &[]);
        let (remote, local) = (
            without_paths(&out),
            local_json(&fixtures.join(name), &["stats", "--json"]),
        );
        for field in ["tensors", "findings", "summary"] {
            assert!(
                remote[field] == local[field],
                "{name} stats {field}: {err}\n{}",
                differences(&remote, &local)
            );
        }
    }
    hub.take_log();
    let (code, _, err) = scratch.run(&hub, &["check", "hf://quant/ct-w4a16"], &[]);
    assert_eq!(code, 0, "{err}");
    let log = hub.take_log();
    assert_eq!(log.len(), 1, "{log:#?}");
    assert!(log[0].contains("/api/models/"), "{log:#?}");
}

/// The seven `weight_shape` members of a compressed-tensors W4A16 checkpoint lie side by side
/// right after its header, where the safetensors library puts them: they come with the header's
/// own request, or with its second when the header is longer than the first asked for. Moved
/// 256 KiB further on, behind a larger tensor sorted before them, they come in one Range request
/// of their own.
#[test]
fn members_come_with_the_header_or_side_by_side_in_one_request() {
    let hub = FakeHub::start();
    let scratch = Scratch::new();
    let (_, files) = quantized_checkpoints()
        .into_iter()
        .find(|(name, _)| name == "ct-w4a16")
        .unwrap();
    let with_model = |change: &dyn Fn(&[u8]) -> Vec<u8>| -> Vec<(String, Vec<u8>)> {
        files
            .iter()
            .map(|(path, bytes)| {
                let bytes = if path == "model.safetensors" {
                    change(bytes)
                } else {
                    bytes.clone()
                };
                (path.clone(), bytes)
            })
            .collect()
    };
    let moved = with_model(&|bytes| rewritten(bytes, 256 << 10, 0));
    let long_header = with_model(&|bytes| rewritten(bytes, 0, 150_000));
    // Range requests to the files: the header's (two for the long one), then the members'.
    for (repo, files, requests) in [
        ("org/w4a16", &files, 1),
        ("org/long-header", &long_header, 2),
        ("org/moved", &moved, 2),
    ] {
        let files: Vec<(&str, Vec<u8>)> = files
            .iter()
            .map(|(path, bytes)| (path.as_str(), bytes.clone()))
            .collect();
        hub.add_repo(repo, COMMIT, &files);
        let (code, out, err) = scratch.run(&hub, &["inspect", &format!("hf://{repo}")], &[]);
        assert_eq!(code, 0, "{repo}: {err}");
        assert!(
            out.contains("int4 g128, compressed-tensors"),
            "{repo}: {out}"
        );
        let log = hub.take_log();
        let ranges = log.iter().filter(|l| l.contains("/cdn/")).count();
        assert_eq!(ranges, requests, "{repo}: {log:#?}");
    }
}

/// The safetensors file `bytes` written again with a tensor of `padding` bytes of I64 added
/// (when not 0), which the library places before every other (the widest dtype, the first
/// name), and a metadata entry of `note` bytes (when not 0), which lengthens the header.
fn rewritten(bytes: &[u8], padding: usize, note: usize) -> Vec<u8> {
    let file = safetensors::SafeTensors::deserialize(bytes).unwrap();
    let mut metadata = safetensors::SafeTensors::read_metadata(bytes)
        .unwrap()
        .1
        .metadata()
        .clone()
        .unwrap_or_default();
    if note > 0 {
        metadata.insert("note".into(), "n".repeat(note));
    }
    let zeros = vec![0u8; padding];
    let mut views: Vec<(String, safetensors::tensor::TensorView<'_>)> = file.tensors();
    if padding > 0 {
        let view = safetensors::tensor::TensorView::new(
            safetensors::Dtype::I64,
            vec![padding / 8],
            &zeros,
        )
        .unwrap();
        views.push(("a.padding".to_owned(), view));
    }
    safetensors::serialize(views, Some(metadata)).unwrap()
}

/// Tensors to write: each one's name, dtype, shape and bytes.
type Written = Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>;

/// What [`checked_from_the_hub`] gives back.
struct Checked {
    code: i32,
    /// Each finding as "severity code message".
    findings: Vec<String>,
    err: String,
    hub: FakeHub,
    scratch: Scratch,
    files: [(&'static str, Vec<u8>); 2],
}

/// A file of `tensors` and a `config.json` holding `config`, as the repository `repo` of a new
/// fake Hub, and `stui check --json` of it.
fn checked_from_the_hub(repo: &str, tensors: &Written, config: &[u8]) -> Checked {
    let views = tensors.iter().map(|(name, dtype, shape, bytes)| {
        let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes).unwrap();
        (name.clone(), view)
    });
    let files = [
        (
            "model.safetensors",
            safetensors::serialize(views, None).unwrap(),
        ),
        ("config.json", config.to_vec()),
    ];
    let hub = FakeHub::start();
    hub.add_repo(repo, COMMIT, &files);
    let scratch = Scratch::new();
    let (code, out, err) = scratch.run(&hub, &["check", "--json", &format!("hf://{repo}")], &[]);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    let findings = report["findings"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|f| format!("{} {} {}", f["severity"], f["code"], f["message"]))
        .collect();
    Checked {
        code,
        findings,
        err,
        hub,
        scratch,
        files,
    }
}

/// A GPTQ checkpoint of 1,100 weights (the experts of a large mixture), each `g_idx` apart from
/// the next by its weight's codes: the group orders would take more requests than an open
/// spends on members. They are left unread, which a finding says, and nothing is an error.
#[test]
fn group_orders_of_thousands_of_weights_are_left_unread() {
    use safetensors::Dtype::{F16, I32};
    const WEIGHTS: usize = 1100;
    let (rows, columns, group) = (256usize, 512usize, 128usize);
    let zeros = |bytes: usize| vec![0u8; bytes];
    let sequential: Vec<u8> = (0..columns)
        .flat_map(|column| i32::try_from(column / group).unwrap().to_le_bytes())
        .collect();
    let scales: Vec<u8> = (0..columns / group * rows)
        .flat_map(|_| half::f16::from_f32(0.01).to_le_bytes())
        .collect();
    let mut tensors: Written = Vec::new();
    for weight in 0..WEIGHTS {
        let prefix = format!("model.layers.0.mlp.experts.{weight}.down_proj");
        let member = |name: &str| format!("{prefix}.{name}");
        tensors.push((member("g_idx"), I32, vec![columns], sequential.clone()));
        let codes = vec![columns / 8, rows];
        tensors.push((member("qweight"), I32, codes, zeros(columns / 8 * rows * 4)));
        let zero_points = vec![columns / group, rows / 8];
        let zero_bytes = columns / group * rows / 8 * 4;
        tensors.push((member("qzeros"), I32, zero_points, zeros(zero_bytes)));
        let scale_shape = vec![columns / group, rows];
        tensors.push((member("scales"), F16, scale_shape, scales.clone()));
    }
    let config = br#"{"model_type":"llama","quantization_config":{"quant_method":"gptq","bits":4,"group_size":128,"desc_act":false,"sym":true}}"#;
    let Checked {
        code,
        findings: summary,
        err,
        hub,
        files,
        ..
    } = checked_from_the_hub("org/experts", &tensors, config);
    assert_eq!(code, 0, "{err}{summary:#?}");
    assert!(
        summary.iter().any(|f| f.contains("quant-group-index")
            && f.contains("group orders (`g_idx`) of 1100 weights were not read")),
        "{summary:#?}"
    );
    assert!(
        summary.iter().all(|f| !f.starts_with("\"error\"")),
        "{summary:#?}"
    );
    // The header's two Range requests (it is longer than the first brings), nothing more.
    let log = hub.take_log();
    let ranges = log.iter().filter(|l| l.contains("/cdn/")).count();
    assert_eq!(ranges, 2, "{:#?}", hub_requests(&log));
    let local = local_copy(&files);
    let local = local_json(local.path(), &["check", "--json"]);
    assert_eq!(
        local["findings"].as_array().map(Vec::len),
        Some(summary.len() - 1)
    );
}

/// A bitsandbytes NF4 checkpoint of 1,100 weights, each quant state apart from the next by its
/// weight's codes: the states would take more requests than an open spends on members. One
/// warning says they were not read, the weights are listed by their element count, and no
/// weight has an error or a finding of its own about them.
#[test]
fn quant_states_of_thousands_of_weights_are_left_unread_with_one_warning() {
    use safetensors::Dtype::{F32, U8};
    const WEIGHTS: usize = 1100;
    let (rows, columns) = (256usize, 576usize);
    let elements = rows * columns;
    let quant_map: Vec<u8> = (0..16u8)
        .flat_map(|i| (f32::from(i) / 8.0 - 1.0).to_le_bytes())
        .collect();
    let absmax: Vec<u8> = (0..elements / 64)
        .flat_map(|_| 0.05f32.to_le_bytes())
        .collect();
    let state = format!(
        r#"{{"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [{rows}, {columns}]}}"#
    )
    .into_bytes();
    let mut tensors: Written = Vec::new();
    for weight in 0..WEIGHTS {
        let name = format!("model.layers.0.mlp.experts.{weight}.down_proj.weight");
        tensors.push((
            name.clone(),
            U8,
            vec![elements / 2, 1],
            vec![0x77; elements / 2],
        ));
        tensors.push((
            format!("{name}.absmax"),
            F32,
            vec![elements / 64],
            absmax.clone(),
        ));
        tensors.push((
            format!("{name}.quant_map"),
            F32,
            vec![16],
            quant_map.clone(),
        ));
        let state_name = format!("{name}.quant_state.bitsandbytes__nf4");
        tensors.push((state_name, U8, vec![state.len()], state.clone()));
    }
    let config = br#"{"model_type":"llama","quantization_config":{"quant_method":"bitsandbytes","load_in_4bit":true,"bnb_4bit_quant_type":"nf4","bnb_4bit_compute_dtype":"bfloat16"}}"#;
    let Checked {
        code,
        findings,
        err,
        hub,
        scratch,
        files,
    } = checked_from_the_hub("org/nf4-experts", &tensors, config);
    assert_eq!(code, 0, "{err}{findings:#?}");
    let unread = "shapes and quant states of 1100 quantized weights were not read";
    assert!(
        findings.iter().filter(|f| f.contains(unread)).count() == 1,
        "{findings:#?}"
    );
    assert!(
        findings
            .iter()
            .all(|f| !f.starts_with("\"error\"") && !f.contains("quant-member")),
        "{findings:#?}"
    );
    let (_, out, _) = scratch.run(&hub, &["inspect", "hf://org/nf4-experts"], &[]);
    assert!(out.contains("1100 weights"), "{out}");
    let local = local_copy(&files);
    let local = local_json(local.path(), &["check", "--json"]);
    assert_eq!(
        local["findings"].as_array().map(Vec::len),
        Some(0),
        "{local}"
    );
}

/// `quantize` and `--compare` read every tensor: a model on the Hub is refused with the command
/// that downloads it, before anything about the output is asked, and nothing is written.
#[test]
fn quantize_refuses_a_model_on_the_hub_with_the_command_that_downloads_it() {
    let hub = FakeHub::start();
    hub.add_repo("org/name", COMMIT, &sharded(0));
    let scratch = Scratch::new();
    let out = tempfile::tempdir().unwrap();
    let existing = out.path().join("existing.safetensors");
    std::fs::write(&existing, b"kept").unwrap();
    let target = out.path().join("new.safetensors");
    for args in [
        vec!["quantize", "hf://org/name", "-o", target.to_str().unwrap()],
        vec![
            "quantize",
            "hf://org/name",
            "-o",
            existing.to_str().unwrap(),
        ],
        vec!["quantize", "hf://org/name", "--compare"],
    ] {
        let (code, out, err) = scratch.run(&hub, &args, &[]);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert!(
            err.contains("quantize reads every tensor: download it first (`hf download org/name`)"),
            "{args:?}: {err}"
        );
    }
    assert!(!target.exists());
    assert_eq!(std::fs::read(&existing).unwrap(), b"kept");
    // Named at a revision, the command downloads that revision.
    let at_commit = format!("hf://org/name@{COMMIT}");
    let (code, _, err) = scratch.run(&hub, &["quantize", &at_commit, "--compare"], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!("(`hf download org/name --revision {COMMIT}`)")),
        "{err}"
    );
}
