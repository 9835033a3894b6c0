//! The fused cross-entropy of the LM head: per-token loss over split
//! weights without the N × V logits.
//!
//! Hidden rows may be shared by several tokens (a bigram model's tokens with
//! one context share one hidden row): [`Targets`] maps each token to its
//! hidden row and label. For hidden row i with tokens `T_i`:
//!
//! ```text
//! lse_i   = log Σ_v exp(h_i·W_v)                      (online, chunk by chunk)
//! loss_n  = lse_i − h_i·W_{label_n}                   for n ∈ T_i, 0 if label_n = −100
//! ∂z_iv   = (Σ_{n∈T_i} ∂loss_n)·softmax_iv − Σ_{n∈T_i} ∂loss_n·[v = label_n]
//! ∂h_i   += Σ_v ∂z_iv·W_v          ∂W_v += Σ_i ∂z_iv·h_i
//! ```
//!
//! Work, in f32 on a CPU with AVX2 and FMA ([`HeadKernel::Auto`]): chunks of
//! `tokens` hidden rows against the whole vocabulary on the tile kernel of
//! [`crate::kernels::gemm::head`], the softmax arithmetic done on each 6 × 16
//! tile of logits as it leaves the registers; the backward recomputes the
//! tiles and forms ∂z for `vocab` rows at a time, then runs the two gradient
//! products on the same kernel. Elsewhere (f64, [`HeadKernel::Matrixmultiply`]):
//! chunks of `tokens` hidden rows × chunks of `vocab` rows of one split, each
//! block of logits one `matrixmultiply` gemm into the workspace. Derivation:
//! `docs/gradients.md#fused-cross-entropy`.
//!
//! This file holds the op (its entry points, saved state and tape method)
//! and its inputs' types; beside it:
//!
//! | module | what |
//! |---|---|
//! | `kernel_choice` | [`HeadKernel`], [`ChunkSizes`], the f32 views the tile kernel takes |
//! | `tile` | the forward and backward on the tile kernel |
//! | `fallback` | the forward and backward on `matrixmultiply`, one chunk loop for both |
//! | `naive` | the naive twins [`naive_ce_forward`] and [`naive_ce_backward`] |

mod fallback;
mod kernel_choice;
mod naive;
pub(crate) mod tile;

use ndarray::{ArrayD, ArrayView2, ArrayViewD, ArrayViewMut2, Ix2, IxDyn};

use crate::kernels::Real;
use crate::kernels::pool::Pool;
use crate::ops::cross_entropy::IGNORE_INDEX;
use crate::tape::{Backward, Flow, NodeGrads, Tape, Var};

pub use fallback::PARTIAL_LIMIT;
pub use kernel_choice::{ChunkSizes, HeadKernel};
pub(crate) use kernel_choice::{f32_weights, pool_f32};
pub use naive::{naive_ce_backward, naive_ce_forward};

/// Which hidden row and which label each token has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Targets {
    /// Label of each token (N), in `[0, V)` or −100.
    pub labels: Vec<i64>,
    /// Hidden row of each token (N).
    pub row_of: Vec<usize>,
    /// The tokens of each hidden row with a label that is not ignored
    /// (CSR: `tokens[starts[i]..starts[i + 1]]`).
    starts: Vec<usize>,
    tokens: Vec<usize>,
    /// Hidden rows with at least one such token, increasing.
    active: Vec<usize>,
}

impl Targets {
    /// One hidden row per token: row n for token n.
    pub fn per_token(labels: Vec<i64>) -> Self {
        let n = labels.len();
        Self::grouped(labels, (0..n).collect(), n)
    }

    /// Tokens that share hidden rows: token n reads row `row_of[n]` < m.
    ///
    /// **Panics** if the lengths differ or a row is ≥ m.
    #[track_caller]
    pub fn grouped(labels: Vec<i64>, row_of: Vec<usize>, m: usize) -> Self {
        assert_eq!(
            labels.len(),
            row_of.len(),
            "Targets: {} labels for {} rows",
            labels.len(),
            row_of.len()
        );
        let mut counts = vec![0usize; m + 1];
        for (&r, &l) in row_of.iter().zip(&labels) {
            assert!(r < m, "Targets: row {r} is out of range 0..{m}");
            if l != IGNORE_INDEX {
                counts[r + 1] += 1;
            }
        }
        for i in 0..m {
            counts[i + 1] += counts[i];
        }
        let starts = counts;
        let mut fill = starts.clone();
        let mut tokens = vec![0; starts[m]];
        for (n, (&r, &l)) in row_of.iter().zip(&labels).enumerate() {
            if l != IGNORE_INDEX {
                tokens[fill[r]] = n;
                fill[r] += 1;
            }
        }
        let active = (0..m).filter(|&i| starts[i + 1] > starts[i]).collect();
        Targets {
            labels,
            row_of,
            starts,
            tokens,
            active,
        }
    }

    /// The hidden rows with at least one token whose label is not ignored,
    /// increasing.
    pub fn active_rows(&self) -> &[usize] {
        &self.active
    }

    /// Number of hidden rows.
    pub fn n_rows(&self) -> usize {
        self.starts.len() - 1
    }

    fn tokens_of(&self, row: usize) -> &[usize] {
        &self.tokens[self.starts[row]..self.starts[row + 1]]
    }

    /// The active rows' tokens for the tile kernel: starts (one per active
    /// row and one more), each token's label, and which token each slot is.
    pub(crate) fn active_csr(&self) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
        let mut starts = Vec::with_capacity(self.active.len() + 1);
        let mut labels = Vec::with_capacity(self.tokens.len());
        let mut slots = Vec::with_capacity(self.tokens.len());
        starts.push(0);
        for &r in &self.active {
            for &n in self.tokens_of(r) {
                labels.push(self.labels[n] as usize);
                slots.push(n);
            }
            starts.push(labels.len());
        }
        (starts, labels, slots)
    }
}

/// The inputs of a call: hidden rows (m, H), the splits (size_k, H), which
/// row and label each token has, and the chunk sizes.
#[derive(Clone, Copy)]
struct Head<'a, 'v, T> {
    h: ArrayView2<'v, T>,
    weights: &'a [ArrayView2<'v, T>],
    targets: &'a Targets,
    chunks: ChunkSizes,
}

/// Per-token loss (N) and per-row log-sum-exp (m), chunked (the fast
/// kernel). h: (m, H), weights: (size_k, H) each. A row with no active
/// token has lse 0; an ignored token has loss 0.
///
/// Chunks of hidden rows run in parallel; each row's log-sum-exp is
/// computed by one thread in a fixed order, so the result does not depend
/// on the thread count.
pub fn fused_ce_forward<T: Real>(
    h: ArrayView2<'_, T>,
    weights: &[ArrayView2<'_, T>],
    targets: &Targets,
    chunks: ChunkSizes,
) -> (Vec<T>, RowStats<T>) {
    fused_ce_forward_on(HeadKernel::Auto, h, weights, targets, chunks)
}

/// [`fused_ce_forward`] on the products `kernel` chooses.
pub fn fused_ce_forward_on<T: Real>(
    kernel: HeadKernel,
    h: ArrayView2<'_, T>,
    weights: &[ArrayView2<'_, T>],
    targets: &Targets,
    chunks: ChunkSizes,
) -> (Vec<T>, RowStats<T>) {
    let head = Head {
        h,
        weights,
        targets,
        chunks,
    };
    kernel
        .isa::<T>()
        .and_then(|isa| tile::forward(isa, head))
        .unwrap_or_else(|| fallback::forward(head))
}

/// Each hidden row's log-sum-exp, as its maximum logit `max` and
/// `log_sum = ln Σ_v e^{z_v − max}` kept apart (their sum rounds away the
/// loss of a confident token when logits are in the thousands; see
/// [`crate::ops::cross_entropy::max_and_log_sum`]). A row with no active
/// token has both 0.
#[derive(Clone, Debug, PartialEq)]
pub struct RowStats<T> {
    /// `m_i = max_v z_iv` (m).
    pub max: Vec<T>,
    /// `ln Σ_v e^{z_iv − m_i}` (m).
    pub log_sum: Vec<T>,
}

impl<T: Real> RowStats<T> {
    /// Zeros for m rows.
    fn zeros(m: usize) -> Self {
        RowStats {
            max: vec![T::zero(); m],
            log_sum: vec![T::zero(); m],
        }
    }

    /// `lse_i = m_i + ln Σ_v e^{z_iv − m_i}` (m), rounded.
    pub fn lse(&self) -> Vec<T> {
        self.max
            .iter()
            .zip(&self.log_sum)
            .map(|(&m, &s)| m + s)
            .collect()
    }
}
/// Adds (`+=`) the gradients of `Σ_n gy[n]·loss_n` (the fast kernel).
///
/// h: (m, H), weights: (size_k, H), stats: (m) from [`fused_ce_forward`],
/// gy: (N); gh: (m, H) and `gws[k]`: (size_k, H), each `None` when not wanted.
///
/// On `matrixmultiply`, chunks of hidden rows run in parallel when every
/// chunk's weight gradient fits a small partial buffer (chunks × V × H ≤
/// [`PARTIAL_LIMIT`] elements, V counting the splits whose gradient is
/// wanted); the partials are then added in chunk order. Otherwise the
/// chunks run one after another, each adding into the weight gradient, and
/// only the matrix products use several threads. The choice depends on the
/// sizes alone, so the result never depends on the thread count.
#[allow(clippy::too_many_arguments)]
pub fn fused_ce_backward<T: Real>(
    h: ArrayView2<'_, T>,
    weights: &[ArrayView2<'_, T>],
    targets: &Targets,
    stats: &RowStats<T>,
    gy: &[T],
    chunks: ChunkSizes,
    gh: Option<ArrayViewMut2<'_, T>>,
    gws: &mut [Option<ArrayViewMut2<'_, T>>],
) {
    fused_ce_backward_on(
        HeadKernel::Auto,
        &Pool::new(),
        h,
        weights,
        targets,
        stats,
        gy,
        chunks,
        gh,
        gws,
    )
}

/// [`fused_ce_backward`] on the products `kernel` chooses, with its
/// workspace from `pool`. On the tile kernel the result does not depend on
/// the thread count either: each element of a gradient is one chain of
/// fused multiply-adds in a fixed order.
#[allow(clippy::too_many_arguments)]
pub fn fused_ce_backward_on<T: Real>(
    kernel: HeadKernel,
    pool: &Pool<T>,
    h: ArrayView2<'_, T>,
    weights: &[ArrayView2<'_, T>],
    targets: &Targets,
    stats: &RowStats<T>,
    gy: &[T],
    chunks: ChunkSizes,
    mut gh: Option<ArrayViewMut2<'_, T>>,
    gws: &mut [Option<ArrayViewMut2<'_, T>>],
) {
    let head = Head {
        h,
        weights,
        targets,
        chunks,
    };
    if let Some(isa) = kernel.isa::<T>()
        && tile::backward(isa, pool, head, stats, gy, &mut gh, gws).is_some()
    {
        return;
    }
    fallback::backward(head, stats, gy, gh, gws)
}

/// A (…, H) value as (N, H) rows (a copy only if it is not contiguous).
pub(crate) fn as_rows<T: Real>(h: ArrayViewD<'_, T>) -> ndarray::CowArray<'_, T, Ix2> {
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

/// Views of 2-D weights as (size_k, H).
///
/// **Panics** (`"{op}: weights must be 2-D"`) if one is not.
#[track_caller]
pub(crate) fn weight_views<'a, T: Real>(
    ws: &[ArrayViewD<'a, T>],
    op: &str,
) -> Vec<ArrayView2<'a, T>> {
    ws.iter()
        .map(|w| {
            w.clone()
                .into_dimensionality::<Ix2>()
                .unwrap_or_else(|e| panic!("{op}: weights must be 2-D: {e:?}"))
        })
        .collect()
}

/// The saved state of the fused cross-entropy: the inputs' nodes, the
/// targets and each hidden row's log-sum-exp.
struct FusedCe<T> {
    hidden: Var,
    weights: Vec<Var>,
    targets: Targets,
    stats: RowStats<T>,
    chunks: ChunkSizes,
    kernel: HeadKernel,
}

impl<T: Real> Backward<T> for FusedCe<T> {
    fn backward<'a>(
        &'a self,
        _y: ArrayViewD<'a, T>,
        gy: Flow<'a, T>,
        grads: &mut NodeGrads<'a, T>,
    ) {
        let h = grads.value(self.hidden);
        let ws: Vec<ArrayViewD<'a, T>> = self.weights.iter().map(|&w| grads.value(w)).collect();
        // Take the buffers out so that all can be written at once.
        let mut gh = grads.take_buffer(self.hidden);
        let mut gws: Vec<Option<ArrayD<T>>> =
            self.weights.iter().map(|&w| grads.take_buffer(w)).collect();
        let gy: Vec<T> = gy.into_owned().iter().copied().collect();
        let h2 = as_rows(h);
        let ghv = gh.as_mut().map(|g| {
            g.view_mut()
                .into_shape_with_order(h2.dim())
                .expect("contiguous gradient")
        });
        let mut gwv: Vec<Option<ArrayViewMut2<'_, T>>> = gws
            .iter_mut()
            .map(|g| {
                g.as_mut().map(|g| {
                    g.view_mut()
                        .into_dimensionality::<Ix2>()
                        .expect("2-D weight gradient")
                })
            })
            .collect();
        fused_ce_backward_on(
            self.kernel,
            grads.pool(),
            h2.view(),
            &weight_views(&ws, "fused_ce"),
            &self.targets,
            &self.stats,
            &gy,
            self.chunks,
            ghv,
            &mut gwv,
        );
        drop(gwv);
        if let Some(g) = gh {
            grads.add(self.hidden, g);
        }
        for (&w, g) in self.weights.iter().zip(gws) {
            if let Some(g) = g {
                grads.add(w, g);
            }
        }
    }
}

impl<'p, T: Real> Tape<'p, T> {
    /// Per-token cross-entropy of hidden rows against split weights,
    /// without the N × V logits: hidden (m, H) or (…, H) read as m rows,
    /// `weights[k]` (size_k, H), `targets` the hidden row and label of each
    /// of N tokens → loss (N). Label −100 gives 0 and no gradient.
    ///
    /// **Panics** if the shapes disagree with the targets or a label is
    /// outside `[0, V)` and not −100 (the head checks its inputs first).
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::{ops::fused_ce::{ChunkSizes, Targets}, Tape};
    /// let mut t = Tape::<f64>::new();
    /// let h = t.input(array![[1.0, 0.0]].into_dyn());
    /// let w = t.input(array![[0.0, 1.0], [0.0, -1.0]].into_dyn());
    /// let loss = t.fused_cross_entropy(h, &[w], Targets::per_token(vec![1]), ChunkSizes::default());
    /// assert!((t.value(loss)[[0]] - 2f64.ln()).abs() < 1e-15);
    /// ```
    #[track_caller]
    pub fn fused_cross_entropy(
        &mut self,
        hidden: Var,
        weights: &[Var],
        targets: Targets,
        chunks: ChunkSizes,
    ) -> Var {
        self.fused_cross_entropy_on(hidden, weights, targets, chunks, HeadKernel::Auto)
    }

    /// [`Tape::fused_cross_entropy`] on the products `kernel` chooses.
    ///
    /// **Panics** as [`Tape::fused_cross_entropy`].
    #[track_caller]
    pub fn fused_cross_entropy_on(
        &mut self,
        hidden: Var,
        weights: &[Var],
        targets: Targets,
        chunks: ChunkSizes,
        kernel: HeadKernel,
    ) -> Var {
        let (loss, stats) = {
            let h = as_rows(self.value(hidden));
            let ws: Vec<ArrayViewD<'_, T>> = weights.iter().map(|&w| self.value(w)).collect();
            fused_ce_forward_on(
                kernel,
                h.view(),
                &weight_views(&ws, "fused_ce"),
                &targets,
                chunks,
            )
        };
        let out = ArrayD::from_shape_vec(IxDyn(&[loss.len()]), loss).expect("one loss per token");
        let mut inputs = weights.to_vec();
        inputs.push(hidden);
        self.push_op(
            out,
            &inputs,
            FusedCe {
                hidden,
                weights: weights.to_vec(),
                targets,
                stats,
                chunks,
                kernel,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rng;
    use ndarray::Array2;

    fn case(
        rng: &mut Rng,
        m: usize,
        n: usize,
        h: usize,
        sizes: &[usize],
        scale: f64,
    ) -> (Array2<f64>, Vec<Array2<f64>>, Targets) {
        let hid = Array2::from_shape_fn((m, h), |_| rng.normal() * scale);
        let ws = sizes
            .iter()
            .map(|&s| Array2::from_shape_fn((s, h), |_| rng.normal() * scale))
            .collect();
        let v: usize = sizes.iter().sum();
        let labels = (0..n)
            .map(|i| {
                if i % 4 == 3 {
                    -100
                } else {
                    rng.below(v as u64) as i64
                }
            })
            .collect();
        let row_of = (0..n).map(|_| rng.below(m as u64) as usize).collect();
        (hid, ws, Targets::grouped(labels, row_of, m))
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    #[test]
    fn fused_equals_naive_across_chunk_boundaries() {
        let mut rng = Rng::new(4);
        let (hid, ws, t) = case(&mut rng, 9, 13, 5, &[7, 0, 10], 30.0);
        let wv: Vec<ArrayView2<'_, f64>> = ws.iter().map(|w| w.view()).collect();
        let (l0, s0) = naive_ce_forward(hid.view(), &wv, &t);
        let gy: Vec<f64> = (0..13).map(|_| rng.normal()).collect();
        let (gh0, gw0) = naive_ce_backward(hid.view(), &wv, &t, &gy);
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
            let (l1, s1) = fused_ce_forward(hid.view(), &wv, &t, chunks);
            assert!(
                l0.iter().zip(&l1).all(|(a, b)| close(*a, *b)),
                "{chunks:?}: {l0:?} vs {l1:?}"
            );
            assert!(s0.lse().iter().zip(&s1.lse()).all(|(a, b)| close(*a, *b)));
            let mut gh = Array2::zeros(hid.dim());
            let mut gws: Vec<Array2<f64>> = ws.iter().map(|w| Array2::zeros(w.dim())).collect();
            let mut views: Vec<Option<ArrayViewMut2<'_, f64>>> =
                gws.iter_mut().map(|g| Some(g.view_mut())).collect();
            fused_ce_backward(
                hid.view(),
                &wv,
                &t,
                &s1,
                &gy,
                chunks,
                Some(gh.view_mut()),
                &mut views,
            );
            assert!(gh.iter().zip(gh0.iter()).all(|(a, b)| close(*a, *b)));
            for (a, b) in gws.iter().zip(&gw0) {
                assert!(a.iter().zip(b.iter()).all(|(a, b)| close(*a, *b)));
            }
        }
    }

    /// A confident token with logits near 3000: in f32, `lse − z_label`
    /// would round to a step of 2.4·10⁻⁴ and lose the loss (≈ 0.05) and the
    /// `1 − p` of the gradient; kept apart, f32 agrees with f64 to f32
    /// rounding.
    #[test]
    fn confident_tokens_with_huge_logits_keep_f32_precision() {
        fn run<T: Real>() -> (f64, Vec<f64>) {
            let h = Array2::from_shape_vec((1, 2), vec![T::from_f64(3000.0), T::zero()]).unwrap();
            let w = Array2::from_shape_vec(
                (3, 2),
                [1.0, 0.0, 0.999, 0.3, 0.998, -0.2]
                    .iter()
                    .map(|&x| T::from_f64(x))
                    .collect(),
            )
            .unwrap();
            let t = Targets::per_token(vec![0]);
            let c = ChunkSizes::default();
            let (loss, stats) = fused_ce_forward(h.view(), &[w.view()], &t, c);
            let mut gh = Array2::<T>::zeros((1, 2));
            fused_ce_backward(
                h.view(),
                &[w.view()],
                &t,
                &stats,
                &[T::one()],
                c,
                Some(gh.view_mut()),
                &mut [None],
            );
            (
                Real::to_f64(loss[0]),
                gh.iter().map(|&x| Real::to_f64(x)).collect(),
            )
        }
        let (l32, g32) = run::<f32>();
        let (l64, g64) = run::<f64>();
        assert!(l64 > 0.04 && l64 < 0.06, "{l64}");
        assert!((l32 - l64).abs() <= 1e-5 * l64, "{l32} vs {l64}");
        for (a, b) in g32.iter().zip(&g64) {
            assert!((a - b).abs() <= 1e-4 * b.abs().max(1e-3), "{a} vs {b}");
        }
    }
}
