//! A layer's parameters from Python: numpy views of their buffers
//! ([`parameter_view`]), the dtype they are kept in, and each one by name
//! ([`param`]): freezing, rounding rows.
//!
//! A layer owns its parameters (the crate's `Parameter`s); `parameter()`
//! hands numpy a writable view of one, without a copy, whose base is the
//! layer (so the layer lives as long as any view of it). No method ever
//! reallocates a parameter's buffer but `set_dtype`, so a view stays valid:
//! loads and `seed_from` write into the buffer that is there. A parameter
//! kept in bf16 is viewed as `uint16` (its bits: numpy has no bfloat16),
//! one kept in f16 as `float16`. `set_dtype` gives the changed parameters
//! new buffers; the old ones stay allocated while a view of them lives (so
//! an old view is stale, never dangling: take the views again).

use std::any::Any;

use ndarray::ArrayViewD;
use numpy::PyArrayDyn;
use pyo3::exceptions::{PyKeyError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyAny;
use splitgrad::Parameter;
use splitgrad::param::{Dtype as StorageDtype, Stored};
use splitgrad::state::Module;

use crate::convert::{OrRaise, PyReal};

/// The parameter `name` of `module`; a `KeyError` naming it when there is none.
pub fn param<'a, T: PyReal>(module: &'a dyn Module<T>, name: &str) -> PyResult<&'a Parameter<T>> {
    let params = module.parameters();
    Ok(params[index_of(&params, name)?])
}

/// [`param`], to change.
pub fn param_mut<'a, T: PyReal>(
    module: &'a mut dyn Module<T>,
    name: &str,
) -> PyResult<&'a mut Parameter<T>> {
    let i = index_of(&module.parameters(), name)?;
    Ok(module.parameters_mut().swap_remove(i))
}

/// Where the parameter `name` is among a module's `params`; a `KeyError`
/// naming it and them when it is not.
fn index_of<T: PyReal>(params: &[&Parameter<T>], name: &str) -> PyResult<usize> {
    params.iter().position(|p| p.name() == name).ok_or_else(|| {
        let names: Vec<&str> = params.iter().map(|p| p.name()).collect();
        PyKeyError::new_err(format!(
            "no parameter named `{name}` (parameters: {})",
            names.join(", ")
        ))
    })
}

/// A parameter as a writable numpy view of the layer's own buffer.
pub fn parameter_view<'py, T: PyReal>(
    slf: &Bound<'py, PyAny>,
    module: &dyn Module<T>,
    keep: &Keep,
    name: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let p = param(module, name)?;
    let base = Bound::new(
        slf.py(),
        ParamView {
            _layer: slf.clone().unbind(),
            _keep: keep.clone(),
        },
    )?
    .into_any();
    // SAFETY: the buffer is the parameter's, owned by the layer; `base` (the
    // array's base object) keeps the layer alive, and `keep` the buffer: a
    // change of dtype (the only call that gives a parameter a new buffer)
    // hands the old buffer to `keep` while a view of it lives (module docs).
    match p.stored() {
        Stored::Full(a) => Ok(unsafe { PyArrayDyn::borrow_from_array(a, base) }.into_any()),
        Stored::BF16(a) => Ok(unsafe { borrow_bits(a, base) }?.into_any()),
        Stored::F16(a) => {
            let bits = unsafe { borrow_bits(a, base) }?;
            bits.call_method1("view", ("float16",))
        }
    }
}

/// The half-precision elements of `a` as a writable numpy `uint16` array
/// of their bits, over `a`'s own buffer, with base object `base`.
///
/// # Safety
/// `base` must keep `a`'s buffer alive and unmoved while the array lives.
unsafe fn borrow_bits<'py, H: HalfBits>(
    a: &ndarray::ArrayD<H>,
    base: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArrayDyn<u16>>> {
    if !a.is_standard_layout() {
        return Err(pyo3::exceptions::PyRuntimeError::new_err(
            "a half-precision parameter is not in standard layout",
        ));
    }
    // SAFETY: bf16 and f16 are `repr(transparent)` over u16; the array is
    // in standard layout, so its shape describes the buffer.
    let view = unsafe { ArrayViewD::from_shape_ptr(a.raw_dim(), a.as_ptr().cast::<u16>()) };
    Ok(unsafe { PyArrayDyn::borrow_from_array(&view, base) })
}

/// bf16 and f16: 16 bits each, `repr(transparent)` over `u16`.
pub trait HalfBits: Copy {}
impl HalfBits for half::bf16 {}
impl HalfBits for half::f16 {}

/// The buffers a layer's parameters had before a change of dtype, kept
/// while a numpy view of them lives (each view holds one `Keep`).
pub type Keep = std::sync::Arc<std::sync::Mutex<Vec<Box<dyn Any + Send>>>>;

/// The base object of a parameter's numpy view: the layer, and the
/// buffers retired by a change of dtype since the view was made.
#[pyclass(module = "splitgrad._splitgrad", name = "_ParamView", frozen)]
pub struct ParamView {
    _layer: Py<PyAny>,
    _keep: Keep,
}

/// A storage dtype from Python: `"bf16"`, `"bfloat16"`, `"float16"`,
/// `"f32"`, `numpy.float16`, `torch.bfloat16`, …
pub fn storage_dtype(obj: &Bound<'_, PyAny>) -> PyResult<StorageDtype> {
    // A name first: numpy reads "f16" as float128 (16 bytes).
    if let Ok(name) = obj.extract::<String>()
        && let Ok(d) = name.parse::<StorageDtype>()
    {
        return Ok(d);
    }
    let np = obj.py().import("numpy")?;
    let name: String = match np.call_method1("dtype", (obj,)) {
        Ok(d) => d.getattr("name")?.extract()?,
        Err(_) => obj.str()?.to_string(),
    };
    name.parse::<StorageDtype>().map_err(|_| {
        PyValueError::new_err(format!(
            "unknown dtype {name} (expected float32, float64, bfloat16 or float16)"
        ))
    })
}

/// Keeps every parameter of `module` as `dtype` (rounded to nearest when
/// narrowed), each changed one in a new buffer; the old buffers go to
/// `keep` when given (a view of them lives), else are freed. Nothing
/// changes on an error.
pub fn set_module_dtype<T: PyReal>(
    module: &mut dyn Module<T>,
    dtype: StorageDtype,
    keep: Option<&Keep>,
) -> PyResult<()> {
    if !dtype.is_half() && dtype != StorageDtype::of::<T>() {
        return Err(PyValueError::new_err(format!(
            "a {} layer keeps its parameters as {} or in bf16 or f16, not {dtype} \
             (build it with dtype={dtype} instead)",
            T::NAME,
            T::NAME
        )));
    }
    let mut bytes = 0u64;
    for p in module
        .parameters()
        .into_iter()
        .filter(|p| p.dtype() != dtype)
    {
        // the new buffer, and a widened copy first when narrowing from
        // another half type (a parameter kept as T is narrowed in place)
        let widened = if p.dtype().is_half() {
            std::mem::size_of::<T>()
        } else {
            0
        };
        let n = crate::convert::bytes_for(p.shape(), widened + dtype.size());
        bytes = bytes.saturating_add(n);
    }
    crate::convert::check_alloc(|| format!("the parameters kept as {dtype}"), bytes)?;
    for p in module.parameters_mut() {
        if p.dtype() == dtype {
            continue;
        }
        let new = match p.widened() {
            std::borrow::Cow::Borrowed(a) => Stored::from_full_view(a.view(), dtype),
            std::borrow::Cow::Owned(a) => Stored::from_full(a, dtype),
        }
        .or_raise()?;
        let old = std::mem::replace(p.stored_mut(), new);
        if let Some(k) = keep {
            k.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Box::new(old));
        }
    }
    Ok(())
}

/// numpy's name of a storage dtype (`"bfloat16"`, which numpy lacks, for bf16).
pub fn numpy_name(d: StorageDtype) -> &'static str {
    match d {
        StorageDtype::F32 => "float32",
        StorageDtype::F64 => "float64",
        StorageDtype::BF16 => "bfloat16",
        StorageDtype::F16 => "float16",
    }
}

/// Freezes or unfreezes the parameter `name`.
pub fn set_trainable<T: PyReal>(module: &mut dyn Module<T>, name: &str, on: bool) -> PyResult<()> {
    param_mut(module, name)?.set_trainable(on);
    Ok(())
}

/// Rounding rows from Python ([`splitgrad::Parameter::set_rounding_rows`]):
/// a 1-D array of integers ≥ 0.
pub fn rounding_rows(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    let a = crate::convert::ids_arg(obj, "rows")?;
    if a.ndim() != 1 {
        return Err(PyValueError::new_err(format!(
            "array `rows`: has shape {:?}, expected one dimension",
            a.shape()
        )));
    }
    a.iter()
        .enumerate()
        .map(|(i, &r)| {
            u64::try_from(r).map_err(|_| {
                PyValueError::new_err(format!(
                    "array `rows`: at position {i}: row {r}, expected a row >= 0"
                ))
            })
        })
        .collect()
}

/// [`splitgrad::Parameter::set_rounding_rows`] of the parameter `name`.
pub fn set_rounding_rows<T: PyReal>(
    module: &mut dyn Module<T>,
    name: &str,
    rows: Option<Vec<u64>>,
) -> PyResult<()> {
    param_mut(module, name)?
        .set_rounding_rows(rows)
        .map_err(crate::convert::py_err)
}
