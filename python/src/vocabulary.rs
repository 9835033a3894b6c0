//! `SplitVocabulary` for numpy arrays: the crate's layer through its
//! tape-free pair (`forward_saved`; `route`, then `backward_saved`), its
//! penalties, and one optimiser step of rows and gates from the
//! gradients of several forward passes (`fused_step`).

use numpy::PyUntypedArrayMethods;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyAny;
use splitgrad::io::SplitIndex;
use splitgrad::layers::{
    NO_ROW, NamedGrad, RowsBlocks, SplitVocabulary, SplitVocabularyConfig, Workspace,
};
use splitgrad::optim::Optimizer;
use splitgrad::param::{Dtype as StorageDtype, ParamGrad};
use splitgrad::state::Module;
use splitgrad::{Error, ErrorKind, RowSparse, Tape};

use crate::convert::{Dtype, OrRaise, PyReal, dtype_of, ids_arg, py_err, real_arg, to_numpy};
use crate::gradients::{PyGradients, Source, give_back, gradients_of, merge};
use crate::halfio::{Act, act_arg, input_arg, output};
use crate::layer::{
    ByDtype, Workspaces, check_output, dtype_arg, layer_class, positive, size_getters, std_layout,
};
use crate::optim::PyOptimizer;
use crate::params::storage_dtype;

layer_class!(
    /// `SplitVocabulary(language_index, token_index, vocab_size, dim, n_languages, gate_init=0.0, dtype="float32")`;
    /// `SplitVocabulary.from_npz(path, vocab_size, dim, n_languages, gate_init=0.0, dtype="float32")`.
    PyVocabulary,
    "SplitVocabulary",
    SplitVocabulary
);
size_getters!(PyVocabulary: n_rows, dim, vocab_size, n_languages);

/// The sizes, each ≥ 0.
fn config(
    vocab_size: i64,
    dim: i64,
    n_languages: i64,
    gate_init: f64,
) -> PyResult<SplitVocabularyConfig> {
    Ok(SplitVocabularyConfig {
        vocab_size: positive(vocab_size, "vocab_size")?,
        dim: positive(dim, "dim")?,
        n_languages: positive(n_languages, "n_languages")?,
        gate_init,
    })
}

/// Builds the layer from ids that may be negative: a negative id is put
/// out of range for the crate's checks, which keep their order, and the
/// error then names the id as given.
fn vocab_new<T: PyReal>(
    languages: &[i64],
    tokens: &[i64],
    score: Option<Vec<f64>>,
    cfg: &SplitVocabularyConfig,
    kept: Option<StorageDtype>,
) -> splitgrad::Result<SplitVocabulary<T>> {
    let as_usize = |v: &[i64]| -> Vec<usize> {
        v.iter()
            .map(|&x| usize::try_from(x).unwrap_or(usize::MAX))
            .collect()
    };
    let mut index = SplitIndex::new(as_usize(languages), as_usize(tokens));
    index.score = score;
    let kept = kept.unwrap_or(StorageDtype::of::<T>());
    SplitVocabulary::with_dtype(index, cfg, kept).map_err(|e| match e.kind() {
        ErrorKind::OutOfRange {
            what,
            position,
            low,
            high,
            ..
        } => {
            let given = if what.starts_with("language") {
                languages
            } else {
                tokens
            };
            let value = given[position[0]];
            let array = e.array().map(str::to_string);
            let mut out = Error::out_of_range(what, position.clone(), value, *low, *high);
            if let Some(a) = array {
                out = out.in_array(a);
            }
            out
        }
        _ => e,
    })
}

/// `rows[i] = table[token_index[i]]`, in the rows' own buffer.
fn seed_rows<T: PyReal>(
    py: Python<'_>,
    sv: &mut SplitVocabulary<T>,
    table: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let t = real_arg::<T>(table, "table")?;
    let tv = t.as_array();
    py.detach(|| sv.seed_from(tv.view())).or_raise()
}

fn forward<'py, T: PyReal>(
    py: Python<'py>,
    sv: &SplitVocabulary<T>,
    wss: &Workspaces,
    args: [&Bound<'py, PyAny>; 3],
    use_gate: bool,
    act: Option<Act>,
) -> PyResult<Bound<'py, PyAny>> {
    let ws: &Workspace<T> = wss.of();
    let tokens = ids_arg(args[0], "token_ids")?;
    let langs = ids_arg(args[1], "language_ids")?;
    let shared = input_arg::<T>(args[2], "shared", act, wss)?;
    let sv_ = std_layout(shared.view(), "shared")?;
    check_output::<T>("the output of forward", sv_.shape(), act)?;
    let out = py.detach(|| sv.forward_saved(ws, &tokens, &langs, sv_.view(), use_gate));
    output(py, out.or_raise()?.0, act, wss)
}

/// `(∂shared, the gradients of rows and gate_logit)`.
type Grads<T> = (Option<ndarray::ArrayD<T>>, Vec<NamedGrad<T>>);

fn backward<T: PyReal>(
    py: Python<'_>,
    sv: &SplitVocabulary<T>,
    wss: &Workspaces,
    args: [&Bound<'_, PyAny>; 4],
    use_gate: bool,
    want_shared: bool,
    act: Option<Act>,
) -> PyResult<Grads<T>> {
    let ws: &Workspace<T> = wss.of();
    let tokens = ids_arg(args[0], "token_ids")?;
    let langs = ids_arg(args[1], "language_ids")?;
    let shared = input_arg::<T>(args[2], "shared", act, wss)?;
    let g = input_arg::<T>(args[3], "grad_output", act, wss)?;
    let s_ = std_layout(shared.view(), "shared")?;
    check_output::<T>("the gradient of shared", s_.shape(), act)?;
    let gv = g.view();
    let res = py.detach(|| {
        let saved = sv.route(&tokens, &langs, s_.shape())?;
        sv.backward_saved(ws, &saved, s_.view(), gv.view(), use_gate, want_shared)
    });
    let g = res.or_raise()?;
    Ok((g.input, g.params))
}

/// The distances `fusion_norms` names, one per row, copied out of the
/// array (n_rows elements).
fn norms_arg<T: PyReal>(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<T>>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let a = real_arg::<T>(obj, "fusion_norms")?;
    if a.ndim() != 1 {
        return Err(py_err(
            Error::shape("fusion_norms", "(n_rows,)", a.shape()).in_array("fusion_norms"),
        ));
    }
    Ok(Some(a.as_array().iter().copied().collect()))
}

/// The gradients of `penalty_weight·penalty + fusion_weight·fusion_penalty`.
/// With `norms` (from `fusion_penalty_norms`, for the rows as they are),
/// the fusion penalty's backward runs without its forward pass.
fn penalty_backward<T: PyReal>(
    py: Python<'_>,
    sv: &SplitVocabulary<T>,
    pool: &Workspace<T>,
    penalty_weight: f64,
    fusion_weight: f64,
    norms: Option<Vec<T>>,
) -> PyResult<Vec<NamedGrad<T>>> {
    if !penalty_weight.is_finite() || !fusion_weight.is_finite() {
        return Err(PyValueError::new_err(format!(
            "the penalty weights must be finite, got {penalty_weight} and {fusion_weight}"
        )));
    }
    let res = py.detach(|| -> splitgrad::Result<Vec<NamedGrad<T>>> {
        let mut tape = Tape::with_pool(pool);
        let mut terms = Vec::new();
        if penalty_weight != 0.0 {
            let p = sv.penalty_var(&mut tape);
            terms.push(tape.scale(p, T::from_f64(penalty_weight)));
        }
        let mut fusion_rows = None;
        if fusion_weight != 0.0 && sv.n_rows() > 0 {
            match &norms {
                Some(n) => {
                    fusion_rows =
                        Some(sv.fusion_penalty_grad(pool, n, T::from_f64(fusion_weight))?)
                }
                None => {
                    let f = sv.fusion_penalty_var(&mut tape);
                    terms.push(tape.scale(f, T::from_f64(fusion_weight)));
                }
            }
        }
        let mut entries = match terms.first().copied() {
            None => Vec::new(),
            Some(mut total) => {
                for &t in &terms[1..] {
                    total = tape.add(total, t);
                }
                NamedGrad::of_module(sv, tape.backward(total))
            }
        };
        if let Some(g) = fusion_rows {
            entries.push(NamedGrad::new(sv.rows(), ParamGrad::Dense(g)));
        }
        Ok(entries)
    });
    res.or_raise()
}

#[pymethods]
impl PyVocabulary {
    #[new]
    #[pyo3(signature = (language_index, token_index, vocab_size, dim, n_languages, gate_init = 0.0, dtype = None, score = None, storage = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        language_index: &Bound<'_, PyAny>,
        token_index: &Bound<'_, PyAny>,
        vocab_size: i64,
        dim: i64,
        n_languages: i64,
        gate_init: f64,
        dtype: Option<&Bound<'_, PyAny>>,
        score: Option<Vec<f64>>,
        storage: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let l = ids_arg(language_index, "language_index")?;
        let t = ids_arg(token_index, "token_index")?;
        for (a, name) in [(&l, "language_index"), (&t, "token_index")] {
            if a.ndim() != 1 {
                return Err(py_err(
                    Error::shape(name, "(n_rows,)", a.shape()).in_array(name),
                ));
            }
        }
        let cfg = config(vocab_size, dim, n_languages, gate_init)?;
        let (l, t) = (l.into_raw_vec_and_offset().0, t.into_raw_vec_and_offset().0);
        let dt = dtype_arg(dtype, Dtype::F32)?;
        let kept = storage.map(storage_dtype).transpose()?;
        Ok(Self::of(
            crate::by_dtype!(dt, T => vocab_new::<T>(&l, &t, score, &cfg, kept).or_raise()?),
        ))
    }

    /// Reads the index from an `.npz` file (`language_index`,
    /// `token_index`, optional `score`). `storage`: how the rows and gate
    /// logits are kept (bfloat16 or float16, allocated as such; the
    /// layer's `dtype` by default).
    #[staticmethod]
    #[pyo3(signature = (path, vocab_size, dim, n_languages, gate_init = 0.0, dtype = None, storage = None))]
    fn from_npz(
        path: std::path::PathBuf,
        vocab_size: i64,
        dim: i64,
        n_languages: i64,
        gate_init: f64,
        dtype: Option<&Bound<'_, PyAny>>,
        storage: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let cfg = config(vocab_size, dim, n_languages, gate_init)?;
        let dt = dtype_arg(dtype, Dtype::F32)?;
        let kept = storage.map(storage_dtype).transpose()?;
        Ok(Self::of(crate::by_dtype!(dt, T => {
            let kept = kept.unwrap_or(StorageDtype::of::<T>());
            SplitVocabulary::<T>::from_npz_with_dtype(&path, &cfg, kept).or_raise()?
        })))
    }

    /// `(language_index, token_index)`, int64.
    fn index<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let (l, t) = crate::each!(&*self.read(py)?, s => {
            let i = s.index();
            (
                i.language_index.iter().map(|&x| x as i64).collect::<ndarray::Array1<i64>>(),
                i.token_index.iter().map(|&x| x as i64).collect::<ndarray::Array1<i64>>(),
            )
        });
        Ok((to_numpy(py, l).into_any(), to_numpy(py, t).into_any()))
    }

    /// The row of each (language, token) pair, −1 for none: token_ids and
    /// language_ids of one length.
    fn rows_of<'py>(
        &self,
        py: Python<'py>,
        token_ids: &Bound<'py, PyAny>,
        language_ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let t = ids_arg(token_ids, "token_ids")?;
        let l = ids_arg(language_ids, "language_ids")?;
        let (t, l) = (
            t.iter().copied().collect::<Vec<_>>(),
            l.iter().copied().collect::<Vec<_>>(),
        );
        let rows = crate::each!(&*self.read(py)?, s => s.rows_of(&t, &l).or_raise()?);
        let rows: ndarray::Array1<i64> = rows
            .iter()
            .map(|&r| if r == NO_ROW { -1 } else { r as i64 })
            .collect();
        Ok(to_numpy(py, rows).into_any())
    }

    /// `rows[i] = table[token_index[i]]`; table (V, D) of the layer's dtype.
    fn seed_from(&self, py: Python<'_>, table: &Bound<'_, PyAny>) -> PyResult<()> {
        crate::each!(&mut *self.write(py)?, s => seed_rows(py, s, table))
    }

    /// σ(gate_logit), (n_rows).
    fn gate<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(crate::each!(&*self.read(py)?, s => to_numpy(py, s.gate()).into_any()))
    }

    /// mean(σ(gate_logit)).
    fn penalty(&self, py: Python<'_>) -> PyResult<f64> {
        Ok(crate::each!(&*self.read(py)?, s => splitgrad::Real::to_f64(s.penalty())))
    }

    /// `(1/n_rows) Σ_i ‖rows_i − c(token_i)‖₂`.
    fn fusion_penalty(&self, py: Python<'_>) -> PyResult<f64> {
        Ok(
            crate::each!(&*self.read(py)?, s => py.detach(|| splitgrad::Real::to_f64(s.fusion_penalty()))),
        )
    }

    /// `(fusion_penalty, norms)`: the value and each row's distance from
    /// its token's centroid, (n_rows), which `penalty_backward` and
    /// `fused_step` take as `fusion_norms` to skip the forward pass.
    fn fusion_penalty_norms<'py>(&self, py: Python<'py>) -> PyResult<(f64, Bound<'py, PyAny>)> {
        Ok(crate::each!(&*self.read(py)?, s => {
            let (v, n) = py.detach(|| s.fusion_penalty_norms());
            (splitgrad::Real::to_f64(v), to_numpy(py, n).into_any())
        }))
    }

    /// token_ids (…), language_ids (…), shared (…, D) → (…, D). `act`
    /// (here and in `backward`): `shared`, the upstream gradient and the
    /// results in bfloat16 (as uint16 bits) or float16 instead of `dtype`.
    #[pyo3(signature = (token_ids, language_ids, shared, use_gate = true, act = None))]
    fn forward<'py>(
        &self,
        py: Python<'py>,
        token_ids: &Bound<'py, PyAny>,
        language_ids: &Bound<'py, PyAny>,
        shared: &Bound<'py, PyAny>,
        use_gate: bool,
        act: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let args = [token_ids, language_ids, shared];
        let act = act_arg(act, self.dt)?;
        crate::each!(&*self.read(py)?, s => forward(py, s, &self.ws, args, use_gate, act))
    }

    /// The gradients of `Σ out ⊙ grad_output`: `(grad_shared, Gradients)`
    /// of rows (row-sparse) and gate_logit.
    #[pyo3(signature = (token_ids, language_ids, shared, grad_output, use_gate = true, shared_grad = true, act = None))]
    #[allow(clippy::too_many_arguments)]
    fn backward<'py>(
        &self,
        py: Python<'py>,
        token_ids: &Bound<'py, PyAny>,
        language_ids: &Bound<'py, PyAny>,
        shared: &Bound<'py, PyAny>,
        grad_output: &Bound<'py, PyAny>,
        use_gate: bool,
        shared_grad: bool,
        act: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(Option<Bound<'py, PyAny>>, PyGradients)> {
        let args = [token_ids, language_ids, shared, grad_output];
        let act = act_arg(act, self.dt)?;
        crate::each!(&*self.read(py)?, s => {
            let (g, e) = backward(py, s, &self.ws, args, use_gate, shared_grad, act)?;
            let g = g.map(|a| output(py, a, act, &self.ws));
            Ok((g.transpose()?, gradients_of(e, &self.ws)))
        })
    }

    /// The gradients of `penalty_weight·penalty + fusion_weight·fusion_penalty`.
    /// `fusion_norms`: the distances `fusion_penalty_norms` returned for
    /// the rows as they still are; the backward then skips the fusion
    /// penalty's forward pass (distances of other rows give a wrong
    /// gradient).
    #[pyo3(signature = (penalty_weight = 1.0, fusion_weight = 1.0, fusion_norms = None))]
    fn penalty_backward(
        &self,
        py: Python<'_>,
        penalty_weight: f64,
        fusion_weight: f64,
        fusion_norms: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyGradients> {
        Ok(crate::each!(&*self.read(py)?, s => gradients_of(
            penalty_backward(
                py,
                s,
                self.ws.of(),
                penalty_weight,
                fusion_weight,
                norms_arg(fusion_norms)?,
            )?,
            &self.ws,
        )))
    }

    /// One optimiser step of the rows (`rows_optimizer`) and the gate
    /// logits (`gate_optimizer`) from the gradients of the forward passes
    /// (`grads`, a list of Gradients) plus those of
    /// `penalty_weight·penalty + fusion_weight·fusion_penalty`, summed.
    /// `fusion_norms`: as for `penalty_backward`.
    #[pyo3(signature = (grads, penalty_weight, fusion_weight, rows_optimizer, gate_optimizer, fusion_norms = None))]
    #[allow(clippy::too_many_arguments)]
    fn fused_step(
        &self,
        py: Python<'_>,
        grads: Vec<PyRef<'_, PyGradients>>,
        penalty_weight: f64,
        fusion_weight: f64,
        rows_optimizer: &Bound<'_, PyOptimizer>,
        gate_optimizer: &Bound<'_, PyOptimizer>,
        fusion_norms: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let w = (penalty_weight, fusion_weight, fusion_norms);
        if rows_optimizer.is(gate_optimizer) {
            return Err(PyValueError::new_err(
                "fused_step: rows_optimizer and gate_optimizer are one optimiser; \
                 pass two (each keeps the state of its own parameters)",
            ));
        }
        // The optimisers first, by address, then the layer (`crate::sync`).
        let (ro, go) = (rows_optimizer.get(), gate_optimizer.get());
        let (mut r, mut g) = if rows_optimizer.as_ptr() < gate_optimizer.as_ptr() {
            let r = ro.write(py)?;
            (r, go.write(py)?)
        } else {
            let g = go.write(py)?;
            (ro.write(py)?, g)
        };
        let mut inner = self.write(py)?;
        let ws = &self.ws;
        match (&mut *inner, &mut *r, &mut *g) {
            (ByDtype::F32(sv), ByDtype::F32(r), ByDtype::F32(g)) => {
                fused_step(py, sv, ws.of(), &grads, w, r.as_mut(), g.as_mut())
            }
            (ByDtype::F64(sv), ByDtype::F64(r), ByDtype::F64(g)) => {
                fused_step(py, sv, ws.of(), &grads, w, r.as_mut(), g.as_mut())
            }
            _ => Err(PyValueError::new_err(
                "the layer and both optimisers must have one dtype",
            )),
        }
    }
}

/// `fused_step` for the layer's real type: the pieces' gradients checked
/// to be of it.
fn fused_step<T: PyReal>(
    py: Python<'_>,
    sv: &mut SplitVocabulary<T>,
    ws: &Workspace<T>,
    grads: &[PyRef<'_, PyGradients>],
    // The penalties' weights, and the fusion penalty's row distances if known.
    penalties: (f64, f64, Option<&Bound<'_, PyAny>>),
    rows_opt: &mut (dyn Optimizer<T> + Send + Sync),
    gate_opt: &mut (dyn Optimizer<T> + Send + Sync),
) -> PyResult<()> {
    let mut pieces = Vec::new();
    for x in grads {
        match T::grads(&x.inner) {
            Some(v) => pieces.push(v),
            None => {
                return Err(PyValueError::new_err(format!(
                    "{} gradients for a {} layer",
                    x.inner.dtype().name(),
                    dtype_of::<T>().name()
                )));
            }
        }
    }
    step_rows_and_gates(py, sv, ws, pieces, penalties, rows_opt, gate_opt)
}

/// One step of the rows and of the gate logits from the pieces'
/// gradients plus the penalties'.
fn step_rows_and_gates<T: PyReal>(
    py: Python<'_>,
    sv: &mut SplitVocabulary<T>,
    pool: &Workspace<T>,
    pieces: Vec<&[NamedGrad<T>]>,
    penalties: (f64, f64, Option<&Bound<'_, PyAny>>),
    rows_opt: &mut (dyn Optimizer<T> + Send + Sync),
    gate_opt: &mut (dyn Optimizer<T> + Send + Sync),
) -> PyResult<()> {
    let (penalty_weight, fusion_weight, norms) = penalties;
    let norms = norms_arg(norms)?;
    if let Some(n) = &norms {
        sv.check_norms(n).or_raise()?;
    }
    let rows_name = sv.rows().name().to_string();
    let entries = || pieces.iter().flat_map(|p| p.iter());
    // Gradients of another layer would be skipped without a word (matched
    // by parameter), or, by name, taken for this layer's rows.
    let own_ids = [sv.rows().id(), sv.gate_logit().id()];
    if let Some(e) = entries().find(|e| !own_ids.contains(&e.id)) {
        return Err(PyValueError::new_err(format!(
            "fused_step: the gradients hold `{}` of another layer, not this SplitVocabulary's; \
             pass the gradients of its own backward",
            e.name
        )));
    }
    // With the distances known and every forward's rows gradient row-sparse,
    // the rows' gradient is formed a block of rows at a time inside their
    // update: each block's norms and terms from its rows, then each row the
    // fusion penalty's row and each forward's row where it has one, in the
    // order the dense sum below adds them. The gradient is never stored.
    let by_blocks = fusion_weight.is_finite()
        && fusion_weight != 0.0
        && sv.n_rows() > 0
        && sv.rows().is_trainable()
        && norms.is_some()
        && entries()
            .filter(|e| e.name == rows_name)
            .all(|e| matches!(e.grad, ParamGrad::RowSparse(_)));
    // The penalties' gradients (without the fusion penalty's when it is
    // formed by blocks), plus the forward passes' not formed by blocks.
    let (own_weight, own_norms) = if by_blocks {
        (0.0, None)
    } else {
        (fusion_weight, norms)
    };
    let own = penalty_backward(py, sv, pool, penalty_weight, own_weight, own_norms)?;
    let by_blocks_name = |e: &&NamedGrad<T>| by_blocks && e.name == rows_name;
    let (own, borrowed) = merge(own, entries().filter(|e| !by_blocks_name(e)));
    let src = Source(own.iter().chain(borrowed.iter().copied()).collect());
    let rows_step = if by_blocks {
        let parts: Vec<&RowSparse<T>> = entries()
            .filter(by_blocks_name)
            .filter_map(|e| match &e.grad {
                ParamGrad::RowSparse(rs) => Some(rs),
                ParamGrad::Dense(_) => None,
            })
            .collect();
        let (rows, blocks) = sv.rows_and_fusion_blocks(T::from_f64(fusion_weight));
        py.detach(|| rows_opt.update_by_blocks(rows, &RowsBlocks::new(&blocks, &parts)))
    } else {
        let rows = sv.rows_mut();
        py.detach(|| rows_opt.step(vec![rows], &src))
    };
    let gates = sv.gate_logit_mut();
    let r = rows_step.and_then(|()| py.detach(|| gate_opt.step(vec![gates], &src)));
    drop(src);
    give_back(own, pool);
    r.or_raise()
}
