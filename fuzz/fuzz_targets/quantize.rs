//! A small random model (F32, BF16, F16 or F8_E4M3, so that both the f64 and the f32 row kernels
//! run), quantized per channel or per tensor and written: the output must verify, and every value must be within half a
//! scale (the quantizer checks it itself and reports `verified`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use stui::demo::{Fill, SyntheticModel};
use stui::format::{Dtype, Model};
use stui::quantize::{Control, Granularity, NonFinite, Options, quantize};

fuzz_target!(|input: (u8, u8, u8, Vec<f32>)| {
    let (kind, rows, columns, values) = input;
    let dtype = [Dtype::F32, Dtype::Bf16, Dtype::F16, Dtype::F8E4M3][usize::from(kind % 4)];
    let granularity = if kind & 4 == 0 {
        Granularity::PerChannel
    } else {
        Granularity::PerTensor
    };
    let (rows, columns) = (u64::from(rows % 16) + 1, u64::from(columns % 16) + 1);
    if values.is_empty() {
        return;
    }
    let values: Vec<f64> = values.iter().map(|&v| f64::from(v)).collect();
    let model = SyntheticModel::new(0).tensor(
        "layer.proj.weight",
        dtype,
        &[rows, columns],
        Fill::Values(values),
    );
    let Ok(dir) = tempfile_dir() else { return };
    let source = dir.join("model.safetensors");
    if model.write(&source).is_err() {
        return;
    }
    let model = Model::open(&source).expect("a written model opens");
    let options = Options {
        granularity,
        non_finite: NonFinite::Skip,
        ..Options::default()
    };
    let summary = quantize(
        &model,
        &dir.join("out.safetensors"),
        &options,
        &Control::default(),
    )
    .expect("quantized");
    assert!(summary.verified);
    let _ = std::fs::remove_dir_all(&dir);
});

fn tempfile_dir() -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("stui-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
