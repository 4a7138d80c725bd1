//! stui: a terminal explorer and validator for `.safetensors` model files.
//!
//! The modules depend on each other in one direction only:
//!
//! - [`text`], [`finding`], [`error`]: shared vocabulary (escaping, findings with stable codes);
//!   [`fault`]: panics on purpose where the fault tests ask (debug builds); [`recycle`]: buffers
//!   handed on from chunk to chunk.
//! - [`format`]: reading headers leniently, the reference's strict verdict, sharded models, and
//!   the writer. Never reads tensor data when opening.
//! - [`arch`]: the architecture recognised from names and shapes, checked against config.json.
//! - [`tree`]: the layer tree built from dotted names, with totals on every node.
//! - [`analysis`]: statistics, histograms and numeric findings from tensor bytes, every dtype.
//! - [`jobs`]: the background scan that reads tensor data and streams results on a channel.
//! - [`quant`]: quantized weights dequantized exactly, layout by layout.
//! - [`quantize`]: int8 quantization, written in the compressed-tensors layout.
//! - [`diff`]: what changed between two checkpoints, tensor by tensor.
//! - [`hash`]: SHA-256 of files and tensors, and the structural ID.
//! - [`report`]: text and JSON output of the headless commands.
//! - [`cli`], [`commands`]: the command line and one function per subcommand.
//! - [`tui`]: the interactive explorer; the only module that uses the terminal.

pub mod analysis;
pub mod arch;
pub mod cli;
pub mod commands;
pub mod demo;
pub mod diff;
pub mod error;
pub mod fault;
pub mod finding;
pub mod format;
pub mod hash;
pub mod jobs;
pub mod quant;
pub mod quantize;
pub mod recycle;
pub mod report;
pub mod text;
pub mod tree;
pub mod tui;
