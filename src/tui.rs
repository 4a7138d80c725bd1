//! The interactive explorer: `stui PATH`. Only this module knows about terminals.
//!
//! It opens the model from its headers alone, draws at once, and starts the scan in the
//! background; scan results, keys and signals arrive on one channel and the screen is redrawn
//! only when something changed, so an idle explorer uses no CPU. The terminal is given back on
//! every way out: quit, Ctrl-C, a panic, SIGTERM, SIGHUP.

pub mod action;
pub mod app;
mod event;
pub mod keymap;
pub mod outline;
pub mod theme;
pub mod ui;

pub use app::App;
pub use theme::Theme;

use crate::format::Model;
use crate::jobs::{Scan, ScanOptions};
use anyhow::Context as _;
use app::Effect;
use event::Event;
use ratatui::crossterm::event::{self as terminal, KeyEventKind, MouseEventKind};
use ratatui::crossterm::execute;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// How the explorer looks and what it records.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Colours (the 16 ANSI ones), or a monochrome theme.
    pub color: bool,
    /// Where to log frame times and input-to-frame latencies.
    pub log: Option<PathBuf>,
}

/// Opens the explorer on the model at `path` and runs it until the user leaves.
pub fn run(path: &Path, options: &Options) -> anyhow::Result<()> {
    let model = Arc::new(Model::open(path)?);
    let mut log = match &options.log {
        Some(file) => {
            Some(BufWriter::new(File::create(file).with_context(|| {
                format!("cannot write the log {}", file.display())
            })?))
        }
        None => None,
    };
    let mut app = App::new(Arc::clone(&model), Theme::new(options.color));
    let (scan_events, events) = event::start();
    let everything = (0..model.tensors.len()).collect();
    let scan = Scan::start(
        model,
        everything,
        ScanOptions {
            serve: true,
            ..ScanOptions::default()
        },
        scan_events,
    );
    if let Some(Effect::Prioritize(tensor)) = app.wanted() {
        scan.prioritize(tensor, true);
    }

    let mut terminal = ratatui::init();
    install_restoring_panic_hook();
    let _ = execute!(std::io::stdout(), terminal::EnableMouseCapture);
    let outcome = event_loop(&mut terminal, &mut app, &events, &scan, log.as_mut());
    restore();
    if let Some(log) = log.as_mut() {
        let _ = log.flush();
    }
    outcome
}

/// Leaves the terminal as it was: mouse capture off, main screen, cooked mode, cursor shown.
fn restore() {
    let _ = execute!(std::io::stdout(), terminal::DisableMouseCapture);
    ratatui::restore();
}

/// Restores the terminal before a panic message is printed. Panics in scan workers are caught
/// and reported as findings, so their message is not printed over the screen.
fn install_restoring_panic_hook() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let name = std::thread::current().name().unwrap_or_default().to_owned();
        if name.starts_with("stui-worker") || name.starts_with("stui-scan") {
            return;
        }
        restore();
        previous(info);
    }));
}

fn event_loop(
    terminal: &mut ratatui::DefaultTerminal,
    app: &mut App,
    events: &std::sync::mpsc::Receiver<Event>,
    scan: &Scan,
    mut log: Option<&mut BufWriter<File>>,
) -> anyhow::Result<()> {
    let mut dirty = true;
    let mut oldest_input: Option<Instant> = None;
    loop {
        if dirty {
            let started = Instant::now();
            terminal
                .draw(|frame| ui::render(frame, app))
                .context("cannot draw")?;
            if let Some(log) = log.as_mut() {
                let latency = oldest_input.map_or_else(String::new, |t| {
                    format!(" latency_ms={:.3}", t.elapsed().as_secs_f64() * 1e3)
                });
                let _ = writeln!(
                    log,
                    "frame_ms={:.3}{latency}",
                    started.elapsed().as_secs_f64() * 1e3
                );
            }
            dirty = false;
            oldest_input = None;
        }
        if app.should_quit {
            return Ok(());
        }
        let Ok(first) = events.recv() else {
            return Ok(());
        };
        for event in std::iter::once(first).chain(events.try_iter()) {
            let (changed, effect) = match event {
                Event::Input(input, at) => {
                    let outcome = handle_input(app, &input);
                    // Latency is measured for input that changes the screen.
                    if outcome.0 {
                        oldest_input.get_or_insert(at);
                    }
                    outcome
                }
                Event::Scan(result) => (app.on_scan(result), None),
                Event::Signal => {
                    app.should_quit = true;
                    (true, None)
                }
            };
            dirty |= changed;
            match effect {
                Some(Effect::Prioritize(tensor)) => scan.prioritize(tensor, true),
                Some(Effect::SetPaused(paused)) => scan.set_paused(paused),
                None => {}
            }
        }
    }
}

fn handle_input(app: &mut App, input: &terminal::Event) -> (bool, Option<Effect>) {
    match input {
        terminal::Event::Key(key) if key.kind != KeyEventKind::Release => {
            keymap::lookup(app.context(), key).map_or((false, None), |action| app.update(action))
        }
        terminal::Event::Mouse(mouse) => match mouse.kind {
            MouseEventKind::ScrollDown => app.scroll(true),
            MouseEventKind::ScrollUp => app.scroll(false),
            MouseEventKind::Down(_) => {
                let row = app.tree_area.and_then(|(x, y, width, height)| {
                    let inside = (x..x + width).contains(&mouse.column)
                        && (y..y + height).contains(&mouse.row);
                    inside.then(|| usize::from(mouse.row - y))
                });
                app.click(row)
            }
            _ => (false, None),
        },
        terminal::Event::Resize(..) => (true, None),
        _ => (false, None),
    }
}
