//! Optimisers with PyTorch's update formulas: [`Sgd`], [`Adam`] (and AdamW)
//! and [`LazyAdam`] (`torch.optim.SparseAdam`).
//!
//! | optimiser | PyTorch | gradient | moves |
//! |---|---|---|---|
//! | [`Sgd`] | `torch.optim.SGD` | dense or row-sparse | every element (a row-sparse gradient counts as its dense equivalent) |
//! | [`Adam`] | `torch.optim.Adam`, `torch.optim.AdamW` | dense or row-sparse | every element (ditto) |
//! | [`LazyAdam`] | `torch.optim.SparseAdam` | row-sparse (or dense: every row present) | only the rows in the gradient |
//!
//! Each one implements [`Optimizer`]: [`Optimizer::update`] applies one step
//! to one parameter from its gradient, so a training loop calls it once per
//! parameter per step (the step count is kept per parameter, as PyTorch
//! keeps `state[p]["step"]`). A frozen parameter
//! ([`Parameter::is_trainable`] is `false`) is never moved and gets no
//! state.
//!
//! # Arithmetic
//!
//! Hyper-parameters and bias corrections are computed in `f64` (as Python
//! floats are) and rounded once to `T`; the element-wise updates are then
//! computed in `T` in the order of PyTorch's CPU kernels (`lerp_`,
//! `addcmul_`, `addcdiv_`, …), never with a fused multiply-add. PyTorch's
//! vectorised kernels may fuse, so results agree with PyTorch to rounding,
//! and with themselves bit for bit whatever the number of threads.
//!
//! # Serial references
//!
//! The Adam family's updates run in parallel; each has a serial twin,
//! [`Adam::update_naive`] and [`LazyAdam::update_naive`], that it equals
//! bit for bit whatever the number of threads:
//!
//! ```
//! use ndarray::array;
//! use splitgrad::optim::{Adam, AdamConfig, LazyAdam, LazyAdamConfig, Optimizer};
//! use splitgrad::{ParamGrad, Parameter, Result, RowSparse};
//!
//! type Naive<O> = fn(&mut O, &mut Parameter<f32>, &ParamGrad<f32>) -> Result<()>;
//!
//! /// One update of a table by `fast`, and by `naive` through its serial
//! /// twin, from a gradient of table row `row`.
//! fn agree<O: Optimizer<f32>>(mut fast: O, (mut naive, update_naive): (O, Naive<O>), row: usize) -> Result<()> {
//!     let g = ParamGrad::RowSparse(RowSparse { n_rows: 2, rows: vec![row], values: array![[0.5f32, -1.0]] });
//!     let table = array![[1.0f32, 2.0], [3.0, 4.0]].into_dyn();
//!     let (mut a, mut b) = (Parameter::new("t", table.clone()), Parameter::new("t", table));
//!     fast.update(&mut a, &g)?;
//!     update_naive(&mut naive, &mut b, &g)?;
//!     assert_eq!(a.value(), b.value());
//!     Ok(())
//! }
//!
//! # fn main() -> Result<()> {
//! let adam = || Adam::new(AdamConfig::default());
//! agree(adam()?, (adam()?, Adam::update_naive), 1)?;
//! let lazy = || LazyAdam::new(LazyAdamConfig::default());
//! agree(lazy()?, (lazy()?, LazyAdam::update_naive), 0)?;
//! # Ok(()) }
//! ```
//!
//! # State and checkpoints
//!
//! State is keyed by the parameter's **name** ([`Parameter::name`]), not its
//! [`ParamId`](crate::ParamId): ids differ between processes, names are
//! stable across a checkpoint. Two parameters given to one optimiser must
//! therefore have different names. [`Optimizer::state`] lists the state as
//! `("<parameter name>.<field>", value)` with PyTorch's field names
//! (`exp_avg`, `exp_avg_sq`, `step`, `momentum_buffer`); step counts are
//! [`StateValue::Step`] (`u64`, exact: an `f32` array would lose counts past
//! 2²⁴). [`Optimizer::load_state`] takes the same list back, and training
//! resumes bit for bit. The hyper-parameters are not state: build the
//! resumed optimiser with the same configuration.
//!
//! # Errors
//!
//! A gradient whose shape does not match its parameter, and state (loaded
//! or kept) whose shape does not, are [`ErrorKind::Shape`](crate::ErrorKind::Shape)
//! errors naming the parameter or the state entry; an invalid
//! hyper-parameter is an [`ErrorKind::Config`](crate::ErrorKind::Config)
//! error.
//!
//! ```
//! use ndarray::array;
//! use splitgrad::optim::{Adam, AdamConfig, Optimizer};
//! use splitgrad::{ParamGrad, Parameter};
//! # fn main() -> splitgrad::Result<()> {
//! let mut w = Parameter::new("w", array![1.0f64, -2.0].into_dyn());
//! let mut adam = Adam::new(AdamConfig { lr: 0.1, ..AdamConfig::default() })?;
//! adam.update(&mut w, &ParamGrad::Dense(array![0.5, -0.5].into_dyn()))?;
//! // The first Adam step moves every element by about lr against its gradient's sign.
//! assert!((w.value()[0] - 0.9).abs() < 1e-6 && (w.value()[1] + 1.9).abs() < 1e-6);
//! # Ok(()) }
//! ```

/// `learning_rate` and `set_learning_rate` of an [`Optimizer`] impl whose
/// configuration is `self.config`: the rate is `config.lr`, a new one
/// checked as at construction (`check_lr(lr, $strict)`).
macro_rules! learning_rate_methods {
    ($strict:expr) => {
        fn learning_rate(&self) -> f64 {
            self.config.lr
        }

        fn set_learning_rate(&mut self, lr: f64) -> Result<()> {
            super::check_lr(lr, $strict)?;
            self.config.lr = lr;
            Ok(())
        }
    };
}

/// The [`Optimizer`] methods of the Adam family, whose state is the
/// [`moments::MomentTable`] `self.moments`: `update` by the rule `$rule`
/// (from `self.config`), the state's three methods, and the learning rate's
/// two (`$strict` as in `learning_rate_methods`).
macro_rules! adam_family_methods {
    ($rule:ty, $strict:expr) => {
        #[track_caller]
        fn update(&mut self, param: &mut Parameter<T>, grad: &ParamGrad<T>) -> Result<()> {
            let fast = super::moments::Kernel::Fast;
            self.moments
                .update::<$rule>(&self.config, param, grad, fast)
        }

        fn state(&self) -> Vec<(String, StateValue<T>)> {
            self.moments.state()
        }

        fn state_refs(&self) -> Option<Vec<(String, super::StateRef<'_, T>)>> {
            Some(self.moments.state_refs())
        }

        fn load_state(&mut self, entries: Vec<(String, StateValue<T>)>) -> Result<()> {
            self.moments.load(entries)
        }

        fn check_state(&self, params: &[&Parameter<T>]) -> Result<()> {
            self.moments.check(params)
        }

        fn set_rounding(&mut self, rounding: $crate::param::Rounding) {
            self.moments.keeping.rounding = rounding;
        }

        fn rounding(&self) -> $crate::param::Rounding {
            self.moments.keeping.rounding
        }

        /// `T`'s own dtype or bf16; f16 is refused (the second moment, a
        /// squared gradient, falls below f16's smallest value, 6·10⁻⁸, for
        /// gradients under 2.4·10⁻⁴). Moments already kept are converted
        /// (to nearest).
        fn set_state_dtype(&mut self, dtype: $crate::param::Dtype) -> Result<()> {
            use $crate::param::Dtype;
            match dtype {
                Dtype::F16 => {
                    return Err($crate::Error::config(
                        "f16 cannot keep Adam's second moment (a squared gradient below 6e-8 \
                         is lost); keep the optimiser state in bf16 or f32",
                    ));
                }
                d if d != Dtype::BF16 && d != Dtype::of::<T>() => {
                    return Err($crate::Error::config(format!(
                        "optimiser state of a {} optimiser is kept as {} or bf16, not {d}",
                        T::NAME,
                        T::NAME
                    )));
                }
                _ => {}
            }
            let keep = (dtype != Dtype::of::<T>()).then_some(dtype);
            self.moments.keeping.state_dtype = keep;
            self.moments.convert_state(dtype)
        }

        fn state_dtype(&self) -> $crate::param::Dtype {
            self.moments
                .keeping
                .state_dtype
                .unwrap_or($crate::param::Dtype::of::<T>())
        }

        learning_rate_methods!($strict);
    };
}

mod adam;
mod grads;
mod groups;
#[cfg(test)]
mod kernel_tests;
mod lazy_adam;
mod moments;
mod sgd;

pub use adam::{Adam, AdamConfig};
pub use groups::ParamGroups;
pub use lazy_adam::{LazyAdam, LazyAdamConfig};
pub use sgd::{Sgd, SgdConfig};

use grads::{
    check_grad, check_sparse_rows, dense_by_blocks, dense_by_rows, flat_mut, rows_width,
    sparse_by_rows,
};

use ndarray::ArrayD;

use crate::error::{Error, Result};
use crate::kernels::Real;
use crate::param::{
    BlockGradient, Dtype, GradSource, ParamGrad, Parameter, RowGradient, SparseRowGradient, Stored,
    StoredView,
};
use crate::state::{StateDict, TensorData};

/// An optimiser: updates parameters from their gradients and keeps its
/// per-parameter state by parameter name.
///
/// ```
/// use ndarray::array;
/// use splitgrad::optim::{Optimizer, Sgd, SgdConfig};
/// use splitgrad::{ParamGrad, Parameter};
/// # fn main() -> splitgrad::Result<()> {
/// // Any optimiser behind a trait object.
/// let mut opt: Box<dyn Optimizer<f64>> = Box::new(Sgd::new(SgdConfig { lr: 0.5, ..SgdConfig::default() })?);
/// let mut p = Parameter::new("p", array![1.0, 2.0].into_dyn());
/// opt.update(&mut p, &ParamGrad::Dense(array![1.0, -1.0].into_dyn()))?;
/// assert_eq!(p.value(), &array![0.5, 2.5].into_dyn());
/// opt.set_learning_rate(0.25)?;
/// assert_eq!(opt.learning_rate(), 0.25);
/// # Ok(()) }
/// ```
pub trait Optimizer<T: Real> {
    /// Applies one update to `param` from its gradient. Frozen parameters
    /// (`!is_trainable()`) are never moved and get no state.
    ///
    /// A gradient of another shape than the parameter's (a row-sparse one
    /// must be `(n_rows, width)` = the parameter's shape, its rows in
    /// range), or kept state of another shape, is an
    /// [`ErrorKind::Shape`](crate::ErrorKind::Shape) /
    /// [`ErrorKind::OutOfRange`](crate::ErrorKind::OutOfRange) error naming
    /// the parameter (or the state entry); nothing is changed then.
    ///
    /// **Panics** if a row-sparse gradient's rows are not sorted and unique
    /// (the [`RowSparse`](crate::RowSparse) invariant).
    fn update(&mut self, param: &mut Parameter<T>, grad: &ParamGrad<T>) -> Result<()>;

    /// [`Self::update`] with a dense gradient of a 2-D parameter given row
    /// by row ([`RowGradient`]: each row written from row r of the
    /// parameter before the update, or named by its form). The gradient
    /// need never be stored whole: an optimiser can compute each row as it
    /// updates it ([`LazyAdam`] does, and computes the rows of a form in
    /// registers when the parameter or its moments are kept in half
    /// precision). This default builds the dense gradient and calls
    /// `update`; an override must give the same result bit for bit. `grad`
    /// is asked for each row once, from any thread, in any order.
    ///
    /// Errors as `update`, and if the parameter is not 2-D.
    fn update_by_rows(
        &mut self,
        param: &mut Parameter<T>,
        grad: &dyn RowGradient<T>,
    ) -> Result<()> {
        if !param.is_trainable() {
            return Ok(());
        }
        let g = dense_by_rows(param, grad)?;
        self.update(param, &ParamGrad::Dense(g))
    }

    /// [`Self::update`] with a dense gradient of a 2-D parameter formed a
    /// block of rows at a time ([`BlockGradient`]: each block's gradient
    /// from the block's rows before the update). [`LazyAdam`] forms each
    /// block just before it updates the block's rows, in parallel over
    /// blocks, so a gradient that needs several rows at once (the fusion
    /// penalty's, [`FusionBlocks`](crate::ops::fusion_penalty::FusionBlocks))
    /// reads them from memory once and is never stored whole. This default
    /// builds the dense gradient block by block and calls `update`; an
    /// override must give the same result bit for bit. Each block is
    /// formed once, from any thread, in any order.
    ///
    /// Errors as `update`, and if the parameter is not 2-D; **panics** if
    /// the blocks are not a partition of the rows.
    fn update_by_blocks(
        &mut self,
        param: &mut Parameter<T>,
        grad: &dyn BlockGradient<T>,
    ) -> Result<()> {
        if !param.is_trainable() {
            return Ok(());
        }
        let g = dense_by_blocks(param, grad)?;
        self.update(param, &ParamGrad::Dense(g))
    }

    /// [`update`](Self::update) with a row-sparse gradient given row by
    /// row ([`SparseRowGradient`]): the rows of a coalesced scatter-add,
    /// each summed from its contributions on demand
    /// ([`Coalescing`](crate::kernels::scatter::Coalescing)), need never be
    /// stored together. [`LazyAdam`] forms each row in a buffer of its task
    /// just before it updates the row. This default builds the row-sparse
    /// gradient and calls `update`; an override must give the same result
    /// bit for bit. `grad` is asked for each row once, from any thread, in
    /// any order.
    ///
    /// Errors as `update`, and if the parameter is not 2-D or `grad` is of
    /// another number of rows; **panics** if its rows are not sorted and
    /// unique.
    fn update_sparse_by_rows(
        &mut self,
        param: &mut Parameter<T>,
        grad: &dyn SparseRowGradient<T>,
    ) -> Result<()> {
        if !param.is_trainable() {
            return Ok(());
        }
        let g = sparse_by_rows(param, grad)?;
        self.update(param, &ParamGrad::RowSparse(g))
    }

    /// Named state entries for a checkpoint: `("<param name>.exp_avg",
    /// array)`, `("<param name>.step", count)`, … sorted by name.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::optim::{LazyAdam, LazyAdamConfig, Optimizer, StateValue};
    /// use splitgrad::{ParamGrad, Parameter};
    /// # fn main() -> splitgrad::Result<()> {
    /// let mut p = Parameter::new("emb.weight", array![[1.0f32, 2.0]].into_dyn());
    /// let mut opt = LazyAdam::new(LazyAdamConfig::default())?;
    /// opt.update(&mut p, &ParamGrad::Dense(array![[0.5f32, 0.5]].into_dyn()))?;
    /// let saved = opt.state();
    /// let names: Vec<&str> = saved.iter().map(|(n, _)| n.as_str()).collect();
    /// assert_eq!(names, ["emb.weight.exp_avg", "emb.weight.exp_avg_sq", "emb.weight.step"]);
    /// assert_eq!(saved[2].1, StateValue::Step(1));
    /// // A new optimiser resumes from it.
    /// let mut resumed = LazyAdam::new(LazyAdamConfig::default())?;
    /// resumed.load_state(saved)?;
    /// resumed.check_state(&[&p])?;
    /// assert_eq!(resumed.state(), opt.state());
    /// # Ok(()) }
    /// ```
    fn state(&self) -> Vec<(String, StateValue<T>)>;

    /// The entries of [`Optimizer::state`], borrowed, where the optimiser
    /// can lend them (every optimiser of this crate does: its moments and
    /// momentum buffers are arrays it holds); `None` where it cannot. A checkpoint
    /// ([`save_state`](crate::checkpoint::save_state)) writes lent arrays
    /// without a copy.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::optim::{LazyAdam, LazyAdamConfig, Optimizer, StateRef};
    /// use splitgrad::param::{ParamGrad, Parameter};
    /// # fn main() -> splitgrad::Result<()> {
    /// let mut p = Parameter::new("w", array![[1.0f32, 2.0]].into_dyn());
    /// let mut opt = LazyAdam::new(LazyAdamConfig::default())?;
    /// opt.update(&mut p, &ParamGrad::Dense(array![[0.5f32, 0.5]].into_dyn()))?;
    /// let lent = opt.state_refs().expect("lazy Adam lends its moments");
    /// let names: Vec<&str> = lent.iter().map(|(n, _)| n.as_str()).collect();
    /// assert_eq!(names, ["w.exp_avg", "w.exp_avg_sq", "w.step"]);
    /// assert!(matches!(lent[2].1, StateRef::Step(1)));
    /// # Ok(()) }
    /// ```
    fn state_refs(&self) -> Option<Vec<(String, StateRef<'_, T>)>> {
        None
    }

    /// How the optimiser narrows the values it stores in half precision
    /// (parameters kept in bf16 or f16, and its own state when kept so):
    /// stochastically (the default, seed 0) or to nearest.
    /// [`Rounding::Stochastic`](crate::param::Rounding::Stochastic)'s bits
    /// depend on the seed, the parameter's step count, the array's name
    /// and the element's index only, so a run gives the same bits on any
    /// number of threads and after a resume. An optimiser that stores no
    /// half-precision value ignores it.
    fn set_rounding(&mut self, rounding: crate::param::Rounding) {
        let _ = rounding;
    }

    /// The rounding of [`Optimizer::set_rounding`].
    fn rounding(&self) -> crate::param::Rounding {
        crate::param::Rounding::default()
    }

    /// Keeps the optimiser's state in `dtype` (default: `T`'s own). An
    /// optimiser that cannot refuses with an
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) error.
    ///
    /// ```
    /// use splitgrad::optim::{LazyAdam, LazyAdamConfig, Optimizer};
    /// use splitgrad::param::Dtype;
    /// let mut opt = LazyAdam::<f32>::new(LazyAdamConfig::default())?;
    /// opt.set_state_dtype(Dtype::BF16)?;
    /// assert_eq!(opt.state_dtype(), Dtype::BF16);
    /// assert!(opt.set_state_dtype(Dtype::F16).is_err());
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    fn set_state_dtype(&mut self, dtype: crate::param::Dtype) -> Result<()> {
        if dtype == crate::param::Dtype::of::<T>() {
            return Ok(());
        }
        Err(Error::config(format!(
            "this optimiser keeps its state as {}, not {dtype}",
            T::NAME
        )))
    }

    /// The dtype of [`Optimizer::set_state_dtype`].
    fn state_dtype(&self) -> crate::param::Dtype {
        crate::param::Dtype::of::<T>()
    }

    /// Replaces the state with entries saved by [`Optimizer::state`].
    ///
    /// Errors (each naming the entry): a name that is not
    /// `<param name>.<field>` with a field this optimiser keeps, an entry
    /// given twice, an array where a step count belongs or the reverse, a
    /// parameter with some of its fields missing, arrays of one parameter
    /// with different shapes. On an error the state is left as it was.
    fn load_state(&mut self, entries: Vec<(String, StateValue<T>)>) -> Result<()>;

    /// Checks the state against the parameters it will update: every
    /// parameter with state is among `params` and its state has the
    /// parameter's shape. Call it after [`Optimizer::load_state`] to catch
    /// a checkpoint of another model before the first step.
    fn check_state(&self, params: &[&Parameter<T>]) -> Result<()>;

    /// The learning rate.
    fn learning_rate(&self) -> f64;

    /// Changes the learning rate (a schedule); the same validation as at
    /// construction.
    fn set_learning_rate(&mut self, lr: f64) -> Result<()>;

    /// One update of every parameter of `params` that has a gradient in
    /// `grads` ([`Gradients`](crate::Gradients) or any [`GradSource`]);
    /// the others (frozen, or unused by the loss) are left alone. On an
    /// error the parameters before the failing one are already updated.
    fn step(&mut self, params: Vec<&mut Parameter<T>>, grads: &dyn GradSource<T>) -> Result<()> {
        for p in params {
            if let Some(g) = grads.grad_of(p) {
                self.update(p, g)?;
            }
        }
        Ok(())
    }

    /// The state as named tensors: arrays as the real type, step counts as
    /// `U64` 0-d tensors (the form a checkpoint stores).
    fn state_dict(&self) -> StateDict {
        let mut sd = StateDict::new();
        for (name, v) in self.state() {
            sd.insert(
                name,
                match v {
                    StateValue::Array(a) => TensorData::from_real(a),
                    StateValue::Half(Stored::BF16(a)) => TensorData::BF16(a),
                    StateValue::Half(Stored::F16(a)) => TensorData::F16(a),
                    StateValue::Half(Stored::Full(a)) => TensorData::from_real(a),
                    StateValue::Step(s) => TensorData::U64(ndarray::arr0(s).into_dyn()),
                },
            );
        }
        sd
    }

    /// Replaces the state with the one of `state` (as written by
    /// [`Optimizer::state_dict`]), every array checked for its dtype and
    /// finiteness (a second moment also for its sign), then checks it
    /// against `params` ([`Optimizer::check_state`]). On an error the state
    /// is left as it was.
    fn load_state_dict(&mut self, state: &StateDict, params: &[&Parameter<T>]) -> Result<()> {
        let mut entries = Vec::with_capacity(state.len());
        for (name, t) in state.iter() {
            let value = match t {
                // A step count is U64 whatever dtype a file gave it.
                TensorData::U64(_) => StateValue::Step(state.step(name)?),
                _ if name.ends_with(".step") => StateValue::Step(state.step(name)?),
                TensorData::BF16(_) | TensorData::F16(_) => {
                    let dtype = if matches!(t, TensorData::BF16(_)) {
                        Dtype::BF16
                    } else {
                        Dtype::F16
                    };
                    let a = match state.stored::<T>(name, t.shape(), dtype)? {
                        StoredView::BF16(a) => Stored::BF16(a.to_owned()),
                        StoredView::F16(a) => Stored::F16(a.to_owned()),
                        StoredView::Full(a) => Stored::Full(a.to_owned()),
                    };
                    if name.ends_with(".exp_avg_sq")
                        && let Some((i, v)) = a
                            .widened()
                            .iter()
                            .enumerate()
                            .find(|(_, v)| **v < T::zero())
                    {
                        return Err(state.error(
                            name,
                            crate::ErrorKind::Format {
                                message: format!(
                                    "a second moment must be ≥ 0, found {} at flat position {i}",
                                    Real::to_f64(*v)
                                ),
                            },
                        ));
                    }
                    StateValue::Half(a)
                }
                _ => {
                    let a = state.real::<T>(name, t.shape())?;
                    if name.ends_with(".exp_avg_sq")
                        && let Some((i, v)) = a.iter().enumerate().find(|(_, v)| **v < T::zero())
                    {
                        return Err(state.error(
                            name,
                            crate::ErrorKind::Format {
                                message: format!(
                                    "a second moment must be ≥ 0, found {} at flat position {i}",
                                    Real::to_f64(*v)
                                ),
                            },
                        ));
                    }
                    StateValue::Array(a.to_owned())
                }
            };
            entries.push((name.to_string(), value));
        }
        let before = self.state();
        let err_in_file = |e: Error| match state.source() {
            Some(p) => e.in_file(p),
            None => e,
        };
        self.load_state(entries).map_err(err_in_file)?;
        if let Err(e) = self.check_state(params) {
            self.load_state(before)
                .expect("the state it had loads back");
            return Err(err_in_file(e));
        }
        Ok(())
    }
}

/// One entry of an optimiser's state, borrowed ([`Optimizer::state_refs`]).
#[derive(Debug)]
pub enum StateRef<'a, T> {
    /// An array as the optimiser keeps it (a moment in `T` or in half
    /// precision).
    Array(StoredView<'a, T>),
    /// A step count.
    Step(u64),
}

/// One entry of an optimiser's state.
///
/// ```
/// use ndarray::ArrayD;
/// use splitgrad::optim::StateValue;
/// let s: StateValue<f32> = StateValue::Step(1 << 30);
/// assert_eq!(s.as_step(), Some(1 << 30));
/// assert!(StateValue::Array(ArrayD::<f32>::zeros(vec![2])).as_array().is_some());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum StateValue<T> {
    /// A real array of the parameter's shape (a moment, a momentum buffer).
    Array(ArrayD<T>),
    /// A moment kept in half precision (an optimiser whose state dtype is
    /// bf16).
    Half(Stored<T>),
    /// A step count, exact.
    Step(u64),
}

impl<T> StateValue<T> {
    /// The array, if this is one.
    pub fn as_array(&self) -> Option<&ArrayD<T>> {
        match self {
            StateValue::Array(a) => Some(a),
            StateValue::Half(_) | StateValue::Step(_) => None,
        }
    }

    /// The step count, if this is one.
    pub fn as_step(&self) -> Option<u64> {
        match self {
            StateValue::Array(_) | StateValue::Half(_) => None,
            StateValue::Step(s) => Some(*s),
        }
    }

    fn kind_name(&self) -> &'static str {
        match self {
            StateValue::Array(_) => "real array",
            StateValue::Half(_) => "half-precision array",
            StateValue::Step(_) => "u64 step count",
        }
    }
}

/// Splits `"<param name>.<field>"` at its last dot (parameter names contain
/// dots themselves).
fn split_entry(name: &str) -> Result<(&str, &str)> {
    name.rsplit_once('.')
        .filter(|(p, f)| !p.is_empty() && !f.is_empty())
        .ok_or_else(|| {
            Error::format("optimiser state entry name is not `<parameter name>.<field>`")
                .in_array(name)
        })
}

/// The error for a state entry that names a field the optimiser does not keep.
fn unknown_field(entry: &str, known: &[&str]) -> Error {
    Error::format(format!(
        "unknown optimiser state field (this optimiser keeps {})",
        known.join(", ")
    ))
    .in_array(entry)
}

/// The error for a state entry of the wrong kind.
fn wrong_kind<T>(entry: &str, expected: &str, found: &StateValue<T>) -> Error {
    Error::new(crate::ErrorKind::Dtype {
        expected: expected.to_string(),
        found: found.kind_name().to_string(),
    })
    .in_array(entry)
}

/// Checks that a learning rate is finite and at least `low` (exclusive
/// when `strict`).
fn check_lr(lr: f64, strict: bool) -> Result<()> {
    if !lr.is_finite() || lr < 0.0 || (strict && lr == 0.0) {
        let bound = if strict { "> 0" } else { ">= 0" };
        return Err(Error::config(format!(
            "invalid learning rate {lr}: expected a finite value {bound}"
        )));
    }
    Ok(())
}

/// Checks a β of Adam: `0 ≤ β < 1`.
fn check_beta(which: &str, beta: f64) -> Result<()> {
    if !(0.0..1.0).contains(&beta) {
        return Err(Error::config(format!(
            "invalid {which} {beta}: expected 0 <= {which} < 1"
        )));
    }
    Ok(())
}

/// Checks a non-negative finite hyper-parameter (ε, weight decay,
/// momentum, dampening).
fn check_non_negative(which: &str, x: f64) -> Result<()> {
    if !x.is_finite() || x < 0.0 {
        return Err(Error::config(format!(
            "invalid {which} {x}: expected a finite value >= 0"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_split_at_the_last_dot() {
        assert_eq!(
            split_entry("token_embedding.prompt.weight.exp_avg").unwrap(),
            ("token_embedding.prompt.weight", "exp_avg")
        );
        for bad in ["step", ".step", "w."] {
            let e = split_entry(bad).unwrap_err();
            assert_eq!(e.array(), Some(bad));
        }
    }
}
