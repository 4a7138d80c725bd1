//! The quantize dialog: scope and choices, the error preview (worst tensors first), then the
//! save's progress and its summary.

use super::{block, inner};
use crate::quantize::Granularity;
use crate::text::{Bytes, escape, escape_path};
use crate::tui::app::{App, QuantizeDialog, Stage};
use ratatui::Frame;
use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Clear, Paragraph};
use std::sync::atomic::Ordering;

pub fn render(frame: &mut Frame, area: Rect, app: &App, dialog: &QuantizeDialog) {
    let width = area
        .width
        .saturating_sub(4)
        .min(100)
        .max(area.width.min(20));
    let height = area.height.saturating_sub(4).max(area.height.min(8));
    let [middle] = area.layout(&Layout::vertical([Constraint::Length(height)]).flex(Flex::Center));
    let [box_area] =
        middle.layout(&Layout::horizontal([Constraint::Length(width)]).flex(Flex::Center));
    frame.render_widget(Clear, box_area);
    frame.render_widget(block("quantize to int8", true, app), box_area);
    let theme = &app.theme;
    let granularity = match dialog.granularity {
        Granularity::PerChannel => "per output channel",
        Granularity::PerTensor => "per tensor",
    };
    let mut lines = vec![
        Line::from(vec![
            Span::styled("scope   ", theme.dim),
            Span::raw(dialog.scope.clone()),
        ]),
        Line::from(vec![
            Span::styled("scales  ", theme.dim),
            Span::raw(format!(
                "{granularity} (g)   NaN/Inf tensors: {} (s)",
                if dialog.skip_non_finite {
                    "skip"
                } else {
                    "stop"
                }
            )),
        ]),
        Line::from(vec![
            Span::styled("output  ", theme.dim),
            Span::raw(escape_path(&dialog.output)),
        ]),
    ];
    let before: u64 = dialog
        .chosen
        .iter()
        .map(|&t| app.model.tensors[t].info.byte_len())
        .sum();
    let after: u64 = dialog
        .chosen
        .iter()
        .map(|&t| app.model.tensors[t].info.element_count().unwrap_or(0))
        .sum();
    lines.push(Line::styled(
        format!(
            "{} tensors chosen: {} -> {} (plus scales)",
            dialog.chosen.len(),
            Bytes(before),
            Bytes(after)
        ),
        theme.dim,
    ));
    lines.push(stage_line(app, dialog));
    lines.push(Line::styled(
        format!(
            "{:<52} {:>8} {:>11} {:>9}",
            "PREVIEW (worst first)", "SNR dB", "max error", "rel RMS"
        ),
        theme.title,
    ));
    lines.extend(preview_lines(app, dialog));

    frame.render_widget(Paragraph::new(lines), inner(box_area));
}

fn stage_line(app: &App, dialog: &QuantizeDialog) -> Line<'static> {
    let theme = &app.theme;
    match &dialog.stage {
        Stage::Choosing => Line::styled("Enter saves, Esc closes", theme.key),
        Stage::ConfirmReplace => Line::styled(
            "the output exists: Enter again replaces it, Esc keeps it",
            theme.warning,
        ),
        Stage::Saving(control) => {
            let done = control.bytes_done.load(Ordering::Relaxed);
            let total = control.bytes_total.load(Ordering::Relaxed).max(1);
            Line::styled(
                format!("saving… {} of {} (Esc cancels)", Bytes(done), Bytes(total)),
                theme.bar,
            )
        }
        Stage::Saved(summary) => Line::styled(
            format!(
                "saved: {} quantized, {} kept, {} -> {}; {}; o opens it",
                summary.quantized.len(),
                summary.kept().count(),
                Bytes(summary.bytes_before),
                Bytes(summary.bytes_after),
                if summary.verified {
                    "verified"
                } else {
                    "VERIFICATION FAILED"
                }
            ),
            if summary.verified {
                theme.good
            } else {
                theme.error
            },
        ),
        Stage::Failed(message) => {
            Line::styled(format!("not saved: {}", escape(message)), theme.error)
        }
    }
}

/// One line per chosen tensor, the worst SNR first, those not yet previewed last.
fn preview_lines(app: &App, dialog: &QuantizeDialog) -> Vec<Line<'static>> {
    let theme = &app.theme;
    let mut rows: Vec<(usize, Option<f64>, Line<'static>)> = dialog
        .chosen
        .iter()
        .map(|&tensor| {
            let name = escape(app.model.tensors[tensor].name()).into_owned();
            match dialog.previews.get(&tensor) {
                None => (
                    tensor,
                    None,
                    Line::styled(format!("{name:<52} …"), theme.dim),
                ),
                Some(Err(error)) => (
                    tensor,
                    Some(f64::NEG_INFINITY),
                    Line::styled(format!("{name:<52} {error}"), theme.error),
                ),
                Some(Ok(None)) => (
                    tensor,
                    Some(f64::NEG_INFINITY),
                    Line::styled(format!("{name:<52} ✖ holds NaN/Inf"), theme.error),
                ),
                Some(Ok(Some(error))) => (
                    tensor,
                    Some(error.snr_db),
                    Line::from(format!(
                        "{name:<52} {:>8.2} {:>11.3e} {:>9.3e}",
                        error.snr_db, error.max_abs_error, error.relative_rms_error
                    )),
                ),
            }
        })
        .collect();
    rows.sort_by(|a, b| match (a.1, b.1) {
        (Some(x), Some(y)) => x.total_cmp(&y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.0.cmp(&b.0),
    });
    rows.into_iter().map(|(_, _, line)| line).collect()
}
