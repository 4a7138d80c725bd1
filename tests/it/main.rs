//! Integration tests, in one test binary (one link instead of one per file).

#![expect(
    clippy::unwrap_used,
    reason = "test helpers fail the test by panicking"
)]

mod cli;
mod conformance;
mod hostile;
mod quant_kernels;
mod quantize;
mod reference;
mod schemes;
mod sharded;
mod stats;
mod support;
mod terminal;
mod tui;
