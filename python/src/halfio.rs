//! Activations in half precision at the boundary with Python: an input
//! (hidden states, an upstream gradient) given in bf16 or f16 is widened
//! into a buffer of the engine's type `T` (exactly), and an output is
//! narrowed (to nearest, once) into a buffer of 16-bit elements that numpy
//! then views, without a copy: `uint16` holding bf16's bits (numpy has no
//! bfloat16), `float16` for f16. Both conversions run on rayon's threads,
//! and both kinds of buffer are kept for the next call of the same size, so
//! a training loop does not fault in fresh pages every step.

use std::sync::{Arc, Mutex};

use half::slice::HalfBitsSliceExt;
use half::{bf16, f16};
use ndarray::{ArrayD, ArrayViewD, IxDyn};
use numpy::{PyArrayDyn, PyReadonlyArrayDyn};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyAny;
use rayon::prelude::*;
use splitgrad::layers::reuse::{keep, take_fitting};

use crate::convert::{PyReal, check_alloc};
use crate::layer::Workspaces;

/// Elements per task of a conversion.
const CHUNK: usize = 1 << 15;

/// The half-precision type of a layer's activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    BF16,
    F16,
}

impl Act {
    /// Its torch name.
    pub fn short(self) -> &'static str {
        match self {
            Act::BF16 => "bfloat16",
            Act::F16 => "float16",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Act::BF16 => "bfloat16 (its bits as uint16)",
            Act::F16 => "float16",
        }
    }
}

/// The `act` argument: `None` (or the layer's own `dtype`) for activations
/// of the engine's type, `"bfloat16"` / `"float16"` for half precision.
pub fn act_arg(
    obj: Option<&Bound<'_, PyAny>>,
    engine: crate::convert::Dtype,
) -> PyResult<Option<Act>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let own = match engine {
        crate::convert::Dtype::F32 => splitgrad::param::Dtype::F32,
        crate::convert::Dtype::F64 => splitgrad::param::Dtype::F64,
    };
    match crate::params::storage_dtype(obj)? {
        splitgrad::param::Dtype::BF16 => Ok(Some(Act::BF16)),
        splitgrad::param::Dtype::F16 => Ok(Some(Act::F16)),
        d if d == own => Ok(None),
        d => Err(PyValueError::new_err(format!(
            "act: a {own} layer's activations are {own}, bfloat16 or float16, not {d}"
        ))),
    }
}

/// Buffers of one element type kept with their elements initialised, for
/// later requests; which buffer a request takes, and which are freed, is
/// the crate's pool rule ([`splitgrad::layers::reuse::take_fitting`]).
pub struct Kept<E>(Arc<Mutex<Vec<Vec<E>>>>);

impl<E> Clone for Kept<E> {
    fn clone(&self) -> Self {
        Kept(Arc::clone(&self.0))
    }
}

impl<E> Default for Kept<E> {
    fn default() -> Self {
        Kept(Arc::default())
    }
}

impl<E: Copy + Default> Kept<E> {
    /// Buffers smaller than this (bytes) are not kept.
    const MIN_BYTES: usize = 1 << 20;
    /// At most this many are kept.
    const MAX: usize = 8;

    /// A buffer of `n` elements: a kept one that fits (its old contents,
    /// zeros past its old length), else a new one (zeroed).
    pub fn take(&self, n: usize) -> Vec<E> {
        if n * std::mem::size_of::<E>() >= Self::MIN_BYTES {
            let mut free = self.0.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(mut v) = take_fitting(&mut free, n) {
                v.resize(n, E::default());
                return v;
            }
        }
        vec![E::default(); n]
    }

    /// Keeps `v` for a later request (or frees it).
    pub fn give(&self, v: Vec<E>) {
        if v.capacity() * std::mem::size_of::<E>() < Self::MIN_BYTES {
            return;
        }
        let mut free = self.0.lock().unwrap_or_else(|e| e.into_inner());
        keep(&mut free, v, Self::MAX);
    }
}

/// An activation as the kernels take it: the numpy array itself (of `T`),
/// or its widened copy, whose buffer goes back when it is dropped.
pub enum Input<'py, T: PyReal> {
    Borrowed(PyReadonlyArrayDyn<'py, T>),
    Widened(Option<ArrayD<T>>, Kept<T>),
}

impl<T: PyReal> Input<'_, T> {
    /// The values.
    pub fn view(&self) -> ArrayViewD<'_, T> {
        match self {
            Input::Borrowed(a) => a.as_array(),
            Input::Widened(a, _) => a.as_ref().expect("held until dropped").view(),
        }
    }
}

impl<T: PyReal> Drop for Input<'_, T> {
    fn drop(&mut self) {
        if let Input::Widened(a, kept) = self
            && let Some(a) = a.take()
        {
            kept.give(a.into_raw_vec_and_offset().0);
        }
    }
}

/// A half-precision activation argument's bits: a numpy array of `act`'s
/// type (bf16 as a uint16 array of its bits), any other dtype a
/// `ValueError` naming `what`.
pub fn half_bits_arg<'py>(
    obj: &Bound<'py, PyAny>,
    what: &str,
    act: Act,
) -> PyResult<PyReadonlyArrayDyn<'py, u16>> {
    let np = obj.py().import("numpy")?;
    let found: String = match obj.getattr("dtype") {
        Ok(d) => d.getattr("name")?.extract()?,
        Err(_) => obj.get_type().name()?.to_string(),
    };
    let want = match act {
        Act::BF16 => "uint16",
        Act::F16 => "float16",
    };
    if !obj.is_instance(&np.getattr("ndarray")?)? || found != want {
        return Err(PyValueError::new_err(format!(
            "array `{what}`: has dtype {found}, expected {}",
            act.name()
        )));
    }
    let bits = obj.call_method1("view", ("uint16",))?;
    bits.extract::<PyReadonlyArrayDyn<'py, u16>>()
}

/// Runs `f` on the bits of a half-precision activation as a
/// [`StoredView`](splitgrad::param::StoredView) of `act`'s type (copied
/// first only when numpy's array is not contiguous).
pub fn with_half_view<T: PyReal, R>(
    bits: &PyReadonlyArrayDyn<'_, u16>,
    act: Act,
    f: impl FnOnce(splitgrad::param::StoredView<'_, T>) -> R,
) -> R {
    let a = bits.as_array();
    let a = a.as_standard_layout();
    let shape = a.shape().to_vec();
    let src = a.as_slice().expect("standard layout is contiguous");
    match act {
        Act::BF16 => {
            let v = ArrayViewD::from_shape(IxDyn(&shape), src.reinterpret_cast::<bf16>())
                .expect("one element per index");
            f(splitgrad::param::StoredView::BF16(v))
        }
        Act::F16 => {
            let v = ArrayViewD::from_shape(IxDyn(&shape), src.reinterpret_cast::<f16>())
                .expect("one element per index");
            f(splitgrad::param::StoredView::F16(v))
        }
    }
}

/// An activation argument: of `T` when `act` is `None` (as
/// [`crate::convert::real_arg`] takes it), else a numpy array of that half
/// type (bf16 as a uint16 array of its bits), widened. Any other dtype is a
/// `ValueError` naming `what`.
pub fn input_arg<'py, T: PyReal>(
    obj: &Bound<'py, PyAny>,
    what: &str,
    act: Option<Act>,
    ws: &Workspaces,
) -> PyResult<Input<'py, T>> {
    let Some(act) = act else {
        return crate::convert::real_arg::<T>(obj, what).map(Input::Borrowed);
    };
    let bits = half_bits_arg(obj, what, act)?;
    let bits = bits.as_array();
    check_alloc(
        || {
            format!(
                "array `{what}` widened to {} (shape {:?})",
                T::NAME,
                bits.shape()
            )
        },
        crate::convert::bytes_for(bits.shape(), std::mem::size_of::<T>()),
    )?;
    let bits = bits.as_standard_layout();
    let src = bits.as_slice().expect("standard layout is contiguous");
    let kept = T::kept(ws).clone();
    let mut dst = kept.take(src.len());
    obj.py().detach(|| {
        dst.par_chunks_mut(CHUNK)
            .zip(src.par_chunks(CHUNK))
            .for_each(|(d, s)| match act {
                Act::BF16 => T::widen_half(s.reinterpret_cast::<bf16>(), d),
                Act::F16 => T::widen_half(s.reinterpret_cast::<f16>(), d),
            })
    });
    let a = ArrayD::from_shape_vec(IxDyn(bits.shape()), dst).expect("one element per index");
    Ok(Input::Widened(Some(a), kept))
}

/// The base object of an output narrowed to half precision: its buffer,
/// given back to the layer's kept buffers when numpy is done with it.
#[pyclass(module = "splitgrad._splitgrad", name = "_HalfBuffer", frozen)]
pub struct HalfBuffer {
    inner: Mutex<Option<Vec<u16>>>,
    kept: Kept<u16>,
}

impl Drop for HalfBuffer {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = inner.take() {
            self.kept.give(v);
        }
    }
}

/// An output of the kernels as numpy: `a` itself (`act` `None`, through the
/// workspace as [`crate::convert::to_numpy_pooled`]), or narrowed to `act`
/// (to nearest), `a`'s buffer going back to the workspace.
pub fn output<'py, T: PyReal>(
    py: Python<'py>,
    a: ArrayD<T>,
    act: Option<Act>,
    ws: &Workspaces,
) -> PyResult<Bound<'py, PyAny>> {
    let Some(act) = act else {
        return Ok(crate::convert::to_numpy_pooled(py, a, ws.of())?.into_any());
    };
    let a = if a.is_standard_layout() {
        a
    } else {
        a.as_standard_layout().into_owned()
    };
    let shape = a.shape().to_vec();
    let mut bits = ws.bits.take(a.len());
    {
        let src = a.as_slice().expect("standard layout is contiguous");
        py.detach(|| {
            bits.par_chunks_mut(CHUNK)
                .zip(src.par_chunks(CHUNK))
                .for_each(|(d, s)| match act {
                    Act::BF16 => T::narrow_half(s, d.reinterpret_cast_mut::<bf16>(), None),
                    Act::F16 => T::narrow_half(s, d.reinterpret_cast_mut::<f16>(), None),
                })
        });
    }
    ws.of::<T>().give(a);
    output_bits(py, bits, &shape, act, ws)
}

/// A half-precision output of the kernels (the bits of `act`'s type, in
/// standard layout of `shape`) as numpy, its buffer going back to the
/// layer's kept buffers when numpy is done with it.
pub fn output_bits<'py>(
    py: Python<'py>,
    bits: Vec<u16>,
    shape: &[usize],
    act: Act,
    ws: &Workspaces,
) -> PyResult<Bound<'py, PyAny>> {
    assert_eq!(
        bits.len(),
        shape.iter().product::<usize>(),
        "one element per index"
    );
    let ptr = bits.as_ptr();
    let holder = Bound::new(
        py,
        HalfBuffer {
            inner: Mutex::new(Some(bits)),
            kept: ws.bits.clone(),
        },
    )?;
    // SAFETY: the buffer is owned by `holder`, the array's base object,
    // which never reallocates or frees it before it is dropped; `shape`
    // describes it in standard layout.
    let view = unsafe { ArrayViewD::from_shape_ptr(IxDyn(shape), ptr) };
    let arr = unsafe { PyArrayDyn::borrow_from_array(&view, holder.into_any()) }.into_any();
    match act {
        Act::BF16 => Ok(arr),
        Act::F16 => arr.call_method1("view", ("float16",)),
    }
}
