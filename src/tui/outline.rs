//! What the tree pane shows of the layer tree: which groups are open, which nodes pass the
//! search filter, the rows that result, the selection and the scroll position. A quantized
//! model's logical weight opens like a group onto its stored members, which are rows of the
//! outline but not nodes of the tree (the tree is built from the listed tensors).
//!
//! Rows are recomputed only when a group opens or closes or the filter changes, and a frame
//! draws only the rows on screen, so the tree stays fast with every node of a 100,000-tensor
//! model open.

use crate::tree::{LayerTree, NodeId, ROOT};
use fixedbitset::FixedBitSet;

/// A row of the outline: a node of the tree, or a member of the logical weight `node`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    pub node: NodeId,
    /// Which of the weight's members, in the order of its quantization.
    pub member: Option<u16>,
}

impl Row {
    fn node(node: NodeId) -> Row {
        Row { node, member: None }
    }
}

#[derive(Debug, Default)]
pub struct Outline {
    open: FixedBitSet,
    /// How many stored members each node (a logical weight) opens onto; empty when the model
    /// lists no logical weights.
    members: Vec<u16>,
    /// Nodes that pass the filter: a tensor below matches. All of them without a filter.
    shown: FixedBitSet,
    /// The visible rows, top to bottom (their depth is worked out for the rows drawn).
    rows: Vec<Row>,
    selected: usize,
    offset: usize,
    /// Which groups were open before a filter opened the ones it shows.
    open_before_filter: Option<FixedBitSet>,
}

impl Outline {
    /// The outline of `tree` with its first level open, unless that level is too long to open
    /// usefully (a model's top level holds a handful of groups).
    pub fn new(tree: &LayerTree) -> Outline {
        Outline::with_members(tree, Vec::new())
    }

    /// The outline of `tree` where node `n` is a logical weight of `members[n]` stored members
    /// (`members` indexed by node, or empty).
    pub fn with_members(tree: &LayerTree, members: Vec<u16>) -> Outline {
        const OPEN_UP_TO: usize = 1000;
        let mut outline = Outline {
            open: FixedBitSet::with_capacity(tree.len()),
            shown: all_set(tree.len()),
            members,
            ..Outline::default()
        };
        outline.open.insert(ROOT as usize);
        if tree.children(ROOT).len() <= OPEN_UP_TO {
            for &child in tree.children(ROOT) {
                if !tree.children(child).is_empty() {
                    outline.open.insert(child as usize);
                }
            }
        }
        outline.rebuild(tree);
        outline
    }

    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    pub fn offset(&self) -> usize {
        self.offset
    }

    pub fn selected_row(&self) -> usize {
        self.selected
    }

    /// The selected node; for a member row, the logical weight it belongs to.
    pub fn selected_node(&self) -> Option<NodeId> {
        self.rows.get(self.selected).map(|row| row.node)
    }

    /// The selected member row's weight node and member.
    pub fn selected_member(&self) -> Option<(NodeId, u16)> {
        let row = self.rows.get(self.selected)?;
        Some((row.node, row.member?))
    }

    pub fn is_open(&self, node: NodeId) -> bool {
        self.open.contains(node as usize)
    }

    /// How many stored members node `node` opens onto (0 for anything but a logical weight).
    pub fn member_count(&self, node: NodeId) -> u16 {
        self.members.get(node as usize).copied().unwrap_or(0)
    }

    /// Whether `node` has rows below it to open.
    pub fn opens(&self, tree: &LayerTree, node: NodeId) -> bool {
        !tree.children(node).is_empty() || self.member_count(node) > 0
    }

    /// Recomputes the rows, keeping the selected node selected when it is still visible.
    fn rebuild(&mut self, tree: &LayerTree) {
        let keep = self.rows.get(self.selected).copied();
        self.rows.clear();
        let mut stack: Vec<NodeId> = tree.children(ROOT).iter().rev().copied().collect();
        while let Some(node) = stack.pop() {
            if !self.shown.contains(node as usize) {
                continue;
            }
            self.rows.push(Row::node(node));
            if self.open.contains(node as usize) {
                stack.extend(tree.children(node).iter().rev());
                self.rows
                    .extend((0..self.member_count(node)).map(|member| Row {
                        node,
                        member: Some(member),
                    }));
            }
        }
        // A member row closed away leaves its weight selected.
        self.selected = keep
            .and_then(|kept| {
                let at = |row: Row| self.rows.iter().position(|&r| r == row);
                at(kept).or_else(|| at(Row::node(kept.node)))
            })
            .unwrap_or(0);
    }

    /// Shows only the nodes above the `matching` tensors (each group of them open); or every
    /// node again, opened as before the filter, when `matching` is `None`.
    pub fn filter(&mut self, tree: &LayerTree, matching: Option<&[usize]>) {
        match matching {
            None => {
                self.shown.set_range(.., true);
                if let Some(open) = self.open_before_filter.take() {
                    self.open = open;
                }
            }
            Some(tensors) => {
                if self.open_before_filter.is_none() {
                    self.open_before_filter = Some(self.open.clone());
                }
                self.shown.clear();
                // The groups above a match open; the match itself (a logical weight with its
                // members) stays as it was.
                for node in tensors.iter().filter_map(|&t| tree.node_of_tensor(t)) {
                    self.shown.insert(node as usize);
                    for up in tree.ancestors(node) {
                        let was_shown = self.shown.put(up as usize);
                        if self.open.put(up as usize) && was_shown {
                            break;
                        }
                    }
                }
            }
        }
        self.rebuild(tree);
    }

    /// Selects `node`, opening the groups above it. Returns whether it is now selected.
    pub fn select(&mut self, tree: &LayerTree, node: NodeId) -> bool {
        if !self.shown.contains(node as usize) {
            return false;
        }
        let mut changed = false;
        for up in tree.ancestors(node) {
            changed |= !self.open.put(up as usize);
        }
        if changed {
            self.rebuild(tree);
        }
        match self.rows.iter().position(|&row| row == Row::node(node)) {
            Some(row) => {
                self.selected = row;
                true
            }
            None => false,
        }
    }

    /// Moves the selection by `delta` rows, within the rows. Returns whether it moved.
    pub fn move_by(&mut self, delta: isize) -> bool {
        let last = self.rows.len().saturating_sub(1);
        let target = self.selected.saturating_add_signed(delta).min(last);
        std::mem::replace(&mut self.selected, target) != target
    }

    pub fn select_row(&mut self, row: usize) -> bool {
        let target = row.min(self.rows.len().saturating_sub(1));
        std::mem::replace(&mut self.selected, target) != target
    }

    /// Opens the selected group (or logical weight), or if it is open, moves to its first row.
    pub fn expand(&mut self, tree: &LayerTree) -> bool {
        let Some(&row) = self.rows.get(self.selected) else {
            return false;
        };
        let node = row.node;
        if row.member.is_some() || !self.opens(tree, node) {
            return false;
        }
        if self.open.put(node as usize) {
            return self.move_by(1);
        }
        self.rebuild(tree);
        true
    }

    /// Closes the selected group, or if it is closed (or a tensor), moves to its parent; from a
    /// member, moves to its weight.
    pub fn collapse(&mut self, tree: &LayerTree) -> bool {
        let Some(&row) = self.rows.get(self.selected) else {
            return false;
        };
        let node = row.node;
        if row.member.is_some() {
            return self.select(tree, node);
        }
        if self.open.contains(node as usize) && self.opens(tree, node) {
            self.open.set(node as usize, false);
            self.rebuild(tree);
            return true;
        }
        match tree.node(node).parent().filter(|&p| p != ROOT) {
            Some(parent) => self.select(tree, parent),
            None => false,
        }
    }

    pub fn toggle(&mut self, tree: &LayerTree) -> bool {
        let Some(&row) = self.rows.get(self.selected) else {
            return false;
        };
        let node = row.node;
        if row.member.is_some() || !self.opens(tree, node) {
            return false;
        }
        self.open.toggle(node as usize);
        self.rebuild(tree);
        true
    }

    /// Opens or closes every group; a logical weight's members stay as they were when opening
    /// (the whole model's members at once would bury its weights).
    pub fn set_all(&mut self, tree: &LayerTree, open: bool) -> bool {
        if open {
            for node in (0..NodeId::MAX).take(tree.len()) {
                if !tree.children(node).is_empty() {
                    self.open.insert(node as usize);
                }
            }
        } else {
            self.open.clear();
        }
        self.open.insert(ROOT as usize);
        self.rebuild(tree);
        true
    }

    /// Keeps the selection on screen in a view of `height` rows; returns the first row to draw.
    pub fn scroll_into_view(&mut self, height: usize) -> usize {
        let height = height.max(1);
        if self.selected < self.offset {
            self.offset = self.selected;
        } else if self.selected >= self.offset + height {
            self.offset = self.selected + 1 - height;
        }
        self.offset = self.offset.min(self.rows.len().saturating_sub(height));
        self.offset
    }
}

/// `len` bits, all set.
fn all_set(len: usize) -> FixedBitSet {
    let mut bits = FixedBitSet::with_capacity(len);
    bits.set_range(.., true);
    bits
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Dtype, Tensor, TensorInfo};

    fn tree(names: &[&str]) -> (LayerTree, Vec<Tensor>) {
        let tensors: Vec<Tensor> = names
            .iter()
            .enumerate()
            .map(|(i, &name)| Tensor {
                info: TensorInfo {
                    name: name.into(),
                    dtype: Dtype::U8.into(),
                    shape: [1u64][..].into(),
                    data_offsets: [i as u64, i as u64 + 1],
                },
                shard: 0,
            })
            .collect();
        (LayerTree::build(&tensors, |_| true), tensors)
    }

    fn labels(outline: &Outline, tree: &LayerTree) -> Vec<String> {
        outline
            .rows()
            .iter()
            .map(|row| match row.member {
                None => format!(
                    "{}{}",
                    "  ".repeat(tree.depth(row.node)),
                    tree.segment(row.node)
                ),
                Some(member) => format!("{}#{member}", "  ".repeat(tree.depth(row.node) + 1)),
            })
            .collect()
    }

    #[test]
    fn opens_closes_and_filters() {
        let (tree, tensors) = tree(&["a.x.v", "a.x.w", "a.y.w", "b.v", "b.w"]);
        let mut outline = Outline::new(&tree);
        assert_eq!(
            labels(&outline, &tree),
            ["a", "  x", "  y.w", "b", "  v", "  w"]
        );
        assert!(outline.collapse(&tree));
        assert_eq!(labels(&outline, &tree), ["a", "b", "  v", "  w"]);
        outline.set_all(&tree, true);
        assert_eq!(outline.rows().len(), 8);
        let matching: Vec<usize> = (0..tensors.len())
            .filter(|&t| tensors[t].name().ends_with("x.w"))
            .collect();
        outline.filter(&tree, Some(&matching));
        assert_eq!(labels(&outline, &tree), ["a", "  x", "    w"]);
        outline.filter(&tree, None);
        assert_eq!(outline.rows().len(), 8, "opened as before the filter");
    }

    #[test]
    fn a_top_level_of_thousands_starts_closed() {
        let names: Vec<String> = (0..1001)
            .flat_map(|i| [format!("g{i}.a"), format!("g{i}.b")])
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let (wide, _) = tree(&names);
        assert_eq!(Outline::new(&wide).rows().len(), 1001);
        let (narrower, _) = tree(&names[..2000]);
        assert_eq!(Outline::new(&narrower).rows().len(), 3000);
    }

    #[test]
    fn a_logical_weight_opens_onto_its_members() {
        let (tree, tensors) = tree(&["a.w", "a.x", "b.w"]);
        let node = |t: usize| tree.node_of_tensor(t).unwrap();
        let mut members = vec![0; tree.len()];
        members[node(0) as usize] = 2;
        members[node(2) as usize] = 3;
        let mut outline = Outline::with_members(&tree, members);
        assert_eq!(labels(&outline, &tree), ["a", "  w", "  x", "b.w"]);
        assert!(outline.select(&tree, node(0)));
        assert!(outline.expand(&tree), "a weight opens like a group");
        assert_eq!(
            labels(&outline, &tree),
            ["a", "  w", "    #0", "    #1", "  x", "b.w"]
        );
        assert!(outline.expand(&tree), "and a second press enters it");
        assert_eq!(outline.selected_member(), Some((node(0), 0)));
        assert_eq!(
            outline.selected_node(),
            Some(node(0)),
            "a member stands for its weight"
        );
        assert!(!outline.expand(&tree), "a member opens onto nothing");
        assert!(outline.move_by(1));
        assert!(
            outline.collapse(&tree),
            "Left from a member goes to its weight"
        );
        assert_eq!(outline.selected_member(), None);
        assert_eq!(outline.selected_node(), Some(node(0)));
        assert!(outline.toggle(&tree));
        assert_eq!(labels(&outline, &tree), ["a", "  w", "  x", "b.w"]);
        assert!(outline.select(&tree, node(1)));
        assert!(
            !outline.expand(&tree),
            "a tensor with no members opens onto nothing"
        );

        outline.set_all(&tree, true);
        assert_eq!(
            outline.rows().len(),
            4,
            "opening everything opens groups only"
        );
        let matching: Vec<usize> = (0..tensors.len())
            .filter(|&t| tensors[t].name().ends_with('w'))
            .collect();
        outline.filter(&tree, Some(&matching));
        assert_eq!(labels(&outline, &tree), ["a", "  w", "b.w"]);
        assert!(outline.select(&tree, node(2)));
        assert!(outline.expand(&tree));
        assert_eq!(
            labels(&outline, &tree),
            ["a", "  w", "b.w", "  #0", "  #1", "  #2"]
        );
        assert!(outline.move_by(2));
        outline.filter(&tree, None);
        assert_eq!(
            outline.selected_member(),
            None,
            "closed again as before the filter"
        );
        assert_eq!(
            outline.selected_node(),
            Some(node(2)),
            "its weight selected"
        );
    }

    #[test]
    fn selecting_a_deep_node_opens_its_ancestors() {
        let (tree, _) = tree(&["a.x.v", "a.x.w", "a.y", "b.w"]);
        let mut outline = Outline::new(&tree);
        outline.set_all(&tree, false);
        let deep = tree.node_of_tensor(0).unwrap();
        assert!(outline.select(&tree, deep));
        assert_eq!(outline.selected_node(), Some(deep));
        assert_eq!(outline.scroll_into_view(2), 1);
    }
}
