//! Sharded models: an index and its shards read as one model, and every inconsistency found.

use crate::support;
use std::path::Path;
use stui::demo::{Fill, SyntheticModel};
use stui::finding::Code;
use stui::format::Dtype;
use stui::format::model::{Model, Source};
use stui::tree::{LayerTree, ROOT};

fn shard(names: &[&str]) -> SyntheticModel {
    names.iter().fold(
        SyntheticModel::new(3).metadata("format", "pt"),
        |model, name| model.tensor(name, Dtype::F32, &[2, 2], Fill::Zeros),
    )
}

fn write_index(dir: &Path, total_size: u64, map: &[(&str, &str)]) {
    let map: serde_json::Map<String, serde_json::Value> = map
        .iter()
        .map(|(tensor, file)| ((*tensor).to_owned(), serde_json::Value::from(*file)))
        .collect();
    let index = serde_json::json!({ "metadata": { "total_size": total_size }, "weight_map": map });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

fn codes(model: &Model) -> Vec<&'static str> {
    model.findings.iter().map(|f| f.code.as_str()).collect()
}

#[test]
fn an_index_reads_as_one_model() {
    let dir = tempfile::tempdir().unwrap();
    shard(&["layers.0.w", "layers.1.w"])
        .write(&dir.path().join("model-00001-of-00002.safetensors"))
        .unwrap();
    shard(&["layers.2.w", "layers.10.w"])
        .write(&dir.path().join("model-00002-of-00002.safetensors"))
        .unwrap();
    write_index(
        dir.path(),
        64,
        &[
            ("layers.0.w", "model-00001-of-00002.safetensors"),
            ("layers.1.w", "model-00001-of-00002.safetensors"),
            ("layers.2.w", "model-00002-of-00002.safetensors"),
            ("layers.10.w", "model-00002-of-00002.safetensors"),
        ],
    );
    for path in [
        dir.path().to_owned(),
        dir.path().join("model.safetensors.index.json"),
    ] {
        let model = Model::open(&path).unwrap();
        assert!(model.findings.is_empty(), "{:?}", model.findings);
        assert!(model.is_valid());
        assert_eq!(model.shards.len(), 2);
        let tree = LayerTree::build(&model.tensors, |_| true);
        let names: Vec<_> = tree
            .tensors_below(ROOT)
            .map(|i| (model.tensors[i].name(), model.tensors[i].shard))
            .collect();
        assert_eq!(
            names,
            [
                ("layers.0.w", 0),
                ("layers.1.w", 0),
                ("layers.2.w", 1),
                ("layers.10.w", 1)
            ]
        );
    }
    assert_eq!(Model::open(dir.path()).unwrap().source, Source::Folder);
}

#[test]
fn a_folder_reads_the_file_its_loader_reads_and_names_the_others() {
    let dir = tempfile::tempdir().unwrap();
    // A diffusers variant beside the model: the same tensors again, in half precision.
    for name in [
        "diffusion_pytorch_model.safetensors",
        "diffusion_pytorch_model.fp16.safetensors",
    ] {
        shard(&["conv_in.weight", "conv_in.bias"])
            .write(&dir.path().join(name))
            .unwrap();
    }
    let model = Model::open(dir.path()).unwrap();
    let labels: Vec<_> = model.shards.iter().map(|s| s.label.as_str()).collect();
    assert_eq!(labels, ["diffusion_pytorch_model.safetensors"]);
    assert_eq!(codes(&model), ["folder-other-files"]);
    let note = &model.findings.iter().next().unwrap().message;
    assert!(
        note.contains("`diffusion_pytorch_model.fp16.safetensors`"),
        "{note}"
    );
    assert!(model.is_valid());
    let check = support::run_within(
        support::stui(dir.path(), ["check", "."]),
        std::time::Duration::from_secs(60),
    );
    assert_eq!(check.code, Some(0), "{}", check.stderr);
}

/// Folders that transformers and diffusers write with a half-precision variant beside the
/// model (`tests/fixtures/folders`): stui reads the save that the producer's own
/// `from_pretrained(dir)` reads, the F32 one, and names the variant it passes over.
#[test]
fn folders_with_variants_read_the_save_their_producers_load() {
    use stui::finding::Severity;
    use stui::format::TensorDtype;
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/folders");
    for (name, noted) in [
        (
            "diffusers_unet_fp16_variant",
            Some("diffusion_pytorch_model.fp16.safetensors"),
        ),
        (
            "diffusers_sharded_fp16_variant",
            Some("diffusion_pytorch_model.safetensors.index.fp16.json"),
        ),
        ("transformers_fp16_variant", Some("model.fp16.safetensors")),
    ] {
        let producer: serde_json::Value = serde_json::from_slice(
            &std::fs::read(fixtures.join(name).join("producer.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(
            producer["reads"]["from_pretrained(dir)"], "default",
            "{name}"
        );
        let default_save: Vec<&str> = producer["written"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|file| file.as_str())
            .filter(|file| file.ends_with(".safetensors") && !file.contains(".fp16"))
            .collect();
        let dir = support::rebuild_folder(&fixtures.join(name), &mut |_, _| {});
        let model = Model::open(dir.path()).unwrap();
        let mut read: Vec<&str> = model.shards.iter().map(|s| s.label.as_str()).collect();
        read.sort_unstable();
        assert_eq!(read, default_save, "{name}");
        assert!(
            model
                .tensors
                .iter()
                .all(|t| t.info.dtype == TensorDtype::Known(Dtype::F32)),
            "{name}: a half-precision tensor was read"
        );
        let notes: Vec<_> = model
            .findings
            .iter()
            .filter(|f| f.code == Code::FolderOtherFiles)
            .collect();
        match noted {
            Some(variant) => {
                assert_eq!(notes.len(), 1, "{name}");
                assert!(notes[0].message.contains(&format!("`{variant}`")), "{name}");
            }
            None => assert!(notes.is_empty(), "{name}"),
        }
        assert!(
            model.findings.iter().all(|f| f.severity == Severity::Info),
            "{name}: {:?}",
            model.findings
        );
        let check = support::run_within(
            support::stui(dir.path(), ["check", "."]),
            std::time::Duration::from_secs(60),
        );
        assert_eq!(check.code, Some(0), "{name}: {}", check.stderr);
    }
}

/// Mistral's repositories: `consolidated.safetensors` (the same weights under other names)
/// beside transformers' shards and their index. The index is read and the other file named.
#[test]
fn a_folder_read_through_its_index_names_the_files_the_index_leaves_out() {
    let dir = tempfile::tempdir().unwrap();
    shard(&["model.embed_tokens.weight"])
        .write(&dir.path().join("model-00001-of-00002.safetensors"))
        .unwrap();
    shard(&["lm_head.weight"])
        .write(&dir.path().join("model-00002-of-00002.safetensors"))
        .unwrap();
    shard(&["tok_embeddings.weight", "output.weight"])
        .write(&dir.path().join("consolidated.safetensors"))
        .unwrap();
    write_index(
        dir.path(),
        32,
        &[
            (
                "model.embed_tokens.weight",
                "model-00001-of-00002.safetensors",
            ),
            ("lm_head.weight", "model-00002-of-00002.safetensors"),
        ],
    );
    let model = Model::open(dir.path()).unwrap();
    assert_eq!(model.shards.len(), 2);
    assert_eq!(codes(&model), ["folder-other-files"]);
    let note = &model.findings.iter().next().unwrap().message;
    assert_eq!(
        note,
        "not read beside `model.safetensors.index.json` and the shards it names: \
         `consolidated.safetensors` (loaders read those alone; open another by its path)"
    );
    // Named by its index's path, the index is what the user chose: nothing is noted.
    let model = Model::open(&dir.path().join("model.safetensors.index.json")).unwrap();
    assert!(model.findings.is_empty(), "{:?}", model.findings);
}

/// A pipeline diffusers saved whole (`tests/fixtures/folders/diffusers_pipeline`) has no model
/// at its top: the error names the components with weights, those the producer's own
/// `DiffusionPipeline.from_pretrained` loads as modules, and each one named opens.
#[test]
fn a_pipelines_folder_names_its_components() {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/folders/diffusers_pipeline");
    let producer: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture.join("producer.json")).unwrap()).unwrap();
    let components: Vec<&str> = producer["components_with_weights"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c.as_str())
        .collect();
    assert_eq!(components, ["unet", "vqvae"]);
    let dir = support::rebuild_folder(&fixture, &mut |_, _| {});
    let check = support::run_within(
        support::stui(dir.path(), ["check", "."]),
        std::time::Duration::from_secs(60),
    );
    assert_eq!(check.code, Some(2), "{}", check.stderr);
    assert!(
        check.stderr.contains(
            "no .safetensors file or index in this folder; its folders `unet`, `vqvae` hold \
             models: open one by its path, e.g. ./unet"
        ),
        "{}",
        check.stderr
    );
    for component in components {
        let model = Model::open(&dir.path().join(component)).unwrap();
        assert!(
            model.findings.is_empty(),
            "{component}: {:?}",
            model.findings
        );
    }
}

/// The FLUX.1 and Stable Diffusion 3.5 repositories: a single-file checkpoint at the top of a
/// diffusers pipeline's folder. The checkpoint is read and the components are named; two
/// checkpoints at the top (Stable Diffusion XL's, one with another VAE) are refused as separate
/// models, naming the components too.
#[test]
fn a_pipeline_with_a_checkpoint_of_its_own_names_its_components() {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/folders/diffusers_pipeline");
    let dir = support::rebuild_folder(&fixture, &mut |_, _| {});
    shard(&["model.diffusion_model.input_blocks.0.0.weight"])
        .write(&dir.path().join("ldm.safetensors"))
        .unwrap();
    let model = Model::open(dir.path()).unwrap();
    assert_eq!(model.shards.len(), 1);
    assert_eq!(codes(&model), ["folder-components"]);
    let shown = dir.path().display();
    assert_eq!(
        model.findings.iter().next().unwrap().message,
        format!(
            "its folders `unet`, `vqvae` hold models, not read with this one: open one by its \
             path, e.g. {shown}/unet"
        )
    );
    shard(&["model.diffusion_model.input_blocks.0.0.weight"])
        .write(&dir.path().join("ldm_other_vae.safetensors"))
        .unwrap();
    let error = Model::open(dir.path()).unwrap_err().to_string();
    assert!(
        error.contains("separate models")
            && error.ends_with(&format!(
                "; its folders `unet`, `vqvae` hold models: open one by its path, e.g. \
                 {shown}/unet"
            )),
        "{error}"
    );
}

/// A cache snapshot's files are links: links to files are not taken for subfolders, however
/// many, and a link to a folder holding a model is a component like a folder.
#[test]
fn components_are_found_among_many_links() {
    let dir = tempfile::tempdir().unwrap();
    shard(&["x"])
        .write(&dir.path().join("model.safetensors"))
        .unwrap();
    std::fs::write(dir.path().join("target.json"), "{}").unwrap();
    for i in 0..300 {
        std::os::unix::fs::symlink("target.json", dir.path().join(format!("link{i:03}.json")))
            .unwrap();
    }
    let elsewhere = tempfile::tempdir().unwrap();
    for folder in [dir.path().join("vae"), elsewhere.path().to_owned()] {
        std::fs::create_dir_all(&folder).unwrap();
        shard(&["y"])
            .write(&folder.join("diffusion_pytorch_model.safetensors"))
            .unwrap();
    }
    std::os::unix::fs::symlink(elsewhere.path(), dir.path().join("text_encoder")).unwrap();
    let model = Model::open(dir.path()).unwrap();
    assert_eq!(codes(&model), ["folder-components"]);
    let note = &model.findings.iter().next().unwrap().message;
    assert!(
        note.starts_with("its folders `text_encoder`, `vae` hold models"),
        "{note}"
    );
}

/// What `from_pretrained(dir, variant="fp16")` downloads of a sharded save: the variant's shards
/// and its index alone. That index is followed, as diffusers follows it.
#[test]
fn a_folder_of_one_variant_follows_its_index() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/folders/diffusers_sharded_fp16_variant");
    let dir = support::rebuild_folder(&fixture, &mut |_, _| {});
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("diffusion_pytorch_model") && !name.contains("fp16") {
            std::fs::remove_file(path).unwrap();
        }
    }
    let model = Model::open(dir.path()).unwrap();
    assert_eq!(model.source, Source::Folder);
    assert_eq!(model.shards.len(), 6);
    assert!(
        model
            .shards
            .iter()
            .all(|s| s.label.starts_with("diffusion_pytorch_model.fp16-")),
        "{:?}",
        model.shards
    );
    assert!(model.findings.is_empty(), "{:?}", model.findings);
    // The index is read: a shard it names and the folder lacks is a finding.
    std::fs::remove_file(
        dir.path()
            .join("diffusion_pytorch_model.fp16-00006-of-00006.safetensors"),
    )
    .unwrap();
    let model = Model::open(dir.path()).unwrap();
    assert!(
        model.findings.iter().any(|f| f.code == Code::ShardMissing),
        "{:?}",
        model.findings
    );
}

/// Each producer's folder of a default save (F32) and an `fp16` variant (F16) is read as its
/// `from_pretrained(dir)` and `from_pretrained(dir, variant="fp16")` read it (`producer.json`).
#[test]
fn a_variant_asked_for_is_read_as_from_pretrained_reads_it() {
    for fixture in [
        "transformers_fp16_variant",
        "diffusers_unet_fp16_variant",
        "diffusers_sharded_fp16_variant",
    ] {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/folders")
            .join(fixture);
        let producer: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fixture.join("producer.json")).unwrap()).unwrap();
        let reads = &producer["reads"];
        assert_eq!(reads["from_pretrained(dir)"], "default");
        assert_eq!(reads["from_pretrained(dir, variant='fp16')"], "fp16");
        let dir = support::rebuild_folder(&fixture, &mut |_, _| {});
        for (variant, dtype) in [(None, Dtype::F32), (Some("fp16"), Dtype::F16)] {
            let model = Model::open_variant(dir.path(), variant).unwrap();
            let shown = format!("{fixture:?} {variant:?}: {:?}", model.shards);
            assert!(!model.tensors.is_empty(), "{shown}");
            assert!(
                model
                    .tensors
                    .iter()
                    .all(|t| t.info.dtype.known() == Some(dtype)),
                "{shown}"
            );
            assert!(
                model
                    .shards
                    .iter()
                    .all(|s| s.label.contains(".fp16") == variant.is_some()),
                "{shown}"
            );
            let passed_over = model
                .findings
                .iter()
                .find(|f| f.code == Code::FolderOtherFiles)
                .map(|f| f.message.clone())
                .unwrap_or_default();
            // The default save names the variant it passes over and how to read it.
            assert_eq!(
                passed_over.contains("or a variant with --variant: `fp16`"),
                variant.is_none(),
                "{passed_over}"
            );
        }
        let error = Model::open_variant(dir.path(), Some("bf16"))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("no `bf16` variant") && error.contains("its variants: `fp16`"),
            "{error}"
        );
    }
}

/// `diff --variant` of a folder against a file: the folder's variant against the file as it is.
#[test]
fn a_variant_is_compared_with_a_file_read_as_it_is() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/folders/transformers_fp16_variant");
    let dir = support::rebuild_folder(&fixture, &mut |_, _| {});
    let elsewhere = tempfile::tempdir().unwrap();
    let copy = elsewhere.path().join("half.safetensors");
    std::fs::copy(dir.path().join("model.fp16.safetensors"), &copy).unwrap();
    let diff = |variant: &[&str]| {
        let args = [
            &["diff"][..],
            variant,
            &[dir.path().to_str().unwrap(), copy.to_str().unwrap()],
        ]
        .concat();
        support::run_within(
            support::stui(dir.path(), args),
            std::time::Duration::from_secs(60),
        )
    };
    let same = diff(&["--variant", "fp16"]);
    assert_eq!(
        same.code,
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&same.stdout),
        same.stderr
    );
    let other = diff(&[]);
    assert_eq!(
        other.code,
        Some(1),
        "{}{}",
        String::from_utf8_lossy(&other.stdout),
        other.stderr
    );
    assert!(
        Model::open_variant(&copy, Some("fp16"))
            .unwrap_err()
            .to_string()
            .contains("is a file"),
        "a single model named by its file is not read for a variant"
    );
}

#[test]
fn files_holding_the_same_tensors_with_no_index_are_separate_models() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "sd_xl_base_1.0.safetensors",
        "sd_xl_base_1.0_0.9vae.safetensors",
    ] {
        shard(&["first_stage_model.decoder.conv_in.weight", "model.x"])
            .write(&dir.path().join(name))
            .unwrap();
    }
    let error = Model::open(dir.path()).unwrap_err().to_string();
    for part in [
        "2 .safetensors files and no index, and they are separate models",
        "`sd_xl_base_1.0.safetensors` and `sd_xl_base_1.0_0.9vae.safetensors` both hold \
         `first_stage_model.decoder.conv_in.weight`",
        "open one of them by its path",
    ] {
        assert!(error.contains(part), "{error}");
    }
    let check = support::run_within(
        support::stui(dir.path(), ["check", "."]),
        std::time::Duration::from_secs(60),
    );
    assert_eq!(check.code, Some(2), "{}", check.stderr);
    assert!(check.stderr.contains("separate models"), "{}", check.stderr);
    assert!(check.no_panic());
}

#[test]
fn several_indexes_none_a_loaders_own_are_named_for_the_user_to_choose() {
    let dir = tempfile::tempdir().unwrap();
    for stem in ["consolidated", "original"] {
        let shard_name = format!("{stem}-00001-of-00001.safetensors");
        shard(&["w"]).write(&dir.path().join(&shard_name)).unwrap();
        let index = serde_json::json!({ "metadata": {}, "weight_map": { "w": shard_name } });
        std::fs::write(
            dir.path().join(format!("{stem}.safetensors.index.json")),
            index.to_string(),
        )
        .unwrap();
    }
    let error = Model::open(dir.path()).unwrap_err().to_string();
    assert!(
        error.contains(
            "2 indexes and none is `model.safetensors.index.json`: open one of them by its path \
             (`consolidated.safetensors.index.json`, `original.safetensors.index.json`)"
        ),
        "{error}"
    );
}

#[test]
fn files_with_no_index_and_their_own_tensors_read_as_one_model() {
    let dir = tempfile::tempdir().unwrap();
    shard(&["decoder.conv_in.weight"])
        .write(&dir.path().join("ae.safetensors"))
        .unwrap();
    shard(&["double_blocks.0.img_attn.qkv.weight"])
        .write(&dir.path().join("flux1-dev.safetensors"))
        .unwrap();
    let model = Model::open(dir.path()).unwrap();
    assert_eq!(model.shards.len(), 2);
    // Read as one, and said to be: the tree shows two models' roots side by side.
    assert_eq!(codes(&model), ["folder-parts"]);
    assert_eq!(
        model.findings.iter().next().unwrap().message,
        "read side by side as one model, with no index to say they are one: `ae.safetensors`, \
         `flux1-dev.safetensors` (each opens alone by its path)"
    );
}

#[test]
fn every_index_inconsistency_is_a_finding() {
    let dir = tempfile::tempdir().unwrap();
    shard(&["a", "b", "twice"])
        .write(&dir.path().join("one.safetensors"))
        .unwrap();
    shard(&["c", "twice"])
        .write(&dir.path().join("two.safetensors"))
        .unwrap();
    write_index(
        dir.path(),
        1,
        &[
            ("a", "one.safetensors"),
            ("ghost", "one.safetensors"),
            ("c", "two.safetensors"),
            ("twice", "one.safetensors"),
            ("lost", "three.safetensors"),
            ("escape", "../outside.safetensors"),
        ],
    );
    let model = Model::open(dir.path()).unwrap();
    let mut found = codes(&model);
    found.sort_unstable();
    assert_eq!(
        found,
        [
            "index-path-escapes",
            "index-tensor-missing",
            "shard-missing",
            "tensor-in-two-shards",
            "tensor-not-in-index",
        ]
    );
    let missing = model
        .findings
        .iter()
        .find(|f| f.code == Code::IndexTensorMissing)
        .unwrap();
    assert_eq!(missing.tensor.as_deref(), Some("ghost"));
    let unmapped = model
        .findings
        .iter()
        .find(|f| f.code == Code::TensorNotInIndex)
        .unwrap();
    assert_eq!(unmapped.tensor.as_deref(), Some("b"));
    assert!(!model.is_valid(), "a missing shard makes the model invalid");
}

#[test]
fn an_index_whose_every_shard_is_refused_is_not_valid() {
    let dir = tempfile::tempdir().unwrap();
    let inner = dir.path().join("inner");
    std::fs::create_dir(&inner).unwrap();
    write_index(&inner, 0, &[("escape", "../outside.safetensors")]);
    let model = Model::open(&inner).unwrap();
    assert_eq!(codes(&model), ["index-path-escapes"]);
    assert!(model.shards.is_empty(), "the refused path is never opened");
    assert!(!model.is_valid(), "nothing was read, so nothing is valid");
}

#[test]
fn a_wrong_total_size_is_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    shard(&["a"])
        .write(&dir.path().join("one.safetensors"))
        .unwrap();
    write_index(dir.path(), 17, &[("a", "one.safetensors")]);
    let model = Model::open(dir.path()).unwrap();
    assert_eq!(codes(&model), ["index-total-size"]);
    assert!(model.findings[0].message.contains("17"));
    assert!(model.is_valid());
}

#[test]
fn a_folder_without_index_reads_its_files_in_natural_order() {
    let dir = tempfile::tempdir().unwrap();
    shard(&["x"])
        .write(&dir.path().join("part-10.safetensors"))
        .unwrap();
    shard(&["y"])
        .write(&dir.path().join("part-2.safetensors"))
        .unwrap();
    let model = Model::open(dir.path()).unwrap();
    let labels: Vec<_> = model.shards.iter().map(|s| s.label.as_str()).collect();
    assert_eq!(labels, ["part-2.safetensors", "part-10.safetensors"]);
}

#[test]
fn a_bad_shard_is_reported_in_its_file() {
    let dir = tempfile::tempdir().unwrap();
    shard(&["a"])
        .write(&dir.path().join("one.safetensors"))
        .unwrap();
    support::write(
        dir.path(),
        "two.safetensors",
        b"version https://git-lfs.github.com/spec/v1\n",
    );
    write_index(
        dir.path(),
        16,
        &[("a", "one.safetensors"), ("b", "two.safetensors")],
    );
    let model = Model::open(dir.path()).unwrap();
    let lfs = model
        .findings
        .iter()
        .find(|f| f.code == Code::NotSafetensors)
        .unwrap();
    assert_eq!(lfs.file.as_deref(), Some("two.safetensors"));
    assert!(model.first_rejection().is_some());
}

#[test]
fn an_empty_folder_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    assert!(Model::open(dir.path()).is_err());
}

/// An index written with its entries in the order given (the shards' own order, as DeepSeek-V3's
/// lists them), not sorted by name.
fn write_index_in_order(dir: &Path, map: &[(&str, &str)]) {
    let entries: Vec<String> = map
        .iter()
        .map(|(tensor, file)| format!("\"{tensor}\": \"{file}\""))
        .collect();
    let index = format!("{{\"weight_map\": {{{}}}}}", entries.join(", "));
    std::fs::write(dir.join("model.safetensors.index.json"), index).unwrap();
}

/// Every finding of a model, in a stable order.
fn all_findings(model: &Model) -> Vec<String> {
    let mut all: Vec<String> = model.findings.iter().map(|f| format!("{f:?}")).collect();
    all.sort_unstable();
    all
}

/// The first shard's names, the second's (none: it is missing), the index, the codes found.
type Case<'a> = (
    &'a [&'a str],
    &'a [&'a str],
    &'a [(&'a str, &'a str)],
    &'a [&'a str],
);

/// An index that lists the shards' tensors in their order is followed without looking names up;
/// where a shard strays from it, the names are looked up from then on: the findings are those of
/// the same index in another order.
#[test]
fn an_index_in_the_shards_order_gives_the_same_findings_as_any_other() {
    let one = "one.safetensors";
    let two = "two.safetensors";
    let cases: [Case<'_>; 5] = [
        (
            &["a", "b"],
            &["c", "d"],
            &[("a", one), ("b", one), ("c", two), ("d", two)],
            &[],
        ),
        (
            &["a", "b"],
            &["b", "c"],
            &[("a", one), ("b", one), ("c", two)],
            &["tensor-in-two-shards"],
        ),
        (&["a"], &[], &[("a", one), ("z", two)], &["shard-missing"]),
        (
            &["a", "b"],
            &["c"],
            &[("a", one), ("b", one), ("c", two), ("ghost", two)],
            &["index-tensor-missing"],
        ),
        (
            &["a"],
            &["b"],
            &[("a", one), ("b", one)],
            // `two.safetensors` is in the folder and not in the index: named, not read.
            &["folder-other-files", "index-tensor-missing"],
        ),
    ];
    for (first, second, map, expected) in cases {
        let dir = tempfile::tempdir().unwrap();
        shard(first).write(&dir.path().join(one)).unwrap();
        if !second.is_empty() {
            shard(second).write(&dir.path().join(two)).unwrap();
        }
        write_index_in_order(dir.path(), map);
        let followed = Model::open(dir.path()).unwrap();
        let mut found = codes(&followed);
        found.sort_unstable();
        found.dedup();
        assert_eq!(found, expected, "{map:?}");
        let reversed: Vec<(&str, &str)> = map.iter().rev().copied().collect();
        write_index_in_order(dir.path(), &reversed);
        let looked_up = Model::open(dir.path()).unwrap();
        assert_eq!(all_findings(&followed), all_findings(&looked_up), "{map:?}");
        let names = |model: &Model| -> Vec<(String, usize)> {
            model
                .tensors
                .iter()
                .map(|t| (t.name().to_owned(), t.shard))
                .collect()
        };
        assert_eq!(names(&followed), names(&looked_up), "{map:?}");
    }
}

/// Shards read while the index is read and shards opened after it (the index turns out not to
/// be in the canonical form at an escaped name) are added alike, in the index's order, on any
/// number of threads.
#[test]
fn shards_read_early_and_late_are_added_in_the_index_order() {
    let dir = tempfile::tempdir().unwrap();
    let labels: Vec<String> = (0..6).map(|i| format!("s{i}.safetensors")).collect();
    let names: Vec<[String; 2]> = (0..6)
        .map(|i| [format!("t{i}a"), format!("t{i}b")])
        .collect();
    for (label, pair) in labels.iter().zip(&names) {
        shard(&[&pair[0], &pair[1]])
            .write(&dir.path().join(label))
            .unwrap();
    }
    let entries = |escaped: bool| -> String {
        let mut entries: Vec<String> = Vec::new();
        for (label, pair) in labels.iter().zip(&names) {
            for name in pair {
                entries.push(format!("\"{name}\":\"{label}\""));
            }
        }
        if escaped {
            // The first name of the second shard: the first shard is read early, the others
            // after the index.
            entries[2] = entries[2].replacen("t1a", "t1\\u0061", 1);
        }
        format!("{{\"weight_map\":{{{}}}}}", entries.join(","))
    };
    let listing = |model: &Model| -> Vec<(String, String)> {
        model
            .tensors
            .iter()
            .map(|t| (t.name().to_owned(), model.shard_of(t).label.clone()))
            .collect()
    };
    let expected: Vec<(String, String)> = labels
        .iter()
        .zip(&names)
        .flat_map(|(label, pair)| pair.iter().map(|n| (n.clone(), label.clone())))
        .collect();
    for threads in [1, 2, 4] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for escaped in [false, true] {
            std::fs::write(
                dir.path().join("model.safetensors.index.json"),
                entries(escaped),
            )
            .unwrap();
            let model = pool.install(|| Model::open(dir.path()).unwrap());
            assert_eq!(listing(&model), expected, "{threads} threads, {escaped}");
            assert!(
                all_findings(&model).is_empty(),
                "{:?}",
                all_findings(&model)
            );
        }
    }
}
