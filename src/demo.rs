//! Deterministic synthetic checkpoints: the bundled demo model, and small models for tests,
//! benchmarks and fuzzing. The same inputs give the same bytes on every machine.

use crate::error::Result;
use crate::format::Dtype;
use crate::format::Shape;
use crate::format::writer::{FileLayout, Metadata, Name, Specs, TensorSpec, write_atomically};
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::Path;

/// How a tensor's values are made.
#[derive(Clone, Debug, PartialEq)]
pub enum Fill {
    /// Normally distributed with this mean and standard deviation, from the tensor's own seed.
    Normal { mean: f64, std: f64 },
    /// Every element zero.
    Zeros,
    /// These values, repeated to fill the tensor.
    Values(Vec<f64>),
}

/// A tensor to generate, with values planted at chosen flat indices (NaN, Inf, outliers).
#[derive(Clone, Debug)]
pub struct SyntheticTensor {
    pub spec: TensorSpec,
    pub fill: Fill,
    pub plants: Vec<(u64, f64)>,
}

/// A model to generate.
#[derive(Clone, Debug, Default)]
pub struct SyntheticModel {
    pub tensors: Vec<SyntheticTensor>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub seed: u64,
}

impl SyntheticModel {
    pub fn new(seed: u64) -> Self {
        SyntheticModel {
            seed,
            ..SyntheticModel::default()
        }
    }

    #[must_use]
    pub fn tensor(mut self, name: &str, dtype: Dtype, shape: &[u64], fill: Fill) -> Self {
        self.tensors.push(SyntheticTensor {
            spec: TensorSpec::new(name, dtype, shape),
            fill,
            plants: Vec::new(),
        });
        self
    }

    /// Sets the value at `index` (counted from the end when negative) of the tensor `name`.
    #[must_use]
    pub fn plant(mut self, name: &str, index: i64, value: f64) -> Self {
        if let Some(tensor) = self.tensors.iter_mut().find(|t| t.spec.name == name) {
            let count: u64 = tensor.spec.shape.iter().product();
            let at = if index < 0 {
                count.saturating_sub(index.unsigned_abs())
            } else {
                index.unsigned_abs()
            };
            tensor.plants.push((at, value));
        }
        self
    }

    #[must_use]
    pub fn metadata(mut self, key: &str, value: &str) -> Self {
        self.metadata
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }

    pub fn layout(&self) -> Result<FileLayout<'_, Self, impl Metadata<'_>>> {
        let metadata = self
            .metadata
            .as_ref()
            .map(|m| m.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        FileLayout::plan(self, metadata)
    }

    /// The whole file in memory (for tests and small fixtures).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let layout = self.layout()?;
        let mut bytes = Vec::with_capacity(usize::try_from(layout.file_len()).unwrap_or(0));
        layout
            .write(&mut bytes, |index, out| self.write_tensor(index, out))
            .map_err(|e| crate::error::Error::Invalid(e.to_string()))?;
        Ok(bytes)
    }

    /// Writes the model to `path`, atomically.
    pub fn write(&self, path: &Path) -> Result<()> {
        let layout = self.layout()?;
        write_atomically(path, |out| {
            layout.write(out, |index, out| self.write_tensor(index, out))
        })
    }

    fn write_tensor<W: Write>(&self, index: usize, out: &mut W) -> io::Result<()> {
        let tensor = &self.tensors[index];
        let count: u64 = tensor.spec.shape.iter().product();
        let mut rng =
            SplitMix64::new(self.seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut plants = tensor.plants.clone();
        plants.sort_by_key(|&(at, _)| at);
        let mut plants = plants.into_iter().peekable();
        let mut buffer = Vec::with_capacity(64 * 1024);
        for i in 0..count {
            let mut value = match &tensor.fill {
                Fill::Normal { mean, std } => mean + std * rng.normal(),
                Fill::Zeros => 0.0,
                Fill::Values(values) => {
                    values[usize::try_from(i).unwrap_or(0) % values.len().max(1)]
                }
            };
            while let Some(&(at, planted)) = plants.peek() {
                if at > i {
                    break;
                }
                if at == i {
                    value = planted;
                }
                plants.next();
            }
            encode(tensor.spec.dtype, value, &mut buffer);
            if buffer.len() >= 60 * 1024 {
                out.write_all(&buffer)?;
                buffer.clear();
            }
        }
        out.write_all(&buffer)
    }
}

impl Specs for SyntheticModel {
    fn count(&self) -> usize {
        self.tensors.len()
    }
    fn name(&self, index: usize) -> Name<'_> {
        Name::new(&self.tensors[index].spec.name)
    }
    fn dtype(&self, index: usize) -> Dtype {
        self.tensors[index].spec.dtype
    }
    fn shape(&self, index: usize) -> Shape {
        self.tensors[index].spec.shape.clone()
    }
}

/// Appends one element of `dtype` holding `value` (rounded to nearest, saturating for integers).
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "narrowing to the element type is the point"
)]
fn encode(dtype: Dtype, value: f64, out: &mut Vec<u8>) {
    match dtype {
        Dtype::F64 => out.extend_from_slice(&value.to_le_bytes()),
        Dtype::F32 => out.extend_from_slice(&(value as f32).to_le_bytes()),
        Dtype::F16 => out.extend_from_slice(&half::f16::from_f64(value).to_le_bytes()),
        Dtype::Bf16 => out.extend_from_slice(&half::bf16::from_f64(value).to_le_bytes()),
        Dtype::I8 => out.extend_from_slice(&(value.round() as i8).to_le_bytes()),
        Dtype::U8 | Dtype::Bool => out.push(value.round() as u8),
        Dtype::I16 => out.extend_from_slice(&(value.round() as i16).to_le_bytes()),
        Dtype::U16 => out.extend_from_slice(&(value.round() as u16).to_le_bytes()),
        Dtype::I32 => out.extend_from_slice(&(value.round() as i32).to_le_bytes()),
        Dtype::U32 => out.extend_from_slice(&(value.round() as u32).to_le_bytes()),
        Dtype::I64 => out.extend_from_slice(&(value.round() as i64).to_le_bytes()),
        Dtype::U64 => out.extend_from_slice(&(value.round() as u64).to_le_bytes()),
        Dtype::C64 => {
            out.extend_from_slice(&(value as f32).to_le_bytes());
            out.extend_from_slice(&0f32.to_le_bytes());
        }
        // Sub-byte and 8-bit float encodings are written as raw zero bytes here; tests that need
        // their values build the bytes themselves.
        Dtype::F4 | Dtype::F6E2M3 | Dtype::F6E3M2 => {}
        Dtype::F8E5M2 | Dtype::F8E4M3 | Dtype::F8E8M0 | Dtype::F8E4M3Fnuz | Dtype::F8E5M2Fnuz => {
            out.push(0);
        }
    }
}

/// A small, fast, well-mixed generator (`SplitMix64`); statistical quality is ample for test data.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// The shape of a Llama-style decoder.
#[derive(Clone, Copy, Debug)]
pub struct LlamaShape {
    pub hidden: u64,
    pub intermediate: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub vocab: u64,
    pub layers: u64,
}

/// A Llama-style model with Hugging Face tensor names, every weight drawn from N(0, 0.02) and
/// every norm from N(1, 0.02).
pub fn llama(shape: LlamaShape, dtype: Dtype, seed: u64) -> SyntheticModel {
    let LlamaShape {
        hidden: h,
        intermediate: i,
        heads,
        kv_heads,
        vocab: v,
        layers,
    } = shape;
    let kv = h / heads * kv_heads;
    let weight = Fill::Normal {
        mean: 0.0,
        std: 0.02,
    };
    let norm = Fill::Normal {
        mean: 1.0,
        std: 0.02,
    };
    let mut model = SyntheticModel::new(seed).tensor(
        "model.embed_tokens.weight",
        dtype,
        &[v, h],
        weight.clone(),
    );
    for layer in 0..layers {
        let p = format!("model.layers.{layer}.");
        for (name, shape) in [
            ("self_attn.q_proj.weight", [h, h]),
            ("self_attn.k_proj.weight", [kv, h]),
            ("self_attn.v_proj.weight", [kv, h]),
            ("self_attn.o_proj.weight", [h, h]),
            ("mlp.gate_proj.weight", [i, h]),
            ("mlp.up_proj.weight", [i, h]),
            ("mlp.down_proj.weight", [h, i]),
        ] {
            model = model.tensor(&format!("{p}{name}"), dtype, &shape, weight.clone());
        }
        for name in ["input_layernorm.weight", "post_attention_layernorm.weight"] {
            model = model.tensor(&format!("{p}{name}"), dtype, &[h], norm.clone());
        }
    }
    model.tensor("model.norm.weight", dtype, &[h], norm).tensor(
        "lm_head.weight",
        dtype,
        &[v, h],
        weight,
    )
}

/// The bundled demo (`assets/demo.safetensors`): a 4-layer BF16 Llama-shaped model with NaN and
/// Inf planted in `model.layers.2.mlp.down_proj.weight`, an all-zero
/// `model.layers.3.self_attn.o_proj.weight`, and some `__metadata__`.
pub fn demo_model() -> SyntheticModel {
    let shape = LlamaShape {
        hidden: 128,
        intermediate: 344,
        heads: 4,
        kv_heads: 2,
        vocab: 2048,
        layers: 4,
    };
    let mut model = llama(shape, Dtype::Bf16, 20_261_121)
        .plant("model.layers.2.mlp.down_proj.weight", 0, f64::NAN)
        .plant("model.layers.2.mlp.down_proj.weight", 12_345, f64::NAN)
        .plant("model.layers.2.mlp.down_proj.weight", -1, f64::NAN)
        .plant("model.layers.2.mlp.down_proj.weight", 777, f64::INFINITY)
        .plant(
            "model.layers.2.mlp.down_proj.weight",
            778,
            f64::NEG_INFINITY,
        )
        .metadata("format", "pt")
        .metadata("model_type", "llama")
        .metadata("producer", "stui demo generator");
    if let Some(tensor) = model
        .tensors
        .iter_mut()
        .find(|t| t.spec.name == "model.layers.3.self_attn.o_proj.weight")
    {
        tensor.fill = Fill::Zeros;
    }
    model
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::SafetensorsFile;

    #[test]
    fn generated_files_are_valid_and_deterministic() {
        let model = SyntheticModel::new(7)
            .tensor(
                "a",
                Dtype::F32,
                &[3, 4],
                Fill::Normal {
                    mean: 0.0,
                    std: 1.0,
                },
            )
            .tensor("b", Dtype::Bf16, &[5], Fill::Zeros)
            .plant("a", -1, f64::NAN);
        let bytes = model.to_bytes().unwrap();
        assert_eq!(bytes, model.to_bytes().unwrap());
        let file = SafetensorsFile::from_bytes(Path::new("x"), &bytes);
        assert!(file.is_valid(), "{:?}", file.findings);
        let last = f32::from_le_bytes(
            bytes[bytes.len() - 14..bytes.len() - 10]
                .try_into()
                .unwrap(),
        );
        assert!(last.is_nan());
    }
}
