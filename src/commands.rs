//! One function per subcommand: open the model, run the shared engine, print through
//! [`crate::report`].

use crate::analysis::{Histogram, Moments};
use crate::cli::{
    CacheArgs, CheckArgs, Cli, Command, CompletionsArgs, DiffArgs, HashArgs, InspectArgs, ManArgs,
    MapMeasure, QuantizeArgs, StatsArgs,
};
use crate::error::{Error, Result};
use crate::finding::Severity;
use crate::format::Model;
use crate::jobs::{Scan, ScanEvent, ScanOptions, ScanOrder};
use crate::layermap::{Analysis, Glyphs, LayerMap, Measure, Values};
use crate::paths;
use crate::quant::{LogicalModel, LogicalTensors, Quantization};
use crate::report::{Check, Inspect, Listing, Report, Shown};
use crate::report::{MapReport, StatsRow, StatsWriter};
use crate::tree::LayerTree;
use std::io::{self, Write};
use std::path::Path;
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
    let variant = cli.variant.as_deref();
    let result = match cli.command {
        Some(Command::Inspect(args)) => inspect(&args, variant, out),
        Some(Command::Check(args)) => check(&args, variant, out),
        Some(Command::Stats(args)) => stats(&args, variant, out),
        Some(Command::Quantize(args)) => quantize(&args, variant, out),
        Some(Command::Hash(args)) => hash(&args, variant, out),
        Some(Command::Diff(args)) => diff(&args, variant, out),
        Some(Command::Cache(args)) => cache(&args, out),
        Some(Command::Completions(args)) => completions(&args, out),
        Some(Command::Man(args)) => man(&args, out),
        None => match (cli.path, cli.diff) {
            (Some(a), Some(b)) => diff(
                &DiffArgs {
                    a,
                    b,
                    json: false,
                    raw: false,
                },
                variant,
                out,
            ),
            (Some(path), None) => {
                let args = InspectArgs {
                    path,
                    json: false,
                    flat: false,
                    expand: false,
                    filter: None,
                    config: None,
                    raw: false,
                };
                inspect(&args, variant, out)
            }
            (None, _) => anyhow::bail!("no model given; see `stui --help`"),
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
    Stui(Error),
    Output(io::Error),
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Failure::Stui(error)
    }
}

impl From<io::Error> for Failure {
    fn from(error: io::Error) -> Self {
        Failure::Output(error)
    }
}

fn open(path: &Path, variant: Option<&str>) -> Result<Model> {
    Model::open_variant(path, variant)
}

/// A config named on the command line must be a file stui can read: anything else stops the
/// command, where a config found beside the model that cannot be read is only a finding.
fn check_config(config: Option<&Path>) -> Result<()> {
    match config {
        Some(path) => paths::look_at_file(path).map_err(|e| Error::io(path, e)),
        None => Ok(()),
    }
}

fn inspect<W: Write>(
    args: &InspectArgs,
    variant: Option<&str>,
    out: &mut W,
) -> Result<Outcome, Failure> {
    check_config(args.config.as_deref())?;
    let mut model = open(&args.path, variant)?;
    let needle = args.filter.as_deref().map(str::to_lowercase);
    let matches = |tensor: &crate::format::Tensor| {
        needle
            .as_deref()
            .is_none_or(|needle| crate::text::contains_ignore_case(tensor.name(), needle))
    };
    // The structural id reads the stored tensors alone: beside the quantization's recognition,
    // much of which runs on one core.
    let (structural_id, recognised) = rayon::join(
        || crate::hash::structural_id(&model),
        || crate::arch::recognise(&model, args.config.as_deref()),
    );
    // A quantized model is listed by its logical weights, unless asked for what is stored: only
    // the listed tensors' tree is built.
    let listed_tree = || {
        let logical = recognised
            .quantization
            .as_ref()
            .filter(|_| !args.raw)
            .map(|quantization| (LogicalTensors::new(&model, quantization), quantization));
        let listed = logical
            .as_ref()
            .map_or(&model.tensors, |(logical, _)| &logical.tensors);
        let tree = LayerTree::build(listed, matches);
        (logical, tree)
    };
    // The checks and the listing's tree each read the whole tensor list: side by side.
    let ((architecture, findings), (logical, tree)) =
        rayon::join(|| crate::arch::review(&recognised, &model), listed_tree);
    model.findings.append(findings);
    let shown = match &logical {
        Some((logical, quantization)) => Shown::logical(&model, logical, quantization),
        None => Shown::stored(&model),
    };
    let report = Inspect {
        shown,
        tree: &tree,
        filter: args.filter.as_deref(),
        architecture: architecture.as_ref(),
        quantization: recognised.quantization.as_ref(),
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
    skip_freeing(report);
    skip_freeing(logical);
    skip_freeing(tree);
    skip_freeing(recognised);
    skip_freeing(model);
    Ok(outcome)
}

fn check<W: Write>(
    args: &CheckArgs,
    variant: Option<&str>,
    out: &mut W,
) -> Result<Outcome, Failure> {
    check_config(args.config.as_deref())?;
    let (model, quantization) =
        crate::arch::reviewed(open(&args.path, variant)?, args.config.as_deref());
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
    skip_freeing(quantization);
    skip_freeing(model);
    Ok(if failed {
        Outcome::Problems
    } else {
        Outcome::Clean
    })
}

fn stats<W: Write>(
    args: &StatsArgs,
    variant: Option<&str>,
    out: &mut W,
) -> Result<Outcome, Failure> {
    let stored = Arc::new(open(&args.path, variant)?);
    let needle = args.filter.as_deref().map(str::to_lowercase);
    let matches = |tensor: &crate::format::Tensor| {
        needle
            .as_deref()
            .is_none_or(|needle| crate::text::contains_ignore_case(tensor.name(), needle))
    };
    // A quantized model is scanned as listed by its logical weights, which the scan dequantizes.
    let quantization = if args.raw {
        None
    } else {
        crate::arch::quantization(&stored)
    };
    let dtype_width = scheme_width(quantization.as_ref());
    let (model, logical) = match quantization {
        Some(quantization) => {
            let (listed, logical) = LogicalModel::open(Arc::clone(&stored), Arc::new(quantization));
            (Arc::new(listed), Some(Arc::new(logical)))
        }
        None => (Arc::clone(&stored), None),
    };
    let chosen = crate::tree::display_order(&model.tensors, matches);
    within_fetch_limit(&model, &chosen, args.fetch_limit)?;
    let options = ScanOptions {
        threads: args.threads.map(usize::from),
        histograms: args.json,
        order: ScanOrder::Given,
        logical: logical.clone(),
        ..ScanOptions::default()
    };
    let mut output = StatsWriter::new(args.json, chosen.iter().map(|&t| model.tensors[t].name()))
        .with_dtype_width(dtype_width);
    for finding in &model.findings {
        output.finding(finding)?;
    }
    let mut rows = InOrder::new(&model, &chosen, args.json);
    // A few numbers a tensor, for the layer map and its findings.
    let mut values = Values::for_names(
        model.tensors.len(),
        chosen.iter().map(|&t| model.tensors[t].name()),
    );
    // With --map, the findings printed under it (as bounded as the model's).
    let mut scan_findings = crate::finding::Findings::new();
    scan_findings.append(model.findings.clone());
    let noted = args.map.then_some(&mut scan_findings);
    let (scanned, elapsed) = scan_into(
        &model,
        &chosen,
        options,
        &mut output,
        &mut rows,
        &mut values,
        noted,
    )?;
    rows.write_rest(&mut output)?;
    let map = if values.is_empty() {
        LayerMap::default()
    } else {
        LayerMap::build(
            chosen
                .iter()
                .map(|&t| (index32(t), model.tensors[t].name())),
        )
    };
    let map_findings = map_findings(&model, logical.as_deref(), &map, &values);
    for finding in &map_findings {
        output.finding(finding)?;
    }
    scan_findings.extend(map_findings);
    let outcome = if output.any_broken() || output.any_errors() {
        Outcome::Problems
    } else {
        Outcome::Clean
    };
    let mut out = io::BufWriter::with_capacity(1 << 16, out);
    if args.map {
        write_map(
            &model,
            logical.as_deref(),
            &map,
            &values,
            &scan_findings,
            scanned,
            args,
            &mut out,
        )?;
    } else {
        output.finish(&mut out, &model, scanned, elapsed)?;
    }
    out.flush()?;
    Ok(outcome)
}

/// Runs the scan over `chosen`, writing each row as soon as the rows before it are written, and
/// noting the findings in `noted` when given; gives the bytes scanned and the seconds taken.
fn scan_into(
    model: &Arc<Model>,
    chosen: &[usize],
    options: ScanOptions,
    output: &mut StatsWriter,
    rows: &mut InOrder,
    values: &mut Values,
    mut noted: Option<&mut crate::finding::Findings>,
) -> Result<(u64, f64), Failure> {
    let (sender, receiver) = mpsc::sync_channel(crate::jobs::EVENT_QUEUE);
    let scan = Scan::start(Arc::clone(model), chosen.to_vec(), options, sender);
    let bar = progress_bar();
    let mut scanned = 0;
    for event in receiver {
        match event {
            ScanEvent::Started { .. } => {}
            ScanEvent::Stats { tensor, moments } => {
                values.record(tensor, &moments);
                rows.pending(tensor).moments = Some(moments);
            }
            ScanEvent::Histogram { tensor, histogram } => {
                rows.pending(tensor).histogram = Some(histogram);
            }
            ScanEvent::Codes { tensor, codes } => {
                rows.pending(tensor).codes = Some(codes);
            }
            ScanEvent::Failed { tensor, finding } => {
                values.record_failed(tensor);
                rows.pending(tensor).failed = true;
                output.finding(&finding)?;
                if let Some(noted) = noted.as_deref_mut() {
                    noted.push(finding);
                }
            }
            ScanEvent::Finding(finding) => {
                output.finding(&finding)?;
                if let Some(noted) = noted.as_deref_mut() {
                    noted.push(finding);
                }
            }
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
        rows.write_finished(output)?;
    }
    bar.finish_and_clear();
    let elapsed = bar.elapsed().as_secs_f64();
    scan.wait();
    Ok((scanned, elapsed))
}

/// For a model read from the Hub, refuses to download more than `limit` bytes of tensors.
fn within_fetch_limit(
    model: &Model,
    chosen: &[usize],
    limit: crate::cli::ByteSize,
) -> Result<(), Failure> {
    if model.remote.is_some() {
        let bytes = chosen
            .iter()
            .map(|&t| model.tensors[t].info.byte_len())
            .fold(0, u64::saturating_add);
        if bytes > limit.0 {
            return Err(Failure::Stui(crate::error::Error::Invalid(format!(
                "the tensors chosen hold {}, more than --fetch-limit {} allows to download from the \
                 Hub: name fewer with --filter TEXT, or raise the limit",
                crate::text::format_bytes(bytes),
                crate::text::format_bytes(limit.0)
            ))));
        }
    }
    Ok(())
}

/// Compares two tensors' bytes, for the layer map's copies of experts; a logical weight's bytes
/// are its members', not compared.
fn same_bytes_in<'m>(
    model: &'m Model,
    logical: Option<&'m LogicalModel>,
) -> impl Fn(u32, u32) -> Option<bool> + 'm {
    let read = std::sync::atomic::AtomicU64::new(0);
    move |a, b| {
        let listed = |t: u32| logical.is_some_and(|l| l.weight(t as usize).is_some());
        if listed(a) || listed(b) {
            return None;
        }
        let tensor = |t: u32| &model.tensors[t as usize];
        crate::diff::same_bytes(model, tensor(a), model, tensor(b), &read).ok()
    }
}

/// The layer map's findings: its outliers by std over every expert.
fn map_findings(
    model: &Model,
    logical: Option<&LogicalModel>,
    map: &LayerMap,
    values: &Values,
) -> Vec<crate::finding::Finding> {
    let expanded = map.rows(false, None);
    let same_bytes = same_bytes_in(model, logical);
    Analysis::of(map, &expanded, values, Measure::Std, Some(&same_bytes)).findings(
        map,
        &expanded,
        Measure::Std,
        |t| model.tensors[t as usize].name(),
    )
}

/// `stats --map`: `report` has the model, the map, its values and findings; its rows, measure
/// and analysis come from the arguments.
#[expect(
    clippy::too_many_arguments,
    reason = "the report's parts and the arguments"
)]
fn write_map(
    model: &Model,
    logical: Option<&LogicalModel>,
    map: &LayerMap,
    values: &Values,
    findings: &[crate::finding::Finding],
    bytes_scanned: u64,
    args: &StatsArgs,
    out: &mut dyn Write,
) -> io::Result<()> {
    let report = MapReport {
        model,
        map,
        rows: &[],
        values,
        measure: Measure::Std,
        analysis: &Analysis::default(),
        findings,
        bytes_scanned,
    };
    let shown = report.map.rows(!args.experts, None);
    let measure = match args.measure {
        MapMeasure::Std => Measure::Std,
        MapMeasure::Absmax => Measure::Absmax,
        MapMeasure::Mean => Measure::Mean,
        MapMeasure::Zeros => Measure::Zeros,
    };
    let same_bytes = same_bytes_in(report.model, logical);
    let analysis = Analysis::of(
        report.map,
        &shown,
        report.values,
        measure,
        Some(&same_bytes),
    );
    let report = MapReport {
        rows: &shown,
        measure,
        analysis: &analysis,
        ..report
    };
    if args.json {
        report.write_json(out)
    } else if args.ascii {
        report.write_text(out, &Glyphs::ASCII)
    } else {
        report.write_text(out, &Glyphs::UNICODE)
    }
}

fn index32(tensor: usize) -> u32 {
    u32::try_from(tensor).unwrap_or(u32::MAX)
}

/// The widest scheme label, for the width of the table's dtype column.
fn scheme_width(quantization: Option<&Quantization>) -> usize {
    quantization.map_or(0, |q| {
        q.schemes()
            .iter()
            .map(|(scheme, _)| scheme.label().chars().count())
            .max()
            .unwrap_or(0)
    })
}

/// What the scan has sent about a tensor whose row is not written yet.
#[derive(Default)]
struct PendingRow {
    moments: Option<Moments>,
    histogram: Option<Histogram>,
    codes: Option<crate::quant::kernels::CodeCounts>,
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
        let Some(&tensor) = self.chosen.get(self.next as usize) else {
            return Ok(());
        };
        let tensor = &self.model.tensors[tensor];
        self.next += 1;
        output.row(&StatsRow {
            name: tensor.name(),
            dtype: tensor.info.dtype.name(),
            moments: row.moments.as_ref(),
            histogram: row.histogram.as_ref(),
            codes: row.codes.as_ref(),
        })
    }
}

fn quantize<W: Write>(
    args: &QuantizeArgs,
    variant: Option<&str>,
    out: &mut W,
) -> Result<Outcome, Failure> {
    use crate::quantize::{Control, Granularity, NonFinite, Options};
    if args.per_tensor && args.scheme != crate::quantize::Scheme::W8A8 && !args.compare {
        return Err(Failure::Stui(crate::error::Error::Invalid(format!(
            "--per-tensor is W8A8's: {} has its own scales ({})",
            args.scheme,
            crate::quantize::scales_label(args.scheme, Granularity::PerTensor, args.group_size)
        ))));
    }
    let model = open(&args.path, variant)?;
    // Before any question about the output, whose answer would not help.
    if let Some(why) = crate::quantize::needs_its_files(&model) {
        return Err(Failure::Stui(crate::error::Error::Invalid(why)));
    }
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
    let existing = paths::look_at_output(output).map_err(|e| Error::io(output, e))?;
    if existing.is_some() && !args.yes {
        return Err(Failure::Stui(Error::Invalid(format!(
            "{} exists; pass --yes to replace it",
            crate::text::escape_path(output)
        ))));
    }
    let (summary, signal) = cancelled_by_signals(&control, || {
        with_progress(progress, || {
            crate::quantize::quantize(&model, output, &options, &control)
        })
    });
    if let Some(signal) = signal {
        end_by_signal(signal, output);
    }
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

fn hash<W: Write>(args: &HashArgs, variant: Option<&str>, out: &mut W) -> Result<Outcome, Failure> {
    use rayon::prelude::*;
    let model = open(&args.path, variant)?;
    let files: Vec<(String, String)> = match &model.remote {
        // The Hub names an LFS file's blob by the SHA-256 of its bytes.
        Some(remote) => {
            if args.per_tensor {
                return Err(Failure::Stui(crate::error::Error::Invalid(format!(
                    "--per-tensor reads every tensor's bytes, which for `{}` means downloading \
                     them: download the model (`{}`), then hash it",
                    remote.repo,
                    remote.download_command()
                ))));
            }
            model
                .shards
                .iter()
                .zip(&remote.blobs)
                .map(|(shard, blob)| {
                    let digest = blob.clone().filter(|b| b.len() == 64).ok_or_else(|| {
                        crate::error::Error::Invalid(format!(
                            "the Hub gives no SHA-256 for {}",
                            crate::text::escape_path(&shard.path)
                        ))
                    })?;
                    Ok((shard.path.to_string_lossy().into_owned(), digest))
                })
                .collect::<Result<_, crate::error::Error>>()?
        }
        None => model
            .shards
            .par_iter()
            .map(|shard| {
                crate::hash::file_sha256(&shard.path)
                    .map(|digest| (shard.path.to_string_lossy().into_owned(), digest))
                    .map_err(|e| crate::error::Error::io(&shard.path, e))
            })
            .collect::<Result<_, _>>()?,
    };
    let tensors = if args.per_tensor {
        let digests = crate::hash::tensor_sha256s(&model).map_err(|(tensor, error)| {
            Error::io(&model.shard_of(&model.tensors[tensor]).path, error)
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

fn diff<W: Write>(args: &DiffArgs, variant: Option<&str>, out: &mut W) -> Result<Outcome, Failure> {
    use std::sync::atomic::AtomicU64;
    let (a, b) = (
        Model::open_compared(&args.a, variant)?,
        Model::open_compared(&args.b, variant)?,
    );
    // Quantized models are compared by the weights they encode, unless asked for what is stored.
    let quantization = |model: &Model| {
        if args.raw {
            None
        } else {
            crate::arch::quantization(model)
        }
    };
    let (quantized_a, quantized_b) = (quantization(&a), quantization(&b));
    let (side_a, side_b) = (
        crate::diff::Side::logical(&a, quantized_a.as_ref()),
        crate::diff::Side::logical(&b, quantized_b.as_ref()),
    );
    let progress = AtomicU64::new(0);
    let total = a.total_bytes().saturating_add(b.total_bytes());
    let result = with_progress(
        || (total, progress.load(Ordering::Relaxed)),
        || crate::diff::diff(&side_a, &side_b, &progress),
    );
    let identical = result.identical();
    let report = crate::report::Diff {
        a: &side_a,
        b: &side_b,
        diff: &result,
    };
    print(out, &report, args.json)?;
    Ok(if identical {
        Outcome::Clean
    } else {
        Outcome::Problems
    })
}

fn completions<W: Write>(args: &CompletionsArgs, out: &mut W) -> Result<Outcome, Failure> {
    use clap::CommandFactory;
    use clap_complete::Generator;
    let mut command = Cli::command();
    command.set_bin_name("stui");
    command.build();
    args.shell.try_generate(&command, out)?;
    Ok(Outcome::Clean)
}

fn man<W: Write>(args: &ManArgs, out: &mut W) -> Result<Outcome, Failure> {
    use clap::CommandFactory;
    let mut command = Cli::command();
    // Names the commands' pages stui-inspect(1) and so on, as the main page lists them.
    command.build();
    let page = match &args.command {
        None => command,
        Some(name) => {
            let commands: Vec<&clap::Command> = command
                .get_subcommands()
                .filter(|c| c.get_name() != "help")
                .collect();
            let Some(&page) = commands.iter().find(|c| c.get_name() == name) else {
                let names: Vec<&str> = commands.iter().map(|c| c.get_name()).collect();
                return Err(Failure::Stui(Error::Invalid(format!(
                    "no command `{}`; the commands are {}",
                    crate::text::escape(name),
                    names.join(", ")
                ))));
            };
            page.clone()
        }
    };
    let source = format!("stui {}", env!("CARGO_PKG_VERSION"));
    let mut out = io::BufWriter::new(out);
    clap_mangen::Man::new(page)
        .source(source)
        .render(&mut out)?;
    out.flush()?;
    Ok(Outcome::Clean)
}

fn cache<W: Write>(args: &CacheArgs, out: &mut W) -> Result<Outcome, Failure> {
    use crate::source::hf_cache::{self, CacheDir};
    let cache = CacheDir::find(&crate::source::ProcessEnvironment).ok_or_else(|| {
        crate::error::Error::Invalid(
            "no Hugging Face cache: neither HF_HUB_CACHE, HF_HOME nor HOME is set".into(),
        )
    })?;
    let repos = match hf_cache::scan(&cache.path) {
        Ok(repos) => repos,
        Err(error) if error.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(error) => return Err(crate::error::Error::io(&cache.path, error).into()),
    };
    let listing = crate::report::cache::CacheListing::new(&cache, &repos);
    print(out, &listing, args.json)?;
    Ok(Outcome::Clean)
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

/// Runs `work` (a save through `control`) with SIGINT, SIGTERM and SIGHUP cancelling it rather
/// than ending the process, so that the save removes what it wrote; gives the signal caught.
fn cancelled_by_signals<T>(
    control: &crate::quantize::Control,
    work: impl FnOnce() -> T,
) -> (T, Option<i32>) {
    #[cfg(unix)]
    {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        if let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) {
            let handle = signals.handle();
            return std::thread::scope(|scope| {
                let watcher = scope.spawn(move || {
                    let caught = signals.forever().next();
                    if caught.is_some() {
                        control.cancelled.store(true, Ordering::Relaxed);
                    }
                    caught
                });
                let result = work();
                handle.close();
                (result, watcher.join().ok().flatten())
            });
        }
    }
    (work(), None)
}

/// Says that a save was stopped by `signal` and ends the process as the signal would have.
fn end_by_signal(signal: i32, output: &Path) -> ! {
    let name = signal_hook::low_level::signal_name(signal).unwrap_or("a signal");
    eprintln!(
        "stui: stopped by {name}: nothing was written to {}",
        crate::text::escape_path(output)
    );
    let _ = signal_hook::low_level::emulate_default_handler(signal);
    std::process::exit(128 + signal);
}

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

/// A byte progress bar on stderr, drawn only when stderr is a terminal.
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

/// What to say when the first word of `args` (the program's arguments, without its name) looks
/// like a command mistyped rather than a model: no file or folder of that name, and within two
/// edits of a command. Parsed as the model's path, `stui chek model.safetensors` made clap say
/// that the subcommand `model.safetensors` cannot be used with `[PATH]`.
pub fn mistyped_command(args: &[std::ffi::OsString]) -> Option<String> {
    let word = args.first()?.to_str()?;
    let plausible = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !plausible || word.starts_with('-') || Path::new(word).exists() {
        return None;
    }
    let command = <Cli as clap::CommandFactory>::command();
    let names: Vec<&str> = command
        .get_subcommands()
        .map(clap::Command::get_name)
        .collect();
    if names.contains(&word) {
        return None;
    }
    let (distance, nearest) = names
        .iter()
        .map(|name| (strsim::damerau_levenshtein(word, name), *name))
        .min()?;
    (distance <= 2).then(|| {
        format!(
            "`{word}` is neither a command nor a file or folder: did you mean `stui {nearest}`? \
             (`stui --help` lists the commands)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mistyped(args: &[&str]) -> Option<String> {
        let args: Vec<std::ffi::OsString> = args.iter().map(std::ffi::OsString::from).collect();
        mistyped_command(&args)
    }

    #[test]
    fn a_command_mistyped_is_named_and_a_model_is_not_taken_for_one() {
        for (typed, meant) in [("chek", "check"), ("inspct", "inspect"), ("stat", "stats")] {
            let said = mistyped(&[typed, "model.safetensors"]).unwrap();
            assert!(
                said.contains(&format!("did you mean `stui {meant}`")),
                "{said}"
            );
        }
        assert!(mistyped(&["quantise"]).unwrap().contains("`stui quantize`"));
        for not_mistyped in [
            &["check", "m.safetensors"][..],
            &["model.safetensors"],
            &["org/name"],
            &["--help"],
            &["llama"],
            &[],
        ] {
            assert_eq!(mistyped(not_mistyped), None, "{not_mistyped:?}");
        }
        // A folder of that name is opened, not corrected (the tests run at the project's root).
        assert!(Path::new("src").is_dir());
        assert_eq!(mistyped(&["src"]), None);
    }
}
