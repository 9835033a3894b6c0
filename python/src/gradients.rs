//! `Gradients`: the gradients of one backward pass, by parameter name
//! (the crate's [`NamedGrad`]s), handed to Python and back to the
//! optimisers; and their sums.

use ndarray::ArrayViewD;
use numpy::PyArrayDyn;
use pyo3::exceptions::{PyKeyError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyAny, PyDict};
use splitgrad::layers::{NamedGrad, Workspace};
use splitgrad::param::{GradSource, ParamGrad, Parameter};

use crate::convert::{Dtype, PyReal, check_shape, ids_arg, real_arg, to_numpy};
use crate::layer::{ByDtype, LayerRef, Workspaces, layers_of, lock_layers};

/// Gradients of either real type.
pub type GradsByDtype = ByDtype<Vec<NamedGrad<f32>>, Vec<NamedGrad<f64>>>;

/// The gradients of one backward pass, by parameter name.
///
/// A table's gradient is row-sparse: `rows(name)` (sorted, unique, int64)
/// and `values(name)` (one row each); any other gradient is dense
/// (`values(name)` is then the whole array). `dense(name)` is either as a
/// dense array of the parameter's shape.
#[pyclass(module = "splitgrad._splitgrad", name = "Gradients", frozen)]
pub struct PyGradients {
    pub inner: GradsByDtype,
    /// Where the gradients' buffers go back when Python is done with them
    /// (the layer's workspaces: its next backward reuses them).
    pub ws: Workspaces,
}

/// Gives the buffers of gradients back to a workspace.
pub fn give_back<T: PyReal>(grads: Vec<NamedGrad<T>>, ws: &Workspace<T>) {
    grads.into_iter().for_each(|g| g.give_back(ws));
}

impl Drop for PyGradients {
    fn drop(&mut self) {
        let ws = &self.ws;
        crate::each!(&mut self.inner, v => give_back(std::mem::take(v), ws.of()))
    }
}

/// The gradients of a layer for Python, their buffers going back to `ws`.
pub fn gradients_of<T: PyReal>(v: Vec<NamedGrad<T>>, ws: &Workspaces) -> PyGradients {
    PyGradients {
        inner: T::wrap_grads(v),
        ws: ws.clone(),
    }
}

/// A list of gradients as the optimisers' [`GradSource`].
pub struct Source<'a, T>(pub Vec<&'a NamedGrad<T>>);

impl<T> GradSource<T> for Source<'_, T> {
    fn grad_of(&self, p: &Parameter<T>) -> Option<&ParamGrad<T>> {
        self.0.iter().find(|e| e.id == p.id()).map(|e| &e.grad)
    }
}

fn find<'a, T>(list: &'a [NamedGrad<T>], name: &str) -> PyResult<&'a NamedGrad<T>> {
    list.iter().find(|e| e.name == name).ok_or_else(|| {
        let names: Vec<&str> = list.iter().map(|e| e.name.as_str()).collect();
        PyKeyError::new_err(format!(
            "no gradient for `{name}` (gradients: {})",
            names.join(", ")
        ))
    })
}

/// [`PyGradients::from_parts`] for the layer's real type.
fn from_parts_typed<T: PyReal>(
    m: &mut LayerRef<'_>,
    parts: &Bound<'_, PyDict>,
    scale: f64,
) -> PyResult<PyGradients> {
    let ws = m.workspaces();
    let module = m.module::<T>().expect("the dtype was checked");
    let params = module.parameters();
    let c = T::from_f64(scale);
    let mut grads = Vec::new();
    for (key, value) in parts.iter() {
        let name: String = key.extract()?;
        let p = params.iter().find(|p| p.name() == name).ok_or_else(|| {
            let names: Vec<&str> = params.iter().map(|p| p.name()).collect();
            PyKeyError::new_err(format!(
                "no parameter `{name}` in this layer (parameters: {})",
                names.join(", ")
            ))
        })?;
        let (rows, values): (Bound<'_, PyAny>, Bound<'_, PyAny>) = value.extract()?;
        let what = format!("values of {name}");
        let vals = real_arg::<T>(&values, &what)?;
        let shape = p.shape().to_vec();
        if rows.is_none() {
            check_shape(vals.as_array().shape(), &shape, &what)?;
            grads.push(NamedGrad::new(
                p,
                ParamGrad::Dense(vals.as_array().mapv(|x| x * c)),
            ));
            continue;
        }
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
        grads.push(NamedGrad::from_rows(ws.of(), p, &at, v.view(), Some(c)));
    }
    Ok(gradients_of(grads, &ws))
}

#[pymethods]
impl PyGradients {
    /// The names of the parameters that have a gradient.
    fn names(&self) -> Vec<String> {
        crate::each!(&self.inner, l => l.iter().map(|e| e.name.clone()).collect())
    }

    fn __len__(&self) -> usize {
        crate::each!(&self.inner, l => l.len())
    }

    fn __contains__(&self, name: &str) -> bool {
        crate::each!(&self.inner, l => l.iter().any(|e| e.name == name))
    }

    /// Whether the gradient of `name` is row-sparse.
    fn is_sparse(&self, name: &str) -> PyResult<bool> {
        crate::each!(&self.inner, l => Ok(matches!(find(l, name)?.grad, ParamGrad::RowSparse(_))))
    }

    /// The shape of the parameter the gradient belongs to.
    fn shape(&self, name: &str) -> PyResult<Vec<usize>> {
        crate::each!(&self.inner, l => Ok(match &find(l, name)?.grad {
            ParamGrad::Dense(d) => d.shape().to_vec(),
            ParamGrad::RowSparse(s) => vec![s.n_rows, s.values.ncols()],
        }))
    }

    /// The rows of a row-sparse gradient (sorted, unique, int64); every row
    /// for a dense one.
    fn rows<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let rows: Vec<i64> = crate::each!(&self.inner, l => match &find(l, name)?.grad {
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
        let arr = crate::each!(&this.inner, l => {
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
        crate::each!(&self.inner, l => {
            let e = find(l, name)?;
            let shape = match &e.grad {
                ParamGrad::RowSparse(s) => vec![s.n_rows, s.values.ncols()],
                ParamGrad::Dense(d) => d.shape().to_vec(),
            };
            crate::convert::check_alloc(
                || format!("the dense gradient of `{name}` (shape {shape:?})"),
                crate::convert::bytes_for(&shape, 8),
            )?;
            Ok(to_numpy(py, e.grad.to_dense()).into_any())
        })
    }

    fn __repr__(&self) -> String {
        let parts: Vec<String> = crate::each!(&self.inner, l => l.iter().map(|e| match &e.grad {
            ParamGrad::RowSparse(s) => format!("{}: {} of {} rows", e.name, s.rows.len(), s.n_rows),
            ParamGrad::Dense(d) => format!("{}: dense {:?}", e.name, d.shape()),
        }).collect());
        format!("Gradients({})", parts.join(", "))
    }

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
        let objs = layers_of(layer)?;
        if objs.len() != 1 {
            return Err(PyTypeError::new_err("from_parts takes one layer"));
        }
        let mut layers = lock_layers(layer.py(), &objs)?;
        let m = &mut layers[0];
        match m.dtype() {
            Dtype::F32 => from_parts_typed::<f32>(m, parts, scale),
            Dtype::F64 => from_parts_typed::<f64>(m, parts, scale),
        }
    }
}

/// Adds `b` into `a` (same parameter).
fn add_grad<T: PyReal>(a: &mut ParamGrad<T>, b: &ParamGrad<T>) {
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

/// The sum of owned gradients (`own`) and borrowed ones (`grads`), by
/// parameter: a parameter with gradients in both, or in several borrowed
/// ones, gets an owned sum (added in order); one with a single borrowed
/// gradient keeps it borrowed.
pub fn merge<'e, T: PyReal>(
    mut own: Vec<NamedGrad<T>>,
    grads: impl Iterator<Item = &'e NamedGrad<T>>,
) -> (Vec<NamedGrad<T>>, Vec<&'e NamedGrad<T>>) {
    let mut borrowed: Vec<&NamedGrad<T>> = Vec::new();
    for e in grads {
        if let Some(o) = own.iter_mut().find(|o| o.name == e.name) {
            add_grad(&mut o.grad, &e.grad);
        } else if let Some(pos) = borrowed.iter().position(|b| b.name == e.name) {
            let mut g = borrowed[pos].grad.clone();
            add_grad(&mut g, &e.grad);
            own.push(NamedGrad {
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
