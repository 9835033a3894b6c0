//! `SplitLanguageModellingHead`: per-token cross-entropy over split output
//! weights, fused so the N × V logits matrix is never materialised.
//!
//! With `W = [W_0; W_1; …]` the split weights concatenated in order
//! ((V, H), the `nn.Linear(H, size_k, bias=False)` layout), token n's loss is
//! `loss_n = lse(h_n·Wᵀ) − h_n·W_{label_n}`, and 0 for label −100.
//!
//! The kernel walks chunks of tokens × chunks of one split's rows; each
//! block of logits `S = h_c·W_blockᵀ` is one gemm into a workspace of
//! `chunk_tokens × chunk_vocab` reals, folded into a running max and a
//! rescaled sum (online log-sum-exp). Backward recomputes each block and
//! runs two more gemms: `∂h_c += G·W_block`, `∂W_block += Gᵀ·h_c` with
//! `G = ∂loss ⊙ (softmax − onehot)`. Derivation:
//! `docs/gradients.md#fused-cross-entropy`. That is 8·N·V·H flops for
//! forward plus backward: the logits are computed twice.
//!
//! When only the sum of the losses is wanted (the usual training loss),
//! [`SplitLanguageModellingHead::forward_sum`] does better: every token's
//! upstream gradient is then one scalar, so its forward walks chunks of
//! tokens against the whole vocabulary once, forms ∂hidden and ∂W right
//! away, and its backward only scales them (6·N·V·H flops; the workspace is
//! one `chunk_tokens × V` block, sized by [`SumChunks`]). Derivation:
//! `docs/gradients.md#summed-fused-cross-entropy`.

use ndarray::{ArrayD, ArrayView2, ArrayViewD, ArrayViewMut2, Ix2, IxDyn};

use super::grads::as_tape_leaves;
use super::{Ids, LayerGrads, NamedGrad, SplitTables, Workspace};
use crate::error::{Error, Result};
use crate::kernels::Real;
use crate::ops::cross_entropy::first_bad_label;
use crate::ops::fused_ce::{
    ChunkSizes, HeadKernel, RowStats, Targets, fused_ce_backward_on, fused_ce_forward_on,
};
use crate::ops::fused_ce_sum::{SumChunks, fused_ce_sum_forward_on};
use crate::param::{ParamGrad, Parameter};
use crate::rng::Rng;
use crate::state::Module;
use crate::tape::{Tape, Var};

/// What [`SplitLanguageModellingHead::backward_saved`] needs of a forward
/// pass: the checked labels and each token's hidden row, and each hidden
/// row's log-sum-exp (as its max and log-sum), so that the backward runs
/// no second forward. 2·N reals and 3·N indices or so.
#[derive(Clone, Debug)]
pub struct HeadSaved<T> {
    targets: Targets,
    stats: RowStats<T>,
    hidden_shape: Vec<usize>,
    labels_shape: Vec<usize>,
}

impl<T> HeadSaved<T> {
    /// The shape of the hidden states the forward read.
    pub fn hidden_shape(&self) -> &[usize] {
        &self.hidden_shape
    }

    /// The shape of the labels (and of the loss).
    pub fn labels_shape(&self) -> &[usize] {
        &self.labels_shape
    }
}

/// The output layer of a split vocabulary with per-token cross-entropy.
///
/// ```
/// use ndarray::array;
/// use splitgrad::{layers::SplitLanguageModellingHead, Rng, Tape};
/// let mut head = SplitLanguageModellingHead::<f64>::new(&[("orig", 5), ("new", 2)], &["orig", "new"], 3)?;
/// head.reset_parameters(&mut Rng::new(0));
/// let mut tape = Tape::new();
/// let hidden = tape.input(array![[0.1, 0.2, 0.3], [1.0, -1.0, 0.5]].into_dyn());
/// let loss = head.forward(&mut tape, hidden, &[6i64, -100])?;
/// assert_eq!(tape.value(loss)[[1]], 0.0); // ignored
/// let total = tape.sum(loss);
/// let grads = tape.backward(total);
/// assert!(grads.input(hidden).is_some());
/// # Ok::<(), splitgrad::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct SplitLanguageModellingHead<T> {
    splits: SplitTables<T>,
    chunks: ChunkSizes,
    sum_chunks: SumChunks,
    kernel: HeadKernel,
}

impl<T: Real> SplitLanguageModellingHead<T> {
    /// Builds the head; weights start at zero (call [`Self::reset_parameters`]).
    /// Same construction errors as
    /// [`SplitTokenEmbeddings::new`](super::SplitTokenEmbeddings::new).
    ///
    /// ```
    /// use splitgrad::layers::SplitLanguageModellingHead;
    /// assert!(SplitLanguageModellingHead::<f32>::new(&[("a", 4)], &["a"], 0).is_err());
    /// ```
    pub fn new<S: AsRef<str>, O: AsRef<str>>(
        split_vocab_size: &[(S, usize)],
        split_order: &[O],
        hidden_size: usize,
    ) -> Result<Self> {
        Ok(SplitLanguageModellingHead {
            splits: SplitTables::new("lm_head", split_vocab_size, split_order, hidden_size)?,
            chunks: ChunkSizes::default(),
            sum_chunks: SumChunks::default(),
            kernel: HeadKernel::Auto,
        })
    }

    /// Every weight U(−1/√H, 1/√H), as `nn.Linear.reset_parameters`.
    ///
    /// ```
    /// use splitgrad::{layers::SplitLanguageModellingHead, Rng};
    /// let mut h = SplitLanguageModellingHead::<f64>::new(&[("a", 50)], &["a"], 4)?;
    /// h.reset_parameters(&mut Rng::new(2));
    /// assert!(h.split("a").unwrap().value().iter().all(|x| x.abs() <= 0.5));
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn reset_parameters(&mut self, rng: &mut Rng) {
        let bound = 1.0 / (self.splits.hidden_size() as f64).sqrt();
        self.splits
            .fill(rng, move |r| T::from_f64(r.uniform_in(-bound, bound)));
    }

    /// Sets the chunk sizes of the fused kernel (both at least 1).
    pub fn set_chunks(&mut self, chunks: ChunkSizes) {
        self.chunks = ChunkSizes {
            tokens: chunks.tokens.max(1),
            vocab: chunks.vocab.max(1),
        };
    }

    /// The chunk sizes of the fused kernel.
    pub fn chunks(&self) -> ChunkSizes {
        self.chunks
    }

    /// Sets the token chunks of [`Self::forward_sum`].
    pub fn set_sum_chunks(&mut self, chunks: SumChunks) {
        self.sum_chunks = chunks;
    }

    /// The token chunks of [`Self::forward_sum`].
    pub fn sum_chunks(&self) -> SumChunks {
        self.sum_chunks
    }

    /// Sets the products the fused kernels run on (default
    /// [`HeadKernel::Auto`]: the tile kernel for f32 where the CPU has AVX2
    /// and FMA, `matrixmultiply` otherwise).
    pub fn set_kernel(&mut self, kernel: HeadKernel) {
        self.kernel = kernel;
    }

    /// The products the fused kernels run on.
    pub fn kernel(&self) -> HeadKernel {
        self.kernel
    }

    /// The labels, flat, after checking them and the hidden states' shape
    /// `hs` (the errors of [`Self::forward`]).
    fn check(&self, hs: &[usize], labels: ArrayViewD<'_, i64>) -> Result<Vec<i64>> {
        let h = self.splits.hidden_size();
        if hs.last() != Some(&h) {
            return Err(Error::shape("hidden", format!("(…, {h})"), hs));
        }
        if labels.shape() != &hs[..hs.len() - 1] {
            return Err(Error::shape(
                "labels",
                format!(
                    "{:?} (the hidden states' shape without H)",
                    &hs[..hs.len() - 1]
                ),
                labels.shape(),
            ));
        }
        let flat: Vec<i64> = labels.iter().copied().collect();
        if let Some((p, l)) = first_bad_label(&flat, self.vocab_size()) {
            let pos = super::splits::unflatten(p, labels.shape());
            return Err(Error::out_of_range(
                "label",
                pos,
                l,
                0,
                self.vocab_size() as i64,
            ));
        }
        Ok(flat)
    }

    /// Per-token cross-entropy (reduction none): hidden (…, H), labels (…)
    /// → loss (…). Label −100 is ignored (loss 0, no gradient); any other
    /// label outside `[0, V)` is an error, as is a shape mismatch.
    pub fn forward<'p, 'i>(
        &'p self,
        tape: &mut Tape<'p, T>,
        hidden: Var,
        labels: impl Ids<'i>,
    ) -> Result<Var> {
        let labels = labels.ids();
        let flat = self.check(tape.value(hidden).shape(), labels.view())?;
        let loss = self.fused(tape, hidden, Targets::per_token(flat));
        Ok(tape.reshape(loss, labels.shape()))
    }

    /// The summed cross-entropy `Σ_n loss_n` as one scalar: hidden (…, H),
    /// labels (…) → (). Equal to [`Self::forward`] followed by
    /// [`Tape::sum`], to rounding, and faster: the gradients of hidden and
    /// of the trainable weights are formed during this call (6·N·V·H flops
    /// in all, against 8·N·V·H), held by the node, and only scaled by the
    /// backward. So the node holds ∂W (V × H) until the tape is dropped.
    /// On a tape that does not record, or when neither hidden nor any
    /// weight needs a gradient, only the loss is computed. Same errors as
    /// [`Self::forward`].
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::{layers::SplitLanguageModellingHead, Rng, Tape};
    /// let mut head = SplitLanguageModellingHead::<f64>::new(&[("orig", 5), ("new", 2)], &["orig", "new"], 3)?;
    /// head.reset_parameters(&mut Rng::new(0));
    /// let labels = [6i64, -100];
    /// let mut tape = Tape::new();
    /// let hidden = tape.input(array![[0.1, 0.2, 0.3], [1.0, -1.0, 0.5]].into_dyn());
    /// let total = head.forward_sum(&mut tape, hidden, &labels)?;
    /// let per_token = head.forward(&mut tape, hidden, &labels)?;
    /// assert!((tape.scalar(total) - tape.value(per_token).sum()).abs() < 1e-12);
    /// let grads = tape.backward(total);
    /// assert!(grads.input(hidden).is_some());
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn forward_sum<'p, 'i>(
        &'p self,
        tape: &mut Tape<'p, T>,
        hidden: Var,
        labels: impl Ids<'i>,
    ) -> Result<Var> {
        let flat = self.check(tape.value(hidden).shape(), labels.ids())?;
        let ws: Vec<Var> = self.splits.tables().iter().map(|p| tape.param(p)).collect();
        Ok(tape.fused_cross_entropy_sum_on(hidden, &ws, &flat, self.sum_chunks, self.kernel))
    }

    /// Cross-entropy for tokens that share hidden rows: hidden (m, H),
    /// token n reads row `row_of[n]` and has label `labels[n]` → loss (N).
    /// Equal to [`Self::forward`] on the hidden rows repeated per token, at
    /// the cost of m rows instead of N (a bigram model's batch has far fewer
    /// distinct contexts than tokens).
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::{layers::SplitLanguageModellingHead, Rng, Tape};
    /// let mut head = SplitLanguageModellingHead::<f64>::new(&[("v", 4)], &["v"], 2)?;
    /// head.reset_parameters(&mut Rng::new(0));
    /// let mut tape = Tape::new();
    /// let h = tape.input(array![[0.5, -1.0]].into_dyn());
    /// let loss = head.forward_grouped(&mut tape, h, &[0, 0], &[1, 3])?;
    /// assert_eq!(tape.value(loss).shape(), &[2]);
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn forward_grouped<'p, 'i>(
        &'p self,
        tape: &mut Tape<'p, T>,
        hidden: Var,
        row_of: &[usize],
        labels: impl Ids<'i>,
    ) -> Result<Var> {
        let targets = self.grouped_targets(tape, hidden, row_of, labels)?;
        Ok(self.fused(tape, hidden, targets))
    }

    /// The summed cross-entropy `Σ_n loss_n` of tokens that share hidden
    /// rows: hidden (m, H), token n reads row `row_of[n]` with label
    /// `labels[n]` → (). Equal to [`Self::forward_grouped`] followed by
    /// [`Tape::sum`], to rounding, and faster in the same way as
    /// [`Self::forward_sum`]: the gradients are formed during this call and
    /// only scaled by the backward (6·m·V·H flops in all against 8·m·V·H;
    /// the node holds ∂W until the tape is dropped). Same errors as
    /// [`Self::forward_grouped`].
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::{layers::SplitLanguageModellingHead, Rng, Tape};
    /// let mut head = SplitLanguageModellingHead::<f64>::new(&[("v", 4)], &["v"], 2)?;
    /// head.reset_parameters(&mut Rng::new(0));
    /// let mut tape = Tape::new();
    /// let h = tape.input(array![[0.5, -1.0]].into_dyn());
    /// let total = head.forward_grouped_sum(&mut tape, h, &[0, 0], &[1, 3])?;
    /// let per_token = head.forward_grouped(&mut tape, h, &[0, 0], &[1, 3])?;
    /// assert!((tape.scalar(total) - tape.value(per_token).sum()).abs() < 1e-12);
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn forward_grouped_sum<'p, 'i>(
        &'p self,
        tape: &mut Tape<'p, T>,
        hidden: Var,
        row_of: &[usize],
        labels: impl Ids<'i>,
    ) -> Result<Var> {
        let targets = self.grouped_targets(tape, hidden, row_of, labels)?;
        let ws: Vec<Var> = self.splits.tables().iter().map(|p| tape.param(p)).collect();
        Ok(
            tape.fused_cross_entropy_sum_grouped(
                hidden,
                &ws,
                targets,
                self.sum_chunks,
                self.kernel,
            ),
        )
    }

    /// The targets of [`Self::forward_grouped`], checked.
    fn grouped_targets<'i>(
        &self,
        tape: &Tape<'_, T>,
        hidden: Var,
        row_of: &[usize],
        labels: impl Ids<'i>,
    ) -> Result<Targets> {
        let labels: Vec<i64> = labels.ids().iter().copied().collect();
        let labels = labels.as_slice();
        let hs = tape.value(hidden).shape().to_vec();
        let h = self.splits.hidden_size();
        if hs.len() != 2 || hs[1] != h {
            return Err(Error::shape("hidden", format!("(m, {h})"), &hs));
        }
        if row_of.len() != labels.len() {
            return Err(Error::shape(
                "row_of",
                format!("({},) like labels", labels.len()),
                &[row_of.len()],
            ));
        }
        if let Some((p, &r)) = row_of.iter().enumerate().find(|&(_, &r)| r >= hs[0]) {
            return Err(Error::out_of_range(
                "hidden row",
                vec![p],
                r as i64,
                0,
                hs[0] as i64,
            ));
        }
        if let Some((p, l)) = first_bad_label(labels, self.vocab_size()) {
            return Err(Error::out_of_range(
                "label",
                vec![p],
                l,
                0,
                self.vocab_size() as i64,
            ));
        }
        Ok(Targets::grouped(labels.to_vec(), row_of.to_vec(), hs[0]))
    }

    fn fused<'p>(&'p self, tape: &mut Tape<'p, T>, hidden: Var, targets: Targets) -> Var {
        let ws: Vec<Var> = self.splits.tables().iter().map(|p| tape.param(p)).collect();
        tape.fused_cross_entropy_on(hidden, &ws, targets, self.chunks, self.kernel)
    }

    /// [`Self::forward`] without a tape: the per-token loss (labels'
    /// shape) and what [`Self::backward_saved`] needs. The same bits and
    /// errors as the tape.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::{layers::{SplitLanguageModellingHead, Workspace}, Rng};
    /// let mut head = SplitLanguageModellingHead::<f64>::new(&[("orig", 5), ("new", 2)], &["orig", "new"], 3)?;
    /// head.reset_parameters(&mut Rng::new(0));
    /// let hidden = array![[0.1, 0.2, 0.3], [1.0, -1.0, 0.5]].into_dyn();
    /// let (loss, saved) = head.forward_saved(hidden.view(), &[6i64, -100])?;
    /// assert_eq!(loss[[1]], 0.0);
    /// let g = head.backward_saved(&Workspace::new(), &saved, hidden.view(), array![1.0, 1.0].into_dyn().view(), true)?;
    /// assert_eq!(g.input.unwrap().shape(), &[2, 3]);
    /// assert_eq!(g.params.len(), 2);
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn forward_saved<'i>(
        &self,
        hidden: ArrayViewD<'_, T>,
        labels: impl Ids<'i>,
    ) -> Result<(ArrayD<T>, HeadSaved<T>)> {
        let labels = labels.ids();
        let flat = self.check(hidden.shape(), labels.view())?;
        let targets = Targets::per_token(flat);
        let h2 = as_rows(hidden.view());
        let weights = self.weight_views();
        let (loss, stats) =
            fused_ce_forward_on(self.kernel, h2.view(), &weights, &targets, self.chunks);
        let loss = ArrayD::from_shape_vec(IxDyn(labels.shape()), loss).expect("one loss per label");
        let saved = HeadSaved {
            targets,
            stats,
            hidden_shape: hidden.shape().to_vec(),
            labels_shape: labels.shape().to_vec(),
        };
        Ok((loss, saved))
    }

    /// The gradients of `Σ loss ⊙ grad_loss` for the loss of
    /// [`Self::forward_saved`] on these hidden states, from the saved
    /// log-sum-exps (no second forward): ∂hidden as the input's gradient
    /// when `want_hidden`, ∂W_k (dense) for each trainable split, each in
    /// a buffer from `ws`; the bits of the tape's `backward_from`. Errors
    /// when `grad_loss` is not of the labels' shape or `hidden` not of the
    /// saved shape.
    pub fn backward_saved(
        &self,
        ws: &Workspace<T>,
        saved: &HeadSaved<T>,
        hidden: ArrayViewD<'_, T>,
        grad_loss: ArrayViewD<'_, T>,
        want_hidden: bool,
    ) -> Result<LayerGrads<T>> {
        if grad_loss.shape() != saved.labels_shape {
            return Err(Error::shape(
                "grad_loss",
                format!("{:?} (the shape of labels)", saved.labels_shape),
                grad_loss.shape(),
            ));
        }
        if hidden.shape() != saved.hidden_shape {
            return Err(Error::shape(
                "hidden",
                format!("{:?} (the shape the forward read)", saved.hidden_shape),
                hidden.shape(),
            ));
        }
        // The upstream gradient as the tape's sweep hands it to the op:
        // its seed `1·g + 0`, through the reshape's `0 + ·`.
        let gy: Vec<T> = grad_loss
            .iter()
            .map(|&g| T::one() * g + T::zero())
            .collect();
        let h2 = as_rows(hidden.view());
        let mut gh = want_hidden.then(|| ws.zeros(hidden.shape()));
        let tables = self.splits.tables();
        let mut gws: Vec<Option<ArrayD<T>>> = tables
            .iter()
            .map(|p| p.is_trainable().then(|| ws.zeros(p.value().shape())))
            .collect();
        if gh.is_some() || gws.iter().any(Option::is_some) {
            let ghv = gh.as_mut().map(|g| {
                g.view_mut()
                    .into_shape_with_order(h2.dim())
                    .expect("a fresh array")
            });
            let mut gwv: Vec<Option<ArrayViewMut2<'_, T>>> = gws
                .iter_mut()
                .map(|g| {
                    g.as_mut()
                        .map(|g| g.view_mut().into_dimensionality::<Ix2>().expect("2-D"))
                })
                .collect();
            fused_ce_backward_on(
                self.kernel,
                ws,
                h2.view(),
                &self.weight_views(),
                &saved.targets,
                &saved.stats,
                &gy,
                self.chunks,
                ghv,
                &mut gwv,
            );
        }
        let params = tables
            .iter()
            .zip(gws)
            .filter_map(|(p, g)| g.map(|g| NamedGrad::new(p, ParamGrad::Dense(g))))
            .collect();
        Ok(LayerGrads { input: gh, params })
    }

    /// [`Self::forward_sum`] without a tape: `Σ_n loss_n`, and its
    /// gradients formed in the same pass (∂hidden when `want_hidden`, ∂W_k
    /// of each trainable split when `want_weights`; buffers from `ws`),
    /// the bits of the tape's `backward` of the sum. With neither wanted
    /// only the loss is computed. Same errors as [`Self::forward`].
    pub fn forward_sum_saved<'i>(
        &self,
        ws: &Workspace<T>,
        hidden: ArrayViewD<'_, T>,
        labels: impl Ids<'i>,
        want_hidden: bool,
        want_weights: bool,
    ) -> Result<(T, LayerGrads<T>)> {
        let flat = self.check(hidden.shape(), labels.ids())?;
        let tables = self.splits.tables();
        let want_w: Vec<bool> = tables
            .iter()
            .map(|p| want_weights && p.is_trainable())
            .collect();
        let h2 = as_rows(hidden.view());
        let (loss, sums) = fused_ce_sum_forward_on(
            self.kernel,
            ws,
            h2.view(),
            &self.weight_views(),
            &flat,
            self.sum_chunks,
            want_hidden,
            &want_w,
        );
        // The tape holds these as `1·d` and writes them out as `1·d + 0`.
        let input = sums.hidden.map(|g| {
            let mut g = g
                .into_shape_with_order(IxDyn(hidden.shape()))
                .expect("(N, H) rows reshape to hidden's shape");
            as_tape_leaves(&mut g);
            g
        });
        let params = tables
            .iter()
            .zip(sums.weights)
            .filter_map(|(p, g)| {
                let mut g = g?.into_dyn();
                as_tape_leaves(&mut g);
                Some(NamedGrad::new(p, ParamGrad::Dense(g)))
            })
            .collect();
        Ok((loss, LayerGrads { input, params }))
    }

    /// The split weights as (size_k, H) views.
    fn weight_views(&self) -> Vec<ArrayView2<'_, T>> {
        self.splits
            .tables()
            .iter()
            .map(|p| {
                p.value()
                    .view()
                    .into_dimensionality::<Ix2>()
                    .expect("weights are 2-D")
            })
            .collect()
    }

    /// The reference: the same loss from the full logits with the tape's
    /// primitive ops (`concat_rows`, `transpose`, `matmul`,
    /// `cross_entropy`). Materialises N × V; for tests and teaching.
    pub fn forward_naive<'p, 'i>(
        &'p self,
        tape: &mut Tape<'p, T>,
        hidden: Var,
        labels: impl Ids<'i>,
    ) -> Result<Var> {
        let labels = labels.ids();
        let flat = self.check(tape.value(hidden).shape(), labels.view())?;
        let ws: Vec<Var> = self.splits.tables().iter().map(|p| tape.param(p)).collect();
        let w = tape.concat_rows(&ws);
        let wt = tape.transpose(w);
        let n = flat.len();
        let h2 = tape.reshape(hidden, &[n, self.splits.hidden_size()]);
        let logits = tape.matmul(h2, wt);
        let ce = tape.cross_entropy(logits, &flat);
        Ok(tape.reshape(ce, labels.shape()))
    }

    /// The weight of a split (`lm_head.<split>.weight`, (size_k, H)).
    pub fn split(&self, name: &str) -> Option<&Parameter<T>> {
        self.splits.table(name)
    }

    /// Freezes (`false`) or unfreezes a split.
    pub fn set_trainable(&mut self, split: &str, trainable: bool) -> Result<()> {
        self.splits.set_trainable(split, trainable)
    }

    /// The splits.
    pub fn splits(&self) -> &SplitTables<T> {
        &self.splits
    }

    /// The splits, to change in place.
    pub fn splits_mut(&mut self) -> &mut SplitTables<T> {
        &mut self.splits
    }

    /// V.
    pub fn vocab_size(&self) -> usize {
        self.splits.vocab_size()
    }

    /// H.
    pub fn hidden_size(&self) -> usize {
        self.splits.hidden_size()
    }
}

impl<T: Real> Module<T> for SplitLanguageModellingHead<T> {
    /// The weights, in split order.
    fn parameters(&self) -> Vec<&Parameter<T>> {
        self.splits.tables().iter().collect()
    }

    fn parameters_mut(&mut self) -> Vec<&mut Parameter<T>> {
        self.splits.tables_mut().iter_mut().collect()
    }
}

/// A (…, H) value as (N, H) rows (a copy only if it is not contiguous).
fn as_rows<T: Real>(h: ArrayViewD<'_, T>) -> ndarray::CowArray<'_, T, Ix2> {
    let width = *h.shape().last().expect("hidden has an H axis (checked)");
    let n: usize = h.shape()[..h.ndim() - 1].iter().product();
    if h.is_standard_layout() {
        ndarray::CowArray::from(
            h.into_shape_with_order((n, width))
                .expect("standard layout"),
        )
    } else {
        let owned = h.as_standard_layout().into_owned();
        ndarray::CowArray::from(owned.into_shape_with_order((n, width)).expect("owned"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::grads::testing::{assert_same_grads, bits};
    use ndarray::{Array2, Array3, array};

    fn head<T: Real>() -> SplitLanguageModellingHead<T> {
        let sizes = [("a", 7), ("b", 5), ("c", 6)];
        let mut head = SplitLanguageModellingHead::<T>::new(&sizes, &["a", "b", "c"], 4).unwrap();
        head.reset_parameters(&mut Rng::new(3));
        head.set_trainable("b", false).unwrap();
        head.set_chunks(ChunkSizes {
            tokens: 3,
            vocab: 4,
        });
        head
    }

    fn saved_pair_is_the_tape<T: Real>() {
        let head = head::<T>();
        let mut rng = Rng::new(4);
        let hidden =
            Array3::from_shape_fn((2, 5, 4), |_| T::from_f64(2.0 * rng.normal())).into_dyn();
        // Rank-2 labels with ignored tokens, in every split.
        let labels = array![[0i64, 8, -100, 17, 3], [12, -100, 6, 7, 0]];
        let up = Array2::from_shape_fn((2, 5), |_| T::from_f64(rng.normal())).into_dyn();
        let ws = Workspace::new();
        let (loss, saved) = head.forward_saved(hidden.view(), &labels).unwrap();
        for want_hidden in [true, false] {
            let got = head
                .backward_saved(&ws, &saved, hidden.view(), up.view(), want_hidden)
                .unwrap();
            let mut tape = Tape::new();
            let x = if want_hidden {
                tape.input(hidden.clone())
            } else {
                tape.constant(hidden.clone())
            };
            let y = head.forward(&mut tape, x, &labels).unwrap();
            assert_eq!(bits(loss.view()), bits(tape.value(y)));
            let mut want = tape.backward_from(y, up.view());
            assert_same_grads(&head, &got, &want);
            assert_eq!(got.params.len(), 2);
            let gh = want.take_input(x);
            assert_eq!(
                got.input.map(|g| bits(g.view())),
                gh.map(|g| bits(g.view()))
            );
        }
    }

    fn summed_is_the_tape<T: Real>() {
        let head = head::<T>();
        let mut rng = Rng::new(5);
        let hidden = Array3::from_shape_fn((2, 3, 4), |_| T::from_f64(rng.normal())).into_dyn();
        let labels = array![[1i64, -100, 17], [12, 9, 0]];
        let ws = Workspace::new();
        for (want_hidden, want_weights) in
            [(true, true), (false, true), (true, false), (false, false)]
        {
            let (loss, got) = head
                .forward_sum_saved(&ws, hidden.view(), &labels, want_hidden, want_weights)
                .unwrap();
            let mut tape = if want_weights || want_hidden {
                Tape::new()
            } else {
                Tape::no_grad()
            };
            let x = if want_hidden {
                tape.input(hidden.clone())
            } else {
                tape.constant(hidden.clone())
            };
            let total = head.forward_sum(&mut tape, x, &labels).unwrap();
            assert_eq!(
                loss.to_f64().to_bits(),
                tape.scalar(total).to_f64().to_bits()
            );
            if !want_weights {
                assert!(got.params.is_empty());
            } else {
                let mut want = tape.backward(total);
                assert_same_grads(&head, &got, &want);
                let gh = want.take_input(x);
                assert_eq!(
                    got.input.map(|g| bits(g.view())),
                    gh.map(|g| bits(g.view()))
                );
            }
        }
    }

    #[test]
    fn saved_pair_is_the_tape_f32_and_f64() {
        saved_pair_is_the_tape::<f32>();
        saved_pair_is_the_tape::<f64>();
        summed_is_the_tape::<f32>();
        summed_is_the_tape::<f64>();
    }

    #[test]
    fn saved_pair_errors_are_the_tapes() {
        let head = head::<f64>();
        let hidden = Array2::<f64>::zeros((2, 4)).into_dyn();
        let err = head.forward_saved(hidden.view(), &[0i64, 18]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "label 18 at position [1] is out of range 0..18"
        );
        let (_, saved) = head.forward_saved(hidden.view(), &[0i64, 1]).unwrap();
        let up = ndarray::Array1::<f64>::zeros(3).into_dyn();
        let err = head
            .backward_saved(&Workspace::new(), &saved, hidden.view(), up.view(), true)
            .unwrap_err();
        assert!(err.to_string().contains("grad_loss"), "{err}");
    }
}
