//! The layer tree: tensors grouped by the dotted parts of their names, with totals on every node.
//! Plain data: the TUI and the text reports each draw it their own way.

use crate::format::{Dtype, Tensor};
use crate::text::{common_prefix_len, natural_cmp};
use hashbrown::HashTable;
use std::hash::BuildHasher;
use std::ops::Range;

pub type NodeId = u32;

/// The root node's id; the root has no name and holds the whole model.
pub const ROOT: NodeId = 0;

#[derive(Debug)]
pub struct LayerTree {
    nodes: Vec<Node>,
    /// Every node's children, each node's run in natural order.
    children: Vec<NodeId>,
    /// Every node's name part, back to back.
    segments: String,
    /// Node of each tensor, by index in the tensor list the tree was built from; `ROOT` (never a
    /// tensor's node) for a tensor left out.
    tensor_nodes: Vec<NodeId>,
}

/// Marks an absent parent or tensor in a [`Node`], which holds plain ids rather than `Option`s
/// to stay small: a tree of a million nodes is measured against a memory bound.
const NONE: u32 = u32::MAX;

#[derive(Debug)]
pub struct Node {
    /// See [`Node::parent`].
    parent: NodeId,
    /// See [`Node::tensor`].
    tensor: u32,
    pub totals: Totals,
    /// Where the node's name part starts in `segments`; it ends where the next node's starts.
    segment: u32,
    /// Where the node's run starts in `children`; it ends where the next node's starts.
    children: u32,
}

/// What a node and everything below it hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// 32 bits, to keep a node small: no model has 4 billion tensors.
    pub tensors: u32,
    pub parameters: u64,
    pub bytes: u64,
    pub dtypes: DtypeSet,
}

/// Which dtypes occur below a node. Per-dtype shares come from [`LayerTree::dtype_mix`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DtypeSet(u32);

impl DtypeSet {
    const UNKNOWN: u32 = 1 << Dtype::ALL.len();

    fn insert(&mut self, dtype: Option<Dtype>) {
        self.0 |= dtype.map_or(Self::UNKNOWN, |d| 1 << d.rank());
    }

    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The dtypes present, in declaration order; `None` stands for names the format does not define.
    pub fn iter(self) -> impl Iterator<Item = Option<Dtype>> {
        let known = Dtype::ALL
            .into_iter()
            .filter(move |d| self.0 & (1 << d.rank()) != 0)
            .map(Some);
        known.chain((self.0 & Self::UNKNOWN != 0).then_some(None))
    }
}

/// How many tensors, parameters and bytes each dtype accounts for, largest share first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DtypeMix(pub Vec<DtypeShare>);

/// One dtype's share of a subtree. `dtype` is `None` for names the format does not define.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DtypeShare {
    pub dtype: Option<Dtype>,
    pub tensors: u64,
    pub parameters: u64,
    pub bytes: u64,
}

impl Node {
    /// `None` for the root only.
    pub fn parent(&self) -> Option<NodeId> {
        (self.parent != NONE).then_some(self.parent)
    }

    /// The tensor whose full name ends here, by index in the tensor list the tree was built
    /// from (a name may also be a prefix of others).
    pub fn tensor(&self) -> Option<usize> {
        (self.tensor != NONE).then_some(self.tensor as usize)
    }
}

impl Totals {
    fn add(&mut self, other: &Totals) {
        self.tensors = self.tensors.saturating_add(other.tensors);
        self.parameters = self.parameters.saturating_add(other.parameters);
        self.bytes = self.bytes.saturating_add(other.bytes);
        self.dtypes.0 |= other.dtypes.0;
    }
}

fn tensor_share(tensor: &Tensor) -> DtypeShare {
    DtypeShare {
        dtype: tensor.info.dtype.known(),
        tensors: 1,
        parameters: tensor.info.element_count().unwrap_or(0),
        bytes: tensor.info.byte_len(),
    }
}

impl LayerTree {
    /// Builds the tree of every tensor for which `include` holds. Consecutive names that share a
    /// prefix (as header order usually has them) are placed without lookups.
    pub fn build(tensors: &[Tensor], include: impl Fn(&Tensor) -> bool) -> LayerTree {
        let mut segments = String::with_capacity(tensors.len() * 16);
        let new_node = |parent, segment| Node {
            parent,
            tensor: NONE,
            totals: Totals::default(),
            segment,
            children: 0,
        };
        // Typical names add one or two nodes each beyond the prefix they share.
        let expected_nodes = tensors.len() + tensors.len() / 2 + 1;
        // At least a node a tensor; more reserved a quarter at a time rather than doubled, as a
        // tree of a million nodes is measured against a memory bound.
        let mut nodes: Vec<Node> = Vec::with_capacity(tensors.len() + 2);
        nodes.push(new_node(NONE, 0));
        let mut tensor_nodes = vec![ROOT; tensors.len()];
        let mut index = ChildIndex::new(expected_nodes);
        // The path of the previous tensor, to skip lookups for the prefix consecutive names share.
        let mut previous: Vec<(NodeId, usize)> = Vec::new();
        let mut previous_name = "";

        for (position, tensor) in tensors.iter().enumerate() {
            if !include(tensor) {
                continue;
            }
            // Reuse the nodes of the whole segments this name shares with the previous one;
            // `previous` holds each segment's node and where it ends in the previous name.
            let name = tensor.name();
            let common = common_prefix_len(previous_name.as_bytes(), name.as_bytes());
            let ends_segment = |text: &str| text.len() == common || text.as_bytes()[common] == b'.';
            let whole = ends_segment(previous_name) && ends_segment(name);
            let shared = previous
                .iter()
                .take_while(|&&(_, end)| end < common || (whole && end == common))
                .count();
            previous.truncate(shared);
            previous_name = name;
            let mut node = previous.last().map_or(ROOT, |&(id, _)| id);
            if previous.last().is_none_or(|&(_, end)| end < name.len()) {
                let base = previous.last().map_or(0, |&(_, end)| end + 1);
                let dots =
                    memchr::memchr_iter(b'.', &name.as_bytes()[base..]).map(move |dot| base + dot);
                let mut start = base;
                // A node made for this name has no children yet: nothing to look up below it.
                let mut created = false;
                for end in dots.chain(std::iter::once(name.len())) {
                    let segment = &name[start..end];
                    let found = if created {
                        None
                    } else {
                        index.find(&nodes, &segments, node, segment)
                    };
                    node = if let Some(id) = found {
                        id
                    } else {
                        created = true;
                        let id = to_u32(nodes.len());
                        if nodes.len() == nodes.capacity() {
                            nodes.reserve_exact(nodes.len() / 4);
                        }
                        nodes.push(new_node(node, to_u32(segments.len())));
                        segments.push_str(segment);
                        index.insert(&nodes, &segments, id);
                        id
                    };
                    previous.push((node, end));
                    start = end + 1;
                }
            }
            nodes[node as usize].tensor = to_u32(position);
            tensor_nodes[position] = node;
        }
        drop(index);
        // Reserved for one and a half nodes a tensor, which a flat model does not use.
        nodes.shrink_to_fit();
        segments.shrink_to_fit();
        let children = pack_children(&mut nodes, &segments);
        // Children are created after their parents, so one backward pass sums every subtree.
        for id in (0..nodes.len()).rev() {
            if let Some(tensor) = nodes[id].tensor() {
                let share = tensor_share(&tensors[tensor]);
                let mut own = Totals {
                    tensors: 1,
                    parameters: share.parameters,
                    bytes: share.bytes,
                    dtypes: DtypeSet::default(),
                };
                own.dtypes.insert(share.dtype);
                nodes[id].totals.add(&own);
            }
            if let Some(parent) = nodes[id].parent() {
                let totals = nodes[id].totals;
                nodes[parent as usize].totals.add(&totals);
            }
        }
        LayerTree {
            nodes,
            children,
            segments,
            tensor_nodes,
        }
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }

    pub fn root(&self) -> &Node {
        self.node(ROOT)
    }

    /// The node's part of the name (`12` in `model.layers.12.mlp`).
    pub fn segment(&self, id: NodeId) -> &str {
        segment_text(&self.nodes, &self.segments, id)
    }

    /// The node's children, in natural order.
    pub fn children(&self, id: NodeId) -> &[NodeId] {
        &self.children[run(&self.nodes, id, |n| n.children, self.children.len())]
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.len() <= 1
    }

    /// The node of a tensor, by its index in the list the tree was built from.
    pub fn node_of_tensor(&self, tensor: usize) -> Option<NodeId> {
        self.tensor_nodes
            .get(tensor)
            .copied()
            .filter(|&node| node != ROOT)
    }

    /// The node's ancestors, nearest first, the root excluded.
    pub fn ancestors(&self, id: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        std::iter::successors(self.node(id).parent(), |&p| self.node(p).parent())
            .filter(|&p| p != ROOT)
    }

    /// How many groups the node is below: 0 at the top level.
    pub fn depth(&self, id: NodeId) -> usize {
        self.ancestors(id).count()
    }

    /// The node named by the dotted path `name`, each part found among its parent's children
    /// (which are in natural order) by bisection.
    pub fn find(&self, name: &str) -> Option<NodeId> {
        name.split('.').try_fold(ROOT, |node, part| {
            let children = self.children(node);
            children
                .binary_search_by(|&child| natural_cmp(self.segment(child), part))
                .ok()
                .map(|at| children[at])
        })
    }

    /// The dotted path from the root to the node.
    pub fn path(&self, id: NodeId) -> String {
        let mut parts: Vec<&str> = self.ancestors(id).map(|a| self.segment(a)).collect();
        parts.reverse();
        parts.push(self.segment(id));
        parts.join(".")
    }

    /// Every node below `id` in display order (depth first, natural order), with its depth.
    pub fn walk(&self, id: NodeId) -> Walk<'_> {
        Walk {
            tree: self,
            stack: vec![self.children(id).iter()],
        }
    }

    /// The tensors below `id` (and at it), in display order.
    pub fn tensors_below(&self, id: NodeId) -> impl Iterator<Item = usize> + '_ {
        self.node(id).tensor().into_iter().chain(
            self.walk(id)
                .filter_map(|(node, _)| self.node(node).tensor()),
        )
    }

    /// Each dtype's share of the tensors below `id`, largest first.
    pub fn dtype_mix(&self, id: NodeId, tensors: &[Tensor]) -> DtypeMix {
        let mut shares: Vec<DtypeShare> = Vec::new();
        for index in self.tensors_below(id) {
            let share = tensor_share(&tensors[index]);
            match shares.iter_mut().find(|s| s.dtype == share.dtype) {
                Some(existing) => {
                    existing.tensors += 1;
                    existing.parameters = existing.parameters.saturating_add(share.parameters);
                    existing.bytes = existing.bytes.saturating_add(share.bytes);
                }
                None => shares.push(share),
            }
        }
        shares.sort_by(|a, b| {
            b.bytes
                .cmp(&a.bytes)
                .then(b.tensors.cmp(&a.tensors))
                .then(a.dtype.cmp(&b.dtype))
        });
        DtypeMix(shares)
    }
}

impl LayerTree {
    /// A fingerprint of each node's structure: the names below it with their dtypes and shapes,
    /// not their values. Nodes with equal fingerprints hold identically shaped subtrees (layer 3
    /// and layer 4 of a model, say), which lets a listing show a run of them once.
    pub fn fingerprints(&self, tensors: &[Tensor]) -> Vec<u64> {
        use std::hash::{BuildHasher, Hash, Hasher};
        let state = foldhash::fast::FixedState::default();
        let mut prints = vec![0u64; self.nodes.len()];
        for id in (0..self.nodes.len()).rev() {
            let node_id = to_u32(id);
            let mut hasher = state.build_hasher();
            if let Some(tensor) = self.nodes[id].tensor() {
                let info = &tensors[tensor].info;
                (info.dtype.name(), &info.shape).hash(&mut hasher);
            }
            for &child in self.children(node_id) {
                (self.segment(child), prints[child as usize]).hash(&mut hasher);
            }
            prints[id] = hasher.finish();
        }
        prints
    }
}

/// The tensors for which `include` holds, in the order a [`LayerTree`] of them lists them
/// ([`LayerTree::tensors_below`] the root), found by sorting their names part by part instead of
/// building the tree, which takes a fraction of the memory: a name's parts in natural order, a
/// group's own tensor before those below it, and a name given twice once (the last of them, as
/// the tree's node holds).
pub fn display_order(tensors: &[Tensor], include: impl Fn(&Tensor) -> bool) -> Vec<usize> {
    let name = |i: usize| tensors[i].name();
    let mut order: Vec<usize> = (0..tensors.len())
        .filter(|&i| include(&tensors[i]))
        .collect();
    order.sort_by(|&a, &b| path_cmp(name(a), name(b)).then(a.cmp(&b)));
    order.dedup_by(|later, earlier| {
        let same = name(*later) == name(*earlier);
        if same {
            *earlier = *later;
        }
        same
    });
    order
}

/// Dotted names compared part by part in natural order, a name before the longer ones it starts.
fn path_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    // The whole parts the names share compare equal: start at the part where they differ.
    let common = common_prefix_len(a.as_bytes(), b.as_bytes());
    let start = a.as_bytes()[..common]
        .iter()
        .rposition(|&byte| byte == b'.')
        .map_or(0, |dot| dot + 1);
    let (mut a_parts, mut b_parts) = (a[start..].split('.'), b[start..].split('.'));
    loop {
        match (a_parts.next(), b_parts.next()) {
            (Some(x), Some(y)) => match natural_cmp(x, y) {
                std::cmp::Ordering::Equal => {}
                order => return order,
            },
            (x, y) => return x.is_some().cmp(&y.is_some()),
        }
    }
}

/// Finds a node's child by its segment while a tree is built.
///
/// While every node's children arrive in ascending byte order of their segments, as they do from
/// a header sorted by name (the writers' order), a segment greater than the last child's is
/// certainly new and needs no lookup. The first name out of that order turns the index into a
/// hash table of every node, which answers from then on.
struct ChildIndex {
    /// Each node's last child, `NONE` for none; used while `table` is `None`.
    last_child: Vec<NodeId>,
    /// Nodes by parent and segment. It holds node ids alone (the keys are read from the nodes),
    /// which keeps a tree of a million nodes within its memory bound.
    table: Option<HashTable<NodeId>>,
    /// Nodes the tree is likely to have, to size the table.
    expected_nodes: usize,
    hasher: foldhash::fast::RandomState,
}

impl ChildIndex {
    fn new(expected_nodes: usize) -> ChildIndex {
        // The root's entry; grown as nodes come rather than reserved, as an index that soon
        // turns to hashing would leave a large reservation unused.
        ChildIndex {
            last_child: vec![NONE],
            table: None,
            expected_nodes,
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    fn key_hash(&self, parent: NodeId, segment: &str) -> u64 {
        self.hasher.hash_one((parent, segment))
    }

    /// The child of `parent` named `segment`, if it exists.
    fn find(
        &mut self,
        nodes: &[Node],
        segments: &str,
        parent: NodeId,
        segment: &str,
    ) -> Option<NodeId> {
        if self.table.is_none() {
            let last = self.last_child[parent as usize];
            if last == NONE || segment > segment_text(nodes, segments, last) {
                return None;
            }
            self.hash_every_node(nodes, segments);
        }
        let hash = self.key_hash(parent, segment);
        let table = self.table.as_ref()?;
        table
            .find(hash, |&id| {
                nodes[id as usize].parent == parent && segment_text(nodes, segments, id) == segment
            })
            .copied()
    }

    /// Records `id`, the node just pushed, which [`ChildIndex::find`] did not find.
    fn insert(&mut self, nodes: &[Node], segments: &str, id: NodeId) {
        let parent = nodes[id as usize].parent;
        if self.table.is_none() {
            self.last_child[parent as usize] = id;
            self.last_child.push(NONE);
            return;
        }
        let hash = self.key_hash(parent, segment_text(nodes, segments, id));
        let hasher = &self.hasher;
        if let Some(table) = &mut self.table {
            table.insert_unique(hash, id, |&id| {
                hasher.hash_one((nodes[id as usize].parent, segment_text(nodes, segments, id)))
            });
        }
    }

    fn hash_every_node(&mut self, nodes: &[Node], segments: &str) {
        let mut table = HashTable::with_capacity(self.expected_nodes.max(nodes.len() + 1));
        for id in 1..to_u32(nodes.len()) {
            let hash = self.key_hash(nodes[id as usize].parent, segment_text(nodes, segments, id));
            table.insert_unique(hash, id, |&id| {
                self.key_hash(nodes[id as usize].parent, segment_text(nodes, segments, id))
            });
        }
        self.table = Some(table);
        self.last_child = Vec::new();
    }
}

/// Every node's children, packed run after run in node order and each run in natural order
/// (counted, placed, then sorted), with the start of each node's run recorded in it.
fn pack_children(nodes: &mut [Node], segments: &str) -> Vec<NodeId> {
    let mut starts = vec![0u32; nodes.len() + 1];
    for node in &nodes[1..] {
        starts[node.parent as usize + 1] += 1;
    }
    for i in 1..starts.len() {
        starts[i] += starts[i - 1];
    }
    // Each node's `children` is its placing cursor until every child is placed.
    for (node, &start) in nodes.iter_mut().zip(&starts) {
        node.children = start;
    }
    let mut children = vec![ROOT; nodes.len().saturating_sub(1)];
    for id in 1..nodes.len() {
        let cursor = &mut nodes[nodes[id].parent as usize].children;
        children[*cursor as usize] = to_u32(id);
        *cursor += 1;
    }
    for (node, &start) in nodes.iter_mut().zip(&starts) {
        node.children = start;
    }
    for pair in starts.windows(2) {
        children[pair[0] as usize..pair[1] as usize].sort_by(|&a, &b| {
            natural_cmp(
                segment_text(nodes, segments, a),
                segment_text(nodes, segments, b),
            )
        });
    }
    children
}

/// The range of node `id`'s part of a back-to-back list: from its start to the next node's
/// start, or to `total` for the last node.
fn run(nodes: &[Node], id: NodeId, start: impl Fn(&Node) -> u32, total: usize) -> Range<usize> {
    let id = id as usize;
    let end = nodes.get(id + 1).map_or(total, |next| start(next) as usize);
    start(&nodes[id]) as usize..end
}

fn segment_text<'s>(nodes: &[Node], segments: &'s str, id: NodeId) -> &'s str {
    &segments[run(nodes, id, |n| n.segment, segments.len())]
}

fn to_u32(value: usize) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

/// Depth-first iterator over a subtree; see [`LayerTree::walk`].
#[derive(Debug)]
pub struct Walk<'a> {
    tree: &'a LayerTree,
    /// The children left to visit at each level of the path walked: memory grows with the depth
    /// of the tree, not its width.
    stack: Vec<std::slice::Iter<'a, NodeId>>,
}

impl Iterator for Walk<'_> {
    type Item = (NodeId, usize);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let depth = self.stack.len().checked_sub(1)?;
            if let Some(&id) = self.stack[depth].next() {
                self.stack.push(self.tree.children(id).iter());
                return Some((id, depth));
            }
            self.stack.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::TensorInfo;
    use std::cmp::Ordering;

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
                        shape: shape.into(),
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
            .map(|(id, depth)| format!("{}{}", "  ".repeat(depth), tree.segment(id)))
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
        let layers_id = tree.children(tree.children(ROOT)[1])[0];
        let layers = tree.node(layers_id);
        assert_eq!(layers.totals.tensors, 3);
        assert_eq!(layers.totals.dtypes.len(), 2);
        let mix = tree.dtype_mix(layers_id, &list);
        assert_eq!(mix.0[0].dtype, Some(Dtype::F32));
        assert_eq!(mix.0[1].bytes, 8);
    }

    #[test]
    fn fingerprints_match_for_identically_shaped_subtrees() {
        let list = tensors(&[
            ("layers.0.a", Dtype::F32, &[2]),
            ("layers.1.a", Dtype::F32, &[2]),
            ("layers.2.a", Dtype::F32, &[3]),
            ("layers.3.b", Dtype::F32, &[2]),
        ]);
        let tree = LayerTree::build(&list, |_| true);
        let prints = tree.fingerprints(&list);
        let layers = tree.children(ROOT)[0];
        let print = |i: usize| prints[tree.children(layers)[i] as usize];
        assert_eq!(print(0), print(1));
        assert_ne!(print(1), print(2), "a different shape");
        assert_ne!(print(1), print(3), "a different name");
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

    fn named(names: &[String]) -> Vec<Tensor> {
        names
            .iter()
            .map(|name| Tensor {
                info: TensorInfo {
                    name: name.as_str().into(),
                    dtype: Dtype::U8.into(),
                    shape: [1].as_slice().into(),
                    data_offsets: [0, 1],
                },
                shard: 0,
            })
            .collect()
    }

    proptest::proptest! {
        /// In any order (sorted, reversed, shuffled, repeated names), every tensor lands on the
        /// node of its own path, siblings are distinct and in natural order, and there is one
        /// node per distinct dotted prefix.
        #[test]
        fn any_order_of_names_builds_the_same_tree(
            parts in proptest::collection::vec(
                proptest::collection::vec(
                    proptest::sample::select(vec!["a", "b", "a-b", "ab", "2", "10", "02", ""]),
                    1..4,
                ),
                0..40,
            ),
            sorted in proptest::bool::ANY,
        ) {
            let mut names: Vec<String> = parts.iter().map(|p| p.join(".")).collect();
            if sorted {
                names.sort();
            }
            let list = named(&names);
            let tree = LayerTree::build(&list, |_| true);
            for (position, name) in names.iter().enumerate() {
                let node = tree.node_of_tensor(position).unwrap();
                proptest::prop_assert_eq!(&tree.path(node), name);
                proptest::prop_assert_eq!(tree.find(name), Some(node));
                proptest::prop_assert_eq!(tree.depth(node), name.matches('.').count());
            }
            let mut prefixes = std::collections::HashSet::new();
            for name in &names {
                let dots = name.match_indices('.').map(|(at, _)| at);
                for end in dots.chain([name.len()]) {
                    prefixes.insert(&name[..end]);
                }
            }
            proptest::prop_assert_eq!(tree.len(), prefixes.len() + 1);
            for id in 0..to_u32(tree.len()) {
                let children = tree.children(id);
                for pair in children.windows(2) {
                    proptest::prop_assert_eq!(
                        natural_cmp(tree.segment(pair[0]), tree.segment(pair[1])),
                        Ordering::Less
                    );
                }
            }
            let walked: Vec<usize> = tree.tensors_below(ROOT).collect();
            proptest::prop_assert_eq!(display_order(&list, |_| true), walked);
            // A repeated name (one in two shards) is one node, holding one of them.
            let distinct: std::collections::HashSet<&String> = names.iter().collect();
            proptest::prop_assert_eq!(tree.root().totals.tensors as usize, distinct.len());
        }
    }
}
