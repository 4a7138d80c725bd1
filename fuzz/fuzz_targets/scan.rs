//! Any bytes as a file whose every readable tensor is decoded and measured: statistics of every
//! dtype over arbitrary bytes, never a panic.
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
        let moments = moments_of(dtype, bytes);
        assert!(moments.count <= bytes.len() as u64 * 2);
    }
});
