//! The findings list, and the screen for a file with nothing readable.

use super::{block, ended_with_ellipsis, inner, wrapped};
use crate::finding::{Finding, Severity};
use crate::text::escape;
use crate::tui::app::{App, Focus};
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span, Text};
use ratatui::widgets::{List, ListItem, ListState, Paragraph, Wrap};

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let findings = &app.findings;
    let filter = match app.severity {
        None => "all",
        Some(Severity::Error) => "errors",
        Some(Severity::Warning) => "warnings",
        Some(Severity::Info) => "info",
    };
    let listed = findings.len(app.severity);
    let unlisted = findings.unlisted(app.severity);
    let title = if unlisted == 0 {
        format!("findings · {listed} ({filter})")
    } else {
        format!(
            "findings · {} ({filter}, {listed} listed)",
            listed + unlisted
        )
    };
    let focused = app.focus == Focus::Findings && app.popup.is_none();
    // Only the lines on screen are made: the list may hold tens of thousands.
    let rows = usize::from(inner(area).height).max(1);
    let width = usize::from(inner(area).width);
    let selected = app.finding_selected.min(listed.saturating_sub(1));
    // The finding selected is shown whole, over as many lines as it needs: a pane 80 columns
    // wide cuts most messages.
    let whole = focused
        .then(|| findings.iter(app.severity).nth(selected))
        .flatten()
        .map(|f| {
            let mut lines = wrapped(finding_line(app, f), width);
            // Taller than the pane, it would not be drawn at all: its start is shown.
            if lines.len() > rows {
                lines.truncate(rows);
                if let Some(last) = lines.last_mut() {
                    ended_with_ellipsis(last, width, app.theme.dim);
                }
            }
            lines
        });
    let selected_rows = whole.as_ref().map_or(1, Vec::len);
    // With the last finding selected, room is kept below it for the line on those left out.
    let below = usize::from(unlisted > 0 && selected + 1 == listed);
    let first = if focused {
        selected.saturating_sub(rows.saturating_sub(selected_rows + below))
    } else {
        0
    };
    let mut whole = whole;
    let mut items: Vec<ListItem> = findings
        .iter(app.severity)
        .enumerate()
        .skip(first)
        .take(rows)
        .map(|(i, f)| match whole.take_if(|_| i == selected) {
            Some(lines) => ListItem::new(Text::from(lines)),
            None => ListItem::new(finding_line(app, f)),
        })
        .collect();
    if items.len() < rows && unlisted > 0 {
        items.push(ListItem::new(Line::styled(
            format!(
                "… {unlisted} more not listed (the tree marks them; `stui check` and `stui stats` list all)"
            ),
            app.theme.dim,
        )));
    }
    let list = List::new(items)
        .block(block(&title, focused, app))
        .highlight_style(app.theme.selected);
    let mut state = ListState::default().with_selected(focused.then_some(selected - first));
    frame.render_stateful_widget(list, area, &mut state);
}

fn finding_line<'a>(app: &App, finding: &Finding) -> Line<'a> {
    let theme = &app.theme;
    let (mark, style) = match finding.severity {
        Severity::Error => ("✖ error  ", theme.error),
        Severity::Warning => ("⚠ warning", theme.warning),
        Severity::Info => ("· info   ", theme.info),
    };
    let mut place = String::new();
    if let Some(file) = &finding.file {
        place.push_str(&escape(file));
        place.push_str(": ");
    }
    if let Some(tensor) = &finding.tensor {
        place.push_str(&escape(tensor));
        place.push_str(": ");
    }
    Line::from(vec![
        Span::styled(mark, style),
        Span::raw(" "),
        Span::styled(finding.code.as_str(), theme.dim),
        Span::raw(" "),
        Span::raw(place),
        Span::raw(escape(&finding.message).into_owned()),
    ])
}

/// In place of the tree when no tensor could be read: what the file seems to be, and why not.
pub fn render_unreadable(frame: &mut Frame, area: Rect, app: &App) {
    let theme = &app.theme;
    frame.render_widget(block("this file cannot be read", true, app), area);
    let mut lines = vec![
        Line::styled(
            "stui could not read any tensor from this file (it is named in the header above).",
            theme.error,
        ),
        Line::from(""),
    ];
    for finding in app.findings.iter(Some(Severity::Error)) {
        lines.push(Line::from(format!("• {}", escape(&finding.message))));
    }
    frame.render_widget(Paragraph::new(lines).wrap(Wrap { trim: true }), inner(area));
}
