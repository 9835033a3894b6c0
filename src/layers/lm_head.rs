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

use ndarray::{ArrayD, ArrayView2, ArrayViewD, ArrayViewMut2, CowArray, Ix2, IxDyn};

use super::grads::as_tape_leaves;
use super::{Ids, LayerGrads, NamedGrad, SplitTables, Workspace};
use crate::error::{Error, Result};
use crate::kernels::Real;
use crate::ops::cross_entropy::first_bad_label;
use crate::ops::fused_ce::{
    ChunkSizes, HeadKernel, RowStats, Targets, fused_ce_backward_on, fused_ce_forward_on,
};
use crate::ops::fused_ce_sum::{SumChunks, fused_ce_sum_forward_on};
use crate::param::{Dtype, ParamGrad, Parameter, Stored};
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
        Self::with_dtype(split_vocab_size, split_order, hidden_size, Dtype::of::<T>())
    }

    /// [`Self::new`] with the weights kept as `dtype` from the start (see
    /// [`SplitTokenEmbeddings::with_dtype`](super::SplitTokenEmbeddings::with_dtype)).
    ///
    /// ```
    /// use splitgrad::{layers::SplitLanguageModellingHead, param::Dtype, state::Module};
    /// let h = SplitLanguageModellingHead::<f32>::with_dtype(&[("a", 50)], &["a"], 4, Dtype::F16)?;
    /// assert_eq!(h.parameter_bytes(), 50 * 4 * 2);
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn with_dtype<S: AsRef<str>, O: AsRef<str>>(
        split_vocab_size: &[(S, usize)],
        split_order: &[O],
        hidden_size: usize,
        dtype: Dtype,
    ) -> Result<Self> {
        Ok(SplitLanguageModellingHead {
            splits: SplitTables::with_dtype(
                "lm_head",
                split_vocab_size,
                split_order,
                hidden_size,
                dtype,
            )?,
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
            let pos = crate::kernels::unravel(p, labels.shape());
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
        let arrays = self.weight_arrays();
        let weights = as_views(&arrays);
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
            .map(|p| p.is_trainable().then(|| ws.zeros(p.shape())))
            .collect();
        if gh.is_some() || gws.iter().any(Option::is_some) {
            let ghv = gh.as_mut().map(|g| {
                g.view_mut()
                    .into_shape_with_order(h2.dim())
                    .expect("a fresh array")
            });
            let mut gwv: Vec<Option<ArrayViewMut2<'_, T>>> =
                gws.iter_mut().map(as_2d_mut).collect();
            fused_ce_backward_on(
                self.kernel,
                ws,
                h2.view(),
                &as_views(&self.weight_arrays()),
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
            &as_views(&self.weight_arrays()),
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

    /// The split weights as (size_k, H) arrays of `T`: borrowed, or
    /// widened from half precision (the fused kernels' panels are `T`).
    fn weight_arrays(&self) -> Vec<CowArray<'_, T, Ix2>> {
        self.splits
            .tables()
            .iter()
            .map(|p| {
                let a = match p.stored() {
                    Stored::Full(a) => CowArray::from(a.view()),
                    _ => CowArray::from(p.widened().into_owned()),
                };
                a.into_dimensionality::<Ix2>().expect("weights are 2-D")
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
}

super::splits::split_layer_api!(SplitLanguageModellingHead);

/// A (…, H) value as (N, H) rows (a copy only if it is not contiguous).
fn as_rows<T: Real>(h: ArrayViewD<'_, T>) -> ndarray::CowArray<'_, T, Ix2> {
    let width = *h.shape().last().expect("hidden has an H axis (checked)");
    let n = h.shape()[..h.ndim() - 1].iter().product();
    let rows: ndarray::CowArray<'_, T, IxDyn> = match h.is_standard_layout() {
        true => h.into(),
        false => h.as_standard_layout().into_owned().into(),
    };
    rows.into_shape_with_order((n, width))
        .expect("standard layout")
}

/// A weight's gradient buffer as (size_k, H).
fn as_2d_mut<T>(g: &mut Option<ArrayD<T>>) -> Option<ArrayViewMut2<'_, T>> {
    let g = g.as_mut()?.view_mut();
    Some(g.into_dimensionality::<Ix2>().expect("2-D"))
}

/// Views of the weights of [`SplitLanguageModellingHead::weight_arrays`].
fn as_views<'a, T>(arrays: &'a [CowArray<'_, T, Ix2>]) -> Vec<ArrayView2<'a, T>> {
    arrays.iter().map(|a| a.view()).collect()
}
