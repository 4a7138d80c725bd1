//! The quantize dialog: scope and choices, every scheme side by side over the scope, the chosen
//! scheme's error preview (worst tensors first), then the save's progress and its summary.

use super::{block, inner, wrapped};
use crate::format::Tensor;
use crate::quantize::{self, Scheme};
use crate::text::{Bytes, Counted, escape, escape_path, fit_name};
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
    frame.render_widget(block("quantize", true, app), box_area);
    let theme = &app.theme;
    // `g` chooses W8A8's scales; the other schemes' are their own.
    let options = dialog.options();
    let w8a8 = quantize::scales_label(Scheme::W8A8, options.granularity, options.group_size);
    let scales = match dialog.scheme {
        Scheme::W8A8 => format!("{w8a8} (g)"),
        scheme => format!(
            "{} · W8A8 {w8a8} (g)",
            quantize::scales_label(scheme, options.granularity, options.group_size)
        ),
    };
    let mut lines = vec![
        Line::from(vec![
            Span::styled("scope   ", theme.dim),
            Span::raw(dialog.scope.clone()),
        ]),
        Line::from(vec![
            Span::styled("scheme  ", theme.dim),
            Span::raw(format!(
                "{} (S)   keep below SNR: {} (k)",
                dialog.scheme,
                dialog
                    .keep_below_snr
                    .map_or_else(|| "off".to_owned(), |db| format!("{db} dB"))
            )),
        ]),
        Line::from(vec![
            Span::styled("scales  ", theme.dim),
            Span::raw(format!(
                "{scales}   NaN/Inf tensors: {} (s)",
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
    let width = usize::from(inner(box_area).width);
    lines.extend(wrapped(chosen_line(app, dialog), width));
    if dialog.chosen.len() > QuantizeDialog::PREVIEWED {
        lines.push(Line::styled(
            format!(
                "previews of the first {} (the rest are measured as they are saved)",
                QuantizeDialog::PREVIEWED
            ),
            theme.dim,
        ));
    }
    lines.extend(comparison_lines(app, dialog, width));
    lines.extend(wrapped(stage_line(app, dialog), width));
    let names = preview_name_width(width);
    lines.push(Line::styled(
        format!(
            "{:<names$} {:>8} {:>11} {:>9}",
            "PREVIEW (worst first)", "SNR dB", "max error", "rel RMS"
        ),
        theme.title,
    ));
    let room = usize::from(inner(box_area).height).saturating_sub(lines.len());
    lines.extend(preview_lines(app, dialog, room, names));
    frame.render_widget(Paragraph::new(lines), inner(box_area));
}

/// How many weights are chosen and what the scheme chosen makes of those it quantizes (its codes
/// alone; a weight whose columns are not in whole groups it keeps).
fn chosen_line(app: &App, dialog: &QuantizeDialog) -> Line<'static> {
    if dialog.chosen.is_empty() {
        let kept: Vec<String> = dialog.kept_in_scope.iter().map(|why| why.name()).collect();
        let why = if kept.is_empty() {
            String::new()
        } else {
            format!(" (kept: {})", kept.join(", "))
        };
        let elsewhere = if dialog.include.is_empty() {
            ""
        } else {
            "; w: the whole model"
        };
        return Line::styled(
            format!("nothing to quantize in {}{why}{elsewhere}", dialog.scope),
            app.theme.warning,
        );
    }
    let group_size = dialog.options().group_size;
    let quantized: Vec<&Tensor> = dialog
        .chosen
        .iter()
        .map(|&t| &app.model.tensors[t])
        .filter(|&tensor| quantize::scheme_quantizes(dialog.scheme, group_size, tensor))
        .collect();
    let before: u64 = quantized.iter().map(|tensor| tensor.info.byte_len()).sum();
    let after: u64 = quantized
        .iter()
        .map(|tensor| tensor.info.element_count().unwrap_or(0))
        .sum::<u64>()
        * u64::from(dialog.scheme.bits())
        / 8;
    let chosen = Counted(dialog.chosen.len(), "tensor");
    let sizes = format!("{} -> {} (plus scales)", Bytes(before), Bytes(after));
    Line::styled(
        if quantized.len() == dialog.chosen.len() {
            format!("{chosen} chosen: {sizes}")
        } else {
            format!(
                "{chosen} chosen, {} quantizes {}: {sizes}",
                dialog.scheme,
                quantized.len()
            )
        },
        app.theme.dim,
    )
}

/// Every scheme side by side over the scope, the chosen one marked, within `width` columns: the
/// worst tensor's name takes what the figures leave.
fn comparison_lines(app: &App, dialog: &QuantizeDialog, width: usize) -> Vec<Line<'static>> {
    let theme = &app.theme;
    let comparison = match &dialog.comparison {
        None => {
            let done = dialog.comparing.bytes_done.load(Ordering::Relaxed);
            let total = dialog.comparing.bytes_total.load(Ordering::Relaxed);
            let progress = if total == 0 {
                String::new()
            } else {
                format!(" {} of {}", Bytes(done.min(total)), Bytes(total))
            };
            return vec![Line::styled(
                format!("comparing the schemes…{progress}"),
                theme.dim,
            )];
        }
        Some(Err(error)) => {
            return vec![Line::styled(
                format!("no comparison: {}", escape(error)),
                theme.error,
            )];
        }
        Some(Ok(comparison)) => comparison,
    };
    let mut lines = vec![Line::styled(
        format!(
            "  {:<11} {:>10} {:>6} {:>8} {:>9}  worst tensor",
            "SCHEME", "output", "bits/w", "worst dB", "median dB"
        ),
        theme.title,
    )];
    let names = width.saturating_sub(COMPARISON_FIGURES).max(MIN_NAME_WIDTH);
    for result in &comparison.schemes {
        let chosen = result.scheme == dialog.scheme;
        let worst = result
            .worst
            .map(|t| fit_name(&escape(app.model.tensors[t].name()), names).into_owned())
            .unwrap_or_default();
        let [bits, worst_db, median_db] = [
            result.bits_per_weight,
            result.worst_snr_db,
            result.median_snr_db,
        ]
        .map(crate::report::two_places_or_dash);
        let text = format!(
            "{} {:<11} {:>10} {bits:>6} {worst_db:>8} {median_db:>9}  {worst}",
            if chosen { "▸" } else { " " },
            result.scheme.name(),
            Bytes(result.output_bytes).to_string(),
        );
        lines.push(if chosen {
            Line::styled(text, theme.key)
        } else {
            Line::raw(text)
        });
    }
    lines
}

/// Columns of a comparison row before the worst tensor's name.
const COMPARISON_FIGURES: usize = 2 + 11 + 1 + 10 + 1 + 6 + 1 + 8 + 1 + 9 + 2;

/// Columns of a preview row after the tensor's name: three figures and the mark of a weight
/// kept for its SNR.
const PREVIEW_FIGURES: usize = 1 + 8 + 1 + 11 + 1 + 9 + 5;

/// The fewest columns a name is cut to, however narrow the dialog.
const MIN_NAME_WIDTH: usize = 16;

/// The most columns the preview's names take, in the widest dialog.
const MAX_PREVIEW_NAME_WIDTH: usize = 52;

/// Columns of the preview's names in a dialog `width` wide, so that every figure and the mark of
/// a kept weight stay on screen.
fn preview_name_width(width: usize) -> usize {
    width
        .saturating_sub(PREVIEW_FIGURES)
        .clamp(MIN_NAME_WIDTH, MAX_PREVIEW_NAME_WIDTH)
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
                } else if summary.beyond_range().next().is_some() {
                    "VERIFICATION FAILED: weights read back as Inf (k keeps them)"
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

/// A line for each of the first `count` chosen tensors, the worst SNR first (failures before any
/// SNR), those not yet previewed last in model order. Only the lines shown are made: thousands of
/// tensors can be chosen.
fn preview_lines(
    app: &App,
    dialog: &QuantizeDialog,
    count: usize,
    names: usize,
) -> Vec<Line<'static>> {
    let theme = &app.theme;
    let options = dialog.options();
    let rank = |tensor: usize| match dialog.previews.get(&tensor) {
        None => (1, 0.0),
        Some(Err(_) | Ok(None)) => (0, f64::NEG_INFINITY),
        Some(Ok(Some(error))) => (0, error.snr_db),
    };
    let order = |a: &(usize, (u8, f64)), b: &(usize, (u8, f64))| {
        (a.1.0.cmp(&b.1.0))
            .then(a.1.1.total_cmp(&b.1.1))
            .then(a.0.cmp(&b.0))
    };
    let mut shown: Vec<(usize, (u8, f64))> = Vec::with_capacity(count + 1);
    for &tensor in dialog.chosen.iter().take(QuantizeDialog::PREVIEWED) {
        let candidate = (tensor, rank(tensor));
        if shown.len() == count
            && shown
                .last()
                .is_none_or(|last| order(&candidate, last).is_ge())
        {
            continue;
        }
        let at = shown.partition_point(|row| order(row, &candidate).is_lt());
        shown.insert(at, candidate);
        shown.truncate(count);
    }
    shown
        .into_iter()
        .map(|(tensor, _)| {
            let name = fit_name(&escape(app.model.tensors[tensor].name()), names).into_owned();
            match dialog.previews.get(&tensor) {
                None if !quantize::scheme_quantizes(
                    dialog.scheme,
                    options.group_size,
                    &app.model.tensors[tensor],
                ) =>
                {
                    let why = if dialog.scheme == Scheme::Fp8Block {
                        "too wide for its blocks"
                    } else {
                        "not in whole groups"
                    };
                    Line::styled(format!("{name:<names$} kept: {why}"), theme.dim)
                }
                None => Line::styled(format!("{name:<names$} …"), theme.dim),
                Some(Err(error)) => Line::styled(format!("{name:<names$} {error}"), theme.error),
                Some(Ok(None)) => {
                    Line::styled(format!("{name:<names$} ✖ holds NaN/Inf"), theme.error)
                }
                Some(Ok(Some(error))) if dialog.kept_for_snr(tensor) => Line::styled(
                    format!(
                        "{name:<names$} {:>8.2} {:>11.3e} {:>9.3e} kept",
                        error.snr_db, error.max_abs_error, error.relative_rms_error
                    ),
                    theme.warning,
                ),
                Some(Ok(Some(error))) => Line::from(format!(
                    "{name:<names$} {:>8.2} {:>11.3e} {:>9.3e}",
                    error.snr_db, error.max_abs_error, error.relative_rms_error
                )),
            }
        })
        .collect()
}
