//! What the three layer classes share: a value of either real type
//! ([`ByDtype`]), the layers' workspaces, the class macros (the struct,
//! its dtype, parameters and state dicts; the constructor and getters of
//! the two split layers), and a layer borrowed from Python ([`LayerRef`]).
//!
//! Parameters by name, their numpy views and their dtype: [`crate::params`].

use std::any::Any;

use ndarray::ArrayViewD;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyAny;
use splitgrad::layers::{
    SplitLanguageModellingHead, SplitTokenEmbeddings, SplitVocabulary, Workspace,
};
use splitgrad::state::Module;

use crate::convert::{Dtype, PyReal};
use crate::embeddings::PyEmbeddings;
use crate::head::PyHead;
use crate::vocabulary::PyVocabulary;

/// One value per real type.
pub enum ByDtype<A, B> {
    F32(A),
    F64(B),
}

impl<A, B> ByDtype<A, B> {
    /// Which real type the value is of.
    pub fn dtype(&self) -> Dtype {
        match self {
            ByDtype::F32(_) => Dtype::F32,
            ByDtype::F64(_) => Dtype::F64,
        }
    }
}

impl<A: 'static, B: 'static> ByDtype<A, B> {
    /// The value if it is an `X` (`A` or `B`: a generic caller's own type,
    /// such as `HeadSaved<T>` for `ByDtype<HeadSaved<f32>, HeadSaved<f64>>`).
    pub fn get<X: 'static>(&self) -> Option<&X> {
        crate::each!(self, v => (v as &dyn Any).downcast_ref())
    }

    /// [`Self::get`], mutably.
    pub fn get_mut<X: 'static>(&mut self) -> Option<&mut X> {
        crate::each!(self, v => (v as &mut dyn Any).downcast_mut())
    }

    /// `x` in its slot.
    ///
    /// **Panics** if `X` is neither `A` nor `B`.
    pub fn new<X: 'static>(x: X) -> Self {
        let mut x = Some(x);
        let any = &mut x as &mut dyn Any;
        if let Some(a) = any.downcast_mut::<Option<A>>() {
            return ByDtype::F32(a.take().expect("just put"));
        }
        match any.downcast_mut::<Option<B>>() {
            Some(b) => ByDtype::F64(b.take().expect("just put")),
            None => unreachable!("a value of neither real type"),
        }
    }
}

/// Runs `$body` with `$l` bound to the f32 or the f64 value of a [`ByDtype`].
#[macro_export]
macro_rules! each {
    ($inner:expr, $l:ident => $body:expr) => {
        match $inner {
            $crate::layer::ByDtype::F32($l) => $body,
            $crate::layer::ByDtype::F64($l) => $body,
        }
    };
}

/// `$body` with the type `$t` naming f32 or f64 as `$dtype` says, in its
/// [`ByDtype`] slot.
#[macro_export]
macro_rules! by_dtype {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            $crate::convert::Dtype::F32 => {
                type $t = f32;
                $crate::layer::ByDtype::F32($body)
            }
            $crate::convert::Dtype::F64 => {
                type $t = f64;
                $crate::layer::ByDtype::F64($body)
            }
        }
    };
}

/// A layer's workspaces (the crate's scratch buffers), one per real type:
/// its outputs and gradients come from them and go back to them.
#[derive(Clone, Default)]
pub struct Workspaces {
    pub(crate) f32: Workspace<f32>,
    pub(crate) f64: Workspace<f64>,
    /// Half-precision outputs (`crate::halfio`).
    pub(crate) bits: crate::halfio::Kept<u16>,
    /// Half-precision inputs widened.
    pub(crate) wide32: crate::halfio::Kept<f32>,
    pub(crate) wide64: crate::halfio::Kept<f64>,
}

impl Workspaces {
    /// The workspace of `T`.
    pub fn of<T: PyReal>(&self) -> &Workspace<T> {
        T::workspace(self)
    }
}

/// A layer's modules of either real type, borrowed mutably.
pub type Modules<'a> = ByDtype<&'a mut dyn Module<f32>, &'a mut dyn Module<f64>>;

/// The `dtype` argument, `default` when not given.
pub fn dtype_arg(dtype: Option<&Bound<'_, PyAny>>, default: Dtype) -> PyResult<Dtype> {
    dtype.map_or(Ok(default), Dtype::parse)
}

/// `{name: size}` or `[(name, size)]`, every size ≥ 0.
pub fn split_sizes(obj: &Bound<'_, PyAny>) -> PyResult<Vec<(String, usize)>> {
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

/// A size argument, ≥ 0.
pub fn positive(x: i64, what: &str) -> PyResult<usize> {
    usize::try_from(x).map_err(|_| PyValueError::new_err(format!("{what} must be ≥ 0, got {x}")))
}

/// A standard-layout view (a copy only when the input is strided, checked
/// against the memory available first: a broadcast view may stand for far
/// more elements than it holds).
pub fn std_layout<'a, T: Clone>(
    a: ArrayViewD<'a, T>,
    what: &str,
) -> PyResult<ndarray::CowArray<'a, T, ndarray::IxDyn>> {
    if a.is_standard_layout() {
        return Ok(ndarray::CowArray::from(a));
    }
    crate::convert::check_alloc(
        || {
            format!(
                "a contiguous copy of array `{what}` (shape {:?})",
                a.shape()
            )
        },
        crate::convert::bytes_for(a.shape(), std::mem::size_of::<T>()),
    )?;
    Ok(ndarray::CowArray::from(a.as_standard_layout().into_owned()))
}

/// Refuses an output (or gradient) of `dims` elements of `T` that would
/// not fit in the memory available, before a kernel allocates it; with
/// `act`, its copy narrowed to that half type counts too (both are held
/// while it is made).
pub fn check_output<T>(
    what: &str,
    dims: &[usize],
    act: Option<crate::halfio::Act>,
) -> PyResult<()> {
    let wide = std::mem::size_of::<T>();
    let (elem, kind) = match act {
        None => (wide, std::any::type_name::<T>().to_string()),
        Some(a) => (
            wide + 2,
            format!("{}, then {}", std::any::type_name::<T>(), a.short()),
        ),
    };
    check_output_bytes(what, dims, elem, &kind)
}

/// Refuses an output of `dims` elements of `elem` bytes each (`kind`
/// naming them) that would not fit in the memory available.
pub fn check_output_bytes(what: &str, dims: &[usize], elem: usize, kind: &str) -> PyResult<()> {
    crate::convert::check_alloc(
        || format!("{what} (shape {dims:?}, {kind})"),
        crate::convert::bytes_for(dims, elem),
    )
}

/// A layer class `$py` (Python name `$name`) over the crate's `$layer`:
/// the struct (the layer of either real type behind its lock, and its
/// workspaces) and the methods every layer has — dtype, parameters,
/// freezing, state dicts.
macro_rules! layer_class {
    ($(#[$doc:meta])* $py:ident, $name:literal, $layer:ident) => {
        $(#[$doc])*
        #[pyclass(module = "splitgrad._splitgrad", name = $name, frozen)]
        pub struct $py {
            /// The layer; forwards and backwards share the read lock,
            /// what changes it takes the write lock (`crate::sync`).
            pub(crate) inner: std::sync::RwLock<$crate::layer::ByDtype<$layer<f32>, $layer<f64>>>,
            pub(crate) ws: $crate::layer::Workspaces,
            /// The layer's real type (never changes).
            pub(crate) dt: $crate::convert::Dtype,
            /// Held by every numpy view of a parameter: the buffers a
            /// change of dtype retired while such a view lived.
            pub(crate) keep: std::sync::Mutex<$crate::params::Keep>,
        }

        impl $py {
            fn of(inner: $crate::layer::ByDtype<$layer<f32>, $layer<f64>>) -> Self {
                $py {
                    dt: inner.dtype(),
                    inner: std::sync::RwLock::new(inner),
                    ws: $crate::layer::Workspaces::default(),
                    keep: std::sync::Mutex::new($crate::params::Keep::default()),
                }
            }

            /// The layer, shared with other readers.
            pub(crate) fn read(
                &self,
                py: Python<'_>,
            ) -> PyResult<std::sync::RwLockReadGuard<'_, $crate::layer::ByDtype<$layer<f32>, $layer<f64>>>> {
                $crate::sync::read(py, &self.inner, $name)
            }

            /// The layer, alone.
            pub(crate) fn write(
                &self,
                py: Python<'_>,
            ) -> PyResult<std::sync::RwLockWriteGuard<'_, $crate::layer::ByDtype<$layer<f32>, $layer<f64>>>> {
                $crate::sync::write(py, &self.inner, $name)
            }
        }

        #[pymethods]
        impl $py {
            /// numpy's name of the layer's real type.
            #[getter]
            fn dtype(&self) -> &'static str {
                self.dt.name()
            }

            /// The parameters' names, in order.
            fn parameter_names(&self, py: Python<'_>) -> PyResult<Vec<String>> {
                Ok($crate::each!(&*self.read(py)?, l => l.parameters().iter().map(|p| p.name().to_string()).collect()))
            }

            /// A parameter as a writable numpy view of the layer's own
            /// buffer (no copy; the layer lives as long as the view).
            fn parameter<'py>(slf: Bound<'py, Self>, name: &str) -> PyResult<Bound<'py, PyAny>> {
                let any = slf.clone().into_any();
                let this = slf.get();
                let inner = this.read(slf.py())?;
                let keep = this.keep.lock().unwrap_or_else(|e| e.into_inner()).clone();
                $crate::each!(&*inner, l => $crate::params::parameter_view(&any, l, &keep, name))
            }

            /// How the parameters are kept: `"float32"`, `"float64"`,
            /// `"bfloat16"` or `"float16"` (the math runs in `dtype`).
            #[getter]
            fn param_dtype(&self, py: Python<'_>) -> PyResult<String> {
                let d = $crate::each!(&*self.read(py)?, l => l.parameters().first().map(|p| p.dtype()));
                Ok($crate::params::numpy_name(d.unwrap_or(match self.dt {
                    $crate::convert::Dtype::F32 => splitgrad::param::Dtype::F32,
                    $crate::convert::Dtype::F64 => splitgrad::param::Dtype::F64,
                })).to_string())
            }

            /// The bytes the parameters' values take, as they are kept.
            #[getter]
            fn parameter_bytes(&self, py: Python<'_>) -> PyResult<u64> {
                Ok($crate::each!(&*self.read(py)?, l => l.parameter_bytes()))
            }

            /// Keeps every parameter as `dtype` from now on: bfloat16 or
            /// float16 (rounded to nearest; the math stays in the layer's
            /// `dtype`), or the layer's own `dtype` to widen back. The
            /// changed parameters get new buffers: views taken before are
            /// stale (take them again).
            fn set_dtype(&self, py: Python<'_>, dtype: &Bound<'_, PyAny>) -> PyResult<()> {
                let d = $crate::params::storage_dtype(dtype)?;
                let mut inner = self.write(py)?;
                let mut keep = self.keep.lock().unwrap_or_else(|e| e.into_inner());
                let viewed = std::sync::Arc::strong_count(&keep) > 1;
                let k = viewed.then_some(&*keep);
                $crate::each!(&mut *inner, l => $crate::params::set_module_dtype(l, d, k))?;
                if viewed {
                    *keep = $crate::params::Keep::default();
                }
                Ok(())
            }

            /// `[(name, view)]` for every parameter, in order.
            fn named_parameters<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, pyo3::types::PyList>> {
                let py = slf.py();
                let names = slf.get().parameter_names(py)?;
                let out = pyo3::types::PyList::empty(py);
                for n in names {
                    let v = Self::parameter(slf.clone(), &n)?;
                    out.append((n, v))?;
                }
                Ok(out)
            }

            /// Whether a parameter is trained (receives gradients).
            fn is_trainable(&self, py: Python<'_>, name: &str) -> PyResult<bool> {
                $crate::each!(&*self.read(py)?, l => $crate::params::param(l, name).map(|p| p.is_trainable()))
            }

            /// Freezes (`False`) or unfreezes a parameter by its name.
            fn set_parameter_trainable(&self, py: Python<'_>, name: &str, trainable: bool) -> PyResult<()> {
                $crate::each!(&mut *self.write(py)?, l => $crate::params::set_trainable(l, name, trainable))
            }

            /// Keys the stochastic roundings of parameter `name`'s updates (and
            /// its moments') by its rows' places `rows` in a larger table of the
            /// same name (one integer per row, distinct, ≥ 0): what a sharded
            /// layer gives each part, so that it rounds as the whole table
            /// would. `None`: its own rows again.
            #[pyo3(signature = (name, rows))]
            fn set_rounding_rows(&self, py: Python<'_>, name: &str, rows: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
                let rows = rows.map(|r| $crate::params::rounding_rows(r)).transpose()?;
                $crate::each!(&mut *self.write(py)?, l => $crate::params::set_rounding_rows(l, name, rows))
            }

            /// The rounding rows of parameter `name` ([`Self::set_rounding_rows`])
            /// as an int64 array, or `None` when it rounds by its own rows.
            fn rounding_rows<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Option<Bound<'py, numpy::PyArray1<i64>>>> {
                let rows: Option<Vec<i64>> = $crate::each!(&*self.read(py)?, l => $crate::params::param(l, name)
                    .map(|p| p.rounding_rows().map(|r| r.iter().map(|&x| x as i64).collect())))?;
                Ok(rows.map(|r| numpy::PyArray1::from_vec(py, r)))
            }

            /// Every parameter and buffer by name, copied.
            fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
                let inner = self.read(py)?;
                $crate::each!(&*inner, l => $crate::convert::check_state_copy(
                    || "the state dict's copy".to_string(),
                    l.state_refs().iter().map(|(_, t)| $crate::convert::tensor_bytes(t)),
                ))?;
                let sd = $crate::each!(&*inner, l => l.state_dict());
                drop(inner);
                $crate::convert::state_to_py(py, sd)
            }

            /// Loads every parameter by name, in place, after checking every
            /// tensor (dtype, shape, finiteness; a split vocabulary's index);
            /// on an error nothing is changed. Names of other modules are
            /// ignored. A whole load also clears the poison a panic left.
            fn load_state_dict(&self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
                let sd = $crate::convert::state_from_py(state)?;
                let (mut inner, was_poisoned) = match $crate::sync::write_any(py, &self.inner) {
                    Ok(g) => (g, false),
                    Err(g) => (g, true),
                };
                $crate::each!(&mut *inner, l => l.load_state_dict(&sd).or_raise())?;
                if was_poisoned {
                    self.inner.clear_poison();
                }
                Ok(())
            }
        }
    };
}
pub(crate) use layer_class;

/// Getters of sizes: `#[getter] fn $name(&self) -> usize` from the
/// layer's method of that name.
macro_rules! size_getters {
    ($py:ident: $($name:ident),+) => {
        #[pymethods]
        impl $py {
            $(
                #[getter]
                fn $name(&self, py: Python<'_>) -> PyResult<usize> {
                    Ok($crate::each!(&*self.read(py)?, l => l.$name()))
                }
            )+
        }
    };
}
pub(crate) use size_getters;

/// The constructor, initialisation (`$reset`, its doc) and getters the
/// two split layers share:
/// `$py(split_vocab_size, split_order, hidden_size, dtype="float32")`.
macro_rules! split_layer_methods {
    ($py:ident, $layer:ident, $reset:literal) => {
        $crate::layer::size_getters!($py: vocab_size, hidden_size);

        #[pymethods]
        impl $py {
            /// `storage`: how the tables are kept (bfloat16 or float16, or
            /// the layer's `dtype`, the default); half-precision tables are
            /// allocated as such and never pass through the layer's dtype.
            #[new]
            #[pyo3(signature = (split_vocab_size, split_order, hidden_size, dtype = None, storage = None))]
            fn new(
                split_vocab_size: &Bound<'_, PyAny>,
                split_order: Vec<String>,
                hidden_size: i64,
                dtype: Option<&Bound<'_, PyAny>>,
                storage: Option<&Bound<'_, PyAny>>,
            ) -> PyResult<Self> {
                let sizes = $crate::layer::split_sizes(split_vocab_size)?;
                let h = $crate::layer::positive(hidden_size, "hidden_size")?;
                let dt = $crate::layer::dtype_arg(dtype, $crate::convert::Dtype::F32)?;
                let kept = storage.map($crate::params::storage_dtype).transpose()?;
                Ok(Self::of($crate::by_dtype!(dt, T => match kept {
                    Some(d) => $layer::<T>::with_dtype(&sizes, &split_order, h, d),
                    None => $layer::<T>::new(&sizes, &split_order, h),
                }
                .or_raise()?)))
            }

            #[doc = $reset]
            fn reset_parameters(&self, py: Python<'_>, seed: u64) -> PyResult<()> {
                let mut inner = self.write(py)?;
                $crate::each!(&mut *inner, l => py.detach(|| l.reset_parameters(&mut splitgrad::Rng::new(seed))));
                Ok(())
            }

            /// Freezes (`False`) or unfreezes a split.
            fn set_trainable(&self, py: Python<'_>, split: &str, trainable: bool) -> PyResult<()> {
                $crate::each!(&mut *self.write(py)?, l => l.set_trainable(split, trainable).or_raise())
            }

            #[getter]
            fn split_order(&self, py: Python<'_>) -> PyResult<Vec<String>> {
                Ok($crate::each!(&*self.read(py)?, l => l.splits().split_order().to_vec()))
            }
        }
    };
}
pub(crate) use split_layer_methods;

/// A layer given from Python (a numpy-level layer, or a `splitgrad.torch`
/// module through its `_core`), not yet locked.
pub enum LayerObj<'py> {
    Embeddings(Bound<'py, PyEmbeddings>),
    Head(Bound<'py, PyHead>),
    Vocabulary(Bound<'py, PyVocabulary>),
}

impl LayerObj<'_> {
    fn as_ptr(&self) -> *mut pyo3::ffi::PyObject {
        match self {
            LayerObj::Embeddings(b) => b.as_ptr(),
            LayerObj::Head(b) => b.as_ptr(),
            LayerObj::Vocabulary(b) => b.as_ptr(),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            LayerObj::Embeddings(_) => "SplitTokenEmbeddings",
            LayerObj::Head(_) => "SplitLanguageModellingHead",
            LayerObj::Vocabulary(_) => "SplitVocabulary",
        }
    }

    /// The layer's real type.
    pub fn dtype(&self) -> Dtype {
        match self {
            LayerObj::Embeddings(b) => b.get().dt,
            LayerObj::Head(b) => b.get().dt,
            LayerObj::Vocabulary(b) => b.get().dt,
        }
    }

    fn lock(&self, py: Python<'_>) -> PyResult<LayerRef<'_>> {
        Ok(match self {
            LayerObj::Embeddings(b) => {
                let l = b.get();
                LayerRef::new(LayerGuard::Embeddings(l.write(py)?), &l.ws)
            }
            LayerObj::Head(b) => {
                let l = b.get();
                LayerRef::new(LayerGuard::Head(l.write(py)?), &l.ws)
            }
            LayerObj::Vocabulary(b) => {
                let l = b.get();
                LayerRef::new(LayerGuard::Vocabulary(l.write(py)?), &l.ws)
            }
        })
    }
}

type Locked<'a, A, B> = std::sync::RwLockWriteGuard<'a, ByDtype<A, B>>;

/// A layer's write lock.
pub enum LayerGuard<'a> {
    Embeddings(Locked<'a, SplitTokenEmbeddings<f32>, SplitTokenEmbeddings<f64>>),
    Head(Locked<'a, SplitLanguageModellingHead<f32>, SplitLanguageModellingHead<f64>>),
    Vocabulary(Locked<'a, SplitVocabulary<f32>, SplitVocabulary<f64>>),
}

/// A layer locked for writing, with its workspaces.
pub struct LayerRef<'a> {
    guard: LayerGuard<'a>,
    ws: &'a Workspaces,
}

/// A layer of either real type as a module.
pub fn modules_of<A: Module<f32>, B: Module<f64>>(x: &mut ByDtype<A, B>) -> Modules<'_> {
    match x {
        ByDtype::F32(l) => ByDtype::F32(l),
        ByDtype::F64(l) => ByDtype::F64(l),
    }
}

impl<'a> LayerRef<'a> {
    fn new(guard: LayerGuard<'a>, ws: &'a Workspaces) -> Self {
        LayerRef { guard, ws }
    }

    /// The layer's real type.
    pub fn dtype(&self) -> Dtype {
        match &self.guard {
            LayerGuard::Embeddings(r) => r.dtype(),
            LayerGuard::Head(r) => r.dtype(),
            LayerGuard::Vocabulary(r) => r.dtype(),
        }
    }

    /// The layer as a module of its real type.
    pub fn modules(&mut self) -> Modules<'_> {
        match &mut self.guard {
            LayerGuard::Embeddings(r) => modules_of(&mut **r),
            LayerGuard::Head(r) => modules_of(&mut **r),
            LayerGuard::Vocabulary(r) => modules_of(&mut **r),
        }
    }

    /// The layer as a module of `T`, `None` when it is of the other type.
    pub fn module<T: PyReal>(&mut self) -> Option<&mut dyn Module<T>> {
        T::module(self.modules())
    }

    /// The layer's workspaces.
    pub fn workspaces(&self) -> Workspaces {
        self.ws.clone()
    }
}

fn one_layer<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Option<LayerObj<'py>>> {
    let obj = if obj.hasattr("_core")? {
        obj.getattr("_core")?
    } else {
        obj.clone()
    };
    if let Ok(r) = obj.extract::<Bound<'py, PyEmbeddings>>() {
        return Ok(Some(LayerObj::Embeddings(r)));
    }
    if let Ok(r) = obj.extract::<Bound<'py, PyHead>>() {
        return Ok(Some(LayerObj::Head(r)));
    }
    if let Ok(r) = obj.extract::<Bound<'py, PyVocabulary>>() {
        return Ok(Some(LayerObj::Vocabulary(r)));
    }
    Ok(None)
}

/// One layer, or a list or tuple of layers (not yet locked: see
/// [`lock_layers`]).
pub fn layers_of<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Vec<LayerObj<'py>>> {
    if let Some(m) = one_layer(obj)? {
        return Ok(vec![m]);
    }
    let mut out = Vec::new();
    for item in obj.try_iter().map_err(|_| not_a_layer(obj))? {
        let item = item?;
        match one_layer(&item)? {
            Some(m) => out.push(m),
            None => return Err(not_a_layer(&item)),
        }
    }
    Ok(out)
}

/// The write locks of `layers`, taken in the order of their addresses
/// (one order for every call, so two calls never wait for each other's
/// locks), returned in the order given. A layer given twice is an error
/// (it would wait for itself).
pub fn lock_layers<'a>(py: Python<'_>, layers: &'a [LayerObj<'_>]) -> PyResult<Vec<LayerRef<'a>>> {
    let mut order: Vec<usize> = (0..layers.len()).collect();
    order.sort_by_key(|&i| layers[i].as_ptr() as usize);
    for w in order.windows(2) {
        if layers[w[0]].as_ptr() == layers[w[1]].as_ptr() {
            return Err(PyValueError::new_err(format!(
                "the same {} is given twice (at positions {} and {})",
                layers[w[0]].name(),
                w[0].min(w[1]),
                w[0].max(w[1])
            )));
        }
    }
    let mut slots: Vec<Option<LayerRef<'a>>> = (0..layers.len()).map(|_| None).collect();
    for i in order {
        slots[i] = Some(layers[i].lock(py)?);
    }
    Ok(slots
        .into_iter()
        .map(|s| s.expect("every layer locked"))
        .collect())
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

/// The layers as modules of `T` (`dt`, the optimiser's or the first
/// layer's type); a layer of the other type is an error.
pub fn typed<'a, T: PyReal>(
    layers: &'a mut [LayerRef<'_>],
    dt: Dtype,
) -> PyResult<Vec<&'a mut dyn Module<T>>> {
    let mut out = Vec::new();
    for m in layers.iter_mut() {
        let mdt = m.dtype();
        match m.module::<T>() {
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
