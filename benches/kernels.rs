//! Statistics kernels on data already in memory (no file, no page cache): the part of a scan
//! that is computation, in GB/s of element bytes, one thread and all threads.
//!
//! `cargo bench --bench kernels`

#![expect(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use rayon::prelude::*;
use std::time::{Duration, Instant};
use stui::analysis::moments_of;
use stui::format::Dtype;

const BYTES: usize = 512 << 20;
const CHUNK: usize = 3 << 20;
const RUNS: usize = 7;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Bytes of normally spread weights in `dtype` (a fixed pseudo-random sequence).
fn weights(dtype: Dtype) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        // A sum of uniforms is near enough to normal for a benchmark.
        (0..4)
            .map(|i| ((state >> (16 * i)) & 0xffff) as f32 / 65536.0)
            .sum::<f32>()
            * 0.02
            - 0.04
    };
    let mut bytes = Vec::with_capacity(BYTES);
    while bytes.len() < BYTES {
        let value = next();
        match dtype {
            Dtype::F32 => bytes.extend_from_slice(&value.to_le_bytes()),
            Dtype::Bf16 => bytes.extend_from_slice(&half::bf16::from_f32(value).to_le_bytes()),
            Dtype::F16 => bytes.extend_from_slice(&half::f16::from_f32(value).to_le_bytes()),
            _ => unreachable!("only float weights are generated"),
        }
    }
    bytes
}

fn main() {
    println!(
        "kernel for finite blocks: {:?}",
        stui::analysis::simd::kernel()
    );
    println!("| dtype | threads | median ms | GB/s |");
    println!("| --- | --- | --- | --- |");
    for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
        let bytes = weights(dtype);
        for parallel in [false, true] {
            let samples = (0..RUNS)
                .map(|_| {
                    let started = Instant::now();
                    let count = if parallel {
                        bytes
                            .par_chunks(CHUNK)
                            .map(|chunk| moments_of(dtype, chunk).count)
                            .sum::<u64>()
                    } else {
                        bytes
                            .chunks(CHUNK)
                            .map(|chunk| moments_of(dtype, chunk).count)
                            .sum()
                    };
                    assert_eq!(count, (BYTES / (dtype.bits() as usize / 8)) as u64);
                    started.elapsed()
                })
                .collect();
            let time = median(samples);
            println!(
                "| {dtype} | {} | {:.1} | {:.2} |",
                if parallel {
                    rayon::current_num_threads()
                } else {
                    1
                },
                time.as_secs_f64() * 1e3,
                BYTES as f64 / time.as_secs_f64() / 1e9
            );
        }
    }
}
