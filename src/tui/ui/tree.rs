//! The layer tree pane: only the rows on screen are drawn.

use super::{block, inner};
use crate::text::{Shape, escape};
use crate::tree::NodeId;
use crate::tui::app::{App, Focus};
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

pub fn render(frame: &mut Frame, area: Rect, app: &mut App) {
    let title = if app.search.is_empty() {
        "tree".to_owned()
    } else {
        format!("tree · /{}", escape(&app.search))
    };
    let focused = app.focus == Focus::Tree && app.popup.is_none();
    frame.render_widget(block(&title, focused, app), area);
    let rows_area = inner(area);
    let height = usize::from(rows_area.height);
    app.page = height.max(1);
    app.tree_area = Some((rows_area.x, rows_area.y, rows_area.width, rows_area.height));
    let first = app.outline.scroll_into_view(height);
    let selected = app.outline.selected_row();
    let width = usize::from(rows_area.width);
    let lines: Vec<Line> = app.outline.rows()[first..]
        .iter()
        .take(height)
        .enumerate()
        .map(|(i, row)| {
            let mut line = match row.member {
                None => row_line(app, row.node, app.tree.depth(row.node), width),
                Some(member) => member_line(app, row.node, member, width),
            };
            if first + i == selected {
                line = line.style(app.theme.selected);
            }
            line
        })
        .collect();
    frame.render_widget(Paragraph::new(lines), rows_area);
}

/// One row: guides, open/closed symbol, marks, name, then shape (or tensor count) and dtype, and
/// the size right-aligned when the width allows.
fn row_line(app: &App, id: NodeId, depth: usize, width: usize) -> Line<'static> {
    let theme = &app.theme;
    let tree = &app.tree;
    let node = tree.node(id);
    let leaf = tree.children(id).is_empty();
    let totals = tree.totals(id, &app.model.tensors);
    let symbol = match (!app.outline.opens(tree, id), app.outline.is_open(id)) {
        (true, _) => "  ",
        (false, true) => "▾ ",
        (false, false) => "▸ ",
    };
    let mut spans = vec![Span::raw(format!("{}{symbol}", "  ".repeat(depth)))];
    let marks = app.marks(id);
    if marks.errors > 0 {
        spans.push(Span::styled(format!("✖{} ", marks.errors), theme.error));
    } else if marks.warnings > 0 {
        spans.push(Span::styled(format!("⚠{} ", marks.warnings), theme.warning));
    }
    let diff = app
        .diff
        .as_ref()
        .and_then(|diff| diff.marks.get(id as usize))
        .copied()
        .unwrap_or_default();
    if diff.changed > 0 {
        spans.push(Span::styled(format!("Δ{} ", diff.changed), theme.key));
    }
    if diff.only_here > 0 {
        spans.push(Span::styled(format!("−{} ", diff.only_here), theme.dim));
    }
    let segment = escape(tree.segment(id)).into_owned();
    let needle = app.search.to_lowercase();
    let style = if !needle.is_empty() && crate::text::contains_ignore_case(&segment, &needle) {
        theme.matched
    } else if marks.errors > 0 {
        theme.error
    } else {
        theme.base
    };
    spans.push(Span::styled(segment, style));
    let detail = match node.tensor() {
        Some(tensor) if leaf => {
            let info = &app.model.tensors[tensor].info;
            // A logical weight's encoding without its producer (`int4`), which the header names.
            let dtype = match info.dtype.name().split_once(" (") {
                Some((encoding, _)) if info.dtype.is_quantized() => encoding,
                _ => info.dtype.name(),
            };
            format!("  {} {}", escape(dtype), Shape(&info.shape))
        }
        _ => format!("  {}", totals.tensors),
    };
    finish(app, spans, detail, totals.bytes, width)
}

/// A stored member of a logical weight, below it: its name after the module's, dtype, shape
/// and size.
fn member_line(app: &App, weight: NodeId, member: u16, width: usize) -> Line<'static> {
    let theme = &app.theme;
    let indent = "  ".repeat(app.tree.depth(weight) + 1);
    let Some((label, stored)) = app
        .tree
        .node(weight)
        .tensor()
        .and_then(|tensor| app.member(tensor, usize::from(member)))
    else {
        return Line::raw(indent);
    };
    let spans = vec![
        Span::raw(format!("{indent}  ")),
        Span::styled(escape(label).into_owned(), theme.dim),
    ];
    let info = &stored.info;
    let detail = format!("  {} {}", escape(info.dtype.name()), Shape(&info.shape));
    finish(app, spans, detail, info.byte_len(), width)
}

/// Adds the dtype and shape (or tensor count) and the size, right-aligned, as the width allows.
fn finish(
    app: &App,
    mut spans: Vec<Span<'static>>,
    detail: String,
    bytes: u64,
    width: usize,
) -> Line<'static> {
    let theme = &app.theme;
    let size = crate::text::Bytes(bytes).to_string();
    let width_of = |spans: &[Span]| -> usize {
        spans
            .iter()
            .map(|s| crate::text::display_width(&s.content))
            .sum()
    };
    let name_width = width_of(&spans);
    let detail_width = crate::text::display_width(&detail);
    // A narrow pane keeps the size column and leaves the dtype and shape to the tensor pane.
    let fits = |used: usize| used + size.len() + 2 <= width;
    if fits(name_width + detail_width) {
        spans.push(Span::styled(detail, theme.dim));
    }
    let used = width_of(&spans);
    if fits(used) {
        spans.push(Span::raw(" ".repeat(width - used - size.len())));
        spans.push(Span::styled(size, theme.dim));
    }
    Line::from(spans)
}
