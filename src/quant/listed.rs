//! The tensor list a quantized model is shown as: each logical weight in place of its members.

use super::Quantization;
use crate::format::{Model, Tensor, TensorInfo};
use std::sync::Arc;

/// A quantized model shown by the weights it encodes: [`LogicalModel::open`] gives the model
/// as listed (its tensors the logical ones, for the tree, the scan and the panes) and this,
/// which holds the stored model and how listed tensors map to it.
#[derive(Debug)]
pub struct LogicalModel {
    pub stored: Arc<Model>,
    pub quantization: Arc<Quantization>,
    /// The mapping only: its tensors are the listed model's.
    listed: LogicalTensors,
}

impl LogicalModel {
    /// The listed model and what stands behind it.
    pub fn open(stored: Arc<Model>, quantization: Arc<Quantization>) -> (Model, LogicalModel) {
        let mut listed = LogicalTensors::new(&stored, &quantization);
        let listing = stored.listing(std::mem::take(&mut listed.tensors));
        (
            listing,
            LogicalModel {
                stored,
                quantization,
                listed,
            },
        )
    }

    /// The logical weight listed tensor `index` is, if it is one.
    pub fn weight(&self, index: usize) -> Option<usize> {
        self.listed.weight(index)
    }
}

/// A quantized model's tensors as the model computes with them: every tensor that is no member,
/// and each logical weight, named `P.weight`, in the place of its first member, with its logical
/// shape, its scheme as dtype ([`crate::format::TensorDtype::quantized`]) and its members' bytes. Built only
/// for a quantized model, so a plain model costs nothing.
#[derive(Debug)]
pub struct LogicalTensors {
    pub tensors: Vec<Tensor>,
    /// `(listed tensor, logical weight)` for every logical weight, by listed tensor.
    weights: Vec<(u32, u32)>,
    /// Each listed tensor's index in the model's tensors (`u32::MAX` for a logical weight).
    stored: Vec<u32>,
}

impl LogicalTensors {
    pub fn new(model: &Model, quantization: &Quantization) -> LogicalTensors {
        let mut tensors = Vec::with_capacity(
            model.tensors.len() + quantization.weights.len()
                - quantization.by_tensor.len().min(model.tensors.len()),
        );
        let mut weights = Vec::with_capacity(quantization.weights.len());
        let mut stored = Vec::with_capacity(tensors.capacity());
        let (weight_of, first_member) = quantization.weights_by_tensor(model.tensors.len());
        for ((index, tensor), weight) in (0u32..).zip(&model.tensors).zip(weight_of) {
            if weight == u32::MAX {
                tensors.push(tensor.clone());
                stored.push(index);
                continue;
            }
            if first_member[weight as usize] != index {
                continue;
            }
            let w = &quantization.weights[weight as usize];
            weights.push((u32::try_from(tensors.len()).unwrap_or(u32::MAX), weight));
            stored.push(u32::MAX);
            tensors.push(Tensor {
                info: TensorInfo {
                    name: w.info.name.clone(),
                    dtype: w.info.dtype.clone(),
                    shape: w.info.shape.clone(),
                    data_offsets: [0, w.stored_bytes()],
                },
                shard: tensor.shard,
            });
        }
        tensors.shrink_to_fit();
        stored.shrink_to_fit();
        LogicalTensors {
            tensors,
            weights,
            stored,
        }
    }

    /// The model's tensor listed tensor `index` is, when it is no logical weight.
    pub fn stored(&self, index: usize) -> Option<usize> {
        self.stored
            .get(index)
            .filter(|&&t| t != u32::MAX)
            .map(|&t| t as usize)
    }

    /// The logical weight listed tensor `index` is, if it is one.
    pub fn weight(&self, index: usize) -> Option<usize> {
        let index = u32::try_from(index).ok()?;
        let at = self
            .weights
            .binary_search_by_key(&index, |&(t, _)| t)
            .ok()?;
        Some(self.weights[at].1 as usize)
    }
}

/// A member's name as shown below its weight: the part after the module both share
/// (`weight_scale` of `P.weight_scale`, `qzeros` of `P.qzeros`).
pub fn member_label<'a>(weight: &str, member: &'a str) -> &'a str {
    let module = weight.strip_suffix("weight").unwrap_or(weight);
    let module = module.trim_end_matches(['.', '_']);
    member
        .strip_prefix(module)
        .map(|rest| rest.trim_start_matches(['.', '_']))
        .filter(|rest| !rest.is_empty())
        .unwrap_or(member)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_labels_drop_the_module() {
        assert_eq!(
            member_label("m.q_proj.weight", "m.q_proj.weight_scale"),
            "weight_scale"
        );
        assert_eq!(member_label("m.q_proj.weight", "m.q_proj.qzeros"), "qzeros");
        assert_eq!(
            member_label("m.experts.down_proj", "m.experts.down_proj_blocks"),
            "blocks"
        );
        assert_eq!(
            member_label("m.q_proj.weight", "other.scale"),
            "other.scale"
        );
    }
}
