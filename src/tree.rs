//! The layer tree: tensors grouped by the dotted parts of their names, with totals on every node.
//! Plain data: the TUI and the text reports each draw it their own way.

use crate::format::{Dtype, Tensor};
use crate::text::natural_cmp;
use std::collections::HashMap;

pub type NodeId = u32;

/// The root node's id; the root has no name and holds the whole model.
pub const ROOT: NodeId = 0;

#[derive(Debug)]
pub struct LayerTree {
    nodes: Vec<Node>,
    /// Node of each tensor, by index in the tensor list the tree was built from.
    tensor_nodes: Vec<Option<NodeId>>,
}

#[derive(Debug)]
pub struct Node {
    /// This node's part of the name (`12` in `model.layers.12.mlp`).
    pub segment: Box<str>,
    pub parent: Option<NodeId>,
    /// Children in natural order.
    pub children: Vec<NodeId>,
    /// The tensor whose full name ends here, if any (a name may also be a prefix of others).
    pub tensor: Option<usize>,
    pub totals: Totals,
}

/// What a node and everything below it hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub tensors: u64,
    pub parameters: u64,
    pub bytes: u64,
    pub dtypes: DtypeMix,
}

/// How many tensors and bytes each dtype accounts for, largest share first once finished.
/// `None` stands for dtypes the format does not define.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DtypeMix(pub Vec<DtypeShare>);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DtypeShare {
    pub dtype: Option<Dtype>,
    pub tensors: u64,
    pub parameters: u64,
    pub bytes: u64,
}

impl DtypeMix {
    fn add(&mut self, share: DtypeShare) {
        match self.0.iter_mut().find(|s| s.dtype == share.dtype) {
            Some(existing) => {
                existing.tensors += share.tensors;
                existing.parameters = existing.parameters.saturating_add(share.parameters);
                existing.bytes = existing.bytes.saturating_add(share.bytes);
            }
            None => self.0.push(share),
        }
    }

    fn sort(&mut self) {
        self.0.sort_by(|a, b| {
            b.bytes
                .cmp(&a.bytes)
                .then(b.tensors.cmp(&a.tensors))
                .then(a.dtype.cmp(&b.dtype))
        });
    }
}

impl Totals {
    fn of_tensor(tensor: &Tensor) -> Totals {
        let parameters = tensor.info.element_count().unwrap_or(0);
        let bytes = tensor.info.byte_len();
        Totals {
            tensors: 1,
            parameters,
            bytes,
            dtypes: DtypeMix(vec![DtypeShare {
                dtype: tensor.info.dtype.known(),
                tensors: 1,
                parameters,
                bytes,
            }]),
        }
    }

    fn add(&mut self, other: &Totals) {
        self.tensors += other.tensors;
        self.parameters = self.parameters.saturating_add(other.parameters);
        self.bytes = self.bytes.saturating_add(other.bytes);
        for share in &other.dtypes.0 {
            self.dtypes.add(*share);
        }
    }
}

impl LayerTree {
    /// Builds the tree of every tensor for which `include` holds. `tensors` should be in natural
    /// name order (as [`crate::format::Model`] keeps them), which makes building fast.
    pub fn build(tensors: &[Tensor], include: impl Fn(&Tensor) -> bool) -> LayerTree {
        let mut nodes = vec![Node {
            segment: "".into(),
            parent: None,
            children: Vec::new(),
            tensor: None,
            totals: Totals::default(),
        }];
        let mut tensor_nodes = vec![None; tensors.len()];
        let mut lookup: HashMap<(NodeId, &str), NodeId> = HashMap::new();
        // The path of the previous tensor, to skip lookups for the prefix consecutive names share.
        let mut previous: Vec<(&str, NodeId)> = Vec::new();

        for (index, tensor) in tensors.iter().enumerate() {
            if !include(tensor) {
                continue;
            }
            let mut node = ROOT;
            for (depth, segment) in tensor.name().split('.').enumerate() {
                if let Some(&(prev_segment, prev_node)) = previous.get(depth)
                    && prev_segment == segment
                    && node == nodes[prev_node as usize].parent.unwrap_or(ROOT)
                {
                    node = prev_node;
                    continue;
                }
                previous.truncate(depth);
                node = *lookup.entry((node, segment)).or_insert_with(|| {
                    let id = NodeId::try_from(nodes.len()).unwrap_or(NodeId::MAX);
                    nodes[node as usize].children.push(id);
                    nodes.push(Node {
                        segment: segment.into(),
                        parent: Some(node),
                        children: Vec::new(),
                        tensor: None,
                        totals: Totals::default(),
                    });
                    id
                });
                previous.push((segment, node));
            }
            nodes[node as usize].tensor = Some(index);
            tensor_nodes[index] = Some(node);
        }

        // Children are created after their parents, so one backward pass sums every subtree.
        for id in (0..nodes.len()).rev() {
            if let Some(tensor) = nodes[id].tensor {
                let own = Totals::of_tensor(&tensors[tensor]);
                nodes[id].totals.add(&own);
            }
            nodes[id].totals.dtypes.sort();
            if let Some(parent) = nodes[id].parent {
                let totals = std::mem::take(&mut nodes[id].totals);
                nodes[parent as usize].totals.add(&totals);
                nodes[id].totals = totals;
            }
        }
        for id in 0..nodes.len() {
            let mut children = std::mem::take(&mut nodes[id].children);
            children.sort_by(|&a, &b| {
                natural_cmp(&nodes[a as usize].segment, &nodes[b as usize].segment)
            });
            nodes[id].children = children;
        }
        LayerTree {
            nodes,
            tensor_nodes,
        }
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }

    pub fn root(&self) -> &Node {
        self.node(ROOT)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.len() <= 1
    }

    /// The node of a tensor, by its index in the list the tree was built from.
    pub fn node_of_tensor(&self, tensor: usize) -> Option<NodeId> {
        self.tensor_nodes.get(tensor).copied().flatten()
    }

    /// The node's ancestors, nearest first, the root excluded.
    pub fn ancestors(&self, id: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        std::iter::successors(self.node(id).parent, |&p| self.node(p).parent).filter(|&p| p != ROOT)
    }

    /// The dotted path from the root to the node.
    pub fn path(&self, id: NodeId) -> String {
        let mut parts: Vec<&str> = self.ancestors(id).map(|a| &*self.node(a).segment).collect();
        parts.reverse();
        parts.push(&self.node(id).segment);
        parts.join(".")
    }

    /// Every node below `id` in display order (depth first, natural order), with its depth.
    pub fn walk(&self, id: NodeId) -> Walk<'_> {
        Walk {
            tree: self,
            stack: self
                .node(id)
                .children
                .iter()
                .rev()
                .map(|&c| (c, 0))
                .collect(),
        }
    }
}

/// Depth-first iterator over a subtree; see [`LayerTree::walk`].
#[derive(Debug)]
pub struct Walk<'a> {
    tree: &'a LayerTree,
    stack: Vec<(NodeId, usize)>,
}

impl Iterator for Walk<'_> {
    type Item = (NodeId, usize);

    fn next(&mut self) -> Option<Self::Item> {
        let (id, depth) = self.stack.pop()?;
        self.stack.extend(
            self.tree
                .node(id)
                .children
                .iter()
                .rev()
                .map(|&c| (c, depth + 1)),
        );
        Some((id, depth))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::TensorInfo;

    fn tensors(names: &[(&str, Dtype, &[u64])]) -> Vec<Tensor> {
        let mut offset = 0;
        let mut list: Vec<Tensor> = names
            .iter()
            .map(|&(name, dtype, shape)| {
                let count: u64 = shape.iter().product();
                let len = dtype.byte_len(count).unwrap();
                offset += len;
                Tensor {
                    info: TensorInfo {
                        name: name.into(),
                        dtype: dtype.into(),
                        shape: shape.to_vec(),
                        data_offsets: [offset - len, offset],
                    },
                    shard: 0,
                }
            })
            .collect();
        list.sort_by(|a, b| natural_cmp(a.name(), b.name()));
        list
    }

    fn labels(tree: &LayerTree) -> Vec<String> {
        tree.walk(ROOT)
            .map(|(id, depth)| format!("{}{}", "  ".repeat(depth), tree.node(id).segment))
            .collect()
    }

    #[test]
    fn groups_by_dotted_names_in_natural_order() {
        let list = tensors(&[
            ("model.layers.10.mlp.weight", Dtype::F32, &[2, 2]),
            ("model.layers.2.mlp.weight", Dtype::F32, &[2, 2]),
            ("model.layers.2.norm", Dtype::Bf16, &[4]),
            ("lm_head.weight", Dtype::F32, &[3]),
        ]);
        let tree = LayerTree::build(&list, |_| true);
        assert_eq!(
            labels(&tree),
            [
                "lm_head",
                "  weight",
                "model",
                "  layers",
                "    2",
                "      mlp",
                "        weight",
                "      norm",
                "    10",
                "      mlp",
                "        weight"
            ]
        );
        let root = &tree.root().totals;
        assert_eq!((root.tensors, root.parameters, root.bytes), (4, 15, 52));
        let layers = tree.node(tree.node(tree.root().children[1]).children[0]);
        assert_eq!(layers.totals.tensors, 3);
        assert_eq!(layers.totals.dtypes.0[0].dtype, Some(Dtype::F32));
        assert_eq!(layers.totals.dtypes.0[1].bytes, 8);
    }

    #[test]
    fn a_name_may_be_a_prefix_of_another() {
        let list = tensors(&[
            ("a.b", Dtype::U8, &[1]),
            ("a.b.c", Dtype::U8, &[2]),
            ("a-b.x", Dtype::U8, &[1]),
        ]);
        let tree = LayerTree::build(&list, |_| true);
        assert_eq!(labels(&tree), ["a", "  b", "    c", "a-b", "  x"]);
        let b = tree
            .node_of_tensor(list.iter().position(|t| t.name() == "a.b").unwrap())
            .unwrap();
        assert_eq!(tree.node(b).totals.tensors, 2);
        assert_eq!(tree.path(b), "a.b");
    }

    #[test]
    fn builds_only_what_the_filter_keeps() {
        let list = tensors(&[
            ("a.x", Dtype::U8, &[1]),
            ("b.x", Dtype::U8, &[1]),
            ("b.y", Dtype::U8, &[1]),
        ]);
        let tree = LayerTree::build(&list, |t| t.name().starts_with('b'));
        assert_eq!(labels(&tree), ["b", "  x", "  y"]);
        assert_eq!(tree.node_of_tensor(0), None);
    }
}
