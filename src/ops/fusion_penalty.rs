//! The fusion penalty as one op: the mean distance of each row from the
//! centroid of its group.
//!
//! ```text
//! c_g = x_{f(g)} + (1/|g|) Σ_{j ∈ g} (x_j − x_{f(g)})     f(g) the first row of group g
//! P   = (1/n) Σ_i ‖x_i − c_{g(i)}‖₂
//! ∂x_i += (∂P/n) · (u_i − (1/|g|) Σ_{j ∈ g} u_j)         u_i = (x_i − c_{g(i)}) / ‖x_i − c_{g(i)}‖, 0 at a zero deviation
//! ```
//!
//! It replaces the composition segment mean → gather → sub → row norm →
//! mean (the split vocabulary's `fusion_penalty_var_naive`), which writes
//! several (n, D) arrays and gradient buffers, with one pass over the rows
//! forward and one backward. The forward keeps only the n norms; the
//! backward recomputes the centroids and deviations from the rows, which it
//! must read anyway. Both run in parallel over groups; each group is summed
//! in increasing row order by one task, so the result is the same bit for
//! bit for any number of threads. Derivation:
//! `docs/gradients.md#the-fused-fusion-penalty`.

use std::mem::MaybeUninit;

use ndarray::{Array1, ArrayD, ArrayView2, ArrayViewD, arr0};
use rayon::prelude::*;

use crate::kernels::Real;
use crate::kernels::half::first_non_finite;
use crate::kernels::pool::Pool;
use crate::kernels::rows::TableRows;
use crate::kernels::wide::wide_fn;
use crate::param::StoredView;
use crate::tape::{Tape, Var};

/// A partition of `n_rows` rows into groups, kept both ways: the group of
/// each row, and the rows of each group in increasing order.
///
/// ```
/// use splitgrad::ops::fusion_penalty::RowGroups;
/// let g = RowGroups::new(&[1, 0, 1], 2);
/// assert_eq!(g.members(1), &[0, 2]);
/// assert_eq!((g.n_rows(), g.n_groups()), (3, 2));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowGroups {
    of: Vec<usize>,
    /// `members[starts[g]..starts[g + 1]]` are the rows of group g.
    starts: Vec<usize>,
    members: Vec<usize>,
}

impl RowGroups {
    /// Groups from the group id of each row. A group may be empty.
    ///
    /// **Panics** if a group id is ≥ n_groups.
    #[track_caller]
    pub fn new(group_of_row: &[usize], n_groups: usize) -> Self {
        let mut starts = vec![0usize; n_groups + 1];
        for &g in group_of_row {
            assert!(
                g < n_groups,
                "RowGroups: group id {g} is out of range 0..{n_groups}"
            );
            starts[g + 1] += 1;
        }
        for g in 0..n_groups {
            starts[g + 1] += starts[g];
        }
        let mut next = starts.clone();
        let mut members = vec![0; group_of_row.len()];
        for (i, &g) in group_of_row.iter().enumerate() {
            members[next[g]] = i;
            next[g] += 1;
        }
        RowGroups {
            of: group_of_row.to_vec(),
            starts,
            members,
        }
    }

    /// The group of each row, (n_rows).
    pub fn group_of_rows(&self) -> &[usize] {
        &self.of
    }

    /// The rows of group g, in increasing order.
    ///
    /// **Panics** if g ≥ n_groups.
    #[track_caller]
    pub fn members(&self, g: usize) -> &[usize] {
        &self.members[self.starts[g]..self.starts[g + 1]]
    }

    /// n_rows.
    pub fn n_rows(&self) -> usize {
        self.of.len()
    }

    /// The number of groups.
    pub fn n_groups(&self) -> usize {
        self.starts.len() - 1
    }

    /// `items` (one per row, in group order: `items[k]` belongs to row
    /// `members[k]`) cut into one slice per group.
    fn split<'a, X>(&self, mut items: &'a mut [X]) -> Vec<(usize, &'a mut [X])> {
        let mut out = Vec::with_capacity(self.n_groups());
        for g in 0..self.n_groups() {
            let (head, tail) = items.split_at_mut(self.starts[g + 1] - self.starts[g]);
            out.push((g, head));
            items = tail;
        }
        out
    }
}

/// Groups per rayon task, at least: a group is a few rows of D elements.
const MIN_GROUPS_PER_TASK: usize = 64;

/// How many groups ahead of the one being summed rows are fetched: a
/// group's rows are scattered over the table, a group is a few rows at
/// most (most are empty or alone), so the fetch must start several groups
/// early to arrive in time.
const AHEAD: usize = 8;

/// A hint to load the rows of group g + [`AHEAD`] (if there is one): called
/// at every group, empty ones too, so the rows of each group are requested
/// [`AHEAD`] groups before they are read.
fn prefetch_ahead<T: Real>(rows: &TableRows<'_, T>, groups: &RowGroups, g: usize) {
    if g + AHEAD < groups.n_groups() {
        rows.prefetch_rows(groups.members(g + AHEAD));
    }
}

/// Rows in half precision, read a group at a time: the group's rows
/// widened (exactly) into a buffer of the task, then the f32 code on that
/// block with the members renumbered 0..m, so every sum runs on the same
/// values in the same order as on the widened table.
struct HalfGroups<'r, 'a, T: Clone> {
    rows: &'r TableRows<'a, T>,
    /// 0, 1, …, the size of the largest group − 1: the block's members.
    local: Vec<usize>,
}

impl<'r, 'a, T: Real> HalfGroups<'r, 'a, T> {
    fn new(rows: &'r TableRows<'a, T>, groups: &RowGroups) -> Self {
        let largest = (0..groups.n_groups())
            .map(|g| groups.members(g).len())
            .max()
            .unwrap_or(0);
        HalfGroups {
            rows,
            local: (0..largest).collect(),
        }
    }

    /// The members' rows widened into `block`, as an (m, D) view, and the
    /// members renumbered.
    fn block<'b>(
        &'b self,
        members: &[usize],
        block: &'b mut Vec<T>,
    ) -> (ArrayView2<'b, T>, &'b [usize]) {
        self.rows.rows_into(members, block);
        let view = ArrayView2::from_shape((members.len(), self.rows.width()), &block[..])
            .expect("m rows of D");
        (view, &self.local[..members.len()])
    }
}

/// The shape (n, D) of rows x, checked: 2-D, one row per row of `groups`.
#[track_caller]
fn check_rows<T: Real>(x: &StoredView<'_, T>, groups: &RowGroups) -> (usize, usize) {
    assert_eq!(x.shape().len(), 2, "fusion_penalty: rows must be 2-D");
    assert_eq!(
        x.shape()[0],
        groups.n_rows(),
        "fusion_penalty: {} rows for groups of {} rows",
        x.shape()[0],
        groups.n_rows()
    );
    (x.shape()[0], x.shape()[1])
}

/// [`check_rows`] for a pass that also takes the rows' norms: one a row.
#[track_caller]
fn check_rows_norms<T: Real>(
    x: &StoredView<'_, T>,
    groups: &RowGroups,
    norms: &[T],
) -> (usize, usize) {
    let (n, width) = check_rows(x, groups);
    assert_eq!(norms.len(), n, "fusion_penalty: one norm per row");
    (n, width)
}

/// The rows a pass reads a group at a time: in place when they are kept
/// as `T`, through [`HalfGroups`] in half precision.
enum GroupRows<'r, 'a, T: Clone> {
    InPlace(ArrayView2<'r, T>),
    Half(HalfGroups<'r, 'a, T>),
}

impl<'r, 'a, T: Real> GroupRows<'r, 'a, T> {
    /// The n rows of `rows`, for `groups`.
    fn new(rows: &'r TableRows<'a, T>, groups: &RowGroups, n: usize) -> Self {
        match rows {
            TableRows::Full(a, w) => {
                GroupRows::InPlace(ArrayView2::from_shape((n, *w), &a[..]).expect("n rows"))
            }
            _ => GroupRows::Half(HalfGroups::new(rows, groups)),
        }
    }

    /// The rows of a group's `members` as an (·, D) view and the members'
    /// indices in it (the members themselves in place; 0..m in `block`,
    /// the members' rows widened, in half precision). Position p of the
    /// returned members is the p-th member either way.
    fn view<'b>(
        &'b self,
        members: &'b [usize],
        block: &'b mut Vec<T>,
    ) -> (ArrayView2<'b, T>, &'b [usize]) {
        match self {
            GroupRows::InPlace(x) => (x.view(), members),
            GroupRows::Half(h) => h.block(members, block),
        }
    }

    /// The norms of a group that need no arithmetic, into `norms`: none
    /// for an empty group, and `lone_norm`'s +0 for a row alone in its
    /// group, kept in half precision, whose elements are all finite (known
    /// from the bits, without widening the row). Returns whether the group
    /// is done. (Rows in place `lone_norm` reads in one pass; a lone row
    /// with ±∞ or NaN takes that way too, for its NaN.)
    fn norms_without_arithmetic(&self, members: &[usize], norms: &mut [T]) -> bool {
        let finite = |i: usize| match self {
            GroupRows::InPlace(_) => false,
            GroupRows::Half(h) => match h.rows {
                TableRows::BF16(a, w) => first_non_finite(&a[i * w..(i + 1) * w]).is_none(),
                TableRows::F16(a, w) => first_non_finite(&a[i * w..(i + 1) * w]).is_none(),
                TableRows::Full(..) => false,
            },
        };
        match members {
            [] => true,
            &[i] if finite(i) => {
                norms[0] = T::zero();
                true
            }
            _ => false,
        }
    }
}

/// `c = x_f + (Σ_{j ∈ members} (x_j − x_f))·(1/|members|)`, f the first
/// member: the mean, exactly x_f when every member equals it (the form of
/// `segment_mean_forward`, with the division as a product).
#[inline(always)]
fn centroid<T: Real>(x: ArrayView2<'_, T>, members: &[usize], c: &mut [T]) {
    let first = x.row(members[0]);
    let first = first.as_slice().expect("standard layout");
    c.fill(T::zero());
    for &j in members {
        let row = x.row(j);
        for ((c, &v), &b) in c
            .iter_mut()
            .zip(row.as_slice().expect("standard layout"))
            .zip(first)
        {
            *c += v - b;
        }
    }
    let inv_count = T::one() / T::from_f64(members.len() as f64);
    for (c, &b) in c.iter_mut().zip(first) {
        *c = b + *c * inv_count;
    }
}

/// A group's terms of the gradient, for members (not empty) with factors
/// `k` (`k(p)`: the p-th member's): its centroid `c` and
/// `s = (Σ_j k_j·d_j) / |g|`, d_j = x_j − c, the sum over members in
/// increasing order, skipping `k_j = 0`.
#[inline(always)]
fn group_terms<T: Real>(
    x: ArrayView2<'_, T>,
    members: &[usize],
    k: impl Fn(usize) -> T,
    c: &mut [T],
    s: &mut [T],
) {
    centroid(x, members, c);
    spread(x, members, k, c, s);
}

/// `s = (Σ_j k_j·(x_j − c)) / |members|` for a group whose centroid `c` is
/// known, `k(p)` the factor of the p-th member, the sum over members in
/// increasing order, skipping `k_j = 0`.
#[inline(always)]
fn spread<T: Real>(
    x: ArrayView2<'_, T>,
    members: &[usize],
    k: impl Fn(usize) -> T,
    c: &[T],
    s: &mut [T],
) {
    s.fill(T::zero());
    for (p, &j) in members.iter().enumerate() {
        let kj = k(p);
        if kj != T::zero() {
            let row = x.row(j);
            let row = row.as_slice().expect("standard layout");
            for ((s, &v), &c) in s.iter_mut().zip(row).zip(c.iter()) {
                *s += kj * (v - c);
            }
        }
    }
    let count = T::from_f64(members.len() as f64);
    s.iter_mut().for_each(|s| *s /= count);
}

/// `Σ_d (x_d − c_d)²`, in eight interleaved partial sums (so that the
/// loop vectorises), then those in a fixed tree.
#[inline(always)]
fn dev_sq_sum<T: Real>(x: &[T], c: &[T]) -> T {
    const LANES: usize = 8;
    let mut acc = [T::zero(); LANES];
    let c = &c[..x.len()];
    let ((xs, xr), (cs, cr)) = (x.as_chunks::<LANES>(), c.as_chunks::<LANES>());
    for (xs, cs) in xs.iter().zip(cs) {
        for k in 0..LANES {
            let d = xs[k] - cs[k];
            acc[k] += d * d;
        }
    }
    // Without this barrier the compiler splits the eight sums into four
    // vectors of two, loaded two floats at a time, to match the tree below.
    let acc = std::hint::black_box(acc);
    let mut tail = T::zero();
    for (&a, &b) in xr.iter().zip(cr) {
        tail += (a - b) * (a - b);
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7])) + tail
}

/// The deviation norm of a row alone in its group: `‖x − (x + (x − x))‖`,
/// 0 for a finite row, NaN for a row with an infinite or NaN element. It
/// is `|Σ_d (x_d − x_d)|`: one pass, no centroid.
#[inline(always)]
#[allow(clippy::eq_op)] // x − x is 0 or NaN: the point is the NaN.
fn lone_norm<T: Real>(x: &[T]) -> T {
    const LANES: usize = 8;
    let mut acc = [T::zero(); LANES];
    let xs = x.chunks_exact(LANES);
    let mut tail = T::zero();
    for &v in xs.remainder() {
        tail += v - v;
    }
    for xs in xs {
        for k in 0..LANES {
            acc[k] += xs[k] - xs[k];
        }
    }
    (acc.iter().fold(T::zero(), |s, &a| s + a) + tail).abs()
}

/// The penalty and the norm of each row's deviation: x (n, D), groups of
/// the n rows → (P, ‖x_i − c_{g(i)}‖ (n)). P = 0 when n = 0.
///
/// **Panics** if x is not 2-D or `groups` is not for x's rows.
#[track_caller]
pub fn fusion_penalty_forward<T: Real>(x: ArrayViewD<'_, T>, groups: &RowGroups) -> (T, Array1<T>) {
    fusion_penalty_forward_stored(StoredView::Full(x), groups)
}

/// [`fusion_penalty_forward`] on rows as they are kept: rows in half
/// precision are widened (exactly) a group at a time, never whole, and
/// the result equals that of the widened rows bit for bit.
///
/// **Panics** as [`fusion_penalty_forward`].
#[track_caller]
pub fn fusion_penalty_forward_stored<T: Real>(
    x: StoredView<'_, T>,
    groups: &RowGroups,
) -> (T, Array1<T>) {
    let (n, width) = check_rows(&x, groups);
    let rows = x.table_rows();
    let group_rows = GroupRows::new(&rows, groups, n);
    let mut by_group = vec![T::zero(); n];
    if width > 0 {
        groups
            .split(&mut by_group)
            .into_par_iter()
            .with_min_len(MIN_GROUPS_PER_TASK)
            .for_each_init(
                || (vec![T::zero(); width], Vec::new()),
                |(c, block), (g, norms)| {
                    prefetch_ahead(&rows, groups, g);
                    let members = groups.members(g);
                    if group_rows.norms_without_arithmetic(members, norms) {
                        return;
                    }
                    let (x, local) = group_rows.view(members, block);
                    group_norms_wide(x, local, c, norms);
                },
            );
    }
    penalty_of(groups, &by_group)
}

/// The norms in row order from `by_group` (in group order), and the
/// penalty, their mean (0 with no row).
fn penalty_of<T: Real>(groups: &RowGroups, by_group: &[T]) -> (T, Array1<T>) {
    let mut norms = Array1::<T>::zeros(groups.n_rows());
    for (&i, &y) in groups.members.iter().zip(by_group) {
        norms[i] = y;
    }
    mean_of_norms(norms)
}

/// P, the mean of the rows' norms (n) in row order (0 for no row), and
/// the norms.
fn mean_of_norms<T: Real>(norms: Array1<T>) -> (T, Array1<T>) {
    let p = norms.sum() / T::from_f64(norms.len().max(1) as f64);
    (p, norms)
}

/// The factor `k = a/y` of a row whose deviation norm is y, 0 where the
/// norm is not > 0 (a row alone, equal to its centroid, or not finite).
#[inline]
fn factor<T: Real>(a: T, y: T) -> T {
    if y > T::zero() { a / y } else { T::zero() }
}

/// The deviation norms of one group's rows `members` (not empty) of x,
/// into `norms` (one per member), with `c` a buffer of one row.
#[inline(always)]
fn group_norms<T: Real>(x: ArrayView2<'_, T>, members: &[usize], c: &mut [T], norms: &mut [T]) {
    match members {
        &[i] => {
            let row = x.row(i);
            norms[0] = lone_norm(row.as_slice().expect("standard layout"));
            return;
        }
        _ => centroid(x.view(), members, c),
    }
    for (y, &i) in norms.iter_mut().zip(members) {
        let row = x.row(i);
        *y = dev_sq_sum(row.as_slice().expect("standard layout"), c).sqrt();
    }
}

/// `∂x_i = (gy/n)·(u_i − mean_{j ∈ g(i)} u_j)`, computed as
/// `k_i·d_i − (Σ_j k_j·d_j)/|g|` with `d_i = x_i − c_{g(i)}`,
/// `k_i = (gy/n)/‖d_i‖`, and `k_i = 0` where the norm is not > 0.
///
/// x: (n, D), the rows; norms: (n), from [`fusion_penalty_forward`];
/// gy: the penalty's gradient (one element) → ∂x (n, D).
///
/// It returns a fresh array, every element written once, rather than
/// adding into a zero-filled buffer: the gradient is dense, and a zero
/// fill would be a third pass over it. The tape adds it to the rows'
/// buffer when there is one, and takes it as the buffer otherwise.
///
/// A group of one row gets 0: its deviation is `x − (x + (x − x))`, 0 for
/// a finite row and NaN otherwise, and either way its norm is not > 0, so
/// the centroid term cancels the row's own.
///
/// **Panics** if the shapes disagree.
#[track_caller]
pub fn fusion_penalty_backward<T: Real>(
    pool: &Pool<T>,
    x: ArrayViewD<'_, T>,
    groups: &RowGroups,
    norms: &[T],
    gy: ArrayViewD<'_, T>,
) -> ArrayD<T> {
    fusion_penalty_backward_stored(pool, StoredView::Full(x), groups, norms, gy)
}

/// [`fusion_penalty_backward`] on rows as they are kept: rows in half
/// precision are widened (exactly) a group at a time, never whole, and
/// the gradient equals that of the widened rows bit for bit.
///
/// **Panics** as [`fusion_penalty_backward`].
#[track_caller]
pub fn fusion_penalty_backward_stored<T: Real>(
    pool: &Pool<T>,
    x: StoredView<'_, T>,
    groups: &RowGroups,
    norms: &[T],
    gy: ArrayViewD<'_, T>,
) -> ArrayD<T> {
    let (n, width) = check_rows_norms(&x, groups, norms);
    let rows = x.table_rows();
    let group_rows = GroupRows::new(&rows, groups, n);
    let a = *gy.iter().next().expect("a scalar gradient") / T::from_f64(n.max(1) as f64);
    let mut out = pool.uninit_2d((n, width));
    if width > 0 {
        let dst = out.as_slice_mut().expect("fresh array is contiguous");
        let mut by_row: Vec<Option<&mut [MaybeUninit<T>]>> =
            dst.chunks_mut(width).map(Some).collect();
        let mut by_group: Vec<&mut [MaybeUninit<T>]> = groups
            .members
            .iter()
            .map(|&i| by_row[i].take().expect("each row in one group"))
            .collect();
        groups
            .split(&mut by_group)
            .into_par_iter()
            .with_min_len(MIN_GROUPS_PER_TASK)
            .for_each_init(
                || (vec![T::zero(); 2 * width], Vec::new()),
                |(buf, block), (grp, grads)| {
                    prefetch_ahead(&rows, groups, grp);
                    let members = groups.members(grp);
                    if members.len() == 1 {
                        grads[0].iter_mut().for_each(|g| {
                            g.write(T::zero());
                        });
                        return;
                    }
                    if members.is_empty() {
                        return;
                    }
                    let (x, local) = group_rows.view(members, block);
                    group_grads(x, local, members, a, norms, buf, grads);
                },
            );
    }
    // SAFETY: every row is the member of exactly one group, and the loop
    // above wrote every element of every member row of every group (with
    // width 0 there is no element).
    unsafe { out.assume_init() }.into_dyn()
}

wide_fn! {
    /// [`group_norms`] on the CPU's widest vectors.
    fn group_norms_wide<T: Real>(x: ArrayView2<'_, T>, members: &[usize], c: &mut [T], norms: &mut [T]) {
        group_norms(x, members, c, norms)
    }
}

wide_fn! {
    /// The gradient rows of one group of two or more rows `members` of x
    /// (the group's rows `rows` of the table), into `grads` (one per
    /// member), with `buf` two rows long: the p-th member's factor is
    /// `factor(a, norms[rows[p]])`. On the CPU's widest vectors.
    fn group_grads<T: Real>(
        x: ArrayView2<'_, T>,
        members: &[usize],
        rows: &[usize],
        a: T,
        norms: &[T],
        buf: &mut [T],
        grads: &mut [&mut [MaybeUninit<T>]],
    ) {
        let k = |p: usize| factor(a, norms[rows[p]]);
        let width = x.ncols();
        let (c, s) = buf.split_at_mut(width);
        group_terms(x.view(), members, k, c, s);
        for (p, (gi, &i)) in grads.iter_mut().zip(members).enumerate() {
            let ki = k(p);
            let row = x.row(i);
            let row = row.as_slice().expect("standard layout");
            for (((g, &v), &c), &s) in gi.iter_mut().zip(row).zip(c.iter()).zip(s.iter()) {
                g.write(ki * (v - c) - s);
            }
        }
    }
}

/// The saved state of `fusion_penalty`: the rows, their groups and each
/// row's distance from its centroid.
struct FusionPenalty<'p, T> {
    x: Var,
    groups: &'p RowGroups,
    /// ‖x_i − c_{g(i)}‖, (n).
    norms: Vec<T>,
}

backward!(FusionPenalty<'_, T>, |s, _y, gy, grads| {
    if grads.wants(s.x) {
        let gy = gy.into_owned();
        let d = fusion_penalty_backward_stored(
            grads.pool(),
            grads.stored_value(s.x),
            s.groups,
            &s.norms,
            gy.view(),
        );
        grads.add(s.x, d);
    }
});

impl<'p, T: Real> Tape<'p, T> {
    /// The fusion penalty of rows x (n, D) grouped by `groups`:
    /// `(1/n) Σ_i ‖x_i − c_{g(i)}‖₂`, c_g the mean of group g's rows, the
    /// gradient flowing through the centroids too and 0 at a zero
    /// deviation. A scalar (0-D) node.
    ///
    /// **Panics** if x is not 2-D or `groups` is not for its rows.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::{ops::fusion_penalty::RowGroups, Tape};
    /// // Group 0: rows 0 and 2, centroid (1, 0); group 1: row 1 alone.
    /// let groups = RowGroups::new(&[0, 1, 0], 2);
    /// let mut t = Tape::<f64>::new();
    /// let x = t.input(array![[0.0, 0.0], [5.0, 5.0], [2.0, 0.0]].into_dyn());
    /// let p = t.fusion_penalty(x, &groups);
    /// assert_eq!(t.scalar(p), (1.0 + 0.0 + 1.0) / 3.0);
    /// let g = t.backward(p);
    /// // u = (−1, 0), 0, (1, 0); their group mean is 0.
    /// let want = array![[-1.0, 0.0], [0.0, 0.0], [1.0, 0.0]] / 3.0;
    /// assert_eq!(g.input(x).unwrap(), &want.into_dyn());
    /// ```
    #[track_caller]
    pub fn fusion_penalty(&mut self, x: Var, groups: &'p RowGroups) -> Var {
        let (p, norms) = fusion_penalty_forward_stored(self.stored_value(x), groups);
        self.push_op_with(arr0(p).into_dyn(), &[x], || FusionPenalty {
            x,
            groups,
            norms: norms.to_vec(),
        })
    }
}

mod blocks;
mod row_grads;
pub use blocks::{FusionBlock, FusionBlocks, FusionLayout};
pub use row_grads::{FusionRowGrads, fusion_penalty_forward_row_grads};

#[cfg(test)]
mod tests;
