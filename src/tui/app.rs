//! The explorer's state and how actions and scan events change it. No drawing and no channels
//! here, so it is tested without a terminal: actions and events in, state and effects out.

use super::action::Action;
use super::keymap::Context;
use super::theme::Theme;
use crate::analysis::{Histogram, Moments};
use crate::finding::{Finding, Severity};
use crate::format::Model;
use crate::jobs::{Progress, ScanEvent};
use crate::text::escape;
use crate::tree::{LayerTree, NodeId, ROOT};
use foldhash::HashMap;
use ratatui::text::{Line, Span};
use std::sync::Arc;
use tui_tree_widget::{TreeItem, TreeState};

/// What the app asks of the world outside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Scan this tensor next (with its histogram).
    Prioritize(usize),
    SetPaused(bool),
}

/// Where a tensor's statistics stand.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorState {
    Pending,
    Scanning,
    Done(Moments),
    Failed(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Focus {
    Tree,
    Findings,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Popup {
    Help,
    Metadata,
}

/// How the histogram's counts are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    Linear,
    Log,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanState {
    Running,
    Paused,
    Done,
    Cancelled,
}

/// How many tensors below a node have errors (NaN, Inf, unreadable, ...) and warnings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Marks {
    pub errors: u32,
    pub warnings: u32,
}

#[derive(Debug)]
pub struct App {
    pub model: Arc<Model>,
    pub theme: Theme,
    pub tree: LayerTree,
    pub items: Vec<TreeItem<'static, NodeId>>,
    pub tree_state: TreeState<NodeId>,
    pub tensors: Vec<TensorState>,
    pub histograms: HashMap<usize, Histogram>,
    pub findings: Vec<Finding>,
    /// The worst severity found on each tensor.
    concern: Vec<Option<Severity>>,
    /// Marks of each node of `tree`.
    pub marks: Vec<Marks>,
    by_name: HashMap<String, usize>,
    pub focus: Focus,
    pub popup: Option<Popup>,
    pub searching: bool,
    pub search: String,
    /// Show only findings of this severity (all when `None`).
    pub severity: Option<Severity>,
    pub finding_selected: usize,
    pub progress: Option<Progress>,
    pub scan: ScanState,
    pub histogram_scale: Scale,
    pub should_quit: bool,
    /// Rows the tree shows at once, for paging (set when drawing).
    pub page: usize,
    items_stale: bool,
}

impl App {
    pub fn new(model: Arc<Model>, theme: Theme) -> App {
        let tensors = vec![TensorState::Pending; model.tensors.len()];
        let by_name = model
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name().to_owned(), i))
            .collect();
        let mut app = App {
            theme,
            tree: LayerTree::build(&model.tensors, |_| true),
            items: Vec::new(),
            tree_state: TreeState::default(),
            tensors,
            histograms: HashMap::default(),
            findings: Vec::new(),
            concern: vec![None; model.tensors.len()],
            marks: Vec::new(),
            by_name,
            focus: Focus::Tree,
            popup: None,
            searching: false,
            search: String::new(),
            severity: None,
            finding_selected: 0,
            progress: None,
            scan: ScanState::Running,
            histogram_scale: Scale::Linear,
            should_quit: false,
            page: 10,
            items_stale: true,
            model,
        };
        for finding in app.model.findings.clone() {
            app.add_finding(finding);
        }
        app.rebuild_tree();
        // Open the first level, and the path to the first tensor, so the screen starts useful.
        for &child in app.tree.children(ROOT) {
            app.tree_state.open(vec![child]);
        }
        app.select_first_row();
        app
    }

    /// Selects the first row. (The tree widget's own `select_first` knows the rows only after a
    /// first render.)
    fn select_first_row(&mut self) {
        if let Some(&first) = self.tree.children(ROOT).first() {
            self.tree_state.select(vec![first]);
        }
    }

    /// The keymap context the app is in.
    pub fn context(&self) -> Context {
        if self.popup.is_some() {
            Context::Popup
        } else if self.searching {
            Context::Search
        } else if self.focus == Focus::Findings {
            Context::Findings
        } else {
            Context::Tree
        }
    }

    /// The selected node of the tree.
    pub fn selected_node(&self) -> Option<NodeId> {
        self.tree_state.selected().last().copied()
    }

    /// The selected tensor, if a tensor is selected.
    pub fn selected_tensor(&self) -> Option<usize> {
        self.selected_node()
            .and_then(|node| self.tree.node(node).tensor)
    }

    /// The findings shown, under the severity filter.
    pub fn visible_findings(&self) -> Vec<&Finding> {
        self.findings
            .iter()
            .filter(|f| self.severity.is_none_or(|s| f.severity == s))
            .collect()
    }

    /// Rebuilds the tree items if marks changed since they were built. Returns whether it did.
    pub fn refresh_items(&mut self) -> bool {
        if !self.items_stale {
            return false;
        }
        self.items = self.build_items(ROOT);
        self.items_stale = false;
        true
    }

    /// Applies an action. Returns whether anything visible changed, and an effect if one is asked.
    pub fn update(&mut self, action: Action) -> (bool, Option<Effect>) {
        let before = self.selected_tensor();
        let changed = self.apply(action);
        let after = self.selected_tensor();
        let effect = match action {
            Action::TogglePause => Some(Effect::SetPaused(self.scan == ScanState::Paused)),
            _ if after != before => self.wanted(),
            _ => None,
        };
        (changed || effect.is_some(), effect)
    }

    /// A mouse click at a screen position: selects the tree row there.
    pub fn click(&mut self, column: u16, row: u16) -> (bool, Option<Effect>) {
        let before = self.selected_tensor();
        let changed = self
            .tree_state
            .click_at(ratatui::layout::Position::new(column, row));
        self.after_selection(before, changed)
    }

    /// The mouse wheel: moves the selection by three rows.
    pub fn scroll(&mut self, down: bool) -> (bool, Option<Effect>) {
        let before = self.selected_tensor();
        let changed = if down {
            self.tree_state
                .select_relative(|c| c.map_or(0, |c| c.saturating_add(3)))
        } else {
            self.tree_state
                .select_relative(|c| c.map_or(0, |c| c.saturating_sub(3)))
        };
        self.after_selection(before, changed)
    }

    /// What the current selection needs: its statistics and histogram first.
    pub fn wanted(&self) -> Option<Effect> {
        self.selected_tensor()
            .filter(|t| !self.histograms.contains_key(t))
            .map(Effect::Prioritize)
    }

    fn after_selection(&self, before: Option<usize>, changed: bool) -> (bool, Option<Effect>) {
        let effect = if self.selected_tensor() == before {
            None
        } else {
            self.wanted()
        };
        (changed, effect)
    }

    fn apply(&mut self, action: Action) -> bool {
        let state = &mut self.tree_state;
        match action {
            Action::Quit => {
                self.should_quit = true;
                true
            }
            Action::ShowHelp => self.open_popup(Popup::Help),
            Action::ShowMetadata => self.open_popup(Popup::Metadata),
            Action::ClosePopup => self.popup.take().is_some(),
            Action::FocusNext => {
                self.focus = if self.focus == Focus::Tree {
                    Focus::Findings
                } else {
                    Focus::Tree
                };
                true
            }
            Action::StartSearch
            | Action::SearchType(_)
            | Action::SearchDelete
            | Action::SearchAccept
            | Action::SearchCancel => self.apply_search(action),
            Action::TogglePause => {
                self.scan = match self.scan {
                    ScanState::Running => ScanState::Paused,
                    ScanState::Paused => ScanState::Running,
                    other => other,
                };
                true
            }
            Action::ToggleLogHistogram => {
                self.histogram_scale = match self.histogram_scale {
                    Scale::Linear => Scale::Log,
                    Scale::Log => Scale::Linear,
                };
                true
            }
            Action::CycleSeverity => {
                self.severity = match self.severity {
                    None => Some(Severity::Error),
                    Some(Severity::Error) => Some(Severity::Warning),
                    Some(Severity::Warning) => Some(Severity::Info),
                    Some(Severity::Info) => None,
                };
                self.finding_selected = 0;
                true
            }
            Action::NextProblem => self.jump_to_problem(true),
            Action::PreviousProblem => self.jump_to_problem(false),
            Action::JumpToFinding => self.jump_to_finding(),
            _ if self.focus == Focus::Findings => self.move_in_findings(action),
            Action::Up => state.key_up(),
            Action::Down => state.key_down(),
            Action::Expand => state.key_right(),
            Action::Collapse => state.key_left(),
            Action::Toggle => state.toggle_selected(),
            Action::First => {
                let before = self.tree_state.selected().to_vec();
                self.select_first_row();
                self.tree_state.selected() != before
            }
            Action::Last => state.select_last(),
            Action::PageUp => {
                state.select_relative(|current| current.map_or(0, |c| c.saturating_sub(self.page)))
            }
            Action::PageDown => {
                state.select_relative(|current| current.map_or(0, |c| c.saturating_add(self.page)))
            }
            Action::HalfPageUp => state
                .select_relative(|current| current.map_or(0, |c| c.saturating_sub(self.page / 2))),
            Action::HalfPageDown => state
                .select_relative(|current| current.map_or(0, |c| c.saturating_add(self.page / 2))),
            Action::ExpandAll => {
                let paths: Vec<Vec<NodeId>> = self
                    .tree
                    .walk(ROOT)
                    .filter(|&(id, _)| !self.tree.children(id).is_empty())
                    .map(|(id, _)| self.path_to(id))
                    .collect();
                for path in paths {
                    self.tree_state.open(path);
                }
                true
            }
            Action::CollapseAll => {
                let changed = self.tree_state.close_all();
                self.select_first_row();
                changed
            }
        }
    }

    fn apply_search(&mut self, action: Action) -> bool {
        match action {
            Action::StartSearch => self.searching = true,
            Action::SearchType(c) => {
                self.search.push(c);
                self.rebuild_tree();
            }
            Action::SearchDelete => {
                if self.search.pop().is_none() {
                    return false;
                }
                self.rebuild_tree();
            }
            Action::SearchAccept => self.searching = false,
            Action::SearchCancel => {
                self.searching = false;
                self.search.clear();
                self.rebuild_tree();
            }
            _ => return false,
        }
        true
    }

    fn open_popup(&mut self, popup: Popup) -> bool {
        self.popup = Some(popup);
        true
    }

    fn move_in_findings(&mut self, action: Action) -> bool {
        let count = self.visible_findings().len();
        let last = count.saturating_sub(1);
        let before = self.finding_selected;
        self.finding_selected = match action {
            Action::Up => before.saturating_sub(1),
            Action::Down => (before + 1).min(last),
            Action::PageUp | Action::HalfPageUp => before.saturating_sub(5),
            Action::PageDown | Action::HalfPageDown => (before + 5).min(last),
            Action::First => 0,
            Action::Last => last,
            _ => before,
        };
        self.finding_selected != before
    }

    fn jump_to_finding(&mut self) -> bool {
        let tensor = self
            .visible_findings()
            .get(self.finding_selected)
            .and_then(|f| f.tensor.as_ref())
            .and_then(|name| self.by_name.get(name).copied());
        match tensor {
            Some(tensor) => {
                self.focus = Focus::Tree;
                self.select_tensor(tensor)
            }
            None => false,
        }
    }

    /// Selects the next (or previous) tensor with findings after the selection: errors (NaN,
    /// Inf) first, then warnings, each in tree order.
    fn jump_to_problem(&mut self, forward: bool) -> bool {
        let in_order: Vec<usize> = self.tree.tensors_below(ROOT).collect();
        let mut problems: Vec<(usize, usize)> = in_order
            .iter()
            .enumerate()
            .filter_map(|(position, &t)| match self.concern[t] {
                Some(Severity::Error) => Some((0, position)),
                Some(Severity::Warning) => Some((1, position)),
                _ => None,
            })
            .collect();
        if problems.is_empty() {
            return false;
        }
        problems.sort_unstable();
        let current = self
            .selected_tensor()
            .and_then(|t| in_order.iter().position(|&x| x == t));
        let at = current.and_then(|position| problems.iter().position(|&(_, p)| p == position));
        let next = match (at, forward) {
            (Some(i), true) => (i + 1) % problems.len(),
            (Some(i), false) => (i + problems.len() - 1) % problems.len(),
            (None, true) => 0,
            (None, false) => problems.len() - 1,
        };
        self.select_tensor(in_order[problems[next].1])
    }

    /// Selects a tensor in the tree, opening the groups above it.
    pub fn select_tensor(&mut self, tensor: usize) -> bool {
        let Some(node) = self.tree.node_of_tensor(tensor) else {
            return false;
        };
        let path = self.path_to(node);
        for depth in 1..path.len() {
            self.tree_state.open(path[..depth].to_vec());
        }
        self.tree_state.select(path)
    }

    /// The identifiers from the top of the tree down to `node`.
    fn path_to(&self, node: NodeId) -> Vec<NodeId> {
        let mut path: Vec<NodeId> = self.tree.ancestors(node).collect();
        path.reverse();
        path.push(node);
        path
    }

    /// Takes in what the scan reports. Returns whether anything visible changed.
    pub fn on_scan(&mut self, event: ScanEvent) -> bool {
        match event {
            ScanEvent::Started { tensor } => {
                if self.tensors[tensor] == TensorState::Pending {
                    self.tensors[tensor] = TensorState::Scanning;
                }
                self.selected_tensor() == Some(tensor)
            }
            ScanEvent::Stats { tensor, moments } => {
                self.tensors[tensor] = TensorState::Done(moments);
                true
            }
            ScanEvent::Histogram { tensor, histogram } => {
                self.histograms.insert(tensor, histogram);
                self.selected_tensor() == Some(tensor)
            }
            ScanEvent::Failed { tensor, finding } => {
                self.tensors[tensor] = TensorState::Failed(finding.message.clone());
                self.add_finding(finding);
                true
            }
            ScanEvent::Finding(finding) => {
                self.add_finding(finding);
                true
            }
            ScanEvent::Progress(progress) => {
                self.progress = Some(progress);
                true
            }
            ScanEvent::Done(progress) => {
                self.progress = Some(progress);
                self.scan = ScanState::Done;
                true
            }
            ScanEvent::Cancelled => {
                self.scan = ScanState::Cancelled;
                true
            }
        }
    }

    fn add_finding(&mut self, finding: Finding) {
        if let Some(tensor) = finding
            .tensor
            .as_ref()
            .and_then(|name| self.by_name.get(name).copied())
        {
            let before = self.concern[tensor];
            let worse = match (before, finding.severity) {
                (_, Severity::Info) | (Some(Severity::Error), _) => false,
                (Some(Severity::Warning), severity) => severity == Severity::Error,
                (_, _) => true,
            };
            if worse {
                self.concern[tensor] = Some(finding.severity);
                self.items_stale = true;
                self.mark_path(tensor, before, finding.severity);
            }
        }
        // Keep the list ordered by severity, each severity in arrival order.
        let at = self
            .findings
            .partition_point(|f| f.severity <= finding.severity);
        self.findings.insert(at, finding);
    }

    /// Moves a tensor's mark from `before` to `after` on its node and every ancestor.
    fn mark_path(&mut self, tensor: usize, before: Option<Severity>, after: Severity) {
        let Some(node) = self.tree.node_of_tensor(tensor) else {
            return;
        };
        if self.marks.is_empty() {
            return;
        }
        for id in std::iter::once(node)
            .chain(self.tree.ancestors(node))
            .chain(std::iter::once(ROOT))
        {
            let marks = &mut self.marks[id as usize];
            if before == Some(Severity::Warning) {
                marks.warnings -= 1;
            }
            match after {
                Severity::Error => marks.errors += 1,
                Severity::Warning => marks.warnings += 1,
                Severity::Info => {}
            }
        }
    }

    fn compute_marks(&self) -> Vec<Marks> {
        let mut marks = vec![Marks::default(); self.tree.len()];
        for (tensor, concern) in self.concern.iter().enumerate() {
            let Some(concern) = concern else { continue };
            let Some(node) = self.tree.node_of_tensor(tensor) else {
                continue;
            };
            for id in std::iter::once(node)
                .chain(self.tree.ancestors(node))
                .chain(std::iter::once(ROOT))
            {
                match concern {
                    Severity::Error => marks[id as usize].errors += 1,
                    Severity::Warning => marks[id as usize].warnings += 1,
                    Severity::Info => {}
                }
            }
        }
        marks
    }

    /// Rebuilds the tree for the current search text, keeping the selection when it is still there.
    fn rebuild_tree(&mut self) {
        let selected = self.selected_tensor();
        let needle = self.search.to_lowercase();
        self.tree = LayerTree::build(&self.model.tensors, |t| {
            needle.is_empty() || t.name().to_lowercase().contains(&needle)
        });
        self.marks = self.compute_marks();
        self.tree_state = TreeState::default();
        self.items = self.build_items(ROOT);
        self.items_stale = false;
        if !self.search.is_empty() {
            let paths: Vec<Vec<NodeId>> = self
                .tree
                .walk(ROOT)
                .filter(|&(id, _)| !self.tree.children(id).is_empty())
                .map(|(id, _)| self.path_to(id))
                .collect();
            for path in paths {
                self.tree_state.open(path);
            }
        }
        match selected {
            Some(tensor) if self.select_tensor(tensor) => {}
            _ => self.select_first_row(),
        }
    }

    fn build_items(&self, parent: NodeId) -> Vec<TreeItem<'static, NodeId>> {
        self.tree
            .children(parent)
            .iter()
            .map(|&id| {
                let line = self.item_line(id);
                let children = self.build_items(id);
                if children.is_empty() {
                    TreeItem::new_leaf(id, line)
                } else {
                    // Identifiers are node ids, unique among siblings by construction.
                    TreeItem::new(id, line.clone(), children)
                        .unwrap_or_else(|_| TreeItem::new_leaf(id, line))
                }
            })
            .collect()
    }

    fn item_line(&self, id: NodeId) -> Line<'static> {
        let theme = &self.theme;
        let node = self.tree.node(id);
        let marks = self.marks.get(id as usize).copied().unwrap_or_default();
        let mut spans = Vec::with_capacity(4);
        if marks.errors > 0 {
            spans.push(Span::styled(format!("✖{} ", marks.errors), theme.error));
        } else if marks.warnings > 0 {
            spans.push(Span::styled(format!("⚠{} ", marks.warnings), theme.warning));
        }
        let segment = escape(self.tree.segment(id)).into_owned();
        let needle = self.search.to_lowercase();
        let style = if marks.errors > 0 {
            theme.error
        } else {
            theme.base
        };
        if !needle.is_empty() && segment.to_lowercase().contains(&needle) {
            spans.push(Span::styled(segment, theme.matched));
        } else {
            spans.push(Span::styled(segment, style));
        }
        let detail = match node.tensor {
            Some(tensor) if self.tree.children(id).is_empty() => {
                let info = &self.model.tensors[tensor].info;
                format!(
                    "  {} {}",
                    escape(info.dtype.name()),
                    crate::text::Shape(&info.shape)
                )
            }
            _ => format!("  {}", node.totals.tensors),
        };
        spans.push(Span::styled(detail, theme.dim));
        Line::from(spans)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::demo_model;
    use crate::format::SafetensorsFile;

    fn demo_app() -> App {
        let bytes = demo_model().to_bytes().unwrap();
        let file = SafetensorsFile::from_bytes(std::path::Path::new("demo.safetensors"), &bytes);
        assert!(file.is_valid());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("demo.safetensors");
        std::fs::write(&path, &bytes).unwrap();
        App::new(Arc::new(Model::open(&path).unwrap()), Theme::new(true))
    }

    fn nan_finding(app: &App, name: &str) -> ScanEvent {
        assert!(app.by_name.contains_key(name));
        ScanEvent::Finding(
            Finding::error(crate::finding::Code::ValuesNan, "3 of 9 values are NaN")
                .for_tensor(name),
        )
    }

    #[test]
    fn marks_climb_to_every_ancestor() {
        let mut app = demo_app();
        app.on_scan(nan_finding(&app, "model.layers.2.mlp.down_proj.weight"));
        let layers = app
            .tree
            .children(ROOT)
            .iter()
            .copied()
            .find(|&c| app.tree.segment(c) == "model")
            .unwrap();
        assert_eq!(app.marks[layers as usize].errors, 1);
        assert_eq!(app.marks[ROOT as usize].errors, 1);
        assert!(app.refresh_items());
    }

    #[test]
    fn next_problem_selects_the_nan_tensor() {
        let mut app = demo_app();
        let tensor = app.by_name["model.layers.2.mlp.down_proj.weight"];
        app.on_scan(nan_finding(&app, "model.layers.2.mlp.down_proj.weight"));
        let (changed, effect) = app.update(Action::NextProblem);
        assert!(changed);
        assert_eq!(app.selected_tensor(), Some(tensor));
        assert_eq!(effect, Some(Effect::Prioritize(tensor)));
    }

    #[test]
    fn search_filters_and_escape_clears() {
        let mut app = demo_app();
        app.update(Action::StartSearch);
        for c in "down".chars() {
            app.update(Action::SearchType(c));
        }
        assert_eq!(app.tree.root().totals.tensors, 4);
        app.update(Action::SearchCancel);
        assert_eq!(app.tree.root().totals.tensors, 39);
        assert!(!app.searching);
    }

    #[test]
    fn pause_toggles_the_scan() {
        let mut app = demo_app();
        assert_eq!(
            app.update(Action::TogglePause).1,
            Some(Effect::SetPaused(true))
        );
        assert_eq!(
            app.update(Action::TogglePause).1,
            Some(Effect::SetPaused(false))
        );
    }
}
