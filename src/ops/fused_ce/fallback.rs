//! The fused cross-entropy on `matrixmultiply` (f64, and
//! [`super::HeadKernel::Matrixmultiply`]): chunks of `tokens` hidden rows ×
//! blocks of `vocab` rows of one split, each block of logits one gemm into
//! the workspace ([`for_each_block`]); the forward folds each block into
//! the rows' online log-sum-exp, the backward turns it into ∂z in place
//! and runs the two gradient gemms on it.

use ndarray::{Array2, ArrayView2, ArrayViewMut2, s};
use rayon::prelude::*;

use super::{Head, RowStats};
use crate::kernels::Real;
use crate::kernels::exp;

/// Elements of weight-gradient partials (chunks × V × H) below which the
/// backward runs its chunks in parallel: 4 Mi elements, 16 MiB in f32.
pub const PARTIAL_LIMIT: usize = 4 << 20;

/// One block of logits of a chunk: split k's rows `v0..v1` (global rows
/// `lo..hi`), the chunk's gathered rows `hc` and the block `z = hc·W_blockᵀ`.
struct Block<'a, T> {
    k: usize,
    v0: usize,
    v1: usize,
    lo: usize,
    hi: usize,
    hc: ArrayView2<'a, T>,
    w: ArrayView2<'a, T>,
    z: ArrayViewMut2<'a, T>,
}

/// The chunk of hidden rows `idx`, block by block: its rows of h gathered,
/// then for each split and each run of at most `vocab` of its rows (no
/// wider than the largest split), one gemm `z = h_c·W_blockᵀ` into the
/// workspace, handed to `visit`.
fn for_each_block<T: Real>(
    head: Head<'_, '_, T>,
    idx: &[usize],
    mut visit: impl FnMut(Block<'_, T>),
) {
    let widest = head.weights.iter().map(|w| w.nrows()).max().unwrap_or(0);
    let vc = head.chunks.vocab.max(1).min(widest.max(1));
    let rows = idx.len();
    let mut hc = Array2::<T>::zeros((rows, head.h.ncols()));
    let mut work = Array2::<T>::zeros((rows, vc));
    for (i, &p) in idx.iter().enumerate() {
        hc.row_mut(i).assign(&head.h.row(p));
    }
    let mut start = 0usize;
    for (k, w) in head.weights.iter().enumerate() {
        for v0 in (0..w.nrows()).step_by(vc) {
            let v1 = (v0 + vc).min(w.nrows());
            let wblk = w.slice(s![v0..v1, ..]);
            let mut z = work.slice_mut(s![.., ..v1 - v0]);
            T::gemm(T::one(), hc.view(), wblk.t(), T::zero(), z.view_mut());
            visit(Block {
                k,
                v0,
                v1,
                lo: start + v0,
                hi: start + v1,
                hc: hc.view(),
                w: wblk,
                z,
            });
        }
        start += w.nrows();
    }
}

/// A chunk's (max, ln Σ) per row and (token, loss) per token.
type ForwardPart<T> = ((Vec<T>, Vec<T>), Vec<(usize, T)>);

/// The forward: per-token loss (N) and per-row statistics (m). Chunks of
/// hidden rows run in parallel, each row's log-sum-exp computed by one
/// task in a fixed order.
pub(super) fn forward<T: Real>(head: Head<'_, '_, T>) -> (Vec<T>, RowStats<T>) {
    let targets = head.targets;
    let mut loss = vec![T::zero(); targets.labels.len()];
    let mut stats = RowStats::zeros(head.h.nrows());
    let tc = head.chunks.tokens.max(1);
    let parts: Vec<ForwardPart<T>> = targets
        .active
        .par_chunks(tc)
        .map(|idx| forward_chunk(head, idx))
        .collect();
    for (idx, ((max, log_sum), chunk_loss)) in targets.active.chunks(tc).zip(parts) {
        for ((&r, m), s) in idx.iter().zip(max).zip(log_sum) {
            stats.max[r] = m;
            stats.log_sum[r] = s;
        }
        for (n, l) in chunk_loss {
            loss[n] = l;
        }
    }
    (loss, stats)
}

/// One chunk of hidden rows `idx`: their log-sum-exp, and (token, loss)
/// for each of their tokens.
fn forward_chunk<T: Real>(head: Head<'_, '_, T>, idx: &[usize]) -> ForwardPart<T> {
    let targets = head.targets;
    let rows = idx.len();
    let mut label_logit: Vec<(usize, T)> = Vec::new();
    let mut m = vec![T::neg_infinity(); rows];
    let mut sum = vec![T::zero(); rows];
    for_each_block(head, idx, |b| {
        for (i, row) in b.z.outer_iter().enumerate() {
            let zs = row.as_slice().expect("rows of the block are contiguous");
            let bm = exp::max(zs);
            if bm > m[i] {
                sum[i] *= (m[i] - bm).exp();
                m[i] = bm;
            }
            let mi = m[i];
            if mi > T::neg_infinity() {
                sum[i] += exp::sum_exp(zs, mi);
            }
            for &n in targets.tokens_of(idx[i]) {
                let l = targets.labels[n] as usize;
                if (b.lo..b.hi).contains(&l) {
                    label_logit.push((n, row[l - b.lo]));
                }
            }
        }
    });
    let log_sum: Vec<T> = sum.iter().map(|&si| si.ln()).collect();
    let mut out = Vec::with_capacity(label_logit.len());
    for (n, z) in label_logit {
        let i = idx
            .binary_search(&targets.row_of[n])
            .expect("the token's row is in its chunk");
        out.push((n, (m[i] - z) + log_sum[i]));
    }
    ((m, log_sum), out)
}

/// A chunk's hidden gradient (rows, H) and weight-gradient partials.
type BackwardPart<T> = (Array2<T>, Vec<Option<Array2<T>>>);

/// The backward: adds the gradients of `Σ_n gy[n]·loss_n` into `gh` and
/// `gws`. Chunks of hidden rows run in parallel, each into partials added
/// in chunk order, when all the partials are at most [`PARTIAL_LIMIT`]
/// elements; otherwise one after another, adding into `gws`.
pub(super) fn backward<T: Real>(
    head: Head<'_, '_, T>,
    stats: &RowStats<T>,
    gy: &[T],
    mut gh: Option<ArrayViewMut2<'_, T>>,
    gws: &mut [Option<ArrayViewMut2<'_, T>>],
) {
    let targets = head.targets;
    let tc = head.chunks.tokens.max(1);
    let width = head.h.ncols();
    let n_chunks = targets.active.len().div_ceil(tc);
    let wanted_v: usize = head
        .weights
        .iter()
        .zip(gws.iter())
        .filter(|(_, g)| g.is_some())
        .map(|(w, _)| w.nrows())
        .sum();
    let want_gh = gh.is_some();
    let chunk = |idx: &[usize], gws: &mut [Option<ArrayViewMut2<'_, T>>]| {
        let mut ghc = Array2::<T>::zeros((idx.len(), width));
        backward_chunk(head, idx, stats, gy, want_gh.then_some(&mut ghc), gws);
        ghc
    };
    if n_chunks > 1 && n_chunks * wanted_v * width <= PARTIAL_LIMIT {
        let parts: Vec<BackwardPart<T>> = targets
            .active
            .par_chunks(tc)
            .map(|idx| {
                let mut partial: Vec<Option<Array2<T>>> = head
                    .weights
                    .iter()
                    .zip(gws.iter())
                    .map(|(w, g)| g.as_ref().map(|_| Array2::<T>::zeros(w.dim())))
                    .collect();
                let mut views: Vec<Option<ArrayViewMut2<'_, T>>> = partial
                    .iter_mut()
                    .map(|p| p.as_mut().map(|p| p.view_mut()))
                    .collect();
                let ghc = chunk(idx, &mut views);
                drop(views);
                (ghc, partial)
            })
            .collect();
        for (idx, (ghc, partial)) in targets.active.chunks(tc).zip(parts) {
            add_rows(&mut gh, idx, &ghc);
            for (g, p) in gws.iter_mut().zip(partial) {
                if let (Some(g), Some(p)) = (g.as_mut(), p) {
                    *g += &p;
                }
            }
        }
        return;
    }
    for idx in targets.active.chunks(tc) {
        let ghc = chunk(idx, gws);
        add_rows(&mut gh, idx, &ghc);
    }
}

/// `gh[idx[i]] += ghc[i]` for each row i of a chunk, when gh is wanted.
fn add_rows<T: Real>(gh: &mut Option<ArrayViewMut2<'_, T>>, idx: &[usize], ghc: &Array2<T>) {
    if let Some(gh) = gh.as_mut() {
        for (i, &r) in idx.iter().enumerate() {
            let mut dst = gh.row_mut(r);
            dst += &ghc.row(i);
        }
    }
}

/// One chunk of hidden rows `idx`: their hidden gradient added into `ghc`
/// (rows, H) when given, and `Σ_i ∂z_iv·h_i` added into `gws`.
fn backward_chunk<T: Real>(
    head: Head<'_, '_, T>,
    idx: &[usize],
    stats: &RowStats<T>,
    gy: &[T],
    mut ghc: Option<&mut Array2<T>>,
    gws: &mut [Option<ArrayViewMut2<'_, T>>],
) {
    let targets = head.targets;
    // Σ_{n ∈ T_i} ∂loss_n: the weight of row i's softmax.
    let wsum: Vec<T> = idx
        .iter()
        .map(|&r| targets.tokens_of(r).iter().map(|&n| gy[n]).sum())
        .collect();
    for_each_block(head, idx, |mut b| {
        for (i, mut row) in b.z.outer_iter_mut().enumerate() {
            let r = idx[i];
            let zs = row
                .as_slice_mut()
                .expect("rows of the block are contiguous");
            // e^{(z − m) − ln Σ}: the shift is applied in two steps so
            // that neither rounds at the scale of m.
            let m = stats.max[r];
            for z in zs.iter_mut() {
                *z -= m;
            }
            exp::scaled_exp(zs, stats.log_sum[r], wsum[i]);
            for &n in targets.tokens_of(idx[i]) {
                let lab = targets.labels[n] as usize;
                if (b.lo..b.hi).contains(&lab) {
                    row[lab - b.lo] -= gy[n];
                }
            }
        }
        if let Some(ghc) = ghc.as_deref_mut() {
            T::gemm(T::one(), b.z.view(), b.w, T::one(), ghc.view_mut());
        }
        if let Some(gw) = gws[b.k].as_mut() {
            T::gemm(
                T::one(),
                b.z.t(),
                b.hc,
                T::one(),
                gw.slice_mut(s![b.v0..b.v1, ..]),
            );
        }
    });
}
