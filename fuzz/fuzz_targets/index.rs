//! Any text as a sharded model's index: findings, never a panic; no shard path leaves the folder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stui::format::index::ShardIndex;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let index = ShardIndex::parse(text);
        for shard in &index.shards {
            let path = std::path::Path::new(shard);
            assert!(path.is_relative());
            assert!(
                !path
                    .components()
                    .any(|c| matches!(c, std::path::Component::ParentDir))
            );
        }
    }
});
