//! Architectures, layer patterns and layer checks on the checkpoints the real producers wrote
//! (`tests/fixtures/arch`, rebuilt here with zeroed data), clean and with planted defects.

use crate::support::{arch_families, arch_fixtures, rebuild_fixture};
use serde_json::{Map, Value};
use std::path::Path;
use std::process::Command;

fn stui_json(args: &[&str], path: &Path) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_stui"))
        .args(args)
        .arg(path)
        .arg("--json")
        .output()
        .unwrap();
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "{args:?} {}: {error}\n{}",
            path.display(),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// The findings of `stui check` that are warnings or errors, as `code: message`.
fn problems(path: &Path) -> Vec<String> {
    let report = stui_json(&["check"], path);
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["severity"] != "info")
        .map(|f| {
            let tensor = f["tensor"]
                .as_str()
                .map_or(String::new(), |t| format!(" [{t}]"));
            format!(
                "{}: {}{tensor}",
                f["code"].as_str().unwrap(),
                f["message"].as_str().unwrap()
            )
        })
        .collect()
}

fn config_of(family: &str) -> Map<String, Value> {
    let path = arch_fixtures().join(family).join("config.json");
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap(),
        Err(_) => Map::new(),
    }
}

/// The name a config gives its model, read here as each producer writes it.
fn config_name(config: &Map<String, Value>) -> Option<&str> {
    ["model_type", "_class_name", "architecture"]
        .iter()
        .find_map(|key| config.get(*key)?.as_str())
}

#[test]
fn every_producers_checkpoint_is_clean_and_named_by_its_config() {
    let families = arch_families();
    assert!(families.len() >= 30, "{families:?}");
    let mut failures = Vec::new();
    for family in &families {
        let dir = rebuild_fixture(family, &mut |_, _| {});
        let problems = problems(dir.path());
        if !problems.is_empty() {
            failures.push(format!("{family}: {problems:#?}"));
        }
        let inspect = stui_json(&["inspect"], dir.path());
        let architecture = &inspect["architecture"];
        assert_eq!(architecture["named_by"], "config", "{family}");
        let config = config_of(family);
        if let Some(name) = config_name(&config) {
            assert_eq!(architecture["model_type"], name, "{family}");
        } else {
            let adapter: Map<String, Value> = serde_json::from_slice(
                &std::fs::read(arch_fixtures().join(family).join("adapter_config.json")).unwrap(),
            )
            .unwrap();
            assert_eq!(architecture["adapter"]["peft_type"], adapter["peft_type"]);
            assert_eq!(architecture["adapter"]["rank"], adapter["r"]);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every decoder whose sizes are read from its tensors has them all: the hidden size, the
/// vocabulary and the width of its MLP or of its experts, among them the MLPs without a gate
/// (`fc1`, `c_fc`) and Granite's experts fused in `input_linear`. That the config agrees is held
/// by the test of clean checkpoints above.
#[test]
fn every_decoder_read_from_its_tensors_has_its_widths() {
    let mut read = 0;
    for family in arch_families() {
        let dir = rebuild_fixture(&family, &mut |_, _| {});
        let inspect = stui_json(&["inspect"], dir.path());
        let architecture = &inspect["architecture"];
        if architecture["layers"].is_null() {
            continue;
        }
        read += 1;
        for key in ["hidden_size", "vocab_size"] {
            assert!(architecture[key].is_u64(), "{family}: {key} {architecture}");
        }
        assert!(
            architecture["intermediate_size"].is_u64()
                || architecture["expert_intermediate_size"].is_u64(),
            "{family}: no width {architecture}"
        );
    }
    assert!(read >= 40, "{read}");
}

/// Each layer's kind as the tensors the producer saved show it: whether it holds experts, and
/// what mixes tokens (attention, linear attention, Mamba).
fn saved_kinds(family: &str, stack: &str) -> Vec<(bool, &'static str)> {
    let producer: Value = serde_json::from_slice(
        &std::fs::read(arch_fixtures().join(family).join("producer.json")).unwrap(),
    )
    .unwrap();
    let mut layers: Vec<(bool, &'static str)> = Vec::new();
    for names in producer["saved_keys"].as_object().unwrap().values() {
        for name in names.as_array().unwrap() {
            let Some(rest) = name.as_str().unwrap().strip_prefix(&format!("{stack}.")) else {
                continue;
            };
            let (layer, part) = rest.split_once('.').unwrap();
            let layer: usize = layer.parse().unwrap();
            if layers.len() <= layer {
                layers.resize(layer + 1, (false, ""));
            }
            let entry = &mut layers[layer];
            entry.0 |= part.contains("experts");
            if part.starts_with("linear_attn.") {
                entry.1 = "linear";
            } else if part.starts_with("mamba.") {
                entry.1 = "mamba";
            } else if (part.starts_with("self_attn.") || part.starts_with("layer.0.SelfAttention."))
                && entry.1.is_empty()
            {
                entry.1 = "attention";
            }
        }
    }
    layers
}

#[test]
fn the_layer_pattern_of_mixed_models_matches_what_they_saved() {
    for family in [
        "deepseek_v3",
        "qwen3_next",
        "jamba",
        "llama4_text",
        "gpt_oss",
        "switch_transformers",
    ] {
        let dir = rebuild_fixture(family, &mut |_, _| {});
        let inspect = stui_json(&["inspect"], dir.path());
        let architecture = &inspect["architecture"];
        let others = architecture["other_patterns"].as_array().cloned();
        for pattern in
            std::iter::once(&architecture["layer_pattern"]).chain(others.iter().flatten())
        {
            check_pattern(family, pattern, dir.path());
        }
    }
}

/// A pattern `inspect --json` gives is the one the producer saved: each layer's experts and
/// mixer, multi-token-prediction layers said to be unstored, and the same words in `inspect`.
fn check_pattern(family: &str, pattern: &Value, dir: &Path) {
    let stack = pattern["stack"].as_str().unwrap();
    let saved = saved_kinds(family, stack);
    let kinds = pattern["kinds"].as_array().unwrap();
    let mut declared: Vec<(bool, &str)> = Vec::new();
    for run in pattern["runs"].as_array().unwrap() {
        let kind = &kinds[usize::try_from(run["kind"].as_u64().unwrap()).unwrap()];
        if kind["next_token_prediction"] == true {
            continue;
        }
        let mixer = match kind["mixer"].as_str().unwrap() {
            "linear_attention" => "linear",
            "mamba" => "mamba",
            _ => "attention",
        };
        for _ in run["first"].as_u64().unwrap()..=run["last"].as_u64().unwrap() {
            declared.push((kind["mlp"]["type"] == "moe", mixer));
        }
    }
    assert_eq!(declared, saved, "{family}: {}", pattern["summary"]);
    // transformers does not save the multi-token-prediction layer DeepSeek-V3 declares.
    let unstored = pattern["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .any(|kind| kind["next_token_prediction"] == true);
    assert_eq!(
        pattern["summary"]
            .as_str()
            .unwrap()
            .contains("multi-token prediction (not stored)"),
        unstored,
        "{family}: {}",
        pattern["summary"]
    );
    let text = Command::new(env!("CARGO_BIN_EXE_stui"))
        .arg("inspect")
        .arg(dir)
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    let summary = pattern["summary"].as_str().unwrap();
    assert!(text.contains(&format!("`{stack}` {summary}")), "{text}");
}

/// The decoder-only language models among the fixtures, with the stack their pattern
/// describes.
fn language_models() -> Vec<(String, String)> {
    let mut models = Vec::new();
    for family in arch_families() {
        let config = config_of(&family);
        let causal = config
            .get("architectures")
            .and_then(Value::as_array)
            .is_some_and(|list| {
                list.iter()
                    .any(|a| a.as_str().unwrap().ends_with("ForCausalLM"))
            });
        let text = config
            .get("text_config")
            .and_then(Value::as_object)
            .unwrap_or(&config);
        if !causal || text.get("num_hidden_layers").is_none() {
            continue;
        }
        let dir = rebuild_fixture(&family, &mut |_, _| {});
        let inspect = stui_json(&["inspect"], dir.path());
        let pattern = &inspect["architecture"]["layer_pattern"];
        if let Some(stack) = pattern["stack"].as_str() {
            models.push((family, stack.to_owned()));
        }
    }
    models
}

/// The names below the layer number of the tensors of `stack` in every layer that has any,
/// with the layers that hold each (from the fixture's headers).
fn layer_tensors(family: &str, stack: &str) -> Vec<(String, Vec<u64>, Vec<u64>)> {
    let mut by_suffix: std::collections::BTreeMap<String, (Vec<u64>, Vec<u64>)> =
        std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(arch_fixtures().join(family)).unwrap() {
        let path = entry.unwrap().path();
        if !path.to_string_lossy().ends_with(".header") {
            continue;
        }
        for (name, info) in crate::support::read_header(&path) {
            let Some(rest) = name.strip_prefix(&format!("{stack}.")) else {
                continue;
            };
            let (layer, suffix) = rest.split_once('.').unwrap();
            let entry = by_suffix.entry(suffix.to_owned()).or_default();
            entry.0.push(layer.parse().unwrap());
            entry.1 = info["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
        }
    }
    by_suffix
        .into_iter()
        .map(|(suffix, (mut layers, shape))| {
            layers.sort_unstable();
            (suffix, layers, shape)
        })
        .collect()
}

/// A checkpoint without one expert of the last layer that has experts one by one, and what
/// a finding naming it says.
fn remove_one_expert(
    family: &str,
    stack: &str,
    tensors: &[(String, Vec<u64>, Vec<u64>)],
) -> Option<(&'static str, tempfile::TempDir, impl Fn(&str) -> bool)> {
    let layer = tensors
        .iter()
        .filter(|(suffix, _, _)| suffix.contains("experts.1."))
        .filter_map(|(_, present, _)| present.last().copied())
        .max()?;
    let expert: Vec<String> = tensors
        .iter()
        .filter(|(suffix, present, _)| suffix.contains("experts.1.") && present.contains(&layer))
        .map(|(suffix, _, _)| suffix.clone())
        .collect();
    let prefix = format!("{stack}.{layer}.");
    let dir = rebuild_fixture(
        family,
        &mut remove_where(|name| {
            name.strip_prefix(&prefix)
                .is_some_and(|s| expert.iter().any(|e| e == s))
        }),
    );
    let layer_name = format!("`{stack}.{layer}");
    Some(("one expert removed", dir, move |p: &str| {
        p.contains(&layer_name) && expert.iter().all(|e| p.contains(e.as_str()))
    }))
}

fn remove_where(pred: impl Fn(&str) -> bool) -> impl FnMut(&str, &mut Map<String, Value>) {
    move |file: &str, map: &mut Map<String, Value>| {
        if file != "config.json" {
            map.retain(|name, _| !pred(name));
        }
    }
}

#[test]
fn planted_defects_in_each_language_model_are_named() {
    let models = language_models();
    assert!(models.len() >= 20, "{models:?}");
    let mut failures = Vec::new();
    let mut check =
        |family: &str, what: &str, dir: &tempfile::TempDir, expect: &dyn Fn(&str) -> bool| {
            let found = problems(dir.path());
            if !found.iter().any(|p| expect(p)) {
                failures.push(format!("{family}, {what}: {found:#?}"));
            }
        };
    for (family, stack) in &models {
        let tensors = layer_tensors(family, stack);
        let layers = &tensors
            .iter()
            .filter_map(|(_, present, _)| present.last())
            .max()
            .map_or(0, |last| last + 1);
        let last = layers - 1;
        // Tensors of the last layer that every layer has, or at least one other.
        let shared = |all: bool| -> Vec<&(String, Vec<u64>, Vec<u64>)> {
            tensors
                .iter()
                .filter(|(_, present, _)| {
                    present.contains(&last)
                        && if all {
                            present.len() as u64 == *layers
                        } else {
                            present.len() >= 2
                        }
                })
                .collect()
        };
        let mut everywhere = shared(true);
        if everywhere.is_empty() {
            everywhere = shared(false);
        }
        assert!(
            !everywhere.is_empty(),
            "{family} {stack}: no tensor in two layers"
        );
        // One tensor of the last layer.
        let (suffix, _, _) = everywhere[everywhere.len() / 2];
        let removed = format!("{stack}.{last}.{suffix}");
        let dir = rebuild_fixture(family, &mut remove_where(|name| name == removed));
        check(family, "one tensor removed", &dir, &|p| {
            p.contains(&format!("`{removed}`"))
        });
        // One shape transposed.
        if let Some((suffix, _, _)) = everywhere
            .iter()
            .find(|(_, _, shape)| shape.len() == 2 && shape[0] != shape[1])
        {
            let name = format!("{stack}.{last}.{suffix}");
            let dir = rebuild_fixture(family, &mut |file, map| {
                if file != "config.json"
                    && let Some(entry) = map.get_mut(&name)
                {
                    let shape = entry["shape"].as_array_mut().unwrap();
                    shape.reverse();
                }
            });
            check(family, "one shape transposed", &dir, &|p| {
                p.starts_with("layer-mismatch") && p.ends_with(&format!("[{name}]"))
            });
        }
        if let Some((what, dir, expect)) = remove_one_expert(family, stack, &tensors) {
            check(family, what, &dir, &expect);
        }
        // A layer missing entirely.
        let prefix = format!("{stack}.0.");
        let dir = rebuild_fixture(family, &mut remove_where(|name| name.starts_with(&prefix)));
        check(family, "layer 0 removed", &dir, &|p| {
            p.starts_with("layer-missing: layer 0 is missing")
        });
        // A wrong layer count in the config.
        let dir = rebuild_fixture(family, &mut |file, map| {
            if file == "config.json" {
                let text = match map.get_mut("text_config") {
                    Some(Value::Object(text)) => text,
                    _ => map,
                };
                let n = text["num_hidden_layers"].as_u64().unwrap();
                text.insert("num_hidden_layers".into(), Value::from(n + 2));
            }
        });
        check(family, "num_hidden_layers + 2", &dir, &|p| {
            p.starts_with("config-mismatch") && p.contains("`num_hidden_layers`")
        });
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The stacks of the encoders, encoder-decoders and vision towers among the fixtures, with
/// where their config gives the layer count.
const SIDE_STACKS: &[(&str, &str, &[&str])] = &[
    ("bert", "bert.encoder.layer", &["num_hidden_layers"]),
    (
        "clip",
        "text_model.encoder.layers",
        &["text_config", "num_hidden_layers"],
    ),
    (
        "clip",
        "vision_model.encoder.layers",
        &["vision_config", "num_hidden_layers"],
    ),
    ("bart", "model.encoder.layers", &["encoder_layers"]),
    ("bart", "model.decoder.layers", &["decoder_layers"]),
    ("whisper", "model.encoder.layers", &["encoder_layers"]),
    ("whisper", "model.decoder.layers", &["decoder_layers"]),
    ("t5", "encoder.block", &["num_layers"]),
    ("t5", "decoder.block", &["num_decoder_layers"]),
    (
        "encoder_decoder",
        "encoder.encoder.layer",
        &["encoder", "num_hidden_layers"],
    ),
    (
        "encoder_decoder",
        "decoder.bert.encoder.layer",
        &["decoder", "num_hidden_layers"],
    ),
    (
        "llava",
        "vision_tower.encoder.layers",
        &["vision_config", "num_hidden_layers"],
    ),
    (
        "gemma3",
        "vision_tower.encoder.layers",
        &["vision_config", "num_hidden_layers"],
    ),
    (
        "llama4",
        "vision_model.model.layers",
        &["vision_config", "num_hidden_layers"],
    ),
    ("qwen2_5_vl", "visual.blocks", &["vision_config", "depth"]),
];

/// The value at `path` in a config.
fn config_value<'m>(config: &'m mut Map<String, Value>, path: &[&str]) -> &'m mut Value {
    let (last, sections) = path.split_last().unwrap();
    let mut map = config;
    for section in sections {
        map = map.get_mut(*section).unwrap().as_object_mut().unwrap();
    }
    map.get_mut(*last).unwrap()
}

/// Every layer pattern `inspect --json` shows.
fn shown_patterns(inspect: &Value) -> Vec<&Value> {
    let architecture = &inspect["architecture"];
    std::iter::once(&architecture["layer_pattern"])
        .chain(
            architecture["other_patterns"]
                .as_array()
                .into_iter()
                .flatten(),
        )
        .collect()
}

#[test]
fn planted_defects_in_encoders_decoders_and_towers_are_named() {
    let mut failures = Vec::new();
    let mut check = |what: String, dir: &tempfile::TempDir, expect: &dyn Fn(&str) -> bool| {
        let found = problems(dir.path());
        if !found.iter().any(|p| expect(p)) {
            failures.push(format!("{what}: {found:#?}"));
        }
    };
    for &(family, stack, count) in SIDE_STACKS {
        let dir = rebuild_fixture(family, &mut |_, _| {});
        let inspect = stui_json(&["inspect"], dir.path());
        let part = match count[0] {
            "vision_config" => "vision",
            "encoder_layers" | "num_layers" | "encoder" => "encoder",
            "decoder_layers" | "num_decoder_layers" | "decoder" => "decoder",
            _ => "main",
        };
        assert!(
            shown_patterns(&inspect)
                .iter()
                .any(|p| p["stack"] == stack && p["part"] == part),
            "{family}: no {part} pattern for {stack}: {inspect:#}"
        );
        let tensors = layer_tensors(family, stack);
        let in_both: Vec<_> = tensors
            .iter()
            .filter(|(_, present, _)| present.contains(&0) && present.contains(&1))
            .collect();
        assert!(in_both.len() >= 4, "{family} {stack}: {tensors:?}");
        let stored = tensors
            .iter()
            .filter_map(|(_, present, _)| present.last())
            .max()
            .unwrap()
            + 1;
        // One tensor removed from layer 1.
        let (suffix, _, _) = in_both[in_both.len() / 2];
        let removed = format!("{stack}.1.{suffix}");
        let dir = rebuild_fixture(family, &mut remove_where(|name| name == removed));
        check(format!("{family}, {removed} removed"), &dir, &|p| {
            p.starts_with("layer-incomplete") && p.contains(&format!("`{removed}`"))
        });
        // One shape transposed in layer 1.
        if let Some((suffix, _, _)) = in_both
            .iter()
            .find(|(_, _, shape)| shape.len() == 2 && shape[0] != shape[1])
        {
            let name = format!("{stack}.1.{suffix}");
            let dir = rebuild_fixture(family, &mut |file, map| {
                if file != "config.json"
                    && let Some(entry) = map.get_mut(&name)
                {
                    entry["shape"].as_array_mut().unwrap().reverse();
                }
            });
            check(format!("{family}, {name} transposed"), &dir, &|p| {
                p.starts_with("layer-mismatch") && p.ends_with(&format!("[{name}]"))
            });
        }
        // Layer 0 missing entirely.
        let prefix = format!("{stack}.0.");
        let dir = rebuild_fixture(family, &mut remove_where(|name| name.starts_with(&prefix)));
        check(format!("{family}, {stack}.0 removed"), &dir, &|p| {
            p.starts_with("layer-missing: layer 0 is missing")
                && p.contains(&format!("`{stack}.0.*`"))
        });
        // A wrong layer count in the config.
        let dir = rebuild_fixture(family, &mut |file, map| {
            if file == "config.json" {
                let value = config_value(map, count);
                *value = Value::from(value.as_u64().unwrap() + 1);
            }
        });
        let key = count.last().unwrap();
        check(format!("{family}, {count:?} + 1"), &dir, &|p| {
            p.starts_with("config-mismatch")
                && p.contains(&format!("`{key}`"))
                && p.contains(&format!("`{stack}` has {stored} layers"))
        });
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn config_sizes_of_encoders_and_towers_are_compared_with_the_keys_each_family_reads() {
    let compared: &[(&str, &[&str])] = &[
        ("bert", &["hidden_size"]),
        ("bert", &["intermediate_size"]),
        ("bert", &["vocab_size"]),
        ("t5", &["d_model"]),
        ("t5", &["d_ff"]),
        ("t5", &["d_kv"]),
        ("t5", &["vocab_size"]),
        ("t5_encoder", &["d_ff"]),
        ("whisper", &["d_model"]),
        ("whisper", &["encoder_ffn_dim"]),
        ("whisper", &["decoder_ffn_dim"]),
        ("whisper", &["vocab_size"]),
        ("whisper", &["num_mel_bins"]),
        ("bart", &["decoder_ffn_dim"]),
        ("clip", &["text_config", "hidden_size"]),
        ("clip", &["text_config", "intermediate_size"]),
        ("clip", &["text_config", "vocab_size"]),
        ("clip", &["vision_config", "hidden_size"]),
        ("clip", &["vision_config", "intermediate_size"]),
        ("clip_text_model", &["intermediate_size"]),
        ("llava", &["vision_config", "intermediate_size"]),
        ("gemma3", &["vision_config", "hidden_size"]),
        ("qwen2_5_vl", &["vision_config", "intermediate_size"]),
    ];
    let mut failures = Vec::new();
    for &(family, path) in compared {
        let mut planted = 0;
        let dir = rebuild_fixture(family, &mut |file, map| {
            if file == "config.json" {
                let value = config_value(map, path);
                planted = value.as_u64().unwrap() + 8;
                *value = Value::from(planted);
            }
        });
        let key = path.last().unwrap();
        let found = problems(dir.path());
        let named = |p: &String| {
            p.starts_with("config-mismatch")
                && p.contains(&format!("`{key}`"))
                // T5's query width is `d_kv` × `num_heads`.
                && (p.contains(&format!("{planted} in the config")) || *key == "d_kv")
        };
        if !found.iter().any(named) {
            failures.push(format!("{family} {path:?}: {found:#?}"));
        }
    }
    // Keys these families do not read are not compared, whatever they say.
    let unread: &[(&str, &str)] = &[
        ("whisper", "intermediate_size"),
        ("whisper", "hidden_size"),
        ("bert", "d_ff"),
        ("bert", "d_model"),
        ("t5", "intermediate_size"),
        ("clip", "vocab_size"),
    ];
    for &(family, key) in unread {
        let dir = rebuild_fixture(family, &mut |file, map| {
            if file == "config.json" {
                map.insert(key.into(), Value::from(7));
            }
        });
        let found = problems(dir.path());
        if !found.is_empty() {
            failures.push(format!("{family} with {key} 7: {found:#?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Derives the expected-tensor templates from the fixtures; with `STUI_UPDATE_TEMPLATES=1`,
/// writes them to `src/arch/templates.json`, and otherwise checks the committed file is what
/// the fixtures give.
#[test]
fn templates_match_the_producers_checkpoints() {
    use stui::arch::expected::{Templates, derive};
    let mut derived = Templates::new();
    for family in arch_families() {
        let folder = arch_fixtures().join(&family);
        let Ok(config) = stui::arch::ModelConfig::read(&folder.join("config.json")) else {
            continue;
        };
        let Some(class) = config.architectures().first().map(|c| (*c).to_owned()) else {
            continue;
        };
        let dir = rebuild_fixture(&family, &mut |_, _| {});
        let model = stui::format::Model::open(dir.path()).unwrap();
        let info = stui::arch::identify(&model, None).unwrap();
        let stacks: Vec<(&stui::arch::LayerPattern, &str)> = info
            .patterns()
            .filter_map(|p| Some((&p.pattern, p.stack.as_deref()?)))
            .collect();
        if stacks.is_empty() {
            continue;
        }
        let producer: Value =
            serde_json::from_slice(&std::fs::read(folder.join("producer.json")).unwrap()).unwrap();
        let tied: Vec<String> = producer["tied_weights_keys"]
            .as_object()
            .map(|keys| keys.keys().cloned().collect())
            .unwrap_or_default();
        let names = model.tensors.iter().map(stui::format::Tensor::name);
        let template = derive(names, &stacks, &tied);
        if let Some(other) = derived.get(&class) {
            assert_eq!(
                other, &template,
                "{family}: {class} differs from another fixture"
            );
        }
        derived.insert(class, template);
    }
    let text = serde_json::to_string_pretty(&derived).unwrap() + "\n";
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/arch/templates.json");
    if std::env::var_os("STUI_UPDATE_TEMPLATES").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap();
    assert!(
        committed == text,
        "src/arch/templates.json is stale: run `STUI_UPDATE_TEMPLATES=1 cargo test --test it \
         arch::templates`"
    );
}

#[test]
fn expected_tensors_name_what_no_layer_comparison_can_see() {
    // Missing from every layer: only the template knows the tensor.
    let dir = rebuild_fixture(
        "qwen3",
        &mut remove_where(|name| name.ends_with("self_attn.q_norm.weight")),
    );
    assert_eq!(
        problems(dir.path()),
        [
            "tensor-missing: `model.layers.*.self_attn.q_norm.weight` is missing from layers \
             0-1: a Qwen3ForCausalLM checkpoint holds it in each"
        ]
    );
    // Jamba's only attention layer, and a tensor outside the layers.
    let dir = rebuild_fixture(
        "jamba",
        &mut remove_where(|name| {
            name == "model.layers.2.self_attn.q_proj.weight"
                || name == "model.final_layernorm.weight"
        }),
    );
    assert_eq!(
        problems(dir.path()),
        [
            "tensor-missing: `model.final_layernorm.weight` is missing: a JambaForCausalLM \
             checkpoint holds it",
            "tensor-missing: `model.layers.*.self_attn.q_proj.weight` is missing from layer 2: \
             a JambaForCausalLM checkpoint holds it in each",
        ]
    );
    // Tensors no Llama has, outside the layers and within one.
    let dir = rebuild_fixture("llama", &mut |file, map| {
        if file != "config.json" {
            let norm = map["model.norm.weight"].clone();
            map.insert("model.extra_norm.weight".into(), norm.clone());
            map.insert("model.layers.1.mlp.extra.weight".into(), norm);
        }
    });
    assert_eq!(
        problems(dir.path()),
        [
            "tensor-unexpected: `model.extra_norm.weight` is not a tensor of LlamaForCausalLM: \
             loaders leave it unused [model.extra_norm.weight]",
            "tensor-unexpected: `model.layers.*.mlp.extra.weight` (in layer 1) is not a tensor \
             of LlamaForCausalLM: loaders leave it unused",
        ]
    );
}

/// The layout of DeepSeek-V3 as published (163 shards of header-only sparse files, 91,991
/// tensors, its config with FP8 `quantization_config`), written by the shared script.
#[test]
fn the_deepseek_v3_layout_shows_its_pattern_and_no_false_finding() {
    let dir = tempfile::tempdir().unwrap();
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/bench/make_deepseek_layout.py");
    let status = Command::new("python3")
        .arg(&script)
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let check = stui_json(&["check"], dir.path());
    assert_eq!(check["findings"], Value::Array(Vec::new()), "{check:#}");
    let output = Command::new(env!("CARGO_BIN_EXE_stui"))
        .arg("inspect")
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8(output.stdout).unwrap();
    let summary: String = text
        .lines()
        .take_while(|line| !line.is_empty())
        .map(|line| line.replace(&dir.path().display().to_string(), "DIR") + "\n")
        .collect();
    insta::assert_snapshot!(summary);

    // Without its multi-token-prediction layer, as transformers saves the model: the pattern
    // says so, and nothing is missing.
    let dropped = drop_layer(dir.path(), "model.layers.61.");
    assert!(dropped > 1000, "{dropped}");
    // (The shards rewritten store their tensors in another order than their headers list them:
    // an info.)
    assert_eq!(problems(dir.path()), Vec::<String>::new());
    let inspect = stui_json(&["inspect"], dir.path());
    let pattern = &inspect["architecture"]["layer_pattern"];
    assert_eq!(pattern["stored_layers"], 61);
    assert_eq!(
        pattern["summary"],
        "layers 0-2: dense MLP; 3-60: MoE, 256 experts + 1 shared; \
         61: multi-token prediction (not stored), MoE, 256 experts + 1 shared"
    );
}

/// Removes the tensors whose names start with `prefix` from a sharded model's shards (reading
/// only their headers: the data is sparse) and index; a shard left empty goes too. Returns how
/// many were removed.
fn drop_layer(dir: &Path, prefix: &str) -> usize {
    use std::io::Read;
    let index_path = dir.join("model.safetensors.index.json");
    let mut index: Value = serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    let map = index["weight_map"].as_object_mut().unwrap();
    let mut files: Vec<String> = map
        .iter()
        .filter(|(name, _)| name.starts_with(prefix))
        .map(|(_, file)| file.as_str().unwrap().to_owned())
        .collect();
    files.sort();
    files.dedup();
    map.retain(|name, _| !name.starts_with(prefix));
    let mut removed = 0;
    let mut bytes = 0;
    for file in files {
        let path = dir.join(file);
        let mut reader = std::fs::File::open(&path).unwrap();
        let mut len = [0; 8];
        reader.read_exact(&mut len).unwrap();
        let mut text = vec![0; usize::try_from(u64::from_le_bytes(len)).unwrap()];
        reader.read_exact(&mut text).unwrap();
        let mut header: Map<String, Value> = serde_json::from_slice(&text).unwrap();
        for (_, entry) in header.iter().filter(|(name, _)| name.starts_with(prefix)) {
            let offsets = &entry["data_offsets"];
            bytes += offsets[1].as_u64().unwrap() - offsets[0].as_u64().unwrap();
            removed += 1;
        }
        header.retain(|name, _| !name.starts_with(prefix));
        if header.keys().all(|name| name == "__metadata__") {
            std::fs::remove_file(&path).unwrap();
        } else {
            crate::support::write_zeroed(&path, &header);
        }
    }
    let total = &mut index["metadata"]["total_size"];
    *total = Value::from(total.as_u64().unwrap() - bytes);
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
    removed
}
