//! The fused cross-entropy kernel of the LM head: per-token loss over split
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

use ndarray::{Array2, ArrayD, ArrayView2, ArrayViewD, ArrayViewMut2, Ix2, IxDyn, s};
use rayon::prelude::*;

use crate::kernels::Real;
use crate::kernels::exp;
use crate::kernels::gemm::{self, Isa, head};
use crate::kernels::pool::Pool;
use crate::ops::cross_entropy::{IGNORE_INDEX, max_and_log_sum};
use crate::tape::{Backward, Flow, NodeGrads, Tape, Var};

/// The products the fused cross-entropy runs on.
///
/// ```
/// use splitgrad::ops::fused_ce::HeadKernel;
/// assert_eq!(HeadKernel::default(), HeadKernel::Auto);
/// assert_eq!(HeadKernel::Matrixmultiply.isa::<f32>(), None);
/// assert_eq!(HeadKernel::Auto.isa::<f64>(), None);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HeadKernel {
    /// The tile kernel ([`Isa::fast`]) for f32 where the CPU has AVX2 and
    /// FMA; `matrixmultiply` otherwise.
    #[default]
    Auto,
    /// `matrixmultiply`, the reference.
    Matrixmultiply,
    /// The tile kernel of this variant, for f32 (f64 uses `matrixmultiply`).
    ///
    /// **Panics** when used on a CPU that cannot run it.
    Tile(Isa),
}

impl HeadKernel {
    /// The tile kernel variant this choice runs for element type `T`, or
    /// `None` for `matrixmultiply`.
    pub fn isa<T: Real>(self) -> Option<Isa> {
        if T::NAME != "f32" {
            return None;
        }
        match self {
            HeadKernel::Auto => Isa::fast(),
            HeadKernel::Matrixmultiply => None,
            HeadKernel::Tile(isa) => Some(isa),
        }
    }
}

/// Chunk sizes of the fused cross-entropy: the workspace holds
/// `tokens × vocab` logits plus two `tokens × H` blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkSizes {
    /// Hidden rows per chunk.
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
    ///
    /// ```
    /// use splitgrad::ops::fused_ce::ChunkSizes;
    /// let c = ChunkSizes { tokens: 256, vocab: 4096 };
    /// assert_eq!(c.workspace_bytes::<f32>(512), (256 * 4096 + 2 * 256 * 512) * 4);
    /// ```
    pub fn workspace_bytes<T: Real>(&self, h: usize) -> usize {
        (self.tokens * self.vocab + 2 * self.tokens * h) * std::mem::size_of::<T>()
    }
}

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

/// Columns of the logits block: the vocabulary chunk, or the largest split
/// when every split is smaller (no need to zero a wider block).
fn block_width<T: Real>(weights: &[ArrayView2<'_, T>], chunks: ChunkSizes) -> usize {
    let widest = weights.iter().map(|w| w.nrows()).max().unwrap_or(0);
    chunks.vocab.max(1).min(widest.max(1))
}

/// Copies rows `idx` of `h` into the first `idx.len()` rows of `buf`.
fn gather_rows<T: Real>(h: ArrayView2<'_, T>, idx: &[usize], buf: &mut Array2<T>) {
    for (i, &p) in idx.iter().enumerate() {
        buf.row_mut(i).assign(&h.row(p));
    }
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
    if let Some(isa) = kernel.isa::<T>() {
        if let Some(out) = tile_forward(isa, h, weights, targets, chunks) {
            return out;
        }
    }
    let mut loss = vec![T::zero(); targets.labels.len()];
    let mut stats = RowStats {
        max: vec![T::zero(); h.nrows()],
        log_sum: vec![T::zero(); h.nrows()],
    };
    let tc = chunks.tokens.max(1);
    let parts: Vec<ForwardPart<T>> = targets
        .active
        .par_chunks(tc)
        .map(|idx| forward_chunk(h, weights, targets, idx, chunks))
        .collect();
    for (idx, ((max, log_sum), chunk_loss)) in targets.active.chunks(tc).zip(parts) {
        for ((&r, m), s) in idx.iter().zip(max).zip(log_sum) {
            stats.max[r] = m;
            stats.log_sum[r] = s;
        }
        for (n, l) in chunk_loss {
            loss[n] = l;
        }
    }
    (loss, stats)
}

/// [`fused_ce_forward`] on the tile kernel (f32 only: `None` otherwise).
fn tile_forward<T: Real>(
    isa: Isa,
    h: ArrayView2<'_, T>,
    weights: &[ArrayView2<'_, T>],
    targets: &Targets,
    chunks: ChunkSizes,
) -> Option<(Vec<T>, RowStats<T>)> {
    let h32 = gemm::f32_view(h)?;
    let w32: Vec<ArrayView2<'_, f32>> = weights
        .iter()
        .map(|w| gemm::f32_view(w.view()))
        .collect::<Option<_>>()?;
    let (starts, labels, slots) = targets.active_csr();
    let rows = head::Rows {
        rows: &targets.active,
        starts: &starts,
        labels: &labels,
    };
    let st = head::fused_ce(
        isa,
        &Pool::new(),
        h32,
        &w32,
        rows,
        head::Pass::Loss,
        chunks.tokens.max(1),
        usize::MAX,
        &mut head::Out::default(),
    );
    let mut loss = vec![T::zero(); targets.labels.len()];
    for (&n, &l) in slots.iter().zip(&st.loss) {
        loss[n] = T::from_f64(l as f64);
    }
    let mut stats = RowStats {
        max: vec![T::zero(); h.nrows()],
        log_sum: vec![T::zero(); h.nrows()],
    };
    for (a, &r) in targets.active.iter().enumerate() {
        stats.max[r] = T::from_f64(st.max[a] as f64);
        stats.log_sum[r] = T::from_f64(st.log_sum[a] as f64);
    }
    Some((loss, stats))
}

/// A chunk's (max, ln Σ) per row and (token, loss) per token.
type ForwardPart<T> = ((Vec<T>, Vec<T>), Vec<(usize, T)>);

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
    /// `lse_i = m_i + ln Σ_v e^{z_iv − m_i}` (m), rounded.
    pub fn lse(&self) -> Vec<T> {
        self.max
            .iter()
            .zip(&self.log_sum)
            .map(|(&m, &s)| m + s)
            .collect()
    }
}
/// A chunk's hidden gradient (rows, H) and weight-gradient partials.
type BackwardPart<T> = (Array2<T>, Vec<Option<Array2<T>>>);

/// One chunk of hidden rows `idx`: their log-sum-exp, and (token, loss)
/// for each of their tokens.
fn forward_chunk<T: Real>(
    h: ArrayView2<'_, T>,
    weights: &[ArrayView2<'_, T>],
    targets: &Targets,
    idx: &[usize],
    chunks: ChunkSizes,
) -> ForwardPart<T> {
    let vc = block_width(weights, chunks);
    let rows = idx.len();
    let mut hc = Array2::<T>::zeros((rows, h.ncols()));
    let mut work = Array2::<T>::zeros((rows, vc));
    gather_rows(h, idx, &mut hc);
    let mut label_logit: Vec<(usize, T)> = Vec::new();
    let mut m = vec![T::neg_infinity(); rows];
    let mut sum = vec![T::zero(); rows];
    let mut start = 0usize;
    for w in weights {
        for v0 in (0..w.nrows()).step_by(vc) {
            let v1 = (v0 + vc).min(w.nrows());
            let mut blk = work.slice_mut(s![.., ..v1 - v0]);
            T::gemm(
                T::one(),
                hc.view(),
                w.slice(s![v0..v1, ..]).t(),
                T::zero(),
                blk.view_mut(),
            );
            let (lo, hi) = (start + v0, start + v1);
            for (i, row) in blk.outer_iter().enumerate() {
                let zs = row.as_slice().expect("rows of the block are contiguous");
                let bm = exp::max(zs);
                if bm > m[i] {
                    sum[i] *= (m[i] - bm).exp();
                    m[i] = bm;
                }
                let mi = m[i];
                if mi > T::neg_infinity() {
                    sum[i] += exp::sum_exp(zs, mi);
                }
                for &n in targets.tokens_of(idx[i]) {
                    let l = targets.labels[n] as usize;
                    if (lo..hi).contains(&l) {
                        label_logit.push((n, row[l - lo]));
                    }
                }
            }
        }
        start += w.nrows();
    }
    let log_sum: Vec<T> = sum.iter().map(|&si| si.ln()).collect();
    let mut out = Vec::with_capacity(label_logit.len());
    for (n, z) in label_logit {
        let i = idx
            .binary_search(&targets.row_of[n])
            .expect("the token's row is in its chunk");
        out.push((n, (m[i] - z) + log_sum[i]));
    }
    ((m, log_sum), out)
}

/// Adds the gradients of `Σ_n gy[n]·loss_n` (the fast kernel).
///
/// h: (m, H), weights: (size_k, H), stats: (m) from [`fused_ce_forward`],
/// gy: (N); gh: (m, H) and `gws[k]`: (size_k, H), each `None` when not wanted.
///
/// Chunks of hidden rows run in parallel when every chunk's weight
/// gradient fits a small partial buffer (chunks × V × H ≤
/// [`PARTIAL_LIMIT`] elements); the partials are then added in chunk order.
/// Otherwise the chunks run one after another, each adding into the weight
/// gradient, and only the matrix products use several threads. The choice
/// depends on the sizes alone, so the result never depends on the thread
/// count.
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
    if let Some(isa) = kernel.isa::<T>() {
        if tile_backward(
            isa, pool, h, weights, targets, stats, gy, chunks, &mut gh, gws,
        ) {
            return;
        }
    }
    let tc = chunks.tokens.max(1);
    let width = h.ncols();
    let n_chunks = targets.active.len().div_ceil(tc);
    let wanted_v: usize = weights
        .iter()
        .zip(gws.iter())
        .filter(|(_, g)| g.is_some())
        .map(|(w, _)| w.nrows())
        .sum();
    let want_gh = gh.is_some();
    if n_chunks > 1 && n_chunks * wanted_v * width <= PARTIAL_LIMIT {
        let parts: Vec<BackwardPart<T>> = targets
            .active
            .par_chunks(tc)
            .map(|idx| {
                let mut ghc = Array2::<T>::zeros((idx.len(), width));
                let mut partial: Vec<Option<Array2<T>>> = weights
                    .iter()
                    .zip(gws.iter())
                    .map(|(w, g)| g.as_ref().map(|_| Array2::<T>::zeros(w.dim())))
                    .collect();
                let mut views: Vec<Option<ArrayViewMut2<'_, T>>> = partial
                    .iter_mut()
                    .map(|p| p.as_mut().map(|p| p.view_mut()))
                    .collect();
                backward_chunk(
                    h, weights, targets, idx, stats, gy, chunks, want_gh, &mut ghc, &mut views,
                );
                drop(views);
                (ghc, partial)
            })
            .collect();
        for (idx, (ghc, partial)) in targets.active.chunks(tc).zip(parts) {
            if let Some(gh) = gh.as_mut() {
                for (i, &r) in idx.iter().enumerate() {
                    let mut dst = gh.row_mut(r);
                    dst += &ghc.row(i);
                }
            }
            for (g, p) in gws.iter_mut().zip(partial) {
                if let (Some(g), Some(p)) = (g.as_mut(), p) {
                    *g += &p;
                }
            }
        }
        return;
    }
    for idx in targets.active.chunks(tc) {
        let mut ghc = Array2::<T>::zeros((idx.len(), width));
        backward_chunk(
            h, weights, targets, idx, stats, gy, chunks, want_gh, &mut ghc, gws,
        );
        if let Some(gh) = gh.as_mut() {
            for (i, &r) in idx.iter().enumerate() {
                let mut dst = gh.row_mut(r);
                dst += &ghc.row(i);
            }
        }
    }
}

/// [`fused_ce_backward`] on the tile kernel; `false` (nothing done) where
/// it cannot run (not f32, or gradients with negative strides).
#[allow(clippy::too_many_arguments)]
fn tile_backward<T: Real>(
    isa: Isa,
    pool: &Pool<T>,
    h: ArrayView2<'_, T>,
    weights: &[ArrayView2<'_, T>],
    targets: &Targets,
    stats: &RowStats<T>,
    gy: &[T],
    chunks: ChunkSizes,
    gh: &mut Option<ArrayViewMut2<'_, T>>,
    gws: &mut [Option<ArrayViewMut2<'_, T>>],
) -> bool {
    let Some(h32) = gemm::f32_view(h) else {
        return false;
    };
    let Some(w32) = weights
        .iter()
        .map(|w| gemm::f32_view(w.view()))
        .collect::<Option<Vec<_>>>()
    else {
        return false;
    };
    let negative = |g: &ArrayViewMut2<'_, T>| g.strides().iter().any(|&s| s < 0);
    if gh.as_ref().is_some_and(negative) || gws.iter().flatten().any(negative) {
        return false;
    }
    let Some(pool32) = pool_f32(pool) else {
        return false;
    };
    let (starts, labels, slots) = targets.active_csr();
    let weights_gy: Vec<f32> = slots.iter().map(|&n| gy[n].to_f64() as f32).collect();
    let max: Vec<f32> = targets
        .active
        .iter()
        .map(|&r| stats.max[r].to_f64() as f32)
        .collect();
    let log_sum: Vec<f32> = targets
        .active
        .iter()
        .map(|&r| stats.log_sum[r].to_f64() as f32)
        .collect();
    let mut out = head::Out {
        hidden: gh
            .as_mut()
            .map(|g| gemm::f32_view_mut(g.view_mut()).expect("f32, strides checked")),
        weights: gws
            .iter_mut()
            .map(|g| {
                g.as_mut()
                    .map(|g| gemm::f32_view_mut(g.view_mut()).expect("f32, strides checked"))
            })
            .collect(),
    };
    head::fused_ce(
        isa,
        pool32,
        h32,
        &w32,
        head::Rows {
            rows: &targets.active,
            starts: &starts,
            labels: &labels,
        },
        head::Pass::Grads {
            max: &max,
            log_sum: &log_sum,
            weights: &weights_gy,
        },
        chunks.tokens.max(1),
        chunks.vocab.max(1),
        &mut out,
    );
    true
}

/// `pool` as the f32 pool it is, when `T` is `f32`.
pub(crate) fn pool_f32<T: Real>(pool: &Pool<T>) -> Option<&Pool<f32>> {
    (T::NAME == "f32").then(|| {
        // SAFETY: `T` is the sealed `Real` whose NAME is "f32", so `T` is
        // `f32` and `Pool<T>` is `Pool<f32>`.
        unsafe { &*(pool as *const Pool<T>).cast::<Pool<f32>>() }
    })
}

/// Elements of weight-gradient partials (chunks × V × H) below which the
/// backward runs its chunks in parallel: 4 Mi elements, 16 MiB in f32.
pub const PARTIAL_LIMIT: usize = 4 << 20;

/// One chunk of hidden rows `idx`: their hidden gradient into `ghc`
/// (rows, H) when `want_gh`, and `Σ_i ∂z_iv·h_i` added into `gws`.
#[allow(clippy::too_many_arguments)]
fn backward_chunk<T: Real>(
    h: ArrayView2<'_, T>,
    weights: &[ArrayView2<'_, T>],
    targets: &Targets,
    idx: &[usize],
    stats: &RowStats<T>,
    gy: &[T],
    chunks: ChunkSizes,
    want_gh: bool,
    ghc: &mut Array2<T>,
    gws: &mut [Option<ArrayViewMut2<'_, T>>],
) {
    let vc = block_width(weights, chunks);
    let rows = idx.len();
    let mut hc = Array2::<T>::zeros((rows, h.ncols()));
    let mut work = Array2::<T>::zeros((rows, vc));
    gather_rows(h, idx, &mut hc);
    // Σ_{n ∈ T_i} ∂loss_n: the weight of row i's softmax.
    let wsum: Vec<T> = idx
        .iter()
        .map(|&r| targets.tokens_of(r).iter().map(|&n| gy[n]).sum())
        .collect();
    let mut start = 0usize;
    for (k, w) in weights.iter().enumerate() {
        for v0 in (0..w.nrows()).step_by(vc) {
            let v1 = (v0 + vc).min(w.nrows());
            let (lo, hi) = (start + v0, start + v1);
            let wblk = w.slice(s![v0..v1, ..]);
            let mut g = work.slice_mut(s![.., ..v1 - v0]);
            T::gemm(T::one(), hc.view(), wblk.t(), T::zero(), g.view_mut());
            for (i, mut row) in g.outer_iter_mut().enumerate() {
                let r = idx[i];
                let zs = row
                    .as_slice_mut()
                    .expect("rows of the block are contiguous");
                // e^{(z − m) − ln Σ}: the shift is applied in two steps so
                // that neither rounds at the scale of m.
                let m = stats.max[r];
                for z in zs.iter_mut() {
                    *z -= m;
                }
                exp::scaled_exp(zs, stats.log_sum[r], wsum[i]);
                for &n in targets.tokens_of(idx[i]) {
                    let lab = targets.labels[n] as usize;
                    if (lo..hi).contains(&lab) {
                        row[lab - lo] -= gy[n];
                    }
                }
            }
            if want_gh {
                T::gemm(T::one(), g.view(), wblk, T::one(), ghc.view_mut());
            }
            if let Some(gw) = gws[k].as_mut() {
                T::gemm(
                    T::one(),
                    g.t(),
                    hc.view(),
                    T::one(),
                    gw.slice_mut(s![v0..v1, ..]),
                );
            }
        }
        start += w.nrows();
    }
}

/// The naive twin of [`fused_ce_forward`]: the full (m, V) logits, then a
/// stable log-sum-exp per row. Same outputs to rounding.
pub fn naive_ce_forward<T: Real>(
    h: ArrayView2<'_, T>,
    weights: &[ArrayView2<'_, T>],
    targets: &Targets,
) -> (Vec<T>, RowStats<T>) {
    let w = ndarray::concatenate(ndarray::Axis(0), weights).expect("same width");
    let mut logits = Array2::<T>::zeros((h.nrows(), w.nrows()));
    T::gemm(T::one(), h, w.t(), T::zero(), logits.view_mut());
    let mut loss = vec![T::zero(); targets.labels.len()];
    let mut stats = RowStats {
        max: vec![T::zero(); h.nrows()],
        log_sum: vec![T::zero(); h.nrows()],
    };
    for &r in &targets.active {
        let (m, log_sum) = max_and_log_sum(logits.row(r));
        stats.max[r] = m;
        stats.log_sum[r] = log_sum;
        for &n in targets.tokens_of(r) {
            loss[n] = (m - logits[[r, targets.labels[n] as usize]]) + log_sum;
        }
    }
    (loss, stats)
}

/// The naive twin of [`fused_ce_backward`], from the full logits.
pub fn naive_ce_backward<T: Real>(
    h: ArrayView2<'_, T>,
    weights: &[ArrayView2<'_, T>],
    targets: &Targets,
    gy: &[T],
) -> (Array2<T>, Vec<Array2<T>>) {
    let w = ndarray::concatenate(ndarray::Axis(0), weights).expect("same width");
    let mut logits = Array2::<T>::zeros((h.nrows(), w.nrows()));
    T::gemm(T::one(), h, w.t(), T::zero(), logits.view_mut());
    let mut g = Array2::<T>::zeros(logits.dim());
    for (n, (&r, &l)) in targets.row_of.iter().zip(&targets.labels).enumerate() {
        if l == IGNORE_INDEX {
            continue;
        }
        let (m, log_sum) = max_and_log_sum(logits.row(r));
        for v in 0..w.nrows() {
            g[[r, v]] += gy[n] * ((logits[[r, v]] - m) - log_sum).exp();
        }
        g[[r, l as usize]] -= gy[n];
    }
    let mut gh = Array2::<T>::zeros(h.dim());
    T::gemm(T::one(), g.view(), w.view(), T::zero(), gh.view_mut());
    let mut gw = Array2::<T>::zeros(w.dim());
    T::gemm(T::one(), g.t(), h, T::zero(), gw.view_mut());
    let mut out = Vec::new();
    let mut start = 0;
    for wk in weights {
        out.push(gw.slice(s![start..start + wk.nrows(), ..]).to_owned());
        start += wk.nrows();
    }
    (gh, out)
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
fn weight_views<'a, T: Real>(ws: &[ArrayViewD<'a, T>]) -> Vec<ArrayView2<'a, T>> {
    ws.iter()
        .map(|w| {
            w.clone()
                .into_dimensionality::<Ix2>()
                .expect("fused_ce: weights must be 2-D")
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
            &weight_views(&ws),
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
            fused_ce_forward_on(kernel, h.view(), &weight_views(&ws), &targets, chunks)
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
