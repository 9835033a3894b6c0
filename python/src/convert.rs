//! Errors, dtypes, arrays and state dicts between Python and the crate.
//!
//! Every argument from Python is checked here or by the crate before any
//! kernel sees it: a bad id, shape or dtype raises `ValueError`, a file
//! that cannot be read `OSError`, each with the crate's one-line message.

use ndarray::{ArrayD, ArrayViewD};
use numpy::{Element, PyArrayDyn, PyReadonlyArrayDyn};
use pyo3::exceptions::{PyFloatingPointError, PyMemoryError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyAny, PyDict};
use splitgrad::layers::{NamedGrad, Workspace};
use splitgrad::state::{Module, StateDict, TensorData};
use splitgrad::{Error, ErrorKind, Real};

use crate::gradients::GradsByDtype;
use crate::layer::{ByDtype, Modules, Workspaces};

/// The crate's error as the Python exception of its kind, with its message.
pub fn py_err(e: Error) -> PyErr {
    let msg = e.to_string();
    match e.kind() {
        ErrorKind::Io(_) => PyOSError::new_err(msg),
        ErrorKind::Diverged { .. } => PyFloatingPointError::new_err(msg),
        // A size no machine holds (it overflows the address space) is a
        // bad argument; one beyond this machine's memory is a MemoryError.
        ErrorKind::TooLarge { bytes, .. } if *bytes > isize::MAX as u64 => {
            PyValueError::new_err(msg)
        }
        ErrorKind::TooLarge { .. } => PyMemoryError::new_err(msg),
        _ => PyValueError::new_err(msg),
    }
}

/// Refuses, before it is made, an allocation of `bytes` (`u64::MAX`: one
/// that overflows) beyond the memory available (`MemoryError`) or beyond
/// any address space (`ValueError`), naming `what` and its size.
pub fn check_alloc(what: impl FnOnce() -> String, bytes: u64) -> PyResult<()> {
    splitgrad::io::check_memory(what, bytes, "").map_err(py_err)
}

/// Refuses, before it is made, the copy of a state handed to Python whose
/// tensors are `tensors` (each tensor's bytes and whether it is in half
/// precision, which is handed over through one more copy, of its bits):
/// `MemoryError` where the memory available would not hold it, instead of
/// an allocation that fails and aborts the process.
pub fn check_state_copy(
    what: impl FnOnce() -> String,
    tensors: impl IntoIterator<Item = (u64, bool)>,
) -> PyResult<()> {
    let (mut total, mut half) = (0u64, 0u64);
    for (bytes, is_half) in tensors {
        total = total.saturating_add(bytes);
        if is_half {
            half = half.max(bytes);
        }
    }
    check_alloc(what, total.saturating_add(half))
}

/// A named tensor's bytes, and whether it is in half precision, for
/// [`check_state_copy`].
pub fn tensor_bytes(t: &splitgrad::state::TensorRef<'_>) -> (u64, bool) {
    // Anything else (a step count, an index) is 8 bytes an element.
    let kept = splitgrad::param::Dtype::from_safetensors(t.dtype());
    let size = kept.map_or(8, splitgrad::param::Dtype::size);
    (
        bytes_for(t.shape(), size),
        kept.is_some_and(|d| d.is_half()),
    )
}

/// The bytes of `n` elements of `elem` bytes each (`u64::MAX` on overflow).
pub fn bytes_for(n: &[usize], elem: usize) -> u64 {
    let mut f: Vec<u64> = n.iter().map(|&x| x as u64).collect();
    f.push(elem as u64);
    splitgrad::io::bytes_of(&f)
}

/// An owned copy of a view. ndarray's `to_owned` asserts on an empty view
/// with the strides numpy gives some empty arrays; an empty array needs no
/// copy of anything.
pub fn owned<T: Clone>(v: ArrayViewD<'_, T>) -> ArrayD<T> {
    if v.is_empty() {
        return ArrayD::from_shape_vec(v.raw_dim(), Vec::new()).expect("an empty shape");
    }
    v.to_owned()
}

/// `Result<T, Error>` → `PyResult<T>`.
pub trait OrRaise<T> {
    /// Raises the error as its Python exception.
    fn or_raise(self) -> PyResult<T>;
}

impl<T> OrRaise<T> for splitgrad::Result<T> {
    fn or_raise(self) -> PyResult<T> {
        self.map_err(py_err)
    }
}

/// The real type of a layer or an optimiser.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F64,
}

impl Dtype {
    /// numpy's name.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "float32",
            Dtype::F64 => "float64",
        }
    }

    /// `"float32"`, `"float64"`, `numpy.float32`, `numpy.dtype("f8")`, a
    /// torch dtype: anything `numpy.dtype` takes or whose `str` ends in
    /// `float32` / `float64`.
    pub fn parse(obj: &Bound<'_, PyAny>) -> PyResult<Dtype> {
        let py = obj.py();
        let np = py.import("numpy")?;
        let name: String = match np.call_method1("dtype", (obj,)) {
            Ok(d) => d.getattr("name")?.extract()?,
            Err(_) => obj.str()?.to_string(),
        };
        let name = name.rsplit('.').next().unwrap_or("").to_string();
        match name.as_str() {
            "float32" | "f32" => Ok(Dtype::F32),
            "float64" | "f64" => Ok(Dtype::F64),
            other => Err(PyValueError::new_err(format!(
                "dtype must be float32 or float64, got {other}"
            ))),
        }
    }
}

fn numpy_array<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    obj.py().import("numpy")?.call_method1("asarray", (obj,))
}

fn dtype_name(arr: &Bound<'_, PyAny>) -> PyResult<String> {
    arr.getattr("dtype")?.getattr("name")?.extract()
}

/// Integer ids (or labels, language ids) of any integer dtype and any
/// shape, as an owned `i64` array. Anything that is not an integer array
/// (floats, booleans, strings) is a `ValueError` naming `what`.
pub fn ids_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<ArrayD<i64>> {
    let ids_bytes = |n: usize, copies: usize| {
        check_alloc(
            || format!("array `{what}` ({n} ids) read as int64"),
            bytes_for(&[n, copies], 8),
        )
    };
    if let Ok(a) = obj.extract::<PyReadonlyArrayDyn<'_, i64>>() {
        ids_bytes(a.as_array().len(), 1)?;
        return Ok(owned(a.as_array()));
    }
    let arr = numpy_array(obj)?;
    let kind: String = arr.getattr("dtype")?.getattr("kind")?.extract()?;
    let size: usize = arr.getattr("size")?.extract()?;
    ids_bytes(size, 2)?; // numpy's int64 copy, then ours
    if kind != "i" && kind != "u" && size > 0 {
        return Err(PyValueError::new_err(format!(
            "array `{what}`: has dtype {}, expected an integer dtype (int8 … int64, uint8 … uint64)",
            dtype_name(&arr)?
        )));
    }
    if kind == "u" {
        let max: u64 = arr
            .call_method0("max")
            .and_then(|m| m.extract())
            .unwrap_or(0);
        if max > i64::MAX as u64 {
            return Err(PyValueError::new_err(format!(
                "array `{what}`: value {max} does not fit in int64"
            )));
        }
    }
    let a = arr.call_method1("astype", ("int64",))?;
    let a = a.extract::<PyReadonlyArrayDyn<'_, i64>>()?;
    Ok(owned(a.as_array()))
}

/// A real array of exactly the layer's dtype, borrowed (zero-copy). A
/// numpy array of another dtype is a `ValueError` (no silent conversion);
/// a Python list or scalar is converted to the dtype.
pub fn real_arg<'py, T: Real + Element>(
    obj: &Bound<'py, PyAny>,
    what: &str,
) -> PyResult<PyReadonlyArrayDyn<'py, T>> {
    if let Ok(a) = obj.extract::<PyReadonlyArrayDyn<'py, T>>() {
        return Ok(a);
    }
    let py = obj.py();
    let np = py.import("numpy")?;
    let is_array = obj.is_instance(&np.getattr("ndarray")?)?;
    if is_array {
        return Err(PyValueError::new_err(format!(
            "array `{what}`: has dtype {}, expected {}",
            dtype_name(obj)?,
            dtype_of::<T>().name()
        )));
    }
    let arr = np.call_method1("asarray", (obj, dtype_of::<T>().name()))?;
    arr.extract::<PyReadonlyArrayDyn<'py, T>>()
}

/// The [`Dtype`] of `T`.
pub fn dtype_of<T: Real>() -> Dtype {
    if T::NAME == "f32" {
        Dtype::F32
    } else {
        Dtype::F64
    }
}

/// An owned array that goes back to a buffer pool when numpy is done with
/// it: the base object of the arrays the layers return, so that a training
/// loop reuses one allocation per output instead of faulting in fresh pages
/// every step.
#[pyclass(module = "splitgrad._splitgrad", name = "_PooledBuffer", frozen)]
pub struct PooledBuffer {
    inner: std::sync::Mutex<Pooled>,
}

type Pooled = ByDtype<(Option<ArrayD<f32>>, Workspace<f32>), (Option<ArrayD<f64>>, Workspace<f64>)>;

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
        crate::each!(inner, slot => {
            if let Some(a) = slot.0.take() {
                slot.1.give(a)
            }
        })
    }
}

/// The element types the bindings move between numpy and the crate, and
/// their slots in the values of either type.
pub trait PyReal: Real + Element {
    /// Wraps an array and its workspace for [`PooledBuffer`].
    fn pooled(a: ArrayD<Self>, ws: Workspace<Self>) -> PooledBuffer;
    /// A view of the array a [`PooledBuffer`] holds.
    fn pooled_view(b: &PooledBuffer) -> (*const Self, Vec<usize>);
    /// The workspace of this type.
    fn workspace(w: &Workspaces) -> &Workspace<Self>;
    /// The kept buffers of half-precision inputs widened to this type.
    fn kept(w: &Workspaces) -> &crate::halfio::Kept<Self>;
    /// The module if it is of this type.
    fn module(m: Modules<'_>) -> Option<&mut dyn Module<Self>>;
    /// The gradients if they are of this type.
    fn grads(g: &GradsByDtype) -> Option<&[NamedGrad<Self>]>;
    /// Gradients of this type in their slot.
    fn wrap_grads(v: Vec<NamedGrad<Self>>) -> GradsByDtype;
}

macro_rules! py_real {
    ($t:ty, $v:ident, $field:ident, $wide:ident) => {
        impl PyReal for $t {
            fn pooled(a: ArrayD<$t>, ws: Workspace<$t>) -> PooledBuffer {
                PooledBuffer {
                    inner: std::sync::Mutex::new(ByDtype::$v((Some(a), ws))),
                }
            }
            fn pooled_view(b: &PooledBuffer) -> (*const $t, Vec<usize>) {
                match &*b.inner.lock().unwrap_or_else(|e| e.into_inner()) {
                    ByDtype::$v((Some(a), _)) => (a.as_ptr(), a.shape().to_vec()),
                    _ => unreachable!("a buffer of this type"),
                }
            }
            fn workspace(w: &Workspaces) -> &Workspace<$t> {
                &w.$field
            }
            fn kept(w: &Workspaces) -> &crate::halfio::Kept<$t> {
                &w.$wide
            }
            fn module(m: Modules<'_>) -> Option<&mut dyn Module<$t>> {
                match m {
                    ByDtype::$v(m) => Some(m),
                    _ => None,
                }
            }
            fn grads(g: &GradsByDtype) -> Option<&[NamedGrad<$t>]> {
                match g {
                    ByDtype::$v(g) => Some(g),
                    _ => None,
                }
            }
            fn wrap_grads(v: Vec<NamedGrad<$t>>) -> GradsByDtype {
                ByDtype::$v(v)
            }
        }
    };
}
py_real!(f32, F32, f32, wide32);
py_real!(f64, F64, f64, wide64);

/// Hands an array to numpy without a copy; its buffer goes back to `pool`
/// when the numpy array (and every view of it) is gone.
pub fn to_numpy_pooled<'py, T: PyReal>(
    py: Python<'py>,
    a: ArrayD<T>,
    pool: &Workspace<T>,
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    let a = if a.is_standard_layout() {
        a
    } else {
        a.as_standard_layout().into_owned()
    };
    let holder = Bound::new(py, T::pooled(a, pool.clone()))?;
    let (ptr, shape) = T::pooled_view(holder.get());
    // SAFETY: the buffer is owned by `holder`, which becomes the array's
    // base object and never reallocates or frees it before it is dropped;
    // the array is in standard layout, so `shape` describes it.
    let view = unsafe { ArrayViewD::from_shape_ptr(ndarray::IxDyn(&shape), ptr) };
    Ok(unsafe { PyArrayDyn::borrow_from_array(&view, holder.into_any()) })
}

/// Hands an owned array to numpy without a copy.
pub fn to_numpy<'py, T: Element, D: ndarray::Dimension>(
    py: Python<'py>,
    a: ndarray::Array<T, D>,
) -> Bound<'py, numpy::PyArray<T, D>> {
    numpy::PyArray::from_owned_array(py, a)
}

/// Checks that a numpy array is C-contiguous-or-strided of the expected
/// shape (used for gradients handed back by torch).
pub fn check_shape(found: &[usize], expected: &[usize], what: &str) -> PyResult<()> {
    if found != expected {
        let dims: Vec<String> = expected.iter().map(|d| d.to_string()).collect();
        return Err(py_err(Error::shape(
            what,
            format!("({})", dims.join(", ")),
            found,
        )));
    }
    Ok(())
}

/// A [`StateDict`] as a Python dict of name → numpy array: a bf16 tensor
/// as a uint16 array of its bits (numpy has no bfloat16), an f16 one as
/// float16.
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
            TensorData::BF16(a) => to_numpy(py, a.mapv(half::bf16::to_bits)).into_any(),
            TensorData::F16(a) => to_numpy(py, a.mapv(half::f16::to_bits))
                .into_any()
                .call_method1("view", ("float16",))?,
        };
        d.set_item(name, a)?;
    }
    Ok(d)
}

/// A Python mapping of name → array as a [`StateDict`]: reals as float32,
/// float64 or float16 as they are, bf16 as its bits in a uint16 array (as
/// [`state_to_py`] gives it; a torch bfloat16 tensor is read so too),
/// integers as int64 (uint64 for a 0-d optimiser step, which may also be a
/// Python int).
pub fn state_from_py(obj: &Bound<'_, PyAny>) -> PyResult<StateDict> {
    let py = obj.py();
    let np = py.import("numpy")?;
    let mut sd = StateDict::new();
    let items = obj.call_method0("items")?;
    for item in items.try_iter()? {
        let (name, value): (String, Bound<'_, PyAny>) = item?.extract()?;
        // torch tensors: numpy arrays of the same memory (a bf16 tensor as
        // its bits, which numpy holds as uint16).
        let value = if value.hasattr("detach")? && value.hasattr("numpy")? {
            let t = value.call_method0("detach")?.call_method0("cpu")?;
            if t.getattr("dtype")?.str()? == "torch.bfloat16" {
                let int16 = py.import("torch")?.getattr("int16")?;
                t.call_method0("contiguous")?
                    .call_method1("view", (int16,))?
                    .call_method0("numpy")?
                    .call_method1("view", ("uint16",))?
            } else {
                t.call_method0("numpy")?
            }
        } else {
            value
        };
        let arr = np.call_method1("asarray", (&value,))?;
        let dtype: String = arr.getattr("dtype")?.getattr("name")?.extract()?;
        // Each array is copied (a half one twice: its bits, then them as
        // the type): refused first where the memory would not hold it.
        let shape: Vec<usize> = arr.getattr("shape")?.extract()?;
        let (size, copies) = match dtype.as_str() {
            "uint16" | "float16" | "bfloat16" => (2, 2),
            "float32" => (4, 1),
            _ => (8, 1),
        };
        check_alloc(
            || format!("the copy of state entry `{name}` (shape {shape:?}, {dtype})"),
            bytes_for(&shape, size).saturating_mul(copies),
        )?;
        let bits = |arr: &Bound<'_, PyAny>| -> PyResult<ArrayD<u16>> {
            let a = arr.call_method1("view", ("uint16",))?;
            Ok(owned(
                a.extract::<PyReadonlyArrayDyn<'_, u16>>()?.as_array(),
            ))
        };
        let data = match dtype.as_str() {
            // bf16 travels as its bits (numpy has no bfloat16; ml_dtypes' is taken too)
            "uint16" | "bfloat16" if !name.ends_with(".step") => {
                TensorData::BF16(bits(&arr)?.mapv(half::bf16::from_bits))
            }
            "float16" => TensorData::F16(bits(&arr)?.mapv(half::f16::from_bits)),
            "float32" => TensorData::F32(owned(
                arr.extract::<PyReadonlyArrayDyn<'_, f32>>()?.as_array(),
            )),
            "float64" => TensorData::F64(owned(
                arr.extract::<PyReadonlyArrayDyn<'_, f64>>()?.as_array(),
            )),
            "uint64" => TensorData::U64(owned(
                arr.extract::<PyReadonlyArrayDyn<'_, u64>>()?.as_array(),
            )),
            _ if name.ends_with(".step") => TensorData::U64(owned(
                arr.call_method1("astype", ("uint64",))?
                    .extract::<PyReadonlyArrayDyn<'_, u64>>()?
                    .as_array(),
            )),
            d if d.starts_with("int") || d.starts_with("uint") => TensorData::I64(owned(
                arr.call_method1("astype", ("int64",))?
                    .extract::<PyReadonlyArrayDyn<'_, i64>>()?
                    .as_array(),
            )),
            other => {
                return Err(py_err(
                    Error::new(ErrorKind::Dtype {
                        found: other.to_string(),
                        expected:
                            "float32, float64, bfloat16 (as uint16 bits), float16, an integer dtype"
                                .into(),
                    })
                    .in_array(name.clone()),
                ));
            }
        };
        sd.insert(name, data);
    }
    Ok(sd)
}
