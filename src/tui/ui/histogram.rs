//! The histogram of the selected tensor: bins squeezed to the pane's width, linear or log counts.

use super::{block, inner};
use crate::tui::app::{App, Scale};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Sparkline};

pub fn render(frame: &mut Frame, area: Rect, app: &App) {
    let scale = if app.histogram_scale == Scale::Log {
        "log count"
    } else {
        "count"
    };
    let histogram = app.selected_tensor().and_then(|t| app.histograms.get(&t));
    let specials = app
        .selected_tensor()
        .and_then(|t| match app.outcomes.get(t) {
            Some(crate::tui::app::Outcome::Moments(m)) => {
                Some(format!(" · NaN {} · ±Inf {}", m.nan, m.pos_inf + m.neg_inf))
            }
            _ => None,
        });
    let title = format!("histogram · {scale}{}", specials.unwrap_or_default());
    frame.render_widget(block(&title, false, app), area);
    let inside = inner(area);
    let Some(histogram) = histogram else {
        let note = match app.selected_tensor() {
            Some(tensor) if app.not_fetched(tensor).is_some() => "not fetched",
            Some(_) => "computing…",
            None => "select a tensor",
        };
        frame.render_widget(Paragraph::new(Line::styled(note, app.theme.dim)), inside);
        return;
    };
    let [bars, axis] = inside.layout(&Layout::vertical([
        Constraint::Min(1),
        Constraint::Length(1),
    ]));
    let width = usize::from(bars.width).max(1);
    let columns = squeeze(&histogram.counts, width);
    let values: Vec<u64> = if app.histogram_scale == Scale::Log {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "scaled log of a count"
        )]
        columns
            .iter()
            .map(|&c| ((c as f64 + 1.0).log10() * 1000.0) as u64)
            .collect()
    } else {
        columns
    };
    frame.render_widget(
        Sparkline::default().data(&values).style(app.theme.bar),
        bars,
    );
    let low = format!("{:.3e}", histogram.min);
    let high = format!("{:.3e}", histogram.max);
    let gap = usize::from(axis.width).saturating_sub(low.len() + high.len());
    frame.render_widget(
        Paragraph::new(Line::styled(
            format!("{low}{}{high}", " ".repeat(gap)),
            app.theme.dim,
        )),
        axis,
    );
}

/// Fits the bins into `width` columns: equal groups of adjacent bins summed when they are too
/// many (unequal groups would draw spikes), each bin repeated when there is room.
fn squeeze(counts: &[u64], width: usize) -> Vec<u64> {
    let width = width.max(1);
    if width >= counts.len() {
        let repeat = width / counts.len().max(1);
        return counts
            .iter()
            .flat_map(|&c| std::iter::repeat_n(c, repeat))
            .collect();
    }
    let group = counts.len().div_ceil(width);
    counts
        .chunks(group)
        .map(|chunk| chunk.iter().sum())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::squeeze;

    #[test]
    fn squeezing_keeps_the_shape() {
        let counts: Vec<u64> = (0..64).collect();
        for width in [1, 7, 30, 63] {
            let columns = squeeze(&counts, width);
            assert!(columns.len() <= width);
            assert_eq!(columns.iter().sum::<u64>(), counts.iter().sum::<u64>());
        }
        assert_eq!(squeeze(&counts, 130).len(), 128);
        assert_eq!(
            squeeze(&[5; 64], 40),
            vec![10; 32],
            "equal groups, no spikes"
        );
    }
}
