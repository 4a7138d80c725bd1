//! Sixteen rows of sixteen `f32` turned into sixteen columns, for NVFP4's kernels, which take
//! sixteen groups side by side (each lane a group). Written element by element, the compiler
//! made the turn 256 scalar stores whose rows, read back at once as vectors, waited on the
//! stores to retire (an eighth of a save's time), or 16 gathers, slower still; it makes no
//! shuffles of it. The shuffles are written here for AVX-512 and AVX, each checked against the
//! element-wise turn, which processors without AVX2 keep.

/// Rows of values as the kernels take them, and their turn.
pub type Square = [[f32; 16]; 16];

/// `rows` turned: element `[i][j]` of the result is `rows[j][i]`.
pub fn transposed(rows: &Square) -> Square {
    let mut columns = [[0f32; 16]; 16];
    for (j, row) in rows.iter().enumerate() {
        for (column, &x) in columns.iter_mut().zip(row) {
            column[j] = x;
        }
    }
    columns
}

/// [`transposed`] in AVX-512 registers: interleaved by pairs of values, then of pairs, then by
/// 128-bit quarters twice.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub fn transposed_avx512(rows: &Square) -> Square {
    use core::arch::x86_64::{
        __m512, _mm512_castpd_ps, _mm512_castps_pd, _mm512_shuffle_f32x4, _mm512_unpackhi_pd,
        _mm512_unpackhi_ps, _mm512_unpacklo_pd, _mm512_unpacklo_ps,
    };
    let r: [__m512; 16] = bytemuck::cast(*rows);
    // Rows 2k and 2k+1 interleaved value by value: pairs of each column.
    let pairs: [__m512; 16] = core::array::from_fn(|i| {
        let (a, b) = (r[i & !1], r[i | 1]);
        if i & 1 == 0 {
            _mm512_unpacklo_ps(a, b)
        } else {
            _mm512_unpackhi_ps(a, b)
        }
    });
    // Pairs interleaved by twos: within each quarter, one column of four rows.
    let fours: [__m512; 16] = core::array::from_fn(|i| {
        let base = i & !3;
        let half = (i >> 1) & 1;
        let (a, b) = (
            _mm512_castps_pd(pairs[base + half]),
            _mm512_castps_pd(pairs[base + 2 + half]),
        );
        _mm512_castpd_ps(if i & 1 == 0 {
            _mm512_unpacklo_pd(a, b)
        } else {
            _mm512_unpackhi_pd(a, b)
        })
    });
    // Quarters gathered from four rows to eight, then to sixteen.
    let eights: [__m512; 16] = core::array::from_fn(|i| {
        let (a, b) = (fours[(i & 8) + (i & 3)], fours[(i & 8) + 4 + (i & 3)]);
        if i & 4 == 0 {
            _mm512_shuffle_f32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_f32x4::<0xDD>(a, b)
        }
    });
    let columns: [__m512; 16] = core::array::from_fn(|i| {
        let (a, b) = (eights[i & 7], eights[8 + (i & 7)]);
        if i & 8 == 0 {
            _mm512_shuffle_f32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_f32x4::<0xDD>(a, b)
        }
    });
    bytemuck::cast(columns)
}

/// [`transposed`] in AVX registers: each of the four 8 × 8 blocks turned and put in the other's
/// place.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
pub fn transposed_avx(rows: &Square) -> Square {
    use core::arch::x86_64::__m256;
    let halves: [[__m256; 2]; 16] = bytemuck::cast(*rows);
    let mut columns = [[halves[0][0]; 2]; 16];
    for block_row in 0..2 {
        for block_column in 0..2 {
            let block: [__m256; 8] =
                core::array::from_fn(|i| halves[8 * block_row + i][block_column]);
            for (i, column) in transposed_8x8(block).into_iter().enumerate() {
                columns[8 * block_column + i][block_row] = column;
            }
        }
    }
    bytemuck::cast(columns)
}

/// Eight rows of eight turned in AVX registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
fn transposed_8x8(r: [core::arch::x86_64::__m256; 8]) -> [core::arch::x86_64::__m256; 8] {
    use core::arch::x86_64::{
        __m256, _mm256_permute2f128_ps, _mm256_shuffle_ps, _mm256_unpackhi_ps, _mm256_unpacklo_ps,
    };
    let pairs: [__m256; 8] = core::array::from_fn(|i| {
        let (a, b) = (r[i & !1], r[i | 1]);
        if i & 1 == 0 {
            _mm256_unpacklo_ps(a, b)
        } else {
            _mm256_unpackhi_ps(a, b)
        }
    });
    let fours: [__m256; 8] = core::array::from_fn(|i| {
        let base = i & !3;
        let half = (i >> 1) & 1;
        let (a, b) = (pairs[base + half], pairs[base + 2 + half]);
        if i & 1 == 0 {
            _mm256_shuffle_ps::<0x44>(a, b)
        } else {
            _mm256_shuffle_ps::<0xEE>(a, b)
        }
    });
    core::array::from_fn(|i| {
        let (a, b) = (fours[i & 3], fours[4 + (i & 3)]);
        if i & 4 == 0 {
            _mm256_permute2f128_ps::<0x20>(a, b)
        } else {
            _mm256_permute2f128_ps::<0x31>(a, b)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use multiversion::multiversion;
    use multiversion::target::match_target;

    /// Each turn in registers this processor runs (the element-wise one without AVX2), named.
    #[multiversion(targets("x86_64+avx512f", "x86_64+avx2"))]
    fn register_turns(rows: &Square) -> Vec<(&'static str, Square)> {
        match_target! {
            "x86_64+avx512f" => vec![
                ("AVX-512", transposed_avx512(rows)),
                ("AVX", transposed_avx(rows)),
            ],
            "x86_64+avx2" => vec![("AVX", transposed_avx(rows))],
            _ => vec![("element by element", transposed(rows))],
        }
    }

    #[test]
    fn every_turn_puts_each_value_in_its_column() {
        let rows: Square = core::array::from_fn(|i| {
            core::array::from_fn(|j| f32::from(u16::try_from(16 * i + j).unwrap_or(0)))
        });
        let columns = transposed(&rows);
        for (i, column) in columns.iter().enumerate() {
            for (j, &x) in column.iter().enumerate() {
                assert_eq!(x, rows[j][i], "[{i}][{j}]");
            }
        }
        for (name, turned) in register_turns(&rows) {
            assert_eq!(turned, columns, "{name}");
        }
    }
}
