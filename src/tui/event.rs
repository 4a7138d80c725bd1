//! Everything the explorer reacts to arrives on one channel: terminal input, scan results and
//! signals, each from its own thread.

use crate::jobs::ScanEvent;
use crate::quantize::{Error8, Granularity, Summary};
use ratatui::crossterm::event as terminal;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::time::Instant;

#[derive(Debug)]
pub enum Event {
    /// A key, mouse or resize event, with when it was read.
    Input(terminal::Event, Instant),
    /// What a scan found, with the number of the scan (of the model opened so far, the first
    /// being 0), so that a model opened in place of another ignores what the old scan still sends.
    Scan(u64, ScanEvent),
    /// SIGTERM or SIGHUP (the SSH connection dropped): leave at once, terminal restored.
    Signal,
    /// A quantization preview of one tensor (`None`: it holds NaN or Inf).
    Preview(usize, Granularity, Result<Option<Error8>, String>),
    /// The comparison of every scheme over the dialog's scope (its include patterns).
    Compared(Vec<String>, Result<crate::quantize::Comparison, String>),
    /// A quantize-and-save ended.
    Saved(Result<Summary, String>),
    /// The comparison with the `--diff` model is done.
    /// The diff with the `--diff` model, for the session of this number.
    Diff(u64, crate::diff::ModelDiff),
    /// Time passed while something shows progress.
    Tick,
}

/// Starts the input and signal threads and returns the channel they feed.
pub fn start() -> (SyncSender<Event>, Receiver<Event>) {
    // Bounded: a scan that outpaces drawing waits rather than piling up results.
    let (sender, receiver) = sync_channel(crate::jobs::EVENT_QUEUE);
    let input = sender.clone();
    // The threads end with the process; a send fails only once the loop has stopped listening.
    let _ = std::thread::Builder::new()
        .name("stui-input".into())
        .spawn(move || {
            while let Ok(event) = terminal::read() {
                if input.send(Event::Input(event, Instant::now())).is_err() {
                    break;
                }
            }
        });
    let signals = sender.clone();
    #[cfg(unix)]
    if let Ok(mut incoming) = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ]) {
        let _ = std::thread::Builder::new()
            .name("stui-signals".into())
            .spawn(move || {
                for _ in incoming.forever() {
                    if signals.send(Event::Signal).is_err() {
                        break;
                    }
                }
            });
    }
    (sender, receiver)
}

/// A sender for a scan's events, forwarded into the explorer's channel.
pub fn forward_scan(sender: &SyncSender<Event>, scan: u64) -> SyncSender<ScanEvent> {
    let (scan_sender, scan_receiver) = sync_channel(crate::jobs::EVENT_QUEUE);
    let sender = sender.clone();
    let _ = std::thread::Builder::new()
        .name("stui-results".into())
        .spawn(move || {
            for event in scan_receiver {
                if sender.send(Event::Scan(scan, event)).is_err() {
                    break;
                }
            }
        });
    scan_sender
}
