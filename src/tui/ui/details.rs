//! Details and statistics of the selection.

use super::{block, inner};
use crate::analysis::Moments;
use crate::text::{Bytes, Count, Counted, Shape, escape, format_bytes};
use crate::tree::ROOT;
use crate::tui::app::{App, Outcome, ScanStatus};
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};
use std::fmt::Write as _;

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    frame.render_widget(block("tensor", false, app), area);
    let member = app.outline.selected_member().and_then(|(node, member)| {
        let tensor = app.tree.node(node).tensor()?;
        Some((tensor, usize::from(member)))
    });
    let lines = match (member, app.selected_node()) {
        (Some((tensor, member)), _) => member_lines(app, tensor, member),
        (None, Some(node)) => match app.tree.node(node).tensor() {
            Some(tensor) if app.tree.children(node).is_empty() => tensor_lines(app, tensor),
            _ => group_lines(app, node),
        },
        (None, None) => vec![Line::from("nothing selected")],
    };
    frame.render_widget(
        Paragraph::new(lines).wrap(Wrap { trim: false }),
        inner(area),
    );
}

fn tensor_lines(app: &App, tensor: usize) -> Vec<Line<'static>> {
    let theme = &app.theme;
    let entry = &app.model.tensors[tensor];
    let info = &entry.info;
    let params = info
        .element_count()
        .map_or_else(|| "overflow".to_owned(), |n| Count(n).to_string());
    let [begin, end] = info.data_offsets;
    let mut lines = vec![
        Line::styled(escape(entry.name()).into_owned(), theme.title),
        Line::from(format!(
            "{} {}  {params} params  {}",
            escape(info.dtype.name()),
            Shape(&info.shape),
            Bytes(info.byte_len())
        )),
    ];
    // A logical weight's bytes are its members'.
    if app.logical_weight(tensor).is_none() {
        lines.push(Line::styled(
            format!(
                "bytes {begin}..{end} of {}",
                escape(&app.model.shard_of(entry).label)
            ),
            theme.dim,
        ));
    }
    lines.extend(scheme_line(app, tensor));
    if let Some(status) = app.diff.as_ref().and_then(|d| d.status[tensor].as_ref()) {
        lines.push(diff_line(app, status));
    }
    match (app.outcomes.get(tensor), app.status[tensor]) {
        (Some(Outcome::Moments(m)), _) => lines.extend(stats_lines(app, m)),
        (Some(Outcome::Failed(why)), _) => {
            lines.push(Line::styled(format!("not scanned: {why}"), theme.error));
        }
        (None, ScanStatus::Scanning) => lines.push(Line::styled("scanning…", theme.dim)),
        (None, _) if let Some(why) = app.not_fetched(tensor) => {
            lines.push(Line::styled(why, theme.dim));
        }
        // Pending, or scanned and let go of on a large model: it is being read (again).
        (None, _) => lines.push(Line::styled("statistics pending", theme.dim)),
    }
    lines.extend(codes_line(app, tensor));
    lines.extend(members_line(app, tensor));
    lines
}

/// A stored member of a logical weight: where it is, and the weight it is part of.
fn member_lines(app: &App, tensor: usize, member: usize) -> Vec<Line<'static>> {
    let theme = &app.theme;
    let Some(((_, stored), (logical, weight))) =
        app.member(tensor, member).zip(app.logical_weight(tensor))
    else {
        return Vec::new();
    };
    let info = &stored.info;
    let [begin, end] = info.data_offsets;
    let w = &logical.quantization.weights[weight];
    vec![
        Line::styled(escape(stored.name()).into_owned(), theme.title),
        Line::from(format!(
            "{} {}  {}",
            escape(info.dtype.name()),
            Shape(&info.shape),
            Bytes(info.byte_len())
        )),
        Line::styled(
            format!(
                "bytes {begin}..{end} of {}",
                escape(&logical.stored.shard_of(stored).label)
            ),
            theme.dim,
        ),
        Line::from(format!(
            "member of {} ({})",
            escape(&w.info.name),
            escape(&w.scheme.to_string())
        )),
        Line::styled(
            "statistics are the weight's; R scans the stored tensors",
            theme.dim,
        ),
    ]
}

/// How a logical weight uses its codes: `codes: 14 of 16 levels used · 0.41% at the extremes`.
fn codes_line(app: &App, tensor: usize) -> Option<Line<'static>> {
    let codes = app.codes.get(&tensor)?;
    let mut text = format!(
        "codes: {} of {} levels used",
        codes.used(),
        codes.space.levels
    );
    if let Some((low, high)) = codes.clipped() {
        let total: u64 = codes.counts.iter().sum();
        let share = (low + high) as f64 * 100.0 / total.max(1) as f64;
        let _ = write!(text, " · {share:.2}% at the extremes");
    }
    Some(Line::styled(text, app.theme.dim))
}

/// A logical weight's scheme; for a member listed as stored, the weight it is part of.
fn scheme_line(app: &App, tensor: usize) -> Option<Line<'static>> {
    if let Some((logical, weight)) = app.logical_weight(tensor) {
        let w = &logical.quantization.weights[weight];
        return Some(Line::from(format!(
            "{}  {:.2} bits/weight",
            escape(&w.scheme.to_string()),
            w.bits_per_weight()
        )));
    }
    // Listed as stored: the listed index is the stored one.
    let quantization = app
        .quantization
        .as_ref()
        .filter(|_| app.logical.is_none())?;
    let w = &quantization.weights[quantization.weight_of(tensor)?];
    Some(Line::styled(
        format!(
            "member of {} ({}); R lists the weights",
            escape(&w.info.name),
            escape(&w.scheme.to_string())
        ),
        app.theme.dim,
    ))
}

/// A logical weight's members as stored, one line: `weight_packed I32 [128, 16] · ...`.
fn members_line(app: &App, tensor: usize) -> Option<Line<'static>> {
    let (logical, weight) = app.logical_weight(tensor)?;
    let name = &logical.quantization.weights[weight].info.name;
    let members: Vec<String> = logical
        .quantization
        .members(weight)
        .iter()
        .map(|member| {
            let stored = &logical.stored.tensors[member.tensor as usize];
            format!(
                "{} {} {}",
                escape(crate::quant::listed::member_label(name, stored.name())),
                escape(stored.info.dtype.name()),
                Shape(&stored.info.shape)
            )
        })
        .collect();
    Some(Line::styled(
        format!("members: {}", members.join(" · ")),
        app.theme.dim,
    ))
}

/// How this tensor differs in the `--diff` model.
fn diff_line(app: &App, status: &crate::diff::Status) -> Line<'static> {
    use crate::diff::Status;
    let theme = &app.theme;
    match status {
        Status::Same => Line::styled("diff: the same", theme.good),
        Status::Removed => Line::styled("diff: only in this model", theme.warning),
        Status::Added => Line::styled("diff: only in the other model", theme.warning),
        Status::Unreadable { error } => {
            Line::styled(format!("diff: unreadable: {}", escape(error)), theme.error)
        }
        Status::Changed(what) => {
            let mut text = "diff:".to_owned();
            if let Some((_, other)) = &what.dtype {
                let _ = write!(text, " dtype there {}", escape(other));
            }
            if let Some((_, other)) = &what.shape {
                let _ = write!(text, " shape there {}", Shape(other));
            }
            if let Some(reason) = &what.unaligned {
                let _ = write!(text, " {reason}");
            }
            if let Some(change) = &what.change {
                let _ = write!(text, " {change}");
            }
            Line::styled(text, theme.warning)
        }
    }
}

fn number(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.4e}"))
}

fn stats_lines(app: &App, m: &Moments) -> Vec<Line<'static>> {
    let theme = &app.theme;
    let finite = m.finite() > 0;
    let bad = m.nan + m.pos_inf + m.neg_inf > 0;
    let specials = format!(
        "NaN {}  +Inf {}  -Inf {}  zeros {}",
        m.nan, m.pos_inf, m.neg_inf, m.zeros
    );
    vec![
        Line::from(format!(
            "min {}  max {}",
            number(finite.then_some(m.min)),
            number(finite.then_some(m.max))
        )),
        Line::from(format!(
            "mean {}  std {}",
            number(m.mean()),
            number(m.std())
        )),
        Line::from(format!("absmax {}", number(m.absmax()))),
        Line::from(Span::styled(
            if bad {
                format!("✖ {specials}")
            } else {
                specials
            },
            if bad { theme.error } else { theme.base },
        )),
    ]
}

fn group_lines(app: &App, node: crate::tree::NodeId) -> Vec<Line<'static>> {
    let theme = &app.theme;
    let totals = app.tree.totals(node, &app.model.tensors);
    let path = if node == ROOT {
        "(whole model)".to_owned()
    } else {
        escape(&app.tree.path(node)).into_owned()
    };
    let mix: Vec<String> = app
        .dtype_mix(node)
        .0
        .iter()
        .map(|share| format!("{} {}", share.name("?"), format_bytes(share.bytes)))
        .collect();
    let marks = app.marks(node);
    let pattern = app
        .model_info()
        .and_then(|info| {
            info.patterns()
                .find(|pattern| pattern.stack.as_deref() == Some(path.as_str()))
        })
        .filter(|_| node != ROOT);
    let mut lines = vec![
        Line::styled(path, theme.title),
        Line::from(format!(
            "{}  {} params  {}",
            Counted(totals.tensors, "tensor"),
            Count(totals.parameters),
            Bytes(totals.bytes)
        )),
        Line::from(mix.join(", ")),
    ];
    if let Some(pattern) = pattern {
        lines.push(Line::styled("layer pattern (config)", theme.dim));
        let summary = pattern
            .summary
            .strip_prefix("layers ")
            .unwrap_or(&pattern.summary);
        lines.extend(
            summary
                .split("; ")
                .map(|run| Line::from(format!("  {run}"))),
        );
    }
    if marks.errors > 0 {
        lines.push(Line::styled(
            format!(
                "✖ {} with errors (NaN, Inf, ...)",
                Counted(marks.errors, "tensor")
            ),
            theme.error,
        ));
    }
    if marks.warnings > 0 {
        lines.push(Line::styled(
            format!("⚠ {} with warnings", Counted(marks.warnings, "tensor")),
            theme.warning,
        ));
    }
    lines
}
