//! The dtype of a case's real arrays ([`CaseDtype`]): how each is stored,
//! rounded, read back, and how a generated case's inputs are written in it
//! ([`Inputs`]).

use std::fmt;
use std::str::FromStr;

use ndarray::ArrayD;

use super::Layer;
use crate::io::{NpyElement, NpzWriter, RealDtype};
use crate::kernels::half::{HalfFloat, narrow_nearest};
use crate::param::Dtype;
use crate::{Error, ErrorKind, Result};

/// The dtype of a case's real arrays: float64 and float32 cases are
/// computed in their dtype; a bf16 or f16 case holds a layer kept in that
/// dtype with activations in it, and is computed in f32 on the widened
/// values (`docs/spec.md#4-golden-vectors`).
///
/// numpy has no bfloat16: a bf16 array of a case is a `uint16` array of
/// the values' bits; f16 is numpy's `float16`.
///
/// ```
/// use splitgrad::app::golden::CaseDtype;
/// use splitgrad::io::RealDtype;
/// let d: CaseDtype = "bf16".parse()?;
/// assert_eq!(d.numpy_name(), "uint16 (bf16 bits)");
/// assert_eq!(CaseDtype::from(RealDtype::F32), CaseDtype::F32);
/// assert!("f8".parse::<CaseDtype>().unwrap_err().to_string().contains("f64, f32, bf16 or f16"));
/// # Ok::<(), splitgrad::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CaseDtype {
    /// float64 reals, computed in f64.
    F64,
    /// float32 reals, computed in f32.
    F32,
    /// bf16 reals (`uint16` bits), the layer kept in bf16, computed in f32.
    BF16,
    /// f16 reals (`float16`), the layer kept in f16, computed in f32.
    F16,
}

impl CaseDtype {
    /// `"f64"`, `"f32"`, `"bf16"` or `"f16"`, as `golden gen --dtype` takes it.
    pub fn name(self) -> &'static str {
        match self {
            CaseDtype::F64 => "f64",
            CaseDtype::F32 => "f32",
            CaseDtype::BF16 => "bf16",
            CaseDtype::F16 => "f16",
        }
    }

    /// How the case's real arrays are stored, in numpy's words.
    pub fn numpy_name(self) -> &'static str {
        match self {
            CaseDtype::F64 => "float64",
            CaseDtype::F32 => "float32",
            CaseDtype::BF16 => "uint16 (bf16 bits)",
            CaseDtype::F16 => "float16",
        }
    }

    /// The half-precision storage dtype of the case's layer, if any.
    pub fn half(self) -> Option<Dtype> {
        match self {
            CaseDtype::BF16 => Some(Dtype::BF16),
            CaseDtype::F16 => Some(Dtype::F16),
            CaseDtype::F32 | CaseDtype::F64 => None,
        }
    }

    /// The case dtype of an array stored as `dtype`: float64, float32,
    /// float16, or uint16 / int16 for bf16's bits.
    pub(super) fn of(dtype: &crate::io::Dtype) -> Result<CaseDtype> {
        use crate::io::DtypeKind;
        match (dtype.kind(), dtype.size()) {
            (DtypeKind::Float, 8) => Ok(CaseDtype::F64),
            (DtypeKind::Float, 4) => Ok(CaseDtype::F32),
            (DtypeKind::Float, 2) => Ok(CaseDtype::F16),
            (DtypeKind::UInt | DtypeKind::Int, 2) => Ok(CaseDtype::BF16),
            _ => Err(Error::new(ErrorKind::Dtype {
                expected: "float64, float32, float16, or uint16 (bf16 bits)".into(),
                found: dtype.to_string(),
            })),
        }
    }
}

impl From<RealDtype> for CaseDtype {
    fn from(d: RealDtype) -> CaseDtype {
        match d {
            RealDtype::F32 => CaseDtype::F32,
            RealDtype::F64 => CaseDtype::F64,
        }
    }
}

impl fmt::Display for CaseDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CaseDtype {
    type Err = Error;

    /// `f64`, `f32`, `bf16` or `f16`; anything else is an
    /// [`ErrorKind::Config`] error naming them.
    fn from_str(s: &str) -> Result<CaseDtype> {
        [
            CaseDtype::F64,
            CaseDtype::F32,
            CaseDtype::BF16,
            CaseDtype::F16,
        ]
        .into_iter()
        .find(|d| d.name() == s)
        .ok_or_else(|| {
            Error::config(format!(
                "unknown dtype `{s}`: expected f64, f32, bf16 or f16"
            ))
        })
    }
}

/// Where a generated case's inputs go: the real arrays are drawn in f64
/// and stored in the case's dtype (rounded to nearest), ids as they are.
pub(super) struct Inputs<'w> {
    w: &'w mut NpzWriter<'static>,
    dtype: CaseDtype,
}

impl<'w> Inputs<'w> {
    /// Inputs written to `w` in `dtype`.
    pub(super) fn new(w: &'w mut NpzWriter<'static>, dtype: CaseDtype) -> Self {
        Inputs { w, dtype }
    }

    /// Adds integer (or any non-real) array `name` as it is.
    pub(super) fn add<A, S, D>(&mut self, name: &str, array: &ndarray::ArrayBase<S, D>)
    where
        A: NpyElement,
        S: ndarray::Data<Elem = A>,
        D: ndarray::Dimension,
    {
        self.w.add(name, array);
    }

    /// Adds the 0-d integer array `name`.
    pub(super) fn add_scalar<A: NpyElement>(&mut self, name: &str, value: A) {
        self.w.add_scalar(name, value);
    }

    /// Adds real array `name`, stored in the case's dtype.
    pub(super) fn reals(&mut self, name: &str, values: &ArrayD<f64>) {
        self.dtype.add_reals(self.w, name, values);
    }

    /// Adds the 0-d real array `name`.
    pub(super) fn real_scalar(&mut self, name: &str, value: f64) {
        self.reals(name, &ndarray::arr0(value).into_dyn());
    }
}

impl CaseDtype {
    /// Adds `values` to `w` as array `name`, stored in this dtype (rounded
    /// to nearest; into a half type through f32).
    pub(super) fn add_reals<D: ndarray::Dimension>(
        self,
        w: &mut NpzWriter,
        name: &str,
        values: &ndarray::Array<f64, D>,
    ) {
        fn narrowed<H: HalfFloat, D: ndarray::Dimension>(
            values: &ndarray::Array<f64, D>,
        ) -> ndarray::Array<H, D> {
            let wide: Vec<f32> = values.iter().map(|&x| x as f32).collect();
            let mut out = vec![H::from_bits(0); wide.len()];
            narrow_nearest(&wide, &mut out);
            ndarray::Array::from_shape_vec(values.raw_dim(), out).expect("one value per element")
        }
        match self {
            CaseDtype::F64 => w.add(name, values),
            CaseDtype::F32 => w.add(name, &values.mapv(|x| x as f32)),
            CaseDtype::BF16 => w.add(
                name,
                &narrowed::<half::bf16, D>(values).mapv(|h| h.to_bits()),
            ),
            CaseDtype::F16 => w.add(name, &narrowed::<half::f16, D>(values)),
        };
    }

    /// `x` as this dtype holds it.
    pub(super) fn round(self, x: f64) -> f64 {
        match self {
            CaseDtype::F64 => x,
            CaseDtype::F32 => f64::from(x as f32),
            CaseDtype::BF16 => f64::from(half::bf16::from_f32(x as f32).to_f32()),
            CaseDtype::F16 => f64::from(half::f16::from_f32(x as f32).to_f32()),
        }
    }

    /// The dtype result `name` of a case of this dtype and `layer` is
    /// written in: the case's, but for a half case float32 except for the
    /// layer's output.
    pub(super) fn of_result(self, layer: Layer, name: &str) -> CaseDtype {
        match self.half() {
            Some(_) if name != layer.output() => CaseDtype::F32,
            _ => self,
        }
    }

    /// Real array `name` of `r` as f64, whatever real dtype of a case it
    /// is stored in (a `uint16` array is read as bf16's bits). Errors for a
    /// dtype that is none of them.
    pub fn read_any(r: &mut crate::io::NpzReader, name: &str) -> Result<ArrayD<f64>> {
        let dtype = r.dtype(name)?;
        match CaseDtype::of(&dtype).map_err(|e| e.in_array(name))? {
            CaseDtype::F64 | CaseDtype::F32 => r.reals::<f64>(name),
            CaseDtype::BF16 => Ok(r
                .bits16(name)?
                .mapv(|b| f64::from(half::bf16::from_bits(b).to_f32()))),
            CaseDtype::F16 => Ok(r
                .bits16(name)?
                .mapv(|b| f64::from(half::f16::from_bits(b).to_f32()))),
        }
    }
}
