//! Symmetric int8 quantization of a model's 2-D float weights, written in the compressed-tensors
//! layout that vLLM, llm-compressor and transformers read:
//!
//! - a quantized `P.weight` keeps its name, with dtype I8 and its shape; beside it
//!   `P.weight_scale`, in the source's float dtype (F16 for F8 sources), shape `[out, 1]` per
//!   output channel or `[1]` per tensor;
//! - `q = round_half_even(x / scale)` clamped to `[-127, 127]`, `scale = absmax / 127` (per row
//!   or per tensor); a row of zeros gets scale 0. Values are computed with the scale as stored,
//!   so dequantizing (`q * scale`) is within half a scale of the source everywhere;
//! - every other tensor is copied byte for byte; `__metadata__` keeps the source's entries, with
//!   `format: pt` and the quantization recorded (`quantization_config`, a JSON string).
//!
//! Output is streamed a chunk at a time, so memory stays bounded whatever the model's size, and
//! written through a temporary file in the target folder that is renamed into place.

mod code_table;
mod compare;
mod copying;
mod digest;
mod fp8;
mod int_packed;
mod lanes;
mod magnitude;
mod nvfp4;
mod pipeline;
pub mod scheme;
mod transpose;

pub use compare::{Comparison, SchemeResult, compare, scheme_quantizes};
pub use scheme::Scheme;

use crate::analysis::simd::Lanes;
use crate::analysis::values;
use crate::error::{Error, Result};
use crate::format::mapped::with_mapped;
use crate::format::writer::{
    AtomicFile, FileLayout, Metadata, Name, Specs, Staged, write_atomically,
};
use crate::format::{Dtype, Model, Shape, StringMap, Tensor};
use crate::paths::open_file;
use crate::quant::Quantization;
use crate::recycle::Recycled;
use crate::source::{ProcessEnvironment, hf_cache};
use crate::text::{escape, escape_path};
use copying::{Copies, Placement, write_copying_beside};
use digest::Digest;
use lanes::Loaded;
use magnitude::Bits;
use multiversion::multiversion;
use serde::Serialize;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Calls `function::<f64>` for an F64 `tensor`, `function::<f32>` for any other.
macro_rules! by_element {
    ($tensor:expr, $function:ident($($argument:expr),* $(,)?)) => {
        if is_wide($tensor) {
            $function::<f64>($($argument),*)
        } else {
            $function::<f32>($($argument),*)
        }
    };
}

/// One scale per output row, or one for the whole tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Granularity {
    PerChannel,
    PerTensor,
}

impl Granularity {
    fn strategy(self) -> &'static str {
        match self {
            Granularity::PerChannel => "channel",
            Granularity::PerTensor => "tensor",
        }
    }
}

/// What to do with a chosen tensor holding NaN or Inf.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NonFinite {
    /// Keep it as it is and say so.
    Skip,
    /// Refuse to write anything.
    Stop,
}

#[derive(Clone, Debug)]
pub struct Options {
    pub scheme: Scheme,
    /// Columns of a group, for the grouped int schemes.
    pub group_size: u64,
    /// W8A8's scales: per channel or per tensor.
    pub granularity: Granularity,
    /// Only tensors whose names match one of these (`*` and `?` wildcards); all when empty.
    pub include: Vec<String>,
    /// Never tensors whose names match one of these.
    pub exclude: Vec<String>,
    pub keep_embeddings: bool,
    pub keep_lm_head: bool,
    pub keep_norms: bool,
    pub non_finite: NonFinite,
    /// Keep in source precision every weight whose SNR under the scheme would fall below this
    /// many dB.
    pub keep_below_snr: Option<f64>,
}

/// How `scheme` scales its weights, in words: `per channel` or `per tensor` (W8A8 as
/// `granularity` says), `groups of 128`, `128x128 blocks`...
pub fn scales_label(scheme: Scheme, granularity: Granularity, group_size: u64) -> String {
    match scheme {
        Scheme::W8A8 => match granularity {
            Granularity::PerChannel => "per channel".into(),
            Granularity::PerTensor => "per tensor".into(),
        },
        Scheme::W8A16 | Scheme::W4A16 | Scheme::W4A16Asym => format!("groups of {group_size}"),
        Scheme::Fp8Dynamic => "per channel".into(),
        Scheme::Fp8Block => format!("{BLOCK}x{BLOCK} blocks", BLOCK = scheme::BLOCK),
        Scheme::Nvfp4A16 => format!("groups of {}", scheme::NVFP4_GROUP),
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            scheme: Scheme::W8A8,
            group_size: scheme::DEFAULT_GROUP,
            granularity: Granularity::PerChannel,
            include: Vec::new(),
            exclude: Vec::new(),
            keep_embeddings: true,
            keep_lm_head: true,
            keep_norms: true,
            non_finite: NonFinite::Stop,
            keep_below_snr: None,
        }
    }
}

/// Why a tensor is not quantized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kept {
    NotFloat,
    NotTwoDimensional,
    /// No values to quantize.
    Empty,
    NotAWeight,
    Embedding,
    LmHead,
    /// A mixture of experts' router, which the loaders read unquantized.
    Router,
    Norm,
    Excluded,
    NotIncluded,
    NonFinite,
    Unreadable,
    /// Its columns do not divide into the scheme's groups.
    Ungrouped,
    /// Its SNR under the scheme falls below the threshold asked for.
    BelowSnr,
}

impl Kept {
    /// The reason as `--json` gives it (`lm-head`, `norm`, …).
    pub fn name(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|name| name.as_str().map(str::to_owned))
            .unwrap_or_default()
    }
}

/// The decision for one tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    Quantize,
    Keep(Kept),
}

/// Decides, from names, dtypes and shapes alone, which tensors to quantize.
pub fn choose(tensor: &Tensor, options: &Options) -> Choice {
    let info = &tensor.info;
    let name = tensor.name();
    let Some(dtype) = info.dtype.known() else {
        return Choice::Keep(Kept::NotFloat);
    };
    let lower = name.to_ascii_lowercase();
    let keep = if !matches!(
        dtype,
        Dtype::F32
            | Dtype::F16
            | Dtype::Bf16
            | Dtype::F64
            | Dtype::F8E4M3
            | Dtype::F8E5M2
            | Dtype::F8E4M3Fnuz
            | Dtype::F8E5M2Fnuz
    ) {
        Some(Kept::NotFloat)
    } else if info.shape.len() != 2 {
        Some(Kept::NotTwoDimensional)
    } else if info.element_count() == Some(0) {
        Some(Kept::Empty)
    } else if !name.ends_with(".weight") {
        Some(Kept::NotAWeight)
    } else if options.keep_embeddings
        && (lower.contains("embed") || lower.contains("wte") || lower.contains("wpe"))
    {
        Some(Kept::Embedding)
    } else if options.keep_lm_head && lower.contains("lm_head") {
        Some(Kept::LmHead)
    } else if is_router(name) {
        Some(Kept::Router)
    } else if options.keep_norms && (lower.contains("norm") || lower.contains(".ln_")) {
        Some(Kept::Norm)
    } else if options.exclude.iter().any(|pattern| glob(pattern, name)) {
        Some(Kept::Excluded)
    } else if !included(name, options) {
        Some(Kept::NotIncluded)
    } else {
        None
    };
    keep.map_or(Choice::Quantize, Choice::Keep)
}

/// Whether `name` is among the tensors `--include` asks for (all of them without it).
pub fn included(name: &str, options: &Options) -> bool {
    options.include.is_empty() || options.include.iter().any(|pattern| glob(pattern, name))
}

/// Whether weight `name` is a mixture of experts' router: its module is `gate` (Qwen's,
/// `DeepSeek`'s and GLM's mixtures, Mixtral's `block_sparse_moe.gate`), `router` (gpt-oss,
/// Llama 4, Jamba) or `shared_expert_gate` (Qwen's), or the `router.layer` of Granite's
/// mixtures. vLLM builds each of them with no quantization (`ReplicatedLinear(...,
/// quant_config=None)`), so that a quantized one would not load, and llm-compressor's recipes
/// for mixtures leave them out.
fn is_router(name: &str) -> bool {
    let Some(module) = name.strip_suffix(".weight") else {
        return false;
    };
    let last = module.rsplit('.').next().unwrap_or(module);
    matches!(last, "gate" | "router" | "shared_expert_gate") || module.ends_with(".router.layer")
}

/// Matches `text` against a pattern where `*` stands for any run of characters and `?` for one.
pub fn glob(pattern: &str, text: &str) -> bool {
    let (pattern, text): (Vec<char>, Vec<char>) =
        (pattern.chars().collect(), text.chars().collect());
    let (mut p, mut t, mut star, mut resume) = (0, 0, None, 0);
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == '?' || pattern[p] == text[t]) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == '*' {
            star = Some(p);
            p += 1;
            resume = t;
        } else if let Some(s) = star {
            p = s + 1;
            resume += 1;
            t = resume;
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

/// The float dtype a quantized tensor's scales are stored in.
pub fn scale_dtype(source: Dtype) -> Dtype {
    match source {
        Dtype::F32 | Dtype::F16 | Dtype::Bf16 | Dtype::F64 => source,
        _ => Dtype::F16,
    }
}

/// The dtype of the scales of `tensor`, a float tensor to quantize.
fn scales_dtype_of(tensor: &Tensor) -> Dtype {
    scale_dtype(tensor.info.dtype.known().unwrap_or(Dtype::F32))
}

/// The shape of the scales of a weight of `shape`: one a row (`[out, 1]`) or one in all (`[1]`).
fn scales_shape(shape: &Shape, granularity: Granularity) -> Shape {
    match granularity {
        Granularity::PerChannel => Shape::from([shape.get(0).unwrap_or(1), 1]),
        Granularity::PerTensor => Shape::from([1]),
    }
}

/// `value` as it reads back after storing in `dtype`.
#[expect(
    clippy::cast_possible_truncation,
    reason = "rounding to the stored type is the point"
)]
fn stored(dtype: Dtype, value: f64) -> f64 {
    match dtype {
        Dtype::F64 => value,
        Dtype::F32 => f64::from(value as f32),
        Dtype::Bf16 => half::bf16::from_f64(value).to_f64(),
        _ => half::f16::from_f64(value).to_f64(),
    }
}

/// `value` as stored in `dtype`, rounded up rather than down when storing rounds it down: the
/// smallest value `dtype` holds at or above `value`.
fn stored_at_least(dtype: Dtype, value: f64) -> f64 {
    if dtype == Dtype::Bf16 && value > 0.0 {
        return bf16_at_least(value);
    }
    let scale = stored(dtype, value);
    if scale >= value || !scale.is_finite() {
        scale
    } else {
        next_stored_up(dtype, scale)
    }
}

/// The smallest BF16 value at or above `value` (positive), from the bits, as the grouped schemes
/// need it once for every group: the smallest `f32` at or above `value`, rounded up to BF16's 16
/// high bits (past the largest finite, infinity). Without a branch, so that the loops over a
/// row's groups calling it stay straight.
#[expect(
    clippy::inline_always,
    reason = "inlined into the kernels, whose copies for AVX2 and AVX-512 it must share"
)]
#[inline(always)]
fn bf16_at_least(value: f64) -> f64 {
    #[expect(clippy::cast_possible_truncation, reason = "rounded up just after")]
    let single = value as f32;
    // One `f32` step up where `single` rounded down (never from infinity, which is not below).
    let bits = single.to_bits() + u32::from(f64::from(single) < value);
    f64::from(f32::from_bits((bits + 0xFFFF) & 0xFFFF_0000))
}

/// The next value above `scale` (as stored in `dtype`) that `dtype` holds.
fn next_stored_up(dtype: Dtype, scale: f64) -> f64 {
    match dtype {
        Dtype::F64 => scale.next_up(),
        #[expect(
            clippy::cast_possible_truncation,
            reason = "the value is an f32 already"
        )]
        Dtype::F32 => f64::from((scale as f32).next_up()),
        Dtype::Bf16 => half::bf16::from_bits(half::bf16::from_f64(scale).to_bits() + 1).to_f64(),
        _ => half::f16::from_bits(half::f16::from_f64(scale).to_bits() + 1).to_f64(),
    }
}

/// The scale for a row whose largest magnitude is `absmax`: `absmax / 127` as stored in `dtype`,
/// rounded up instead when storing rounded it down so far that `absmax` would land more than
/// half a step beyond 127 steps. That happens only to tiny (subnormal) scales, which can even
/// underflow to zero; a normal scale keeps its nearest rounding.
fn scale_for(dtype: Dtype, absmax: f64) -> f64 {
    let scale = stored(dtype, absmax / 127.0);
    if scale * 127.5 >= absmax || !scale.is_finite() {
        return loadable(dtype, scale, 127.0);
    }
    next_stored_up(dtype, scale)
}

/// `scale`, or the value of `dtype` below it when the grid's largest value
/// `largest_code · scale` lies beyond the largest `dtype` holds (F16's 65504, BF16's and F32's
/// about 3.4e38), which a loader would turn into ±Inf. That happens only to weights at the very
/// top of their dtype's range. One step down brings the grid back within range for the codes of
/// 127 and 448 that use this, and the largest magnitude such a weight can hold then lands within
/// half a step of the largest code.
fn loadable(dtype: Dtype, scale: f64, largest_code: f64) -> f64 {
    if scale.is_finite() && scale > 0.0 && stored(dtype, largest_code * scale).is_infinite() {
        next_stored_down(dtype, scale)
    } else {
        scale
    }
}

/// The next value below `scale` (positive, as stored in `dtype`) that `dtype` holds.
fn next_stored_down(dtype: Dtype, scale: f64) -> f64 {
    match dtype {
        Dtype::F64 => scale.next_down(),
        #[expect(
            clippy::cast_possible_truncation,
            reason = "the value is an f32 already"
        )]
        Dtype::F32 => f64::from((scale as f32).next_down()),
        Dtype::Bf16 => half::bf16::from_bits(half::bf16::from_f64(scale).to_bits() - 1).to_f64(),
        _ => half::f16::from_bits(half::f16::from_f64(scale).to_bits() - 1).to_f64(),
    }
}

/// Stored values of a float `dtype` decoded.
fn decode_f64(dtype: Dtype, bytes: &[u8], out: &mut Vec<f64>) {
    <f64 as Element>::decode(dtype, bytes, out);
}

/// The error measures of the sums of a scheme's kernels.
fn finish(sums: &scheme::ErrorSums) -> Error8 {
    let error = ErrorSums {
        signal: sums.signal,
        noise: sums.noise,
        max_abs: sums.max_abs,
        max_in_scales: sums.max_in_steps,
    };
    error.finish()
}

#[expect(
    clippy::cast_possible_truncation,
    reason = "rounding to the stored type is the point"
)]
fn encode_scale(dtype: Dtype, value: f64, out: &mut Vec<u8>) {
    match dtype {
        Dtype::F64 => out.extend_from_slice(&value.to_le_bytes()),
        Dtype::F32 => out.extend_from_slice(&(value as f32).to_le_bytes()),
        Dtype::Bf16 => out.extend_from_slice(&half::bf16::from_f64(value).to_le_bytes()),
        _ => out.extend_from_slice(&half::f16::from_f64(value).to_le_bytes()),
    }
}

/// How well a tensor survives quantization.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Error8 {
    /// Signal-to-noise ratio in dB: `10 log10(sum x^2 / sum (x - x')^2)`; infinite when exact.
    pub snr_db: f64,
    pub max_abs_error: f64,
    /// `sqrt(sum (x - x')^2 / sum x^2)`.
    pub relative_rms_error: f64,
    /// Worst `|x - x'| / scale` over the elements (at most 0.5 by construction).
    pub max_error_in_scales: f64,
}

#[derive(Clone, Copy, Debug, Default)]
struct ErrorSums {
    signal: f64,
    noise: f64,
    max_abs: f64,
    max_in_scales: f64,
}

impl ErrorSums {
    fn merge(&mut self, other: &ErrorSums) {
        self.signal += other.signal;
        self.noise += other.noise;
        self.max_abs = self.max_abs.max(other.max_abs);
        self.max_in_scales = self.max_in_scales.max(other.max_in_scales);
    }

    fn finish(&self) -> Error8 {
        let snr_db = if self.noise == 0.0 {
            f64::INFINITY
        } else {
            10.0 * (self.signal / self.noise).log10()
        };
        let relative_rms_error = if self.signal == 0.0 {
            0.0
        } else {
            (self.noise / self.signal).sqrt()
        };
        Error8 {
            snr_db,
            max_abs_error: self.max_abs,
            relative_rms_error,
            max_error_in_scales: self.max_in_scales,
        }
    }
}

/// The result for one quantized tensor, by index among the model's tensors.
#[derive(Clone, Copy, Debug)]
pub struct Quantized {
    pub tensor: usize,
    pub error: Error8,
}

/// What a quantization did. Tensors are told by index among the model's tensors: a model can
/// have millions.
#[derive(Clone, Debug)]
pub struct Summary {
    pub output: Vec<PathBuf>,
    pub scheme: Scheme,
    pub group_size: u64,
    pub granularity: Granularity,
    pub quantized: Vec<Quantized>,
    /// The decision for each of the model's tensors.
    pub choices: Vec<Choice>,
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Every file written is exactly as planned (hence valid), and every quantized tensor reads
    /// back finite and within half a scale of its source.
    pub verified: bool,
}

impl Summary {
    /// The tensors kept as they were, and why.
    pub fn kept(&self) -> impl Iterator<Item = (usize, Kept)> + '_ {
        self.choices
            .iter()
            .enumerate()
            .filter_map(|(index, choice)| match choice {
                Choice::Keep(why) => Some((index, *why)),
                Choice::Quantize => None,
            })
    }

    /// The quantized tensor with the lowest SNR.
    pub fn worst(&self) -> Option<&Quantized> {
        self.quantized
            .iter()
            .min_by(|a, b| a.error.snr_db.total_cmp(&b.error.snr_db))
    }

    /// The quantized tensors that read back as ±Inf (or NaN): their grid's largest value passes
    /// the largest their scale's type holds.
    pub fn beyond_range(&self) -> impl Iterator<Item = &Quantized> + '_ {
        self.quantized
            .iter()
            .filter(|q| !q.error.max_abs_error.is_finite())
    }

    /// The quantized tensors, the lowest SNR first.
    pub fn worst_first(&self) -> Vec<&Quantized> {
        let mut worst: Vec<&Quantized> = self.quantized.iter().collect();
        worst.sort_by(|a, b| a.error.snr_db.total_cmp(&b.error.snr_db));
        worst
    }
}

/// Progress shared with whoever shows it, and the cancel flag.
#[derive(Debug, Default)]
pub struct Control {
    pub cancelled: AtomicBool,
    pub bytes_done: AtomicU64,
    pub bytes_total: AtomicU64,
}

impl Control {
    fn check(&self) -> io::Result<()> {
        if self.cancelled.load(Ordering::Relaxed) {
            Err(io::Error::new(io::ErrorKind::Interrupted, "cancelled"))
        } else {
            Ok(())
        }
    }
}

/// Bytes copied, or looked through for NaN and Inf, at a time.
const CHUNK: u64 = 4 << 20;
/// Rows read at a time are about this many bytes: a run read lands in the core's cache (2 MiB of
/// L2 here), where its decoding, or the comparison's pass for its largest magnitude, finds it.
/// Runs of 4 MiB went out to memory and came back: 1 MiB ones made BF16 saves 6-24% faster, F32
/// ones up to 10%, and the comparison on F32 8%.
const ROWS_RUN: u64 = 1 << 20;
/// Values of a run decoded and worked on at a time: 128 KiB of `f32`, which the passes over them
/// find in the core's cache.
const BLOCK_VALUES: usize = 32 << 10;
/// Runs a matrix of at least [`ROWS_RUN`] bytes but fewer than this many runs' is cut into
/// nonetheless, so that more than one thread works on it (the single run of 1 MiB each of a BF16
/// save's 256 x 2048 projections was read in kept the other threads waiting). Smaller ones are
/// read in one run, on the calling thread: a model can have millions. A number rather than the
/// threads', so that the runs, and the order the errors are summed in, are the same on every
/// machine.
const SHARED_RUNS: u64 = 4;
/// Rows read at a time at most, so that what is kept for each row (its scale) stays small however
/// narrow the rows are.
const MAX_ROWS: u64 = 1 << 16;

/// Why a model stored quantized is not quantized again: its weights are codes and scales, which
/// the schemes would take for plain values (FP8 codes without their scales), and the new
/// `quantization_config` would misdescribe the quantized weights it copies as they are.
pub fn already_quantized(quantization: &Quantization) -> String {
    format!("already quantized ({})", quantization.summary())
}

/// Why a model read from the Hub is not quantized, with what to do: every tensor is read.
pub fn needs_its_files(model: &Model) -> Option<String> {
    let remote = model.remote.as_ref()?;
    Some(format!(
        "quantize reads every tensor: download it first (`{}`)",
        remote.download_command()
    ))
}

/// Stops with what to do when `model` is read from the Hub (see [`needs_its_files`]) or is
/// already quantized (see [`already_quantized`]): the schemes read unquantized weights.
fn ensure_quantizable(model: &Model) -> Result<()> {
    if let Some(why) = needs_its_files(model) {
        return Err(Error::Invalid(why));
    }
    match crate::arch::quantization(model) {
        Some(quantization) => Err(Error::Invalid(format!(
            "{} is {}: stui quantizes unquantized weights; quantize the model it was made from",
            escape_path(&model.path),
            already_quantized(&quantization)
        ))),
        None => Ok(()),
    }
}

/// Quantizes `model` into `output`: a `.safetensors` file for a single-file model, a folder for
/// a sharded one. A model already quantized is refused. Nothing is written unless every check
/// passes; each file is written through a temporary file renamed into place.
pub fn quantize(
    model: &Model,
    output: &Path,
    options: &Options,
    control: &Control,
) -> Result<Summary> {
    ensure_quantizable(model)?;
    match options.scheme {
        Scheme::W8A8 => quantize_keeping(model, output, options, control, KEPT_SCALES, &|_| {}),
        _ => pipeline::quantize(model, output, options, control),
    }
}

/// [`quantize`], keeping at most `kept_scales` per-channel scales from the first pass, running
/// `before_read_back` on each file written before it is read back.
fn quantize_keeping(
    model: &Model,
    output: &Path,
    options: &Options,
    control: &Control,
    kept_scales: u64,
    before_read_back: &(dyn Fn(&Path) + Sync),
) -> Result<Summary> {
    let (sharded, targets, files) = prepare(model, output)?;
    let mut choices = choose_all(model, &files, options, control, |_| true)?;
    let absmax = first_pass(model, &files, &mut choices, options, control, kept_scales)?;
    quantizes_some(&choices, options)?;
    let _folder = ready_folder(&targets)?;
    let ignore = ignored_modules(model, &choices);
    let config = quantization_config(options, &ignore).to_string();
    let context = ShardContext {
        model,
        files: &files,
        choices: &choices,
        absmax: &absmax,
        granularity: options.granularity,
        config: &config,
        control,
        before_read_back,
    };
    let written = write_outputs(
        model,
        output,
        (sharded, &targets),
        &ignore,
        options,
        &context,
    )?;
    Ok(written.summary(model, targets, options, choices))
}

/// How a scheme writes the files of a quantized model.
trait Writer {
    /// Writes output file `shard` to `target`.
    fn write_shard(&self, shard: usize, target: &Path) -> Result<Written>;
    /// Writes the index of a sharded output into the folder `output`; gives its number of
    /// entries.
    fn write_index(&self, output: &Path) -> Result<usize>;
}

/// The decision for each of the model's tensors: those `options` choose and the scheme `fits`,
/// less those whose SNR would fall below the threshold.
fn choose_all(
    model: &Model,
    files: &[File],
    options: &Options,
    control: &Control,
    fits: impl Fn(&Tensor) -> bool,
) -> Result<Vec<Choice>> {
    let mut choices: Vec<Choice> = model
        .tensors
        .iter()
        .map(|t| match choose(t, options) {
            Choice::Quantize if !fits(t) => Choice::Keep(Kept::Ungrouped),
            choice => choice,
        })
        .collect();
    if let Some(threshold) = options.keep_below_snr {
        let below = compare::below_snr(model, files, &choices, options, threshold, control)?;
        compare::keep_below(&mut choices, &below);
    }
    quantizes_some(&choices, options)?;
    Ok(choices)
}

/// An error when `choices` quantize nothing (weights kept for their SNR, their groups, or, once
/// read, for holding NaN or Inf): the output would be a copy declaring a quantization it does not
/// hold.
fn quantizes_some(choices: &[Choice], options: &Options) -> Result<()> {
    if choices.contains(&Choice::Quantize) {
        Ok(())
    } else {
        Err(Error::Invalid(nothing_to_quantize(choices, options)))
    }
}

/// Why `choices` quantize nothing, and what would change that.
fn nothing_to_quantize(choices: &[Choice], options: &Options) -> String {
    let scheme = options.scheme;
    let kept = |why: Kept| choices.contains(&Choice::Keep(why));
    if kept(Kept::NonFinite) {
        "every weight left to quantize holds NaN or Inf and is kept as it is (--skip-nonfinite): \
         nothing is left to quantize (`stui stats` lists them)"
            .into()
    } else if let (true, Some(threshold)) = (kept(Kept::BelowSnr), options.keep_below_snr) {
        format!(
            "every weight chosen falls below {threshold} dB under {scheme}: nothing is left to \
             quantize (a lower --keep-below-snr keeps fewer)"
        )
    } else if kept(Kept::Ungrouped) {
        let groups = scales_label(scheme, options.granularity, options.group_size);
        format!(
            "no weight chosen has columns that divide into {scheme}'s {groups}: nothing to \
             quantize (another --group-size, or another scheme)"
        )
    } else {
        "no tensor to quantize: stui quantizes 2-D float weights, and --include, --exclude and \
         the embeddings, lm_head and norms kept leave none"
            .into()
    }
}

/// Creates the folder of the files to write, and removes the temporaries an interrupted save
/// left there; gives the folder if it made it, to be removed again should the save stop.
fn ready_folder(targets: &[PathBuf]) -> Result<FolderMade> {
    let folder = targets[0]
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let made = FolderMade((!folder.exists()).then(|| folder.to_owned()));
    std::fs::create_dir_all(folder).map_err(|e| Error::io(folder, e))?;
    remove_stale_temporaries(folder);
    Ok(made)
}

/// The folder a save made for its output, if it made one: removed when the save ends with the
/// folder empty (it stopped before anything was put in place).
struct FolderMade(Option<PathBuf>);

impl Drop for FolderMade {
    fn drop(&mut self) {
        if let Some(folder) = &self.0 {
            // Fails, as it should, once the folder holds the output.
            let _ = std::fs::remove_dir(folder);
        }
    }
}

/// Writes every file of `targets` through `writer`, then the index of a sharded output and the
/// companion files (config.json with `ignore`, and the rest copied).
fn write_outputs(
    model: &Model,
    output: &Path,
    (sharded, targets): (bool, &[PathBuf]),
    ignore: &[&str],
    options: &Options,
    writer: &impl Writer,
) -> Result<Written> {
    let mut all = Written {
        quantized: Vec::new(),
        bytes: 0,
        verified: true,
        staged: Vec::with_capacity(targets.len()),
    };
    for (shard, target) in targets.iter().enumerate() {
        let written = writer.write_shard(shard, target)?;
        all.bytes += written.bytes;
        all.staged.extend(written.staged);
        // A grid value the loader's type cannot hold (at the top of BF16's range) reads back
        // as Inf, however close the grid came to the value.
        let loadable = written
            .quantized
            .iter()
            .all(|q| q.error.max_abs_error.is_finite());
        all.verified &= written.verified && loadable;
        if all.quantized.is_empty() {
            all.quantized = written.quantized;
        } else {
            all.quantized.extend(written.quantized);
        }
    }
    for file in all.staged.drain(..) {
        file.persist()?;
    }
    if sharded {
        let entries = writer.write_index(output)?;
        all.verified &= index_reads_back(model, output, entries)?;
    }
    if let Some(folder) = targets[0].parent() {
        copy_companions(model, folder, ignore, options)?;
    }
    Ok(all)
}

/// Open `model`'s files for quantizing it into `output`: whether the output is a folder, the
/// files to write, and the model's files opened.
fn prepare(model: &Model, output: &Path) -> Result<(bool, Vec<PathBuf>, Vec<File>)> {
    if !model.is_valid() {
        return Err(Error::Invalid(
            "the model is not valid (see `stui check`); refusing to quantize it".into(),
        ));
    }
    let sharded = model.shards.len() > 1 || model.source != crate::format::model::Source::File;
    let output_usable = if sharded {
        crate::paths::look_at_output_folder(output)
    } else {
        crate::paths::look_at_output_file(output)
    };
    output_usable.map_err(|e| Error::io(output, e))?;
    if let Some(cache) = hf_cache::cache_holding(output, &ProcessEnvironment) {
        return Err(Error::Invalid(format!(
            "refusing to write into the Hugging Face cache: {} is inside {}, which holds what \
             the Hub sent; choose an output outside it",
            escape_path(output),
            escape_path(&cache)
        )));
    }
    if sharded && output.extension().is_some_and(|ext| ext == "safetensors") {
        return Err(Error::Invalid(format!(
            "{} would be a folder: a sharded model, or one given as a folder or a repository \
             id, is written as a folder of its files and config.json; name the folder, e.g. {}",
            escape_path(output),
            escape_path(&output.with_extension(""))
        )));
    }
    let sources: std::collections::HashSet<PathBuf> =
        model.shards.iter().map(|s| canonical(&s.path)).collect();
    let targets: Vec<PathBuf> = if sharded {
        model.shards.iter().map(|s| output.join(&s.label)).collect()
    } else {
        vec![output.to_owned()]
    };
    for target in &targets {
        if sources.contains(&canonical(target)) {
            return Err(Error::Invalid(format!(
                "refusing to overwrite the source {}",
                escape(&target.display().to_string())
            )));
        }
    }
    let files: Vec<File> = model
        .shards
        .iter()
        .map(|s| open_file(&s.path).map_err(|e| Error::io(&s.path, e)))
        .collect::<Result<_>>()?;
    if model.tensors.len() > u32::MAX as usize {
        return Err(Error::Invalid("too many tensors to quantize".into()));
    }
    Ok((sharded, targets, files))
}

/// Per-channel scales kept from the first pass, at most this many (16 MiB): those of the first
/// tensors, which then need no pass of their own to write their scales. The scales of the rest
/// are worked out from each row when it is read, so that memory does not grow with the rows of
/// a model (160 MB of scales for the largest open models; eight times the data for a hostile
/// file of one-column weights).
const KEPT_SCALES: u64 = 2 << 20;

/// What the first pass learned for the scales: per tensor, each tensor's largest magnitude (0
/// for a tensor kept as it is); per channel, the scales of the rows of the first tensors.
enum Absmax {
    PerTensor(Vec<f64>),
    PerChannel {
        /// Scales as stored, one run after another, of the tensors before `kept_ends.len()`.
        kept: Vec<f64>,
        /// Where each of those tensors' run ends in `kept`.
        kept_ends: Vec<u32>,
    },
}

impl Absmax {
    /// How the rows of quantized `tensor` (an index among the model's) find their scales.
    fn row_scales(&self, model: &Model, tensor: usize) -> RowScales<'_> {
        let dtype = scales_dtype_of(&model.tensors[tensor]);
        match self {
            Absmax::PerTensor(largest) => RowScales::Shared(scale_for(dtype, largest[tensor])),
            Absmax::PerChannel { kept, kept_ends } if tensor < kept_ends.len() => {
                let end = |index: usize| kept_ends[index] as usize;
                let start = tensor.checked_sub(1).map_or(0, end);
                RowScales::Kept(&kept[start..end(tensor)])
            }
            Absmax::PerChannel { .. } => RowScales::Own(dtype),
        }
    }
}

/// Where a row's scale comes from.
#[derive(Clone, Copy, Debug)]
enum RowScales<'a> {
    /// One for every row of the tensor.
    Shared(f64),
    /// Each row's, by row.
    Kept(&'a [f64]),
    /// The row's own, from its largest magnitude, as stored in this dtype.
    Own(Dtype),
}

impl RowScales<'_> {
    /// The scale of `row`, the tensor's row `index`.
    fn of<E: Element>(self, index: usize, row: &[E]) -> f64 {
        match self {
            RowScales::Shared(scale) => scale,
            RowScales::Kept(scales) => scales[index],
            RowScales::Own(dtype) => scale_for(dtype, absmax_of(row).0),
        }
    }
}

/// The first pass: every quantized tensor's largest magnitude, and the scales of the rows of the
/// first. A tensor holding NaN or Inf is kept as it is or stops everything, as the options say.
fn first_pass(
    model: &Model,
    files: &[File],
    choices: &mut [Choice],
    options: &Options,
    control: &Control,
    kept_scales: u64,
) -> Result<Absmax> {
    let per_channel = options.granularity == Granularity::PerChannel;
    // The tensors whose scales are kept: the first, as long as their rows fit, up to the last
    // one quantized.
    let (mut rows, mut kept_rows) = (0u64, 0u64);
    let mut kept_before = 0;
    if per_channel {
        for (index, (tensor, choice)) in model.tensors.iter().zip(choices.iter()).enumerate() {
            if *choice == Choice::Quantize {
                rows += tensor.info.shape.get(0).unwrap_or(1);
                if rows > kept_scales {
                    break;
                }
                (kept_before, kept_rows) = (index + 1, rows);
            }
        }
    }
    // Each quantized tensor is read by this pass and for its values, its int8 values read back
    // from the file written (counted as a read of the source, which it replaces), and it is read
    // for its scales when they are its rows' own and not kept; a kept tensor is copied.
    let total: u64 = model
        .tensors
        .iter()
        .zip(choices.iter())
        .enumerate()
        .map(|(index, (tensor, choice))| {
            let reads = match choice {
                Choice::Keep(_) => 1,
                Choice::Quantize if per_channel && index >= kept_before => 4,
                Choice::Quantize => 3,
            };
            reads * tensor.info.byte_len()
        })
        .sum();
    control.bytes_total.fetch_add(total, Ordering::Relaxed);
    // Sized exactly: doubling lists of millions would hold both copies at once.
    let mut kept = Vec::with_capacity(usize::try_from(kept_rows).unwrap_or(0));
    let mut kept_ends = Vec::with_capacity(kept_before);
    let mut largest = Vec::with_capacity(if per_channel { 0 } else { model.tensors.len() });
    for (index, (tensor, choice)) in model.tensors.iter().zip(choices.iter_mut()).enumerate() {
        let keep_rows = index < kept_before;
        let mut tensor_largest = 0.0;
        if *choice == Choice::Quantize {
            match tensor_absmax(model, files, tensor, keep_rows, control)
                .map_err(|e| Error::io(&model.shard_of(tensor).path, e))?
            {
                Some((value, rows)) => {
                    tensor_largest = value;
                    let dtype = scales_dtype_of(tensor);
                    kept.extend(rows.iter().map(|&row| scale_for(dtype, row)));
                }
                None if options.non_finite == NonFinite::Skip => {
                    *choice = Choice::Keep(Kept::NonFinite);
                }
                None => {
                    return Err(Error::Invalid(format!(
                        "`{}` holds NaN or Inf; quantizing it would spread them (skip such tensors to go on)",
                        escape(tensor.name())
                    )));
                }
            }
        }
        if per_channel {
            if keep_rows {
                // At most `kept_scales` (a few million) scales are kept.
                kept_ends.push(u32::try_from(kept.len()).unwrap_or(u32::MAX));
            }
        } else {
            largest.push(tensor_largest);
        }
    }
    let absmax = if per_channel {
        Absmax::PerChannel { kept, kept_ends }
    } else {
        Absmax::PerTensor(largest)
    };
    Ok(absmax)
}

fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned())
}

/// Removes temporary files an interrupted save left in `folder`.
fn remove_stale_temporaries(folder: &Path) {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with(".stui-tmp-") && name.ends_with(".partial")) {
            continue;
        }
        // A temporary still locked is another save's, in progress (see `write_atomically`).
        if std::fs::File::open(entry.path()).is_ok_and(|file| file.try_lock().is_ok()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// How a source's values reach the row kernels: as `f32` for every float dtype `f32` holds
/// exactly (F32 data in place, without a copy), as `f64` for F64.
trait Element: bytemuck::Pod + Send + Sync + Into<f64> {
    /// The dtype whose bytes are these values as they are.
    const IN_PLACE: Dtype;
    /// Decodes `bytes` of `dtype` into `out`.
    fn decode(dtype: Dtype, bytes: &[u8], out: &mut Vec<Self>);

    /// Buffers for decoding into.
    fn buffers() -> &'static Recycled<Vec<Self>>;

    /// [`quantize_row`], in `f32` when `narrow` says the source's values and its scale have at
    /// most 11 significant bits (see [`quantize_narrow_row`]).
    fn quantize(
        row: &[Self],
        scale: f64,
        out: &mut [u8],
        narrow: bool,
        loaded: Loaded,
    ) -> ErrorSums;

    /// [`row_within_half_a_scale`], in `f32` when `narrow` says so (see
    /// [`narrow_row_within_half_a_scale`]).
    fn within(row: &[Self], int8: &[u8], scale: f64, narrow: bool) -> bool;
}

impl Element for f32 {
    const IN_PLACE: Dtype = Dtype::F32;
    fn buffers() -> &'static Recycled<Vec<f32>> {
        static BUFFERS: Recycled<Vec<f32>> = Recycled::new();
        &BUFFERS
    }
    fn decode(dtype: Dtype, bytes: &[u8], out: &mut Vec<f32>) {
        // Resized, not cleared: a buffer handed on keeps its room, and only what it grows by is
        // zeroed before being written over.
        out.resize(bytes.len() * 8 / dtype.bits() as usize, 0.0);
        decode_into(dtype, bytes, out);
    }

    #[expect(
        clippy::cast_possible_truncation,
        reason = "a narrow source's scale is stored as BF16 or F16, which f32 holds exactly"
    )]
    fn within(row: &[f32], int8: &[u8], scale: f64, narrow: bool) -> bool {
        if narrow {
            narrow_row_within_half_a_scale(row, int8, scale as f32)
        } else {
            row_within_half_a_scale(row, int8, scale)
        }
    }

    #[expect(
        clippy::cast_possible_truncation,
        reason = "a narrow source's scale is stored as BF16 or F16, which f32 holds exactly"
    )]
    fn quantize(
        row: &[f32],
        scale: f64,
        out: &mut [u8],
        narrow: bool,
        loaded: Loaded,
    ) -> ErrorSums {
        if narrow {
            quantize_narrow_row(row, scale as f32, out, loaded)
        } else {
            quantize_row(row, scale, out, loaded)
        }
    }
}

impl Element for f64 {
    const IN_PLACE: Dtype = Dtype::F64;
    fn buffers() -> &'static Recycled<Vec<f64>> {
        static BUFFERS: Recycled<Vec<f64>> = Recycled::new();
        &BUFFERS
    }
    fn decode(dtype: Dtype, bytes: &[u8], out: &mut Vec<f64>) {
        struct Wide<'a>(&'a mut Vec<f64>);
        impl values::Sink for Wide<'_> {
            fn f32s(&mut self, values: &[f32]) {
                self.0.extend(values.iter().map(|&v| f64::from(v)));
            }
            fn f64s(&mut self, values: &[f64]) {
                self.0.extend_from_slice(values);
            }
        }
        out.clear();
        values::feed(dtype, bytes, &mut Wide(out));
    }

    fn quantize(
        row: &[f64],
        scale: f64,
        out: &mut [u8],
        _narrow: bool,
        loaded: Loaded,
    ) -> ErrorSums {
        quantize_row(row, scale, out, loaded)
    }

    fn within(row: &[f64], int8: &[u8], scale: f64, _narrow: bool) -> bool {
        row_within_half_a_scale(row, int8, scale)
    }
}

/// Elements in a row of a `[out, in]` weight (at least one, so that rows can be cut).
fn row_length(tensor: &Tensor) -> io::Result<usize> {
    Ok(usize::try_from(tensor.info.shape.get(1).unwrap_or(1))
        .map_err(io::Error::other)?
        .max(1))
}

/// Whether a tensor's values have at most 11 significant bits (BF16, F16 and the F8, F6 and F4
/// types), its scales stored as BF16 or F16: its int8 rows are made and checked in `f32` (see
/// [`quantize_narrow_row`]).
fn is_narrow(tensor: &Tensor) -> bool {
    tensor
        .info
        .dtype
        .known()
        .is_some_and(|dtype| dtype.is_float() && dtype.bits() <= 16)
}

/// Whether a tensor's values are read as `f64` (F64) rather than `f32`.
fn is_wide(tensor: &Tensor) -> bool {
    tensor.info.dtype.known() == Some(Dtype::F64)
}

/// Reads `tensor` a run of whole rows at a time (about [`ROWS_RUN`] bytes),
/// runs `compute` on each run's values on the rayon pool, a few runs at once, and hands the
/// results to `consume` in order, on a thread of its own, so that writing one group of runs
/// overlaps computing the next. Rows are `[out, in]`'s rows; `compute` gets the first row's
/// index.
fn map_rows<E: Element, T: Send>(
    model: &Model,
    files: &[File],
    tensor: &Tensor,
    control: &Control,
    compute: impl Fn(usize, &[E]) -> io::Result<T> + Sync,
    consume: impl FnMut(T) -> io::Result<()> + Send,
) -> io::Result<()> {
    map_rows_aligned(model, files, tensor, 1, control, compute, consume)
}

/// [`map_rows`], each run of rows starting at a multiple of `align` rows. `compute` is called on
/// a block of rows at a time (a multiple of `align`, about [`BLOCK_VALUES`] values), each block
/// decoded as it comes, so that the passes over a block's values stay in the core's cache.
fn map_rows_aligned<E: Element, T: Send>(
    model: &Model,
    files: &[File],
    tensor: &Tensor,
    align: u64,
    control: &Control,
    compute: impl Fn(usize, &[E]) -> io::Result<T> + Sync,
    mut consume: impl FnMut(T) -> io::Result<()> + Send,
) -> io::Result<()> {
    let dtype = tensor
        .info
        .dtype
        .known()
        .ok_or_else(|| io::Error::other("unknown dtype"))?;
    let columns = row_length(tensor)?;
    let row_bytes = usize::try_from(dtype.byte_len(columns as u64).unwrap_or(0))
        .map_err(io::Error::other)?
        .max(1);
    let block_rows = block_rows(columns, align);
    map_byte_runs(
        model,
        files,
        tensor,
        align,
        control,
        |first, bytes| {
            let mut results: smallvec::SmallVec<[T; 1]> = smallvec::SmallVec::new();
            let mut decoded = None;
            for (block, bytes) in bytes.chunks(block_rows * row_bytes).enumerate() {
                let first = first + block * block_rows;
                if let Some(values) = in_place::<E>(dtype, bytes) {
                    results.push(compute(first, values)?);
                    continue;
                }
                let decoded = decoded.get_or_insert_with(|| E::buffers().take());
                E::decode(dtype, bytes, decoded);
                results.push(compute(first, decoded)?);
            }
            if let Some(decoded) = decoded {
                E::buffers().give(decoded);
            }
            Ok(results)
        },
        |results| results.into_iter().try_for_each(&mut consume),
    )
}

/// `bytes` as the values of `E` they are, where `dtype` is `E`'s own, stored little-endian and
/// aligned: used where they lie, without a copy.
fn in_place<E: Element>(dtype: Dtype, bytes: &[u8]) -> Option<&[E]> {
    (dtype == E::IN_PLACE && cfg!(target_endian = "little"))
        .then(|| bytemuck::try_cast_slice::<u8, E>(bytes).ok())
        .flatten()
}

/// The elements of `dtype` in `bytes` decoded into `out`, which holds one value for each.
fn decode_into(dtype: Dtype, bytes: &[u8], out: &mut [f32]) {
    /// Writes the values fed to it one after the other.
    struct InPlace<'a> {
        out: &'a mut [f32],
        at: usize,
    }
    impl InPlace<'_> {
        fn next(&mut self, count: usize) -> &mut [f32] {
            let len = self.out.len();
            let start = self.at.min(len);
            self.at += count;
            &mut self.out[start..self.at.min(len)]
        }
    }
    impl values::Sink for InPlace<'_> {
        fn f32s(&mut self, values: &[f32]) {
            let out = self.next(values.len());
            out.copy_from_slice(&values[..out.len()]);
        }
        fn halves(&mut self, lanes: Lanes, bytes: &[u8]) {
            values::widen(lanes, bytes, self.next(bytes.len() / lanes.size()));
        }
        #[expect(
            clippy::cast_possible_truncation,
            reason = "only F64 data comes as f64, and F64 is read as f64"
        )]
        fn f64s(&mut self, values: &[f64]) {
            for (out, &value) in self.next(values.len()).iter_mut().zip(values) {
                *out = value as f32;
            }
        }
    }
    if dtype == Dtype::Bf16 {
        magnitude::widen_bf16(bytes, out);
    } else {
        values::feed(dtype, bytes, &mut InPlace { out, at: 0 });
    }
}

/// The rows of each block a run of [`map_rows_aligned`] is worked on in, for rows of `columns`
/// values: about [`BLOCK_VALUES`] values, a multiple of `align` rows.
fn block_rows(columns: usize, align: u64) -> usize {
    let align = usize::try_from(align).unwrap_or(usize::MAX).max(1);
    ((BLOCK_VALUES / columns.max(1)) / align).max(1) * align
}

/// The runs (first row, rows) a matrix of `dtype` values is read in: about [`ROWS_RUN`] bytes
/// each, at most [`MAX_ROWS`] rows and, from [`ROWS_RUN`] bytes, a [`SHARED_RUNS`]th of the
/// matrix, a multiple of `align` rows but for the last.
fn row_runs([rows, columns]: [u64; 2], dtype: Dtype, align: u64) -> Vec<(u64, u64)> {
    let row_bytes = dtype.byte_len(columns).unwrap_or(0).max(1);
    let align = align.max(1);
    let rows_per_run = ((ROWS_RUN / row_bytes).clamp(1, MAX_ROWS) / align).max(1) * align;
    let rows_per_run = if rows.saturating_mul(row_bytes) < ROWS_RUN {
        rows_per_run
    } else {
        let shared = rows.div_ceil(SHARED_RUNS).div_ceil(align).max(1) * align;
        rows_per_run.min(shared)
    };
    (0..rows)
        .step_by(usize::try_from(rows_per_run).unwrap_or(1))
        .map(|row| (row, rows_per_run.min(rows - row)))
        .collect()
}

/// Runs `work` on the bytes of the run `(row, rows)` of a matrix stored from `start` in `file`,
/// `row_bytes` to a row; with their count.
fn with_rows<T>(
    file: &File,
    (start, row_bytes): (u64, u64),
    (row, rows): (u64, u64),
    work: impl FnOnce(&[u8]) -> T,
) -> io::Result<(T, u64)> {
    let len = rows * row_bytes;
    let bytes = usize::try_from(len).map_err(io::Error::other)?;
    Ok((
        with_mapped(file, start + row * row_bytes, bytes, work)?,
        len,
    ))
}

/// [`map_rows_aligned`] on the runs' bytes as stored.
fn map_byte_runs<T: Send>(
    model: &Model,
    files: &[File],
    tensor: &Tensor,
    align: u64,
    control: &Control,
    compute: impl Fn(usize, &[u8]) -> io::Result<T> + Sync,
    mut consume: impl FnMut(T) -> io::Result<()> + Send,
) -> io::Result<()> {
    let info = &tensor.info;
    let dtype = info
        .dtype
        .known()
        .ok_or_else(|| io::Error::other("unknown dtype"))?;
    let [rows, columns] = info
        .shape
        .matrix()
        .ok_or_else(|| io::Error::other("not a matrix"))?;
    let row_bytes = dtype.byte_len(columns).unwrap_or(0).max(1);
    let (start, _) = model.file_range(tensor);
    let file = &files[tensor.shard];
    let runs = row_runs([rows, columns], dtype, align);
    let read_run = |&run: &(u64, u64)| -> io::Result<(T, u64)> {
        let first = usize::try_from(run.0).map_err(io::Error::other)?;
        let (value, len) = with_rows(file, (start, row_bytes), run, |bytes| compute(first, bytes))?;
        Ok((value?, len))
    };
    if runs.len() == 1 || rayon::current_thread_index().is_some() {
        // A small tensor, read in one run: no pipeline to set up (a model can have millions).
        // On one of the pool's threads, whose waiting for the runs it gave the pool could leave
        // them with no thread to run them, the runs are read in turn there.
        for run in &runs {
            control.check()?;
            let (value, bytes) = read_run(run)?;
            consume(value)?;
            control.bytes_done.fetch_add(bytes, Ordering::Relaxed);
        }
        return Ok(());
    }
    // Each run goes to the pool as the one `window` places ahead of it is consumed, so that the
    // threads never wait for a batch's last run; the results, which come back in any order, are
    // consumed in order on this thread, at most `window` of them held.
    let window = rayon::current_num_threads().max(1) * 2;
    // A run that panics sends its panic, raised again here: waiting for a result that never
    // came would hang.
    let (done, finished) = std::sync::mpsc::channel::<(usize, std::thread::Result<_>)>();
    rayon::in_place_scope(|scope| -> io::Result<()> {
        let read_run = &read_run;
        let spawn = |index: usize| {
            let done = done.clone();
            let run = runs[index];
            scope.spawn(move |_| {
                let result =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read_run(&run)));
                // The receiver outlives the scope: a result sent after the caller stopped on an
                // error is dropped with it.
                let _ = done.send((index, result));
            });
        };
        let mut waiting: std::collections::VecDeque<Option<(T, u64)>> =
            std::collections::VecDeque::with_capacity(window);
        let (mut spawned, mut consumed) = (0, 0);
        while consumed < runs.len() {
            while spawned < runs.len() && spawned < consumed + window {
                control.check()?;
                spawn(spawned);
                waiting.push_back(None);
                spawned += 1;
            }
            let (index, result) = finished
                .recv()
                .map_err(|_| io::Error::other("a run was lost"))?;
            let result = result.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            waiting[index - consumed] = Some(result?);
            while let Some((value, bytes)) = waiting.front_mut().and_then(Option::take) {
                waiting.pop_front();
                consume(value)?;
                control.bytes_done.fetch_add(bytes, Ordering::Relaxed);
                consumed += 1;
            }
        }
        Ok(())
    })
}

/// Buffers of the int8 values written and read back.
static INT8_BUFFERS: Recycled<Vec<u8>> = Recycled::new();

/// A tensor's largest magnitude and, when `rows` says so, each row's; `None` if it holds NaN or
/// Inf.
fn tensor_absmax(
    model: &Model,
    files: &[File],
    tensor: &Tensor,
    rows: bool,
    control: &Control,
) -> io::Result<Option<(f64, Vec<f64>)>> {
    if let Some(bits) = tensor.info.dtype.known().and_then(Bits::of) {
        return tensor_absmax_of_bits(model, files, tensor, bits, rows, control);
    }
    by_element!(
        tensor,
        tensor_absmax_as(model, files, tensor, rows, control)
    )
}

/// The largest magnitude of each of `tensors` (indices into the model's), `None` for one that
/// holds NaN or Inf. Those of F32, BF16 or F16 are read in runs shared out among the threads
/// across all the tensors at once: read tensor by tensor, a tensor of a few runs kept the threads
/// waiting on one another, and the pass took a fifth of a quantization. Once a run of a tensor
/// holds NaN or Inf, its runs not yet begun are not read (a model whose training diverged holds
/// them everywhere). An error names the file.
fn largest_magnitudes(
    model: &Model,
    files: &[File],
    tensors: &[usize],
    control: &Control,
) -> Result<Vec<Option<f64>>> {
    use rayon::prelude::*;
    let mut runs = Vec::new();
    for (slot, &index) in tensors.iter().enumerate() {
        let tensor = &model.tensors[index];
        let Some(bits) = tensor.info.dtype.known().and_then(Bits::of) else {
            continue;
        };
        let (start, len) = model.file_range(tensor);
        let end = start.saturating_add(len);
        let run = CHUNK - CHUNK % bits.size() as u64;
        runs.extend(
            (start..end)
                .step_by(usize::try_from(run).unwrap_or(usize::MAX))
                .map(|begin| (slot, bits, begin, run.min(end - begin))),
        );
    }
    let non_finite: Vec<AtomicBool> = tensors.iter().map(|_| AtomicBool::new(false)).collect();
    let read = |&(slot, bits, begin, len): &(usize, Bits, u64, u64)| {
        let tensor = &model.tensors[tensors[slot]];
        if non_finite[slot].load(Ordering::Relaxed) {
            control.bytes_done.fetch_add(len, Ordering::Relaxed);
            return Ok((slot, 0));
        }
        let largest = (|| {
            control.check()?;
            let len = usize::try_from(len).map_err(io::Error::other)?;
            with_mapped(&files[tensor.shard], begin, len, |bytes| {
                bits.largest_bits(bytes)
            })
        })()
        .map_err(|e| Error::io(&model.shard_of(tensor).path, e))?;
        if bits.magnitude(largest).is_none() {
            non_finite[slot].store(true, Ordering::Relaxed);
        }
        control.bytes_done.fetch_add(len, Ordering::Relaxed);
        Ok((slot, largest))
    };
    let largest_bits: Vec<(usize, u32)> = runs.par_iter().map(read).collect::<Result<_>>()?;
    let mut largest: Vec<Option<u32>> = vec![None; tensors.len()];
    for (slot, bits) in largest_bits {
        largest[slot] = Some(largest[slot].unwrap_or(0).max(bits));
    }
    tensors
        .iter()
        .zip(largest)
        .map(|(&index, bits)| {
            let tensor = &model.tensors[index];
            match tensor.info.dtype.known().and_then(Bits::of) {
                Some(kind) => Ok(kind.magnitude(bits.unwrap_or(0))),
                None => tensor_absmax(model, files, tensor, false, control)
                    .map(|largest| largest.map(|(value, _)| value))
                    .map_err(|e| Error::io(&model.shard_of(tensor).path, e)),
            }
        })
        .collect()
}

/// [`tensor_absmax`] of F32, BF16 or F16, read from the values' bits.
fn tensor_absmax_of_bits(
    model: &Model,
    files: &[File],
    tensor: &Tensor,
    bits: Bits,
    rows: bool,
    control: &Control,
) -> io::Result<Option<(f64, Vec<f64>)>> {
    let row_bytes = row_length(tensor)? * bits.size();
    let (mut largest, mut row_maxima) = (0u32, Vec::new());
    map_byte_runs(
        model,
        files,
        tensor,
        1,
        control,
        |_, bytes| {
            if !rows {
                return Ok((bits.largest_bits(bytes), Vec::new()));
            }
            let maxima: Vec<u32> = bytes
                .chunks(row_bytes)
                .map(|row| bits.largest_bits(row))
                .collect();
            Ok((maxima.iter().copied().max().unwrap_or(0), maxima))
        },
        |(max, maxima)| {
            largest = largest.max(max);
            // Rows are kept only while every value is finite: a non-finite tensor keeps none.
            if bits.magnitude(largest).is_some() {
                row_maxima.extend(maxima.into_iter().map(|m| bits.magnitude(m).unwrap_or(0.0)));
            }
            Ok(())
        },
    )?;
    Ok(bits.magnitude(largest).map(|largest| (largest, row_maxima)))
}

fn tensor_absmax_as<E: Element>(
    model: &Model,
    files: &[File],
    tensor: &Tensor,
    rows: bool,
    control: &Control,
) -> io::Result<Option<(f64, Vec<f64>)>> {
    let columns = row_length(tensor)?;
    let (mut largest, mut finite, mut row_maxima) = (0.0f64, true, Vec::new());
    map_rows(
        model,
        files,
        tensor,
        control,
        |_, values: &[E]| {
            if !rows {
                return Ok((absmax_of(values), Vec::new()));
            }
            let mut all_finite = true;
            let maxima: Vec<f64> = values
                .chunks(columns)
                .map(|row| {
                    let (max, finite) = absmax_of(row);
                    all_finite &= finite;
                    max
                })
                .collect();
            let max = maxima.iter().copied().fold(0.0, f64::max);
            Ok(((max, all_finite), maxima))
        },
        |((max, all_finite), maxima)| {
            largest = largest.max(max);
            finite &= all_finite;
            row_maxima.extend(maxima);
            Ok(())
        },
    )?;
    Ok(finite.then_some((largest, row_maxima)))
}

/// Writes the scales of each row of a tensor, as stored in `dtype`.
fn write_row_scales<E: Element>(
    model: &Model,
    files: &[File],
    tensor: &Tensor,
    dtype: Dtype,
    out: &mut (impl Write + Send),
    control: &Control,
) -> io::Result<u64> {
    let columns = row_length(tensor)?;
    let mut digest = Digest::default();
    map_rows(
        model,
        files,
        tensor,
        control,
        |_, values: &[E]| {
            let mut bytes = Vec::new();
            for row in values.chunks(columns) {
                encode_scale(dtype, RowScales::Own(dtype).of(0, row), &mut bytes);
            }
            Ok(bytes)
        },
        |bytes| {
            digest.update(&bytes);
            out.write_all(&bytes)
        },
    )?;
    Ok(digest.finish())
}

/// Values summed or compared side by side in the row kernels, so that they vectorize.
const LANES: usize = 8;

/// A row's largest magnitude, and whether every value is finite.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn absmax_of<E: Element>(row: &[E]) -> (f64, bool) {
    // `x * 0.0` is 0 for a finite `x` and NaN otherwise: one branch-free pass.
    let (mut max, mut poison) = ([0f64; LANES], [0f64; LANES]);
    let (chunks, rest) = row.as_chunks::<LANES>();
    for chunk in chunks {
        for i in 0..LANES {
            let x: f64 = chunk[i].into();
            max[i] = if x.abs() > max[i] { x.abs() } else { max[i] };
            poison[i] += x * 0.0;
        }
    }
    for &x in rest {
        let x: f64 = x.into();
        max[0] = max[0].max(x.abs());
        poison[0] += x * 0.0;
    }
    (
        max.into_iter().fold(0.0, f64::max),
        poison.iter().sum::<f64>() == 0.0,
    )
}

/// Whether every value of `row`, dequantized from `int8` with `scale`, is within half a scale
/// of the source value.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn row_within_half_a_scale<E: Element>(row: &[E], int8: &[u8], scale: f64) -> bool {
    let limit = scale * 0.5 * (1.0 + 1e-9) + f64::MIN_POSITIVE;
    // Counted, not tested one by one, so that the loop vectorizes; NaN (in the source) counts.
    let mut beyond = [0u32; LANES];
    let mut check = |x: E, q: u8, lane: usize| {
        let x: f64 = x.into();
        let error = (x - f64::from(q.cast_signed()) * scale).abs();
        beyond[lane] += u32::from(error.is_nan() || error > limit);
    };
    let (chunks, rest) = row.as_chunks::<LANES>();
    let (int8_chunks, int8_rest) = int8.as_chunks::<LANES>();
    for (chunk, bytes) in chunks.iter().zip(int8_chunks) {
        for lane in 0..LANES {
            check(chunk[lane], bytes[lane], lane);
        }
    }
    for (&x, &q) in rest.iter().zip(int8_rest) {
        check(x, q, 0);
    }
    beyond == [0; LANES]
}

/// [`row_within_half_a_scale`] in `f32`, for sources of at most 11 significant bits and a
/// scale stored as BF16 or F16: `x - q · scale` is then exact in `f32` (see
/// [`quantize_narrow_row`]), and the next value above half a scale that such an error can take
/// is further from it than the `f64` check's allowance, so both say the same.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn narrow_row_within_half_a_scale(row: &[f32], int8: &[u8], scale: f32) -> bool {
    let limit = 0.5 * scale + f32::MIN_POSITIVE;
    let mut beyond = 0u32;
    for (&x, &q) in row.iter().zip(int8) {
        let error = (x - f32::from(q.cast_signed()) * scale).abs();
        beyond += u32::from(error.is_nan()) + u32::from(error > limit);
    }
    beyond == 0
}

/// Where a written tensor's bytes come from: a source tensor copied, quantized, or its scales,
/// by index among the model's tensors.
#[derive(Clone, Copy)]
enum Source {
    Copy(u32),
    Weight(u32),
    Scale(u32),
}

/// The tensors of one output file, described from the model's own as the writer asks: no copy
/// of a name or a shape is made.
struct ShardSpecs<'a> {
    model: &'a Model,
    granularity: Granularity,
    sources: Vec<Source>,
}

impl ShardSpecs<'_> {
    fn tensor(&self, index: usize) -> &Tensor {
        let (Source::Copy(tensor) | Source::Weight(tensor) | Source::Scale(tensor)) =
            self.sources[index];
        &self.model.tensors[tensor as usize]
    }
}

impl Specs for ShardSpecs<'_> {
    fn count(&self) -> usize {
        self.sources.len()
    }

    fn name(&self, index: usize) -> Name<'_> {
        let name = self.tensor(index).name();
        match self.sources[index] {
            Source::Scale(_) => Name {
                stem: name,
                suffix: "_scale",
            },
            Source::Copy(_) | Source::Weight(_) => Name::new(name),
        }
    }

    fn dtype(&self, index: usize) -> Dtype {
        let tensor = self.tensor(index);
        match self.sources[index] {
            // The model is valid: every dtype is known.
            Source::Copy(_) => tensor.info.dtype.known().unwrap_or(Dtype::U8),
            Source::Weight(_) => Dtype::I8,
            Source::Scale(_) => scales_dtype_of(tensor),
        }
    }

    fn shape(&self, index: usize) -> Shape {
        let shape = &self.tensor(index).info.shape;
        match self.sources[index] {
            Source::Copy(_) | Source::Weight(_) => shape.clone(),
            Source::Scale(_) => scales_shape(shape, self.granularity),
        }
    }
}

/// Everything writing a shard needs.
struct ShardContext<'a> {
    model: &'a Model,
    files: &'a [File],
    choices: &'a [Choice],
    absmax: &'a Absmax,
    granularity: Granularity,
    /// The `quantization_config` metadata value.
    config: &'a str,
    control: &'a Control,
    before_read_back: &'a (dyn Fn(&Path) + Sync),
}

/// One output file written, or all of them.
struct Written {
    quantized: Vec<Quantized>,
    bytes: u64,
    verified: bool,
    /// The files written and read back, put in place once every one of them is: a save that
    /// stops part of the way leaves none of them, and an output it replaces as it was.
    staged: Vec<Staged>,
}

impl Written {
    /// The summary of a quantization that wrote these files.
    fn summary(
        self,
        model: &Model,
        output: Vec<PathBuf>,
        options: &Options,
        choices: Vec<Choice>,
    ) -> Summary {
        Summary {
            output,
            scheme: options.scheme,
            group_size: options.group_size,
            granularity: options.granularity,
            quantized: self.quantized,
            choices,
            bytes_before: model.file_bytes(),
            bytes_after: self.bytes,
            verified: self.verified,
        }
    }
}

impl Writer for ShardContext<'_> {
    fn write_index(&self, output: &Path) -> Result<usize> {
        write_index(self.model, output, self.choices, self.granularity)
    }

    fn write_shard(&self, shard: usize, target: &Path) -> Result<Written> {
        let ShardContext {
            model,
            files,
            choices,
            absmax,
            granularity,
            config,
            control,
            before_read_back,
        } = *self;
        // The model's tensors come in the order of their files.
        let first = model.tensors.partition_point(|t| t.shard < shard);
        let end = model.tensors.partition_point(|t| t.shard <= shard);
        let weights = choices[first..end]
            .iter()
            .filter(|&&choice| choice == Choice::Quantize)
            .count();
        // Sized exactly: doubling lists of millions would hold both copies at once.
        let mut sources = Vec::with_capacity(end - first + weights);
        for (index, choice) in choices.iter().enumerate().take(end).skip(first) {
            // `quantize` made sure that every index fits.
            let index32 = u32::try_from(index).unwrap_or(u32::MAX);
            if *choice == Choice::Quantize {
                sources.extend([Source::Weight(index32), Source::Scale(index32)]);
            } else {
                sources.push(Source::Copy(index32));
            }
        }
        let specs = ShardSpecs {
            model,
            granularity,
            sources,
        };
        let metadata = output_metadata(model.shards[shard].metadata.as_deref(), config);
        let layout = FileLayout::plan(&specs, Some(metadata))?;
        let mut quantized = Vec::with_capacity(weights);
        // The digest of each quantized tensor's and scales' bytes as made, by spec: sized
        // exactly.
        let mut digests: Vec<(usize, u64)> = Vec::with_capacity(2 * weights);
        let mut all_within = true;
        let file = AtomicFile::create(target)?;
        file.write(|out| {
            let placement = |spec| match specs.sources[spec] {
                Source::Copy(index) => Placement::Copied(index as usize),
                Source::Scale(_) | Source::Weight(_) => Placement::Streamed,
            };
            let (written, _) = write_copying_beside(
                &layout,
                out,
                (placement, Copies::Beside),
                (model, files, control),
                |spec, out| match specs.sources[spec] {
                    Source::Copy(_) => Ok(()),
                    Source::Scale(index) => {
                        let tensor = &model.tensors[index as usize];
                        let dtype = specs.dtype(spec);
                        let mut bytes = Vec::new();
                        match absmax.row_scales(model, index as usize) {
                            RowScales::Shared(scale) => encode_scale(dtype, scale, &mut bytes),
                            RowScales::Kept(scales) => {
                                for &scale in scales {
                                    encode_scale(dtype, scale, &mut bytes);
                                }
                            }
                            RowScales::Own(dtype) => {
                                let digest = by_element!(
                                    tensor,
                                    write_row_scales(model, files, tensor, dtype, out, control)
                                )?;
                                digests.push((spec, digest));
                                return Ok(());
                            }
                        }
                        digests.push((spec, Digest::of(&bytes)));
                        out.write_all(&bytes)
                    }
                    Source::Weight(index) => {
                        let index = index as usize;
                        let tensor = &model.tensors[index];
                        let scales = absmax.row_scales(model, index);
                        let made = write_weight(model, files, tensor, scales, out, control)?;
                        digests.push((spec, made.digest));
                        all_within &= made.within;
                        quantized.push(Quantized {
                            tensor: index,
                            error: made.error,
                        });
                        Ok(())
                    }
                },
            );
            written
        })
        .map_err(|e| Error::io(target, e))?;
        before_read_back(file.temporary_path());
        let differs = layout.differences(file.reopen()?, target)?.is_some();
        self.read_back(&layout, &file.reopen()?, target, &digests)?;
        let verified = !differs && all_within;
        Ok(Written {
            quantized,
            bytes: layout.file_len(),
            verified,
            staged: vec![file.stage()?],
        })
    }
}

impl ShardContext<'_> {
    /// Reads back each quantized tensor and its scales from the file written and compares their
    /// digests with those of the bytes made, `digests` by spec: the errors measured as they were
    /// made are then those of the file. Each is counted as the read of the source it replaces.
    fn read_back<'a>(
        &self,
        layout: &FileLayout<'a, ShardSpecs<'a>, impl Metadata<'a>>,
        written: &File,
        target: &Path,
        digests: &[(usize, u64)],
    ) -> Result<()> {
        use rayon::prelude::*;
        let specs = layout.specs();
        let ranges = layout.ranges_in_file();
        digests.par_iter().try_for_each(|&(spec, expected)| {
            let member = specs.name(spec);
            Digest::check_file(
                written,
                target,
                ranges[spec],
                expected,
                member,
                self.control,
            )?;
            if let Source::Weight(index) = specs.sources[spec] {
                self.control.bytes_done.fetch_add(
                    self.model.tensors[index as usize].info.byte_len(),
                    Ordering::Relaxed,
                );
            }
            Ok(())
        })
    }
}

/// What writing a tensor's int8 values made: the error they leave, whether every value is
/// within half a scale of its source, and the digest of the bytes.
struct Made {
    error: Error8,
    within: bool,
    digest: u64,
}

/// Writes a tensor's int8 values, measuring the error they leave and checking each value within
/// half a scale while its source rows are in hand (the file is then read back for its digest,
/// not checked against a third read of the source).
fn write_weight(
    model: &Model,
    files: &[File],
    tensor: &Tensor,
    scales: RowScales,
    out: &mut (impl Write + Send),
    control: &Control,
) -> io::Result<Made> {
    by_element!(
        tensor,
        write_weight_as(model, files, tensor, scales, out, control)
    )
}

fn write_weight_as<E: Element>(
    model: &Model,
    files: &[File],
    tensor: &Tensor,
    scales: RowScales,
    out: &mut (impl Write + Send),
    control: &Control,
) -> io::Result<Made> {
    let columns = row_length(tensor)?;
    let narrow = is_narrow(tensor);
    let loaded = Loaded::of(scales_dtype_of(tensor));
    let mut sums = ErrorSums::default();
    let mut within = true;
    let mut digest = Digest::default();
    map_rows(
        model,
        files,
        tensor,
        control,
        |first_row, values: &[E]| {
            let mut bytes = INT8_BUFFERS.take_filled(values.len());
            let mut chunk_sums = ErrorSums::default();
            let mut chunk_within = true;
            for (offset, (row, out)) in values
                .chunks(columns)
                .zip(bytes.chunks_mut(columns))
                .enumerate()
            {
                let scale = scales.of(first_row + offset, row);
                chunk_sums.merge(&E::quantize(row, scale, out, narrow, loaded));
                chunk_within &= E::within(row, out, scale, narrow);
            }
            Ok((bytes, chunk_sums, chunk_within))
        },
        |(bytes, chunk_sums, chunk_within)| {
            sums.merge(&chunk_sums);
            within &= chunk_within;
            digest.update(&bytes);
            out.write_all(&bytes)?;
            INT8_BUFFERS.give(bytes);
            Ok(())
        },
    )?;
    Ok(Made {
        error: sums.finish(),
        within,
        digest: digest.finish(),
    })
}

/// Quantizes one row with its scale into `out`, measuring the error left by the values as they
/// are `loaded`. The worst error in scales is worked out once for the row, from its worst error
/// on the grid.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn quantize_row<E: Element>(row: &[E], scale: f64, out: &mut [u8], loaded: Loaded) -> ErrorSums {
    if scale == 0.0 || !scale.is_finite() {
        // Every value becomes 0 (see `quantize_value`): its error is itself.
        out.fill(0);
        let (mut signal, mut max_abs) = (0.0, 0.0f64);
        for &x in row {
            let x: f64 = x.into();
            signal += x * x;
            max_abs = max_abs.max(x.abs());
        }
        return ErrorSums {
            signal,
            noise: signal,
            max_abs,
            max_in_scales: 0.0,
        };
    }
    // `quantize_value` with the scale's checks done once.
    quantize_lanes(row, scale, out, loaded)
}

/// Quantizes `row` with a finite nonzero `scale`, in `f64`, in array-valued steps (rather than
/// updates of one lane at a time), which are what the compiler turns into SIMD in the function
/// that calls this. The code sits in the low bits of `ROUNDER` plus it, above an even offset
/// (`2^51`), so the sum's lowest byte is the code's two's complement byte.
#[expect(
    clippy::inline_always,
    reason = "inlined into its caller, whose copies for AVX2 and AVX-512 it must share"
)]
#[inline(always)]
fn quantize_lanes<E: Element>(row: &[E], scale: f64, out: &mut [u8], loaded: Loaded) -> ErrorSums {
    let shifted = |x: f64| (x / scale).clamp(-127.0, 127.0) + ROUNDER;
    let back = |shifted: f64| (shifted - ROUNDER) * scale;
    let low_byte = |shifted: f64| shifted.to_bits().to_le_bytes()[0];
    let (mut signal, mut noise) = ([0f64; LANES], [0f64; LANES]);
    let (mut max_abs, mut max_on_grid) = ([0f64; LANES], [0f64; LANES]);
    let larger = lanes::larger::<f64>;
    let (chunks, rest) = row.as_chunks::<LANES>();
    let (out_chunks, out_rest) = out.as_chunks_mut::<LANES>();
    for (xs, bytes) in chunks.iter().zip(out_chunks) {
        let xs: [f64; LANES] = std::array::from_fn(|i| xs[i].into());
        let shifted: [f64; LANES] = std::array::from_fn(|i| shifted(xs[i]));
        let backs: [f64; LANES] = std::array::from_fn(|i| back(shifted[i]));
        let on_grid: [f64; LANES] = std::array::from_fn(|i| (xs[i] - backs[i]).abs());
        let errors = loaded_errors(&xs, &backs, loaded);
        *bytes = std::array::from_fn(|i| low_byte(shifted[i]));
        signal = std::array::from_fn(|i| signal[i] + xs[i] * xs[i]);
        noise = std::array::from_fn(|i| noise[i] + errors[i] * errors[i]);
        max_abs = std::array::from_fn(|i| larger(errors[i], max_abs[i]));
        max_on_grid = std::array::from_fn(|i| larger(on_grid[i], max_on_grid[i]));
    }
    for (&x, out) in rest.iter().zip(out_rest) {
        let x: f64 = x.into();
        let shifted = shifted(x);
        let back = back(shifted);
        let error = (x - loaded.round_wide(back)).abs();
        *out = low_byte(shifted);
        signal[0] += x * x;
        noise[0] += error * error;
        max_abs[0] = larger(error, max_abs[0]);
        max_on_grid[0] = larger((x - back).abs(), max_on_grid[0]);
    }
    let largest = |lanes: [f64; LANES]| lanes.into_iter().fold(0.0, f64::max);
    ErrorSums {
        signal: signal.iter().sum(),
        noise: noise.iter().sum(),
        max_abs: largest(max_abs),
        max_in_scales: largest(max_on_grid) / scale,
    }
}

/// The errors of values `xs` that come back as `backs` on the grid (exactly, in `f64`), as
/// they are `loaded`: a loop for each type, so that each vectorizes.
#[expect(
    clippy::inline_always,
    reason = "inlined into its caller, whose copies for AVX2 and AVX-512 it must share"
)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "rounding to the loader's type is the point"
)]
#[inline(always)]
fn loaded_errors(xs: &[f64; LANES], backs: &[f64; LANES], loaded: Loaded) -> [f64; LANES] {
    match loaded {
        Loaded::F64 => std::array::from_fn(|i| (xs[i] - backs[i]).abs()),
        Loaded::F32 => std::array::from_fn(|i| (xs[i] - f64::from(backs[i] as f32)).abs()),
        Loaded::Half(_) => std::array::from_fn(|i| (xs[i] - loaded.round_wide(backs[i])).abs()),
    }
}

/// [`quantize_row`] in `f32`, for sources of at most 11 significant bits (BF16, F16 and the F8,
/// F6 and F4 types) whose scale is stored as BF16 or F16. It gives the same bytes: `x / scale`
/// is then at least 2^-12 away from any half-integer it is not equal to, far more than `f32`'s
/// rounding error below 128, so the correctly rounded quotient rounds to the same integer, and
/// `x - q * scale` is exact in `f32`.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn quantize_narrow_row(row: &[f32], scale: f32, out: &mut [u8], loaded: Loaded) -> ErrorSums {
    use lanes::{Tally, WIDE};
    if !lanes::measured_in_f32(scale) {
        return quantize_row(row, f64::from(scale), out, loaded);
    }
    // The squares summed in `f32` a part of the row at a time, [`WIDE`] lanes side by side
    // (see `Tally`): in `f64` the lanes were half as many, and the sums most of the work.
    let mut tally = Tally::new(loaded);
    lanes::for_loaded!(loaded, ROUNDING => {
        let (chunks, rest) = row.as_chunks::<WIDE>();
        let (out_chunks, out_rest) = out.as_chunks_mut::<WIDE>();
        for (xs, bytes) in chunks.iter().zip(out_chunks) {
            quantize_narrow_lanes::<ROUNDING>(xs, scale, bytes, &mut tally);
        }
        if !rest.is_empty() {
            let (mut xs, mut bytes) = ([0f32; WIDE], [0u8; WIDE]);
            xs[..rest.len()].copy_from_slice(rest);
            quantize_narrow_lanes::<ROUNDING>(&xs, scale, &mut bytes, &mut tally);
            out_rest.copy_from_slice(&bytes[..rest.len()]);
        }
    });
    let sums = tally.finish();
    ErrorSums {
        signal: sums.signal,
        noise: sums.noise,
        max_abs: sums.max_abs,
        max_in_scales: sums.max_in_steps,
    }
}

/// [`lanes::WIDE`] values of [`quantize_narrow_row`] (padding of zeros codes as 0, without
/// error).
#[expect(
    clippy::inline_always,
    reason = "inlined into its caller, whose copies for AVX2 and AVX-512 it must share"
)]
#[inline(always)]
fn quantize_narrow_lanes<const ROUNDING: lanes::Rounding>(
    xs: &[f32; lanes::WIDE],
    scale: f32,
    bytes: &mut [u8; lanes::WIDE],
    tally: &mut lanes::Tally,
) {
    let mut backs = [0f32; lanes::WIDE];
    for lane in 0..lanes::WIDE {
        let q = lanes::round_even(lanes::clamp(xs[lane] / scale, -127.0, 127.0));
        // A negative code's low byte is its two's complement.
        bytes[lane] = lanes::byte_of(q);
        backs[lane] = q * scale;
    }
    tally.add::<ROUNDING>(xs, &backs, &[1.0 / scale; lanes::WIDE]);
}

/// What quantizing one tensor to W8A8 would cost, the error its writer would measure, worked out
/// without codes as a comparison does: `None` when it holds NaN or Inf.
pub fn preview(model: &Model, tensor: usize, granularity: Granularity) -> Result<Option<Error8>> {
    let files: Vec<File> = model
        .shards
        .iter()
        .map(|s| open_file(&s.path).map_err(|e| Error::io(&s.path, e)))
        .collect::<Result<_>>()?;
    let options = Options {
        scheme: Scheme::W8A8,
        granularity,
        ..Options::default()
    };
    let (errors, _) = compare::evaluate(
        model,
        &files,
        &[tensor],
        &[Scheme::W8A8],
        &options,
        &Control::default(),
    )?;
    Ok(errors
        .first()
        .and_then(|schemes| schemes.first().copied().flatten())
        .map(|sums| finish(&sums)))
}

/// The default output next to the source, named after the scheme: `<stem>.int8.safetensors`
/// for W8A8 (`<stem>.w4a16.safetensors` for W4A16...) for a file, `<folder>-int8` beside a
/// sharded model's folder; in the current folder for a model in a Hugging Face cache
/// (`<repository name>-int8`).
pub fn default_output(model: &Model, scheme: Scheme) -> PathBuf {
    let suffix = if scheme == Scheme::W8A8 {
        "int8".to_owned()
    } else {
        scheme.name().to_ascii_lowercase()
    };
    let first = &model.shards[0].path;
    let beside = if model.shards.len() > 1 || model.source != crate::format::model::Source::File {
        let folder = first.parent().unwrap_or(Path::new("."));
        let name = hf_cache::cached_repo_name(first).unwrap_or_else(|| {
            folder
                .file_name()
                .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned())
        });
        folder.with_file_name(format!("{name}-{suffix}"))
    } else {
        let stem = first
            .file_stem()
            .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
        first.with_file_name(format!("{stem}.{suffix}.safetensors"))
    };
    // Nothing is written into the Hugging Face cache: a model read from it is saved in the
    // current folder.
    match (
        hf_cache::cache_holding(&beside, &ProcessEnvironment),
        beside.file_name(),
    ) {
        (Some(_), Some(name)) => std::env::current_dir().unwrap_or_default().join(name),
        _ => beside,
    }
}

/// Adding and taking away 1.5 * 2^52 rounds half to even (the FPU's default mode) any value
/// as small as a quotient clamped to the int8 range, without a call to `rint` on CPUs without
/// SSE4.1.
const ROUNDER: f64 = 6_755_399_441_055_744.0;

/// `round_half_even(x / scale)` clamped to `[-127, 127]`, as a whole `f64`, for a finite nonzero
/// `scale`.
fn rounded_quotient(x: f64, scale: f64) -> f64 {
    ((x / scale).clamp(-127.0, 127.0) + ROUNDER) - ROUNDER
}

/// `round_half_even(x / scale)` clamped to `[-127, 127]`; 0 when the scale is 0.
pub fn quantize_value(x: f64, scale: f64) -> i8 {
    if scale == 0.0 || !scale.is_finite() {
        return 0;
    }
    let rounded = rounded_quotient(x, scale);
    #[expect(
        clippy::cast_possible_truncation,
        reason = "a whole number in the int8 range"
    )]
    let q = rounded as i8;
    q
}

/// The source's metadata, with `format: pt` when it says no format, and the quantization
/// recorded (in place of any the source records).
fn output_metadata<'a>(source: Option<&'a StringMap>, config: &'a str) -> impl Metadata<'a> {
    let says_format = source.is_some_and(|metadata| metadata.contains_key("format"));
    (!says_format)
        .then_some(("format", "pt"))
        .into_iter()
        .chain(
            source
                .into_iter()
                .flat_map(StringMap::iter)
                .filter(|&(key, _)| key != "quantization_config"),
        )
        .chain([("quantization_config", config)])
}

/// The compressed-tensors `quantization_config`; `ignore` names the modules left as they were.
pub fn quantization_config(options: &Options, ignore: &[&str]) -> serde_json::Value {
    if options.scheme != Scheme::W8A8 {
        return scheme::config(options.scheme, options.group_size, ignore);
    }
    serde_json::json!({
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 8, "type": "int", "symmetric": true,
                    "strategy": options.granularity.strategy(), "dynamic": false
                },
                "input_activations": {
                    "num_bits": 8, "type": "int", "symmetric": true,
                    "strategy": "token", "dynamic": true
                }
            }
        },
        "ignore": ignore,
    })
}

/// The modules whose weights stay as they were, for the config's `ignore` list.
fn ignored_modules<'a>(model: &'a Model, choices: &[Choice]) -> Vec<&'a str> {
    model
        .tensors
        .iter()
        .zip(choices)
        .filter_map(|(t, c)| match c {
            Choice::Keep(_) => t.name().strip_suffix(".weight"),
            Choice::Quantize => None,
        })
        .collect()
}

/// Writes the output's index, each name (a scale's beside its weight's) in name order, streamed;
/// gives the number of entries.
fn write_index(
    model: &Model,
    output: &Path,
    choices: &[Choice],
    granularity: Granularity,
) -> Result<usize> {
    let mut total_size = 0u64;
    for (index, tensor) in model.tensors.iter().enumerate() {
        if choices[index] == Choice::Quantize {
            let count = tensor.info.element_count().unwrap_or(0);
            let scales: u64 = scales_shape(&tensor.info.shape, granularity)
                .iter()
                .product();
            total_size += count + scales * u64::from(scales_dtype_of(tensor).bits() / 8);
        } else {
            total_size += tensor.info.byte_len();
        }
    }
    // Entries as a tensor's index and whether it is its scale's (`quantize` made sure that every
    // index fits).
    let mut entries: Vec<(u32, bool)> = Vec::new();
    for (index, choice) in choices.iter().enumerate() {
        let index = u32::try_from(index).unwrap_or(u32::MAX);
        entries.push((index, false));
        if *choice == Choice::Quantize {
            entries.push((index, true));
        }
    }
    let name = |(index, scale): (u32, bool)| Name {
        stem: model.tensors[index as usize].name(),
        suffix: if scale { "_scale" } else { "" },
    };
    entries.sort_unstable_by(|&a, &b| name(a).cmp(&name(b)));
    write_index_entries(output, total_size, &entries, &name, &|(index, _)| {
        model.shards[model.tensors[index as usize].shard]
            .label
            .as_str()
    })?;
    Ok(entries.len())
}

/// Writes the output's index from `entries` in name order, each named by `name` and placed in
/// the file `label` says.
fn write_index_entries<'a, T: Copy>(
    output: &Path,
    total_size: u64,
    entries: &'a [T],
    name: &'a dyn Fn(T) -> Name<'a>,
    label: &'a dyn Fn(T) -> &'a str,
) -> Result<()> {
    let index = IndexJson {
        metadata: IndexMetadata { total_size },
        weight_map: WeightMap {
            entries,
            name,
            label,
        },
    };
    let path = output.join(crate::format::index::INDEX_FILE_NAME);
    write_atomically(&path, |out| {
        serde_json::to_writer_pretty(out, &index).map_err(io::Error::from)
    })?;
    Ok(())
}

#[derive(Serialize)]
#[serde(bound = "")]
struct IndexJson<'a, T: Copy> {
    metadata: IndexMetadata,
    weight_map: WeightMap<'a, T>,
}

#[derive(Serialize)]
struct IndexMetadata {
    total_size: u64,
}

/// An index's `weight_map`, written from the model's names as it is serialized.
struct WeightMap<'a, T> {
    entries: &'a [T],
    name: &'a dyn Fn(T) -> Name<'a>,
    label: &'a dyn Fn(T) -> &'a str,
}

impl<T: Copy> Serialize for WeightMap<'_, T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(
            self.entries
                .iter()
                .map(|&entry| ((self.name)(entry), (self.label)(entry))),
        )
    }
}

/// Whether the index written in `output` reads back clean, with `entries` entries, each naming
/// one of the files written.
fn index_reads_back(model: &Model, output: &Path, entries: usize) -> Result<bool> {
    let path = output.join(crate::format::index::INDEX_FILE_NAME);
    let file = open_file(&path).map_err(|e| Error::io(&path, e))?;
    let index = crate::format::index::ShardIndex::read(io::BufReader::new(file));
    Ok(index.findings.is_empty()
        && index.weight_map.len() == entries
        && index
            .weight_map
            .values()
            .all(|label| model.shards.iter().any(|shard| shard.label == label)))
}

/// Copies `config.json` (with the quantization added) and the small files beside the model into
/// the output folder, when that is not the model's own folder and the model's is a model's folder
/// ([`is_model_folder`]).
fn copy_companions(model: &Model, output: &Path, ignore: &[&str], options: &Options) -> Result<()> {
    let Some(source) = model.shards.first().and_then(|s| s.path.parent()) else {
        return Ok(());
    };
    let output = if output.as_os_str().is_empty() {
        Path::new(".")
    } else {
        output
    };
    let source = if source.as_os_str().is_empty() {
        Path::new(".")
    } else {
        source
    };
    if canonical(source) == canonical(output) || !is_model_folder(source) {
        return Ok(());
    }
    let entries = std::fs::read_dir(source).map_err(|e| Error::io(source, e))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        let small = entry
            .metadata()
            .is_ok_and(|m| m.is_file() && m.len() < 64 << 20);
        // Indexes name shards the output does not hold, variants' too
        // (`diffusion_pytorch_model.safetensors.index.fp16.json`).
        let index = name.ends_with(".index.json")
            || (name.contains(".safetensors.index.")
                && path.extension().is_some_and(|e| e == "json"));
        if !small || name.ends_with(".safetensors") || index || name.starts_with('.') {
            continue;
        }
        let target = output.join(&name);
        if name == "config.json" {
            let text = open_file(&path)
                .and_then(io::read_to_string)
                .map_err(|e| Error::io(&path, e))?;
            let mut config: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
                Error::Invalid(format!("{}: {e}", escape(&path.display().to_string())))
            })?;
            if let Some(object) = config.as_object_mut() {
                object.insert(
                    "quantization_config".into(),
                    quantization_config(options, ignore),
                );
            }
            let text =
                serde_json::to_string_pretty(&config).map_err(|e| Error::Invalid(e.to_string()))?;
            write_atomically(&target, |out| out.write_all(text.as_bytes()))?;
        } else {
            let mut file = open_file(&path).map_err(|e| Error::io(&path, e))?;
            write_atomically(&target, |out| io::copy(&mut file, out).map(drop))?;
        }
    }
    Ok(())
}

/// Whether `folder` holds a model's own files: a `config.json` (or a PEFT adapter's
/// `adapter_config.json`) beside the weights. A single file in a folder shared with other things
/// (a downloads folder) has no companions: the small files there are not the model's.
fn is_model_folder(folder: &Path) -> bool {
    ["config.json", "adapter_config.json"]
        .iter()
        .any(|name| folder.join(name).is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a save runs on each file it wrote before reading it back.
    pub(super) type ReadBackHook<'a> = dyn Fn(&Path) + Sync + 'a;

    /// A model of two shards, `a.weight` in the first and `b.weight` in the second, with its
    /// index, in `folder`.
    pub(super) fn two_shards(folder: &Path) -> Model {
        use crate::demo::{Fill, SyntheticModel};
        std::fs::create_dir_all(folder).unwrap();
        let mut map = serde_json::Map::new();
        for (seed, name) in [(1, "a.weight"), (2, "b.weight")] {
            let file = format!("model-0000{seed}-of-00002.safetensors");
            SyntheticModel::new(seed)
                .tensor(
                    name,
                    Dtype::Bf16,
                    &[64, 256],
                    Fill::Normal {
                        mean: 0.0,
                        std: 1.0,
                    },
                )
                .write(&folder.join(&file))
                .unwrap();
            map.insert(name.into(), file.into());
        }
        let index = serde_json::json!({ "metadata": {}, "weight_map": map });
        std::fs::write(
            folder.join("model.safetensors.index.json"),
            index.to_string(),
        )
        .unwrap();
        Model::open(folder).unwrap()
    }

    /// Every file in `folder`, with its bytes, in name order; empty when there is no folder.
    pub(super) fn files_in(folder: &Path) -> Vec<(String, Vec<u8>)> {
        let Ok(entries) = std::fs::read_dir(folder) else {
            return Vec::new();
        };
        let mut files: Vec<(String, Vec<u8>)> = entries
            .map(|entry| {
                let entry = entry.unwrap();
                let name = entry.file_name().to_string_lossy().into_owned();
                (name, std::fs::read(entry.path()).unwrap())
            })
            .collect();
        files.sort();
        files
    }

    /// A sharded save that fails in its second file (`member` of `b.weight` read back differs)
    /// puts none of its files in place, through `save(output, hook)`: a new output and its
    /// folder are not made, and an output it replaces stays as it was.
    pub(super) fn a_failed_sharded_save_leaves_nothing_in_place(
        member: &str,
        save: &dyn Fn(&Path, &ReadBackHook<'_>) -> Result<Summary>,
    ) {
        use std::sync::atomic::AtomicUsize;
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("out");
        let fail_in_the_second = || {
            let calls = AtomicUsize::new(0);
            move |path: &Path| {
                if calls.fetch_add(1, Ordering::Relaxed) == 1 {
                    flip_a_byte_of(path, member);
                }
            }
        };
        let error = save(&output, &fail_in_the_second())
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(&format!("`{member}` read back differs")),
            "{error}"
        );
        assert!(!output.exists(), "{:?}", files_in(&output));
        assert!(save(&output, &|_| {}).unwrap().verified);
        let before = files_in(&output);
        assert_eq!(before.len(), 3, "two shards and the index");
        assert!(save(&output, &fail_in_the_second()).is_err());
        assert_eq!(files_in(&output), before);
    }

    #[test]
    fn a_failed_sharded_w8a8_save_leaves_nothing_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let model = two_shards(&dir.path().join("model"));
        a_failed_sharded_save_leaves_nothing_in_place("b.weight", &|output, hook| {
            quantize_keeping(
                &model,
                output,
                &Options::default(),
                &Control::default(),
                KEPT_SCALES,
                hook,
            )
        });
    }

    /// Flips the bits of one byte in the middle of `tensor`'s data in the file at `path`.
    pub(super) fn flip_a_byte_of(path: &Path, tensor: &str) {
        let written = Model::open(path).unwrap();
        let tensor = written.tensors.iter().find(|t| t.name() == tensor).unwrap();
        let (start, len) = written.file_range(tensor);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        let at = start + len / 2;
        let mut byte = [0u8];
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(at)).unwrap();
        std::io::Read::read_exact(&mut file, &mut byte).unwrap();
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(at)).unwrap();
        file.write_all(&[!byte[0]]).unwrap();
    }

    /// Cuts the file at `path` to its first `len` bytes.
    pub(super) fn cut_file(path: &Path, len: u64) {
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(len)
            .unwrap();
    }

    proptest::proptest! {
        #[test]
        fn a_bf16_scale_is_rounded_up_from_its_bits_as_from_storing_it(
            mantissa in 1u64..(1 << 52),
            exponent in -140i32..130,
            shift in proptest::sample::select(&[0u64, 1, 0x7FFF, 0x8000, 0x8001][..]),
        ) {
            let near_grid = f64::from(f32::from_bits(
                (u32::try_from(mantissa >> 29).unwrap() & 0x7F_0000) | 0x3F80_0000,
            ));
            #[expect(clippy::cast_precision_loss, reason = "a test pattern")]
            for value in [
                (1.0 + mantissa as f64 / (1u64 << 52) as f64) * 2f64.powi(exponent),
                near_grid * 2f64.powi(exponent) + f64::from(f32::from_bits(u32::try_from(shift).unwrap())),
                near_grid * 2f64.powi(exponent),
                (near_grid * 2f64.powi(exponent)).next_up(),
                (near_grid * 2f64.powi(exponent)).next_down(),
            ] {
                let stored = stored(Dtype::Bf16, value);
                let expected = if stored >= value || !stored.is_finite() {
                    stored
                } else {
                    next_stored_up(Dtype::Bf16, stored)
                };
                let got = stored_at_least(Dtype::Bf16, value);
                proptest::prop_assert_eq!(got.to_bits(), expected.to_bits(), "{}", value);
            }
        }
    }

    #[test]
    fn a_row_is_quantized_as_value_by_value() {
        let row: Vec<f64> = (-300..300)
            .map(|i| f64::from(i) * 0.25)
            .chain([1e300, -1e300, 0.0, -0.0])
            .collect();
        for scale in [0.5, 1.0, 0.1, 0.0, f64::INFINITY] {
            let mut out = vec![0u8; row.len()];
            let sums = quantize_row(&row, scale, &mut out, Loaded::F64);
            let mut noise = 0.0;
            for (&x, &byte) in row.iter().zip(&out) {
                let q = quantize_value(x, scale);
                assert_eq!(byte.cast_signed(), q, "{x} / {scale}");
                let dequantized = if scale.is_finite() {
                    f64::from(q) * scale
                } else {
                    0.0
                };
                noise += (x - dequantized).powi(2);
            }
            assert_eq!(sums.noise, noise, "scale {scale}");
        }
    }

    #[test]
    fn narrow_rows_are_quantized_as_value_by_value() {
        // Every BF16 value in [1, 4) and every F16 value in [0.5, 2), with their negatives and
        // the ties they make, against scales as stored for rows of those values.
        let bf16: Vec<f32> = (0x3f80u16..0x4080)
            .map(|bits| half::bf16::from_bits(bits).to_f32())
            .flat_map(|x| [x, -x])
            .collect();
        let f16: Vec<f32> = (0x3800u16..0x4000)
            .map(|bits| half::f16::from_bits(bits).to_f32())
            .flat_map(|x| [x, -x])
            .collect();
        for (dtype, row) in [(Dtype::Bf16, bf16), (Dtype::F16, f16)] {
            for absmax in [4.0, 2.0, 3.3, 127.0, 1.0, 0.26] {
                let scale = scale_for(dtype, absmax);
                let mut fast = vec![0u8; row.len()];
                #[expect(clippy::cast_possible_truncation, reason = "stored as BF16 or F16")]
                let sums = quantize_narrow_row(&row, scale as f32, &mut fast, Loaded::of(dtype));
                let mut wide = vec![0u8; row.len()];
                let expected = quantize_row(&row, scale, &mut wide, Loaded::of(dtype));
                assert_eq!(fast, wide, "{dtype} scale {scale}");
                // The errors of the values as loaded: each product rounded to the scale's type.
                let (mut noise, mut largest) = (0f64, 0f64);
                for (&x, &byte) in row.iter().zip(&fast) {
                    let q = quantize_value(f64::from(x), scale);
                    assert_eq!(byte.cast_signed(), q);
                    let exact = f64::from(q) * scale;
                    let loaded = if dtype == Dtype::Bf16 {
                        half::bf16::from_f64(exact).to_f64()
                    } else {
                        half::f16::from_f64(exact).to_f64()
                    };
                    noise += (f64::from(x) - loaded).powi(2);
                    largest = largest.max((f64::from(x) - loaded).abs());
                }
                assert_eq!(expected.max_abs, largest, "{dtype} scale {scale}");
                assert!(
                    (expected.noise - noise).abs() <= 1e-12 * noise,
                    "{dtype} {scale}"
                );
                assert_eq!(sums.max_abs, expected.max_abs);
                // The same errors, their squares summed in `f32` a part at a time.
                for (narrow, wide) in [(sums.noise, expected.noise), (sums.signal, expected.signal)]
                {
                    assert!(
                        (narrow - wide).abs() <= 2f64.powi(-16) * wide,
                        "{narrow} {wide}"
                    );
                }
                // The check of the written rows says the same in `f32`, on the bytes as made (of
                // rows clipped when the scale is below their largest value) and with a byte in
                // turn one step off.
                #[expect(clippy::cast_possible_truncation, reason = "stored as BF16 or F16")]
                let scale32 = scale as f32;
                assert_eq!(
                    narrow_row_within_half_a_scale(&row, &fast, scale32),
                    row_within_half_a_scale(&row, &fast, scale),
                    "{dtype} scale {scale}"
                );
                for at in (0..row.len()).step_by(97) {
                    let mut off = fast.clone();
                    off[at] = off[at].wrapping_add(1);
                    assert_eq!(
                        narrow_row_within_half_a_scale(&row, &off, scale32),
                        row_within_half_a_scale(&row, &off, scale),
                        "{dtype} scale {scale} at {at}"
                    );
                }
            }
        }
    }

    #[test]
    fn rounds_half_to_even_and_clamps() {
        assert_eq!(quantize_value(2.5, 1.0), 2);
        assert_eq!(quantize_value(3.5, 1.0), 4);
        assert_eq!(quantize_value(-2.5, 1.0), -2);
        assert_eq!(quantize_value(1000.0, 1.0), 127);
        assert_eq!(quantize_value(-1000.0, 1.0), -127);
        assert_eq!(quantize_value(5.0, 0.0), 0);
    }

    #[test]
    fn scales_never_round_below_absmax_over_127() {
        for dtype in [Dtype::F64, Dtype::F32, Dtype::Bf16, Dtype::F16] {
            for absmax in [2.8e-44, 1e-300, 1e-9, 3.0e-5, 0.0137, 1.0, 300.0] {
                let scale = scale_for(dtype, absmax);
                assert!(scale * 127.5 >= absmax, "{dtype} {absmax}: {scale}");
                assert_eq!(
                    scale,
                    stored(dtype, scale),
                    "{dtype} {absmax}: representable"
                );
                assert!(
                    scale <= absmax / 127.0 * 1.01 || absmax < 1e-4,
                    "{dtype} {absmax}"
                );
            }
            assert_eq!(scale_for(dtype, 0.0), 0.0);
        }
    }

    /// An F16 row reaching F16's largest value gets a scale whose grid stays within F16, so that
    /// an F16 loader reads no ±Inf, with every value still within half a scale.
    #[test]
    fn f16_scales_keep_the_grid_within_f16() {
        for absmax in [65504.0, 65472.0, 65440.0, 60000.0] {
            let scale = scale_for(Dtype::F16, absmax);
            let largest = half::f16::from_f64(127.0 * scale);
            assert!(largest.is_finite(), "{absmax}: {scale}");
            assert!(scale * 127.5 >= absmax, "{absmax}: {scale}");
            assert_eq!(scale, stored(Dtype::F16, scale));
        }
        assert_eq!(scale_for(Dtype::F16, 65504.0), 515.5);
        // Far below the top of its range, a BF16 scale is as it was.
        assert_eq!(
            scale_for(Dtype::Bf16, 65504.0),
            stored(Dtype::Bf16, 65504.0 / 127.0)
        );
    }

    /// Every largest magnitude in the top binade of BF16 (and the top of F16 and F32): the int8
    /// grid and the FP8 grid stay finite in the dtype, and the largest magnitude lands within
    /// half a step of the largest code (127 steps of the scale, or E4M3's 448 with its spacing
    /// of 32 there).
    #[test]
    fn scales_keep_the_grid_finite_at_the_top_of_every_range() {
        let bfloat16 = (0x7F00_u16..0x7F80).map(|bits| half::bf16::from_bits(bits).to_f64());
        let binary16 = (0x7800_u16..0x7C00).map(|bits| half::f16::from_bits(bits).to_f64());
        let binary32 = (0..4096_u32).map(|i| f64::from(f32::from_bits(0x7F7F_FFFF - i * 997)));
        let cases = bfloat16
            .map(|v| (Dtype::Bf16, v))
            .chain(binary16.map(|v| (Dtype::F16, v)))
            .chain(binary32.map(|v| (Dtype::F32, v)));
        for (dtype, absmax) in cases {
            let scale = scale_for(dtype, absmax);
            assert!(stored(dtype, 127.0 * scale).is_finite(), "{dtype} {absmax}");
            assert!(scale * 127.5 >= absmax, "{dtype} {absmax}: {scale}");
            let fp8 = f64::from(fp8::MAX);
            let scale = loadable(dtype, stored_at_least(dtype, absmax / fp8), fp8);
            assert!(stored(dtype, fp8 * scale).is_finite(), "{dtype} {absmax}");
            assert!(
                absmax - fp8 * scale <= 16.0 * scale,
                "{dtype} {absmax}: {scale}"
            );
        }
    }

    /// Scales kept from the first pass and scales worked out again from the rows give the same
    /// file, per channel and per tensor.
    #[test]
    fn kept_and_recomputed_scales_write_the_same_file() {
        use crate::demo::{Fill, SyntheticModel};
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("model.safetensors");
        let normal = Fill::Normal {
            mean: 0.0,
            std: 1.0,
        };
        SyntheticModel::new(3)
            .tensor("a.weight", Dtype::Bf16, &[300, 7], normal.clone())
            .tensor("b.weight", Dtype::F32, &[5, 3], normal.clone())
            .tensor("c.weight", Dtype::F64, &[70_000, 2], normal)
            .write(&source)
            .unwrap();
        let model = Model::open(&source).unwrap();
        for granularity in [Granularity::PerChannel, Granularity::PerTensor] {
            let options = Options {
                granularity,
                ..Options::default()
            };
            // The model holds c (F64, 70,000 rows), b (5), then a (300): none kept, the first two, all.
            let files: Vec<Vec<u8>> = [0, 70_005, KEPT_SCALES]
                .into_iter()
                .map(|kept| {
                    let output = dir.path().join(format!("out-{kept}.safetensors"));
                    let summary = quantize_keeping(
                        &model,
                        &output,
                        &options,
                        &Control::default(),
                        kept,
                        &|_| {},
                    )
                    .unwrap();
                    assert!(summary.verified);
                    assert_eq!(summary.quantized.len(), 3);
                    std::fs::read(&output).unwrap()
                })
                .collect();
            assert!(
                files[0] == files[1] && files[1] == files[2],
                "{granularity:?}"
            );
        }
    }

    /// A byte of a quantized tensor or of its scales changed between the write and the read-back
    /// is found (the digests of the bytes made and of the file differ) and named; scales kept
    /// from the first pass, worked out again, or shared alike.
    #[test]
    fn an_int8_file_altered_before_its_read_back_is_reported() {
        use crate::demo::{Fill, SyntheticModel};
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("model.safetensors");
        let normal = Fill::Normal {
            mean: 0.0,
            std: 1.0,
        };
        SyntheticModel::new(7)
            .tensor("a.weight", Dtype::Bf16, &[64, 256], normal.clone())
            .tensor("b.weight", Dtype::F32, &[32, 128], normal)
            .write(&source)
            .unwrap();
        let model = Model::open(&source).unwrap();
        let output = dir.path().join("out.safetensors");
        for (granularity, kept, altered) in [
            (Granularity::PerChannel, KEPT_SCALES, "a.weight"),
            (Granularity::PerChannel, KEPT_SCALES, "b.weight_scale"),
            (Granularity::PerChannel, 0, "a.weight_scale"),
            (Granularity::PerTensor, KEPT_SCALES, "b.weight"),
        ] {
            let options = Options {
                granularity,
                ..Options::default()
            };
            let run = |hook: &(dyn Fn(&Path) + Sync)| {
                quantize_keeping(&model, &output, &options, &Control::default(), kept, hook)
            };
            assert!(run(&|_| {}).unwrap().verified);
            let error = run(&|path| flip_a_byte_of(path, altered))
                .unwrap_err()
                .to_string();
            assert!(
                error.contains(&format!("`{altered}` read back differs")),
                "{granularity:?} {kept}: {error}"
            );
        }
    }

    /// The pass shared out across tensors finds each tensor's largest magnitude, or its NaN or
    /// Inf, as the pass over that tensor alone does: tensors of several runs, of one, of a dtype
    /// read as values, and non-finite values in a tensor's first and last runs.
    #[test]
    fn largest_magnitudes_match_each_tensor_alone() {
        use crate::demo::{Fill, SyntheticModel};
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("model.safetensors");
        let normal = Fill::Normal {
            mean: 0.0,
            std: 1.0,
        };
        // 3 MiB of BF16 and 9 MiB of F32: one and three runs.
        SyntheticModel::new(5)
            .tensor("a.weight", Dtype::Bf16, &[1024, 1536], normal.clone())
            .tensor("b.weight", Dtype::F32, &[2048, 1152], normal.clone())
            .tensor("c.weight", Dtype::F32, &[2048, 1152], normal.clone())
            .tensor("d.weight", Dtype::F16, &[64, 96], normal.clone())
            .tensor("e.weight", Dtype::F64, &[300, 7], normal.clone())
            .tensor("f.weight", Dtype::Bf16, &[16, 16], Fill::Zeros)
            .plant("b.weight", -1, f64::NAN)
            .plant("c.weight", 0, f64::NEG_INFINITY)
            .plant("a.weight", 1_000_000, -8192.0)
            .write(&source)
            .unwrap();
        let model = Model::open(&source).unwrap();
        let files = vec![open_file(&source).unwrap()];
        let control = Control::default();
        let all: Vec<usize> = (0..model.tensors.len()).collect();
        let found = largest_magnitudes(&model, &files, &all, &control).unwrap();
        for (tensor, found) in model.tensors.iter().zip(found) {
            let alone = tensor_absmax(&model, &files, tensor, false, &control)
                .unwrap()
                .map(|(largest, _)| largest);
            assert_eq!(found, alone, "{}", tensor.name());
        }
        let by_name = |name: &str| model.tensors.iter().position(|t| t.name() == name).unwrap();
        let picked = [
            by_name("b.weight"),
            by_name("a.weight"),
            by_name("f.weight"),
        ];
        let found = largest_magnitudes(&model, &files, &picked, &control).unwrap();
        assert_eq!(found, [None, Some(8192.0), Some(0.0)]);
    }

    /// A matrix is read in runs of about [`ROWS_RUN`] bytes, each a multiple of the alignment
    /// but for the last, covering every row once; one of a run or a few is cut into
    /// [`SHARED_RUNS`] runs where its rows allow, one smaller than a run is read whole.
    #[test]
    fn runs_cover_the_rows_and_share_a_small_matrix_out() {
        for (shape, dtype, align) in [
            ([5632, 2048], Dtype::Bf16, 1),
            ([256, 2048], Dtype::Bf16, 1),
            ([384, 4096], Dtype::F32, 128),
            ([3, 7], Dtype::F16, 1),
            ([1, 1 << 20], Dtype::F32, 1),
        ] {
            let runs = row_runs(shape, dtype, align);
            let mut next = 0;
            for (i, &(first, rows)) in runs.iter().enumerate() {
                assert_eq!(first, next, "{shape:?}");
                assert!(rows > 0 && (i + 1 == runs.len() || rows % align == 0));
                next += rows;
            }
            assert_eq!(next, shape[0], "{shape:?}");
            let bytes = dtype.byte_len(shape[0] * shape[1]).unwrap();
            let count = runs.len() as u64;
            if bytes < ROWS_RUN {
                assert_eq!(count, 1, "{shape:?}");
            } else {
                assert!(
                    count >= shape[0].div_ceil(align).min(SHARED_RUNS),
                    "{shape:?}"
                );
                assert!(
                    count <= bytes.div_ceil(ROWS_RUN).max(SHARED_RUNS),
                    "{shape:?}"
                );
            }
        }
    }

    /// A model of one weight, `c.weight`, of 9 MiB of F32 (2048 x 1152, normal values): nine
    /// runs of rows, three of the largest magnitudes' pass.
    fn nine_mib_of_f32() -> crate::demo::SyntheticModel {
        use crate::demo::{Fill, SyntheticModel};
        let normal = Fill::Normal {
            mean: 0.0,
            std: 1.0,
        };
        SyntheticModel::new(5).tensor("c.weight", Dtype::F32, &[2048, 1152], normal)
    }

    /// A run whose work panics raises the panic in the caller, once the other runs are done,
    /// rather than leaving it waiting for a result that never comes.
    #[test]
    fn a_run_that_panics_raises_its_panic_in_the_caller() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("model.safetensors");
        nine_mib_of_f32().write(&source).unwrap();
        let (sender, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let model = Model::open(&source).unwrap();
            let files = vec![open_file(&source).unwrap()];
            let read = map_rows(
                &model,
                &files,
                &model.tensors[0],
                &Control::default(),
                |first, _: &[f32]| {
                    assert!(first < 1000, "a run past row 1000");
                    Ok(())
                },
                |()| Ok(()),
            );
            // Not sent if the read panics, which drops the sender.
            let _ = sender.send(read.is_ok());
        });
        let ended = finished.recv_timeout(std::time::Duration::from_secs(60));
        assert_eq!(ended, Err(std::sync::mpsc::RecvTimeoutError::Disconnected));
    }

    /// A weight read from one of the pool's threads (as a job on the pool would) is read there in
    /// turn, to the same result, rather than left waiting for runs no thread is free to read.
    #[test]
    fn a_weight_read_on_a_pool_thread_is_read_there() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("model.safetensors");
        nine_mib_of_f32().write(&source).unwrap();
        let read = move || {
            let model = Model::open(&source).unwrap();
            let files = vec![open_file(&source).unwrap()];
            tensor_absmax(&model, &files, &model.tensors[0], true, &Control::default()).unwrap()
        };
        let on_this_thread = read.clone()();
        let (sender, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let one_thread = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .unwrap();
            let _ = sender.send(one_thread.install(read));
        });
        let on_the_pool = finished
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the read on the pool's thread finishes");
        assert_eq!(on_the_pool, on_this_thread);
        assert_eq!(on_the_pool.unwrap().1.len(), 2048);
    }

    /// Once a run of a tensor holds NaN or Inf, the pass reads no more of it: a tensor whose
    /// first run holds Inf and whose file ends before its last run is found non-finite, without
    /// the error that reading that run gives (one thread, so that the runs go in order).
    #[test]
    fn largest_magnitudes_stop_reading_a_tensor_found_non_finite() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("model.safetensors");
        nine_mib_of_f32()
            .plant("c.weight", 0, f64::INFINITY)
            .write(&source)
            .unwrap();
        let model = Model::open(&source).unwrap();
        let files = vec![open_file(&source).unwrap()];
        let (start, len) = model.file_range(&model.tensors[0]);
        cut_file(&source, start + len - 4);
        let one_thread = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let control = Control::default();
        let found = one_thread.install(|| largest_magnitudes(&model, &files, &[0], &control));
        assert_eq!(found.unwrap(), [None]);
        assert!(tensor_absmax(&model, &files, &model.tensors[0], false, &control).is_err());
    }

    /// Every scheme measures a weight scaled by a power of two far from 1 (its values near
    /// `1e30` or `1e-30`, whose squares `f32` does not hold, or near `1e-37`) as it measures the
    /// weight itself, in the file written and in the comparison, and the file verifies: scales
    /// follow their values, and so do the errors.
    #[test]
    fn weights_far_from_1_are_measured_as_near_it() {
        use crate::demo::{Fill, SyntheticModel};
        let dir = tempfile::tempdir().unwrap();
        for dtype in [Dtype::F32, Dtype::Bf16] {
            let snrs_at = |power: i32| -> Vec<(f64, f64)> {
                let source = dir.path().join(format!("{dtype}-{power}.safetensors"));
                let std = 2f64.powi(power);
                SyntheticModel::new(11)
                    .tensor(
                        "w.weight",
                        dtype,
                        &[128, 256],
                        Fill::Normal { mean: 0.0, std },
                    )
                    .plant("w.weight", 3, 9.0 * std)
                    .write(&source)
                    .unwrap();
                let model = Model::open(&source).unwrap();
                Scheme::ALL
                    .iter()
                    .map(|&scheme| {
                        let output = dir.path().join(format!("{dtype}-{power}-{scheme}"));
                        let options = Options {
                            scheme,
                            ..Options::default()
                        };
                        let summary =
                            quantize(&model, &output, &options, &Control::default()).unwrap();
                        assert!(summary.verified, "{dtype} 2^{power} {scheme}");
                        let written = summary.quantized[0].error.snr_db;
                        let compared = compare(&model, &options, &Control::default()).unwrap();
                        let compared = compared
                            .schemes
                            .iter()
                            .find(|result| result.scheme == scheme)
                            .and_then(|result| result.worst_snr_db)
                            .unwrap();
                        (written, compared)
                    })
                    .collect()
            };
            let near_1 = snrs_at(0);
            // At 2^-122 the smallest values are subnormal, and so not quite the others scaled;
            // NVFP4's global scale (`448 · 6 / absmax`) passes `f32`'s range.
            for (power, within) in [
                (-122, 0.5),
                (-100, 1e-3),
                (-45, 1e-3),
                (45, 1e-3),
                (100, 1e-3),
            ] {
                for ((scheme, far), near) in Scheme::ALL.iter().zip(snrs_at(power)).zip(&near_1) {
                    for (far, near) in [(far.0, near.0), (far.1, near.1), (far.0, far.1)] {
                        assert!(
                            far.is_finite() && (far - near).abs() < within,
                            "{dtype} 2^{power} {scheme}: {far} dB against {near} dB"
                        );
                    }
                }
            }
        }
    }

    /// Tensors copied whole are written beside the quantized ones, by every scheme, byte for
    /// byte; a copy that fails (its source shrank) fails the save, naming the tensor and its
    /// file, and leaves no output.
    #[test]
    fn tensors_copied_beside_the_stream_arrive_whole() {
        use crate::demo::{Fill, SyntheticModel};
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("model.safetensors");
        let normal = Fill::Normal {
            mean: 0.0,
            std: 1.0,
        };
        // F32 first in the file, then BF16: the copied `z.norm.weight` (9 MiB, three runs) last.
        SyntheticModel::new(9)
            .tensor("a.weight", Dtype::F32, &[256, 512], normal.clone())
            .tensor("b.norm.weight", Dtype::F32, &[512], normal.clone())
            .tensor("c.weight", Dtype::F32, &[128, 256], normal.clone())
            .tensor("z.norm.weight", Dtype::Bf16, &[9 << 19], normal)
            .write(&source)
            .unwrap();
        let model = Model::open(&source).unwrap();
        let source_bytes = std::fs::read(&source).unwrap();
        let bytes_of = |model: &Model, bytes: &[u8], name: &str| {
            let tensor = model.tensors.iter().find(|t| t.name() == name).unwrap();
            let (start, len) = model.file_range(tensor);
            bytes[usize::try_from(start).unwrap()..][..usize::try_from(len).unwrap()].to_vec()
        };
        for scheme in Scheme::ALL {
            let options = Options {
                scheme,
                ..Options::default()
            };
            let output = dir.path().join(format!("{scheme}.safetensors"));
            let summary = quantize(&model, &output, &options, &Control::default()).unwrap();
            assert!(summary.verified, "{scheme}");
            assert_eq!(summary.quantized.len(), 2, "{scheme}");
            let written = Model::open(&output).unwrap();
            let written_bytes = std::fs::read(&output).unwrap();
            safetensors::SafeTensors::deserialize(&written_bytes).unwrap();
            for name in ["b.norm.weight", "z.norm.weight"] {
                assert!(
                    bytes_of(&model, &source_bytes, name)
                        == bytes_of(&written, &written_bytes, name),
                    "{scheme}: {name}"
                );
            }
        }
        let copied = model
            .tensors
            .iter()
            .find(|t| t.name() == "z.norm.weight")
            .unwrap();
        let (start, len) = model.file_range(copied);
        cut_file(&source, start + len / 2);
        for scheme in [Scheme::W8A8, Scheme::W4A16] {
            let options = Options {
                scheme,
                ..Options::default()
            };
            let output = dir.path().join(format!("shrunk-{scheme}.safetensors"));
            let error = quantize(&model, &output, &options, &Control::default())
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("copying `z.norm.weight` from")
                    && error.contains("model.safetensors"),
                "{scheme}: {error}"
            );
            assert!(!output.exists(), "{scheme}");
        }
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .filter(|name| name.contains(".partial"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn globs_match_names() {
        assert!(glob("*.mlp.*", "model.layers.0.mlp.down_proj.weight"));
        assert!(glob("model.layers.?.mlp*", "model.layers.3.mlp.up"));
        assert!(!glob("model.layers.?.mlp*", "model.layers.12.mlp.up"));
        assert!(glob("*", ""));
        assert!(!glob("a", "b"));
    }

    #[test]
    fn chooses_two_dimensional_float_weights_only() {
        let tensor = |name: &str, dtype: Dtype, shape: &[u64]| Tensor {
            info: crate::format::TensorInfo {
                name: name.into(),
                dtype: dtype.into(),
                shape: shape.into(),
                data_offsets: [0, 0],
            },
            shard: 0,
        };
        let options = Options::default();
        assert_eq!(
            choose(
                &tensor("m.layers.0.mlp.w.weight", Dtype::Bf16, &[4, 4]),
                &options
            ),
            Choice::Quantize
        );
        assert_eq!(
            choose(
                &tensor("m.layers.0.mlp.w.bias", Dtype::Bf16, &[4, 4]),
                &options
            ),
            Choice::Keep(Kept::NotAWeight)
        );
        assert_eq!(
            choose(&tensor("m.norm.weight", Dtype::Bf16, &[4, 4]), &options),
            Choice::Keep(Kept::Norm)
        );
        assert_eq!(
            choose(&tensor("lm_head.weight", Dtype::F32, &[4, 4]), &options),
            Choice::Keep(Kept::LmHead)
        );
        assert_eq!(
            choose(
                &tensor("m.embed_tokens.weight", Dtype::F32, &[4, 4]),
                &options
            ),
            Choice::Keep(Kept::Embedding)
        );
        for router in [
            "model.layers.3.mlp.gate.weight",
            "model.layers.0.block_sparse_moe.gate.weight",
            "model.layers.0.mlp.router.weight",
            "model.layers.0.feed_forward.router.weight",
            "model.layers.0.mlp.shared_expert_gate.weight",
            "model.layers.0.block_sparse_moe.router.layer.weight",
        ] {
            assert_eq!(
                choose(&tensor(router, Dtype::Bf16, &[8, 128]), &options),
                Choice::Keep(Kept::Router),
                "{router}"
            );
        }
        for not_router in [
            "model.layers.0.mlp.gate_proj.weight",
            "model.layers.0.mlp.experts.3.gate_proj.weight",
            "model.layers.0.mlp.gate_up_proj.weight",
            "model.layers.0.self_attn.o_proj.weight",
        ] {
            assert_eq!(
                choose(&tensor(not_router, Dtype::Bf16, &[8, 128]), &options),
                Choice::Quantize,
                "{not_router}"
            );
        }
        assert_eq!(
            choose(&tensor("m.w.weight", Dtype::I32, &[4, 4]), &options),
            Choice::Keep(Kept::NotFloat)
        );
        assert_eq!(
            choose(&tensor("m.w.weight", Dtype::F32, &[4]), &options),
            Choice::Keep(Kept::NotTwoDimensional)
        );
        for empty in [[0, 4], [100_000_000, 0]] {
            assert_eq!(
                choose(&tensor("m.w.weight", Dtype::F32, &empty), &options),
                Choice::Keep(Kept::Empty)
            );
        }
        let excluding = Options {
            exclude: vec!["*.mlp.*".into()],
            ..Options::default()
        };
        assert_eq!(
            choose(&tensor("m.mlp.w.weight", Dtype::F32, &[4, 4]), &excluding),
            Choice::Keep(Kept::Excluded)
        );
    }
}
