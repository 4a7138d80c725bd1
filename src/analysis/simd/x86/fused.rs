//! Statistics taken straight from a quantized weight's codes: each load decodes `2 * WIDTH`
//! values in registers (four-bit codes looked up in their group's table of 16 values, E4M3
//! codes decoded and multiplied by their group's scale, then rounded as the producer rounds)
//! and goes into the same lanes as [`super::block`]'s, so no dequantized value is written to
//! memory. The values are the ones the dequantization gives, bit for bit: the tables are made by
//! it, and the E4M3 path does its operations in its order.

use super::{Isa, Moments, SumsAbout};
use crate::analysis::moments::FiniteBlock;
use crate::analysis::simd::Rounding;
use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};

/// What an E4M3 code's fields read as an `f32` are multiplied by to be its value: 2^120.
const REBIAS: f32 = f32::from_bits((127 + 120) << 23);

/// How far ahead of the pass to ask for codes, in bytes.
const PREFETCH: usize = 2048;

/// Loads the first pass sums in `f32` lanes before adding them to its `f64` sums: a value's
/// `f64` widening and additions cost as much as the rest of the pass, and eight `f32`
/// additions a lane lose at most 2^-21 of the lane's magnitude.
const PARTIAL: u32 = 8;

/// Codes in groups of equal length, each decoded with its own parameters.
pub trait Stream {
    /// A group's parameters, held in registers.
    type Group<I: Isa>: Copy;
    fn codes(&self) -> &[u8];
    fn groups(&self) -> usize;
    /// Bytes each load reads.
    fn step<I: Isa>() -> usize;
    /// Values each byte holds.
    const PER_BYTE: usize;
    /// # Safety
    /// The caller enables the instruction set.
    unsafe fn group<I: Isa>(&self, group: usize) -> Self::Group<I>;
    /// The `2 * WIDTH` values of the codes at `at`.
    ///
    /// # Safety
    /// The caller enables the instruction set and keeps `at + step` inside the codes.
    unsafe fn load<I: Isa>(&self, group: &Self::Group<I>, at: usize) -> [I::Ps; 2];
    /// Whether the lanes can take these codes and parameters (else the caller dequantizes).
    fn usable(&self) -> bool {
        true
    }
    /// How many values are zero, when the codes tell without the lanes and no value is
    /// subnormal.
    fn zeros(&self) -> Option<u64> {
        None
    }
}

/// Packed four-bit codes and a table of 16 values per group.
pub struct Nibbles<'a> {
    pub codes: &'a [u8],
    pub tables: &'a [[f32; 16]],
}

impl Stream for Nibbles<'_> {
    type Group<I: Isa> = I::Table16;
    const PER_BYTE: usize = 2;
    fn codes(&self) -> &[u8] {
        self.codes
    }
    fn groups(&self) -> usize {
        self.tables.len()
    }
    fn step<I: Isa>() -> usize {
        I::WIDTH
    }
    #[inline(always)]
    unsafe fn group<I: Isa>(&self, group: usize) -> I::Table16 {
        // SAFETY: passed on to the caller.
        unsafe { I::table16(&self.tables[group]) }
    }
    #[inline(always)]
    unsafe fn load<I: Isa>(&self, table: &I::Table16, at: usize) -> [I::Ps; 2] {
        // SAFETY: passed on to the caller.
        unsafe {
            let [low, high] = I::load_nibbles(self.codes, at);
            [I::lookup16(table, low), I::lookup16(table, high)]
        }
    }
    /// When every table has no subnormal value and its one zero at the same code (as a
    /// symmetric integer scheme's tables have), the zeros are the codes equal to it.
    #[inline(always)]
    fn zeros(&self) -> Option<u64> {
        let first = small_values(self.tables.first()?);
        let (zeros, below) = first;
        if !(zeros == below && zeros.is_power_of_two()) {
            return None;
        }
        for table in &self.tables[1..] {
            if small_values(table) != first {
                return None;
            }
        }
        let code = u8::try_from(zeros.trailing_zeros()).ok()?;
        let mut count = 0u32;
        for &b in self.codes {
            count += u32::from(b & 15 == code) + u32::from(b >> 4 == code);
        }
        Some(u64::from(count))
    }
}

/// The codes of a table's zeros and of its magnitudes below `f32`'s normal range (zeros
/// included), as bits.
#[inline(always)]
fn small_values(table: &[f32; 16]) -> (u32, u32) {
    let (mut zeros, mut below) = (0, 0);
    for (k, x) in table.iter().enumerate() {
        let bits = x.to_bits() & 0x7fff_ffff;
        zeros |= u32::from(bits == 0) << k;
        below |= u32::from(bits < f32::MIN_POSITIVE.to_bits()) << k;
    }
    (zeros, below)
}

/// E4M3 codes and a scale per group; each value `round(e4m3(c) · scale)`.
pub struct E4m3<'a, const ROUND: u8> {
    pub codes: &'a [u8],
    pub scales: &'a [f32],
}

/// `ROUND` of [`E4m3`] for each [`Rounding`].
pub const fn round_code(rounding: Rounding) -> u8 {
    match rounding {
        Rounding::None => 0,
        Rounding::Bf16 => 1,
        Rounding::F16 => 2,
    }
}

impl<const ROUND: u8> Stream for E4m3<'_, ROUND> {
    type Group<I: Isa> = I::Ps;
    const PER_BYTE: usize = 1;
    fn codes(&self) -> &[u8] {
        self.codes
    }
    fn groups(&self) -> usize {
        self.scales.len()
    }
    fn step<I: Isa>() -> usize {
        2 * I::WIDTH
    }
    /// The scale times the decoding's 2^120, so that one product decodes and scales: the same
    /// product, rounded once, as long as it does not overflow (`usable` checks).
    #[inline(always)]
    unsafe fn group<I: Isa>(&self, group: usize) -> I::Ps {
        // SAFETY: passed on to the caller.
        unsafe { I::splat_ps(self.scales[group] * REBIAS) }
    }
    #[inline(always)]
    unsafe fn load<I: Isa>(&self, scale: &I::Ps, at: usize) -> [I::Ps; 2] {
        // SAFETY: passed on to the caller.
        unsafe {
            let [a, b] = I::load_i8(self.codes, at);
            let (a, b) = (
                I::mul_ps(I::e4m3_fields(a), *scale),
                I::mul_ps(I::e4m3_fields(b), *scale),
            );
            match ROUND {
                1 => [I::round_bf16(a), I::round_bf16(b)],
                2 => [I::round_f16(a), I::round_f16(b)],
                _ => [a, b],
            }
        }
    }
    /// No NaN code (the lanes decode none) and every scale finite, so that no value is NaN,
    /// and below 2^7 in magnitude, so that it times 2^120 is finite.
    #[inline(always)]
    fn usable(&self) -> bool {
        let mut nan_code = false;
        for &c in self.codes {
            nan_code |= c & 0x7f == 0x7f;
        }
        let mut scales_fit = true;
        for &scale in self.scales {
            scales_fit &= scale.abs() < 128.0;
        }
        !nan_code && scales_fit
    }
    /// When no product can fall below `f32`'s normal range (every scale zero or at least
    /// 2^-116, as the least nonzero E4M3 magnitude is 2^-9) or round to zero (not in F16,
    /// whose range is narrower), a value is zero where its code or its scale is.
    #[inline(always)]
    fn zeros(&self) -> Option<u64> {
        let floor = f32::from_bits((127 - 116) << 23);
        let mut fit = ROUND != 2;
        for &scale in self.scales {
            fit &= scale == 0.0 || scale.abs() >= floor;
        }
        if !fit {
            return None;
        }
        // A zero code's seven magnitude bits are zero: nothing is left once its sign is
        // shifted out.
        let mut zeros = 0u32;
        for &c in self.codes {
            zeros += u32::from(c << 1 == 0);
        }
        // A zero scale's group is all zeros, its zero codes counted already.
        let group = self.codes.len() / self.scales.len();
        let mut zeros = u64::from(zeros);
        for (g, &scale) in self.scales.iter().enumerate() {
            if scale == 0.0 {
                let codes = &self.codes[g * group..(g + 1) * group];
                let counted = codes.iter().filter(|&&c| c << 1 == 0).count();
                zeros += (group - counted) as u64;
            }
        }
        Some(zeros)
    }
}

/// Whether the groups of `stream` split into whole loads (and there is something to read), and
/// its counts fit the lanes' `u32`s.
pub fn fits<I: Isa, S: Stream>(stream: &S) -> bool {
    let (codes, groups) = (stream.codes().len(), stream.groups());
    groups > 0
        && codes.is_multiple_of(groups)
        && (codes / groups).is_multiple_of(S::step::<I>())
        && codes < (u32::MAX / 2) as usize
}

fn step_of<I: Isa, S: Stream>(_: &S) -> usize {
    S::step::<I>()
}

/// Runs `$body` on each load's values `$x` (one vector at a time, `$v` its place in the load) of
/// `$stream`, in order.
macro_rules! each_value {
    ($I:ty, $stream:expr, $prefetch:expr, |$v:ident, $x:ident| $body:block) => {{
        let stream = $stream;
        let codes = stream.codes();
        let group_bytes = codes.len() / stream.groups();
        let step = step_of::<$I, _>(stream);
        for g in 0..stream.groups() {
            let parameters = stream.group::<$I>(g);
            let start = g * group_bytes;
            if $prefetch {
                for line in (start.next_multiple_of(64)..start + group_bytes).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(
                        codes.as_ptr().wrapping_add(line + PREFETCH).cast(),
                    );
                }
            }
            for at in (start..start + group_bytes).step_by(step) {
                for ($v, $x) in stream.load::<$I>(&parameters, at).into_iter().enumerate() $body
            }
        }
    }};
}

/// Statistics of the stream's values when all of them are finite; `None` when one is not.
/// The first pass sums in `f32` lanes, [`PARTIAL`] loads at a time, then in `f64`; when those
/// sums cancel, a second pass takes [`super::block`]'s `f64` sums about the least value (one of
/// the values). Zeros and subnormals are counted in the first pass.
///
/// # Safety
/// The caller enables the instruction set and checked [`fits`].
#[inline(always)]
pub unsafe fn moments<I: Isa, S: Stream>(stream: &S) -> Option<Moments> {
    let count = stream.codes().len() * S::PER_BYTE;
    if count == 0 {
        return None;
    }
    if !stream.usable() {
        return None;
    }
    // SAFETY: passed on.
    let (zeros, subnormals, low, high, sum, squares) = unsafe {
        match stream.zeros() {
            Some(zeros) => {
                let (_, _, low, high, sum, squares) = first_pass::<I, S, false>(stream);
                (zeros, 0, low, high, sum, squares)
            }
            None => first_pass::<I, S, true>(stream),
        }
    };
    // Not finite with a NaN or an infinity, or with values whose squares pass `f32::MAX` in the
    // partial sums (beyond 2^63 in magnitude): left to the caller.
    if !(sum.is_finite() && squares.is_finite()) {
        return None;
    }
    let block = FiniteBlock {
        count: count as u64,
        zeros,
        subnormals,
        min: f64::from(low),
        max: f64::from(high),
    };
    let n = count as f64;
    // The squares cancel: more than 8 of the variance's bits would be lost (the first pass
    // sums in `f32` for `PARTIAL` loads at a time, so its sums have fewer bits to lose).
    if squares > (squares - sum * sum / n) * 256.0 {
        let offset = f64::from(low);
        // SAFETY: as above.
        let (sum, squares) = unsafe {
            let mut sums = SumsAbout::<I>::new(offset);
            each_value!(I, stream, false, |_v, x| {
                sums.add(x);
            });
            sums.totals()
        };
        return Some(block.with_sums_about(offset, sum, squares));
    }
    Some(block.with_sums_about(0.0, sum, squares))
}

/// The first pass: zeros and subnormals counted in lanes (when `COUNT`), the range, and the
/// sums of the values and of their squares.
///
/// # Safety
/// As for [`moments`].
#[inline(always)]
unsafe fn first_pass<I: Isa, S: Stream, const COUNT: bool>(
    stream: &S,
) -> (u64, u64, f32, f32, f64, f64) {
    // SAFETY: the loads stay inside the codes (`fits`); the caller enables the instructions.
    unsafe {
        let floor = I::splat_int(f32::MIN_POSITIVE.to_bits());
        let mut zeros = I::splat_int(0);
        let mut below = I::splat_int(0);
        let mut low = I::splat_ps(f32::INFINITY);
        let mut high = I::splat_ps(f32::NEG_INFINITY);
        // Four sums of each kind, so that the additions do not wait on each other.
        let mut s1 = [I::splat_pd(0.0); 4];
        let mut s2 = [I::splat_pd(0.0); 4];
        let mut p1 = [I::splat_ps(0.0); 2];
        let mut p2 = [I::splat_ps(0.0); 2];
        let mut pending = 0u32;
        // Written as a macro, not a closure, which would not take the instruction set.
        macro_rules! flush {
            () => {
                for (sums, partial) in [(&mut s1, &p1), (&mut s2, &p2)] {
                    for v in 0..2 {
                        let [a, b] = I::widen(partial[v]);
                        sums[2 * v] = I::add_pd(sums[2 * v], a);
                        sums[2 * v + 1] = I::add_pd(sums[2 * v + 1], b);
                    }
                }
            };
        }
        each_value!(I, stream, true, |v, x| {
            if COUNT {
                let bits = I::magnitude_bits(x);
                zeros = I::count_zero(zeros, bits);
                below = I::count_below(below, bits, floor);
            }
            low = I::min_ps(low, x);
            high = I::max_ps(high, x);
            p1[v] = I::add_ps(p1[v], x);
            p2[v] = I::fmadd_ps(x, x, p2[v]);
            if v == 1 {
                pending += 1;
                if pending == PARTIAL {
                    flush!();
                    p1 = [I::splat_ps(0.0); 2];
                    p2 = [I::splat_ps(0.0); 2];
                    pending = 0;
                }
            }
        });
        flush!();
        let zeros = I::sum_u32(zeros);
        let total = |s: [I::Pd; 4]| {
            (I::sum_pd(s[0]) + I::sum_pd(s[1])) + (I::sum_pd(s[2]) + I::sum_pd(s[3]))
        };
        (
            zeros,
            I::sum_u32(below) - zeros,
            I::least_ps(low),
            I::most_ps(high),
            total(s1),
            total(s2),
        )
    }
}
