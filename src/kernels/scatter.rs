//! Coalescing a scatter-add into a row-sparse gradient.
//!
//! Given contributions `(ids[k], values[k])`, the gradient of row `r` is
//! `Σ_{k : ids[k] = r} values[k]`, summed **in increasing k**. Fixing the
//! order makes the result identical bit for bit whatever the number of
//! threads: the kernel sorts positions by id to find the unique rows, cuts
//! them into ranges of about equal contribution counts, and gives each range
//! to one task, which walks its contributions in position order (so each
//! row still adds its contributions in increasing k, and the sources are
//! read front to back). No V × H dense buffer is ever touched.
//!
//! [`coalesce_sources`] reads the contributions where they already are (rows
//! of the output gradient routed to one split, or a gradient `c·R` never
//! materialised) instead of a stacked copy; [`coalesce_rows`] is its
//! one-array form.

use std::mem::MaybeUninit;

use ndarray::{Array2, ArrayView2};
use rayon::prelude::*;

use super::Real;
use super::pool::Pool;

/// What coalescing returns: the sorted unique rows that received a
/// contribution and the sum of each one's contributions,
/// `values[i] = Σ_{k : ids[k] = rows[i]} values_k` (`(rows.len(), width)`).
/// A row-sparse gradient is built from it with the number of rows of its
/// table ([`RowSparse::from_coalesced`](crate::param::RowSparse::from_coalesced)).
#[derive(Clone, Debug, PartialEq)]
pub struct Coalesced<T> {
    /// The sorted unique rows that received a contribution.
    pub rows: Vec<usize>,
    /// One summed row per entry of `rows`: (rows.len(), width).
    pub values: Array2<T>,
}

/// Sorted unique rows and their summed gradients (the fast kernel).
///
/// ids: (n), values: (n, width), every id < n_rows.
///
/// **Panics** if the lengths differ or an id is ≥ n_rows.
#[track_caller]
pub fn coalesce_rows<T: Real>(
    n_rows: usize,
    ids: &[usize],
    values: ArrayView2<'_, T>,
) -> Coalesced<T> {
    assert_eq!(
        ids.len(),
        values.nrows(),
        "coalesce_rows: {} ids for {} rows",
        ids.len(),
        values.nrows()
    );
    coalesce_sources(n_rows, values.ncols(), ids, &[RowSource::all(values)])
}

/// Where contributions are read from: rows of a 2-D array, all of them in
/// order or the ones listed, each optionally times a scalar. This lets a
/// backward pass hand over `∂out`'s rows of one split (`rows`), or a
/// gradient known to be `c·R` (`scale`), without copying them out first.
///
/// The rows may be kept in half precision (`S` = `half::bf16` or
/// `half::f16` for `T` = `f32`): each is widened (exactly) as it is added,
/// so the sums are those of the widened rows, bit for bit.
#[derive(Clone, Debug)]
pub struct RowSource<'a, T, S = T> {
    /// The array the rows are read from.
    pub values: ArrayView2<'a, S>,
    /// The rows of `values` in contribution order; `None`: every row.
    pub rows: Option<&'a [usize]>,
    /// Each row times this when given.
    pub scale: Option<T>,
}

/// An element type contributions can be read as, for sums in `T`: `T`
/// itself, or a half-precision type widened to `f32`.
pub trait SourceElem<T: Real>: Copy + Send + Sync + 'static {
    /// `dst[i] += scale·src[i]` (`src[i]` without a scale), prefetching
    /// `next`, the row summed after this one.
    fn add_row(dst: &mut [T], src: &[Self], scale: Option<T>, next: Option<&[Self]>);
    /// `*d += scale·x` for one element.
    fn add_one(d: &mut T, x: Self, scale: Option<T>);
}

impl<T: Real> SourceElem<T> for T {
    #[inline(always)]
    fn add_row(dst: &mut [T], src: &[T], scale: Option<T>, next: Option<&[T]>) {
        match scale {
            None => add_row(dst, src, next, |x| x),
            Some(c) => add_row(dst, src, next, |x| c * x),
        }
    }
    #[inline(always)]
    fn add_one(d: &mut T, x: T, scale: Option<T>) {
        *d += scale.map_or(x, |c| c * x);
    }
}

macro_rules! half_source {
    ($h:ty) => {
        impl<T: Real> SourceElem<T> for $h {
            fn add_row(dst: &mut [T], src: &[$h], scale: Option<T>, next: Option<&[$h]>) {
                const STEP: usize = 256;
                for (c, (d, s)) in dst.chunks_mut(STEP).zip(src.chunks(STEP)).enumerate() {
                    if let Some(n) = next {
                        // The same 512 bytes of the next row: eight lines.
                        for line in 0..STEP / 32 {
                            prefetch(n.as_ptr().wrapping_add(c * STEP + line * 32));
                        }
                    }
                    T::add_widened(s, d, scale);
                }
            }
            fn add_one(d: &mut T, x: $h, scale: Option<T>) {
                let x = T::from_f64(x.to_f64());
                *d += scale.map_or(x, |c| c * x);
            }
        }
    };
}

half_source!(half::bf16);
half_source!(half::f16);

impl<'a, T: Real, S> RowSource<'a, T, S> {
    /// Every row of `values` in order, unscaled.
    pub fn all(values: ArrayView2<'a, S>) -> Self {
        RowSource {
            values,
            rows: None,
            scale: None,
        }
    }

    /// Number of contributions.
    pub fn len(&self) -> usize {
        self.rows.map_or(self.values.nrows(), <[usize]>::len)
    }

    /// Whether it has no contribution.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// [`coalesce_rows`] over contributions read from several sources in turn:
/// contribution k is the k-th row listed across `sources`, `ids[k]` its
/// destination row. The sum of each row is in increasing k, as in
/// [`coalesce_rows`], and a scaled contribution adds `scale·row`.
///
/// **Panics** if the sources do not hold `ids.len()` rows of `width`, a
/// listed row is out of range, or an id is ≥ n_rows.
#[track_caller]
pub fn coalesce_sources<T: Real>(
    n_rows: usize,
    width: usize,
    ids: &[usize],
    sources: &[RowSource<'_, T>],
) -> Coalesced<T> {
    coalesce_sources_in(&Pool::new(), n_rows, width, ids, sources)
}

/// [`coalesce_sources`] writing its rows into a buffer from `pool`.
///
/// **Panics** as [`coalesce_sources`].
#[track_caller]
pub fn coalesce_sources_in<T: Real, S: SourceElem<T>>(
    pool: &Pool<T>,
    n_rows: usize,
    width: usize,
    ids: &[usize],
    sources: &[RowSource<'_, T, S>],
) -> Coalesced<T> {
    Coalescing::new(n_rows, width, ids, sources).coalesce_in(pool)
}

impl<T: Real, S: SourceElem<T>> Coalescing<'_, '_, T, S> {
    /// The unique rows cut into ranges of about equal contribution
    /// counts, one task each: `cuts[q]..cuts[q + 1]`.
    fn cuts(&self) -> Vec<usize> {
        let (starts, n_unique, n) = (&self.starts, self.rows.len(), self.order.len());
        let n_parts = if n * self.width >= super::PAR_MIN_ELEMS {
            4 * rayon::current_num_threads()
        } else {
            1
        };
        let mut cuts = vec![0usize];
        let mut seen = 0;
        for j in 0..n_unique.saturating_sub(1) {
            seen += starts[j + 1] - starts[j];
            if seen * n_parts >= n * cuts.len() {
                cuts.push(j + 1);
            }
        }
        cuts.push(n_unique);
        cuts
    }

    /// Whether the rows a task of [`Self::coalesce_in`] sums into stay in
    /// its core's cache, so that it walks its contributions in position
    /// order (the sources read front to back); past that it walks them row
    /// by row, as [`Self::sum_row`] does.
    pub fn sums_in_cache(&self) -> bool {
        self.parts_in_cache(&self.cuts())
    }

    /// [`Self::sums_in_cache`] for the tasks `cuts` ([`Self::cuts`]).
    fn parts_in_cache(&self, cuts: &[usize]) -> bool {
        let part_bytes =
            (self.rows.len() / (cuts.len() - 1).max(1)).saturating_mul(self.width * size_of::<T>());
        part_bytes <= CACHED_ROWS_BYTES
    }

    /// Every row summed, in parallel: [`coalesce_sources_in`] of the
    /// plan, its rows in a buffer from `pool`.
    pub fn coalesce_in(&self, pool: &Pool<T>) -> Coalesced<T> {
        let plan = self;
        let (order, starts, width) = (&plan.order, &plan.starts, plan.width);
        let n_unique = plan.rows.len();
        // Each row is zeroed when its first contribution arrives (in cache,
        // just before it is added), so the buffer is written once.
        let mut out = pool.uninit_2d((n_unique, width));
        if width > 0 && n_unique > 0 {
            // slot[k]: the unique row that contribution k adds into.
            let mut slot = vec![0u32; order.len()];
            for j in 0..n_unique {
                for &k in &order[starts[j]..starts[j + 1]] {
                    slot[k as usize] = j as u32;
                }
            }
            // The unique rows cut into ranges of about equal contribution
            // counts, one task each. Every row of the result sums its
            // contributions in increasing k whatever the cut and whichever of
            // the two walks below a task takes, so neither changes a bit.
            let cuts = plan.cuts();
            // A task's contributions, walked in one of two orders. While the
            // rows a task sums into stay in its core's cache, in position
            // order: the sources are read front to back. Past that, row by
            // row (each row's contributions in increasing k, `order`'s own
            // order): a row is summed in cache and written once, where the
            // position order would fetch and write it back from memory for
            // each of its contributions (`embed_full`'s backward: 1,600 rows
            // of 4 KiB, 0.68× the time in bf16, 0.89× in f32).
            let mine: Vec<Vec<u32>> = if plan.parts_in_cache(&cuts) {
                let mut part_of = vec![0u32; n_unique];
                for (q, w) in cuts.windows(2).enumerate() {
                    part_of[w[0]..w[1]].fill(q as u32);
                }
                let mut mine = vec![Vec::new(); cuts.len() - 1];
                for (k, &j) in slot.iter().enumerate() {
                    mine[part_of[j as usize] as usize].push(k as u32);
                }
                mine
            } else {
                cuts.windows(2)
                    .map(|w| order[starts[w[0]]..starts[w[1]]].to_vec())
                    .collect()
            };
            let mut parts: Vec<(usize, &mut [MaybeUninit<T>])> = Vec::with_capacity(mine.len());
            let mut rest = out.as_slice_mut().expect("fresh array is contiguous");
            for w in cuts.windows(2) {
                let (head, tail) = rest.split_at_mut((w[1] - w[0]) * width);
                parts.push((w[0], head));
                rest = tail;
            }
            let sum_part = |((j0, dst), ks): ((usize, &mut [MaybeUninit<T>]), Vec<u32>)| {
                for (p, &k) in ks.iter().enumerate() {
                    let j = slot[k as usize] as usize;
                    let dst = &mut dst[(j - j0) * width..(j - j0 + 1) * width];
                    if order[starts[j]] == k {
                        // Row j's first contribution: its row starts at zero.
                        dst.fill(MaybeUninit::new(T::zero()));
                    }
                    // SAFETY: the row was written (zeros) at its first
                    // contribution, which comes first in position order, and
                    // `MaybeUninit<T>` has `T`'s layout.
                    let dst: &mut [T] = unsafe { &mut *(dst as *mut [MaybeUninit<T>] as *mut [T]) };
                    // Rows are often one page each, where the hardware
                    // prefetcher starts over: ask for the next row while this
                    // one is summed.
                    let next = ks.get(p + 1).and_then(|&k| plan.row_slice(k));
                    plan.add(dst, k, next);
                }
            };
            if parts.len() > 1 {
                parts.into_par_iter().zip(mine).for_each(sum_part);
            } else {
                parts.into_iter().zip(mine).for_each(sum_part);
            }
        }
        // SAFETY: every unique row has at least one contribution, whose task
        // wrote the row (zeros, then its sums); with width 0 there is nothing.
        let values = unsafe { out.assume_init() };
        Coalesced {
            rows: plan.rows.clone(),
            values,
        }
    }
}

/// A coalescing prepared but not summed: the contributions ordered by
/// destination row, and the unique rows ([`Coalescing::rows`]), whose sums
/// [`Coalescing::sum_row`] forms one at a time, each in increasing k (the
/// bits of [`coalesce_sources`]'s row). It is a
/// [`SparseRowGradient`](crate::param::SparseRowGradient), so an optimiser
/// can update each row just after it is summed, in cache
/// ([`Optimizer::update_sparse_by_rows`](crate::optim::Optimizer::update_sparse_by_rows)),
/// and the sums are never stored together.
///
/// ```
/// use ndarray::array;
/// use splitgrad::kernels::scatter::{Coalescing, RowSource, coalesce_rows};
/// let values = array![[1.0f32, 2.0], [3.0, 4.0], [5.0, 6.0]];
/// let ids = [4, 1, 4];
/// let sources = [RowSource::all(values.view())];
/// let plan = Coalescing::new(6, 2, &ids, &sources);
/// assert_eq!(plan.rows(), &[1, 4]);
/// let mut row = [0.0f32; 2];
/// plan.sum_row(1, &mut row);
/// assert_eq!(row, [6.0, 8.0]);
/// assert_eq!(coalesce_rows(6, &ids, values.view()).values.row(1).to_vec(), row);
/// ```
#[derive(Debug)]
pub struct Coalescing<'s, 'a, T, S = T> {
    n_rows: usize,
    width: usize,
    sources: &'s [RowSource<'a, T, S>],
    /// Each source's values as one slice, where they are contiguous.
    flat: Vec<Option<&'a [S]>>,
    /// Contribution k → (source, row of its values).
    at: Vec<(u32, u32)>,
    /// The contributions in increasing id, equal ids in increasing k.
    order: Vec<u32>,
    /// `order[starts[j]..starts[j + 1]]` are the j-th unique row's.
    starts: Vec<usize>,
    /// The sorted unique rows.
    rows: Vec<usize>,
}

impl<'s, 'a, T: Real, S: SourceElem<T>> Coalescing<'s, 'a, T, S> {
    /// The plan of [`coalesce_sources`] for the same arguments.
    ///
    /// **Panics** as [`coalesce_sources`].
    #[track_caller]
    pub fn new(
        n_rows: usize,
        width: usize,
        ids: &[usize],
        sources: &'s [RowSource<'a, T, S>],
    ) -> Self {
        let total: usize = sources.iter().map(RowSource::len).sum();
        assert_eq!(
            ids.len(),
            total,
            "coalesce_sources: {} ids for {total} rows",
            ids.len()
        );
        if let Some(&bad) = ids.iter().find(|&&i| i >= n_rows) {
            panic!("coalesce_rows: id {bad} is out of range 0..{n_rows}");
        }
        assert!(
            ids.len() <= u32::MAX as usize,
            "coalesce_rows: more than 2^32 contributions"
        );
        let mut at: Vec<(u32, u32)> = Vec::with_capacity(ids.len());
        for (s, src) in sources.iter().enumerate() {
            assert_eq!(
                src.values.ncols(),
                width,
                "coalesce_sources: source {s} has width {}, expected {width}",
                src.values.ncols()
            );
            let n = src.values.nrows();
            match src.rows {
                Some(rows) => {
                    if let Some(&bad) = rows.iter().find(|&&r| r >= n) {
                        panic!("coalesce_sources: row {bad} of source {s} is out of range 0..{n}");
                    }
                    at.extend(rows.iter().map(|&r| (s as u32, r as u32)));
                }
                None => at.extend((0..n).map(|r| (s as u32, r as u32))),
            }
        }
        let order = order_by_id(ids, n_rows);
        let mut starts = Vec::with_capacity(ids.len() + 1);
        for (p, &k) in order.iter().enumerate() {
            if p == 0 || ids[k as usize] != ids[order[p - 1] as usize] {
                starts.push(p);
            }
        }
        starts.push(order.len());
        let rows = starts[..starts.len() - 1]
            .iter()
            .map(|&p| ids[order[p] as usize])
            .collect();
        // Contiguous source rows are summed as slices (the loop
        // vectorises); other layouts go through ndarray's row views.
        let flat = sources.iter().map(|s| s.values.to_slice()).collect();
        Coalescing {
            n_rows,
            width,
            sources,
            flat,
            at,
            order,
            starts,
            rows,
        }
    }

    /// The sorted unique rows that receive a contribution.
    pub fn rows(&self) -> &[usize] {
        &self.rows
    }

    /// The rows of the table the contributions go to.
    pub fn n_rows(&self) -> usize {
        self.n_rows
    }

    /// The contiguous row of contribution k, if its source is contiguous.
    fn row_slice(&self, k: u32) -> Option<&'a [S]> {
        self.cols_slice(k, 0..self.width)
    }

    /// Columns `cols` of the contiguous row of contribution k, if its
    /// source is contiguous.
    fn cols_slice(&self, k: u32, cols: std::ops::Range<usize>) -> Option<&'a [S]> {
        let (s, r) = self.at[k as usize];
        let at = r as usize * self.width;
        self.flat[s as usize].map(|v| &v[at + cols.start..at + cols.end])
    }

    /// Adds contribution k into `dst` (a row of the sums), fetching `next`
    /// (the row added after it) meanwhile.
    fn add(&self, dst: &mut [T], k: u32, next: Option<&[S]>) {
        self.add_cols(dst, k, 0..self.width, next)
    }

    /// Adds columns `cols` of contribution k into `dst` (those columns of
    /// a row of the sums), fetching `next` meanwhile.
    fn add_cols(&self, dst: &mut [T], k: u32, cols: std::ops::Range<usize>, next: Option<&[S]>) {
        let (s, r) = self.at[k as usize];
        let src = &self.sources[s as usize];
        match self.cols_slice(k, cols.clone()) {
            Some(v) => S::add_row(dst, v, src.scale, next),
            None => {
                let row = src.values.row(r as usize);
                for (d, &x) in dst.iter_mut().zip(row.iter().skip(cols.start)) {
                    S::add_one(d, x, src.scale);
                }
            }
        }
    }

    /// The number of contributions to `rows()[j]`.
    ///
    /// **Panics** if j is out of range.
    pub fn contributions(&self, j: usize) -> usize {
        self.starts[j + 1] - self.starts[j]
    }

    /// The sum of the contributions to `rows()[j]` into `dst` (a row of
    /// `width`, every element written): zeros, then each contribution
    /// added in increasing k. Fetches the first contribution of the next
    /// row while it adds its last.
    ///
    /// **Panics** if j is out of range or `dst` is not a row long.
    #[track_caller]
    pub fn sum_row(&self, j: usize, dst: &mut [T]) {
        assert_eq!(
            dst.len(),
            self.width,
            "Coalescing::sum_row: a row of {}",
            self.width
        );
        self.sum_cols(j, 0..self.width, dst)
    }

    /// Columns `cols` of [`Self::sum_row`] into `dst` (`cols.len()`
    /// elements): each element's sum is the whole row's, bit for bit.
    ///
    /// **Panics** if j is out of range, `cols` is not within the row or
    /// `dst` is not as long as `cols`.
    #[track_caller]
    pub fn sum_cols(&self, j: usize, cols: std::ops::Range<usize>, dst: &mut [T]) {
        assert!(
            cols.start <= cols.end && cols.end <= self.width && dst.len() == cols.len(),
            "Coalescing::sum_cols: columns {cols:?} of a row of {} into {} elements",
            self.width,
            dst.len()
        );
        dst.fill(T::zero());
        let ks = &self.order[self.starts[j]..self.starts[j + 1]];
        let after = self
            .starts
            .get(j + 2)
            .map(|_| self.order[self.starts[j + 1]]);
        for (p, &k) in ks.iter().enumerate() {
            let next = ks.get(p + 1).copied().or(after);
            let next = next.and_then(|k| self.cols_slice(k, cols.clone()));
            self.add_cols(dst, k, cols.clone(), next);
        }
    }
}

/// The bytes of result rows a task of [`coalesce_sources_in`] sums into
/// up to which it walks its contributions in position order (they stay in
/// a core's cache: half of Zen 3's 512 KiB L2), and row by row past it.
const CACHED_ROWS_BYTES: usize = 256 << 10;

/// The positions `0..ids.len()` in increasing id, equal ids in increasing
/// position (a stable order): an LSD radix sort on 8-bit digits, one pass
/// for each byte of `n_rows − 1`, every pass O(n + 256).
fn order_by_id(ids: &[usize], n_rows: usize) -> Vec<u32> {
    let bits = usize::BITS - n_rows.saturating_sub(1).leading_zeros();
    let mut order: Vec<u32> = (0..ids.len() as u32).collect();
    let mut next = vec![0u32; ids.len()];
    for shift in (0..bits).step_by(8) {
        let digit = |k: u32| (ids[k as usize] >> shift) & 0xFF;
        let mut at = [0usize; 256];
        for &k in &order {
            at[digit(k)] += 1;
        }
        let mut sum = 0;
        for a in at.iter_mut() {
            (*a, sum) = (sum, sum + *a);
        }
        for &k in &order {
            let d = digit(k);
            next[at[d]] = k;
            at[d] += 1;
        }
        std::mem::swap(&mut order, &mut next);
    }
    order
}

/// `dst[i] += f(src[i])`, one cache line at a time, prefetching the same
/// line of `next` (the row summed after this one).
#[inline(always)]
fn add_row<T: Real>(dst: &mut [T], src: &[T], next: Option<&[T]>, f: impl Fn(T) -> T) {
    let line = (64 / std::mem::size_of::<T>()).max(1);
    for (c, (d, s)) in dst.chunks_mut(line).zip(src.chunks(line)).enumerate() {
        if let Some(n) = next {
            prefetch(n.as_ptr().wrapping_add(c * line));
        }
        for (d, &x) in d.iter_mut().zip(s) {
            *d += f(x);
        }
    }
}

/// Hints to load every cache line of the `bytes` bytes from address `at`
/// (an address, not a reference: the span may be another task's row, and
/// a prefetch reads nothing the program sees and never faults).
#[inline]
pub(crate) fn prefetch_span(at: usize, bytes: usize) {
    for off in (0..bytes).step_by(64) {
        prefetch(at.wrapping_add(off) as *const u8);
    }
}

/// A hint to load the cache line at `p` (no effect elsewhere than x86-64).
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and reads nothing the program sees,
    // whatever the address; SSE is part of x86-64.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// The naive twin of [`coalesce_rows`]: one pass in position order into a
/// map from row to sum. Same result, bit for bit.
pub fn coalesce_rows_naive<T: Real>(
    n_rows: usize,
    ids: &[usize],
    values: ArrayView2<'_, T>,
) -> Coalesced<T> {
    let mut acc: std::collections::BTreeMap<usize, Vec<T>> = Default::default();
    for (k, &id) in ids.iter().enumerate() {
        assert!(
            id < n_rows,
            "coalesce_rows_naive: id {id} is out of range 0..{n_rows}"
        );
        let row = acc
            .entry(id)
            .or_insert_with(|| vec![T::zero(); values.ncols()]);
        for (d, &s) in row.iter_mut().zip(values.row(k).iter()) {
            *d += s;
        }
    }
    let rows: Vec<usize> = acc.keys().copied().collect();
    let mut out = Array2::<T>::zeros((rows.len(), values.ncols()));
    for (mut o, v) in out.outer_iter_mut().zip(acc.values()) {
        o.assign(&ndarray::ArrayView1::from(v.as_slice()));
    }
    Coalesced { rows, values: out }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn hand_case() {
        let v = array![[1.0f64, 1.0], [2.0, 2.0], [4.0, 4.0], [8.0, 8.0]];
        let rs = coalesce_rows(10, &[7, 2, 7, 7], v.view());
        assert_eq!(rs.rows, vec![2, 7]);
        assert_eq!(rs.values, array![[2.0, 2.0], [13.0, 13.0]]);
        assert_eq!(rs, coalesce_rows_naive(10, &[7, 2, 7, 7], v.view()));
    }

    #[test]
    fn the_radix_order_is_the_stable_sort() {
        let mut rng = crate::rng::Rng::new(3);
        for n_rows in [1usize, 2, 255, 256, 257, 65_536, 70_000, 1 << 25] {
            for n in [0usize, 1, 2, 100, 5000] {
                let ids: Vec<usize> = (0..n).map(|_| rng.below(n_rows as u64) as usize).collect();
                let mut want: Vec<u32> = (0..n as u32).collect();
                want.sort_by_key(|&k| ids[k as usize]);
                assert_eq!(order_by_id(&ids, n_rows), want, "{n_rows} rows, {n} ids");
            }
        }
    }

    #[test]
    fn empty() {
        let v = Array2::<f32>::zeros((0, 3));
        let rs = coalesce_rows(4, &[], v.view());
        assert!(rs.rows.is_empty());
        assert_eq!(rs.values.dim(), (0, 3));
    }
}
