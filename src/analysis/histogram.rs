//! Histograms of a tensor's finite values: 64 equal bins over `[min, max]`, and counts by power
//! of two of the magnitude (the log view). Both need the range first, so they come from a second
//! pass over the data, made on demand.

use super::values::Sink;
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
    min: f64,
    max: f64,
    /// `BINS / ((max - min) / 2)`, applied to halved offsets so that nothing can overflow.
    per_unit: f64,
    /// The edges the scaled estimate is corrected against, so counts agree with `edges()`.
    edges: [f64; BINS + 1],
    counts: [u64; BINS],
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
        HistogramBuilder {
            min,
            max,
            per_unit,
            edges: bin_edges(min, max),
            counts: [0; BINS],
            log2: vec![0; usize::try_from(LOG2_HIGH - LOG2_LOW + 1).unwrap_or(0)],
            zeros: 0,
        }
    }

    fn add(&mut self, x: f64) {
        if !x.is_finite() {
            return;
        }
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
        self.counts[bin] += 1;
        if x == 0.0 {
            self.zeros += 1;
        } else {
            let exponent = floor_log2(x.abs());
            let slot = usize::try_from(exponent.clamp(LOG2_LOW, LOG2_HIGH) - LOG2_LOW).unwrap_or(0);
            self.log2[slot] += 1;
        }
    }

    pub fn merge(&mut self, other: &HistogramBuilder) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        for (a, b) in self.log2.iter_mut().zip(&other.log2) {
            *a += b;
        }
        self.zeros += other.zeros;
    }

    pub fn finish(self) -> Histogram {
        let log2 = self
            .log2
            .iter()
            .enumerate()
            .filter(|&(_, &count)| count > 0)
            .map(|(slot, &count)| (i32::try_from(slot).unwrap_or(0) + LOG2_LOW, count))
            .collect();
        Histogram {
            min: self.min,
            max: self.max,
            counts: self.counts.to_vec(),
            log2,
            zeros: self.zeros,
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
        for &x in values {
            self.add(f64::from(x));
        }
    }

    fn f64s(&mut self, values: &[f64]) {
        for &x in values {
            self.add(x);
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

    #[test]
    fn a_constant_tensor_fills_one_bin() {
        let mut builder = HistogramBuilder::new(3.0, 3.0);
        builder.f64s(&[3.0; 10]);
        assert_eq!(builder.finish().counts[0], 10);
    }
}
