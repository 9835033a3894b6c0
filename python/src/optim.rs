//! `Optimizer`: the crate's optimisers (Adam, LazyAdam, SGD) over the
//! layers' parameters and gradients.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyAny, PyDict};
use splitgrad::optim::{Adam, AdamConfig, LazyAdam, LazyAdamConfig, Optimizer, Sgd, SgdConfig};
use splitgrad::param::Rounding;

use crate::convert::{Dtype, OrRaise, PyReal, state_from_py, state_to_py};
use crate::gradients::{PyGradients, Source};
use crate::layer::{ByDtype, LayerRef, dtype_arg, layers_of, lock_layers, typed};

/// An optimiser of either real type, boxed.
pub type Boxed<T> = Box<dyn Optimizer<T> + Send + Sync>;

/// An optimiser of the crate: `Optimizer.adam(...)`, `.lazy_adam(...)`,
/// `.sgd(...)` (the package's `Adam`, `LazyAdam`, `SGD`).
///
/// Its state is behind a lock (`crate::sync`): steps and loads take it
/// alone, reads of the state share it.
#[pyclass(module = "splitgrad._splitgrad", name = "Optimizer", frozen)]
pub struct PyOptimizer {
    pub(crate) inner: RwLock<ByDtype<Boxed<f32>, Boxed<f64>>>,
    kind: &'static str,
    dt: Dtype,
}

/// An optimiser of either real type, locked for writing.
pub type Locked<'a> = RwLockWriteGuard<'a, ByDtype<Boxed<f32>, Boxed<f64>>>;

impl PyOptimizer {
    /// The optimiser's real type.
    pub(crate) fn dtype(&self) -> Dtype {
        self.dt
    }

    /// The optimiser, shared with other readers.
    pub(crate) fn read(
        &self,
        py: Python<'_>,
    ) -> PyResult<RwLockReadGuard<'_, ByDtype<Boxed<f32>, Boxed<f64>>>> {
        crate::sync::read(py, &self.inner, self.kind)
    }

    /// The optimiser, alone.
    pub(crate) fn write(&self, py: Python<'_>) -> PyResult<Locked<'_>> {
        crate::sync::write(py, &self.inner, self.kind)
    }

    fn make<
        F32: Optimizer<f32> + Send + Sync + 'static,
        F64: Optimizer<f64> + Send + Sync + 'static,
    >(
        dtype: Option<&Bound<'_, PyAny>>,
        kind: &'static str,
        f32: impl FnOnce() -> splitgrad::Result<F32>,
        f64: impl FnOnce() -> splitgrad::Result<F64>,
    ) -> PyResult<Self> {
        let inner = match dtype_arg(dtype, Dtype::F32)? {
            Dtype::F32 => ByDtype::F32(Box::new(f32().or_raise()?) as Boxed<f32>),
            Dtype::F64 => ByDtype::F64(Box::new(f64().or_raise()?) as Boxed<f64>),
        };
        Ok(PyOptimizer {
            dt: inner.dtype(),
            inner: RwLock::new(inner),
            kind,
        })
    }
}

/// `Optimizer.step` for the optimiser's real type `dt`: the gradients and
/// the layers checked to be of it.
fn step_typed<T: PyReal>(
    py: Python<'_>,
    opt: &mut (dyn Optimizer<T> + Send + Sync),
    layers: &mut [LayerRef<'_>],
    grads: &[PyRef<'_, PyGradients>],
    dt: Dtype,
) -> PyResult<()> {
    let mut entries = Vec::new();
    for g in grads {
        match T::grads(&g.inner) {
            Some(v) => entries.extend(v.iter()),
            None => {
                return Err(PyValueError::new_err(format!(
                    "{} gradients for a {} optimiser",
                    g.inner.dtype().name(),
                    dt.name()
                )));
            }
        }
    }
    let mods = typed::<T>(layers, dt)?;
    // A gradient no given module holds would otherwise be skipped without a
    // word, and its layer would silently not train.
    for e in &entries {
        if !mods
            .iter()
            .any(|m| m.parameters().iter().any(|p| p.id() == e.id))
        {
            return Err(PyValueError::new_err(format!(
                "Optimizer.step: the gradients hold `{}`, a parameter of none of the layers \
                 given to step; pass that layer too (a list of layers is accepted)",
                e.name
            )));
        }
    }
    let src = Source(entries);
    for m in mods {
        let params = m.parameters_mut();
        py.detach(|| opt.step(params, &src)).or_raise()?;
    }
    Ok(())
}

fn grads_of<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Vec<PyRef<'py, PyGradients>>> {
    if let Ok(g) = obj.extract::<PyRef<'py, PyGradients>>() {
        return Ok(vec![g]);
    }
    let mut out = Vec::new();
    for item in obj.try_iter()? {
        out.push(item?.extract::<PyRef<'py, PyGradients>>()?);
    }
    Ok(out)
}

#[pymethods]
impl PyOptimizer {
    /// `torch.optim.Adam` (AdamW with `decoupled_weight_decay=True`).
    #[staticmethod]
    #[pyo3(signature = (lr = 1e-3, betas = (0.9, 0.999), eps = 1e-8, weight_decay = 0.0, decoupled_weight_decay = false, dtype = None))]
    fn adam(
        lr: f64,
        betas: (f64, f64),
        eps: f64,
        weight_decay: f64,
        decoupled_weight_decay: bool,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let cfg = AdamConfig {
            lr,
            beta1: betas.0,
            beta2: betas.1,
            eps,
            weight_decay,
            decoupled_weight_decay,
        };
        Self::make(
            dtype,
            "Adam",
            || Adam::<f32>::new(cfg),
            || Adam::<f64>::new(cfg),
        )
    }

    /// `torch.optim.SparseAdam`: only the rows present in a gradient move.
    #[staticmethod]
    #[pyo3(signature = (lr = 1e-3, betas = (0.9, 0.999), eps = 1e-8, dtype = None))]
    fn lazy_adam(
        lr: f64,
        betas: (f64, f64),
        eps: f64,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let cfg = LazyAdamConfig {
            lr,
            beta1: betas.0,
            beta2: betas.1,
            eps,
        };
        Self::make(
            dtype,
            "LazyAdam",
            || LazyAdam::<f32>::new(cfg),
            || LazyAdam::<f64>::new(cfg),
        )
    }

    /// `torch.optim.SGD`.
    #[staticmethod]
    #[pyo3(signature = (lr = 1e-3, momentum = 0.0, dampening = 0.0, nesterov = false, weight_decay = 0.0, dtype = None))]
    fn sgd(
        lr: f64,
        momentum: f64,
        dampening: f64,
        nesterov: bool,
        weight_decay: f64,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let cfg = SgdConfig {
            lr,
            momentum,
            dampening,
            nesterov,
            weight_decay,
        };
        Self::make(
            dtype,
            "SGD",
            || Sgd::<f32>::new(cfg),
            || Sgd::<f64>::new(cfg),
        )
    }

    #[getter]
    fn kind(&self) -> &'static str {
        self.kind
    }

    #[getter]
    fn dtype_name(&self) -> &'static str {
        self.dtype().name()
    }

    #[getter]
    fn get_lr(&self, py: Python<'_>) -> PyResult<f64> {
        Ok(crate::each!(&*self.read(py)?, o => o.learning_rate()))
    }

    #[setter]
    fn set_lr(&self, py: Python<'_>, lr: f64) -> PyResult<()> {
        crate::each!(&mut *self.write(py)?, o => o.set_learning_rate(lr).or_raise())
    }

    /// How the optimiser narrows what it stores in half precision (the
    /// parameters kept in bf16 or f16, its state when kept in bf16):
    /// `"stochastic"` (the default, unbiased; its random bits a pure
    /// function of (seed, step, parameter, element)) or `"nearest"`.
    /// `seed` (0 when not given) is stochastic rounding's; `"nearest"`
    /// draws no random bits and refuses one.
    #[pyo3(signature = (rounding, seed = None))]
    fn set_rounding(&self, py: Python<'_>, rounding: &str, seed: Option<u64>) -> PyResult<()> {
        let r = match (rounding, seed) {
            ("stochastic", seed) => Rounding::Stochastic {
                seed: seed.unwrap_or(0),
            },
            ("nearest", None) => Rounding::Nearest,
            ("nearest", Some(seed)) => {
                return Err(PyValueError::new_err(format!(
                    "set_rounding: seed {seed} draws the random bits of stochastic rounding, and \
                     \"nearest\" draws none: leave the seed out"
                )));
            }
            (other, _) => {
                return Err(PyValueError::new_err(format!(
                    "rounding must be \"stochastic\" or \"nearest\", got {other:?}"
                )));
            }
        };
        let kept = crate::each!(&mut *self.write(py)?, o => { o.set_rounding(r); o.rounding() });
        if kept != r {
            // An optimiser that stores nothing in half precision keeps none.
            return Err(PyValueError::new_err(format!(
                "set_rounding: {} stores no value in half precision (it refuses bf16/f16 \
                 parameters), so it has no rounding to set",
                self.kind
            )));
        }
        Ok(())
    }

    /// `("stochastic", seed)` or `("nearest", None)`.
    #[getter]
    fn rounding(&self, py: Python<'_>) -> PyResult<(&'static str, Option<u64>)> {
        Ok(match crate::each!(&*self.read(py)?, o => o.rounding()) {
            Rounding::Stochastic { seed } => ("stochastic", Some(seed)),
            Rounding::Nearest => ("nearest", None),
        })
    }

    /// Keeps the optimiser's state (Adam's moments) in `dtype`: the
    /// optimiser's own `dtype_name` (the default) or bfloat16 (Adam and
    /// LazyAdam; f16 is refused). Moments kept already are converted.
    fn set_state_dtype(&self, py: Python<'_>, dtype: &Bound<'_, PyAny>) -> PyResult<()> {
        let d = crate::params::storage_dtype(dtype)?;
        crate::each!(&mut *self.write(py)?, o => o.set_state_dtype(d).or_raise())
    }

    /// numpy's name of the state's dtype (`"bfloat16"` for bf16).
    #[getter]
    fn state_dtype(&self, py: Python<'_>) -> PyResult<&'static str> {
        let d = crate::each!(&*self.read(py)?, o => o.state_dtype());
        Ok(crate::params::numpy_name(d))
    }

    /// One update of every parameter of `modules` (a layer or a list) that
    /// has a gradient in `grads` (a Gradients or a list of them). The
    /// optimiser and every layer are locked for the step (the optimiser
    /// first): steps of one optimiser, or on one layer, run one at a time.
    fn step(
        &self,
        py: Python<'_>,
        modules: &Bound<'_, PyAny>,
        grads: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let objs = layers_of(modules)?;
        let grads = grads_of(grads)?;
        let dt = self.dtype();
        let mut opt = self.write(py)?;
        let mut layers = lock_layers(py, &objs)?;
        crate::each!(&mut *opt, o => step_typed(py, o.as_mut(), &mut layers, &grads, dt))
    }

    /// The state by name (`<param>.exp_avg`, `.exp_avg_sq`, `.step`, …), copied.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let opt = self.read(py)?;
        crate::each!(&*opt, o => check_optimizer_copy(o.as_ref()))?;
        let sd = crate::each!(&*opt, o => o.state_dict());
        drop(opt);
        state_to_py(py, sd)
    }

    /// Replaces the state with one from `state_dict`, checked against the
    /// parameters of `modules`; on an error the state is left as it was.
    fn load_state_dict(
        &self,
        py: Python<'_>,
        state: &Bound<'_, PyAny>,
        modules: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let sd = state_from_py(state)?;
        let objs = layers_of(modules)?;
        let dt = self.dtype();
        let mut opt = self.write(py)?;
        let mut layers = lock_layers(py, &objs)?;
        crate::each!(&mut *opt, o => load_typed(o.as_mut(), &sd, &mut layers, dt))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "{}(lr={}, dtype={})",
            self.kind,
            self.get_lr(py)?,
            self.dtype().name()
        ))
    }
}

/// Refuses, before it is made, the copy of an optimiser's state that its
/// state dict is (made twice where it lends none: its state, then the
/// tensors).
fn check_optimizer_copy<T: PyReal>(opt: &dyn Optimizer<T>) -> PyResult<()> {
    use splitgrad::optim::StateRef;
    let Some(refs) = opt.state_refs() else {
        return Ok(());
    };
    let sizes = refs.iter().map(|(_, r)| match r {
        StateRef::Array(a) => {
            let half = a.dtype().is_half();
            (crate::convert::bytes_for(a.shape(), a.dtype().size()), half)
        }
        StateRef::Step(_) => (8, false),
    });
    crate::convert::check_state_copy(|| "the optimiser's state dict's copy".to_string(), sizes)
}

/// `Optimizer.load_state_dict` for the optimiser's real type `dt`.
fn load_typed<T: PyReal>(
    opt: &mut dyn Optimizer<T>,
    sd: &splitgrad::state::StateDict,
    layers: &mut [LayerRef<'_>],
    dt: Dtype,
) -> PyResult<()> {
    let ms = typed::<T>(layers, dt)?;
    let ps: Vec<_> = ms.iter().flat_map(|m| m.parameters()).collect();
    opt.load_state_dict(sd, &ps).or_raise()
}
