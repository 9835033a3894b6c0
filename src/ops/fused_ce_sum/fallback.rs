//! The summed heads on `matrixmultiply` (f64, and
//! [`HeadKernel::Matrixmultiply`](crate::ops::fused_ce::HeadKernel)). Tokens
//! with their own rows ([`whole_rows`]): each chunk's logits against the
//! whole vocabulary, one gemm per split, turned into `softmax − onehot` in
//! place, then the two gradient gemms. Tokens that share rows
//! ([`per_token_kernel`]): the per-token kernel's forward and backward,
//! every upstream gradient 1.

use ndarray::parallel::prelude::*;
use ndarray::{Array2, Axis, Ix2, s};

use super::{SumGrads, Summed};
use crate::kernels::Real;
use crate::kernels::exp;
use crate::ops::fused_ce::{ChunkSizes, fused_ce_backward_on, fused_ce_forward_on};

/// `Σ_n loss_n` of the active tokens (rows of h, labels in `[0, V)`), `tc`
/// a chunk, their gradients added into `grads` (zeros): ∂h rows of active
/// tokens written, ∂W_k added. The sum is in f64, in token order.
pub(super) fn whole_rows<T: Real>(sum: &Summed<'_, '_, T>, grads: &mut SumGrads<T>) -> f64 {
    let Summed {
        pool,
        h,
        weights,
        targets,
        tc,
        ..
    } = *sum;
    let (labels, active) = (&targets.labels, targets.active_rows());
    let width = h.ncols();
    let v: usize = weights.iter().map(|w| w.nrows()).sum();
    let want_hidden = grads.hidden.is_some();
    let want_grad = want_hidden || grads.weights.iter().any(Option::is_some);
    let mut z_buf: Array2<T> = pool
        .zeros(&[tc, v])
        .into_dimensionality::<Ix2>()
        .expect("2-D");
    let mut hc_buf = Array2::<T>::zeros((tc, width));
    let mut ghc_buf = Array2::<T>::zeros((if want_hidden { tc } else { 0 }, width));
    let mut total = 0f64;
    for idx in active.chunks(tc) {
        let r = idx.len();
        let mut hc = hc_buf.slice_mut(s![..r, ..]);
        for (i, &p) in idx.iter().enumerate() {
            hc.row_mut(i).assign(&h.row(p));
        }
        let hc = hc.view();
        let mut z = z_buf.slice_mut(s![..r, ..]);
        // Z_cᵀ = W_k·h_cᵀ, one split's columns at a time. W is the left
        // side, so matrixmultiply packs it on every thread, block by block
        // (it packs the right side on one thread).
        let mut start = 0;
        for w in weights {
            let cols = s![.., start..start + w.nrows()];
            T::gemm(
                T::one(),
                w.view(),
                hc.t(),
                T::zero(),
                z.slice_mut(cols).reversed_axes(),
            );
            start += w.nrows();
        }
        // Each row: its loss, and softmax − onehot in place.
        let losses: Vec<T> = z
            .axis_iter_mut(Axis(0))
            .into_par_iter()
            .enumerate()
            .map(|(i, mut row)| {
                let zs = row
                    .as_slice_mut()
                    .expect("rows of the block are contiguous");
                row_loss(zs, labels[idx[i]] as usize, want_grad)
            })
            .collect();
        for l in losses {
            total += l.to_f64();
        }
        if !want_grad {
            continue;
        }
        let g = z.view();
        if let Some(gh) = grads.hidden.as_mut() {
            // ∂h_c = Σ_k G_{c,k}·W_k.
            let mut ghc = ghc_buf.slice_mut(s![..r, ..]);
            let (mut start, mut first) = (0, true);
            for w in weights.iter().filter(|w| w.nrows() > 0) {
                let beta = if first { T::zero() } else { T::one() };
                let cols = s![.., start..start + w.nrows()];
                T::gemm(
                    T::one(),
                    w.t(),
                    g.slice(cols).t(),
                    beta,
                    ghc.view_mut().reversed_axes(),
                );
                (start, first) = (start + w.nrows(), false);
            }
            for (i, &p) in idx.iter().enumerate() {
                gh.row_mut(p).assign(&ghc.row(i));
            }
        }
        // ∂W_k += G_{c,k}ᵀ·h_c.
        let mut start = 0;
        for (w, gw) in weights.iter().zip(grads.weights.iter_mut()) {
            if let Some(gw) = gw.as_mut() {
                let cols = s![.., start..start + w.nrows()];
                T::gemm(T::one(), g.slice(cols).t(), hc, T::one(), gw.view_mut());
            }
            start += w.nrows();
        }
    }
    pool.give(z_buf);
    total
}

/// `Σ_n loss_n` of tokens that share hidden rows, by the per-token
/// kernel's forward and backward (every upstream gradient 1, `tc` rows a
/// chunk), the gradients added into `grads`.
pub(super) fn per_token_kernel<T: Real>(sum: &Summed<'_, '_, T>, grads: &mut SumGrads<T>) -> f64 {
    let Summed {
        kernel,
        pool,
        h,
        weights,
        targets,
        tc,
        ..
    } = *sum;
    let want_grad = grads.hidden.is_some() || grads.weights.iter().any(Option::is_some);
    let per_token = ChunkSizes {
        tokens: tc,
        ..ChunkSizes::default()
    };
    let (loss, stats) = fused_ce_forward_on(kernel, h, weights, targets, per_token);
    let total: f64 = loss.iter().map(|&l| Real::to_f64(l)).sum();
    if want_grad {
        let ones = vec![T::one(); targets.labels.len()];
        let mut gws: Vec<Option<ndarray::ArrayViewMut2<'_, T>>> = grads
            .weights
            .iter_mut()
            .map(|g| g.as_mut().map(|g| g.view_mut()))
            .collect();
        fused_ce_backward_on(
            kernel,
            pool,
            h,
            weights,
            targets,
            &stats,
            &ones,
            per_token,
            grads.hidden.as_mut().map(|g| g.view_mut()),
            &mut gws,
        );
    }
    total
}

/// One token's row of logits z (V) with label y: returns
/// `(m − z_y) + ln Σ_v e^{z_v − m}`, and when `grad` turns z into
/// `softmax(z) − onehot(y)` in place. The shift by m and by ln Σ are
/// applied one after the other, so that neither rounds at the scale of m
/// (logits in the thousands keep the loss of a confident token).
fn row_loss<T: Real>(z: &mut [T], y: usize, grad: bool) -> T {
    let m = exp::max(z);
    let log_sum = exp::sum_exp(z, m).ln();
    let loss = (m - z[y]) + log_sum;
    if grad {
        for x in z.iter_mut() {
            *x -= m;
        }
        exp::scaled_exp(z, log_sum, T::one());
        z[y] -= T::one();
    }
    loss
}
