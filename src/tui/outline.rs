//! What the tree pane shows of the layer tree: which groups are open, which nodes pass the
//! search filter, the rows that result, the selection and the scroll position.
//!
//! Rows are recomputed only when a group opens or closes or the filter changes, and a frame
//! draws only the rows on screen, so the tree stays fast with every node of a 100,000-tensor
//! model open.

use crate::tree::{LayerTree, NodeId, ROOT};
use fixedbitset::FixedBitSet;

#[derive(Debug, Default)]
pub struct Outline {
    open: FixedBitSet,
    /// Nodes that pass the filter: a tensor below matches. All of them without a filter.
    shown: FixedBitSet,
    /// The visible rows' nodes, top to bottom (their depth is worked out for the rows drawn).
    rows: Vec<NodeId>,
    selected: usize,
    offset: usize,
    /// Which groups were open before a filter opened the ones it shows.
    open_before_filter: Option<FixedBitSet>,
}

impl Outline {
    /// The outline of `tree` with its first level open, unless that level is too long to open
    /// usefully (a model's top level holds a handful of groups).
    pub fn new(tree: &LayerTree) -> Outline {
        const OPEN_UP_TO: usize = 1000;
        let mut outline = Outline {
            open: FixedBitSet::with_capacity(tree.len()),
            shown: all_set(tree.len()),
            ..Outline::default()
        };
        outline.open.insert(ROOT as usize);
        if tree.children(ROOT).len() <= OPEN_UP_TO {
            for &child in tree.children(ROOT) {
                outline.open.insert(child as usize);
            }
        }
        outline.rebuild(tree);
        outline
    }

    pub fn rows(&self) -> &[NodeId] {
        &self.rows
    }

    pub fn offset(&self) -> usize {
        self.offset
    }

    pub fn selected_row(&self) -> usize {
        self.selected
    }

    pub fn selected_node(&self) -> Option<NodeId> {
        self.rows.get(self.selected).copied()
    }

    pub fn is_open(&self, node: NodeId) -> bool {
        self.open.contains(node as usize)
    }

    /// Recomputes the rows, keeping the selected node selected when it is still visible.
    fn rebuild(&mut self, tree: &LayerTree) {
        let keep = self.selected_node();
        self.rows.clear();
        let mut stack: Vec<NodeId> = tree.children(ROOT).iter().rev().copied().collect();
        while let Some(node) = stack.pop() {
            if !self.shown.contains(node as usize) {
                continue;
            }
            self.rows.push(node);
            if self.open.contains(node as usize) {
                stack.extend(tree.children(node).iter().rev());
            }
        }
        self.selected = keep
            .and_then(|node| self.rows.iter().position(|&n| n == node))
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
                for node in tensors.iter().filter_map(|&t| tree.node_of_tensor(t)) {
                    for up in std::iter::once(node).chain(tree.ancestors(node)) {
                        if self.shown.put(up as usize) {
                            break;
                        }
                        self.open.insert(up as usize);
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
        match self.rows.iter().position(|&n| n == node) {
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

    /// Opens the selected group, or if it is open, moves to its first child.
    pub fn expand(&mut self, tree: &LayerTree) -> bool {
        let Some(node) = self.selected_node() else {
            return false;
        };
        if tree.children(node).is_empty() {
            return false;
        }
        if self.open.put(node as usize) {
            return self.move_by(1);
        }
        self.rebuild(tree);
        true
    }

    /// Closes the selected group, or if it is closed (or a tensor), moves to its parent.
    pub fn collapse(&mut self, tree: &LayerTree) -> bool {
        let Some(node) = self.selected_node() else {
            return false;
        };
        if self.open.contains(node as usize) && !tree.children(node).is_empty() {
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
        let Some(node) = self.selected_node() else {
            return false;
        };
        if tree.children(node).is_empty() {
            return false;
        }
        self.open.toggle(node as usize);
        self.rebuild(tree);
        true
    }

    pub fn set_all(&mut self, tree: &LayerTree, open: bool) -> bool {
        self.open.set_range(.., open);
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
            .map(|&n| format!("{}{}", "  ".repeat(tree.depth(n)), tree.segment(n)))
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
