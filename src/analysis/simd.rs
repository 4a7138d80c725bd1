//! Hand-written SIMD kernels for the common block: every value finite (as in the bulk of any
//! weight tensor). One pass over a block of statistics gives its range, the sums of its values
//! and their squares in `f64` (where NaN and the infinities show up as sums that are not
//! finite), and the least magnitude's bit pattern, which tells whether a zero or a subnormal is
//! there; those are then counted in a second pass over the block while it sits in L1. The diff's
//! kernel sums differences, squares and products of pairs the same way. A block holding NaN or an
//! infinity returns `None` and goes to the general kernels, which count every class.
//!
//! The histogram's kernel estimates each value's bin in lanes, corrects it by one against the
//! bins' bounds (looked up in registers with AVX-512, gathered with AVX2) and checks the result,
//! then counts bins and exponents in four interleaved tables of `u32`; a value it cannot place
//! for certain (next to a bound the estimate missed by more than one, a subnormal) is handed
//! back to be placed one by one.
//!
//! The kernels are written once over a trait of the few vector operations they need, and
//! compiled for AVX-512 and for AVX2; the one the CPU has is chosen at run time (the release
//! binary targets plain x86-64). BF16 and F16 are widened inside the kernel (a shift and a mask;
//! the F16C conversion), never through a buffer. The next 4 KiB are prefetched as the pass goes:
//! without that the loop waits on memory between its loads.

#![expect(
    unsafe_code,
    reason = "SIMD intrinsics: each kernel runs only on a CPU that has its features, and every load stays inside the slice it reads"
)]

use super::histogram::BINS;
use super::moments::Moments;

/// How a block's elements are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lanes {
    F32,
    Bf16,
    F16,
}

impl Lanes {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Lanes::F32 => 4,
            Lanes::Bf16 | Lanes::F16 => 2,
        }
    }

    /// The element starting at `bytes[at..]`.
    pub fn decode(self, bytes: &[u8], at: usize) -> f32 {
        match self {
            Lanes::F32 => {
                f32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
            }
            Lanes::Bf16 => {
                f32::from_bits(u32::from(u16::from_le_bytes([bytes[at], bytes[at + 1]])) << 16)
            }
            Lanes::F16 => half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32(),
        }
    }
}

/// Statistics of the elements in `bytes` (little-endian, whole elements) when all of them are
/// finite, counting as subnormal the nonzero magnitudes below `smallest_normal`; `None` when one
/// is NaN or infinite, or when the CPU lacks the instructions.
pub fn finite_block(lanes: Lanes, bytes: &[u8], smallest_normal: f32) -> Option<Moments> {
    #[cfg(target_arch = "x86_64")]
    return x86::finite_block(lanes, bytes, smallest_normal);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (lanes, bytes, smallest_normal);
        None
    }
}

/// How each value of a fused pass is rounded after its product, as its producer rounds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rounding {
    None,
    Bf16,
    F16,
}

/// Statistics of the values of packed four-bit codes (`codes`, each byte's low half first),
/// each run of `codes.len() / tables.len()` bytes standing for the values of its own table, as
/// [`finite_block`] gives them for those values; `None` when a value is NaN or infinite, when the
/// runs do not split into the kernel's loads (of 8 or 16 bytes), or when the CPU lacks the
/// instructions.
pub fn nibble_moments(codes: &[u8], tables: &[[f32; 16]]) -> Option<Moments> {
    #[cfg(target_arch = "x86_64")]
    return x86::nibble_moments_with(x86::kernel()?, codes, tables);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (codes, tables);
        None
    }
}

/// Statistics of `rounding(e4m3(c) · scale)` over E4M3 codes, each run of
/// `codes.len() / scales.len()` codes with its own scale; `None` as for [`nibble_moments`]
/// (loads of 16 or 32 bytes).
pub fn e4m3_moments(codes: &[u8], scales: &[f32], rounding: Rounding) -> Option<Moments> {
    #[cfg(target_arch = "x86_64")]
    return x86::e4m3_moments_with(x86::kernel()?, codes, scales, rounding);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (codes, scales, rounding);
        None
    }
}

/// Sums over pairs of values `(x, y)` from two tensors, for the size of their difference.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PairSums {
    pub diff_sq: f64,
    pub a_sq: f64,
    pub b_sq: f64,
    pub dot: f64,
    pub max_abs: f64,
    /// Pairs whose values differ as numbers.
    pub changed: u64,
}

/// [`PairSums`] of `a` and `b` (of the same length) when every value in both is finite; `None`
/// when one is not, or when the CPU lacks the instructions.
pub fn finite_pairs(a: &[f32], b: &[f32]) -> Option<PairSums> {
    #[cfg(target_arch = "x86_64")]
    return x86::finite_pairs(a, b);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (a, b);
        None
    }
}

/// A histogram's linear bins as the kernel reads them. Bin `b` holds the `f32` values `x` with
/// `low[b] <= x < high[b]` (`low[0]` is −∞ and `high[BINS - 1]` is +∞, so the first and last bins
/// take whatever lies beyond), and `(x / 2 - origin) * per_unit` estimates `b`.
#[derive(Clone, Debug, PartialEq)]
pub struct BinBounds {
    pub low: [f32; BINS],
    pub high: [f32; BINS],
    pub origin: f32,
    pub per_unit: f32,
}

/// What the histogram's kernel counted, by bin and biased `f32` exponent together, so that each
/// value costs one increment: slot `bin << 8 | exponent`, exponent 0 holding zeros and 1 to 254
/// normal values (255, never a finite value's, takes the lanes not counted). Few slots are
/// used, so the ones in use stay in L1. `u32` counts, added into `u64` totals before they could
/// overflow.
#[derive(Clone, Debug, PartialEq)]
pub struct Tally {
    slots: Box<[u32]>,
    /// Values counted in the slots since they were last emptied.
    pending: u64,
    bins: [u64; BINS],
    exponents: [u64; 256],
}

const TALLY_SLOTS: usize = BINS << 8;

impl Default for Tally {
    fn default() -> Self {
        Tally {
            slots: vec![0; TALLY_SLOTS].into_boxed_slice(),
            pending: 0,
            bins: [0; BINS],
            exponents: [0; 256],
        }
    }
}

impl Tally {
    /// Adds the counts to finite values per bin and zeros (0) and normal values (1 to 254) by
    /// biased exponent.
    pub fn add_to(&self, bins: &mut [u64; BINS], exponents: &mut [u64; 256]) {
        for (total, own) in bins.iter_mut().zip(&self.bins) {
            *total += own;
        }
        for (total, own) in exponents.iter_mut().zip(&self.exponents) {
            *total += own;
        }
        for (bin, row) in self.slots.chunks_exact(256).enumerate() {
            for (exponent, &count) in row[..255].iter().enumerate() {
                bins[bin] += u64::from(count);
                exponents[exponent] += u64::from(count);
            }
        }
    }

    /// Makes room for `count` more values in the slots.
    fn reserve(&mut self, count: u64) {
        if self.pending + count > u64::from(u32::MAX) {
            let slots = std::mem::replace(&mut self.slots, vec![0; TALLY_SLOTS].into_boxed_slice());
            let emptied = Tally {
                slots,
                pending: 0,
                bins: [0; BINS],
                exponents: [0; 256],
            };
            emptied.add_to(&mut self.bins, &mut self.exponents);
            self.pending = 0;
        }
        self.pending += count;
    }
}

/// Counts the elements in `bytes` (little-endian, whole elements) into `tally`, leaving out NaN
/// and the infinities, and passes to `odd` the values it leaves to the caller: finite values it
/// cannot place for certain, and those after the last whole vector (which may be NaN or
/// infinite); `false`, having done nothing, when the CPU lacks the instructions.
pub fn tally(
    lanes: Lanes,
    bytes: &[u8],
    bounds: &BinBounds,
    tally: &mut Tally,
    odd: &mut dyn FnMut(f32),
) -> bool {
    #[cfg(target_arch = "x86_64")]
    return x86::kernel()
        .is_some_and(|kernel| x86::tally_with(kernel, lanes, bytes, bounds, tally, odd));
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (lanes, bytes, bounds, tally, odd);
        false
    }
}

/// The instruction sets the kernel is compiled for, in the order they are preferred.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Avx512,
    Avx2,
}

/// The kernel this CPU runs, if any.
pub fn kernel() -> Option<Kernel> {
    #[cfg(target_arch = "x86_64")]
    return x86::kernel();
    #[cfg(not(target_arch = "x86_64"))]
    None
}

#[cfg(target_arch = "x86_64")]
#[expect(
    clippy::inline_always,
    reason = "the kernel and its operations must be inlined into the functions that enable the instruction sets to be compiled with them"
)]
#[expect(
    clippy::cast_ptr_alignment,
    reason = "the unaligned loads take a pointer of the vector's type at any alignment"
)]
mod x86 {
    use super::{BINS, BinBounds, Kernel, Lanes, Moments, PairSums, Rounding, TALLY_SLOTS, Tally};
    use crate::analysis::moments::FiniteBlock;
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};

    /// The high element of a 32-bit lane holding two 16-bit ones (the bits of `0xffff_0000`).
    const HIGH_HALF: i32 = -65_536;

    /// An f32's sign and the seven bits below its exponent's top bit, where an E4M3 code's
    /// fields go (the bits of `0x87f0_0000`).
    const E4M3_FIELDS: i32 = -2_014_314_496;

    /// How far ahead of the pass to ask for data, in bytes.
    const PREFETCH: usize = 4096;

    pub fn kernel() -> Option<Kernel> {
        [Kernel::Avx512, Kernel::Avx2]
            .into_iter()
            .find(|&kernel| runs(kernel))
    }

    /// Whether the CPU has the instruction sets of `kernel`.
    pub fn runs(kernel: Kernel) -> bool {
        match kernel {
            Kernel::Avx512 => {
                is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
            }
            Kernel::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
        }
    }

    pub fn finite_block(lanes: Lanes, bytes: &[u8], smallest_normal: f32) -> Option<Moments> {
        finite_block_with(kernel()?, lanes, bytes, smallest_normal)
    }

    /// [`finite_block`] with the given kernel, which the CPU must run (checked).
    pub fn finite_block_with(
        kernel: Kernel,
        lanes: Lanes,
        bytes: &[u8],
        smallest_normal: f32,
    ) -> Option<Moments> {
        if !runs(kernel) {
            return None;
        }
        // SAFETY: `runs` checked that the CPU has the instruction sets each function enables.
        unsafe {
            match (kernel, lanes) {
                (Kernel::Avx512, Lanes::F32) => block_avx512::<F32>(bytes, smallest_normal),
                (Kernel::Avx512, Lanes::Bf16) => block_avx512::<Bf16>(bytes, smallest_normal),
                (Kernel::Avx512, Lanes::F16) => block_avx512::<F16>(bytes, smallest_normal),
                (Kernel::Avx2, Lanes::F32) => block_avx2::<F32>(bytes, smallest_normal),
                (Kernel::Avx2, Lanes::Bf16) => block_avx2::<Bf16>(bytes, smallest_normal),
                (Kernel::Avx2, Lanes::F16) => block_avx2::<F16>(bytes, smallest_normal),
            }
        }
    }

    pub fn finite_pairs(a: &[f32], b: &[f32]) -> Option<PairSums> {
        finite_pairs_with(kernel()?, a, b)
    }

    /// [`finite_pairs`] with the given kernel, which the CPU must run (checked).
    pub fn finite_pairs_with(kernel: Kernel, a: &[f32], b: &[f32]) -> Option<PairSums> {
        if a.len() != b.len() || !runs(kernel) {
            return None;
        }
        let (left, right) = (bytemuck::cast_slice(a), bytemuck::cast_slice(b));
        // SAFETY: `kernel` checked that the CPU has the instruction sets each function enables.
        unsafe {
            match kernel {
                Kernel::Avx512 => pairs_avx512(left, right),
                Kernel::Avx2 => pairs_avx2(left, right),
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn pairs_avx512(a: &[u8], b: &[u8]) -> Option<PairSums> {
        pairs::<avx512::Isa512>(a, b)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pairs_avx2(a: &[u8], b: &[u8]) -> Option<PairSums> {
        pairs::<avx2::Isa256>(a, b)
    }

    /// One pass over pairs of F32 values (bytes of the same length): sums of squares and
    /// products in `f64`, in which NaN and the infinities show up as sums that are not finite.
    #[inline(always)]
    fn pairs<I: Isa>(left: &[u8], right: &[u8]) -> Option<PairSums> {
        let count = left.len() / 4;
        let (steps, stride) = steps::<I, F32>(count);
        // SAFETY: step `v` covers bytes `v * stride..(v + 1) * stride` of both slices, inside
        // them for every `v < steps`; the callers enable the instruction set.
        let mut sums = unsafe {
            let zero = I::splat_pd(0.0);
            let (mut diff_sq, mut a_sq, mut b_sq, mut dot) =
                ([zero; 2], [zero; 2], [zero; 2], [zero; 2]);
            let (mut max_abs, mut changed) = ([zero; 2], [zero; 2]);
            for v in 0..steps {
                let at = v * stride;
                for line in (at.next_multiple_of(64)..at + stride).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(left.as_ptr().wrapping_add(line + PREFETCH).cast());
                    _mm_prefetch::<_MM_HINT_T0>(
                        right.as_ptr().wrapping_add(line + PREFETCH).cast(),
                    );
                }
                for (x, y) in F32::load::<I>(left, at)
                    .into_iter()
                    .zip(F32::load::<I>(right, at))
                {
                    for (h, (x, y)) in I::widen(x).into_iter().zip(I::widen(y)).enumerate() {
                        let d = I::sub_pd(x, y);
                        diff_sq[h] = I::fmadd_pd(d, d, diff_sq[h]);
                        a_sq[h] = I::fmadd_pd(x, x, a_sq[h]);
                        b_sq[h] = I::fmadd_pd(y, y, b_sq[h]);
                        dot[h] = I::fmadd_pd(x, y, dot[h]);
                        max_abs[h] = I::max_abs_pd(max_abs[h], d);
                        changed[h] = I::count_nonzero_pd(changed[h], d);
                    }
                }
            }
            let total = |v: [I::Pd; 2]| I::sum_pd(v[0]) + I::sum_pd(v[1]);
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "a count of pairs, held exactly in f64"
            )]
            let changed = total(changed) as u64;
            PairSums {
                diff_sq: total(diff_sq),
                a_sq: total(a_sq),
                b_sq: total(b_sq),
                dot: total(dot),
                max_abs: I::max_pd(max_abs[0]).max(I::max_pd(max_abs[1])),
                changed,
            }
        };
        for i in steps * 2 * I::WIDTH..count {
            let x = f64::from(Lanes::F32.decode(left, 4 * i));
            let y = f64::from(Lanes::F32.decode(right, 4 * i));
            let difference = x - y;
            sums.diff_sq += difference * difference;
            sums.a_sq += x * x;
            sums.b_sq += y * y;
            sums.dot += x * y;
            sums.max_abs = sums.max_abs.max(difference.abs());
            sums.changed += u64::from(difference != 0.0);
        }
        // An f32's square is below 2^256: only NaN and the infinities make these not finite.
        (sums.a_sq.is_finite() && sums.b_sq.is_finite()).then_some(sums)
    }

    /// [`super::tally`] with the given kernel, which the CPU must run (checked).
    pub fn tally_with(
        kernel: Kernel,
        lanes: Lanes,
        bytes: &[u8],
        bounds: &BinBounds,
        tally: &mut Tally,
        odd: &mut dyn FnMut(f32),
    ) -> bool {
        if !runs(kernel) {
            return false;
        }
        // SAFETY: `runs` checked that the CPU has the instruction sets each function enables.
        unsafe {
            match (kernel, lanes) {
                (Kernel::Avx512, Lanes::F32) => tally_avx512::<F32>(bytes, bounds, tally, odd),
                (Kernel::Avx512, Lanes::Bf16) => tally_avx512::<Bf16>(bytes, bounds, tally, odd),
                (Kernel::Avx512, Lanes::F16) => tally_avx512::<F16>(bytes, bounds, tally, odd),
                (Kernel::Avx2, Lanes::F32) => tally_avx2::<F32>(bytes, bounds, tally, odd),
                (Kernel::Avx2, Lanes::Bf16) => tally_avx2::<Bf16>(bytes, bounds, tally, odd),
                (Kernel::Avx2, Lanes::F16) => tally_avx2::<F16>(bytes, bounds, tally, odd),
            }
        }
        true
    }

    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn tally_avx512<L: Load>(
        bytes: &[u8],
        bounds: &BinBounds,
        tally: &mut Tally,
        odd: &mut dyn FnMut(f32),
    ) {
        // Segments short enough for the slots' `u32` counts.
        for segment in bytes.chunks(SEGMENT * L::LANES.size()) {
            tally_block::<avx512::Isa512, L>(segment, bounds, tally, odd);
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tally_avx2<L: Load>(
        bytes: &[u8],
        bounds: &BinBounds,
        tally: &mut Tally,
        odd: &mut dyn FnMut(f32),
    ) {
        // Segments short enough for the slots' `u32` counts.
        for segment in bytes.chunks(SEGMENT * L::LANES.size()) {
            tally_block::<avx2::Isa256, L>(segment, bounds, tally, odd);
        }
    }

    /// The slot of a lane not counted: exponent 255, which no counted value has.
    const UNCOUNTED: u32 = 255;

    #[expect(clippy::cast_possible_truncation, reason = "64 bins")]
    const LAST_BIN: u32 = BINS as u32 - 1;

    /// Elements counted in one go: a multiple of every kernel's step, and below 2^32.
    const SEGMENT: usize = 1 << 30;

    /// Steps whose keys are stored before they are counted.
    const BATCH: usize = 16;

    /// Elements in a step of the widest kernel (AVX-512: two vectors of 16).
    const WIDEST_STEP: usize = 32;

    /// Values passed on to `odd` at once.
    const LEFT_OVER: usize = 256;

    /// The histogram's pass over a block. Each lane's bin is estimated from its value, moved by
    /// one where the value lies below the estimate's lower bound or at or above its upper one,
    /// and counted only if the value then lies within the bounds of its bin; the exponent is
    /// read from the bits.
    #[inline(always)]
    fn tally_block<I: Isa, L: Load>(
        bytes: &[u8],
        bounds: &BinBounds,
        tally: &mut Tally,
        odd: &mut dyn FnMut(f32),
    ) {
        let size = L::LANES.size();
        let count = bytes.len() / size;
        let (steps, stride) = steps::<I, L>(count);
        tally.reserve((steps * 2 * I::WIDTH) as u64);
        let slots = &mut tally.slots[..TALLY_SLOTS];
        let mut left = [0f32; LEFT_OVER];
        let mut left_count = 0;
        // SAFETY: as in `block`; the slots' indexes are masked to their length.
        unsafe {
            let low = I::table(&bounds.low);
            let high = I::table(&bounds.high);
            let origin = I::splat_ps(bounds.origin);
            let per_unit = I::splat_ps(bounds.per_unit);
            let (half, zero) = (I::splat_ps(0.5), I::splat_ps(0.0));
            let top = I::splat_ps(LAST_BIN as f32);
            let (last, no_exponent) = (I::splat_int(LAST_BIN), I::splat_int(255));
            let (none, uncounted) = (I::splat_int(0), I::splat_int(UNCOUNTED));
            let mut keys = [0u32; BATCH * WIDEST_STEP];
            for batch in (0..steps).step_by(BATCH) {
                let mut filled = 0;
                for v in batch..(batch + BATCH).min(steps) {
                    let at = v * stride;
                    for line in (at.next_multiple_of(64)..at + stride).step_by(64) {
                        _mm_prefetch::<_MM_HINT_T0>(
                            bytes.as_ptr().wrapping_add(line + PREFETCH).cast(),
                        );
                    }
                    for x in L::load::<I>(bytes, at) {
                        // NaN becomes 0 here (`max_ps` returns its second operand then).
                        let scaled = I::mul_ps(I::sub_ps(I::mul_ps(x, half), origin), per_unit);
                        let estimate = I::truncate(I::min_ps(I::max_ps(scaled, zero), top));
                        let below = I::lt_ps(x, I::lookup(&low, estimate));
                        let above = I::le_ps(I::lookup(&high, estimate), x);
                        // Only +∞ moves past the last bin.
                        let bin = I::min_u32(I::step(estimate, below, above), last);
                        let inside = I::and(
                            I::le_ps(I::lookup(&low, bin), x),
                            I::lt_ps(x, I::lookup(&high, bin)),
                        );
                        let bits = I::magnitude_bits(x);
                        let exponent = I::exponent(bits);
                        let finite = I::gt_i32(no_exponent, exponent);
                        let normal = I::and(I::gt_i32(exponent, none), finite);
                        let counted = I::and(inside, I::or(normal, I::eq_i32(bits, none)));
                        let key = I::select(counted, I::pack(bin, exponent), uncounted);
                        I::store_u32(key, &mut keys[filled..]);
                        filled += I::WIDTH;
                        let missed = I::mask_bits(I::and_not(counted, finite));
                        if missed != 0 {
                            I::each_f32(x, |lane, value| {
                                if missed >> lane & 1 == 1 {
                                    left[left_count] = value;
                                    left_count += 1;
                                }
                            });
                            if left_count > LEFT_OVER - 2 * I::WIDTH {
                                pass_on(&left[..left_count], odd);
                                left_count = 0;
                            }
                        }
                    }
                }
                // Counted apart from the lanes' work, in plain loads and increments.
                for &key in &keys[..filled] {
                    slots[key as usize % TALLY_SLOTS] += 1;
                }
            }
        }
        pass_on(&left[..left_count], odd);
        for i in steps * 2 * I::WIDTH..count {
            odd(L::LANES.decode(bytes, i * size));
        }
    }

    #[cold]
    #[inline(never)]
    fn pass_on(values: &[f32], odd: &mut dyn FnMut(f32)) {
        for &value in values {
            odd(value);
        }
    }

    mod fused;

    pub fn nibble_moments_with(
        kernel: Kernel,
        codes: &[u8],
        tables: &[[f32; 16]],
    ) -> Option<Moments> {
        fused_with(kernel, &fused::Nibbles { codes, tables })
    }

    pub fn e4m3_moments_with(
        kernel: Kernel,
        codes: &[u8],
        scales: &[f32],
        rounding: Rounding,
    ) -> Option<Moments> {
        const NONE: u8 = fused::round_code(Rounding::None);
        const BF16: u8 = fused::round_code(Rounding::Bf16);
        const HALF: u8 = fused::round_code(Rounding::F16);
        match rounding {
            Rounding::None => fused_with(kernel, &fused::E4m3::<NONE> { codes, scales }),
            Rounding::Bf16 => fused_with(kernel, &fused::E4m3::<BF16> { codes, scales }),
            Rounding::F16 => fused_with(kernel, &fused::E4m3::<HALF> { codes, scales }),
        }
    }

    fn fused_with<S: fused::Stream>(kernel: Kernel, stream: &S) -> Option<Moments> {
        if !runs(kernel) {
            return None;
        }
        // SAFETY: `runs` checked that the CPU has the instruction sets each function enables.
        unsafe {
            match kernel {
                Kernel::Avx512 => fused_avx512(stream),
                Kernel::Avx2 => fused_avx2(stream),
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn fused_avx512<S: fused::Stream>(stream: &S) -> Option<Moments> {
        if !fused::fits::<avx512::Isa512, S>(stream) {
            return None;
        }
        // SAFETY: the instruction set is enabled here, and the groups fit the loads.
        unsafe { fused::moments::<avx512::Isa512, S>(stream) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn fused_avx2<S: fused::Stream>(stream: &S) -> Option<Moments> {
        if !fused::fits::<avx2::Isa256, S>(stream) {
            return None;
        }
        // SAFETY: as for `fused_avx512`.
        unsafe { fused::moments::<avx2::Isa256, S>(stream) }
    }

    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn block_avx512<L: Load>(bytes: &[u8], smallest_normal: f32) -> Option<Moments> {
        block::<avx512::Isa512, L>(bytes, smallest_normal)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block_avx2<L: Load>(bytes: &[u8], smallest_normal: f32) -> Option<Moments> {
        block::<avx2::Isa256, L>(bytes, smallest_normal)
    }

    /// The vector operations the kernel needs. Every function must be called only from code
    /// compiled with the instruction set (`block_avx512`, `block_avx2`); the loads read two
    /// vectors' worth of elements (`2 * WIDTH`) from `at`, which must be inside the slice, in
    /// any order (BF16 comes out with odd and even elements in separate vectors).
    pub trait Isa {
        /// `f32` lanes in a vector.
        const WIDTH: usize;
        type Ps: Copy;
        type Pd: Copy;
        type Int: Copy;
        unsafe fn load_f32(bytes: &[u8], at: usize) -> [Self::Ps; 2];
        unsafe fn load_bf16(bytes: &[u8], at: usize) -> [Self::Ps; 2];
        unsafe fn load_f16(bytes: &[u8], at: usize) -> [Self::Ps; 2];
        unsafe fn splat_ps(value: f32) -> Self::Ps;
        unsafe fn splat_pd(value: f64) -> Self::Pd;
        unsafe fn splat_int(value: u32) -> Self::Int;
        /// The bits of each lane's magnitude.
        unsafe fn magnitude_bits(x: Self::Ps) -> Self::Int;
        unsafe fn min_u32(a: Self::Int, b: Self::Int) -> Self::Int;
        unsafe fn min_ps(a: Self::Ps, b: Self::Ps) -> Self::Ps;
        unsafe fn max_ps(a: Self::Ps, b: Self::Ps) -> Self::Ps;
        /// The lanes of `x` as two vectors of `f64`.
        unsafe fn widen(x: Self::Ps) -> [Self::Pd; 2];
        unsafe fn sub_pd(a: Self::Pd, b: Self::Pd) -> Self::Pd;
        unsafe fn add_pd(a: Self::Pd, b: Self::Pd) -> Self::Pd;
        /// `a * b + c`.
        unsafe fn fmadd_pd(a: Self::Pd, b: Self::Pd, c: Self::Pd) -> Self::Pd;
        /// The larger of `max` and `|d|` in each lane (for finite values).
        unsafe fn max_abs_pd(max: Self::Pd, d: Self::Pd) -> Self::Pd;
        /// Adds one to `count` in each lane where `d` is not zero.
        unsafe fn count_nonzero_pd(count: Self::Pd, d: Self::Pd) -> Self::Pd;
        /// Adds one to `count` in each lane where `bits` is zero.
        unsafe fn count_zero(count: Self::Int, bits: Self::Int) -> Self::Int;
        /// Adds one to `count` in each lane where `bits < floor` (both below 2^31).
        unsafe fn count_below(count: Self::Int, bits: Self::Int, floor: Self::Int) -> Self::Int;
        /// `BINS` (64) `f32` values held for [`Isa::lookup`].
        type Table: Copy;
        /// Lanes where a comparison holds.
        type Mask: Copy;
        unsafe fn table(values: &[f32; BINS]) -> Self::Table;
        /// `table[index]` in each lane, for indexes below `BINS`.
        unsafe fn lookup(table: &Self::Table, index: Self::Int) -> Self::Ps;
        unsafe fn mul_ps(a: Self::Ps, b: Self::Ps) -> Self::Ps;
        unsafe fn sub_ps(a: Self::Ps, b: Self::Ps) -> Self::Ps;
        unsafe fn add_ps(a: Self::Ps, b: Self::Ps) -> Self::Ps;
        /// `a * b + c`.
        unsafe fn fmadd_ps(a: Self::Ps, b: Self::Ps, c: Self::Ps) -> Self::Ps;
        /// Each lane converted to an integer, rounding toward zero.
        unsafe fn truncate(x: Self::Ps) -> Self::Int;
        unsafe fn lt_ps(a: Self::Ps, b: Self::Ps) -> Self::Mask;
        unsafe fn le_ps(a: Self::Ps, b: Self::Ps) -> Self::Mask;
        unsafe fn gt_i32(a: Self::Int, b: Self::Int) -> Self::Mask;
        unsafe fn eq_i32(a: Self::Int, b: Self::Int) -> Self::Mask;
        unsafe fn and(a: Self::Mask, b: Self::Mask) -> Self::Mask;
        unsafe fn or(a: Self::Mask, b: Self::Mask) -> Self::Mask;
        /// `b` and not `a`.
        unsafe fn and_not(a: Self::Mask, b: Self::Mask) -> Self::Mask;
        /// `value - 1` where `down`, `value + 1` where `up` (never both).
        unsafe fn step(value: Self::Int, down: Self::Mask, up: Self::Mask) -> Self::Int;
        /// `a` where `mask`, else `b`.
        unsafe fn select(mask: Self::Mask, a: Self::Int, b: Self::Int) -> Self::Int;
        /// The biased exponent of each lane's `f32` bits.
        unsafe fn exponent(bits: Self::Int) -> Self::Int;
        /// `bin << 8 | exponent`.
        unsafe fn pack(bin: Self::Int, exponent: Self::Int) -> Self::Int;
        /// Bit `i` set where lane `i` of the mask is.
        unsafe fn mask_bits(mask: Self::Mask) -> u32;
        /// Stores the lanes in `out`, which must hold `WIDTH` values.
        unsafe fn store_u32(v: Self::Int, out: &mut [u32]);
        fn each_f32(v: Self::Ps, f: impl FnMut(usize, f32));
        fn least_u32(v: Self::Int) -> u32;
        fn sum_u32(v: Self::Int) -> u64;
        fn least_ps(v: Self::Ps) -> f32;
        fn most_ps(v: Self::Ps) -> f32;
        fn sum_pd(v: Self::Pd) -> f64;
        fn max_pd(v: Self::Pd) -> f64;
        /// 16 `f32` values held for [`Isa::lookup16`].
        type Table16: Copy;
        unsafe fn table16(values: &[f32; 16]) -> Self::Table16;
        /// `table[index]` in each lane, for indexes below 16.
        unsafe fn lookup16(table: &Self::Table16, index: Self::Int) -> Self::Ps;
        /// The `2 * WIDTH` four-bit codes of the `WIDTH` bytes at `at`, one a lane: the low
        /// halves (even elements), then the high halves (odd elements).
        unsafe fn load_nibbles(bytes: &[u8], at: usize) -> [Self::Int; 2];
        /// The `2 * WIDTH` bytes at `at`, one a lane, sign-extended.
        unsafe fn load_i8(bytes: &[u8], at: usize) -> [Self::Int; 2];
        /// The fields of OCP E4M3 codes (sign-extended bytes, one a lane) placed in an `f32`'s:
        /// the code's value times 2^-120 (exactly, as a subnormal `f32` for small codes), but
        /// for the NaN codes, which the caller leaves out.
        unsafe fn e4m3_fields(codes: Self::Int) -> Self::Ps;
        /// Each lane rounded to BF16 (to nearest, ties to even); NaN lanes, which the caller
        /// leaves out, may come out as anything.
        unsafe fn round_bf16(x: Self::Ps) -> Self::Ps;
        /// Each lane rounded to F16 (to nearest, ties to even).
        unsafe fn round_f16(x: Self::Ps) -> Self::Ps;
    }

    /// How elements are stored.
    pub trait Load {
        const LANES: Lanes;
        /// # Safety
        /// As for [`Isa`]'s loads.
        unsafe fn load<I: Isa>(bytes: &[u8], at: usize) -> [I::Ps; 2];
    }

    struct F32;
    struct Bf16;
    struct F16;

    impl Load for F32 {
        const LANES: Lanes = Lanes::F32;
        #[inline(always)]
        unsafe fn load<I: Isa>(bytes: &[u8], at: usize) -> [I::Ps; 2] {
            // SAFETY: passed on to the caller.
            unsafe { I::load_f32(bytes, at) }
        }
    }

    impl Load for Bf16 {
        const LANES: Lanes = Lanes::Bf16;
        #[inline(always)]
        unsafe fn load<I: Isa>(bytes: &[u8], at: usize) -> [I::Ps; 2] {
            // SAFETY: passed on to the caller.
            unsafe { I::load_bf16(bytes, at) }
        }
    }

    impl Load for F16 {
        const LANES: Lanes = Lanes::F16;
        #[inline(always)]
        unsafe fn load<I: Isa>(bytes: &[u8], at: usize) -> [I::Ps; 2] {
            // SAFETY: passed on to the caller.
            unsafe { I::load_f16(bytes, at) }
        }
    }

    struct Pass {
        least: u32,
        low: f32,
        high: f32,
        sum: f64,
        squares: f64,
    }

    /// One pass over the block: the range, the least magnitude's bit pattern (whether a zero or
    /// a subnormal is there), and the sums of the values and of their squares in `f64`, where
    /// NaN and the infinities show up as a sum that is not finite. Those sums give the variance
    /// unless the values lie far from zero for their spread; then a second pass sums the
    /// deviations from the block's first value, which is one of the values, so its squared
    /// distance from the mean is at most `count` times the variance and the variance loses at
    /// most `log2(count + 1)` bits (12 for a block) of `f64`'s 53.
    #[inline(always)]
    fn block<I: Isa, L: Load>(bytes: &[u8], smallest_normal: f32) -> Option<Moments> {
        let size = L::LANES.size();
        let count = bytes.len() / size;
        if count == 0 {
            return None;
        }
        let (steps, stride) = steps::<I, L>(count);
        // SAFETY (every load here, in `small_values` and in `sums_about`): step `v` covers
        // bytes `v * stride..(v + 1) * stride`, inside `bytes` for every `v < steps`; the
        // callers enable the instruction set. Prefetching any address is harmless.
        let mut pass = unsafe {
            let mut least = I::splat_int(u32::MAX);
            let mut low = I::splat_ps(f32::INFINITY);
            let mut high = I::splat_ps(f32::NEG_INFINITY);
            let mut s1 = [I::splat_pd(0.0); 2];
            let mut s2 = [I::splat_pd(0.0); 2];
            for v in 0..steps {
                let at = v * stride;
                for line in (at.next_multiple_of(64)..at + stride).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(
                        bytes.as_ptr().wrapping_add(line + PREFETCH).cast(),
                    );
                }
                for x in L::load::<I>(bytes, at) {
                    least = I::min_u32(least, I::magnitude_bits(x));
                    low = I::min_ps(low, x);
                    high = I::max_ps(high, x);
                    for (h, half) in I::widen(x).into_iter().enumerate() {
                        s1[h] = I::add_pd(s1[h], half);
                        s2[h] = I::fmadd_pd(half, half, s2[h]);
                    }
                }
            }
            Pass {
                least: I::least_u32(least),
                low: I::least_ps(low),
                high: I::most_ps(high),
                sum: I::sum_pd(s1[0]) + I::sum_pd(s1[1]),
                squares: I::sum_pd(s2[0]) + I::sum_pd(s2[1]),
            }
        };
        for i in steps * 2 * I::WIDTH..count {
            let x = L::LANES.decode(bytes, i * size);
            pass.least = pass.least.min(x.to_bits() & 0x7fff_ffff);
            pass.low = pass.low.min(x);
            pass.high = pass.high.max(x);
            pass.sum += f64::from(x);
            pass.squares += f64::from(x) * f64::from(x);
        }
        // An f32's square is below 2^256: only NaN and the infinities make these not finite.
        if !(pass.sum.is_finite() && pass.squares.is_finite()) {
            return None;
        }
        // A zero's bits are 0, below any floor but a zero one.
        let floor = smallest_normal.to_bits().max(1);
        let (zeros, subnormals) = if pass.least < floor {
            small_values::<I, L>(bytes, floor)
        } else {
            (0, 0)
        };
        let block = FiniteBlock {
            count: count as u64,
            zeros,
            subnormals,
            min: f64::from(pass.low),
            max: f64::from(pass.high),
        };
        let n = count as f64;
        // The squares cancel: more than 20 of the variance's bits would be lost.
        if pass.squares > (pass.squares - pass.sum * pass.sum / n) * 1_048_576.0 {
            let offset = f64::from(L::LANES.decode(bytes, 0));
            let (sum, squares) = sums_about::<I, L>(bytes, offset);
            return Some(block.with_sums_about(offset, sum, squares));
        }
        Some(block.with_sums_about(0.0, pass.sum, pass.squares))
    }

    /// Sums of `x - offset` and of its squares, kept in lanes: the second pass of the moments
    /// when the first pass's sums cancel.
    struct SumsAbout<I: Isa> {
        shift: I::Pd,
        s1: [I::Pd; 2],
        s2: [I::Pd; 2],
    }

    impl<I: Isa> SumsAbout<I> {
        /// # Safety
        /// The caller enables the instruction set.
        #[inline(always)]
        unsafe fn new(offset: f64) -> Self {
            // SAFETY: passed on to the caller.
            unsafe {
                SumsAbout {
                    shift: I::splat_pd(offset),
                    s1: [I::splat_pd(0.0); 2],
                    s2: [I::splat_pd(0.0); 2],
                }
            }
        }

        /// # Safety
        /// The caller enables the instruction set.
        #[inline(always)]
        unsafe fn add(&mut self, x: I::Ps) {
            // SAFETY: passed on to the caller.
            unsafe {
                for (h, half) in I::widen(x).into_iter().enumerate() {
                    let d = I::sub_pd(half, self.shift);
                    self.s1[h] = I::add_pd(self.s1[h], d);
                    self.s2[h] = I::fmadd_pd(d, d, self.s2[h]);
                }
            }
        }

        /// The sum and the sum of squares.
        #[inline(always)]
        fn totals(&self) -> (f64, f64) {
            (
                I::sum_pd(self.s1[0]) + I::sum_pd(self.s1[1]),
                I::sum_pd(self.s2[0]) + I::sum_pd(self.s2[1]),
            )
        }
    }

    /// The sums of `x - offset` and of its squares over a block of finite values.
    #[inline(always)]
    fn sums_about<I: Isa, L: Load>(bytes: &[u8], offset: f64) -> (f64, f64) {
        let size = L::LANES.size();
        let count = bytes.len() / size;
        let (steps, stride) = steps::<I, L>(count);
        // SAFETY: as in `block`.
        let (mut sum, mut squares) = unsafe {
            let mut sums = SumsAbout::<I>::new(offset);
            for v in 0..steps {
                for x in L::load::<I>(bytes, v * stride) {
                    sums.add(x);
                }
            }
            sums.totals()
        };
        for i in steps * 2 * I::WIDTH..count {
            let d = f64::from(L::LANES.decode(bytes, i * size)) - offset;
            sum += d;
            squares += d * d;
        }
        (sum, squares)
    }

    /// Whole loads in `count` elements, and the bytes each covers.
    #[inline(always)]
    fn steps<I: Isa, L: Load>(count: usize) -> (usize, usize) {
        (count / (2 * I::WIDTH), 2 * I::WIDTH * L::LANES.size())
    }

    /// Zeros and nonzero magnitudes whose bits are below `floor`, in a block of finite values.
    #[inline(always)]
    fn small_values<I: Isa, L: Load>(bytes: &[u8], floor: u32) -> (u64, u64) {
        let size = L::LANES.size();
        let count = bytes.len() / size;
        let (steps, stride) = steps::<I, L>(count);
        // SAFETY: as in `block`.
        let (mut zeros, mut below) = unsafe {
            let floor = I::splat_int(floor);
            let mut zeros = I::splat_int(0);
            let mut below = I::splat_int(0);
            for v in 0..steps {
                for x in L::load::<I>(bytes, v * stride) {
                    let bits = I::magnitude_bits(x);
                    zeros = I::count_zero(zeros, bits);
                    below = I::count_below(below, bits, floor);
                }
            }
            (I::sum_u32(zeros), I::sum_u32(below))
        };
        for i in steps * 2 * I::WIDTH..count {
            let bits = L::LANES.decode(bytes, i * size).to_bits() & 0x7fff_ffff;
            zeros += u64::from(bits == 0);
            below += u64::from(bits < floor);
        }
        (zeros, below - zeros)
    }

    /// A vector's lanes as an array.
    fn lanes<V, T: Copy + Default, const N: usize>(v: &V) -> [T; N] {
        const { assert!(size_of::<V>() == size_of::<[T; N]>()) };
        // SAFETY: both are plain data of the same size (checked above).
        unsafe { std::mem::transmute_copy(v) }
    }

    mod avx2 {
        use super::{BINS, E4M3_FIELDS, HIGH_HALF, Isa, lanes};
        use std::arch::x86_64::{
            __m128i, __m256, __m256d, __m256i, _CMP_LE_OQ, _CMP_LT_OQ, _CMP_NEQ_OQ,
            _MM_FROUND_TO_NEAREST_INT, _mm_loadl_epi64, _mm_loadu_si128, _mm_srli_si128,
            _mm256_add_epi32, _mm256_add_pd, _mm256_add_ps, _mm256_and_pd, _mm256_and_si256,
            _mm256_andnot_pd, _mm256_andnot_si256, _mm256_blendv_epi8, _mm256_blendv_ps,
            _mm256_castps_si256, _mm256_castps256_ps128, _mm256_castsi256_ps, _mm256_cmp_pd,
            _mm256_cmp_ps, _mm256_cmpeq_epi32, _mm256_cmpgt_epi32, _mm256_cvtepi8_epi32,
            _mm256_cvtepu8_epi32, _mm256_cvtph_ps, _mm256_cvtps_pd, _mm256_cvtps_ph,
            _mm256_cvttps_epi32, _mm256_extractf128_ps, _mm256_fmadd_pd, _mm256_fmadd_ps,
            _mm256_i32gather_ps, _mm256_loadu_ps, _mm256_loadu_si256, _mm256_max_pd, _mm256_max_ps,
            _mm256_min_epu32, _mm256_min_ps, _mm256_movemask_ps, _mm256_mul_ps, _mm256_or_si256,
            _mm256_permutevar8x32_ps, _mm256_set1_epi32, _mm256_set1_pd, _mm256_set1_ps,
            _mm256_setzero_pd, _mm256_setzero_si256, _mm256_slli_epi32, _mm256_srli_epi32,
            _mm256_storeu_si256, _mm256_sub_epi32, _mm256_sub_pd, _mm256_sub_ps,
        };

        pub struct Isa256;

        #[expect(
            clippy::cast_possible_wrap,
            reason = "lanes hold u32 bit patterns in i32 registers"
        )]
        #[expect(
            unsafe_op_in_unsafe_fn,
            reason = "intrinsics whose one requirement, the instruction set, the trait puts on the caller"
        )]
        impl Isa for Isa256 {
            const WIDTH: usize = 8;
            type Ps = __m256;
            type Pd = __m256d;
            type Int = __m256i;
            type Table = *const f32;
            type Mask = __m256i;

            #[inline(always)]
            unsafe fn table(values: &[f32; BINS]) -> *const f32 {
                values.as_ptr()
            }
            #[inline(always)]
            unsafe fn lookup(table: &*const f32, index: __m256i) -> __m256 {
                // SAFETY: the caller keeps the indexes below 64, inside the table.
                unsafe { _mm256_i32gather_ps::<4>(*table, index) }
            }
            #[inline(always)]
            unsafe fn mul_ps(a: __m256, b: __m256) -> __m256 {
                _mm256_mul_ps(a, b)
            }
            #[inline(always)]
            unsafe fn sub_ps(a: __m256, b: __m256) -> __m256 {
                _mm256_sub_ps(a, b)
            }
            #[inline(always)]
            unsafe fn add_ps(a: __m256, b: __m256) -> __m256 {
                _mm256_add_ps(a, b)
            }
            #[inline(always)]
            unsafe fn fmadd_ps(a: __m256, b: __m256, c: __m256) -> __m256 {
                _mm256_fmadd_ps(a, b, c)
            }
            #[inline(always)]
            unsafe fn truncate(x: __m256) -> __m256i {
                _mm256_cvttps_epi32(x)
            }
            #[inline(always)]
            unsafe fn lt_ps(a: __m256, b: __m256) -> __m256i {
                _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LT_OQ>(a, b))
            }
            #[inline(always)]
            unsafe fn le_ps(a: __m256, b: __m256) -> __m256i {
                _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(a, b))
            }
            #[inline(always)]
            unsafe fn gt_i32(a: __m256i, b: __m256i) -> __m256i {
                _mm256_cmpgt_epi32(a, b)
            }
            #[inline(always)]
            unsafe fn eq_i32(a: __m256i, b: __m256i) -> __m256i {
                _mm256_cmpeq_epi32(a, b)
            }
            #[inline(always)]
            unsafe fn and(a: __m256i, b: __m256i) -> __m256i {
                _mm256_and_si256(a, b)
            }
            #[inline(always)]
            unsafe fn or(a: __m256i, b: __m256i) -> __m256i {
                _mm256_or_si256(a, b)
            }
            #[inline(always)]
            unsafe fn and_not(a: __m256i, b: __m256i) -> __m256i {
                _mm256_andnot_si256(a, b)
            }
            #[inline(always)]
            unsafe fn step(value: __m256i, down: __m256i, up: __m256i) -> __m256i {
                // A true compare is all ones: -1.
                _mm256_sub_epi32(_mm256_add_epi32(value, down), up)
            }
            #[inline(always)]
            unsafe fn select(mask: __m256i, a: __m256i, b: __m256i) -> __m256i {
                _mm256_blendv_epi8(b, a, mask)
            }
            #[inline(always)]
            unsafe fn exponent(bits: __m256i) -> __m256i {
                _mm256_srli_epi32::<23>(bits)
            }
            #[inline(always)]
            unsafe fn pack(bin: __m256i, exponent: __m256i) -> __m256i {
                _mm256_or_si256(_mm256_slli_epi32::<8>(bin), exponent)
            }
            #[inline(always)]
            unsafe fn mask_bits(mask: __m256i) -> u32 {
                _mm256_movemask_ps(_mm256_castsi256_ps(mask)).cast_unsigned()
            }
            #[inline(always)]
            unsafe fn store_u32(v: __m256i, out: &mut [u32]) {
                assert!(out.len() >= 8);
                // SAFETY: `out` holds the vector's 32 bytes (checked).
                unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), v) };
            }
            #[inline(always)]
            fn each_f32(v: __m256, mut f: impl FnMut(usize, f32)) {
                for (lane, value) in lanes::<_, f32, 8>(&v).into_iter().enumerate() {
                    f(lane, value);
                }
            }

            #[inline(always)]
            unsafe fn load_f32(bytes: &[u8], at: usize) -> [__m256; 2] {
                debug_assert!(at + 64 <= bytes.len());
                // SAFETY: the caller keeps the bytes inside the slice and enables AVX2.
                unsafe {
                    let p = bytes.as_ptr().add(at);
                    [_mm256_loadu_ps(p.cast()), _mm256_loadu_ps(p.add(32).cast())]
                }
            }
            #[inline(always)]
            unsafe fn load_bf16(bytes: &[u8], at: usize) -> [__m256; 2] {
                debug_assert!(at + 32 <= bytes.len());
                // SAFETY: as for `load_f32`. Each 32-bit lane holds two elements: the low one
                // becomes an f32 shifted up, the high one masked in place.
                unsafe {
                    let pairs = _mm256_loadu_si256(bytes.as_ptr().add(at).cast::<__m256i>());
                    [
                        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(pairs)),
                        _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(HIGH_HALF))),
                    ]
                }
            }
            #[inline(always)]
            unsafe fn load_f16(bytes: &[u8], at: usize) -> [__m256; 2] {
                debug_assert!(at + 32 <= bytes.len());
                // SAFETY: as for `load_f32`; the caller enables F16C.
                unsafe {
                    let p = bytes.as_ptr().add(at);
                    [
                        _mm256_cvtph_ps(_mm_loadu_si128(p.cast::<__m128i>())),
                        _mm256_cvtph_ps(_mm_loadu_si128(p.add(16).cast::<__m128i>())),
                    ]
                }
            }
            #[inline(always)]
            unsafe fn splat_ps(value: f32) -> __m256 {
                _mm256_set1_ps(value)
            }
            #[inline(always)]
            unsafe fn splat_pd(value: f64) -> __m256d {
                _mm256_set1_pd(value)
            }
            #[inline(always)]
            unsafe fn splat_int(value: u32) -> __m256i {
                _mm256_set1_epi32(value as i32)
            }
            #[inline(always)]
            unsafe fn magnitude_bits(x: __m256) -> __m256i {
                _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7fff_ffff))
            }
            #[inline(always)]
            unsafe fn min_u32(a: __m256i, b: __m256i) -> __m256i {
                _mm256_min_epu32(a, b)
            }
            #[inline(always)]
            unsafe fn min_ps(a: __m256, b: __m256) -> __m256 {
                _mm256_min_ps(a, b)
            }
            #[inline(always)]
            unsafe fn max_ps(a: __m256, b: __m256) -> __m256 {
                _mm256_max_ps(a, b)
            }
            #[inline(always)]
            unsafe fn widen(x: __m256) -> [__m256d; 2] {
                [
                    _mm256_cvtps_pd(_mm256_castps256_ps128(x)),
                    _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(x)),
                ]
            }
            #[inline(always)]
            unsafe fn sub_pd(a: __m256d, b: __m256d) -> __m256d {
                _mm256_sub_pd(a, b)
            }
            #[inline(always)]
            unsafe fn add_pd(a: __m256d, b: __m256d) -> __m256d {
                _mm256_add_pd(a, b)
            }
            #[inline(always)]
            unsafe fn fmadd_pd(a: __m256d, b: __m256d, c: __m256d) -> __m256d {
                _mm256_fmadd_pd(a, b, c)
            }
            #[inline(always)]
            unsafe fn count_zero(count: __m256i, bits: __m256i) -> __m256i {
                // A true compare is all ones: -1.
                _mm256_sub_epi32(count, _mm256_cmpeq_epi32(bits, _mm256_setzero_si256()))
            }
            #[inline(always)]
            unsafe fn count_below(count: __m256i, bits: __m256i, floor: __m256i) -> __m256i {
                _mm256_add_epi32(
                    count,
                    _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_cmpgt_epi32(floor, bits)),
                )
            }
            fn least_u32(v: __m256i) -> u32 {
                lanes::<_, u32, 8>(&v).into_iter().min().unwrap_or(u32::MAX)
            }
            fn sum_u32(v: __m256i) -> u64 {
                lanes::<_, u32, 8>(&v).into_iter().map(u64::from).sum()
            }
            fn least_ps(v: __m256) -> f32 {
                lanes::<_, f32, 8>(&v)
                    .into_iter()
                    .fold(f32::INFINITY, f32::min)
            }
            fn most_ps(v: __m256) -> f32 {
                lanes::<_, f32, 8>(&v)
                    .into_iter()
                    .fold(f32::NEG_INFINITY, f32::max)
            }
            fn sum_pd(v: __m256d) -> f64 {
                lanes::<_, f64, 4>(&v).into_iter().sum()
            }
            fn max_pd(v: __m256d) -> f64 {
                lanes::<_, f64, 4>(&v).into_iter().fold(0.0, f64::max)
            }
            #[inline(always)]
            unsafe fn max_abs_pd(max: __m256d, d: __m256d) -> __m256d {
                _mm256_max_pd(max, _mm256_andnot_pd(_mm256_set1_pd(-0.0), d))
            }
            #[inline(always)]
            unsafe fn count_nonzero_pd(count: __m256d, d: __m256d) -> __m256d {
                let nonzero = _mm256_cmp_pd::<_CMP_NEQ_OQ>(d, _mm256_setzero_pd());
                _mm256_add_pd(count, _mm256_and_pd(nonzero, _mm256_set1_pd(1.0)))
            }
            type Table16 = [__m256; 2];
            #[inline(always)]
            unsafe fn table16(values: &[f32; 16]) -> [__m256; 2] {
                // SAFETY: two loads of 8 lanes cover the 16 values.
                [
                    _mm256_loadu_ps(values.as_ptr()),
                    _mm256_loadu_ps(values.as_ptr().add(8)),
                ]
            }
            #[inline(always)]
            unsafe fn lookup16(table: &[__m256; 2], index: __m256i) -> __m256 {
                // Each permute picks by the index's low 3 bits; bit 3, moved to the sign, picks
                // the permute.
                let low = _mm256_permutevar8x32_ps(table[0], index);
                let high = _mm256_permutevar8x32_ps(table[1], index);
                _mm256_blendv_ps(
                    low,
                    high,
                    _mm256_castsi256_ps(_mm256_slli_epi32::<28>(index)),
                )
            }
            #[inline(always)]
            unsafe fn load_nibbles(bytes: &[u8], at: usize) -> [__m256i; 2] {
                debug_assert!(at + 8 <= bytes.len());
                // SAFETY: the caller keeps the 8 bytes inside the slice and enables AVX2.
                let wide = _mm256_cvtepu8_epi32(_mm_loadl_epi64(bytes.as_ptr().add(at).cast()));
                [
                    _mm256_and_si256(wide, _mm256_set1_epi32(15)),
                    _mm256_srli_epi32::<4>(wide),
                ]
            }
            #[inline(always)]
            unsafe fn load_i8(bytes: &[u8], at: usize) -> [__m256i; 2] {
                debug_assert!(at + 16 <= bytes.len());
                // SAFETY: the caller keeps the 16 bytes inside the slice and enables AVX2.
                let all = _mm_loadu_si128(bytes.as_ptr().add(at).cast());
                [
                    _mm256_cvtepi8_epi32(all),
                    _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(all)),
                ]
            }
            #[inline(always)]
            unsafe fn e4m3_fields(codes: __m256i) -> __m256 {
                // The sign-extended code shifted puts its sign and its seven other bits in an
                // f32's sign, exponent and mantissa; the bits between are cleared.
                _mm256_castsi256_ps(_mm256_and_si256(
                    _mm256_slli_epi32::<20>(codes),
                    _mm256_set1_epi32(E4M3_FIELDS),
                ))
            }
            #[inline(always)]
            unsafe fn round_bf16(x: __m256) -> __m256 {
                let bits = _mm256_castps_si256(x);
                let odd = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
                _mm256_castsi256_ps(_mm256_and_si256(
                    _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), odd),
                    _mm256_set1_epi32(HIGH_HALF),
                ))
            }
            #[inline(always)]
            unsafe fn round_f16(x: __m256) -> __m256 {
                _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
            }
        }
    }

    mod avx512 {
        use super::{BINS, E4M3_FIELDS, HIGH_HALF, Isa, lanes};
        use std::arch::x86_64::{
            __m256i, __m512, __m512d, __m512i, __mmask16, _CMP_LE_OQ, _CMP_LT_OQ, _CMP_NEQ_OQ,
            _MM_FROUND_TO_NEAREST_INT, _mm_loadu_si128, _mm256_castpd_ps, _mm256_loadu_si256,
            _mm512_abs_pd, _mm512_add_epi32, _mm512_add_pd, _mm512_add_ps, _mm512_and_si512,
            _mm512_castps_pd, _mm512_castps_si512, _mm512_castps512_ps256, _mm512_castsi512_ps,
            _mm512_cmp_pd_mask, _mm512_cmp_ps_mask, _mm512_cmpeq_epi32_mask,
            _mm512_cmpgt_epi32_mask, _mm512_cmplt_epu32_mask, _mm512_cvtepi8_epi32,
            _mm512_cvtepu8_epi32, _mm512_cvtph_ps, _mm512_cvtps_pd, _mm512_cvtps_ph,
            _mm512_cvttps_epi32, _mm512_extractf64x4_pd, _mm512_fmadd_pd, _mm512_fmadd_ps,
            _mm512_loadu_ps, _mm512_loadu_si512, _mm512_mask_add_epi32, _mm512_mask_add_pd,
            _mm512_mask_blend_epi32, _mm512_mask_blend_ps, _mm512_mask_sub_epi32, _mm512_max_pd,
            _mm512_max_ps, _mm512_min_epu32, _mm512_min_ps, _mm512_mul_ps, _mm512_or_si512,
            _mm512_permutex2var_ps, _mm512_permutexvar_ps, _mm512_set1_epi32, _mm512_set1_pd,
            _mm512_set1_ps, _mm512_setzero_pd, _mm512_setzero_si512, _mm512_slli_epi32,
            _mm512_srli_epi32, _mm512_storeu_si512, _mm512_sub_pd, _mm512_sub_ps,
            _mm512_test_epi32_mask,
        };

        pub struct Isa512;

        #[expect(
            clippy::cast_possible_wrap,
            reason = "lanes hold u32 bit patterns in i32 registers"
        )]
        #[expect(
            unsafe_op_in_unsafe_fn,
            reason = "intrinsics whose one requirement, the instruction set, the trait puts on the caller"
        )]
        impl Isa for Isa512 {
            const WIDTH: usize = 16;
            type Ps = __m512;
            type Pd = __m512d;
            type Int = __m512i;
            type Table = [__m512; 4];
            type Mask = __mmask16;

            #[inline(always)]
            unsafe fn table(values: &[f32; BINS]) -> [__m512; 4] {
                // SAFETY: four loads of 16 lanes cover the 64 values.
                std::array::from_fn(|i| unsafe { _mm512_loadu_ps(values.as_ptr().add(16 * i)) })
            }
            #[inline(always)]
            unsafe fn lookup(table: &[__m512; 4], index: __m512i) -> __m512 {
                // Each permute picks from 32 values by the index's low 5 bits; bit 5 picks
                // the permute.
                let low = _mm512_permutex2var_ps(table[0], index, table[1]);
                let high = _mm512_permutex2var_ps(table[2], index, table[3]);
                let upper = _mm512_test_epi32_mask(index, _mm512_set1_epi32(32));
                _mm512_mask_blend_ps(upper, low, high)
            }
            #[inline(always)]
            unsafe fn mul_ps(a: __m512, b: __m512) -> __m512 {
                _mm512_mul_ps(a, b)
            }
            #[inline(always)]
            unsafe fn sub_ps(a: __m512, b: __m512) -> __m512 {
                _mm512_sub_ps(a, b)
            }
            #[inline(always)]
            unsafe fn add_ps(a: __m512, b: __m512) -> __m512 {
                _mm512_add_ps(a, b)
            }
            #[inline(always)]
            unsafe fn fmadd_ps(a: __m512, b: __m512, c: __m512) -> __m512 {
                _mm512_fmadd_ps(a, b, c)
            }
            #[inline(always)]
            unsafe fn truncate(x: __m512) -> __m512i {
                _mm512_cvttps_epi32(x)
            }
            #[inline(always)]
            unsafe fn lt_ps(a: __m512, b: __m512) -> __mmask16 {
                _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b)
            }
            #[inline(always)]
            unsafe fn le_ps(a: __m512, b: __m512) -> __mmask16 {
                _mm512_cmp_ps_mask::<_CMP_LE_OQ>(a, b)
            }
            #[inline(always)]
            unsafe fn gt_i32(a: __m512i, b: __m512i) -> __mmask16 {
                _mm512_cmpgt_epi32_mask(a, b)
            }
            #[inline(always)]
            unsafe fn eq_i32(a: __m512i, b: __m512i) -> __mmask16 {
                _mm512_cmpeq_epi32_mask(a, b)
            }
            #[inline(always)]
            unsafe fn and(a: __mmask16, b: __mmask16) -> __mmask16 {
                a & b
            }
            #[inline(always)]
            unsafe fn or(a: __mmask16, b: __mmask16) -> __mmask16 {
                a | b
            }
            #[inline(always)]
            unsafe fn and_not(a: __mmask16, b: __mmask16) -> __mmask16 {
                !a & b
            }
            #[inline(always)]
            unsafe fn step(value: __m512i, down: __mmask16, up: __mmask16) -> __m512i {
                let one = _mm512_set1_epi32(1);
                let lowered = _mm512_mask_sub_epi32(value, down, value, one);
                _mm512_mask_add_epi32(lowered, up, lowered, one)
            }
            #[inline(always)]
            unsafe fn select(mask: __mmask16, a: __m512i, b: __m512i) -> __m512i {
                _mm512_mask_blend_epi32(mask, b, a)
            }
            #[inline(always)]
            unsafe fn exponent(bits: __m512i) -> __m512i {
                _mm512_srli_epi32::<23>(bits)
            }
            #[inline(always)]
            unsafe fn pack(bin: __m512i, exponent: __m512i) -> __m512i {
                _mm512_or_si512(_mm512_slli_epi32::<8>(bin), exponent)
            }
            #[inline(always)]
            unsafe fn mask_bits(mask: __mmask16) -> u32 {
                u32::from(mask)
            }
            #[inline(always)]
            unsafe fn store_u32(v: __m512i, out: &mut [u32]) {
                assert!(out.len() >= 16);
                // SAFETY: `out` holds the vector's 64 bytes (checked).
                unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), v) };
            }
            #[inline(always)]
            fn each_f32(v: __m512, mut f: impl FnMut(usize, f32)) {
                for (lane, value) in lanes::<_, f32, 16>(&v).into_iter().enumerate() {
                    f(lane, value);
                }
            }

            #[inline(always)]
            unsafe fn load_f32(bytes: &[u8], at: usize) -> [__m512; 2] {
                debug_assert!(at + 128 <= bytes.len());
                // SAFETY: the caller keeps the bytes inside the slice and enables AVX-512.
                unsafe {
                    let p = bytes.as_ptr().add(at);
                    [_mm512_loadu_ps(p.cast()), _mm512_loadu_ps(p.add(64).cast())]
                }
            }
            #[inline(always)]
            unsafe fn load_bf16(bytes: &[u8], at: usize) -> [__m512; 2] {
                debug_assert!(at + 64 <= bytes.len());
                // SAFETY: as for `load_f32`. Each 32-bit lane holds two elements: the low one
                // becomes an f32 shifted up, the high one masked in place.
                unsafe {
                    let pairs = _mm512_loadu_si512(bytes.as_ptr().add(at).cast::<__m512i>());
                    [
                        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(pairs)),
                        _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(HIGH_HALF))),
                    ]
                }
            }
            #[inline(always)]
            unsafe fn load_f16(bytes: &[u8], at: usize) -> [__m512; 2] {
                debug_assert!(at + 64 <= bytes.len());
                // SAFETY: as for `load_f32`.
                unsafe {
                    let p = bytes.as_ptr().add(at);
                    [
                        _mm512_cvtph_ps(_mm256_loadu_si256(p.cast::<__m256i>())),
                        _mm512_cvtph_ps(_mm256_loadu_si256(p.add(32).cast::<__m256i>())),
                    ]
                }
            }
            #[inline(always)]
            unsafe fn splat_ps(value: f32) -> __m512 {
                _mm512_set1_ps(value)
            }
            #[inline(always)]
            unsafe fn splat_pd(value: f64) -> __m512d {
                _mm512_set1_pd(value)
            }
            #[inline(always)]
            unsafe fn splat_int(value: u32) -> __m512i {
                _mm512_set1_epi32(value as i32)
            }
            #[inline(always)]
            unsafe fn magnitude_bits(x: __m512) -> __m512i {
                _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fff_ffff))
            }
            #[inline(always)]
            unsafe fn min_u32(a: __m512i, b: __m512i) -> __m512i {
                _mm512_min_epu32(a, b)
            }
            #[inline(always)]
            unsafe fn min_ps(a: __m512, b: __m512) -> __m512 {
                _mm512_min_ps(a, b)
            }
            #[inline(always)]
            unsafe fn max_ps(a: __m512, b: __m512) -> __m512 {
                _mm512_max_ps(a, b)
            }
            #[inline(always)]
            unsafe fn widen(x: __m512) -> [__m512d; 2] {
                let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
                [
                    _mm512_cvtps_pd(_mm512_castps512_ps256(x)),
                    _mm512_cvtps_pd(high),
                ]
            }
            #[inline(always)]
            unsafe fn sub_pd(a: __m512d, b: __m512d) -> __m512d {
                _mm512_sub_pd(a, b)
            }
            #[inline(always)]
            unsafe fn add_pd(a: __m512d, b: __m512d) -> __m512d {
                _mm512_add_pd(a, b)
            }
            #[inline(always)]
            unsafe fn fmadd_pd(a: __m512d, b: __m512d, c: __m512d) -> __m512d {
                _mm512_fmadd_pd(a, b, c)
            }
            #[inline(always)]
            unsafe fn count_zero(count: __m512i, bits: __m512i) -> __m512i {
                let zero = _mm512_cmpeq_epi32_mask(bits, _mm512_setzero_si512());
                _mm512_mask_add_epi32(count, zero, count, _mm512_set1_epi32(1))
            }
            #[inline(always)]
            unsafe fn count_below(count: __m512i, bits: __m512i, floor: __m512i) -> __m512i {
                let below = _mm512_cmplt_epu32_mask(bits, floor);
                _mm512_mask_add_epi32(count, below, count, _mm512_set1_epi32(1))
            }
            fn least_u32(v: __m512i) -> u32 {
                lanes::<_, u32, 16>(&v)
                    .into_iter()
                    .min()
                    .unwrap_or(u32::MAX)
            }
            fn sum_u32(v: __m512i) -> u64 {
                lanes::<_, u32, 16>(&v).into_iter().map(u64::from).sum()
            }
            fn least_ps(v: __m512) -> f32 {
                lanes::<_, f32, 16>(&v)
                    .into_iter()
                    .fold(f32::INFINITY, f32::min)
            }
            fn most_ps(v: __m512) -> f32 {
                lanes::<_, f32, 16>(&v)
                    .into_iter()
                    .fold(f32::NEG_INFINITY, f32::max)
            }
            fn sum_pd(v: __m512d) -> f64 {
                lanes::<_, f64, 8>(&v).into_iter().sum()
            }
            fn max_pd(v: __m512d) -> f64 {
                lanes::<_, f64, 8>(&v).into_iter().fold(0.0, f64::max)
            }
            #[inline(always)]
            unsafe fn max_abs_pd(max: __m512d, d: __m512d) -> __m512d {
                _mm512_max_pd(max, _mm512_abs_pd(d))
            }
            #[inline(always)]
            unsafe fn count_nonzero_pd(count: __m512d, d: __m512d) -> __m512d {
                let nonzero = _mm512_cmp_pd_mask::<_CMP_NEQ_OQ>(d, _mm512_setzero_pd());
                _mm512_mask_add_pd(count, nonzero, count, _mm512_set1_pd(1.0))
            }
            type Table16 = __m512;
            #[inline(always)]
            unsafe fn table16(values: &[f32; 16]) -> __m512 {
                // SAFETY: one load of 16 lanes covers the 16 values.
                _mm512_loadu_ps(values.as_ptr())
            }
            #[inline(always)]
            unsafe fn lookup16(table: &__m512, index: __m512i) -> __m512 {
                _mm512_permutexvar_ps(index, *table)
            }
            #[inline(always)]
            unsafe fn load_nibbles(bytes: &[u8], at: usize) -> [__m512i; 2] {
                debug_assert!(at + 16 <= bytes.len());
                // SAFETY: the caller keeps the 16 bytes inside the slice and enables AVX-512.
                let wide = _mm512_cvtepu8_epi32(_mm_loadu_si128(bytes.as_ptr().add(at).cast()));
                [
                    _mm512_and_si512(wide, _mm512_set1_epi32(15)),
                    _mm512_srli_epi32::<4>(wide),
                ]
            }
            #[inline(always)]
            unsafe fn load_i8(bytes: &[u8], at: usize) -> [__m512i; 2] {
                debug_assert!(at + 32 <= bytes.len());
                // SAFETY: the caller keeps the 32 bytes inside the slice and enables AVX-512.
                let p = bytes.as_ptr().add(at);
                [
                    _mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast())),
                    _mm512_cvtepi8_epi32(_mm_loadu_si128(p.add(16).cast())),
                ]
            }
            #[inline(always)]
            unsafe fn e4m3_fields(codes: __m512i) -> __m512 {
                // The sign-extended code shifted puts its sign and its seven other bits in an
                // f32's sign, exponent and mantissa; the bits between are cleared.
                _mm512_castsi512_ps(_mm512_and_si512(
                    _mm512_slli_epi32::<20>(codes),
                    _mm512_set1_epi32(E4M3_FIELDS),
                ))
            }
            #[inline(always)]
            unsafe fn round_bf16(x: __m512) -> __m512 {
                let bits = _mm512_castps_si512(x);
                let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(1));
                _mm512_castsi512_ps(_mm512_and_si512(
                    _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), odd),
                    _mm512_set1_epi32(HIGH_HALF),
                ))
            }
            #[inline(always)]
            unsafe fn round_f16(x: __m512) -> __m512 {
                _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
    }

    /// The result of every kernel this CPU runs, which must agree (to rounding, as they sum in
    /// different orders).
    fn each_kernel(lanes: Lanes, bytes: &[u8], smallest_normal: f32) -> Option<Moments> {
        #[cfg(target_arch = "x86_64")]
        {
            let results: Vec<Option<Moments>> = [Kernel::Avx512, Kernel::Avx2]
                .into_iter()
                .filter(|&kernel| x86::runs(kernel))
                .map(|kernel| x86::finite_block_with(kernel, lanes, bytes, smallest_normal))
                .collect();
            for pair in results.windows(2) {
                let [Some(a), Some(b)] = pair else {
                    assert_eq!(pair[0], pair[1]);
                    continue;
                };
                assert_eq!(
                    (a.count, a.zeros, a.subnormals, a.min, a.max),
                    (b.count, b.zeros, b.subnormals, b.min, b.max)
                );
                let agree = |x: f64, y: f64| (x - y).abs() <= 1e-9 * x.abs().max(y.abs());
                assert!(agree(a.mean().unwrap(), b.mean().unwrap()));
                assert!(agree(a.std().unwrap(), b.std().unwrap()));
            }
            results.into_iter().next().flatten()
        }
        #[cfg(not(target_arch = "x86_64"))]
        finite_block(lanes, bytes, smallest_normal)
    }

    #[test]
    fn matches_the_general_kernel_on_finite_blocks_of_every_length() {
        for len in [1, 7, 8, 9, 31, 32, 33, 100, 4096] {
            let values: Vec<f32> = (0..len)
                .map(|i| ((i * 7919) % 1013) as f32 * 0.37 - 150.5)
                .collect();
            let fast = each_kernel(Lanes::F32, &bytes_of(&values), f32::MIN_POSITIVE);
            let Some(fast) = fast else {
                assert!(kernel().is_none(), "no fast result for {len} values");
                continue;
            };
            let general = Moments::of_f32(&values);
            assert_eq!(
                (fast.count, fast.finite(), fast.min, fast.max),
                (general.count, general.finite(), general.min, general.max)
            );
            assert!(close(fast.mean().unwrap(), general.mean().unwrap()));
            assert!(close(fast.std().unwrap(), general.std().unwrap()));
        }
    }

    #[test]
    fn leaves_nan_and_infinities_to_the_general_kernel() {
        for (at, odd) in [(3, f32::NAN), (39, f32::INFINITY), (0, f32::NEG_INFINITY)] {
            let mut block = [1.0f32; 40];
            block[at] = odd;
            assert_eq!(
                each_kernel(Lanes::F32, &bytes_of(&block), f32::MIN_POSITIVE),
                None
            );
        }
    }

    #[test]
    fn counts_zeros_and_subnormals_of_the_dtype() {
        let mut values: Vec<f32> = (0..45).map(|i| i as f32 - 20.5).collect();
        values[0] = 0.0;
        values[9] = -0.0;
        values[44] = 1e-40;
        values[30] = -1e-39;
        values[12] = 3e-5;
        let Some(fast) = each_kernel(Lanes::F32, &bytes_of(&values), f32::MIN_POSITIVE) else {
            assert!(kernel().is_none());
            return;
        };
        let general = Moments::of_f32(&values);
        assert_eq!((fast.zeros, fast.subnormals), (2, 2));
        assert_eq!(
            (fast.count, fast.finite(), fast.min, fast.max),
            (general.count, general.finite(), general.min, general.max)
        );
        assert!(close(fast.mean().unwrap(), general.mean().unwrap()));
        assert!(close(fast.std().unwrap(), general.std().unwrap()));
        // Below F16's smallest normal (2^-14), 3e-5 is subnormal too.
        let fast = each_kernel(Lanes::F32, &bytes_of(&values), 2f32.powi(-14)).unwrap();
        assert_eq!((fast.zeros, fast.subnormals), (2, 3));
    }

    #[test]
    fn values_far_from_the_first_keep_their_spread() {
        let mut values: Vec<f32> = (0..4096).map(|i| 1e6 + (i % 7) as f32 * 0.0625).collect();
        values[0] = -1e6;
        let as_f64: Vec<f64> = values.iter().map(|&v| f64::from(v)).collect();
        let n = as_f64.len() as f64;
        let mean = as_f64.iter().sum::<f64>() / n;
        let std = (as_f64.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
        let Some(fast) = each_kernel(Lanes::F32, &bytes_of(&values), f32::MIN_POSITIVE) else {
            assert!(kernel().is_none());
            return;
        };
        assert!(close(fast.mean().unwrap(), mean));
        assert!((fast.std().unwrap() - std).abs() <= 1e-9 * std);
    }

    #[test]
    fn values_far_from_zero_for_their_spread_keep_it() {
        let values: Vec<f32> = (0..1000).map(|i| 1e6 + (i % 7) as f32 * 0.0625).collect();
        let as_f64: Vec<f64> = values.iter().map(|&v| f64::from(v)).collect();
        let n = as_f64.len() as f64;
        let mean = as_f64.iter().sum::<f64>() / n;
        let std = (as_f64.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
        let Some(fast) = each_kernel(Lanes::F32, &bytes_of(&values), f32::MIN_POSITIVE) else {
            assert!(kernel().is_none());
            return;
        };
        assert!(close(fast.mean().unwrap(), mean));
        assert!((fast.std().unwrap() - std).abs() <= 1e-9 * std);
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn pair_sums_match_plain_sums_on_every_kernel() {
        let a: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut b = a.clone();
        for (at, value) in [(3, 2.0), (64, -0.0), (500, 0.25), (999, -7.0)] {
            b[at] = value;
        }
        b[65] = -b[65];
        let pairs = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| (f64::from(x), f64::from(y)));
        let diff_sq: f64 = pairs.clone().map(|(x, y)| (x - y) * (x - y)).sum();
        let dot: f64 = pairs.clone().map(|(x, y)| x * y).sum();
        let max_abs = pairs
            .clone()
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        let changed = pairs.filter(|(x, y)| x != y).count() as u64;
        for kernel in [Kernel::Avx512, Kernel::Avx2] {
            let Some(sums) = x86::finite_pairs_with(kernel, &a, &b) else {
                assert!(!x86::runs(kernel));
                continue;
            };
            assert_eq!((sums.changed, sums.max_abs), (changed, max_abs));
            assert!((sums.diff_sq - diff_sq).abs() <= 1e-12 * diff_sq);
            assert!((sums.dot - dot).abs() <= 1e-12 * dot.abs());
        }
        b[10] = f32::INFINITY;
        assert_eq!(finite_pairs(&a, &b), None);
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn histogram_kernels_agree() {
        type Counted = ([u64; BINS], [u64; 256]);
        let mut low = [0f32; BINS];
        let mut high = [0f32; BINS];
        for b in 0..BINS {
            low[b] = if b == 0 {
                f32::NEG_INFINITY
            } else {
                b as f32 / 64.0
            };
            high[b] = if b == BINS - 1 {
                f32::INFINITY
            } else {
                (b + 1) as f32 / 64.0
            };
        }
        let bounds = BinBounds {
            low,
            high,
            origin: 0.0,
            per_unit: 128.0,
        };
        let values: Vec<f32> = (0..5000u32)
            .map(|i| match i % 50 {
                0 => f32::NAN,
                1 => f32::INFINITY,
                2 => f32::NEG_INFINITY,
                3 => 1e-41,
                4 => -0.0,
                5 => (i % 64) as f32 / 64.0,
                _ => ((i * 7919) % 10007) as f32 / 9000.0 - 0.05,
            })
            .collect();
        let results: Vec<(Counted, Vec<u32>)> = [Kernel::Avx512, Kernel::Avx2]
            .into_iter()
            .filter(|&kernel| x86::runs(kernel))
            .map(|kernel| {
                let mut tally = Tally::default();
                let mut odd = Vec::new();
                let bytes = bytemuck::cast_slice(&values);
                assert!(x86::tally_with(
                    kernel,
                    Lanes::F32,
                    bytes,
                    &bounds,
                    &mut tally,
                    &mut |x| odd.push(x.to_bits())
                ));
                odd.sort_unstable();
                let mut counted = ([0; BINS], [0; 256]);
                tally.add_to(&mut counted.0, &mut counted.1);
                (counted, odd)
            })
            .collect();
        for pair in results.windows(2) {
            assert_eq!(pair[0], pair[1]);
        }
        let Some(((bins, exponents), odd)) = results.first() else {
            return;
        };
        // What the kernel counted is every finite value it did not leave, in the bin its
        // bounds say and under its exponent.
        let mut left = odd.clone();
        let (mut expected_bins, mut expected_exponents) = ([0u64; BINS], [0u64; 256]);
        for x in values.iter().filter(|x| x.is_finite()) {
            if let Ok(at) = left.binary_search(&x.to_bits()) {
                left.remove(at);
                continue;
            }
            let bin = (0..BINS).find(|&b| low[b] <= *x && *x < high[b]).unwrap();
            expected_bins[bin] += 1;
            expected_exponents[(x.abs().to_bits() >> 23) as usize] += 1;
        }
        assert_eq!(bins, &expected_bins);
        assert_eq!(exponents, &expected_exponents);
        assert!(left.is_empty());
        // Left over: the subnormals and the values after the last whole vector.
        assert!(odd.len() <= 100 + 5000 % 32, "{} left over", odd.len());
    }

    #[test]
    fn widens_bf16_and_f16_in_the_kernel() {
        let bf16: Vec<u8> = (0..37u16)
            .flat_map(|i| (0x3f80 + i * 3).to_le_bytes())
            .collect();
        let f16: Vec<u8> = (0..37u16)
            .flat_map(|i| (0x3c00 + i * 5).to_le_bytes())
            .collect();
        let widened = |bytes: &[u8], decode: fn(u16) -> f32| -> Vec<f32> {
            bytes
                .chunks_exact(2)
                .map(|b| decode(u16::from_le_bytes([b[0], b[1]])))
                .collect()
        };
        for (lanes, bytes, values) in [
            (
                Lanes::Bf16,
                &bf16,
                widened(&bf16, |h| f32::from_bits(u32::from(h) << 16)),
            ),
            (
                Lanes::F16,
                &f16,
                widened(&f16, |h| half::f16::from_bits(h).to_f32()),
            ),
        ] {
            let Some(fast) = each_kernel(lanes, bytes, f32::MIN_POSITIVE) else {
                assert!(kernel().is_none());
                continue;
            };
            let general = Moments::of_f32(&values);
            assert_eq!((fast.min, fast.max), (general.min, general.max));
            assert!(close(fast.mean().unwrap(), general.mean().unwrap()));
            assert!(close(fast.std().unwrap(), general.std().unwrap()));
        }
    }

    /// A fixed pseudo-random sequence (xorshift).
    fn sequence() -> impl FnMut() -> u64 {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        }
    }

    /// A fused kernel's result against the general kernel's over the values it stands for:
    /// equal counts and range, mean and deviation but for the first pass's `f32` partial sums
    /// (2^-21 of a lane's magnitude each, the variance read from them only when at most 8 of
    /// its bits cancel: within 2^-12 of the spread); `None` where a value is not finite.
    fn agree_with_general(fast: Option<Moments>, values: &[f32]) {
        let general = Moments::of_f32(values);
        if general.finite() < general.count {
            assert_eq!(fast, None);
            return;
        }
        let fast = fast.expect("finite values are taken");
        assert_eq!(
            (fast.count, fast.zeros, fast.subnormals, fast.min, fast.max),
            (
                general.count,
                general.zeros,
                general.subnormals,
                general.min,
                general.max
            )
        );
        let spread = general.std().unwrap();
        for (a, b) in [
            (fast.mean().unwrap(), general.mean().unwrap()),
            (fast.std().unwrap(), spread),
        ] {
            assert!(
                (a - b).abs() <= 2f64.powi(-12) * (a.abs().max(b.abs()) + spread),
                "{a} against {b}"
            );
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn kernels() -> Vec<Kernel> {
        [Kernel::Avx512, Kernel::Avx2]
            .into_iter()
            .filter(|&k| x86::runs(k))
            .collect()
    }

    /// Random codes in 1 to 4 groups of 32 to 128 bytes.
    fn random_codes(next: &mut impl FnMut() -> u64) -> (Vec<u8>, usize) {
        let groups = 1 + usize::from(next().to_le_bytes()[0] % 4);
        let group_bytes = 32 * (1 + usize::from(next().to_le_bytes()[0] % 4));
        let codes = (0..groups * group_bytes)
            .map(|_| next().to_le_bytes()[0])
            .collect();
        (codes, groups)
    }

    /// Four-bit codes through tables with zeros, subnormals, NaN, infinities and values far
    /// from zero for their spread, on every kernel this CPU runs.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fused_nibbles_match_the_values_of_their_tables() {
        let mut next = sequence();
        let special = [0.0, -0.0, 1e-40, f32::NAN, f32::INFINITY, 1000.0];
        for case in 0..300 {
            let (codes, groups) = random_codes(&mut next);
            let far = if case % 5 == 0 { 500.0 } else { 0.0 };
            let tables: Vec<[f32; 16]> = (0..groups)
                .map(|_| {
                    std::array::from_fn(|_| {
                        let pick = usize::from(next().to_le_bytes()[0] % 40);
                        match special.get(pick) {
                            Some(&value) if case % 3 == 0 => value,
                            _ => {
                                f32::from(u16::from_le_bytes([next().to_le_bytes()[0], 0])) * 4e-3
                                    - 0.5
                                    + far
                            }
                        }
                    })
                })
                .collect();
            let group_bytes = codes.len() / groups;
            let values: Vec<f32> = codes
                .iter()
                .enumerate()
                .flat_map(|(i, &c)| {
                    let table = &tables[i / group_bytes];
                    [table[usize::from(c & 15)], table[usize::from(c >> 4)]]
                })
                .collect();
            for kernel in kernels() {
                agree_with_general(x86::nibble_moments_with(kernel, &codes, &tables), &values);
            }
        }
    }

    /// E4M3 from its definition: sign, four exponent bits (bias 7), three mantissa bits.
    fn e4m3(code: u8) -> f32 {
        let (exponent, mantissa) = (i32::from(code >> 3 & 15), f32::from(code & 7));
        let magnitude = if code & 0x7f == 0x7f {
            f32::NAN
        } else if exponent == 0 {
            mantissa / 8.0 * 2f32.powi(-6)
        } else {
            (1.0 + mantissa / 8.0) * 2f32.powi(exponent - 7)
        };
        if code & 0x80 == 0 {
            magnitude
        } else {
            -magnitude
        }
    }

    /// E4M3 codes (NaN codes among them) times scales that are zero, subnormal, NaN or large,
    /// rounded three ways, on every kernel this CPU runs.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fused_e4m3_matches_its_products() {
        let mut next = sequence();
        for case in 0..300 {
            let (codes, groups) = random_codes(&mut next);
            let codes: Vec<u8> = codes
                .iter()
                .map(|&c| {
                    if case % 4 == 0 || c & 0x7f != 0x7f {
                        c
                    } else {
                        0
                    }
                })
                .collect();
            let edges = case % 2 == 0;
            let scales: Vec<f32> = (0..groups)
                .map(|_| match next().to_le_bytes()[0] % 12 {
                    0 if edges => 0.0,
                    1 if edges => 1e-42,
                    2 if edges => f32::NAN,
                    3 if edges => 100.0,
                    4 if edges => 200.0,
                    _ => f32::from(next().to_le_bytes()[0]) * 1e-4 + 1e-6,
                })
                .collect();
            for (rounding, round) in [
                (Rounding::None, (|x| x) as fn(f32) -> f32),
                (Rounding::Bf16, |x| half::bf16::from_f32(x).to_f32()),
                (Rounding::F16, |x| half::f16::from_f32(x).to_f32()),
            ] {
                let per_group = codes.len() / groups;
                let values: Vec<f32> = codes
                    .iter()
                    .enumerate()
                    .map(|(i, &c)| round(e4m3(c) * scales[i / per_group]))
                    .collect();
                for kernel in kernels() {
                    let fast = x86::e4m3_moments_with(kernel, &codes, &scales, rounding);
                    if fast.is_none() && scales.iter().any(|s| s.abs() >= 128.0) {
                        // Left to the caller (the scale times 2^120 would overflow).
                        continue;
                    }
                    agree_with_general(fast, &values);
                }
            }
        }
    }
}
