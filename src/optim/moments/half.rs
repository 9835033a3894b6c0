//! The Adam family's update when a parameter or its moments are kept in
//! half precision: runs widened (fused in registers for `f32`), the rule's
//! own element update applied, and each half-precision array narrowed back
//! with its stochastic-rounding key at the element's flat index.

use std::ops::Range;
use std::sync::Arc;

use ndarray::ArrayD;
use rayon::prelude::*;

use super::blocks::walk_blocks;
use super::{CHUNK, Moments, Rule, apply_zip};
use crate::kernels::PAR_MIN_ELEMS;
use crate::kernels::half::{
    FusedArray, HALF_LANES, HalfFloat, LANES, LaneRule, SrKey, narrow_stochastic_at,
};
use crate::kernels::scatter::prefetch_span;
use crate::param::{
    BlockGradient, Part, Rounding, RowForm, RowGradient, SparseRowGradient, Stored, StoredMut,
    WIDEN_CHUNK, update_widened_in,
};
use crate::{ParamGrad, Parameter, Real};

/// The stochastic-rounding keys of a parameter's value and of its two
/// moments, and where its elements' random bits are drawn, as [`keys`]
/// makes them.
#[derive(Clone, Debug)]
pub(super) struct Keys {
    /// The keys (`None`: to nearest).
    pub keys: [Option<SrKey>; 3],
    /// The parameter's rounding rows
    /// ([`Parameter::set_rounding_rows`]) and its row width, when they are
    /// not its own and some array rounds stochastically.
    rows: Option<(Arc<[u64]>, usize)>,
}

impl Keys {
    /// The flat index whose random bits element `col` of row `row` (of
    /// `width` elements) draws.
    #[inline]
    fn index(&self, row: usize, width: usize, col: usize) -> u64 {
        match &self.rows {
            Some((rows, _)) => rows[row] * width as u64 + col as u64,
            None => (row * width + col) as u64,
        }
    }

    /// The rounding rows and the row width, when the draws follow them.
    fn remapped(&self) -> Option<(&[u64], usize)> {
        self.rows.as_ref().map(|(r, w)| (&r[..], *w))
    }
}

/// The stochastic-rounding keys (`None`: to nearest) of `param`'s value
/// and of its two moments at optimiser step `step`: the arrays are named
/// `name`, `name.exp_avg` and `name.exp_avg_sq`; each element draws at its
/// flat index, or at its row's place among the parameter's rounding rows.
pub(super) fn keys<T: Real>(rounding: Rounding, step: u64, param: &Parameter<T>) -> Keys {
    let name = param.name();
    let keys = [
        rounding.key(step, name),
        rounding.key(step, &format!("{name}.exp_avg")),
        rounding.key(step, &format!("{name}.exp_avg_sq")),
    ];
    let rows = match param.rounding_rows_shared() {
        Some(rows) if keys.iter().any(Option::is_some) => {
            Some((rows, param.shape()[1..].iter().product()))
        }
        _ => None,
    };
    Keys { keys, rows }
}

/// The parameter's value and its two moments, flat, as they are kept.
pub(super) fn arrays<'a, T: Real>(
    param: &'a mut Parameter<T>,
    slot: &'a mut Moments<T>,
) -> [StoredMut<'a, T>; 3] {
    [
        param.stored_mut().flat_mut(),
        slot.exp_avg.flat_mut(),
        slot.exp_avg_sq.flat_mut(),
    ]
}

/// The three arrays of an update as [`update_widened_in`] takes them.
fn parts<'a, T>(
    [p, m, v]: [StoredMut<'a, T>; 3],
    [kp, km, kv]: [Option<SrKey>; 3],
) -> [Part<'a, T>; 3] {
    [
        Part { elems: p, key: kp },
        Part { elems: m, key: km },
        Part { elems: v, key: kv },
    ]
}

/// Writes `full` (the array's shape) into `dst`, narrowed with `key` when
/// `dst` is kept in half precision: at global index 0, or row by row at
/// each row's place among the rounding rows (`remapped`).
fn store<T: Real>(
    dst: &mut Stored<T>,
    full: &ArrayD<T>,
    key: Option<SrKey>,
    remapped: Option<(&[u64], usize)>,
) {
    let src = full.as_standard_layout();
    let s = src.as_slice().expect("standard layout is contiguous");
    match dst.flat_mut() {
        StoredMut::Full(d) => d.copy_from_slice(s),
        StoredMut::BF16(d) => narrow_rows(s, d, key, remapped),
        StoredMut::F16(d) => narrow_rows(s, d, key, remapped),
    }
}

/// `src` narrowed into `dst` with `key`: at global index 0, or row by row
/// at each row's place among the rounding rows (`remapped`).
fn narrow_rows<T: Real, H: HalfFloat>(
    src: &[T],
    dst: &mut [H],
    key: Option<SrKey>,
    remapped: Option<(&[u64], usize)>,
) {
    match (key, remapped) {
        (Some(k), Some((rows, width))) if width > 0 => {
            let chunks = src.chunks(width).zip(dst.chunks_mut(width));
            for ((s, d), &row) in chunks.zip(rows) {
                T::narrow_half(s, d, Some((k, row * width as u64)));
            }
        }
        _ => T::narrow_half(src, dst, key.map(|k| (k, 0))),
    }
}

/// The serial reference of [`update_half`]: the parameter and its moments
/// widened whole, the rule's naive update in `T`, and every element
/// narrowed back with its key at its flat index. (An element the update
/// did not touch is representable, so it narrows back to itself.)
pub(super) fn update_half_naive<T: Real, R: Rule<T>>(
    rule: &R,
    param: &mut Parameter<T>,
    slot: &mut Moments<T>,
    grad: &ParamGrad<T>,
    keys: Keys,
) {
    let [kp, km, kv] = keys.keys;
    let remapped = keys.remapped();
    let mut p = param.widened().into_owned();
    let mut m = slot.exp_avg.widened().into_owned();
    let mut v = slot.exp_avg_sq.widened().into_owned();
    let pmv = [p.view_mut(), m.view_mut(), v.view_mut()];
    match grad {
        ParamGrad::Dense(g) => apply_zip(rule, pmv, g.view()),
        ParamGrad::RowSparse(s) => rule.apply_sparse_naive(pmv, s),
    }
    store(param.stored_mut(), &p, kp, remapped);
    store(&mut slot.exp_avg, &m, km, remapped);
    store(&mut slot.exp_avg_sq, &v, kv, remapped);
}

/// One update when the parameter or its moments are kept in half
/// precision: the rule's own element update in `T` on widened runs of
/// [`WIDEN_CHUNK`](crate::param::WIDEN_CHUNK) elements, each half-precision
/// store narrowed with its key at the element's flat index — so the result
/// is the same for any number of threads, and equals
/// [`update_half_naive`]'s bit for bit. A lazy rule's row-sparse gradient
/// touches only its rows; a dense rule's is written out first.
pub(super) fn update_half<T: Real, R: Rule<T>>(
    rule: &R,
    param: &mut Parameter<T>,
    slot: &mut Moments<T>,
    grad: &ParamGrad<T>,
    keys: Keys,
) {
    let pmv = arrays(param, slot);
    match grad {
        ParamGrad::Dense(g) => {
            let g = g.as_standard_layout();
            dense_half(rule, pmv, g.as_slice().expect("standard layout"), &keys);
        }
        ParamGrad::RowSparse(s) if R::LAZY => {
            let values = s.values.as_standard_layout();
            let values = values.as_slice().expect("standard layout is contiguous");
            let width = s.values.ncols();
            rows_half(rule, pmv, &s.rows, width, &Stacked(values, width), &keys)
        }
        ParamGrad::RowSparse(s) => {
            let g = s.to_dense();
            dense_half(rule, pmv, g.as_slice().expect("a fresh array"), &keys);
        }
    }
}

/// The widening buffers of one task.
type Bufs<T> = [[T; WIDEN_CHUNK]; 3];

/// A run of a parameter and of its two moments.
type Triple<'a, T> = ((StoredMut<'a, T>, StoredMut<'a, T>), StoredMut<'a, T>);

/// One run of elements of a parameter and its two moments, `first` the
/// flat index of its first element: for `f32`, fused in registers
/// ([`Real::update_fused`]: each array widened, the rule applied and each
/// array narrowed, [`LANES`] elements at a time); for `f64`, widened into
/// `bufs` a [`WIDEN_CHUNK`] at a time. The same bits either way as the
/// three passes.
fn update_run<T: Real, R: Rule<T>>(
    rule: &R,
    [p, m, v]: [Part<'_, T>; 3],
    g: &[T],
    first: u64,
    bufs: &mut Option<Box<Bufs<T>>>,
) {
    if T::FUSED {
        T::update_fused([fused(p), fused(m), fused(v)], [g], first, Given(rule));
    } else {
        let bufs = bufs.get_or_insert_with(|| Box::new([[T::zero(); WIDEN_CHUNK]; 3]));
        update_widened_in([p, m, v], first, bufs, |[p, m, v], off| {
            let n = p.len();
            rule.apply_run(p, m, v, Some(&g[off..off + n]));
        });
    }
}

/// A run as [`FusedArray`] takes it.
fn fused<T>(Part { elems, key }: Part<'_, T>) -> FusedArray<'_, T> {
    match elems {
        StoredMut::Full(s) => FusedArray::Full(s),
        StoredMut::BF16(s) => FusedArray::Bf16(s, key),
        StoredMut::F16(s) => FusedArray::F16(s, key),
    }
}

/// [`update_run`] of a row whose gradient is of `form`, computed in
/// registers from the parameter's lanes (`T` fused, [`Real::FUSED`]): `0`
/// for [`RowForm::Zero`], `k·(x − c) − s` for [`RowForm::Deviation`], the
/// bits [`RowGradient::write`] gives.
///
/// **Panics** for [`RowForm::Written`] (the caller writes those rows), and
/// if `T` is not fused.
fn update_formed<T: Real, R: Rule<T>>(
    rule: &R,
    [p, m, v]: [Part<'_, T>; 3],
    form: RowForm<'_, T>,
    first: u64,
) {
    let arrays = [fused(p), fused(m), fused(v)];
    match form {
        RowForm::Zero => T::update_fused(arrays, [], first, Zero(rule)),
        RowForm::Deviation { k, c, s } => {
            T::update_fused(arrays, [c, s], first, Deviation { rule, k })
        }
        RowForm::Written => unreachable!("a written row is updated from its buffer"),
    }
}

/// `rule` on every lane of a block, lane l's gradient `g(l, p[l])` from
/// the parameter's lane before the update. (One loop: a gradient formed
/// in a loop of its own first goes through the stack, measurably slower.)
#[inline(always)]
fn lanes<T: Real, R: Rule<T>, const L: usize>(
    rule: &R,
    [p, m, v]: [&mut [T; L]; 3],
    g: impl Fn(usize, T) -> T,
) {
    for l in 0..L {
        let g = g(l, p[l]);
        rule.apply(&mut p[l], &mut m[l], &mut v[l], g);
    }
}

/// The rule on a block whose gradient is the kernel's one input. (These
/// rules are types with `#[inline(always)]` methods, not closures, so
/// that the kernels compile them for their vector unit: a closure this
/// large may be left out of line, compiled for baseline x86-64.)
struct Given<'a, R>(&'a R);

impl<T: Real, R: Rule<T>> LaneRule<T, 3, 1> for Given<'_, R> {
    #[inline(always)]
    fn apply(&self, [p, m, v]: &mut [[T; LANES]; 3], [g]: &[[T; LANES]; 1]) {
        lanes(self.0, [p, m, v], |l, _| g[l]);
    }

    #[inline(always)]
    fn apply_half(&self, [p, m, v]: &mut [[T; HALF_LANES]; 3], [g]: &[[T; HALF_LANES]; 1]) {
        lanes(self.0, [p, m, v], |l, _| g[l]);
    }
}

/// The rule on a block of a zero gradient.
struct Zero<'a, R>(&'a R);

impl<T: Real, R: Rule<T>> LaneRule<T, 3, 0> for Zero<'_, R> {
    #[inline(always)]
    fn apply(&self, [p, m, v]: &mut [[T; LANES]; 3], _: &[[T; LANES]; 0]) {
        lanes(self.0, [p, m, v], |_, _| T::zero());
    }

    #[inline(always)]
    fn apply_half(&self, [p, m, v]: &mut [[T; HALF_LANES]; 3], _: &[[T; HALF_LANES]; 0]) {
        lanes(self.0, [p, m, v], |_, _| T::zero());
    }
}

/// The rule on a block of a [`RowForm::Deviation`] row, the inputs its
/// `c` and `s`: the gradient `k·(x − c) − s` from the parameter's lanes.
struct Deviation<'a, R, T> {
    rule: &'a R,
    k: T,
}

impl<T: Real, R: Rule<T>> LaneRule<T, 3, 2> for Deviation<'_, R, T> {
    #[inline(always)]
    fn apply(&self, [p, m, v]: &mut [[T; LANES]; 3], [c, s]: &[[T; LANES]; 2]) {
        let k = self.k;
        lanes(self.rule, [p, m, v], |l, x| k * (x - c[l]) - s[l]);
    }

    #[inline(always)]
    fn apply_half(&self, [p, m, v]: &mut [[T; HALF_LANES]; 3], [c, s]: &[[T; HALF_LANES]; 2]) {
        let k = self.k;
        lanes(self.rule, [p, m, v], |l, x| k * (x - c[l]) - s[l]);
    }
}

/// Rows narrower than this, when the draws follow rounding rows, are
/// updated [`CHUNK`] elements a task through widened buffers and narrowed
/// row by row ([`remapped_narrow_rows`]), not one fused run a row.
const NARROW_ROW: usize = 64;

/// Every element, in parallel tasks of [`CHUNK`] elements above
/// [`PAR_MIN_ELEMS`] (of a row each when the draws follow rounding rows:
/// a run draws at consecutive indices; narrow rows, [`NARROW_ROW`], a
/// chunk of them a task).
fn dense_half<T: Real, R: Rule<T>>(
    rule: &R,
    [p, m, v]: [StoredMut<'_, T>; 3],
    g: &[T],
    keys: &Keys,
) {
    let len = p.len();
    let chunk = match keys.remapped() {
        Some((_, 0)) => return,
        Some((rows, width)) if width < NARROW_ROW => {
            return remapped_narrow_rows(rule, [p, m, v], g, keys, rows, width);
        }
        Some((_, width)) => width,
        None => CHUNK,
    };
    let run = |b: &mut Option<Box<Bufs<T>>>, (i, ((p, m), v)): (usize, Triple<'_, T>)| {
        let at = i * chunk;
        let g = &g[at..at + p.len()];
        // (Run i is row i when the draws follow rounding rows.)
        let first = keys.index(i, chunk, 0);
        update_run(rule, parts([p, m, v], keys.keys), g, first, b);
    };
    in_chunks([p, m, v], chunk, len < PAR_MIN_ELEMS, 1, || None, run);
}

/// The three arrays cut into runs of `chunk` elements, side by side.
fn triples<'a, T: Real>(
    [p, m, v]: [StoredMut<'a, T>; 3],
    chunk: usize,
) -> impl Iterator<Item = Triple<'a, T>> {
    p.chunks(chunk)
        .into_iter()
        .zip(m.chunks(chunk))
        .zip(v.chunks(chunk))
}

/// `run` on each run of `chunk` elements of the three arrays (the i-th
/// run, from element `i·chunk`), with a scratch of its task made by
/// `scratch`: in order on this thread when `serial`, else in parallel,
/// at least `min_runs` runs a task.
fn in_chunks<'a, T: Real, S>(
    arrays: [StoredMut<'a, T>; 3],
    chunk: usize,
    serial: bool,
    min_runs: usize,
    scratch: impl Fn() -> S + Sync + Send,
    run: impl Fn(&mut S, (usize, Triple<'a, T>)) + Sync + Send,
) {
    let jobs = triples(arrays, chunk).enumerate();
    if serial {
        let mut s = scratch();
        jobs.for_each(|job| run(&mut s, job));
    } else {
        jobs.collect::<Vec<_>>()
            .into_par_iter()
            .with_min_len(min_runs)
            .for_each_init(scratch, run);
    }
}

/// [`dense_half`] of rows narrower than [`NARROW_ROW`] whose draws follow
/// rounding rows (a vector's elements, one row each): in tasks of whole
/// rows, about [`CHUNK`] elements, each array widened into a buffer of the
/// task, the rule's element update applied in `T` ([`Rule::apply_run`]:
/// the bits of every path), and each half-precision array narrowed back
/// row by row at the row's place. A fused run a row would pay a kernel's
/// setup for every element.
fn remapped_narrow_rows<T: Real, R: Rule<T>>(
    rule: &R,
    [p, m, v]: [StoredMut<'_, T>; 3],
    g: &[T],
    keys: &Keys,
    rows: &[u64],
    width: usize,
) {
    let chunk = (CHUNK / width).max(1) * width;
    let len = p.len();
    type Scratch<T> = ([Vec<T>; 3], Vec<f32>);
    let run = |(bufs, narrowed): &mut Scratch<T>, (i, ((p, m), v)): (usize, Triple<'_, T>)| {
        let at = i * chunk;
        let n = p.len();
        let mut arrays = [p, m, v];
        for (a, b) in arrays.iter().zip(bufs.iter_mut()) {
            b.resize(n, T::zero());
            a.kept().widen_into(b);
        }
        let [bp, bm, bv] = &mut *bufs;
        rule.apply_run(bp, bm, bv, Some(&g[at..at + n]));
        let mine = &rows[at / width..(at + n) / width];
        for ((a, b), key) in arrays.iter_mut().zip(bufs.iter()).zip(keys.keys) {
            match a {
                StoredMut::Full(d) => d.copy_from_slice(b),
                StoredMut::BF16(d) => narrow_at(b, d, key, narrowed, mine, width),
                StoredMut::F16(d) => narrow_at(b, d, key, narrowed, mine, width),
            }
        }
    };
    let scratch = || ([Vec::new(), Vec::new(), Vec::new()], Vec::new());
    in_chunks([p, m, v], chunk, len < PAR_MIN_ELEMS, 1, scratch, run);
}

/// `src`, rows of `width` elements, narrowed into `dst` with `key`, each
/// row at its place among the rounding rows `rows`
/// ([`narrow_stochastic_at`], through `f32` in `buf` as
/// [`Real::narrow_half`] goes), or to nearest without a key.
fn narrow_at<T: Real, H: HalfFloat>(
    src: &[T],
    dst: &mut [H],
    key: Option<SrKey>,
    buf: &mut Vec<f32>,
    rows: &[u64],
    width: usize,
) {
    let Some(key) = key else {
        return T::narrow_half(src, dst, None);
    };
    buf.clear();
    buf.extend(src.iter().map(|&x| x.to_f64() as f32));
    if width == 1 {
        // A vector's element is its row: no division.
        narrow_stochastic_at(buf, dst, key, |i| rows[i]);
    } else {
        let w = width as u64;
        narrow_stochastic_at(buf, dst, key, |i| rows[i / width] * w + (i % width) as u64);
    }
}

/// Elements at the head of the next touched row that a sparse update
/// fetches while it updates a row: as far as the fused kernel reaches ahead
/// within a row.
const ROW_HEAD_ELEMS: usize = 256;

/// Only the gradient's rows `rows`, in parallel over rows (batched to a
/// few thousand elements a task; a row much heavier to form than the
/// others in runs of columns, [`pieces`]), the j-th row's gradient from
/// `grads`.
pub(super) fn rows_half<T: Real, R: Rule<T>>(
    rule: &R,
    [p, m, v]: [StoredMut<'_, T>; 3],
    rows: &[usize],
    width: usize,
    grads: &impl SparseRows<T>,
    keys: &Keys,
) {
    if width == 0 || rows.is_empty() {
        return;
    }
    let bases = [&p, &m, &v].map(|a| a.address());
    let (runs, split) = pieces(rows.len(), width, grads);
    let [p, m, v] =
        [p, m, v].map(|a| cut_rows(a.pick_rows(width, rows), &runs, StoredMut::split_at));
    let jobs = p.into_iter().zip(m).zip(v).zip(&runs);
    type Job<'a, T> = (
        ((StoredMut<'a, T>, StoredMut<'a, T>), StoredMut<'a, T>),
        &'a (usize, Range<usize>),
    );
    type Scratch<T> = (Option<Box<Bufs<T>>>, Vec<T>);
    let run = |(b, g): &mut Scratch<T>, (((p, m), v), (j, cols)): Job<'_, T>| {
        // The head of the next row, which the kernel's own reach ahead
        // (into the memory after this row) does not fetch.
        if cols.end == width
            && let Some(&next) = rows.get(j + 1)
        {
            for &(at, bytes) in &bases {
                let head = (width * bytes).min(ROW_HEAD_ELEMS * bytes);
                prefetch_span(at.wrapping_add(next * width * bytes), head);
            }
        }
        let g = grads.cols(*j, cols.clone(), g);
        let first = keys.index(rows[*j], width, cols.start);
        update_run(rule, parts([p, m, v], keys.keys), g, first, b);
    };
    let scratch = || (None, Vec::new());
    if rows.len() * width < PAR_MIN_ELEMS {
        let mut s = scratch();
        jobs.for_each(|job| run(&mut s, job));
    } else {
        let min_len = if split { 1 } else { (4096 / width).max(1) };
        let jobs: Vec<_> = jobs.collect();
        jobs.into_par_iter()
            .with_min_len(min_len)
            .for_each_init(scratch, run);
    }
}

/// Columns of a row below which [`pieces`] does not cut it.
const MIN_RUN: usize = 256;

/// The runs of columns a row-sparse update by rows takes, `(j, columns)`
/// in order, and whether any row was cut: each row whole, but where rows
/// differ in weight, a row whose weight (+ 1 for its update) is more than
/// a quarter of a thread's share is cut into runs of about that share, of
/// at least [`MIN_RUN`] columns, each a multiple of 32 long (so a run
/// starts on a pair of bf16 elements). Elementwise sums and an
/// elementwise update give the same bits whatever the cut.
pub(in crate::optim) fn pieces<T>(
    n: usize,
    width: usize,
    grads: &impl SparseRows<T>,
) -> (Vec<(usize, Range<usize>)>, bool) {
    let weights: Vec<usize> = (0..n).map(|j| grads.weight(j).saturating_add(1)).collect();
    let uniform = weights.windows(2).all(|w| w[0] == w[1]);
    let total = weights.iter().fold(0usize, |a, &w| a.saturating_add(w));
    let share = (total / (4 * rayon::current_num_threads())).max(1);
    let most = (width / MIN_RUN).max(1);
    let mut out = Vec::with_capacity(n);
    let mut split = false;
    for (j, &w) in weights.iter().enumerate() {
        let k = if uniform {
            1
        } else {
            w.div_ceil(share).clamp(1, most)
        };
        let len = width.div_ceil(k).next_multiple_of(32).min(width).max(1);
        split |= len < width;
        let mut c = 0;
        while c < width {
            let e = (c + len).min(width);
            out.push((j, c..e));
            c = e;
        }
    }
    (out, split)
}

/// Whole rows (one per listed row, in order) cut into the runs of `runs`
/// (consecutive, in increasing columns within a row), by `split_at`.
pub(in crate::optim) fn cut_rows<X>(
    rows: Vec<X>,
    runs: &[(usize, Range<usize>)],
    split_at: impl Fn(X, usize) -> (X, X),
) -> Vec<X> {
    let mut out = Vec::with_capacity(runs.len());
    let mut rows = rows.into_iter().enumerate();
    let mut rest: Option<(usize, X)> = None;
    for (j, cols) in runs {
        if rest.as_ref().is_none_or(|(r, _)| r != j) {
            rest = rows.find(|(r, _)| r == j);
        }
        let (r, x) = rest.take().expect("a run of a listed row");
        let (head, tail) = split_at(x, cols.len());
        out.push(head);
        rest = Some((r, tail));
    }
    out
}

/// Where a row-sparse update finds the gradient of its j-th row: stored
/// rows ([`Stacked`]), or rows formed on demand into a buffer of the task
/// ([`Summed`]).
pub(in crate::optim) trait SparseRows<T>: Sync {
    /// Columns `cols` of the j-th row's gradient, `buf` the task's buffer.
    fn cols<'b>(&'b self, j: usize, cols: Range<usize>, buf: &'b mut Vec<T>) -> &'b [T];

    /// The work of forming the j-th row ([`SparseRowGradient::weight`]).
    fn weight(&self, j: usize) -> usize;
}

/// The rows of a row-sparse gradient's values, one after another (flat,
/// rows of the given width).
pub(in crate::optim) struct Stacked<'a, T>(pub &'a [T], pub usize);

impl<T: Real> SparseRows<T> for Stacked<'_, T> {
    fn cols<'b>(&'b self, j: usize, cols: Range<usize>, _: &'b mut Vec<T>) -> &'b [T] {
        let at = j * self.1;
        &self.0[at + cols.start..at + cols.end]
    }

    fn weight(&self, _: usize) -> usize {
        1
    }
}

/// The rows of a [`SparseRowGradient`], each run of columns written into
/// the task's buffer just before it is updated.
pub(in crate::optim) struct Summed<'a, T>(pub &'a dyn SparseRowGradient<T>);

impl<T: Real> SparseRows<T> for Summed<'_, T> {
    fn cols<'b>(&'b self, j: usize, cols: Range<usize>, buf: &'b mut Vec<T>) -> &'b [T] {
        buf.resize(cols.len(), T::zero());
        self.0.write_cols(j, cols, buf);
        buf
    }

    fn weight(&self, j: usize) -> usize {
        self.0.weight(j)
    }
}

/// The buffers of a task updating rows whose gradient is given row by
/// row: the row widened, its gradient, the widening buffers.
struct RowScratch<T> {
    x: Vec<T>,
    g: Vec<T>,
    bufs: Option<Box<Bufs<T>>>,
}

impl<T: Real> RowScratch<T> {
    fn new(width: usize) -> Self {
        RowScratch {
            x: vec![T::zero(); width],
            g: vec![T::zero(); width],
            bufs: None,
        }
    }
}

/// Row r of a parameter and its two moments (`row`) updated as
/// [`update_half`] updates it, its gradient from `grad`: computed in
/// registers from its form ([`update_formed`], `T` fused) or, a written
/// row (every row for a `T` not fused), into `s.g` from the row widened.
fn update_row<T: Real, R: Rule<T>>(
    rule: &R,
    s: &mut RowScratch<T>,
    (r, ((p, m), v)): (usize, Triple<'_, T>),
    width: usize,
    grad: &dyn RowGradient<T>,
    keys: &Keys,
) {
    let first = keys.index(r, width, 0);
    // Only a fused `T` computes a form on its lanes; otherwise (f64,
    // widened through buffers) every row is written.
    let form = if T::FUSED {
        grad.form(r)
    } else {
        RowForm::Written
    };
    if !matches!(form, RowForm::Written) {
        // A form of the wrong width panics in the kernel's check.
        update_formed(rule, parts([p, m, v], keys.keys), form, first);
        return;
    }
    let kept = p.kept();
    grad.write(r, kept.read(&mut s.x), &mut s.g);
    update_run(rule, parts([p, m, v], keys.keys), &s.g, first, &mut s.bufs);
}

/// The body of [`MomentTable::update_half_by_rows`](super::MomentTable::update_half_by_rows):
/// in parallel over rows of `width` elements, each row updated by
/// [`update_row`].
pub(super) fn by_rows<T: Real, R: Rule<T>>(
    rule: &R,
    param: &mut Parameter<T>,
    slot: &mut Moments<T>,
    width: usize,
    grad: &dyn RowGradient<T>,
    keys: Keys,
) {
    let len = param.shape().iter().product::<usize>();
    // Narrow rows batched so that a task has a few thousand elements.
    in_chunks(
        arrays(param, slot),
        width,
        len < PAR_MIN_ELEMS,
        (4096 / width).max(1),
        || RowScratch::new(width),
        |s, row| update_row(rule, s, row, width, grad, &keys),
    );
}

/// The body of [`MomentTable::update_half_by_blocks`](super::MomentTable::update_half_by_blocks):
/// in parallel over the gradient's blocks, each block formed from its
/// rows as they are kept, then its rows updated by [`update_row`] while
/// they are in cache.
///
/// **Panics** if the blocks are not a partition of the rows.
pub(super) fn by_blocks<T: Real, R: Rule<T>>(
    rule: &R,
    param: &mut Parameter<T>,
    slot: &mut Moments<T>,
    width: usize,
    grad: &dyn BlockGradient<T>,
    keys: Keys,
) {
    let pmv = arrays(param, slot);
    let (at, size) = pmv[0].address();
    let len = pmv[0].len();
    walk_blocks(
        triples(pmv, width).collect(),
        grad,
        Some((at, width * size)),
        len < PAR_MIN_ELEMS,
        || RowScratch::new(width),
        |s, r, row, block| update_row(rule, s, (r, row), width, block, &keys),
    );
}
