//! NVFP4 in the compressed-tensors `nvfp4-pack-quantized` layout:
//!
//! - `P.weight_packed` U8 `[out, in/2]`: FP4 E2M1 codes, element `2j` in the low nibble of byte
//!   `j`, `2j+1` in the high one (sign in bit 3, magnitude `[0, .5, 1, 1.5, 2, 3, 4, 6][n & 7]`);
//! - `P.weight_scale` `F8_E4M3` `[out, in/16]`: each group of 16's scale times the global scale;
//! - `P.weight_global_scale` F32 `[1]`: `448 · 6 / absmax`, which divides.
//!
//! `scale = e4m3(group absmax / 6 · global)`, `x' = fp4(x / (scale / global)) · scale / global`.
//! As the preset computes them, except that a group scale that FP8 rounded so far down that its
//! group's largest value would land more than half a step beyond 6 is rounded up instead.

use super::fp8;
use super::scheme::{ErrorSums, NVFP4_GROUP, Plan, Streams, within_half};

/// The magnitudes of the FP4 E2M1 codes 0 to 7.
pub const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// The global scale of a tensor whose largest magnitude is `absmax`: `448 · 6 / absmax` in
/// FP32, 1 when that is not finite (a tensor of zeros).
pub fn global_scale(absmax: f64) -> f32 {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the preset stores it as F32"
    )]
    let scale = (f64::from(fp8::MAX) * 6.0 / absmax) as f32;
    if scale.is_finite() && scale > 0.0 {
        scale
    } else {
        1.0
    }
}

/// `value` rounded to the nearest E2M1 value (clamped to ±6), ties to the even code.
pub fn encode(value: f32) -> u8 {
    let sign = if value.is_sign_negative() { 8 } else { 0 };
    let a = value.abs();
    let code = if a.is_nan() || a <= 0.25 {
        0
    } else if a < 0.75 {
        1
    } else if a <= 1.25 {
        2
    } else if a < 1.75 {
        3
    } else if a <= 2.5 {
        4
    } else if a < 3.5 {
        5
    } else if a <= 5.0 {
        6
    } else {
        7
    };
    sign | code
}

pub fn decode(code: u8) -> f32 {
    let magnitude = E2M1[usize::from(code & 7)];
    if code & 8 == 0 { magnitude } else { -magnitude }
}

/// The grid's step around a code's value: 0.5 below 2, 1 below 4, 2 above.
pub fn step(code: u8) -> f32 {
    match code & 7 {
        0..=3 => 0.5,
        4 | 5 => 1.0,
        _ => 2.0,
    }
}

fn columns(plan: &Plan) -> usize {
    usize::try_from(plan.columns).unwrap_or(usize::MAX).max(1)
}

/// A group's scale as stored (an E4M3 byte), and the scale its values are divided by: of the
/// two E4M3 values either side of `absmax / 6 · global`, the one that leaves the group the least
/// error while keeping its largest value within half a step of 6.
fn group_scale(plan: &Plan, group: &[f32]) -> (u8, f32) {
    let absmax = group.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
    let global = plan.global_scale;
    let ideal = (absmax / 6.0 * global).min(fp8::MAX);
    let nearest = fp8::encode(ideal);
    let other = if fp8::decode(nearest) > ideal {
        nearest.saturating_sub(1)
    } else {
        (nearest + 1).min(0x7E)
    };
    let within = |byte: u8| absmax == 0.0 || absmax / (fp8::decode(byte) / global) <= 7.0;
    let error = |byte: u8| {
        let scale = fp8::decode(byte) / global;
        if scale == 0.0 {
            return f64::INFINITY;
        }
        group
            .iter()
            .map(|&x| {
                let e = f64::from(x) - f64::from(decode(encode(x / scale))) * f64::from(scale);
                e * e
            })
            .sum::<f64>()
    };
    let mut best = None::<(f64, u8)>;
    for byte in [nearest, other] {
        if within(byte) {
            let e = error(byte);
            if best.is_none_or(|(least, _)| e < least) {
                best = Some((e, byte));
            }
        }
    }
    let byte = best.map_or_else(
        || {
            // Up one code at a time while the largest value would land past 6 and half a step.
            let mut byte = nearest;
            while byte < 0x7E && !within(byte) {
                byte += 1;
            }
            byte
        },
        |(_, byte)| byte,
    );
    (byte, fp8::decode(byte) / global)
}

pub fn quantize(plan: &Plan, values: &[f32], out: &mut Streams) -> ErrorSums {
    let columns = columns(plan);
    let group = usize::try_from(NVFP4_GROUP).unwrap_or(16);
    let mut sums = ErrorSums::default();
    for row in values.chunks(columns) {
        for values in row.chunks(group) {
            let (byte, scale) = group_scale(plan, values);
            out.scales.push(byte);
            let code = |x: f32| {
                if scale == 0.0 || !scale.is_finite() {
                    0
                } else {
                    encode(x / scale)
                }
            };
            for pair in values.chunks(2) {
                let low = code(pair[0]);
                let high = pair.get(1).map_or(0, |&x| code(x));
                for (&x, c) in pair.iter().zip([low, high]) {
                    sums.add(
                        x,
                        f64::from(decode(c)) * f64::from(scale),
                        f64::from(step(c)) * f64::from(scale),
                    );
                }
                out.codes.push(low | (high << 4));
            }
        }
    }
    sums
}

pub fn check(plan: &Plan, source: &[f32], written: &Streams) -> (ErrorSums, bool) {
    let columns = columns(plan);
    let group = usize::try_from(NVFP4_GROUP).unwrap_or(16);
    let groups = columns.div_ceil(group);
    let bytes = columns.div_ceil(2);
    let mut sums = ErrorSums::default();
    let mut within = true;
    for (row, values) in source.chunks(columns).enumerate() {
        for (column, &x) in values.iter().enumerate() {
            let byte = written.codes[row * bytes + column / 2];
            let code = if column % 2 == 0 {
                byte & 15
            } else {
                byte >> 4
            };
            let scale = f64::from(
                fp8::decode(written.scales[row * groups + column / group]) / plan.global_scale,
            );
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
    use crate::quantize::scheme::Scheme;

    #[test]
    fn codes_round_to_nearest() {
        for code in 0..16u8 {
            if code == 8 {
                continue;
            }
            assert_eq!(encode(decode(code)), code);
        }
        assert_eq!(encode(0.25), 0);
        assert_eq!(encode(0.75), 2);
        assert_eq!(encode(2.5), 4);
        assert_eq!(encode(5.0), 6);
        assert_eq!(encode(-100.0), 15);
    }

    #[test]
    fn reads_back_within_half_a_step_with_the_low_nibble_first() {
        let source: Vec<f32> = (0..8 * 64)
            .map(|i| (((i * 7919) % 2000) as f32 - 1000.0) / 1234.0)
            .collect();
        let absmax = source.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let plan = Plan::new(
            Scheme::Nvfp4A16,
            16,
            [8, 64],
            Dtype::Bf16,
            f64::from(absmax),
        );
        let mut out = Streams::default();
        let sums = quantize(&plan, &source, &mut out);
        assert_eq!((out.codes.len(), out.scales.len()), (8 * 32, 8 * 4));
        let (checked, within) = check(&plan, &source, &out);
        assert!(within);
        assert_eq!(checked.noise.to_bits(), sums.noise.to_bits());
        let scale = fp8::decode(out.scales[0]) / plan.global_scale;
        assert_eq!(out.codes[0] & 15, encode(source[0] / scale));
        assert_eq!(out.codes[0] >> 4, encode(source[1] / scale));
    }
}
