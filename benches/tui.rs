//! Explorer speed: one frame of a 100,000-tensor model with the tree fully open, and rebuilding
//! the tree after a search keystroke, on ratatui's test backend (200x60).
//!
//! `cargo bench --bench tui [-- FILE]`: FILE defaults to a generated 100,000-tensor model.

#![expect(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use ratatui::Terminal;
use ratatui::backend::TestBackend;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stui::demo::{Fill, SyntheticModel};
use stui::format::{Dtype, Model};
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
    Ok(())
}
