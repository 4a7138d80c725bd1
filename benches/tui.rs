//! Explorer speed: one frame of a 100,000-tensor model with the tree fully open, rebuilding the
//! tree after a search keystroke, and the layer map (built on first `M`, then frames with a row
//! per expert and folded, and `Tab`, `e` and `/` each with the frame after it), on ratatui's test
//! backend (200x60).
//!
//! `cargo bench --bench tui [-- PATH]`: PATH defaults to a generated 100,000-tensor model; the
//! DeepSeek-V3 layout (`make_deepseek_layout.py DIR`, header only) is the map's reference.

#![expect(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use ratatui::Terminal;
use ratatui::backend::TestBackend;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stui::analysis::Moments;
use stui::demo::{Fill, SyntheticModel};
use stui::format::{Dtype, Model};
use stui::jobs::ScanEvent;
use stui::layermap::Measure;
use stui::tui::action::Action;
use stui::tui::app::App;
use stui::tui::{Theme, ui};

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn generated(dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    let mut model = SyntheticModel::new(1);
    for layer in 0..200 {
        for expert in 0..256 {
            for projection in ["gate_proj", "up_proj", "down_proj"] {
                let name = format!("model.layers.{layer}.mlp.experts.{expert}.{projection}.weight");
                model = model.tensor(&name, Dtype::Bf16, &[2, 2], Fill::Zeros);
                if model.tensors.len() == 100_000 {
                    let path = dir.join("many.safetensors");
                    model.write(&path)?;
                    return Ok(path);
                }
            }
        }
    }
    anyhow::bail!("200 x 256 x 3 is over 100,000")
}

fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = match std::env::args().skip(1).find(|a| !a.starts_with('-')) {
        Some(path) => PathBuf::from(path),
        None => generated(dir.path())?,
    };
    let model = Arc::new(Model::open(&path)?);
    let started = Instant::now();
    let mut app = App::new(Arc::clone(&model), Theme::new(true));
    let opened = started.elapsed();
    app.update(Action::ExpandAll);
    let mut terminal = Terminal::new(TestBackend::new(200, 60))?;
    let mut frames = Vec::new();
    for round in 0..40 {
        app.update(if round % 2 == 0 {
            Action::Down
        } else {
            Action::Up
        });
        let start = Instant::now();
        terminal
            .draw(|frame| ui::render(frame, &mut app))
            .expect("draw");
        frames.push(start.elapsed());
    }
    app.update(Action::StartSearch);
    let mut keystrokes = Vec::new();
    for c in "layers.1".chars() {
        let start = Instant::now();
        app.update(Action::SearchType(c));
        keystrokes.push(start.elapsed());
    }
    app.update(Action::SearchCancel);
    // The explorer's one cost of the map when opening: a few numbers a tensor.
    let start = Instant::now();
    let values = stui::layermap::Values::new(model.tensors.len());
    let values_made = start.elapsed();
    drop(values);
    let map = layer_map(&mut app, &mut terminal)?;
    println!("tensors                         {}", model.tensors.len());
    println!(
        "app built (tree + outline)      {:>8.2} ms",
        opened.as_secs_f64() * 1e3
    );
    println!(
        "frame, tree fully open, 200x60  {:>8.2} ms median of {}",
        median(frames.clone()).as_secs_f64() * 1e3,
        frames.len()
    );
    println!(
        "search keystroke (rebuild)      {:>8.2} ms median of {}",
        median(keystrokes.clone()).as_secs_f64() * 1e3,
        keystrokes.len()
    );
    println!(
        "map values made (in App::new)   {:>8.2} ms",
        values_made.as_secs_f64() * 1e3
    );
    map.print();
    Ok(())
}

/// Timings of the layer map.
struct MapTimes {
    built: Duration,
    rows: (usize, usize),
    columns: usize,
    first_frame: Duration,
    expanded: Vec<Duration>,
    folded: Vec<Duration>,
    /// A key and the frame after it: `Tab`, `e`, a `/` filter's keystroke; the first time the
    /// rows of a measure and folding are measured, and when they come back.
    keys: Vec<KeyTimes>,
}

struct KeyTimes {
    what: &'static str,
    first: Vec<Duration>,
    again: Vec<Duration>,
}

impl MapTimes {
    fn print(&self) {
        println!(
            "layer map built (first M)       {:>8.2} ms, {} layers, {} rows a row per expert, {} folded",
            self.built.as_secs_f64() * 1e3,
            self.columns,
            self.rows.0,
            self.rows.1
        );
        println!(
            "map first frame (outliers)      {:>8.2} ms",
            self.first_frame.as_secs_f64() * 1e3
        );
        for (what, frames) in [
            ("map frame, a row per expert", &self.expanded),
            ("map frame, experts folded", &self.folded),
        ] {
            println!(
                "{what:<32}{:>8.2} ms median of {}",
                median(frames.clone()).as_secs_f64() * 1e3,
                frames.len()
            );
        }
        for keys in &self.keys {
            for (when, times) in [("first", &keys.first), ("again", &keys.again)] {
                if times.is_empty() {
                    continue;
                }
                println!(
                    "{:<32}{:>8.2} ms median of {}, slowest {:.2} ms",
                    format!("{} + frame, {when}", keys.what),
                    median(times.clone()).as_secs_f64() * 1e3,
                    times.len(),
                    times.iter().max().unwrap_or(&Duration::ZERO).as_secs_f64() * 1e3
                );
            }
        }
    }
}

/// Times `action` and the frame drawn after it.
fn key_and_frame(
    app: &mut App,
    terminal: &mut Terminal<TestBackend>,
    action: Action,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    app.update(action);
    terminal.draw(|frame| ui::render(frame, app))?;
    Ok(start.elapsed())
}

/// Opens the map, gives every tensor statistics (as a finished scan would), and draws it: a
/// row per expert, then folded, moving the cursor between frames.
fn layer_map(app: &mut App, terminal: &mut Terminal<TestBackend>) -> anyhow::Result<MapTimes> {
    let start = Instant::now();
    app.update(Action::ToggleMap);
    let built = start.elapsed();
    for tensor in 0..app.model.tensors.len() {
        let spread = 0.01 + (tensor % 97) as f32 * 1e-4;
        app.on_scan(ScanEvent::Stats {
            tensor,
            moments: Moments::of_f32(&[-spread, 0.0, spread]),
        });
    }
    app.update(Action::MapExperts);
    let rows_expanded = app.map.as_ref().map_or(0, |view| view.rows.len());
    let columns = app.map.as_ref().map_or(0, |view| view.map.columns.len());
    let start = Instant::now();
    terminal.draw(|frame| ui::render(frame, app))?;
    let first_frame = start.elapsed();
    let frames = |app: &mut App, terminal: &mut Terminal<TestBackend>| {
        let mut times = Vec::new();
        for round in 0..40 {
            app.update(match round % 4 {
                0 => Action::Down,
                1 => Action::Right,
                2 => Action::PageDown,
                _ => Action::Left,
            });
            let start = Instant::now();
            terminal.draw(|frame| ui::render(frame, app))?;
            times.push(start.elapsed());
        }
        anyhow::Ok(times)
    };
    let expanded = frames(app, terminal)?;
    app.update(Action::MapExperts);
    let rows_folded = app.map.as_ref().map_or(0, |view| view.rows.len());
    terminal.draw(|frame| ui::render(frame, app))?;
    let folded = frames(app, terminal)?;
    // Tab through the measures with a row per expert, then folded; e back and forth; a filter.
    // Measured so far: std with a row per expert (the first frame), and folded.
    let mut seen = vec![(Measure::Std, false), (Measure::Std, true)];
    let mut keys = Vec::new();
    for (what, actions) in [
        ("Tab (measure)", vec![Action::MapMeasure; 16]),
        ("e (experts)", vec![Action::MapExperts; 16]),
        (
            "/ filter keystroke",
            "proj"
                .chars()
                .map(Action::SearchType)
                .chain(std::iter::repeat_n(Action::SearchDelete, 4))
                .collect(),
        ),
    ] {
        let mut times = KeyTimes {
            what,
            first: Vec::new(),
            again: Vec::new(),
        };
        if what.starts_with('/') {
            app.update(Action::StartSearch);
        }
        for (round, action) in actions.into_iter().enumerate() {
            if what.starts_with('T') && round == 8 {
                app.update(Action::MapExperts);
            }
            let time = key_and_frame(app, terminal, action)?;
            let shown = app.map.as_ref().map(|view| (view.measure, view.folded));
            if let Some(shown) = shown.filter(|shown| !seen.contains(shown)) {
                seen.push(shown);
                times.first.push(time);
            } else {
                times.again.push(time);
            }
        }
        keys.push(times);
    }
    app.update(Action::SearchCancel);
    Ok(MapTimes {
        built,
        rows: (rows_expanded, rows_folded),
        columns,
        first_frame,
        expanded,
        folded,
        keys,
    })
}
