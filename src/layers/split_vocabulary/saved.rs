//! The split vocabulary's tape-free pair ([`SplitVocabulary::forward_saved`],
//! [`SplitVocabulary::backward_saved`]) and [`SplitVocabulary::backward_from`]:
//! the gated mix and its backward without a tape, for a caller whose
//! forward and backward are separate calls.

use ndarray::{ArrayD, ArrayViewD, Ix2};

use super::{SplitVocabulary, shared_shape_error};
use crate::error::{Error, Result};
use crate::kernels::Real;
use crate::kernels::pool::Pool;
use crate::kernels::scatter::{RowSource, coalesce_sources_in};
use crate::layers::{Ids, LayerGrads, NamedGrad, VocabularyGrads, Workspace};
use crate::ops::gated_mix::{Want, gated_mix_backward_act, gated_mix_forward_act};
use crate::ops::sigmoid::sigmoid_backward;
use crate::param::{ParamGrad, RowSparse, Stored, StoredView};

/// What [`SplitVocabulary::backward_saved`] needs of a forward pass: the
/// row of each token (checked, [`SplitVocabulary::route`]) and the shape
/// of `shared`.
#[derive(Clone, Debug)]
pub struct VocabularySaved {
    row_of: Vec<u32>,
    shared_shape: Vec<usize>,
}

impl VocabularySaved {
    /// The row of each token, [`NO_ROW`](crate::layers::NO_ROW) for none.
    pub fn row_of(&self) -> &[u32] {
        &self.row_of
    }

    /// The shape of `shared` (the ids' shape, then D).
    pub fn shared_shape(&self) -> &[usize] {
        &self.shared_shape
    }
}

impl<T: Real> SplitVocabulary<T> {
    /// The gradients of `Σ out ⊙ grad_output` for the output of
    /// [`Self::forward`] on these inputs, without computing that output:
    /// for a caller whose forward and backward are separate calls (the
    /// Python package's autograd functions). They equal, bit for bit, the
    /// tape's `backward_from(forward(…), grad_output)`: ∂shared when
    /// `want_shared`, ∂rows (row-sparse) and ∂gate_logit where those are
    /// trainable (∂gate_logit only with the gate).
    ///
    /// Errors as [`Self::forward`], and when `grad_output` is not of shared's
    /// shape.
    ///
    /// ```
    /// use ndarray::{array, Array2};
    /// use splitgrad::{io::SplitIndex, kernels::pool::Pool, Tape};
    /// use splitgrad::layers::{SplitVocabulary, SplitVocabularyConfig};
    /// let index = SplitIndex::new(vec![0, 1], vec![2, 2]);
    /// let sv = SplitVocabulary::<f64>::new(index, &SplitVocabularyConfig::new(4, 2, 2))?;
    /// let shared = array![[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]].into_dyn();
    /// let up = Array2::from_elem((3, 2), 0.5).into_dyn();
    /// let (tokens, langs) = ([2i64, 2, 0], [0i64, 1, 0]);
    /// let g = sv.backward_from(&Pool::new(), &tokens, &langs, shared.view(), up.view(), true, true)?;
    /// let mut tape = Tape::new();
    /// let s = tape.input(shared.clone());
    /// let out = sv.forward(&mut tape, &tokens, &langs, s, true)?;
    /// let want = tape.backward_from(out, up.view());
    /// assert_eq!(g.shared.as_ref(), want.input(s));
    /// assert_eq!(g.rows.unwrap().to_dense().into_dyn(), want.dense(sv.rows()));
    /// assert_eq!(g.gate_logit.unwrap(), want.dense(sv.gate_logit()));
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn backward_from<'i, 'j>(
        &self,
        pool: &Pool<T>,
        token_ids: impl Ids<'i>,
        language_ids: impl Ids<'j>,
        shared: ArrayViewD<'_, T>,
        grad_output: ArrayViewD<'_, T>,
        use_gate: bool,
        want_shared: bool,
    ) -> Result<VocabularyGrads<T>> {
        let row_of = self.route_rows(token_ids.ids(), language_ids.ids(), shared.shape())?;
        let (shared, rows, gate_logit) = self.backward_rows(
            pool,
            &row_of,
            StoredView::Full(shared),
            StoredView::Full(grad_output),
            use_gate,
            want_shared,
        )?;
        Ok(VocabularyGrads {
            shared: shared.map(Stored::into_full),
            rows,
            gate_logit,
        })
    }

    /// The ids checked against each other and `shared`'s shape (the errors
    /// of [`Self::forward`]) and each token's row: what
    /// [`Self::backward_saved`] needs, without the forward pass.
    pub fn route<'i, 'j>(
        &self,
        token_ids: impl Ids<'i>,
        language_ids: impl Ids<'j>,
        shared_shape: &[usize],
    ) -> Result<VocabularySaved> {
        Ok(VocabularySaved {
            row_of: self.route_rows(token_ids.ids(), language_ids.ids(), shared_shape)?,
            shared_shape: shared_shape.to_vec(),
        })
    }

    /// [`Self::forward`] without a tape: the output (shared's shape) in a
    /// buffer from `ws`, and what the backward needs. The same bits and
    /// errors as the tape.
    ///
    /// ```
    /// use ndarray::{array, Array2};
    /// use splitgrad::{io::SplitIndex, layers::{SplitVocabulary, SplitVocabularyConfig, Workspace}, Tape};
    /// let sv = SplitVocabulary::<f64>::new(SplitIndex::new(vec![0, 1], vec![2, 2]), &SplitVocabularyConfig::new(4, 2, 2))?;
    /// let shared = array![[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]].into_dyn();
    /// let (tokens, langs) = ([2i64, 2, 0], [0i64, 1, 0]);
    /// let ws = Workspace::new();
    /// let (out, saved) = sv.forward_saved(&ws, &tokens, &langs, shared.view(), true)?;
    /// let up = Array2::from_elem((3, 2), 0.5).into_dyn();
    /// let g = sv.backward_saved(&ws, &saved, shared.view(), up.view(), true, true)?;
    /// let mut tape = Tape::new();
    /// let s = tape.input(shared.clone());
    /// let y = sv.forward(&mut tape, &tokens, &langs, s, true)?;
    /// assert_eq!(out, tape.value(y));
    /// let want = tape.backward_from(y, up.view());
    /// assert_eq!(g.input.as_ref(), want.input(s));
    /// assert_eq!(g.get("split_vocabulary.gate_logit").unwrap().to_dense(), want.dense(sv.gate_logit()));
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn forward_saved<'i, 'j>(
        &self,
        ws: &Workspace<T>,
        token_ids: impl Ids<'i>,
        language_ids: impl Ids<'j>,
        shared: ArrayViewD<'_, T>,
        use_gate: bool,
    ) -> Result<(ArrayD<T>, VocabularySaved)> {
        let (out, saved) = self.forward_saved_stored(
            ws,
            token_ids,
            language_ids,
            StoredView::Full(shared),
            use_gate,
        )?;
        Ok((out.into_full(), saved))
    }

    /// The gradients of `Σ out ⊙ grad_output` for the output of
    /// [`Self::forward_saved`]: [`Self::backward_from`] from the saved
    /// rows, as [`LayerGrads`] (∂shared as the input's gradient when
    /// `want_shared`; ∂rows row-sparse and ∂gate_logit dense where
    /// trainable). Errors when `shared` is not of the saved shape or
    /// `grad_output` not of shared's.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_saved(
        &self,
        ws: &Workspace<T>,
        saved: &VocabularySaved,
        shared: ArrayViewD<'_, T>,
        grad_output: ArrayViewD<'_, T>,
        use_gate: bool,
        want_shared: bool,
    ) -> Result<LayerGrads<T>> {
        let g = self.backward_saved_stored(
            ws,
            saved,
            StoredView::Full(shared),
            StoredView::Full(grad_output),
            use_gate,
            want_shared,
        )?;
        Ok(LayerGrads {
            input: g.input.map(Stored::into_full),
            params: g.params,
        })
    }

    /// [`Self::forward_saved`] on activations kept in the tables' dtype, as
    /// torch keeps a bf16 model's: `shared` in `T`, bf16 or f16, and the
    /// output in shared's dtype. Half-precision rows of `shared` are
    /// widened as tokens read them and each output row is computed in `T`
    /// and rounded to nearest once: the output is [`Self::forward_saved`]'s
    /// on the widened `shared`, rounded once, bit for bit (and its output
    /// exactly when `shared` is `T`). Errors as [`Self::forward`].
    ///
    /// ```
    /// use half::bf16;
    /// use ndarray::array;
    /// use splitgrad::io::SplitIndex;
    /// use splitgrad::layers::{SplitVocabulary, SplitVocabularyConfig, Workspace};
    /// use splitgrad::param::{Dtype, Stored};
    /// let sv = SplitVocabulary::<f32>::new(SplitIndex::new(vec![0], vec![2]), &SplitVocabularyConfig::new(4, 2, 2))?;
    /// let shared = Stored::from_full(array![[1.0f32, 2.0], [3.0, 4.0]].into_dyn(), Dtype::BF16)?;
    /// let ws = Workspace::new();
    /// let (out, _saved) = sv.forward_saved_stored(&ws, &[2i64, 1], &[0i64, 0], shared.view(), true)?;
    /// // Token 2 in language 0 has a row (zeros), mixed by the gate σ(0) = ½.
    /// let Stored::BF16(out) = out else { unreachable!() };
    /// assert_eq!(out, array![[0.5f32, 1.0], [3.0, 4.0]].mapv(bf16::from_f32).into_dyn());
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn forward_saved_stored<'i, 'j>(
        &self,
        ws: &Workspace<T>,
        token_ids: impl Ids<'i>,
        language_ids: impl Ids<'j>,
        shared: StoredView<'_, T>,
        use_gate: bool,
    ) -> Result<(Stored<T>, VocabularySaved)> {
        let saved = self.route(token_ids, language_ids, shared.shape())?;
        let (n, d) = (saved.row_of.len(), self.dim);
        let gate = use_gate.then(|| self.gate());
        let gate = gate.as_ref().map(|g| g.as_slice().expect("a fresh array"));
        let mut copy = None;
        let out = gated_mix_forward_act(
            ws,
            rows_of(&shared, [n, d], &mut copy),
            self.rows.stored().view(),
            gate,
            &saved.row_of,
        );
        Ok((out.into_shape(shared.shape()), saved))
    }

    /// [`Self::backward_saved`] on activations kept in the tables' dtype:
    /// `shared` and `grad_output` in one dtype (`T`, bf16 or f16), ∂shared
    /// returned in it. ∂shared is [`Self::backward_saved`]'s on the widened
    /// activations, rounded to nearest once; ∂rows and ∂gate_logit are `T`
    /// and equal its bit for bit. Errors as [`Self::backward_saved`], and
    /// when `grad_output` is not kept in shared's dtype.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_saved_stored(
        &self,
        ws: &Workspace<T>,
        saved: &VocabularySaved,
        shared: StoredView<'_, T>,
        grad_output: StoredView<'_, T>,
        use_gate: bool,
        want_shared: bool,
    ) -> Result<LayerGrads<T, Stored<T>>> {
        if shared.shape() != saved.shared_shape {
            return Err(shared_shape_error(&saved.shared_shape, shared.shape()));
        }
        let (input, rows, gate_logit) = self.backward_rows(
            ws,
            &saved.row_of,
            shared,
            grad_output,
            use_gate,
            want_shared,
        )?;
        let mut params = Vec::new();
        if let Some(rs) = rows {
            params.push(NamedGrad::new(&self.rows, ParamGrad::RowSparse(rs)));
        }
        if let Some(d) = gate_logit {
            params.push(NamedGrad::new(&self.gate_logit, ParamGrad::Dense(d)));
        }
        Ok(LayerGrads { input, params })
    }

    /// [`Self::backward_from`] for tokens already routed, on activations as
    /// they are kept: (∂shared in their dtype, ∂rows, ∂gate_logit), each
    /// when wanted. Errors when `grad_output` is not of shared's shape and
    /// dtype.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn backward_rows(
        &self,
        pool: &Pool<T>,
        row_of: &[u32],
        shared: StoredView<'_, T>,
        grad_output: StoredView<'_, T>,
        use_gate: bool,
        want_shared: bool,
    ) -> Result<(Option<Stored<T>>, Option<RowSparse<T>>, Option<ArrayD<T>>)> {
        if grad_output.shape() != shared.shape() {
            return Err(Error::shape(
                "grad_output",
                format!("{:?} (the shape of shared)", shared.shape()),
                grad_output.shape(),
            ));
        }
        if grad_output.dtype() != shared.dtype() {
            return Err(Error::new(crate::ErrorKind::Dtype {
                expected: format!("{} (the dtype of shared)", shared.dtype()),
                found: grad_output.dtype().to_string(),
            })
            .in_array("grad_output"));
        }
        let (n, d) = (row_of.len(), self.dim);
        let want = Want {
            shared: want_shared,
            rows: self.rows.is_trainable(),
            gate: use_gate && self.gate_logit.is_trainable(),
        };
        let gate_value = use_gate.then(|| self.gate().into_dyn());
        // ∂out is read as the tape hands it over (1·∂out + 0); in T it
        // becomes ∂shared in place.
        let (mut copy_s, mut copy_g) = (None, None);
        let (gs, contrib, gg) = gated_mix_backward_act(
            pool,
            row_of,
            rows_of(&shared, [n, d], &mut copy_s),
            self.rows.stored().view(),
            gate_value.as_ref().map(|g| g.view()),
            rows_of(&grad_output, [n, d], &mut copy_g),
            want,
        );
        let rows = contrib.map(|(ids, vals)| {
            let vals = vals
                .into_dimensionality::<Ix2>()
                .expect("2-D row contributions");
            let rows =
                coalesce_sources_in(pool, self.n_rows(), d, &ids, &[RowSource::all(vals.view())]);
            RowSparse::from_coalesced(self.n_rows(), rows)
        });
        // ∂gate_logit = 0 + ∂g·g·(1 − g): the sigmoid's backward into a zero buffer.
        let gate_logit = match (gg, gate_value) {
            (Some(gg), Some(g)) if want.gate => {
                let mut out = ArrayD::<T>::zeros(g.raw_dim());
                sigmoid_backward(g.view(), gg.view(), &mut out);
                Some(out)
            }
            _ => None,
        };
        Ok((gs.map(|g| g.into_shape(shared.shape())), rows, gate_logit))
    }
}

/// `a` as (n, d): the view itself in standard layout, else a standard copy
/// kept in `copy`.
fn rows_of<'c, 'v: 'c, T: Real>(
    a: &StoredView<'v, T>,
    [n, d]: [usize; 2],
    copy: &'c mut Option<Stored<T>>,
) -> StoredView<'c, T> {
    match a.reshaped(&[n, d]) {
        Some(v) => v.reborrow(),
        None => copy
            .insert(a.to_owned())
            .view()
            .reshaped(&[n, d])
            .expect("a fresh copy is in standard layout"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tape;
    use crate::io::SplitIndex;
    use crate::layers::SplitVocabularyConfig;
    use crate::layers::grads::testing::{
        assert_same_grads, assert_same_input, bits, in_f32_and_f64,
    };
    use crate::rng::Rng;
    use crate::state::Module;
    use ndarray::{Array3, array};

    fn layer<T: Real>(rng: &mut Rng) -> SplitVocabulary<T> {
        // Pairs (language, token): (0, 2), (1, 2), (1, 4), (0, 1).
        let index = SplitIndex::new(vec![0, 1, 1, 0], vec![2, 2, 4, 1]);
        let mut sv =
            SplitVocabulary::<T>::new(index, &SplitVocabularyConfig::new(6, 3, 2)).unwrap();
        for p in sv.parameters_mut() {
            p.value_mut().mapv_inplace(|_| T::from_f64(rng.normal()));
        }
        sv
    }

    fn saved_pair_is_the_tape<T: Real>() {
        let mut rng = Rng::new(11);
        let mut sv = layer::<T>(&mut rng);
        // Rank-2 ids: rows used twice, tokens without a row.
        let tokens = array![[2i64, 2, 4, 0], [1, 2, 5, 4]];
        let langs = array![[0i64, 1, 1, 0], [0, 0, 1, 1]];
        let shared = Array3::from_shape_fn((2, 4, 3), |_| T::from_f64(rng.normal())).into_dyn();
        let up = Array3::from_shape_fn((2, 4, 3), |_| T::from_f64(rng.normal())).into_dyn();
        let ws = Workspace::new();
        for frozen in [None, Some("rows"), Some("gate")] {
            sv.rows_mut().set_trainable(frozen != Some("rows"));
            sv.gate_logit_mut().set_trainable(frozen != Some("gate"));
            for use_gate in [true, false] {
                let (out, saved) = sv
                    .forward_saved(&ws, &tokens, &langs, shared.view(), use_gate)
                    .unwrap();
                let got = sv
                    .backward_saved(&ws, &saved, shared.view(), up.view(), use_gate, true)
                    .unwrap();
                let mut tape = Tape::new();
                let s = tape.input(shared.clone());
                let y = sv.forward(&mut tape, &tokens, &langs, s, use_gate).unwrap();
                assert_eq!(bits(out.view()), bits(tape.value(y)));
                let mut want = tape.backward_from(y, up.view());
                assert_same_grads(&sv, &got, &want);
                let gs = want.take_input(s);
                assert_same_input(got.input.as_ref(), gs);
            }
        }
    }

    in_f32_and_f64!(saved_pair_is_the_tape_f32_and_f64, saved_pair_is_the_tape);

    /// The pair on half-precision activations against the `T` pair on the
    /// widened activations: the output and ∂shared rounded once, ∂rows and
    /// ∂gate_logit the same bits; rank-2 ids (a non-standard `shared`
    /// too), rows kept as `T` and in bf16, with and without the gate.
    #[test]
    fn stored_pair_is_the_t_pair_rounded_once() {
        use crate::param::Dtype;
        let mut rng = Rng::new(12);
        let tokens = array![[2i64, 2, 4, 0], [1, 2, 5, 4]];
        let langs = array![[0i64, 1, 1, 0], [0, 0, 1, 1]];
        let ws = Workspace::new();
        for dtype in [Dtype::BF16, Dtype::F16] {
            for rows_dtype in [Dtype::F32, Dtype::BF16] {
                let mut sv = layer::<f32>(&mut rng);
                sv.rows_mut().set_dtype(rows_dtype).unwrap();
                let draw = |rng: &mut Rng| {
                    let a = Array3::from_shape_fn((2, 4, 3), |_| rng.normal() as f32).into_dyn();
                    Stored::from_full(a, dtype).unwrap()
                };
                let (shared, up) = (draw(&mut rng), draw(&mut rng));
                let (shared_w, up_w) = (shared.widened().into_owned(), up.widened().into_owned());
                for use_gate in [true, false] {
                    let (out, saved) = sv
                        .forward_saved_stored(&ws, &tokens, &langs, shared.view(), use_gate)
                        .unwrap();
                    let (want_out, want_saved) = sv
                        .forward_saved(&ws, &tokens, &langs, shared_w.view(), use_gate)
                        .unwrap();
                    let round = |a: ArrayD<f32>| Stored::from_full(a, dtype).unwrap();
                    assert_eq!(out, round(want_out));
                    let got = sv
                        .backward_saved_stored(
                            &ws,
                            &saved,
                            shared.view(),
                            up.view(),
                            use_gate,
                            true,
                        )
                        .unwrap();
                    let want = sv
                        .backward_saved(
                            &ws,
                            &want_saved,
                            shared_w.view(),
                            up_w.view(),
                            use_gate,
                            true,
                        )
                        .unwrap();
                    assert_eq!(got.input, want.input.map(round));
                    assert_eq!(got.params.len(), want.params.len());
                    for (g, w) in got.params.iter().zip(&want.params) {
                        assert_eq!(g.name, w.name);
                        assert_eq!(
                            bits(g.grad.to_dense().view()),
                            bits(w.grad.to_dense().view())
                        );
                    }
                    // The same through transposed (non-standard) views.
                    let t = |a: &Stored<f32>| match a {
                        Stored::BF16(a) => Stored::BF16(a.t().as_standard_layout().into_owned()),
                        Stored::F16(a) => Stored::F16(a.t().as_standard_layout().into_owned()),
                        Stored::Full(_) => unreachable!(),
                    };
                    let (st, ut) = (t(&shared), t(&up));
                    fn tv(a: &Stored<f32>) -> StoredView<'_, f32> {
                        match a {
                            Stored::BF16(a) => StoredView::BF16(a.t()),
                            Stored::F16(a) => StoredView::F16(a.t()),
                            Stored::Full(_) => unreachable!(),
                        }
                    }
                    let (out_t, saved_t) = sv
                        .forward_saved_stored(&ws, &tokens, &langs, tv(&st), use_gate)
                        .unwrap();
                    assert_eq!(out_t, out);
                    let got_t = sv
                        .backward_saved_stored(&ws, &saved_t, tv(&st), tv(&ut), use_gate, true)
                        .unwrap();
                    assert_eq!(got_t.input, got.input);
                }
            }
        }
    }

    #[test]
    fn stored_pair_errors_name_the_array() {
        use crate::param::Dtype;
        let sv = layer::<f32>(&mut Rng::new(1));
        let ws = Workspace::new();
        let zeros = ndarray::Array2::<f32>::zeros((2, 3)).into_dyn();
        let shared = Stored::from_full(zeros.clone(), Dtype::BF16).unwrap();
        let err = sv
            .forward_saved_stored(&ws, &[2i64, 6], &[0i64, 0], shared.view(), true)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "token id 6 at position [1] is out of range 0..6"
        );
        let (_, saved) = sv
            .forward_saved_stored(&ws, &[2i64, 1], &[0i64, 0], shared.view(), true)
            .unwrap();
        let up16 = Stored::from_full(zeros.clone(), Dtype::F16).unwrap();
        let err = sv
            .backward_saved_stored(&ws, &saved, shared.view(), up16.view(), true, true)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "array `grad_output`: has dtype f16, expected bf16 (the dtype of shared)"
        );
        let err = sv
            .backward_saved_stored(
                &ws,
                &saved,
                shared.view(),
                StoredView::Full(zeros.view()),
                true,
                true,
            )
            .unwrap_err();
        assert!(err.to_string().contains("expected bf16"), "{err}");
    }

    #[test]
    fn saved_pair_errors_are_the_tapes() {
        let sv = layer::<f64>(&mut Rng::new(1));
        let ws = Workspace::new();
        let shared = ndarray::Array2::<f64>::zeros((2, 3)).into_dyn();
        let err = sv
            .forward_saved(&ws, &[2i64, 6], &[0i64, 0], shared.view(), true)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "token id 6 at position [1] is out of range 0..6"
        );
        let saved = sv.route(&[2i64, 1], &[0i64, 0], shared.shape()).unwrap();
        let other = ndarray::Array2::<f64>::zeros((2, 4)).into_dyn();
        let err = sv
            .backward_saved(&ws, &saved, other.view(), shared.view(), true, true)
            .unwrap_err();
        assert_eq!(err.to_string(), "shared has shape [2, 4], expected (2, 3)");
    }

    #[test]
    fn seed_from_writes_in_place() {
        let mut sv = layer::<f32>(&mut Rng::new(2));
        let before = sv.rows().value().as_ptr();
        let table = ndarray::Array2::from_shape_fn((6, 3), |(i, j)| (10 * i + j) as f32);
        sv.seed_from(&table).unwrap();
        assert_eq!(sv.rows().value().as_ptr(), before);
        assert_eq!(
            sv.rows().value(),
            &table.select(ndarray::Axis(0), &[2, 2, 4, 1]).into_dyn()
        );
        let seeded = sv.rows().value().clone();
        assert!(
            sv.seed_from(&ndarray::Array2::<f32>::zeros((5, 3)))
                .is_err()
        );
        assert_eq!(sv.rows().value(), &seeded);
    }
}
