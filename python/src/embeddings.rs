//! `SplitTokenEmbeddings` for numpy arrays: the crate's layer through its
//! tape-free pair (`forward_saved`; `route`, then `backward_saved`).

use pyo3::prelude::*;
use pyo3::types::PyAny;
use splitgrad::Tape;
use splitgrad::layers::{NamedGrad, SplitTokenEmbeddings, Workspace};
use splitgrad::state::Module;

use crate::convert::{OrRaise, PyReal, check_shape, ids_arg};
use crate::gradients::{PyGradients, gradients_of};
use crate::halfio::{Act, act_arg, half_bits_arg, input_arg, output, output_bits, with_half_view};
use crate::layer::{
    ByDtype, Workspaces, check_output, check_output_bytes, layer_class, split_layer_methods,
};
use crate::optim::PyOptimizer;
use half::vec::{HalfBitsVecExt, HalfFloatVecExt};
use pyo3::exceptions::PyValueError;
use splitgrad::optim::Optimizer;
use splitgrad::param::{Dtype as StorageDtype, Stored};

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
    ws: &Workspaces,
    ids: &Bound<'py, PyAny>,
    act: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let act = act_arg(act, crate::convert::dtype_of::<T>())?;
    let ids = ids_arg(ids, "input_ids")?;
    let dims = [ids.len(), layer.hidden_size()];
    let tables_in = |d: StorageDtype| layer.parameters().iter().all(|p| p.dtype() == d);
    let same = match act {
        Some(Act::BF16) => tables_in(StorageDtype::BF16),
        Some(Act::F16) => tables_in(StorageDtype::F16),
        None => false,
    };
    match act {
        // Rows copied bit for bit: the half-precision output alone.
        Some(a) if same => check_output_bytes("the output of forward", &dims, 2, a.short())?,
        _ => check_output::<T>("the output of forward", &dims, act)?,
    }
    if let (true, Some(act)) = (same, act) {
        // Tables and activations of one half type: the rows copied bit
        // for bit into the output, in a buffer numpy gave back before.
        let n = ids.len() * layer.hidden_size();
        let spare = ws.bits.take(n);
        ws.of::<T>()
            .give_half_vec::<half::bf16>(spare.reinterpret_into());
        let (out, _) = py
            .detach(|| layer.forward_saved_stored(ws.of(), &ids))
            .or_raise()?;
        let shape = out.shape().to_vec();
        let bits = match out {
            Stored::BF16(a) => a.into_raw_vec_and_offset().0.reinterpret_into(),
            Stored::F16(a) => a.into_raw_vec_and_offset().0.reinterpret_into(),
            Stored::Full(a) => return output(py, a, Some(act), ws),
        };
        return output_bits(py, bits, &shape, act, ws);
    }
    let (out, _) = py
        .detach(|| layer.forward_saved(ws.of(), &ids))
        .or_raise()?;
    output(py, out, act, ws)
}

/// The tables' gradients of `Σ out ⊙ grad`: from the routed ids
/// straight, or (`through_tape`) by a forward and a backward on the tape.
fn backward<'py, T: PyReal>(
    py: Python<'py>,
    layer: &SplitTokenEmbeddings<T>,
    wss: &Workspaces,
    [ids, grad]: [&Bound<'py, PyAny>; 2],
    through_tape: bool,
    act: Option<&Bound<'py, PyAny>>,
) -> PyResult<Vec<NamedGrad<T>>> {
    let ws: &Workspace<T> = wss.of();
    let act = act_arg(act, crate::convert::dtype_of::<T>())?;
    let ids = ids_arg(ids, "input_ids")?;
    check_output::<T>(
        "the tables' gradients",
        &[ids.len(), layer.hidden_size()],
        None,
    )?;
    if !through_tape && let Some(act) = act {
        // A half-precision upstream gradient is read as it is: its rows
        // widened as they are summed.
        let saved = layer.route(&ids).or_raise()?;
        let bits = half_bits_arg(grad, "grad_output", act)?;
        let grads = with_half_view::<T, _>(&bits, act, |g| {
            py.detach(|| layer.backward_saved(ws, &saved, g))
        });
        return Ok(grads.or_raise()?.params);
    }
    if !through_tape {
        let saved = layer.route(&ids).or_raise()?;
        let g = input_arg::<T>(grad, "grad_output", act, wss)?;
        let gv = g.view();
        let grads = py.detach(|| layer.backward_saved(ws, &saved, gv.view()));
        return Ok(grads.or_raise()?.params);
    }
    let g = input_arg::<T>(grad, "grad_output", act, wss)?;
    let mut want = ids.shape().to_vec();
    want.push(layer.hidden_size());
    check_shape(g.view().shape(), &want, "grad_output")?;
    let gv = g.view();
    let grads = {
        let mut tape = Tape::with_pool(ws);
        let out = layer.forward(&mut tape, ids.view()).or_raise()?;
        tape.backward_from(out, gv.view())
    };
    Ok(NamedGrad::of_module(layer, grads))
}

/// [`PyEmbeddings::backward_step`] for the layer's real type: `opt`'s
/// update of every table the ids reach from the gradient of
/// `Σ out ⊙ grad`, each touched row summed and updated in one pass.
fn backward_step<'py, T: PyReal>(
    py: Python<'py>,
    layer: &mut SplitTokenEmbeddings<T>,
    opt: &mut (dyn Optimizer<T> + Send + Sync),
    wss: &Workspaces,
    [ids, grad]: [&Bound<'py, PyAny>; 2],
    act: Option<&Bound<'py, PyAny>>,
) -> PyResult<()> {
    let ws: &Workspace<T> = wss.of();
    let act = act_arg(act, crate::convert::dtype_of::<T>())?;
    let ids = ids_arg(ids, "input_ids")?;
    let saved = layer.route(&ids).or_raise()?;
    if let Some(act) = act {
        // A half-precision upstream gradient is read as it is: its rows
        // widened as they are summed.
        let bits = half_bits_arg(grad, "grad_output", act)?;
        return with_half_view::<T, _>(&bits, act, |g| {
            py.detach(|| {
                layer.backward_update_saved(ws, &saved, g, &mut |p, g| {
                    opt.update_sparse_by_rows(p, g)
                })
            })
        })
        .or_raise();
    }
    let g = input_arg::<T>(grad, "grad_output", act, wss)?;
    let gv = g.view();
    py.detach(|| {
        layer.backward_update_saved(ws, &saved, gv.view(), &mut |p, g| {
            opt.update_sparse_by_rows(p, g)
        })
    })
    .or_raise()
}

#[pymethods]
impl PyEmbeddings {
    /// ids of any shape → `(*ids.shape, H)`, of the layer's `dtype`, or
    /// with `act="bfloat16"` / `"float16"` rounded once to that type (bf16
    /// as a uint16 array of its bits).
    #[pyo3(signature = (input_ids, act = None))]
    fn forward<'py>(
        &self,
        py: Python<'py>,
        input_ids: &Bound<'py, PyAny>,
        act: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        crate::each!(&*self.read(py)?, l => forward(py, l, &self.ws, input_ids, act))
    }

    /// The tables' gradients of `Σ out ⊙ grad_output`: row-sparse, only the
    /// trainable splits that the ids reach. `act`: the dtype of
    /// `grad_output` when it is bfloat16 (a uint16 array of its bits) or
    /// float16 (widened exactly).
    #[pyo3(signature = (input_ids, grad_output, act = None))]
    fn backward<'py>(
        &self,
        py: Python<'py>,
        input_ids: &Bound<'py, PyAny>,
        grad_output: &Bound<'py, PyAny>,
        act: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<PyGradients> {
        let args = [input_ids, grad_output];
        crate::each!(&*self.read(py)?, l => Ok(gradients_of(backward(py, l, &self.ws, args, false, act)?, &self.ws)))
    }

    /// `optimizer`'s update of the tables from the gradient of
    /// `Σ out ⊙ grad_output` (the gradients `backward` returns), each
    /// touched row summed into a buffer and updated at once, so the
    /// gradients are never stored: the bits of
    /// `optimizer.step(self, self.backward(input_ids, grad_output))`. The
    /// optimiser is locked first, then the layer, as `Optimizer.step` locks
    /// them. `act` as in `backward`.
    #[pyo3(signature = (input_ids, grad_output, optimizer, act = None))]
    fn backward_step<'py>(
        &self,
        py: Python<'py>,
        input_ids: &Bound<'py, PyAny>,
        grad_output: &Bound<'py, PyAny>,
        optimizer: &Bound<'py, PyOptimizer>,
        act: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<()> {
        let args = [input_ids, grad_output];
        let opt = optimizer.get();
        let mut o = opt.write(py)?;
        let mut l = self.write(py)?;
        match (&mut *l, &mut *o) {
            (ByDtype::F32(l), ByDtype::F32(o)) => {
                backward_step(py, l, o.as_mut(), &self.ws, args, act)
            }
            (ByDtype::F64(l), ByDtype::F64(o)) => {
                backward_step(py, l, o.as_mut(), &self.ws, args, act)
            }
            _ => Err(PyValueError::new_err(format!(
                "backward_step: a {} layer and a {} optimiser",
                self.dt.name(),
                opt.dtype().name()
            ))),
        }
    }

    /// [`backward`] through the crate's tape (forward, `Σ out ⊙ g`,
    /// backward): the reference the direct path is tested against.
    #[pyo3(signature = (input_ids, grad_output, act = None))]
    fn backward_tape<'py>(
        &self,
        input_ids: &Bound<'py, PyAny>,
        grad_output: &Bound<'py, PyAny>,
        act: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<PyGradients> {
        let (py, args) = (input_ids.py(), [input_ids, grad_output]);
        crate::each!(&*self.read(py)?, l => Ok(gradients_of(backward(py, l, &self.ws, args, true, act)?, &self.ws)))
    }
}
