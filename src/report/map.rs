//! `stui stats --map`: the layer map as text (shade blocks, or plain characters) or as JSON numbers.

use super::write_json;
use crate::finding::Finding;
use crate::format::model::Model;
use crate::layermap::analysis::Described;
use crate::layermap::{Analysis, Glyphs, LayerMap, Measure, Problem, Row, Scale, State, Values};
use crate::text::{Counted, escape};
use crate::text::{display_width, format_bytes};
use serde::Serialize;
use std::io::{self, Write};

/// A layer map to print, with what stands out in it.
#[derive(Clone, Copy, Debug)]
pub struct MapReport<'a> {
    pub model: &'a Model,
    pub map: &'a LayerMap,
    pub rows: &'a [Row],
    pub values: &'a Values,
    pub measure: Measure,
    pub analysis: &'a Analysis,
    pub findings: &'a [Finding],
    pub bytes_scanned: u64,
}

/// Labels wider than this are cut, so the grid stays in view.
const LABEL_WIDTH: usize = 60;

impl MapReport<'_> {
    pub fn write_text(&self, out: &mut dyn Write, glyphs: &Glyphs) -> io::Result<()> {
        let MapReport {
            model, map, rows, ..
        } = *self;
        let scale = self.analysis.scale.as_ref();
        writeln!(
            out,
            "{}: layer map by {}, {} x {}, {} scanned",
            escape(&model.path.to_string_lossy()),
            self.measure.name(),
            Counted(map.columns.len(), "layer"),
            Counted(rows.len(), "row"),
            format_bytes(self.bytes_scanned)
        )?;
        let labels: Vec<String> = rows
            .iter()
            .map(|&row| cut(&escape(&map.label(row)), LABEL_WIDTH))
            .collect();
        let width = labels
            .iter()
            .map(|l| display_width(l))
            .max()
            .unwrap_or(0)
            .max(5);
        writeln!(out)?;
        for line in layer_numbers(&map.columns) {
            writeln!(out, "{:width$}  {line}", "")?;
        }
        for (label, &row) in labels.iter().zip(rows) {
            let cells: String = (0..map.columns.len())
                .map(|column| {
                    glyphs
                        .of(
                            map.cell(self.values, row, column, self.measure).state,
                            scale,
                        )
                        .0
                })
                .collect();
            let pad = width - display_width(label);
            writeln!(out, "{label}{:pad$}  {}", "", cells.trim_end())?;
        }
        if !map.strip.is_empty() {
            writeln!(out, "\noutside layers")?;
            for &tensor in &map.strip {
                let name = cut(&escape(model.tensors[tensor as usize].name()), LABEL_WIDTH);
                let state = self.values.get(tensor as usize, self.measure);
                let (glyph, _) = glyphs.of(state, scale);
                let pad = width.saturating_sub(display_width(&name) + 2);
                writeln!(out, "  {name}{:pad$}  {glyph}  {}", "", value_text(state))?;
            }
        }
        writeln!(out, "\n{}", legend(glyphs, scale))?;
        if self.analysis.outliers.is_empty() {
            writeln!(out, "\nnothing stands out by {}", self.measure.name())?;
        } else {
            writeln!(out, "\noutliers by {}", self.measure.name())?;
            for outlier in &self.analysis.outliers {
                let mark = match outlier.problem {
                    Problem::NonFinite | Problem::Failed => glyphs.non_finite,
                    _ => '~',
                };
                let described = Described(outlier, map, rows, self.measure);
                if matches!(outlier.problem, Problem::Band { .. }) {
                    writeln!(out, "  {mark} {described}")?;
                } else {
                    let name = escape(model.tensors[outlier.tensor as usize].name());
                    writeln!(out, "  {mark} {name}: {described}")?;
                }
            }
        }
        if !self.findings.is_empty() {
            writeln!(out)?;
            for finding in self.findings {
                super::write_finding(out, finding)?;
            }
        }
        Ok(())
    }

    pub fn write_json(&self, out: &mut dyn Write) -> io::Result<()> {
        let MapReport {
            model,
            map,
            rows,
            values,
            measure,
            ..
        } = *self;
        let number = |state: State| match state {
            State::Value(value) => Some(value),
            _ => None,
        };
        let problem = |state: State| match state {
            State::NonFinite => Some("nan-or-inf"),
            State::Failed => Some("unreadable"),
            State::Pending => Some("pending"),
            _ => None,
        };
        let json = MapJson {
            path: model.path.to_string_lossy().into_owned(),
            measure: measure.name(),
            scale: self.analysis.scale.map(|scale| ScaleJson {
                kind: if scale.log { "log" } else { "linear" },
                low: scale.low,
                high: scale.high,
            }),
            columns: &map.columns,
            rows: rows
                .iter()
                .map(|&row| {
                    let cells: Vec<_> = (0..map.columns.len())
                        .map(|column| map.cell(values, row, column, measure))
                        .collect();
                    RowJson {
                        label: map.label(row),
                        values: cells.iter().map(|c| number(c.state)).collect(),
                        problems: cells
                            .iter()
                            .enumerate()
                            .filter_map(|(column, c)| {
                                problem(c.state).map(|p| (map.columns[column], p))
                            })
                            .collect(),
                    }
                })
                .collect(),
            outside: map
                .strip
                .iter()
                .map(|&tensor| {
                    let state = values.get(tensor as usize, measure);
                    OutsideJson {
                        name: model.tensors[tensor as usize].name(),
                        value: number(state),
                        problem: problem(state),
                    }
                })
                .collect(),
            outliers: self
                .analysis
                .outliers
                .iter()
                .map(|outlier| OutlierJson {
                    kind: match outlier.problem {
                        Problem::NonFinite => "nan-or-inf",
                        Problem::Failed => "unreadable",
                        Problem::Deviant { .. } => "deviant",
                        Problem::DeadExperts(_) => "dead-experts",
                        Problem::ConstantExperts(_) => "constant-experts",
                        Problem::Copies { .. } => "copied-experts",
                        Problem::Band { .. } => "band",
                    },
                    row: outlier.cell().map(|(row, _)| map.label(rows[row])),
                    layer: outlier.cell().map(|(_, column)| map.columns[column]),
                    tensor: (outlier.tensor != crate::layermap::NONE)
                        .then(|| model.tensors[outlier.tensor as usize].name()),
                    z: match outlier.problem {
                        Problem::Deviant { z, .. } | Problem::Band { z, .. } => Some(z),
                        _ => None,
                    },
                    message: Described(outlier, map, rows, measure).to_string(),
                })
                .collect(),
            findings: self.findings,
        };
        write_json(out, &json)
    }
}

#[derive(Serialize)]
struct MapJson<'a> {
    path: String,
    measure: &'static str,
    scale: Option<ScaleJson>,
    columns: &'a [u64],
    rows: Vec<RowJson>,
    outside: Vec<OutsideJson<'a>>,
    outliers: Vec<OutlierJson<'a>>,
    findings: &'a [Finding],
}

#[derive(Serialize)]
struct ScaleJson {
    kind: &'static str,
    low: f32,
    high: f32,
}

#[derive(Serialize)]
struct RowJson {
    label: String,
    /// One per column: null where the layer has no such tensor or it has no value.
    values: Vec<Option<f32>>,
    /// `(layer, what)` for cells with NaN/Inf, unreadable or not scanned.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    problems: Vec<(u64, &'static str)>,
}

#[derive(Serialize)]
struct OutsideJson<'a> {
    name: &'a str,
    value: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    problem: Option<&'static str>,
}

#[derive(Serialize)]
struct OutlierJson<'a> {
    kind: &'static str,
    /// The row and layer in the grid; neither for a tensor outside layers.
    #[serde(skip_serializing_if = "Option::is_none")]
    row: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    layer: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tensor: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    z: Option<f32>,
    message: String,
}

/// The legend: the shades from low to high with the scale's ends, and the other marks.
pub fn legend(glyphs: &Glyphs, scale: Option<&Scale>) -> String {
    let shades: String = glyphs.shades.iter().collect();
    let range = scale.map_or_else(
        || "no values yet".to_owned(),
        |scale| {
            format!(
                "{} {:.3e} to {:.3e}",
                if scale.log { "log" } else { "linear" },
                scale.low,
                scale.high
            )
        },
    );
    format!(
        "{shades} {range}  {} pending  {} NaN/Inf  {} unreadable  {} no value",
        glyphs.pending, glyphs.non_finite, glyphs.failed, glyphs.unmeasured
    )
}

/// A state's value as text.
pub fn value_text(state: State) -> String {
    match state {
        State::Value(value) => format!("{value:.3e}"),
        State::Missing => "not in this layer".into(),
        State::Pending => "not scanned yet".into(),
        State::Failed => "unreadable".into(),
        State::NonFinite => "NaN/Inf".into(),
        State::Unmeasured => "no value".into(),
    }
}

/// Lines of layer numbers over the columns, read downwards: the last line the units, those above
/// a digit only where it changes.
pub fn layer_numbers(columns: &[u64]) -> Vec<String> {
    let digits = columns
        .iter()
        .map(|layer| layer.to_string().len())
        .max()
        .unwrap_or(1);
    (0..digits)
        .map(|line| {
            let power = 10u64.pow(u32::try_from(digits - 1 - line).unwrap_or(0));
            let mut previous = None;
            columns
                .iter()
                .map(|&layer| {
                    let above = layer / power;
                    let shown = line + 1 == digits || previous != Some(above);
                    previous = Some(above);
                    if shown && (above > 0 || line + 1 == digits) {
                        char::from_digit(u32::try_from(above % 10).unwrap_or(0), 10).unwrap_or(' ')
                    } else {
                        ' '
                    }
                })
                .collect::<String>()
                .trim_end()
                .to_owned()
        })
        .collect()
}

/// `text` cut to `width` columns, with `…` where it was cut.
fn cut(text: &str, width: usize) -> String {
    if display_width(text) <= width {
        return text.to_owned();
    }
    let mut kept = String::new();
    for c in text.chars() {
        if display_width(&kept) + 2 > width {
            break;
        }
        kept.push(c);
    }
    kept.push('…');
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_numbers_read_downwards() {
        let columns: Vec<u64> = (0..23).collect();
        assert_eq!(
            layer_numbers(&columns),
            ["          1         2", "01234567890123456789012"]
        );
        assert_eq!(layer_numbers(&[0, 1, 2]), ["012"]);
        assert_eq!(layer_numbers(&[98, 99, 100]), ["  1", "9 0", "890"]);
    }
}
