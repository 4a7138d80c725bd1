//! The scan: reads every chosen tensor's data in the background and streams statistics,
//! histograms, findings and progress on a channel, ending with exactly one of `Done` or
//! `Cancelled`.
//!
//! A coordinator thread takes tensors in file order (a prioritized tensor first) and hands them
//! to a rayon pool: small tensors in batches, one per worker, large ones split into chunks that
//! all workers share and whose statistics merge exactly. Each chunk is read through its own
//! short-lived memory map ([`crate::format::mapped`]), so memory stays bounded whatever the
//! model's size, and a file that shrinks or is replaced under the scan gives an I/O finding for
//! the tensors it affects, never a crash. Cancel is checked before every chunk. A failure on one
//! tensor (an I/O error, a panic in a worker) becomes a finding and the scan goes on.

pub mod dequantized;

use crate::analysis::checks::{self, Limits, Spread};
use crate::analysis::{self, Histogram, HistogramBuilder, Moments, values};
use crate::finding::{Code, Finding};
use crate::format::mapped::with_mapped;
use crate::format::remote::RemoteModel;
use crate::format::{Dtype, Model, Tensor};
use crate::quant::LogicalModel;
use crate::quant::kernels::CodeCounts;
use fixedbitset::FixedBitSet;
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes read at a time from the Hub, a request each.
const CHUNK: usize = crate::format::remote::RANGE_BYTES;

/// Bytes read at a time from a local file, a multiple of the same: a chunk copied into the
/// reading thread's buffer is still in the core's cache (2 MiB of L2 here) when it is scanned.
/// Chunks of 12 MiB went out to memory and came back: 1.5 MiB ones made `stats` 22% faster.
const LOCAL_CHUNK: usize = 3 << 19;

/// The statistics of each [`LOCAL_CHUNK`] of `bytes` (which start at a multiple of it in their
/// tensor). A tensor's statistics are those of its pieces merged in order ([`merged`]), whatever
/// size it was read in: the same to the last digit from a local file or from the Hub, and from
/// one run to the next, where merges in the order the workers finished moved the last digits.
fn pieces_moments(dtype: Dtype, bytes: &[u8]) -> impl Iterator<Item = Moments> {
    bytes
        .chunks(LOCAL_CHUNK)
        .map(move |piece| analysis::moments_of(dtype, piece))
}

/// `pieces` merged in order.
fn merged(pieces: impl IntoIterator<Item = Moments>) -> Moments {
    pieces.into_iter().fold(Moments::EMPTY, |mut total, piece| {
        total.merge(&piece);
        total
    })
}

/// Tensors up to this size are scanned whole by one worker, several at a time.
const SMALL: u64 = 1 << 20;

/// Most logical weights in one batch.
const LOGICAL_BATCH: usize = 4;

/// Most tensors in one batch, so that a header of a million tiny tensors is still scanned (and
/// reported, and cancelled) a batch at a time.
const MAX_BATCH: usize = 1024;

/// How often progress is reported at most.
const PROGRESS_EVERY: Duration = Duration::from_millis(50);

/// What a scan reports.
#[derive(Debug)]
pub enum ScanEvent {
    /// Work on a large tensor began.
    Started {
        tensor: usize,
    },
    /// A tensor's statistics.
    Stats {
        tensor: usize,
        moments: Moments,
    },
    /// A tensor's histogram (when asked for).
    Histogram {
        tensor: usize,
        histogram: Histogram,
    },
    /// How many elements of a logical weight hold each of its codes (with its histogram).
    Codes {
        tensor: usize,
        codes: CodeCounts,
    },
    /// A tensor could not be scanned; the finding says why.
    Failed {
        tensor: usize,
        finding: Finding,
    },
    /// A finding about the values.
    Finding(Finding),
    Progress(Progress),
    /// The last event of a scan that ran to its end.
    Done(Progress),
    /// The last event of a cancelled scan.
    Cancelled,
}

/// A good bound for a scan's event channel: room for the results of many small tensors while
/// the reader is busy, and a small fraction of a large model's.
pub const EVENT_QUEUE: usize = 1024;

/// How far a scan has come.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Progress {
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub tensors_done: usize,
    pub tensors_total: usize,
    pub elapsed: Duration,
}

impl Progress {
    /// Bytes per second so far.
    pub fn rate(&self) -> f64 {
        self.bytes_done as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Bytes per second so far, in whole bytes.
    pub fn bytes_per_second(&self) -> u64 {
        let micros = u64::try_from(self.elapsed.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        u64::try_from(u128::from(self.bytes_done) * 1_000_000 / u128::from(micros))
            .unwrap_or(u64::MAX)
    }

    /// Estimated time to finish at the rate so far.
    pub fn remaining(&self) -> Option<Duration> {
        let rate = self.rate();
        (rate > 0.0).then(|| {
            Duration::from_secs_f64(
                (self.bytes_total.saturating_sub(self.bytes_done)) as f64 / rate,
            )
        })
    }
}

#[derive(Clone, Debug, Default)]
pub struct ScanOptions {
    /// Worker threads; all cores when `None`.
    pub threads: Option<usize>,
    /// Compute every tensor's histogram too (a second pass over the data).
    pub histograms: bool,
    /// Start paused (until [`Scan::set_paused`] resumes it).
    pub paused: bool,
    /// After `Done`, keep serving [`Scan::prioritize`] requests (statistics and histograms for
    /// the explorer) until cancelled; the scan then ends with `Cancelled`.
    pub serve: bool,
    pub order: ScanOrder,
    pub limits: Limits,
    /// For a quantized model listed by its logical weights: those are dequantized from the
    /// stored model behind them rather than read.
    pub logical: Option<Arc<LogicalModel>>,
}

/// The order tensors are scanned in (a tensor asked for with [`Scan::prioritize`] comes first).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ScanOrder {
    /// The order of their data in the files, which reads each file front to back.
    #[default]
    Files,
    /// The order given: for output in that order, which tensors finished out of turn would
    /// wait for in memory.
    Given,
}

/// A running scan. Dropping it cancels the scan.
#[derive(Debug)]
pub struct Scan {
    control: Arc<Control>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct Control {
    cancelled: AtomicBool,
    paused: AtomicBool,
    /// Tensors to scan next, most recent request last; `true` also asks for the histogram.
    requests: Mutex<Vec<(usize, bool)>>,
    /// Wakes a scan that has finished and waits for requests.
    wake: std::sync::Condvar,
}

impl Scan {
    /// Starts scanning `tensors` (indices into `model.tensors`; a range takes no memory) and
    /// returns at once.
    ///
    /// `events` is a bounded channel (of [`EVENT_QUEUE`] events, say): a reader that falls
    /// behind holds the workers back rather than letting a million results pile up in the
    /// channel. A reader that stops reading before `Done` or `Cancelled` must drop its receiver.
    pub fn start(
        model: Arc<Model>,
        tensors: impl IntoIterator<Item = usize, IntoIter: Clone + Send + 'static>,
        options: ScanOptions,
        events: SyncSender<ScanEvent>,
    ) -> Scan {
        let tensors = tensors.into_iter();
        let control = Arc::new(Control::default());
        control.paused.store(options.paused, Ordering::Relaxed);
        let worker_control = Arc::clone(&control);
        let thread = std::thread::Builder::new()
            .name("stui-scan".into())
            .spawn(move || coordinate(&model, tensors, &options, &worker_control, &events))
            .ok();
        Scan { control, thread }
    }

    /// Stops the scan; the scan sends `Cancelled` once the chunks under way are done.
    pub fn cancel(&self) {
        self.control.cancelled.store(true, Ordering::Relaxed);
        self.control.wake.notify_all();
    }

    pub fn set_paused(&self, paused: bool) {
        self.control.paused.store(paused, Ordering::Relaxed);
    }

    pub fn is_paused(&self) -> bool {
        self.control.paused.load(Ordering::Relaxed)
    }

    /// Scans `tensor` next (again, if it was scanned already and `histogram` is asked for: its
    /// statistics are then sent again, its findings not).
    pub fn prioritize(&self, tensor: usize, histogram: bool) {
        let mut requests = self
            .control
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        requests.retain(|&(t, _)| t != tensor);
        requests.push((tensor, histogram));
        self.control.wake.notify_all();
    }

    /// Waits for the scan thread to end.
    pub fn wait(mut self) {
        if let Some(thread) = self.thread.take() {
            // A panic in the coordinator has already been reported through the panic hook.
            let _ = thread.join();
        }
    }
}

impl Drop for Scan {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// Counts bytes done across workers and reports progress now and then.
struct Tracker<'a> {
    bytes_done: AtomicU64,
    bytes_total: u64,
    tensors_total: usize,
    tensors_done: AtomicU64,
    started: Instant,
    last_report: Mutex<Instant>,
    events: &'a SyncSender<ScanEvent>,
}

impl Tracker<'_> {
    fn progress(&self) -> Progress {
        Progress {
            bytes_done: self.bytes_done.load(Ordering::Relaxed),
            bytes_total: self.bytes_total,
            tensors_done: usize::try_from(self.tensors_done.load(Ordering::Relaxed))
                .unwrap_or(usize::MAX),
            tensors_total: self.tensors_total,
            elapsed: self.started.elapsed(),
        }
    }

    fn advance(&self, bytes: u64) {
        self.bytes_done.fetch_add(bytes, Ordering::Relaxed);
        let mut last = self
            .last_report
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if last.elapsed() >= PROGRESS_EVERY {
            *last = Instant::now();
            // A closed channel means nobody listens any more; the scan stops at its next check.
            let _ = self.events.send(ScanEvent::Progress(self.progress()));
        }
    }
}

/// Why a tensor's scan stopped early.
enum Stop {
    Cancelled,
    Io(io::Error),
    /// A logical weight's members do not fit its layout.
    Dequantize(String),
}

fn coordinate(
    model: &Model,
    tensors: impl Iterator<Item = usize> + Clone,
    options: &ScanOptions,
    control: &Control,
    events: &SyncSender<ScanEvent>,
) {
    let files: Vec<Option<Bytes>> = match &model.remote {
        Some(remote) => (0..model.shards.len())
            .map(|shard| Some(Bytes::Remote(remote, shard)))
            .collect(),
        None => model
            .shards
            .iter()
            .map(|s| crate::paths::open_file(&s.path).ok().map(Bytes::Local))
            .collect(),
    };
    let mut scannable_set = FixedBitSet::with_capacity(model.tensors.len());
    let (mut count, mut bytes) = (0, 0u64);
    let file_order = |t: usize| {
        let tensor = &model.tensors[t];
        (tensor.shard, tensor.info.data_offsets)
    };
    let mut in_file_order = true;
    let mut previous = None;
    let logical = |t: usize| logical_weight(options, t).is_some();
    for tensor in tensors.clone() {
        if !logical(tensor) && !scannable(model, &model.tensors[tensor]) {
            let finding = Finding::info(
                Code::DataUnreadable,
                "not scanned: its entry is invalid (see the format findings)",
            )
            .for_tensor(model.tensors[tensor].name());
            let _ = events.send(ScanEvent::Failed { tensor, finding });
            continue;
        }
        scannable_set.insert(tensor);
        count += 1;
        bytes = bytes.saturating_add(model.tensors[tensor].info.byte_len());
        in_file_order &= previous.is_none_or(|p| p <= file_order(tensor));
        previous = Some(file_order(tensor));
    }
    let mut queue = if options.order == ScanOrder::Given || in_file_order {
        Queue::AsGiven(tensors.peekable())
    } else {
        // Tensor indices as `u32` (a header of 100 MB holds far fewer), sorted in place (a
        // stable sort would take a buffer half the list's size): the list of a million-tensor
        // model is counted against the memory bound.
        let mut sorted: Vec<u32> = tensors
            .filter(|&t| scannable_set.contains(t))
            .filter_map(|t| u32::try_from(t).ok())
            .collect();
        sorted.sort_unstable_by_key(|&t| (file_order(t as usize), t));
        Queue::Sorted(sorted.into())
    };
    let passes = if options.histograms { 2 } else { 1 };
    let tracker = Tracker {
        bytes_done: AtomicU64::new(0),
        bytes_total: bytes * passes,
        tensors_total: count,
        tensors_done: AtomicU64::new(0),
        started: Instant::now(),
        last_report: Mutex::new(Instant::now()),
        events,
    };
    let Ok(pool) = rayon::ThreadPoolBuilder::new()
        .num_threads(options.threads.unwrap_or(0))
        .thread_name(|i| format!("stui-worker-{i}"))
        .build()
    else {
        let _ = events.send(ScanEvent::Cancelled);
        return;
    };
    let mut coordinator = Coordinator {
        scanner: Scanner {
            count_histograms: options.histograms,
            model,
            files: &files,
            control,
            tracker: &tracker,
        },
        pool,
        options,
        events,
        scannable: scannable_set,
        done: FixedBitSet::with_capacity(model.tensors.len()),
        spreads: Vec::new(),
    };
    let ended = coordinator.run(&mut queue);
    if ended == Ended::Finished {
        coordinator.finish();
        if options.serve {
            coordinator.serve();
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    Finished,
    Stopped,
}

/// A tensor's scan as it came back from the workers: its statistics, why it stopped, or the
/// message of a panic.
type Outcome = Result<Result<(Moments, Option<Histogram>), Stop>, String>;

/// The tensors left to scan, in the order they are scanned in.
enum Queue<I: Iterator<Item = usize>> {
    /// As given, already in the order wanted: nothing is kept.
    AsGiven(std::iter::Peekable<I>),
    /// Put in file order.
    Sorted(VecDeque<u32>),
}

impl<I: Iterator<Item = usize>> Queue<I> {
    fn front(&mut self) -> Option<usize> {
        match self {
            Queue::AsGiven(tensors) => tensors.peek().copied(),
            Queue::Sorted(tensors) => tensors.front().map(|&t| t as usize),
        }
    }

    fn pop_front(&mut self) {
        match self {
            Queue::AsGiven(tensors) => {
                tensors.next();
            }
            Queue::Sorted(tensors) => {
                tensors.pop_front();
            }
        }
    }
}

struct Coordinator<'a> {
    scanner: Scanner<'a>,
    pool: rayon::ThreadPool,
    options: &'a ScanOptions,
    events: &'a SyncSender<ScanEvent>,
    scannable: FixedBitSet,
    done: FixedBitSet,
    /// The spread of each float tensor scanned, by tensor, for the checks that compare layers at
    /// the end; [`Spread::NONE`] for the others. Made at its full size (16 bytes a tensor, no
    /// `Option` tag) when the first float tensor is scanned rather than grown by doubling, as a
    /// model can have a million tensors; empty while none is.
    spreads: Vec<Spread>,
}

impl Coordinator<'_> {
    /// Scans until the queue is empty (`Finished`), or the scan is cancelled or nobody listens.
    fn run(&mut self, queue: &mut Queue<impl Iterator<Item = usize>>) -> Ended {
        let control = self.scanner.control;
        loop {
            while control.paused.load(Ordering::Relaxed)
                && !control.cancelled.load(Ordering::Relaxed)
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            if control.cancelled.load(Ordering::Relaxed) {
                let _ = self.events.send(ScanEvent::Cancelled);
                return Ended::Stopped;
            }
            let Some(batch) = self.next_batch(queue) else {
                return Ended::Finished;
            };
            if batch.is_empty() {
                continue;
            }
            for (tensor, histogram, outcome) in self.scan(&batch) {
                if self.report(tensor, histogram, outcome) == Ended::Stopped {
                    return Ended::Stopped;
                }
            }
            let _ = self
                .events
                .send(ScanEvent::Progress(self.scanner.tracker.progress()));
        }
    }

    /// The next tensors to scan: a prioritized one alone, or small tensors in file order up to a
    /// few megabytes, or one large tensor. `None` when nothing is left; empty to look again.
    fn next_batch(
        &self,
        queue: &mut Queue<impl Iterator<Item = usize>>,
    ) -> Option<Vec<(usize, bool)>> {
        let control = self.scanner.control;
        let request = control
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        if let Some((tensor, histogram)) = request {
            // A tensor outside the list scanned (the explorer lists none of a model read from
            // the Hub) is scanned when asked for, if its entry allows.
            let model = self.scanner.model;
            let can = self.scannable.contains(tensor)
                || logical_weight(self.options, tensor).is_some()
                || scannable(model, &model.tensors[tensor]);
            let wanted = can && (!self.done.contains(tensor) || histogram);
            return Some(if wanted {
                vec![(tensor, histogram || self.options.histograms)]
            } else {
                Vec::new()
            });
        }
        let mut batch = Vec::new();
        let mut bytes = 0;
        while let Some(tensor) = queue.front() {
            if self.done.contains(tensor) || !self.scannable.contains(tensor) {
                queue.pop_front();
                continue;
            }
            // Logical weights go a few at a time, each over all workers, so that one's members
            // are read and mapped while another's rows are read.
            if logical_weight(self.options, tensor).is_some() {
                let logical_batch = batch
                    .first()
                    .is_some_and(|&(t, _)| logical_weight(self.options, t).is_some());
                if !batch.is_empty() && (!logical_batch || batch.len() == LOGICAL_BATCH) {
                    break;
                }
                queue.pop_front();
                batch.push((tensor, self.options.histograms));
                continue;
            }
            let len = self.scanner.model.tensors[tensor].info.byte_len();
            let large = len > SMALL;
            let full = bytes + len > 8 * SMALL || batch.len() == MAX_BATCH;
            let after_logical = batch
                .first()
                .is_some_and(|&(t, _)| logical_weight(self.options, t).is_some());
            if !batch.is_empty() && (large || full || after_logical) {
                break;
            }
            queue.pop_front();
            batch.push((tensor, self.options.histograms));
            bytes += len;
            if large {
                break;
            }
        }
        (!batch.is_empty()).then_some(batch)
    }

    /// Scans a batch: one tensor over all workers, several logical weights each over all
    /// workers, or several small tensors, one per worker.
    fn scan(&self, batch: &[(usize, bool)]) -> Vec<(usize, bool, Outcome)> {
        use rayon::prelude::*;
        let weights: Option<Vec<_>> = batch
            .iter()
            .map(|&(tensor, histogram)| {
                logical_weight(self.options, tensor).map(|found| (tensor, histogram, found))
            })
            .collect();
        if let Some(weights) = weights.filter(|w| w.len() > 1) {
            for &(tensor, _, _) in &weights {
                let _ = self.events.send(ScanEvent::Started { tensor });
            }
            return self.pool.install(|| {
                weights
                    .par_iter()
                    .map(|&(tensor, histogram, (logical, weight))| {
                        let counted = !self.done.contains(tensor);
                        let outcome = guarded(|| {
                            self.scanner
                                .dequantized((tensor, logical, weight), histogram, counted)
                        });
                        (tensor, histogram, outcome)
                    })
                    .collect()
            });
        }
        if let [(tensor, histogram)] = *batch {
            let _ = self.events.send(ScanEvent::Started { tensor });
            // A tensor of one chunk is read once for its statistics and its histogram (a read
            // from the Hub is a request); a larger one is spread over the workers.
            let one_chunk = self.scanner.model.tensors[tensor].info.byte_len()
                <= self.scanner.chunk_len(tensor) as u64;
            let logical = logical_weight(self.options, tensor);
            let outcome = guarded(|| {
                self.pool.install(|| {
                    let counted = !self.done.contains(tensor);
                    if let Some((logical, weight)) = logical {
                        self.scanner
                            .dequantized((tensor, logical, weight), histogram, counted)
                    } else if one_chunk {
                        self.scanner.small_tensor(tensor, histogram, counted)
                    } else {
                        self.scanner
                            .moments(tensor, counted)
                            .map(|moments| (moments, None))
                    }
                })
            });
            return vec![(tensor, histogram, outcome)];
        }
        self.pool.install(|| {
            batch
                .par_iter()
                .map(|&(t, h)| {
                    let counted = !self.done.contains(t);
                    (t, h, guarded(|| self.scanner.small_tensor(t, h, counted)))
                })
                .collect()
        })
    }

    /// Sends what a tensor's scan found, and its histogram if asked for.
    fn report(&mut self, tensor: usize, histogram: bool, outcome: Outcome) -> Ended {
        let name = self.scanner.model.tensors[tensor].name();
        let (moments, made_histogram) = match outcome {
            Ok(Ok(result)) => result,
            Ok(Err(Stop::Cancelled)) => {
                let _ = self.events.send(ScanEvent::Cancelled);
                return Ended::Stopped;
            }
            Ok(Err(Stop::Io(error))) => {
                return self.fail(tensor, Code::DataUnreadable, read_failure(&error));
            }
            Ok(Err(Stop::Dequantize(message))) => {
                return self.fail(tensor, Code::DataUnreadable, message);
            }
            Err(panic) => {
                return self.fail(tensor, Code::ScanFailed, format!("internal error: {panic}"));
            }
        };
        // A tensor asked for again (the explorer keeps few tensors' statistics) gets its
        // statistics again, but its findings and its progress only once.
        let first_time = !self.done.contains(tensor);
        // A logical weight's values are its dequantized ones.
        let dtype = if logical_weight(self.options, tensor).is_some() {
            Some(Dtype::F32)
        } else {
            self.scanner.model.tensors[tensor].info.dtype.known()
        };
        if first_time {
            self.done.insert(tensor);
            self.scanner
                .tracker
                .tensors_done
                .fetch_add(1, Ordering::Relaxed);
            if let Some(spread) =
                Spread::of(&moments).filter(|_| dtype.is_some_and(Dtype::is_float))
            {
                if self.spreads.is_empty() {
                    self.spreads = vec![Spread::NONE; self.scanner.model.tensors.len()];
                }
                self.spreads[tensor] = spread;
            }
        }
        if self
            .events
            .send(ScanEvent::Stats { tensor, moments })
            .is_err()
        {
            return Ended::Stopped;
        }
        if first_time && let Some(dtype) = dtype {
            // A quantized weight's stored settings (shapes, zero points, flags) are constant by
            // design.
            let settings =
                crate::quant::members::classify(name).is_some_and(|m| m.role.holds_settings());
            for finding in checks::tensor_findings(name, dtype, &moments, &self.options.limits) {
                let by_design = matches!(finding.code, Code::ValuesAllZero | Code::ValuesConstant);
                if !(settings && by_design) {
                    let _ = self.events.send(ScanEvent::Finding(finding));
                }
            }
        }
        if !histogram {
            return Ended::Finished;
        }
        if let Some(histogram) = made_histogram {
            let _ = self.events.send(ScanEvent::Histogram { tensor, histogram });
            return Ended::Finished;
        }
        match guarded(|| {
            self.pool
                .install(|| self.scanner.histogram(tensor, &moments, first_time))
        }) {
            Ok(Ok(histogram)) => {
                let _ = self.events.send(ScanEvent::Histogram { tensor, histogram });
                Ended::Finished
            }
            Ok(Err(Stop::Cancelled)) => {
                let _ = self.events.send(ScanEvent::Cancelled);
                Ended::Stopped
            }
            Ok(Err(Stop::Io(error))) => {
                self.fail(tensor, Code::DataUnreadable, read_failure(&error))
            }
            Ok(Err(Stop::Dequantize(message))) => self.fail(tensor, Code::DataUnreadable, message),
            Err(panic) => self.fail(tensor, Code::ScanFailed, format!("internal error: {panic}")),
        }
    }

    fn fail(&mut self, tensor: usize, code: Code, message: String) -> Ended {
        self.done.insert(tensor);
        let finding =
            Finding::error(code, message).for_tensor(self.scanner.model.tensors[tensor].name());
        if self
            .events
            .send(ScanEvent::Failed { tensor, finding })
            .is_err()
        {
            Ended::Stopped
        } else {
            Ended::Finished
        }
    }

    /// Answers requests until the scan is cancelled.
    fn serve(&mut self) {
        let control = self.scanner.control;
        let mut empty: Queue<std::iter::Empty<usize>> =
            Queue::AsGiven(std::iter::empty().peekable());
        loop {
            {
                let requests = control
                    .requests
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let waiting = control
                    .wake
                    .wait_while(requests, |r| {
                        r.is_empty() && !control.cancelled.load(Ordering::Relaxed)
                    })
                    .unwrap_or_else(PoisonError::into_inner);
                drop(waiting);
            }
            if self.run(&mut empty) == Ended::Stopped {
                return;
            }
        }
    }

    /// The findings that need every tensor, then `Done`.
    fn finish(&self) {
        let model = self.scanner.model;
        let spreads = &self.spreads;
        let scanned = (0..spreads.len())
            .filter(|&t| !spreads[t].is_none())
            .filter_map(|t| u32::try_from(t).ok());
        checks::layer_outliers(
            scanned,
            |tensor| model.tensors[tensor as usize].name(),
            |tensor| spreads[tensor as usize],
            &self.options.limits,
            |finding| {
                let _ = self.events.send(ScanEvent::Finding(finding));
            },
        );
        let _ = self
            .events
            .send(ScanEvent::Done(self.scanner.tracker.progress()));
    }
}

/// The logical weight listed tensor `tensor` is, with the model behind it.
fn logical_weight(options: &ScanOptions, tensor: usize) -> Option<(&LogicalModel, usize)> {
    let logical = options.logical.as_deref()?;
    logical.weight(tensor).map(|weight| (logical, weight))
}

/// A histogram builder over the range `moments` found.
fn builder_for(moments: &Moments) -> HistogramBuilder {
    if moments.finite() > 0 {
        HistogramBuilder::new(moments.min, moments.max)
    } else {
        HistogramBuilder::new(0.0, 0.0)
    }
}

/// The histogram of the values `feed` gives, over the range `moments` found.
fn histogram_of(moments: &Moments, feed: impl FnOnce(&mut HistogramBuilder)) -> Histogram {
    let mut builder = builder_for(moments);
    feed(&mut builder);
    builder.finish()
}

/// Whether a tensor's entry is sound enough to read its data: a known dtype, a size that matches
/// its shape, and bytes inside its file.
fn scannable(model: &Model, tensor: &Tensor) -> bool {
    let shard = model.shard_of(tensor);
    let info = &tensor.info;
    let [begin, end] = info.data_offsets;
    let expected = info
        .dtype
        .known()
        .zip(info.element_count())
        .and_then(|(d, n)| d.byte_len(n));
    let data_len = shard.file_len.saturating_sub(shard.data_start);
    shard.readable && expected == Some(end.saturating_sub(begin)) && end >= begin && end <= data_len
}

fn read_failure(error: &io::Error) -> String {
    if error.kind() == io::ErrorKind::UnexpectedEof {
        "the file ends before this tensor's data does: it shrank or was replaced while stui read it"
            .into()
    } else {
        format!("cannot read the data: {error}")
    }
}

/// Runs `work`, turning a panic into its message.
fn guarded<T>(work: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(work)).map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a worker panicked".into())
    })
}

/// Where a shard's bytes are read from: a local file, through short-lived maps, or the Hub,
/// a Range request a chunk.
enum Bytes<'a> {
    Local(File),
    Remote(&'a RemoteModel, usize),
}

struct Scanner<'a> {
    /// Whether histogram passes count towards progress (when every tensor gets one).
    count_histograms: bool,
    model: &'a Model,
    files: &'a [Option<Bytes<'a>>],
    control: &'a Control,
    tracker: &'a Tracker<'a>,
}

impl Scanner<'_> {
    /// The statistics of logical weight `weight`, dequantized from the stored model behind it,
    /// with its histogram when asked for; its scales that break a group are sent as findings
    /// the first time.
    fn dequantized(
        &self,
        (tensor, logical, weight): (usize, &LogicalModel, usize),
        histogram: bool,
        counted: bool,
    ) -> Result<(Moments, Option<Histogram>), Stop> {
        let stopped = || self.control.cancelled.load(Ordering::Relaxed);
        let stored = (&*logical.stored, &*logical.quantization, weight);
        let stats = dequantized::weight_stats(stored, histogram, &stopped).map_err(|e| {
            if stopped() {
                Stop::Cancelled
            } else {
                Stop::Dequantize(format!("cannot dequantize: {e}"))
            }
        })?;
        if counted {
            self.tracker
                .advance(logical.quantization.weights[weight].stored_bytes());
            for finding in stats.findings {
                let _ = self.tracker.events.send(ScanEvent::Finding(finding));
            }
        }
        if let Some(codes) = stats.codes {
            let _ = self.tracker.events.send(ScanEvent::Codes { tensor, codes });
        }
        Ok((stats.moments, stats.histogram))
    }

    /// The tensor's statistics, its chunks spread over the pool's workers.
    /// `counted`: whether the bytes read count towards progress (not when read again).
    fn moments(&self, tensor: usize, counted: bool) -> Result<Moments, Stop> {
        use rayon::prelude::*;
        let chunks = self.chunks(tensor);
        let pieces = if let [chunk] = chunks[..] {
            vec![self.chunk_moments(tensor, chunk, counted)?]
        } else {
            chunks
                .par_iter()
                .map(|&chunk| self.chunk_moments(tensor, chunk, counted))
                .collect::<Result<Vec<_>, Stop>>()?
        };
        Ok(merged(pieces.into_iter().flatten()))
    }

    /// A tensor of one chunk or less: its statistics and, when asked for, its histogram, from
    /// one read (a histogram made later would cost a round trip to the pool per tensor).
    fn small_tensor(
        &self,
        tensor: usize,
        histogram: bool,
        counted: bool,
    ) -> Result<(Moments, Option<Histogram>), Stop> {
        // Small tensors are at most one chunk long.
        let len = usize::try_from(self.model.tensors[tensor].info.byte_len()).unwrap_or(CHUNK);
        if len == 0 {
            let moments = Moments::EMPTY;
            return Ok((moments, histogram.then(|| histogram_of(&moments, |_| {}))));
        }
        let chunk = (0, len);
        let histogram_counted = counted && histogram && self.count_histograms;
        let (moments, histogram) = self.with_chunk(tensor, chunk, counted, |dtype, bytes| {
            crate::fault::inject("scan");
            let moments = merged(pieces_moments(dtype, bytes));
            let histogram =
                histogram.then(|| histogram_of(&moments, |b| values::feed(dtype, bytes, b)));
            (moments, histogram)
        })?;
        if histogram_counted {
            self.tracker.advance(chunk.1 as u64);
        }
        Ok((moments, histogram))
    }

    /// The statistics of each piece of a chunk (see [`pieces_moments`]).
    fn chunk_moments(
        &self,
        tensor: usize,
        chunk: (u64, usize),
        counted: bool,
    ) -> Result<Vec<Moments>, Stop> {
        self.with_chunk(tensor, chunk, counted, |dtype, bytes| {
            crate::fault::inject("scan");
            pieces_moments(dtype, bytes).collect()
        })
    }

    /// The tensor's histogram over the range its statistics found.
    fn histogram(
        &self,
        tensor: usize,
        moments: &Moments,
        first_time: bool,
    ) -> Result<Histogram, Stop> {
        use rayon::prelude::*;
        let chunks = self.chunks(tensor);
        let builder = chunks
            .par_iter()
            .map(|&chunk| {
                let counted = self.count_histograms && first_time;
                self.with_chunk(tensor, chunk, counted, |dtype, bytes| {
                    let mut builder = builder_for(moments);
                    values::feed(dtype, bytes, &mut builder);
                    builder
                })
            })
            .try_reduce(
                || builder_for(moments),
                |mut a, b| {
                    a.merge(&b);
                    Ok(a)
                },
            )?;
        Ok(builder.finish())
    }

    /// Bytes of `tensor` read at a time: [`LOCAL_CHUNK`] from a local file, [`CHUNK`] (a
    /// request each) from the Hub.
    fn chunk_len(&self, tensor: usize) -> usize {
        match self.files[self.model.tensors[tensor].shard] {
            Some(Bytes::Local(_)) => LOCAL_CHUNK,
            _ => CHUNK,
        }
    }

    /// `(offset in the tensor, length)` of each chunk.
    fn chunks(&self, tensor: usize) -> Vec<(u64, usize)> {
        let len = self.model.tensors[tensor].info.byte_len();
        let chunk = self.chunk_len(tensor);
        (0..len)
            .step_by(chunk)
            .map(|start| {
                (
                    start,
                    usize::try_from((len - start).min(chunk as u64)).unwrap_or(chunk),
                )
            })
            .collect()
    }

    /// Runs `work` on one chunk's bytes: copied from a local file, fetched from the Hub.
    fn with_chunk<T>(
        &self,
        tensor: usize,
        (offset, len): (u64, usize),
        counted: bool,
        work: impl FnOnce(crate::format::Dtype, &[u8]) -> T,
    ) -> Result<T, Stop> {
        if self.control.cancelled.load(Ordering::Relaxed) {
            return Err(Stop::Cancelled);
        }
        let entry = &self.model.tensors[tensor];
        let Some(dtype) = entry.info.dtype.known() else {
            return Err(Stop::Cancelled);
        };
        let (start, _) = self.model.file_range(entry);
        let file = self.files[entry.shard].as_ref().ok_or_else(|| {
            Stop::Io(io::Error::new(
                io::ErrorKind::NotFound,
                "the file could not be opened",
            ))
        })?;
        let result = match file {
            Bytes::Local(file) => {
                with_mapped(file, start + offset, len, |bytes| work(dtype, bytes))
            }
            Bytes::Remote(remote, shard) => remote
                .read(*shard, start + offset, len as u64)
                .map(|bytes| work(dtype, &bytes))
                .map_err(io::Error::other),
        };
        if counted {
            self.tracker.advance(len as u64);
        }
        result.map_err(Stop::Io)
    }
}
