//! What a model's side files and `__metadata__` say about its quantization, before any tensor is
//! looked at: `config.json`'s `quantization_config` (or `text_config`'s, or the older
//! `compression_config`, or MLX's `quantization`), `quantize_config.json` / `quant_config.json`,
//! `hf_quant_config.json`, `quanto_qmap.json`, and the header's MLX `format`, stui's own
//! `quantization_config` and `ComfyUI`'s `_quantization_metadata`.

use crate::finding::{Code, Finding};
use crate::format::StringMap;
use crate::format::folder::QUANT_SIDE_FILES;
use crate::text::escape;
use regex::Regex;
use serde_json::Value;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// How a config says the weights' scales are shared (compressed-tensors `strategy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    Tensor,
    Channel,
    /// Groups of columns (`group`, and NVFP4's `tensor_group`).
    Group,
    Block,
}

/// The quantization a model's files declare.
#[derive(Debug)]
pub struct Declared {
    /// `quant_method` as written (lowercase), or the family a side file implies (`mlx`,
    /// `modelopt`, `quanto`, `comfyui`).
    pub method: String,
    /// Where it was read: "config.json `quantization_config`", "`__metadata__` `quantization_config`".
    pub source: String,
    pub bits: Option<u8>,
    /// Columns per group; `None` when the config gives none or says one group per row (-1).
    pub group_size: Option<u32>,
    /// `[rows, cols]` of a block strategy (`weight_block_size`, `block_structure`).
    pub block: Option<[u32; 2]>,
    /// How the weights' scales are shared, where the config says (compressed-tensors
    /// `strategy`): a weight of one row has a single scale under a tensor's, a row's or a
    /// group's, but compressed-tensors packs the zero point of the last two only.
    pub strategy: Option<Strategy>,
    pub symmetric: Option<bool>,
    /// The sub-format: compressed-tensors `format`, GPTQ `checkpoint_format`, AWQ `version`,
    /// auto-round `packing_format`, `ModelOpt` `quant_algo`, MLX `mode`, bitsandbytes quant type.
    pub format: Option<String>,
    /// compressed-tensors `quantization_status` (weights are packed only when `compressed`).
    pub status: Option<String>,
    /// Weights are stored in a rotated basis (`transform_config`, `ComfyUI` `convrot`).
    pub rotated: bool,
    /// `fp8` checkpoints whose `weight_scale_inv` divides (`GPTQModel`'s own FP8).
    pub scale_divides: bool,
    /// A compressed-tensors config group targets every `Linear`: each one the ignore list does
    /// not name is quantized.
    pub targets_linear: bool,
    ignore: Ignore,
    /// MLX per-module overrides: the module path, and its bits and group size (`None`: left
    /// unquantized).
    pub overrides: Vec<(String, Option<(u8, u32)>)>,
}

/// The modules a config leaves unquantized.
#[derive(Debug, Default)]
struct Ignore {
    /// Names matched whole (compressed-tensors, `ModelOpt`) or as parts of a module path
    /// (transformers' `modules_to_not_convert`).
    names: Vec<String>,
    patterns: Vec<Regex>,
    whole_names: bool,
    /// Whether any list was given at all.
    given: bool,
}

/// The side files found beside a model, parsed.
#[derive(Debug, Default)]
pub struct SideFiles {
    pub config: Option<Value>,
    pub quantize_config: Option<(String, Value)>,
    pub hf_quant_config: Option<Value>,
    pub quanto_qmap: Option<Value>,
}

impl SideFiles {
    /// Reads the quantization side files ([`QUANT_SIDE_FILES`]) from `beside` (`config` is
    /// `config.json`, read by the caller); a side file that cannot be read or parsed is a
    /// finding.
    pub fn read(beside: &Beside<'_>, config: Option<Value>, findings: &mut Vec<Finding>) -> Self {
        let mut read = |name: &str| -> Option<Value> {
            let (path, bytes) = beside.file(name)?;
            let parsed = bytes.map_err(|e| e.to_string()).and_then(|bytes| {
                serde_json::from_slice::<Value>(&bytes).map_err(|e| e.to_string())
            });
            match parsed {
                Ok(value) => Some(value),
                Err(error) => {
                    findings.push(
                        Finding::warning(Code::ConfigInvalid, format!("cannot read it: {error}"))
                            .in_file(escape(&path.display().to_string())),
                    );
                    None
                }
            }
        };
        let [quantize_config, quant_config, hf_quant_config, quanto_qmap] = QUANT_SIDE_FILES;
        SideFiles {
            config,
            quantize_config: [quantize_config, quant_config]
                .into_iter()
                .find_map(|name| read(name).map(|value| (name.to_string(), value))),
            hf_quant_config: read(hf_quant_config),
            quanto_qmap: read(quanto_qmap),
        }
    }
}

/// Where a model's side files are.
#[derive(Debug)]
pub enum Beside<'a> {
    /// In this folder, when there is one.
    Folder(Option<&'a Path>),
    /// Fetched with a model read from the Hub: each file's name, its path as shown and its bytes.
    Fetched(&'a [(String, PathBuf, Vec<u8>)]),
}

impl Beside<'_> {
    /// The side file `name`, as shown, and its bytes; `None` when there is none.
    fn file(&self, name: &str) -> Option<(PathBuf, std::io::Result<Vec<u8>>)> {
        match self {
            Beside::Folder(folder) => {
                let path = (*folder)?.join(name);
                path.is_file().then(|| {
                    let bytes = std::fs::read(&path);
                    (path, bytes)
                })
            }
            Beside::Fetched(files) => files
                .iter()
                .find(|(file, ..)| file == name)
                .map(|(_, path, bytes)| (path.clone(), Ok(bytes.clone()))),
        }
    }
}

impl Declared {
    /// The declaration, from the first source that gives one: `config.json`, the other side
    /// files, then the header's metadata. Problems in what they say are added to `findings`.
    pub fn find(
        side: &SideFiles,
        metadata: &StringMap,
        findings: &mut Vec<Finding>,
    ) -> Option<Declared> {
        let mut declared = Self::from_config(side)
            .or_else(|| Self::from_other_files(side))
            .or_else(|| Self::from_metadata(metadata))?;
        declared.ignore.compile(findings);
        Some(declared)
    }

    fn from_config(side: &SideFiles) -> Option<Declared> {
        let config = side.config.as_ref()?;
        let candidates = [
            ("quantization_config", config.get("quantization_config")),
            (
                "text_config.quantization_config",
                config
                    .get("text_config")
                    .and_then(|c| c.get("quantization_config")),
            ),
            ("compression_config", config.get("compression_config")),
        ];
        for (key, value) in candidates {
            if let Some(value) = value.filter(|v| v.is_object())
                && let Some(declared) = Self::from_quantization_config(value)
            {
                return Some(declared.with_source(format!("config.json {key}")));
            }
        }
        let mlx = config.get("quantization").filter(|v| v.is_object())?;
        Some(Self::from_mlx(mlx).with_source("config.json quantization".to_string()))
    }

    fn from_other_files(side: &SideFiles) -> Option<Declared> {
        if let Some((name, value)) = &side.quantize_config {
            let mut declared = if value.get("quant_method").is_some() {
                Self::from_quantization_config(value)?
            } else if value.get("w_bit").is_some() {
                // AutoAWQ's own file.
                let mut awq = Self::empty("awq");
                awq.bits = uint(value, "w_bit").and_then(|b| u8::try_from(b).ok());
                awq.group_size = group_size(value.get("q_group_size"));
                awq.format = string(value, "version");
                awq
            } else {
                let mut gptq = Self::empty("gptq");
                gptq.read_gptq(value);
                gptq
            };
            declared.source.clone_from(name);
            return Some(declared);
        }
        if let Some(value) = &side.hf_quant_config {
            let quantization = value.get("quantization").unwrap_or(value);
            let mut modelopt = Self::empty("modelopt");
            modelopt.format = string(quantization, "quant_algo");
            modelopt.group_size = group_size(quantization.get("group_size"));
            modelopt.ignore = Ignore::list(quantization.get("exclude_modules"), true);
            return Some(modelopt.with_source("hf_quant_config.json".to_string()));
        }
        let qmap = side.quanto_qmap.as_ref()?;
        let mut quanto = Self::empty("quanto");
        quanto.format = qmap
            .as_object()
            .and_then(|modules| modules.values().find_map(|m| string(m, "weights")));
        Some(quanto.with_source("quanto_qmap.json".to_string()))
    }

    fn from_metadata(metadata: &StringMap) -> Option<Declared> {
        if let Some(text) = metadata.get("quantization_config")
            && let Ok(value) = serde_json::from_str::<Value>(text)
            && let Some(declared) = Self::from_quantization_config(&value)
        {
            return Some(declared.with_source("__metadata__ quantization_config".to_string()));
        }
        if let Some(text) = metadata.get("_quantization_metadata") {
            let mut comfy = Self::empty("comfyui");
            if let Ok(value) = serde_json::from_str::<Value>(text)
                && let Some(layers) = value.get("layers").and_then(Value::as_object)
            {
                comfy.format = layers.values().find_map(|l| string(l, "format"));
                comfy.rotated = layers
                    .values()
                    .any(|l| l.get("convrot").and_then(Value::as_bool) == Some(true));
            }
            return Some(comfy.with_source("__metadata__ _quantization_metadata".to_string()));
        }
        if metadata.get("format") == Some("mlx") {
            return Some(Self::empty("mlx").with_source("__metadata__ format: mlx".to_string()));
        }
        None
    }

    fn empty(method: &str) -> Declared {
        Declared {
            method: method.to_string(),
            source: String::new(),
            bits: None,
            group_size: None,
            block: None,
            strategy: None,
            symmetric: None,
            format: None,
            status: None,
            rotated: false,
            scale_divides: false,
            targets_linear: false,
            ignore: Ignore::default(),
            overrides: Vec::new(),
        }
    }

    fn with_source(mut self, source: String) -> Declared {
        self.source = source;
        self
    }

    /// A `quantization_config` object, by its `quant_method`.
    fn from_quantization_config(value: &Value) -> Option<Declared> {
        let method = string(value, "quant_method")
            .or_else(|| string(value, "method"))
            .or_else(|| {
                value
                    .get("config_groups")
                    .map(|_| "compressed-tensors".to_string())
            })?
            .to_lowercase();
        let mut declared = Self::empty(&method);
        match method.as_str() {
            "compressed-tensors" => declared.read_compressed_tensors(value),
            "gptq" | "auto-round" | "autoround" => declared.read_gptq(value),
            "awq" => {
                declared.bits = uint(value, "bits").and_then(|b| u8::try_from(b).ok());
                declared.group_size = group_size(value.get("group_size"));
                declared.format = string(value, "version");
                declared.symmetric = value
                    .get("zero_point")
                    .and_then(Value::as_bool)
                    .map(|zero| !zero);
                declared.ignore = Ignore::list(value.get("modules_to_not_convert"), false);
            }
            "bitsandbytes" => {
                let four = value.get("load_in_4bit").and_then(Value::as_bool) == Some(true);
                declared.bits = Some(if four { 4 } else { 8 });
                declared.format = four.then(|| {
                    string(value, "bnb_4bit_quant_type").unwrap_or_else(|| "fp4".to_string())
                });
                declared.ignore = Ignore::list(value.get("llm_int8_skip_modules"), false);
            }
            "fp8" => {
                declared.bits = Some(8);
                declared.block = value
                    .get("weight_block_size")
                    .and_then(Value::as_array)
                    .and_then(|dims| pair(dims));
                declared.scale_divides =
                    string(value, "weight_scale_semantics").as_deref() == Some("inverse");
                declared.ignore = Ignore::list(
                    value
                        .get("modules_to_not_convert")
                        .or_else(|| value.get("ignored_layers")),
                    false,
                );
            }
            "modelopt" => {
                declared.format = string(value, "quant_algo");
                declared.group_size = group_size(value.get("group_size"));
                declared.ignore = Ignore::list(
                    value.get("ignore").or_else(|| value.get("exclude_modules")),
                    true,
                );
            }
            "mlx" => return Some(Self::from_mlx(value)),
            _ => {
                declared.bits = uint(value, "bits").and_then(|b| u8::try_from(b).ok());
                declared.group_size = group_size(value.get("group_size"));
                declared.ignore = Ignore::list(
                    value
                        .get("modules_to_not_convert")
                        .or_else(|| value.get("skip_modules")),
                    false,
                );
            }
        }
        Some(declared)
    }

    fn read_compressed_tensors(&mut self, value: &Value) {
        self.format = string(value, "format");
        self.status = string(value, "quantization_status");
        self.rotated = value
            .get("transform_config")
            .is_some_and(|t| !t.is_null() && t.as_object().is_none_or(|o| !o.is_empty()));
        self.ignore = Ignore::list(value.get("ignore"), true);
        let groups = value.get("config_groups").and_then(Value::as_object);
        self.targets_linear = groups.is_some_and(|groups| {
            groups.values().any(|group| {
                group
                    .get("targets")
                    .and_then(Value::as_array)
                    .is_some_and(|targets| targets.iter().any(|t| t == "Linear"))
            })
        });
        let Some(group) = groups.and_then(|groups| groups.values().next()) else {
            return;
        };
        if self.format.as_deref() == Some("mixed-precision")
            && let Some(format) = string(group, "format")
        {
            self.format = Some(format);
        }
        let Some(weights) = group.get("weights").filter(|w| w.is_object()) else {
            return;
        };
        self.bits = uint(weights, "num_bits").and_then(|b| u8::try_from(b).ok());
        self.symmetric = weights.get("symmetric").and_then(Value::as_bool);
        let strategy = string(weights, "strategy");
        self.strategy = match strategy.as_deref() {
            Some("tensor") => Some(Strategy::Tensor),
            Some("channel") => Some(Strategy::Channel),
            Some("group" | "tensor_group") => Some(Strategy::Group),
            Some("block") => Some(Strategy::Block),
            _ => None,
        };
        match strategy.as_deref() {
            Some("group" | "tensor_group") => {
                self.group_size = group_size(weights.get("group_size"));
            }
            Some("block") => {
                self.block = weights
                    .get("block_structure")
                    .and_then(Value::as_array)
                    .and_then(|dims| pair(dims));
            }
            _ => {}
        }
    }

    fn read_gptq(&mut self, value: &Value) {
        self.bits = uint(value, "bits").and_then(|b| u8::try_from(b).ok());
        self.group_size = group_size(value.get("group_size"));
        self.symmetric = value.get("sym").and_then(Value::as_bool);
        self.format = string(value, "packing_format")
            .or_else(|| string(value, "checkpoint_format"))
            .or_else(|| string(value, "format"));
        self.ignore = Ignore::list(value.get("modules_to_not_convert"), false);
    }

    fn from_mlx(value: &Value) -> Declared {
        let mut mlx = Self::empty("mlx");
        mlx.bits = uint(value, "bits").and_then(|b| u8::try_from(b).ok());
        mlx.group_size = group_size(value.get("group_size"));
        mlx.format = string(value, "mode");
        if let Some(entries) = value.as_object() {
            for (key, entry) in entries {
                let override_ = match entry {
                    Value::Bool(false) => None,
                    Value::Object(_) => Some((
                        uint(entry, "bits")
                            .and_then(|b| u8::try_from(b).ok())
                            .or(mlx.bits)
                            .unwrap_or(4),
                        group_size(entry.get("group_size"))
                            .or(mlx.group_size)
                            .unwrap_or(64),
                    )),
                    _ => continue,
                };
                mlx.overrides.push((key.clone(), override_));
            }
        }
        mlx.overrides.sort_by(|a, b| a.0.cmp(&b.0));
        mlx
    }

    /// True when the config says module `module` (a weight's name without `.weight`) stays
    /// unquantized. `None` when the config gives no list to tell.
    pub fn ignores(&self, module: &str) -> Option<bool> {
        if let Ok(at) = self
            .overrides
            .binary_search_by(|(key, _)| key.as_str().cmp(module))
        {
            return Some(self.overrides[at].1.is_none());
        }
        self.ignore.given.then(|| self.ignore.matches(module))
    }

    /// The bits and group size the config gives module `module` (MLX overrides first).
    pub fn bits_and_group(&self, module: &str) -> (Option<u8>, Option<u32>) {
        if let Ok(at) = self
            .overrides
            .binary_search_by(|(key, _)| key.as_str().cmp(module))
            && let Some((bits, group)) = self.overrides[at].1
        {
            return (Some(bits), Some(group));
        }
        (self.bits, self.group_size)
    }

    /// The declaration in a line: "gptq, 4 bit, group 128 (config.json `quantization_config`)".
    pub fn summary(&self) -> String {
        let mut text = self.method.clone();
        if let Some(format) = &self.format {
            let _ = write!(text, " {format}");
        }
        if let Some(bits) = self.bits {
            let _ = write!(text, ", {bits} bit");
        }
        if let Some(group) = self.group_size {
            let _ = write!(text, ", group {group}");
        }
        if let Some([rows, cols]) = self.block {
            let _ = write!(text, ", block {rows}x{cols}");
        }
        let _ = write!(text, " ({})", self.source);
        escape(&text).into_owned()
    }

    /// Whether the config says weights are stored quantized: compressed-tensors checkpoints in
    /// `frozen` or `decompressed` status hold float weights.
    pub fn stores_quantized(&self) -> bool {
        self.status.as_deref().is_none_or(|s| s == "compressed")
            && !matches!(self.format.as_deref(), Some("dense"))
    }
}

impl Ignore {
    fn list(value: Option<&Value>, whole_names: bool) -> Ignore {
        let Some(list) = value.and_then(Value::as_array) else {
            return Ignore {
                whole_names,
                ..Ignore::default()
            };
        };
        Ignore {
            names: list
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
            patterns: Vec::new(),
            whole_names,
            given: true,
        }
    }

    /// Turns `re:` entries (compressed-tensors) and globs (`model.layers.*.self_attn`) into
    /// regular expressions.
    fn compile(&mut self, findings: &mut Vec<Finding>) {
        let mut plain = Vec::new();
        for name in std::mem::take(&mut self.names) {
            let pattern = if let Some(pattern) = name.strip_prefix("re:") {
                format!("^(?:{pattern})")
            } else if name.contains('*') {
                let parts: Vec<String> = name.split('*').map(regex::escape).collect();
                format!("(?:^|\\.){}(?:$|\\.)", parts.join("[^.]*"))
            } else {
                plain.push(name);
                continue;
            };
            match Regex::new(&pattern) {
                Ok(regex) => self.patterns.push(regex),
                Err(error) => findings.push(Finding::warning(
                    Code::QuantConfig,
                    format!(
                        "the ignore entry `{}` is not a pattern stui reads: {error}",
                        escape(&name)
                    ),
                )),
            }
        }
        self.names = plain;
    }

    fn matches(&self, module: &str) -> bool {
        self.patterns.iter().any(|p| p.is_match(module))
            || self.names.iter().any(|name| {
                if self.whole_names {
                    name == module || module.ends_with(&format!(".{name}"))
                } else {
                    module.contains(name.as_str())
                }
            })
    }
}

fn string(value: &Value, key: &str) -> Option<String> {
    value.get(key)?.as_str().map(str::to_string)
}

fn uint(value: &Value, key: &str) -> Option<u64> {
    value.get(key)?.as_u64()
}

fn group_size(value: Option<&Value>) -> Option<u32> {
    value?.as_u64().and_then(|g| u32::try_from(g).ok())
}

fn pair(dims: &[Value]) -> Option<[u32; 2]> {
    match dims {
        [rows, cols] => Some([
            u32::try_from(rows.as_u64()?).ok()?,
            u32::try_from(cols.as_u64()?).ok()?,
        ]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn declared(config: Value) -> Declared {
        let side = SideFiles {
            config: Some(config),
            ..SideFiles::default()
        };
        Declared::find(&side, &StringMap::default(), &mut Vec::new()).expect("declared")
    }

    #[test]
    fn reads_compressed_tensors_groups_and_ignore_patterns() {
        let d = declared(json!({"quantization_config": {
            "quant_method": "compressed-tensors", "format": "pack-quantized",
            "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                "num_bits": 4, "type": "int", "symmetric": true, "strategy": "group",
                "group_size": 128}}},
            "ignore": ["lm_head", "re:.*mlp.gate$"]}}));
        assert_eq!(
            (d.method.as_str(), d.bits, d.group_size),
            ("compressed-tensors", Some(4), Some(128))
        );
        assert_eq!(d.ignores("lm_head"), Some(true));
        assert_eq!(d.ignores("model.layers.0.mlp.gate"), Some(true));
        assert_eq!(d.ignores("model.layers.0.mlp.gate_proj"), Some(false));
        assert_eq!(
            d.summary(),
            "compressed-tensors pack-quantized, 4 bit, group 128 (config.json quantization_config)"
        );
    }

    #[test]
    fn reads_nested_text_config_mlx_overrides_and_globs() {
        let d = declared(json!({"text_config": {"quantization_config": {
            "quant_method": "fp8", "weight_block_size": [128, 128]}}}));
        assert_eq!(d.block, Some([128, 128]));
        assert_eq!(d.source, "config.json text_config.quantization_config");
        let mlx = declared(json!({"quantization": {"bits": 4, "group_size": 64,
            "model.layers.0.mlp.down_proj": {"bits": 8}, "lm_head": false}}));
        assert_eq!(mlx.ignores("lm_head"), Some(true));
        assert_eq!(
            mlx.bits_and_group("model.layers.0.mlp.down_proj"),
            (Some(8), Some(64))
        );
        assert_eq!(
            mlx.bits_and_group("model.layers.1.mlp.down_proj"),
            (Some(4), Some(64))
        );
        let oss = declared(json!({"quantization_config": {"quant_method": "mxfp4",
            "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}}));
        assert_eq!(oss.ignores("model.layers.3.self_attn.q_proj"), Some(true));
        assert_eq!(
            oss.ignores("model.layers.3.mlp.experts.down_proj"),
            Some(false)
        );
    }
}
