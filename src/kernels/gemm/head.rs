//! The fused cross-entropy of the LM head on the tile kernel (f32).
//!
//! Rows of hidden states h_i (H) against split weights `W = [W_0; W_1; …]`
//! (V × H), each row with one or more tokens and their labels. A call walks
//! the rows in chunks; for a chunk:
//!
//! ```text
//! A   for each 6-row panel of W and 16-row panel of the chunk:
//!       tile = W_panel·h_panelᵀ                  (6 × 16 logits, registers)
//!       on the tile: column max, e = exp(z − s) with a per-row shift s,
//!       row sums Σ e, the label logits; e stored in E (rows × V)
//!     s is the first tile's maximum, raised only when a later tile exceeds
//!     it by MARGIN (then the row's earlier e are rescaled): e ≤ e^MARGIN.
//!     With the row's sum T and true max m: ln Σ_v e^{z_v − m} = ln T + (s − m),
//!     f = (Σ weights)/T, and the label's entry gets −T·w/(Σ weights), so
//!     that G = f·E = softmax·Σw − Σ w·onehot.
//! B1  ∂h_iᵀ = f_i·(Wᵀ·E_iᵀ)                     (W packed once per call)
//! B2  ∂W   += Eᵀ·(f ⊙ h)
//! ```
//!
//! The logits tile is never written: only its exponentials are. Given the
//! rows' statistics (the per-token backward), phase A writes G itself,
//! `w·exp((z − m) − ln Σ) − w_n·onehot`, vocabulary block by block.
//!
//! Each row's statistics are computed by one task in increasing v; each
//! element of ∂h is one chain of fused multiply-adds over v in order, and
//! each element of ∂W one chain over the rows in order, continued from
//! chunk to chunk. How the work is split between tasks changes none of
//! these, so the results are the same bits for any thread count, and the
//! scalar and AVX2 variants give the same bits too.

use std::mem::MaybeUninit;

use ndarray::{ArrayView2, ArrayViewMut2};
use rayon::prelude::*;

use super::micro::{Dst, Lhs, MR, NR, Rhs, Tile, TileFn};
use super::{Isa, pack};
use crate::kernels::exp::exp_fma;
use crate::kernels::pool::Pool;

/// How far a later logit may exceed a row's shift before the shift is
/// raised: e^40 ≈ 2.4·10¹⁷, so a row's sum stays far from f32's range
/// for any vocabulary below 10²⁰ words.
pub const MARGIN: f32 = 40.0;

/// Depth of the blocks of the vocabulary in the ∂h product (16 KiB of E
/// per 16-row panel, which stays in L1 while the panels of Wᵀ pass).
const KC_V: usize = 256;
/// Depth of the blocks of H in the logits product (16 KiB of a packed
/// chunk panel, which stays in L1 while the panels of W pass).
const KC_H: usize = 512;
/// Depth of the blocks of chunk rows in the ∂W product (16 KiB of the
/// packed `f ⊙ h`, which stays in L1 while the panels of E pass).
const KC_T: usize = 256;
/// Vocabulary panels whose rows of W stay in L2 while the chunk panels
/// pass (96 rows: 96 KiB for H = 256 of a block).
const PANELS_A: usize = 16;
/// Panels of Wᵀ (6 columns of W each) that stay in L2 while a block of E
/// passes in the ∂h product.
const PANELS_B1: usize = 16;
/// Vocabulary panels per task of the ∂W product.
const PANELS_B2: usize = 16;

/// What a call computes.
#[derive(Clone, Copy, Debug)]
pub enum Pass<'a> {
    /// Each row's statistics and each token's loss.
    Loss,
    /// The loss, and the gradients of `Σ_n loss_n` (every token weighs 1).
    LossAndGrads,
    /// The gradients of `Σ_n w_n·loss_n`, given each row's statistics
    /// (from a [`Pass::Loss`] call) and each token's weight `w_n`.
    Grads {
        /// Each row's maximum logit.
        max: &'a [f32],
        /// Each row's `ln Σ_v e^{z_v − max}`.
        log_sum: &'a [f32],
        /// Each token's weight (the upstream gradient of its loss).
        weights: &'a [f32],
    },
}

/// The rows of a call and their tokens' labels.
#[derive(Clone, Copy, Debug)]
pub struct Rows<'a> {
    /// Row `a` of the call is row `rows[a]` of h.
    pub rows: &'a [usize],
    /// Row `a`'s tokens are `starts[a]..starts[a + 1]` (one more entry than rows).
    pub starts: &'a [usize],
    /// Each token's label, a global vocabulary index below V.
    pub labels: &'a [usize],
}

/// The gradients a call adds into.
#[derive(Debug, Default)]
pub struct Out<'a> {
    /// ∂h: row `rows[a]` gets row a's gradient added, when wanted.
    pub hidden: Option<ArrayViewMut2<'a, f32>>,
    /// ∂W_k (size_k × H) for each split, when wanted.
    pub weights: Vec<Option<ArrayViewMut2<'a, f32>>>,
}

/// What a loss pass returns.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Each row's maximum logit.
    pub max: Vec<f32>,
    /// Each row's `ln Σ_v e^{z_v − max}`.
    pub log_sum: Vec<f32>,
    /// Each token's loss `(max − z_label) + log_sum`, in the tokens' order.
    pub loss: Vec<f32>,
}

/// One 6-row panel of the vocabulary: split, first local row, first
/// global row, rows.
#[derive(Clone, Copy, Debug)]
struct Panel {
    split: usize,
    local: usize,
    global: usize,
    rows: usize,
}

/// A label met by the tiles of one 16-row panel of the chunk.
#[derive(Clone, Copy, Debug)]
struct Lab {
    /// Global vocabulary row.
    v: usize,
    /// Column of the panel (the chunk row within it).
    j: usize,
    /// The token (index into labels).
    slot: usize,
}

/// The running state of the 16 chunk rows of one panel.
#[derive(Clone, Copy, Debug)]
struct Cols {
    /// The shift the exponentials are taken from (in a [`Pass::Grads`]
    /// call: the row's given log-sum).
    s: [f32; NR],
    /// The running maximum (in a [`Pass::Grads`] call: the given one).
    m: [f32; NR],
    /// Σ e^{z − s} so far.
    t: [f64; NR],
}

impl Cols {
    fn new() -> Self {
        Cols {
            s: [f32::NEG_INFINITY; NR],
            m: [f32::NEG_INFINITY; NR],
            t: [0.0; NR],
        }
    }
}

/// A weight as a pointer with non-negative strides.
#[derive(Clone, Copy, Debug)]
struct WPtr {
    ptr: *const f32,
    rs: usize,
    cs: usize,
}

// SAFETY: the pointer is read only, from views that outlive the call.
unsafe impl Send for WPtr {}
// SAFETY: as above.
unsafe impl Sync for WPtr {}

/// A writable pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy, Debug)]
struct MutPtr {
    ptr: *mut f32,
    rs: usize,
    cs: usize,
}

// SAFETY: each task writes rows no other task writes.
unsafe impl Send for MutPtr {}
// SAFETY: as above.
unsafe impl Sync for MutPtr {}

/// The fused cross-entropy (see the module documentation).
///
/// h: (rows of h, H); `weights[k]`: (size_k, H), V = Σ size_k. Rows are
/// taken `chunk_rows` at a time (at least 1); a [`Pass::Grads`] call holds
/// at most `vocab_block` vocabulary rows of G at once, the others the whole
/// vocabulary (`16·ceil(chunk_rows/16) × V` floats of workspace, from
/// `pool`). Returns the statistics (empty for [`Pass::Grads`]).
///
/// **Panics** if the shapes disagree, a label is ≥ V, or `isa` is not
/// available.
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn fused_ce(
    isa: Isa,
    pool: &Pool<f32>,
    h: ArrayView2<'_, f32>,
    weights: &[ArrayView2<'_, f32>],
    rows: Rows<'_>,
    pass: Pass<'_>,
    chunk_rows: usize,
    vocab_block: usize,
    out: &mut Out<'_>,
) -> Stats {
    let tile = isa.tile_fn();
    let hd = h.ncols();
    let n_rows = rows.rows.len();
    assert_eq!(
        rows.starts.len(),
        n_rows + 1,
        "fused_ce: one start per row and one more"
    );
    assert_eq!(
        *rows.starts.last().unwrap_or(&0),
        rows.labels.len(),
        "fused_ce: the starts end at the labels' end"
    );
    assert!(
        weights.iter().all(|w| w.ncols() == hd),
        "fused_ce: widths differ"
    );
    assert!(
        out.weights.is_empty() || out.weights.len() == weights.len(),
        "fused_ce: one gradient slot per weight"
    );
    let v_total: usize = weights.iter().map(|w| w.nrows()).sum();
    assert!(
        rows.labels.iter().all(|&l| l < v_total),
        "fused_ce: a label is outside 0..{v_total}"
    );
    assert!(
        rows.rows.iter().all(|&r| r < h.nrows()),
        "fused_ce: a row is outside h"
    );
    if let Some(gh) = &out.hidden {
        assert_eq!(gh.dim(), h.dim(), "fused_ce: ∂h has h's shape");
    }
    for (g, w) in out.weights.iter().zip(weights) {
        if let Some(g) = g {
            assert_eq!(g.dim(), w.dim(), "fused_ce: ∂W_k has W_k's shape");
        }
    }
    if let Pass::Grads {
        max,
        log_sum,
        weights: gw,
    } = pass
    {
        assert!(
            max.len() == n_rows && log_sum.len() == n_rows && gw.len() == rows.labels.len(),
            "fused_ce: statistics for every row, a weight for every token"
        );
    }
    let mut stats = Stats::default();
    let loss_pass = !matches!(pass, Pass::Grads { .. });
    if loss_pass {
        stats.max = vec![0.0; n_rows];
        stats.log_sum = vec![0.0; n_rows];
        stats.loss = vec![0.0; rows.labels.len()];
    }
    if n_rows == 0 {
        return stats;
    }

    // Non-negative strides for the raw walks (a copy otherwise).
    let owned: Vec<Option<ndarray::Array2<f32>>> = weights
        .iter()
        .map(|w| (w.strides().iter().any(|&s| s < 0)).then(|| w.as_standard_layout().into_owned()))
        .collect();
    let wviews: Vec<ArrayView2<'_, f32>> = weights
        .iter()
        .zip(&owned)
        .map(|(w, o)| o.as_ref().map_or(w.view(), |o| o.view()))
        .collect();
    let wptrs: Vec<WPtr> = wviews
        .iter()
        .map(|w| WPtr {
            ptr: w.as_ptr(),
            rs: w.strides()[0] as usize,
            cs: w.strides()[1] as usize,
        })
        .collect();
    let mut panels = Vec::new();
    let mut start = 0;
    for (k, w) in wviews.iter().enumerate() {
        for local in (0..w.nrows()).step_by(MR) {
            panels.push(Panel {
                split: k,
                local,
                global: start + local,
                rows: MR.min(w.nrows() - local),
            });
        }
        start += w.nrows();
    }

    let want_h = out.hidden.is_some() && !matches!(pass, Pass::Loss);
    let want_w: Vec<bool> = (0..weights.len())
        .map(|k| !matches!(pass, Pass::Loss) && out.weights.get(k).is_some_and(|g| g.is_some()))
        .collect();
    let grads = want_h || want_w.iter().any(|&w| w);
    let store = grads;

    // Vocabulary blocks: whole panels, at most `vocab_block` rows, except
    // that a pass that forms the softmax from the sums holds all of them.
    let blocks: Vec<(usize, usize)> = if matches!(pass, Pass::Grads { .. }) {
        let cap = vocab_block.max(1);
        let mut out = Vec::new();
        let mut p0 = 0;
        while p0 < panels.len() {
            let mut p1 = p0 + 1;
            while p1 < panels.len()
                && panels[p1].global + panels[p1].rows - panels[p0].global <= cap
            {
                p1 += 1;
            }
            out.push((p0, p1));
            p0 = p1;
        }
        out
    } else {
        vec![(0, panels.len())]
    };
    let block_rows = |&(p0, p1): &(usize, usize)| {
        if p1 > p0 {
            panels[p1 - 1].global + panels[p1 - 1].rows - panels[p0].global
        } else {
            0
        }
    };
    let max_block = blocks.iter().map(block_rows).max().unwrap_or(0);

    // ∂h's product reads Wᵀ in panels of MR columns, packed once.
    let n_h6 = hd.div_ceil(MR);
    let wp_stride = v_total * MR;
    let mut wp: Vec<f32> = Vec::new();
    if want_h {
        wp = pool.take_vec(n_h6 * wp_stride);
        let space = &mut wp.spare_capacity_mut()[..n_h6 * wp_stride];
        let mut s = 0;
        for w in &wviews {
            pack::pack_transposed_into(w.view(), s, wp_stride, space);
            s += w.nrows();
        }
        // SAFETY: the splits' rows are 0..V, so the packing wrote every
        // element of every panel (columns past H as zeros).
        unsafe { wp.set_len(n_h6 * wp_stride) };
    }

    let chunk = chunk_rows.max(1);
    let p_max = chunk.min(n_rows).div_ceil(NR);
    // E is written whole by phase A before anything reads it: no zeros.
    let mut ebuf: Vec<f32> = Vec::new();
    if store {
        ebuf = pool.take_vec(p_max * NR * max_block);
    }
    let espace: &mut [MaybeUninit<f32>] = if store {
        &mut ebuf.spare_capacity_mut()[..p_max * NR * max_block]
    } else {
        &mut []
    };
    let threads = rayon::current_num_threads().max(1);
    let n_h16 = hd.div_ceil(NR);
    let mut hp: Vec<f32> = Vec::new();
    let mut hpp: Vec<f32> = Vec::new();
    let mut ctiles: Vec<Tile> = Vec::new();
    let ghp = out.hidden.as_mut().map(|g| MutPtr {
        ptr: g.as_mut_ptr(),
        rs: g.strides()[0] as usize,
        cs: g.strides()[1] as usize,
    });
    let gwp: Vec<Option<MutPtr>> = (0..weights.len())
        .map(|k| {
            if !want_w[k] {
                return None;
            }
            out.weights[k].as_mut().map(|g| MutPtr {
                ptr: g.as_mut_ptr(),
                rs: g.strides()[0] as usize,
                cs: g.strides()[1] as usize,
            })
        })
        .collect();
    for s in gwp.iter().flatten().chain(ghp.iter()) {
        assert!(
            (s.rs as isize) >= 0 && (s.cs as isize) >= 0,
            "fused_ce: gradients with negative strides"
        );
    }

    for a0 in (0..n_rows).step_by(chunk) {
        let a1 = (a0 + chunk).min(n_rows);
        let nc = a1 - a0;
        let np = nc.div_ceil(NR);
        // The chunk's rows, packed: [panel][k][16], zero past the last row.
        hp.clear();
        hp.resize(np * hd * NR, 0.0);
        for (i, &r) in rows.rows[a0..a1].iter().enumerate() {
            let (p, j) = (i / NR, i % NR);
            for (k, &x) in h.row(r).iter().enumerate() {
                hp[p * hd * NR + k * NR + j] = x;
            }
        }
        // Each panel's labels in vocabulary order.
        let labs: Vec<Vec<Lab>> = (0..np)
            .map(|p| {
                let mut l: Vec<Lab> = Vec::new();
                for j in 0..NR.min(nc - p * NR) {
                    let a = a0 + p * NR + j;
                    for slot in rows.starts[a]..rows.starts[a + 1] {
                        l.push(Lab {
                            v: rows.labels[slot],
                            j,
                            slot,
                        });
                    }
                }
                l.sort_by_key(|x| (x.v, x.slot));
                l
            })
            .collect();
        // Per column: Σ of its tokens' weights.
        let wsum: Vec<[f32; NR]> = (0..np)
            .map(|p| {
                let mut w = [0.0f32; NR];
                for (j, wj) in w.iter_mut().enumerate().take(NR.min(nc - p * NR)) {
                    let a = a0 + p * NR + j;
                    let toks = rows.starts[a]..rows.starts[a + 1];
                    *wj = match pass {
                        Pass::Grads { weights, .. } => weights[toks].iter().sum(),
                        _ => toks.len() as f32,
                    };
                }
                w
            })
            .collect();
        let mut cols = vec![Cols::new(); np];
        let mut zs: Vec<Vec<f32>> = labs.iter().map(|l| vec![0.0; l.len()]).collect();
        let grads_given = match pass {
            Pass::Grads {
                max,
                log_sum,
                weights,
            } => Some((max, log_sum, weights)),
            _ => None,
        };
        // Per-column statistics for the Grads pass.
        if let Some((max, log_sum, _)) = grads_given {
            for (p, c) in cols.iter_mut().enumerate() {
                // Padding columns weigh 0: finite statistics keep their G 0.
                c.m = [0.0; NR];
                c.s = [0.0; NR];
                for j in 0..NR.min(nc - p * NR) {
                    c.m[j] = max[a0 + p * NR + j];
                    c.s[j] = log_sum[a0 + p * NR + j];
                }
            }
        }
        let gt = group_size(np, hd, threads);
        if want_h {
            ctiles.clear();
            ctiles.resize(np * n_h6, [[0.0; NR]; MR]);
        }
        let mut f = vec![[0.0f32; NR]; np];
        for (bi, blk) in blocks.iter().enumerate() {
            let (p0, p1) = *blk;
            let vb0 = panels.get(p0).map_or(0, |p| p.global);
            let vbw = block_rows(blk);
            let ework: &mut [MaybeUninit<f32>] = if store {
                &mut espace[..np * NR * vbw]
            } else {
                &mut []
            };
            // Phase A.
            let job = AJob {
                tile,
                hp: &hp,
                hd,
                w: &wptrs,
                panels: &panels[p0..p1],
                vb0,
                vbw,
                store,
                grads_given: grads_given.map(|(_, _, w)| w),
            };
            let stride = if store { gt * NR * vbw } else { 0 };
            let groups: Vec<Group<'_>> = {
                let mut v = Vec::new();
                let mut cs: &mut [Cols] = &mut cols;
                let mut zr: &mut [Vec<f32>] = &mut zs;
                let mut g = 0;
                while !cs.is_empty() {
                    let n = gt.min(cs.len());
                    let (c0, c1) = cs.split_at_mut(n);
                    let (z0, z1) = zr.split_at_mut(n);
                    v.push((g, c0, z0));
                    cs = c1;
                    zr = z1;
                    g += n;
                }
                v
            };
            let mut eparts: Vec<&mut [MaybeUninit<f32>]> = if store {
                ework.chunks_mut(stride).collect()
            } else {
                (0..groups.len())
                    .map(|_| <&mut [MaybeUninit<f32>]>::default())
                    .collect()
            };
            groups
                .into_par_iter()
                .zip(eparts.par_iter_mut())
                .for_each(|((g0, cs, zr), e)| {
                    let n = cs.len();
                    phase_a(
                        isa,
                        &job,
                        g0,
                        cs,
                        zr,
                        e,
                        &labs[g0..g0 + n],
                        &wsum[g0..g0 + n],
                    );
                });
            drop(eparts);
            if !grads {
                continue;
            }
            // SAFETY: phase A wrote every element of the block: each chunk
            // panel's rows of every vocabulary panel, 16 columns each, and
            // the panels cover the block's rows. f32 has no invalid bits.
            let ework: &mut [f32] = unsafe { &mut *(std::ptr::from_mut(ework) as *mut [f32]) };
            if grads_given.is_some() {
                // G is final: f = 1.
                for (p, fp) in f.iter_mut().enumerate() {
                    fp[..NR.min(nc - p * NR)].fill(1.0);
                }
            } else {
                // Fold the labels into E and find f = Σw / T.
                for (p, c) in cols.iter().enumerate() {
                    for j in 0..NR.min(nc - p * NR) {
                        f[p][j] = (wsum[p][j] as f64 / c.t[j]) as f32;
                    }
                    for l in &labs[p] {
                        let at = p * NR * vbw + (l.v - vb0) * NR + l.j;
                        ework[at] -= (c.t[l.j] / wsum[p][l.j] as f64) as f32;
                    }
                }
            }
            let ework: &[f32] = ework;
            // Phase B1: ∂hᵀ tiles, carried across blocks.
            if want_h {
                let first = bi == 0;
                ctiles
                    .par_chunks_mut(gt * n_h6)
                    .zip(ework.par_chunks(gt * NR * vbw))
                    .for_each(|(ct, e)| {
                        let job = B1Job {
                            tile,
                            wp: &wp,
                            wp_stride,
                            n_h6,
                            hd,
                            vb0,
                            vbw,
                            first,
                        };
                        phase_b1(isa, &job, ct, e);
                    });
            }
            // Phase B2: ∂W rows of the block's panels.
            if want_w.iter().any(|&w| w) {
                // f ⊙ h, packed [h panel][row][16].
                let kt = np * NR;
                hpp.clear();
                hpp.resize(n_h16 * kt * NR, 0.0);
                for (i, &r) in rows.rows[a0..a1].iter().enumerate() {
                    let fi = f[i / NR][i % NR];
                    for (k, &x) in h.row(r).iter().enumerate() {
                        hpp[(k / NR) * kt * NR + i * NR + k % NR] = fi * x;
                    }
                }
                let mine: Vec<Panel> = panels[p0..p1]
                    .iter()
                    .copied()
                    .filter(|p| want_w[p.split])
                    .collect();
                let job = B2Job {
                    tile,
                    e: ework,
                    vb0,
                    vbw,
                    kt,
                    hpp: &hpp,
                    n_h16,
                    hd,
                    gw: &gwp,
                };
                mine.par_chunks(PANELS_B2)
                    .for_each(|ps| phase_b2(isa, &job, ps));
            }
        }
        // The chunk's statistics and losses.
        if loss_pass {
            for (p, c) in cols.iter().enumerate() {
                for j in 0..NR.min(nc - p * NR) {
                    let a = a0 + p * NR + j;
                    let ls = c.t[j].ln() + (c.s[j] as f64 - c.m[j] as f64);
                    stats.max[a] = c.m[j];
                    stats.log_sum[a] = ls as f32;
                }
                for (l, &z) in labs[p].iter().zip(&zs[p]) {
                    let a = a0 + p * NR + l.j;
                    stats.loss[l.slot] = (stats.max[a] - z) + stats.log_sum[a];
                }
            }
        }
        // ∂h rows.
        if let (true, Some(g)) = (want_h, ghp) {
            for (i, &r) in rows.rows[a0..a1].iter().enumerate() {
                let (p, j) = (i / NR, i % NR);
                let fi = f[p][j];
                for hb in 0..n_h6 {
                    let t = &ctiles[p * n_h6 + hb];
                    for (rr, trow) in t.iter().enumerate().take(MR.min(hd - hb * MR)) {
                        let c = hb * MR + rr;
                        // SAFETY: (r, c) is inside ∂h (checked: h's shape,
                        // r < rows of h, c < H), and no task runs now.
                        unsafe { *g.ptr.add(r * g.rs + c * g.cs) += fi * trow[j] };
                    }
                }
            }
        }
    }
    if !wp.is_empty() {
        pool.give_vec(wp);
    }
    // E was written through its spare capacity, so its length is 0: ask
    // the capacity whether there is a buffer to give back.
    if ebuf.capacity() > 0 {
        pool.give_vec(ebuf);
    }
    stats
}

/// 16-row panels of the chunk per task: every thread busy, and a task's
/// packed rows (`gt·H·16` floats) within 256 KiB of L2.
fn group_size(np: usize, hd: usize, threads: usize) -> usize {
    let l2 = ((256 << 10) / (hd.max(1) * NR * 4)).max(1);
    np.div_ceil(threads).clamp(1, l2)
}

/// A task of phase A: its first chunk panel, their running states and
/// their label logits.
type Group<'a> = (usize, &'a mut [Cols], &'a mut [Vec<f32>]);

/// What phase A reads.
struct AJob<'a> {
    tile: TileFn,
    hp: &'a [f32],
    hd: usize,
    w: &'a [WPtr],
    panels: &'a [Panel],
    vb0: usize,
    vbw: usize,
    store: bool,
    grads_given: Option<&'a [f32]>,
}

#[allow(clippy::too_many_arguments)]
fn phase_a(
    isa: Isa,
    job: &AJob<'_>,
    g0: usize,
    cols: &mut [Cols],
    zs: &mut [Vec<f32>],
    e: &mut [MaybeUninit<f32>],
    labs: &[Vec<Lab>],
    wsum: &[[f32; NR]],
) {
    match isa {
        Isa::Scalar => phase_a_body::<false>(job, g0, cols, zs, e, labs, wsum),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the job's kernel is `isa`'s, which was checked available.
        Isa::Avx2Fma => unsafe { phase_a_avx2(job, g0, cols, zs, e, labs, wsum) },
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2Fma => unreachable!("not available"),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn phase_a_avx2(
    job: &AJob<'_>,
    g0: usize,
    cols: &mut [Cols],
    zs: &mut [Vec<f32>],
    e: &mut [MaybeUninit<f32>],
    labs: &[Vec<Lab>],
    wsum: &[[f32; NR]],
) {
    phase_a_body::<true>(job, g0, cols, zs, e, labs, wsum)
}

/// Phase A for the chunk panels `g0..g0 + cols.len()`: every vocabulary
/// panel of the block against each of them.
///
/// `AVX2`: the caller is compiled for AVX2 and FMA, so the kernel of six
/// rows is called directly (and inlined) rather than through `job.tile`.
#[inline(always)]
fn phase_a_body<const AVX2: bool>(
    job: &AJob<'_>,
    g0: usize,
    cols: &mut [Cols],
    zs: &mut [Vec<f32>],
    e: &mut [MaybeUninit<f32>],
    labs: &[Vec<Lab>],
    wsum: &[[f32; NR]],
) {
    let n = cols.len();
    let pe = NR * job.vbw;
    let mut cursor: Vec<usize> = labs
        .iter()
        .map(|l| l.partition_point(|x| x.v < job.vb0))
        .collect();
    // BLIS order: a block of vocabulary panels (their rows of W stay in
    // L2) against one chunk panel at a time (its 16 KiB of packed rows
    // stay in L1), H in blocks of KC_H; the tiles wait in `tiles` between
    // blocks of H, and take the softmax after the last.
    let (kc_h, panels_a) = (KC_H, PANELS_A);
    // With H in one block each tile takes its softmax at once: one tile.
    let multi = job.hd > kc_h;
    let at = |q: usize, i: usize| if multi { q * panels_a + i } else { 0 };
    let mut tiles: Vec<Tile> = vec![[[0.0; NR]; MR]; if multi { n * panels_a } else { 1 }];
    for blk in job.panels.chunks(panels_a) {
        for k0 in (0..job.hd).step_by(kc_h) {
            let kc = kc_h.min(job.hd - k0);
            let last = k0 + kc == job.hd;
            for q in 0..n {
                let rhs = Rhs {
                    ptr: job.hp[(g0 + q) * job.hd * NR + k0 * NR..].as_ptr(),
                    rs: NR,
                };
                for (i, pan) in blk.iter().enumerate() {
                    let w = job.w[pan.split];
                    let lhs =
                        Lhs::strided(w.ptr.wrapping_add(pan.local * w.rs + k0 * w.cs), w.rs, w.cs);
                    let t = &mut tiles[at(q, i)];
                    // SAFETY: rows local..local + rows of the split exist
                    // (panels never pass a split's end) and are read
                    // through the view's own strides at columns k0..k0 + kc
                    // < H; the packed chunk panel holds hd steps of 16
                    // floats.
                    #[cfg(target_arch = "x86_64")]
                    if AVX2 && pan.rows == MR {
                        // SAFETY: as above; with AVX2 set, the caller is
                        // compiled for, and runs on, a CPU with AVX2 and FMA.
                        unsafe {
                            super::micro::avx2::rows::<MR>(kc, lhs, rhs, Dst::tile(t), k0 > 0)
                        };
                    } else {
                        // SAFETY: as above.
                        unsafe { (job.tile)(kc, pan.rows, lhs, rhs, Dst::tile(t), k0 > 0) };
                    }
                    #[cfg(not(target_arch = "x86_64"))]
                    // SAFETY: as above.
                    unsafe {
                        (job.tile)(kc, pan.rows, lhs, rhs, Dst::tile(t), k0 > 0)
                    };
                    if !last {
                        continue;
                    }
                    let t = &tiles[at(q, i)];
                    let vrow = pan.global - job.vb0;
                    let c = &mut cols[q];
                    let ep: &mut [MaybeUninit<f32>] = if job.store {
                        &mut e[q * pe..(q + 1) * pe]
                    } else {
                        &mut []
                    };
                    let l = &labs[q];
                    if let Some(gw) = job.grads_given {
                        grads_tile(t, pan.rows, c, &wsum[q], &mut ep[vrow * NR..]);
                        while cursor[q] < l.len() && l[cursor[q]].v < pan.global + pan.rows {
                            let x = l[cursor[q]];
                            // SAFETY: the label's row is in this panel, whose
                            // rows `grads_tile` has just written.
                            unsafe {
                                *ep[(x.v - job.vb0) * NR + x.j].assume_init_mut() -= gw[x.slot]
                            };
                            cursor[q] += 1;
                        }
                    } else {
                        while cursor[q] < l.len() && l[cursor[q]].v < pan.global + pan.rows {
                            let x = l[cursor[q]];
                            zs[q][cursor[q]] = t[x.v - pan.global][x.j];
                            cursor[q] += 1;
                        }
                        #[cfg(target_arch = "x86_64")]
                        if AVX2 && pan.rows == MR {
                            // SAFETY: with AVX2 set, the CPU has AVX2 and
                            // FMA; a stored panel of E holds rows vrow..vrow
                            // + 6 of 16 floats (the block's rows).
                            unsafe {
                                if job.store {
                                    forward_tile6_avx2::<true>(t, c, ep, vrow);
                                } else {
                                    forward_tile6_avx2::<false>(t, c, ep, vrow);
                                }
                            }
                            continue;
                        }
                        if job.store {
                            forward_tile::<true>(t, pan.rows, c, ep, vrow);
                        } else {
                            forward_tile::<false>(t, pan.rows, c, ep, vrow);
                        }
                    }
                }
            }
        }
    }
}

/// The softmax arithmetic on a tile of logits: the column max, the shift
/// raised where a logit exceeds it by [`MARGIN`], `e = exp(z − s)` into the
/// column sums, and (when `STORE`) into rows `vrow..` of the panel's E.
#[inline(always)]
fn forward_tile<const STORE: bool>(
    t: &Tile,
    rows: usize,
    c: &mut Cols,
    e: &mut [MaybeUninit<f32>],
    vrow: usize,
) {
    let mut cm = [f32::NEG_INFINITY; NR];
    for row in t.iter().take(rows) {
        for (m, &x) in cm.iter_mut().zip(row) {
            *m = if x > *m { x } else { *m };
        }
    }
    let mut raise = false;
    for ((&x, &s), m) in cm.iter().zip(&c.s).zip(c.m.iter_mut()) {
        raise |= x > s + MARGIN;
        *m = if x > *m { x } else { *m };
    }
    if raise {
        raise_shift(c, &cm, if STORE { Some(e) } else { None }, vrow);
    }
    let mut ts = [0.0f32; NR];
    for (r, row) in t.iter().enumerate().take(rows) {
        let mut x = [0.0f32; NR];
        for (((x, sum), &z), &s) in x.iter_mut().zip(ts.iter_mut()).zip(row).zip(&c.s) {
            *x = exp_fma(z - s);
            *sum += *x;
        }
        if STORE {
            put_row(&mut e[(vrow + r) * NR..(vrow + r + 1) * NR], &x);
        }
    }
    for (t, &x) in c.t.iter_mut().zip(&ts) {
        *t += x as f64;
    }
}

/// [`forward_tile`] for a whole tile of six rows on AVX2 + FMA: the same
/// operations in the same order on 8-lane vectors (so the same bits), with
/// the column state, the exponentials and their sums in registers. A tile
/// that raises a shift (rare: only when a logit exceeds the row's shift by
/// [`MARGIN`]) takes [`forward_tile`].
///
/// # Safety
///
/// The CPU must have AVX2 and FMA; when `STORE`, `e` holds rows `vrow..vrow
/// + 6` of 16 floats.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn forward_tile6_avx2<const STORE: bool>(
    t: &Tile,
    c: &mut Cols,
    e: &mut [MaybeUninit<f32>],
    vrow: usize,
) {
    use crate::kernels::exp::avx2::exp_fma_ps;
    use std::arch::x86_64::*;
    // SAFETY (all loads and stores below): a tile row and the columns'
    // arrays hold 16 floats (two vectors of 8); c.t holds 16 f64 (four
    // vectors of 4); e's rows vrow..vrow + 6 hold 16 floats each (the
    // caller's contract), checked by the slice index.
    unsafe {
        let ld = |p: &[f32; NR]| {
            (
                _mm256_loadu_ps(p.as_ptr()),
                _mm256_loadu_ps(p.as_ptr().add(8)),
            )
        };
        let mut cm = (
            _mm256_set1_ps(f32::NEG_INFINITY),
            _mm256_set1_ps(f32::NEG_INFINITY),
        );
        for row in t.iter() {
            let (x0, x1) = ld(row);
            cm = (_mm256_max_ps(x0, cm.0), _mm256_max_ps(x1, cm.1));
        }
        let s = ld(&c.s);
        let margin = _mm256_set1_ps(MARGIN);
        let raise = _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_GT_OQ>(cm.0, _mm256_add_ps(s.0, margin)),
            _mm256_cmp_ps::<_CMP_GT_OQ>(cm.1, _mm256_add_ps(s.1, margin)),
        );
        if _mm256_movemask_ps(raise) != 0 {
            forward_tile::<STORE>(t, MR, c, e, vrow);
            return;
        }
        let m = ld(&c.m);
        _mm256_storeu_ps(c.m.as_mut_ptr(), _mm256_max_ps(cm.0, m.0));
        _mm256_storeu_ps(c.m.as_mut_ptr().add(8), _mm256_max_ps(cm.1, m.1));
        let mut ts = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let dst = if STORE {
            e[vrow * NR..(vrow + MR) * NR].as_mut_ptr().cast::<f32>()
        } else {
            std::ptr::null_mut()
        };
        for (r, row) in t.iter().enumerate() {
            let (z0, z1) = ld(row);
            let x0 = exp_fma_ps(_mm256_sub_ps(z0, s.0));
            let x1 = exp_fma_ps(_mm256_sub_ps(z1, s.1));
            ts = (_mm256_add_ps(ts.0, x0), _mm256_add_ps(ts.1, x1));
            if STORE {
                _mm256_storeu_ps(dst.add(r * NR), x0);
                _mm256_storeu_ps(dst.add(r * NR + 8), x1);
            }
        }
        let tp = c.t.as_mut_ptr();
        let halves = [
            _mm256_castps256_ps128(ts.0),
            _mm256_extractf128_ps::<1>(ts.0),
            _mm256_castps256_ps128(ts.1),
            _mm256_extractf128_ps::<1>(ts.1),
        ];
        for (i, h) in halves.into_iter().enumerate() {
            let p = tp.add(4 * i);
            _mm256_storeu_pd(p, _mm256_add_pd(_mm256_loadu_pd(p), _mm256_cvtps_pd(h)));
        }
    }
}

/// Writes a row of 16 floats.
#[inline(always)]
fn put_row(dst: &mut [MaybeUninit<f32>], x: &[f32; NR]) {
    for (d, &x) in dst[..NR].iter_mut().zip(x) {
        d.write(x);
    }
}

/// Raises the shift of the columns whose tile maximum `cm` exceeds it by
/// [`MARGIN`] to that maximum, rescaling their sum and their `vrow` rows
/// of E already written.
#[cold]
#[inline(never)]
fn raise_shift(c: &mut Cols, cm: &[f32; NR], e: Option<&mut [MaybeUninit<f32>]>, vrow: usize) {
    let mut e = e;
    for j in 0..NR {
        if cm[j] > c.s[j] + MARGIN {
            let f = if c.s[j] == f32::NEG_INFINITY {
                0.0
            } else {
                (c.s[j] as f64 - cm[j] as f64).exp()
            };
            c.t[j] *= f;
            if let Some(e) = e.as_deref_mut() {
                let f = f as f32;
                for v in 0..vrow {
                    // SAFETY: rows before `vrow` were written by the tiles
                    // before this one.
                    unsafe { *e[v * NR + j].assume_init_mut() *= f };
                }
            }
            c.s[j] = cm[j];
        }
    }
}

/// G on a tile, given the statistics (`c.m` the max, `c.s` the log-sum):
/// `w·exp((z − m) − ln Σ)` into the first `rows` rows of `e`.
#[inline(always)]
fn grads_tile(t: &Tile, rows: usize, c: &Cols, w: &[f32; NR], e: &mut [MaybeUninit<f32>]) {
    for (r, row) in t.iter().enumerate().take(rows) {
        let mut x = [0.0f32; NR];
        for (((x, &z), (&m, &l)), &w) in x.iter_mut().zip(row).zip(c.m.iter().zip(&c.s)).zip(w) {
            *x = w * exp_fma((z - m) - l);
        }
        put_row(&mut e[r * NR..(r + 1) * NR], &x);
    }
}

/// What phase B1 reads.
struct B1Job<'a> {
    tile: TileFn,
    wp: &'a [f32],
    wp_stride: usize,
    n_h6: usize,
    hd: usize,
    vb0: usize,
    vbw: usize,
    first: bool,
}

fn phase_b1(isa: Isa, job: &B1Job<'_>, ct: &mut [Tile], e: &[f32]) {
    match isa {
        Isa::Scalar => phase_b1_body(job, ct, e),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the job's kernel is `isa`'s, which was checked available.
        Isa::Avx2Fma => unsafe { phase_b1_avx2(job, ct, e) },
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2Fma => unreachable!("not available"),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn phase_b1_avx2(job: &B1Job<'_>, ct: &mut [Tile], e: &[f32]) {
    phase_b1_body(job, ct, e)
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

/// What phase B2 reads.
struct B2Job<'a> {
    tile: TileFn,
    e: &'a [f32],
    vb0: usize,
    vbw: usize,
    /// Rows of the chunk, padded to whole panels.
    kt: usize,
    hpp: &'a [f32],
    n_h16: usize,
    hd: usize,
    gw: &'a [Option<MutPtr>],
}

fn phase_b2(isa: Isa, job: &B2Job<'_>, ps: &[Panel]) {
    match isa {
        Isa::Scalar => phase_b2_body(job, ps),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the job's kernel is `isa`'s, which was checked available.
        Isa::Avx2Fma => unsafe { phase_b2_avx2(job, ps) },
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2Fma => unreachable!("not available"),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn phase_b2_avx2(job: &B2Job<'_>, ps: &[Panel]) {
    phase_b2_body(job, ps)
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
