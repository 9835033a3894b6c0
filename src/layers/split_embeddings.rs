//! `SplitTokenEmbeddings`: named embedding tables, each owning a contiguous
//! range of one global vocabulary (parity with d9d's layer of that name).
//!
//! `out[…, :] = table_k[id − start_k]` for the split k that owns `id`.
//! Gradients are row-sparse: only rows read in the batch carry gradient, a
//! token routed to split k sends nothing to any other split, and a frozen
//! split receives nothing. Derivation: `docs/gradients.md#gather` and
//! `docs/gradients.md#split-routing`.

use ndarray::{ArrayD, ArrayViewD, CowArray, Ix2};

use super::{Ids, LayerGrads, NamedGrad, SplitTables, Workspace};
use crate::error::{Error, Result};
use crate::kernels::Real;
use crate::kernels::routing::Routed;
use crate::kernels::scatter::{Coalescing, RowSource, SourceElem, coalesce_sources_in};
use crate::ops::split_gather::{split_gather_half_in, split_gather_stored_in};
use crate::param::{Dtype, ParamGrad, Parameter, RowSparse, SparseRowGradient, Stored, StoredView};
use crate::rng::Rng;
use crate::state::Module;
use crate::tape::{Tape, Var};

/// What [`SplitTokenEmbeddings::backward_saved`] needs of a forward pass:
/// the ids, checked and routed to their splits
/// ([`SplitTokenEmbeddings::route`]).
#[derive(Clone, Debug)]
pub struct EmbeddingsSaved {
    routed: Routed,
    ids_shape: Vec<usize>,
}

impl EmbeddingsSaved {
    /// The ids' shape.
    pub fn ids_shape(&self) -> &[usize] {
        &self.ids_shape
    }
}

/// Token embeddings made of several named tables (splits).
///
/// The d9d documentation's prompt-tuning case — the original vocabulary
/// frozen, 16 new prompt tokens trained:
///
/// ```
/// use ndarray::array;
/// use splitgrad::{layers::SplitTokenEmbeddings, Rng, Tape};
/// let mut emb = SplitTokenEmbeddings::<f32>::new(&[("orig", 1000), ("prompt", 16)], &["orig", "prompt"], 8)?;
/// emb.reset_parameters(&mut Rng::new(0));
/// emb.set_trainable("orig", false)?;
/// let ids = array![[1i64, 2, 1000, 1001]];
/// let mut tape = Tape::new();
/// let hidden = emb.forward(&mut tape, &ids)?; // (1, 4, 8)
/// assert_eq!(tape.value(hidden).shape(), &[1, 4, 8]);
/// let loss = tape.sum(hidden);
/// let grads = tape.backward(loss);
/// assert!(grads.param(emb.split("orig").unwrap()).is_none());
/// assert!(grads.param(emb.split("prompt").unwrap()).is_some());
/// # Ok::<(), splitgrad::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct SplitTokenEmbeddings<T> {
    splits: SplitTables<T>,
}

impl<T: Real> SplitTokenEmbeddings<T> {
    /// Builds the layer from split sizes, their order and the hidden size;
    /// the tables start at zero (call [`Self::reset_parameters`]).
    ///
    /// Errors: empty order; a name in the order with no size; a name twice;
    /// a sized split missing from the order; hidden size 0.
    ///
    /// ```
    /// use splitgrad::layers::SplitTokenEmbeddings;
    /// assert!(SplitTokenEmbeddings::<f32>::new(&[("orig", 4)], &[] as &[&str], 8).is_err());
    /// ```
    pub fn new<S: AsRef<str>, O: AsRef<str>>(
        split_vocab_size: &[(S, usize)],
        split_order: &[O],
        hidden_size: usize,
    ) -> Result<Self> {
        Self::with_dtype(split_vocab_size, split_order, hidden_size, Dtype::of::<T>())
    }

    /// [`Self::new`] with the tables kept as `dtype` from the start (bf16
    /// or f16 tables never pass through f32: the layer costs their bytes
    /// only). Errors: those of [`Self::new`]; f64 tables in an f32 layer.
    ///
    /// ```
    /// use splitgrad::{layers::SplitTokenEmbeddings, param::Dtype, state::Module};
    /// let e = SplitTokenEmbeddings::<f32>::with_dtype(&[("orig", 100), ("prompt", 4)], &["orig", "prompt"], 8, Dtype::BF16)?;
    /// assert_eq!(e.parameter_bytes(), 104 * 8 * 2);
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn with_dtype<S: AsRef<str>, O: AsRef<str>>(
        split_vocab_size: &[(S, usize)],
        split_order: &[O],
        hidden_size: usize,
        dtype: Dtype,
    ) -> Result<Self> {
        Ok(SplitTokenEmbeddings {
            splits: SplitTables::with_dtype(
                "token_embedding",
                split_vocab_size,
                split_order,
                hidden_size,
                dtype,
            )?,
        })
    }

    /// Every element N(0, 1), as `nn.Embedding.reset_parameters`.
    ///
    /// ```
    /// use splitgrad::{layers::SplitTokenEmbeddings, Rng};
    /// let mut e = SplitTokenEmbeddings::<f64>::new(&[("a", 3)], &["a"], 2)?;
    /// e.reset_parameters(&mut Rng::new(1));
    /// assert!(e.split("a").unwrap().value().iter().all(|x| x.is_finite() && *x != 0.0));
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn reset_parameters(&mut self, rng: &mut Rng) {
        self.splits.fill(rng, |r| T::from_f64(r.normal()));
    }

    /// Looks up embeddings for global ids of any shape: → `(*ids.shape, H)`.
    ///
    /// An id outside `[0, V)` is an error naming the id, its position and
    /// the valid range (d9d would return a zero vector).
    ///
    /// ```
    /// use splitgrad::{layers::SplitTokenEmbeddings, Tape};
    /// let e = SplitTokenEmbeddings::<f32>::new(&[("a", 3)], &["a"], 2)?;
    /// let mut tape = Tape::new();
    /// let err = e.forward(&mut tape, &[0i64, 3]).unwrap_err();
    /// assert_eq!(err.to_string(), "input id 3 at position [1] is out of range 0..3");
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn forward<'p, 'i>(
        &'p self,
        tape: &mut Tape<'p, T>,
        input_ids: impl Ids<'i>,
    ) -> Result<Var> {
        let saved = self.route(input_ids)?;
        let tables: Vec<Var> = self.splits.tables().iter().map(|p| tape.param(p)).collect();
        Ok(tape.split_gather(&tables, &saved.routed, &saved.ids_shape))
    }

    /// The ids checked (the errors of [`Self::forward`]) and routed to
    /// their splits: what [`Self::backward_saved`] needs, without the
    /// forward pass.
    pub fn route<'i>(&self, input_ids: impl Ids<'i>) -> Result<EmbeddingsSaved> {
        let input_ids = input_ids.ids();
        Ok(EmbeddingsSaved {
            routed: self.splits.route(input_ids.view(), "input id")?,
            ids_shape: input_ids.shape().to_vec(),
        })
    }

    /// [`Self::forward`] without a tape: the embeddings `(*ids.shape, H)`
    /// in a buffer from `ws`, and the routing the backward needs. The same
    /// bits and errors as the tape.
    ///
    /// ```
    /// use ndarray::{array, Array2};
    /// use splitgrad::{layers::{SplitTokenEmbeddings, Workspace}, ParamGrad, Rng};
    /// let mut e = SplitTokenEmbeddings::<f32>::new(&[("a", 3), ("b", 2)], &["a", "b"], 2)?;
    /// e.reset_parameters(&mut Rng::new(0));
    /// let ws = Workspace::new();
    /// let (out, saved) = e.forward_saved(&ws, &array![[0i64, 4, 4]])?;
    /// assert_eq!(out.shape(), &[1, 3, 2]);
    /// let g = e.backward_saved(&ws, &saved, Array2::ones((3, 2)).into_shape_with_order((1, 3, 2)).unwrap().into_dyn().view())?;
    /// let Some(ParamGrad::RowSparse(b)) = g.get("token_embedding.b.weight") else { panic!() };
    /// assert_eq!((b.rows.clone(), b.values.row(0).to_vec()), (vec![1], vec![2.0, 2.0]));
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn forward_saved<'i>(
        &self,
        ws: &Workspace<T>,
        input_ids: impl Ids<'i>,
    ) -> Result<(ArrayD<T>, EmbeddingsSaved)> {
        let saved = self.route(input_ids)?;
        let views: Vec<StoredView<'_, T>> = self
            .splits
            .tables()
            .iter()
            .map(|p| p.stored().view())
            .collect();
        let out = split_gather_stored_in(ws, &views, &saved.routed, &saved.ids_shape);
        Ok((out, saved))
    }

    /// [`Self::forward_saved`] with the embeddings in the tables' dtype,
    /// as torch returns them: when every table is kept in the same half
    /// precision the rows are copied bit for bit into an output of that
    /// type (the f32 output rounded once, exactly: every value is
    /// representable), from a buffer of `ws`
    /// ([`Workspace::give_half_vec`] takes it back); otherwise the
    /// output of [`Self::forward_saved`].
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::{layers::{SplitTokenEmbeddings, Workspace}, param::Dtype, state::Module, Rng};
    /// let mut e = SplitTokenEmbeddings::<f32>::new(&[("a", 3), ("b", 2)], &["a", "b"], 2)?;
    /// e.reset_parameters(&mut Rng::new(0));
    /// e.set_dtype(Dtype::BF16)?;
    /// let ws = Workspace::new();
    /// let (out, _) = e.forward_saved_stored(&ws, &array![0i64, 4])?;
    /// let (wide, _) = e.forward_saved(&ws, &array![0i64, 4])?;
    /// assert_eq!(out.dtype(), Dtype::BF16);
    /// assert_eq!(out.widened().into_owned(), wide);
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn forward_saved_stored<'i>(
        &self,
        ws: &Workspace<T>,
        input_ids: impl Ids<'i>,
    ) -> Result<(Stored<T>, EmbeddingsSaved)> {
        let tables = self.splits.tables();
        let dtype = tables[0].dtype();
        if !dtype.is_half() || tables.iter().any(|p| p.dtype() != dtype) {
            let (out, saved) = self.forward_saved(ws, input_ids)?;
            return Ok((Stored::Full(out), saved));
        }
        let saved = self.route(input_ids)?;
        let (routed, shape) = (&saved.routed, &saved.ids_shape);
        let out = match dtype {
            Dtype::BF16 => {
                let views: Vec<_> = tables.iter().map(|p| half_view_bf16(p)).collect();
                Stored::BF16(split_gather_half_in(ws, &views, routed, shape))
            }
            _ => {
                let views: Vec<_> = tables.iter().map(|p| half_view_f16(p)).collect();
                Stored::F16(split_gather_half_in(ws, &views, routed, shape))
            }
        };
        Ok((out, saved))
    }

    /// The tables' gradients of `Σ out ⊙ grad_output` for the ids of
    /// `saved`: row-sparse, one per trainable split the ids reach, in split
    /// order, each in a buffer from `ws`; the bits of the tape's
    /// `backward_from(forward(…), grad_output)`. The upstream gradient may
    /// be kept in half precision ([`StoredView::BF16`],
    /// [`StoredView::F16`]), as a bf16 layer's is: its rows are widened as
    /// they are summed, the bits of the widened gradient's. Errors when
    /// `grad_output` is not `(*ids.shape, H)`.
    pub fn backward_saved<'g>(
        &self,
        ws: &Workspace<T>,
        saved: &EmbeddingsSaved,
        grad_output: impl Into<StoredView<'g, T>>,
    ) -> Result<LayerGrads<T>>
    where
        T: 'g,
    {
        match grad_output.into() {
            StoredView::Full(g) => self.backward_from_source(ws, saved, g),
            StoredView::BF16(g) => self.backward_from_source(ws, saved, g),
            StoredView::F16(g) => self.backward_from_source(ws, saved, g),
        }
    }

    /// [`Self::backward_saved`] and the update of every table it reaches,
    /// in one pass: `update` gets each trainable table the ids reach, in
    /// split order, with its gradient given row by row
    /// ([`SparseRowGradient`], a [`Coalescing`]), each row summed when it
    /// is asked for (or, where the table's touched rows are few enough to
    /// stay in cache, summed first in a buffer from `ws`, reading the
    /// gradient's rows front to back). With an optimiser's
    /// [`update_sparse_by_rows`](crate::optim::Optimizer::update_sparse_by_rows),
    /// each touched row's gradient is summed into a buffer of the task that
    /// then updates the row, while it is in cache, and the tables'
    /// gradients are never stored; the result is the optimiser's `update`
    /// of each gradient `backward_saved` returns, bit for bit. Errors as
    /// `backward_saved` (before any table moves) and as `update`.
    ///
    /// ```
    /// use ndarray::Array2;
    /// use splitgrad::layers::{SplitTokenEmbeddings, Workspace};
    /// use splitgrad::optim::{LazyAdam, LazyAdamConfig, Optimizer};
    /// use splitgrad::state::Module;
    /// # fn main() -> splitgrad::Result<()> {
    /// let mut a = SplitTokenEmbeddings::<f32>::new(&[("orig", 6), ("prompt", 2)], &["orig", "prompt"], 3)?;
    /// let mut b = a.clone();
    /// let ids = [0i64, 6, 3, 6];
    /// let g = Array2::from_shape_fn((4, 3), |(i, j)| (i + j) as f32 * 0.5);
    /// let (mut oa, mut ob) = (LazyAdam::new(LazyAdamConfig::default())?, LazyAdam::new(LazyAdamConfig::default())?);
    /// // Summed and updated in one pass…
    /// let saved = a.route(&ids)?;
    /// a.backward_update_saved(&Workspace::new(), &saved, g.view().into_dyn(), &mut |p, g| oa.update_sparse_by_rows(p, g))?;
    /// // …or the gradients first, then the update.
    /// let grads = b.backward_saved(&Workspace::new(), &b.route(&ids)?, g.view().into_dyn())?;
    /// for named in grads.params {
    ///     let p = b.parameters_mut().into_iter().find(|p| p.name() == named.name).unwrap();
    ///     ob.update(p, &named.grad)?;
    /// }
    /// assert_eq!(a.parameters()[0].value(), b.parameters()[0].value());
    /// assert_eq!(a.parameters()[1].value(), b.parameters()[1].value());
    /// # Ok(()) }
    /// ```
    pub fn backward_update_saved<'g>(
        &mut self,
        ws: &Workspace<T>,
        saved: &EmbeddingsSaved,
        grad_output: impl Into<StoredView<'g, T>>,
        update: &mut TableUpdate<'_, T>,
    ) -> Result<()>
    where
        T: 'g,
    {
        match grad_output.into() {
            StoredView::Full(g) => self.backward_update_from_source(ws, saved, g, update),
            StoredView::BF16(g) => self.backward_update_from_source(ws, saved, g, update),
            StoredView::F16(g) => self.backward_update_from_source(ws, saved, g, update),
        }
    }

    fn backward_update_from_source<S: SourceElem<T>>(
        &mut self,
        ws: &Workspace<T>,
        saved: &EmbeddingsSaved,
        grad_output: ArrayViewD<'_, S>,
        update: &mut TableUpdate<'_, T>,
    ) -> Result<()> {
        let routed = &saved.routed;
        let g2 = self.upstream_rows(saved, grad_output)?;
        for (k, p) in self.splits.tables_mut().iter_mut().enumerate() {
            let Some(source) = table_source(p, routed, k, g2.view()) else {
                continue;
            };
            let sources = [source];
            let n_rows = p.shape()[0];
            let plan = Coalescing::new(n_rows, g2.ncols(), &routed.local[k], &sources);
            if plan.sums_in_cache() {
                // Few rows: summed first in position order (the gradient's
                // rows read front to back; the sums stay in cache), then
                // updated.
                let rs = RowSparse::from_coalesced(n_rows, plan.coalesce_in(ws));
                let done = update(p, &rs);
                ws.give(rs.values);
                done?;
            } else {
                update(p, &plan)?;
            }
        }
        Ok(())
    }

    /// `grad_output` as one row per id of `saved`, `(n_ids, H)`, in
    /// standard layout (copied only if it is not); an error unless it is
    /// `(*ids.shape, H)`.
    fn upstream_rows<'a, S: Clone>(
        &self,
        saved: &EmbeddingsSaved,
        grad_output: ArrayViewD<'a, S>,
    ) -> Result<CowArray<'a, S, Ix2>> {
        let h = self.hidden_size();
        let mut want = saved.ids_shape.clone();
        want.push(h);
        if grad_output.shape() != want {
            let dims: Vec<String> = want.iter().map(|d| d.to_string()).collect();
            return Err(Error::shape(
                "grad_output",
                format!("({})", dims.join(", ")),
                grad_output.shape(),
            ));
        }
        let g: CowArray<'a, S, _> = if grad_output.is_standard_layout() {
            grad_output.into()
        } else {
            grad_output.as_standard_layout().into_owned().into()
        };
        Ok(g.into_shape_with_order((saved.routed.n_ids(), h))
            .expect("standard layout reshapes"))
    }

    fn backward_from_source<S: SourceElem<T>>(
        &self,
        ws: &Workspace<T>,
        saved: &EmbeddingsSaved,
        grad_output: ArrayViewD<'_, S>,
    ) -> Result<LayerGrads<T>> {
        let routed = &saved.routed;
        let g2 = self.upstream_rows(saved, grad_output)?;
        let mut params = Vec::new();
        for (k, p) in self.splits.tables().iter().enumerate() {
            let Some(source) = table_source(p, routed, k, g2.view()) else {
                continue;
            };
            let n_rows = p.shape()[0];
            let rs = RowSparse::from_coalesced(
                n_rows,
                coalesce_sources_in(ws, n_rows, g2.ncols(), &routed.local[k], &[source]),
            );
            params.push(NamedGrad::new(p, ParamGrad::RowSparse(rs)));
        }
        Ok(LayerGrads {
            input: None,
            params,
        })
    }
}

/// Where table k's gradient is summed from: the rows of the upstream
/// gradient `g2` (one per id) at the positions routed to it; `None` for a
/// frozen table or one no id reaches, which gets no gradient.
fn table_source<'a, T: Real, S>(
    table: &Parameter<T>,
    routed: &'a Routed,
    k: usize,
    g2: ndarray::ArrayView2<'a, S>,
) -> Option<RowSource<'a, T, S>> {
    (table.is_trainable() && !routed.positions[k].is_empty()).then(|| RowSource {
        values: g2,
        rows: Some(&routed.positions[k]),
        scale: None,
    })
}

/// What [`SplitTokenEmbeddings::backward_update_saved`] calls for each
/// table it reaches: the table and its gradient given row by row (an
/// optimiser's [`update_sparse_by_rows`](crate::optim::Optimizer::update_sparse_by_rows)).
pub type TableUpdate<'u, T> =
    dyn FnMut(&mut Parameter<T>, &dyn SparseRowGradient<T>) -> Result<()> + 'u;

super::splits::split_layer_api!(SplitTokenEmbeddings);

/// A bf16 table's values (checked by the caller).
fn half_view_bf16<T: Real>(p: &Parameter<T>) -> ArrayViewD<'_, half::bf16> {
    match p.stored() {
        Stored::BF16(a) => a.view(),
        _ => unreachable!("every table is bf16"),
    }
}

/// An f16 table's values (checked by the caller).
fn half_view_f16<T: Real>(p: &Parameter<T>) -> ArrayViewD<'_, half::f16> {
    match p.stored() {
        Stored::F16(a) => a.view(),
        _ => unreachable!("every table is f16"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::param::ParamGrad;
    use ndarray::array;

    #[test]
    fn routed_gradient_touches_only_the_owner() {
        // Splits a (2 rows) and b (2 rows); ids [3, 3, 0]: b's row 1 twice,
        // a's row 0 once. ∂b[1] = R[0] + R[1], ∂a[0] = R[2]; nothing else.
        let mut e =
            SplitTokenEmbeddings::<f64>::new(&[("a", 2), ("b", 2)], &["a", "b"], 2).unwrap();
        e.reset_parameters(&mut Rng::new(3));
        let ids = [3i64, 3, 0];
        let mut t = Tape::new();
        let y = e.forward(&mut t, &ids).unwrap();
        let r = array![[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]].into_dyn();
        let loss = t.dot_const(y, r);
        let g = t.backward(loss);
        let ParamGrad::RowSparse(gb) = g.param(e.split("b").unwrap()).unwrap() else {
            panic!("dense")
        };
        assert_eq!(gb.rows, vec![1]);
        assert_eq!(gb.values, array![[11.0, 22.0]]);
        let ParamGrad::RowSparse(ga) = g.param(e.split("a").unwrap()).unwrap() else {
            panic!("dense")
        };
        assert_eq!(ga.rows, vec![0]);
        assert_eq!(ga.values, array![[100.0, 200.0]]);
    }

    /// The backward inside the update equals the gradients stored, then
    /// the update, bit for bit: a table with few touched rows (summed
    /// first, in position order) and one with many wide rows (each summed
    /// as it is updated, its heaviest rows in runs of columns), a frozen
    /// split and one no id reaches; f32 and bf16 tables with bf16 state and
    /// a bf16 upstream gradient; 1, 2 and 4 threads; three steps.
    #[test]
    fn backward_inside_the_update_is_the_stored_gradients_update() {
        use crate::optim::{LazyAdam, LazyAdamConfig, Optimizer};
        use crate::param::Rounding;
        let h = 1024;
        let sizes = [("few", 12), ("many", 3000), ("frozen", 5), ("none", 4)];
        let mut base =
            SplitTokenEmbeddings::<f32>::new(&sizes, &["few", "many", "frozen", "none"], h)
                .unwrap();
        base.reset_parameters(&mut Rng::new(4));
        base.set_trainable("frozen", false).unwrap();
        // Zipf-like ids over "few" and "many" (and "frozen"): a few rows hit
        // hundreds of times.
        let mut rng = Rng::new(5);
        let ids: Vec<i64> = (0..3000)
            .map(|i| {
                let u = rng.uniform();
                match i % 10 {
                    0 => (12.0f64.powf(u) as i64 - 1).min(11),
                    1 => 3012 + (i as i64 / 10) % 5,
                    _ => 12 + (3000.0f64.powf(u * u) as i64 - 1).min(2999),
                }
            })
            .collect();
        let up = ArrayD::from_shape_fn(ndarray::IxDyn(&[3000, h]), |_| rng.normal() as f32);
        for dtype in [Dtype::F32, Dtype::BF16] {
            let g = Stored::from_full(up.clone(), dtype).unwrap();
            let fresh = || {
                let mut e = base.clone();
                e.set_dtype(dtype).unwrap();
                let mut o = LazyAdam::new(LazyAdamConfig::default()).unwrap();
                o.set_state_dtype(dtype).unwrap();
                o.set_rounding(Rounding::Stochastic { seed: 2 });
                (e, o)
            };
            let ws = Workspace::new();
            let mut want = fresh();
            for _ in 0..3 {
                let saved = want.0.route(&ids).unwrap();
                let grads = want.0.backward_saved(&ws, &saved, g.view()).unwrap();
                want.1.step(want.0.parameters_mut(), &grads).unwrap();
            }
            for threads in [1, 2, 4] {
                let pool = crate::kernels::threads(threads);
                let (mut e, mut o) = fresh();
                pool.install(|| {
                    for _ in 0..3 {
                        let saved = e.route(&ids).unwrap();
                        e.backward_update_saved(&ws, &saved, g.view(), &mut |p, g| {
                            o.update_sparse_by_rows(p, g)
                        })
                        .unwrap();
                    }
                });
                for (a, b) in e.parameters().iter().zip(want.0.parameters()) {
                    assert_eq!(
                        a.widened().mapv(f32::to_bits),
                        b.widened().mapv(f32::to_bits),
                        "{dtype}, {threads} threads: {}",
                        a.name()
                    );
                }
                assert!(
                    o.state() == want.1.state(),
                    "{dtype}, {threads} threads: state"
                );
            }
        }
    }

    #[test]
    fn reset_is_seeded() {
        let mut a = SplitTokenEmbeddings::<f32>::new(&[("x", 3000)], &["x"], 3).unwrap();
        let mut b = a.clone();
        a.reset_parameters(&mut Rng::new(9));
        b.reset_parameters(&mut Rng::new(9));
        assert_eq!(a.split("x").unwrap().value(), b.split("x").unwrap().value());
        let v = a.split("x").unwrap().value();
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.05, "{mean}");
    }
}

#[cfg(test)]
mod saved_tests {
    use super::*;
    use crate::layers::grads::testing::{assert_same_grads, bits, in_f32_and_f64};
    use ndarray::{IxDyn, array};

    fn saved_pair_is_the_tape<T: Real>() {
        let sizes = [("a", 5), ("b", 3), ("c", 4), ("d", 2)];
        let mut e = SplitTokenEmbeddings::<T>::new(&sizes, &["a", "b", "c", "d"], 3).unwrap();
        e.reset_parameters(&mut Rng::new(7));
        e.set_trainable("c", false).unwrap();
        // Rank-2 ids; b's rows repeat; c is frozen; d is not reached.
        let ids = array![[0i64, 6, 5, 9], [6, 1, 0, 11]];
        let mut rng = Rng::new(8);
        let up = ArrayD::from_shape_fn(IxDyn(&[2, 4, 3]), |_| T::from_f64(rng.normal()));
        let ws = Workspace::new();
        let (out, saved) = e.forward_saved(&ws, &ids).unwrap();
        let got = e.backward_saved(&ws, &saved, up.view()).unwrap();
        let mut tape = Tape::new();
        let y = e.forward(&mut tape, &ids).unwrap();
        assert_eq!(bits(out.view()), bits(tape.value(y)));
        let want = tape.backward_from(y, up.view());
        assert_same_grads(&e, &got, &want);
        assert!(got.input.is_none());
        assert_eq!(got.params.len(), 2);
        // A transposed upstream gradient: the same bits.
        let up_t = up.t().as_standard_layout().into_owned();
        let strided = up_t.t();
        let again = e.backward_saved(&ws, &saved, strided.view()).unwrap();
        assert_same_grads(&e, &again, &want);
    }

    in_f32_and_f64!(saved_pair_is_the_tape_f32_and_f64, saved_pair_is_the_tape);

    #[test]
    fn saved_pair_errors_are_the_tapes() {
        let e = SplitTokenEmbeddings::<f32>::new(&[("a", 3)], &["a"], 2).unwrap();
        let ws = Workspace::new();
        let err = e.forward_saved(&ws, &array![[0i64], [3]]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "input id 3 at position [1, 0] is out of range 0..3"
        );
        let saved = e.route(&[0i64, 1]).unwrap();
        let bad = ArrayD::<f32>::zeros(IxDyn(&[2, 3]));
        let err = e.backward_saved(&ws, &saved, bad.view()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "grad_output has shape [2, 3], expected (2, 2)"
        );
    }
}
