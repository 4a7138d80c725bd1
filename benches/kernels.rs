//! Statistics kernels on data already in memory (no file, no page cache): the part of a scan
//! that is computation, in GB/s of element bytes, one thread and all threads. Then the
//! dequantization kernels (compressed-tensors W4A16 group 128, FP8 with 128×128 block scales)
//! against BF16 widening and BF16 statistics, in logical elements per second.
//!
//! `cargo bench --bench kernels`

#![expect(clippy::print_stdout, reason = "a benchmark reports on stdout")]
#![expect(
    clippy::expect_used,
    reason = "a benchmark of layouts it builds itself"
)]

use rayon::prelude::*;
use std::time::{Duration, Instant};
use stui::analysis::moments_of;
use stui::analysis::simd::Lanes;
use stui::analysis::values::widen;
use stui::format::Dtype;
use stui::quant::kernels::compressed_tensors::{Packed, PackedMembers, Strategy};
use stui::quant::kernels::fp8::Fp8;
use stui::quant::kernels::{Dequantize, Stored};

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
    dequantization();
}

/// Logical rows and columns of the dequantized weights (a Llama-like MLP projection).
const ROWS: usize = 8192;
const COLS: usize = 8192;
/// Rows dequantized at a time, as the scan streams them: 32,768 values (128 KiB), which stay
/// in L2 between the dequantization and the statistics.
const ROW_BLOCK: usize = 4;

/// A fixed pseudo-random byte sequence.
fn random_bytes(count: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    (0..count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[3]
        })
        .collect()
}

fn bf16_bytes(values: impl Iterator<Item = f32>) -> Vec<u8> {
    values
        .flat_map(|v| half::bf16::from_f32(v).to_le_bytes())
        .collect()
}

/// Times `work` over every row block, one thread and all threads, and prints logical
/// elements per second.
fn time_rows(
    name: &str,
    rows: usize,
    cols: usize,
    work: &(dyn Fn(std::ops::Range<usize>, &mut [f32]) + Sync),
) {
    for parallel in [false, true] {
        let samples = (0..RUNS)
            .map(|_| {
                let started = Instant::now();
                let blocks: Vec<usize> = (0..rows.div_ceil(ROW_BLOCK)).collect();
                let run = |block: &usize, out: &mut Vec<f32>| {
                    let range = block * ROW_BLOCK..((block + 1) * ROW_BLOCK).min(rows);
                    out.resize(range.len() * cols, 0.0);
                    work(range, out);
                };
                if parallel {
                    blocks
                        .par_iter()
                        .for_each_init(Vec::new, |out, block| run(block, out));
                } else {
                    let mut out = Vec::new();
                    for block in &blocks {
                        run(block, &mut out);
                    }
                }
                started.elapsed()
            })
            .collect();
        let time = median(samples);
        println!(
            "| {name} | {} | {:.1} | {:.2} |",
            if parallel {
                rayon::current_num_threads()
            } else {
                1
            },
            time.as_secs_f64() * 1e3,
            (rows * cols) as f64 / time.as_secs_f64() / 1e9
        );
    }
}

fn dequantization() {
    println!();
    println!("{ROWS}x{COLS} logical elements, {ROW_BLOCK} rows at a time");
    println!("| kernel | threads | median ms | G elements/s |");
    println!("| --- | --- | --- | --- |");
    let bf16 = bf16_bytes(
        random_bytes(ROWS * COLS, 1)
            .into_iter()
            .map(|b| f32::from(b) / 2560.0 - 0.05),
    );
    time_rows("BF16 widen", ROWS, COLS, &|rows, out| {
        widen(
            Lanes::Bf16,
            &bf16[rows.start * COLS * 2..rows.end * COLS * 2],
            out,
        );
    });
    time_rows("BF16 statistics", ROWS, COLS, &|rows, _| {
        moments_of(
            Dtype::Bf16,
            &bf16[rows.start * COLS * 2..rows.end * COLS * 2],
        );
    });

    // compressed-tensors W4A16, symmetric, groups of 128, BF16 scales.
    let packed = random_bytes(ROWS * COLS / 2, 2);
    let packed_shape = [ROWS as u64, (COLS / 8) as u64];
    let shape_values: Vec<u8> = [ROWS as u64, COLS as u64]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let groups = COLS / 128;
    let scales = bf16_bytes((0..ROWS * groups).map(|k| 1e-3 + (k % 97) as f32 * 1e-5));
    let scales_shape = [ROWS as u64, groups as u64];
    let members = PackedMembers {
        weight_packed: Stored {
            bytes: &packed,
            dtype: Dtype::I32,
            shape: &packed_shape,
        },
        weight_shape: Stored {
            bytes: &shape_values,
            dtype: Dtype::I64,
            shape: &[2],
        },
        weight_scale: Stored {
            bytes: &scales,
            dtype: Dtype::Bf16,
            shape: &scales_shape,
        },
        weight_zero_point: None,
        weight_g_idx: None,
    };
    let w4a16 =
        Packed::new(members, 4, Strategy::Group { size: 128 }, None).expect("a valid layout");
    time_rows("W4A16 g128 dequantize", ROWS, COLS, &|rows, out| {
        w4a16.dequantize_rows(rows, out);
    });
    time_rows(
        "W4A16 g128 dequantize + statistics",
        ROWS,
        COLS,
        &|rows, out| {
            w4a16.dequantize_rows(rows, out);
            moments_of(Dtype::F32, bytemuck::cast_slice(out));
        },
    );

    // FP8 E4M3 with 128x128 block scales (F32, as DeepSeek-V3).
    let fp8: Vec<u8> = random_bytes(ROWS * COLS, 3)
        .into_iter()
        .map(|b| if b & 0x7f == 0x7f { 0 } else { b })
        .collect();
    let fp8_shape = [ROWS as u64, COLS as u64];
    let blocks = (ROWS / 128) * (COLS / 128);
    let block_scales: Vec<u8> = (0..blocks)
        .flat_map(|k| (1e-4 + (k % 89) as f32 * 1e-6).to_le_bytes())
        .collect();
    let block_shape = [(ROWS / 128) as u64, (COLS / 128) as u64];
    let fp8_block = Fp8::block(
        Stored {
            bytes: &fp8,
            dtype: Dtype::F8E4M3,
            shape: &fp8_shape,
        },
        Stored {
            bytes: &block_scales,
            dtype: Dtype::F32,
            shape: &block_shape,
        },
        [128, 128],
    )
    .expect("a valid layout");
    time_rows("FP8 block dequantize", ROWS, COLS, &|rows, out| {
        fp8_block.dequantize_rows(rows, out);
    });
    time_rows(
        "FP8 block dequantize + statistics",
        ROWS,
        COLS,
        &|rows, out| {
            fp8_block.dequantize_rows(rows, out);
            moments_of(Dtype::F32, bytemuck::cast_slice(out));
        },
    );
}
