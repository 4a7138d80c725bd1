//! Quantized weights read as the values they encode.

pub mod kernels;
