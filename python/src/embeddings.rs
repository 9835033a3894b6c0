//! `SplitTokenEmbeddings` for numpy arrays: the crate's layer through its
//! tape-free pair (`forward_saved`; `route`, then `backward_saved`).

use numpy::PyUntypedArrayMethods;
use pyo3::prelude::*;
use pyo3::types::PyAny;
use splitgrad::Tape;
use splitgrad::layers::{NamedGrad, SplitTokenEmbeddings, Workspace};
use splitgrad::state::Module;

use crate::convert::{OrRaise, PyReal, check_shape, ids_arg, real_arg, to_numpy_pooled};
use crate::gradients::{PyGradients, gradients_of};
use crate::layer::{check_output, layer_class, split_layer_methods};

layer_class!(
    /// `SplitTokenEmbeddings(split_vocab_size, split_order, hidden_size, dtype="float32")`.
    PyEmbeddings,
    "SplitTokenEmbeddings",
    SplitTokenEmbeddings
);
split_layer_methods!(
    PyEmbeddings,
    SplitTokenEmbeddings,
    "Every element N(0, 1) from splitgrad's seeded generator."
);

fn forward<'py, T: PyReal>(
    py: Python<'py>,
    layer: &SplitTokenEmbeddings<T>,
    ws: &Workspace<T>,
    ids: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let ids = ids_arg(ids, "input_ids")?;
    check_output::<T>("the output of forward", &[ids.len(), layer.hidden_size()])?;
    let (out, _) = py.detach(|| layer.forward_saved(ws, &ids)).or_raise()?;
    Ok(to_numpy_pooled(py, out, ws)?.into_any())
}

/// The tables' gradients of `Σ out ⊙ grad`: from the routed ids
/// straight, or (`through_tape`) by a forward and a backward on the tape.
fn backward<T: PyReal>(
    py: Python<'_>,
    layer: &SplitTokenEmbeddings<T>,
    ws: &Workspace<T>,
    [ids, grad]: [&Bound<'_, PyAny>; 2],
    through_tape: bool,
) -> PyResult<Vec<NamedGrad<T>>> {
    let ids = ids_arg(ids, "input_ids")?;
    check_output::<T>("the tables' gradients", &[ids.len(), layer.hidden_size()])?;
    if !through_tape {
        let saved = layer.route(&ids).or_raise()?;
        let g = real_arg::<T>(grad, "grad_output")?;
        let gv = g.as_array();
        let grads = py.detach(|| layer.backward_saved(ws, &saved, gv.view()));
        return Ok(grads.or_raise()?.params);
    }
    let g = real_arg::<T>(grad, "grad_output")?;
    let mut want = ids.shape().to_vec();
    want.push(layer.hidden_size());
    check_shape(g.shape(), &want, "grad_output")?;
    let gv = g.as_array();
    let grads = {
        let mut tape = Tape::with_pool(ws);
        let out = layer.forward(&mut tape, ids.view()).or_raise()?;
        tape.backward_from(out, gv.view())
    };
    Ok(NamedGrad::of_module(layer, grads))
}

#[pymethods]
impl PyEmbeddings {
    /// ids of any shape → `(*ids.shape, H)`.
    fn forward<'py>(
        &self,
        py: Python<'py>,
        input_ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        crate::each!(&*self.read(py)?, l => forward(py, l, self.ws.of(), input_ids))
    }

    /// The tables' gradients of `Σ out ⊙ grad_output`: row-sparse, only the
    /// trainable splits that the ids reach.
    fn backward(
        &self,
        py: Python<'_>,
        input_ids: &Bound<'_, PyAny>,
        grad_output: &Bound<'_, PyAny>,
    ) -> PyResult<PyGradients> {
        let args = [input_ids, grad_output];
        crate::each!(&*self.read(py)?, l => Ok(gradients_of(backward(py, l, self.ws.of(), args, false)?, &self.ws)))
    }

    /// [`backward`] through the crate's tape (forward, `Σ out ⊙ g`,
    /// backward): the reference the direct path is tested against.
    fn backward_tape(
        &self,
        input_ids: &Bound<'_, PyAny>,
        grad_output: &Bound<'_, PyAny>,
    ) -> PyResult<PyGradients> {
        let (py, args) = (input_ids.py(), [input_ids, grad_output]);
        crate::each!(&*self.read(py)?, l => Ok(gradients_of(backward(py, l, self.ws.of(), args, true)?, &self.ws)))
    }
}
