//! Dense Adam and AdamW (`torch.optim.Adam`, `torch.optim.AdamW`).

use rayon::prelude::*;

use super::moments::{CHUNK, Kernel, MomentTable, Rule};
use super::{Optimizer, StateValue, check_beta, check_lr, check_non_negative};
use crate::kernels::PAR_MIN_ELEMS;
use crate::{ParamGrad, Parameter, Real, Result, RowSparse};

/// The hyper-parameters of [`Adam`], PyTorch's defaults by
/// [`Default`] (Adam) and [`AdamConfig::adamw`] (AdamW).
///
/// ```
/// use splitgrad::optim::AdamConfig;
/// let c = AdamConfig::default();
/// assert_eq!((c.lr, c.beta1, c.beta2, c.eps, c.weight_decay), (1e-3, 0.9, 0.999, 1e-8, 0.0));
/// assert!(AdamConfig::adamw().decoupled_weight_decay);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamConfig {
    /// Learning rate γ, ≥ 0.
    pub lr: f64,
    /// β1, the first moment's decay, in `[0, 1)`.
    pub beta1: f64,
    /// β2, the second moment's decay, in `[0, 1)`.
    pub beta2: f64,
    /// ε, added to the denominator, ≥ 0.
    pub eps: f64,
    /// Weight decay λ, ≥ 0: added to the gradient (L2, Adam) or applied to
    /// the parameter (decoupled, AdamW).
    pub weight_decay: f64,
    /// `true` for AdamW: `p ← p·(1 − γλ)` before the step instead of
    /// `g ← g + λp` (PyTorch's `Adam(decoupled_weight_decay=True)`).
    pub decoupled_weight_decay: bool,
}

impl Default for AdamConfig {
    /// `torch.optim.Adam`'s defaults: lr 1e-3, betas (0.9, 0.999), eps
    /// 1e-8, no weight decay.
    fn default() -> Self {
        AdamConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled_weight_decay: false,
        }
    }
}

impl AdamConfig {
    /// `torch.optim.AdamW`'s defaults: as Adam's, with decoupled weight
    /// decay 1e-2.
    ///
    /// ```
    /// use splitgrad::optim::AdamConfig;
    /// let c = AdamConfig { lr: 3e-4, ..AdamConfig::adamw() };
    /// assert_eq!((c.weight_decay, c.decoupled_weight_decay), (1e-2, true));
    /// ```
    pub fn adamw() -> Self {
        AdamConfig {
            weight_decay: 1e-2,
            decoupled_weight_decay: true,
            ..AdamConfig::default()
        }
    }
}

/// Adam (Kingma & Ba) with PyTorch's update, or AdamW with
/// [`AdamConfig::decoupled_weight_decay`].
///
/// For each element, with `t` the parameter's step count after the
/// increment and `g` its gradient (0 where a row-sparse gradient has no
/// row):
///
/// ```text
/// AdamW: p ← p·(1 − γ·λ)            Adam: g ← g + λ·p   (only when λ ≠ 0)
/// m ← m + (1 − β1)·(g − m)          (PyTorch's lerp_, which for β1 ≤ 0.5 is g − (g − m)·β1)
/// v ← β2·v + (1 − β2)·g·g
/// denom = √v / √(1 − β2ᵗ) + ε
/// p ← p − (γ / (1 − β1ᵗ))·m / denom
/// ```
///
/// A [`ParamGrad::RowSparse`] gradient behaves exactly, bit for bit, as its
/// dense equivalent: every row's moments decay and every row keeps moving
/// through its momentum (without a dense copy of the gradient). For
/// embedding tables where only the rows in the batch should move, use
/// [`super::LazyAdam`].
///
/// The update runs in parallel over contiguous chunks; each element is
/// independent, so the result is the same for any number of threads and
/// equals [`Adam::update_naive`]'s bit for bit.
///
/// ```
/// use ndarray::array;
/// use splitgrad::optim::{Adam, AdamConfig, Optimizer};
/// use splitgrad::{ParamGrad, Parameter};
/// # fn main() -> splitgrad::Result<()> {
/// let mut adamw = Adam::new(AdamConfig { lr: 0.1, weight_decay: 0.5, ..AdamConfig::adamw() })?;
/// let mut p = Parameter::new("p", array![2.0f64].into_dyn());
/// adamw.update(&mut p, &ParamGrad::Dense(array![0.0].into_dyn()))?;
/// // A zero gradient leaves m = 0, so only the decay moves p: 2·(1 − 0.1·0.5).
/// assert_eq!(p.value()[0], 2.0 * (1.0 - 0.1 * 0.5));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Adam<T> {
    config: AdamConfig,
    moments: MomentTable<T>,
}

/// The per-step coefficients, rounded to `T` once.
#[derive(Clone, Copy)]
struct Coeffs<T> {
    /// `1 − β1` and `β1` (lerp's two branches).
    w: T,
    one_minus_w: T,
    small_w: bool,
    beta2: T,
    one_minus_beta2: T,
    bias_correction2_sqrt: T,
    eps: T,
    /// `−γ / (1 − β1ᵗ)`.
    neg_step_size: T,
    /// `λ` of L2 weight decay, if any.
    l2: Option<T>,
    /// `1 − γλ` of decoupled weight decay, if any.
    decay: Option<T>,
}

impl<T: Real> Rule<T> for Coeffs<T> {
    type Config = AdamConfig;

    fn new(c: &AdamConfig, step: u64) -> Self {
        let t = step as f64;
        let bias_correction1 = 1.0 - c.beta1.powf(t);
        let bias_correction2 = 1.0 - c.beta2.powf(t);
        let w = T::from_f64(1.0 - c.beta1);
        let decayed = c.weight_decay != 0.0;
        Coeffs {
            w,
            one_minus_w: T::one() - w,
            small_w: w.abs() < T::from_f64(0.5),
            beta2: T::from_f64(c.beta2),
            one_minus_beta2: T::from_f64(1.0 - c.beta2),
            bias_correction2_sqrt: T::from_f64(bias_correction2.sqrt()),
            eps: T::from_f64(c.eps),
            neg_step_size: T::from_f64(-(c.lr / bias_correction1)),
            l2: (decayed && !c.decoupled_weight_decay).then(|| T::from_f64(c.weight_decay)),
            decay: (decayed && c.decoupled_weight_decay)
                .then(|| T::from_f64(1.0 - c.lr * c.weight_decay)),
        }
    }

    #[inline(always)]
    fn apply(&self, p: &mut T, m: &mut T, v: &mut T, g: T) {
        if let Some(f) = self.decay {
            *p *= f;
        }
        let g = match self.l2 {
            Some(wd) => g + wd * *p,
            None => g,
        };
        *m = if self.small_w {
            *m + self.w * (g - *m)
        } else {
            g - (g - *m) * self.one_minus_w
        };
        *v = *v * self.beta2 + self.one_minus_beta2 * g * g;
        let denom = v.sqrt() / self.bias_correction2_sqrt + self.eps;
        *p += self.neg_step_size * *m / denom;
    }

    /// Every row moves: a row with a gradient row from it, the others from
    /// a zero gradient (the dense equivalent).
    fn apply_sparse(&self, p: &mut [T], m: &mut [T], v: &mut [T], s: &RowSparse<T>) {
        let width = s.values.ncols();
        if p.is_empty() {
            return;
        }
        let values = s.values.as_standard_layout();
        let values = values.as_slice().expect("standard layout is contiguous");
        // Rows [r0, r0 + len / width) of the table, each with its
        // gradient row or none (a zero gradient).
        let rows_from = |r0: usize, p: &mut [T], m: &mut [T], v: &mut [T]| {
            let mut k = s.rows.partition_point(|&r| r < r0);
            let runs = p
                .chunks_mut(width)
                .zip(m.chunks_mut(width))
                .zip(v.chunks_mut(width));
            for (i, ((p, m), v)) in runs.enumerate() {
                let g = if s.rows.get(k) == Some(&(r0 + i)) {
                    k += 1;
                    Some(&values[(k - 1) * width..k * width])
                } else {
                    None
                };
                self.apply_run(p, m, v, g);
            }
        };
        if p.len() < PAR_MIN_ELEMS {
            rows_from(0, p, m, v);
        } else {
            let chunk_rows = (CHUNK / width).max(1);
            let chunk = chunk_rows * width;
            p.par_chunks_mut(chunk)
                .zip(m.par_chunks_mut(chunk))
                .zip(v.par_chunks_mut(chunk))
                .enumerate()
                .for_each(|(i, ((p, m), v))| rows_from(i * chunk_rows, p, m, v));
        }
    }
}

impl<T: Real> Adam<T> {
    /// An Adam (or AdamW) optimiser with no state yet.
    ///
    /// Errors ([`ErrorKind::Config`](crate::ErrorKind::Config)), as
    /// PyTorch's: lr < 0, eps < 0, a β outside `[0, 1)`, weight decay < 0,
    /// or any of them not finite.
    ///
    /// ```
    /// use splitgrad::optim::{Adam, AdamConfig};
    /// assert!(Adam::<f32>::new(AdamConfig { beta2: 1.0, ..AdamConfig::default() }).is_err());
    /// let adam = Adam::<f32>::new(AdamConfig::default()).unwrap();
    /// assert_eq!(adam.config().beta2, 0.999);
    /// ```
    pub fn new(config: AdamConfig) -> Result<Self> {
        check_lr(config.lr, false)?;
        check_beta("beta1", config.beta1)?;
        check_beta("beta2", config.beta2)?;
        check_non_negative("eps", config.eps)?;
        check_non_negative("weight decay", config.weight_decay)?;
        Ok(Adam {
            config,
            moments: MomentTable::default(),
        })
    }

    /// Its hyper-parameters (example at [`Adam::new`]).
    pub fn config(&self) -> &AdamConfig {
        &self.config
    }

    /// [`Optimizer::update`] computed serially, element by element over the
    /// dense gradient (a row-sparse one written out): the reference the
    /// parallel update is tested against (bit for bit).
    ///
    /// **Panics** as [`Optimizer::update`] does. Example: [the module's
    /// serial references](crate::optim#serial-references).
    #[track_caller]
    pub fn update_naive(&mut self, param: &mut Parameter<T>, grad: &ParamGrad<T>) -> Result<()> {
        let naive = Kernel::Naive;
        self.moments
            .update::<Coeffs<T>>(&self.config, param, grad, naive)
    }
}

impl<T: Real> Optimizer<T> for Adam<T> {
    adam_family_methods!(Coeffs<T>, false);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_hyper_parameters_are_config_errors() {
        let bad = [
            AdamConfig {
                lr: -1.0,
                ..AdamConfig::default()
            },
            AdamConfig {
                beta1: 1.0,
                ..AdamConfig::default()
            },
            AdamConfig {
                beta2: -0.1,
                ..AdamConfig::default()
            },
            AdamConfig {
                eps: f64::NAN,
                ..AdamConfig::default()
            },
            AdamConfig {
                weight_decay: -1e-2,
                ..AdamConfig::adamw()
            },
        ];
        for c in bad {
            let e = Adam::<f32>::new(c).unwrap_err();
            assert!(matches!(e.kind(), crate::ErrorKind::Config { .. }), "{c:?}");
        }
        assert_eq!(
            Adam::<f32>::new(AdamConfig {
                beta1: 1.0,
                ..AdamConfig::default()
            })
            .unwrap_err()
            .to_string(),
            "invalid beta1 1: expected 0 <= beta1 < 1"
        );
    }
}
