//! Hub repository ids read from a Hugging Face cache laid out as `huggingface_hub` writes it:
//! blobs named by their `ETag` (sha256 for LFS files, git sha1 for the others), refs holding a
//! commit with no newline, snapshots of relative links into `blobs/`.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

const MAIN: &str = "1111111111111111111111111111111111111111";
const TAG: &str = "2222222222222222222222222222222222222222";
const PR: &str = "3333333333333333333333333333333333333333";

/// A safetensors file written by the reference crate: F32 tensors of shape `[2]`.
fn safetensors_file(names: &[&str]) -> Vec<u8> {
    let data = [0u8; 8];
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = names
        .iter()
        .map(|name| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &data)
                    .unwrap();
            ((*name).to_owned(), view)
        })
        .collect();
    safetensors::serialize(views, None).unwrap()
}

/// The git blob id of `bytes`, as the Hub names a file kept in git rather than LFS.
fn git_sha1(bytes: &[u8]) -> String {
    let output = Command::new("git")
        .args(["hash-object", "--stdin"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(bytes)?;
            child.wait_with_output()
        })
        .unwrap();
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

fn sha256(bytes: &[u8]) -> String {
    stui::hash::hex(Sha256::digest(bytes).as_slice())
}

/// A fake cache folder holding one repository, `org/name`.
struct FakeCache {
    dir: tempfile::TempDir,
}

impl FakeCache {
    fn new() -> FakeCache {
        let cache = FakeCache {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir_all(cache.repo().join("blobs")).unwrap();
        std::fs::write(
            cache.path().join("CACHEDIR.TAG"),
            "Signature: 8a477f597d28d172789f06886806bc55\n",
        )
        .unwrap();
        cache
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn repo(&self) -> PathBuf {
        self.path().join("models--org--name")
    }

    /// Stores `bytes` as a blob (LFS files by sha256, others by git sha1); returns its name.
    fn blob(&self, bytes: &[u8], lfs: bool) -> String {
        let name = if lfs { sha256(bytes) } else { git_sha1(bytes) };
        std::fs::write(self.repo().join("blobs").join(&name), bytes).unwrap();
        name
    }

    /// Links `snapshots/<commit>/<path>` to the blob, relatively, as `huggingface_hub` does.
    fn link(&self, commit: &str, path: &str, blob: &str) {
        let link = self.repo().join("snapshots").join(commit).join(path);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        let depth = path.split('/').count() + 1;
        let target = format!("{}blobs/{blob}", "../".repeat(depth));
        symlink(target, link).unwrap();
    }

    fn add(&self, commit: &str, path: &str, bytes: &[u8]) {
        let lfs = path.ends_with(".safetensors");
        let blob = self.blob(bytes, lfs);
        self.link(commit, path, &blob);
    }

    fn set_ref(&self, name: &str, commit: &str) {
        let file = self.repo().join("refs").join(name);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, commit).unwrap();
    }

    /// A sharded model at `commit`: two shards and a git-sha1 index blob.
    fn sharded(&self, commit: &str, folder: &str) {
        let shards = [
            ("model-00001-of-00002.safetensors", ["a.0.w", "a.1.w"]),
            ("model-00002-of-00002.safetensors", ["a.2.w", "a.3.w"]),
        ];
        let mut map = serde_json::Map::new();
        for (file, names) in shards {
            self.add(
                commit,
                &format!("{folder}{file}"),
                &safetensors_file(&names),
            );
            for name in names {
                map.insert(name.into(), file.into());
            }
        }
        let index = serde_json::json!({"metadata": {"total_size": 32}, "weight_map": map});
        self.add(
            commit,
            &format!("{folder}model.safetensors.index.json"),
            index.to_string().as_bytes(),
        );
    }

    /// Runs stui with this cache as `HF_HUB_CACHE`, offline: exit code, stdout, stderr.
    fn run(&self, args: &[&str]) -> (i32, String, String) {
        run_with(args, &[("HF_HUB_CACHE", self.path().as_os_str())], None)
    }

    /// Every file of the cache and its bytes (links as their targets), to show nothing changed.
    fn contents(&self) -> HashMap<PathBuf, Vec<u8>> {
        let mut found = HashMap::new();
        let mut pending = vec![self.path().to_owned()];
        while let Some(folder) = pending.pop() {
            for entry in std::fs::read_dir(folder).unwrap().flatten() {
                let path = entry.path();
                let kind = entry.file_type().unwrap();
                if kind.is_dir() {
                    pending.push(path);
                } else if kind.is_symlink() {
                    let target = std::fs::read_link(&path).unwrap();
                    found.insert(path, target.to_string_lossy().as_bytes().to_vec());
                } else {
                    found.insert(path.clone(), std::fs::read(path).unwrap());
                }
            }
        }
        found
    }
}

fn run_with(
    args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
    dir: Option<&Path>,
) -> (i32, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_stui"));
    command.args(args).env("HF_HUB_OFFLINE", "1");
    for name in [
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_HOME",
        "XDG_CACHE_HOME",
    ] {
        command.env_remove(name);
    }
    for (name, value) in env {
        command.env(name, value);
    }
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let output = command.output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn tensor_names(inspect_json: &str) -> Vec<String> {
    let json: serde_json::Value = serde_json::from_str(inspect_json).unwrap();
    let mut names: Vec<String> = json["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_sharded_model_with_a_git_sha1_index_blob() {
    let cache = FakeCache::new();
    cache.sharded(MAIN, "");
    cache.set_ref("main", MAIN);
    let before = cache.contents();
    let (code, out, err) = cache.run(&["inspect", "--json", "org/name"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(tensor_names(&out), ["a.0.w", "a.1.w", "a.2.w", "a.3.w"]);
    let snapshot = cache.repo().join("snapshots").join(MAIN);
    let (_, local, _) = run_with(
        &["inspect", "--json", snapshot.to_str().unwrap()],
        &[],
        None,
    );
    assert_eq!(
        out, local,
        "the same report as the snapshot opened by its path"
    );
    for command in ["check", "hash", "stats"] {
        let (code, out, err) = cache.run(&[command, "org/name"]);
        assert_eq!(code, 0, "{command}: {out}{err}");
    }
    let (code, out, err) = cache.run(&["diff", "org/name", snapshot.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        cache.contents(),
        before,
        "nothing is written into the cache"
    );
}

#[test]
fn a_tag_and_a_pull_request_ref() {
    let cache = FakeCache::new();
    cache.add(MAIN, "model.safetensors", &safetensors_file(&["main"]));
    cache.add(TAG, "model.safetensors", &safetensors_file(&["tagged"]));
    cache.add(PR, "model.safetensors", &safetensors_file(&["proposed"]));
    cache.set_ref("main", MAIN);
    cache.set_ref("v1.0", TAG);
    cache.set_ref("refs/pr/1", PR);
    for (argument, name) in [
        ("org/name", "main"),
        ("org/name@main", "main"),
        ("org/name@v1.0", "tagged"),
        ("org/name@refs/pr/1", "proposed"),
    ] {
        let (code, out, err) = cache.run(&["inspect", "--json", argument]);
        assert_eq!(code, 0, "{argument}: {err}");
        assert_eq!(tensor_names(&out), [name], "{argument}");
    }
}

#[test]
fn a_commit_revision_without_a_ref() {
    let cache = FakeCache::new();
    cache.add(TAG, "model.safetensors", &safetensors_file(&["pinned"]));
    cache.add(MAIN, "model.safetensors", &safetensors_file(&["main"]));
    cache.set_ref("main", MAIN);
    let (code, out, err) = cache.run(&["inspect", "--json", &format!("org/name@{TAG}")]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(tensor_names(&out), ["pinned"]);
    // A commit that is not in the cache is named, with what is there.
    let absent = "4444444444444444444444444444444444444444";
    let (code, _, err) = cache.run(&["inspect", &format!("org/name@{absent}")]);
    assert_eq!(code, 2);
    assert!(
        err.contains(&format!("is commit {absent}, which has no snapshot")),
        "{err}"
    );
    assert!(err.contains("hf download org/name --revision"), "{err}");
}

#[test]
fn two_snapshots_sharing_blobs() {
    let cache = FakeCache::new();
    let shared = safetensors_file(&["same"]);
    cache.add(MAIN, "model.safetensors", &shared);
    cache.add(TAG, "model.safetensors", &shared);
    cache.set_ref("main", MAIN);
    cache.set_ref("v1.0", TAG);
    for argument in ["org/name", "org/name@v1.0"] {
        let (code, out, _) = cache.run(&["inspect", "--json", argument]);
        assert_eq!(code, 0);
        assert_eq!(tensor_names(&out), ["same"]);
    }
    let (code, out, err) = cache.run(&["cache", "--json"]);
    assert_eq!(code, 0, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    let repo = &json["repos"][0];
    assert_eq!(repo["repo"], "org/name");
    assert_eq!(
        repo["size"],
        shared.len() as u64,
        "a blob two snapshots share counts once"
    );
    assert_eq!(repo["revisions"].as_array().unwrap().len(), 2);
}

#[test]
fn a_subfolder() {
    let cache = FakeCache::new();
    cache.sharded(MAIN, "unet/");
    cache.add(
        MAIN,
        "text_encoder/model.safetensors",
        &safetensors_file(&["te"]),
    );
    cache.set_ref("main", MAIN);
    for argument in ["org/name/unet", "org/name@main/unet", "hf://org/name/unet"] {
        let (code, out, err) = cache.run(&["inspect", "--json", argument]);
        assert_eq!(code, 0, "{argument}: {err}");
        assert_eq!(tensor_names(&out), ["a.0.w", "a.1.w", "a.2.w", "a.3.w"]);
    }
    let (code, out, _) = cache.run(&[
        "inspect",
        "--json",
        "org/name/text_encoder/model.safetensors",
    ]);
    assert_eq!(code, 0);
    assert_eq!(tensor_names(&out), ["te"]);
    let (code, _, err) = cache.run(&["inspect", "org/name/vae"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("`vae` is not in the cached snapshot of `org/name`"),
        "{err}"
    );
    // The top holds no model: its components are named as the repository was.
    let (code, _, err) = cache.run(&["inspect", "org/name"]);
    assert_eq!(code, 2);
    assert!(
        err.contains(
            "holds no .safetensors file or index; its folders `text_encoder`, `unet` hold \
             models: open one by its path, e.g. org/name/text_encoder"
        ),
        "{err}"
    );
    // With a checkpoint of its own at the top, the components are a note, named the same way.
    cache.add(
        MAIN,
        "flux1-dev.safetensors",
        &safetensors_file(&["img_in.weight"]),
    );
    let (code, out, err) = cache.run(&["check", "org/name"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(
            "its folders `text_encoder`, `unet` hold models, not read with this one: open one \
             by its path, e.g. org/name/text_encoder"
        ),
        "{out}"
    );
}

/// A snapshot holding a default save and an `fp16` one: `--variant` reads the variant's files,
/// whose names the error then uses as the user gave them.
#[test]
fn a_variant_in_the_cache() {
    let cache = FakeCache::new();
    cache.sharded(MAIN, "text_encoder/");
    cache.add(
        MAIN,
        "text_encoder/model.fp16.safetensors",
        &safetensors_file(&["half.w"]),
    );
    cache.set_ref("main", MAIN);
    let (code, out, err) = cache.run(&["inspect", "--json", "org/name/text_encoder"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(tensor_names(&out), ["a.0.w", "a.1.w", "a.2.w", "a.3.w"]);
    let (code, out, err) = cache.run(&[
        "inspect",
        "--json",
        "--variant",
        "fp16",
        "org/name/text_encoder",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(tensor_names(&out), ["half.w"]);
    let (code, _, err) = cache.run(&["inspect", "--variant", "bf16", "org/name/text_encoder"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("org/name/text_encoder: no `bf16` variant")
            && err.contains("its variants: `fp16`"),
        "{err}"
    );
}

#[test]
fn a_dangling_link_is_named_with_what_to_do() {
    let cache = FakeCache::new();
    cache.sharded(MAIN, "");
    cache.set_ref("main", MAIN);
    let shard = cache
        .repo()
        .join("snapshots")
        .join(MAIN)
        .join("model-00002-of-00002.safetensors");
    std::fs::remove_file(std::fs::canonicalize(&shard).unwrap()).unwrap();
    let (code, out, err) = cache.run(&["check", "org/name"]);
    assert_eq!(code, 1, "{err}");
    assert!(out.contains("model-00002-of-00002.safetensors"), "{out}");
    assert!(out.contains("a dangling link"), "{out}");
    assert!(
        out.contains(&format!(
            "hf download org/name model-00002-of-00002.safetensors --revision {MAIN}"
        )),
        "{out}"
    );
    let (_, listing, _) = cache.run(&["cache"]);
    assert!(listing.contains("1 of 2 shards"), "{listing}");
    assert!(
        listing.contains("INCOMPLETE (missing model-00002-of-00002.safetensors)"),
        "{listing}"
    );
}

#[test]
fn an_incomplete_blob_is_named_with_what_to_do() {
    let cache = FakeCache::new();
    cache.sharded(MAIN, "");
    cache.set_ref("main", MAIN);
    let shard = cache
        .repo()
        .join("snapshots")
        .join(MAIN)
        .join("model-00002-of-00002.safetensors");
    let blob = std::fs::canonicalize(&shard).unwrap();
    std::fs::remove_file(&shard).unwrap();
    let mut partial = blob.clone().into_os_string();
    partial.push(".incomplete");
    std::fs::rename(&blob, &partial).unwrap();
    let (code, out, err) = cache.run(&["check", "--json", "org/name"]);
    assert_eq!(code, 1, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    let finding = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["code"] == "shard-missing")
        .unwrap();
    assert_eq!(finding["file"], "model-00002-of-00002.safetensors");
    let message = finding["message"].as_str().unwrap();
    assert!(message.contains("unfinished"), "{message}");
    assert!(message.contains(".incomplete"), "{message}");
    assert!(
        message.contains("hf download org/name --revision"),
        "{message}"
    );
    let (_, listing, _) = cache.run(&["cache", "--json"]);
    let listing: serde_json::Value = serde_json::from_str(&listing).unwrap();
    assert_eq!(listing["repos"][0]["revisions"][0]["complete"], false);
    assert_eq!(
        listing["repos"][0]["incomplete"].as_array().unwrap().len(),
        1
    );
}

#[test]
fn a_repo_not_in_the_cache_and_an_unknown_revision_say_what_to_do() {
    let cache = FakeCache::new();
    cache.add(MAIN, "model.safetensors", &safetensors_file(&["x"]));
    cache.set_ref("main", MAIN);
    cache.set_ref("refs/pr/1", MAIN);
    let (code, _, err) = cache.run(&["inspect", "other/model"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("`other/model` is not in the Hugging Face cache at"),
        "{err}"
    );
    assert!(err.contains(&cache.path().display().to_string()), "{err}");
    assert!(err.contains("(from HF_HUB_CACHE)"), "{err}");
    assert!(err.contains("hf download other/model"), "{err}");
    let (code, _, err) = cache.run(&["inspect", "org/name@v2"]);
    assert_eq!(code, 2);
    assert!(err.contains("has no revision `v2`"), "{err}");
    assert!(err.contains("main → 111111111111"), "{err}");
    assert!(err.contains("refs/pr/1 → 111111111111"), "{err}");
}

#[test]
fn a_local_path_wins_over_a_repo_id() {
    let cache = FakeCache::new();
    cache.add(MAIN, "model.safetensors", &safetensors_file(&["cached"]));
    cache.set_ref("main", MAIN);
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(work.path().join("org/name")).unwrap();
    std::fs::write(
        work.path().join("org/name/model.safetensors"),
        safetensors_file(&["local"]),
    )
    .unwrap();
    let env = [("HF_HUB_CACHE", cache.path().as_os_str())];
    let (code, out, _) = run_with(&["inspect", "--json", "org/name"], &env, Some(work.path()));
    assert_eq!(code, 0);
    assert_eq!(tensor_names(&out), ["local"]);
}

#[test]
fn the_cache_folder_follows_the_variables_in_order() {
    let caches: Vec<FakeCache> = (0..5).map(|_| FakeCache::new()).collect();
    for (i, cache) in caches.iter().enumerate() {
        cache.add(
            MAIN,
            "model.safetensors",
            &safetensors_file(&[&format!("cache{i}")]),
        );
        cache.set_ref("main", MAIN);
    }
    // HF_HOME and XDG_CACHE_HOME name folders that hold the cache below them.
    let home = tempfile::tempdir().unwrap();
    let hf_home = home.path().join("hf_home");
    let xdg = home.path().join("xdg");
    let user = home.path().join("user");
    for (link, cache) in [
        (hf_home.join("hub"), &caches[2]),
        (xdg.join("huggingface/hub"), &caches[3]),
        (user.join(".cache/huggingface/hub"), &caches[4]),
    ] {
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        symlink(cache.path(), link).unwrap();
    }
    let empty = std::ffi::OsStr::new("");
    let all = [
        ("HF_HUB_CACHE", caches[0].path().as_os_str()),
        ("HUGGINGFACE_HUB_CACHE", caches[1].path().as_os_str()),
        ("HF_HOME", hf_home.as_os_str()),
        ("XDG_CACHE_HOME", xdg.as_os_str()),
        ("HOME", user.as_os_str()),
    ];
    for first in 0..5 {
        // The variables before `first` unset, or set to an empty value (the same).
        for blank in [false, true] {
            let mut env: Vec<(&str, &std::ffi::OsStr)> = all[first..].to_vec();
            if blank {
                env.extend(all[..first].iter().map(|(name, _)| (*name, empty)));
            }
            let (code, out, err) = run_with(&["inspect", "--json", "org/name"], &env, None);
            assert_eq!(code, 0, "{err}");
            assert_eq!(tensor_names(&out), [format!("cache{first}")], "{env:?}");
        }
    }
}

/// Nothing is written into the cache: an output inside it (in a snapshot, beside the
/// repositories, or in a cache found by its layout alone) is refused with what to do, and the
/// cache is left as it was; an output outside it is written.
#[test]
fn quantize_writes_nothing_into_the_cache() {
    let cache = FakeCache::new();
    let model = stui::demo::SyntheticModel::new(1).tensor(
        "w.weight",
        stui::format::Dtype::F32,
        &[4, 16],
        stui::demo::Fill::Normal {
            mean: 0.0,
            std: 0.02,
        },
    );
    let file = tempfile::NamedTempFile::new().unwrap();
    model.write(file.path()).unwrap();
    cache.add(
        MAIN,
        "model.safetensors",
        &std::fs::read(file.path()).unwrap(),
    );
    cache.set_ref("main", MAIN);
    let before = cache.contents();
    let snapshot = cache.repo().join("snapshots").join(MAIN);
    let inside = [
        snapshot.join("model.int8.safetensors"),
        cache.path().join("quantized"),
        cache.repo().join("model.int8.safetensors"),
    ];
    for output in &inside {
        let output = output.to_str().unwrap();
        let (code, out, err) = cache.run(&["quantize", "org/name", "-o", output, "--yes"]);
        assert_eq!(code, 2, "{output}: {out}{err}");
        assert!(
            err.contains("refusing to write into the Hugging Face cache") && err.contains(output),
            "{err}"
        );
    }
    // Found by its layout, with HF_HUB_CACHE pointing elsewhere and the model given by path.
    let model_path = snapshot.join("model.safetensors");
    let elsewhere = tempfile::tempdir().unwrap();
    let (code, _, err) = run_with(
        &[
            "quantize",
            model_path.to_str().unwrap(),
            "-o",
            snapshot.join("beside.safetensors").to_str().unwrap(),
        ],
        &[("HF_HUB_CACHE", elsewhere.path().as_os_str())],
        None,
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("refusing to write into the Hugging Face cache"),
        "{err}"
    );
    assert_eq!(cache.contents(), before, "the cache changed");
    let out = elsewhere.path().join("name-int8");
    let (code, _, err) = cache.run(&["quantize", "org/name", "-o", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.join("model.safetensors").is_file());
    assert_eq!(cache.contents(), before, "the cache changed");
}

/// The explorer saves a model read from the cache into the current folder, named after the
/// repository (or the file), not beside its snapshot.
#[test]
fn the_default_output_of_a_cached_model_is_outside_the_cache() {
    let cache = FakeCache::new();
    cache.add(MAIN, "model.safetensors", &safetensors_file(&["a.weight"]));
    let snapshot = cache.repo().join("snapshots").join(MAIN);
    let folder = stui::format::Model::open(&snapshot).unwrap();
    let file = stui::format::Model::open(&snapshot.join("model.safetensors")).unwrap();
    for (model, expected) in [(&folder, "name-w4a16"), (&file, "model.w4a16.safetensors")] {
        let output = stui::quantize::default_output(model, stui::quantize::Scheme::W4A16);
        assert_eq!(output, std::env::current_dir().unwrap().join(expected));
    }
    let plain = tempfile::tempdir().unwrap();
    std::fs::copy(
        snapshot.join("model.safetensors"),
        plain.path().join("m.safetensors"),
    )
    .unwrap();
    let model = stui::format::Model::open(&plain.path().join("m.safetensors")).unwrap();
    assert_eq!(
        stui::quantize::default_output(&model, stui::quantize::Scheme::W8A8),
        plain.path().join("m.int8.safetensors")
    );
}
