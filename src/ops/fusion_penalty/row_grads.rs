//! The fusion penalty's gradient row by row, for an optimiser that forms
//! each row's gradient as it updates it
//! ([`Optimizer::update_by_rows`](crate::optim::Optimizer::update_by_rows)):
//! the per-group terms, and the forward pass that computes them beside the
//! norms.

use std::mem::MaybeUninit;

use ndarray::{Array1, ArrayView2};
use rayon::prelude::*;

use super::{
    AHEAD, GroupRows, MIN_GROUPS_PER_TASK, RowGroups, check_rows, check_rows_norms, factor,
    group_norms, group_terms, penalty_of, prefetch_ahead, spread,
};
use crate::kernels::Real;
use crate::kernels::pool::Pool;
use crate::kernels::wide::{wide, wide_fn};
use crate::param::RowForm;
use crate::param::StoredView;

/// [`fusion_penalty_forward_stored`](super::fusion_penalty_forward_stored)
/// and the gradient of `gy·P` row by row ([`FusionRowGrads::from_stored`])
/// in one pass over the rows: each group's centroid and norms, then its
/// gradient terms from the same block of rows. The same bits as the two calls, for a caller that knows the
/// penalty's weight before the forward (a training step whose loss is
/// `… + gy·P`) and reads the rows once instead of twice.
///
/// **Panics** as [`fusion_penalty_forward`](super::fusion_penalty_forward).
#[track_caller]
pub fn fusion_penalty_forward_row_grads<T: Real>(
    pool: &Pool<T>,
    x: StoredView<'_, T>,
    groups: &RowGroups,
    gy: T,
) -> (T, Array1<T>, FusionRowGrads<T>) {
    let (n, width) = check_rows(&x, groups);
    let rows = x.table_rows();
    let group_rows = GroupRows::new(&rows, groups, n);
    let a = gy / T::from_f64(n.max(1) as f64);
    let (multi, slot) = slots(groups);
    let n_multi = multi.len();
    // The terms, from the pool, each slot written whole by its group's
    // task (no zero-fill of the whole buffer first).
    let len = n_multi * 2 * width;
    let mut terms = pool.take_vec(len);
    let mut by_group = vec![T::zero(); n];
    if width > 0 {
        let mut chunks = terms.spare_capacity_mut()[..len].chunks_mut(2 * width);
        let term_of: Vec<Option<&mut [MaybeUninit<T>]>> = (0..groups.n_groups())
            .map(|g| (groups.members(g).len() > 1).then(|| chunks.next().expect("a slot")))
            .collect();
        groups
            .split(&mut by_group)
            .into_par_iter()
            .zip(term_of)
            .with_min_len(MIN_GROUPS_PER_TASK)
            .for_each_init(
                || (vec![T::zero(); width], Vec::new()),
                |(c, block), ((g, norms), t)| {
                    prefetch_ahead(&rows, groups, g);
                    let members = groups.members(g);
                    // (A group of fewer than two rows has no terms slot.)
                    if group_rows.norms_without_arithmetic(members, norms) {
                        return;
                    }
                    let (x, local) = group_rows.view(members, block);
                    group_norms_terms(x, local, a, c, norms, t);
                },
            );
    }
    // SAFETY: every slot is a group of two or more rows, whose task wrote
    // its 2·width elements (with width 0 there is none); the buffer has
    // room for `len`.
    unsafe { terms.set_len(len) };
    let (p, norms) = penalty_of(groups, &by_group);
    let k = norms.iter().map(|&y| factor(a, y)).collect();
    let grads = FusionRowGrads {
        width,
        slot,
        k,
        terms,
    };
    (p, norms, grads)
}

wide_fn! {
    /// One group's work in [`fusion_penalty_forward_row_grads`]: its rows'
    /// norms (`c` left holding its centroid) and, for a group of two or
    /// more rows, its terms `t` (centroid, then `s`; written whole).
    fn group_norms_terms<T: Real>(
        x: ArrayView2<'_, T>,
        members: &[usize],
        a: T,
        c: &mut [T],
        norms: &mut [T],
        t: Option<&mut [MaybeUninit<T>]>,
    ) {
        match t {
            None => group_norms(x.view(), members, c, norms),
            Some(t) => {
                // Written whole first (the centroid and s are then written
                // over), so that the slot is a slice of T.
                t.fill(MaybeUninit::new(T::zero()));
                // SAFETY: every element just written, and `MaybeUninit<T>`
                // has `T`'s layout.
                let t = unsafe { &mut *(t as *mut [MaybeUninit<T>] as *mut [T]) };
                let (tc, ts) = t.split_at_mut(c.len());
                norms_and_terms(x, members, a, norms, tc, ts);
            }
        }
    }
}

/// A group of two or more rows `members` of x: their norms into `norms`
/// (one per member), the centroid into `tc` and
/// `s = (Σ_j k_j·d_j)/|g|` into `ts`, from the factors of the norms just
/// computed: `group_terms`' bits.
#[inline(always)]
pub(super) fn norms_and_terms<T: Real>(
    x: ArrayView2<'_, T>,
    members: &[usize],
    a: T,
    norms: &mut [T],
    tc: &mut [T],
    ts: &mut [T],
) {
    group_norms(x.view(), members, tc, norms);
    // The p-th member's norm is norms[p].
    spread(x, members, |p| factor(a, norms[p]), tc, ts);
}

/// The groups of two or more rows, in group order, and the slot of each
/// row's group among them (`u32::MAX` for a row alone).
fn slots(groups: &RowGroups) -> (Vec<usize>, Vec<u32>) {
    let multi: Vec<usize> = (0..groups.n_groups())
        .filter(|&g| groups.members(g).len() > 1)
        .collect();
    let mut slot = vec![u32::MAX; groups.n_rows()];
    for (s, &g) in multi.iter().enumerate() {
        for &i in groups.members(g) {
            slot[i] = s as u32;
        }
    }
    (multi, slot)
}

/// The fusion penalty's gradient row by row, for a consumer that takes
/// the rows one at a time (an optimiser's update,
/// [`Optimizer::update_by_rows`](crate::optim::Optimizer::update_by_rows))
/// instead of a stored (n, D) array: the per-group terms are computed once,
/// the centroid `c` and `s = (Σ_j k_j·d_j)/|g|` of each group of two or
/// more rows, and row i's gradient is then `k_i·(x_i − c) − s`, 0 for a
/// row alone in its group. Each row equals
/// [`fusion_penalty_backward`](super::fusion_penalty_backward)'s bit for
/// bit.
#[derive(Clone, Debug)]
pub struct FusionRowGrads<T> {
    width: usize,
    /// The slot of each row's group in `terms`; `u32::MAX` for a row alone.
    pub(super) slot: Vec<u32>,
    /// `k_i = (gy/n)/‖d_i‖`, 0 where the norm is not > 0.
    pub(super) k: Vec<T>,
    /// Per slot: c (width), then s (width).
    pub(super) terms: Vec<T>,
}

impl<T: Real> FusionRowGrads<T> {
    /// The terms for rows x (n, D), their groups, the norms of
    /// [`fusion_penalty_forward`](super::fusion_penalty_forward) and the
    /// penalty's gradient gy.
    ///
    /// **Panics** if the shapes disagree.
    #[track_caller]
    pub fn new(x: ArrayView2<'_, T>, groups: &RowGroups, norms: &[T], gy: T) -> Self {
        Self::from_stored(StoredView::Full(x.into_dyn()), groups, norms, gy)
    }

    /// [`Self::new`] for rows (n, D) as they are kept: rows in half
    /// precision are widened (exactly) a group at a time, never whole; the
    /// terms equal those of the widened rows bit for bit. [`Self::row`]
    /// then takes each row widened.
    ///
    /// **Panics** if the shapes disagree.
    #[track_caller]
    pub fn from_stored(x: StoredView<'_, T>, groups: &RowGroups, norms: &[T], gy: T) -> Self {
        let (n, width) = check_rows_norms(&x, groups, norms);
        let rows = x.table_rows();
        let group_rows = GroupRows::new(&rows, groups, n);
        let a = gy / T::from_f64(n.max(1) as f64);
        let k: Vec<T> = norms.iter().map(|&y| factor(a, y)).collect();
        let (multi, slot) = slots(groups);
        let mut terms = vec![T::zero(); multi.len() * 2 * width];
        if width > 0 {
            terms
                .par_chunks_mut(2 * width)
                .zip(multi.par_iter().enumerate())
                .with_min_len(MIN_GROUPS_PER_TASK)
                .for_each_init(Vec::new, |block, (t, (at, &g))| {
                    let (c, s) = t.split_at_mut(width);
                    if let Some(&ahead) = multi.get(at + AHEAD) {
                        rows.prefetch_rows(groups.members(ahead));
                    }
                    let members = groups.members(g);
                    let (x, local) = group_rows.view(members, block);
                    group_terms(x, local, |p| k[members[p]], c, s);
                });
        }
        FusionRowGrads {
            width,
            slot,
            k,
            terms,
        }
    }

    /// Hands its buffer of terms back to `pool`.
    pub fn give_back(self, pool: &Pool<T>) {
        pool.give_vec(self.terms);
    }

    /// Row i's form ([`RowForm`]): `Zero` for a row alone in its group,
    /// else `Deviation` with its factor `k_i` and its group's `c` and `s`,
    /// the bits of [`Self::row`]. Fetches the terms of the row `AHEAD` rows
    /// on, as `row` does.
    ///
    /// **Panics** if i is out of range.
    #[track_caller]
    pub fn form(&self, i: usize) -> RowForm<'_, T> {
        self.prefetch_terms(i + AHEAD);
        match self.slot[i] {
            u32::MAX => RowForm::Zero,
            s => {
                let (c, s) = self.terms_of(s);
                RowForm::Deviation { k: self.k[i], c, s }
            }
        }
    }

    /// The terms of slot `s`: c, then s.
    fn slot_terms(&self, s: u32) -> &[T] {
        let w = self.width;
        &self.terms[s as usize * 2 * w..][..2 * w]
    }

    /// The terms (c, s) of slot `s`.
    fn terms_of(&self, s: u32) -> (&[T], &[T]) {
        self.slot_terms(s).split_at(self.width)
    }

    /// Fetches the terms of row i's group, if it has any (rows are mostly
    /// asked for in increasing order, as an update walks them, and a
    /// row's terms are its group's, scattered).
    fn prefetch_terms(&self, i: usize) {
        if let Some(&s) = self.slot.get(i)
            && s != u32::MAX
        {
            let t = self.slot_terms(s);
            crate::kernels::scatter::prefetch_span(t.as_ptr() as usize, std::mem::size_of_val(t));
        }
    }

    /// Row i's gradient into `out` (D elements), from `x_i`, row i of the
    /// rows the terms were computed from.
    ///
    /// **Panics** if i is out of range or a slice is not D long.
    #[track_caller]
    pub fn row(&self, i: usize, x_i: &[T], out: &mut [T]) {
        let w = self.width;
        assert!(
            x_i.len() == w && out.len() == w,
            "FusionRowGrads::row: rows of {w} elements"
        );
        self.prefetch_terms(i + AHEAD);
        match self.slot[i] {
            u32::MAX => out.fill(T::zero()),
            s => {
                let (c, s) = self.terms_of(s);
                deviation_row(self.k[i], x_i, c, s, out);
            }
        }
    }
}

/// `out = k·(x − c) − s`, element by element, as written (the form
/// [`RowForm::Deviation`](crate::param::RowForm::Deviation) names).
pub(super) fn deviation_row<T: Real>(k: T, x: &[T], c: &[T], s: &[T], out: &mut [T]) {
    wide(|| {
        for (((g, &v), &c), &s) in out.iter_mut().zip(x).zip(c).zip(s) {
            *g = k * (v - c) - s;
        }
    });
}
