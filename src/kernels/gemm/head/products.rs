//! Phases B1 and B2 of [`super::fused_ce`], the two gradient products on
//! the tile kernel: `∂hᵀ = f·(Wᵀ·Eᵀ)` (tiles carried across the vocabulary
//! blocks, added into ∂h at the chunk's end) and `∂W += Eᵀ·(f ⊙ h)`.

use ndarray::ArrayView2;
use rayon::prelude::*;

use super::super::micro::{Dst, Lhs, MR, NR, Rhs, Tile, TileFn};
use super::layout::{Chunk, MutPtr, Panel};
use super::{Isa, Rows, Task, run_on};

/// Depth of the blocks of the vocabulary in the ∂h product (16 KiB of E
/// per 16-row panel, which stays in L1 while the panels of Wᵀ pass).
const KC_V: usize = 256;
/// Depth of the blocks of chunk rows in the ∂W product (16 KiB of the
/// packed `f ⊙ h`, which stays in L1 while the panels of E pass).
const KC_T: usize = 256;
/// Panels of Wᵀ (6 columns of W each) that stay in L2 while a block of E
/// passes in the ∂h product.
const PANELS_B1: usize = 16;
/// Vocabulary panels per task of the ∂W product.
const PANELS_B2: usize = 16;

/// What phase B1 reads.
pub(super) struct B1Job<'a> {
    /// The variant's tile kernel.
    pub(super) tile: TileFn,
    /// Wᵀ packed ([`super::layout::pack_wt`]): `n_h6` panels, `wp_stride` apart.
    pub(super) wp: &'a [f32],
    pub(super) wp_stride: usize,
    pub(super) n_h6: usize,
    /// H.
    pub(super) hd: usize,
    /// The block's first vocabulary row and its rows.
    pub(super) vb0: usize,
    pub(super) vbw: usize,
    /// Whether this is the first block (the tiles are set, not added to).
    pub(super) first: bool,
}

/// Phase B1 on one vocabulary block: the ∂hᵀ tiles of the chunk's panels,
/// `ctiles[q·n_h6 + b] += Wᵀ_b·E_q` (set, not added, on the first block),
/// `gt` panels a task.
pub(super) fn hidden_product(isa: Isa, job: &B1Job<'_>, gt: usize, ctiles: &mut [Tile], e: &[f32]) {
    ctiles
        .par_chunks_mut(gt * job.n_h6)
        .zip(e.par_chunks(gt * NR * job.vbw))
        .for_each(|(ct, e)| run_on(isa, B1Task { job, ct, e }));
}

/// One task of phase B1: the ∂hᵀ tiles `ct` of some chunk panels and
/// their part of E.
struct B1Task<'a, 'j> {
    job: &'a B1Job<'j>,
    ct: &'a mut [Tile],
    e: &'a [f32],
}

impl Task for B1Task<'_, '_> {
    #[inline(always)]
    fn run<const AVX2: bool>(self) {
        phase_b1_body(self.job, self.ct, self.e)
    }
}

/// ∂hᵀ tiles of some chunk panels: `ct[q·n_h6 + b] += Wᵀ_b·E_q` over the block.
#[inline(always)]
fn phase_b1_body(job: &B1Job<'_>, ct: &mut [Tile], e: &[f32]) {
    let n = ct.len() / job.n_h6;
    let pe = NR * job.vbw;
    for k0 in (0..job.vbw).step_by(KC_V) {
        let kc = KC_V.min(job.vbw - k0);
        let add = !(job.first && k0 == 0);
        for b0 in (0..job.n_h6).step_by(PANELS_B1) {
            for q in 0..n {
                let rhs = Rhs {
                    ptr: e[q * pe + k0 * NR..].as_ptr(),
                    rs: NR,
                };
                for b in b0..(b0 + PANELS_B1).min(job.n_h6) {
                    let rows = MR.min(job.hd - b * MR);
                    let lhs = Lhs::strided(
                        job.wp[b * job.wp_stride + (job.vb0 + k0) * MR..].as_ptr(),
                        1,
                        MR,
                    );
                    // SAFETY: the packed Wᵀ panel holds V steps of MR floats
                    // and (vb0 + k0 + kc) ≤ V; E holds the block's vbw rows
                    // of 16 floats for each panel, and k0 + kc ≤ vbw.
                    unsafe {
                        (job.tile)(
                            kc,
                            rows,
                            lhs,
                            rhs,
                            Dst::tile(&mut ct[q * job.n_h6 + b]),
                            add,
                        )
                    };
                }
            }
        }
    }
}

/// The end of phase B1 for a chunk: `∂h[rows[a]] += f_a·(∂hᵀ tiles)ᵀ`, row
/// by row, into the gradient at `g` (no task runs meanwhile).
pub(super) fn add_hidden_rows(
    h: ArrayView2<'_, f32>,
    rows: Rows<'_>,
    c: &Chunk,
    ctiles: &[Tile],
    g: MutPtr,
) {
    let hd = h.ncols();
    let n_h6 = hd.div_ceil(MR);
    for (i, &r) in rows.rows[c.a0..c.a1].iter().enumerate() {
        let (p, j) = (i / NR, i % NR);
        let fi = c.f[p][j];
        for hb in 0..n_h6 {
            let t = &ctiles[p * n_h6 + hb];
            for (rr, trow) in t.iter().enumerate().take(MR.min(hd - hb * MR)) {
                let col = hb * MR + rr;
                // SAFETY: (r, col) is inside ∂h (checked: h's shape, r <
                // rows of h, col < H), and no task runs now.
                unsafe { *g.ptr.add(r * g.rs + col * g.cs) += fi * trow[j] };
            }
        }
    }
}

/// What phase B2 reads.
pub(super) struct B2Job<'a> {
    /// The variant's tile kernel.
    pub(super) tile: TileFn,
    /// The block's E (G = f·E), `[chunk panel][vbw rows][16]`.
    pub(super) e: &'a [f32],
    /// The block's first vocabulary row and its rows.
    pub(super) vb0: usize,
    pub(super) vbw: usize,
    /// Rows of the chunk, padded to whole panels.
    pub(super) kt: usize,
    /// `f ⊙ h` packed ([`pack_scaled_rows`]): `n_h16` panels of 16 columns.
    pub(super) hpp: &'a [f32],
    pub(super) n_h16: usize,
    /// H.
    pub(super) hd: usize,
    /// Each split's ∂W_k, where wanted.
    pub(super) gw: &'a [Option<MutPtr>],
}

/// The right side of phase B2 for a chunk: `f ⊙ h` of its rows, packed
/// `[h panel][row][16]` into `hpp`, zero past the rows and past H. Returns
/// the rows, padded to whole panels.
pub(super) fn pack_scaled_rows(
    h: ArrayView2<'_, f32>,
    rows: Rows<'_>,
    c: &Chunk,
    hpp: &mut Vec<f32>,
) -> usize {
    let n_h16 = h.ncols().div_ceil(NR);
    let kt = c.np * NR;
    hpp.clear();
    hpp.resize(n_h16 * kt * NR, 0.0);
    for (i, &r) in rows.rows[c.a0..c.a1].iter().enumerate() {
        let fi = c.f[i / NR][i % NR];
        for (k, &x) in h.row(r).iter().enumerate() {
            hpp[(k / NR) * kt * NR + i * NR + k % NR] = fi * x;
        }
    }
    kt
}

/// Phase B2 on one vocabulary block: `∂W[panel rows] += Eᵀ·(f ⊙ h)` for
/// the block's `panels` of the splits in `want_w`, [`PANELS_B2`] a task.
pub(super) fn weight_product(isa: Isa, job: &B2Job<'_>, panels: &[Panel], want_w: &[bool]) {
    let mine: Vec<Panel> = panels.iter().copied().filter(|p| want_w[p.split]).collect();
    mine.par_chunks(PANELS_B2)
        .for_each(|ps| run_on(isa, B2Task { job, ps }));
}

/// One task of phase B2: the vocabulary panels `ps`, whose rows of ∂W it
/// alone writes.
struct B2Task<'a, 'j> {
    job: &'a B2Job<'j>,
    ps: &'a [Panel],
}

impl Task for B2Task<'_, '_> {
    #[inline(always)]
    fn run<const AVX2: bool>(self) {
        phase_b2_body(self.job, self.ps)
    }
}

/// `∂W[panel rows] += Eᵀ·(f ⊙ h)` for the panels `ps`.
#[inline(always)]
fn phase_b2_body(job: &B2Job<'_>, ps: &[Panel]) {
    let mut t: Tile = [[0.0; NR]; MR];
    for t0 in (0..job.kt).step_by(KC_T) {
        let kc = KC_T.min(job.kt - t0);
        for hb in 0..job.n_h16 {
            let cols = NR.min(job.hd - hb * NR);
            let rhs = Rhs {
                ptr: job.hpp[hb * job.kt * NR + t0 * NR..].as_ptr(),
                rs: NR,
            };
            for pan in ps {
                let g = job.gw[pan.split].expect("a wanted split");
                let lhs = Lhs {
                    ptr: job.e[(t0 / NR) * NR * job.vbw + (pan.global - job.vb0) * NR..].as_ptr(),
                    rs: NR,
                    cs: 1,
                    kb: NR,
                    bs: NR * job.vbw,
                };
                let corner = g.ptr.wrapping_add(pan.local * g.rs + hb * NR * g.cs);
                if cols == NR && g.cs == 1 {
                    // SAFETY: E holds, for each chunk panel, the block's
                    // rows of 16 floats (bs apart), and t0 + kc ≤ kt; the
                    // packed f ⊙ h holds kt steps of 16 floats per column
                    // panel; rows local..local + rows and columns
                    // hb·16..hb·16 + 16 are inside ∂W_k, and this task alone
                    // owns the panel's rows.
                    unsafe {
                        (job.tile)(
                            kc,
                            pan.rows,
                            lhs,
                            rhs,
                            Dst {
                                ptr: corner,
                                rs: g.rs,
                            },
                            true,
                        )
                    };
                    continue;
                }
                for (r, row) in t.iter_mut().enumerate().take(pan.rows) {
                    for (c, x) in row.iter_mut().enumerate().take(cols) {
                        // SAFETY: row local + r < size_k and column
                        // hb·16 + c < H are inside ∂W_k; this task alone
                        // owns the panel's rows.
                        *x = unsafe { *corner.add(r * g.rs + c * g.cs) };
                    }
                    row[cols..].fill(0.0);
                }
                // SAFETY: as above, into the tile.
                unsafe { (job.tile)(kc, pan.rows, lhs, rhs, Dst::tile(&mut t), true) };
                for (r, row) in t.iter().enumerate().take(pan.rows) {
                    for (c, &x) in row.iter().enumerate().take(cols) {
                        // SAFETY: as for the load above.
                        unsafe { *corner.add(r * g.rs + c * g.cs) = x };
                    }
                }
            }
        }
    }
}
