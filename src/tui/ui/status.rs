//! The header, the scan status line and the key hints.

use crate::text::{Bytes, Count, Counted, display_width, escape, escape_path};
use crate::tui::action::Action;
use crate::tui::app::{App, ScanState};
use crate::tui::keymap;
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

pub fn render_header(frame: &mut Frame, area: Rect, app: &App) {
    let theme = &app.theme;
    let model = &app.model;
    let (verdict, style) = if model.is_valid() {
        ("valid", theme.good)
    } else {
        ("NOT VALID", theme.error)
    };
    let totals = app.tree.totals(crate::tree::ROOT, &model.tensors);
    let name = app.model_info().and_then(|info| {
        let name = escape(info.model_type.as_deref()?);
        Some(if info.config.is_some() {
            format!("  {name}")
        } else {
            format!("  {name}?")
        })
    });
    // The scheme shown once for the model, and whether its members are listed as stored.
    let quantized = app.quantization.as_ref().map(|q| {
        let listed = if app.logical.is_some() {
            ""
        } else {
            ", stored"
        };
        format!("  {}{listed}", escape(&q.summary()))
    });
    let line = Line::from(vec![
        Span::styled(" stui ", theme.title),
        Span::raw(escape_path(&model.path)),
        Span::raw("  "),
        Span::styled(verdict, style),
        // Before the totals, so that a narrow terminal cuts those rather than the model's name.
        Span::styled(name.unwrap_or_default(), theme.key),
        Span::styled(quantized.unwrap_or_default(), theme.key),
        Span::styled(
            format!(
                "  {} · {} params · {}",
                Counted(totals.tensors, "tensor"),
                Count(totals.parameters),
                Bytes(model.file_bytes())
            ),
            theme.dim,
        ),
    ]);
    frame.render_widget(Paragraph::new(line), area);
}

pub fn render_status(frame: &mut Frame, area: Rect, app: &App) {
    let theme = &app.theme;
    if let Some(notice) = &app.notice {
        let line = Line::styled(format!(" {}", escape(notice)), theme.warning);
        frame.render_widget(Paragraph::new(line), area);
        return;
    }
    let text = match (app.scan, app.progress) {
        (ScanState::Done, Some(p)) => format!(
            " scan done: {}, {} in {:.1} s",
            Counted(p.tensors_done, "tensor"),
            Bytes(p.bytes_done),
            p.elapsed.as_secs_f64()
        ),
        (ScanState::Cancelled, _) => " scan stopped".to_owned(),
        (state, Some(p)) => {
            let left = p.remaining().map_or_else(String::new, |d| {
                format!(" · {:.0} s left", d.as_secs_f64().ceil())
            });
            let paused = if state == ScanState::Paused {
                "paused · "
            } else {
                ""
            };
            format!(
                " {paused}scanning {}/{} tensors · {} of {} · {}/s{left}",
                p.tensors_done,
                p.tensors_total,
                Bytes(p.bytes_done),
                Bytes(p.bytes_total),
                Bytes(p.bytes_per_second())
            )
        }
        (ScanState::Paused, None) => " scan paused".to_owned(),
        _ => " scan starting…".to_owned(),
    };
    let text = match &app.diff {
        Some(diff) => format!(
            "{text} · diff Δ{} −{} here +{} there{}",
            diff.changed,
            diff.only_here,
            diff.only_there,
            if diff.metadata > 0 {
                ", metadata differs"
            } else {
                ""
            }
        ),
        None => text,
    };
    frame.render_widget(Paragraph::new(Line::styled(text, theme.dim)), area);
}

pub fn render_footer(frame: &mut Frame, area: Rect, app: &App) {
    let theme = &app.theme;
    let mut spans = Vec::new();
    if app.searching {
        spans.push(Span::styled(" /", theme.key));
        let typed = match &app.map {
            Some(view) if app.map_open => &view.filter,
            _ => &app.search,
        };
        spans.push(Span::raw(crate::text::escape(typed).into_owned()));
        spans.push(Span::styled("▏", theme.key));
    }
    let room = usize::from(area.width).saturating_sub(spans.iter().map(Span::width).sum());
    for (key, label, _) in fitting_hints(keymap::hints(app.context()), room) {
        spans.push(Span::styled(format!(" {key}"), theme.key));
        spans.push(Span::raw(format!(" {label} ")));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

/// Of `hints`, those that fit whole in `room` columns (one cut short reads as another key), in
/// their order; where not all do, the one for help is kept last, since help lists them all.
fn fitting_hints(
    mut hints: Vec<(String, &'static str, Action)>,
    room: usize,
) -> Vec<(String, &'static str, Action)> {
    // " key label ", its last space free to fall past the edge.
    let width =
        |(key, label, _): &(String, &str, Action)| display_width(key) + display_width(label) + 3;
    let room = room + 1;
    if hints.iter().map(width).sum::<usize>() <= room {
        return hints;
    }
    let help = hints
        .iter()
        .position(|&(_, _, action)| action == Action::ShowHelp)
        .map(|at| hints.remove(at));
    let mut left = room.saturating_sub(help.as_ref().map_or(0, width));
    let mut fitting: Vec<_> = hints
        .into_iter()
        .take_while(|hint| {
            let fits = width(hint) <= left;
            left -= if fits { width(hint) } else { 0 };
            fits
        })
        .collect();
    fitting.extend(help);
    fitting
}
