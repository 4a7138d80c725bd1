//! Popups over the middle of the screen: help (from the keymap) and `__metadata__`.

use super::{block, ended_with_ellipsis, inner, wrapped};
use crate::text::escape;
use crate::tui::action::Action;
use crate::tui::app::{App, Popup};
use crate::tui::keymap::{BINDINGS, Binding, Context, GLOBAL};
use ratatui::Frame;
use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Clear, Paragraph};

pub fn render(frame: &mut Frame, area: Rect, app: &App, popup: Popup) {
    let height = (area.height * 4 / 5).max(area.height.saturating_sub(4).min(area.height));
    let width = (area.width * 4 / 5)
        .max(area.width.saturating_sub(4).min(76))
        .min(area.width);
    let [middle] = area.layout(&Layout::vertical([Constraint::Length(height)]).flex(Flex::Center));
    let [box_area] =
        middle.layout(&Layout::horizontal([Constraint::Length(width)]).flex(Flex::Center));
    frame.render_widget(Clear, box_area);
    let inside = inner(box_area);
    let rows = usize::from(inside.height).max(1);
    let (title, lines) = match popup {
        Popup::Help => ("keys", help_lines(app)),
        Popup::Metadata => (
            "__metadata__",
            metadata_lines(app, rows, usize::from(inside.width)),
        ),
    };
    frame.render_widget(block(title, true, app), box_area);
    // Long lists flow into as many columns as they need, each as wide as its widest line and the
    // last taking the rest, so that a long label is cut only when the popup is full.
    let chunks: Vec<&[Line]> = lines.chunks(rows).collect();
    let widths = chunks.iter().enumerate().map(|(i, chunk)| {
        if i + 1 == chunks.len() {
            Constraint::Fill(1)
        } else {
            let widest = chunk.iter().map(Line::width).max().unwrap_or(0);
            Constraint::Length(u16::try_from(widest).unwrap_or(u16::MAX))
        }
    });
    let areas = inside.layout_vec(&Layout::horizontal(widths).spacing(2));
    for (chunk, area) in chunks.into_iter().zip(areas) {
        frame.render_widget(Paragraph::new(chunk.to_vec()), area);
    }
}

fn help_lines(app: &App) -> Vec<Line<'static>> {
    // Headings start where the keys below them do, one column in from the popup's edge.
    let line = |keys: String, label: &str| {
        Line::from(vec![
            Span::styled(format!(" {keys:<12}"), app.theme.key),
            Span::raw(label.to_owned()),
        ])
    };
    let mut lines = Vec::new();
    // The map lists its own keys and the tree's views theirs: both at once do not fit 80x24.
    let mut sections: Vec<(&str, Vec<&Binding>)> = if app.map_open {
        vec![(
            "layer map",
            BINDINGS
                .iter()
                .filter(|b| b.context == Context::Map)
                .collect(),
        )]
    } else {
        vec![
            (
                "tree",
                BINDINGS
                    .iter()
                    .filter(|b| b.context == Context::Tree)
                    // Switching listings applies to a quantized model only.
                    .filter(|b| b.action != Action::ToggleRaw || app.quantization.is_some())
                    .collect(),
            ),
            // Moving in the findings list uses the tree's keys; only its own are listed.
            (
                "findings",
                BINDINGS
                    .iter()
                    .filter(|b| b.context == Context::Findings)
                    .filter(|b| {
                        !BINDINGS
                            .iter()
                            .any(|t| t.context == Context::Tree && t.action == b.action)
                    })
                    .collect(),
            ),
            (
                "search",
                BINDINGS
                    .iter()
                    .filter(|b| b.context == Context::Search)
                    .collect(),
            ),
        ]
    };
    sections.push(("everywhere", GLOBAL.iter().collect()));
    for (name, bindings) in sections {
        lines.push(Line::styled(format!(" {name}"), app.theme.title));
        for binding in bindings {
            let keys: Vec<String> = binding.keys.iter().map(|k| k.label()).collect();
            lines.push(line(keys.join(" "), binding.label));
        }
    }
    lines.push(line("Ctrl-C".into(), "quit"));
    lines.push(line("mouse".into(), "wheel scrolls, click selects"));
    lines
}

/// The lines an entry of `__metadata__` takes at most: a long value (a training run's settings,
/// a tag list) shows its start, and `stui inspect --json` gives it whole.
const LINES_PER_ENTRY: usize = 3;

/// At most `rows` lines of `width` columns: the identity whole, then the entries that fit, each
/// wrapped over up to [`LINES_PER_ENTRY`] lines, then how many more there are (a header can hold
/// millions).
fn metadata_lines(app: &App, rows: usize, width: usize) -> Vec<Line<'static>> {
    let identity = app.identity();
    let mut lines = wrapped(
        Line::from(vec![
            Span::styled("structural id = ", app.theme.dim),
            Span::raw(identity.structural_id.clone()),
        ]),
        width,
    );
    lines.extend(wrapped(
        Line::from(vec![
            Span::styled("architecture = ", app.theme.dim),
            Span::raw(identity.architecture.clone()),
        ]),
        width,
    ));
    let metadata = &app.model.metadata;
    if metadata.is_empty() {
        lines.push(Line::styled("(no __metadata__)", app.theme.dim));
        return lines;
    }
    let mut shown = 0;
    for (key, value) in metadata.iter() {
        let mut entry = wrapped(
            Line::from(vec![
                Span::styled(format!("{} = ", escape(key)), app.theme.key),
                Span::raw(escape(value).into_owned()),
            ]),
            width,
        );
        if entry.len() > LINES_PER_ENTRY {
            entry.truncate(LINES_PER_ENTRY);
            if let Some(last) = entry.last_mut() {
                ended_with_ellipsis(last, width, app.theme.dim);
            }
        }
        // The last row is kept for the line on the entries left out, unless this one is the last.
        let reserve = usize::from(shown + 1 < metadata.len());
        if lines.len() + entry.len() + reserve > rows {
            break;
        }
        lines.extend(entry);
        shown += 1;
    }
    if shown < metadata.len() {
        lines.push(Line::styled(
            format!(
                "… {} more entries (`stui inspect --json` lists them all)",
                metadata.len() - shown
            ),
            app.theme.dim,
        ));
    }
    lines
}
