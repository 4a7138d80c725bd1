//! Integration tests, in one test binary (one link instead of one per file).

#![expect(
    clippy::unwrap_used,
    reason = "test helpers fail the test by panicking"
)]

mod arch;
mod cli;
mod conformance;
mod fake_hub;
mod hf_cache;
mod hostile;
mod layermap;
mod paths;
mod quant;
mod quant_diff;
mod quant_findings;
mod quant_kernels;
mod quantize;
mod reference;
mod remote;
mod schemes;
mod sharded;
mod stats;
mod support;
mod terminal;
mod tui;
mod tui_quant;
