//! Lazy Adam: `torch.optim.SparseAdam` for row-sparse gradients.

use ndarray::{ArrayViewMutD, Axis};
use rayon::prelude::*;

use super::moments::{
    Kernel, MomentTable, Rule, SparseRows, Stacked, Summed, apply_zip, cut_rows, pieces,
    walk_blocks,
};
use super::{Optimizer, StateValue, check_beta, check_lr, check_sparse_rows, flat_mut, rows_width};
use crate::kernels::PAR_MIN_ELEMS;
use crate::param::{BlockGradient, RowGradient, SparseRowGradient};
use crate::{Error, ParamGrad, Parameter, Real, Result, RowSparse};

/// The hyper-parameters of [`LazyAdam`]; [`Default`] gives PyTorch's.
///
/// ```
/// use splitgrad::optim::LazyAdamConfig;
/// let c = LazyAdamConfig::default();
/// assert_eq!((c.lr, c.beta1, c.beta2, c.eps), (1e-3, 0.9, 0.999, 1e-8));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LazyAdamConfig {
    /// Learning rate γ, > 0.
    pub lr: f64,
    /// β1, the first moment's decay, in `[0, 1)`.
    pub beta1: f64,
    /// β2, the second moment's decay, in `[0, 1)`.
    pub beta2: f64,
    /// ε, added to the denominator, > 0.
    pub eps: f64,
}

impl Default for LazyAdamConfig {
    /// `torch.optim.SparseAdam`'s defaults: lr 1e-3, betas (0.9, 0.999),
    /// eps 1e-8.
    fn default() -> Self {
        LazyAdamConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }
}

/// Lazy Adam, with the semantics and update of `torch.optim.SparseAdam`:
/// only the rows present in a row-sparse gradient move, and only their
/// moments change.
///
/// For each row `r` in the gradient, element-wise, with `t` the
/// parameter's step count after the increment:
///
/// ```text
/// m_r ← m_r + (g_r − m_r)·(1 − β1)
/// v_r ← v_r + (g_r·g_r − v_r)·(1 − β2)
/// step_size = γ·√(1 − β2ᵗ) / (1 − β1ᵗ)
/// p_r ← p_r − step_size · m_r / (√v_r + ε)
/// ```
///
/// The step count is per parameter and goes up by one on every update the
/// parameter receives, even one whose gradient has no rows (as PyTorch's).
/// A dense gradient counts as one with every row present. No weight decay:
/// `SparseAdam` has none.
///
/// # How lazy Adam differs from dense Adam
///
/// - Rows absent from a batch keep their moments as they were (stale) and
///   do not move. Dense [`super::Adam`] decays every row's moments every
///   step and keeps moving rows that got no gradient through their
///   momentum `m`.
/// - The bias correction uses the parameter's step count (every update the
///   table received), not the number of updates a row received.
/// - ε is added to `√v` before the bias correction (PyTorch's sparse
///   formula), where dense Adam adds it after: dense Adam divides `m` by
///   `√v / √(1 − β2ᵗ) + ε`, lazy Adam by `(√v + ε) / √(1 − β2ᵗ)`, so lazy
///   Adam's ε acts as ε / √(1 − β2ᵗ), larger in the first steps.
///
/// The update runs in parallel over the gradient's rows; each row is
/// independent, so the result is the same for any number of threads and
/// equals [`LazyAdam::update_naive`]'s bit for bit.
///
/// ```
/// use ndarray::{array, Array2};
/// use splitgrad::optim::{LazyAdam, LazyAdamConfig, Optimizer};
/// use splitgrad::{ParamGrad, Parameter, RowSparse};
/// # fn main() -> splitgrad::Result<()> {
/// let mut table = Parameter::new("emb", Array2::<f64>::ones((3, 2)).into_dyn());
/// let mut opt = LazyAdam::new(LazyAdamConfig { lr: 0.1, ..LazyAdamConfig::default() })?;
/// let g = RowSparse { n_rows: 3, rows: vec![1], values: array![[1.0, -1.0]] };
/// opt.update(&mut table, &ParamGrad::RowSparse(g))?;
/// // Only row 1 moved, by about lr.
/// assert_eq!((table.value()[[0, 0]], table.value()[[0, 1]]), (1.0, 1.0));
/// assert!((table.value()[[1, 0]] - 0.9).abs() < 1e-6 && (table.value()[[1, 1]] - 1.1).abs() < 1e-6);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct LazyAdam<T> {
    config: LazyAdamConfig,
    moments: MomentTable<T>,
}

/// A parameter's step coefficients, its row width, and its value and two
/// moments, flat ([`LazyAdam::t_rows`]).
type TRows<'a, T> = (Coeffs<T>, usize, &'a mut [T], &'a mut [T], &'a mut [T]);

/// The per-step coefficients, rounded to `T` once.
#[derive(Clone, Copy)]
struct Coeffs<T> {
    one_minus_beta1: T,
    one_minus_beta2: T,
    eps: T,
    /// `−γ·√(1 − β2ᵗ) / (1 − β1ᵗ)`.
    neg_step_size: T,
}

impl<T: Real> Rule<T> for Coeffs<T> {
    type Config = LazyAdamConfig;
    const LAZY: bool = true;

    fn new(c: &LazyAdamConfig, step: u64) -> Self {
        let t = step as f64;
        let bias_correction1 = 1.0 - c.beta1.powf(t);
        let bias_correction2 = 1.0 - c.beta2.powf(t);
        let step_size = c.lr * bias_correction2.sqrt() / bias_correction1;
        Coeffs {
            one_minus_beta1: T::from_f64(1.0 - c.beta1),
            one_minus_beta2: T::from_f64(1.0 - c.beta2),
            eps: T::from_f64(c.eps),
            neg_step_size: T::from_f64(-step_size),
        }
    }

    /// One element's update, in the order of PyTorch's `_functional.sparse_adam`.
    #[inline(always)]
    fn apply(&self, p: &mut T, m: &mut T, v: &mut T, g: T) {
        *m = *m + (g - *m) * self.one_minus_beta1;
        *v = *v + (g * g - *v) * self.one_minus_beta2;
        *p += self.neg_step_size * (*m / (v.sqrt() + self.eps));
    }

    /// Only the gradient's rows move, in parallel.
    fn apply_sparse(&self, p: &mut [T], m: &mut [T], v: &mut [T], s: &RowSparse<T>) {
        let width = s.values.ncols();
        let values = s.values.as_standard_layout();
        let values = values.as_slice().expect("standard layout is contiguous");
        self.apply_rows(p, m, v, &s.rows, width, &Stacked(values, width));
    }

    /// Row by row through `ndarray` views.
    fn apply_sparse_naive(&self, mut pmv: [ArrayViewMutD<'_, T>; 3], s: &RowSparse<T>) {
        for (&r, g) in s.rows.iter().zip(s.values.outer_iter()) {
            let row = pmv.each_mut().map(|a| a.index_axis_mut(Axis(0), r));
            apply_zip(self, row, g.into_dyn());
        }
    }
}

impl<T: Real> Coeffs<T> {
    /// The rows `rows` (sorted, unique) of the parameter and its moments,
    /// kept as `T`, updated in parallel, the j-th row's gradient from
    /// `grads`.
    fn apply_rows(
        &self,
        p: &mut [T],
        m: &mut [T],
        v: &mut [T],
        rows: &[usize],
        width: usize,
        grads: &impl SparseRows<T>,
    ) {
        if width == 0 || rows.is_empty() {
            return;
        }
        // A row much heavier to form than the others in runs of columns.
        let (runs, split) = pieces(rows.len(), width, grads);
        let cut = |a| cut_rows(pick_rows(a, width, rows), &runs, <[T]>::split_at_mut);
        let jobs = cut(p).into_iter().zip(cut(m)).zip(cut(v)).zip(&runs);
        let run = |buf: &mut Vec<T>, (((p, m), v), (j, cols)): RunOf<'_, T>| {
            let g = grads.cols(*j, cols.clone(), buf);
            self.apply_run(p, m, v, Some(g));
        };
        if rows.len() * width < PAR_MIN_ELEMS {
            let mut buf = Vec::new();
            jobs.for_each(|job| run(&mut buf, job));
        } else {
            // Rows of a narrow table are batched so that a task has a few
            // thousand elements.
            let min_len = if split { 1 } else { (4096 / width).max(1) };
            let jobs: Vec<_> = jobs.collect();
            jobs.into_par_iter()
                .with_min_len(min_len)
                .for_each_init(Vec::new, run);
        }
    }
}

/// A run of columns of the parameter and of its two moments, and which
/// run it is.
type RunOf<'a, T> = (
    ((&'a mut [T], &'a mut [T]), &'a mut [T]),
    &'a (usize, std::ops::Range<usize>),
);

/// Row r of the parameter and of its two moments.
type RowOf<'a, T> = (usize, ((&'a mut [T], &'a mut [T]), &'a mut [T]));

/// The disjoint rows `rows` (sorted, unique, in range) of a row-major
/// table of row length `width`.
fn pick_rows<'a, T>(mut table: &'a mut [T], width: usize, rows: &[usize]) -> Vec<&'a mut [T]> {
    let mut out = Vec::with_capacity(rows.len());
    let mut next = 0;
    for &r in rows {
        let rest = std::mem::take(&mut table);
        let (row, rest) = rest[(r - next) * width..].split_at_mut(width);
        out.push(row);
        table = rest;
        next = r + 1;
    }
    out
}

impl<T: Real> LazyAdam<T> {
    /// The start of an update of a 2-D `param` whose gradient comes row by
    /// row or block by block: a frozen parameter is left alone, one kept
    /// in half precision (or with half moments) is updated by `half` (the
    /// moments' path), and one kept as `T` takes its step here and gets its
    /// coefficients, its row width and its value and moments, flat (`None`
    /// for rows of no element).
    fn t_rows<'a>(
        &'a mut self,
        param: &'a mut Parameter<T>,
        half: impl FnOnce(&mut MomentTable<T>, &LazyAdamConfig, &mut Parameter<T>, usize) -> Result<()>,
    ) -> Result<Option<TRows<'a, T>>> {
        if !param.is_trainable() {
            return Ok(None);
        }
        let width = rows_width(param)?;
        if self.moments.keeps_half(param) {
            half(&mut self.moments, &self.config, param, width)?;
            return Ok(None);
        }
        let slot = self.moments.step(param)?;
        let c = Coeffs::<T>::new(&self.config, slot.step);
        if width == 0 {
            return Ok(None);
        }
        let (m, v) = slot
            .slices_mut()
            .expect("moments of a parameter kept as T are kept as T");
        Ok(Some((c, width, flat_mut(param), m, v)))
    }

    /// A lazy Adam optimiser with no state yet.
    ///
    /// Errors ([`ErrorKind::Config`](crate::ErrorKind::Config)), as
    /// PyTorch's: lr ≤ 0, eps ≤ 0, a β outside `[0, 1)`, or any of them not
    /// finite.
    ///
    /// ```
    /// use splitgrad::optim::{LazyAdam, LazyAdamConfig};
    /// assert!(LazyAdam::<f32>::new(LazyAdamConfig { eps: 0.0, ..LazyAdamConfig::default() }).is_err());
    /// let opt = LazyAdam::<f32>::new(LazyAdamConfig::default()).unwrap();
    /// assert_eq!(opt.config().eps, 1e-8);
    /// ```
    pub fn new(config: LazyAdamConfig) -> Result<Self> {
        check_lr(config.lr, true)?;
        check_beta("beta1", config.beta1)?;
        check_beta("beta2", config.beta2)?;
        if !(config.eps.is_finite() && config.eps > 0.0) {
            let eps = config.eps;
            return Err(Error::config(format!(
                "invalid eps {eps}: expected a finite value > 0"
            )));
        }
        Ok(LazyAdam {
            config,
            moments: MomentTable::default(),
        })
    }

    /// Its hyper-parameters (example at [`LazyAdam::new`]).
    pub fn config(&self) -> &LazyAdamConfig {
        &self.config
    }

    /// [`Optimizer::update`] computed serially, row by row through
    /// `ndarray` views: the reference the parallel update is tested
    /// against (bit for bit).
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

impl<T: Real> Optimizer<T> for LazyAdam<T> {
    adam_family_methods!(Coeffs<T>, true);

    /// Rows in parallel, each row's gradient written into a buffer of the
    /// task just before the row is updated (in cache): the update of the
    /// stored row-sparse gradient, bit for bit.
    fn update_sparse_by_rows(
        &mut self,
        param: &mut Parameter<T>,
        grad: &dyn SparseRowGradient<T>,
    ) -> Result<()> {
        if !param.is_trainable() {
            return Ok(());
        }
        let width = check_sparse_rows(param, grad)?;
        if self.moments.keeps_half(param) {
            return self.moments.update_half_sparse_by_rows::<Coeffs<T>>(
                &self.config,
                param,
                width,
                grad,
            );
        }
        let slot = self.moments.step(param)?;
        let c = Coeffs::<T>::new(&self.config, slot.step);
        let p = flat_mut(param);
        let (m, v) = slot
            .slices_mut()
            .expect("moments of a parameter kept as T are kept as T");
        c.apply_rows(p, m, v, grad.rows(), width, &Summed(grad));
        Ok(())
    }

    /// Rows in parallel, each row's gradient computed into a buffer of
    /// the task just before the row is updated; in `f32` with the
    /// parameter or its moments in half precision, a row of a
    /// [`RowForm`](crate::param::RowForm) other than `Written` is computed
    /// in registers inside the update.
    fn update_by_rows(
        &mut self,
        param: &mut Parameter<T>,
        grad: &dyn RowGradient<T>,
    ) -> Result<()> {
        let half = |moments: &mut MomentTable<T>,
                    config: &LazyAdamConfig,
                    param: &mut Parameter<T>,
                    width| {
            moments.update_half_by_rows::<Coeffs<T>>(config, param, width, grad)
        };
        let Some((c, width, p, m, v)) = self.t_rows(param, half)? else {
            return Ok(());
        };
        let run = |g: &mut Vec<T>, (r, ((p, m), v)): RowOf<'_, T>| {
            grad.write(r, p, g);
            c.apply_run(p, m, v, Some(g));
        };
        if p.len() < PAR_MIN_ELEMS {
            let mut g = vec![T::zero(); width];
            let rows = p
                .chunks_mut(width)
                .zip(m.chunks_mut(width))
                .zip(v.chunks_mut(width));
            rows.enumerate().for_each(|job| run(&mut g, job));
        } else {
            let rows = p
                .par_chunks_mut(width)
                .zip(m.par_chunks_mut(width))
                .zip(v.par_chunks_mut(width));
            let min_rows = (4096 / width).max(1);
            rows.enumerate()
                .with_min_len(min_rows)
                .for_each_init(|| vec![T::zero(); width], run);
        }
        Ok(())
    }

    /// Blocks in parallel, each block formed from its rows just before
    /// they are updated, each row as [`Self::update_by_rows`] updates it.
    fn update_by_blocks(
        &mut self,
        param: &mut Parameter<T>,
        grad: &dyn BlockGradient<T>,
    ) -> Result<()> {
        let half = |moments: &mut MomentTable<T>,
                    config: &LazyAdamConfig,
                    param: &mut Parameter<T>,
                    width| {
            moments.update_half_by_blocks::<Coeffs<T>>(config, param, width, grad)
        };
        let Some((c, width, p, m, v)) = self.t_rows(param, half)? else {
            return Ok(());
        };
        let (at, len) = (p.as_ptr() as usize, p.len());
        let rows = p
            .chunks_mut(width)
            .zip(m.chunks_mut(width))
            .zip(v.chunks_mut(width));
        walk_blocks(
            rows.collect(),
            grad,
            Some((at, width * std::mem::size_of::<T>())),
            len < PAR_MIN_ELEMS,
            || vec![T::zero(); width],
            |g, r, ((p, m), v), block| {
                block.write(r, p, g);
                c.apply_run(p, m, v, Some(g));
            },
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pick_rows_returns_exactly_the_asked_rows() {
        let mut t: Vec<u32> = (0..12).collect();
        let rows = pick_rows(&mut t, 3, &[0, 2, 3]);
        let got: Vec<Vec<u32>> = rows.into_iter().map(|r| r.to_vec()).collect();
        assert_eq!(got, vec![vec![0, 1, 2], vec![6, 7, 8], vec![9, 10, 11]]);
        assert!(pick_rows(&mut t, 3, &[]).is_empty());
    }

    #[test]
    fn invalid_hyper_parameters_are_config_errors() {
        for c in [
            LazyAdamConfig {
                lr: 0.0,
                ..LazyAdamConfig::default()
            },
            LazyAdamConfig {
                eps: 0.0,
                ..LazyAdamConfig::default()
            },
            LazyAdamConfig {
                beta2: 1.0,
                ..LazyAdamConfig::default()
            },
        ] {
            assert!(LazyAdam::<f64>::new(c).is_err(), "{c:?}");
        }
        let mut opt = LazyAdam::<f64>::new(LazyAdamConfig::default()).unwrap();
        assert_eq!(
            opt.set_learning_rate(0.0).unwrap_err().to_string(),
            "invalid learning rate 0: expected a finite value > 0"
        );
        assert_eq!(opt.learning_rate(), 1e-3);
    }
}
