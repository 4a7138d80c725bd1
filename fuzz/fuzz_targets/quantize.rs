//! A small random model (F32, BF16, F16 or F8_E4M3, so that both the f64 and the f32 row kernels
//! run), quantized under any scheme (W8A8 per channel or per tensor, the grouped int schemes
//! with groups that divide the columns or not, FP8 per channel and in blocks, NVFP4) and written.
//! The output must verify (the file read back is the one planned, every value finite and within
//! half a step of its grid) but for one save at the top of the range (below); the comparison,
//! which measures every scheme without writing codes, must give each weight the error the save
//! read back, to what the `f32` measures leave out; and the output read as the loaders read it
//! (`stui diff`, each weight dequantized from its members) must leave each weight that error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stui::demo::{Fill, SyntheticModel};
use stui::diff::{Side, Status, diff};
use stui::format::{Dtype, Model};
use stui::quantize::{Control, Granularity, NonFinite, Options, Scheme, compare, quantize};

/// BF16's largest finite value, `0x7F7F`.
const BF16_MAX: f64 = 3.389_531_389_251_535_5e38;

fuzz_target!(|input: (u8, u8, u8, u8, Vec<f32>)| {
    let (kind, rows, columns, choice, values) = input;
    let dtype = [Dtype::F32, Dtype::Bf16, Dtype::F16, Dtype::F8E4M3][usize::from(kind % 4)];
    let granularity = if kind & 4 == 0 {
        Granularity::PerChannel
    } else {
        Granularity::PerTensor
    };
    // Narrow tensors, and tensors in whole groups of 16 (NVFP4's) up to 192 wide: one group of
    // 128 and part of another, and part of a second 128x128 block.
    let columns = if kind & 8 == 0 {
        u64::from(columns % 16) + 1
    } else {
        16 * (u64::from(columns % 12) + 1)
    };
    let rows = u64::from(rows % 48) + 1;
    let scheme = Scheme::ALL[usize::from(choice) % Scheme::ALL.len()];
    let group_size = [128, 16, 32, 64, 48][usize::from(choice / 16) % 5];
    if values.is_empty() {
        return;
    }
    let values: Vec<f64> = values.iter().map(|&v| f64::from(v)).collect();
    let absmax = values
        .iter()
        .filter(|v| v.is_finite())
        .fold(0f64, |m, v| m.max(v.abs()));
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
        scheme,
        group_size,
        granularity,
        non_finite: NonFinite::Skip,
        ..Options::default()
    };
    let Ok(summary) = quantize(
        &model,
        &dir.join("out.safetensors"),
        &options,
        &Control::default(),
    ) else {
        // Nothing to quantize under this scheme (columns not in its groups, NaN skipped): said
        // so, as an error, rather than an empty file written.
        return;
    };
    // Every scheme's scales keep its grid within the loader's type, up to the top of F32's
    // range, but for one save, which says its output did not verify: NVFP4A16 loads in BF16,
    // which cannot hold an F32 weight beyond BF16's largest value.
    let unloadable = scheme == Scheme::Nvfp4A16 && absmax > BF16_MAX;
    assert!(
        summary.verified || unloadable,
        "{scheme} of {dtype:?} [{rows}, {columns}]"
    );
    let comparison = compare(&model, &options, &Control::default()).expect("compared");
    let measured = comparison
        .schemes
        .iter()
        .find(|result| result.scheme == scheme)
        .expect("every scheme compared");
    assert_eq!(measured.errors.len(), summary.quantized.len(), "{scheme}");
    // The measures in `f32` leave out what falls below its range: squares under 2^-66 of the
    // largest value's, errors under 2^-63 of it (`lanes::tensor_measured_in_f32`).
    let elements = (rows * columns) as f64;
    let floor = absmax * 2f64.powi(-60);
    for (written, &(tensor, error)) in summary.quantized.iter().zip(&measured.errors) {
        assert_eq!(written.tensor, tensor);
        let (a, b) = (
            written.error.relative_rms_error.powi(2),
            error.relative_rms_error.powi(2),
        );
        assert!(
            a == b || (a - b).abs() <= a.max(b) * 1e-4 + elements * 2f64.powi(-66),
            "{scheme} of {dtype:?} [{rows}, {columns}]: SNR {} written, {} compared",
            written.error.snr_db,
            error.snr_db
        );
        let (a, b) = (written.error.max_abs_error, error.max_abs_error);
        assert!(
            a == b || (a - b).abs() <= a.max(b) * 1e-6 + floor,
            "{scheme} of {dtype:?} [{rows}, {columns}]: largest error {a} written, {b} compared"
        );
    }
    if summary.verified {
        read_back_as_saved(&model, &dir.join("out.safetensors"), &summary, elements);
    }
    let _ = std::fs::remove_dir_all(&dir);
});

/// The output read back as the loaders read it (`stui diff SOURCE OUTPUT`, each quantized weight
/// dequantized in its scales' type) leaves each weight the error its save reported.
fn read_back_as_saved(
    source: &Model,
    output: &std::path::Path,
    summary: &stui::quantize::Summary,
    elements: f64,
) {
    let output = Model::open(output).expect("the output opens");
    let quantization = stui::arch::quantization(&output);
    let (a, b) = (
        Side::stored(source),
        Side::logical(&output, quantization.as_ref()),
    );
    let compared = diff(&a, &b, &std::sync::atomic::AtomicU64::new(0));
    for written in &summary.quantized {
        let name = source.tensors[written.tensor].name();
        let read = compared
            .tensors
            .iter()
            .find(|t| t.name(&a, &b) == name)
            .map(|t| match &t.status {
                Status::Same => Some(0.0),
                Status::Changed(changed) => changed.change.as_ref().map(|c| c.relative_l2),
                _ => None,
            });
        let Some(Some(read)) = read else {
            panic!("{name}: not read back as a weight ({:?})", summary.scheme);
        };
        let (a, b) = (written.error.relative_rms_error.powi(2), read.powi(2));
        assert!(
            a == b || (a - b).abs() <= a.max(b) * 1e-4 + elements * 2f64.powi(-66),
            "{:?}: relative error {} saved, {read} read back",
            summary.scheme,
            written.error.relative_rms_error
        );
    }
}

fn tempfile_dir() -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("stui-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
