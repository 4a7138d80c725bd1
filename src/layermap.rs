//! The layer map: a model laid out as a grid, one column per layer and one row per kind of tensor
//! within a layer (`self_attn.q_proj.weight`), with the tensors outside layers in a strip of their
//! own. Experts are an axis of their own: one row per expert, or their kind folded into one row.
//!
//! Pure data: the grid holds tensor indexes, [`Values`] a few single-precision measures per
//! tensor, and [`analysis`] the scale and what stands out. Drawing is the explorer's and
//! `report`'s business.

pub mod analysis;

use crate::analysis::Moments;
use crate::text::natural_cmp;
use foldhash::HashMap;

pub use analysis::{Analysis, Outlier, Problem, Scale};

/// No tensor at this place of the grid.
pub const NONE: u32 = u32::MAX;

/// Where a tensor sits in the map: its stack of layers, its layer and its kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place<'a> {
    /// The name before the layer number (`model.layers`).
    pub stack: &'a str,
    pub layer: u64,
    /// The name after the layer number, expert number included (`mlp.experts.7.w1.weight`).
    pub kind: &'a str,
    /// The expert number within `kind`, and where its digits are.
    pub expert: Option<(u32, std::ops::Range<usize>)>,
}

/// Where a tensor sits in the map, from its name alone; `None` for tensors outside layers.
///
/// The one place the map finds layers: the layer is the name's first numeric part (as the layer
/// checks find it), and an expert a numeric part after `experts`, or `expert_N` there (as the
/// architectures' tensor kinds write it). Other numbers after the layer's are part of the kind: T5's `layer.1`, a
/// sequential module's `mlp.0`.
pub fn place(name: &str) -> Option<Place<'_>> {
    let (stack, layer, kind) = crate::arch::split_at_layer(name)?;
    let mut start = 0;
    let mut expert = None;
    let mut previous = "";
    for part in kind.split('.') {
        let end = start + part.len();
        if previous == "experts"
            && let Some((number, digits)) = crate::arch::expert_part(part)
            && let Ok(number) = u32::try_from(number)
        {
            expert = Some((number, start + digits..end));
            break;
        }
        previous = part;
        start = end + 1;
    }
    Some(Place {
        stack,
        layer,
        kind,
        expert,
    })
}

/// A kind of tensor in a layer: one row, or one row per expert.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kind {
    pub stack: String,
    /// The name after the layer number, `*` in place of the expert number.
    pub pattern: String,
    /// Where the `*` is in `pattern`, for a kind with experts.
    star: Option<usize>,
    /// The expert numbers, ascending; empty for a kind without experts.
    pub experts: Vec<u32>,
    /// The first row of this kind in the expanded grid.
    first_row: u32,
}

impl Kind {
    fn rows(&self) -> usize {
        self.experts.len().max(1)
    }
}

/// A row of the map as shown: a kind, or one expert of a kind (an index into its experts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Row {
    pub kind: u32,
    pub expert: Option<u32>,
}

/// The grid: tensor indexes by row (kind and expert) and column (layer).
#[derive(Clone, Debug, Default)]
pub struct LayerMap {
    /// Layer numbers, ascending.
    pub columns: Vec<u64>,
    pub kinds: Vec<Kind>,
    /// Tensor of each expanded row and column, row after row; [`NONE`] where a layer lacks it.
    cells: Vec<u32>,
    /// Tensors outside layers, in natural order of their names.
    pub strip: Vec<u32>,
    /// Whether the model has more than one stack of layers, whose names then start the labels.
    several_stacks: bool,
}

impl LayerMap {
    /// The map of `tensors`, given as `(index, name)`.
    pub fn build<'a>(tensors: impl IntoIterator<Item = (u32, &'a str)>) -> LayerMap {
        // (stack, pattern before the expert, after it, has experts) -> kind id
        let mut ids: HashMap<(&str, &str, &str, bool), u32> = HashMap::default();
        let mut kinds: Vec<(&str, &str, &str, bool)> = Vec::new();
        // (kind id, expert, layer, tensor)
        let mut placed: Vec<(u32, u32, u64, u32)> = Vec::new();
        let mut strip: Vec<(u32, &str)> = Vec::new();
        for (tensor, name) in tensors {
            let Some(place) = place(name) else {
                strip.push((tensor, name));
                continue;
            };
            let (key, expert) = match &place.expert {
                Some((number, digits)) => (
                    (
                        place.stack,
                        &place.kind[..digits.start],
                        &place.kind[digits.end..],
                        true,
                    ),
                    *number,
                ),
                None => ((place.stack, place.kind, "", false), 0),
            };
            let id = *ids.entry(key).or_insert_with(|| {
                kinds.push(key);
                u32::try_from(kinds.len() - 1).unwrap_or(u32::MAX)
            });
            placed.push((id, expert, place.layer, tensor));
        }
        let several_stacks = kinds.windows(2).any(|pair| pair[0].0 != pair[1].0);
        let mut order: Vec<u32> = (0..u32::try_from(kinds.len()).unwrap_or(u32::MAX)).collect();
        order.sort_by(|&a, &b| {
            let (a, b) = (kinds[a as usize], kinds[b as usize]);
            natural_cmp(a.0, b.0)
                .then_with(|| natural_cmp(a.1, b.1))
                .then_with(|| natural_cmp(a.2, b.2))
        });
        let mut rank = vec![0u32; kinds.len()];
        for (position, &id) in order.iter().enumerate() {
            rank[id as usize] = u32::try_from(position).unwrap_or(u32::MAX);
        }
        for entry in &mut placed {
            entry.0 = rank[entry.0 as usize];
        }
        placed.sort_unstable();
        let mut columns: Vec<u64> = placed.iter().map(|&(_, _, layer, _)| layer).collect();
        columns.sort_unstable();
        columns.dedup();
        let mut built: Vec<Kind> = order
            .iter()
            .map(|&id| {
                let (stack, before, after, experts) = kinds[id as usize];
                Kind {
                    stack: stack.to_owned(),
                    pattern: if experts {
                        format!("{before}*{after}")
                    } else {
                        before.to_owned()
                    },
                    star: experts.then_some(before.len()),
                    experts: Vec::new(),
                    first_row: 0,
                }
            })
            .collect();
        for group in placed.chunk_by(|a, b| a.0 == b.0) {
            let kind = &mut built[group[0].0 as usize];
            if kind.star.is_some() {
                kind.experts = group.iter().map(|&(_, expert, _, _)| expert).collect();
                kind.experts.dedup();
            }
        }
        let mut rows = 0u32;
        for kind in &mut built {
            kind.first_row = rows;
            rows = rows.saturating_add(u32::try_from(kind.rows()).unwrap_or(u32::MAX));
        }
        let width = columns.len();
        // Names can make a grid far larger than the model (a new kind in each new layer): such
        // names are no stack of layers, and the map of them is left empty.
        if (rows as usize).saturating_mul(width) > placed.len().saturating_mul(2) + (1 << 20) {
            return LayerMap::default();
        }
        let mut cells = vec![NONE; rows as usize * width];
        for &(kind, expert, layer, tensor) in &placed {
            let kind = &built[kind as usize];
            let row =
                kind.first_row as usize + kind.experts.binary_search(&expert).unwrap_or_default();
            let column = columns.binary_search(&layer).unwrap_or_default();
            let cell = &mut cells[row * width + column];
            if *cell == NONE {
                *cell = tensor;
            }
        }
        strip.sort_by(|a, b| natural_cmp(a.1, b.1));
        LayerMap {
            columns,
            kinds: built,
            cells,
            strip: strip.into_iter().map(|(tensor, _)| tensor).collect(),
            several_stacks,
        }
    }

    /// Whether any kind has experts.
    pub fn has_experts(&self) -> bool {
        self.kinds.iter().any(|kind| kind.star.is_some())
    }

    /// The rows shown: every kind, each expert on a row of its own unless `folded`, only those
    /// whose label contains `filter` (lower case) when there is one.
    pub fn rows(&self, folded: bool, filter: Option<&str>) -> Vec<Row> {
        let mut rows = Vec::new();
        for (id, kind) in self.kinds.iter().enumerate() {
            let id = u32::try_from(id).unwrap_or(u32::MAX);
            let shown = |row: Row| {
                filter.is_none_or(|needle| {
                    crate::text::contains_ignore_case(&self.label(row), needle)
                })
            };
            if kind.experts.is_empty() || folded {
                let row = Row {
                    kind: id,
                    expert: None,
                };
                if shown(row) {
                    rows.push(row);
                }
            } else {
                for expert in 0..kind.experts.len() {
                    let row = Row {
                        kind: id,
                        expert: Some(u32::try_from(expert).unwrap_or(u32::MAX)),
                    };
                    if shown(row) {
                        rows.push(row);
                    }
                }
            }
        }
        rows
    }

    /// A row's label: the kind, with the expert's number or `*` for a folded row, after the
    /// stack when the model has several.
    pub fn label(&self, row: Row) -> String {
        let kind = &self.kinds[row.kind as usize];
        let pattern = match (kind.star, row.expert) {
            (Some(star), Some(expert)) => format!(
                "{}{}{}",
                &kind.pattern[..star],
                kind.experts[expert as usize],
                &kind.pattern[star + 1..]
            ),
            _ => kind.pattern.clone(),
        };
        if self.several_stacks {
            format!("{}.*.{pattern}", kind.stack)
        } else {
            pattern
        }
    }

    /// The tensors of a row's cell in `column`: one, or each expert's for a folded row.
    pub fn tensors(&self, row: Row, column: usize) -> impl Iterator<Item = u32> + '_ {
        let kind = &self.kinds[row.kind as usize];
        let rows = match row.expert {
            Some(expert) => {
                let row = kind.first_row as usize + expert as usize;
                row..row + 1
            }
            None => kind.first_row as usize..kind.first_row as usize + kind.rows(),
        };
        let width = self.columns.len();
        rows.map(move |row| self.cells[row * width + column])
            .filter(|&tensor| tensor != NONE)
    }

    /// The tensors of a row that shows one tensor a cell (an expert's, or a kind's without
    /// experts), column by column ([`NONE`] where a layer lacks it); `None` for a folded row.
    pub fn row_tensors(&self, row: Row) -> Option<&[u32]> {
        let kind = &self.kinds[row.kind as usize];
        let at = match row.expert {
            Some(expert) => kind.first_row as usize + expert as usize,
            None if kind.experts.len() < 2 => kind.first_row as usize,
            None => return None,
        };
        let width = self.columns.len();
        self.cells.get(at * width..(at + 1) * width)
    }

    /// The cell of `row` in `column` by `measure`. A folded row shows its worst expert: one with
    /// NaN/Inf or unreadable, or else the one furthest from the experts' median.
    pub fn cell(&self, values: &Values, row: Row, column: usize, measure: Measure) -> Cell {
        let mut tensors = self.tensors(row, column);
        let Some(first) = tensors.next() else {
            return Cell::MISSING;
        };
        let state = |tensor: u32| values.get(tensor as usize, measure);
        let first = Cell {
            tensor: first,
            state: state(first),
        };
        if row.expert.is_some() || self.kinds[row.kind as usize].experts.len() < 2 {
            return first;
        }
        // The worst state (broken first, then values, then pending), and the measured experts.
        let mut worst = first;
        let mut measured: Vec<(u32, f32)> =
            Vec::with_capacity(self.kinds[row.kind as usize].experts.len());
        for cell in std::iter::once(first).chain(tensors.map(|tensor| Cell {
            tensor,
            state: state(tensor),
        })) {
            if let State::Value(value) = cell.state {
                measured.push((cell.tensor, value));
            }
            if cell.state.rank() > worst.state.rank() {
                worst = cell;
            }
        }
        if !matches!(worst.state, State::Value(_)) {
            return worst;
        }
        let middle = measured.len() / 2;
        let centre = measured
            .select_nth_unstable_by(middle, |a, b| a.1.total_cmp(&b.1))
            .1
            .1;
        let mut furthest = (measured[0], -1.0f32);
        for &(tensor, value) in &measured {
            let distance = measure.distance(value, centre);
            if distance > furthest.1 {
                furthest = ((tensor, value), distance);
            }
        }
        Cell {
            tensor: furthest.0.0,
            state: State::Value(furthest.0.1),
        }
    }

    /// The row (among `rows`) and column where `tensor` is shown.
    pub fn position(&self, rows: &[Row], tensor: u32) -> Option<(usize, usize)> {
        rows.iter().enumerate().find_map(|(index, &row)| {
            (0..self.columns.len())
                .find(|&column| self.tensors(row, column).any(|t| t == tensor))
                .map(|column| (index, column))
        })
    }

    /// How many tensors the grid holds, as rows by columns (expanded).
    pub fn expanded_rows(&self) -> usize {
        self.kinds.iter().map(Kind::rows).sum()
    }
}

/// What a cell shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    Std,
    Absmax,
    Mean,
    /// The share of elements that are zero.
    Zeros,
    /// With `--diff`: the relative L2 change from the other model.
    Change,
    /// The quantization preview's signal-to-noise ratio, in dB.
    Snr,
}

impl Measure {
    pub const ALL: [Measure; 6] = [
        Measure::Std,
        Measure::Absmax,
        Measure::Mean,
        Measure::Zeros,
        Measure::Change,
        Measure::Snr,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Measure::Std => "std",
            Measure::Absmax => "absmax",
            Measure::Mean => "mean",
            Measure::Zeros => "zeros",
            Measure::Change => "change",
            Measure::Snr => "snr",
        }
    }

    /// Whether values spread over orders of magnitude, so that outliers are judged by ratio.
    const fn is_magnitude(self) -> bool {
        matches!(self, Measure::Std | Measure::Absmax | Measure::Change)
    }

    /// How far `value` is from `centre`: by ratio for measures of magnitude (as their logarithms
    /// would be, without taking them), by difference for the others.
    fn distance(self, value: f32, centre: f32) -> f32 {
        if !self.is_magnitude() {
            return (value - centre).abs();
        }
        if centre <= 0.0 || value <= 0.0 {
            return if value == centre { 0.0 } else { f32::INFINITY };
        }
        (value / centre).max(centre / value)
    }

    /// The value outliers are judged on: its logarithm for measures of magnitude.
    fn judged(self, value: f32) -> f32 {
        if self.is_magnitude() {
            value.max(f32::MIN_POSITIVE).ln()
        } else {
            value
        }
    }
}

/// A cell: the tensor shown (the worst expert of a folded row) and what it holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cell {
    /// [`NONE`] where the layer has no such tensor.
    pub tensor: u32,
    pub state: State,
}

impl Cell {
    pub const MISSING: Cell = Cell {
        tensor: NONE,
        state: State::Missing,
    };
}

/// What is known of a tensor by one measure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum State {
    Missing,
    /// Not scanned yet.
    Pending,
    /// Its bytes could not be read.
    Failed,
    /// It holds NaN or Inf (whatever the measure).
    NonFinite,
    /// Scanned, but the measure has no value (no diff or preview of it, or no finite value).
    Unmeasured,
    Value(f32),
}

impl State {
    /// How much a state says, for folding experts: NaN/Inf and unreadable first, then values.
    const fn rank(self) -> u8 {
        match self {
            State::NonFinite => 5,
            State::Failed => 4,
            State::Value(_) => 3,
            State::Pending => 2,
            State::Unmeasured => 1,
            State::Missing => 0,
        }
    }
}

/// The characters cells are drawn with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Glyphs {
    /// Low to high.
    pub shades: [char; 4],
    pub pending: char,
    pub non_finite: char,
    pub failed: char,
    pub unmeasured: char,
}

impl Glyphs {
    pub const UNICODE: Glyphs = Glyphs {
        shades: ['░', '▒', '▓', '█'],
        pending: '·',
        non_finite: '!',
        failed: 'x',
        unmeasured: '-',
    };
    pub const ASCII: Glyphs = Glyphs {
        shades: [':', '+', '*', '#'],
        pending: '.',
        non_finite: '!',
        failed: 'x',
        unmeasured: '-',
    };

    /// The character of a cell, and its shade (from 0) when it has a value.
    pub fn of(&self, state: State, scale: Option<&Scale>) -> (char, Option<usize>) {
        match state {
            State::Missing => (' ', None),
            State::Pending => (self.pending, None),
            State::Failed => (self.failed, None),
            State::NonFinite => (self.non_finite, None),
            State::Unmeasured => (self.unmeasured, None),
            State::Value(value) => {
                let level = scale.map_or(0, |scale| scale.level(value, self.shades.len()));
                (self.shades[level], Some(level))
            }
        }
    }
}

const SCANNED: u8 = 1;
const NON_FINITE: u8 = 2;
const FAILED: u8 = 4;

/// The measures of each tensor, a few bytes each: a model can have a million tensors.
#[derive(Clone, Debug, Default)]
pub struct Values {
    /// std, absmax, mean and zero share, by tensor; empty until the first is recorded.
    stats: Vec<[f32; 4]>,
    flags: Vec<u8>,
    /// Relative L2 change, by tensor (NaN where unknown); empty without a diff.
    change: Vec<f32>,
    /// Preview SNR in dB, by tensor (NaN where unknown); empty without a preview.
    snr: Vec<f32>,
    /// Bumped on every change, so views know when to work things out again.
    pub generation: u64,
}

#[expect(
    clippy::cast_possible_truncation,
    reason = "the map keeps single precision, ample for shading and ranking"
)]
fn single(value: f64) -> f32 {
    value as f32
}

impl Values {
    /// Room for `tensors` tensors.
    /// Room for the values of `tensors`, when one of them is in a layer: a model whose names
    /// have no layer has no map to show, and keeps nothing.
    pub fn for_names<'a>(tensors: usize, mut names: impl Iterator<Item = &'a str>) -> Values {
        if names.any(|name| place(name).is_some()) {
            Values::new(tensors)
        } else {
            Values::default()
        }
    }

    /// True when no tensor has room for values (see [`Values::for_names`]).
    pub fn is_empty(&self) -> bool {
        self.stats.is_empty()
    }

    pub fn new(tensors: usize) -> Values {
        Values {
            stats: vec![[f32::NAN; 4]; tensors],
            flags: vec![0; tensors],
            ..Values::default()
        }
    }

    /// Records a tensor's statistics.
    pub fn record(&mut self, tensor: usize, moments: &Moments) {
        let Some(slot) = self.stats.get_mut(tensor) else {
            return;
        };
        let zeros = if moments.count == 0 {
            f64::NAN
        } else {
            moments.zeros as f64 / moments.count as f64
        };
        *slot = [
            single(moments.std().unwrap_or(f64::NAN)),
            single(moments.absmax().unwrap_or(f64::NAN)),
            single(moments.mean().unwrap_or(f64::NAN)),
            single(zeros),
        ];
        let non_finite = moments.nan + moments.pos_inf + moments.neg_inf > 0;
        self.flags[tensor] = SCANNED | if non_finite { NON_FINITE } else { 0 };
        self.generation += 1;
    }

    /// Records that a tensor's bytes could not be read.
    pub fn record_failed(&mut self, tensor: usize) {
        if let Some(flags) = self.flags.get_mut(tensor) {
            *flags = SCANNED | FAILED;
            self.generation += 1;
        }
    }

    /// Records the relative L2 change of a tensor from the diff's other model.
    pub fn record_change(&mut self, tensor: usize, relative_l2: f64) {
        record_in(&mut self.change, self.flags.len(), tensor, relative_l2);
        self.generation += 1;
    }

    /// Records the quantization preview's SNR of a tensor.
    pub fn record_snr(&mut self, tensor: usize, snr_db: f64) {
        record_in(&mut self.snr, self.flags.len(), tensor, snr_db);
        self.generation += 1;
    }

    /// The measures that have values: the diff's and the preview's only once recorded.
    pub fn measures(&self) -> impl Iterator<Item = Measure> + '_ {
        Measure::ALL.into_iter().filter(|&measure| match measure {
            Measure::Change => !self.change.is_empty(),
            Measure::Snr => !self.snr.is_empty(),
            _ => true,
        })
    }

    /// What is known of `tensor` by `measure`.
    pub fn get(&self, tensor: usize, measure: Measure) -> State {
        let flags = self.flags.get(tensor).copied().unwrap_or(0);
        if flags & FAILED != 0 {
            return State::Failed;
        }
        if flags & NON_FINITE != 0 {
            return State::NonFinite;
        }
        let value = match measure {
            Measure::Change => self.change.get(tensor).copied(),
            Measure::Snr => self.snr.get(tensor).copied(),
            _ if flags & SCANNED == 0 => return State::Pending,
            Measure::Std => Some(self.stats[tensor][0]),
            Measure::Absmax => Some(self.stats[tensor][1]),
            Measure::Mean => Some(self.stats[tensor][2]),
            Measure::Zeros => Some(self.stats[tensor][3]),
        };
        match value {
            Some(value) if !value.is_nan() => State::Value(value),
            _ if flags & SCANNED == 0 => State::Pending,
            _ => State::Unmeasured,
        }
    }

    /// The four statistics of a scanned tensor (std, absmax, mean, zero share).
    pub fn stats(&self, tensor: usize) -> Option<[f32; 4]> {
        let flags = self.flags.get(tensor).copied().unwrap_or(0);
        (flags & SCANNED != 0 && flags & FAILED == 0).then(|| self.stats[tensor])
    }
}

fn record_in(list: &mut Vec<f32>, len: usize, tensor: usize, value: f64) {
    if list.is_empty() {
        *list = vec![f32::NAN; len];
    }
    if let Some(slot) = list.get_mut(tensor) {
        *slot = single(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each row's label, experts not folded.
    fn unfolded_labels(map: &LayerMap) -> Vec<String> {
        map.rows(false, None)
            .into_iter()
            .map(|row| map.label(row))
            .collect()
    }

    fn names(names: &[&str]) -> LayerMap {
        LayerMap::build(
            names
                .iter()
                .enumerate()
                .map(|(i, name)| (u32::try_from(i).unwrap(), *name)),
        )
    }

    #[test]
    fn places_layers_and_experts() {
        let place = place("model.layers.3.mlp.experts.17.down_proj.weight").unwrap();
        assert_eq!(place.stack, "model.layers");
        assert_eq!(place.layer, 3);
        assert_eq!(place.kind, "mlp.experts.17.down_proj.weight");
        let (number, digits) = place.expert.unwrap();
        assert_eq!(number, 17);
        assert_eq!(&place.kind[digits], "17");
        assert!(super::place("lm_head.weight").is_none());
    }

    #[test]
    fn lays_out_layers_across_and_kinds_down() {
        let map = names(&[
            "model.embed_tokens.weight",
            "model.layers.10.mlp.down_proj.weight",
            "model.layers.2.mlp.down_proj.weight",
            "model.layers.2.self_attn.q_proj.weight",
            "model.layers.10.self_attn.q_proj.weight",
            "model.layers.2.mlp.experts.1.w.weight",
            "model.layers.2.mlp.experts.0.w.weight",
            "lm_head.weight",
        ]);
        assert_eq!(map.columns, [2, 10]);
        assert_eq!(map.strip, [7, 0], "natural order of names");
        let labels = unfolded_labels(&map);
        assert_eq!(
            labels,
            [
                "mlp.down_proj.weight",
                "mlp.experts.0.w.weight",
                "mlp.experts.1.w.weight",
                "self_attn.q_proj.weight"
            ]
        );
        let folded = map.rows(true, None);
        assert_eq!(map.label(folded[1]), "mlp.experts.*.w.weight");
        assert_eq!(map.tensors(folded[1], 0).collect::<Vec<_>>(), [6, 5]);
        assert_eq!(map.tensors(folded[1], 1).count(), 0);
        assert_eq!(map.tensors(folded[0], 1).collect::<Vec<_>>(), [1]);
        let filtered = map.rows(true, Some("attn"));
        assert_eq!(filtered.len(), 1);
        assert_eq!(map.position(&folded, 4), Some((2, 1)));
    }

    #[test]
    fn stacks_are_rows_of_their_own_and_experts_are_numbered_after_experts() {
        let map = names(&[
            "model.encoder.layers.0.self_attn.q_proj.weight",
            "model.decoder.layers.0.self_attn.q_proj.weight",
            "vision_tower.encoder.layers.1.mlp.fc1.weight",
            "encoder.block.0.layer.1.DenseReluDense.wi.weight",
            "encoder.block.0.layer.0.SelfAttention.q.weight",
            "model.decoder.layers.1.mlp.0.weight",
        ]);
        assert!(
            !map.has_experts(),
            "T5's `layer.1` and `mlp.0` are no experts"
        );
        let labels = unfolded_labels(&map);
        assert_eq!(
            labels,
            [
                "encoder.block.*.layer.0.SelfAttention.q.weight",
                "encoder.block.*.layer.1.DenseReluDense.wi.weight",
                "model.decoder.layers.*.mlp.0.weight",
                "model.decoder.layers.*.self_attn.q_proj.weight",
                "model.encoder.layers.*.self_attn.q_proj.weight",
                "vision_tower.encoder.layers.*.mlp.fc1.weight",
            ]
        );
        let rows = map.rows(false, None);
        assert_eq!(map.position(&rows, 0), Some((4, 0)));
        assert_eq!(map.position(&rows, 1), Some((3, 0)));
        assert_eq!(map.position(&rows, 2), Some((5, 1)));
    }

    #[test]
    fn names_that_make_no_grid_make_an_empty_map() {
        let names: Vec<String> = (0..2_000).map(|i| format!("a.{i}.kind{i}")).collect();
        let map = LayerMap::build(
            names
                .iter()
                .enumerate()
                .map(|(i, n)| (u32::try_from(i).unwrap(), n.as_str())),
        );
        assert!(map.columns.is_empty() && map.kinds.is_empty() && map.strip.is_empty());
    }

    #[test]
    fn a_folded_row_shows_its_worst_expert_and_problems_first() {
        let map = names(&["l.0.experts.0.w", "l.0.experts.1.w", "l.0.experts.2.w"]);
        let mut values = Values::new(3);
        values.record(0, &Moments::of_f32(&[1.0, -1.0]));
        values.record(1, &Moments::of_f32(&[3.0, -3.0]));
        let row = map.rows(true, None)[0];
        values.record(2, &Moments::of_f32(&[1.1, -1.1]));
        let cell = map.cell(&values, row, 0, Measure::Std);
        assert_eq!(
            (cell.tensor, cell.state),
            (1, State::Value(3.0)),
            "the furthest from the median"
        );
        values.record(2, &Moments::of_f32(&[f32::NAN, 0.0]));
        assert_eq!(
            map.cell(&values, row, 0, Measure::Std).state,
            State::NonFinite
        );
        assert_eq!(values.get(2, Measure::Zeros), State::NonFinite);
        assert_eq!(Values::new(3).get(0, Measure::Std), State::Pending);
        assert_eq!(values.get(0, Measure::Change), State::Unmeasured);
        assert_eq!(values.measures().count(), 4);
        values.record_change(0, 0.5);
        assert_eq!(values.get(0, Measure::Change), State::Value(0.5));
        assert_eq!(values.measures().count(), 5);
    }
}
