//! Reading one case: every array's shape is checked (against what the
//! layer expects and against the size limits) from its header, before any
//! of its data is read; every error names the case file and the array.

use std::path::{Path, PathBuf};

use ndarray::{ArrayD, Dimension};

use super::{CaseDtype, MAX_CASE_ELEMENTS};
use crate::io::NpzReader;
use crate::state::Module;
use crate::{Error, ErrorKind, Real, Result};

/// The shape an array must have.
pub(super) enum Want<'a> {
    /// 0-d (a numpy scalar).
    Scalar,
    /// 1-D, of this length if one is given.
    Vector(Option<usize>),
    /// 2-D with this many rows (any width).
    Rows(usize),
    /// Exactly this shape, for the reason given (`"input_ids' shape + (H,)"`).
    Exact(&'a [usize], &'a str),
    /// Any shape.
    Any,
    /// At least one axis.
    NotScalar,
}

fn fmt_shape(shape: &[usize]) -> String {
    match shape {
        [] => "()".into(),
        [n] => format!("({n},)"),
        _ => {
            let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
            format!("({})", dims.join(", "))
        }
    }
}

impl Want<'_> {
    /// The expectation in words, or `None` when `shape` meets it.
    fn unmet(&self, shape: &[usize]) -> Option<String> {
        let ok = match self {
            Want::Scalar => shape.is_empty(),
            Want::Vector(None) => shape.len() == 1,
            Want::Vector(Some(n)) => shape == [*n],
            Want::Rows(n) => shape.len() == 2 && shape[0] == *n,
            Want::Exact(s, _) => shape == *s,
            Want::Any => true,
            Want::NotScalar => !shape.is_empty(),
        };
        if ok {
            return None;
        }
        Some(match self {
            Want::Scalar => "() (a 0-d array)".into(),
            Want::Vector(None) => "1-D".into(),
            Want::Vector(Some(n)) => format!("({n},)"),
            Want::Rows(n) => format!("({n}, H)"),
            Want::Exact(s, why) => format!("{} ({why})", fmt_shape(s)),
            Want::Any => unreachable!("any shape is accepted"),
            Want::NotScalar => "at least 1-D".into(),
        })
    }
}

/// One case being read: the archive, its label, the real dtype of its
/// real arrays and the elements read so far.
pub(super) struct Case {
    npz: NpzReader,
    label: PathBuf,
    dtype: CaseDtype,
    anchor: &'static str,
    elements: usize,
}

impl Case {
    /// Opens the case in `bytes`; its real dtype is that of array `anchor`.
    pub(super) fn open(label: &Path, bytes: Vec<u8>, anchor: &'static str) -> Result<Case> {
        let mut npz = NpzReader::from_bytes(label, bytes)?;
        let dtype = npz
            .dtype(anchor)
            .and_then(|d| CaseDtype::of(&d).map_err(|e| e.in_file(label).in_array(anchor)))?;
        Ok(Case {
            npz,
            label: label.to_path_buf(),
            dtype,
            anchor,
            elements: 0,
        })
    }

    /// The real dtype every real array of the case must have.
    pub(super) fn dtype(&self) -> CaseDtype {
        self.dtype
    }

    /// Keeps `layer`'s parameters in the case's half type, for a bf16 or
    /// f16 case (their values came from it, so nothing is rounded).
    pub(super) fn keep_in_storage<T: Real, M: Module<T>>(&self, layer: &mut M) -> Result<()> {
        match self.dtype.half() {
            Some(dtype) => layer.set_dtype(dtype).map_err(|e| e.in_file(&self.label)),
            None => Ok(()),
        }
    }

    /// `e`, naming this case's file and array `name` (unless it names one).
    pub(super) fn fail(&self, e: Error, name: &str) -> Error {
        e.in_file(&self.label).in_array(name)
    }

    /// Checks array `name`'s shape (from its header) against `want` and
    /// the limits, and counts its elements.
    fn check_shape(&mut self, name: &str, want: &Want<'_>) -> Result<Vec<usize>> {
        let shape = self.npz.shape(name)?;
        let too_big = || {
            Error::shape(
                name,
                format!("at most {MAX_CASE_ELEMENTS} elements in all arrays of a case"),
                &shape,
            )
        };
        let len = shape
            .iter()
            .try_fold(1usize, |n, &d| {
                (d <= MAX_CASE_ELEMENTS).then(|| n.checked_mul(d))?
            })
            .filter(|&n| n <= MAX_CASE_ELEMENTS - self.elements)
            .ok_or_else(|| self.fail(too_big(), name))?;
        if let Some(expected) = want.unmet(&shape) {
            return Err(self.fail(Error::shape(name, expected, &shape), name));
        }
        self.elements += len;
        Ok(shape)
    }

    /// Integer array `name` (any integer dtype) of shape `want`.
    pub(super) fn ints(&mut self, name: &str, want: Want<'_>) -> Result<ArrayD<i64>> {
        self.check_shape(name, &want)?;
        self.npz.ints(name)
    }

    /// Integer array `name` of shape `want`, flattened (row-major).
    pub(super) fn ints_vec(&mut self, name: &str, want: Want<'_>) -> Result<Vec<i64>> {
        Ok(self.ints(name, want)?.iter().copied().collect())
    }

    /// The 0-d integer array `name`.
    pub(super) fn int_scalar(&mut self, name: &str) -> Result<i64> {
        Ok(self.ints_vec(name, Want::Scalar)?[0])
    }

    /// The 0-d integer array `name`, which must be 0 or 1.
    pub(super) fn flag(&mut self, name: &str) -> Result<bool> {
        match self.int_scalar(name)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(self.fail(Error::out_of_range("flag", vec![], v, 0, 2), name)),
        }
    }

    /// Checks that every value of 1-D array `name` is 0 or 1.
    pub(super) fn check_flags(&self, values: &[i64], name: &str, what: &'static str) -> Result<()> {
        match values.iter().position(|&v| v != 0 && v != 1) {
            Some(i) => Err(self.fail(Error::out_of_range(what, vec![i], values[i], 0, 2), name)),
            None => Ok(()),
        }
    }

    /// Checks that every id is in `low..high`, naming the first that is not
    /// with its multi-index.
    pub(super) fn check_ids(
        &self,
        ids: &ArrayD<i64>,
        name: &str,
        what: &'static str,
        high: usize,
    ) -> Result<()> {
        let high = i64::try_from(high).unwrap_or(i64::MAX);
        match ids.indexed_iter().find(|&(_, &v)| !(0..high).contains(&v)) {
            Some((i, &v)) => Err(self.fail(
                Error::out_of_range(what, i.slice().to_vec(), v, 0, high),
                name,
            )),
            None => Ok(()),
        }
    }

    /// Real array `name` of shape `want`, of the case's real dtype, every
    /// element finite.
    /// A bf16 or f16 case's arrays are widened exactly (to `T`, f32).
    pub(super) fn reals<T: Real>(&mut self, name: &str, want: Want<'_>) -> Result<ArrayD<T>> {
        let stored = self.npz.dtype(name)?;
        let dtype = CaseDtype::of(&stored).map_err(|e| self.fail(e, name))?;
        if dtype != self.dtype {
            // Neither array is the wrong one: they disagree. Name both.
            return Err(Error::format(format!(
                "real arrays differ in dtype: `{}` is {}, `{name}` is {}; \
                 every real array of a case must have one dtype (float64, float32, \
                 float16, or uint16 holding bf16's bits)",
                self.anchor,
                self.dtype.numpy_name(),
                dtype.numpy_name()
            ))
            .in_file(&self.label));
        }
        self.check_shape(name, &want)?;
        if dtype.half().is_none() {
            return self.npz.finite_reals(name);
        }
        let values = CaseDtype::read_any(&mut self.npz, name)?.mapv(T::from_f64);
        crate::io::check_finite(values.view(), name).map_err(|e| e.in_file(&self.label))?;
        Ok(values)
    }

    /// The 0-d real array `name`.
    pub(super) fn real_scalar<T: Real>(&mut self, name: &str) -> Result<T> {
        let a = self.reals::<T>(name, Want::Scalar)?;
        Ok(a.iter().copied().next().unwrap_or_else(T::zero))
    }
}

/// The splits of an embedding or head case: `split_sizes`, optionally
/// `split_trainable`, and `weight_<k>` for each split.
pub(super) struct Splits<T> {
    /// Split names, `s0`, `s1`, ….
    pub(super) names: Vec<String>,
    /// size_k.
    pub(super) sizes: Vec<usize>,
    /// Whether each split is trainable.
    pub(super) trainable: Vec<bool>,
    /// weight_k, (size_k, H).
    pub(super) weights: Vec<ArrayD<T>>,
    /// H.
    pub(super) hidden: usize,
}

impl<T: Real> Splits<T> {
    /// Reads the splits; `with_trainable` reads `split_trainable` (else
    /// every split is trainable).
    pub(super) fn read(case: &mut Case, with_trainable: bool) -> Result<Self> {
        let raw = case.ints_vec("split_sizes", Want::Vector(None))?;
        if raw.is_empty() {
            return Err(case.fail(Error::new(ErrorKind::Empty), "split_sizes"));
        }
        let high = MAX_CASE_ELEMENTS as i64 + 1;
        let mut sizes = Vec::with_capacity(raw.len());
        for (k, &s) in raw.iter().enumerate() {
            if !(0..high).contains(&s) {
                let e = Error::out_of_range("split size", vec![k], s, 0, high);
                return Err(case.fail(e, "split_sizes"));
            }
            sizes.push(s as usize);
        }
        let n = sizes.len();
        let trainable = if with_trainable {
            let flags = case.ints_vec("split_trainable", Want::Vector(Some(n)))?;
            case.check_flags(&flags, "split_trainable", "trainable flag")?;
            flags.iter().map(|&f| f == 1).collect()
        } else {
            vec![true; n]
        };
        let mut weights = Vec::with_capacity(n);
        let first = case.reals::<T>("weight_0", Want::Rows(sizes[0]))?;
        let hidden = first.shape()[1];
        if hidden == 0 {
            let e = Error::shape(
                "weight_0",
                format!("({}, H) with H ≥ 1", sizes[0]),
                first.shape(),
            );
            return Err(case.fail(e, "weight_0"));
        }
        weights.push(first);
        for (k, &size) in sizes.iter().enumerate().skip(1) {
            let name = format!("weight_{k}");
            let why = format!("split_sizes[{k}] × H, H = {hidden} from weight_0");
            weights.push(case.reals::<T>(&name, Want::Exact(&[size, hidden], &why))?);
        }
        Ok(Splits {
            names: (0..n).map(|k| format!("s{k}")).collect(),
            sizes,
            trainable,
            weights,
            hidden,
        })
    }

    /// `(name, size)` pairs for the layers' constructors.
    pub(super) fn sized(&self) -> Vec<(&str, usize)> {
        self.names
            .iter()
            .map(String::as_str)
            .zip(self.sizes.iter().copied())
            .collect()
    }

    /// V, the sum of the sizes.
    pub(super) fn vocab_size(&self) -> usize {
        self.sizes.iter().sum()
    }
}
