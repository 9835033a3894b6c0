//! The fused cross-entropy on the tile kernel of
//! [`crate::kernels::gemm::head`] (f32): the targets' active rows as the
//! kernel's rows, its results back in `T`. Each function returns `None`
//! (having done nothing) where the kernel cannot run.

use ndarray::ArrayViewMut2;

use super::kernel_choice::{f32_weights, pool_f32};
use super::{Head, RowStats, Targets};
use crate::kernels::Real;
use crate::kernels::gemm::{self, Isa, head};
use crate::kernels::pool::Pool;

/// The active rows' tokens as the tile kernel takes them
/// ([`Targets::active_csr`]), and which token each of its slots is.
pub(crate) struct TileRows {
    starts: Vec<usize>,
    labels: Vec<usize>,
    /// The token of each slot, in the kernel's order.
    pub(crate) slots: Vec<usize>,
}

impl TileRows {
    pub(crate) fn of(targets: &Targets) -> Self {
        let (starts, labels, slots) = targets.active_csr();
        TileRows {
            starts,
            labels,
            slots,
        }
    }

    /// The kernel's rows: `targets`' active rows (the targets these were
    /// made of).
    pub(crate) fn rows<'a>(&'a self, targets: &'a Targets) -> head::Rows<'a> {
        head::Rows {
            rows: targets.active_rows(),
            starts: &self.starts,
            labels: &self.labels,
        }
    }
}

/// [`super::fused_ce_forward`] on the tile kernel (f32 only).
pub(super) fn forward<T: Real>(isa: Isa, head: Head<'_, '_, T>) -> Option<(Vec<T>, RowStats<T>)> {
    let h32 = gemm::f32_view(head.h)?;
    let w32 = f32_weights(head.weights)?;
    let targets = head.targets;
    let tr = TileRows::of(targets);
    let st = head::fused_ce(
        isa,
        &Pool::new(),
        h32,
        &w32,
        tr.rows(targets),
        head::Pass::Loss,
        head.chunks.tokens.max(1),
        usize::MAX,
        &mut head::Out::default(),
    );
    let mut loss = vec![T::zero(); targets.labels.len()];
    for (&n, &l) in tr.slots.iter().zip(&st.loss) {
        loss[n] = T::from_f64(l as f64);
    }
    let mut stats = RowStats::zeros(head.h.nrows());
    for (a, &r) in targets.active.iter().enumerate() {
        stats.max[r] = T::from_f64(st.max[a] as f64);
        stats.log_sum[r] = T::from_f64(st.log_sum[a] as f64);
    }
    Some((loss, stats))
}

/// [`super::fused_ce_backward`] on the tile kernel (f32 only, and
/// gradients without negative strides).
pub(super) fn backward<T: Real>(
    isa: Isa,
    pool: &Pool<T>,
    head: Head<'_, '_, T>,
    stats: &RowStats<T>,
    gy: &[T],
    gh: &mut Option<ArrayViewMut2<'_, T>>,
    gws: &mut [Option<ArrayViewMut2<'_, T>>],
) -> Option<()> {
    let h32 = gemm::f32_view(head.h)?;
    let w32 = f32_weights(head.weights)?;
    let negative = |g: &ArrayViewMut2<'_, T>| g.strides().iter().any(|&s| s < 0);
    if gh.as_ref().is_some_and(negative) || gws.iter().flatten().any(negative) {
        return None;
    }
    let pool32 = pool_f32(pool)?;
    let targets = head.targets;
    let tr = TileRows::of(targets);
    let weights_gy: Vec<f32> = tr.slots.iter().map(|&n| gy[n].to_f64() as f32).collect();
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
    fn view<'a, T: Real>(g: &'a mut ArrayViewMut2<'_, T>) -> ArrayViewMut2<'a, f32> {
        gemm::f32_view_mut(g.view_mut()).expect("f32, strides checked")
    }
    let mut out = head::Out {
        hidden: gh.as_mut().map(view),
        weights: gws.iter_mut().map(|g| g.as_mut().map(view)).collect(),
    };
    head::fused_ce(
        isa,
        pool32,
        h32,
        &w32,
        tr.rows(targets),
        head::Pass::Grads {
            max: &max,
            log_sum: &log_sum,
            weights: &weights_gy,
        },
        head.chunks.tokens.max(1),
        head.chunks.vocab.max(1),
        &mut out,
    );
    Some(())
}
