//! The summed fused cross-entropy of the LM head: `ℒ = Σ_n loss_n` as one
//! scalar, with its gradients formed during the forward.
//!
//! When the per-token losses are only summed, every token's upstream
//! gradient is the same scalar gy, so the gradient is known at forward time
//! up to that one factor. The forward walks chunks of tokens against the
//! whole vocabulary, once:
//!
//! ```text
//! Z_c     = h_c·Wᵀ                                (chunk_tokens × V, the workspace; one gemm per split)
//! loss_n  = (m_n − z_{n,y_n}) + ln Σ_v e^{z_nv − m_n}   m_n = max_v z_nv; 0 for y_n = −100
//! G_c     = softmax(Z_c) − onehot(y_c)            (in place; ignored tokens are left out)
//! ∂h_c    = G_c·W                                 ∂W_k += G_{c,k}ᵀ·h_c   (β = 1)
//! ```
//!
//! and the backward only scales: `∂h += gy·∂h°`, `∂W_k += gy·∂W_k°`
//! ([`fused_ce_sum_backward`]). That is 6·N·V·H flops, against 8·N·V·H for
//! the per-token kernel of [`super::fused_ce`], which must recompute the
//! logits in its backward; the price is ∂W (V × H), held from the forward
//! to the backward. Derivation:
//! `docs/gradients.md#summed-fused-cross-entropy`.
//!
//! In f32 on a CPU with AVX2 and FMA ([`HeadKernel::Auto`]) the three
//! products run on the tile kernel of [`crate::kernels::gemm::head`]: W is
//! packed once per call and read by every chunk, the logits never leave
//! the 6 × 16 tiles (only their exponentials are stored, `Z_c` is never
//! written), and the softmax's normalisation is folded into the two
//! gradient products. Otherwise (f64, [`HeadKernel::Matrixmultiply`]) each
//! product is a `matrixmultiply` gemm as written above.
//!
//! Either way each row's softmax is computed by one task in a fixed order,
//! and no product's inner sum is split between threads, so the result is
//! the same bits for any thread count.
//!
//! Tokens that share hidden rows ([`fused_ce_sum_grouped_forward_on`]) take
//! the same path: both forms are one scaffold, which tries the tile kernel
//! and otherwise runs the form's `matrixmultiply` path (in `fallback`: the
//! above for tokens with their own rows, the per-token kernel's forward and
//! backward for shared rows). [`SumChunks`] (in `chunks`) sizes the chunks.

mod chunks;
mod fallback;

use ndarray::{Array2, ArrayD, ArrayView2, ArrayViewD, Ix2, IxDyn};

use super::fused_ce::tile::TileRows;
use super::fused_ce::{HeadKernel, Targets, as_rows, f32_weights, pool_f32, weight_views};
use crate::kernels::Real;
use crate::kernels::gemm::{self, head};
use crate::kernels::pool::Pool;
use crate::ops::cross_entropy::IGNORE_INDEX;
use crate::tape::{Backward, Flow, NodeGrads, Tape, Var};

pub use chunks::SumChunks;

/// The gradients of `Σ_n loss_n` formed by [`fused_ce_sum_forward`], not
/// yet scaled by the upstream gradient.
#[derive(Clone, Debug, PartialEq)]
pub struct SumGrads<T> {
    /// ∂ℒ/∂h (N, H), when asked for; rows of ignored tokens are 0.
    pub hidden: Option<Array2<T>>,
    /// ∂ℒ/∂W_k (size_k, H) for each split, when asked for.
    pub weights: Vec<Option<Array2<T>>>,
}

impl<T: Real> SumGrads<T> {
    /// Zeros from `pool`: ∂h of `shape` when `want_hidden`, ∂W_k of
    /// `weights[k]`'s shape when `want_weights[k]`.
    fn zeros(
        pool: &Pool<T>,
        shape: (usize, usize),
        weights: &[ArrayView2<'_, T>],
        want_hidden: bool,
        want_weights: &[bool],
    ) -> Self {
        let zeros2 = |(r, c): (usize, usize)| -> Array2<T> {
            pool.zeros(&[r, c])
                .into_dimensionality::<Ix2>()
                .expect("2-D")
        };
        SumGrads {
            hidden: want_hidden.then(|| zeros2(shape)),
            weights: weights
                .iter()
                .zip(want_weights)
                .map(|(w, &want)| want.then(|| zeros2(w.dim())))
                .collect(),
        }
    }

    /// Whether any gradient is wanted.
    fn any(&self) -> bool {
        self.hidden.is_some() || self.weights.iter().any(Option::is_some)
    }

    /// The gradients as the tile kernel's destination (f32 views).
    ///
    /// **Panics** if `T` is not f32 (the tile kernel's callers have checked).
    fn head_out(&mut self) -> head::Out<'_> {
        fn view<T: Real>(g: &mut Array2<T>) -> ndarray::ArrayViewMut2<'_, f32> {
            gemm::f32_view_mut(g.view_mut()).expect("a fresh f32 array")
        }
        head::Out {
            hidden: self.hidden.as_mut().map(view),
            weights: self
                .weights
                .iter_mut()
                .map(|g| g.as_mut().map(view))
                .collect(),
        }
    }
}

/// `Σ_n loss_n` and, when asked for, its gradients (the fast kernel).
///
/// h: (N, H), `weights[k]`: (size_k, H), labels: (N) in `[0, V)` or −100;
/// `want_hidden` and `want_weights[k]` say which gradients to form. With
/// none wanted only the loss is computed (the same bits). The loss is
/// summed in token order in f64 and rounded to `T` once.
///
/// ```
/// use ndarray::array;
/// use splitgrad::ops::fused_ce_sum::{SumChunks, fused_ce_sum_forward};
/// // One token, z = [0, 0]: loss ln 2, ∂h = ½·W_0 + ½·W_1 − W_1.
/// let h = array![[1.0f64, 0.0]];
/// let w = array![[0.0, 1.0], [0.0, -1.0]];
/// let (loss, g) = fused_ce_sum_forward(h.view(), &[w.view()], &[1], SumChunks::default(), true, &[true]);
/// assert!((loss - 2f64.ln()).abs() < 1e-15);
/// assert_eq!(g.hidden.unwrap(), array![[0.0, 1.0]]);
/// assert_eq!(g.weights[0].as_ref().unwrap(), array![[0.5, 0.0], [-0.5, 0.0]]);
/// ```
///
/// **Panics** if labels and h have different lengths, `want_weights` and
/// `weights` differ in length, or a label is outside `[0, V)` and not −100.
#[track_caller]
pub fn fused_ce_sum_forward<T: Real>(
    h: ArrayView2<'_, T>,
    weights: &[ArrayView2<'_, T>],
    labels: &[i64],
    chunks: SumChunks,
    want_hidden: bool,
    want_weights: &[bool],
) -> (T, SumGrads<T>) {
    fused_ce_sum_forward_in(
        &Pool::new(),
        h,
        weights,
        labels,
        chunks,
        want_hidden,
        want_weights,
    )
}

/// [`fused_ce_sum_forward`] with its gradients and workspace in buffers
/// from `pool` (the workspace is given back before it returns).
///
/// **Panics** as [`fused_ce_sum_forward`].
#[track_caller]
pub fn fused_ce_sum_forward_in<T: Real>(
    pool: &Pool<T>,
    h: ArrayView2<'_, T>,
    weights: &[ArrayView2<'_, T>],
    labels: &[i64],
    chunks: SumChunks,
    want_hidden: bool,
    want_weights: &[bool],
) -> (T, SumGrads<T>) {
    fused_ce_sum_forward_on(
        HeadKernel::Auto,
        pool,
        h,
        weights,
        labels,
        chunks,
        want_hidden,
        want_weights,
    )
}

/// [`fused_ce_sum_forward_in`] on the products `kernel` chooses.
///
/// **Panics** as [`fused_ce_sum_forward`].
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn fused_ce_sum_forward_on<T: Real>(
    kernel: HeadKernel,
    pool: &Pool<T>,
    h: ArrayView2<'_, T>,
    weights: &[ArrayView2<'_, T>],
    labels: &[i64],
    chunks: SumChunks,
    want_hidden: bool,
    want_weights: &[bool],
) -> (T, SumGrads<T>) {
    let wants = (want_hidden, want_weights);
    sum_forward(
        Form::PerToken(labels),
        kernel,
        pool,
        h,
        weights,
        chunks,
        wants,
    )
}

/// `Σ_n loss_n` for tokens that share hidden rows, and when asked for its
/// gradients: h (m, H), token n reads row `row_of[n]` with label `labels[n]`
/// ([`Targets::grouped`]); ∂h is (m, H). The same sum as
/// [`fused_ce_sum_forward`] on the rows repeated per token, at the cost of
/// m rows instead of N. On the tile kernel the gradients are formed in this
/// pass (`6·m·V·H` flops) with the chunks of `chunks` (rows per chunk, by
/// the same budget); elsewhere the per-token kernel's forward and backward
/// (with every upstream gradient 1) form them.
///
/// ```
/// use ndarray::array;
/// use splitgrad::ops::fused_ce::{HeadKernel, Targets};
/// use splitgrad::ops::fused_ce_sum::{SumChunks, fused_ce_sum_grouped_forward_on};
/// use splitgrad::kernels::pool::Pool;
/// let h = array![[1.0f64, 0.0]];
/// let w = array![[0.0, 1.0], [0.0, -1.0]];
/// // Two tokens read the one row: z = [0, 0], each loss ln 2.
/// let t = Targets::grouped(vec![0, 1], vec![0, 0], 1);
/// let (loss, g) = fused_ce_sum_grouped_forward_on(
///     HeadKernel::Auto, &Pool::new(), h.view(), &[w.view()], &t, SumChunks::default(), true, &[true]);
/// assert!((loss - 2.0 * 2f64.ln()).abs() < 1e-15);
/// // The two tokens pull W's rows opposite ways: ∂W = 0.
/// assert!(g.weights[0].as_ref().unwrap().iter().all(|x| x.abs() < 1e-15));
/// ```
///
/// **Panics** if `targets` has a different number of rows than h or a
/// label outside `[0, V)`, or `want_weights` and `weights` differ in length.
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn fused_ce_sum_grouped_forward_on<T: Real>(
    kernel: HeadKernel,
    pool: &Pool<T>,
    h: ArrayView2<'_, T>,
    weights: &[ArrayView2<'_, T>],
    targets: &Targets,
    chunks: SumChunks,
    want_hidden: bool,
    want_weights: &[bool],
) -> (T, SumGrads<T>) {
    let wants = (want_hidden, want_weights);
    sum_forward(
        Form::Grouped(targets),
        kernel,
        pool,
        h,
        weights,
        chunks,
        wants,
    )
}

/// The two forms of the summed head.
#[derive(Clone, Copy)]
enum Form<'a> {
    /// Token n reads hidden row n, with label `labels[n]`.
    PerToken(&'a [i64]),
    /// Tokens share hidden rows.
    Grouped(&'a Targets),
}

/// The scaffold of both forms: checks the inputs (in the form's words),
/// makes the gradients' buffers, and sums the loss with its gradients on
/// the tile kernel where it runs, the form's `matrixmultiply` path
/// elsewhere. `wants`: whether ∂h is wanted, and each ∂W_k.
#[track_caller]
fn sum_forward<T: Real>(
    form: Form<'_>,
    kernel: HeadKernel,
    pool: &Pool<T>,
    h: ArrayView2<'_, T>,
    weights: &[ArrayView2<'_, T>],
    chunks: SumChunks,
    (want_hidden, want_weights): (bool, &[bool]),
) -> (T, SumGrads<T>) {
    let m = h.nrows();
    let v: usize = weights.iter().map(|w| w.nrows()).sum();
    let op = match form {
        Form::PerToken(labels) => {
            assert_eq!(
                labels.len(),
                m,
                "fused_ce_sum: {} labels for {m} rows",
                labels.len()
            );
            "fused_ce_sum"
        }
        Form::Grouped(targets) => {
            assert_eq!(
                targets.n_rows(),
                m,
                "fused_ce_sum_grouped: targets for {} rows, hidden has {m}",
                targets.n_rows()
            );
            "fused_ce_sum_grouped"
        }
    };
    assert_eq!(
        want_weights.len(),
        weights.len(),
        "{op}: one wish per weight"
    );
    let per_token;
    let (targets, unit, rows) = match form {
        Form::PerToken(labels) => {
            per_token = Targets::per_token(labels.to_vec());
            (&per_token, "row", per_token.active_rows().len())
        }
        Form::Grouped(targets) => (targets, "token", m),
    };
    if let Some((n, &l)) = targets
        .labels
        .iter()
        .enumerate()
        .find(|&(_, &l)| l != IGNORE_INDEX && (l < 0 || l as usize >= v))
    {
        panic!("{op}: label {l} of {unit} {n} is outside 0..{v}");
    }
    let grads = SumGrads::zeros(pool, h.dim(), weights, want_hidden, want_weights);
    let sum = Summed {
        form,
        kernel,
        pool,
        h,
        weights,
        targets,
        tc: chunks.tokens::<T>(v).min(rows).max(1),
    };
    sum.run(grads)
}

/// A call of the summed head: its form, products and inputs (`targets`
/// the per-token ones for [`Form::PerToken`]), and the rows per chunk.
struct Summed<'a, 'v, T: Real> {
    form: Form<'a>,
    kernel: HeadKernel,
    pool: &'a Pool<T>,
    h: ArrayView2<'v, T>,
    weights: &'a [ArrayView2<'v, T>],
    targets: &'a Targets,
    tc: usize,
}

impl<T: Real> Summed<'_, '_, T> {
    /// `Σ_n loss_n`, its gradients added into `grads` (zeros).
    fn run(self, mut grads: SumGrads<T>) -> (T, SumGrads<T>) {
        let total = match (self.tile(&mut grads), self.form) {
            // The active tokens, in token order.
            (Some((_, loss)), Form::PerToken(_)) => loss.iter().map(|&l| l as f64).sum(),
            (Some((slots, loss)), Form::Grouped(_)) => {
                // Σ_n in token order, an ignored token's 0 included.
                let mut by_token = vec![0f64; self.targets.labels.len()];
                for (&n, &l) in slots.iter().zip(&loss) {
                    by_token[n] = l as f64;
                }
                by_token.iter().sum()
            }
            (None, Form::PerToken(_)) => fallback::whole_rows(&self, &mut grads),
            (None, Form::Grouped(_)) => fallback::per_token_kernel(&self, &mut grads),
        };
        // Rust's empty float sum is −0; a batch with no active token sums
        // to +0, as torch's sum does (every other total keeps its bits).
        (T::from_f64(total + 0.0), grads)
    }

    /// The tile kernel's pass: each loss's token and the per-token losses,
    /// the gradients added into `grads`; `None` (nothing done) where it
    /// cannot run.
    fn tile(&self, grads: &mut SumGrads<T>) -> Option<(Vec<usize>, Vec<f32>)> {
        let isa = self.kernel.isa::<T>()?;
        let h32 = gemm::f32_view(self.h)?;
        let w32 = f32_weights(self.weights)?;
        let pool32 = pool_f32(self.pool)?;
        let tr = TileRows::of(self.targets);
        let pass = if grads.any() {
            head::Pass::LossAndGrads
        } else {
            head::Pass::Loss
        };
        let st = head::fused_ce(
            isa,
            pool32,
            h32,
            &w32,
            tr.rows(self.targets),
            pass,
            self.tc,
            usize::MAX,
            &mut grads.head_out(),
        );
        Some((tr.slots, st.loss))
    }
}

/// `∂x += gy·d°` for every input x whose gradient d° [`fused_ce_sum_forward`]
/// formed: handed to the tape as the pairs `(gy, d°)`, written out only
/// when something needs the array (as `gy·d° + 0`: with gy = 1 the values of `d°`, a −0 written as +0).
pub fn fused_ce_sum_backward<'a, T: Real>(
    held: impl Iterator<Item = (Var, ArrayViewD<'a, T>)>,
    gy: T,
    grads: &mut NodeGrads<'a, T>,
) {
    for (v, d) in held {
        grads.add_scaled(v, gy, d);
    }
}

/// The saved state of the summed head: the gradients of `Σ_n loss_n`
/// formed in the forward, each beside the node it belongs to.
struct FusedCeSum<T: Real> {
    /// The hidden states' node and ∂ℒ/∂hidden (…, H), when it needs one.
    hidden: (Var, Option<ArrayD<T>>),
    /// Each weight's node and ∂ℒ/∂W_k (size_k, H), when it needs one.
    weights: Vec<(Var, Option<ArrayD<T>>)>,
    /// Where the gradients go back when the tape is dropped.
    pool: Pool<T>,
}

impl<T: Real> Drop for FusedCeSum<T> {
    fn drop(&mut self) {
        for (_, d) in std::iter::once(&mut self.hidden).chain(&mut self.weights) {
            if let Some(d) = d.take() {
                self.pool.give(d);
            }
        }
    }
}

impl<T: Real> Backward<T> for FusedCeSum<T> {
    fn backward<'a>(
        &'a self,
        _y: ArrayViewD<'a, T>,
        gy: Flow<'a, T>,
        grads: &mut NodeGrads<'a, T>,
    ) {
        let held = std::iter::once(&self.hidden)
            .chain(&self.weights)
            .filter_map(|(v, d)| d.as_ref().map(|d| (*v, d.view())));
        fused_ce_sum_backward(held, gy.first(), grads);
    }
}

impl<'p, T: Real> Tape<'p, T> {
    /// The summed cross-entropy `Σ_n loss_n` of hidden rows (…, H) against
    /// split weights `weights[k]` (size_k, H), labels (N) in `[0, V)` or
    /// −100 → a 0-D loss. The gradients of hidden and of the weights that
    /// need one are formed here (6·N·V·H flops in all) and held by the node
    /// until the tape is dropped; the backward only scales them.
    ///
    /// **Panics** if the shapes disagree or a label is outside `[0, V)`
    /// and not −100 (the head checks its inputs first).
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::{ops::fused_ce_sum::SumChunks, Tape};
    /// let mut t = Tape::<f64>::new();
    /// let h = t.input(array![[1.0, 0.0]].into_dyn());
    /// let w = t.input(array![[0.0, 1.0], [0.0, -1.0]].into_dyn());
    /// let loss = t.fused_cross_entropy_sum(h, &[w], &[1], SumChunks::default());
    /// assert!((t.scalar(loss) - 2f64.ln()).abs() < 1e-15);
    /// let g = t.backward(loss);
    /// assert_eq!(g.input(h).unwrap(), &array![[0.0, 1.0]].into_dyn());
    /// ```
    #[track_caller]
    pub fn fused_cross_entropy_sum(
        &mut self,
        hidden: Var,
        weights: &[Var],
        labels: &[i64],
        chunks: SumChunks,
    ) -> Var {
        self.fused_cross_entropy_sum_on(hidden, weights, labels, chunks, HeadKernel::Auto)
    }

    /// [`Tape::fused_cross_entropy_sum`] on the products `kernel` chooses.
    ///
    /// **Panics** as [`Tape::fused_cross_entropy_sum`].
    #[track_caller]
    pub fn fused_cross_entropy_sum_on(
        &mut self,
        hidden: Var,
        weights: &[Var],
        labels: &[i64],
        chunks: SumChunks,
        kernel: HeadKernel,
    ) -> Var {
        self.record_sum(hidden, weights, |pool, h, ws, want_hidden, want_weights| {
            let h = as_rows(h);
            fused_ce_sum_forward_on(
                kernel,
                pool,
                h.view(),
                &weight_views(ws, "fused_ce_sum"),
                labels,
                chunks,
                want_hidden,
                want_weights,
            )
        })
    }

    /// Records a summed head: `forward` runs on the pool, hidden's value,
    /// the weights' values and which gradients the tape wants (hidden's,
    /// each weight's), and its gradients are held by the node, ∂h in
    /// hidden's shape.
    #[track_caller]
    fn record_sum(
        &mut self,
        hidden: Var,
        weights: &[Var],
        forward: impl FnOnce(
            &Pool<T>,
            ArrayViewD<'_, T>,
            &[ArrayViewD<'_, T>],
            bool,
            &[bool],
        ) -> (T, SumGrads<T>),
    ) -> Var {
        let want_hidden = self.is_recording() && self.requires_grad(hidden);
        let want_weights: Vec<bool> = weights
            .iter()
            .map(|&w| self.is_recording() && self.requires_grad(w))
            .collect();
        let (loss, sums) = {
            let ws: Vec<ArrayViewD<'_, T>> = weights.iter().map(|&w| self.value(w)).collect();
            forward(
                self.pool(),
                self.value(hidden),
                &ws,
                want_hidden,
                &want_weights,
            )
        };
        let hidden_shape = self.value(hidden).shape().to_vec();
        let saved = FusedCeSum {
            hidden: (
                hidden,
                sums.hidden.map(|g| {
                    g.into_shape_with_order(IxDyn(&hidden_shape))
                        .expect("(N, H) rows reshape to hidden's shape")
                }),
            ),
            weights: weights
                .iter()
                .zip(sums.weights)
                .map(|(&w, g)| (w, g.map(|g| g.into_dyn())))
                .collect(),
            pool: self.pool().clone(),
        };
        let mut inputs = weights.to_vec();
        inputs.push(hidden);
        self.push_op(ArrayD::from_elem(IxDyn(&[]), loss), &inputs, saved)
    }

    /// The summed cross-entropy `Σ_n loss_n` of tokens that share hidden
    /// rows: hidden (m, H), `targets` the hidden row and label of each of
    /// N tokens ([`Targets::grouped`]) → a 0-D loss. The gradients of
    /// hidden and of the weights that need one are formed here, as
    /// [`Tape::fused_cross_entropy_sum`] forms them
    /// ([`fused_ce_sum_grouped_forward_on`]), and held by the node.
    ///
    /// **Panics** if the shapes disagree with the targets or a label is
    /// outside `[0, V)` and not −100 (the head checks its inputs first).
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::{ops::{fused_ce::{HeadKernel, Targets}, fused_ce_sum::SumChunks}, Tape};
    /// let mut t = Tape::<f64>::new();
    /// let h = t.input(array![[1.0, 0.0]].into_dyn());
    /// let w = t.input(array![[0.0, 1.0], [0.0, -1.0]].into_dyn());
    /// let targets = Targets::grouped(vec![1, 1], vec![0, 0], 1);
    /// let loss = t.fused_cross_entropy_sum_grouped(h, &[w], targets, SumChunks::default(), HeadKernel::Auto);
    /// assert!((t.scalar(loss) - 2.0 * 2f64.ln()).abs() < 1e-15);
    /// let g = t.backward(loss);
    /// let gh = g.input(h).unwrap();
    /// assert!((gh[[0, 0]]).abs() < 1e-15 && (gh[[0, 1]] - 2.0).abs() < 1e-15);
    /// ```
    #[track_caller]
    pub fn fused_cross_entropy_sum_grouped(
        &mut self,
        hidden: Var,
        weights: &[Var],
        targets: Targets,
        chunks: SumChunks,
        kernel: HeadKernel,
    ) -> Var {
        self.record_sum(hidden, weights, |pool, h, ws, want_hidden, want_weights| {
            let h = h
                .into_dimensionality::<Ix2>()
                .expect("fused_ce_sum_grouped: hidden must be (m, H)");
            fused_ce_sum_grouped_forward_on(
                kernel,
                pool,
                h,
                &weight_views(ws, "fused_ce_sum_grouped"),
                &targets,
                chunks,
                want_hidden,
                want_weights,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rng;
    use crate::ops::fused_ce::{ChunkSizes, fused_ce_backward, fused_ce_forward};
    use ndarray::ArrayViewMut2;

    /// The per-token kernel with gy = 1, summed: the reference.
    fn per_token(
        h: ArrayView2<'_, f64>,
        ws: &[ArrayView2<'_, f64>],
        labels: &[i64],
    ) -> (f64, Array2<f64>, Vec<Array2<f64>>) {
        let t = Targets::per_token(labels.to_vec());
        let c = ChunkSizes::default();
        let (loss, stats) = fused_ce_forward(h, ws, &t, c);
        let mut gh = Array2::zeros(h.dim());
        let mut gws: Vec<Array2<f64>> = ws.iter().map(|w| Array2::zeros(w.dim())).collect();
        let mut views: Vec<Option<ArrayViewMut2<'_, f64>>> =
            gws.iter_mut().map(|g| Some(g.view_mut())).collect();
        let ones = vec![1.0; labels.len()];
        fused_ce_backward(h, ws, &t, &stats, &ones, c, Some(gh.view_mut()), &mut views);
        drop(views);
        (loss.iter().sum(), gh, gws)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1.0)
    }

    #[test]
    fn equals_the_per_token_kernel_for_every_chunk() {
        let mut rng = Rng::new(11);
        let (n, width, sizes) = (9, 4, [6usize, 0, 5]);
        let h = Array2::from_shape_fn((n, width), |_| 3.0 * rng.normal());
        let ws: Vec<Array2<f64>> = sizes
            .iter()
            .map(|&s| Array2::from_shape_fn((s, width), |_| rng.normal()))
            .collect();
        let wv: Vec<ArrayView2<'_, f64>> = ws.iter().map(|w| w.view()).collect();
        let labels = [3i64, -100, 10, 0, 5, -100, 7, 1, 9];
        let (l0, gh0, gw0) = per_token(h.view(), &wv, &labels);
        for tokens in [1, 2, 3, 7, 8, 100] {
            let c = SumChunks::Tokens(tokens);
            let (l, g) = fused_ce_sum_forward(h.view(), &wv, &labels, c, true, &[true; 3]);
            assert!(close(l, l0), "{tokens}: {l} vs {l0}");
            let gh = g.hidden.unwrap();
            assert!(gh.iter().zip(&gh0).all(|(a, b)| close(*a, *b)), "{tokens}");
            for (a, b) in g.weights.iter().zip(&gw0) {
                let a = a.as_ref().unwrap();
                assert!(a.iter().zip(b).all(|(a, b)| close(*a, *b)), "{tokens}");
            }
            let (l2, none) = fused_ce_sum_forward(h.view(), &wv, &labels, c, false, &[false; 3]);
            assert_eq!(l2.to_bits(), l.to_bits(), "the loss alone is the same bits");
            assert!(none.hidden.is_none() && none.weights.iter().all(Option::is_none));
        }
    }

    #[test]
    fn backward_with_unit_upstream_adds_exactly() {
        let d = ndarray::array![0.1f32, -0.3, 7.0].into_dyn();
        let mut g = ndarray::array![0.2f32, 0.0, -1.0].into_dyn();
        let want = &g + &d;
        crate::kernels::reduce::add_scaled(1.0, d.view(), &mut g);
        assert_eq!(g, want);
    }
}
