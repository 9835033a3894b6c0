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
//! `docs/gradients.md#fused-cross-entropy`.

use ndarray::{Array2, ArrayD, ArrayView2, ArrayViewD, ArrayViewMut2, Ix2, s};

use super::SplitTables;
use crate::ops::cross_entropy::{IGNORE_INDEX, first_bad_label};
use crate::tape::{Op, Tape, Var};
use crate::{Error, Parameter, Real, Result, Rng};

/// Chunk sizes of the fused cross-entropy: the workspace holds
/// `tokens × vocab` logits plus two `tokens × H` blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkSizes {
    /// Tokens per chunk.
    pub tokens: usize,
    /// Vocabulary rows per chunk.
    pub vocab: usize,
}

impl Default for ChunkSizes {
    fn default() -> Self {
        ChunkSizes {
            tokens: 256,
            vocab: 4096,
        }
    }
}

impl ChunkSizes {
    /// Bytes of workspace the kernel allocates for hidden size `h` and
    /// element type `T`: independent of N and V.
    pub fn workspace_bytes<T: Real>(&self, h: usize) -> usize {
        (self.tokens * self.vocab + 2 * self.tokens * h) * std::mem::size_of::<T>()
    }
}

/// What the backward of the fused op needs: the inputs' nodes, the labels
/// and each token's log-sum-exp.
pub(crate) struct FusedCeSaved<T> {
    pub(crate) hidden: Var,
    pub(crate) weights: Vec<Var>,
    labels: Vec<i64>,
    lse: Vec<T>,
    chunks: ChunkSizes,
}

/// Positions of the tokens whose label is not ignored.
fn active_positions(labels: &[i64]) -> Vec<usize> {
    labels
        .iter()
        .enumerate()
        .filter(|&(_, &l)| l != IGNORE_INDEX)
        .map(|(i, _)| i)
        .collect()
}

/// Copies rows `idx` of `h` into the first `idx.len()` rows of `buf`.
fn gather_rows<T: Real>(h: ArrayView2<'_, T>, idx: &[usize], buf: &mut Array2<T>) {
    for (i, &p) in idx.iter().enumerate() {
        buf.row_mut(i).assign(&h.row(p));
    }
}

/// Per-token loss and log-sum-exp, chunked (the fast kernel).
///
/// h: (N, H), weights: (size_k, H) each, labels: (N) in `[0, V)` or −100
/// → (loss (N), lse (N)); an ignored token has loss 0 and lse 0.
pub fn fused_ce_forward<T: Real>(
    h: ArrayView2<'_, T>,
    weights: &[ArrayView2<'_, T>],
    labels: &[i64],
    chunks: ChunkSizes,
) -> (Vec<T>, Vec<T>) {
    let n = h.nrows();
    let mut loss = vec![T::zero(); n];
    let mut lse = vec![T::zero(); n];
    let active = active_positions(labels);
    let (tc, vc) = (chunks.tokens.max(1), chunks.vocab.max(1));
    let mut hc = Array2::<T>::zeros((tc.min(active.len()), h.ncols()));
    let mut work = Array2::<T>::zeros((tc.min(active.len()), vc));
    for idx in active.chunks(tc) {
        let rows = idx.len();
        gather_rows(h, idx, &mut hc);
        let hc = hc.slice(s![..rows, ..]);
        let mut m = vec![T::neg_infinity(); rows];
        let mut sum = vec![T::zero(); rows];
        let mut label_logit = vec![T::zero(); rows];
        let mut start = 0usize;
        for w in weights {
            for v0 in (0..w.nrows()).step_by(vc) {
                let v1 = (v0 + vc).min(w.nrows());
                let mut sblk = work.slice_mut(s![..rows, ..v1 - v0]);
                T::gemm(
                    T::one(),
                    hc,
                    w.slice(s![v0..v1, ..]).t(),
                    T::zero(),
                    sblk.view_mut(),
                );
                for (i, row) in sblk.outer_iter().enumerate() {
                    let bm = row.iter().fold(T::neg_infinity(), |a, &b| a.max(b));
                    if bm > m[i] {
                        sum[i] = sum[i] * (m[i] - bm).exp();
                        m[i] = bm;
                    }
                    let mi = m[i];
                    if mi > T::neg_infinity() {
                        sum[i] += row.iter().map(|&z| (z - mi).exp()).sum::<T>();
                    }
                    let l = labels[idx[i]] as usize;
                    if l >= start + v0 && l < start + v1 {
                        label_logit[i] = row[l - start - v0];
                    }
                }
            }
            start += w.nrows();
        }
        for (i, &p) in idx.iter().enumerate() {
            lse[p] = m[i] + sum[i].ln();
            loss[p] = lse[p] - label_logit[i];
        }
    }
    (loss, lse)
}

/// Adds the gradients of `Σ_n gy[n]·loss_n` (the fast kernel).
///
/// h: (N, H), weights: (size_k, H), labels, lse: (N) from
/// [`fused_ce_forward`], gy: (N); gh: (N, H), gws[k]: (size_k, H), each
/// `None` when not wanted.
#[allow(clippy::too_many_arguments)]
pub fn fused_ce_backward<T: Real>(
    h: ArrayView2<'_, T>,
    weights: &[ArrayView2<'_, T>],
    labels: &[i64],
    lse: &[T],
    gy: &[T],
    chunks: ChunkSizes,
    mut gh: Option<ArrayViewMut2<'_, T>>,
    gws: &mut [Option<ArrayViewMut2<'_, T>>],
) {
    let active = active_positions(labels);
    let (tc, vc) = (chunks.tokens.max(1), chunks.vocab.max(1));
    let width = h.ncols();
    let mut hc = Array2::<T>::zeros((tc.min(active.len()), width));
    let mut ghc = Array2::<T>::zeros((tc.min(active.len()), width));
    let mut work = Array2::<T>::zeros((tc.min(active.len()), vc));
    for idx in active.chunks(tc) {
        let rows = idx.len();
        gather_rows(h, idx, &mut hc);
        let hcv = hc.slice(s![..rows, ..]);
        ghc.fill(T::zero());
        let mut start = 0usize;
        for (k, w) in weights.iter().enumerate() {
            for v0 in (0..w.nrows()).step_by(vc) {
                let v1 = (v0 + vc).min(w.nrows());
                let wblk = w.slice(s![v0..v1, ..]);
                let mut g = work.slice_mut(s![..rows, ..v1 - v0]);
                T::gemm(T::one(), hcv, wblk.t(), T::zero(), g.view_mut());
                for (i, mut row) in g.outer_iter_mut().enumerate() {
                    let p = idx[i];
                    let (l, u) = (lse[p], gy[p]);
                    row.mapv_inplace(|z| u * (z - l).exp());
                    let lab = labels[p] as usize;
                    if lab >= start + v0 && lab < start + v1 {
                        row[lab - start - v0] -= u;
                    }
                }
                if gh.is_some() {
                    T::gemm(
                        T::one(),
                        g.view(),
                        wblk,
                        T::one(),
                        ghc.slice_mut(s![..rows, ..]),
                    );
                }
                if let Some(gw) = gws[k].as_mut() {
                    T::gemm(T::one(), g.t(), hcv, T::one(), gw.slice_mut(s![v0..v1, ..]));
                }
            }
            start += w.nrows();
        }
        if let Some(gh) = gh.as_mut() {
            for (i, &p) in idx.iter().enumerate() {
                let mut dst = gh.row_mut(p);
                dst += &ghc.row(i);
            }
        }
    }
}

/// The naive twin: the full (N, V) logits, then a stable cross-entropy per
/// row. Returns (loss (N), lse (N)).
pub fn naive_ce_forward<T: Real>(
    h: ArrayView2<'_, T>,
    weights: &[ArrayView2<'_, T>],
    labels: &[i64],
) -> (Vec<T>, Vec<T>) {
    let w = ndarray::concatenate(ndarray::Axis(0), weights).expect("same width");
    let mut logits = Array2::<T>::zeros((h.nrows(), w.nrows()));
    T::gemm(T::one(), h, w.t(), T::zero(), logits.view_mut());
    let mut loss = vec![T::zero(); h.nrows()];
    let mut lse = vec![T::zero(); h.nrows()];
    for (i, row) in logits.outer_iter().enumerate() {
        if labels[i] != IGNORE_INDEX {
            lse[i] = crate::ops::cross_entropy::logsumexp_row(row);
            loss[i] = lse[i] - row[labels[i] as usize];
        }
    }
    (loss, lse)
}

impl<T: Real> FusedCeSaved<T> {
    /// Adds the gradients into the buffers given.
    pub(crate) fn backward(
        &self,
        h: ArrayViewD<'_, T>,
        ws: &[ArrayViewD<'_, T>],
        gy: ArrayViewD<'_, T>,
        gh: Option<&mut ArrayD<T>>,
        gws: Vec<Option<&mut ArrayD<T>>>,
    ) {
        let h2 = as_rows(h);
        let ws2: Vec<ArrayView2<'_, T>> = ws
            .iter()
            .map(|w| w.view().into_dimensionality::<Ix2>().expect("2-D weight"))
            .collect();
        let gy: Vec<T> = gy.iter().copied().collect();
        let width = h2.ncols();
        let gh = gh.map(|g| {
            g.view_mut()
                .into_shape_with_order((gy.len(), width))
                .expect("contiguous gradient")
        });
        let mut gws: Vec<Option<ArrayViewMut2<'_, T>>> = gws
            .into_iter()
            .map(|g| {
                g.map(|g| {
                    g.view_mut()
                        .into_dimensionality::<Ix2>()
                        .expect("2-D weight gradient")
                })
            })
            .collect();
        fused_ce_backward(
            h2.view(),
            &ws2,
            &self.labels,
            &self.lse,
            &gy,
            self.chunks,
            gh,
            &mut gws,
        );
    }
}

/// A (…, H) value as (N, H) rows (a copy only if it is not contiguous).
fn as_rows<T: Real>(h: ArrayViewD<'_, T>) -> ndarray::CowArray<'_, T, Ix2> {
    let width = *h.shape().last().expect("hidden has an H axis");
    let n: usize = h.shape()[..h.ndim() - 1].iter().product();
    if h.is_standard_layout() {
        ndarray::CowArray::from(
            h.into_shape_with_order((n, width))
                .expect("standard layout reshapes"),
        )
    } else {
        ndarray::CowArray::from(
            h.as_standard_layout()
                .into_owned()
                .into_shape_with_order((n, width))
                .expect("owned arrays reshape"),
        )
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
/// let loss = head.forward(&mut tape, hidden, array![6i64, -100].into_dyn().view())?;
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
    pub fn forward<'p>(
        &'p self,
        tape: &mut Tape<'p, T>,
        hidden: Var,
        labels: ArrayViewD<'_, i64>,
    ) -> Result<Var> {
        let flat = self.check(tape, hidden, labels.view())?;
        let ws: Vec<Var> = self.splits.tables().iter().map(|p| tape.param(p)).collect();
        let (loss, lse) = {
            let h = as_rows(tape.value(hidden));
            let wv: Vec<ArrayView2<'_, T>> = self
                .splits
                .tables()
                .iter()
                .map(|p| p.value().view().into_dimensionality::<Ix2>().expect("2-D"))
                .collect();
            fused_ce_forward(h.view(), &wv, &flat, self.chunks)
        };
        let out = ArrayD::from_shape_vec(labels.shape(), loss).expect("one loss per label");
        let saved = FusedCeSaved {
            hidden,
            weights: ws.clone(),
            labels: flat,
            lse,
            chunks: self.chunks,
        };
        let mut inputs = ws;
        inputs.push(hidden);
        Ok(tape.push(out, Op::FusedCrossEntropy(Box::new(saved)), &inputs))
    }

    /// The reference: the same loss from the full logits with the tape's
    /// primitive ops (`concat_rows`, `transpose`, `matmul`,
    /// `cross_entropy`). Materialises N × V; for tests and teaching.
    pub fn forward_naive<'p>(
        &'p self,
        tape: &mut Tape<'p, T>,
        hidden: Var,
        labels: ArrayViewD<'_, i64>,
    ) -> Result<Var> {
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

    /// The weights, in split order.
    pub fn parameters(&self) -> &[Parameter<T>] {
        self.splits.tables()
    }

    /// The weights, to change in place.
    pub fn parameters_mut(&mut self) -> &mut [Parameter<T>] {
        self.splits.tables_mut()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_equals_naive_across_chunk_boundaries() {
        let mut rng = Rng::new(4);
        let (n, h) = (13, 5);
        let sizes = [7usize, 0, 10];
        let hid = Array2::from_shape_fn((n, h), |_| rng.normal() * 30.0);
        let ws: Vec<Array2<f64>> = sizes
            .iter()
            .map(|&s| Array2::from_shape_fn((s, h), |_| rng.normal() * 30.0))
            .collect();
        let wv: Vec<ArrayView2<'_, f64>> = ws.iter().map(|w| w.view()).collect();
        let labels: Vec<i64> = (0..n)
            .map(|i| {
                if i % 4 == 3 {
                    -100
                } else {
                    (i * 5 % 17) as i64
                }
            })
            .collect();
        let (l0, s0) = naive_ce_forward(hid.view(), &wv, &labels);
        for chunks in [
            ChunkSizes {
                tokens: 1,
                vocab: 1,
            },
            ChunkSizes {
                tokens: 4,
                vocab: 3,
            },
            ChunkSizes {
                tokens: 100,
                vocab: 100,
            },
        ] {
            let (l1, s1) = fused_ce_forward(hid.view(), &wv, &labels, chunks);
            for i in 0..n {
                assert!(
                    (l0[i] - l1[i]).abs() <= 1e-9 * l0[i].abs().max(1.0),
                    "{chunks:?} token {i}: {} vs {}",
                    l0[i],
                    l1[i]
                );
                assert!((s0[i] - s1[i]).abs() <= 1e-9 * s0[i].abs().max(1.0));
            }
        }
    }
}
