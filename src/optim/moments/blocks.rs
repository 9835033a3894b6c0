//! What an update by blocks ([`Optimizer::update_by_blocks`](crate::optim::Optimizer::update_by_blocks))
//! needs whatever the rows are kept as: the rows cut into the gradient's
//! blocks, and the next block's rows fetched while one is updated.

use crate::kernels::Real;
use crate::kernels::scatter::prefetch_span;
use crate::param::BlockGradient;

/// The next block's rows, fetched into the cache while a block is
/// updated, a few per row updated (block b's j-th of n rows fetches the
/// j-th n-th of block b + 1's), so that the next block's terms read its
/// rows from the cache. (Most often a task takes the next block next.)
pub(in crate::optim) struct Ahead<'g> {
    next: &'g [usize],
    n: usize,
    /// The parameter's first element's address, and a row's bytes.
    at: usize,
    row_bytes: usize,
}

impl<'g> Ahead<'g> {
    /// For block b of `grad`, of n rows, in a parameter at address `at`.
    pub(in crate::optim) fn new<T>(
        grad: &'g dyn BlockGradient<T>,
        b: usize,
        n: usize,
        at: usize,
        row_bytes: usize,
    ) -> Self {
        let next = if b + 1 < grad.n_blocks() {
            grad.rows(b + 1)
        } else {
            &[]
        };
        Ahead {
            next,
            n: n.max(1),
            at,
            row_bytes,
        }
    }

    /// The share of the next block's rows of the j-th row updated.
    #[inline]
    pub(in crate::optim) fn fetch(&self, j: usize) {
        let m = self.next.len();
        let share = &self.next[(j * m / self.n).min(m)..((j + 1) * m / self.n).min(m)];
        for &r in share {
            prefetch_span(self.at + r * self.row_bytes, self.row_bytes);
        }
    }
}

/// The rows of each block of `grad` (each row's index and its `rows`
/// entry), in block order.
///
/// **Panics** if the blocks are not a partition of the rows.
pub(in crate::optim) fn cut_blocks<X>(
    rows: Vec<X>,
    grad: &dyn BlockGradient<impl Real>,
) -> Vec<(usize, Vec<(usize, X)>)> {
    let n = rows.len();
    let mut rows: Vec<Option<X>> = rows.into_iter().map(Some).collect();
    let blocks: Vec<_> = (0..grad.n_blocks())
        .map(|b| {
            let taken = grad.rows(b).iter().map(|&r| {
                let row = rows.get_mut(r).and_then(Option::take);
                let row = row.unwrap_or_else(|| {
                    panic!("update_by_blocks: row {r} of {n} is out of range or in two blocks")
                });
                (r, row)
            });
            (b, taken.collect())
        })
        .collect();
    if let Some(r) = rows.iter().position(Option::is_some) {
        panic!("update_by_blocks: row {r} is in no block");
    }
    blocks
}
