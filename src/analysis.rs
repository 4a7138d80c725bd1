//! Numbers from tensor data: per-tensor statistics and histograms for every dtype, and the
//! findings they lead to. Pure computation over byte slices; reading and scheduling live in
//! [`crate::jobs`].

pub mod checks;
pub mod histogram;
pub mod moments;
pub mod simd;
pub mod values;

pub use histogram::{Histogram, HistogramBuilder};
pub use moments::Moments;

use crate::format::Dtype;

/// Statistics of a tensor's bytes (whole elements), computed in one pass. Subnormals are those
/// of the tensor's own dtype.
pub fn moments_of(dtype: Dtype, bytes: &[u8]) -> Moments {
    let mut accumulator = Accumulator {
        total: Moments::EMPTY,
        smallest_normal: dtype.smallest_normal().unwrap_or(0.0),
    };
    values::feed(dtype, bytes, &mut accumulator);
    accumulator.total
}

struct Accumulator {
    total: Moments,
    smallest_normal: f64,
}

impl values::Sink for Accumulator {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the dtypes widened to f32 have their smallest normal in f32's range"
    )]
    fn f32s(&mut self, values: &[f32]) {
        let moments = Moments::of_f32_above(values, self.smallest_normal as f32);
        self.total.merge(&moments);
    }

    fn f64s(&mut self, values: &[f64]) {
        let moments = Moments::of_f64(values, self.smallest_normal);
        self.total.merge(&moments);
    }

    #[expect(
        clippy::cast_possible_truncation,
        reason = "BF16's and F16's smallest normals are f32 values"
    )]
    fn halves(&mut self, lanes: simd::Lanes, bytes: &[u8]) {
        let moments = Moments::of_halves(lanes, bytes, self.smallest_normal as f32);
        self.total.merge(&moments);
    }
}
