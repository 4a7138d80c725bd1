//! Command-line arguments. No logic here: [`crate::commands`] acts on them.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// Explore and check .safetensors model files.
///
/// PATH may be a .safetensors file, a sharded model's model.safetensors.index.json, or a folder
/// holding either; or a Hub repository, ORG/NAME[@REVISION][/PATH], read from the local Hugging
/// Face cache (a local path of the same spelling wins) or, with hf://, from the Hub. `stui PATH`
/// shows the model in the explorer when standard output is a terminal, and otherwise prints the
/// report of `stui inspect PATH` (of `stui diff PATH B` with --diff B). The subcommands serve
/// scripts and CI, each with --json output and exit codes: 0 when nothing is wrong, 1 when the
/// model has problems, 2 when stui could not run (bad arguments, a path that is not a model file
/// or folder).
#[derive(Debug, Parser)]
#[command(
    name = "stui",
    version,
    args_conflicts_with_subcommands = true,
    arg_required_else_help = true
)]
pub struct Cli {
    /// The model to open: a .safetensors file, an index .json, a folder, or ORG/NAME[@REVISION].
    pub path: Option<PathBuf>,

    /// Open the explorer even when standard output is not a terminal: it draws on the terminal
    /// stui runs in, and stops with a message when there is none.
    #[arg(long)]
    pub tui: bool,

    /// In the explorer, compare the model with B: each tensor marked as changed (with the size
    /// of the change) or only in this model, the marks climbing the tree.
    #[arg(long, value_name = "B")]
    pub diff: Option<PathBuf>,

    /// In the explorer, list a quantized model's tensors as stored (its weights' members)
    /// rather than the weights they encode; `R` switches between the two.
    #[arg(long)]
    pub raw: bool,

    /// In the explorer, for a model read from the Hub: the largest tensor whose bytes are
    /// downloaded for its statistics when selected (e.g. 512M, 4G).
    #[arg(long, value_name = "SIZE", default_value = "512M")]
    pub fetch_limit: ByteSize,

    #[command(subcommand)]
    pub command: Option<Command>,

    /// Read a folder's (or a repository's) variant V, as `from_pretrained(..., variant=V)` does:
    /// `model.V.safetensors` or `model.safetensors.index.V.json` (diffusers' names too).
    #[arg(long, value_name = "V", global = true)]
    pub variant: Option<String>,

    /// Colours in the explorer: auto (off when `NO_COLOR` is set), always, never.
    #[arg(long, value_enum, default_value_t = ColorMode::Auto)]
    pub color: ColorMode,

    /// Log frame times and input-to-frame latencies of the explorer to FILE (or set `STUI_LOG`).
    #[arg(long, value_name = "FILE", env = "STUI_LOG")]
    pub log: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorMode {
    Auto,
    Always,
    Never,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Summarize a model: files, tensors, parameters, dtypes, metadata, and the layer tree.
    Inspect(InspectArgs),
    /// Validate a model: every problem found, and whether the reference implementation accepts it.
    ///
    /// Exits 1 when any error is found (with --strict: only when the reference would reject a file).
    Check(CheckArgs),
    /// Read every tensor and report its statistics: min, max, mean, std, absmax, NaN/Inf/zero
    /// counts (and, with --json, histograms), with findings on the values.
    ///
    /// Tensors holding NaN or Inf come first. Exits 1 when any tensor holds NaN or Inf, or any
    /// error is found.
    Stats(StatsArgs),
    /// Quantize the 2-D float weights (int8 by default; int4, FP8 and NVFP4 with --scheme) and
    /// save a copy in the compressed-tensors layout that vLLM, transformers and llm-compressor
    /// read, or compare every scheme without writing (--compare).
    ///
    /// Norms, biases, 1-D tensors, embeddings and `lm_head` are kept as they are. The output is
    /// checked after saving and every quantized tensor compared with its source.
    Quantize(QuantizeArgs),
    /// SHA-256 of each file (as sha256sum prints it) and, with --per-tensor, of each tensor's
    /// bytes; and the model's structural ID.
    Hash(HashArgs),
    /// Compare two models: tensors added and removed, dtype and shape changes, metadata
    /// differences, and how much each common tensor's values changed.
    ///
    /// Exits 0 when the models are identical, 1 when they differ.
    Diff(DiffArgs),
    /// Print a shell completion script: bash, zsh, fish, elvish or powershell.
    Completions(CompletionsArgs),
    /// Print the manual page: stui(1), or stui-COMMAND(1) for one command.
    ///
    /// The page is roff, for `man`: `stui man | man -l -` shows it.
    Man(ManArgs),
    /// List the models of the local Hugging Face cache that hold safetensors files: each
    /// repository's revisions, size, and whether its shards are all there.
    ///
    /// Any of them opens with `stui ORG/NAME[@REVISION]`. The cache is only read, never written.
    Cache(CacheArgs),
}

#[derive(Debug, Args)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "each is a command-line switch of its own"
)]
pub struct InspectArgs {
    /// The model: a .safetensors file, an index .json, or a folder.
    pub path: PathBuf,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    /// List tensors one per line instead of as a tree.
    #[arg(long)]
    pub flat: bool,
    /// Show every node of the tree: do not fold runs of identically shaped numbered siblings
    /// (`layers.0` ... `layers.31`) into one `0-31 ×32` row.
    #[arg(long, conflicts_with = "flat")]
    pub expand: bool,
    /// Show only tensors whose name contains TEXT (case-insensitive).
    #[arg(long, value_name = "TEXT")]
    pub filter: Option<String>,
    /// Compare the tensors with this config.json instead of the one beside the model.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// List the tensors as stored: a quantized weight's members, not the weight they encode.
    #[arg(long)]
    pub raw: bool,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The model: a .safetensors file, an index .json, or a folder.
    pub path: PathBuf,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    /// Judge only by the reference implementation's verdict: exit 1 only when it rejects a file.
    #[arg(long)]
    pub strict: bool,
    /// Compare the tensors with this config.json instead of the one beside the model.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Args)]
#[expect(clippy::struct_excessive_bools, reason = "each is a command-line flag")]
pub struct StatsArgs {
    /// The model: a .safetensors file, an index .json, or a folder.
    pub path: PathBuf,
    /// Print one JSON document instead of text, histograms included.
    #[arg(long)]
    pub json: bool,
    /// Scan only tensors whose name contains TEXT (case-insensitive).
    #[arg(long, value_name = "TEXT")]
    pub filter: Option<String>,
    /// Worker threads (default: one per core).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    /// Print the layer map instead of the table: layers across, tensor kinds down, each cell
    /// shaded by --measure, with the outliers.
    #[arg(long)]
    pub map: bool,
    /// What the map's cells show.
    #[arg(long, value_enum, default_value_t = MapMeasure::Std, requires = "map")]
    pub measure: MapMeasure,
    /// In the map: one row per expert, rather than each kind's worst expert.
    #[arg(long, requires = "map")]
    pub experts: bool,
    /// Draw the map with plain ASCII characters rather than shade blocks.
    #[arg(long, requires = "map")]
    pub ascii: bool,
    /// For a model read from the Hub: the most tensor bytes to download (e.g. 512M, 4G).
    #[arg(long, value_name = "SIZE", default_value = "512M")]
    pub fetch_limit: ByteSize,
    /// Statistics of the stored tensors: a quantized weight's codes and scales, not the values
    /// they encode.
    #[arg(long)]
    pub raw: bool,
}

/// What the layer map's cells show.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MapMeasure {
    Std,
    Absmax,
    Mean,
    /// The share of elements that are zero.
    Zeros,
}

#[derive(Debug, Args)]
#[expect(clippy::struct_excessive_bools, reason = "each is a command-line flag")]
pub struct QuantizeArgs {
    /// The model: a .safetensors file, an index .json, or a folder.
    pub path: PathBuf,
    /// Where to write: a .safetensors file (a folder for a sharded model).
    #[arg(short, long, value_name = "OUT", required_unless_present = "compare")]
    pub output: Option<PathBuf>,
    /// Write nothing: print every scheme side by side (output size, bits per weight with
    /// scales, worst and median SNR, the worst tensor) over the weights that would be quantized.
    #[arg(long, conflicts_with_all = ["output", "keep_below_snr"])]
    pub compare: bool,
    /// Keep in source precision every weight whose SNR under the scheme would fall below DB.
    #[arg(long, value_name = "DB", value_parser = parse_decibels, allow_negative_numbers = true)]
    pub keep_below_snr: Option<f64>,
    #[arg(
        long,
        value_name = "NAME",
        value_parser = parse_scheme,
        default_value = "W8A8",
        help = "The scheme, as the compressed-tensors preset of that name: W8A8 (int8 per channel \
                or tensor), W8A16, W4A16, W4A16_ASYM (int in groups, pack-quantized), FP8_DYNAMIC \
                (per channel), FP8_BLOCK (128x128 blocks) or NVFP4A16"
    )]
    pub scheme: crate::quantize::Scheme,
    #[arg(long, value_name = "N", default_value_t = crate::quantize::scheme::DEFAULT_GROUP,
          help = "Columns of a group for W8A16, W4A16 and W4A16_ASYM; weights whose columns do \
                  not divide into groups are kept as they are",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub group_size: u64,
    /// W8A8: one scale per output channel (row); the default.
    #[arg(long, conflicts_with = "per_tensor")]
    pub per_channel: bool,
    /// W8A8: one scale for the whole tensor (the other schemes have their own scales).
    #[arg(long)]
    pub per_tensor: bool,
    /// Quantize only tensors whose names match GLOB (`*` and `?`); may be repeated.
    #[arg(long, value_name = "GLOB")]
    pub include: Vec<String>,
    /// Never quantize tensors whose names match GLOB; may be repeated.
    #[arg(long, value_name = "GLOB")]
    pub exclude: Vec<String>,
    /// Keep tensors holding NaN or Inf as they are, instead of stopping.
    #[arg(long)]
    pub skip_nonfinite: bool,
    /// Replace OUT if it exists.
    #[arg(long)]
    pub yes: bool,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The first model: a .safetensors file, an index .json, or a folder.
    pub a: PathBuf,
    /// The second model.
    pub b: PathBuf,
    /// Print one JSON document instead of text (every tensor, the same ones included).
    #[arg(long)]
    pub json: bool,
    /// Compare the tensors as stored: a quantized weight's members, not the weight they encode.
    #[arg(long)]
    pub raw: bool,
}

#[derive(Debug, Args)]
pub struct HashArgs {
    /// The model: a .safetensors file, an index .json, or a folder.
    pub path: PathBuf,
    /// Also hash every tensor's bytes (in parallel).
    #[arg(long)]
    pub per_tensor: bool,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell the script is for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// The command whose page to print (`check` prints stui-check(1)); stui(1) when omitted.
    pub command: Option<String>,
}

#[derive(Debug, Args)]
pub struct CacheArgs {
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

/// A number of bytes, written `123`, `512K`, `512M` or `4G` (powers of 1024).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl std::str::FromStr for ByteSize {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let (digits, shift) = match text.char_indices().last() {
            Some((at, 'k' | 'K')) => (&text[..at], 10),
            Some((at, 'm' | 'M')) => (&text[..at], 20),
            Some((at, 'g' | 'G')) => (&text[..at], 30),
            Some((at, 't' | 'T')) => (&text[..at], 40),
            _ => (text, 0),
        };
        digits
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(1 << shift))
            .map(ByteSize)
            .ok_or_else(|| format!("`{text}` is not a size such as 512M or 4G"))
    }
}

/// A number of dB: any number, but not NaN.
fn parse_decibels(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(db) if !db.is_nan() => Ok(db),
        _ => Err("not a number of dB".into()),
    }
}

fn parse_scheme(name: &str) -> Result<crate::quantize::Scheme, String> {
    crate::quantize::Scheme::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = crate::quantize::Scheme::ALL
            .iter()
            .map(|s| s.name())
            .collect();
        format!("unknown scheme; one of {}", names.join(", "))
    })
}
