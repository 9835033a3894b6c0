//! Stochastic gradient descent with momentum (`torch.optim.SGD`).

use std::collections::BTreeMap;

use ndarray::{ArrayD, IxDyn};

use super::moments::{check_kept, state_shape_error};
use super::{
    Optimizer, StateValue, check_grad, check_lr, check_non_negative, flat_mut, split_entry,
    unknown_field, wrong_kind,
};
use crate::{Error, ParamGrad, Parameter, Real, Result};

/// The hyper-parameters of [`Sgd`]; [`Default`] gives PyTorch's (lr 1e-3,
/// no momentum, no weight decay).
///
/// ```
/// use splitgrad::optim::SgdConfig;
/// let c = SgdConfig { lr: 0.1, momentum: 0.9, nesterov: true, ..SgdConfig::default() };
/// assert_eq!((c.dampening, c.weight_decay), (0.0, 0.0));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdConfig {
    /// Learning rate γ, ≥ 0.
    pub lr: f64,
    /// Momentum μ, ≥ 0 (0: no momentum buffer).
    pub momentum: f64,
    /// Dampening τ of the momentum, ≥ 0.
    pub dampening: f64,
    /// Nesterov momentum (needs μ > 0 and τ = 0).
    pub nesterov: bool,
    /// L2 weight decay λ, ≥ 0, added to the gradient.
    pub weight_decay: f64,
}

impl Default for SgdConfig {
    /// `torch.optim.SGD`'s defaults.
    fn default() -> Self {
        SgdConfig {
            lr: 1e-3,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        }
    }
}

/// SGD with PyTorch's update. For each element, `g` its gradient (0 where a
/// row-sparse gradient has no row):
///
/// ```text
/// d ← g + λ·p                              (only when λ ≠ 0)
/// b ← d on the first step, else μ·b + (1 − τ)·d   (only when μ ≠ 0)
/// d ← d + μ·b if nesterov, else b                (only when μ ≠ 0)
/// p ← p − γ·d
/// ```
///
/// A [`ParamGrad::RowSparse`] gradient behaves exactly as its dense equivalent
/// (with momentum or weight decay every row moves); without either, only
/// its rows are visited. The update is serial.
///
/// ```
/// use ndarray::array;
/// use splitgrad::optim::{Optimizer, Sgd, SgdConfig};
/// use splitgrad::{ParamGrad, Parameter};
/// # fn main() -> splitgrad::Result<()> {
/// let mut sgd = Sgd::new(SgdConfig { lr: 0.5, momentum: 0.5, ..SgdConfig::default() })?;
/// let mut p = Parameter::new("p", array![1.0f64].into_dyn());
/// let g = ParamGrad::Dense(array![1.0].into_dyn());
/// sgd.update(&mut p, &g)?; // b = 1, p = 1 − 0.5·1
/// sgd.update(&mut p, &g)?; // b = 0.5·1 + 1 = 1.5, p = 0.5 − 0.5·1.5
/// assert_eq!(p.value()[0], -0.25);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Sgd<T> {
    config: SgdConfig,
    /// `momentum_buffer` by parameter name (only when μ ≠ 0).
    buffers: BTreeMap<String, ArrayD<T>>,
}

/// The per-step coefficients, rounded to `T` once.
#[derive(Clone, Copy)]
struct Coeffs<T> {
    neg_lr: T,
    weight_decay: Option<T>,
    /// `(μ, 1 − τ, nesterov)` when μ ≠ 0.
    momentum: Option<(T, T, bool)>,
}

impl<T: Real> Coeffs<T> {
    fn new(c: &SgdConfig) -> Self {
        Coeffs {
            neg_lr: T::from_f64(-c.lr),
            weight_decay: (c.weight_decay != 0.0).then(|| T::from_f64(c.weight_decay)),
            momentum: (c.momentum != 0.0).then(|| {
                let mu = T::from_f64(c.momentum);
                (mu, T::from_f64(1.0 - c.dampening), c.nesterov)
            }),
        }
    }

    /// One element's update; `b` is the momentum buffer (unused without
    /// momentum), `first` whether it is created by this step.
    #[inline(always)]
    fn apply(&self, p: &mut T, b: &mut T, first: bool, g: T) {
        let mut d = match self.weight_decay {
            Some(wd) => g + wd * *p,
            None => g,
        };
        if let Some((mu, one_minus_dampening, nesterov)) = self.momentum {
            *b = if first {
                d
            } else {
                *b * mu + one_minus_dampening * d
            };
            d = if nesterov { d + mu * *b } else { *b };
        }
        *p += self.neg_lr * d;
    }

    /// The update of a run of elements; `g = None` is a zero gradient,
    /// `b = None` is no momentum.
    fn apply_run(&self, p: &mut [T], b: Option<&mut [T]>, first: bool, g: Option<&[T]>) {
        let zero = T::zero();
        let g = |i: usize| g.map_or(zero, |g| g[i]);
        match b {
            Some(b) => {
                for (i, (p, b)) in p.iter_mut().zip(b).enumerate() {
                    self.apply(p, b, first, g(i));
                }
            }
            None => {
                let mut unused = zero;
                for (i, p) in p.iter_mut().enumerate() {
                    self.apply(p, &mut unused, first, g(i));
                }
            }
        }
    }
}

impl<T: Real> Sgd<T> {
    /// An SGD optimiser with no state yet.
    ///
    /// Errors ([`ErrorKind::Config`](crate::ErrorKind::Config)), as
    /// PyTorch's: lr, momentum, dampening or weight decay negative or not
    /// finite; Nesterov momentum with μ = 0 or τ ≠ 0.
    ///
    /// ```
    /// use splitgrad::optim::{Sgd, SgdConfig};
    /// assert!(Sgd::<f64>::new(SgdConfig { nesterov: true, ..SgdConfig::default() }).is_err());
    /// let sgd = Sgd::<f64>::new(SgdConfig { momentum: 0.9, nesterov: true, ..SgdConfig::default() }).unwrap();
    /// assert!(sgd.config().nesterov);
    /// ```
    pub fn new(config: SgdConfig) -> Result<Self> {
        check_lr(config.lr, false)?;
        check_non_negative("momentum", config.momentum)?;
        check_non_negative("dampening", config.dampening)?;
        check_non_negative("weight decay", config.weight_decay)?;
        if config.nesterov && (config.momentum == 0.0 || config.dampening != 0.0) {
            return Err(Error::config(
                "Nesterov momentum requires a momentum > 0 and zero dampening",
            ));
        }
        Ok(Sgd {
            config,
            buffers: BTreeMap::new(),
        })
    }

    /// Its hyper-parameters (example at [`Sgd::new`]).
    pub fn config(&self) -> &SgdConfig {
        &self.config
    }
}

impl<T: Real> Optimizer<T> for Sgd<T> {
    #[track_caller]
    fn update(&mut self, param: &mut Parameter<T>, grad: &ParamGrad<T>) -> Result<()> {
        if !param.is_trainable() {
            return Ok(());
        }
        check_grad(param, grad)?;
        if param.dtype().is_half() {
            return Err(Error::config(format!(
                "Sgd does not update a parameter kept in {} (its store would round every \
                 update); use Adam or LazyAdam, whose stores round stochastically",
                param.dtype()
            ))
            .in_array(param.name()));
        }
        let c = Coeffs::<T>::new(&self.config);
        let shape = param.value().shape().to_vec();
        let (mut b, first) = if c.momentum.is_some() {
            let first = !self.buffers.contains_key(param.name());
            if first {
                crate::io::check_memory(
                    || format!("the momentum buffer of `{}` ({shape:?})", param.name()),
                    crate::io::bytes_of(&[
                        param.value().len() as u64,
                        std::mem::size_of::<T>() as u64,
                    ]),
                    "",
                )?;
            }
            let b = self
                .buffers
                .entry(param.name().to_string())
                .or_insert_with(|| ArrayD::zeros(IxDyn(&shape)));
            if b.shape() != shape {
                return Err(state_shape_error(param, "momentum_buffer", b.shape()));
            }
            (
                Some(b.as_slice_mut().expect("state is standard layout")),
                first,
            )
        } else {
            (None, false)
        };
        let p = flat_mut(param);
        match grad {
            ParamGrad::Dense(g) => {
                let g = g.as_standard_layout();
                c.apply_run(p, b, first, g.as_slice());
            }
            ParamGrad::RowSparse(s) => {
                let width = s.values.ncols();
                let values = s.values.as_standard_layout();
                let values = values.as_slice().expect("standard layout is contiguous");
                let rows_with_grad = values.chunks(width.max(1)).zip(&s.rows);
                if c.momentum.is_none() && c.weight_decay.is_none() {
                    // p − γ·0 = p bit for bit: only the gradient's rows move.
                    for (g, &r) in rows_with_grad {
                        c.apply_run(&mut p[r * width..(r + 1) * width], None, first, Some(g));
                    }
                } else if width > 0 {
                    let mut rows_with_grad = rows_with_grad.peekable();
                    for (r, p) in p.chunks_mut(width).enumerate() {
                        let g = rows_with_grad.next_if(|&(_, &gr)| gr == r).map(|(g, _)| g);
                        let b = b.as_deref_mut().map(|b| &mut b[r * width..(r + 1) * width]);
                        c.apply_run(p, b, first, g);
                    }
                }
            }
        }
        Ok(())
    }

    fn state(&self) -> Vec<(String, StateValue<T>)> {
        let buffers = self.buffers.iter();
        buffers
            .map(|(name, b)| {
                (
                    format!("{name}.momentum_buffer"),
                    StateValue::Array(b.clone()),
                )
            })
            .collect()
    }

    fn state_refs(&self) -> Option<Vec<(String, super::StateRef<'_, T>)>> {
        let lent = self.buffers.iter().map(|(name, b)| {
            let view = crate::param::StoredView::Full(b.view());
            (
                format!("{name}.momentum_buffer"),
                super::StateRef::Array(view),
            )
        });
        Some(lent.collect())
    }

    fn load_state(&mut self, entries: Vec<(String, StateValue<T>)>) -> Result<()> {
        let mut buffers = BTreeMap::new();
        for (entry, value) in entries {
            let (param, field) = split_entry(&entry)?;
            if field != "momentum_buffer" {
                return Err(unknown_field(&entry, &["momentum_buffer"]));
            }
            let StateValue::Array(b) = value else {
                return Err(wrong_kind(&entry, "real array", &value));
            };
            let b = b.as_standard_layout().into_owned();
            if buffers.insert(param.to_string(), b).is_some() {
                return Err(Error::format("optimiser state entry given twice").in_array(entry));
            }
        }
        self.buffers = buffers;
        Ok(())
    }

    fn check_state(&self, params: &[&Parameter<T>]) -> Result<()> {
        let kept = self.buffers.iter().map(|(n, b)| (n, b.shape()));
        check_kept(kept, "momentum_buffer", params)
    }

    learning_rate_methods!(false);
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn nesterov_needs_momentum_and_no_dampening() {
        let bad = [
            SgdConfig {
                nesterov: true,
                ..SgdConfig::default()
            },
            SgdConfig {
                nesterov: true,
                momentum: 0.9,
                dampening: 0.1,
                ..SgdConfig::default()
            },
            SgdConfig {
                momentum: -0.9,
                ..SgdConfig::default()
            },
        ];
        for c in bad {
            assert!(Sgd::<f64>::new(c).is_err(), "{c:?}");
        }
    }

    #[test]
    fn load_state_rejects_other_fields_and_kinds() {
        let mut sgd = Sgd::<f64>::new(SgdConfig {
            momentum: 0.9,
            ..SgdConfig::default()
        })
        .unwrap();
        for (entry, message) in [
            (
                "w.exp_avg",
                "array `w.exp_avg`: unknown optimiser state field (this optimiser keeps momentum_buffer)",
            ),
            (
                "w.momentum_buffer",
                "array `w.momentum_buffer`: has dtype u64 step count, expected real array",
            ),
        ] {
            let e = sgd
                .load_state(vec![(entry.into(), StateValue::Step(3))])
                .unwrap_err();
            assert_eq!(e.to_string(), message);
        }
        let b = StateValue::Array(array![1.0, 2.0].into_dyn());
        sgd.load_state(vec![("w.momentum_buffer".into(), b)])
            .unwrap();
        let mut w = Parameter::new("w", array![1.0].into_dyn());
        let e = sgd
            .update(&mut w, &ParamGrad::Dense(array![1.0].into_dyn()))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "array `w.momentum_buffer`: optimiser state has shape [2], expected [1] (the shape of parameter `w`)"
        );
        assert_eq!(w.value()[0], 1.0);
    }
}
