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
use crate::quant::{LogicalModel, Quantization};
use crate::quantize;
use anyhow::Context as _;
use app::{Effect, Stage};
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
    /// List a quantized model's tensors as stored rather than by the weights they encode.
    pub raw: bool,
    /// The variant of a folder's saves to read (`--variant`); with `diff`, of each model that is
    /// not a file (see [`Model::open_compared`]).
    pub variant: Option<String>,
}

/// Opens the explorer on the model at `path` and runs it until the user leaves. It draws on
/// standard output when that is a terminal, else on the terminal stui runs in; without one it
/// fails, as it does when a path is not one it can use, before it changes anything on screen.
pub fn run(path: &Path, options: &Options) -> anyhow::Result<()> {
    let variant = options.variant.as_deref();
    let (opened, other) = match &options.diff {
        Some(other) => (
            Opened::open(Model::open_compared(path, variant)?),
            Some(Arc::new(Opened::open(Model::open_compared(
                other, variant,
            )?))),
        ),
        None => (Opened::open(Model::open_variant(path, variant)?), None),
    };
    let mut log = match &options.log {
        Some(file) => Some(BufWriter::new(open_log(file).with_context(|| {
            format!("cannot write the log {}", crate::text::escape_path(file))
        })?)),
        None => None,
    };
    let mut terminal = screen::take_over()?;
    // Before the scan starts, so that its workers' panics are never printed over the screen.
    install_restoring_panic_hook();
    let (sender, events) = event::start();
    let mut session = Session::open(opened, other, options.raw, options, &sender, 0);
    let outcome = event_loop(&mut terminal, &mut session, &sender, &events, log.as_mut());
    session.stop_saving(&events);
    screen::give_back();
    if let Some(log) = log.as_mut() {
        let _ = log.flush();
    }
    outcome
}

/// Compares the model with `other` in the background, both listed as the explorer lists them;
/// the result comes tagged with the session's number, so that one for a listing since
/// replaced is dropped.
fn start_diff(
    opened: &Opened,
    other: &Arc<Opened>,
    raw: bool,
    sender: &SyncSender<Event>,
    session: u64,
) {
    let (here, there) = (opened.clone(), Arc::clone(other));
    let sender = sender.clone();
    let _ = std::thread::Builder::new()
        .name("stui-diff".into())
        .spawn(move || {
            let progress = std::sync::atomic::AtomicU64::new(0);
            let diff = crate::diff::diff(&here.side(raw), &there.side(raw), &progress);
            let _ = sender.send(Event::Diff(session, diff));
        });
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

/// A model as opened, and how it is quantized.
#[derive(Clone)]
struct Opened {
    model: Arc<Model>,
    quantization: Option<Arc<Quantization>>,
}

impl Opened {
    /// `model`, reviewed (see [`crate::arch::reviewed`]).
    fn open(model: Model) -> Opened {
        let (model, quantization) = crate::arch::reviewed(model, None);
        Opened {
            model: Arc::new(model),
            quantization: quantization.map(Arc::new),
        }
    }

    /// The model as listed: a quantized model by its logical weights unless `raw`, with what
    /// stands behind them.
    fn listed(&self, raw: bool) -> (Arc<Model>, Option<Arc<LogicalModel>>) {
        match self.quantization.as_ref().filter(|_| !raw) {
            Some(quantization) => {
                let (listed, logical) =
                    LogicalModel::open(Arc::clone(&self.model), Arc::clone(quantization));
                (Arc::new(listed), Some(Arc::new(logical)))
            }
            None => (Arc::clone(&self.model), None),
        }
    }

    /// The side a diff compares: listed as the explorer lists it.
    fn side(&self, raw: bool) -> crate::diff::Side<'_> {
        if raw {
            crate::diff::Side::stored(&self.model)
        } else {
            crate::diff::Side::logical(&self.model, self.quantization.as_deref())
        }
    }
}

/// The model being explored: its state and its scan.
struct Session {
    app: App,
    scan: Scan,
    opened: Opened,
    /// The model compared with (`--diff`).
    other: Option<Arc<Opened>>,
    /// A quantized model is listed as stored rather than by its logical weights.
    raw: bool,
    /// Which scan this is: 0 for the model opened first, one more for each model opened after.
    scan_number: u64,
    color: bool,
}

impl Session {
    fn open(
        opened: Opened,
        other: Option<Arc<Opened>>,
        raw: bool,
        options: &Options,
        sender: &SyncSender<Event>,
        scan_number: u64,
    ) -> Session {
        let (model, logical) = opened.listed(raw);
        let mut app = App::new(Arc::clone(&model), Theme::new(options.color));
        app.set_quantization(opened.quantization.clone(), logical.clone());
        app.fetch_limit = model.remote.is_some().then_some(options.fetch_limit);
        if let Some(other) = &other {
            start_diff(&opened, other, raw, sender, scan_number);
        }
        // A model read from the Hub is scanned only where asked: the tensor selected.
        let everything = if app.fetch_limit.is_some() {
            0..0
        } else {
            0..model.tensors.len()
        };
        let scan_options = ScanOptions {
            serve: true,
            logical,
            ..ScanOptions::default()
        };
        let events = event::forward_scan(sender, scan_number);
        let scan = Scan::start(model, everything, scan_options, events);
        let session = Session {
            app,
            scan,
            opened,
            other,
            raw,
            scan_number,
            color: options.color,
        };
        if let Some(Effect::Prioritize(tensor)) = session.app.wanted() {
            session.prioritize(tensor);
        }
        session
    }

    /// Stops a save under way and waits, ten seconds at most, for it to remove what it wrote: a
    /// process ended under it would leave its temporary files in the output folder.
    fn stop_saving(&self, events: &std::sync::mpsc::Receiver<Event>) {
        let Some(dialog) = &self.app.quantize else {
            return;
        };
        let Stage::Saving(control) = &dialog.stage else {
            return;
        };
        control.cancelled.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match events.recv_timeout(left) {
                Ok(Event::Saved(_)) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }

    /// The options this session was opened with, as far as a session opened after it keeps them.
    fn options(&self) -> Options {
        Options {
            color: self.color,
            log: None,
            diff: None,
            fetch_limit: self.app.fetch_limit.unwrap_or(u64::MAX),
            raw: self.raw,
            // A session opened after this one opens a file written, not a folder.
            variant: None,
        }
    }

    /// Scans a tensor next; one read from the Hub only within the fetch limit.
    fn prioritize(&self, tensor: usize) {
        if self.app.not_fetched(tensor).is_none() {
            self.scan.prioritize(tensor, true);
        }
    }

    /// Compares every scheme over `options`' scope on a thread of its own, its progress
    /// redrawn as it goes; a comparison cancelled (the dialog closed or compared again) says
    /// nothing when it ends.
    fn compare_in_background(
        model: &Arc<Model>,
        options: quantize::Options,
        control: Arc<quantize::Control>,
        sender: &SyncSender<Event>,
    ) {
        let model = Arc::clone(model);
        let (reporter, ticker) = (sender.clone(), sender.clone());
        let finished = Arc::new(AtomicBool::new(false));
        let (done, watched) = (Arc::clone(&finished), Arc::clone(&control));
        let _ = std::thread::Builder::new()
            .name("stui-compare".into())
            .spawn(move || {
                let result =
                    quantize::compare(&model, &options, &control).map_err(|e| e.to_string());
                done.store(true, Ordering::Relaxed);
                if !control.cancelled.load(Ordering::Relaxed) {
                    let _ = reporter.send(Event::Compared(options.include, result));
                }
            });
        tick_while(ticker, move || {
            !finished.load(Ordering::Relaxed) && !watched.cancelled.load(Ordering::Relaxed)
        });
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
                    logical: self.app.logical.clone(),
                    ..ScanOptions::default()
                };
                let events = event::forward_scan(sender, self.scan_number);
                self.scan = Scan::start(Arc::clone(&self.app.model), 0..0, options, events);
            }
            Effect::SetPaused(paused) => self.scan.set_paused(paused),
            Effect::Preview(tensors, granularity, previewing, compare) => {
                if let Some((options, control)) = compare {
                    Self::compare_in_background(&self.app.model, options, control, sender);
                }
                let model = Arc::clone(&self.app.model);
                let sender = sender.clone();
                let _ = std::thread::Builder::new()
                    .name("stui-preview".into())
                    .spawn(move || {
                        for tensor in tensors {
                            if previewing.cancelled.load(Ordering::Relaxed) {
                                break;
                            }
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
                tick_while(ticker, move || !finished.load(Ordering::Relaxed));
            }
            Effect::ToggleRaw => {
                let options = self.options();
                *self = Session::open(
                    self.opened.clone(),
                    self.other.clone(),
                    !self.raw,
                    &options,
                    sender,
                    self.scan_number + 1,
                );
            }
            Effect::Reopen(path) => match Model::open(&path).map(Opened::open) {
                Ok(opened) => {
                    let options = Options {
                        diff: None,
                        ..self.options()
                    };
                    *self = Session::open(
                        opened,
                        None,
                        self.raw,
                        &options,
                        sender,
                        self.scan_number + 1,
                    );
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
                Event::Preview(tensor, granularity, result) => {
                    (app.on_preview(tensor, granularity, result), None)
                }
                Event::Saved(result) => (app.on_saved(result), None),
                Event::Compared(include, result) => (app.on_compared(&include, result), None),
                Event::Diff(session_number, diff) if session_number == session.scan_number => {
                    (app.on_diff(&diff), None)
                }
                // From the scan or the diff of a listing since replaced.
                Event::Scan(..) | Event::Diff(..) => (false, None),
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

/// Sends a tick ten times a second, for the progress of work in the background to be redrawn,
/// while `running` holds and the app listens.
fn tick_while(ticker: SyncSender<Event>, running: impl Fn() -> bool + Send + 'static) {
    let _ = std::thread::Builder::new()
        .name("stui-ticks".into())
        .spawn(move || {
            while running() && ticker.send(Event::Tick).is_ok() {
                std::thread::sleep(Duration::from_millis(100));
            }
        });
}
