//! FP8 E4M3 weights in the compressed-tensors `float-quantized` layout: `P.weight` `F8_E4M3`
//! `[out, in]` and `P.weight_scale` in the source's float dtype, `[out, 1]` per channel
//! (`FP8_DYNAMIC`) or `[ceil(out/128), ceil(in/128)]` per 128x128 block (`FP8_BLOCK`).
//! `scale = absmax / 448`, `q = e4m3(clamp(x / scale, ±448))` rounded to nearest, ties to even;
//! `x' = q · scale`.

use super::scheme::{BLOCK, ErrorSums, Plan, Scheme, Streams, decode_scales, within_half};
use super::{encode_scale, stored_at_least};

/// The largest finite E4M3 value.
pub const MAX: f32 = 448.0;

/// `value` (at most 448 in magnitude) rounded to the nearest E4M3 value, ties to even, as its
/// byte. NaN becomes 0.
pub fn encode(value: f32) -> u8 {
    let sign = if value.is_sign_negative() { 0x80 } else { 0 };
    let magnitude = value.abs().min(MAX);
    if magnitude.is_nan() {
        return 0;
    }
    // Below the smallest normal (2^-6) the grid is even, in steps of 2^-9; its codes run on
    // into the normal ones (code 8 is 2^-6).
    if magnitude < 2f32.powi(-6) {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "from 0 to 8"
        )]
        let code = (magnitude * 512.0).round_ties_even() as u8;
        return sign | code;
    }
    // Round the f32 mantissa to 3 bits, ties to even, carrying into the exponent.
    let bits = magnitude.to_bits();
    let rounded = bits + 0x7_FFFF + ((bits >> 20) & 1);
    let exponent = (rounded >> 23).cast_signed() - 127 + 7;
    let mantissa = (rounded >> 20) & 7;
    #[expect(clippy::cast_possible_truncation, reason = "an exponent of 1 to 15")]
    let code = ((exponent.cast_unsigned() << 3) | mantissa) as u8;
    sign | code.min(0x7E)
}

/// The value of an E4M3 byte (0x7F and 0xFF, NaN, read as NaN).
pub fn decode(byte: u8) -> f32 {
    let sign = if byte & 0x80 == 0 { 1.0 } else { -1.0 };
    let exponent = i32::from((byte >> 3) & 15);
    let mantissa = f32::from(byte & 7);
    if byte & 0x7F == 0x7F {
        return f32::NAN;
    }
    sign * if exponent == 0 {
        mantissa * 2f32.powi(-9)
    } else {
        (1.0 + mantissa / 8.0) * 2f32.powi(exponent - 7)
    }
}

/// The grid's step around an E4M3 byte's value: the spacing of its binade.
pub fn step(byte: u8) -> f32 {
    let exponent = i32::from((byte >> 3) & 15);
    2f32.powi(exponent.max(1) - 10)
}

fn columns(plan: &Plan) -> usize {
    usize::try_from(plan.columns).unwrap_or(usize::MAX).max(1)
}

fn block_columns(plan: &Plan) -> usize {
    match plan.scheme {
        Scheme::Fp8Block => usize::try_from(BLOCK).unwrap_or(128),
        _ => columns(plan),
    }
}

fn block_rows(plan: &Plan) -> usize {
    match plan.scheme {
        Scheme::Fp8Block => usize::try_from(BLOCK).unwrap_or(128),
        _ => 1,
    }
}

/// Quantizes `row` with `scale` (as stored) into `out`.
fn quantize_with(row: &[f32], scale: f64, out: &mut Vec<u8>, sums: &mut ErrorSums) {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "scales are at most f32 here"
    )]
    let scale32 = scale as f32;
    for &x in row {
        let code = if scale32 == 0.0 || !scale32.is_finite() {
            0
        } else {
            encode((x / scale32).clamp(-MAX, MAX))
        };
        sums.add(
            x,
            f64::from(decode(code)) * scale,
            f64::from(step(code)) * scale,
        );
        out.push(code);
    }
}

pub fn quantize(plan: &Plan, values: &[f32], out: &mut Streams) -> ErrorSums {
    let columns = columns(plan);
    let (block_rows, block_columns) = (block_rows(plan), block_columns(plan));
    let mut sums = ErrorSums::default();
    for rows in values.chunks(columns * block_rows) {
        let scales: Vec<f64> = (0..columns.div_ceil(block_columns))
            .map(|block| {
                let absmax = rows
                    .chunks(columns)
                    .flat_map(|row| row.iter().skip(block * block_columns).take(block_columns))
                    .fold(0.0f32, |m, &x| m.max(x.abs()));
                stored_at_least(plan.scale_dtype, f64::from(absmax) / f64::from(MAX))
            })
            .collect();
        for &scale in &scales {
            encode_scale(plan.scale_dtype, scale, &mut out.scales);
        }
        for row in rows.chunks(columns) {
            for (block, &scale) in row.chunks(block_columns).zip(&scales) {
                quantize_with(block, scale, &mut out.codes, &mut sums);
            }
        }
    }
    sums
}

pub fn check(plan: &Plan, source: &[f32], written: &Streams) -> (ErrorSums, bool) {
    let columns = columns(plan);
    let (block_rows, block_columns) = (block_rows(plan), block_columns(plan));
    let scales = decode_scales(plan.scale_dtype, &written.scales);
    let blocks = columns.div_ceil(block_columns);
    let mut sums = ErrorSums::default();
    let mut within = true;
    for (row, (values, codes)) in source
        .chunks(columns)
        .zip(written.codes.chunks(columns))
        .enumerate()
    {
        for (column, (&x, &code)) in values.iter().zip(codes).enumerate() {
            let scale = scales[(row / block_rows) * blocks + column / block_columns];
            let back = f64::from(decode(code)) * scale;
            let step = f64::from(step(code)) * scale;
            sums.add(x, back, step);
            within &= within_half(x, back, step);
        }
    }
    (sums, within)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Dtype;

    #[test]
    fn every_byte_encodes_back_to_itself() {
        for byte in 0..=255u8 {
            if byte & 0x7F == 0x7F {
                continue;
            }
            let value = decode(byte);
            let back = encode(value);
            // -0 encodes as 0x80, its own byte.
            assert_eq!(back, byte, "{byte:#x} = {value}");
        }
        assert_eq!(decode(0x7E), 448.0);
        assert_eq!(decode(0x01), 2f32.powi(-9));
    }

    #[test]
    fn rounds_to_nearest_ties_to_even() {
        // Between 1.0 (0x38) and 1.125 (0x39): the tie goes to the even 1.0.
        assert_eq!(encode(1.0625), 0x38);
        assert_eq!(encode(1.07), 0x39);
        // Between 1.125 and 1.25 (0x3A): the tie goes to the even 1.25.
        assert_eq!(encode(1.1875), 0x3A);
        // Rounding carries into the exponent.
        assert_eq!(encode(1.97), 0x40);
        assert_eq!(encode(1000.0), 0x7E);
        assert_eq!(encode(-0.5), 0x80 | 0x30);
    }

    #[test]
    fn blocks_and_channels_read_back_within_half_a_step() {
        let source: Vec<f32> = (0..256 * 160)
            .map(|i| (((i * 7919) % 2000) as f32 - 1000.0) / 777.0)
            .collect();
        for scheme in [Scheme::Fp8Dynamic, Scheme::Fp8Block] {
            let plan = Plan::new(scheme, 128, [256, 160], Dtype::Bf16, 1.3);
            let mut out = Streams::default();
            let sums = quantize(&plan, &source, &mut out);
            let scales = if scheme == Scheme::Fp8Block {
                2 * 2
            } else {
                256
            };
            assert_eq!(out.scales.len(), scales * 2);
            let (checked, within) = check(&plan, &source, &out);
            assert!(within);
            assert!(sums.max_in_steps <= 0.5 + 1e-4);
            assert_eq!(checked.noise.to_bits(), sums.noise.to_bits());
        }
    }
}
