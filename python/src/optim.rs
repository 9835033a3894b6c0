//! Optimisers, checkpoints and golden vectors.

use std::collections::BTreeMap;
use std::path::PathBuf;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyAny, PyBytes, PyDict};
use splitgrad::Rng;
use splitgrad::app::golden::{self, Layer};
use splitgrad::checkpoint::{load_state, save_state};
use splitgrad::io::RealDtype;
use splitgrad::optim::{Adam, AdamConfig, LazyAdam, LazyAdamConfig, Optimizer, Sgd, SgdConfig};
use splitgrad::state::{Module, StateDict, TensorRef};

use crate::convert::{Dtype, OrRaise};
use crate::layers::{
    Dt, Entry, PoolOf, PyEmbeddings, PyGradients, PyHead, PyVocabulary, Source, state_from_py,
    vocab_penalty_backward,
};
use splitgrad::layers::SplitVocabulary;
use splitgrad::param::ParamGrad;

/// A layer borrowed mutably from Python (a numpy-level layer, or a
/// `splitgrad.torch` module through its `_core`).
pub enum ModRef<'py> {
    E(PyRefMut<'py, PyEmbeddings>),
    H(PyRefMut<'py, PyHead>),
    V(PyRefMut<'py, PyVocabulary>),
}

impl ModRef<'_> {
    fn dtype(&self) -> Dtype {
        let f32 = match self {
            ModRef::E(r) => matches!(r.inner, Dt::F32(_)),
            ModRef::H(r) => matches!(r.inner, Dt::F32(_)),
            ModRef::V(r) => matches!(r.inner, Dt::F32(_)),
        };
        if f32 { Dtype::F32 } else { Dtype::F64 }
    }
}

/// The f32 or f64 module of a [`ModRef`].
pub trait ModuleOf<T: splitgrad::Real> {
    fn module(&mut self) -> Option<&mut dyn Module<T>>;
}

macro_rules! module_of {
    ($t:ty, $v:ident) => {
        impl ModuleOf<$t> for ModRef<'_> {
            fn module(&mut self) -> Option<&mut dyn Module<$t>> {
                match self {
                    ModRef::E(r) => match &mut r.inner {
                        Dt::$v(l) => Some(l),
                        _ => None,
                    },
                    ModRef::H(r) => match &mut r.inner {
                        Dt::$v(l) => Some(l),
                        _ => None,
                    },
                    ModRef::V(r) => match &mut r.inner {
                        Dt::$v(l) => Some(l),
                        _ => None,
                    },
                }
            }
        }
    };
}
module_of!(f32, F32);
module_of!(f64, F64);

fn one_module<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Option<ModRef<'py>>> {
    let obj = if obj.hasattr("_core")? {
        obj.getattr("_core")?
    } else {
        obj.clone()
    };
    if let Ok(r) = obj.extract::<PyRefMut<'py, PyEmbeddings>>() {
        return Ok(Some(ModRef::E(r)));
    }
    if let Ok(r) = obj.extract::<PyRefMut<'py, PyHead>>() {
        return Ok(Some(ModRef::H(r)));
    }
    if let Ok(r) = obj.extract::<PyRefMut<'py, PyVocabulary>>() {
        return Ok(Some(ModRef::V(r)));
    }
    Ok(None)
}

/// One layer, or a list or tuple of layers.
pub fn modules_of<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Vec<ModRef<'py>>> {
    if let Some(m) = one_module(obj)? {
        return Ok(vec![m]);
    }
    let mut out = Vec::new();
    for item in obj.try_iter().map_err(|_| not_a_layer(obj))? {
        let item = item?;
        match one_module(&item)? {
            Some(m) => out.push(m),
            None => return Err(not_a_layer(&item)),
        }
    }
    Ok(out)
}

fn not_a_layer(obj: &Bound<'_, PyAny>) -> PyErr {
    let ty = obj
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    PyTypeError::new_err(format!(
        "expected a splitgrad layer (SplitTokenEmbeddings, SplitLanguageModellingHead, SplitVocabulary) or a list of them, got {ty}"
    ))
}

fn typed<'a, T: splitgrad::Real>(
    mods: &'a mut [ModRef<'_>],
    dt: Dtype,
) -> PyResult<Vec<&'a mut dyn Module<T>>>
where
    for<'x> ModRef<'x>: ModuleOf<T>,
{
    let mut out = Vec::new();
    for m in mods.iter_mut() {
        let mdt = m.dtype();
        match m.module() {
            Some(x) => out.push(x),
            None => {
                return Err(PyValueError::new_err(format!(
                    "a {} layer cannot be used with {} ones or a {} optimiser",
                    mdt.name(),
                    dt.name(),
                    dt.name()
                )));
            }
        }
    }
    Ok(out)
}

type Boxed<T> = Box<dyn Optimizer<T> + Send + Sync>;

/// An optimiser of the crate: `Optimizer.adam(...)`, `.lazy_adam(...)`,
/// `.sgd(...)` (the package's `Adam`, `LazyAdam`, `SGD`).
#[pyclass(module = "splitgrad._splitgrad", name = "Optimizer")]
pub struct PyOptimizer {
    inner: Dt<Boxed<f32>, Boxed<f64>>,
    kind: &'static str,
}

impl PyOptimizer {
    fn dtype(&self) -> Dtype {
        match self.inner {
            Dt::F32(_) => Dtype::F32,
            Dt::F64(_) => Dtype::F64,
        }
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
        let dt = match dtype {
            Some(d) => Dtype::parse(d)?,
            None => Dtype::F32,
        };
        let inner = match dt {
            Dtype::F32 => Dt::F32(Box::new(f32().or_raise()?) as Boxed<f32>),
            Dtype::F64 => Dt::F64(Box::new(f64().or_raise()?) as Boxed<f64>),
        };
        Ok(PyOptimizer { inner, kind })
    }
}

fn step_typed<T: splitgrad::Real>(
    opt: &mut dyn Optimizer<T>,
    mods: Vec<&mut dyn Module<T>>,
    entries: Vec<&Entry<T>>,
) -> PyResult<()> {
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
        opt.step(m.parameters_mut(), &src).or_raise()?;
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
    fn get_lr(&self) -> f64 {
        crate::each!(&self.inner, o => o.learning_rate())
    }

    #[setter]
    fn set_lr(&mut self, lr: f64) -> PyResult<()> {
        crate::each!(&mut self.inner, o => o.set_learning_rate(lr).or_raise())
    }

    /// One update of every parameter of `modules` (a layer or a list) that
    /// has a gradient in `grads` (a Gradients or a list of them).
    fn step(&mut self, modules: &Bound<'_, PyAny>, grads: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut mods = modules_of(modules)?;
        let grads = grads_of(grads)?;
        let dt = self.dtype();
        match &mut self.inner {
            Dt::F32(o) => {
                let mut entries = Vec::new();
                for g in &grads {
                    match &g.inner {
                        Dt::F32(v) => entries.extend(v.iter()),
                        Dt::F64(_) => {
                            return Err(PyValueError::new_err(
                                "float64 gradients for a float32 optimiser",
                            ));
                        }
                    }
                }
                let ms = typed::<f32>(&mut mods, dt)?;
                step_typed(o.as_mut(), ms, entries)
            }
            Dt::F64(o) => {
                let mut entries = Vec::new();
                for g in &grads {
                    match &g.inner {
                        Dt::F64(v) => entries.extend(v.iter()),
                        Dt::F32(_) => {
                            return Err(PyValueError::new_err(
                                "float32 gradients for a float64 optimiser",
                            ));
                        }
                    }
                }
                let ms = typed::<f64>(&mut mods, dt)?;
                step_typed(o.as_mut(), ms, entries)
            }
        }
    }

    /// The state by name (`<param>.exp_avg`, `.exp_avg_sq`, `.step`, …), copied.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let sd = crate::each!(&self.inner, o => o.state_dict());
        crate::layers_state_to_py(py, sd)
    }

    /// Replaces the state with one from `state_dict`, checked against the
    /// parameters of `modules`; on an error the state is left as it was.
    fn load_state_dict(
        &mut self,
        state: &Bound<'_, PyAny>,
        modules: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let sd = state_from_py(state)?;
        let mut mods = modules_of(modules)?;
        let dt = self.dtype();
        match &mut self.inner {
            Dt::F32(o) => {
                let ms = typed::<f32>(&mut mods, dt)?;
                let ps: Vec<_> = ms.iter().flat_map(|m| m.parameters()).collect();
                o.load_state_dict(&sd, &ps).or_raise()
            }
            Dt::F64(o) => {
                let ms = typed::<f64>(&mut mods, dt)?;
                let ps: Vec<_> = ms.iter().flat_map(|m| m.parameters()).collect();
                o.load_state_dict(&sd, &ps).or_raise()
            }
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "{}(lr={}, dtype={})",
            self.kind,
            self.get_lr(),
            self.dtype().name()
        )
    }
}

fn metadata_of(obj: Option<&Bound<'_, PyAny>>) -> PyResult<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    if let Some(d) = obj {
        for item in d.call_method0("items")?.try_iter()? {
            let (k, v): (String, Bound<'_, PyAny>) = item?.extract()?;
            out.insert(k, v.str()?.to_string());
        }
    }
    Ok(out)
}

/// Writes the state of `modules`, of `optimizer` (under `optimizer.`),
/// the `extra` arrays and string `metadata` to one safetensors file,
/// atomically.
#[pyfunction]
#[pyo3(signature = (path, modules, optimizer = None, metadata = None, extra = None))]
pub fn save_checkpoint(
    path: PathBuf,
    modules: &Bound<'_, PyAny>,
    optimizer: Option<PyRef<'_, PyOptimizer>>,
    metadata: Option<&Bound<'_, PyAny>>,
    extra: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let mut mods = modules_of(modules)?;
    let meta = metadata_of(metadata)?;
    let extra_sd = match extra {
        Some(e) => state_from_py(e)?,
        None => StateDict::new(),
    };
    let extra_refs: Vec<(String, TensorRef<'_>)> = extra_sd
        .iter()
        .map(|(n, t)| (n.to_string(), t.view()))
        .collect();
    let dt = match (&optimizer, mods.first()) {
        (Some(o), _) => o.dtype(),
        (None, Some(m)) => m.dtype(),
        (None, None) => Dtype::F32,
    };
    match dt {
        Dtype::F32 => {
            let ms = typed::<f32>(&mut mods, dt)?;
            let refs: Vec<&dyn Module<f32>> = ms.iter().map(|m| &**m as &dyn Module<f32>).collect();
            let opt = match &optimizer {
                Some(o) => match &o.inner {
                    Dt::F32(b) => Some(b.as_ref() as &dyn Optimizer<f32>),
                    Dt::F64(_) => unreachable!("dtype checked"),
                },
                None => None,
            };
            save_state(&path, &refs, opt, &extra_refs, &meta).or_raise()
        }
        Dtype::F64 => {
            let ms = typed::<f64>(&mut mods, dt)?;
            let refs: Vec<&dyn Module<f64>> = ms.iter().map(|m| &**m as &dyn Module<f64>).collect();
            let opt = match &optimizer {
                Some(o) => match &o.inner {
                    Dt::F64(b) => Some(b.as_ref() as &dyn Optimizer<f64>),
                    Dt::F32(_) => unreachable!("dtype checked"),
                },
                None => None,
            };
            save_state(&path, &refs, opt, &extra_refs, &meta).or_raise()
        }
    }
}

/// Loads `modules` and `optimizer` saved by `save_checkpoint`, checking
/// every tensor before anything changes: `(metadata, other tensors)`.
#[pyfunction]
#[pyo3(signature = (path, modules, optimizer = None))]
pub fn load_checkpoint<'py>(
    py: Python<'py>,
    path: PathBuf,
    modules: &Bound<'py, PyAny>,
    optimizer: Option<PyRefMut<'py, PyOptimizer>>,
) -> PyResult<(Bound<'py, PyDict>, Bound<'py, PyDict>)> {
    let mut mods = modules_of(modules)?;
    let mut optimizer = optimizer;
    let dt = match (&optimizer, mods.first()) {
        (Some(o), _) => o.dtype(),
        (None, Some(m)) => m.dtype(),
        (None, None) => Dtype::F32,
    };
    let (meta, rest) = match dt {
        Dtype::F32 => {
            let mut ms = typed::<f32>(&mut mods, dt)?;
            let opt = match optimizer.as_deref_mut() {
                Some(PyOptimizer {
                    inner: Dt::F32(b), ..
                }) => Some(b.as_mut() as &mut dyn Optimizer<f32>),
                Some(_) => unreachable!("dtype checked"),
                None => None,
            };
            load_state(&path, &mut ms, opt).or_raise()?
        }
        Dtype::F64 => {
            let mut ms = typed::<f64>(&mut mods, dt)?;
            let opt = match optimizer.as_deref_mut() {
                Some(PyOptimizer {
                    inner: Dt::F64(b), ..
                }) => Some(b.as_mut() as &mut dyn Optimizer<f64>),
                Some(_) => unreachable!("dtype checked"),
                None => None,
            };
            load_state(&path, &mut ms, opt).or_raise()?
        }
    };
    let m = PyDict::new(py);
    for (k, v) in meta {
        m.set_item(k, v)?;
    }
    Ok((m, crate::layers_state_to_py(py, rest)?))
}

fn layer_of(name: &str) -> PyResult<Layer> {
    name.parse::<Layer>().or_raise()
}

/// Evaluates one golden case (the bytes of its `.npz`) and returns the
/// results as `.npz` bytes; `label` names the case in errors.
#[pyfunction]
#[pyo3(signature = (layer, case, label = "case.npz"))]
pub fn golden_evaluate<'py>(
    py: Python<'py>,
    layer: &str,
    case: Vec<u8>,
    label: &str,
) -> PyResult<Bound<'py, PyBytes>> {
    let layer = layer_of(layer)?;
    let out = py
        .detach(|| golden::evaluate_bytes(layer, label, case))
        .or_raise()?;
    Ok(PyBytes::new(py, &out))
}

/// A random golden case of `layer` (inputs and results) as `.npz` bytes.
#[pyfunction]
#[pyo3(signature = (layer, seed, dtype = None))]
pub fn golden_generate<'py>(
    py: Python<'py>,
    layer: &str,
    seed: u64,
    dtype: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let layer = layer_of(layer)?;
    let dt = match dtype {
        Some(d) => Dtype::parse(d)?,
        None => Dtype::F64,
    };
    let dt = match dt {
        Dtype::F32 => RealDtype::F32,
        Dtype::F64 => RealDtype::F64,
    };
    let out = golden::generate_case(layer, &mut Rng::new(seed), dt);
    Ok(PyBytes::new(py, &out))
}

/// `splitgrad golden eval`: every case under `inputs` evaluated into
/// `out`; returns `{"ok": [names], "failed": [(name, message)]}`.
#[pyfunction]
pub fn golden_evaluate_dir<'py>(
    py: Python<'py>,
    inputs: PathBuf,
    out: PathBuf,
) -> PyResult<Bound<'py, PyDict>> {
    let summary = py
        .detach(|| golden::evaluate_dir(&inputs, &out))
        .or_raise()?;
    let d = PyDict::new(py);
    let ok: Vec<String> = summary
        .ok
        .iter()
        .map(|c| format!("{}/{}", c.layer.name(), c.name))
        .collect();
    let failed: Vec<(String, String)> = summary
        .failed
        .iter()
        .map(|c| {
            (
                format!("{}/{}", c.layer.name(), c.name),
                c.error.to_string(),
            )
        })
        .collect();
    d.set_item("ok", ok)?;
    d.set_item("failed", failed)?;
    Ok(d)
}

/// Adds `b` into `a` (same parameter).
fn add_grad<T: splitgrad::Real>(a: &mut ParamGrad<T>, b: &ParamGrad<T>) {
    match (&mut *a, b) {
        (ParamGrad::Dense(d), ParamGrad::Dense(e)) => *d += e,
        (ParamGrad::Dense(d), ParamGrad::RowSparse(s)) => s.add_to(
            d.view_mut()
                .into_dimensionality::<ndarray::Ix2>()
                .expect("a row-sparse gradient belongs to a 2-D parameter"),
        ),
        (ParamGrad::RowSparse(_), _) => {
            let mut d = a.to_dense();
            match b {
                ParamGrad::Dense(e) => d += e,
                ParamGrad::RowSparse(s) => s.add_to(
                    d.view_mut()
                        .into_dimensionality::<ndarray::Ix2>()
                        .expect("2-D"),
                ),
            }
            *a = ParamGrad::Dense(d);
        }
    }
}

fn vocab_fused_step<T: crate::convert::PyReal>(
    py: Python<'_>,
    sv: &mut SplitVocabulary<T>,
    pool: &splitgrad::kernels::pool::Pool<T>,
    pieces: Vec<&[Entry<T>]>,
    // The penalties' weights, and the fusion penalty's row distances if known.
    penalties: (f64, f64, Option<&Bound<'_, PyAny>>),
    rows_opt: &mut dyn Optimizer<T>,
    gate_opt: &mut dyn Optimizer<T>,
) -> PyResult<()> {
    let (penalty_weight, fusion_weight, norms) = penalties;
    let norms = crate::layers::norms_arg(norms)?;
    let rows_name = sv.rows().name().to_string();
    let entries = || pieces.iter().flat_map(|p| p.iter());
    // With the distances known and every forward's rows gradient row-sparse,
    // the rows' gradient is formed row by row inside their update: the
    // fusion penalty's row, then each forward's row where it has one, in
    // the order the dense sum below adds them. The gradient is never stored.
    let by_rows = fusion_weight.is_finite()
        && fusion_weight != 0.0
        && sv.n_rows() > 0
        && sv.rows().is_trainable()
        && entries()
            .filter(|e| e.name == rows_name)
            .all(|e| matches!(e.grad, ParamGrad::RowSparse(_)));
    let (fusion, norms) = match norms {
        Some(n) if by_rows => (
            Some(
                sv.fusion_row_grads(&n, T::from_f64(fusion_weight))
                    .or_raise()?,
            ),
            None,
        ),
        norms => (None, norms),
    };
    // The penalties' gradients (without the fusion penalty's when it is
    // formed by rows), plus the forward passes' not formed by rows.
    let fusion_weight = if fusion.is_some() { 0.0 } else { fusion_weight };
    let own = vocab_penalty_backward(py, sv, pool, penalty_weight, fusion_weight, norms)?;
    let by_rows_name = |e: &&Entry<T>| fusion.is_some() && e.name == rows_name;
    let (own, borrowed) = merge(own, entries().filter(|e| !by_rows_name(e)));
    let src = Source(own.iter().chain(borrowed.iter().copied()).collect());
    let rows_step = match &fusion {
        None => rows_opt.step(vec![sv.rows_mut()], &src),
        Some(fusion) => {
            let n_rows = sv.n_rows();
            let parts: Vec<(&splitgrad::RowSparse<T>, Vec<u32>)> = entries()
                .filter(by_rows_name)
                .filter_map(|e| match &e.grad {
                    ParamGrad::RowSparse(rs) => {
                        let mut at = vec![u32::MAX; n_rows];
                        for (k, &r) in rs.rows.iter().enumerate() {
                            at[r] = k as u32;
                        }
                        Some((rs, at))
                    }
                    ParamGrad::Dense(_) => None,
                })
                .collect();
            let grad_row = |r: usize, x: &[T], g: &mut [T]| {
                fusion.row(r, x, g);
                for (rs, at) in &parts {
                    if let Some(k) = at.get(r).copied().filter(|&k| k != u32::MAX) {
                        let v = rs.values.row(k as usize);
                        g.iter_mut().zip(v.iter()).for_each(|(g, &v)| *g += v);
                    }
                }
            };
            rows_opt.update_by_rows(sv.rows_mut(), &grad_row)
        }
    };
    let r = rows_step.and_then(|()| gate_opt.step(vec![sv.gate_logit_mut()], &src));
    drop(src);
    crate::layers::give_back(own, pool);
    r.or_raise()
}

/// The sum of the penalties' gradients (`own`) and the forward passes'
/// (`entries`), by parameter: a parameter with gradients in both, or in
/// several entries, gets an owned sum (added in order); one with a single
/// entry keeps it borrowed.
fn merge<'e, T: splitgrad::Real>(
    mut own: Vec<Entry<T>>,
    entries: impl Iterator<Item = &'e Entry<T>>,
) -> (Vec<Entry<T>>, Vec<&'e Entry<T>>) {
    let mut borrowed: Vec<&Entry<T>> = Vec::new();
    for e in entries {
        if let Some(o) = own.iter_mut().find(|o| o.name == e.name) {
            add_grad(&mut o.grad, &e.grad);
        } else if let Some(pos) = borrowed.iter().position(|b| b.name == e.name) {
            let mut g = borrowed[pos].grad.clone();
            add_grad(&mut g, &e.grad);
            own.push(Entry {
                name: e.name.clone(),
                id: e.id,
                grad: g,
            });
            borrowed.remove(pos);
        } else {
            borrowed.push(e);
        }
    }
    (own, borrowed)
}

#[pymethods]
impl PyVocabulary {
    /// One optimiser step of the rows (`rows_optimizer`) and the gate
    /// logits (`gate_optimizer`) from the gradients of the forward passes
    /// (`grads`, a list of Gradients) plus those of
    /// `penalty_weight·penalty + fusion_weight·fusion_penalty`, summed.
    /// `fusion_norms`: as for `penalty_backward`.
    #[pyo3(signature = (grads, penalty_weight, fusion_weight, rows_optimizer, gate_optimizer, fusion_norms = None))]
    #[allow(clippy::too_many_arguments)]
    fn fused_step(
        &mut self,
        py: Python<'_>,
        grads: Vec<PyRef<'_, PyGradients>>,
        penalty_weight: f64,
        fusion_weight: f64,
        mut rows_optimizer: PyRefMut<'_, PyOptimizer>,
        mut gate_optimizer: PyRefMut<'_, PyOptimizer>,
        fusion_norms: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let w = (penalty_weight, fusion_weight, fusion_norms);
        let PyVocabulary { inner, pools } = self;
        let (ro, go) = (&mut rows_optimizer.inner, &mut gate_optimizer.inner);
        match (inner, ro, go) {
            (Dt::F32(sv), Dt::F32(r), Dt::F32(g)) => {
                let mut pieces = Vec::new();
                for x in &grads {
                    match &x.inner {
                        Dt::F32(v) => pieces.push(v.as_slice()),
                        Dt::F64(_) => {
                            return Err(PyValueError::new_err(
                                "float64 gradients for a float32 layer",
                            ));
                        }
                    }
                }
                vocab_fused_step(
                    py,
                    sv,
                    PoolOf::<f32>::of(pools),
                    pieces,
                    w,
                    r.as_mut(),
                    g.as_mut(),
                )
            }
            (Dt::F64(sv), Dt::F64(r), Dt::F64(g)) => {
                let mut pieces = Vec::new();
                for x in &grads {
                    match &x.inner {
                        Dt::F64(v) => pieces.push(v.as_slice()),
                        Dt::F32(_) => {
                            return Err(PyValueError::new_err(
                                "float32 gradients for a float64 layer",
                            ));
                        }
                    }
                }
                vocab_fused_step(
                    py,
                    sv,
                    PoolOf::<f64>::of(pools),
                    pieces,
                    w,
                    r.as_mut(),
                    g.as_mut(),
                )
            }
            _ => Err(PyValueError::new_err(
                "the layer and both optimisers must have one dtype",
            )),
        }
    }
}

impl ModRef<'_> {
    /// The layer's buffer pools.
    fn pools(&self) -> crate::layers::Pools {
        match self {
            ModRef::E(r) => r.pools.clone(),
            ModRef::H(r) => r.pools.clone(),
            ModRef::V(r) => r.pools.clone(),
        }
    }
}

/// [`PyGradients::from_parts`] for the layer's real type.
fn from_parts_typed<T: crate::convert::PyReal>(
    m: &mut ModRef<'_>,
    parts: &Bound<'_, PyDict>,
    scale: f64,
) -> PyResult<PyGradients>
where
    for<'a> ModRef<'a>: ModuleOf<T>,
    crate::layers::Pools: PoolOf<T>,
    Vec<Entry<T>>: crate::layers::IntoDt,
{
    use crate::convert::{check_shape, ids_arg, real_arg};
    let pools = m.pools();
    let module = m.module().expect("the dtype was checked");
    let params = module.parameters();
    let c = T::from_f64(scale);
    let mut entries = Vec::new();
    for (key, value) in parts.iter() {
        let name: String = key.extract()?;
        let p = params.iter().find(|p| p.name() == name).ok_or_else(|| {
            let names: Vec<&str> = params.iter().map(|p| p.name()).collect();
            pyo3::exceptions::PyKeyError::new_err(format!(
                "no parameter `{name}` in this layer (parameters: {})",
                names.join(", ")
            ))
        })?;
        let (rows, values): (Bound<'_, PyAny>, Bound<'_, PyAny>) = value.extract()?;
        let what = format!("values of {name}");
        let vals = real_arg::<T>(&values, &what)?;
        let shape = p.value().shape().to_vec();
        let grad = if rows.is_none() {
            check_shape(vals.as_array().shape(), &shape, &what)?;
            ParamGrad::Dense(vals.as_array().mapv(|x| x * c))
        } else {
            let ids = ids_arg(&rows, &format!("rows of {name}"))?;
            if shape.len() != 2 || ids.ndim() != 1 {
                return Err(PyValueError::new_err(format!(
                    "rows of {name}: a row-sparse gradient needs a 2-D parameter (it is {shape:?}) and 1-D rows (they are {:?})",
                    ids.shape()
                )));
            }
            let (n_rows, width) = (shape[0], shape[1]);
            check_shape(vals.as_array().shape(), &[ids.len(), width], &what)?;
            let mut at = Vec::with_capacity(ids.len());
            for (i, &r) in ids.iter().enumerate() {
                if r < 0 || r as usize >= n_rows {
                    return Err(PyValueError::new_err(format!(
                        "rows of {name}: row {r} at position [{i}] is out of range 0..{n_rows}"
                    )));
                }
                at.push(r as usize);
            }
            let v = vals.as_array();
            let v = v
                .to_shape((ids.len(), width))
                .expect("the shape was checked");
            let rs = splitgrad::kernels::scatter::coalesce_sources_in(
                PoolOf::<T>::of(&pools),
                n_rows,
                width,
                &at,
                &[splitgrad::kernels::scatter::RowSource {
                    values: v.view(),
                    rows: None,
                    scale: Some(c),
                }],
            );
            ParamGrad::RowSparse(splitgrad::RowSparse::from_coalesced(n_rows, rs))
        };
        entries.push(Entry {
            name,
            id: p.id(),
            grad,
        });
    }
    Ok(crate::layers::gradients_of(entries, &pools))
}

#[pymethods]
impl PyGradients {
    /// Gradients of `layer` built from arrays: `parts` maps a parameter's
    /// name to `(rows, values)`, `rows` the int64 row of each row of
    /// `values` (repeats are summed, in order) for a row-sparse gradient,
    /// or `None` with `values` of the parameter's shape for a dense one;
    /// every value times `scale`. For gradients gathered from several
    /// processes (`splitgrad.torch.prepare_distributed`).
    #[staticmethod]
    #[pyo3(signature = (layer, parts, scale = 1.0))]
    fn from_parts(
        layer: &Bound<'_, PyAny>,
        parts: &Bound<'_, PyDict>,
        scale: f64,
    ) -> PyResult<PyGradients> {
        if !scale.is_finite() {
            return Err(PyValueError::new_err(format!(
                "scale must be finite, got {scale}"
            )));
        }
        let mut mods = modules_of(layer)?;
        if mods.len() != 1 {
            return Err(PyTypeError::new_err("from_parts takes one layer"));
        }
        let m = &mut mods[0];
        match m.dtype() {
            Dtype::F32 => from_parts_typed::<f32>(m, parts, scale),
            Dtype::F64 => from_parts_typed::<f64>(m, parts, scale),
        }
    }
}
