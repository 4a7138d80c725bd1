//! Numbers from tensor data: per-tensor statistics and histograms for every dtype, and the
//! findings they lead to. Pure computation over byte slices; reading and scheduling live in
//! [`crate::jobs`].

pub mod checks;
pub mod histogram;
pub mod moments;
pub mod values;

pub use histogram::{Histogram, HistogramBuilder};
pub use moments::Moments;

use crate::format::Dtype;

/// Statistics of a tensor's bytes (whole elements), computed in one pass.
pub fn moments_of(dtype: Dtype, bytes: &[u8]) -> Moments {
    let mut moments = Moments::EMPTY;
    values::feed(dtype, bytes, &mut moments);
    moments
}

impl values::Sink for Moments {
    fn f32s(&mut self, values: &[f32]) {
        self.merge(&Moments::of_f32(values));
    }

    fn f64s(&mut self, values: &[f64]) {
        self.merge(&Moments::of_f64(values));
    }
}
