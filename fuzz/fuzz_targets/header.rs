//! Any text as a header: the canonical fast path, when it accepts the text, must read exactly what
//! the full lenient parser reads (tensors, metadata and findings); neither may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stui::format::header;

fuzz_target!(|text: &str| {
    let lenient = header::parse_leniently(text, true);
    if let Some(fast) = header::fast::parse(text) {
        assert_eq!(fast, lenient);
    }
});
