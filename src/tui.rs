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
mod screen;
pub mod theme;
pub mod ui;

pub use app::App;
pub use theme::Theme;

use crate::format::Model;
use crate::jobs::{Scan, ScanOptions};
use crate::quantize;
use anyhow::Context as _;
use app::Effect;
use event::Event;
use ratatui::crossterm::event::{self as terminal, KeyEventKind, MouseEventKind};
use screen::ScreenTerminal;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::SyncSender;
use std::time::{Duration, Instant};

/// How the explorer looks and what it records.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Colours (the 16 ANSI ones), or a monochrome theme.
    pub color: bool,
    /// Where to log frame times and input-to-frame latencies.
    pub log: Option<PathBuf>,
    /// A second model to compare with (`--diff`).
    pub diff: Option<PathBuf>,
    /// For a model read from the Hub: the largest tensor fetched for its statistics.
    pub fetch_limit: u64,
}

/// Opens the explorer on the model at `path` and runs it until the user leaves. It draws on
/// standard output when that is a terminal, else on the terminal stui runs in; without one it
/// fails, as it does when a path is not one it can use, before it changes anything on screen.
pub fn run(path: &Path, options: &Options) -> anyhow::Result<()> {
    let (model, _) = crate::arch::open_reviewed(path, None)?;
    let model = Arc::new(model);
    let mut log = match &options.log {
        Some(file) => Some(BufWriter::new(open_log(file).with_context(|| {
            format!("cannot write the log {}", crate::text::escape_path(file))
        })?)),
        None => None,
    };
    let other = match &options.diff {
        Some(other) => Some(crate::arch::open_reviewed(other, None)?),
        None => None,
    };
    let mut terminal = screen::take_over()?;
    // Before the scan starts, so that its workers' panics are never printed over the screen.
    install_restoring_panic_hook();
    let (sender, events) = event::start();
    if let Some((other, other_quantization)) = other {
        let model = Arc::clone(&model);
        let sender = sender.clone();
        std::thread::Builder::new()
            .name("stui-diff".into())
            .spawn(move || {
                let progress = std::sync::atomic::AtomicU64::new(0);
                let (here, there) = (
                    crate::diff::Side::stored(&model),
                    crate::diff::Side::logical(&other, other_quantization.as_ref()),
                );
                let _ = sender.send(Event::Diff(crate::diff::diff(&here, &there, &progress)));
            })
            .context("cannot start the diff")?;
    }
    let mut session = Session::open(model, options, &sender, 0);
    let outcome = event_loop(&mut terminal, &mut session, &sender, &events, log.as_mut());
    screen::give_back();
    if let Some(log) = log.as_mut() {
        let _ = log.flush();
    }
    outcome
}

/// Creates (or empties) the log file, which must be a regular file or not exist yet: a named
/// pipe would wait for a reader, a device is no place for it.
fn open_log(path: &Path) -> std::io::Result<File> {
    crate::paths::look_at_output_file(path)?;
    File::create(path)
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
        screen::give_back();
        previous(info);
    }));
}

/// The model being explored: its state and its scan.
struct Session {
    app: App,
    scan: Scan,
    /// Which scan this is: 0 for the model opened first, one more for each model opened after.
    scan_number: u64,
    color: bool,
    /// For a model read from the Hub, the largest tensor fetched; `None` for local models.
    fetch_limit: Option<u64>,
}

impl Session {
    fn open(
        model: Arc<Model>,
        options: &Options,
        sender: &SyncSender<Event>,
        scan_number: u64,
    ) -> Session {
        let app = App::new(Arc::clone(&model), Theme::new(options.color));
        // A model read from the Hub is scanned only where asked: the tensor selected.
        let fetch_limit = model.remote.is_some().then_some(options.fetch_limit);
        let everything = if fetch_limit.is_some() {
            0..0
        } else {
            0..model.tensors.len()
        };
        let scan_options = ScanOptions {
            serve: true,
            ..ScanOptions::default()
        };
        let events = event::forward_scan(sender, scan_number);
        let scan = Scan::start(model, everything, scan_options, events);
        let session = Session {
            app,
            scan,
            scan_number,
            color: options.color,
            fetch_limit,
        };
        if let Some(Effect::Prioritize(tensor)) = session.app.wanted() {
            session.prioritize(tensor);
        }
        session
    }

    /// Scans a tensor next; one read from the Hub only within the fetch limit.
    fn prioritize(&self, tensor: usize) {
        let len = self.app.model.tensors[tensor].info.byte_len();
        if self.fetch_limit.is_none_or(|limit| len <= limit) {
            self.scan.prioritize(tensor, true);
        }
    }

    /// Carries out what the app asks.
    fn perform(&mut self, effect: Effect, sender: &SyncSender<Event>) {
        match effect {
            Effect::Prioritize(tensor) => self.prioritize(tensor),
            Effect::CancelFetch => {
                // The scan of a model read from the Hub serves requests only: a fresh one
                // takes the place of the one stopped.
                self.scan.cancel();
                let options = ScanOptions {
                    serve: true,
                    ..ScanOptions::default()
                };
                let events = event::forward_scan(sender, self.scan_number);
                self.scan = Scan::start(Arc::clone(&self.app.model), 0..0, options, events);
            }
            Effect::SetPaused(paused) => self.scan.set_paused(paused),
            Effect::Preview(tensors, granularity, compare) => {
                if let Some(options) = compare {
                    let model = Arc::clone(&self.app.model);
                    let sender = sender.clone();
                    let _ = std::thread::Builder::new()
                        .name("stui-compare".into())
                        .spawn(move || {
                            let result =
                                quantize::compare(&model, &options, &quantize::Control::default())
                                    .map_err(|e| e.to_string());
                            let _ = sender.send(Event::Compared(options.include, result));
                        });
                }
                let model = Arc::clone(&self.app.model);
                let sender = sender.clone();
                let _ = std::thread::Builder::new()
                    .name("stui-preview".into())
                    .spawn(move || {
                        for tensor in tensors {
                            let result = quantize::preview(&model, tensor, granularity)
                                .map_err(|e| e.to_string());
                            if sender
                                .send(Event::Preview(tensor, granularity, result))
                                .is_err()
                            {
                                break;
                            }
                        }
                    });
            }
            Effect::Save(options, output, control) => {
                let model = Arc::clone(&self.app.model);
                let (saver, ticker) = (sender.clone(), sender.clone());
                let finished = Arc::new(AtomicBool::new(false));
                let done = Arc::clone(&finished);
                let _ = std::thread::Builder::new()
                    .name("stui-save".into())
                    .spawn(move || {
                        let result = quantize::quantize(&model, &output, &options, &control)
                            .map_err(|e| e.to_string());
                        done.store(true, Ordering::Relaxed);
                        let _ = saver.send(Event::Saved(result));
                    });
                let _ = std::thread::Builder::new()
                    .name("stui-ticks".into())
                    .spawn(move || {
                        while !finished.load(Ordering::Relaxed) && ticker.send(Event::Tick).is_ok()
                        {
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    });
            }
            Effect::Reopen(path) => match crate::arch::open_reviewed(&path, None) {
                Ok((model, _)) => {
                    let options = Options {
                        color: self.color,
                        log: None,
                        diff: None,
                        fetch_limit: self.fetch_limit.unwrap_or(u64::MAX),
                    };
                    *self = Session::open(Arc::new(model), &options, sender, self.scan_number + 1);
                }
                Err(error) => {
                    self.app
                        .on_saved(Err(format!("cannot open {}: {error}", path.display())));
                }
            },
        }
    }
}

fn event_loop(
    terminal: &mut ScreenTerminal,
    session: &mut Session,
    sender: &SyncSender<Event>,
    events: &std::sync::mpsc::Receiver<Event>,
    mut log: Option<&mut BufWriter<File>>,
) -> anyhow::Result<()> {
    let mut dirty = true;
    let mut oldest_input: Option<Instant> = None;
    loop {
        if dirty {
            let started = Instant::now();
            terminal
                .draw(|frame| {
                    crate::fault::inject("draw");
                    ui::render(frame, &mut session.app);
                })
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
        if session.app.should_quit {
            return Ok(());
        }
        let Ok(first) = events.recv() else {
            return Ok(());
        };
        for event in std::iter::once(first).chain(events.try_iter()) {
            let app = &mut session.app;
            let (changed, effect) = match event {
                Event::Input(input, at) => {
                    let outcome = handle_input(app, &input);
                    // Latency is measured for input that changes the screen.
                    if outcome.0 {
                        oldest_input.get_or_insert(at);
                    }
                    outcome
                }
                Event::Scan(scan, result) if scan == session.scan_number => {
                    (app.on_scan(result), None)
                }
                // From the scan of a model since replaced.
                Event::Scan(..) => (false, None),
                Event::Preview(tensor, granularity, result) => {
                    (app.on_preview(tensor, granularity, result), None)
                }
                Event::Saved(result) => (app.on_saved(result), None),
                Event::Compared(include, result) => (app.on_compared(&include, result), None),
                Event::Diff(diff) => (app.on_diff(&diff), None),
                Event::Tick => (app.quantize.is_some(), None),
                Event::Signal => {
                    app.should_quit = true;
                    (true, None)
                }
            };
            dirty |= changed;
            if let Some(effect) = effect {
                session.perform(effect, sender);
                dirty = true;
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
