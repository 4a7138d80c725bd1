//! Histograms of a tensor's finite values: 64 equal bins over `[min, max]`, and counts by power
//! of two of the magnitude (the log view). Both need the range first, so they come from a second
//! pass over the data, made on demand. That pass bins `f32`, BF16 and F16 values in SIMD lanes
//! (`simd::tally`), with exactly the counts of the plain loop kept here for the rest.

use super::moments::BLOCK;
use super::simd::{self, Lanes};
use super::values::{Sink, widen};
use serde::Serialize;

/// Bins of the linear view.
pub const BINS: usize = 64;

/// Smallest and largest `floor(log2 |x|)` an `f64` can have.
const LOG2_LOW: i32 = -1075;
const LOG2_HIGH: i32 = 1024;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Histogram {
    /// The range the bins cover: the smallest and largest finite value.
    pub min: f64,
    pub max: f64,
    /// Finite values per bin; bin `i` covers `[edge i, edge i+1)`, the last bin includes `max`.
    pub counts: Vec<u64>,
    /// Nonzero finite values by `floor(log2 |x|)`, as `(exponent, count)`, ascending.
    pub log2: Vec<(i32, u64)>,
    /// Zeros, which the log view leaves out.
    pub zeros: u64,
}

impl Histogram {
    /// The `BINS + 1` bin edges.
    pub fn edges(&self) -> Vec<f64> {
        bin_edges(self.min, self.max).to_vec()
    }
}

fn bin_edges(min: f64, max: f64) -> [f64; BINS + 1] {
    std::array::from_fn(|i| {
        let t = i as f64 / BINS as f64;
        if i == BINS {
            max
        } else {
            min * (1.0 - t) + max * t
        }
    })
}

/// Builds a histogram over a known range from values fed to it.
#[derive(Clone, Debug)]
pub struct HistogramBuilder {
    bins: Bins,
    counts: Counts,
    /// What the SIMD kernel counted, made when first used.
    tally: Option<simd::Tally>,
}

/// Fewer values than this are binned by the plain loop rather than make a tally for them.
const LEAST_FOR_KERNEL: usize = 1024;

/// Where a value falls among the linear bins.
#[derive(Clone, Debug)]
struct Bins {
    min: f64,
    max: f64,
    /// `BINS / ((max - min) / 2)`, applied to halved offsets so that nothing can overflow.
    per_unit: f64,
    /// The edges the scaled estimate is corrected against, so counts agree with `edges()`.
    edges: [f64; BINS + 1],
    /// The bins as `f32` bounds for the SIMD kernel, when the edges rise (as they do unless
    /// the range is empty or rounding makes them fall back).
    bounds: Option<Box<simd::BinBounds>>,
}

#[derive(Clone, Debug)]
struct Counts {
    bins: [u64; BINS],
    log2: Vec<u64>,
    zeros: u64,
}

impl HistogramBuilder {
    /// A builder for finite values in `[min, max]`.
    pub fn new(min: f64, max: f64) -> Self {
        let half_span = max * 0.5 - min * 0.5;
        let per_unit = if half_span > 0.0 {
            BINS as f64 / half_span
        } else {
            0.0
        };
        let edges = bin_edges(min, max);
        HistogramBuilder {
            bins: Bins {
                min,
                max,
                per_unit,
                edges,
                bounds: (per_unit > 0.0)
                    .then(|| bounds_of(&edges, min, per_unit))
                    .flatten()
                    .map(Box::new),
            },
            counts: Counts {
                bins: [0; BINS],
                log2: vec![0; usize::try_from(LOG2_HIGH - LOG2_LOW + 1).unwrap_or(0)],
                zeros: 0,
            },
            tally: None,
        }
    }

    fn add(&mut self, x: f64) {
        self.counts.add(&self.bins, x);
    }

    /// Counts elements as stored with the SIMD kernel; `false`, having counted nothing, when
    /// the bins, the CPU or a short block do not call for it.
    fn tally(&mut self, lanes: Lanes, bytes: &[u8]) -> bool {
        let Some(bounds) = &self.bins.bounds else {
            return false;
        };
        if bytes.len() < LEAST_FOR_KERNEL * lanes.size() {
            return false;
        }
        let (bins, counts) = (&self.bins, &mut self.counts);
        let tally = self.tally.get_or_insert_with(simd::Tally::default);
        simd::tally(lanes, bytes, bounds, tally, &mut |x| {
            counts.add(bins, f64::from(x));
        })
    }

    pub fn merge(&mut self, other: &HistogramBuilder) {
        for (a, b) in self.counts.bins.iter_mut().zip(&other.counts.bins) {
            *a += b;
        }
        for (a, b) in self.counts.log2.iter_mut().zip(&other.counts.log2) {
            *a += b;
        }
        self.counts.zeros += other.counts.zeros;
        if let Some(tally) = &other.tally {
            self.counts.merge_tally(tally);
        }
    }

    pub fn finish(mut self) -> Histogram {
        if let Some(tally) = self.tally.take() {
            self.counts.merge_tally(&tally);
        }
        let log2 = self
            .counts
            .log2
            .iter()
            .enumerate()
            .filter(|&(_, &count)| count > 0)
            .map(|(slot, &count)| (i32::try_from(slot).unwrap_or(0) + LOG2_LOW, count))
            .collect();
        Histogram {
            min: self.bins.min,
            max: self.bins.max,
            counts: self.counts.bins.to_vec(),
            log2,
            zeros: self.counts.zeros,
        }
    }
}

/// The `f32` bounds of each bin: bin `b` holds the `x` with `edges[b] <= x < edges[b + 1]`,
/// which for an `f32` is `x >= ` the least `f32` not below `edges[b]`; `None` when the edges
/// do not rise, as the bin found by correcting the estimate then depends on the estimate.
fn bounds_of(edges: &[f64; BINS + 1], min: f64, per_unit: f64) -> Option<simd::BinBounds> {
    if edges.windows(2).any(|pair| {
        pair[0]
            .partial_cmp(&pair[1])
            .is_none_or(std::cmp::Ordering::is_gt)
    }) {
        return None;
    }
    let least_not_below = |edge: f64| {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "the nearest f32, moved up when below"
        )]
        let near = edge as f32;
        if f64::from(near) < edge {
            near.next_up()
        } else {
            near
        }
    };
    let low = std::array::from_fn(|b| {
        if b == 0 {
            f32::NEG_INFINITY
        } else {
            least_not_below(edges[b])
        }
    });
    let high = std::array::from_fn(|b| {
        if b == BINS - 1 {
            f32::INFINITY
        } else {
            least_not_below(edges[b + 1])
        }
    });
    #[expect(
        clippy::cast_possible_truncation,
        reason = "only the estimate uses them; the bounds decide"
    )]
    Some(simd::BinBounds {
        low,
        high,
        origin: (min * 0.5) as f32,
        per_unit: per_unit as f32,
    })
}

impl Bins {
    /// The bin of a finite `x`.
    fn of(&self, x: f64) -> usize {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "clamped to the bins"
        )]
        let mut bin =
            ((x * 0.5 - self.min * 0.5) * self.per_unit).clamp(0.0, (BINS - 1) as f64) as usize;
        // The estimate can be off by one next to an edge, where rounding decides.
        if self.per_unit > 0.0 {
            while bin > 0 && x < self.edges[bin] {
                bin -= 1;
            }
            while bin < BINS - 1 && x >= self.edges[bin + 1] {
                bin += 1;
            }
        }
        bin
    }
}

impl Counts {
    fn add(&mut self, bins: &Bins, x: f64) {
        if !x.is_finite() {
            return;
        }
        self.bins[bins.of(x)] += 1;
        if x == 0.0 {
            self.zeros += 1;
        } else {
            let exponent = floor_log2(x.abs());
            let slot = usize::try_from(exponent.clamp(LOG2_LOW, LOG2_HIGH) - LOG2_LOW).unwrap_or(0);
            self.log2[slot] += 1;
        }
    }

    /// Adds what the SIMD kernel counted: normal `f32` values by biased exponent `e`, whose
    /// `floor(log2 |x|)` is `e - 127`.
    fn merge_tally(&mut self, tally: &simd::Tally) {
        let mut exponents = [0; 256];
        tally.add_to(&mut self.bins, &mut exponents);
        self.zeros += exponents[0];
        for (biased, &count) in (1..).zip(&exponents[1..255]) {
            let slot = usize::try_from(biased - 127 - LOG2_LOW).unwrap_or(0);
            self.log2[slot] += count;
        }
    }
}

/// `floor(log2(x))` for a finite positive `x`, read from its exponent bits (subnormals by
/// `log2`).
fn floor_log2(x: f64) -> i32 {
    let biased = i32::try_from((x.to_bits() >> 52) & 0x7ff).unwrap_or(0);
    if biased == 0 {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "log2 of a subnormal lies in -1075..-1022"
        )]
        let exponent = x.log2().floor() as i32;
        exponent
    } else {
        biased - 1023
    }
}

impl Sink for HistogramBuilder {
    fn f32s(&mut self, values: &[f32]) {
        if !self.tally(Lanes::F32, bytemuck::cast_slice(values)) {
            for &x in values {
                self.add(f64::from(x));
            }
        }
    }

    fn f64s(&mut self, values: &[f64]) {
        for &x in values {
            self.add(x);
        }
    }

    fn halves(&mut self, lanes: Lanes, bytes: &[u8]) {
        if self.tally(lanes, bytes) {
            return;
        }
        let mut block = [0f32; BLOCK];
        for chunk in bytes.chunks(lanes.size() * BLOCK) {
            let values = &mut block[..chunk.len() / lanes.size()];
            widen(lanes, chunk, values);
            for &x in values.iter() {
                self.add(f64::from(x));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_cover_the_range_and_the_log_view_counts_powers_of_two() {
        let mut builder = HistogramBuilder::new(-1.0, 1.0);
        builder.f32s(&[-1.0, -0.99, 0.0, 0.25, 0.5, 1.0, f32::NAN, f32::INFINITY]);
        let histogram = builder.finish();
        assert_eq!(histogram.counts.iter().sum::<u64>(), 6);
        assert_eq!(histogram.counts[0], 2);
        assert_eq!(histogram.counts[32], 1, "zero sits at the start of bin 32");
        assert_eq!(histogram.counts[BINS - 1], 1, "max falls in the last bin");
        assert_eq!(histogram.log2, [(-2, 1), (-1, 2), (0, 2)]);
        assert_eq!(histogram.zeros, 1);
        let edges = histogram.edges();
        assert_eq!((edges.len(), edges[0], edges[BINS]), (BINS + 1, -1.0, 1.0));
    }

    use proptest::prelude::*;

    /// A builder that bins every value with the plain loop.
    fn plain(min: f64, max: f64) -> HistogramBuilder {
        let mut builder = HistogramBuilder::new(min, max);
        builder.bins.bounds = None;
        builder
    }

    /// Values that test the binning: uniform in the range, the edges and their `f32`
    /// neighbours, the ends, values past them, zeros, subnormals, NaN and the infinities.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "edges and random bits made into f32 values"
    )]
    fn awkward_values(min: f32, max: f32, count: usize, seed: u64) -> Vec<f32> {
        let edges = bin_edges(f64::from(min), f64::from(max));
        let mut state = seed | 1;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        (0..count)
            .map(|_| {
                let pick = next();
                let edge = edges[usize::try_from(pick >> 32).unwrap_or(0) % edges.len()] as f32;
                let unit = (pick >> 40) as f32 / (1u64 << 24) as f32;
                match pick % 16 {
                    0 => edge,
                    1 => edge.next_up(),
                    2 => edge.next_down(),
                    3 => [min, max, min.next_down(), max.next_up()]
                        [usize::try_from(pick >> 60).unwrap_or(0) % 4],
                    4 => [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -f32::NAN]
                        [usize::try_from(pick >> 60).unwrap_or(0) % 4],
                    5 => [0.0, -0.0, 1e-40, -3e-45][usize::try_from(pick >> 60).unwrap_or(0) % 4],
                    6 => f32::from_bits(u32::try_from(pick >> 32).unwrap_or(0)),
                    _ => min + (max - min) * unit,
                }
            })
            .collect()
    }

    fn ranges() -> impl Strategy<Value = (f32, f32)> {
        let endpoint = prop_oneof![
            -1.0f32..1.0,
            -1e-3f32..1e-3,
            Just(0.0f32),
            Just(-f32::MAX),
            Just(f32::MAX),
            Just(1e-40f32),
            any::<f32>().prop_filter("finite", |x| x.is_finite()),
        ];
        (endpoint.clone(), endpoint, 0u32..4).prop_map(|(a, b, ulps)| {
            let (low, high) = if a <= b { (a, b) } else { (b, a) };
            // Some ranges only a few ulps wide, where rounding decides most bins.
            if ulps > 0 {
                let mut high = low;
                for _ in 0..ulps * 20 {
                    high = high.next_up();
                }
                (low, high)
            } else {
                (low, high)
            }
        })
    }

    proptest! {
        #[test]
        fn lanes_bin_as_the_plain_loop_does((min, max) in ranges(), count in 0usize..6000, seed: u64) {
            let values = awkward_values(min, max, count, seed);
            let (low, high) = (f64::from(min), f64::from(max));
            // In two builders merged, as the scan's workers do.
            let (first, second) = values.split_at(values.len() / 3);
            let mut fast = HistogramBuilder::new(low, high);
            fast.f32s(first);
            let mut other = HistogramBuilder::new(low, high);
            other.f32s(second);
            fast.merge(&other);
            let mut reference = plain(low, high);
            for &x in &values {
                reference.add(f64::from(x));
            }
            let fast = fast.finish();
            prop_assert_eq!(&fast, &reference.finish());
            let finite = values.iter().filter(|x| x.is_finite()).count() as u64;
            prop_assert_eq!(fast.counts.iter().sum::<u64>(), finite);

            // The same values stored as BF16 and F16, read in place.
            for (lanes, bits) in [
                (Lanes::Bf16, values.iter().map(|x| (x.to_bits() >> 16) as u16).collect::<Vec<_>>()),
                (Lanes::F16, values.iter().map(|&x| half::f16::from_f32(x).to_bits()).collect()),
            ] {
                let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
                let mut fast = HistogramBuilder::new(low, high);
                fast.halves(lanes, &bytes);
                let mut reference = plain(low, high);
                for at in (0..bytes.len()).step_by(2) {
                    reference.add(f64::from(lanes.decode(&bytes, at)));
                }
                prop_assert_eq!(fast.finish(), reference.finish(), "{:?}", lanes);
            }
        }
    }

    #[test]
    fn the_kernel_takes_the_common_case() {
        let values = awkward_values(-0.05, 0.07, 100_000, 7);
        let builder = HistogramBuilder::new(-0.05, f64::from(0.07f32));
        let Some(bounds) = &builder.bins.bounds else {
            panic!("rising edges give bounds");
        };
        let mut tally = simd::Tally::default();
        let mut others = 0;
        let counted = simd::tally(
            Lanes::F32,
            bytemuck::cast_slice(&values),
            bounds,
            &mut tally,
            &mut |x| others += usize::from(x.is_normal()),
        );
        // Left over: the subnormals, and a few values next to the bounds.
        assert!(
            !counted || others < values.len() / 500,
            "{others} normal values left over"
        );
    }

    #[test]
    fn a_constant_tensor_fills_one_bin() {
        let mut builder = HistogramBuilder::new(3.0, 3.0);
        builder.f64s(&[3.0; 10]);
        assert_eq!(builder.finish().counts[0], 10);
    }
}
