//! Errors, dtypes and arrays between Python and the crate.
//!
//! Every argument from Python is checked here or by the crate before any
//! kernel sees it: a bad id, shape or dtype raises `ValueError`, a file
//! that cannot be read `OSError`, each with the crate's one-line message.

use ndarray::{ArrayD, ArrayViewD};
use numpy::{Element, PyArrayDyn, PyReadonlyArrayDyn};
use pyo3::exceptions::{PyFloatingPointError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyAny;
use splitgrad::kernels::pool::Pool;
use splitgrad::{Error, ErrorKind, Real};

/// The crate's error as the Python exception of its kind, with its message.
pub fn py_err(e: Error) -> PyErr {
    let msg = e.to_string();
    match e.kind() {
        ErrorKind::Io(_) => PyOSError::new_err(msg),
        ErrorKind::Diverged { .. } => PyFloatingPointError::new_err(msg),
        _ => PyValueError::new_err(msg),
    }
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
    if let Ok(a) = obj.extract::<PyReadonlyArrayDyn<'_, i64>>() {
        return Ok(a.as_array().to_owned());
    }
    let arr = numpy_array(obj)?;
    let kind: String = arr.getattr("dtype")?.getattr("kind")?.extract()?;
    let size: usize = arr.getattr("size")?.extract()?;
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
    Ok(a.as_array().to_owned())
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

enum Pooled {
    F32(Option<ArrayD<f32>>, Pool<f32>),
    F64(Option<ArrayD<f64>>, Pool<f64>),
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
        match inner {
            Pooled::F32(a, p) => {
                if let Some(a) = a.take() {
                    p.give(a)
                }
            }
            Pooled::F64(a, p) => {
                if let Some(a) = a.take() {
                    p.give(a)
                }
            }
        }
    }
}

/// The element types the bindings move between numpy and the crate.
pub trait PyReal: Real + Element {
    /// Wraps an array and its pool for [`PooledBuffer`].
    fn pooled(a: ArrayD<Self>, pool: Pool<Self>) -> PooledBuffer;
    /// A view of the array a [`PooledBuffer`] holds.
    fn pooled_view(b: &PooledBuffer) -> (*const Self, Vec<usize>);
}

impl PyReal for f32 {
    fn pooled(a: ArrayD<f32>, pool: Pool<f32>) -> PooledBuffer {
        PooledBuffer {
            inner: std::sync::Mutex::new(Pooled::F32(Some(a), pool)),
        }
    }
    fn pooled_view(b: &PooledBuffer) -> (*const f32, Vec<usize>) {
        match &*b.inner.lock().unwrap_or_else(|e| e.into_inner()) {
            Pooled::F32(Some(a), _) => (a.as_ptr(), a.shape().to_vec()),
            _ => unreachable!("an f32 buffer"),
        }
    }
}

impl PyReal for f64 {
    fn pooled(a: ArrayD<f64>, pool: Pool<f64>) -> PooledBuffer {
        PooledBuffer {
            inner: std::sync::Mutex::new(Pooled::F64(Some(a), pool)),
        }
    }
    fn pooled_view(b: &PooledBuffer) -> (*const f64, Vec<usize>) {
        match &*b.inner.lock().unwrap_or_else(|e| e.into_inner()) {
            Pooled::F64(Some(a), _) => (a.as_ptr(), a.shape().to_vec()),
            _ => unreachable!("an f64 buffer"),
        }
    }
}

/// Hands an array to numpy without a copy; its buffer goes back to `pool`
/// when the numpy array (and every view of it) is gone.
pub fn to_numpy_pooled<'py, T: PyReal>(
    py: Python<'py>,
    a: ArrayD<T>,
    pool: &Pool<T>,
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
