//! Quantized checkpoints read as the model they encode: the scheme recognised from side files,
//! metadata and tensor names ([`recognise`], [`members`]), each quantized Linear grouped into
//! one logical weight named as the tensor it encodes ([`logical`]), with findings where the
//! members, the config and the scheme disagree.
//!
//! A model with no quantized tensor costs nothing here: recognition returns `None`.

pub mod dequantize;
pub mod kernels;
pub mod listed;
pub mod logical;
pub mod members;
pub mod read;
pub mod recognise;
pub mod scheme;

use crate::finding::{Code, Finding};
use crate::format::{Model, TensorInfo};
use crate::text::{Counted, escape};
pub use listed::{LogicalModel, LogicalTensors};
pub use members::Role;
pub use recognise::{Beside, Declared, SideFiles};
pub use scheme::{Grouping, Layout, Scheme};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// A quantized weight as the model computes with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogicalWeight {
    /// The weight as a tensor entry: the name of the weight it encodes (`P.weight`), whatever
    /// its members are called; its logical shape; the dtype of its first member in the model's
    /// order; and `[0, bytes of all its members]` for offsets.
    pub info: TensorInfo,
    pub scheme: Scheme,
    first_member: u32,
    member_count: u16,
    /// The shape is only the element count: the layout does not store the weight's rows
    /// (quanto's packed codes).
    pub flat: bool,
}

impl LogicalWeight {
    pub fn element_count(&self) -> u64 {
        self.info.shape.iter().product()
    }

    /// Bytes of all its members.
    pub fn stored_bytes(&self) -> u64 {
        self.info.data_offsets[1]
    }

    /// How many stored tensors it has.
    pub fn member_count(&self) -> u16 {
        self.member_count
    }

    /// Stored bits per logical element, scales and zero points included.
    pub fn bits_per_weight(&self) -> f64 {
        let elements = self.element_count();
        if elements == 0 {
            0.0
        } else {
            self.stored_bytes() as f64 * 8.0 / elements as f64
        }
    }
}

/// A stored tensor of a logical weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its index in [`Model::tensors`].
    pub tensor: u32,
    pub role: Role,
}

/// What a model's quantization is: the declaration, its logical weights and their members.
#[derive(Debug)]
pub struct Quantization {
    pub declared: Option<Declared>,
    pub weights: Vec<LogicalWeight>,
    members: Vec<Member>,
    /// `(tensor, weight)` for every member, by tensor.
    by_tensor: Vec<(u32, u32)>,
    /// Weights are stored in a rotated basis: statistics are of the rotated weights, and they
    /// are not element-aligned with an unrotated model.
    pub rotated: bool,
}

impl Quantization {
    /// Recognises the quantization of `model`, given the side files beside it; `None` (and no
    /// finding) for a model that neither declares nor stores quantized weights. The findings
    /// are about members, the config and the scheme disagreeing.
    pub fn recognise(model: &Model, side: &SideFiles) -> (Option<Quantization>, Vec<Finding>) {
        let mut findings = Vec::new();
        let declared = Declared::find(side, &model.metadata, &mut findings);
        let built = logical::build(model, declared.as_ref());
        findings.extend(built.findings);
        if built.weights.is_empty() {
            if let Some(declared) = declared.as_ref().filter(|d| d.stores_quantized()) {
                findings.push(Finding::warning(
                    Code::QuantConfig,
                    format!(
                        "{} declares quantized weights, but no tensor is stored quantized",
                        declared.summary()
                    ),
                ));
            }
            return (None, findings);
        }
        let mut by_tensor: Vec<(u32, u32)> = Vec::with_capacity(built.members.len());
        for (index, weight) in built.weights.iter().enumerate() {
            let weight_index = u32::try_from(index).unwrap_or(u32::MAX);
            let members =
                &built.members[weight.first_member as usize..][..usize::from(weight.member_count)];
            by_tensor.extend(members.iter().map(|m| (m.tensor, weight_index)));
        }
        rayon::slice::ParallelSliceMut::par_sort_unstable(&mut by_tensor[..]);
        let rotated = declared.as_ref().is_some_and(|d| d.rotated);
        let quantization = Quantization {
            declared,
            weights: built.weights,
            members: built.members,
            by_tensor,
            rotated,
        };
        quantization.check_against_config(model, side, &mut findings);
        (Some(quantization), findings)
    }

    /// The members of weight `weight`.
    pub fn members(&self, weight: usize) -> &[Member] {
        let w = &self.weights[weight];
        &self.members[w.first_member as usize..][..usize::from(w.member_count)]
    }

    /// The member of `weight` in `role`, as an index into the model's tensors.
    pub fn member(&self, weight: usize, role: Role) -> Option<usize> {
        self.members(weight)
            .iter()
            .find(|m| m.role == role)
            .map(|m| m.tensor as usize)
    }

    /// The logical weight stored tensor `tensor` belongs to.
    pub fn weight_of(&self, tensor: usize) -> Option<usize> {
        let tensor = u32::try_from(tensor).ok()?;
        let at = self
            .by_tensor
            .binary_search_by_key(&tensor, |&(t, _)| t)
            .ok()?;
        Some(self.by_tensor[at].1 as usize)
    }

    /// Why the values of weights in `layout` are not read although the layout is recognised:
    /// a variant the config declares whose packing or scale direction differs from the one
    /// stui reads (`None` when they are read).
    pub fn unread_variant(&self, layout: Layout) -> Option<&'static str> {
        let declared = self.declared.as_ref()?;
        let format = declared.format.as_deref().map(str::to_ascii_lowercase);
        match (layout, format.as_deref()) {
            (Layout::GptqV1 | Layout::GptqV2, Some("gptq_p")) => {
                Some("GPTQ's planar `gptq_p` packing")
            }
            (Layout::Awq, Some("gemv" | "gemv_fast")) => Some("AWQ's GEMV packing"),
            (Layout::Fp8ScaleInv, _) if declared.scale_divides => {
                Some("GPTQModel's own FP8, whose `weight_scale_inv` divides")
            }
            _ => None,
        }
    }

    /// The model's schemes, most weights first, with how many weights use each.
    pub fn schemes(&self) -> Vec<(Scheme, usize)> {
        let mut counts: Vec<(Scheme, usize)> = Vec::new();
        for weight in &self.weights {
            match counts.iter_mut().find(|(s, _)| *s == weight.scheme) {
                Some((_, count)) => *count += 1,
                None => counts.push((weight.scheme, 1)),
            }
        }
        counts.sort_by_key(|&(_, count)| std::cmp::Reverse(count));
        counts
    }

    /// The scheme shown once for the model: "int4 g128 asym, GPTQ v1", with "+ 2 more" when
    /// weights differ, and "rotated" when they are stored so.
    pub fn summary(&self) -> String {
        let schemes = self.schemes();
        let mut text = schemes
            .first()
            .map_or_else(String::new, |(s, _)| s.to_string());
        if schemes.len() > 1 {
            let _ = write!(text, " + {} more", schemes.len() - 1);
        }
        if self.rotated {
            text.push_str(", rotated");
        }
        text
    }

    /// Stored bits per logical element over all the quantized weights.
    pub fn bits_per_weight(&self) -> f64 {
        let (bytes, elements) = self.weights.iter().fold((0u64, 0u64), |(b, e), w| {
            (b + w.stored_bytes(), e + w.element_count())
        });
        if elements == 0 {
            0.0
        } else {
            bytes as f64 * 8.0 / elements as f64
        }
    }

    /// The model's tensors as the model computes with them: every tensor that is no member,
    /// and each logical weight in the place of its first member, with its logical shape and
    /// its members' bytes (a weight whose rows are not known has its element count as its
    /// shape, so that its name is there for the checks that look for it).
    pub fn logical_infos<'a>(&'a self, model: &'a Model) -> Vec<&'a TensorInfo> {
        let (weight_of, first_member) = self.weights_by_tensor(model.tensors.len());
        (0u32..)
            .zip(&model.tensors)
            .zip(weight_of)
            .filter_map(|((index, tensor), weight)| {
                if weight == u32::MAX {
                    return Some(&tensor.info);
                }
                (first_member[weight as usize] == index)
                    .then(|| &self.weights[weight as usize].info)
            })
            .collect()
    }

    /// For each of `tensors` tensors the weight it is a member of (`u32::MAX` for none), and
    /// each weight's first member: found in one pass over the members sorted by tensor.
    fn weights_by_tensor(&self, tensors: usize) -> (Vec<u32>, Vec<u32>) {
        let mut weight_of = vec![u32::MAX; tensors];
        let mut first_member = vec![u32::MAX; self.weights.len()];
        for &(tensor, weight) in &self.by_tensor {
            if let Some(slot) = weight_of.get_mut(tensor as usize) {
                *slot = weight;
            }
            let first = &mut first_member[weight as usize];
            *first = (*first).min(tensor);
        }
        (weight_of, first_member)
    }

    fn check_against_config(&self, model: &Model, side: &SideFiles, findings: &mut Vec<Finding>) {
        let Some(declared) = &self.declared else {
            let self_described = self
                .weights
                .iter()
                .all(|w| w.scheme.layout.described_by_its_tensors());
            if side.config.is_some() && !self_described {
                findings.push(Finding::warning(
                    Code::QuantConfig,
                    format!(
                        "the tensors are stored quantized ({}), but config.json declares no \
                         quantization: loaders will not read them as quantized weights",
                        self.summary()
                    ),
                ));
            }
            return;
        };
        let mut unexpected: BTreeMap<Layout, usize> = BTreeMap::new();
        for weight in &self.weights {
            if !method_allows(&declared.method, weight.scheme.layout) {
                *unexpected.entry(weight.scheme.layout).or_default() += 1;
            }
            let module = weight
                .info
                .name
                .strip_suffix(".weight")
                .unwrap_or(&weight.info.name);
            if declared.ignores(module) == Some(true) {
                findings.push(
                    Finding::warning(
                        Code::QuantIgnore,
                        "stored quantized although the config's ignore list names it",
                    )
                    .for_tensor(escape(&weight.info.name).into_owned()),
                );
            }
        }
        for (layout, count) in unexpected {
            findings.push(Finding::warning(
                Code::QuantConfig,
                format!(
                    "{} declares `{}`, but {} {} stored in the {} layout",
                    escape(&declared.source),
                    escape(&declared.method),
                    Counted(count, "weight"),
                    if count == 1 { "is" } else { "are" },
                    layout.family()
                ),
            ));
        }
        self.check_left_unquantized(model, declared, findings);
        if self.rotated {
            findings.push(Finding::info(
                Code::QuantRotated,
                "the weights are stored in a rotated basis: their statistics are of the rotated \
                 weights, and a diff against an unrotated model is not element-aligned",
            ));
        }
        let opaque: Vec<&str> = self
            .schemes()
            .iter()
            .filter_map(|(s, _)| {
                if s.layout.is_opaque() {
                    Some(s.layout.family())
                } else {
                    self.unread_variant(s.layout)
                }
            })
            .collect();
        for family in opaque {
            findings.push(Finding::info(
                Code::QuantOpaque,
                format!("{family} weights are recognised, but stui does not read their values"),
            ));
        }
    }

    /// A plain float weight of a kind (its last module name) that is quantized elsewhere in the
    /// model, or of a layer when the config quantizes every `Linear`, which the config's ignore
    /// list does not name.
    fn check_left_unquantized(
        &self,
        model: &Model,
        declared: &Declared,
        findings: &mut Vec<Finding>,
    ) {
        // A handful of kinds among thousands of weights: a set, not a sort of every name.
        let kinds: foldhash::HashSet<&str> = self
            .weights
            .iter()
            .filter_map(|w| {
                let module = w.info.name.strip_suffix(".weight")?;
                Some(module.rsplit('.').next().unwrap_or(module))
            })
            .collect();
        // The members, sorted by tensor, walked beside the tensors.
        let mut members = self.by_tensor.iter().map(|&(t, _)| t as usize).peekable();
        for (index, tensor) in model.tensors.iter().enumerate() {
            while members.next_if(|&member| member < index).is_some() {}
            if members.peek() == Some(&index)
                || tensor.info.shape.len() < 2
                || !tensor
                    .info
                    .dtype
                    .known()
                    .is_some_and(crate::format::Dtype::is_float)
            {
                continue;
            }
            let Some(module) = tensor.name().strip_suffix(".weight") else {
                continue;
            };
            let kind = module.rsplit('.').next().unwrap_or(module);
            let in_a_layer = module
                .split('.')
                .any(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()));
            if !(kinds.contains(kind) || (declared.targets_linear && in_a_layer)) {
                continue;
            }
            if declared.ignores(module) != Some(true) {
                findings.push(
                    Finding::warning(
                        Code::QuantIgnore,
                        format!(
                            "left unquantized ({}), but the config's ignore list does not name it",
                            tensor.info.dtype.name()
                        ),
                    )
                    .for_tensor(escape(tensor.name()).into_owned()),
                );
            }
        }
    }
}

/// Whether `method` (a config's `quant_method`) writes weights in `layout`.
fn method_allows(method: &str, layout: Layout) -> bool {
    use Layout as L;
    match method {
        "compressed-tensors" => matches!(
            layout,
            L::CompressedInt
                | L::CompressedFloat
                | L::CompressedPacked
                | L::CompressedNvfp4
                | L::CompressedMxfp4
                | L::CompressedMxfp8
        ),
        "gptq" => matches!(layout, L::GptqV1 | L::GptqV2),
        "awq" => layout == L::Awq,
        "auto-round" | "autoround" => matches!(layout, L::GptqV1 | L::GptqV2 | L::Awq),
        "bitsandbytes" => matches!(layout, L::BnbInt8 | L::BnbNf4 | L::BnbFp4),
        "fp8" | "fbgemm_fp8" => matches!(layout, L::Fp8ScaleInv | L::Fp8Scaled),
        "modelopt" => matches!(layout, L::ModelOptNvfp4 | L::Fp8Scaled),
        "mxfp4" => layout == L::GptOssMxfp4,
        "mlx" => matches!(
            layout,
            L::MlxAffine | L::MlxMxfp4 | L::MlxNvfp4 | L::MlxMxfp8
        ),
        "hqq" => layout == L::Hqq,
        "quanto" => layout == L::Quanto,
        "exl2" => layout == L::Exl2,
        "exl3" => layout == L::Exl3,
        "comfyui" => matches!(
            layout,
            L::ComfyInt8 | L::ComfyNvfp4 | L::ComfyMxfp8 | L::Fp8Scaled
        ),
        _ => true,
    }
}
