//! One function per subcommand: open the model, run the shared engine, print through
//! [`crate::report`].

use crate::analysis::{Histogram, Moments};
use crate::cli::{
    CheckArgs, Cli, Command, DiffArgs, HashArgs, InspectArgs, QuantizeArgs, StatsArgs,
};
use crate::error::Result;
use crate::finding::Severity;
use crate::format::Model;
use crate::jobs::{Scan, ScanEvent, ScanOptions, ScanOrder};
use crate::report::{Check, Inspect, Listing, Report};
use crate::report::{StatsRow, StatsWriter};
use crate::tree::LayerTree;
use std::io::{self, Write};
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};

/// How a command ended, as the process exit code tells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing wrong: exit code 0.
    Clean,
    /// The model has problems: exit code 1.
    Problems,
}

impl Outcome {
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Clean => 0,
            Outcome::Problems => 1,
        }
    }
}

/// Runs what the command line asks, writing to `out`.
pub fn run<W: Write>(cli: Cli, out: &mut W) -> anyhow::Result<Outcome> {
    let result = match cli.command {
        Some(Command::Inspect(args)) => inspect(&args, out),
        Some(Command::Check(args)) => check(&args, out),
        Some(Command::Stats(args)) => stats(&args, out),
        Some(Command::Quantize(args)) => quantize(&args, out),
        Some(Command::Hash(args)) => hash(&args, out),
        Some(Command::Diff(args)) => diff(&args, out),
        None => match cli.path {
            Some(path) => {
                let args = InspectArgs {
                    path,
                    json: false,
                    flat: false,
                    expand: false,
                    filter: None,
                    config: None,
                };
                inspect(&args, out)
            }
            None => anyhow::bail!("no model given; see `stui --help`"),
        },
    };
    match result {
        Err(Failure::Output(error)) if error.kind() == io::ErrorKind::BrokenPipe => {
            Ok(Outcome::Clean)
        }
        Err(Failure::Output(error)) => {
            Err(anyhow::Error::new(error).context("cannot write output"))
        }
        Err(Failure::Stui(error)) => Err(error.into()),
        Ok(outcome) => Ok(outcome),
    }
}

/// Why a command stopped: stui's own errors, or the output going away.
enum Failure {
    Stui(crate::error::Error),
    Output(io::Error),
}

impl From<crate::error::Error> for Failure {
    fn from(error: crate::error::Error) -> Self {
        Failure::Stui(error)
    }
}

impl From<io::Error> for Failure {
    fn from(error: io::Error) -> Self {
        Failure::Output(error)
    }
}

fn open(path: &std::path::Path) -> Result<Model> {
    Model::open(path)
}

fn inspect<W: Write>(args: &InspectArgs, out: &mut W) -> Result<Outcome, Failure> {
    let mut model = open(&args.path)?;
    let needle = args.filter.as_deref().map(str::to_lowercase);
    // The checks, the tree and the structural id each read the whole tensor list: side by side.
    let ((architecture, findings), (tree, structural_id)) = rayon::join(
        || crate::arch::review_model(&model, args.config.as_deref()),
        || {
            rayon::join(
                || {
                    LayerTree::build(&model.tensors, |tensor| {
                        needle.as_deref().is_none_or(|needle| {
                            crate::text::contains_ignore_case(tensor.name(), needle)
                        })
                    })
                },
                || crate::hash::structural_id(&model),
            )
        },
    );
    model.findings.append(findings);
    let report = Inspect {
        model: &model,
        tree: &tree,
        filter: args.filter.as_deref(),
        architecture: architecture.as_ref(),
        structural_id: &structural_id,
    };
    let mut out = io::BufWriter::with_capacity(1 << 16, out);
    if args.json {
        report.write_json(&mut out)?;
    } else {
        let listing = match (args.flat, args.expand) {
            (true, _) => Listing::Flat,
            (false, true) => Listing::Expanded,
            (false, false) => Listing::Tree,
        };
        report.write_text(&mut out, listing)?;
    }
    out.flush()?;
    let outcome = if has_errors(&model) {
        Outcome::Problems
    } else {
        Outcome::Clean
    };
    skip_freeing(model);
    skip_freeing(tree);
    Ok(outcome)
}

fn check<W: Write>(args: &CheckArgs, out: &mut W) -> Result<Outcome, Failure> {
    let model = crate::arch::open_reviewed(&args.path, args.config.as_deref())?;
    let report = Check {
        model: &model,
        findings: &model.findings,
    };
    print(out, &report, args.json)?;
    let failed = if args.strict {
        !model.is_valid()
    } else {
        has_errors(&model)
    };
    skip_freeing(model);
    Ok(if failed {
        Outcome::Problems
    } else {
        Outcome::Clean
    })
}

fn stats<W: Write>(args: &StatsArgs, out: &mut W) -> Result<Outcome, Failure> {
    let model = Arc::new(open(&args.path)?);
    let needle = args.filter.as_deref().map(str::to_lowercase);
    // In the tree's order, without building it.
    let chosen = crate::tree::display_order(&model.tensors, |tensor| {
        needle
            .as_deref()
            .is_none_or(|needle| crate::text::contains_ignore_case(tensor.name(), needle))
    });
    let options = ScanOptions {
        threads: args.threads.map(usize::from),
        histograms: args.json,
        order: ScanOrder::Given,
        ..ScanOptions::default()
    };
    let mut output = StatsWriter::new(args.json, chosen.iter().map(|&t| model.tensors[t].name()));
    for finding in &model.findings {
        output.finding(finding)?;
    }
    let mut rows = InOrder::new(&model, &chosen, args.json);
    let (sender, receiver) = mpsc::sync_channel(crate::jobs::EVENT_QUEUE);
    let scan = Scan::start(Arc::clone(&model), chosen.clone(), options, sender);
    let bar = progress_bar();
    let mut scanned = 0;
    for event in receiver {
        match event {
            ScanEvent::Started { .. } => {}
            ScanEvent::Stats { tensor, moments } => rows.pending(tensor).moments = Some(moments),
            ScanEvent::Histogram { tensor, histogram } => {
                rows.pending(tensor).histogram = Some(histogram);
            }
            ScanEvent::Failed { tensor, finding } => {
                rows.pending(tensor).failed = true;
                output.finding(&finding)?;
            }
            ScanEvent::Finding(finding) => output.finding(&finding)?,
            ScanEvent::Progress(progress) => {
                bar.set_length(progress.bytes_total);
                bar.set_position(progress.bytes_done);
            }
            ScanEvent::Done(progress) => {
                scanned = progress.bytes_done;
                break;
            }
            ScanEvent::Cancelled => break,
        }
        rows.write_finished(&mut output)?;
    }
    bar.finish_and_clear();
    let elapsed = bar.elapsed().as_secs_f64();
    scan.wait();
    rows.write_rest(&mut output)?;
    let outcome = if output.any_broken() || output.any_errors() {
        Outcome::Problems
    } else {
        Outcome::Clean
    };
    let mut out = io::BufWriter::with_capacity(1 << 16, out);
    output.finish(&mut out, &model, scanned, elapsed)?;
    out.flush()?;
    Ok(outcome)
}

/// What the scan has sent about a tensor whose row is not written yet.
#[derive(Default)]
struct PendingRow {
    moments: Option<Moments>,
    histogram: Option<Histogram>,
    failed: bool,
}

/// Rows of `stui stats` put back in display order: the scan finishes tensors roughly in the
/// order asked, a few out of turn, so only those wait here.
struct InOrder<'m> {
    model: &'m Model,
    chosen: &'m [usize],
    /// Each tensor's place in `chosen`.
    place: Vec<u32>,
    pending: std::collections::BTreeMap<u32, PendingRow>,
    /// The place of the next row to write.
    next: u32,
    histograms: bool,
}

impl<'m> InOrder<'m> {
    fn new(model: &'m Model, chosen: &'m [usize], histograms: bool) -> InOrder<'m> {
        let mut place = vec![u32::MAX; model.tensors.len()];
        for (i, &tensor) in chosen.iter().enumerate() {
            place[tensor] = u32::try_from(i).unwrap_or(u32::MAX);
        }
        InOrder {
            model,
            chosen,
            place,
            pending: std::collections::BTreeMap::new(),
            next: 0,
            histograms,
        }
    }

    fn pending(&mut self, tensor: usize) -> &mut PendingRow {
        self.pending.entry(self.place[tensor]).or_default()
    }

    /// Writes the rows that are complete and next in order.
    fn write_finished(&mut self, output: &mut StatsWriter) -> io::Result<()> {
        while let Some(entry) = self.pending.first_entry() {
            let row = entry.get();
            let complete = row.failed
                || row.moments.is_some() && (!self.histograms || row.histogram.is_some());
            if *entry.key() != self.next || !complete {
                break;
            }
            let row = entry.remove();
            self.write(output, &row)?;
        }
        Ok(())
    }

    /// Writes every row left, as far as the scan got with each.
    fn write_rest(&mut self, output: &mut StatsWriter) -> io::Result<()> {
        let empty = PendingRow::default();
        while (self.next as usize) < self.chosen.len() {
            let row = self.pending.remove(&self.next);
            self.write(output, row.as_ref().unwrap_or(&empty))?;
        }
        Ok(())
    }

    fn write(&mut self, output: &mut StatsWriter, row: &PendingRow) -> io::Result<()> {
        let tensor = &self.model.tensors[self.chosen[self.next as usize]];
        self.next += 1;
        output.row(&StatsRow {
            name: tensor.name(),
            dtype: tensor.info.dtype.name(),
            moments: row.moments.as_ref(),
            histogram: row.histogram.as_ref(),
        })
    }
}

fn quantize<W: Write>(args: &QuantizeArgs, out: &mut W) -> Result<Outcome, Failure> {
    use crate::quantize::{Control, Granularity, NonFinite, Options};
    let model = open(&args.path)?;
    let options = Options {
        scheme: args.scheme,
        group_size: args.group_size,
        granularity: if args.per_tensor {
            Granularity::PerTensor
        } else {
            Granularity::PerChannel
        },
        include: args.include.clone(),
        exclude: args.exclude.clone(),
        non_finite: if args.skip_nonfinite {
            NonFinite::Skip
        } else {
            NonFinite::Stop
        },
        keep_below_snr: args.keep_below_snr,
        ..Options::default()
    };
    let control = Control::default();
    let progress = || {
        (
            control.bytes_total.load(Ordering::Relaxed),
            control.bytes_done.load(Ordering::Relaxed),
        )
    };
    let Some(output) = args.output.as_deref().filter(|_| !args.compare) else {
        let comparison = with_progress(progress, || {
            crate::quantize::compare(&model, &options, &control)
        })?;
        let mut out = io::BufWriter::new(out);
        crate::report::write_comparison(&mut out, &model, &comparison, args.json)?;
        out.flush()?;
        return Ok(Outcome::Clean);
    };
    if output.exists() && !args.yes {
        return Err(Failure::Stui(crate::error::Error::Invalid(format!(
            "{} exists; pass --yes to replace it",
            crate::text::escape_path(output)
        ))));
    }
    let summary = with_progress(progress, || {
        crate::quantize::quantize(&model, output, &options, &control)
    });
    let summary = summary?;
    let mut out = io::BufWriter::new(out);
    crate::report::write_quantize(&mut out, &model, &summary, args.json)?;
    out.flush()?;
    Ok(if summary.verified {
        Outcome::Clean
    } else {
        Outcome::Problems
    })
}

fn hash<W: Write>(args: &HashArgs, out: &mut W) -> Result<Outcome, Failure> {
    use rayon::prelude::*;
    let model = open(&args.path)?;
    let files: Vec<(String, String)> = model
        .shards
        .par_iter()
        .map(|shard| {
            crate::hash::file_sha256(&shard.path)
                .map(|digest| (shard.path.to_string_lossy().into_owned(), digest))
                .map_err(|e| crate::error::Error::io(&shard.path, e))
        })
        .collect::<Result<_, _>>()?;
    let tensors = if args.per_tensor {
        let digests = crate::hash::tensor_sha256s(&model).map_err(|(tensor, error)| {
            crate::error::Error::io(&model.shard_of(&model.tensors[tensor]).path, error)
        })?;
        Some(crate::report::TensorDigests {
            tensors: &model.tensors,
            digests,
        })
    } else {
        None
    };
    let report = crate::report::Hashes {
        files,
        tensors,
        structural_id: crate::hash::structural_id(&model),
    };
    print(out, &report, args.json)?;
    Ok(Outcome::Clean)
}

fn diff<W: Write>(args: &DiffArgs, out: &mut W) -> Result<Outcome, Failure> {
    use std::sync::atomic::AtomicU64;
    let (a, b) = (open(&args.a)?, open(&args.b)?);
    let progress = AtomicU64::new(0);
    let total = a.total_bytes().saturating_add(b.total_bytes());
    let result = with_progress(
        || (total, progress.load(Ordering::Relaxed)),
        || crate::diff::diff(&a, &b, &progress),
    );
    let identical = result.identical();
    let report = crate::report::Diff {
        a: &a,
        b: &b,
        diff: &result,
    };
    print(out, &report, args.json)?;
    Ok(if identical {
        Outcome::Clean
    } else {
        Outcome::Problems
    })
}

/// Writes a report, buffered, as JSON or text.
fn print<W: Write>(out: &mut W, report: &dyn Report, json: bool) -> io::Result<()> {
    let mut out = io::BufWriter::new(out);
    if json {
        report.write_json(&mut out)?;
    } else {
        report.write_text(&mut out)?;
    }
    out.flush()
}

/// A byte progress bar on stderr, drawn only when stderr is a terminal.
/// Runs `work` with a progress bar on stderr that shows `(total, done)` bytes as `progress`
/// reads them, ten times a second, and goes as soon as the work ends.
fn with_progress<T>(progress: impl Fn() -> (u64, u64) + Sync, work: impl FnOnce() -> T) -> T {
    let bar = progress_bar();
    let (finished, wait) = std::sync::mpsc::channel::<()>();
    let result = std::thread::scope(|scope| {
        let (bar, progress) = (&bar, &progress);
        scope.spawn(move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                wait.recv_timeout(std::time::Duration::from_millis(100))
            {
                let (total, done) = progress();
                bar.set_length(total);
                bar.set_position(done);
            }
        });
        let result = work();
        drop(finished);
        result
    });
    bar.finish_and_clear();
    result
}

fn progress_bar() -> indicatif::ProgressBar {
    let bar =
        indicatif::ProgressBar::with_draw_target(Some(0), indicatif::ProgressDrawTarget::stderr());
    let style = indicatif::ProgressStyle::with_template(
        "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    );
    if let Ok(style) = style {
        bar.set_style(style);
    }
    bar
}

/// The command is done and the process exits next: freeing a large model's names one by one
/// would cost about as long as reading them, and the system reclaims the memory anyway.
fn skip_freeing<T>(value: T) {
    std::mem::forget(value);
}

fn has_errors(model: &Model) -> bool {
    model.findings.iter().any(|f| f.severity == Severity::Error)
}
