//! The walk of an update by blocks ([`Optimizer::update_by_blocks`](crate::optim::Optimizer::update_by_blocks)),
//! whatever the rows are kept as: the rows cut into the gradient's blocks,
//! each block formed from its rows and its rows then updated, the next
//! block's rows fetched meanwhile.

use rayon::prelude::*;

use crate::kernels::Real;
use crate::kernels::rows::KeptRow;
use crate::kernels::scatter::prefetch_span;
use crate::param::{BlockGradient, RowGradient, StoredMut};

/// A row an update by blocks walks, which lends its parameter's row as it
/// is kept to the block's gradient.
pub(in crate::optim) trait BlockRow<T>: Send {
    /// The parameter's row, read-only.
    fn kept(&self) -> KeptRow<'_, T>;
}

/// A row of a parameter and its two moments, as they are kept.
impl<T: Real> BlockRow<T> for ((StoredMut<'_, T>, StoredMut<'_, T>), StoredMut<'_, T>) {
    fn kept(&self) -> KeptRow<'_, T> {
        self.0.0.kept()
    }
}

/// A row of a parameter and its two moments, kept as `T`.
impl<T: Real> BlockRow<T> for ((&mut [T], &mut [T]), &mut [T]) {
    fn kept(&self) -> KeptRow<'_, T> {
        KeptRow::Full(self.0.0)
    }
}

/// A row of a parameter as it is kept, and a row to write into.
impl<T: Real> BlockRow<T> for (KeptRow<'_, T>, &mut [T]) {
    fn kept(&self) -> KeptRow<'_, T> {
        self.0
    }
}

/// `rows` (row r at `rows[r]`) walked block by block of `grad`: each block
/// formed from its rows as they are kept, then `update(scratch, r, row,
/// block)` on each of its rows in the block's order, the next block's rows
/// fetched meanwhile when `fetch` gives the parameter's address and a
/// row's bytes ([`Ahead`]); in parallel over blocks unless `serial`.
///
/// **Panics** if the blocks are not a partition of the rows.
pub(in crate::optim) fn walk_blocks<T: Real, X: BlockRow<T>, S>(
    rows: Vec<X>,
    grad: &dyn BlockGradient<T>,
    fetch: Option<(usize, usize)>,
    serial: bool,
    scratch: impl Fn() -> S + Sync + Send,
    update: impl Fn(&mut S, usize, X, &dyn RowGradient<T>) + Sync + Send,
) {
    let run = |(s, terms): &mut (S, Vec<T>), (b, rows): (usize, Vec<(usize, X)>)| {
        let kept: Vec<KeptRow<'_, T>> = rows.iter().map(|(_, x)| x.kept()).collect();
        let block = grad.block(b, &kept, terms);
        drop(kept);
        let ahead = fetch.map(|(at, row_bytes)| Ahead::new(grad, b, rows.len(), at, row_bytes));
        for (j, (r, x)) in rows.into_iter().enumerate() {
            if let Some(ahead) = &ahead {
                ahead.fetch(j);
            }
            update(s, r, x, &*block);
        }
    };
    let blocks = cut_blocks(rows, grad);
    let scratch = || (scratch(), Vec::new());
    if serial {
        let mut s = scratch();
        blocks.into_iter().for_each(|job| run(&mut s, job));
    } else {
        blocks.into_par_iter().for_each_init(scratch, run);
    }
}

/// The next block's rows, fetched into the cache while a block is
/// updated, a few per row updated (block b's j-th of n rows fetches the
/// j-th n-th of block b + 1's), so that the next block's terms read its
/// rows from the cache. (Most often a task takes the next block next.)
struct Ahead<'g> {
    next: &'g [usize],
    n: usize,
    /// The parameter's first element's address, and a row's bytes.
    at: usize,
    row_bytes: usize,
}

impl<'g> Ahead<'g> {
    /// For block b of `grad`, of n rows, in a parameter at address `at`.
    fn new<T>(
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
    fn fetch(&self, j: usize) {
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
fn cut_blocks<X>(
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
