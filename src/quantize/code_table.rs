//! A 4-bit group's values looked up rather than worked out, for the comparison's measure of
//! W4A16 and `W4A16_ASYM` and for their saves' read-back check: a group's sixteen codes' values as
//! the loader has them (the code times the scale, rounded to the loader's type) fill one AVX-512
//! register, and each value's code picks its lane. That takes two steps where the product and
//! its rounding to BF16 took six.

use super::lanes::{Checked, Compared, Rounding, WIDE, divisor, round, wide_chunks};

/// Codes a table holds: those of 4 bits.
pub const CODES: usize = 16;

/// The loaded values of the codes `low` to `low + 15` (whole numbers) on the grid of step
/// `scale`, each in the lane of its code's low four bits (two's complement), rounded as
/// `ROUNDING` says.
#[inline(always)]
#[expect(
    clippy::inline_always,
    reason = "inlined into the kernels, whose copies for AVX2 and AVX-512 it must share"
)]
pub fn code_values<const ROUNDING: Rounding>(low: f32, scale: f32) -> [f32; WIDE] {
    const { assert!(WIDE == CODES) };
    #[expect(clippy::cast_possible_truncation, reason = "a code, within 2^7")]
    let low = low as i32;
    let mut products = [0f32; WIDE];
    for (lane, product) in products.iter_mut().enumerate() {
        #[expect(clippy::cast_possible_truncation, reason = "below 16")]
        #[expect(clippy::cast_possible_wrap, reason = "below 16")]
        let code = low + ((lane as i32 - low) & 15);
        #[expect(clippy::cast_precision_loss, reason = "a code, within 2^7")]
        let code = code as f32;
        *product = code * scale;
    }
    round::<ROUNDING>(&products)
}

/// Adds a row's values, each group's coded with its `(scale, zero)` of `grid` as the whole
/// numbers from `low` to `low + 15`, to `tally`: as `int_packed::tally_row` adds them, each value's
/// code its quotient by the scale rounded to the nearest whole number (ties to even, as the
/// conversion rounds) and clamped, but its value taken from the group's [`code_values`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub fn tally_row_avx512<const ROUNDING: Rounding>(
    row: &[f32],
    group: usize,
    grid: &[(f32, f32)],
    low: f32,
    tally: &mut Compared,
) {
    use core::arch::x86_64::{
        __m512, _mm512_cvtps_epi32, _mm512_div_ps, _mm512_max_ps, _mm512_min_ps,
        _mm512_permutexvar_ps, _mm512_set1_ps,
    };
    #[expect(clippy::cast_precision_loss, reason = "15")]
    let span = (CODES - 1) as f32;
    let mut local = *tally;
    for (values, &(scale, zero)) in row.chunks(group).zip(grid) {
        let (low, high) = (low - zero, low + span - zero);
        let table: __m512 = bytemuck::cast(code_values::<ROUNDING>(low, scale));
        let by = _mm512_set1_ps(divisor(scale));
        let (low, high) = (_mm512_set1_ps(low), _mm512_set1_ps(high));
        for xs in wide_chunks(values) {
            let quotients = _mm512_div_ps(bytemuck::cast(xs), by);
            // Clamped before the rounding rather than after: the ends are whole numbers.
            let clamped = _mm512_min_ps(_mm512_max_ps(quotients, low), high);
            let loaded = _mm512_permutexvar_ps(_mm512_cvtps_epi32(clamped), table);
            local.add_loaded(&xs, &bytemuck::cast(loaded));
        }
    }
    *tally = local;
}

/// Adds a row's values to `checked`, each group's from its codes (`0` to `15`, one a byte) under
/// its `(scale, offset)` of `grid`, as `int_packed::check_row_in_f32` adds them (each code's value
/// `(code - offset) · scale`, then rounded to the loader's type), both values looked up in the
/// group's tables. A group whose scale is 0 is left out, as there.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub fn check_row_avx512<const ROUNDING: Rounding>(
    values: &[f32],
    codes: &[u8],
    group: usize,
    grid: &[(f32, f32)],
    checked: &mut Checked,
) {
    use core::arch::x86_64::{__m128i, __m512, _mm512_cvtepu8_epi32, _mm512_permutexvar_ps};
    let mut local = *checked;
    for ((values, codes), &(scale, offset)) in
        values.chunks(group).zip(codes.chunks(group)).zip(grid)
    {
        if scale == 0.0 {
            continue;
        }
        let mut on_grid = [0f32; WIDE];
        for (code, back) in (0u8..).zip(&mut on_grid) {
            *back = (f32::from(code) - offset) * scale;
        }
        let loaded = round::<ROUNDING>(&on_grid);
        let (backs, loads): (__m512, __m512) = (bytemuck::cast(on_grid), bytemuck::cast(loaded));
        let (steps, per_steps) = ([scale; WIDE], [1.0; WIDE]);
        let (chunks, rest) = values.as_chunks::<WIDE>();
        let (code_chunks, code_rest) = codes.as_chunks::<WIDE>();
        for (xs, cs) in chunks.iter().zip(code_chunks) {
            let lanes = _mm512_cvtepu8_epi32(bytemuck::cast::<[u8; WIDE], __m128i>(*cs));
            let back = bytemuck::cast(_mm512_permutexvar_ps(lanes, backs));
            let load = bytemuck::cast(_mm512_permutexvar_ps(lanes, loads));
            local.add_loaded(xs, &back, &load, &steps, &per_steps);
        }
        if !rest.is_empty() {
            // Padded with zeros coming back as zeros.
            let (mut xs, mut back, mut load) = ([0f32; WIDE], [0f32; WIDE], [0f32; WIDE]);
            for (lane, (&x, &code)) in rest.iter().zip(code_rest).enumerate() {
                let code = usize::from(code & 15);
                (xs[lane], back[lane], load[lane]) = (x, on_grid[code], loaded[code]);
            }
            local.add_loaded(&xs, &back, &load, &steps, &per_steps);
        }
        local.end_group(1.0 / f64::from(scale));
    }
    *checked = local;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quantize::lanes::{AS_IS, TO_BF16};

    #[test]
    fn each_code_sits_in_the_lane_of_its_low_bits() {
        for low in [-8i16, -3, 0, -15] {
            let values = code_values::<AS_IS>(f32::from(low), 0.5);
            for code in low..low + 16 {
                let lane = usize::try_from(code.rem_euclid(16)).unwrap();
                assert_eq!(values[lane], f32::from(code) * 0.5);
            }
        }
        let bf16 = code_values::<TO_BF16>(-8.0, 0.3);
        assert_eq!(bf16[7], half::bf16::from_f32(7.0 * 0.3).to_f32());
        assert_eq!(bf16[8], half::bf16::from_f32(-8.0 * 0.3).to_f32());
    }
}
