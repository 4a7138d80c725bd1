//! Any bytes as a model file read as the quantized model it encodes: each layout recognised from
//! the names, dtypes and shapes of its members, and every logical weight dequantized and
//! measured (through the fused kernels where the layout has them), as `stui stats` does. Never a
//! panic; a weight either gives statistics of all its elements or an error that says why.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stui::jobs::dequantized::weight_stats;

fuzz_target!(|data: &[u8]| {
    let Ok(dir) = tempfile_dir() else { return };
    let path = dir.join("model.safetensors");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let Ok((model, Some(quantization))) = stui::arch::open_reviewed(&path, None) else {
        return;
    };
    for (index, weight) in quantization.weights.iter().enumerate() {
        match weight_stats((&model, &quantization, index), true, &|| false) {
            Ok(stats) => {
                let elements = weight.element_count();
                assert_eq!(stats.moments.count, elements, "{}", weight.info.name);
                if let Some(histogram) = &stats.histogram {
                    let binned: u64 = histogram.counts.iter().sum();
                    assert!(binned <= elements, "{}", weight.info.name);
                }
            }
            Err(message) => assert!(!message.is_empty(), "{}", weight.info.name),
        }
    }
});

fn tempfile_dir() -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("stui-fuzz-dequantize-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
