//! The fusion penalty and its gradient formed a block of groups at a time
//! inside an optimiser's update
//! ([`Optimizer::update_by_blocks`](crate::optim::Optimizer::update_by_blocks)):
//! each block's rows are read once from memory, its groups' norms and
//! gradient terms are computed from them, and the same rows, still in
//! cache, are updated next. Neither a pass over the rows before the update
//! nor a buffer of every group's terms is needed.

use std::borrow::Cow;
use std::sync::OnceLock;

use ndarray::{Array1, ArrayView2};
use rayon::prelude::*;

use super::row_grads::{deviation_row, norms_and_terms};
use super::{RowGroups, check_rows, factor, lone_norm, mean_of_norms};
use crate::kernels::Real;
use crate::kernels::rows::KeptRow;
use crate::kernels::wide::wide_fn;
use crate::param::{BlockGradient, RowForm, RowGradient, StoredView};

/// The bytes of `T` a block's rows hold at least: a block closes at the
/// first group that takes it to this many (about 128 rows of 512 `f32`,
/// in a few runs of consecutive rows, which stay in a core's cache between
/// the terms and the update; blocks of 64 to 256 such rows gave the same
/// step, of 512 a slower one).
const BLOCK_BYTES: usize = 256 << 10;

/// The fusion penalty `P = (1/n) Σ_i ‖x_i − c_{g(i)}‖` of rows grouped by
/// `groups` and the gradient of `gy·P`, as a [`BlockGradient`]: blocks of
/// consecutive groups, each block's rows in increasing order. A block's
/// gradient ([`FusionBlock`]) is formed from its rows just before they
/// are updated, and its rows' norms are kept; [`Self::penalty`] gives P
/// and the norms afterwards. Every value equals
/// [`fusion_penalty_forward_row_grads`](super::fusion_penalty_forward_row_grads)'s
/// bit for bit: each group is computed by the same code on the same
/// values in the same order.
///
/// ```
/// use ndarray::array;
/// use splitgrad::ops::fusion_penalty::{FusionBlocks, RowGroups, fusion_penalty_forward};
/// use splitgrad::optim::{LazyAdam, LazyAdamConfig, Optimizer};
/// use splitgrad::Parameter;
/// # fn main() -> splitgrad::Result<()> {
/// let groups = RowGroups::new(&[0, 1, 0], 2);
/// let x = array![[0.0f32, 0.0], [5.0, 5.0], [2.0, 0.0]].into_dyn();
/// let mut p = Parameter::new("rows", x.clone());
/// let blocks = FusionBlocks::new(&groups, 2, 0.5);
/// LazyAdam::new(LazyAdamConfig::default())?.update_by_blocks(&mut p, &blocks)?;
/// // The penalty of the rows before the update.
/// assert_eq!(blocks.penalty(x.view().into()), fusion_penalty_forward(x.view(), &groups));
/// assert_ne!(p.value(), &x);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct FusionBlocks<'g, T> {
    groups: &'g RowGroups,
    layout: Cow<'g, FusionLayout>,
    /// `gy / n`.
    a: T,
    /// Each block's norms in its rows' order, once it is formed.
    norms: Vec<OnceLock<Box<[T]>>>,
}

/// How [`FusionBlocks`] cuts the groups of a [`RowGroups`] into blocks,
/// for rows of a width: a function of the groups and the width only, so a
/// layer whose groups are fixed builds it once and lends it to every
/// step's blocks ([`FusionBlocks::with_layout`]).
///
/// ```
/// use splitgrad::ops::fusion_penalty::{FusionBlocks, FusionLayout, RowGroups};
/// let groups = RowGroups::new(&[0, 1, 0], 2);
/// let layout = FusionLayout::new::<f32>(&groups, 2);
/// let blocks = FusionBlocks::with_layout(&groups, &layout, 0.5f32);
/// assert_eq!(blocks.rows(0), FusionBlocks::new(&groups, 2, 0.5f32).rows(0));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FusionLayout {
    width: usize,
    n_groups: usize,
    /// Block b holds groups `group_starts[b]..group_starts[b + 1]`.
    group_starts: Vec<usize>,
    /// Block b's rows are `rows[row_starts[b]..row_starts[b + 1]]`.
    row_starts: Vec<usize>,
    rows: Vec<usize>,
    /// Each row's position in its block's rows.
    position: Vec<u32>,
}

impl FusionLayout {
    /// The blocks of the rows of `groups`, rows of `width` elements of `T`
    /// (each block, but the last, at least 256 KiB of rows of `T`).
    pub fn new<T>(groups: &RowGroups, width: usize) -> Self {
        let n = groups.n_rows();
        let n_groups = groups.n_groups();
        let (mut group_starts, mut row_starts) = (vec![0], vec![0]);
        let mut rows = Vec::with_capacity(n);
        let mut open = 0;
        let block_rows = (BLOCK_BYTES / (width * std::mem::size_of::<T>()).max(1)).max(1);
        for g in 0..n_groups {
            rows.extend_from_slice(groups.members(g));
            if rows.len() - open >= block_rows || g + 1 == n_groups {
                rows[open..].sort_unstable();
                group_starts.push(g + 1);
                row_starts.push(rows.len());
                open = rows.len();
            }
        }
        let mut position = vec![0; n];
        for b in row_starts.windows(2) {
            for (i, &r) in rows[b[0]..b[1]].iter().enumerate() {
                position[r] = i as u32;
            }
        }
        FusionLayout {
            width,
            n_groups,
            group_starts,
            row_starts,
            rows,
            position,
        }
    }

    /// The number of blocks.
    pub fn n_blocks(&self) -> usize {
        self.group_starts.len() - 1
    }
}

impl<'g, T: Real> FusionBlocks<'g, T> {
    /// The blocks of the rows of `groups`, rows of `width` elements, for
    /// the gradient of `gy·P`.
    pub fn new(groups: &'g RowGroups, width: usize, gy: T) -> Self {
        Self::of(
            groups,
            Cow::Owned(FusionLayout::new::<T>(groups, width)),
            gy,
        )
    }

    /// [`Self::new`] with the blocks of `layout`, which must be
    /// `FusionLayout::new::<T>(groups, width)`'s.
    ///
    /// **Panics** if `layout` is not for as many rows and groups as
    /// `groups` has; a layout of other groups of as many rows and groups
    /// panics when a block is formed whose groups' rows are not its rows
    /// ([`Self::block`]).
    #[track_caller]
    pub fn with_layout(groups: &'g RowGroups, layout: &'g FusionLayout, gy: T) -> Self {
        assert!(
            layout.position.len() == groups.n_rows() && layout.n_groups == groups.n_groups(),
            "FusionBlocks::with_layout: a layout of {} rows in {} groups for {} rows in {} groups",
            layout.position.len(),
            layout.n_groups,
            groups.n_rows(),
            groups.n_groups()
        );
        Self::of(groups, Cow::Borrowed(layout), gy)
    }

    fn of(groups: &'g RowGroups, layout: Cow<'g, FusionLayout>, gy: T) -> Self {
        let n = groups.n_rows();
        FusionBlocks {
            groups,
            a: gy / T::from_f64(n.max(1) as f64),
            norms: (0..layout.n_blocks()).map(|_| OnceLock::new()).collect(),
            layout,
        }
    }

    /// The number of blocks.
    pub fn n_blocks(&self) -> usize {
        self.norms.len()
    }

    /// The number of rows (of all blocks).
    pub fn n_rows(&self) -> usize {
        self.layout.rows.len()
    }

    /// The rows of block b, in increasing order.
    ///
    /// **Panics** if b is out of range.
    #[track_caller]
    pub fn rows(&self, b: usize) -> &[usize] {
        &self.layout.rows[self.layout.row_starts[b]..self.layout.row_starts[b + 1]]
    }

    /// Block b's gradient from its rows (`x[i]` is row `self.rows(b)[i]`),
    /// its terms in `scratch`; the block's norms are kept (the first time
    /// it is formed).
    ///
    /// **Panics** if `x` is not one row of the width per row of the block,
    /// or if a row of one of the block's groups is not among its rows (a
    /// layout of other groups, [`Self::with_layout`]).
    #[track_caller]
    pub fn block<'s>(
        &'s self,
        b: usize,
        x: &[KeptRow<'_, T>],
        scratch: &'s mut Vec<T>,
    ) -> FusionBlock<'s, T> {
        let rows = self.rows(b);
        let w = self.layout.width;
        assert!(
            x.len() == rows.len() && x.iter().all(|r| r.len() == w),
            "FusionBlocks::block: block {b} has {} rows of {w} elements",
            rows.len()
        );
        let groups = self.layout.group_starts[b]..self.layout.group_starts[b + 1];
        let sizes = || groups.clone().map(|g| self.groups.members(g).len());
        let n_multi = sizes().filter(|&m| m > 1).count();
        let largest = sizes().max().unwrap_or(0).max(1);
        let n_terms = n_multi * 2 * w;
        // Every element a block uses is written before it is read (the
        // rows widened, each slot's c and s), so a longer buffer is kept
        // as it is, not filled again.
        let need = n_terms + largest * w;
        if scratch.len() < need {
            scratch.resize(need, T::zero());
        }
        let (terms, buf) = scratch[..need].split_at_mut(n_terms);
        let mut slot = vec![u32::MAX; rows.len()];
        let mut norms = vec![T::zero(); rows.len()];
        // Each member's place in the block, checked: a layout of other
        // groups would put a group's row in another block.
        let at = |r: usize| {
            let i = self.layout.position[r] as usize;
            assert!(
                rows.get(i) == Some(&r),
                "FusionBlocks::block: row {r} of a group of block {b} is not among the block's \
                 rows: the layout is of other groups"
            );
            i
        };
        let local: Vec<usize> = (0..largest).collect();
        let (mut pos, mut group_norm) = (Vec::new(), Vec::new());
        let mut s = 0;
        for g in groups {
            match self.groups.members(g) {
                [] => {}
                // Rows of no element have norm 0, as in the one-pass
                // forward (and a group of them its empty terms).
                &[r] if w > 0 => {
                    let i = at(r);
                    norms[i] = match x[i] {
                        KeptRow::Full(row) => lone(row),
                        // A finite row's norm is +0, known from the bits.
                        row if row.all_finite() => T::zero(),
                        row => {
                            row.widen_into(&mut buf[..w]);
                            lone(&buf[..w])
                        }
                    };
                }
                [_] => {}
                members => {
                    let m = members.len();
                    pos.clear();
                    pos.extend(members.iter().map(|&r| at(r)));
                    group_norm.clear();
                    group_norm.resize(m, T::zero());
                    if w > 0 {
                        for (o, &i) in buf.chunks_exact_mut(w).zip(&pos) {
                            x[i].widen_into(o);
                        }
                        let view = ArrayView2::from_shape((m, w), &buf[..m * w]).expect("m rows");
                        let (tc, ts) = terms[s * 2 * w..(s + 1) * 2 * w].split_at_mut(w);
                        group_slot(view, &local[..m], self.a, &mut group_norm, tc, ts);
                    }
                    for (&i, &y) in pos.iter().zip(&group_norm) {
                        norms[i] = y;
                        slot[i] = s as u32;
                    }
                    s += 1;
                }
            }
        }
        let k = norms.iter().map(|&y| factor(self.a, y)).collect();
        // Formed again (a second update from the same blocks), the norms
        // kept are the first formation's.
        let _ = self.norms[b].set(norms.into_boxed_slice());
        FusionBlock {
            rows,
            position: &self.layout.position,
            width: w,
            slot,
            k,
            terms: &scratch[..n_terms],
        }
    }

    /// The penalty P and each row's norm (n), as
    /// [`fusion_penalty_forward`](super::fusion_penalty_forward) gives them
    /// for the rows the blocks were formed from. A block no update formed
    /// (a frozen parameter is not moved) is formed now from `x`, which must
    /// be those rows.
    ///
    /// **Panics** if `x` is not (n, width).
    #[track_caller]
    pub fn penalty(&self, x: StoredView<'_, T>) -> (T, Array1<T>) {
        let (n, w) = check_rows(&x, self.groups);
        assert_eq!(
            w, self.layout.width,
            "FusionBlocks::penalty: rows of {w}, not {}",
            self.layout.width
        );
        let table = x.table_rows();
        // The blocks no update formed, formed now (in parallel).
        (0..self.n_blocks())
            .into_par_iter()
            .filter(|&b| self.norms[b].get().is_none())
            .for_each_init(Vec::new, |scratch, b| {
                let kept: Vec<KeptRow<'_, T>> =
                    self.rows(b).iter().map(|&r| table.kept(r)).collect();
                self.block(b, &kept, scratch);
            });
        // Each row's norm in its place.
        let mut norms = Array1::<T>::zeros(n);
        for b in 0..self.n_blocks() {
            let formed = self.norms[b].get().expect("every block formed");
            for (&r, &y) in self.rows(b).iter().zip(formed.iter()) {
                norms[r] = y;
            }
        }
        mean_of_norms(norms)
    }
}

wide_fn! {
    /// A group of two or more rows of a block: the rows `x` (m, D) with
    /// members `local` (0..m), their norms into `norms`, the centroid into
    /// `tc` and `s` into `ts` ([`norms_and_terms`] on the CPU's vectors).
    fn group_slot<T: Real>(
        x: ArrayView2<'_, T>,
        local: &[usize],
        a: T,
        norms: &mut [T],
        tc: &mut [T],
        ts: &mut [T],
    ) {
        norms_and_terms(x, local, a, norms, tc, ts);
    }
}

wide_fn! {
    /// [`lone_norm`] on the CPU's vectors.
    fn lone<T: Real>(x: &[T]) -> T {
        lone_norm(x)
    }
}

impl<T: Real> BlockGradient<T> for FusionBlocks<'_, T> {
    fn n_blocks(&self) -> usize {
        FusionBlocks::n_blocks(self)
    }

    fn rows(&self, b: usize) -> &[usize] {
        FusionBlocks::rows(self, b)
    }

    fn block<'s>(
        &'s self,
        b: usize,
        rows: &[KeptRow<'_, T>],
        scratch: &'s mut Vec<T>,
    ) -> Box<dyn RowGradient<T> + 's> {
        Box::new(FusionBlocks::block(self, b, rows, scratch))
    }
}

/// One block's rows of the fusion penalty's gradient
/// ([`FusionBlocks::block`]): the terms (c, s) of its groups of two or
/// more rows and each row's factor; row i's gradient is
/// `k_i·(x_i − c) − s`, 0 for a row alone in its group, the bits of
/// [`FusionRowGrads::row`](super::FusionRowGrads::row).
#[derive(Debug)]
pub struct FusionBlock<'s, T> {
    rows: &'s [usize],
    /// Each row's position in its block (of every block).
    position: &'s [u32],
    width: usize,
    /// The slot of each row's group in `terms` (`u32::MAX`: alone).
    slot: Vec<u32>,
    k: Vec<T>,
    terms: &'s [T],
}

impl<T: Real> FusionBlock<'_, T> {
    /// Row r's position in the block.
    #[track_caller]
    fn at(&self, r: usize) -> usize {
        match self.position.get(r) {
            Some(&i) if self.rows.get(i as usize) == Some(&r) => i as usize,
            _ => panic!("FusionBlock: row {r} is not in the block"),
        }
    }

    /// The terms (c, s) of slot s.
    fn terms_of(&self, s: u32) -> (&[T], &[T]) {
        let w = self.width;
        self.terms[s as usize * 2 * w..][..2 * w].split_at(w)
    }

    /// Row r's form ([`RowForm`]): `Zero` for a row alone in its group,
    /// else `Deviation` with its factor and its group's terms.
    ///
    /// **Panics** if r is not a row of the block.
    #[track_caller]
    pub fn form(&self, r: usize) -> RowForm<'_, T> {
        let i = self.at(r);
        match self.slot[i] {
            u32::MAX => RowForm::Zero,
            s => {
                let (c, s) = self.terms_of(s);
                RowForm::Deviation { k: self.k[i], c, s }
            }
        }
    }

    /// Row r's gradient into `out` from `x_r`, row r before the update.
    ///
    /// **Panics** if r is not a row of the block or a slice is not a row
    /// long.
    #[track_caller]
    pub fn row(&self, r: usize, x_r: &[T], out: &mut [T]) {
        let w = self.width;
        assert!(
            x_r.len() == w && out.len() == w,
            "FusionBlock::row: rows of {w} elements"
        );
        let i = self.at(r);
        match self.slot[i] {
            u32::MAX => out.fill(T::zero()),
            s => {
                let (c, s) = self.terms_of(s);
                deviation_row(self.k[i], x_r, c, s, out);
            }
        }
    }
}

impl<T: Real> RowGradient<T> for FusionBlock<'_, T> {
    fn write(&self, r: usize, x: &[T], g: &mut [T]) {
        self.row(r, x, g)
    }

    fn form(&self, r: usize) -> RowForm<'_, T> {
        FusionBlock::form(self, r)
    }
}
