//! Any bytes as a file whose every readable tensor is decoded and measured: statistics of every
//! dtype over arbitrary bytes (through the SIMD kernels where the CPU has them), never a panic,
//! and statistics that agree with themselves.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stui::analysis::moments_of;
use stui::format::SafetensorsFile;

fuzz_target!(|data: &[u8]| {
    let file = SafetensorsFile::from_bytes(std::path::Path::new("fuzz.safetensors"), data);
    if !file.is_valid() {
        return;
    }
    let start = usize::try_from(file.data_start()).unwrap_or(usize::MAX);
    for tensor in file.tensors.iter().map(|t| &t.info) {
        let [begin, end] = tensor.data_offsets;
        let (Ok(begin), Ok(end)) = (usize::try_from(begin), usize::try_from(end)) else {
            continue;
        };
        let (Some(dtype), Some(bytes)) =
            (tensor.dtype.known(), data.get(start + begin..start + end))
        else {
            continue;
        };
        let m = moments_of(dtype, bytes);
        assert!(m.count <= bytes.len() as u64 * 2);
        assert_eq!(m.count, m.nan + m.pos_inf + m.neg_inf + m.finite());
        assert!(m.zeros + m.subnormals <= m.finite());
        if let (Some(mean), Some(std)) = (m.mean(), m.std()) {
            assert!(m.min <= m.max);
            let slack = 1e-9 * m.min.abs().max(m.max.abs());
            assert!(
                mean >= m.min - slack && mean <= m.max + slack,
                "{mean} {m:?}"
            );
            assert!(
                std >= 0.0 && std <= (m.max - m.min) * (1.0 + 1e-9) + slack,
                "{std} {m:?}"
            );
        }
    }
});
