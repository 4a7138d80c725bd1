//! The layer tree: tensors grouped by the dotted parts of their names, with totals on every node.
//! Plain data: the TUI and the text reports each draw it their own way.

use crate::format::{Dtype, OtherDtype, Tensor, TensorDtype};
use crate::text::{common_prefix_len, natural_cmp};
use std::ops::Range;
use std::sync::Arc;

pub type NodeId = u32;

/// The root node's id; the root has no name and holds the whole model.
pub const ROOT: NodeId = 0;

#[derive(Debug)]
pub struct LayerTree {
    nodes: Vec<Node>,
    /// What each group (a node with children, and the root) holds. Groups come first among the
    /// nodes, so this is indexed by node id; a leaf's totals are its tensor's, not stored, as most
    /// nodes of a large model are leaves.
    group_totals: Vec<Totals>,
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

#[derive(Clone, Copy, Debug)]
pub struct Node {
    /// See [`Node::parent`].
    parent: NodeId,
    /// See [`Node::tensor`].
    tensor: u32,
    /// Where the node's name part starts in `segments`; it ends where the next node's starts.
    segment: u32,
    /// Where the node's run starts in `children`; it ends where the next node's starts.
    children: u32,
}

/// What a node and everything below it hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// 32 bits, to keep the totals small: no model has 4 billion tensors.
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
    const QUANTIZED: u32 = 1 << (Dtype::ALL.len() + 1);

    fn insert(&mut self, dtype: &TensorDtype) {
        self.0 |= match dtype {
            TensorDtype::Known(d) => 1 << d.rank(),
            TensorDtype::Unknown(other) if other.is_quantized() => Self::QUANTIZED,
            TensorDtype::Unknown(_) => Self::UNKNOWN,
        };
    }

    /// Whether quantized logical weights are below.
    pub fn has_quantized(self) -> bool {
        self.0 & Self::QUANTIZED != 0
    }

    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The dtypes present, in declaration order; `None` stands for names the format does not
    /// define. Quantized weights are left out (see [`DtypeSet::has_quantized`]).
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

/// One dtype's share of a subtree. `dtype` is `None` for names the format does not define and
/// for quantized weights, which `quantized` names by scheme ("int4 (GPTQ)").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DtypeShare {
    pub dtype: Option<Dtype>,
    pub quantized: Option<Arc<OtherDtype>>,
    pub tensors: u64,
    pub parameters: u64,
    pub bytes: u64,
}

impl DtypeShare {
    /// The dtype's name, the scheme's label for quantized weights, `unknown` for names the
    /// format does not define.
    pub fn name<'a>(&'a self, unknown: &'a str) -> &'a str {
        match (&self.quantized, self.dtype) {
            (Some(label), _) => label,
            (None, Some(dtype)) => dtype.name(),
            (None, None) => unknown,
        }
    }
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
    fn of(tensor: &Tensor) -> Totals {
        let share = tensor_share(tensor);
        let mut totals = Totals {
            tensors: 1,
            parameters: share.parameters,
            bytes: share.bytes,
            dtypes: DtypeSet::default(),
        };
        totals.dtypes.insert(&tensor.info.dtype);
        totals
    }

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
        quantized: match &tensor.info.dtype {
            TensorDtype::Unknown(other) if other.is_quantized() => Some(other.clone()),
            _ => None,
        },
        tensors: 1,
        parameters: tensor.info.element_count().unwrap_or(0),
        bytes: tensor.info.byte_len(),
    }
}

impl LayerTree {
    /// Builds the tree of every tensor for which `include` holds.
    ///
    /// Names are placed in header order while it is sorted part by part (the writers' order), so
    /// that a name shares with the one before it all the nodes it shares with any placed before.
    /// At the first name out of that order the names are sorted and placed again. No table of
    /// nodes is kept either way, as a tree of millions of nodes is measured against a memory
    /// bound.
    pub fn build(tensors: &[Tensor], include: impl Fn(&Tensor) -> bool) -> LayerTree {
        let included = || (0..tensors.len()).filter(|&i| include(&tensors[i]));
        let mut placing = Placing::place(tensors, included(), Order::AsGiven);
        if placing.out_of_order {
            drop(placing);
            let mut order: Vec<u32> = included().map(to_u32).collect();
            order.sort_unstable_by(|&a, &b| {
                let name = |i: u32| tensors[i as usize].name().as_bytes();
                parts_cmp(name(a), name(b)).then(a.cmp(&b))
            });
            placing = Placing::place(
                tensors,
                order.into_iter().map(|i| i as usize),
                Order::Sorted,
            );
        }
        placing.into_tree(tensors)
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }

    pub fn root(&self) -> &Node {
        self.node(ROOT)
    }

    /// What the node and everything below it hold; `tensors` is the list the tree was built from.
    pub fn totals(&self, id: NodeId, tensors: &[Tensor]) -> Totals {
        node_totals(&self.group_totals, &self.nodes, id as usize, tensors)
    }

    /// How many nodes are groups: those with children, and the root. They have the ids below
    /// this; the leaves come after them.
    pub fn group_count(&self) -> usize {
        self.group_totals.len()
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

    /// The node named by the dotted path `name`. At each node, the child whose first part is the
    /// name's next part is found by bisection (siblings differ in their first part, and are in
    /// natural order), and its parts must then all come next in the name.
    pub fn find(&self, name: &str) -> Option<NodeId> {
        let mut node = ROOT;
        let mut rest = name;
        loop {
            let children = self.children(node);
            let at = children
                .binary_search_by(|&child| {
                    natural_cmp(first_part(self.segment(child)), first_part(rest))
                })
                .ok()?;
            node = children[at];
            let segment = self.segment(node);
            match rest.strip_prefix(segment)? {
                "" => return Some(node),
                below => rest = below.strip_prefix('.')?,
            }
        }
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
            match shares
                .iter_mut()
                .find(|s| s.dtype == share.dtype && s.quantized == share.quantized)
            {
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
                .then_with(|| {
                    a.quantized
                        .as_deref()
                        .map(|q| &**q)
                        .cmp(&b.quantized.as_deref().map(|q| &**q))
                })
        });
        DtypeMix(shares)
    }
}

/// A fingerprint of each node's structure: the names below it with their dtypes and shapes,
/// not their values. Nodes with equal fingerprints hold identically shaped subtrees (layer 3 and
/// layer 4 of a model, say), which lets a listing show a run of them once.
#[derive(Debug)]
pub struct Fingerprints<'a> {
    tree: &'a LayerTree,
    tensors: &'a [Tensor],
    /// The groups' fingerprints, by id; a leaf's is worked out when asked for.
    groups: Vec<u64>,
}

impl<'a> Fingerprints<'a> {
    /// Of every node of `tree`, built from `tensors`.
    pub fn new(tree: &'a LayerTree, tensors: &'a [Tensor]) -> Fingerprints<'a> {
        let mut prints = Fingerprints {
            tree,
            tensors,
            groups: vec![0; tree.group_count()],
        };
        // Children come after their parent.
        for id in (0..tree.group_count()).rev() {
            prints.groups[id] = prints.hash(to_u32(id));
        }
        prints
    }

    pub fn of(&self, id: NodeId) -> u64 {
        self.groups
            .get(id as usize)
            .copied()
            .unwrap_or_else(|| self.hash(id))
    }

    fn hash(&self, id: NodeId) -> u64 {
        use std::hash::{BuildHasher, Hash, Hasher};
        let mut hasher = foldhash::fast::FixedState::default().build_hasher();
        if let Some(tensor) = self.tree.node(id).tensor() {
            let info = &self.tensors[tensor].info;
            (info.dtype.name(), &info.shape).hash(&mut hasher);
        }
        for &child in self.tree.children(id) {
            (self.tree.segment(child), self.of(child)).hash(&mut hasher);
        }
        hasher.finish()
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

/// Dotted names (or parts) compared part by part in byte order: as bytes, but with the dot
/// below every other byte, so a part sorts before the longer parts it starts (`a.x` before
/// `a-b`, as `a` is before `a-b`).
fn parts_cmp(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    let rank = |byte: u8| if byte == b'.' { 0 } else { u16::from(byte) + 1 };
    let common = common_prefix_len(a, b);
    match (a.get(common), b.get(common)) {
        (Some(&x), Some(&y)) => rank(x).cmp(&rank(y)),
        (x, y) => x.is_some().cmp(&y.is_some()),
    }
}

/// How the names given to [`Placing::place`] come.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Order {
    /// In any order: placing stops at the first name out of order.
    AsGiven,
    /// Sorted part by part (see [`parts_cmp`]), so every name is in order.
    Sorted,
}

/// A node as placed, before the tree is numbered and packed.
#[derive(Clone, Copy, Debug)]
struct Placed {
    parent: NodeId,
    tensor: u32,
    /// A tensor whose name starts with the node's path.
    named_by: u32,
    /// Where the parts below the node start in that name: one past the dot after its path (0
    /// for the root, 1 for a node whose path is one empty part).
    below: u32,
}

/// The nodes of a tree being built, in the order they were made, and the path of the last name
/// placed: all that placing names in order needs.
struct Placing {
    nodes: Vec<Placed>,
    tensor_nodes: Vec<NodeId>,
    /// Set when a name came out of order; the names after it were not placed.
    out_of_order: bool,
}

impl Placing {
    /// Places the tensors in the order given, stopping at the first name out of order unless
    /// they are known to be sorted.
    ///
    /// Each name shares its first whole parts with the name before it, and the nodes of those:
    /// the nodes on the previous path deeper than that are done with. Where the two names part
    /// inside one node's parts (which spans several while nothing else branches there), that node
    /// is split in two, and the name hangs its remaining parts, as one node, from the upper half.
    fn place(tensors: &[Tensor], names: impl Iterator<Item = usize>, order: Order) -> Placing {
        let mut placing = Placing {
            nodes: Vec::with_capacity(tensors.len() + 1),
            tensor_nodes: vec![ROOT; tensors.len()],
            out_of_order: false,
        };
        let nodes = &mut placing.nodes;
        nodes.push(Placed {
            parent: NONE,
            tensor: NONE,
            named_by: NONE,
            below: 0,
        });
        let mut path: Vec<NodeId> = vec![ROOT];
        let mut previous_name: Option<&str> = None;
        for position in names {
            let name = tensors[position].name();
            let shared = match previous_name {
                Some(previous) => {
                    if order == Order::AsGiven
                        && parts_cmp(name.as_bytes(), previous.as_bytes()).is_lt()
                    {
                        placing.out_of_order = true;
                        return placing;
                    }
                    to_u32(shared_parts_end(previous, name))
                }
                None => 0,
            };
            previous_name = Some(name);
            let mut split = None;
            while let [.., _, last] = path[..]
                && nodes[last as usize].below > shared
            {
                split = path.pop();
            }
            let top = path.last().copied().unwrap_or(ROOT);
            if nodes[top as usize].below < shared
                && let Some(lower) = split
            {
                let upper = push_node(
                    nodes,
                    Placed {
                        parent: top,
                        tensor: NONE,
                        named_by: to_u32(position),
                        below: shared,
                    },
                );
                nodes[lower as usize].parent = upper;
                path.push(upper);
            }
            let top = path.last().copied().unwrap_or(ROOT);
            let node = if top != ROOT && nodes[top as usize].below as usize == name.len() + 1 {
                // The same name again (in two shards): one node, holding the last.
                top
            } else {
                let leaf = push_node(
                    nodes,
                    Placed {
                        parent: top,
                        tensor: NONE,
                        named_by: to_u32(position),
                        below: to_u32(name.len() + 1),
                    },
                );
                path.push(leaf);
                leaf
            };
            nodes[node as usize].tensor = to_u32(position);
            placing.tensor_nodes[position] = node;
        }
        placing
    }

    /// The node's part of its name.
    fn segment<'t>(&self, tensors: &'t [Tensor], id: usize) -> &'t str {
        let node = self.nodes[id];
        let start = self.nodes[node.parent as usize].below as usize;
        &tensors[node.named_by as usize].name()[start..node.below as usize - 1]
    }

    /// Numbers the groups before the leaves, each parent before its children (depth first, as a
    /// split can make a parent after its child), then lays out the name parts and children in
    /// that order and sums the totals. The nodes are renumbered in place, as a tree of millions
    /// of nodes is counted against the memory bound.
    fn into_tree(self, tensors: &[Tensor]) -> LayerTree {
        let (made_ids, group_count) = self.depth_first();
        // Each node's part, copied in the new order; where it starts noted in place of the made
        // id, which is no longer needed.
        let mut new_ids = made_ids.clone();
        invert(&mut new_ids);
        let mut segment_starts = made_ids;
        let mut segments = String::new();
        for made in &mut segment_starts {
            let start = to_u32(segments.len());
            if *made != ROOT {
                segments.push_str(self.segment(tensors, *made as usize));
            }
            *made = start;
        }
        segments.shrink_to_fit();
        let Placing {
            nodes: mut placed,
            mut tensor_nodes,
            ..
        } = self;
        for node in &mut tensor_nodes {
            *node = new_ids[*node as usize];
        }
        for node in &mut placed {
            node.parent = node.parent().map_or(NONE, |p| new_ids[p as usize]);
        }
        // Each node moved to its new id, cycle by cycle.
        for id in 0..placed.len() {
            while new_ids[id] as usize != id {
                let to = new_ids[id] as usize;
                placed.swap(id, to);
                new_ids.swap(id, to);
            }
        }
        drop(new_ids);
        // The same size as a placed node: converted where it lies.
        let mut nodes: Vec<Node> = placed
            .into_iter()
            .enumerate()
            .map(|(id, node)| Node {
                parent: node.parent,
                tensor: node.tensor,
                segment: segment_starts[id],
                children: 0,
            })
            .collect();
        drop(segment_starts);
        let children = pack_children(&mut nodes, &segments);
        let mut group_totals = vec![Totals::default(); group_count];
        for (totals, node) in group_totals.iter_mut().zip(&nodes) {
            if let Some(tensor) = node.tensor() {
                *totals = Totals::of(&tensors[tensor]);
            }
        }
        // Parents come before their children, so one backward pass sums every subtree.
        for id in (1..nodes.len()).rev() {
            let totals = node_totals(&group_totals, &nodes, id, tensors);
            group_totals[nodes[id].parent as usize].add(&totals);
        }
        LayerTree {
            nodes,
            group_totals,
            children,
            segments,
            tensor_nodes,
        }
    }

    /// The made ids in their new order: depth first from the root, the groups (nodes with
    /// children, and the root) numbered from 0 and the leaves after them; and how many groups
    /// there are.
    fn depth_first(&self) -> (Vec<u32>, usize) {
        let count = self.nodes.len();
        let (starts, runs) = children_runs(count, |id| self.nodes[id].parent);
        let run = |id: usize| {
            let end = starts.get(id + 1).map_or(runs.len(), |&end| end as usize);
            &runs[starts[id] as usize..end]
        };
        let group_count = (0..count)
            .filter(|&id| id == 0 || !run(id).is_empty())
            .count();
        let mut made_ids = vec![0u32; count];
        let (mut next_group, mut next_leaf) = (0, group_count);
        let mut stack: Vec<&[NodeId]> = vec![&[ROOT]];
        while let Some(top) = stack.last_mut() {
            let Some((&id, rest)) = top.split_first() else {
                stack.pop();
                continue;
            };
            *top = rest;
            let below = run(id as usize);
            let next = if id == ROOT || !below.is_empty() {
                &mut next_group
            } else {
                &mut next_leaf
            };
            made_ids[*next] = id;
            *next += 1;
            stack.push(below);
        }
        (made_ids, group_count)
    }
}

impl Placed {
    fn parent(self) -> Option<NodeId> {
        (self.parent != NONE).then_some(self.parent)
    }
}

/// Adds a node; the list grows a quarter at a time rather than doubling, as a header of a
/// million tensors makes millions of nodes, counted against the memory bound.
fn push_node(nodes: &mut Vec<Placed>, node: Placed) -> NodeId {
    if nodes.len() == nodes.capacity() {
        nodes.reserve_exact(nodes.len() / 4 + 1);
    }
    nodes.push(node);
    to_u32(nodes.len() - 1)
}

/// A dotted name's or segment's first part.
fn first_part(text: &str) -> &str {
    text.split('.').next().unwrap_or_default()
}

/// Where the whole parts two names share end, as [`Placed::below`] counts: one past the dot after
/// them, or 0 if the names differ in their first part.
fn shared_parts_end(a: &str, b: &str) -> usize {
    let common = common_prefix_len(a.as_bytes(), b.as_bytes());
    let ends_part = |name: &str| name.len() == common || name.as_bytes()[common] == b'.';
    if ends_part(a) && ends_part(b) {
        return common + 1;
    }
    a.as_bytes()[..common]
        .iter()
        .rposition(|&byte| byte == b'.')
        .map_or(0, |dot| dot + 1)
}

/// A node's totals: a group's as summed in `group_totals`, a leaf's its tensor's.
fn node_totals(group_totals: &[Totals], nodes: &[Node], id: usize, tensors: &[Tensor]) -> Totals {
    match group_totals.get(id) {
        Some(totals) => *totals,
        None => nodes[id]
            .tensor()
            .map_or_else(Totals::default, |tensor| Totals::of(&tensors[tensor])),
    }
}

/// Turns a list of old ids by new id into a list of new ids by old id, in place.
fn invert(order: &mut [u32]) {
    // Each entry is marked done by its top bit, which no id uses (a header of 100 MB holds
    // far fewer than 2^31 nodes).
    const DONE: u32 = 1 << 31;
    for start in 0..order.len() {
        if order[start] & DONE != 0 {
            continue;
        }
        // Follow the cycle through `start`: the new id of old id `order[new]` is `new`.
        let mut new = start;
        let mut old = order[start];
        while old & DONE == 0 {
            let next = order[old as usize];
            order[old as usize] = to_u32(new) | DONE;
            new = old as usize;
            old = next;
        }
    }
    for entry in order {
        *entry &= !DONE;
    }
}

/// Every node's children, packed run after run in node order and each run in display order,
/// with the start of each node's run recorded in it.
fn pack_children(nodes: &mut [Node], segments: &str) -> Vec<NodeId> {
    let (starts, mut children) = children_runs(nodes.len(), |id| nodes[id].parent);
    for (node, &start) in nodes.iter_mut().zip(&starts) {
        node.children = start;
    }
    for id in 0..nodes.len() {
        let run = run(nodes, to_u32(id), |n| n.children, children.len());
        children[run].sort_by(|&a, &b| {
            path_cmp(
                segment_text(nodes, segments, a),
                segment_text(nodes, segments, b),
            )
        });
    }
    children
}

/// Each node's children, run after run in node order (counted, then placed from the back, so
/// each run is in id order), and where each node's run starts; `parent_of` gives the parent of
/// every node but the root (0).
fn children_runs(count: usize, parent_of: impl Fn(usize) -> NodeId) -> (Vec<u32>, Vec<NodeId>) {
    let mut starts = vec![0u32; count];
    for id in 1..count {
        starts[parent_of(id) as usize] += 1;
    }
    let mut total = 0;
    for start in &mut starts {
        total += *start;
        *start = total;
    }
    let mut runs = vec![ROOT; count.saturating_sub(1)];
    for id in (1..count).rev() {
        let start = &mut starts[parent_of(id) as usize];
        *start -= 1;
        runs[*start as usize] = to_u32(id);
    }
    (starts, runs)
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
    use proptest::strategy::Strategy;
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
                "lm_head.weight",
                "model.layers",
                "  2",
                "    mlp.weight",
                "    norm",
                "  10.mlp.weight",
            ]
        );
        let root = tree.totals(ROOT, &list);
        assert_eq!((root.tensors, root.parameters, root.bytes), (4, 15, 52));
        let layers_id = tree.children(ROOT)[1];
        let layers = tree.totals(layers_id, &list);
        assert_eq!(layers.tensors, 3);
        assert_eq!(layers.dtypes.len(), 2);
        let mix = tree.dtype_mix(layers_id, &list);
        assert_eq!(mix.0[0].dtype, Some(Dtype::F32));
        assert_eq!(mix.0[1].bytes, 8);
    }

    #[test]
    fn fingerprints_match_for_identically_shaped_subtrees() {
        let list = tensors(&[
            ("layers.0.a", Dtype::F32, &[2]),
            ("layers.0.z", Dtype::F32, &[1]),
            ("layers.1.a", Dtype::F32, &[2]),
            ("layers.1.z", Dtype::F32, &[1]),
            ("layers.2.a", Dtype::F32, &[3]),
            ("layers.2.z", Dtype::F32, &[1]),
            ("layers.3.b", Dtype::F32, &[2]),
            ("layers.3.z", Dtype::F32, &[1]),
        ]);
        let tree = LayerTree::build(&list, |_| true);
        let prints = Fingerprints::new(&tree, &list);
        let layers = tree.children(ROOT)[0];
        let print = |i: usize| prints.of(tree.children(layers)[i]);
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
        assert_eq!(labels(&tree), ["a.b", "  c", "a-b.x"]);
        let b = tree
            .node_of_tensor(list.iter().position(|t| t.name() == "a.b").unwrap())
            .unwrap();
        assert_eq!(tree.totals(b, &list).tensors, 2);
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
        #[test]
        fn invert_gives_each_old_id_its_new_one(
            order in (0..60usize).prop_flat_map(|n| {
                proptest::strategy::Just((0..to_u32(n)).collect::<Vec<u32>>()).prop_shuffle()
            }),
        ) {
            let mut inverse = order.clone();
            invert(&mut inverse);
            for (new, &old) in order.iter().enumerate() {
                proptest::prop_assert_eq!(inverse[old as usize] as usize, new);
            }
        }


        /// In any order (sorted, reversed, shuffled, repeated names), every tensor lands on the
        /// node of its own path, siblings are distinct and in natural order, and the nodes are
        /// the names and the prefixes where names branch (a chain of parts nothing else branches
        /// from is one node).
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
            use std::collections::{BTreeSet, HashMap};
            let mut names: Vec<String> = parts.iter().map(|p| p.join(".")).collect();
            if sorted {
                names.sort();
            }
            let list = named(&names);
            let tree = LayerTree::build(&list, |_| true);
            // Each whole-part prefix of a name, with the parts that follow it in other names.
            let mut next_parts: HashMap<&str, BTreeSet<&str>> = HashMap::new();
            for name in &names {
                let dots = name.match_indices('.').map(|(at, _)| at);
                for end in dots {
                    next_parts.entry(&name[..end]).or_default().insert(first_part(&name[end + 1..]));
                }
            }
            let is_node = |path: &str| {
                names.iter().any(|name| name == path)
                    || next_parts.get(path).is_some_and(|next| next.len() > 1)
            };
            let expected: BTreeSet<&str> = names
                .iter()
                .map(String::as_str)
                .chain(next_parts.keys().copied().filter(|&path| is_node(path)))
                .collect();
            proptest::prop_assert_eq!(tree.len(), expected.len() + 1);
            for (position, name) in names.iter().enumerate() {
                let node = tree.node_of_tensor(position).unwrap();
                proptest::prop_assert_eq!(&tree.path(node), name);
                proptest::prop_assert_eq!(tree.find(name), Some(node));
                let above = name
                    .match_indices('.')
                    .filter(|&(at, _)| expected.contains(&name[..at]))
                    .count();
                proptest::prop_assert_eq!(tree.depth(node), above);
            }
            for id in 0..to_u32(tree.len()) {
                let children = tree.children(id);
                let group = id == ROOT || !children.is_empty();
                proptest::prop_assert_eq!((id as usize) < tree.group_count(), group);
                if id != ROOT {
                    proptest::prop_assert!(expected.contains(tree.path(id).as_str()));
                    proptest::prop_assert_eq!(tree.find(&tree.path(id)), Some(id));
                }
                let below = tree.tensors_below(id).count();
                proptest::prop_assert_eq!(tree.totals(id, &list).tensors as usize, below);
                for pair in children.windows(2) {
                    proptest::prop_assert_eq!(
                        natural_cmp(first_part(tree.segment(pair[0])), first_part(tree.segment(pair[1]))),
                        Ordering::Less
                    );
                }
            }
            let walked: Vec<usize> = tree.tensors_below(ROOT).collect();
            proptest::prop_assert_eq!(display_order(&list, |_| true), walked);
            // A repeated name (one in two shards) is one node, holding one of them.
            let distinct: std::collections::HashSet<&String> = names.iter().collect();
            proptest::prop_assert_eq!(tree.totals(ROOT, &list).tensors as usize, distinct.len());
        }
    }
}
