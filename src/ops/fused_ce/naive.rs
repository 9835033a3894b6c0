//! The naive twins of the fused cross-entropy: the full (m, V) logits in
//! one product, then each row's stable log-sum-exp and softmax. The tests
//! hold [`super::fused_ce_forward`] and [`super::fused_ce_backward`] to
//! them (the same outputs to rounding).

use ndarray::{Array2, ArrayView2, s};

use super::{RowStats, Targets};
use crate::kernels::Real;
use crate::ops::cross_entropy::{IGNORE_INDEX, max_and_log_sum};

/// The full logits `h·Wᵀ` (m, V) and W, the splits concatenated (V, H).
fn logits<T: Real>(h: ArrayView2<'_, T>, weights: &[ArrayView2<'_, T>]) -> (Array2<T>, Array2<T>) {
    let w = ndarray::concatenate(ndarray::Axis(0), weights).expect("same width");
    let mut logits = Array2::<T>::zeros((h.nrows(), w.nrows()));
    T::gemm(T::one(), h, w.t(), T::zero(), logits.view_mut());
    (logits, w)
}

/// The naive twin of [`super::fused_ce_forward`]: the full (m, V) logits,
/// then a stable log-sum-exp per row. Same outputs to rounding.
pub fn naive_ce_forward<T: Real>(
    h: ArrayView2<'_, T>,
    weights: &[ArrayView2<'_, T>],
    targets: &Targets,
) -> (Vec<T>, RowStats<T>) {
    let (logits, _) = logits(h, weights);
    let mut loss = vec![T::zero(); targets.labels.len()];
    let mut stats = RowStats::zeros(h.nrows());
    for &r in targets.active_rows() {
        let (m, log_sum) = max_and_log_sum(logits.row(r));
        stats.max[r] = m;
        stats.log_sum[r] = log_sum;
        for &n in targets.tokens_of(r) {
            loss[n] = (m - logits[[r, targets.labels[n] as usize]]) + log_sum;
        }
    }
    (loss, stats)
}

/// The naive twin of [`super::fused_ce_backward`], from the full logits.
pub fn naive_ce_backward<T: Real>(
    h: ArrayView2<'_, T>,
    weights: &[ArrayView2<'_, T>],
    targets: &Targets,
    gy: &[T],
) -> (Array2<T>, Vec<Array2<T>>) {
    let (logits, w) = logits(h, weights);
    let mut g = Array2::<T>::zeros(logits.dim());
    for (n, (&r, &l)) in targets.row_of.iter().zip(&targets.labels).enumerate() {
        if l == IGNORE_INDEX {
            continue;
        }
        let (m, log_sum) = max_and_log_sum(logits.row(r));
        for v in 0..w.nrows() {
            g[[r, v]] += gy[n] * ((logits[[r, v]] - m) - log_sum).exp();
        }
        g[[r, l as usize]] -= gy[n];
    }
    let mut gh = Array2::<T>::zeros(h.dim());
    T::gemm(T::one(), g.view(), w.view(), T::zero(), gh.view_mut());
    let mut gw = Array2::<T>::zeros(w.dim());
    T::gemm(T::one(), g.t(), h, T::zero(), gw.view_mut());
    let mut out = Vec::new();
    let mut start = 0;
    for wk in weights {
        out.push(gw.slice(s![start..start + wk.nrows(), ..]).to_owned());
        start += wk.nrows();
    }
    (gh, out)
}
