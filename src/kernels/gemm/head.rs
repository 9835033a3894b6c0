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
//! [`fused_ce`] runs the phases in turn, one function each (in the private
//! modules `layout`, `softmax` and `products`):
//!
//! | phase | what | function |
//! |---|---|---|
//! | pack | the splits' 6-row panels and vocabulary blocks; Wᵀ for B1; each chunk's rows, labels and state | `layout::Vocab::new`, `layout::pack_wt`, `layout::Chunk::pack` |
//! | A, tile softmax | the logits tiles of a block and the arithmetic on them: E (or G, given the statistics) | `softmax::tile_softmax` |
//! | fold | the labels into E, and each row's f | `softmax::fold_labels` |
//! | B1 | `∂hᵀ = f·(Wᵀ·Eᵀ)`, tiles carried across blocks, added into ∂h | `products::hidden_product`, `products::add_hidden_rows` |
//! | B2 | `∂W += Eᵀ·(f ⊙ h)` | `products::pack_scaled_rows`, `products::weight_product` |
//! | stats | each row's statistics and each token's loss | `softmax::chunk_stats` |
//!
//! Each row's statistics are computed by one task in increasing v; each
//! element of ∂h is one chain of fused multiply-adds over v in order, and
//! each element of ∂W one chain over the rows in order, continued from
//! chunk to chunk. How the work is split between tasks changes none of
//! these, so the results are the same bits for any thread count, and the
//! scalar and AVX2 variants give the same bits too.

mod layout;
mod products;
mod softmax;

use std::mem::MaybeUninit;

use ndarray::{ArrayView2, ArrayViewMut2};

use super::Isa;
use super::micro::{MR, NR, Tile};
use crate::kernels::pool::Pool;
use layout::{Chunk, Vocab};

/// How far a later logit may exceed a row's shift before the shift is
/// raised: e^40 ≈ 2.4·10¹⁷, so a row's sum stays far from f32's range
/// for any vocabulary below 10²⁰ words.
pub const MARGIN: f32 = 40.0;

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
    check(h, weights, rows, pass, out);
    let hd = h.ncols();
    let n_rows = rows.rows.len();
    let loss_pass = !matches!(pass, Pass::Grads { .. });
    let mut stats = Stats::default();
    if loss_pass {
        stats.max = vec![0.0; n_rows];
        stats.log_sum = vec![0.0; n_rows];
        stats.loss = vec![0.0; rows.labels.len()];
    }
    if n_rows == 0 {
        return stats;
    }

    // Pack: the splits with non-negative strides, their panels and blocks.
    let owned = layout::nonnegative_copies(weights);
    let wviews = layout::views(weights, &owned);
    let vocab = Vocab::new(&wviews, pass, vocab_block);
    let want_h = out.hidden.is_some() && !matches!(pass, Pass::Loss);
    let want_w: Vec<bool> = (0..weights.len())
        .map(|k| !matches!(pass, Pass::Loss) && out.weights.get(k).is_some_and(|g| g.is_some()))
        .collect();
    // E is stored exactly when some gradient is formed from it.
    let store = want_h || want_w.iter().any(|&w| w);
    // A Grads pass: each token's weight (its statistics go to the chunks).
    let given = match pass {
        Pass::Grads { weights, .. } => Some(weights),
        _ => None,
    };
    let n_h6 = hd.div_ceil(MR);
    let wp = want_h.then(|| layout::pack_wt(pool, &wviews, vocab.v_total, hd));

    let chunk = chunk_rows.max(1);
    let p_max = chunk.min(n_rows).div_ceil(NR);
    // E is written whole by phase A before anything reads it: no zeros.
    let mut ebuf: Vec<f32> = Vec::new();
    if store {
        ebuf = pool.take_vec(p_max * NR * vocab.max_block);
    }
    let espace: &mut [MaybeUninit<f32>] = if store {
        &mut ebuf.spare_capacity_mut()[..p_max * NR * vocab.max_block]
    } else {
        &mut []
    };
    let threads = rayon::current_num_threads().max(1);
    let mut hp: Vec<f32> = Vec::new();
    let mut hpp: Vec<f32> = Vec::new();
    let mut ctiles: Vec<Tile> = Vec::new();
    let (ghp, gwp) = layout::destinations(out, &want_w);

    for a0 in (0..n_rows).step_by(chunk) {
        let a1 = (a0 + chunk).min(n_rows);
        let mut c = Chunk::pack(h, rows, pass, a0..a1, &mut hp);
        let gt = softmax::group_size(c.np, hd, threads);
        if want_h {
            ctiles.clear();
            ctiles.resize(c.np * n_h6, [[0.0; NR]; MR]);
        }
        for (bi, blk) in vocab.blocks.iter().enumerate() {
            let e: &mut [MaybeUninit<f32>] = if store {
                &mut espace[..c.np * NR * blk.rows]
            } else {
                &mut []
            };
            let a = softmax::AJob {
                tile,
                hp: &hp,
                hd,
                w: &vocab.wptrs,
                panels: &vocab.panels[blk.panels.clone()],
                vb0: blk.v0,
                vbw: blk.rows,
                store,
                grads_given: given,
            };
            softmax::tile_softmax(isa, &a, gt, &mut c, e);
            if !store {
                continue;
            }
            // SAFETY: phase A wrote every element of the block: each chunk
            // panel's rows of every vocabulary panel, 16 columns each, and
            // the panels cover the block's rows. f32 has no invalid bits.
            let e: &mut [f32] = unsafe { &mut *(std::ptr::from_mut(e) as *mut [f32]) };
            softmax::fold_labels(&mut c, e, blk, given.is_some());
            let e: &[f32] = e;
            if let Some(wp) = &wp {
                let b1 = products::B1Job {
                    tile,
                    wp,
                    wp_stride: vocab.v_total * MR,
                    n_h6,
                    hd,
                    vb0: blk.v0,
                    vbw: blk.rows,
                    first: bi == 0,
                };
                products::hidden_product(isa, &b1, gt, &mut ctiles, e);
            }
            if want_w.iter().any(|&w| w) {
                let kt = products::pack_scaled_rows(h, rows, &c, &mut hpp);
                let b2 = products::B2Job {
                    tile,
                    e,
                    vb0: blk.v0,
                    vbw: blk.rows,
                    kt,
                    hpp: &hpp,
                    n_h16: hd.div_ceil(NR),
                    hd,
                    gw: &gwp,
                };
                products::weight_product(isa, &b2, &vocab.panels[blk.panels.clone()], &want_w);
            }
        }
        if loss_pass {
            softmax::chunk_stats(&c, &mut stats);
        }
        if let (true, Some(g)) = (want_h, ghp) {
            products::add_hidden_rows(h, rows, &c, &ctiles, g);
        }
    }
    if let Some(wp) = wp
        && !wp.is_empty()
    {
        pool.give_vec(wp);
    }
    // E was written through its spare capacity, so its length is 0: ask
    // the capacity whether there is a buffer to give back.
    if ebuf.capacity() > 0 {
        pool.give_vec(ebuf);
    }
    stats
}

/// The shape checks of [`fused_ce`], in the order it makes them.
#[track_caller]
fn check(
    h: ArrayView2<'_, f32>,
    weights: &[ArrayView2<'_, f32>],
    rows: Rows<'_>,
    pass: Pass<'_>,
    out: &Out<'_>,
) {
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
}

/// A task of one phase, run on the variant's tile kernel by [`run_on`].
trait Task {
    /// Does the task's work. `AVX2`: the caller is compiled for AVX2 and
    /// FMA, so the task may call that variant's kernel directly (inlined).
    fn run<const AVX2: bool>(self);
}

/// Runs `task` compiled for `isa` (its loops with AVX2 and FMA for
/// [`Isa::Avx2Fma`]).
fn run_on<P: Task>(isa: Isa, task: P) {
    match isa {
        Isa::Scalar => task.run::<false>(),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the tasks' kernel is `isa`'s, which was checked available.
        Isa::Avx2Fma => unsafe { run_avx2(task) },
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2Fma => unreachable!("not available"),
    }
}

/// # Safety
///
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_avx2<P: Task>(task: P) {
    task.run::<true>()
}
