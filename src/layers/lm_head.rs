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

use ndarray::ArrayViewD;

use super::{Ids, SplitTables};
use crate::error::{Error, Result};
use crate::kernels::Real;
use crate::ops::cross_entropy::first_bad_label;
use crate::ops::fused_ce::{ChunkSizes, HeadKernel, Targets};
use crate::ops::fused_ce_sum::SumChunks;
use crate::param::Parameter;
use crate::rng::Rng;
use crate::state::Module;
use crate::tape::{Tape, Var};

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

    fn check(
        &self,
        tape: &Tape<'_, T>,
        hidden: Var,
        labels: ArrayViewD<'_, i64>,
    ) -> Result<Vec<i64>> {
        let hs = tape.value(hidden).shape().to_vec();
        let h = self.splits.hidden_size();
        if hs.last() != Some(&h) {
            return Err(Error::shape("hidden", format!("(…, {h})"), &hs));
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
        let flat = self.check(tape, hidden, labels.view())?;
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
        let flat = self.check(tape, hidden, labels.ids())?;
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
        let flat = self.check(tape, hidden, labels.view())?;
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
