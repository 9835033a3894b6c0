//! Row-wise log-sum-exp and cross-entropy with an ignore label.
//!
//! `lse[i] = m_i + ln Σ_j e^{x[i, j] − m_i}` with `m_i = max_j x[i, j]`, so
//! no exponential overflows even for logits in the thousands. Backward:
//! `∂x[i, j] += ∂lse[i]·softmax[i, j]`, `softmax[i, j] = e^{x[i, j] − lse[i]}`.
//!
//! `ce[i] = lse[i] − x[i, label[i]]`, and 0 where `label[i] = -100`
//! ([`IGNORE_INDEX`]). Backward: `∂x[i, j] += ∂ce[i]·(softmax[i, j] − [j = label[i]])`,
//! nothing for an ignored row.
//! Derivation: `docs/gradients.md#log-sum-exp-and-cross-entropy`.

use ndarray::{Array1, ArrayD, ArrayView1, ArrayViewD, Zip};

use super::{as_2d, grad_2d};
use crate::kernels::Real;
use crate::tape::{Tape, Var};

/// The label whose token is ignored: loss 0, no gradient (PyTorch's
/// `ignore_index` default).
pub const IGNORE_INDEX: i64 = -100;

/// `max_j x[j] + ln Σ_j e^{x[j] − max}`: −∞ for an empty row or a row of −∞.
pub fn logsumexp_row<T: Real>(x: ArrayView1<'_, T>) -> T {
    let (m, log_sum) = max_and_log_sum(x);
    if m == T::neg_infinity() || !m.is_finite() {
        return m;
    }
    m + log_sum
}

/// `(m, ln Σ_j e^{x[j] − m})` with `m = max_j x[j]`, kept apart: with
/// logits in the thousands, `m + ln Σ` rounds to a step of `ulp(m)`
/// (2.4·10⁻⁴ in f32 near 3000), so the loss is computed as
/// `(m − x[label]) + ln Σ` and the softmax as `e^{(x[j] − m) − ln Σ}`,
/// which keep full precision (PyTorch does the same). For an empty row or
/// a row of −∞, m = −∞ and ln Σ = 0.
pub fn max_and_log_sum<T: Real>(x: ArrayView1<'_, T>) -> (T, T) {
    let m = x.iter().fold(T::neg_infinity(), |m, &v| m.max(v));
    if m == T::neg_infinity() || !m.is_finite() {
        return (m, T::zero());
    }
    let s: T = x.iter().map(|&v| (v - m).exp()).sum();
    (m, s.ln())
}

#[track_caller]
fn rows2<'a, T>(op: &str, x: ArrayViewD<'a, T>) -> ndarray::ArrayView2<'a, T> {
    as_2d(x, format_args!("{op}: expected (n, V) logits, got shape"))
}

/// `lse[i]` for each row. x: (n, V) → (n).
///
/// **Panics** if x is not 2-D.
#[track_caller]
pub fn logsumexp_forward<T: Real>(x: ArrayViewD<'_, T>) -> ArrayD<T> {
    let x = rows2("logsumexp", x);
    let y: Array1<T> = x.outer_iter().map(logsumexp_row).collect();
    y.into_dyn()
}

/// `g[i, j] += gy[i]·e^{x[i, j] − lse[i]}`; nothing for a row whose lse is
/// not finite.
pub fn logsumexp_backward<T: Real>(
    x: ArrayViewD<'_, T>,
    lse: ArrayViewD<'_, T>,
    gy: ArrayViewD<'_, T>,
    g: &mut ArrayD<T>,
) {
    let x = rows2("logsumexp", x);
    let mut g = grad_2d(g);
    for (((mut gr, xr), &l), &gyi) in g
        .outer_iter_mut()
        .zip(x.outer_iter())
        .zip(lse.iter())
        .zip(gy.iter())
    {
        if l.is_finite() {
            Zip::from(&mut gr)
                .and(&xr)
                .for_each(|g, &x| *g += gyi * (x - l).exp());
        }
    }
}

/// Checks labels against V: each must be in `[0, V)` or be [`IGNORE_INDEX`].
/// Returns the position and value of the first that is not.
pub fn first_bad_label(labels: &[i64], v: usize) -> Option<(usize, i64)> {
    labels
        .iter()
        .enumerate()
        .find(|&(_, &l)| l != IGNORE_INDEX && (l < 0 || l as u64 >= v as u64))
        .map(|(i, &l)| (i, l))
}

/// `ce[i] = lse[i] − x[i, label[i]]`, computed as `(m − x[label]) + ln Σ`
/// (see [`max_and_log_sum`]), 0 for an ignored row.
/// x: (n, V), labels: (n) → (n).
///
/// **Panics** if x is not 2-D, the lengths differ, or a label is outside
/// `[0, V)` and not −100.
#[track_caller]
pub fn cross_entropy_forward<T: Real>(x: ArrayViewD<'_, T>, labels: &[i64]) -> ArrayD<T> {
    let x = rows2("cross_entropy", x);
    assert_eq!(
        x.nrows(),
        labels.len(),
        "cross_entropy: {} labels for {} rows",
        labels.len(),
        x.nrows()
    );
    if let Some((i, l)) = first_bad_label(labels, x.ncols()) {
        panic!(
            "cross_entropy: label {l} at position {i} is out of range 0..{}",
            x.ncols()
        );
    }
    let y: Array1<T> = x
        .outer_iter()
        .zip(labels)
        .map(|(r, &l)| {
            if l == IGNORE_INDEX {
                T::zero()
            } else {
                let (m, log_sum) = max_and_log_sum(r);
                (m - r[l as usize]) + log_sum
            }
        })
        .collect();
    y.into_dyn()
}

/// `g[i, j] += gy[i]·(softmax[i, j] − [j = label[i]])`; nothing for an
/// ignored row.
pub fn cross_entropy_backward<T: Real>(
    x: ArrayViewD<'_, T>,
    labels: &[i64],
    gy: ArrayViewD<'_, T>,
    g: &mut ArrayD<T>,
) {
    let x = rows2("cross_entropy", x);
    let mut g = grad_2d(g);
    for (i, (mut gr, xr)) in g.outer_iter_mut().zip(x.outer_iter()).enumerate() {
        let l = labels[i];
        if l == IGNORE_INDEX {
            continue;
        }
        let gyi = gy[i];
        let (m, log_sum) = max_and_log_sum(xr);
        Zip::from(&mut gr)
            .and(&xr)
            .for_each(|g, &x| *g += gyi * ((x - m) - log_sum).exp());
        gr[l as usize] -= gyi;
    }
}

/// The saved state of `cross_entropy`: the logits and the labels.
struct CrossEntropy {
    logits: Var,
    labels: Vec<i64>,
}

backward!(CrossEntropy, |s, _y, gy, grads| {
    let x = grads.value(s.logits);
    grads.accumulate(gy, &[s.logits], |_, gy, g| {
        cross_entropy_backward(x.view(), &s.labels, gy, g)
    });
});

impl<'p, T: Real> Tape<'p, T> {
    /// Row-wise log-sum-exp: (n, V) → (n), stable for logits in the thousands.
    ///
    /// **Panics** if x is not 2-D.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::Tape;
    /// let mut t = Tape::<f64>::new();
    /// let x = t.input(array![[1000.0, 1000.0]].into_dyn());
    /// let y = t.logsumexp(x);
    /// assert!((t.value(y)[[0]] - (1000.0 + 2f64.ln())).abs() < 1e-12);
    /// ```
    #[track_caller]
    pub fn logsumexp(&mut self, x: Var) -> Var {
        let y = logsumexp_forward(self.value(x));
        self.push_unary(y, x, logsumexp_backward)
    }

    /// Per-row cross-entropy of logits against labels (reduction none):
    /// (n, V), (n) → (n). Label −100 gives loss 0 and no gradient.
    ///
    /// **Panics** if x is not 2-D, there is not one label per row, or a
    /// label is outside `[0, V)` and not −100 (layers check labels first
    /// and return an [`Error`](crate::Error)).
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::Tape;
    /// let mut t = Tape::<f64>::new();
    /// let x = t.input(array![[0.0, 0.0], [5.0, 1.0]].into_dyn());
    /// let ce = t.cross_entropy(x, &[1, -100]);
    /// assert!((t.value(ce)[[0]] - 2f64.ln()).abs() < 1e-15);
    /// assert_eq!(t.value(ce)[[1]], 0.0);
    /// ```
    #[track_caller]
    pub fn cross_entropy(&mut self, logits: Var, labels: &[i64]) -> Var {
        let y = cross_entropy_forward(self.value(logits), labels);
        self.push_op_with(y, &[logits], || CrossEntropy {
            logits,
            labels: labels.to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::input_grads;
    use ndarray::array;

    #[test]
    fn hand_case() {
        // Two equal logits: softmax = [1/2, 1/2], label 1:
        // ∂x = softmax − onehot = [1/2, −1/2].
        let g = input_grads(vec![array![[3.0, 3.0]].into_dyn()], |t, x| {
            let ce = t.cross_entropy(x[0], &[1]);
            t.sum(ce)
        });
        let gx = &g[0];
        assert!(
            (gx[[0, 0]] - 0.5).abs() < 1e-15 && (gx[[0, 1]] + 0.5).abs() < 1e-15,
            "{gx}"
        );
    }

    #[test]
    fn stable_in_the_thousands() {
        let x = array![[5000.0f32, 4990.0, -3000.0]].into_dyn();
        let ce = cross_entropy_forward(x.view(), &[1]);
        let expect = (1.0f64 + (-10.0f64).exp()).ln() + 10.0;
        assert!((ce[[0]] as f64 - expect).abs() < 1e-3, "{}", ce[[0]]);
    }

    #[test]
    #[should_panic(expected = "label 2 at position 0 is out of range 0..2")]
    fn bad_label_panics() {
        cross_entropy_forward(array![[0.0f64, 0.0]].into_dyn().view(), &[2]);
    }
}
