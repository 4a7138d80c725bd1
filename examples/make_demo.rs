//! Regenerates the bundled demo model: `cargo run --example make_demo [OUT]`
//! (default `assets/demo.safetensors`). The output is the same bytes on every run.

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let out = std::env::args_os()
        .nth(1)
        .map_or_else(|| PathBuf::from("assets/demo.safetensors"), PathBuf::from);
    stui::demo::demo_model().write(&out)?;
    eprintln!("wrote {}", out.display());
    Ok(())
}
