//! The three layers for numpy arrays.
//!
//! A layer owns its parameters (the crate's [`Parameter`]s); `parameter()`
//! hands numpy a writable view of one, without a copy, whose base is the
//! layer (so the layer lives as long as any view of it). No method ever
//! reallocates a parameter's buffer, so a view stays valid: loads and
//! `seed_from` write into the buffer that is there.
//!
//! `forward` runs the layer on a tape that records nothing; `backward`
//! takes the gradient of the output and returns the parameters' gradients
//! (row-sparse for the tables) as a [`PyGradients`], plus the gradient of
//! the differentiable input where there is one.

use ndarray::{ArrayD, ArrayViewD, IxDyn};
use numpy::{PyArrayDyn, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::{PyKeyError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyAny, PyDict, PyList};
use splitgrad::io::SplitIndex;
use splitgrad::kernels::pool::Pool;
use splitgrad::kernels::scatter::{RowSource, coalesce_sources_in};
use splitgrad::layers::{
    SplitLanguageModellingHead, SplitTokenEmbeddings, SplitVocabulary, SplitVocabularyConfig,
};
use splitgrad::ops::gated_mix::gated_mix_forward_in;
use splitgrad::ops::split_gather::split_gather_forward_in;
use splitgrad::param::{ParamGrad, GradSource, ParamId, Parameter};
use splitgrad::state::{Module, StateDict, TensorData};
use splitgrad::{Error, ErrorKind, Gradients, Rng, Tape};

use crate::convert::{
    Dtype, OrRaise, PyReal, check_shape, ids_arg, py_err, real_arg, to_numpy, to_numpy_pooled,
};

/// One value per real type.
pub enum Dt<A, B> {
    F32(A),
    F64(B),
}

/// Runs `$body` with `$l` bound to the f32 or the f64 value.
#[macro_export]
macro_rules! each {
    ($inner:expr, $l:ident => $body:expr) => {
        match $inner {
            $crate::layers::Dt::F32($l) => $body,
            $crate::layers::Dt::F64($l) => $body,
        }
    };
}

/// The buffer pools of a layer, one per real type.
#[derive(Clone, Default)]
pub struct Pools {
    f32: Pool<f32>,
    f64: Pool<f64>,
}

/// The pool of `T`.
pub trait PoolOf<T> {
    fn of(&self) -> &Pool<T>;
}
impl PoolOf<f32> for Pools {
    fn of(&self) -> &Pool<f32> {
        &self.f32
    }
}
impl PoolOf<f64> for Pools {
    fn of(&self) -> &Pool<f64> {
        &self.f64
    }
}

// ---------------------------------------------------------------------------
// Gradients

/// One parameter's gradient, by name.
pub struct Entry<T> {
    pub name: String,
    pub id: ParamId,
    pub grad: ParamGrad<T>,
}

/// The gradients of one backward pass, by parameter name.
///
/// A table's gradient is row-sparse: `rows(name)` (sorted, unique, int64)
/// and `values(name)` (one row each); any other gradient is dense
/// (`values(name)` is then the whole array). `dense(name)` is either as a
/// dense array of the parameter's shape.
#[pyclass(module = "splitgrad._splitgrad", name = "Gradients", frozen)]
pub struct PyGradients {
    pub inner: Dt<Vec<Entry<f32>>, Vec<Entry<f64>>>,
    /// Where the gradients' buffers go back when Python is done with them
    /// (the layer's pools: its next backward reuses them).
    pub pools: Pools,
}

/// Gives the buffers of gradients back to a pool.
pub fn give_back<T: PyReal>(entries: Vec<Entry<T>>, pool: &Pool<T>) {
    for e in entries {
        match e.grad {
            ParamGrad::Dense(d) => pool.give(d),
            ParamGrad::RowSparse(s) => pool.give(s.values),
        }
    }
}

impl Drop for PyGradients {
    fn drop(&mut self) {
        match &mut self.inner {
            Dt::F32(v) => give_back(std::mem::take(v), &self.pools.f32),
            Dt::F64(v) => give_back(std::mem::take(v), &self.pools.f64),
        }
    }
}

/// A list of entries as the optimisers' [`GradSource`].
pub struct Source<'a, T>(pub Vec<&'a Entry<T>>);

impl<T> GradSource<T> for Source<'_, T> {
    fn grad_of(&self, p: &Parameter<T>) -> Option<&ParamGrad<T>> {
        self.0.iter().find(|e| e.id == p.id()).map(|e| &e.grad)
    }
}

fn entries_of<T: PyReal>(module: &dyn Module<T>, mut grads: Gradients<T>) -> Vec<Entry<T>> {
    module
        .parameters()
        .into_iter()
        .filter_map(|p| {
            grads.take(p.id()).map(|grad| Entry {
                name: p.name().to_string(),
                id: p.id(),
                grad,
            })
        })
        .collect()
}

fn find<'a, T>(list: &'a [Entry<T>], name: &str) -> PyResult<&'a Entry<T>> {
    list.iter().find(|e| e.name == name).ok_or_else(|| {
        let names: Vec<&str> = list.iter().map(|e| e.name.as_str()).collect();
        PyKeyError::new_err(format!(
            "no gradient for `{name}` (gradients: {})",
            names.join(", ")
        ))
    })
}

#[pymethods]
impl PyGradients {
    /// The names of the parameters that have a gradient.
    fn names(&self) -> Vec<String> {
        each!(&self.inner, l => l.iter().map(|e| e.name.clone()).collect())
    }

    fn __len__(&self) -> usize {
        each!(&self.inner, l => l.len())
    }

    fn __contains__(&self, name: &str) -> bool {
        each!(&self.inner, l => l.iter().any(|e| e.name == name))
    }

    /// Whether the gradient of `name` is row-sparse.
    fn is_sparse(&self, name: &str) -> PyResult<bool> {
        each!(&self.inner, l => Ok(matches!(find(l, name)?.grad, ParamGrad::RowSparse(_))))
    }

    /// The shape of the parameter the gradient belongs to.
    fn shape(&self, name: &str) -> PyResult<Vec<usize>> {
        each!(&self.inner, l => Ok(match &find(l, name)?.grad {
            ParamGrad::Dense(d) => d.shape().to_vec(),
            ParamGrad::RowSparse(s) => vec![s.n_rows, s.values.ncols()],
        }))
    }

    /// The rows of a row-sparse gradient (sorted, unique, int64); every row
    /// for a dense one.
    fn rows<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let rows: Vec<i64> = each!(&self.inner, l => match &find(l, name)?.grad {
            ParamGrad::RowSparse(s) => s.rows.iter().map(|&r| r as i64).collect(),
            ParamGrad::Dense(d) => (0..d.shape().first().copied().unwrap_or(1) as i64).collect(),
        });
        Ok(to_numpy(py, ndarray::Array1::from(rows)).into_any())
    }

    /// The gradient's values without a copy (read-only): one row per entry
    /// of `rows(name)` for a row-sparse gradient, the whole array for a
    /// dense one.
    fn values<'py>(slf: Bound<'py, Self>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let this = slf.get();
        let arr = each!(&this.inner, l => {
            let e = find(l, name)?;
            let view: ArrayViewD<'_, _> = match &e.grad {
                ParamGrad::RowSparse(s) => s.values.view().into_dyn(),
                ParamGrad::Dense(d) => d.view(),
            };
            // SAFETY: the gradients are frozen: never changed or freed
            // while `slf`, the array's base, lives.
            let a = unsafe { PyArrayDyn::borrow_from_array(&view, slf.clone().into_any()) };
            a.into_any()
        });
        Ok(arr)
    }

    /// The gradient as a dense array of the parameter's shape (a copy).
    fn dense<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        each!(&self.inner, l => Ok(to_numpy(py, find(l, name)?.grad.to_dense()).into_any()))
    }

    fn __repr__(&self) -> String {
        let parts: Vec<String> = each!(&self.inner, l => l.iter().map(|e| match &e.grad {
            ParamGrad::RowSparse(s) => format!("{}: {} of {} rows", e.name, s.rows.len(), s.n_rows),
            ParamGrad::Dense(d) => format!("{}: dense {:?}", e.name, d.shape()),
        }).collect());
        format!("Gradients({})", parts.join(", "))
    }
}

// ---------------------------------------------------------------------------
// What every layer has: parameters, state, freezing.

fn params_py<'py, T: PyReal>(
    slf: &Bound<'py, PyAny>,
    module: &dyn Module<T>,
    name: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let p = module
        .parameters()
        .into_iter()
        .find(|p| p.name() == name)
        .ok_or_else(|| {
            let names: Vec<&str> = module.parameters().iter().map(|p| p.name()).collect();
            PyKeyError::new_err(format!(
                "no parameter named `{name}` (parameters: {})",
                names.join(", ")
            ))
        })?;
    // SAFETY: the layer (`slf`, the array's base) owns the parameter and
    // never reallocates its buffer (module docs).
    Ok(unsafe { PyArrayDyn::borrow_from_array(p.value(), slf.clone()) }.into_any())
}

pub fn state_to_py<'py>(py: Python<'py>, sd: StateDict) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let names: Vec<String> = sd.names().map(str::to_string).collect();
    let mut sd = sd;
    for name in names {
        let t = sd.remove(&name).expect("listed");
        let a = match t {
            TensorData::F32(a) => to_numpy(py, a).into_any(),
            TensorData::F64(a) => to_numpy(py, a).into_any(),
            TensorData::I64(a) => to_numpy(py, a).into_any(),
            TensorData::U64(a) => to_numpy(py, a).into_any(),
        };
        d.set_item(name, a)?;
    }
    Ok(d)
}

/// A Python mapping of name → array as a [`StateDict`]: reals as float32
/// or float64 as they are, integers as int64 (uint64 for a 0-d optimiser
/// step, which may also be a Python int).
pub fn state_from_py(obj: &Bound<'_, PyAny>) -> PyResult<StateDict> {
    let py = obj.py();
    let np = py.import("numpy")?;
    let mut sd = StateDict::new();
    let items = obj.call_method0("items")?;
    for item in items.try_iter()? {
        let (name, value): (String, Bound<'_, PyAny>) = item?.extract()?;
        // torch tensors: numpy arrays of the same memory.
        let value = if value.hasattr("detach")? && value.hasattr("numpy")? {
            value
                .call_method0("detach")?
                .call_method0("cpu")?
                .call_method0("numpy")?
        } else {
            value
        };
        let arr = np.call_method1("asarray", (&value,))?;
        let dtype: String = arr.getattr("dtype")?.getattr("name")?.extract()?;
        let data = match dtype.as_str() {
            "float32" => TensorData::F32(
                arr.extract::<PyReadonlyArrayDyn<'_, f32>>()?
                    .as_array()
                    .to_owned(),
            ),
            "float64" => TensorData::F64(
                arr.extract::<PyReadonlyArrayDyn<'_, f64>>()?
                    .as_array()
                    .to_owned(),
            ),
            "uint64" => TensorData::U64(
                arr.extract::<PyReadonlyArrayDyn<'_, u64>>()?
                    .as_array()
                    .to_owned(),
            ),
            _ if name.ends_with(".step") => TensorData::U64(
                arr.call_method1("astype", ("uint64",))?
                    .extract::<PyReadonlyArrayDyn<'_, u64>>()?
                    .as_array()
                    .to_owned(),
            ),
            d if d.starts_with("int") || d.starts_with("uint") => TensorData::I64(
                arr.call_method1("astype", ("int64",))?
                    .extract::<PyReadonlyArrayDyn<'_, i64>>()?
                    .as_array()
                    .to_owned(),
            ),
            other => {
                return Err(py_err(
                    Error::new(ErrorKind::Dtype {
                        found: other.to_string(),
                        expected: "float32, float64, an integer dtype".into(),
                    })
                    .in_array(name.clone()),
                ));
            }
        };
        sd.insert(name, data);
    }
    Ok(sd)
}

fn set_trainable<T: PyReal>(module: &mut dyn Module<T>, name: &str, on: bool) -> PyResult<()> {
    let p = module
        .parameters_mut()
        .into_iter()
        .find(|p| p.name() == name)
        .ok_or_else(|| PyKeyError::new_err(format!("no parameter named `{name}`")))?;
    p.set_trainable(on);
    Ok(())
}

/// The methods every layer has, in one place.
macro_rules! module_methods {
    ($ty:ty) => {
        #[pymethods]
        impl $ty {
            /// numpy's name of the layer's real type.
            #[getter]
            fn dtype(&self) -> &'static str {
                match &self.inner {
                    Dt::F32(_) => Dtype::F32.name(),
                    Dt::F64(_) => Dtype::F64.name(),
                }
            }

            /// The parameters' names, in order.
            fn parameter_names(&self) -> Vec<String> {
                each!(&self.inner, l => l.parameters().iter().map(|p| p.name().to_string()).collect())
            }

            /// A parameter as a writable numpy view of the layer's own
            /// buffer (no copy; the layer lives as long as the view).
            fn parameter<'py>(slf: Bound<'py, Self>, name: &str) -> PyResult<Bound<'py, PyAny>> {
                let any = slf.clone().into_any();
                let this = slf.borrow();
                each!(&this.inner, l => params_py(&any, l, name))
            }

            /// `[(name, view)]` for every parameter, in order.
            fn named_parameters<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyList>> {
                let py = slf.py();
                let names: Vec<String> = {
                    let this = slf.borrow();
                    each!(&this.inner, l => l.parameters().iter().map(|p| p.name().to_string()).collect())
                };
                let out = PyList::empty(py);
                for n in names {
                    let v = Self::parameter(slf.clone(), &n)?;
                    out.append((n, v))?;
                }
                Ok(out)
            }

            /// Whether a parameter is trained (receives gradients).
            fn is_trainable(&self, name: &str) -> PyResult<bool> {
                each!(&self.inner, l => l.parameters().into_iter().find(|p| p.name() == name)
                    .map(|p| p.is_trainable())
                    .ok_or_else(|| PyKeyError::new_err(format!("no parameter named `{name}`"))))
            }

            /// Freezes (`False`) or unfreezes a parameter by its name.
            fn set_parameter_trainable(&mut self, name: &str, trainable: bool) -> PyResult<()> {
                each!(&mut self.inner, l => set_trainable(l, name, trainable))
            }

            /// Every parameter and buffer by name, copied.
            fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
                let sd = each!(&self.inner, l => l.state_dict());
                state_to_py(py, sd)
            }

            /// Loads every parameter by name, in place, after checking every
            /// tensor (dtype, shape, finiteness; a split vocabulary's index);
            /// on an error nothing is changed. Names of other modules are
            /// ignored.
            fn load_state_dict(&mut self, state: &Bound<'_, PyAny>) -> PyResult<()> {
                let sd = state_from_py(state)?;
                each!(&mut self.inner, l => l.load_state_dict(&sd).or_raise())
            }
        }
    };
}

pub(crate) fn gradients_of<T: PyReal>(v: Vec<Entry<T>>, pools: &Pools) -> PyGradients
where
    Vec<Entry<T>>: IntoDt,
{
    PyGradients {
        inner: v.into_dt(),
        pools: pools.clone(),
    }
}

/// Puts a typed list of entries in its [`Dt`] slot.
pub trait IntoDt {
    fn into_dt(self) -> Dt<Vec<Entry<f32>>, Vec<Entry<f64>>>;
}
impl IntoDt for Vec<Entry<f32>> {
    fn into_dt(self) -> Dt<Vec<Entry<f32>>, Vec<Entry<f64>>> {
        Dt::F32(self)
    }
}
impl IntoDt for Vec<Entry<f64>> {
    fn into_dt(self) -> Dt<Vec<Entry<f32>>, Vec<Entry<f64>>> {
        Dt::F64(self)
    }
}

fn split_sizes(obj: &Bound<'_, PyAny>) -> PyResult<Vec<(String, usize)>> {
    let items = if obj.hasattr("items")? {
        obj.call_method0("items")?
    } else {
        obj.clone()
    };
    let mut out = Vec::new();
    for item in items.try_iter()? {
        let (name, size): (String, i64) = item?.extract()?;
        if size < 0 {
            return Err(PyValueError::new_err(format!(
                "split `{name}` has size {size}; sizes must be ≥ 0"
            )));
        }
        out.push((name, size as usize));
    }
    Ok(out)
}

fn positive(x: i64, what: &str) -> PyResult<usize> {
    usize::try_from(x).map_err(|_| PyValueError::new_err(format!("{what} must be ≥ 0, got {x}")))
}

/// A standard-layout view (a copy only when the input is strided).
fn std_layout<'a, T: Clone>(a: ArrayViewD<'a, T>) -> ndarray::CowArray<'a, T, IxDyn> {
    if a.is_standard_layout() {
        ndarray::CowArray::from(a)
    } else {
        ndarray::CowArray::from(a.as_standard_layout().into_owned())
    }
}

// ---------------------------------------------------------------------------
// SplitTokenEmbeddings

/// `SplitTokenEmbeddings(split_vocab_size, split_order, hidden_size, dtype="float32")`.
#[pyclass(module = "splitgrad._splitgrad", name = "SplitTokenEmbeddings")]
pub struct PyEmbeddings {
    pub inner: Dt<SplitTokenEmbeddings<f32>, SplitTokenEmbeddings<f64>>,
    pub(crate) pools: Pools,
}

module_methods!(PyEmbeddings);

fn emb_forward<'py, T: PyReal>(
    py: Python<'py>,
    layer: &SplitTokenEmbeddings<T>,
    pool: &Pool<T>,
    ids: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let ids = ids_arg(ids, "input_ids")?;
    let routed = layer.splits().route(ids.view(), "input id").or_raise()?;
    let out = py.detach(|| {
        let views: Vec<ArrayViewD<'_, T>> = layer
            .splits()
            .tables()
            .iter()
            .map(|p| p.value().view())
            .collect();
        split_gather_forward_in(pool, &views, &routed, ids.shape())
    });
    Ok(to_numpy_pooled(py, out, pool)?.into_any())
}

fn out_shape(ids: &[usize], h: usize) -> Vec<usize> {
    let mut s = ids.to_vec();
    s.push(h);
    s
}

fn emb_backward<T: PyReal>(
    py: Python<'_>,
    layer: &SplitTokenEmbeddings<T>,
    pool: &Pool<T>,
    ids: &Bound<'_, PyAny>,
    grad: &Bound<'_, PyAny>,
) -> PyResult<Vec<Entry<T>>> {
    let ids = ids_arg(ids, "input_ids")?;
    let routed = layer.splits().route(ids.view(), "input id").or_raise()?;
    let g = real_arg::<T>(grad, "grad_output")?;
    let h = layer.hidden_size();
    check_shape(g.shape(), &out_shape(ids.shape(), h), "grad_output")?;
    let g = std_layout(g.as_array());
    let n = routed.n_ids();
    let g2 = g
        .view()
        .into_shape_with_order((n, h))
        .expect("standard layout reshapes");
    let tables = layer.splits().tables();
    let out = py.detach(|| {
        let mut out = Vec::new();
        for (k, p) in tables.iter().enumerate() {
            if !p.is_trainable() || routed.positions[k].is_empty() {
                continue;
            }
            let rs = coalesce_sources_in(
                pool,
                p.value().shape()[0],
                h,
                &routed.local[k],
                &[RowSource {
                    values: g2.view(),
                    rows: Some(&routed.positions[k]),
                    scale: None,
                }],
            );
            out.push(Entry {
                name: p.name().to_string(),
                id: p.id(),
                grad: ParamGrad::RowSparse(splitgrad::RowSparse::from_coalesced(
                    p.value().shape()[0],
                    rs,
                )),
            });
        }
        out
    });
    Ok(out)
}

fn emb_backward_tape<T: PyReal>(
    layer: &SplitTokenEmbeddings<T>,
    pool: &Pool<T>,
    ids: &Bound<'_, PyAny>,
    grad: &Bound<'_, PyAny>,
) -> PyResult<Vec<Entry<T>>> {
    let ids = ids_arg(ids, "input_ids")?;
    let g = real_arg::<T>(grad, "grad_output")?;
    check_shape(
        g.shape(),
        &out_shape(ids.shape(), layer.hidden_size()),
        "grad_output",
    )?;
    let gv = g.as_array();
    let grads = {
        let mut tape = Tape::with_pool(pool);
        let out = layer.forward(&mut tape, ids.view()).or_raise()?;
        tape.backward_from(out, gv.view())
    };
    Ok(entries_of(layer, grads))
}

#[pymethods]
impl PyEmbeddings {
    #[new]
    #[pyo3(signature = (split_vocab_size, split_order, hidden_size, dtype = None))]
    fn new(
        split_vocab_size: &Bound<'_, PyAny>,
        split_order: Vec<String>,
        hidden_size: i64,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let sizes = split_sizes(split_vocab_size)?;
        let h = positive(hidden_size, "hidden_size")?;
        let dt = match dtype {
            Some(d) => Dtype::parse(d)?,
            None => Dtype::F32,
        };
        let inner = match dt {
            Dtype::F32 => Dt::F32(SplitTokenEmbeddings::new(&sizes, &split_order, h).or_raise()?),
            Dtype::F64 => Dt::F64(SplitTokenEmbeddings::new(&sizes, &split_order, h).or_raise()?),
        };
        Ok(PyEmbeddings {
            inner,
            pools: Pools::default(),
        })
    }

    /// Every element N(0, 1) from splitgrad's seeded generator.
    fn reset_parameters(&mut self, seed: u64) {
        each!(&mut self.inner, l => l.reset_parameters(&mut Rng::new(seed)))
    }

    /// Freezes (`False`) or unfreezes a split.
    fn set_trainable(&mut self, split: &str, trainable: bool) -> PyResult<()> {
        each!(&mut self.inner, l => l.set_trainable(split, trainable).or_raise())
    }

    #[getter]
    fn split_order(&self) -> Vec<String> {
        each!(&self.inner, l => l.splits().split_order().to_vec())
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        each!(&self.inner, l => l.vocab_size())
    }

    #[getter]
    fn hidden_size(&self) -> usize {
        each!(&self.inner, l => l.hidden_size())
    }

    /// ids of any shape → `(*ids.shape, H)`.
    fn forward<'py>(
        &self,
        py: Python<'py>,
        input_ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match &self.inner {
            Dt::F32(l) => emb_forward(py, l, self.pools.of(), input_ids),
            Dt::F64(l) => emb_forward(py, l, self.pools.of(), input_ids),
        }
    }

    /// The tables' gradients of `Σ out ⊙ grad_output`: row-sparse, only the
    /// trainable splits that the ids reach.
    fn backward(
        &self,
        py: Python<'_>,
        input_ids: &Bound<'_, PyAny>,
        grad_output: &Bound<'_, PyAny>,
    ) -> PyResult<PyGradients> {
        Ok(match &self.inner {
            Dt::F32(l) => gradients_of(
                emb_backward(py, l, self.pools.of(), input_ids, grad_output)?,
                &self.pools,
            ),
            Dt::F64(l) => gradients_of(
                emb_backward(py, l, self.pools.of(), input_ids, grad_output)?,
                &self.pools,
            ),
        })
    }

    /// [`backward`] through the crate's tape (forward, `Σ out ⊙ g`,
    /// backward): the reference the direct path is tested against.
    fn backward_tape(
        &self,
        input_ids: &Bound<'_, PyAny>,
        grad_output: &Bound<'_, PyAny>,
    ) -> PyResult<PyGradients> {
        Ok(match &self.inner {
            Dt::F32(l) => gradients_of(
                emb_backward_tape(l, self.pools.of(), input_ids, grad_output)?,
                &self.pools,
            ),
            Dt::F64(l) => gradients_of(
                emb_backward_tape(l, self.pools.of(), input_ids, grad_output)?,
                &self.pools,
            ),
        })
    }
}

// ---------------------------------------------------------------------------
// SplitLanguageModellingHead

/// `SplitLanguageModellingHead(split_vocab_size, split_order, hidden_size, dtype="float32")`.
#[pyclass(module = "splitgrad._splitgrad", name = "SplitLanguageModellingHead")]
pub struct PyHead {
    pub inner: Dt<SplitLanguageModellingHead<f32>, SplitLanguageModellingHead<f64>>,
    pub(crate) pools: Pools,
}

module_methods!(PyHead);

fn head_forward<'py, T: PyReal>(
    py: Python<'py>,
    layer: &SplitLanguageModellingHead<T>,
    pool: &Pool<T>,
    hidden: &Bound<'py, PyAny>,
    labels: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let labels = ids_arg(labels, "labels")?;
    let h = real_arg::<T>(hidden, "hidden")?;
    let hv = std_layout(h.as_array());
    let out = py.detach(|| -> splitgrad::Result<ArrayD<T>> {
        let mut tape = Tape::no_grad_with_pool(pool);
        let x = tape.constant_view(hv.view());
        let loss = layer.forward(&mut tape, x, labels.view())?;
        Ok(tape.value(loss).to_owned())
    });
    Ok(to_numpy(py, out.or_raise()?).into_any())
}

type HeadGrads<T> = (Option<ArrayD<T>>, Vec<Entry<T>>);

fn head_backward<T: PyReal>(
    py: Python<'_>,
    layer: &SplitLanguageModellingHead<T>,
    pool: &Pool<T>,
    hidden: &Bound<'_, PyAny>,
    labels: &Bound<'_, PyAny>,
    grad: &Bound<'_, PyAny>,
    want_hidden: bool,
) -> PyResult<HeadGrads<T>> {
    let labels = ids_arg(labels, "labels")?;
    let h = real_arg::<T>(hidden, "hidden")?;
    let g = real_arg::<T>(grad, "grad_loss")?;
    let hv = std_layout(h.as_array());
    let gv = g.as_array();
    let res = py.detach(|| -> splitgrad::Result<HeadGrads<T>> {
        let mut tape = Tape::with_pool(pool);
        let x = if want_hidden {
            tape.input_view(hv.view())
        } else {
            tape.constant_view(hv.view())
        };
        let loss = layer.forward(&mut tape, x, labels.view())?;
        if gv.shape() != labels.shape() {
            return Err(Error::shape(
                "grad_loss",
                format!("{:?} (the shape of labels)", labels.shape()),
                gv.shape(),
            ));
        }
        let mut grads = tape.backward_from(loss, gv.view());
        let gh = grads.take_input(x);
        Ok((gh, entries_of(layer, grads)))
    });
    res.or_raise()
}

type SumResult<T> = (T, Option<ArrayD<T>>, Vec<Entry<T>>);

fn head_sum_backward<T: PyReal>(
    py: Python<'_>,
    layer: &SplitLanguageModellingHead<T>,
    pool: &Pool<T>,
    hidden: &Bound<'_, PyAny>,
    labels: &Bound<'_, PyAny>,
    want_hidden: bool,
    record: bool,
) -> PyResult<SumResult<T>> {
    let labels = ids_arg(labels, "labels")?;
    let h = real_arg::<T>(hidden, "hidden")?;
    let hv = std_layout(h.as_array());
    let res = py.detach(|| -> splitgrad::Result<SumResult<T>> {
        let mut tape = if record {
            Tape::with_pool(pool)
        } else {
            Tape::no_grad_with_pool(pool)
        };
        let x = if want_hidden {
            tape.input_view(hv.view())
        } else {
            tape.constant_view(hv.view())
        };
        let total = layer.forward_sum(&mut tape, x, labels.view())?;
        let loss = tape.scalar(total);
        if !record {
            return Ok((loss, None, Vec::new()));
        }
        let mut grads = tape.backward(total);
        let gh = grads.take_input(x);
        Ok((loss, gh, entries_of(layer, grads)))
    });
    res.or_raise()
}

#[pymethods]
impl PyHead {
    #[new]
    #[pyo3(signature = (split_vocab_size, split_order, hidden_size, dtype = None))]
    fn new(
        split_vocab_size: &Bound<'_, PyAny>,
        split_order: Vec<String>,
        hidden_size: i64,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let sizes = split_sizes(split_vocab_size)?;
        let h = positive(hidden_size, "hidden_size")?;
        let dt = match dtype {
            Some(d) => Dtype::parse(d)?,
            None => Dtype::F32,
        };
        let inner = match dt {
            Dtype::F32 => {
                Dt::F32(SplitLanguageModellingHead::new(&sizes, &split_order, h).or_raise()?)
            }
            Dtype::F64 => {
                Dt::F64(SplitLanguageModellingHead::new(&sizes, &split_order, h).or_raise()?)
            }
        };
        Ok(PyHead {
            inner,
            pools: Pools::default(),
        })
    }

    /// Every weight U(−1/√H, 1/√H) from splitgrad's seeded generator.
    fn reset_parameters(&mut self, seed: u64) {
        each!(&mut self.inner, l => l.reset_parameters(&mut Rng::new(seed)))
    }

    fn set_trainable(&mut self, split: &str, trainable: bool) -> PyResult<()> {
        each!(&mut self.inner, l => l.set_trainable(split, trainable).or_raise())
    }

    #[getter]
    fn split_order(&self) -> Vec<String> {
        each!(&self.inner, l => l.splits().split_order().to_vec())
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        each!(&self.inner, l => l.vocab_size())
    }

    #[getter]
    fn hidden_size(&self) -> usize {
        each!(&self.inner, l => l.hidden_size())
    }

    /// Per-token cross-entropy (the fused kernel): hidden (…, H), labels
    /// (…) → loss (…), 0 where the label is −100.
    fn forward<'py>(
        &self,
        py: Python<'py>,
        hidden: &Bound<'py, PyAny>,
        labels: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match &self.inner {
            Dt::F32(l) => head_forward(py, l, self.pools.of(), hidden, labels),
            Dt::F64(l) => head_forward(py, l, self.pools.of(), hidden, labels),
        }
    }

    /// The gradients of `Σ loss ⊙ grad_loss`: `(grad_hidden, Gradients)`
    /// (`grad_hidden` None when `hidden_grad` is false).
    #[pyo3(signature = (hidden, labels, grad_loss, hidden_grad = true))]
    fn backward<'py>(
        &self,
        py: Python<'py>,
        hidden: &Bound<'py, PyAny>,
        labels: &Bound<'py, PyAny>,
        grad_loss: &Bound<'py, PyAny>,
        hidden_grad: bool,
    ) -> PyResult<(Option<Bound<'py, PyAny>>, PyGradients)> {
        Ok(match &self.inner {
            Dt::F32(l) => {
                let (gh, e) = head_backward(
                    py,
                    l,
                    self.pools.of(),
                    hidden,
                    labels,
                    grad_loss,
                    hidden_grad,
                )?;
                (
                    gh.map(|a| to_numpy_pooled(py, a, self.pools.of()).map(|x| x.into_any()))
                        .transpose()?,
                    gradients_of(e, &self.pools),
                )
            }
            Dt::F64(l) => {
                let (gh, e) = head_backward(
                    py,
                    l,
                    self.pools.of(),
                    hidden,
                    labels,
                    grad_loss,
                    hidden_grad,
                )?;
                (
                    gh.map(|a| to_numpy_pooled(py, a, self.pools.of()).map(|x| x.into_any()))
                        .transpose()?,
                    gradients_of(e, &self.pools),
                )
            }
        })
    }

    /// `Σ_n loss_n` (the summed fused kernel), a float.
    fn forward_sum(
        &self,
        py: Python<'_>,
        hidden: &Bound<'_, PyAny>,
        labels: &Bound<'_, PyAny>,
    ) -> PyResult<f64> {
        each!(&self.inner, l => {
            let (loss, _, _) = head_sum_backward(py, l, self.pools.of(), hidden, labels, false, false)?;
            Ok(splitgrad::Real::to_f64(loss))
        })
    }

    /// `Σ_n loss_n` and its gradients in one pass (6·N·V·H flops):
    /// `(loss, grad_hidden, Gradients)`.
    #[pyo3(signature = (hidden, labels, hidden_grad = true))]
    fn forward_sum_backward<'py>(
        &self,
        py: Python<'py>,
        hidden: &Bound<'py, PyAny>,
        labels: &Bound<'py, PyAny>,
        hidden_grad: bool,
    ) -> PyResult<(f64, Option<Bound<'py, PyAny>>, PyGradients)> {
        Ok(match &self.inner {
            Dt::F32(l) => {
                let (loss, gh, e) =
                    head_sum_backward(py, l, self.pools.of(), hidden, labels, hidden_grad, true)?;
                (
                    loss as f64,
                    gh.map(|a| to_numpy_pooled(py, a, self.pools.of()).map(|x| x.into_any()))
                        .transpose()?,
                    gradients_of(e, &self.pools),
                )
            }
            Dt::F64(l) => {
                let (loss, gh, e) =
                    head_sum_backward(py, l, self.pools.of(), hidden, labels, hidden_grad, true)?;
                (
                    loss,
                    gh.map(|a| to_numpy_pooled(py, a, self.pools.of()).map(|x| x.into_any()))
                        .transpose()?,
                    gradients_of(e, &self.pools),
                )
            }
        })
    }
}

// ---------------------------------------------------------------------------
// SplitVocabulary

/// `SplitVocabulary(language_index, token_index, vocab_size, dim, n_languages, gate_init=0.0, dtype="float32")`;
/// `SplitVocabulary.from_npz(path, vocab_size, dim, n_languages, gate_init=0.0, dtype="float32")`.
#[pyclass(module = "splitgrad._splitgrad", name = "SplitVocabulary")]
pub struct PyVocabulary {
    pub inner: Dt<SplitVocabulary<f32>, SplitVocabulary<f64>>,
    pub(crate) pools: Pools,
}

module_methods!(PyVocabulary);

/// Builds the layer from ids that may be negative: a negative id is put
/// out of range for the crate's checks, which keep their order, and the
/// error then names the id as given.
fn vocab_new<T: PyReal>(
    languages: &[i64],
    tokens: &[i64],
    score: Option<Vec<f64>>,
    cfg: &SplitVocabularyConfig,
) -> splitgrad::Result<SplitVocabulary<T>> {
    let as_usize = |v: &[i64]| -> Vec<usize> {
        v.iter()
            .map(|&x| usize::try_from(x).unwrap_or(usize::MAX))
            .collect()
    };
    let mut index = SplitIndex::new(as_usize(languages), as_usize(tokens));
    index.score = score;
    SplitVocabulary::new(index, cfg).map_err(|e| match e.kind() {
        ErrorKind::OutOfRange {
            what,
            position,
            low,
            high,
            ..
        } => {
            let given = if what.starts_with("language") {
                languages
            } else {
                tokens
            };
            let value = given[position[0]];
            let array = e.array().map(str::to_string);
            let mut out = Error::out_of_range(what, position.clone(), value, *low, *high);
            if let Some(a) = array {
                out = out.in_array(a);
            }
            out
        }
        _ => e,
    })
}

/// Overwrites the rows in their own buffer with what `f` leaves in them.
fn keep_rows_buffer<T: PyReal>(
    sv: &mut SplitVocabulary<T>,
    f: impl FnOnce(&mut SplitVocabulary<T>) -> splitgrad::Result<()>,
) -> splitgrad::Result<()> {
    let copy = sv.rows().value().clone();
    let own = std::mem::replace(sv.rows_mut().value_mut(), copy);
    let r = f(sv);
    let new = std::mem::replace(sv.rows_mut().value_mut(), own);
    if r.is_ok() {
        sv.rows_mut().value_mut().assign(&new);
    }
    r
}

fn vocab_forward<'py, T: PyReal>(
    py: Python<'py>,
    sv: &SplitVocabulary<T>,
    pool: &Pool<T>,
    args: (&Bound<'py, PyAny>, &Bound<'py, PyAny>, &Bound<'py, PyAny>),
    use_gate: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let tokens = ids_arg(args.0, "token_ids")?;
    let langs = ids_arg(args.1, "language_ids")?;
    let shared = real_arg::<T>(args.2, "shared")?;
    let sv_ = std_layout(shared.as_array());
    if tokens.ndim() == 1 && langs.ndim() == 1 && sv_.ndim() == 2 {
        // One row per token: the layer's checks, in its order and words,
        // then the kernel straight into a pooled buffer (no copy of the
        // output; the same bits as the tape's op).
        if langs.shape() != tokens.shape() {
            return Err(py_err(Error::shape(
                "language_ids",
                format!("{:?} like token_ids", tokens.shape()),
                langs.shape(),
            )));
        }
        let (t, l) = (
            tokens.as_slice().expect("owned"),
            langs.as_slice().expect("owned"),
        );
        let row_of = sv.rows_of(t, l).or_raise()?;
        let want = [t.len(), sv.dim()];
        if sv_.shape() != want {
            return Err(py_err(Error::shape(
                "shared",
                format!("({}, {})", want[0], want[1]),
                sv_.shape(),
            )));
        }
        let out = py.detach(|| {
            let gate = use_gate.then(|| sv.gate());
            let s2 = sv_
                .view()
                .into_dimensionality::<ndarray::Ix2>()
                .expect("2-D");
            let r2 = sv
                .rows()
                .value()
                .view()
                .into_dimensionality::<ndarray::Ix2>()
                .expect("rows are 2-D");
            gated_mix_forward_in(
                pool,
                s2,
                r2,
                gate.as_ref().and_then(|g| g.as_slice()),
                &row_of,
            )
        });
        return Ok(to_numpy_pooled(py, out.into_dyn(), pool)?.into_any());
    }
    let out = py.detach(|| -> splitgrad::Result<ArrayD<T>> {
        let mut tape = Tape::no_grad_with_pool(pool);
        let s = tape.constant_view(sv_.view());
        let out = sv.forward(&mut tape, tokens.view(), langs.view(), s, use_gate)?;
        let mut buf = pool.zeros(tape.value(out).shape());
        buf.assign(&tape.value(out));
        Ok(buf)
    });
    Ok(to_numpy_pooled(py, out.or_raise()?, pool)?.into_any())
}

fn vocab_backward<T: PyReal>(
    py: Python<'_>,
    sv: &SplitVocabulary<T>,
    pool: &Pool<T>,
    args: (
        &Bound<'_, PyAny>,
        &Bound<'_, PyAny>,
        &Bound<'_, PyAny>,
        &Bound<'_, PyAny>,
    ),
    use_gate: bool,
    want_shared: bool,
) -> PyResult<HeadGrads<T>> {
    let tokens = ids_arg(args.0, "token_ids")?;
    let langs = ids_arg(args.1, "language_ids")?;
    let shared = real_arg::<T>(args.2, "shared")?;
    let g = real_arg::<T>(args.3, "grad_output")?;
    let s_ = std_layout(shared.as_array());
    let gv = g.as_array();
    let res = py.detach(|| -> splitgrad::Result<HeadGrads<T>> {
        let g = sv.backward_from(
            pool,
            tokens.view(),
            langs.view(),
            s_.view(),
            gv.view(),
            use_gate,
            want_shared,
        )?;
        let mut entries = Vec::new();
        if let Some(rs) = g.rows {
            entries.push(Entry {
                name: sv.rows().name().to_string(),
                id: sv.rows().id(),
                grad: ParamGrad::RowSparse(rs),
            });
        }
        if let Some(d) = g.gate_logit {
            entries.push(Entry {
                name: sv.gate_logit().name().to_string(),
                id: sv.gate_logit().id(),
                grad: ParamGrad::Dense(d),
            });
        }
        Ok((g.shared, entries))
    });
    res.or_raise()
}

/// The distances `fusion_norms` names, one per row, copied out of the
/// array (n_rows elements).
pub(crate) fn norms_arg<T: PyReal>(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<T>>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let a = real_arg::<T>(obj, "fusion_norms")?;
    if a.ndim() != 1 {
        return Err(py_err(
            Error::shape("fusion_norms", "(n_rows,)", a.shape()).in_array("fusion_norms"),
        ));
    }
    Ok(Some(a.as_array().iter().copied().collect()))
}

/// The gradients of `penalty_weight·penalty + fusion_weight·fusion_penalty`.
/// With `norms` (from `fusion_penalty_norms`, for the rows as they are),
/// the fusion penalty's backward runs without its forward pass.
pub(crate) fn vocab_penalty_backward<T: PyReal>(
    py: Python<'_>,
    sv: &SplitVocabulary<T>,
    pool: &Pool<T>,
    penalty_weight: f64,
    fusion_weight: f64,
    norms: Option<Vec<T>>,
) -> PyResult<Vec<Entry<T>>> {
    if !penalty_weight.is_finite() || !fusion_weight.is_finite() {
        return Err(PyValueError::new_err(format!(
            "the penalty weights must be finite, got {penalty_weight} and {fusion_weight}"
        )));
    }
    let res = py.detach(|| -> splitgrad::Result<Vec<Entry<T>>> {
        let mut tape = Tape::with_pool(pool);
        let mut terms = Vec::new();
        if penalty_weight != 0.0 {
            let p = sv.penalty_var(&mut tape);
            terms.push(tape.scale(p, T::from_f64(penalty_weight)));
        }
        let mut fusion_rows = None;
        if fusion_weight != 0.0 && sv.n_rows() > 0 {
            match &norms {
                Some(n) => {
                    fusion_rows =
                        Some(sv.fusion_penalty_grad(pool, n, T::from_f64(fusion_weight))?)
                }
                None => {
                    let f = sv.fusion_penalty_var(&mut tape);
                    terms.push(tape.scale(f, T::from_f64(fusion_weight)));
                }
            }
        }
        let mut entries = match terms.first().copied() {
            None => Vec::new(),
            Some(mut total) => {
                for &t in &terms[1..] {
                    total = tape.add(total, t);
                }
                entries_of(sv, tape.backward(total))
            }
        };
        if let Some(g) = fusion_rows {
            entries.push(Entry {
                name: sv.rows().name().to_string(),
                id: sv.rows().id(),
                grad: ParamGrad::Dense(g),
            });
        }
        Ok(entries)
    });
    res.or_raise()
}

#[pymethods]
impl PyVocabulary {
    #[new]
    #[pyo3(signature = (language_index, token_index, vocab_size, dim, n_languages, gate_init = 0.0, dtype = None, score = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        language_index: &Bound<'_, PyAny>,
        token_index: &Bound<'_, PyAny>,
        vocab_size: i64,
        dim: i64,
        n_languages: i64,
        gate_init: f64,
        dtype: Option<&Bound<'_, PyAny>>,
        score: Option<Vec<f64>>,
    ) -> PyResult<Self> {
        let l = ids_arg(language_index, "language_index")?;
        let t = ids_arg(token_index, "token_index")?;
        for (a, name) in [(&l, "language_index"), (&t, "token_index")] {
            if a.ndim() != 1 {
                return Err(py_err(
                    Error::shape(name, "(n_rows,)", a.shape()).in_array(name),
                ));
            }
        }
        let cfg = SplitVocabularyConfig {
            vocab_size: positive(vocab_size, "vocab_size")?,
            dim: positive(dim, "dim")?,
            n_languages: positive(n_languages, "n_languages")?,
            gate_init,
        };
        let (l, t) = (l.into_raw_vec_and_offset().0, t.into_raw_vec_and_offset().0);
        let dt = match dtype {
            Some(d) => Dtype::parse(d)?,
            None => Dtype::F32,
        };
        let inner = match dt {
            Dtype::F32 => Dt::F32(vocab_new(&l, &t, score, &cfg).or_raise()?),
            Dtype::F64 => Dt::F64(vocab_new(&l, &t, score, &cfg).or_raise()?),
        };
        Ok(PyVocabulary {
            inner,
            pools: Pools::default(),
        })
    }

    /// Reads the index from an `.npz` file (`language_index`,
    /// `token_index`, optional `score`).
    #[staticmethod]
    #[pyo3(signature = (path, vocab_size, dim, n_languages, gate_init = 0.0, dtype = None))]
    fn from_npz(
        path: std::path::PathBuf,
        vocab_size: i64,
        dim: i64,
        n_languages: i64,
        gate_init: f64,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let cfg = SplitVocabularyConfig {
            vocab_size: positive(vocab_size, "vocab_size")?,
            dim: positive(dim, "dim")?,
            n_languages: positive(n_languages, "n_languages")?,
            gate_init,
        };
        let dt = match dtype {
            Some(d) => Dtype::parse(d)?,
            None => Dtype::F32,
        };
        let inner = match dt {
            Dtype::F32 => Dt::F32(SplitVocabulary::from_npz(&path, &cfg).or_raise()?),
            Dtype::F64 => Dt::F64(SplitVocabulary::from_npz(&path, &cfg).or_raise()?),
        };
        Ok(PyVocabulary {
            inner,
            pools: Pools::default(),
        })
    }

    #[getter]
    fn n_rows(&self) -> usize {
        each!(&self.inner, l => l.n_rows())
    }
    #[getter]
    fn dim(&self) -> usize {
        each!(&self.inner, l => l.dim())
    }
    #[getter]
    fn vocab_size(&self) -> usize {
        each!(&self.inner, l => l.vocab_size())
    }
    #[getter]
    fn n_languages(&self) -> usize {
        each!(&self.inner, l => l.n_languages())
    }

    /// `(language_index, token_index)`, int64.
    fn index<'py>(&self, py: Python<'py>) -> (Bound<'py, PyAny>, Bound<'py, PyAny>) {
        let (l, t) = each!(&self.inner, s => {
            let i = s.index();
            (
                i.language_index.iter().map(|&x| x as i64).collect::<ndarray::Array1<i64>>(),
                i.token_index.iter().map(|&x| x as i64).collect::<ndarray::Array1<i64>>(),
            )
        });
        (to_numpy(py, l).into_any(), to_numpy(py, t).into_any())
    }

    /// The row of each (language, token) pair, −1 for none: token_ids and
    /// language_ids of one length.
    fn rows_of<'py>(
        &self,
        py: Python<'py>,
        token_ids: &Bound<'py, PyAny>,
        language_ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let t = ids_arg(token_ids, "token_ids")?;
        let l = ids_arg(language_ids, "language_ids")?;
        let (t, l) = (
            t.iter().copied().collect::<Vec<_>>(),
            l.iter().copied().collect::<Vec<_>>(),
        );
        let rows = each!(&self.inner, s => s.rows_of(&t, &l).or_raise()?);
        let rows: ndarray::Array1<i64> = rows
            .iter()
            .map(|&r| {
                if r == splitgrad::ops::gated_mix::NO_ROW {
                    -1
                } else {
                    r as i64
                }
            })
            .collect();
        Ok(to_numpy(py, rows).into_any())
    }

    /// `rows[i] = table[token_index[i]]`; table (V, D) of the layer's dtype.
    fn seed_from(&mut self, table: &Bound<'_, PyAny>) -> PyResult<()> {
        match &mut self.inner {
            Dt::F32(s) => {
                let t = real_arg::<f32>(table, "table")?;
                let tv = t.as_array();
                keep_rows_buffer(s, |s| s.seed_from(tv.view())).or_raise()
            }
            Dt::F64(s) => {
                let t = real_arg::<f64>(table, "table")?;
                let tv = t.as_array();
                keep_rows_buffer(s, |s| s.seed_from(tv.view())).or_raise()
            }
        }
    }

    /// σ(gate_logit), (n_rows).
    fn gate<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        each!(&self.inner, s => to_numpy(py, s.gate()).into_any())
    }

    /// mean(σ(gate_logit)).
    fn penalty(&self) -> f64 {
        each!(&self.inner, s => splitgrad::Real::to_f64(s.penalty()))
    }

    /// `(1/n_rows) Σ_i ‖rows_i − c(token_i)‖₂`.
    fn fusion_penalty(&self, py: Python<'_>) -> f64 {
        each!(&self.inner, s => py.detach(|| splitgrad::Real::to_f64(s.fusion_penalty())))
    }

    /// `(fusion_penalty, norms)`: the value and each row's distance from
    /// its token's centroid, (n_rows), which `penalty_backward` and
    /// `fused_step` take as `fusion_norms` to skip the forward pass.
    fn fusion_penalty_norms<'py>(&self, py: Python<'py>) -> (f64, Bound<'py, PyAny>) {
        each!(&self.inner, s => {
            let (v, n) = py.detach(|| s.fusion_penalty_norms());
            (splitgrad::Real::to_f64(v), to_numpy(py, n).into_any())
        })
    }

    /// token_ids (…), language_ids (…), shared (…, D) → (…, D).
    #[pyo3(signature = (token_ids, language_ids, shared, use_gate = true))]
    fn forward<'py>(
        &self,
        py: Python<'py>,
        token_ids: &Bound<'py, PyAny>,
        language_ids: &Bound<'py, PyAny>,
        shared: &Bound<'py, PyAny>,
        use_gate: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let args = (token_ids, language_ids, shared);
        match &self.inner {
            Dt::F32(s) => vocab_forward(py, s, self.pools.of(), args, use_gate),
            Dt::F64(s) => vocab_forward(py, s, self.pools.of(), args, use_gate),
        }
    }

    /// The gradients of `Σ out ⊙ grad_output`: `(grad_shared, Gradients)`
    /// of rows (row-sparse) and gate_logit.
    #[pyo3(signature = (token_ids, language_ids, shared, grad_output, use_gate = true, shared_grad = true))]
    #[allow(clippy::too_many_arguments)]
    fn backward<'py>(
        &self,
        py: Python<'py>,
        token_ids: &Bound<'py, PyAny>,
        language_ids: &Bound<'py, PyAny>,
        shared: &Bound<'py, PyAny>,
        grad_output: &Bound<'py, PyAny>,
        use_gate: bool,
        shared_grad: bool,
    ) -> PyResult<(Option<Bound<'py, PyAny>>, PyGradients)> {
        let args = (token_ids, language_ids, shared, grad_output);
        Ok(match &self.inner {
            Dt::F32(s) => {
                let (g, e) = vocab_backward(py, s, self.pools.of(), args, use_gate, shared_grad)?;
                (
                    g.map(|a| to_numpy_pooled(py, a, self.pools.of()).map(|x| x.into_any()))
                        .transpose()?,
                    gradients_of(e, &self.pools),
                )
            }
            Dt::F64(s) => {
                let (g, e) = vocab_backward(py, s, self.pools.of(), args, use_gate, shared_grad)?;
                (
                    g.map(|a| to_numpy_pooled(py, a, self.pools.of()).map(|x| x.into_any()))
                        .transpose()?,
                    gradients_of(e, &self.pools),
                )
            }
        })
    }

    /// The gradients of `penalty_weight·penalty + fusion_weight·fusion_penalty`.
    /// `fusion_norms`: the distances `fusion_penalty_norms` returned for
    /// the rows as they still are; the backward then skips the fusion
    /// penalty's forward pass (distances of other rows give a wrong
    /// gradient).
    #[pyo3(signature = (penalty_weight = 1.0, fusion_weight = 1.0, fusion_norms = None))]
    fn penalty_backward(
        &self,
        py: Python<'_>,
        penalty_weight: f64,
        fusion_weight: f64,
        fusion_norms: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyGradients> {
        Ok(each!(&self.inner, s => gradients_of(
            vocab_penalty_backward(
                py,
                s,
                self.pools.of(),
                penalty_weight,
                fusion_weight,
                norms_arg(fusion_norms)?,
            )?,
            &self.pools,
        )))
    }
}
