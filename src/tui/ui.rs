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
use ratatui::text::{Line, Span};
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

/// `line` cut at its spaces into lines of at most `width` columns, each character keeping its
/// span's style and each line the line's, so that a long message (a finding, a save that failed
/// and why) is read whole; a word wider than `width` is cut where the width ends.
fn wrapped(line: Line<'static>, width: usize) -> Vec<Line<'static>> {
    if line.width() <= width || width == 0 {
        return vec![line];
    }
    let chars: Vec<(char, Style)> = line
        .spans
        .iter()
        .flat_map(|span| span.content.chars().map(move |c| (c, span.style)))
        .collect();
    let columns = |c: char| unicode_width::UnicodeWidthChar::width(c).unwrap_or(0);
    let mut breaks = Vec::new();
    let (mut at, mut used) = (0, 0);
    while at < chars.len() {
        let word_end = chars[at..]
            .iter()
            .position(|&(c, _)| c == ' ')
            .map_or(chars.len(), |p| at + p);
        let next = chars[word_end..]
            .iter()
            .position(|&(c, _)| c != ' ')
            .map_or(chars.len(), |p| word_end + p);
        let word: usize = chars[at..word_end].iter().map(|&(c, _)| columns(c)).sum();
        if used + word <= width {
            used += word + (next - word_end);
            at = next;
        } else if used > 0 {
            breaks.push(at);
            used = 0;
        } else {
            // Wider than a line: cut after the characters that fit, at least one.
            let mut fit = 0;
            let mut cut = at;
            while cut < word_end && (cut == at || fit + columns(chars[cut].0) <= width) {
                fit += columns(chars[cut].0);
                cut += 1;
            }
            breaks.push(cut);
            at = cut;
        }
    }
    let style = line.style;
    let mut lines = Vec::new();
    let mut start = 0;
    for end in breaks.into_iter().chain([chars.len()]) {
        let mut spans: Vec<Span<'static>> = Vec::new();
        for chunk in chars[start..end].chunk_by(|a, b| a.1 == b.1) {
            spans.push(Span::styled(
                chunk.iter().map(|&(c, _)| c).collect::<String>(),
                chunk[0].1,
            ));
        }
        if !spans.is_empty() {
            lines.push(Line::from(spans).style(style));
        }
        start = end;
    }
    lines
}

/// `line` cut to leave room for " …" within `width` columns, and the mark added: what follows is
/// left out.
fn ended_with_ellipsis(line: &mut Line<'static>, width: usize, style: Style) {
    while line.width() + 2 > width {
        let Some(span) = line.spans.last_mut() else {
            break;
        };
        let mut text = span.content.to_string();
        if text.pop().is_none() {
            line.spans.pop();
            continue;
        }
        span.content = text.into();
    }
    line.spans.push(Span::styled(" …", style));
}

/// The part of `area` inside a block's borders.
fn inner(area: Rect) -> Rect {
    area.inner(ratatui::layout::Margin {
        horizontal: 1,
        vertical: 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::display_width;
    use proptest::prelude::*;
    use ratatui::style::Color;

    /// Every character that is not a space, with its style.
    fn marks(lines: &[Line<'_>]) -> Vec<(char, Style)> {
        lines
            .iter()
            .flat_map(|line| &line.spans)
            .flat_map(|span| {
                span.content
                    .chars()
                    .filter(|&c| c != ' ')
                    .map(move |c| (c, span.style))
            })
            .collect()
    }

    proptest! {
        /// Lines fit their width (but for one character wider than it), and keep every
        /// character, in order, with its span's style; a break falls at a space or inside a word
        /// wider than the width.
        #[test]
        fn wrapped_lines_fit_and_lose_nothing(
            spans in proptest::collection::vec(("[a-zé界 ]{0,14}", 0u8..4), 0..8),
            width in 1usize..24,
        ) {
            let line = Line::from(
                spans
                    .iter()
                    .map(|(text, colour)| {
                        Span::styled(text.clone(), Style::new().fg(Color::Indexed(*colour)))
                    })
                    .collect::<Vec<_>>(),
            )
            .style(Style::new().bg(Color::Blue));
            let lines = wrapped(line.clone(), width);
            prop_assert_eq!(marks(&lines), marks(std::slice::from_ref(&line)));
            for out in &lines {
                prop_assert_eq!(out.style, line.style);
                let text: String = out.spans.iter().map(|s| s.content.as_ref()).collect();
                let shown = text.trim_end_matches(' ');
                prop_assert!(
                    display_width(shown) <= width || shown.chars().count() == 1,
                    "{:?} is wider than {}", shown, width
                );
            }
            let original: String = line.spans.iter().map(|s| s.content.as_ref()).collect();
            let joined: String = lines
                .iter()
                .flat_map(|l| l.spans.iter().map(|s| s.content.as_ref()))
                .collect();
            prop_assert_eq!(&joined, &original);
            // A word that fits its width is never cut: each line's words are the original's.
            for out in &lines {
                let text: String = out.spans.iter().map(|s| s.content.as_ref()).collect();
                for word in text.split(' ').filter(|w| !w.is_empty()) {
                    prop_assert!(
                        original
                            .split(' ')
                            .any(|w| w == word || (w.contains(word) && display_width(w) > width)),
                        "{:?} was cut", word
                    );
                }
            }
        }
    }

    #[test]
    fn a_short_line_is_left_alone_and_a_long_one_breaks_at_spaces() {
        let line = Line::from(vec![Span::raw("one two "), Span::raw("three")]);
        assert_eq!(wrapped(line.clone(), 13), vec![line]);
        let lines = wrapped(Line::raw("one two three"), 7);
        let texts: Vec<String> = lines.iter().map(ToString::to_string).collect();
        assert_eq!(texts, ["one two ", "three"]);
        let lines = wrapped(Line::raw("abcdefgh"), 3);
        let texts: Vec<String> = lines.iter().map(ToString::to_string).collect();
        assert_eq!(texts, ["abc", "def", "gh"]);
    }
}
