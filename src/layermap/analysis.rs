//! What the map shows beside its picture: the scale of a measure, and what stands out (NaN/Inf
//! cells, cells far from their row's median, dead, constant and copied experts, bands of layers
//! off their rows), each of which is also a finding.

use super::{Cell, LayerMap, Measure, NONE, Row, State, Values};
use crate::finding::{Code, Finding};
use crate::text::escape;
use std::sync::Arc;

/// Cells whose robust z-score is at least this far from their row's median stand out.
pub const OUTLIER_Z: f32 = 6.0;
/// For measures of magnitude, a cell must also be this many times off its row's median.
const OUTLIER_RATIO: f32 = 1.5;
/// A layer is in a band when the median z-score of its cells, over the rows, is this far out.
const BAND_Z: f32 = 3.0;
/// Cells this many times off their row's median are the scan's `layer-outlier` findings.
const LAYER_OUTLIER_RATIO: f32 = 10.0;
/// Rows with fewer measured layers than this have no outliers: no median to speak of.
const MIN_LAYERS: usize = 4;
/// At most this many cells of each kind of problem are listed (a hostile model can have a
/// million NaN tensors); the findings of the scan count them all.
const LISTED: usize = 1_000;

/// How values map to shades: linear, or logarithmic when positive values span two orders of
/// magnitude or more. A linear scale of a measure of magnitude starts at zero, and one of the
/// mean is centred on zero, so that values a hair apart do not look worlds apart.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scale {
    pub log: bool,
    pub low: f32,
    pub high: f32,
}

impl Scale {
    /// The scale of `values` by `measure` (non-finite values ignored); `None` when there is none.
    pub fn of(values: impl IntoIterator<Item = f32>, measure: Measure) -> Option<Scale> {
        let (mut low, mut high) = (f32::INFINITY, f32::NEG_INFINITY);
        for value in values.into_iter().filter(|v| v.is_finite()) {
            low = low.min(value);
            high = high.max(value);
        }
        if low > high {
            return None;
        }
        if low > 0.0 && high / low >= 100.0 {
            return Some(Scale {
                log: true,
                low,
                high,
            });
        }
        let (low, high) = match measure {
            Measure::Std | Measure::Absmax | Measure::Change | Measure::Zeros => {
                (low.min(0.0), high)
            }
            Measure::Mean => {
                let reach = low.abs().max(high.abs());
                (-reach, reach)
            }
            Measure::Snr => (low, high),
        };
        Some(Scale {
            log: false,
            low,
            high,
        })
    }

    /// The shade of `value`, from 0 to `levels - 1`.
    pub fn level(&self, value: f32, levels: usize) -> usize {
        let position = if self.log {
            (value.max(self.low).ln() - self.low.ln()) / (self.high.ln() - self.low.ln())
        } else if self.high > self.low {
            (value - self.low) / (self.high - self.low)
        } else {
            0.0
        };
        let last = levels.saturating_sub(1);
        if position.is_nan() {
            return 0;
        }
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "clamped to 0..=last first"
        )]
        let level = (position.clamp(0.0, 1.0) * levels as f32) as usize;
        level.min(last)
    }
}

/// Why a cell or an expert stands out.
#[derive(Clone, Debug, PartialEq)]
pub enum Problem {
    NonFinite,
    Failed,
    /// Far from its row's median by the measure.
    Deviant {
        value: f32,
        median: f32,
        z: f32,
    },
    /// Every tensor of these experts (numbers) of one layer is all zeros.
    DeadExperts(Vec<u32>),
    /// Every tensor of these experts holds one repeated nonzero value.
    ConstantExperts(Vec<u32>),
    /// `(expert, original)`: experts with the same statistics, tensor by tensor, as another
    /// expert of the layer; `confirmed` when their bytes were compared and found equal.
    Copies {
        pairs: Vec<(u32, u32)>,
        confirmed: bool,
    },
    /// Layers (from, to: columns) whose cells are off their rows' medians, most rows alike.
    Band {
        last: usize,
        rows: usize,
        z: f32,
    },
}

/// Where an outlier is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spot {
    /// `row` among the rows analysed (the stack's first row for a band), and `column`.
    Cell { row: usize, column: usize },
    /// A tensor outside layers, by its place in the map's strip.
    Strip(usize),
}

/// One thing the map lists, where it is and the tensor shown there.
#[derive(Clone, Debug, PartialEq)]
pub struct Outlier {
    pub problem: Problem,
    pub spot: Spot,
    pub tensor: u32,
}

impl Outlier {
    /// The row and column of an outlier in the grid; `None` for one outside layers.
    pub fn cell(&self) -> Option<(usize, usize)> {
        match self.spot {
            Spot::Cell { row, column } => Some((row, column)),
            Spot::Strip(_) => None,
        }
    }
}

/// The scale and the list of what stands out, for one measure over some rows.
#[derive(Clone, Debug, Default)]
pub struct Analysis {
    /// The rows measured, and where each row analysed is among them.
    measured: Option<Arc<Measured>>,
    found: Vec<Option<usize>>,
    pub scale: Option<Scale>,
    /// NaN/Inf and unreadable cells first (those outside layers after the grid's), then cells
    /// by how far out they are, then experts and bands.
    pub outliers: Vec<Outlier>,
}

/// Compares two tensors' bytes: `Some(true)` when equal.
pub type SameBytes<'a> = &'a dyn Fn(u32, u32) -> Option<bool>;

/// Some rows' cells by one measure, with what each row says alone: its cells' robust z-scores
/// and the cells far from its median. What rows say together (the scale, bands of layers) is
/// worked out when they are put together ([`Analysis::assemble`]), so that a filter, or a key
/// that comes back to a measure, reuses them.
#[derive(Clone, Debug)]
pub struct Measured {
    pub measure: Measure,
    pub rows: Vec<Row>,
    width: usize,
    cells: Vec<Cell>,
    z_scores: Vec<f32>,
    /// Cells far from their row's median, row after row.
    deviants: Vec<Outlier>,
}

impl Measured {
    pub fn of(map: &LayerMap, rows: Vec<Row>, values: &Values, measure: Measure) -> Measured {
        let width = map.columns.len();
        let mut cells: Vec<Cell> = Vec::with_capacity(rows.len() * width);
        for &row in &rows {
            match map.row_tensors(row) {
                Some(tensors) => cells.extend(tensors.iter().map(|&tensor| match tensor {
                    NONE => Cell::MISSING,
                    _ => Cell {
                        tensor,
                        state: values.get(tensor as usize, measure),
                    },
                })),
                None => {
                    cells.extend((0..width).map(|column| map.cell(values, row, column, measure)));
                }
            }
        }
        let (deviants, z_scores) = deviants(&cells, width, measure);
        Measured {
            measure,
            rows,
            width,
            cells,
            z_scores,
            deviants,
        }
    }

    /// How many cells it keeps.
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    /// The index among `self.rows` of each of `shown`, which are in the map's order as these
    /// are; `None` for one not measured.
    fn find(&self, shown: &[Row]) -> Vec<Option<usize>> {
        let mut next = 0;
        shown
            .iter()
            .map(|row| {
                let found = self.rows[next..].iter().position(|r| r == row)?;
                next += found + 1;
                Some(next - 1)
            })
            .collect()
    }
}

impl Analysis {
    /// Works out the scale and the outliers of `rows` by `measure`. `same_bytes`, when given,
    /// confirms copies of experts found by their statistics.
    pub fn of(
        map: &LayerMap,
        rows: &[Row],
        values: &Values,
        measure: Measure,
        same_bytes: Option<SameBytes<'_>>,
    ) -> Analysis {
        let measured = Arc::new(Measured::of(map, rows.to_vec(), values, measure));
        let experts = ExpertProblems::of(map, values, same_bytes);
        Analysis::assemble(map, &measured, rows, &experts, values)
    }

    /// The analysis of `shown`, rows among those `measured` and in the same order, with the
    /// tensors outside layers and the `experts`' problems. Nothing is measured or copied: the
    /// cells stay `measured`'s.
    pub fn assemble(
        map: &LayerMap,
        measured: &Arc<Measured>,
        shown: &[Row],
        experts: &ExpertProblems,
        values: &Values,
    ) -> Analysis {
        let (width, measure) = (measured.width, measured.measure);
        let found = measured.find(shown);
        let cells: Vec<Option<&[Cell]>> = found
            .iter()
            .map(|index| index.map(|i| &measured.cells[i * width..(i + 1) * width]))
            .collect();
        let z_scores: Vec<&[f32]> = found
            .iter()
            .map(|index| index.map_or(&[][..], |i| &measured.z_scores[i * width..(i + 1) * width]))
            .collect();
        let mut deviants = Vec::new();
        for (row, &index) in found.iter().enumerate() {
            let Some(index) = index else { continue };
            let first = measured
                .deviants
                .partition_point(|o| o.cell().is_some_and(|(r, _)| r < index));
            for outlier in measured.deviants[first..]
                .iter()
                .take_while(|o| o.cell().is_some_and(|(r, _)| r == index))
            {
                if let Some((_, column)) = outlier.cell() {
                    deviants.push(Outlier {
                        spot: Spot::Cell { row, column },
                        ..outlier.clone()
                    });
                }
            }
        }
        let scale = Scale::of(
            cells
                .iter()
                .flatten()
                .flat_map(|row| row.iter())
                .filter_map(|cell| match cell.state {
                    State::Value(value) => Some(value),
                    _ => None,
                }),
            measure,
        );
        let mut outliers = broken(map, &cells, values, measure);
        deviants.sort_by(|a, b| z_of(b).total_cmp(&z_of(a)));
        deviants.truncate(LISTED);
        outliers.append(&mut deviants);
        outliers.extend(experts.shown_in(shown));
        // A band is one stack's: rows of one stack are next to each other.
        let mut start = 0;
        for group in shown
            .chunk_by(|a, b| map.kinds[a.kind as usize].stack == map.kinds[b.kind as usize].stack)
        {
            let end = start + group.len();
            for mut band in bands(&z_scores[start..end], width) {
                if let Spot::Cell { row, .. } = &mut band.spot {
                    *row = start;
                }
                outliers.push(band);
            }
            start = end;
        }
        Analysis {
            measured: Some(Arc::clone(measured)),
            found,
            scale,
            outliers,
        }
    }

    /// The cell of `row` (among the rows analysed) in `column`; `None` for a row not measured.
    pub fn cell(&self, row: usize, column: usize) -> Option<Cell> {
        let measured = self.measured.as_ref()?;
        let index = (*self.found.get(row)?)?;
        measured.cells.get(index * measured.width + column).copied()
    }

    /// The findings these outliers make, but NaN/Inf and unreadable cells, which the scan's own
    /// findings report.
    pub fn findings<'n>(
        &self,
        map: &LayerMap,
        rows: &[Row],
        measure: Measure,
        name_of: impl Fn(u32) -> &'n str,
    ) -> Vec<Finding> {
        let mut findings = Vec::new();
        for outlier in &self.outliers {
            let Some((row, column)) = outlier.cell() else {
                continue;
            };
            let layer = map.columns[column];
            let tensor = (outlier.tensor != NONE).then(|| name_of(outlier.tensor));
            let described = Described(outlier, map, rows, measure);
            let finding = match &outlier.problem {
                Problem::NonFinite | Problem::Failed => continue,
                // Ten times off or more is `layer-outlier`'s, which the scan reports.
                Problem::Deviant { value, median, .. }
                    if measure.is_magnitude()
                        && !(median / LAYER_OUTLIER_RATIO..median * LAYER_OUTLIER_RATIO)
                            .contains(value) =>
                {
                    continue;
                }
                Problem::Deviant { .. } => Finding::info(Code::MapOutlier, format!("{described}")),
                Problem::DeadExperts(_) => {
                    Finding::warning(Code::ExpertDead, format!("layer {layer}: {described}"))
                }
                Problem::ConstantExperts(_) => {
                    Finding::warning(Code::ExpertConstant, format!("layer {layer}: {described}"))
                }
                Problem::Copies { .. } => {
                    let label = map.label(rows[row]);
                    Finding::warning(
                        Code::ExpertCopy,
                        format!("layer {layer} of `{}`: {described}", escape(&label)),
                    )
                }
                Problem::Band { .. } => Finding::warning(Code::LayerBand, format!("{described}")),
            };
            findings.push(match tensor {
                Some(name) if !matches!(outlier.problem, Problem::Band { .. }) => {
                    finding.for_tensor(name)
                }
                _ => finding,
            });
        }
        findings
    }
}

/// NaN/Inf and unreadable cells, then tensors outside layers, at most [`LISTED`] of them.
fn broken(
    map: &LayerMap,
    rows: &[Option<&[Cell]>],
    values: &Values,
    measure: Measure,
) -> Vec<Outlier> {
    let problem = |state: State| match state {
        State::NonFinite => Some(Problem::NonFinite),
        State::Failed => Some(Problem::Failed),
        _ => None,
    };
    let in_grid = rows.iter().enumerate().flat_map(|(row, cells)| {
        cells
            .unwrap_or_default()
            .iter()
            .enumerate()
            .filter_map(move |(column, cell)| {
                Some(Outlier {
                    problem: problem(cell.state)?,
                    spot: Spot::Cell { row, column },
                    tensor: cell.tensor,
                })
            })
    });
    let outside = map.strip.iter().enumerate().filter_map(|(at, &tensor)| {
        Some(Outlier {
            problem: problem(values.get(tensor as usize, measure))?,
            spot: Spot::Strip(at),
            tensor,
        })
    });
    let mut found: Vec<Outlier> = in_grid.chain(outside).take(LISTED).collect();
    found.sort_by_key(|outlier| matches!(outlier.problem, Problem::Failed));
    found
}

/// An outlier in words: what is wrong, without the tensor's name.
#[derive(Debug)]
pub struct Described<'a>(
    pub &'a Outlier,
    pub &'a LayerMap,
    pub &'a [Row],
    pub Measure,
);

impl std::fmt::Display for Described<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Described(outlier, map, rows, measure) = *self;
        let (row, column) = outlier.cell().unwrap_or_default();
        let numbers = |list: &[u32]| {
            let shown: Vec<String> = list.iter().take(8).map(u32::to_string).collect();
            let more = list.len().saturating_sub(shown.len());
            if more > 0 {
                format!("{} and {more} more", shown.join(", "))
            } else {
                shown.join(", ")
            }
        };
        let experts = |list: &[u32]| {
            if list.len() == 1 {
                format!("expert {}", list[0])
            } else {
                format!("{} experts ({})", list.len(), numbers(list))
            }
        };
        match &outlier.problem {
            Problem::NonFinite => f.write_str("holds NaN or Inf"),
            Problem::Failed => f.write_str("could not be read"),
            Problem::Deviant { value, median, z } => {
                let name = measure.name();
                let label = rows.get(row).map(|&row| map.label(row)).unwrap_or_default();
                let label = escape(&label);
                let layer = map.columns.get(column).copied().unwrap_or_default();
                if measure.is_magnitude() && *median > 0.0 {
                    write!(
                        f,
                        "{name} {value:.3e} in layer {layer} is {:.1}x the median {median:.3e} of `{label}` (robust z {z:.1})",
                        value / median
                    )
                } else {
                    write!(
                        f,
                        "{name} {value:.3e} in layer {layer} is far from the median {median:.3e} of `{label}` (robust z {z:.1})"
                    )
                }
            }
            Problem::DeadExperts(list) => {
                write!(f, "{} all zeros", experts(list))
            }
            Problem::ConstantExperts(list) => {
                write!(f, "{} one repeated value", experts(list))
            }
            Problem::Copies { pairs, confirmed } => {
                let shown: Vec<String> = pairs
                    .iter()
                    .take(4)
                    .map(|(expert, original)| format!("expert {expert} = expert {original}"))
                    .collect();
                let more = pairs.len().saturating_sub(shown.len());
                let how = if *confirmed {
                    "byte for byte"
                } else {
                    "by their statistics"
                };
                write!(f, "copied experts ({how}): {}", shown.join(", "))?;
                if more > 0 {
                    write!(f, " and {more} more")?;
                }
                Ok(())
            }
            Problem::Band { last, rows, z } => {
                let layer = |column: usize| map.columns.get(column).copied().unwrap_or_default();
                let (first, last) = (layer(column), layer(*last));
                let layers = if first == last {
                    format!("layer {first}")
                } else {
                    format!("layers {first}-{last}")
                };
                write!(
                    f,
                    "{layers}: most of {rows} rows off their medians by {} (median robust z {z:.1})",
                    measure.name()
                )
            }
        }
    }
}

fn z_of(outlier: &Outlier) -> f32 {
    match outlier.problem {
        Problem::Deviant { z, .. } => z.abs(),
        _ => 0.0,
    }
}

fn judged(value: f32, measure: Measure) -> f32 {
    measure.judged(value)
}

fn median(values: &mut [f32]) -> f32 {
    let middle = values.len() / 2;
    *values.select_nth_unstable_by(middle, f32::total_cmp).1
}

/// Cells far from their row's median, and every cell's robust z-score (NaN where none).
fn deviants(grid: &[Cell], width: usize, measure: Measure) -> (Vec<Outlier>, Vec<f32>) {
    let mut z_scores = vec![f32::NAN; grid.len()];
    let mut found = Vec::new();
    if width == 0 {
        return (found, z_scores);
    }
    let mut judged_values = Vec::with_capacity(width);
    let mut deviations = Vec::with_capacity(width);
    for (row, cells) in grid.chunks(width).enumerate() {
        // Each cell's judged value, worked out once (a logarithm for measures of magnitude),
        // kept in the z-scores' place until they take it.
        let judged_row = &mut z_scores[row * width..(row + 1) * width];
        judged_values.clear();
        for (cell, slot) in cells.iter().zip(judged_row.iter_mut()) {
            if let State::Value(value) = cell.state {
                *slot = judged(value, measure);
                judged_values.push(*slot);
            }
        }
        if judged_values.len() < MIN_LAYERS {
            judged_row.fill(f32::NAN);
            continue;
        }
        let centre = median(&mut judged_values);
        let floor = if measure.is_magnitude() {
            0.01
        } else {
            deviations.clear();
            deviations.extend(judged_values.iter().map(|v| v.abs()));
            (median(&mut deviations) * 1e-3).max(1e-12)
        };
        deviations.clear();
        deviations.extend(judged_values.iter().map(|v| (v - centre).abs()));
        let spread = median(&mut deviations).max(floor);
        let raw_median = if measure.is_magnitude() {
            centre.exp()
        } else {
            centre
        };
        for (column, (cell, slot)) in cells.iter().zip(judged_row.iter_mut()).enumerate() {
            let State::Value(value) = cell.state else {
                continue;
            };
            let off = *slot - centre;
            let z = 0.6745 * off / spread;
            *slot = z;
            let far_enough = !measure.is_magnitude() || off.abs() >= OUTLIER_RATIO.ln();
            if z.abs() >= OUTLIER_Z && far_enough {
                found.push(Outlier {
                    problem: Problem::Deviant {
                        value,
                        median: raw_median,
                        z,
                    },
                    spot: Spot::Cell { row, column },
                    tensor: cell.tensor,
                });
            }
        }
    }
    (found, z_scores)
}

/// Runs of layers where most rows are off their medians the same way.
fn bands(z_scores: &[&[f32]], width: usize) -> Vec<Outlier> {
    if width < MIN_LAYERS {
        return Vec::new();
    }
    let mut column_z = Vec::with_capacity(width);
    let mut per_column = Vec::with_capacity(z_scores.len());
    for column in 0..width {
        per_column.clear();
        per_column.extend(
            z_scores
                .iter()
                .filter_map(|row| row.get(column))
                .filter(|z| !z.is_nan()),
        );
        let counted = per_column.len();
        let z = if counted >= 3 {
            median(&mut per_column)
        } else {
            0.0
        };
        column_z.push((z, counted));
    }
    let mut found = Vec::new();
    let mut column = 0;
    while column < width {
        let (z, _) = column_z[column];
        if z.abs() < BAND_Z {
            column += 1;
            continue;
        }
        let first = column;
        while column + 1 < width
            && column_z[column + 1].0.abs() >= BAND_Z
            && column_z[column + 1].0.signum() == z.signum()
        {
            column += 1;
        }
        let counted = column_z[first..=column]
            .iter()
            .map(|&(_, n)| n)
            .min()
            .unwrap_or(0);
        let mut band_z: Vec<f32> = column_z[first..=column].iter().map(|&(z, _)| z).collect();
        found.push(Outlier {
            problem: Problem::Band {
                last: column,
                rows: counted,
                z: median(&mut band_z),
            },
            spot: Spot::Cell {
                row: 0,
                column: first,
            },
            tensor: NONE,
        });
        column += 1;
    }
    found
}

/// Dead, constant and copied experts of every layer, one problem per layer and kind of problem:
/// what the experts' statistics say, whatever the measure or the rows shown.
#[derive(Clone, Debug, Default)]
pub struct ExpertProblems(Vec<ExpertProblem>);

#[derive(Clone, Debug)]
struct ExpertProblem {
    problem: Problem,
    column: usize,
    /// The first expert's (or copy's) first tensor.
    tensor: u32,
    /// The rows that can show that expert, the first shown taken.
    shown_by: Vec<Row>,
}

/// One stack's kinds with experts, and the expert numbers any of them has.
struct ExpertKinds {
    kinds: Vec<u32>,
    numbers: Vec<u32>,
    /// By kind, then by number: the expert's index in that kind.
    index: Vec<Vec<Option<u32>>>,
}

impl ExpertKinds {
    /// The stacks' kinds with experts, stack by stack.
    fn of(map: &LayerMap) -> Vec<ExpertKinds> {
        let mut stacks: Vec<ExpertKinds> = Vec::new();
        let mut last_stack: Option<&str> = None;
        for (id, kind) in map.kinds.iter().enumerate() {
            if kind.experts.is_empty() {
                continue;
            }
            if last_stack != Some(kind.stack.as_str()) {
                stacks.push(ExpertKinds {
                    kinds: Vec::new(),
                    numbers: Vec::new(),
                    index: Vec::new(),
                });
                last_stack = Some(&kind.stack);
            }
            if let Some(stack) = stacks.last_mut() {
                stack.kinds.push(u32::try_from(id).unwrap_or(u32::MAX));
                stack.numbers.extend(&kind.experts);
            }
        }
        for stack in &mut stacks {
            stack.numbers.sort_unstable();
            stack.numbers.dedup();
            stack.index = stack
                .kinds
                .iter()
                .map(|&kind| {
                    let experts = &map.kinds[kind as usize].experts;
                    stack
                        .numbers
                        .iter()
                        .map(|number| {
                            let at = experts.binary_search(number).ok()?;
                            u32::try_from(at).ok()
                        })
                        .collect()
                })
                .collect();
        }
        stacks
    }

    /// The tensors of expert `slot` (among `numbers`) in `column`, kind by kind (`NONE` where
    /// that kind lacks it).
    fn tensors<'m>(
        &'m self,
        map: &'m LayerMap,
        slot: usize,
        column: usize,
    ) -> impl Iterator<Item = u32> + 'm {
        let width = map.columns.len();
        self.kinds
            .iter()
            .zip(&self.index)
            .map(move |(&kind, index)| {
                index[slot].map_or(NONE, |at| {
                    let row = map.kinds[kind as usize].first_row as usize + at as usize;
                    map.cells[row * width + column]
                })
            })
    }

    /// The rows that can show expert `slot`: its own row, or its kind folded, kind by kind.
    fn rows_of(&self, slot: usize) -> Vec<Row> {
        self.kinds
            .iter()
            .zip(&self.index)
            .filter_map(|(&kind, index)| index[slot].map(|at| (kind, at)))
            .flat_map(|(kind, at)| {
                [
                    Row {
                        kind,
                        expert: Some(at),
                    },
                    Row { kind, expert: None },
                ]
            })
            .collect()
    }
}

/// What the tensors of one expert of one layer hold.
#[derive(Clone, Copy)]
struct Expert {
    slot: usize,
    number: u32,
    first_tensor: u32,
    dead: bool,
    constant: bool,
    /// A hash of its statistics, kind by kind; `None` once one tensor is not scanned.
    signature: Option<u64>,
}

impl ExpertProblems {
    /// The problems of every expert. `same_bytes`, when given, confirms copies found by their
    /// statistics.
    pub fn of(map: &LayerMap, values: &Values, same_bytes: Option<SameBytes<'_>>) -> Self {
        let mut found = Vec::new();
        let mut layer: Vec<Expert> = Vec::new();
        for stack in ExpertKinds::of(map) {
            for column in 0..map.columns.len() {
                layer.clear();
                for (slot, &number) in stack.numbers.iter().enumerate() {
                    if let Some(expert) = expert(map, values, &stack, slot, number, column) {
                        layer.push(expert);
                    }
                }
                let picked = |pick: &dyn Fn(&Expert) -> bool, problem: fn(Vec<u32>) -> Problem| {
                    let picked: Vec<&Expert> = layer.iter().filter(|e| pick(e)).collect();
                    let first = picked.first()?;
                    Some(ExpertProblem {
                        problem: problem(picked.iter().map(|e| e.number).collect()),
                        column,
                        tensor: first.first_tensor,
                        shown_by: stack.rows_of(first.slot),
                    })
                };
                found.extend(picked(&|e| e.dead, Problem::DeadExperts));
                found.extend(picked(&|e| e.constant && !e.dead, Problem::ConstantExperts));
                found.extend(copies(map, values, &stack, &mut layer, column, same_bytes));
            }
        }
        ExpertProblems(found)
    }

    /// The problems, at the first of `shown` that shows each (the first row when none does).
    fn shown_in(&self, shown: &[Row]) -> Vec<Outlier> {
        if self.0.is_empty() {
            return Vec::new();
        }
        let at: foldhash::HashMap<Row, usize> = shown
            .iter()
            .enumerate()
            .map(|(index, &row)| (row, index))
            .collect();
        self.0
            .iter()
            .map(|found| Outlier {
                problem: found.problem.clone(),
                spot: Spot::Cell {
                    row: found
                        .shown_by
                        .iter()
                        .find_map(|row| at.get(row).copied())
                        .unwrap_or(0),
                    column: found.column,
                },
                tensor: found.tensor,
            })
            .collect()
    }
}

/// What expert `slot` of `stack` holds in `column`; `None` when it has no tensor there.
fn expert(
    map: &LayerMap,
    values: &Values,
    stack: &ExpertKinds,
    slot: usize,
    number: u32,
    column: usize,
) -> Option<Expert> {
    let mut expert = Expert {
        slot,
        number,
        first_tensor: NONE,
        dead: true,
        constant: true,
        signature: Some(0xcbf2_9ce4_8422_2325),
    };
    for (position, tensor) in stack.tensors(map, slot, column).enumerate() {
        if tensor == NONE {
            continue;
        }
        if expert.first_tensor == NONE {
            expert.first_tensor = tensor;
        }
        if let Some(stats) = values.stats(tensor as usize) {
            let [std, absmax, _, zeros] = stats;
            expert.dead &= zeros == 1.0;
            expert.constant &= std == 0.0 && absmax > 0.0;
            if let Some(hash) = &mut expert.signature {
                for word in std::iter::once(u32::try_from(position).unwrap_or(u32::MAX))
                    .chain(stats.map(f32::to_bits))
                {
                    *hash = (*hash ^ u64::from(word)).wrapping_mul(0x0100_0000_01b3);
                }
            }
        } else {
            expert.dead = false;
            expert.constant = false;
            expert.signature = None;
        }
    }
    (expert.first_tensor != NONE).then_some(expert)
}

/// Experts of one layer with the same statistics, tensor by tensor, as an expert before them,
/// their bytes compared by `same_bytes` when given.
fn copies(
    map: &LayerMap,
    values: &Values,
    stack: &ExpertKinds,
    layer: &mut [Expert],
    column: usize,
    same_bytes: Option<SameBytes<'_>>,
) -> Option<ExpertProblem> {
    layer.sort_by_key(|e| (e.signature, e.number));
    let same_statistics = |a: &Expert, b: &Expert| {
        stack
            .tensors(map, a.slot, column)
            .zip(stack.tensors(map, b.slot, column))
            .all(|(a, b)| match (a, b) {
                (NONE, NONE) => true,
                (NONE, _) | (_, NONE) => false,
                (a, b) => {
                    let bits = |t: u32| values.stats(t as usize).map(|s| s.map(f32::to_bits));
                    bits(a) == bits(b)
                }
            })
    };
    let same_bytes_of = |a: &Expert, b: &Expert| {
        same_bytes.is_none_or(|same| {
            stack
                .tensors(map, a.slot, column)
                .zip(stack.tensors(map, b.slot, column))
                .filter(|&(a, b)| a != NONE || b != NONE)
                .all(|(a, b)| same(a, b) == Some(true))
        })
    };
    let mut pairs = Vec::new();
    let mut first_copy: Option<&Expert> = None;
    let candidates = |e: &&Expert| !e.dead && !e.constant && e.signature.is_some();
    let layer: Vec<&Expert> = layer.iter().filter(candidates).collect();
    for group in layer.chunk_by(|a, b| a.signature == b.signature) {
        // Equal hashes of unequal statistics: each expert is compared with the first before it
        // whose statistics it has.
        for (at, copy) in group.iter().enumerate() {
            let Some(original) = group[..at].iter().find(|o| same_statistics(o, copy)) else {
                continue;
            };
            if same_bytes_of(original, copy) {
                pairs.push((copy.number, original.number));
                first_copy = first_copy.or(Some(copy));
            }
        }
    }
    let copy = first_copy?;
    Some(ExpertProblem {
        problem: Problem::Copies {
            pairs,
            confirmed: same_bytes.is_some(),
        },
        column,
        tensor: copy.first_tensor,
        shown_by: stack.rows_of(copy.slot),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::Moments;

    #[test]
    fn scales_are_linear_or_logarithmic_from_the_data() {
        let linear = Scale::of([0.5, 1.0, 2.0], Measure::Snr).unwrap();
        assert!(!linear.log);
        assert_eq!(linear.level(0.5, 4), 0);
        assert_eq!(linear.level(2.0, 4), 3);
        assert_eq!(linear.level(1.25, 4), 2);
        let log = Scale::of([0.001, 0.01, 1.0, f32::NAN], Measure::Std).unwrap();
        assert!(log.log);
        assert_eq!((log.low, log.high), (0.001, 1.0));
        assert_eq!(log.level(0.01, 3), 1);
        assert!(Scale::of([f32::NAN], Measure::Std).is_none());
        let close = Scale::of([0.0199, 0.0201], Measure::Std).unwrap();
        assert_eq!((close.low, close.level(0.0199, 4)), (0.0, 3), "from zero");
        let mean = Scale::of([-0.5, 0.25], Measure::Mean).unwrap();
        assert_eq!((mean.low, mean.high, mean.level(0.0, 4)), (-0.5, 0.5, 2));
        assert_eq!(
            Scale::of([0.0, 0.0], Measure::Zeros).unwrap().level(0.0, 4),
            0
        );
    }

    /// `layers` layers of `kinds`, each with `experts` experts of one kind, std 1 but where
    /// `std_of` says otherwise.
    fn model(
        layers: u32,
        experts: u32,
        std_of: impl Fn(&str) -> Option<f32>,
    ) -> (LayerMap, Values, Vec<String>) {
        let mut names = Vec::new();
        for layer in 0..layers {
            for kind in ["attn.q.weight", "mlp.down.weight", "norm.weight"] {
                names.push(format!("layers.{layer}.{kind}"));
            }
            for expert in 0..experts {
                names.push(format!("layers.{layer}.moe.experts.{expert}.w.weight"));
            }
        }
        let map = LayerMap::build(
            names
                .iter()
                .enumerate()
                .map(|(i, n)| (u32::try_from(i).unwrap(), n.as_str())),
        );
        let mut values = Values::new(names.len());
        for (tensor, name) in names.iter().enumerate() {
            // Each tensor's own values, so that no two experts are copies by accident.
            let jitter = 1.0 + tensor as f32 * 1e-4;
            let std = std_of(name).unwrap_or(1.0) * jitter;
            values.record(tensor, &Moments::of_f32(&[-std, std]));
        }
        (map, values, names)
    }

    #[test]
    fn finds_the_tensor_far_from_its_row() {
        let (map, values, names) = model(12, 0, |name| {
            (name == "layers.7.mlp.down.weight").then_some(4.0)
        });
        let rows = map.rows(false, None);
        let analysis = Analysis::of(&map, &rows, &values, Measure::Std, None);
        assert_eq!(analysis.outliers.len(), 1, "{:?}", analysis.outliers);
        let outlier = &analysis.outliers[0];
        assert_eq!(names[outlier.tensor as usize], "layers.7.mlp.down.weight");
        assert!(matches!(outlier.problem, Problem::Deviant { z, .. } if z > 50.0));
        let findings = analysis.findings(&map, &rows, Measure::Std, |t| &names[t as usize]);
        assert_eq!(findings[0].code, Code::MapOutlier);
        assert!(
            findings[0]
                .message
                .starts_with("std 4.009e0 in layer 7 is 4.0x the median 1.002e0"),
            "{}",
            findings[0].message
        );
    }

    #[test]
    fn finds_dead_constant_and_copied_experts() {
        let (map, mut values, names) = model(5, 4, |_| None);
        let index_of = |name: &str| names.iter().position(|n| n == name).unwrap();
        values.record(
            index_of("layers.2.moe.experts.1.w.weight"),
            &Moments::of_f32(&[0.0, 0.0]),
        );
        values.record(
            index_of("layers.3.moe.experts.2.w.weight"),
            &Moments::of_f32(&[0.5, 0.5]),
        );
        let original = values.stats(index_of("layers.4.moe.experts.0.w.weight"));
        let copy = index_of("layers.4.moe.experts.3.w.weight");
        values.record(copy, &Moments::of_f32(&[-1.0004, 1.0004]));
        assert_ne!(values.stats(copy), original);
        let source = index_of("layers.4.moe.experts.0.w.weight");
        values.record(copy, &Moments::of_f32(&[-1.0, 1.0]));
        values.record(source, &Moments::of_f32(&[-1.0, 1.0]));
        let rows = map.rows(true, None);
        let analysis = Analysis::of(&map, &rows, &values, Measure::Std, None);
        let problems: Vec<(&Problem, u64)> = analysis
            .outliers
            .iter()
            .filter(|o| !matches!(o.problem, Problem::Deviant { .. }))
            .map(|o| (&o.problem, map.columns[o.cell().unwrap().1]))
            .collect();
        assert_eq!(
            problems,
            [
                (&Problem::DeadExperts(vec![1]), 2),
                (&Problem::ConstantExperts(vec![2]), 3),
                (
                    &Problem::Copies {
                        pairs: vec![(3, 0)],
                        confirmed: false
                    },
                    4
                ),
            ]
        );
        let differ: &dyn Fn(u32, u32) -> Option<bool> = &|_, _| Some(false);
        let confirmed = Analysis::of(&map, &rows, &values, Measure::Std, Some(differ));
        assert!(
            !confirmed
                .outliers
                .iter()
                .any(|o| matches!(o.problem, Problem::Copies { .. }))
        );
    }

    #[test]
    fn finds_a_band_of_layers() {
        let (map, values, _) = model(20, 0, |name| {
            let layer: u32 = name.split('.').nth(1)?.parse().ok()?;
            (12..15).contains(&layer).then_some(3.0)
        });
        let rows = map.rows(false, None);
        let analysis = Analysis::of(&map, &rows, &values, Measure::Std, None);
        let bands: Vec<String> = analysis
            .outliers
            .iter()
            .filter(|o| matches!(o.problem, Problem::Band { .. }))
            .map(|o| Described(o, &map, &rows, Measure::Std).to_string())
            .collect();
        assert_eq!(bands.len(), 1);
        assert!(
            bands[0].starts_with("layers 12-14: most of 3 rows"),
            "{}",
            bands[0]
        );
    }
}
