//! The layer map view's state: the grid (built on first use), the measure, the rows shown, the
//! cursor and what stands out. No drawing here.

use super::{Action, App, Focus};
use crate::layermap::analysis::{ExpertProblems, Measured, Spot};
use crate::layermap::{Analysis, LayerMap, Measure, Row, Values};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct MapView {
    pub map: LayerMap,
    pub measure: Measure,
    /// Each kind with experts on one row (its worst expert), rather than a row per expert.
    pub folded: bool,
    /// Rows whose label contains this (case-insensitive).
    pub filter: String,
    pub rows: Vec<Row>,
    /// The widest label of `rows`, in columns.
    pub label_width: usize,
    /// `(row, column)` of the cursor among `rows` and the map's columns.
    pub cursor: (usize, usize),
    /// The first row and column on screen (set when drawing).
    pub offset: (usize, usize),
    /// Whether the cursor is on the strip of tensors outside layers rather than on the grid.
    pub in_strip: bool,
    /// The cursor's tensor in the strip, by its place there.
    pub strip_cursor: usize,
    /// The first tensor of the strip on screen (set when drawing).
    pub strip_offset: usize,
    /// The outlier the cursor was last sent to by `n`/`N`.
    problem: Option<usize>,
    /// The analysis, the values' generation it was made for and when; forgotten when the
    /// measure or the rows change.
    analysis: Option<(u64, Instant, Analysis)>,
    /// Every row of a folding measured by a measure, kept so that `Tab`, `e` and `/` put the
    /// rows shown together again rather than measure them anew.
    measured: Vec<Kept<Arc<Measured>>>,
    experts: Option<Kept<ExpertProblems>>,
    /// The generation and time of the analysis while it is taken out to draw.
    taken: Option<(u64, Instant)>,
}

impl MapView {
    /// How often the outliers are worked out again while the scan streams.
    pub const REANALYSED: Duration = Duration::from_millis(500);

    /// The map of `names` (the model's tensors, in order), folded when it has experts.
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> MapView {
        let map = LayerMap::build(
            names
                .into_iter()
                .enumerate()
                .map(|(i, name)| (u32::try_from(i).unwrap_or(u32::MAX), name)),
        );
        let rows = map.rows(true, None);
        let label_width = label_width(&map, &rows);
        MapView {
            label_width,
            map,
            measure: Measure::Std,
            folded: true,
            filter: String::new(),
            rows,
            cursor: (0, 0),
            offset: (0, 0),
            in_strip: false,
            strip_cursor: 0,
            strip_offset: 0,
            problem: None,
            analysis: None,
            measured: Vec::new(),
            experts: None,
            taken: None,
        }
    }

    /// The scale and outliers of the rows shown, worked out again when values came in since, but
    /// while the scan streams (not `settled`) at most every [`MapView::REANALYSED`]: on a model of
    /// a hundred thousand tensors it takes tens of milliseconds.
    pub fn analysis(&mut self, values: &Values, settled: bool) -> &Analysis {
        let stale = self.analysis.as_ref().is_none_or(|(generation, at, _)| {
            *generation != values.generation && (settled || at.elapsed() >= Self::REANALYSED)
        });
        if stale {
            let analysis = self.assemble(values, settled);
            self.analysis = Some((values.generation, Instant::now(), analysis));
        }
        &self
            .analysis
            .get_or_insert_with(|| (0, Instant::now(), Analysis::default()))
            .2
    }

    /// The analysis of the rows shown, from the rows measured and the experts' problems kept
    /// when they are of the current values (or, while the scan streams, recent enough).
    fn assemble(&mut self, values: &Values, settled: bool) -> Analysis {
        let usable = |generation: u64, at: Instant| {
            generation == values.generation || (!settled && at.elapsed() < Self::REANALYSED)
        };
        self.measured
            .retain(|kept| usable(kept.generation, kept.at));
        let (measure, folded) = (self.measure, self.folded);
        let found = self
            .measured
            .iter()
            .position(|kept| kept.value.measure == measure && kept.folded == folded);
        let index = found.unwrap_or_else(|| {
            let all = self.map.rows(folded, None);
            let measured = Arc::new(Measured::of(&self.map, all, values, measure));
            // The oldest go first when a model's grids are too large to keep many.
            let mut total: usize = measured.len();
            let mut kept = 0;
            for entry in self.measured.iter().rev() {
                total += entry.value.len();
                if total > MAX_KEPT_CELLS {
                    break;
                }
                kept += 1;
            }
            self.measured.drain(..self.measured.len() - kept);
            self.measured.push(Kept::new(values, folded, measured));
            self.measured.len() - 1
        });
        if self
            .experts
            .as_ref()
            .is_none_or(|kept| !usable(kept.generation, kept.at))
        {
            let experts = ExpertProblems::of(&self.map, values, None);
            self.experts = Some(Kept::new(values, folded, experts));
        }
        let experts = self.experts.as_ref().map(|kept| &kept.value);
        Analysis::assemble(
            &self.map,
            &self.measured[index].value,
            &self.rows,
            experts.unwrap_or(&ExpertProblems::default()),
            values,
        )
    }

    /// The analysis, taken out to draw with while the view's offsets change; whether its cells
    /// are those of the current values. Put it back with [`MapView::put_back`].
    pub fn take_analysis(&mut self, values: &Values, settled: bool) -> (Analysis, bool) {
        self.analysis(values, settled);
        match self.analysis.take() {
            Some((generation, at, analysis)) => {
                self.taken = Some((generation, at));
                (analysis, generation == values.generation)
            }
            None => (Analysis::default(), false),
        }
    }

    pub fn put_back(&mut self, analysis: Analysis) {
        if let Some((generation, at)) = self.taken.take() {
            self.analysis = Some((generation, at, analysis));
        }
    }

    /// Forgets the analysis: the measure or the rows changed.
    fn changed(&mut self) {
        self.analysis = None;
        self.problem = None;
    }

    /// The next measure with values.
    pub fn cycle_measure(&mut self, values: &Values) {
        let measures: Vec<Measure> = values.measures().collect();
        let at = measures.iter().position(|&m| m == self.measure);
        self.measure = at.map_or(Measure::Std, |i| measures[(i + 1) % measures.len()]);
        self.changed();
    }

    /// Folds experts, or shows one row per expert, keeping the cursor on its tensor's kind.
    pub fn toggle_experts(&mut self) {
        let kind = self.rows.get(self.cursor.0).map(|row| row.kind);
        self.folded = !self.folded;
        self.refresh_rows();
        if let Some(kind) = kind {
            self.cursor.0 = self.rows.iter().position(|r| r.kind == kind).unwrap_or(0);
        }
    }

    /// Shows the rows the filter and folding choose.
    pub fn refresh_rows(&mut self) {
        let needle = self.filter.to_lowercase();
        let filter = (!needle.is_empty()).then_some(needle.as_str());
        self.rows = self.map.rows(self.folded, filter);
        self.label_width = label_width(&self.map, &self.rows);
        self.cursor.0 = self.cursor.0.min(self.rows.len().saturating_sub(1));
        self.changed();
    }

    /// Moves the cursor by rows and columns; whether it moved. Down from the last row goes to
    /// the strip of tensors outside layers, up from there back to the grid.
    pub fn move_by(&mut self, rows: isize, columns: isize) -> bool {
        let clamp = |at: usize, by: isize, len: usize| {
            at.saturating_add_signed(by).min(len.saturating_sub(1))
        };
        let strip = self.map.strip.len();
        if self.in_strip {
            if rows < 0 && !self.rows.is_empty() {
                self.in_strip = false;
                return true;
            }
            let before = self.strip_cursor;
            self.strip_cursor = clamp(self.strip_cursor, columns, strip);
            return self.strip_cursor != before;
        }
        let last_row = self.rows.len().saturating_sub(1);
        if rows > 0 && strip > 0 && (self.rows.is_empty() || self.cursor.0 == last_row) {
            self.in_strip = true;
            self.strip_cursor = self.strip_cursor.min(strip - 1);
            return true;
        }
        let before = self.cursor;
        self.cursor = (
            clamp(self.cursor.0, rows, self.rows.len()),
            clamp(self.cursor.1, columns, self.map.columns.len()),
        );
        self.cursor != before
    }

    /// The tensor under the cursor (a folded row's worst expert), if any.
    pub fn tensor_at_cursor(&self, values: &Values) -> Option<usize> {
        if self.in_strip {
            return self.map.strip.get(self.strip_cursor).map(|&t| t as usize);
        }
        let row = *self.rows.get(self.cursor.0)?;
        let cell = self.map.cell(values, row, self.cursor.1, self.measure);
        (cell.tensor != crate::layermap::NONE).then_some(cell.tensor as usize)
    }

    /// Sends the cursor to the next (or previous) outlier; whether there was one.
    pub fn jump_to_problem(&mut self, values: &Values, forward: bool) -> bool {
        let count = self.analysis(values, true).outliers.len();
        if count == 0 {
            return false;
        }
        let next = match (self.problem, forward) {
            (Some(i), true) => (i + 1) % count,
            (Some(i), false) => (i + count - 1) % count,
            (None, true) => 0,
            (None, false) => count - 1,
        };
        match self.analysis(values, true).outliers[next].spot {
            Spot::Cell { row, column } => {
                self.cursor = (row, column);
                self.in_strip = false;
            }
            Spot::Strip(at) => {
                self.strip_cursor = at;
                self.in_strip = true;
            }
        }
        self.problem = Some(next);
        true
    }

    /// Puts the cursor on `tensor`'s cell, if it is shown. A tensor outside layers leaves the
    /// cursor where it was: the tree starts on one (`lm_head.weight`, first by name), and the
    /// map then opens on its grid.
    pub fn show_tensor(&mut self, tensor: usize) {
        let tensor = u32::try_from(tensor).unwrap_or(u32::MAX);
        if let Some(at) = self.map.position(&self.rows, tensor) {
            self.cursor = at;
            self.in_strip = false;
        }
    }
}

/// Grids of more cells than this, together, are not all kept measured.
const MAX_KEPT_CELLS: usize = 1 << 21;

/// Something worked out from the values, with their generation and when.
#[derive(Debug)]
struct Kept<T> {
    generation: u64,
    at: Instant,
    folded: bool,
    value: T,
}

impl<T> Kept<T> {
    fn new(values: &Values, folded: bool, value: T) -> Kept<T> {
        Kept {
            generation: values.generation,
            at: Instant::now(),
            folded,
            value,
        }
    }
}

fn label_width(map: &LayerMap, rows: &[Row]) -> usize {
    rows.iter()
        .map(|&row| crate::text::display_width(&crate::text::escape(&map.label(row))))
        .max()
        .unwrap_or(0)
}

impl App {
    /// The layer map's actions, while it is open; `None` for the others.
    pub(super) fn apply_map(&mut self, action: Action) -> Option<bool> {
        if !self.map_open || self.searching {
            return None;
        }
        let page = isize::try_from(self.page).unwrap_or(10);
        let values = &self.values;
        let view = self.map.as_mut()?;
        Some(match action {
            Action::Up => view.move_by(-1, 0),
            Action::Down => view.move_by(1, 0),
            Action::Left => view.move_by(0, -1),
            Action::Right => view.move_by(0, 1),
            Action::PageUp => view.move_by(-page, 0),
            Action::PageDown => view.move_by(page, 0),
            Action::MapMeasure => {
                view.cycle_measure(values);
                true
            }
            Action::MapExperts => {
                view.toggle_experts();
                true
            }
            Action::NextProblem => view.jump_to_problem(values, true),
            Action::PreviousProblem => view.jump_to_problem(values, false),
            Action::MapJump => {
                let Some(tensor) = view.tensor_at_cursor(values) else {
                    return Some(false);
                };
                self.map_open = false;
                self.focus = Focus::Tree;
                self.select_tensor(tensor);
                true
            }
            _ => return None,
        })
    }

    /// Opens the layer map (built the first time), its cursor on the selected tensor; or goes
    /// back to the tree.
    pub(super) fn toggle_map(&mut self) -> bool {
        if self.map_open {
            self.map_open = false;
            return true;
        }
        let selected = self.selected_tensor();
        let view = self.map_view();
        if let Some(tensor) = selected {
            view.show_tensor(tensor);
        }
        self.map_open = true;
        true
    }

    fn map_view(&mut self) -> &mut MapView {
        let model = &self.model;
        self.map.get_or_insert_with(|| {
            MapView::new(model.tensors.iter().map(crate::format::Tensor::name))
        })
    }

    /// Typing in the map's row filter.
    pub(super) fn apply_map_search(&mut self, action: Action) -> bool {
        let Some(view) = self.map.as_mut() else {
            return false;
        };
        match action {
            Action::StartSearch => self.searching = true,
            Action::SearchType(c) => view.filter.push(c),
            Action::SearchDelete => {
                if view.filter.pop().is_none() {
                    return false;
                }
            }
            Action::SearchAccept => {
                self.searching = false;
                return true;
            }
            Action::SearchCancel => {
                self.searching = false;
                view.filter.clear();
            }
            _ => return false,
        }
        view.refresh_rows();
        true
    }

    /// Once the scan is done: what the layer map finds by std, over every expert.
    pub(super) fn add_map_findings(&mut self) {
        // A model whose names have no layer has no map, and nothing to find in one.
        if self.values.is_empty() {
            return;
        }
        let model = Arc::clone(&self.model);
        self.map_view();
        let (Some(view), values) = (&self.map, &self.values) else {
            return;
        };
        let expanded = view.map.rows(false, None);
        let findings = Analysis::of(&view.map, &expanded, values, Measure::Std, None).findings(
            &view.map,
            &expanded,
            Measure::Std,
            |t| model.tensors[t as usize].name(),
        );
        for finding in findings {
            self.add_finding(finding);
        }
    }
}
