//! Statistics against an independent, straightforward f64 computation, for every dtype, and the
//! background scan against the same numbers, under cancel, priority and a file truncated mid-scan.

use proptest::prelude::*;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};
use stui::analysis::{HistogramBuilder, Moments, moments_of, values};
use stui::demo::{Fill, SyntheticModel};
use stui::finding::Code;
use stui::format::{Dtype, Model};
use stui::jobs::{Scan, ScanEvent, ScanOptions, ScanOrder};

/// A small float: sign, exponent and mantissa fields, with subnormals; written out plainly.
fn small_float(code: u32, exponent_bits: u32, mantissa_bits: u32, bias: i32) -> f64 {
    let mantissa = f64::from(code % (1 << mantissa_bits));
    let exponent = (code >> mantissa_bits) % (1 << exponent_bits);
    let sign = if (code >> (exponent_bits + mantissa_bits)) % 2 == 1 {
        -1.0
    } else {
        1.0
    };
    let steps = f64::from(1u32 << mantissa_bits);
    if exponent == 0 {
        sign * mantissa / steps * 2f64.powi(1 - bias)
    } else {
        sign * (1.0 + mantissa / steps) * 2f64.powi(i32::try_from(exponent).unwrap() - bias)
    }
}

/// Every element of `bytes` as an f64, decoded independently of stui.
#[expect(
    clippy::too_many_lines,
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    reason = "a plain decoder, one arm per dtype; the casts reinterpret bits on purpose"
)]
fn decode(dtype: Dtype, bytes: &[u8]) -> Vec<f64> {
    let le = |b: &[u8]| {
        let mut word = 0u64;
        for (i, &byte) in b.iter().enumerate() {
            word |= u64::from(byte) << (8 * i);
        }
        word
    };
    let word = |size: usize| bytes.chunks_exact(size).map(le).collect::<Vec<u64>>();
    match dtype {
        Dtype::F64 => word(8).into_iter().map(f64::from_bits).collect(),
        Dtype::F32 => word(4)
            .into_iter()
            .map(|w| f64::from(f32::from_bits(u32::try_from(w).unwrap())))
            .collect(),
        Dtype::F16 => word(2)
            .into_iter()
            .map(|w| half::f16::from_bits(u16::try_from(w).unwrap()).to_f64())
            .collect(),
        Dtype::Bf16 => word(2)
            .into_iter()
            .map(|w| half::bf16::from_bits(u16::try_from(w).unwrap()).to_f64())
            .collect(),
        Dtype::I8 => bytes.iter().map(|&b| f64::from(b as i8)).collect(),
        Dtype::U8 => bytes.iter().map(|&b| f64::from(b)).collect(),
        Dtype::Bool => bytes
            .iter()
            .map(|&b| if b == 0 { 0.0 } else { 1.0 })
            .collect(),
        Dtype::I16 => word(2)
            .into_iter()
            .map(|w| f64::from(w as u16 as i16))
            .collect(),
        Dtype::U16 => word(2).into_iter().map(|w| w as f64).collect(),
        Dtype::I32 => word(4)
            .into_iter()
            .map(|w| f64::from(w as u32 as i32))
            .collect(),
        Dtype::U32 => word(4).into_iter().map(|w| w as f64).collect(),
        Dtype::I64 => word(8).into_iter().map(|w| w as i64 as f64).collect(),
        Dtype::U64 => word(8).into_iter().map(|w| w as f64).collect(),
        Dtype::C64 => word(8)
            .into_iter()
            .map(|w| {
                let re = f64::from(f32::from_bits(w as u32));
                let im = f64::from(f32::from_bits((w >> 32) as u32));
                re.hypot(im)
            })
            .collect(),
        Dtype::F8E5M2 => bytes
            .iter()
            .map(|&b| match (b >> 2) & 0x1f {
                0x1f if b.trailing_zeros() >= 2 => {
                    if b & 0x80 == 0 {
                        f64::INFINITY
                    } else {
                        f64::NEG_INFINITY
                    }
                }
                0x1f => f64::NAN,
                _ => small_float(u32::from(b), 5, 2, 15),
            })
            .collect(),
        Dtype::F8E4M3 => bytes
            .iter()
            .map(|&b| {
                if b & 0x7f == 0x7f {
                    f64::NAN
                } else {
                    small_float(u32::from(b), 4, 3, 7)
                }
            })
            .collect(),
        Dtype::F8E4M3Fnuz => bytes
            .iter()
            .map(|&b| {
                if b == 0x80 {
                    f64::NAN
                } else {
                    small_float(u32::from(b), 4, 3, 8)
                }
            })
            .collect(),
        Dtype::F8E5M2Fnuz => bytes
            .iter()
            .map(|&b| {
                if b == 0x80 {
                    f64::NAN
                } else {
                    small_float(u32::from(b), 5, 2, 16)
                }
            })
            .collect(),
        Dtype::F8E8M0 => bytes
            .iter()
            .map(|&b| {
                if b == 255 {
                    f64::NAN
                } else {
                    2f64.powi(i32::from(b) - 127)
                }
            })
            .collect(),
        Dtype::F4 => bytes
            .iter()
            .flat_map(|&b| [b & 15, b >> 4])
            .map(|n| small_float(u32::from(n), 2, 1, 1))
            .collect(),
        Dtype::F6E2M3 | Dtype::F6E3M2 => {
            let (e, m, bias) = if dtype == Dtype::F6E2M3 {
                (2, 3, 1)
            } else {
                (3, 2, 3)
            };
            bytes
                .chunks_exact(3)
                .flat_map(|b| {
                    let group = le(b);
                    (0..4).map(move |i| u32::try_from((group >> (6 * i)) & 63).unwrap())
                })
                .map(|code| small_float(code, e, m, bias))
                .collect()
        }
    }
}

struct Expected {
    count: u64,
    nan: u64,
    pos_inf: u64,
    neg_inf: u64,
    zeros: u64,
    subnormals: u64,
    min: f64,
    max: f64,
    mean: Option<f64>,
    std: Option<f64>,
}

/// The smallest positive normal value of each float dtype, from its exponent bias; 0 for the
/// dtypes without subnormals.
fn smallest_normal(dtype: Dtype) -> f64 {
    let bias = match dtype {
        Dtype::F64 => 1023,
        Dtype::F32 | Dtype::Bf16 => 127,
        Dtype::F16 | Dtype::F8E5M2 => 15,
        Dtype::F8E5M2Fnuz => 16,
        Dtype::F8E4M3 => 7,
        Dtype::F8E4M3Fnuz => 8,
        Dtype::F6E3M2 => 3,
        Dtype::F6E2M3 | Dtype::F4 => 1,
        _ => return 0.0,
    };
    2f64.powi(1 - bias)
}

fn expected(dtype: Dtype, values: &[f64]) -> Expected {
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    let n = finite.len() as f64;
    // Worked out on the values over their largest magnitude, so that neither the sums overflow
    // nor the squares of tiny values underflow to zero.
    let scale = absmax(&finite);
    let scaled = |v: f64| if scale > 0.0 { v / scale } else { v };
    let scaled_mean =
        (!finite.is_empty()).then(|| finite.iter().map(|&v| scaled(v)).sum::<f64>() / n);
    let mean = scaled_mean.map(|m| if scale > 0.0 { m * scale } else { m });
    let std = scaled_mean.map(|m| {
        let variance = finite
            .iter()
            .map(|&v| (scaled(v) - m) * (scaled(v) - m))
            .sum::<f64>()
            / n;
        let std = variance.sqrt();
        if scale > 0.0 { std * scale } else { std }
    });
    Expected {
        count: values.len() as u64,
        nan: values.iter().filter(|v| v.is_nan()).count() as u64,
        pos_inf: values.iter().filter(|&&v| v == f64::INFINITY).count() as u64,
        neg_inf: values.iter().filter(|&&v| v == f64::NEG_INFINITY).count() as u64,
        zeros: values.iter().filter(|&&v| v == 0.0).count() as u64,
        subnormals: values
            .iter()
            .filter(|&&v| v != 0.0 && v.abs() < smallest_normal(dtype))
            .count() as u64,
        min: finite.iter().copied().fold(f64::INFINITY, f64::min),
        max: finite.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        mean,
        std,
    }
}

fn assert_matches(dtype: Dtype, bytes: &[u8]) -> Result<(), TestCaseError> {
    let values = decode(dtype, bytes);
    let want = expected(dtype, &values);
    let got = moments_of(dtype, bytes);
    prop_assert_eq!(
        (
            got.count,
            got.nan,
            got.pos_inf,
            got.neg_inf,
            got.zeros,
            got.subnormals
        ),
        (
            want.count,
            want.nan,
            want.pos_inf,
            want.neg_inf,
            want.zeros,
            want.subnormals
        ),
        "{} counts",
        dtype
    );
    prop_assert_eq!((got.min, got.max), (want.min, want.max), "{} range", dtype);
    let tolerance = if dtype == Dtype::F64 { 1e-9 } else { 1e-6 };
    for (what, got, want) in [
        ("mean", got.mean(), want.mean),
        ("std", got.std(), want.std),
    ] {
        match (got, want) {
            (Some(got), Some(want)) => {
                // Relative, with a floor at the reference's own rounding (a sum that cancels to
                // about zero has no relative precision in plain f64 either).
                let floor = 1e-12 * absmax(&values) * (values.len() as f64).sqrt();
                let allowed = tolerance * want.abs().max(got.abs()) + floor;
                prop_assert!(
                    (got - want).abs() <= allowed,
                    "{dtype} {what}: {got} vs {want}"
                );
            }
            (got, want) => prop_assert_eq!(got, want, "{} {}", dtype, what),
        }
    }
    // Histogram counts: every finite value lands in the bin its edges say.
    if want.mean.is_some() {
        let mut builder = HistogramBuilder::new(want.min, want.max);
        values::feed(dtype, bytes, &mut builder);
        let histogram = builder.finish();
        let edges = histogram.edges();
        let mut counts = vec![0u64; histogram.counts.len()];
        for &v in values.iter().filter(|v| v.is_finite()) {
            let bin = edges[1..]
                .iter()
                .position(|&edge| v < edge)
                .unwrap_or(counts.len() - 1);
            counts[bin] += 1;
        }
        if want.max > want.min {
            prop_assert_eq!(&histogram.counts, &counts, "{} histogram", dtype);
        }
    }
    Ok(())
}

fn absmax(values: &[f64]) -> f64 {
    values
        .iter()
        .filter(|v| v.is_finite())
        .fold(0f64, |m, v| m.max(v.abs()))
}

/// Bytes for `count` elements of `dtype`, with specials and values near the limits mixed in.
fn bytes_for(dtype: Dtype, count: usize, seed: u64) -> Vec<u8> {
    let len = dtype.byte_len(count as u64).unwrap();
    let mut rng = stui::demo::SplitMix64::new(seed);
    let mut bytes: Vec<u8> = (0..len).map(|_| (rng.next_u64() & 0xff) as u8).collect();
    if dtype == Dtype::F32 && count >= 8 {
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            f32::MAX,
            f32::MIN,
            1e-40,
        ];
        for (i, v) in specials.iter().enumerate() {
            bytes[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn statistics_match_a_plain_f64_computation(
        dtype in prop::sample::select(Dtype::ALL.to_vec()),
        count in prop_oneof![Just(0usize), Just(1), 2usize..64, 4000usize..9000],
        seed in any::<u64>(),
    ) {
        let count = match dtype {
            Dtype::F4 => count / 2 * 2,
            Dtype::F6E2M3 | Dtype::F6E3M2 => count / 4 * 4,
            _ => count,
        };
        assert_matches(dtype, &bytes_for(dtype, count, seed))?;
    }
}

#[test]
fn edge_cases_of_every_dtype() {
    for dtype in Dtype::ALL {
        let one = dtype
            .byte_len(if dtype == Dtype::F4 {
                2
            } else if dtype.is_sub_byte() {
                4
            } else {
                1
            })
            .unwrap();
        for bytes in [
            vec![],
            vec![0u8; usize::try_from(one).unwrap()],
            vec![0xffu8; usize::try_from(one * 8).unwrap()],
        ] {
            assert_matches(dtype, &bytes).unwrap();
        }
    }
    let near_limits: Vec<u8> = [f64::MAX, -f64::MAX, f64::MIN_POSITIVE, 5e-324, 1.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_matches(Dtype::F64, &near_limits).unwrap();
    let ints: Vec<u8> = [i64::MIN, i64::MAX, 0, -1]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_matches(Dtype::I64, &ints).unwrap();
}

/// A model with tensors larger than the scan's chunks, written to a temporary folder.
fn big_model(dir: &std::path::Path) -> Arc<Model> {
    let model = SyntheticModel::new(9)
        .tensor(
            "a.weight",
            Dtype::F32,
            &[2048, 1024],
            Fill::Normal {
                mean: 0.0,
                std: 0.02,
            },
        )
        .tensor(
            "b.weight",
            Dtype::Bf16,
            &[2048, 1500],
            Fill::Normal {
                mean: 1.0,
                std: 0.5,
            },
        )
        .tensor(
            "c.weight",
            Dtype::F32,
            &[1024, 1024],
            Fill::Normal {
                mean: 0.0,
                std: 1.0,
            },
        )
        .tensor("d.bias", Dtype::F16, &[300], Fill::Zeros)
        .plant("b.weight", 3_000_000, f64::NAN);
    let path = dir.join("big.safetensors");
    model.write(&path).unwrap();
    Arc::new(Model::open(&path).unwrap())
}

fn collect(receiver: &mpsc::Receiver<ScanEvent>) -> Vec<ScanEvent> {
    let mut events = Vec::new();
    while let Ok(event) = receiver.recv_timeout(Duration::from_secs(60)) {
        let last = matches!(event, ScanEvent::Done(_) | ScanEvent::Cancelled);
        events.push(event);
        if last {
            break;
        }
    }
    events
}

/// Every event of a scan of the whole of `model` on two workers, with histograms, to its end.
fn scan_events(model: &Arc<Model>) -> Vec<ScanEvent> {
    let (sender, receiver) = mpsc::sync_channel(1 << 16);
    let all: Vec<usize> = (0..model.tensors.len()).collect();
    let scan = Scan::start(
        Arc::clone(model),
        all,
        ScanOptions {
            threads: Some(2),
            histograms: true,
            ..ScanOptions::default()
        },
        sender,
    );
    let events = collect(&receiver);
    scan.wait();
    assert!(matches!(events.last(), Some(ScanEvent::Done(_))));
    events
}

#[test]
fn the_scan_gives_the_same_numbers_as_a_single_pass() {
    let dir = tempfile::tempdir().unwrap();
    let model = big_model(dir.path());
    let bytes = std::fs::read(&model.shards[0].path).unwrap();
    let events = scan_events(&model);
    let mut seen = 0;
    for event in &events {
        if let ScanEvent::Stats { tensor, moments } = event {
            let (start, len) = model.file_range(&model.tensors[*tensor]);
            let range = usize::try_from(start).unwrap()..usize::try_from(start + len).unwrap();
            let dtype = model.tensors[*tensor].info.dtype.known().unwrap();
            let single: Moments = moments_of(dtype, &bytes[range]);
            assert_eq!(
                (moments.count, moments.nan, moments.min, moments.max),
                (single.count, single.nan, single.min, single.max)
            );
            let (a, b) = (moments.std().unwrap_or(0.0), single.std().unwrap_or(0.0));
            assert!((a - b).abs() <= 1e-12 * a.abs().max(1e-30), "{a} vs {b}");
            seen += 1;
        }
    }
    assert_eq!(seen, 4);
    let histograms = events
        .iter()
        .filter(|e| matches!(e, ScanEvent::Histogram { .. }))
        .count();
    assert_eq!(histograms, 4);
    let nan = events.iter().any(|e| matches!(e, ScanEvent::Finding(f) if f.code == Code::ValuesNan && f.tensor.as_deref() == Some("b.weight")));
    assert!(nan, "the planted NaN is reported");
}

/// A tensor's statistics are those of its pieces of 1.5 MiB (the scan's chunks of a local file,
/// and within each 12 MiB read from the Hub) merged in order: the same to the last digit from
/// one scan to the next, whichever worker finishes first.
#[test]
fn the_scan_merges_its_pieces_in_order_every_time() {
    const PIECE: usize = 3 << 19;
    let dir = tempfile::tempdir().unwrap();
    let model = big_model(dir.path());
    let bytes = std::fs::read(&model.shards[0].path).unwrap();
    let stats = |events: &[ScanEvent]| -> Vec<(usize, Moments)> {
        let mut stats: Vec<_> = events
            .iter()
            .filter_map(|event| match event {
                ScanEvent::Stats { tensor, moments } => Some((*tensor, *moments)),
                _ => None,
            })
            .collect();
        stats.sort_by_key(|&(tensor, _)| tensor);
        stats
    };
    let first = stats(&scan_events(&model));
    assert_eq!(first.len(), model.tensors.len());
    for &(tensor, moments) in &first {
        let (start, len) = model.file_range(&model.tensors[tensor]);
        let range = usize::try_from(start).unwrap()..usize::try_from(start + len).unwrap();
        let dtype = model.tensors[tensor].info.dtype.known().unwrap();
        let mut merged = Moments::EMPTY;
        for piece in bytes[range].chunks(PIECE) {
            merged.merge(&moments_of(dtype, piece));
        }
        assert_eq!(moments, merged, "{}", model.tensors[tensor].name());
    }
    for _ in 0..3 {
        assert_eq!(stats(&scan_events(&model)), first);
    }
}

#[test]
fn a_prioritized_tensor_is_scanned_first() {
    let dir = tempfile::tempdir().unwrap();
    let model = big_model(dir.path());
    let last = model
        .tensors
        .iter()
        .position(|t| t.name() == "d.bias")
        .unwrap();
    let (sender, receiver) = mpsc::sync_channel(1 << 16);
    let all: Vec<usize> = (0..model.tensors.len()).collect();
    let scan = Scan::start(
        Arc::clone(&model),
        all,
        ScanOptions {
            paused: true,
            ..ScanOptions::default()
        },
        sender,
    );
    scan.prioritize(last, false);
    scan.set_paused(false);
    let events = collect(&receiver);
    let first = events.iter().find_map(|e| match e {
        ScanEvent::Stats { tensor, .. } => Some(*tensor),
        _ => None,
    });
    assert_eq!(first, Some(last));
}

#[test]
fn a_tensor_asked_for_again_gets_its_statistics_again_and_its_findings_once() {
    let dir = tempfile::tempdir().unwrap();
    let model = big_model(dir.path());
    let zeros = model
        .tensors
        .iter()
        .position(|t| t.name() == "d.bias")
        .unwrap();
    let (sender, receiver) = mpsc::sync_channel(1 << 16);
    let scan = Scan::start(
        Arc::clone(&model),
        0..model.tensors.len(),
        ScanOptions {
            serve: true,
            ..ScanOptions::default()
        },
        sender,
    );
    let mut events = collect(&receiver);
    scan.prioritize(zeros, true);
    while let Ok(event) = receiver.recv_timeout(Duration::from_secs(60)) {
        let histogram = matches!(event, ScanEvent::Histogram { tensor, .. } if tensor == zeros);
        events.push(event);
        if histogram {
            break;
        }
    }
    let stats = events
        .iter()
        .filter(|e| matches!(e, ScanEvent::Stats { tensor, .. } if *tensor == zeros))
        .count();
    let all_zero = events
        .iter()
        .filter(|e| matches!(e, ScanEvent::Finding(f) if f.code == Code::ValuesAllZero))
        .count();
    assert_eq!((stats, all_zero), (2, 1));
}

#[test]
fn a_tensor_read_again_is_not_counted_again_in_the_progress() {
    let dir = tempfile::tempdir().unwrap();
    let model = big_model(dir.path());
    let large = (0..model.tensors.len())
        .max_by_key(|&t| model.tensors[t].info.byte_len())
        .unwrap();
    let (sender, receiver) = mpsc::sync_channel(1 << 16);
    let scan = Scan::start(
        Arc::clone(&model),
        0..model.tensors.len(),
        ScanOptions {
            serve: true,
            ..ScanOptions::default()
        },
        sender,
    );
    let events = collect(&receiver);
    let done = events
        .iter()
        .find_map(|e| match e {
            ScanEvent::Done(progress) => Some(*progress),
            _ => None,
        })
        .unwrap();
    assert_eq!(done.bytes_done, done.bytes_total);
    scan.prioritize(large, true);
    let mut read_again = false;
    while let Ok(event) = receiver.recv_timeout(Duration::from_secs(60)) {
        match event {
            ScanEvent::Stats { tensor, .. } if tensor == large => read_again = true,
            ScanEvent::Progress(progress) if read_again => {
                assert_eq!(
                    (progress.bytes_done, progress.tensors_done),
                    (done.bytes_done, done.tensors_done)
                );
                return;
            }
            _ => {}
        }
    }
    panic!("no progress after the tensor was read again");
}

#[test]
fn cancel_takes_effect_quickly_and_ends_with_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let model = big_model(dir.path());
    let (sender, receiver) = mpsc::sync_channel(1 << 16);
    let all: Vec<usize> = (0..model.tensors.len()).collect();
    let scan = Scan::start(
        Arc::clone(&model),
        all,
        ScanOptions {
            paused: true,
            ..ScanOptions::default()
        },
        sender,
    );
    scan.set_paused(false);
    let asked = Instant::now();
    scan.cancel();
    let events = collect(&receiver);
    assert!(
        asked.elapsed() < Duration::from_millis(500),
        "cancel took {:?}",
        asked.elapsed()
    );
    assert!(matches!(events.last(), Some(ScanEvent::Cancelled)));
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, ScanEvent::Done(_) | ScanEvent::Cancelled))
            .count(),
        1
    );
}

#[test]
fn a_file_truncated_during_the_scan_gives_findings_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let model = big_model(dir.path());
    let (sender, receiver) = mpsc::sync_channel(1 << 16);
    let all: Vec<usize> = (0..model.tensors.len()).collect();
    let scan = Scan::start(
        Arc::clone(&model),
        all,
        ScanOptions {
            paused: true,
            ..ScanOptions::default()
        },
        sender,
    );
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&model.shards[0].path)
        .unwrap();
    file.set_len(model.shards[0].file_len / 3).unwrap();
    scan.set_paused(false);
    let events = collect(&receiver);
    assert!(matches!(events.last(), Some(ScanEvent::Done(_))));
    let unreadable = events
        .iter()
        .filter(|e| matches!(e, ScanEvent::Failed { finding, .. } if finding.code == Code::DataUnreadable))
        .count();
    assert!(unreadable >= 2, "the tensors past the cut are reported");
}

#[test]
fn stui_stats_on_a_file_truncated_while_it_runs_reports_it_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let model = big_model(dir.path());
    let path = &model.shards[0].path;
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_stui"))
        .args(["stats", "--threads", "1"])
        .arg(path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(30));
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(model.shards[0].file_len / 3)
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    // Cut before stui opened it, the file is short from the start; cut during the scan, the
    // tensors past the cut cannot be read. Either is reported, nothing crashes.
    assert!(
        stdout.contains("data-unreadable") || stdout.contains("data-truncated"),
        "{stdout}"
    );
}

/// The scan goes through a file front to back unless asked for the order given; either way
/// every tensor is scanned once.
#[test]
fn the_scan_follows_the_file_or_the_order_given() {
    let dir = tempfile::tempdir().unwrap();
    let count = 40u64;
    let entries: Vec<String> = (0..count)
        .map(|i| {
            let at = 4 * (count - 1 - i);
            format!(
                r#""t.{i}":{{"dtype":"F32","shape":[1],"data_offsets":[{at},{}]}}"#,
                at + 4
            )
        })
        .collect();
    let header = format!("{{{}}}", entries.join(","));
    let bytes = crate::support::raw_file(&header, &[0; 4 * 40]);
    crate::support::write(dir.path(), "reversed.safetensors", &bytes);
    let model = Arc::new(Model::open(&dir.path().join("reversed.safetensors")).unwrap());
    let order = |order: ScanOrder, given: Vec<usize>| {
        let (sender, receiver) = mpsc::sync_channel(1 << 16);
        let options = ScanOptions {
            threads: Some(1),
            order,
            ..ScanOptions::default()
        };
        let scan = Scan::start(Arc::clone(&model), given, options, sender);
        let events = collect(&receiver);
        scan.wait();
        events
            .iter()
            .filter_map(|e| match e {
                ScanEvent::Stats { tensor, .. } => Some(*tensor),
                _ => None,
            })
            .collect::<Vec<usize>>()
    };
    let forward: Vec<usize> = (0..model.tensors.len()).collect();
    let back_to_front: Vec<usize> = forward.iter().rev().copied().collect();
    let name = |t: &usize| model.tensors[*t].name().to_owned();
    // The file holds `t.39` first.
    let in_file = order(ScanOrder::Files, forward.clone());
    assert_eq!(in_file.iter().map(name).next().as_deref(), Some("t.39"));
    assert_eq!(in_file, back_to_front);
    assert_eq!(
        order(ScanOrder::Files, back_to_front.clone()),
        back_to_front
    );
    assert_eq!(order(ScanOrder::Given, forward.clone()), forward);
}
