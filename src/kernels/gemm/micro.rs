//! The micro-kernel: one 6 × 16 tile of a product, `T[r][j] = Σ_k A(r, k)·B(k, j)`,
//! in registers, written out once.
//!
//! Every element of the tile is one chain of fused multiply-adds in
//! increasing k from 0, `p ← fma(A(r, k), B(k, j), p)`, then either stored
//! or added to what the destination holds (`add`: `c ← c + p`, one
//! rounding). The AVX2 variant computes the same chain lane by lane, so it
//! gives the scalar variant's bits exactly. When adding, the destination's
//! rows are prefetched before the chain and read after it, so a
//! destination in memory costs no wait.
//!
//! The operands are addressed, not packed: `A(r, k)` is a broadcast from
//! `a.ptr + r·a.rs + (k / a.kb)·a.bs + (k % a.kb)·a.cs` (so A may be the rows
//! of a matrix, a packed panel, or panels of 16 columns one after another),
//! and `B(k, 0..16)` is 16 consecutive floats at `b.ptr + k·b.rs`.

/// Rows of a tile (the broadcast operand).
pub const MR: usize = 6;
/// Columns of a tile (the vector operand): two 8-lane vectors.
pub const NR: usize = 16;

/// A tile of the product, row by row.
pub type Tile = [[f32; NR]; MR];

/// Where the tile's broadcast operand is: element (r, k) at
/// `ptr + r·rs + (k / kb)·bs + (k % kb)·cs`.
#[derive(Clone, Copy, Debug)]
pub struct Lhs {
    /// Element (0, 0).
    pub ptr: *const f32,
    /// Step between rows.
    pub rs: usize,
    /// Step between consecutive k within a block.
    pub cs: usize,
    /// k per block (at least 1; `usize::MAX` for one block).
    pub kb: usize,
    /// Step between blocks of k.
    pub bs: usize,
}

impl Lhs {
    /// Rows of a matrix, or a packed panel: element (r, k) at `ptr + r·rs + k·cs`.
    pub fn strided(ptr: *const f32, rs: usize, cs: usize) -> Self {
        Lhs {
            ptr,
            rs,
            cs,
            kb: usize::MAX,
            bs: 0,
        }
    }
}

/// Where the tile's vector operand is: `B(k, 0..16)` at `ptr + k·rs`.
#[derive(Clone, Copy, Debug)]
pub struct Rhs {
    /// `B(0, 0)`.
    pub ptr: *const f32,
    /// Step between consecutive k.
    pub rs: usize,
}

/// Where a tile goes: row r is the 16 floats at `ptr + r·rs`.
#[derive(Clone, Copy, Debug)]
pub struct Dst {
    /// Row 0.
    pub ptr: *mut f32,
    /// Step between rows.
    pub rs: usize,
}

impl Dst {
    /// A [`Tile`] in memory.
    pub fn tile(t: &mut Tile) -> Self {
        Dst {
            ptr: t.as_mut_ptr().cast(),
            rs: NR,
        }
    }
}

/// A micro-kernel: computes rows `0..rows` (1 ≤ rows ≤ [`MR`]) of the tile
/// over `k` steps and stores them in `out`, or adds them to `out` when
/// `add` (rows past `rows` untouched).
///
/// # Safety
///
/// For every r < rows and k' < k, `A(r, k')` and the 16 floats of `B(k', ·)`
/// must be readable, and the 16 floats of each row r < rows of `out`
/// readable and writable, and not read or written by anyone else meanwhile.
pub type TileFn = unsafe fn(k: usize, rows: usize, a: Lhs, b: Rhs, out: Dst, add: bool);

/// The reference: one `mul_add` chain per element.
///
/// # Safety
///
/// As [`TileFn`].
pub unsafe fn tile_scalar(k: usize, rows: usize, a: Lhs, b: Rhs, out: Dst, add: bool) {
    let kb = a.kb.max(1);
    for r in 0..rows.min(MR) {
        for j in 0..NR {
            // SAFETY: row r < rows of `out` is writable (the caller's contract).
            let c = unsafe { &mut *out.ptr.add(r * out.rs + j) };
            let mut acc = 0.0f32;
            for kk in 0..k {
                let at = r * a.rs + (kk / kb) * a.bs + (kk % kb) * a.cs;
                // SAFETY: the caller guarantees A(r, kk) and B(kk, j) are
                // readable for r < rows, kk < k, j < 16.
                let (x, y) = unsafe { (*a.ptr.add(at), *b.ptr.add(kk * b.rs + j)) };
                acc = x.mul_add(y, acc);
            }
            *c = if add { *c + acc } else { acc };
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::{Dst, Lhs, Rhs};
    use std::arch::x86_64::*;

    /// The AVX2 + FMA kernel for `R` rows: 2·R accumulators. Callers
    /// compiled for AVX2 and FMA may call it directly, so that it is
    /// inlined into their loops.
    ///
    /// # Safety
    ///
    /// As [`super::TileFn`], and the CPU must have AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn rows<const R: usize>(k: usize, a: Lhs, b: Rhs, out: Dst, add: bool) {
        let mut c0 = [_mm256_setzero_ps(); R];
        let mut c1 = [_mm256_setzero_ps(); R];
        if add {
            for r in 0..R {
                // A prefetch never faults; the rows are read after the chain.
                let p = out.ptr.wrapping_add(r * out.rs).cast::<i8>().cast_const();
                _mm_prefetch::<_MM_HINT_T0>(p);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(60));
            }
        }
        let kb = a.kb.max(1);
        let mut bp = b.ptr;
        let mut block = a.ptr;
        let mut left = k;
        while left > 0 {
            let len = kb.min(left);
            if len < left {
                // The next block of A is elsewhere (a panel of 16 columns of
                // another part): ask for its rows now. A prefetch never faults.
                let next = block.wrapping_add(a.bs);
                for r in 0..R {
                    _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(r * a.rs).cast::<i8>());
                }
            }
            let mut off = 0usize;
            for _ in 0..len {
                // SAFETY: B(k', 0..16) is readable for every k' < k (the
                // caller's contract), and `bp` is B(k', 0) for the current k'.
                let (b0, b1) = unsafe { (_mm256_loadu_ps(bp), _mm256_loadu_ps(bp.add(8))) };
                for r in 0..R {
                    // SAFETY: A(r, k') is readable for r < R, k' < k; `block
                    // + r·rs + off` is its address.
                    let x = unsafe { _mm256_broadcast_ss(&*block.add(r * a.rs + off)) };
                    c0[r] = _mm256_fmadd_ps(x, b0, c0[r]);
                    c1[r] = _mm256_fmadd_ps(x, b1, c1[r]);
                }
                off += a.cs;
                // SAFETY: stays within (or one step past) the B the caller
                // made readable; the last step is not dereferenced.
                bp = bp.wrapping_add(b.rs);
            }
            block = block.wrapping_add(a.bs);
            left -= len;
        }
        for r in 0..R {
            // SAFETY: rows r < R of `out` hold 16 readable, writable floats.
            unsafe {
                let p = out.ptr.add(r * out.rs);
                if add {
                    c0[r] = _mm256_add_ps(_mm256_loadu_ps(p), c0[r]);
                    c1[r] = _mm256_add_ps(_mm256_loadu_ps(p.add(8)), c1[r]);
                }
                _mm256_storeu_ps(p, c0[r]);
                _mm256_storeu_ps(p.add(8), c1[r]);
            }
        }
    }

    /// The AVX2 + FMA kernel.
    ///
    /// # Safety
    ///
    /// As [`super::TileFn`], and the CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tile(k: usize, rows_: usize, a: Lhs, b: Rhs, out: Dst, add: bool) {
        // SAFETY: the caller's contract is that of each `rows::<R>` with
        // R = rows_, and the CPU has the features.
        unsafe {
            match rows_ {
                0 => {}
                1 => rows::<1>(k, a, b, out, add),
                2 => rows::<2>(k, a, b, out, add),
                3 => rows::<3>(k, a, b, out, add),
                4 => rows::<4>(k, a, b, out, add),
                5 => rows::<5>(k, a, b, out, add),
                _ => rows::<6>(k, a, b, out, add),
            }
        }
    }
}
