//! Finding and reading the config that describes a model: transformers' `config.json` (plain or
//! composite, with a `text_config`), diffusers' (`_class_name`), timm's (`architecture`), and a
//! PEFT adapter's `adapter_config.json`.

use crate::format::Model;
use crate::format::model::Source;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Configs are a few kilobytes; anything past this is not one and is not read.
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// A parsed config and where it came from.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub path: PathBuf,
    pub json: Value,
}

/// A PEFT adapter, from its `adapter_config.json`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Adapter {
    /// `LORA`, `LOHA`, `IA3`, ...
    pub peft_type: String,
    pub base_model: Option<String>,
    /// `r`: the rank of the A/B pairs.
    pub rank: Option<u64>,
    pub alpha: Option<f64>,
    /// `target_modules`: module names, or one regular expression.
    pub targets: Vec<String>,
    /// The A/B pairs the adapter's tensors hold.
    pub pairs: Option<u64>,
}

impl std::fmt::Display for Adapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::text::escape;
        write!(f, "{} adapter", escape(&self.peft_type))?;
        if let Some(rank) = self.rank {
            write!(f, " rank {rank}")?;
        }
        if let Some(alpha) = self.alpha {
            write!(f, " alpha {alpha}")?;
        }
        if !self.targets.is_empty() {
            write!(f, " on {}", escape(&self.targets.join(", ")))?;
        }
        if let Some(pairs) = self.pairs {
            write!(f, ", {pairs} A/B pairs")?;
        }
        if let Some(base) = &self.base_model {
            write!(f, ", base model {}", escape(base))?;
        }
        Ok(())
    }
}

/// The config to read: `explicit`, else `config.json` in the model's folder, else the folder's
/// `adapter_config.json`.
pub fn config_path(model: &Model, explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(path) = explicit {
        return Some(path.to_path_buf());
    }
    let folder = match model.source {
        Source::Folder => model.path.clone(),
        _ => model.path.parent()?.to_path_buf(),
    };
    ["config.json", "adapter_config.json"]
        .iter()
        .map(|name| folder.join(name))
        .find(|path| path.is_file())
}

/// Finds the model's config (see [`config_path`]) and parses it: `None` when there is none, an
/// error naming the file when it cannot be read or is not a JSON object.
pub fn find_config(
    model: &Model,
    explicit: Option<&Path>,
) -> Option<Result<ModelConfig, ConfigError>> {
    if explicit.is_none()
        && let Some(remote) = &model.remote
    {
        return remote
            .config
            .as_ref()
            .map(|(path, bytes)| ModelConfig::parse(path, bytes));
    }
    config_path(model, explicit).map(|path| ModelConfig::read(&path))
}

/// A config that cannot be used, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub path: PathBuf,
    pub reason: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot read the config: {}", self.reason)
    }
}

impl ModelConfig {
    pub fn read(path: &Path) -> Result<ModelConfig, ConfigError> {
        let error = |reason: String| ConfigError {
            path: path.to_path_buf(),
            reason,
        };
        let file = crate::paths::open_file(path).map_err(|e| error(e.to_string()))?;
        let len = file.metadata().map_err(|e| error(e.to_string()))?.len();
        if len > MAX_CONFIG_BYTES {
            return Err(error(format!(
                "it is {len} bytes, more than a config ever takes ({MAX_CONFIG_BYTES})"
            )));
        }
        let text = std::io::read_to_string(file).map_err(|e| error(e.to_string()))?;
        ModelConfig::parse(path, text.as_bytes())
    }

    /// A config's text, read from `path` (a local file, or one of a model read from the Hub).
    pub fn parse(path: &Path, text: &[u8]) -> Result<ModelConfig, ConfigError> {
        let error = |reason: String| ConfigError {
            path: path.to_path_buf(),
            reason,
        };
        let json: Value = serde_json::from_slice(text).map_err(|e| error(e.to_string()))?;
        if !json.is_object() {
            return Err(error("it is JSON but not an object".to_owned()));
        }
        Ok(ModelConfig {
            path: path.to_path_buf(),
            json,
        })
    }

    pub fn from_json(path: &Path, json: Value) -> ModelConfig {
        ModelConfig {
            path: path.to_path_buf(),
            json,
        }
    }

    fn text_of<'v>(json: &'v Value, key: &str) -> Option<&'v str> {
        json.get(key)?.as_str()
    }

    /// transformers' `model_type` (`llama`, `deepseek_v3`, `llava`, ...).
    pub fn model_type(&self) -> Option<&str> {
        Self::text_of(&self.json, "model_type")
    }

    /// transformers' `architectures` (`LlamaForCausalLM`, ...).
    pub fn architectures(&self) -> Vec<&str> {
        self.json
            .get("architectures")
            .and_then(Value::as_array)
            .map(|list| list.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    }

    /// diffusers' `_class_name` (`UNet2DConditionModel`, ...).
    pub fn class_name(&self) -> Option<&str> {
        Self::text_of(&self.json, "_class_name")
    }

    /// timm's `architecture` (`convnext_atto`, `vit_base_patch16_224`, ...).
    pub fn timm_architecture(&self) -> Option<&str> {
        Self::text_of(&self.json, "architecture")
    }

    /// The adapter this config describes, if it is a PEFT `adapter_config.json`.
    pub fn adapter(&self) -> Option<Adapter> {
        let json = &self.json;
        let peft_type = Self::text_of(json, "peft_type")?.to_owned();
        let targets = match json.get("target_modules") {
            Some(Value::Array(list)) => list
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            Some(Value::String(pattern)) => vec![pattern.clone()],
            _ => Vec::new(),
        };
        let mut targets: Vec<String> = targets;
        targets.sort();
        Some(Adapter {
            peft_type,
            base_model: Self::text_of(json, "base_model_name_or_path").map(str::to_owned),
            // Ranks set per module (`rank_pattern`) make `r` a default only.
            rank: json.get("r").and_then(Value::as_u64).filter(|_| {
                json.get("rank_pattern")
                    .and_then(Value::as_object)
                    .is_none_or(serde_json::Map::is_empty)
            }),
            alpha: json.get("lora_alpha").and_then(Value::as_f64),
            targets,
            pairs: None,
        })
    }

    /// The name the config gives the model: `model_type`, diffusers' class, timm's
    /// architecture, or the adapter's type.
    pub fn name(&self) -> Option<String> {
        if let Some(name) = self.model_type().or(self.class_name()) {
            return Some(name.to_owned());
        }
        if let Some(adapter) = self.adapter() {
            return Some(format!("{} adapter", adapter.peft_type.to_lowercase()));
        }
        self.timm_architecture().map(str::to_owned)
    }

    /// The part of the config that describes the language model: `text_config` in composite
    /// configs (vision-language models), the whole config otherwise.
    pub fn text(&self) -> &Value {
        match self.json.get("text_config") {
            Some(text) if text.is_object() => text,
            _ => &self.json,
        }
    }

    /// The text model's `model_type`: `text_config`'s in a composite config.
    pub fn text_model_type(&self) -> Option<&str> {
        Self::text_of(self.text(), "model_type").or(self.model_type())
    }

    /// A whole number from the text model's config: the first of `keys` it has.
    pub fn number(&self, keys: &[&str]) -> Option<u64> {
        keys.iter().find_map(|key| self.text().get(key)?.as_u64())
    }

    /// A flag from the text model's config, falling back to the top level (where composite
    /// configs keep `tie_word_embeddings`).
    pub fn flag(&self, key: &str) -> Option<bool> {
        self.text()
            .get(key)
            .or_else(|| self.json.get(key))
            .and_then(Value::as_bool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(json: Value) -> ModelConfig {
        ModelConfig::from_json(Path::new("config.json"), json)
    }

    #[test]
    fn names_come_from_the_config_of_each_ecosystem() {
        assert_eq!(
            config(json!({"model_type": "deepseek_v3"}))
                .name()
                .as_deref(),
            Some("deepseek_v3")
        );
        assert_eq!(
            config(json!({"_class_name": "AutoencoderKL", "_diffusers_version": "0.30"}))
                .name()
                .as_deref(),
            Some("AutoencoderKL")
        );
        assert_eq!(
            config(json!({"architecture": "convnext_atto", "num_classes": 10}))
                .name()
                .as_deref(),
            Some("convnext_atto")
        );
        let lora = config(json!({"peft_type": "LORA", "r": 8, "lora_alpha": 16,
            "target_modules": ["v_proj", "q_proj"], "base_model_name_or_path": "tiny-llama"}));
        assert_eq!(lora.name().as_deref(), Some("lora adapter"));
        assert_eq!(
            lora.adapter(),
            Some(Adapter {
                peft_type: "LORA".into(),
                base_model: Some("tiny-llama".into()),
                rank: Some(8),
                alpha: Some(16.0),
                targets: vec!["q_proj".into(), "v_proj".into()],
                pairs: None,
            })
        );
    }

    #[test]
    fn a_composite_config_reads_sizes_from_its_text_config() {
        let c = config(json!({"model_type": "llava", "tie_word_embeddings": false,
            "text_config": {"model_type": "llama", "hidden_size": 64}}));
        assert_eq!(c.name().as_deref(), Some("llava"));
        assert_eq!(c.text_model_type(), Some("llama"));
        assert_eq!(c.number(&["hidden_size"]), Some(64));
        assert_eq!(c.flag("tie_word_embeddings"), Some(false));
    }

    #[test]
    fn a_config_that_is_not_an_object_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, "[1, 2]").unwrap();
        let error = ModelConfig::read(&path).unwrap_err();
        assert_eq!(error.path, path);
        assert_eq!(error.reason, "it is JSON but not an object");
    }
}
