//! What the Adam family ([`super::Adam`], [`super::LazyAdam`]) shares: the
//! per-parameter state (a step count and the two moments, keyed by
//! parameter name, with its checkpoint form), and the update itself, each
//! member giving its element rule and its treatment of a row-sparse
//! gradient ([`Rule`]).

use std::collections::BTreeMap;

use ndarray::{ArrayViewD, ArrayViewMutD, Zip};
use rayon::prelude::*;

use super::{StateValue, check_grad, flat_mut, split_entry, unknown_field, wrong_kind};
use crate::kernels::PAR_MIN_ELEMS;

use crate::param::{Dtype, Rounding, Stored, StoredMut};
use crate::{Error, ParamGrad, Parameter, Real, Result, RowSparse};

mod blocks;
mod half;
pub(super) use blocks::walk_blocks;
use half::{Keys, arrays, by_blocks, by_rows, keys, rows_half, update_half, update_half_naive};
pub(super) use half::{SparseRows, Stacked, Summed, cut_rows, pieces};

/// Elements per parallel task of a dense update.
pub(super) const CHUNK: usize = 1 << 14;

/// The update rule of one member of the family: its coefficients for one
/// step, rounded to `T` once, and how they apply.
pub(super) trait Rule<T: Real>: Sized + Sync {
    /// The hyper-parameters.
    type Config;

    /// Whether a row-sparse gradient moves only its rows (lazy Adam), or
    /// every row as its dense equivalent would (dense Adam).
    const LAZY: bool = false;

    /// The coefficients of the step whose count (after the increment) is
    /// `step`.
    fn new(config: &Self::Config, step: u64) -> Self;

    /// One element's update from its gradient `g`.
    fn apply(&self, p: &mut T, m: &mut T, v: &mut T, g: T);

    /// The update of a run of elements; `g = None` is a zero gradient.
    /// Compiled for the widest vector unit the CPU has
    /// ([`wide`](crate::kernels::wide::wide)): each element's additions,
    /// products, quotient and square root are IEEE operations, correctly
    /// rounded at any vector width and never fused, so every path gives
    /// the bits of the naive update (`apply_zip`, baseline code).
    #[inline]
    fn apply_run(&self, p: &mut [T], m: &mut [T], v: &mut [T], g: Option<&[T]>) {
        crate::kernels::wide::wide(|| {
            let pmv = p.iter_mut().zip(m.iter_mut()).zip(v.iter_mut());
            match g {
                Some(g) => pmv
                    .zip(g)
                    .for_each(|(((p, m), v), &g)| self.apply(p, m, v, g)),
                None => pmv.for_each(|((p, m), v)| self.apply(p, m, v, T::zero())),
            }
        })
    }

    /// The update of the whole parameter and its moments, flat and
    /// row-major, from a row-sparse gradient of its shape.
    fn apply_sparse(&self, p: &mut [T], m: &mut [T], v: &mut [T], s: &RowSparse<T>);

    /// [`Rule::apply_sparse`] serially through `ndarray` views of the
    /// parameter and its moments: the reference it is tested against, bit
    /// for bit. This default updates every element from the dense
    /// gradient, the row-sparse one written out (right for a member whose
    /// row-sparse update is its dense equivalent's).
    fn apply_sparse_naive(&self, pmv: [ArrayViewMutD<'_, T>; 3], s: &RowSparse<T>) {
        apply_zip(self, pmv, s.to_dense().into_dyn().view());
    }
}

/// Every element's update from a dense gradient, in parallel chunks above
/// [`PAR_MIN_ELEMS`] elements (each element is independent, so the result
/// is the same for any number of threads).
pub(super) fn apply_dense<T: Real>(
    rule: &impl Rule<T>,
    p: &mut [T],
    m: &mut [T],
    v: &mut [T],
    g: &[T],
) {
    if p.len() < PAR_MIN_ELEMS {
        rule.apply_run(p, m, v, Some(g));
    } else {
        p.par_chunks_mut(CHUNK)
            .zip(m.par_chunks_mut(CHUNK))
            .zip(v.par_chunks_mut(CHUNK))
            .zip(g.par_chunks(CHUNK))
            .for_each(|(((p, m), v), g)| rule.apply_run(p, m, v, Some(g)));
    }
}

/// Every element's update, serially through `ndarray` views (the naive
/// path).
pub(super) fn apply_zip<T: Real>(
    rule: &impl Rule<T>,
    [p, m, v]: [ArrayViewMutD<'_, T>; 3],
    g: ArrayViewD<'_, T>,
) {
    Zip::from(p)
        .and(m)
        .and(v)
        .and(g)
        .for_each(|p, m, v, &g| rule.apply(p, m, v, g));
}

/// Which update to run: the parallel kernels, or their serial reference
/// (`update_naive`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kernel {
    Fast,
    Naive,
}

const FIELDS: [&str; 3] = ["exp_avg", "exp_avg_sq", "step"];

/// One parameter's Adam state.
#[derive(Clone, Debug)]
pub(super) struct Moments<T> {
    /// Steps taken (PyTorch's `state["step"]`).
    pub step: u64,
    /// First moment `m`, the parameter's shape, standard layout.
    pub exp_avg: Stored<T>,
    /// Second moment `v`, the parameter's shape, standard layout.
    pub exp_avg_sq: Stored<T>,
}

impl<T: Real> Moments<T> {
    /// `m` and `v` as flat slices kept as `T`, for the update kernels
    /// (`None` when either is kept in half precision).
    pub fn slices_mut(&mut self) -> Option<(&mut [T], &mut [T])> {
        match (self.exp_avg.flat_mut(), self.exp_avg_sq.flat_mut()) {
            (StoredMut::Full(m), StoredMut::Full(v)) => Some((m, v)),
            _ => None,
        }
    }

    /// Whether either moment is kept in half precision.
    pub fn is_half(&self) -> bool {
        self.exp_avg.dtype().is_half() || self.exp_avg_sq.dtype().is_half()
    }
}

/// How an Adam-family optimiser keeps its moments, and how it narrows
/// what it stores in half precision (the parameters' values and its
/// moments).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Keeping {
    /// The moments' dtype; `None`: the engine's own.
    pub state_dtype: Option<Dtype>,
    /// The narrowing of every half-precision store.
    pub rounding: Rounding,
}

/// The Adam state of every parameter an optimiser has updated.
#[derive(Clone, Debug, Default)]
pub(super) struct MomentTable<T> {
    slots: BTreeMap<String, Moments<T>>,
    pub keeping: Keeping,
}

impl<T: Real> MomentTable<T> {
    /// One update of `param` from its gradient by the member whose rule
    /// is `R` ([`Optimizer::update`](super::Optimizer::update), or
    /// `update_naive` with [`Kernel::Naive`]): a frozen parameter is left
    /// alone and gets no state; otherwise the gradient is checked (its
    /// error comes before a state error), the step counted, and every
    /// element of a dense gradient, or the rows of a row-sparse one as the
    /// rule treats them, updated.
    ///
    /// **Panics** if a row-sparse gradient's rows are not sorted and unique.
    #[track_caller]
    pub fn update<R: Rule<T>>(
        &mut self,
        config: &R::Config,
        param: &mut Parameter<T>,
        grad: &ParamGrad<T>,
        kernel: Kernel,
    ) -> Result<()> {
        if !param.is_trainable() {
            return Ok(());
        }
        check_grad(param, grad)?;
        let rounding = self.keeping.rounding;
        let slot = self.step(param)?;
        let rule = R::new(config, slot.step);
        if param.dtype().is_half() || slot.is_half() {
            let keys = keys(rounding, slot.step, param);
            match kernel {
                Kernel::Naive => update_half_naive(&rule, param, slot, grad, keys),
                Kernel::Fast => update_half(&rule, param, slot, grad, keys),
            }
            return Ok(());
        }
        if kernel == Kernel::Naive {
            let m = slot
                .exp_avg
                .as_full_mut()
                .expect("checked above")
                .view_mut();
            let v = slot
                .exp_avg_sq
                .as_full_mut()
                .expect("checked above")
                .view_mut();
            let pmv = [param.value_mut().view_mut(), m, v];
            match grad {
                ParamGrad::Dense(g) => apply_zip(&rule, pmv, g.view()),
                ParamGrad::RowSparse(s) => rule.apply_sparse_naive(pmv, s),
            }
            return Ok(());
        }
        let p = flat_mut(param);
        let (m, v) = slot.slices_mut().expect("checked above");
        match grad {
            ParamGrad::Dense(g) => {
                let g = g.as_standard_layout();
                let g = g.as_slice().expect("standard layout is contiguous");
                apply_dense(&rule, p, m, v, g);
            }
            ParamGrad::RowSparse(s) => rule.apply_sparse(p, m, v, s),
        }
        Ok(())
    }

    /// One update of a 2-D `param` kept in half precision, or with moments
    /// kept so, whose gradient is given row by row (`grad`,
    /// [`Optimizer::update_by_rows`](super::Optimizer::update_by_rows)): in
    /// parallel over rows, each row's gradient computed in registers from
    /// its form, or (a written row) its parameter widened and its gradient
    /// written into a buffer of the task; the row updated as
    /// [`update_half`] updates it. The gradient is never written out; the
    /// result is the update of the dense gradient bit for bit. The step is
    /// counted (and the gradient's width checked) by the caller.
    pub fn update_half_by_rows<R: Rule<T>>(
        &mut self,
        config: &R::Config,
        param: &mut Parameter<T>,
        width: usize,
        grad: &dyn crate::param::RowGradient<T>,
    ) -> Result<()> {
        let (rule, slot, keys) = self.half_step::<R>(config, param)?;
        if width > 0 {
            by_rows(&rule, param, slot, width, grad, keys);
        }
        Ok(())
    }

    /// [`Self::update_half_by_rows`] from a gradient formed a block of rows
    /// at a time ([`Optimizer::update_by_blocks`](super::Optimizer::update_by_blocks)):
    /// in parallel over blocks, each block formed from its rows as they are
    /// kept, then its rows updated while they are in cache; the update of
    /// the dense gradient bit for bit.
    pub fn update_half_by_blocks<R: Rule<T>>(
        &mut self,
        config: &R::Config,
        param: &mut Parameter<T>,
        width: usize,
        grad: &dyn crate::param::BlockGradient<T>,
    ) -> Result<()> {
        let (rule, slot, keys) = self.half_step::<R>(config, param)?;
        if width > 0 {
            by_blocks(&rule, param, slot, width, grad, keys);
        }
        Ok(())
    }

    /// One lazy update (`R::LAZY`) of a 2-D `param` kept in half
    /// precision, or with moments kept so, from a row-sparse gradient given
    /// row by row ([`Optimizer::update_sparse_by_rows`](super::Optimizer::update_sparse_by_rows)):
    /// in parallel over its rows, each row's gradient written into a buffer
    /// of the task just before the row is updated as [`update_half`]
    /// updates it; the update of the stored row-sparse gradient bit for
    /// bit. The gradient is checked by the caller.
    pub fn update_half_sparse_by_rows<R: Rule<T>>(
        &mut self,
        config: &R::Config,
        param: &mut Parameter<T>,
        width: usize,
        grad: &dyn crate::param::SparseRowGradient<T>,
    ) -> Result<()> {
        debug_assert!(R::LAZY, "a row-sparse update by rows moves only its rows");
        let (rule, slot, keys) = self.half_step::<R>(config, param)?;
        let pmv = arrays(param, slot);
        rows_half(&rule, pmv, grad.rows(), width, &Summed(grad), &keys);
        Ok(())
    }

    /// Whether `param`'s update takes the half-precision path: the
    /// parameter, or the moments this table keeps, in half precision.
    pub fn keeps_half(&self, param: &Parameter<T>) -> bool {
        param.dtype().is_half() || self.keeping.state_dtype.is_some_and(Dtype::is_half)
    }

    /// The step of a half-precision update by rows counted: the rule's
    /// coefficients, the parameter's state and the three arrays'
    /// stochastic-rounding keys.
    fn half_step<R: Rule<T>>(
        &mut self,
        config: &R::Config,
        param: &Parameter<T>,
    ) -> Result<(R, &mut Moments<T>, Keys)> {
        let rounding = self.keeping.rounding;
        let slot = self.step(param)?;
        let rule = R::new(config, slot.step);
        let keys = keys(rounding, slot.step, param);
        Ok((rule, slot, keys))
    }

    /// The state of `param` with one more step counted (zeros and step 1
    /// the first time); an error as [`MomentTable::slot`].
    pub fn step(&mut self, param: &Parameter<T>) -> Result<&mut Moments<T>> {
        let slot = self.slot(param)?;
        slot.step = slot.step.checked_add(1).ok_or_else(|| {
            crate::Error::config(format!(
                "parameter `{}` has taken {} steps: no step count follows (its state was loaded with one)",
                param.name(),
                slot.step
            ))
        })?;
        Ok(slot)
    }

    /// The state of `param`, zeros (step 0) the first time; an error if
    /// the kept state has another shape than the parameter.
    pub fn slot(&mut self, param: &Parameter<T>) -> Result<&mut Moments<T>> {
        let shape = param.shape();
        let dtype = self.keeping.state_dtype.unwrap_or(Dtype::of::<T>());
        if let Some(m) = self.slots.get(param.name()) {
            if m.exp_avg.shape() != shape {
                return Err(state_shape_error(param, "exp_avg", m.exp_avg.shape()));
            }
        } else {
            // The two moments are allocated here, the first time: checked
            // against the memory available before they are.
            let n = param.shape().iter().product::<usize>() as u64;
            crate::io::check_memory(
                || {
                    format!(
                        "the optimiser's two moments of `{}` ({shape:?}, {dtype})",
                        param.name()
                    )
                },
                crate::io::bytes_of(&[n, 2, dtype.size() as u64]),
                "",
            )?;
            let zeros = || Stored::zeros(shape, dtype).expect("the state dtype was checked");
            let fresh = Moments {
                step: 0,
                exp_avg: zeros(),
                exp_avg_sq: zeros(),
            };
            self.slots.insert(param.name().to_string(), fresh);
        }
        Ok(self
            .slots
            .get_mut(param.name())
            .expect("present or inserted above"))
    }

    /// Keeps every moment as `dtype` from now on (rounded to nearest).
    pub fn convert_state(&mut self, dtype: Dtype) -> Result<()> {
        for (name, m) in self.slots.iter_mut() {
            for (field, a) in [
                ("exp_avg", &mut m.exp_avg),
                ("exp_avg_sq", &mut m.exp_avg_sq),
            ] {
                a.set_dtype(dtype)
                    .map_err(|e| e.in_array(format!("{name}.{field}")))?;
            }
        }
        Ok(())
    }

    /// The state of the parameter with this name, if it has any.
    #[cfg(test)]
    pub fn get(&self, name: &str) -> Option<&Moments<T>> {
        self.slots.get(name)
    }

    /// The entries of [`MomentTable::state`], borrowed.
    pub fn state_refs(&self) -> Vec<(String, super::StateRef<'_, T>)> {
        use super::StateRef;
        let mut out = Vec::with_capacity(3 * self.slots.len());
        for (name, m) in &self.slots {
            out.push((format!("{name}.exp_avg"), StateRef::Array(m.exp_avg.view())));
            out.push((
                format!("{name}.exp_avg_sq"),
                StateRef::Array(m.exp_avg_sq.view()),
            ));
            out.push((format!("{name}.step"), StateRef::Step(m.step)));
        }
        out
    }

    /// `(name.exp_avg, m)`, `(name.exp_avg_sq, v)`, `(name.step, t)` per
    /// parameter, sorted by name.
    pub fn state(&self) -> Vec<(String, StateValue<T>)> {
        let mut out = Vec::with_capacity(3 * self.slots.len());
        let value = |a: &Stored<T>| match a {
            Stored::Full(a) => StateValue::Array(a.clone()),
            half => StateValue::Half(half.clone()),
        };
        for (name, m) in &self.slots {
            out.push((format!("{name}.exp_avg"), value(&m.exp_avg)));
            out.push((format!("{name}.exp_avg_sq"), value(&m.exp_avg_sq)));
            out.push((format!("{name}.step"), StateValue::Step(m.step)));
        }
        out
    }

    /// Replaces the table with the entries of [`MomentTable::state`]; on an
    /// error the table is unchanged.
    pub fn load(&mut self, entries: Vec<(String, StateValue<T>)>) -> Result<()> {
        type Partial<T> = (Option<Stored<T>>, Option<Stored<T>>, Option<u64>);
        let mut parts: BTreeMap<String, Partial<T>> = BTreeMap::new();
        for (entry, value) in entries {
            let (param, field) = split_entry(&entry)?;
            let slot = parts.entry(param.to_string()).or_default();
            let taken = match (field, value) {
                ("exp_avg", StateValue::Array(a)) => slot.0.replace(Stored::Full(a)).is_some(),
                ("exp_avg_sq", StateValue::Array(a)) => slot.1.replace(Stored::Full(a)).is_some(),
                ("exp_avg", StateValue::Half(a)) => slot.0.replace(a).is_some(),
                ("exp_avg_sq", StateValue::Half(a)) => slot.1.replace(a).is_some(),
                ("step", StateValue::Step(s)) => slot.2.replace(s).is_some(),
                ("exp_avg" | "exp_avg_sq", v) => return Err(wrong_kind(&entry, "real array", &v)),
                ("step", v) => return Err(wrong_kind(&entry, "u64 step count", &v)),
                _ => return Err(unknown_field(&entry, &FIELDS)),
            };
            if taken {
                return Err(Error::format("optimiser state entry given twice").in_array(entry));
            }
        }
        let mut slots = BTreeMap::new();
        for (name, (m, v, step)) in parts {
            let missing = |field: &str| {
                Error::new(crate::ErrorKind::Missing).in_array(format!("{name}.{field}"))
            };
            let m = m.ok_or_else(|| missing("exp_avg"))?;
            let v = v.ok_or_else(|| missing("exp_avg_sq"))?;
            let step = step.ok_or_else(|| missing("step"))?;
            if v.shape() != m.shape() {
                return Err(Error::shape(
                    "optimiser state",
                    format!("{:?} (the shape of `{name}.exp_avg`)", m.shape()),
                    v.shape(),
                )
                .in_array(format!("{name}.exp_avg_sq")));
            }
            // Kept as this optimiser keeps its moments (converted, to
            // nearest, when the file's differ), in standard layout.
            let dtype = self.keeping.state_dtype.unwrap_or(Dtype::of::<T>());
            let keep = |mut a: Stored<T>| {
                a.set_dtype(dtype)
                    .map_err(|e| e.in_array(format!("{name}.exp_avg")))?;
                let _ = a.flat_mut();
                Ok::<_, Error>(a)
            };
            let exp_avg = keep(m)?;
            let exp_avg_sq = keep(v)?;
            slots.insert(
                name,
                Moments {
                    step,
                    exp_avg,
                    exp_avg_sq,
                },
            );
        }
        self.slots = slots;
        Ok(())
    }

    /// Every parameter with state is in `params`, with the state's shape.
    pub fn check(&self, params: &[&Parameter<T>]) -> Result<()> {
        let kept = self.slots.iter().map(|(n, m)| (n, m.exp_avg.shape()));
        // (shapes only: a moment's dtype is the optimiser's, not the
        // parameter's)
        check_kept(kept, "exp_avg", params)
    }
}

/// Checks kept state, `(parameter name, shape)` for each parameter with
/// state, against the parameters it will update: each is among `params`
/// with that shape. An error names the entry `<name>.<field>`.
pub(super) fn check_kept<'k, T>(
    kept: impl Iterator<Item = (&'k String, &'k [usize])>,
    field: &str,
    params: &[&Parameter<T>],
) -> Result<()> {
    for (name, shape) in kept {
        match params.iter().find(|p| p.name() == name) {
            None => {
                return Err(Error::format(
                    "optimiser state for a parameter that is not being trained",
                )
                .in_array(format!("{name}.{field}")));
            }
            Some(p) if p.shape() != shape => {
                return Err(state_shape_error(p, field, shape));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Kept state of `param` (field `field`) has shape `found`, not the
/// parameter's.
pub(super) fn state_shape_error<T>(param: &Parameter<T>, field: &str, found: &[usize]) -> Error {
    Error::shape(
        "optimiser state",
        format!(
            "{:?} (the shape of parameter `{}`)",
            param.shape(),
            param.name()
        ),
        found,
    )
    .in_array(format!("{}.{field}", param.name()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    type Entries = Vec<(String, StateValue<f32>)>;

    fn entries() -> Entries {
        vec![
            (
                "a.b.exp_avg".into(),
                StateValue::Array(array![1.0f32, 2.0].into_dyn()),
            ),
            (
                "a.b.exp_avg_sq".into(),
                StateValue::Array(array![3.0f32, 4.0].into_dyn()),
            ),
            ("a.b.step".into(), StateValue::Step((1 << 24) + 1)),
        ]
    }

    #[test]
    fn load_then_state_round_trips() {
        let mut t = MomentTable::<f32>::default();
        t.load(entries()).unwrap();
        assert_eq!(t.state(), entries());
        assert_eq!(t.get("a.b").unwrap().step, 16_777_217);
    }

    #[test]
    fn load_errors_name_the_entry_and_keep_the_table() {
        let mut t = MomentTable::<f32>::default();
        t.load(entries()).unwrap();
        let cases: Vec<(Entries, &str)> = vec![
            (
                vec![("a.b.exp_avg_sqr".into(), StateValue::Step(1))],
                "array `a.b.exp_avg_sqr`: unknown optimiser state field (this optimiser keeps exp_avg, exp_avg_sq, step)",
            ),
            (
                vec![(
                    "a.b.step".into(),
                    StateValue::Array(array![1.0f32].into_dyn()),
                )],
                "array `a.b.step`: has dtype real array, expected u64 step count",
            ),
            (entries()[..2].to_vec(), "array `a.b.step`: is missing"),
            (
                [entries(), entries()[2..].to_vec()].concat(),
                "array `a.b.step`: optimiser state entry given twice",
            ),
            (
                vec![
                    entries()[0].clone(),
                    (
                        "a.b.exp_avg_sq".into(),
                        StateValue::Array(array![3.0f32].into_dyn()),
                    ),
                    entries()[2].clone(),
                ],
                "array `a.b.exp_avg_sq`: optimiser state has shape [1], expected [2] (the shape of `a.b.exp_avg`)",
            ),
        ];
        for (bad, message) in cases {
            assert_eq!(t.load(bad).unwrap_err().to_string(), message);
            assert_eq!(t.state(), entries());
        }
    }

    #[test]
    fn check_finds_unknown_names_and_shape_mismatches() {
        let mut t = MomentTable::<f32>::default();
        t.load(entries()).unwrap();
        let right = Parameter::new("a.b", array![0.0f32, 0.0].into_dyn());
        let wrong = Parameter::new("a.b", array![0.0f32].into_dyn());
        let other = Parameter::new("c", array![0.0f32, 0.0].into_dyn());
        assert!(t.check(&[&other, &right]).is_ok());
        assert_eq!(
            t.check(&[&wrong]).unwrap_err().to_string(),
            "array `a.b.exp_avg`: optimiser state has shape [2], expected [1] (the shape of parameter `a.b`)"
        );
        assert_eq!(
            t.check(&[&other]).unwrap_err().to_string(),
            "array `a.b.exp_avg`: optimiser state for a parameter that is not being trained"
        );
        assert!(t.slot(&wrong).is_err());
        assert!(t.slot(&right).is_ok());
    }
}
