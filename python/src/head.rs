//! `SplitLanguageModellingHead` for numpy arrays: the crate's layer
//! through its tape-free pair (`forward_saved`, `backward_saved`) and its
//! summed pass (`forward_sum_saved`).

use ndarray::ArrayD;
use pyo3::prelude::*;
use pyo3::types::PyAny;
use splitgrad::Real;
use splitgrad::layers::{HeadSaved, LayerGrads, SplitLanguageModellingHead, Workspace};
use splitgrad::state::Module;

use crate::convert::{OrRaise, PyReal, ids_arg, to_numpy};
use crate::gradients::{PyGradients, gradients_of};
use crate::halfio::{Act, act_arg, input_arg, output};
use crate::layer::{ByDtype, Workspaces, layer_class, split_layer_methods, std_layout};

layer_class!(
    /// `SplitLanguageModellingHead(split_vocab_size, split_order, hidden_size, dtype="float32")`.
    PyHead,
    "SplitLanguageModellingHead",
    SplitLanguageModellingHead
);
split_layer_methods!(
    PyHead,
    SplitLanguageModellingHead,
    "Every weight U(−1/√H, 1/√H) from splitgrad's seeded generator."
);

/// What `forward_saved` kept for `backward`: each token's log-sum-exp, so
/// that the backward runs no second forward pass.
#[pyclass(module = "splitgrad._splitgrad", name = "HeadSaved", frozen)]
pub struct PyHeadSaved {
    inner: ByDtype<HeadSaved<f32>, HeadSaved<f64>>,
}

#[pymethods]
impl PyHeadSaved {
    fn __repr__(&self) -> String {
        crate::each!(&self.inner, s => format!(
            "HeadSaved(hidden {:?}, labels {:?})",
            s.hidden_shape(),
            s.labels_shape()
        ))
    }
}

fn forward<T: PyReal>(
    py: Python<'_>,
    layer: &SplitLanguageModellingHead<T>,
    ws: &Workspaces,
    hidden: &Bound<'_, PyAny>,
    labels: &Bound<'_, PyAny>,
    act: Option<Act>,
) -> PyResult<(ArrayD<T>, HeadSaved<T>)> {
    let labels = ids_arg(labels, "labels")?;
    let h = input_arg::<T>(hidden, "hidden", act, ws)?;
    let hv = std_layout(h.view(), "hidden")?;
    py.detach(|| layer.forward_saved(hv.view(), &labels))
        .or_raise()
}

fn backward<T: PyReal>(
    py: Python<'_>,
    layer: &SplitLanguageModellingHead<T>,
    wss: &Workspaces,
    args: [&Bound<'_, PyAny>; 3],
    saved: Option<&PyHeadSaved>,
    want_hidden: bool,
    act: Option<Act>,
) -> PyResult<LayerGrads<T>> {
    let ws: &Workspace<T> = wss.of();
    let [hidden, labels, grad] = args;
    let labels = ids_arg(labels, "labels")?;
    let h = input_arg::<T>(hidden, "hidden", act, wss)?;
    let g = input_arg::<T>(grad, "grad_loss", act, wss)?;
    let hv = std_layout(h.view(), "hidden")?;
    let gv = g.view();
    let saved = match saved {
        Some(s) => Some(s.inner.get::<HeadSaved<T>>().ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(
                "saved: the forward_saved of a layer of another dtype",
            )
        })?),
        None => None,
    };
    let res = py.detach(|| -> splitgrad::Result<LayerGrads<T>> {
        let own;
        let saved = match saved {
            Some(s) => s,
            None => {
                own = layer.forward_saved(hv.view(), &labels)?.1;
                &own
            }
        };
        layer.backward_saved(ws, saved, hv.view(), gv.view(), want_hidden)
    });
    res.or_raise()
}

#[allow(clippy::too_many_arguments)]
fn summed<T: PyReal>(
    py: Python<'_>,
    layer: &SplitLanguageModellingHead<T>,
    wss: &Workspaces,
    hidden: &Bound<'_, PyAny>,
    labels: &Bound<'_, PyAny>,
    want: Option<bool>,
    act: Option<Act>,
) -> PyResult<(T, LayerGrads<T>)> {
    let labels = ids_arg(labels, "labels")?;
    let h = input_arg::<T>(hidden, "hidden", act, wss)?;
    let hv = std_layout(h.view(), "hidden")?;
    let (want_hidden, want_weights) = (want == Some(true), want.is_some());
    py.detach(|| layer.forward_sum_saved(wss.of(), hv.view(), &labels, want_hidden, want_weights))
        .or_raise()
}

/// `(grad_hidden, Gradients)` for Python.
type PyGrads<'py> = (Option<Bound<'py, PyAny>>, PyGradients);

fn to_py<'py, T: PyReal>(
    py: Python<'py>,
    g: LayerGrads<T>,
    ws: &Workspaces,
    act: Option<Act>,
) -> PyResult<PyGrads<'py>> {
    let gh = g.input.map(|a| output(py, a, act, ws)).transpose()?;
    Ok((gh, gradients_of(g.params, ws)))
}

#[pymethods]
impl PyHead {
    /// Per-token cross-entropy (the fused kernel): hidden (…, H), labels
    /// (…) → loss (…), 0 where the label is −100. `act` (here and below):
    /// the hidden states, upstream gradients and results in bfloat16 (as
    /// uint16 bits) or float16 instead of the layer's `dtype`.
    #[pyo3(signature = (hidden, labels, act = None))]
    fn forward<'py>(
        &self,
        py: Python<'py>,
        hidden: &Bound<'py, PyAny>,
        labels: &Bound<'py, PyAny>,
        act: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        crate::each!(&*self.read(py)?, l => {
            let act = act_arg(act, self.dt)?;
            let loss = forward(py, l, &self.ws, hidden, labels, act)?.0;
            output(py, loss, act, &self.ws)
        })
    }

    /// [`forward`] and what `backward` needs of it: `(loss, saved)`; pass
    /// `saved` to `backward` (with the same hidden states and labels) and
    /// it runs no second forward pass.
    #[pyo3(signature = (hidden, labels, act = None))]
    fn forward_saved<'py>(
        &self,
        py: Python<'py>,
        hidden: &Bound<'py, PyAny>,
        labels: &Bound<'py, PyAny>,
        act: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyAny>, PyHeadSaved)> {
        crate::each!(&*self.read(py)?, l => {
            let act = act_arg(act, self.dt)?;
            let (loss, saved) = forward(py, l, &self.ws, hidden, labels, act)?;
            let saved = PyHeadSaved {
                inner: ByDtype::new(saved),
            };
            let loss = match act {
                None => to_numpy(py, loss).into_any(),
                a => output(py, loss, a, &self.ws)?,
            };
            Ok((loss, saved))
        })
    }

    /// The gradients of `Σ loss ⊙ grad_loss`: `(grad_hidden, Gradients)`
    /// (`grad_hidden` None when `hidden_grad` is false). `saved`: what
    /// `forward_saved` returned for these hidden states and labels; without
    /// it the forward pass runs again.
    #[pyo3(signature = (hidden, labels, grad_loss, hidden_grad = true, saved = None, act = None))]
    #[allow(clippy::too_many_arguments)]
    fn backward<'py>(
        &self,
        py: Python<'py>,
        hidden: &Bound<'py, PyAny>,
        labels: &Bound<'py, PyAny>,
        grad_loss: &Bound<'py, PyAny>,
        hidden_grad: bool,
        saved: Option<PyRef<'py, PyHeadSaved>>,
        act: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<PyGrads<'py>> {
        let args = [hidden, labels, grad_loss];
        let saved = saved.as_deref();
        crate::each!(&*self.read(py)?, l => {
            let act = act_arg(act, self.dt)?;
            let g = backward(py, l, &self.ws, args, saved, hidden_grad, act)?;
            to_py(py, g, &self.ws, act)
        })
    }

    /// `Σ_n loss_n` (the summed fused kernel), a float.
    #[pyo3(signature = (hidden, labels, act = None))]
    fn forward_sum(
        &self,
        py: Python<'_>,
        hidden: &Bound<'_, PyAny>,
        labels: &Bound<'_, PyAny>,
        act: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<f64> {
        crate::each!(&*self.read(py)?, l => {
            let act = act_arg(act, self.dt)?;
            let (loss, _) = summed(py, l, &self.ws, hidden, labels, None, act)?;
            Ok(Real::to_f64(loss))
        })
    }

    /// `Σ_n loss_n` and its gradients in one pass (6·N·V·H flops):
    /// `(loss, grad_hidden, Gradients)`.
    #[pyo3(signature = (hidden, labels, hidden_grad = true, act = None))]
    fn forward_sum_backward<'py>(
        &self,
        py: Python<'py>,
        hidden: &Bound<'py, PyAny>,
        labels: &Bound<'py, PyAny>,
        hidden_grad: bool,
        act: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(f64, Option<Bound<'py, PyAny>>, PyGradients)> {
        crate::each!(&*self.read(py)?, l => {
            let act = act_arg(act, self.dt)?;
            let (loss, g) = summed(py, l, &self.ws, hidden, labels, Some(hidden_grad), act)?;
            let (gh, grads) = to_py(py, g, &self.ws, act)?;
            Ok((Real::to_f64(loss), gh, grads))
        })
    }
}
