//! The layer map, in place of the tree, the details and the findings:
//!
//! ```text
//! ┌ layer map · std · layers 0-61 · experts folded ─────┐┌ outliers ─────────┐
//! │ layer 7 · model.layers.7.mlp.down_proj.weight 2e-1  ││ ! …: NaN or Inf   │
//! │ ░▒▓█ log 1e-3 to 1e-1  · pending  ! NaN/Inf …       ││ ~ …: 10.0x median │
//! │                          0         1         2      ││                   │
//! │                          0123456789012345678901     ││                   │
//! │ mlp.down_proj.weight     ░░░▒▒▒▓▓▓█!                ││                   │
//! │ outside: ▒ lm_head.weight  ▒ model.norm.weight      ││                   │
//! └─────────────────────────────────────────────────────┘└───────────────────┘
//! ```
//!
//! Narrower than 120 columns, the outliers go below the picture. Only the cells on screen are
//! looked up, one character each, written straight into the frame's buffer.

use super::{block, inner};
use crate::layermap::analysis::Described;
use crate::layermap::{Analysis, Glyphs, Problem, State};
use crate::report::{layer_numbers, legend, value_text};
use crate::text::{Counted, escape};
use crate::tui::app::{App, MapView, ScanState};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{List, Paragraph};

/// Wide enough for the outliers beside the picture.
const SIDE_BY_SIDE: u16 = 120;

pub fn render(frame: &mut Frame, area: Rect, app: &mut App) {
    let Some(mut view) = app.map.take() else {
        return;
    };
    let settled = app.scan != ScanState::Running;
    let (analysis, fresh) = view.take_analysis(&app.values, settled);
    let outliers_area = if area.width >= SIDE_BY_SIDE {
        let [picture, side] = area.layout(&Layout::horizontal([
            Constraint::Percentage(62),
            Constraint::Percentage(38),
        ]));
        render_picture(frame, picture, app, &mut view, (&analysis, fresh));
        side
    } else {
        let lines = if analysis.outliers.is_empty() && app.fetch_limit.is_some() {
            2
        } else {
            analysis.outliers.len().clamp(1, 4)
        };
        let below = u16::try_from(lines + 2).unwrap_or(6);
        let [picture, under] = area.layout(&Layout::vertical([
            Constraint::Min(8),
            Constraint::Length(below),
        ]));
        render_picture(frame, picture, app, &mut view, (&analysis, fresh));
        under
    };
    render_outliers(frame, outliers_area, app, &view, &analysis);
    view.put_back(analysis);
    app.map = Some(view);
}

fn render_picture(
    frame: &mut Frame,
    area: Rect,
    app: &App,
    view: &mut MapView,
    (analysis, fresh): (&Analysis, bool),
) {
    let theme = &app.theme;
    let map = &view.map;
    let glyphs = Glyphs::UNICODE;
    let title = title(view);
    frame.render_widget(block(&title, true, app), area);
    let inside = inner(area);
    if inside.height < 4 || inside.width < 12 {
        return;
    }
    let numbers = layer_numbers(&map.columns);
    let number_lines = u16::try_from(numbers.len()).unwrap_or(1);
    let strip_line = u16::from(!map.strip.is_empty());
    let [cursor_line, legend_line, numbers_area, grid, strip_area] =
        inside.layout(&Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(1),
            Constraint::Length(number_lines),
            Constraint::Min(1),
            Constraint::Length(strip_line),
        ]));
    let label_width = view.label_width.clamp(8, usize::from(inside.width / 2));
    let cells_x = inside.x + u16::try_from(label_width + 1).unwrap_or(0);
    let visible_columns = usize::from(inside.right().saturating_sub(cells_x)).max(1);
    let visible_rows = usize::from(grid.height).max(1);
    view.offset = (
        scrolled(view.offset.0, view.cursor.0, visible_rows, view.rows.len()),
        scrolled(
            view.offset.1,
            view.cursor.1,
            visible_columns,
            map.columns.len(),
        ),
    );
    let (first_row, first_column) = view.offset;
    let columns = first_column..map.columns.len().min(first_column + visible_columns);

    let cursor_text = cursor_text(app, view);
    frame.render_widget(
        Paragraph::new(Line::styled(cursor_text, theme.title)),
        cursor_line,
    );
    frame.render_widget(
        Paragraph::new(Line::styled(
            legend(&glyphs, analysis.scale.as_ref()),
            theme.dim,
        )),
        legend_line,
    );

    let buffer = frame.buffer_mut();
    for (line, text) in numbers.iter().enumerate() {
        let y = numbers_area.y + u16::try_from(line).unwrap_or(0);
        draw_layer_numbers(buffer, (cells_x, y), text, columns.clone(), view, app);
    }
    let problems: std::collections::HashSet<(usize, usize)> = analysis
        .outliers
        .iter()
        .filter(|o| matches!(o.problem, Problem::Deviant { .. }))
        .filter_map(crate::layermap::Outlier::cell)
        .collect();
    for (y, index) in (grid.y..grid.bottom()).zip(first_row..view.rows.len()) {
        let row = view.rows[index];
        let label = map.label(row);
        let label = escape(&label);
        let label_style = if index == view.cursor.0 && !view.in_strip {
            theme.cursor
        } else {
            theme.base
        };
        buffer.set_stringn(inside.x, y, &label, label_width, label_style);
        for (x, column) in (cells_x..).zip(columns.clone()) {
            // The analysis has every cell measured when it is fresh; otherwise those on screen
            // are looked up.
            let state = match analysis.cell(index, column) {
                Some(cell) if fresh => cell.state,
                _ => map.cell(&app.values, row, column, view.measure).state,
            };
            let (glyph, level) = glyphs.of(state, analysis.scale.as_ref());
            let mut style = match (state, level) {
                (State::NonFinite | State::Failed, _) => theme.broken,
                (_, Some(_)) if problems.contains(&(index, column)) => theme.outlier,
                (_, Some(level)) => theme.ramp[level],
                _ => theme.dim,
            };
            if (index, column) == view.cursor && !view.in_strip {
                style = style.patch(theme.cursor);
            }
            buffer[(x, y)].set_char(glyph).set_style(style);
        }
    }
    if strip_line > 0 {
        render_strip(frame, strip_area, app, view, analysis);
    }
}

/// The pane's title: the measure, the grid's size, how experts are shown and the row filter.
fn title(view: &MapView) -> String {
    let folding = if !view.map.has_experts() {
        ""
    } else if view.folded {
        " · experts folded (worst)"
    } else {
        " · a row per expert"
    };
    let filter = if view.filter.is_empty() {
        String::new()
    } else {
        format!(" · rows matching \"{}\"", escape(&view.filter))
    };
    format!(
        "layer map · {} · {} x {}{folding}{filter}",
        view.measure.name(),
        Counted(view.map.columns.len(), "layer"),
        Counted(view.rows.len(), "row")
    )
}

/// One line of layer numbers over the `columns` on screen, from `(x, y)`; the cursor's in its
/// style.
fn draw_layer_numbers(
    buffer: &mut ratatui::buffer::Buffer,
    (x, y): (u16, u16),
    text: &str,
    columns: std::ops::Range<usize>,
    view: &MapView,
    app: &App,
) {
    let digits: Vec<char> = text.chars().collect();
    for (x, column) in (x..).zip(columns) {
        if let Some(&digit) = digits.get(column).filter(|c| **c != ' ') {
            let style = if column == view.cursor.1 && !view.in_strip {
                app.theme.cursor
            } else {
                app.theme.dim
            };
            buffer[(x, y)].set_char(digit).set_style(style);
        }
    }
}

/// The cell under the cursor: its layer, its tensor and its value.
fn cursor_text(app: &App, view: &MapView) -> String {
    let map = &view.map;
    if view.in_strip
        && let Some(&tensor) = map.strip.get(view.strip_cursor)
    {
        return format!(
            "outside layers · {} · {} {}",
            escape(app.model.tensors[tensor as usize].name()),
            view.measure.name(),
            value_text(app.values.get(tensor as usize, view.measure))
        );
    }
    match view.rows.get(view.cursor.0) {
        Some(&row) => {
            let layer = map.columns.get(view.cursor.1).copied().unwrap_or_default();
            let cell = map.cell(&app.values, row, view.cursor.1, view.measure);
            if cell.tensor == crate::layermap::NONE {
                format!(
                    "layer {layer} · {} · not in this layer",
                    escape(&map.label(row))
                )
            } else {
                format!(
                    "layer {layer} · {} · {} {}",
                    escape(app.model.tensors[cell.tensor as usize].name()),
                    view.measure.name(),
                    value_text(cell.state)
                )
            }
        }
        None if map.columns.is_empty() => {
            "no stack of numbered layers in the tensor names".to_owned()
        }
        None => "no rows (/ filters them)".to_owned(),
    }
}

/// The tensors outside layers, on one line from the first on screen, scrolled so that the
/// cursor's is in view.
fn render_strip(frame: &mut Frame, area: Rect, app: &App, view: &mut MapView, analysis: &Analysis) {
    let theme = &app.theme;
    let glyphs = Glyphs::UNICODE;
    let strip = &view.map.strip;
    let heading = "outside layers:";
    let name = |at: usize| escape(app.model.tensors[strip[at] as usize].name());
    // Each tensor takes a space, its mark, a space and its name.
    let room = usize::from(area.width).saturating_sub(heading.len() + 2);
    let width_of = |at: usize| crate::text::display_width(&name(at)) + 3;
    let cursor = view.strip_cursor.min(strip.len().saturating_sub(1));
    // The first tensor from which the cursor's still fits (walking back at most a line's worth).
    let mut fitting = cursor;
    let mut used = width_of(cursor);
    while fitting > view.strip_offset.min(cursor) {
        used += width_of(fitting - 1);
        if used > room {
            break;
        }
        fitting -= 1;
    }
    let first = view.strip_offset.clamp(fitting, cursor);
    view.strip_offset = first;
    let mut spans = vec![Span::styled(heading, theme.dim)];
    if first > 0 {
        spans.push(Span::styled("…", theme.dim));
    }
    // The last one shown may be cut by the pane's edge.
    let mut used = 0;
    for (at, &tensor) in strip.iter().enumerate().skip(first) {
        if used >= room {
            break;
        }
        used += width_of(at);
        let state = app.values.get(tensor as usize, view.measure);
        let (glyph, level) = glyphs.of(state, analysis.scale.as_ref());
        let mut style = match (state, level) {
            (State::NonFinite | State::Failed, _) => theme.broken,
            (_, Some(level)) => theme.ramp[level],
            _ => theme.dim,
        };
        let mut name_style = theme.base;
        if view.in_strip && at == cursor {
            style = style.patch(theme.cursor);
            name_style = theme.cursor;
        }
        spans.push(Span::raw(" "));
        spans.push(Span::styled(glyph.to_string(), style));
        spans.push(Span::raw(" "));
        spans.push(Span::styled(name(at).into_owned(), name_style));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

/// The new first row (or column) on screen, so that `cursor` is in view and no room is left
/// empty past the last of `len`.
fn scrolled(offset: usize, cursor: usize, visible: usize, len: usize) -> usize {
    let offset = if cursor < offset {
        cursor
    } else if cursor >= offset + visible {
        cursor + 1 - visible
    } else {
        offset
    };
    offset.min(len.saturating_sub(visible))
}

fn render_outliers(frame: &mut Frame, area: Rect, app: &App, view: &MapView, analysis: &Analysis) {
    let theme = &app.theme;
    let title = format!("outliers · {} (n/N)", analysis.outliers.len());
    let rows = usize::from(inner(area).height).max(1);
    let lines: Vec<Line> = if analysis.outliers.is_empty() && app.fetch_limit.is_some() {
        // A model on the Hub has no background scan: its cells stay empty unless asked for.
        vec![
            Line::styled(
                "a model on the Hub is read a tensor at a time: Enter on a cell fetches it",
                theme.dim,
            ),
            Line::styled(
                "(`stui stats --map` fetches them all, within --fetch-limit)",
                theme.dim,
            ),
        ]
    } else if analysis.outliers.is_empty() {
        vec![Line::styled(
            format!("nothing stands out by {}", view.measure.name()),
            theme.dim,
        )]
    } else {
        analysis
            .outliers
            .iter()
            .take(rows)
            .map(|outlier| {
                let (mark, style) = match outlier.problem {
                    Problem::NonFinite | Problem::Failed => ("! ", theme.error),
                    _ => ("~ ", theme.warning),
                };
                let described = Described(outlier, &view.map, &view.rows, view.measure);
                let text = if matches!(outlier.problem, Problem::Band { .. })
                    || outlier.tensor == crate::layermap::NONE
                {
                    described.to_string()
                } else {
                    format!(
                        "{}: {described}",
                        escape(app.model.tensors[outlier.tensor as usize].name())
                    )
                };
                Line::from(vec![Span::styled(mark, style), Span::raw(text)])
            })
            .collect()
    };
    frame.render_widget(List::new(lines).block(block(&title, false, app)), area);
}
