//! Drawing the explorer. The screen, from top to bottom:
//!
//! ```text
//! ┌ header: file, verdict, tensors, parameters, size ─────────────────────────┐
//! │ tree (tui-tree-widget)              │ tensor: details and statistics      │
//! │   marks climb: ✖ errors, ⚠ warnings │ histogram of the selected tensor    │
//! ├ findings (Enter jumps to the tensor) ─────────────────────────────────────┤
//! │ status: scan progress, rate, time left                                     │
//! │ footer: key hints from the keymap                                          │
//! ```
//!
//! The layer map (`M`) takes the place of the tree, the details and the findings.
//! Popups (help, metadata) draw over the middle. A file with no readable tensor shows its
//! findings and what the file seems to be in place of the tree.

mod details;
mod findings;
mod histogram;
mod map;
mod popup;
mod quantize;
mod status;
mod tree;

use super::app::App;
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::widgets::{Block, BorderType, Borders};

/// Draws the whole screen.
pub fn render(frame: &mut Frame, app: &mut App) {
    let area = frame.area();
    if area.width < 20 || area.height < 8 {
        frame.render_widget(
            ratatui::widgets::Paragraph::new("stui: terminal too small"),
            area,
        );
        return;
    }
    let findings_height = (area.height / 4).clamp(4, 12);
    let [header, body, findings_area, status_area, footer] = area.layout(&Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(6),
        Constraint::Length(findings_height),
        Constraint::Length(1),
        Constraint::Length(1),
    ]));
    status::render_header(frame, header, app);
    if app.map_open {
        map::render(frame, body.union(findings_area), app);
    } else if app.model.tensors.is_empty() && !app.model.is_valid() {
        findings::render_unreadable(frame, body, app);
    } else {
        let [left, right] = body.layout(&Layout::horizontal([
            Constraint::Percentage(55),
            Constraint::Percentage(45),
        ]));
        tree::render(frame, left, app);
        // Two more lines for a logical weight's scheme and members.
        let wanted = if app.logical.is_some() { 11 } else { 9 };
        let details_height = wanted.min(right.height.saturating_sub(4)).max(4);
        let [details_area, histogram_area] = right.layout(&Layout::vertical([
            Constraint::Length(details_height),
            Constraint::Min(3),
        ]));
        details::render(frame, details_area, app);
        histogram::render(frame, histogram_area, app);
    }
    if !app.map_open {
        findings::render(frame, findings_area, app);
    }
    status::render_status(frame, status_area, app);
    status::render_footer(frame, footer, app);
    if let Some(kind) = app.popup {
        popup::render(frame, area, app, kind);
    }
    if let Some(dialog) = &app.quantize {
        quantize::render(frame, area, app, dialog);
    }
}

/// A bordered block with a title, its border showing focus.
fn block<'a>(title: &'a str, focused: bool, app: &App) -> Block<'a> {
    let theme = &app.theme;
    let border: Style = if focused {
        theme.border_focused
    } else {
        theme.border
    };
    Block::new()
        .borders(Borders::ALL)
        .border_type(BorderType::Plain)
        .border_style(border)
        .title(ratatui::text::Span::styled(
            format!(" {title} "),
            theme.title,
        ))
}

/// The part of `area` inside a block's borders.
fn inner(area: Rect) -> Rect {
    area.inner(ratatui::layout::Margin {
        horizontal: 1,
        vertical: 1,
    })
}
