//! The explorer's state and how actions and scan events change it. No drawing and no channels
//! here, so it is tested without a terminal: actions and events in, state and effects out.

use super::action::Action;
use super::keymap::Context;
use super::theme::Theme;
use crate::analysis::{Histogram, Moments};
use crate::finding::{Finding, Severity};
use crate::format::Model;
use crate::jobs::{Progress, ScanEvent};
use crate::quant::kernels::CodeCounts;
use crate::quant::{LogicalModel, Quantization};
use crate::text::Bytes;
use crate::tree::{LayerTree, NodeId, ROOT};
use foldhash::HashMap;

use super::outline::Outline;
use crate::layermap::Values;

mod map;
use crate::quantize::{self, Error8, Granularity};
pub use map::MapView;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// What the app asks of the world outside it.
#[derive(Clone, Debug)]
pub enum Effect {
    /// Scan this tensor next (with its histogram).
    Prioritize(usize),
    SetPaused(bool),
    /// Compute the quantization preview of these tensors (W8A8), in the background, until
    /// the control is cancelled; and the comparison of every scheme over the options' scope
    /// when asked, reporting through and stopped by its own control.
    Preview(
        Vec<usize>,
        Granularity,
        Arc<quantize::Control>,
        Option<(quantize::Options, Arc<quantize::Control>)>,
    ),
    /// Quantize and save, in the background, reporting through `control`.
    Save(quantize::Options, PathBuf, Arc<quantize::Control>),
    /// Open this file in place of the current model.
    Reopen(PathBuf),
    /// Stop downloading the selected tensor of a model read from the Hub.
    CancelFetch,
    /// List the quantized model's tensors as stored, or by the weights they encode.
    ToggleRaw,
}

/// The quantize dialog.
#[derive(Debug)]
pub struct QuantizeDialog {
    /// What is quantized: the whole model, a group, or one tensor.
    pub scope: String,
    pub include: Vec<String>,
    pub granularity: Granularity,
    pub scheme: quantize::Scheme,
    /// Weights whose SNR under the scheme falls below this stay in source precision.
    pub keep_below_snr: Option<f64>,
    /// Every scheme side by side over the scope, once computed.
    pub comparison: Option<Result<quantize::Comparison, String>>,
    pub skip_non_finite: bool,
    pub output: PathBuf,
    /// Tensors the options choose.
    pub chosen: Vec<usize>,
    /// Why the tensors of the scope the options do not choose are kept, each reason once, in
    /// the order first met.
    pub kept_in_scope: Vec<quantize::Kept>,
    /// Preview of each chosen tensor as it arrives; `None` when it holds NaN or Inf.
    pub previews: HashMap<usize, Result<Option<Error8>, String>>,
    pub stage: Stage,
    /// The comparison under way (its progress) and the previews: each stopped when the dialog
    /// starts it again or closes, so that a model's weights are not read for a dialog gone.
    pub comparing: Arc<quantize::Control>,
    previewing: Arc<quantize::Control>,
}

impl Drop for QuantizeDialog {
    fn drop(&mut self) {
        for work in [&self.comparing, &self.previewing] {
            work.cancelled.store(true, Ordering::Relaxed);
        }
    }
}

#[derive(Debug)]
pub enum Stage {
    Choosing,
    /// The output exists; Enter again replaces it.
    ConfirmReplace,
    Saving(Arc<quantize::Control>),
    Saved(quantize::Summary),
    Failed(String),
}

impl QuantizeDialog {
    /// The tensors of the scope the options choose, and why the others of the scope are kept.
    fn choose(&mut self, model: &Model) {
        let options = self.options();
        self.chosen.clear();
        self.kept_in_scope.clear();
        for (index, tensor) in model.tensors.iter().enumerate() {
            if !quantize::included(tensor.name(), &options) {
                continue;
            }
            match quantize::choose(tensor, &options) {
                quantize::Choice::Quantize => self.chosen.push(index),
                quantize::Choice::Keep(why) => {
                    if !self.kept_in_scope.contains(&why) {
                        self.kept_in_scope.push(why);
                    }
                }
            }
        }
    }

    /// Tensors previewed at most: the first chosen. A preview reads its tensor twice and is kept
    /// to be shown; a hostile model can have a million tensors to quantize.
    pub const PREVIEWED: usize = 10_000;

    /// The thresholds `k` goes through, in dB.
    pub const THRESHOLDS: [f64; 5] = [20.0, 25.0, 30.0, 35.0, 40.0];

    /// Previews of the first chosen tensors, computed in the background; with `compare`, the
    /// comparison of every scheme too.
    fn preview(&mut self, compare: bool) -> Effect {
        let previewed = self.chosen.len().min(Self::PREVIEWED);
        let restart = |work: &mut Arc<quantize::Control>| {
            work.cancelled.store(true, Ordering::Relaxed);
            *work = Arc::default();
        };
        restart(&mut self.previewing);
        if compare {
            self.comparison = None;
            restart(&mut self.comparing);
        }
        self.fill_previews();
        Effect::Preview(
            self.chosen[..previewed].to_vec(),
            self.granularity,
            Arc::clone(&self.previewing),
            compare.then(|| (self.options(), Arc::clone(&self.comparing))),
        )
    }

    /// Goes on to the next scheme: its previews from the comparison, W8A8's computed.
    fn next_scheme(&mut self) -> Option<Effect> {
        self.scheme = self.scheme.next();
        self.previews.clear();
        if self.scheme == quantize::Scheme::W8A8 {
            Some(self.preview(false))
        } else {
            self.fill_previews();
            None
        }
    }

    /// Goes on to the next threshold, after the last to none.
    fn next_threshold(&mut self) {
        self.keep_below_snr = match self.keep_below_snr {
            None => Some(Self::THRESHOLDS[0]),
            Some(now) => Self::THRESHOLDS.iter().copied().find(|&t| t > now),
        };
    }

    /// The previews of a scheme other than W8A8, from the comparison.
    fn fill_previews(&mut self) {
        if self.scheme == quantize::Scheme::W8A8 {
            return;
        }
        self.previews.clear();
        let Some(Ok(comparison)) = &self.comparison else {
            return;
        };
        if let Some(result) = comparison.schemes.iter().find(|r| r.scheme == self.scheme) {
            for &(tensor, error) in &result.errors {
                self.previews.insert(tensor, Ok(Some(error)));
            }
        }
    }

    /// Whether `tensor` would be kept in source precision for its SNR.
    pub fn kept_for_snr(&self, tensor: usize) -> bool {
        let Some(threshold) = self.keep_below_snr else {
            return false;
        };
        matches!(self.previews.get(&tensor), Some(Ok(Some(error))) if error.snr_db < threshold)
    }

    pub fn options(&self) -> quantize::Options {
        quantize::Options {
            scheme: self.scheme,
            keep_below_snr: self.keep_below_snr,
            granularity: self.granularity,
            include: self.include.clone(),
            non_finite: if self.skip_non_finite {
                quantize::NonFinite::Skip
            } else {
                quantize::NonFinite::Stop
            },
            ..quantize::Options::default()
        }
    }
}

/// Where a tensor's scan stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanStatus {
    Pending,
    Scanning,
    Done,
    Failed,
}

/// What the scan found for one tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Moments(Moments),
    /// Why the tensor could not be read.
    Failed(String),
}

/// The outcomes of the tensors scanned or shown last, at most [`Recent::KEPT`]: on a model of
/// more tensors, one shown again is read again (the scan serves such requests first), so that the
/// explorer's memory does not grow by a hundred bytes a tensor.
#[derive(Debug, Default)]
pub struct Recent {
    outcomes: HashMap<usize, Outcome>,
    /// Tensors in the order their outcomes came, oldest first.
    order: std::collections::VecDeque<usize>,
}

impl Recent {
    pub const KEPT: usize = 4_096;

    pub fn get(&self, tensor: usize) -> Option<&Outcome> {
        self.outcomes.get(&tensor)
    }

    /// Keeps `outcome`, letting go of the oldest one if full, but never that of `shown`.
    fn insert(&mut self, tensor: usize, outcome: Outcome, shown: Option<usize>) {
        if self.outcomes.insert(tensor, outcome).is_some() {
            return;
        }
        self.order.push_back(tensor);
        while self.outcomes.len() > Self::KEPT {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if Some(oldest) == shown {
                self.order.push_back(oldest);
            } else {
                self.outcomes.remove(&oldest);
            }
        }
    }
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

/// With `--diff`: how many tensors below a node changed or are only in this model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiffMarks {
    pub changed: u32,
    pub only_here: u32,
}

/// Findings as the explorer lists them: by severity, each severity in arrival order. At most
/// [`FindingList::LISTED`] of each severity are kept (a hostile header can give every one of a
/// million tensors a finding); the tree's marks count every finding all the same.
#[derive(Debug, Default)]
pub struct FindingList {
    /// Errors, warnings and info.
    listed: [Vec<Finding>; 3],
    unlisted: [usize; 3],
}

impl FindingList {
    pub const LISTED: usize = 10_000;

    fn slot(severity: Severity) -> usize {
        match severity {
            Severity::Error => 0,
            Severity::Warning => 1,
            Severity::Info => 2,
        }
    }

    /// The slots `filter` shows: one severity, or all.
    fn slots(filter: Option<Severity>) -> std::ops::Range<usize> {
        filter.map_or(0..3, |severity| {
            let slot = Self::slot(severity);
            slot..slot + 1
        })
    }

    pub fn push(&mut self, finding: Finding) {
        let slot = Self::slot(finding.severity);
        if self.listed[slot].len() < Self::LISTED {
            self.listed[slot].push(finding);
        } else {
            self.unlisted[slot] += 1;
        }
    }

    /// How many findings of those `filter` shows are listed.
    pub fn len(&self, filter: Option<Severity>) -> usize {
        Self::slots(filter)
            .map(|slot| self.listed[slot].len())
            .sum()
    }

    /// How many findings of those `filter` shows were left out of the list.
    pub fn unlisted(&self, filter: Option<Severity>) -> usize {
        Self::slots(filter).map(|slot| self.unlisted[slot]).sum()
    }

    /// The `index`th finding `filter` shows, errors first.
    pub fn get(&self, filter: Option<Severity>, mut index: usize) -> Option<&Finding> {
        for slot in Self::slots(filter) {
            match self.listed[slot].get(index) {
                Some(finding) => return Some(finding),
                None => index -= self.listed[slot].len(),
            }
        }
        None
    }

    /// The findings `filter` shows, errors first.
    pub fn iter(&self, filter: Option<Severity>) -> impl Iterator<Item = &Finding> {
        Self::slots(filter).flat_map(|slot| &self.listed[slot])
    }
}

/// The comparison with the `--diff` model.
#[derive(Debug, Default)]
pub struct DiffView {
    /// Each tensor's status, by tensor index.
    pub status: Vec<Option<crate::diff::Status>>,
    /// Marks of each node of the tree (kept apart from [`Marks`], which every model has).
    pub marks: Vec<DiffMarks>,
    pub changed: usize,
    pub only_here: usize,
    pub only_there: usize,
    pub metadata: usize,
}

#[derive(Debug)]
pub struct App {
    /// The model as listed: a quantized model's logical weights in the place of their members,
    /// unless it is listed as stored.
    pub model: Arc<Model>,
    /// How the model is quantized, whether listed by its logical weights or as stored.
    pub quantization: Option<Arc<Quantization>>,
    /// The stored model behind the listed one, when that lists logical weights.
    pub logical: Option<Arc<LogicalModel>>,
    /// A message for the status line, until the next key.
    pub notice: Option<String>,
    pub theme: Theme,
    pub tree: LayerTree,
    pub outline: Outline,
    /// Each tensor's scan status.
    pub status: Vec<ScanStatus>,
    pub outcomes: Recent,
    pub histograms: HashMap<usize, Histogram>,
    /// A logical weight's code counts, which come with its histogram.
    pub codes: HashMap<usize, CodeCounts>,
    pub findings: FindingList,
    /// The worst severity found on each tensor.
    concern: Vec<Option<Severity>>,
    /// Marks of each group of `tree` (see [`App::marks`]); empty until the first mark, as a
    /// model of a million groups may have none.
    group_marks: Vec<Marks>,
    pub focus: Focus,
    pub popup: Option<Popup>,
    pub quantize: Option<QuantizeDialog>,
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
    /// Where the tree's rows are on screen, `(x, y, width, height)` (set when drawing), for clicks.
    pub tree_area: Option<(u16, u16, u16, u16)>,
    pub diff: Option<DiffView>,
    /// The layer map, built when first opened (or when the scan ends, for its findings).
    pub map: Option<MapView>,
    pub map_open: bool,
    /// A few numbers a tensor for the layer map, as the scan reports them.
    pub values: Values,
    /// For a model read from the Hub, the most bytes one tensor's statistics fetch; `None` for
    /// a local model, which is scanned whole.
    pub fetch_limit: Option<u64>,
    /// The dtype mix of each group shown so far, which takes a walk over its tensors to compute.
    mixes: std::cell::RefCell<HashMap<NodeId, crate::tree::DtypeMix>>,
    /// The structural id and the architecture recognised, worked out when first shown: each
    /// reads every tensor, too much to redo at every frame of a large model.
    identity: std::cell::OnceCell<Identity>,
    /// What the model is (its config's name, its layer pattern), read when first shown.
    info: std::cell::OnceCell<Option<crate::arch::ModelInfo>>,
}

/// What the metadata popup says the model is.
#[derive(Debug)]
pub struct Identity {
    pub structural_id: String,
    pub architecture: String,
}

impl App {
    pub fn new(model: Arc<Model>, theme: Theme) -> App {
        let status = vec![ScanStatus::Pending; model.tensors.len()];
        let tree = LayerTree::build(&model.tensors, |_| true);
        let mut app = App {
            quantization: None,
            logical: None,
            notice: None,
            theme,
            outline: Outline::new(&tree),
            group_marks: Vec::new(),
            tree,
            status,
            outcomes: Recent::default(),
            histograms: HashMap::default(),
            codes: HashMap::default(),
            findings: FindingList::default(),
            concern: vec![None; model.tensors.len()],
            focus: Focus::Tree,
            popup: None,
            quantize: None,
            searching: false,
            search: String::new(),
            severity: None,
            finding_selected: 0,
            progress: None,
            scan: ScanState::Running,
            histogram_scale: Scale::Linear,
            should_quit: false,
            page: 10,
            tree_area: None,
            diff: None,
            map: None,
            map_open: false,
            fetch_limit: None,
            values: Values::for_names(
                model.tensors.len(),
                model.tensors.iter().map(crate::format::Tensor::name),
            ),
            mixes: std::cell::RefCell::default(),
            identity: std::cell::OnceCell::new(),
            info: std::cell::OnceCell::new(),
            model,
        };
        for finding in app.model.findings.clone() {
            app.add_finding(finding);
        }
        app
    }

    /// Records how the model is quantized, and the stored model behind the listed one when it
    /// lists logical weights.
    pub fn set_quantization(
        &mut self,
        quantization: Option<Arc<Quantization>>,
        logical: Option<Arc<LogicalModel>>,
    ) {
        self.quantization = quantization;
        self.logical = logical;
        if let Some(logical) = &self.logical {
            let mut members = vec![0; self.tree.len()];
            for tensor in 0..self.model.tensors.len() {
                if let (Some(weight), Some(node)) =
                    (logical.weight(tensor), self.tree.node_of_tensor(tensor))
                {
                    members[node as usize] = logical.quantization.weights[weight].member_count();
                }
            }
            self.outline = Outline::with_members(&self.tree, members);
        }
    }

    /// The logical weight listed tensor `tensor` is, with the model's quantization.
    pub fn logical_weight(&self, tensor: usize) -> Option<(&LogicalModel, usize)> {
        let logical = self.logical.as_deref()?;
        logical.weight(tensor).map(|weight| (logical, weight))
    }

    /// Member `member` of logical weight `tensor` as stored, with its name below the weight
    /// (`weight_scale`).
    pub fn member(&self, tensor: usize, member: usize) -> Option<(&str, &crate::format::Tensor)> {
        let (logical, weight) = self.logical_weight(tensor)?;
        let stored = &logical.stored.tensors
            [logical.quantization.members(weight).get(member)?.tensor as usize];
        let name = &logical.quantization.weights[weight].info.name;
        Some((
            crate::quant::listed::member_label(name, stored.name()),
            stored,
        ))
    }

    /// The tensor called `name` (the last of that name, should a sharded model repeat it),
    /// found through the tree: no index of names is kept beside it.
    fn tensor_named(&self, name: &str) -> Option<usize> {
        self.tree
            .find(name)
            .and_then(|node| self.tree.node(node).tensor())
    }

    /// The keymap context the app is in.
    pub fn context(&self) -> Context {
        if self.quantize.is_some() {
            Context::Quantize
        } else if self.popup.is_some() {
            Context::Popup
        } else if self.searching {
            Context::Search
        } else if self.map_open {
            Context::Map
        } else if self.focus == Focus::Findings {
            Context::Findings
        } else {
            Context::Tree
        }
    }

    /// The selected node of the tree.
    pub fn selected_node(&self) -> Option<NodeId> {
        self.outline.selected_node()
    }

    /// The selected tensor, if a tensor is selected.
    pub fn selected_tensor(&self) -> Option<usize> {
        self.selected_node()
            .and_then(|node| self.tree.node(node).tensor())
    }

    /// For a model read from the Hub, why `tensor`'s statistics are not fetched: its bytes
    /// pass the fetch limit.
    pub fn not_fetched(&self, tensor: usize) -> Option<String> {
        let limit = self.fetch_limit?;
        let len = self.model.tensors[tensor].info.byte_len();
        (len > limit).then(|| {
            format!(
                "not fetched: {} is more than --fetch-limit {}",
                Bytes(len),
                Bytes(limit)
            )
        })
    }

    /// Each dtype's share of the tensors below `node`, computed once per node shown.
    pub fn dtype_mix(&self, node: NodeId) -> crate::tree::DtypeMix {
        self.mixes
            .borrow_mut()
            .entry(node)
            .or_insert_with(|| self.tree.dtype_mix(node, &self.model.tensors))
            .clone()
    }

    pub fn identity(&self) -> &Identity {
        self.identity.get_or_init(|| Identity {
            structural_id: crate::hash::structural_id(&self.model),
            architecture: self
                .model_info()
                .map_or_else(|| "not recognised".to_owned(), ToString::to_string),
        })
    }

    /// What the model is: its config's name (or a guess from the tensor names) and its layer
    /// pattern.
    pub fn model_info(&self) -> Option<&crate::arch::ModelInfo> {
        self.info
            .get_or_init(|| crate::arch::identify(&self.model, None))
            .as_ref()
    }

    /// Applies an action. Returns whether anything visible changed, and an effect if one is asked.
    pub fn update(&mut self, action: Action) -> (bool, Option<Effect>) {
        if let Some(outcome) = self.apply_quantize(action) {
            return outcome;
        }
        if action == Action::Escape {
            if self.fetching() {
                return (true, Some(Effect::CancelFetch));
            }
            self.should_quit = true;
            return (true, None);
        }
        let noticed = self.notice.take().is_some();
        if action == Action::ToggleRaw {
            if self.quantization.is_some() {
                return (true, Some(Effect::ToggleRaw));
            }
            self.notice =
                Some("the model is not quantized: its tensors are listed as stored".into());
            return (true, None);
        }
        let before = self.selected_tensor();
        let changed = self.apply(action) || noticed;
        let after = self.selected_tensor();
        let effect = match action {
            Action::TogglePause => Some(Effect::SetPaused(self.scan == ScanState::Paused)),
            _ if after != before => self.wanted(),
            _ => None,
        };
        (changed || effect.is_some(), effect)
    }

    /// A mouse click on the tree's `row` (counted from its first visible row), or elsewhere.
    pub fn click(&mut self, row: Option<usize>) -> (bool, Option<Effect>) {
        let before = self.selected_tensor();
        let changed = row.is_some_and(|row| self.outline.select_row(self.outline.offset() + row));
        self.after_selection(before, changed)
    }

    /// The mouse wheel: moves the selection by three rows.
    pub fn scroll(&mut self, down: bool) -> (bool, Option<Effect>) {
        let before = self.selected_tensor();
        let changed = self.outline.move_by(if down { 3 } else { -3 });
        self.after_selection(before, changed)
    }

    /// What the current selection needs: its statistics and histogram first.
    /// Whether the selected tensor of a model read from the Hub is waiting for its bytes.
    fn fetching(&self) -> bool {
        self.model.remote.is_some() && self.wanted().is_some()
    }

    pub fn wanted(&self) -> Option<Effect> {
        self.selected_tensor()
            .filter(|&t| !self.histograms.contains_key(&t) || self.outcomes.get(t).is_none())
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
        if let Some(changed) = self.apply_map(action) {
            return changed;
        }
        let page = isize::try_from(self.page).unwrap_or(10);
        let (outline, tree) = (&mut self.outline, &self.tree);
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
            // Escape is handled in `update`, which knows whether a download is under way, and
            // so is the switch between listings, which opens the model anew.
            Action::Escape
            | Action::ToggleRaw
            | Action::Quantize
            | Action::QuantizeGranularity
            | Action::QuantizeWholeModel
            | Action::QuantizeSkipNonFinite
            | Action::QuantizeScheme
            | Action::QuantizeKeepBelow
            | Action::QuantizeConfirm
            | Action::QuantizeCancel
            | Action::OpenResult
            | Action::Left
            | Action::Right
            | Action::MapMeasure
            | Action::MapExperts
            | Action::MapJump => false,
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
            Action::ToggleMap => self.toggle_map(),
            Action::NextProblem => self.jump_to_problem(true),
            Action::PreviousProblem => self.jump_to_problem(false),
            Action::JumpToFinding => self.jump_to_finding(),
            _ if self.focus == Focus::Findings => self.move_in_findings(action),
            Action::Up => outline.move_by(-1),
            Action::Down => outline.move_by(1),
            Action::Expand => outline.expand(tree),
            Action::Collapse => outline.collapse(tree),
            Action::Toggle => outline.toggle(tree),
            Action::First => outline.select_row(0),
            Action::Last => outline.select_row(usize::MAX),
            Action::PageUp => outline.move_by(-page),
            Action::PageDown => outline.move_by(page),
            Action::HalfPageUp => outline.move_by(-page / 2),
            Action::HalfPageDown => outline.move_by(page / 2),
            Action::ExpandAll => outline.set_all(tree, true),
            Action::CollapseAll => {
                outline.set_all(tree, false);
                outline.select_row(0);
                true
            }
        }
    }

    /// The quantize dialog's actions; `None` for every other action.
    fn apply_quantize(&mut self, action: Action) -> Option<(bool, Option<Effect>)> {
        match action {
            Action::Quantize => Some(self.open_quantize()),
            Action::QuantizeGranularity
            | Action::QuantizeWholeModel
            | Action::QuantizeSkipNonFinite
            | Action::QuantizeScheme
            | Action::QuantizeKeepBelow
            | Action::QuantizeConfirm
            | Action::QuantizeCancel
            | Action::OpenResult => {
                let model = Arc::clone(&self.model);
                let dialog = self.quantize.as_mut()?;
                // After a failed save, every choice is open again.
                if matches!(dialog.stage, Stage::Failed(_)) && action != Action::QuantizeCancel {
                    dialog.stage = Stage::Choosing;
                }
                let effect = match (action, &dialog.stage) {
                    (Action::QuantizeGranularity, Stage::Choosing | Stage::ConfirmReplace) => {
                        dialog.granularity = match dialog.granularity {
                            Granularity::PerChannel => Granularity::PerTensor,
                            Granularity::PerTensor => Granularity::PerChannel,
                        };
                        dialog.previews.clear();
                        Some(dialog.preview(false))
                    }
                    (Action::QuantizeScheme, Stage::Choosing | Stage::ConfirmReplace) => {
                        // An output still named after the scheme follows it.
                        let named = quantize::default_output(&model, dialog.scheme);
                        let effect = dialog.next_scheme();
                        if dialog.output == named {
                            dialog.output = quantize::default_output(&model, dialog.scheme);
                            dialog.stage = Stage::Choosing;
                        }
                        effect
                    }
                    (Action::QuantizeKeepBelow, Stage::Choosing | Stage::ConfirmReplace) => {
                        dialog.next_threshold();
                        None
                    }
                    (Action::QuantizeWholeModel, Stage::Choosing | Stage::ConfirmReplace) => {
                        "the whole model".clone_into(&mut dialog.scope);
                        dialog.include.clear();
                        dialog.choose(&model);
                        dialog.previews.clear();
                        Some(dialog.preview(true))
                    }
                    (Action::QuantizeConfirm, Stage::Choosing) if dialog.chosen.is_empty() => {
                        dialog.stage = Stage::Failed(
                            "nothing to quantize in this scope (w: the whole model)".into(),
                        );
                        None
                    }
                    (Action::QuantizeSkipNonFinite, Stage::Choosing | Stage::ConfirmReplace) => {
                        dialog.skip_non_finite = !dialog.skip_non_finite;
                        None
                    }
                    (Action::QuantizeConfirm, Stage::Choosing) if dialog.output.exists() => {
                        dialog.stage = Stage::ConfirmReplace;
                        None
                    }
                    (Action::QuantizeConfirm, Stage::Choosing | Stage::ConfirmReplace) => {
                        let control = Arc::new(quantize::Control::default());
                        dialog.stage = Stage::Saving(Arc::clone(&control));
                        Some(Effect::Save(
                            dialog.options(),
                            dialog.output.clone(),
                            control,
                        ))
                    }
                    (Action::QuantizeCancel, Stage::Saving(control)) => {
                        control.cancelled.store(true, Ordering::Relaxed);
                        None
                    }
                    (Action::QuantizeCancel, _) => {
                        self.quantize = None;
                        None
                    }
                    (Action::OpenResult, Stage::Saved(summary)) => {
                        summary.output.first().map(|p| {
                            Effect::Reopen(if summary.output.len() > 1 {
                                p.parent().unwrap_or(p).to_owned()
                            } else {
                                p.clone()
                            })
                        })
                    }
                    _ => return Some((false, None)),
                };
                Some((true, effect))
            }
            _ => None,
        }
    }

    /// Opens the quantize dialog, its scope taken from the selection.
    fn open_quantize(&mut self) -> (bool, Option<Effect>) {
        if let Some(why) = quantize::needs_its_files(&self.model) {
            self.notice = Some(why);
            return (true, None);
        }
        if let Some(quantization) = &self.quantization {
            self.notice = Some(format!(
                // Within 80 columns for a label as long as "int4 g128, compressed-tensors".
                "{}; quantize the source model",
                quantize::already_quantized(quantization)
            ));
            return (true, None);
        }
        let (scope, include) = match self.selected_node() {
            Some(node)
                if self.tree.node(node).tensor().is_some()
                    && self.tree.children(node).is_empty() =>
            {
                let name = self.tree.path(node);
                (format!("tensor {}", crate::text::escape(&name)), vec![name])
            }
            Some(node)
                if self.tree.node(node).parent().is_some_and(|p| p != ROOT)
                    || self.tree.children(ROOT).len() > 1 =>
            {
                let path = self.tree.path(node);
                (
                    format!("group {}", crate::text::escape(&path)),
                    vec![format!("{path}.*")],
                )
            }
            _ => ("the whole model".to_owned(), Vec::new()),
        };
        let mut dialog = QuantizeDialog {
            scope,
            include,
            granularity: Granularity::PerChannel,
            scheme: quantize::Scheme::W8A8,
            keep_below_snr: None,
            comparison: None,
            skip_non_finite: false,
            output: quantize::default_output(&self.model, quantize::Scheme::W8A8),
            chosen: Vec::new(),
            kept_in_scope: Vec::new(),
            previews: HashMap::default(),
            stage: Stage::Choosing,
            comparing: Arc::default(),
            previewing: Arc::default(),
        };
        dialog.choose(&self.model);
        let effect = dialog.preview(true);
        self.quantize = Some(dialog);
        (true, Some(effect))
    }

    /// A quantization preview arrived.
    pub fn on_preview(
        &mut self,
        tensor: usize,
        granularity: Granularity,
        result: Result<Option<Error8>, String>,
    ) -> bool {
        if let Ok(Some(error)) = &result {
            self.values.record_snr(tensor, error.snr_db);
        }
        match self.quantize.as_mut() {
            Some(dialog)
                if dialog.granularity == granularity && dialog.scheme == quantize::Scheme::W8A8 =>
            {
                dialog.previews.insert(tensor, result);
                true
            }
            _ => false,
        }
    }

    /// The comparison of every scheme arrived, for the scope of `include`.
    pub fn on_compared(
        &mut self,
        include: &[String],
        result: Result<quantize::Comparison, String>,
    ) -> bool {
        match self.quantize.as_mut() {
            Some(dialog) if dialog.include == include => {
                dialog.comparison = Some(result);
                dialog.fill_previews();
                true
            }
            _ => false,
        }
    }

    /// The save finished.
    pub fn on_saved(&mut self, result: Result<quantize::Summary, String>) -> bool {
        let Some(dialog) = self.quantize.as_mut() else {
            return false;
        };
        let cancelled = matches!(&dialog.stage, Stage::Saving(control)
            if control.cancelled.load(Ordering::Relaxed));
        dialog.stage = match result {
            Ok(summary) => Stage::Saved(summary),
            // Whatever file the save was reading when it stopped, the user stopped it.
            Err(_) if cancelled => Stage::Failed("cancelled: nothing was written".into()),
            Err(message) => Stage::Failed(message),
        };
        true
    }

    fn apply_search(&mut self, action: Action) -> bool {
        if self.map_open {
            return self.apply_map_search(action);
        }
        match action {
            Action::StartSearch => self.searching = true,
            Action::SearchType(c) => {
                self.search.push(c);
                self.apply_filter();
            }
            Action::SearchDelete => {
                if self.search.pop().is_none() {
                    return false;
                }
                self.apply_filter();
            }
            Action::SearchAccept => self.searching = false,
            Action::SearchCancel => {
                self.searching = false;
                self.search.clear();
                self.apply_filter();
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
        let count = self.findings.len(self.severity);
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
            .findings
            .get(self.severity, self.finding_selected)
            .and_then(|f| f.tensor.as_ref())
            .and_then(|name| self.tensor_named(name));
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
        self.outline.select(&self.tree, node)
    }

    /// Shows only the tensors whose names contain the search text (case-insensitive).
    fn apply_filter(&mut self) {
        if self.search.is_empty() {
            self.outline.filter(&self.tree, None);
            return;
        }
        let needle = self.search.to_lowercase();
        let matching: Vec<usize> = self
            .model
            .tensors
            .iter()
            .enumerate()
            .filter(|(_, t)| crate::text::contains_ignore_case(t.name(), &needle))
            .map(|(i, _)| i)
            .collect();
        self.outline.filter(&self.tree, Some(&matching));
    }

    /// Takes in what the scan reports. Returns whether anything visible changed.
    pub fn on_scan(&mut self, event: ScanEvent) -> bool {
        match event {
            ScanEvent::Started { tensor } => {
                if self.status[tensor] == ScanStatus::Pending {
                    self.status[tensor] = ScanStatus::Scanning;
                }
                self.selected_tensor() == Some(tensor)
            }
            ScanEvent::Stats { tensor, moments } => {
                self.status[tensor] = ScanStatus::Done;
                self.values.record(tensor, &moments);
                let shown = self.selected_tensor();
                self.outcomes
                    .insert(tensor, Outcome::Moments(moments), shown);
                true
            }
            ScanEvent::Histogram { tensor, histogram } => {
                self.histograms.insert(tensor, histogram);
                self.selected_tensor() == Some(tensor)
            }
            ScanEvent::Codes { tensor, codes } => {
                self.codes.insert(tensor, codes);
                self.selected_tensor() == Some(tensor)
            }
            ScanEvent::Failed { tensor, finding } => {
                let again = self.status[tensor] == ScanStatus::Failed;
                self.status[tensor] = ScanStatus::Failed;
                self.values.record_failed(tensor);
                let shown = self.selected_tensor();
                self.outcomes
                    .insert(tensor, Outcome::Failed(finding.message.clone()), shown);
                // A tensor read again fails again: its finding is listed once.
                if !again {
                    self.add_finding(finding);
                }
                true
            }
            ScanEvent::Finding(finding) => {
                self.add_finding(finding);
                true
            }
            // After the scan, the tensors the cursor asks for again (for their histograms) are
            // not the scan's: its summary keeps the time and bytes it ended with.
            ScanEvent::Progress(_) if self.scan == ScanState::Done => false,
            ScanEvent::Progress(progress) => {
                self.progress = Some(progress);
                true
            }
            ScanEvent::Done(progress) => {
                self.progress = Some(progress);
                self.scan = ScanState::Done;
                self.add_map_findings();
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
            .and_then(|name| self.tensor_named(name))
        {
            let before = self.concern[tensor];
            let worse = match (before, finding.severity) {
                (_, Severity::Info) | (Some(Severity::Error), _) => false,
                (Some(Severity::Warning), severity) => severity == Severity::Error,
                (_, _) => true,
            };
            if worse {
                self.concern[tensor] = Some(finding.severity);
                self.mark_path(tensor, before, finding.severity);
            }
        }
        self.findings.push(finding);
    }

    /// Marks each changed tensor, and each only in this model, on its node and every ancestor.
    pub fn on_diff(&mut self, diff: &crate::diff::ModelDiff) -> bool {
        use crate::diff::Status;
        let mut view = DiffView {
            status: vec![None; self.model.tensors.len()],
            marks: vec![DiffMarks::default(); self.tree.len()],
            metadata: diff.metadata.len(),
            ..DiffView::default()
        };
        for entry in &diff.tensors {
            let Some(tensor) = entry.in_a() else {
                view.only_there += usize::from(entry.status == Status::Added);
                continue;
            };
            let changed = matches!(
                entry.status,
                Status::Changed { .. } | Status::Unreadable { .. }
            );
            let removed = entry.status == Status::Removed;
            view.changed += usize::from(changed);
            view.only_here += usize::from(removed);
            if (changed || removed)
                && let Some(node) = self.tree.node_of_tensor(tensor)
            {
                for id in std::iter::once(node)
                    .chain(self.tree.ancestors(node))
                    .chain(std::iter::once(ROOT))
                {
                    let marks = &mut view.marks[id as usize];
                    marks.changed += u32::from(changed);
                    marks.only_here += u32::from(removed);
                }
            }
            match &entry.status {
                Status::Same => self.values.record_change(tensor, 0.0),
                Status::Changed(changed) => {
                    if let Some(change) = &changed.change {
                        self.values.record_change(tensor, change.relative_l2);
                    }
                }
                _ => {}
            }
            view.status[tensor] = Some(entry.status.clone());
        }
        self.diff = Some(view);
        true
    }

    /// How many tensors at and below a node have errors and warnings. Counted on groups as
    /// findings come; a leaf's are its tensor's worst finding.
    pub fn marks(&self, id: NodeId) -> Marks {
        if (id as usize) < self.tree.group_count() {
            return self
                .group_marks
                .get(id as usize)
                .copied()
                .unwrap_or_default();
        }
        let concern = self.tree.node(id).tensor().and_then(|t| self.concern[t]);
        Marks {
            errors: u32::from(concern == Some(Severity::Error)),
            warnings: u32::from(concern == Some(Severity::Warning)),
        }
    }

    /// Moves a tensor's mark from `before` to `after` on every group it is in.
    fn mark_path(&mut self, tensor: usize, before: Option<Severity>, after: Severity) {
        let Some(node) = self.tree.node_of_tensor(tensor) else {
            return;
        };
        if self.group_marks.is_empty() {
            self.group_marks = vec![Marks::default(); self.tree.group_count()];
        }
        for id in std::iter::once(node)
            .chain(self.tree.ancestors(node))
            .chain(std::iter::once(ROOT))
        {
            let Some(marks) = self.group_marks.get_mut(id as usize) else {
                continue;
            };
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
        assert!(app.tensor_named(name).is_some());
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
        assert_eq!(app.marks(layers).errors, 1);
        assert_eq!(app.marks(ROOT).errors, 1);
        let tensor = app
            .tensor_named("model.layers.2.mlp.down_proj.weight")
            .unwrap();
        let leaf = app.tree.node_of_tensor(tensor).unwrap();
        assert_eq!(
            app.marks(leaf),
            Marks {
                errors: 1,
                warnings: 0
            }
        );
        let unmarked = app.tree.node_of_tensor(tensor + 1).unwrap();
        assert_eq!(app.marks(unmarked), Marks::default());
    }

    #[test]
    fn next_problem_selects_the_nan_tensor() {
        let mut app = demo_app();
        let tensor = app
            .tensor_named("model.layers.2.mlp.down_proj.weight")
            .unwrap();
        app.on_scan(nan_finding(&app, "model.layers.2.mlp.down_proj.weight"));
        let (changed, effect) = app.update(Action::NextProblem);
        assert!(changed);
        assert_eq!(app.selected_tensor(), Some(tensor));
        assert!(matches!(effect, Some(Effect::Prioritize(t)) if t == tensor));
    }

    #[test]
    fn search_filters_and_escape_clears() {
        let mut app = demo_app();
        app.update(Action::StartSearch);
        for c in "down".chars() {
            app.update(Action::SearchType(c));
        }
        let shown = |app: &App| {
            app.outline
                .rows()
                .iter()
                .filter(|row| app.tree.node(row.node).tensor().is_some())
                .count()
        };
        assert_eq!(shown(&app), 4);
        app.update(Action::SearchCancel);
        assert_eq!(app.outline.rows().len(), 5, "opened as before the search");
        assert!(!app.searching);
    }

    #[test]
    fn pause_toggles_the_scan() {
        let mut app = demo_app();
        assert!(matches!(
            app.update(Action::TogglePause).1,
            Some(Effect::SetPaused(true))
        ));
        assert!(matches!(
            app.update(Action::TogglePause).1,
            Some(Effect::SetPaused(false))
        ));
    }

    #[test]
    fn findings_are_listed_by_severity_in_arrival_order_up_to_a_bound() {
        use crate::finding::Code;
        let mut list = FindingList::default();
        list.push(Finding::info(Code::TensorOrder, "i0"));
        list.push(Finding::warning(Code::ValuesAllZero, "w0"));
        list.push(Finding::error(Code::ValuesNan, "e0"));
        list.push(Finding::warning(Code::ValuesAllZero, "w1"));
        let messages: Vec<&str> = list.iter(None).map(|f| f.message.as_str()).collect();
        assert_eq!(messages, ["e0", "w0", "w1", "i0"]);
        assert_eq!(list.get(None, 2).map(|f| f.message.as_str()), Some("w1"));
        assert_eq!(
            list.get(Some(Severity::Warning), 1)
                .map(|f| f.message.as_str()),
            Some("w1")
        );
        assert!(list.get(None, 4).is_none());
        for _ in 0..FindingList::LISTED + 5 {
            list.push(Finding::info(Code::TensorOrder, "more"));
        }
        assert_eq!(list.len(Some(Severity::Info)), FindingList::LISTED);
        assert_eq!(list.unlisted(Some(Severity::Info)), 6);
        assert_eq!(list.unlisted(None), 6);
        assert_eq!(list.len(None), 3 + FindingList::LISTED);
    }

    #[test]
    fn recent_outcomes_let_go_of_the_oldest_but_never_the_one_shown() {
        let mut recent = Recent::default();
        let outcome = |i: usize| Outcome::Failed(i.to_string());
        for tensor in 0..Recent::KEPT {
            recent.insert(tensor, outcome(tensor), Some(0));
        }
        recent.insert(Recent::KEPT, outcome(Recent::KEPT), Some(0));
        assert!(recent.get(0).is_some(), "the tensor shown stays");
        assert!(recent.get(1).is_none(), "the oldest other one goes");
        assert!(recent.get(Recent::KEPT).is_some());
        recent.insert(5, outcome(50), Some(0));
        assert_eq!(recent.get(5), Some(&outcome(50)), "replaced in place");
        assert_eq!(recent.outcomes.len(), Recent::KEPT);
    }

    #[test]
    fn a_tensor_read_again_shows_its_statistics_and_lists_its_failure_once() {
        use crate::finding::Code;
        let mut app = demo_app();
        let tensor = app.tensor_named("model.norm.weight").unwrap();
        let moments = Moments::of_f64(&[1.0, 2.0], f64::MIN_POSITIVE);
        for _ in 0..2 {
            app.on_scan(ScanEvent::Stats { tensor, moments });
        }
        assert_eq!(app.status[tensor], ScanStatus::Done);
        assert_eq!(app.outcomes.get(tensor), Some(&Outcome::Moments(moments)));
        let failure =
            Finding::error(Code::DataUnreadable, "cut short").for_tensor("model.norm.weight");
        for _ in 0..2 {
            app.on_scan(ScanEvent::Failed {
                tensor,
                finding: failure.clone(),
            });
        }
        let listed = app
            .findings
            .iter(None)
            .filter(|f| f.code == Code::DataUnreadable)
            .count();
        assert_eq!(listed, 1);
        assert_eq!(app.status[tensor], ScanStatus::Failed);
    }
}
