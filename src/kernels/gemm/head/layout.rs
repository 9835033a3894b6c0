//! The pack phase of [`super::fused_ce`]: the vocabulary as the kernel
//! walks it (the splits as raw pointers, their 6-row panels and the blocks
//! of panels one pass holds), Wᵀ packed for the ∂h product, and each chunk
//! of rows packed with its labels and running state.

use std::mem::MaybeUninit;
use std::ops::Range;

use ndarray::{Array2, ArrayView2, ArrayViewMut2};

use super::super::micro::{MR, NR};
use super::super::pack;
use super::softmax::Cols;
use super::{Out, Pass, Rows};
use crate::kernels::pool::Pool;

/// A matrix as a pointer and its strides, for the raw walks of the tasks
/// that share it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Strided<P> {
    pub(super) ptr: P,
    pub(super) rs: usize,
    pub(super) cs: usize,
}

/// A weight, read only, with non-negative strides.
pub(super) type WPtr = Strided<*const f32>;
/// A gradient, shared by tasks that write disjoint elements.
pub(super) type MutPtr = Strided<*mut f32>;

// SAFETY: a weight is only read, from views that outlive the call.
unsafe impl Send for WPtr {}
// SAFETY: as above.
unsafe impl Sync for WPtr {}
// SAFETY: each task writes rows no other task writes.
unsafe impl Send for MutPtr {}
// SAFETY: as above.
unsafe impl Sync for MutPtr {}

impl WPtr {
    /// `w`, whose strides are not negative.
    fn of(w: &ArrayView2<'_, f32>) -> Self {
        Strided {
            ptr: w.as_ptr(),
            rs: w.strides()[0] as usize,
            cs: w.strides()[1] as usize,
        }
    }
}

impl MutPtr {
    /// `g` (the caller checks that the strides, cast, are not negative).
    pub(super) fn of(g: &mut ArrayViewMut2<'_, f32>) -> Self {
        Strided {
            ptr: g.as_mut_ptr(),
            rs: g.strides()[0] as usize,
            cs: g.strides()[1] as usize,
        }
    }
}

/// The gradients of `out` as raw pointers: ∂h whenever given, each ∂W_k
/// when `want_w[k]`.
///
/// **Panics** if one has a negative stride.
#[track_caller]
pub(super) fn destinations(
    out: &mut Out<'_>,
    want_w: &[bool],
) -> (Option<MutPtr>, Vec<Option<MutPtr>>) {
    let ghp = out.hidden.as_mut().map(MutPtr::of);
    let gwp: Vec<Option<MutPtr>> = (0..want_w.len())
        .map(|k| {
            if !want_w[k] {
                return None;
            }
            out.weights[k].as_mut().map(MutPtr::of)
        })
        .collect();
    for s in gwp.iter().flatten().chain(ghp.iter()) {
        assert!(
            (s.rs as isize) >= 0 && (s.cs as isize) >= 0,
            "fused_ce: gradients with negative strides"
        );
    }
    (ghp, gwp)
}

/// Copies, in standard layout, of the weights with a negative stride (the
/// raw walks need non-negative ones); `None` for the others.
pub(super) fn nonnegative_copies(weights: &[ArrayView2<'_, f32>]) -> Vec<Option<Array2<f32>>> {
    weights
        .iter()
        .map(|w| (w.strides().iter().any(|&s| s < 0)).then(|| w.as_standard_layout().into_owned()))
        .collect()
}

/// Each weight, or its copy where [`nonnegative_copies`] made one.
pub(super) fn views<'a>(
    weights: &[ArrayView2<'a, f32>],
    owned: &'a [Option<Array2<f32>>],
) -> Vec<ArrayView2<'a, f32>> {
    weights
        .iter()
        .zip(owned)
        .map(|(w, o)| o.as_ref().map_or(*w, |o| o.view()))
        .collect()
}

/// One 6-row panel of the vocabulary: split, first local row, first
/// global row, rows.
#[derive(Clone, Copy, Debug)]
pub(super) struct Panel {
    pub(super) split: usize,
    pub(super) local: usize,
    pub(super) global: usize,
    pub(super) rows: usize,
}

/// A block of the vocabulary: whole panels, global rows `v0..v0 + rows`.
#[derive(Clone, Debug)]
pub(super) struct Block {
    /// Its panels, indices into [`Vocab::panels`].
    pub(super) panels: Range<usize>,
    pub(super) v0: usize,
    pub(super) rows: usize,
}

/// The vocabulary of a call.
pub(super) struct Vocab {
    /// V, the rows of all splits.
    pub(super) v_total: usize,
    /// Each split (non-negative strides).
    pub(super) wptrs: Vec<WPtr>,
    /// The 6-row panels, split by split; none crosses a split's end.
    pub(super) panels: Vec<Panel>,
    /// The blocks a pass holds at once, in order.
    pub(super) blocks: Vec<Block>,
    /// Rows of the largest block.
    pub(super) max_block: usize,
}

impl Vocab {
    /// The splits `wviews` (non-negative strides) in panels and blocks:
    /// whole panels, at most `vocab_block` rows a block, except that a pass
    /// that forms the softmax from the sums holds all of them.
    pub(super) fn new(wviews: &[ArrayView2<'_, f32>], pass: Pass<'_>, vocab_block: usize) -> Self {
        let wptrs: Vec<WPtr> = wviews.iter().map(WPtr::of).collect();
        let mut panels = Vec::new();
        let mut start = 0;
        for (k, w) in wviews.iter().enumerate() {
            for local in (0..w.nrows()).step_by(MR) {
                panels.push(Panel {
                    split: k,
                    local,
                    global: start + local,
                    rows: MR.min(w.nrows() - local),
                });
            }
            start += w.nrows();
        }
        let ranges: Vec<(usize, usize)> = if matches!(pass, Pass::Grads { .. }) {
            let cap = vocab_block.max(1);
            let mut out = Vec::new();
            let mut p0 = 0;
            while p0 < panels.len() {
                let mut p1 = p0 + 1;
                while p1 < panels.len()
                    && panels[p1].global + panels[p1].rows - panels[p0].global <= cap
                {
                    p1 += 1;
                }
                out.push((p0, p1));
                p0 = p1;
            }
            out
        } else {
            vec![(0, panels.len())]
        };
        let blocks: Vec<Block> = ranges
            .into_iter()
            .map(|(p0, p1)| Block {
                panels: p0..p1,
                v0: panels.get(p0).map_or(0, |p| p.global),
                rows: if p1 > p0 {
                    panels[p1 - 1].global + panels[p1 - 1].rows - panels[p0].global
                } else {
                    0
                },
            })
            .collect();
        let max_block = blocks.iter().map(|b| b.rows).max().unwrap_or(0);
        Vocab {
            v_total: start,
            wptrs,
            panels,
            blocks,
            max_block,
        }
    }
}

/// Wᵀ for the ∂h product, in panels of [`MR`] columns of W (`ceil(H / 6)`
/// panels of `V·6` floats, from `pool`), packed once per call.
pub(super) fn pack_wt(
    pool: &Pool<f32>,
    wviews: &[ArrayView2<'_, f32>],
    v_total: usize,
    hd: usize,
) -> Vec<f32> {
    let n_h6 = hd.div_ceil(MR);
    let wp_stride = v_total * MR;
    let mut wp = pool.take_vec(n_h6 * wp_stride);
    let space: &mut [MaybeUninit<f32>] = &mut wp.spare_capacity_mut()[..n_h6 * wp_stride];
    let mut s = 0;
    for w in wviews {
        pack::pack_transposed_into(w.view(), s, wp_stride, space);
        s += w.nrows();
    }
    // SAFETY: the splits' rows are 0..V, so the packing wrote every
    // element of every panel (columns past H as zeros).
    unsafe { wp.set_len(n_h6 * wp_stride) };
    wp
}

/// A label met by the tiles of one 16-row panel of the chunk.
#[derive(Clone, Copy, Debug)]
pub(super) struct Lab {
    /// Global vocabulary row.
    pub(super) v: usize,
    /// Column of the panel (the chunk row within it).
    pub(super) j: usize,
    /// The token (index into labels).
    pub(super) slot: usize,
}

/// One chunk of the call's rows, `a0..a1`, in 16-row panels, and what the
/// phases keep for it.
pub(super) struct Chunk {
    /// First row of the call in the chunk.
    pub(super) a0: usize,
    /// One past the last.
    pub(super) a1: usize,
    /// Rows, `a1 − a0`.
    pub(super) nc: usize,
    /// 16-row panels, `ceil(nc / 16)`.
    pub(super) np: usize,
    /// Each panel's labels in vocabulary order.
    pub(super) labs: Vec<Vec<Lab>>,
    /// Per column: Σ of its tokens' weights.
    pub(super) wsum: Vec<[f32; NR]>,
    /// Per panel: the running state of its 16 rows.
    pub(super) cols: Vec<Cols>,
    /// Per panel: the label logits, in the order of `labs`.
    pub(super) zs: Vec<Vec<f32>>,
    /// Per column: the factor G = f·E of its row.
    pub(super) f: Vec<[f32; NR]>,
}

impl Chunk {
    /// The call's rows `range` of h packed into `hp` (`[panel][k][16]`,
    /// zero past the last row), their labels and weights, and their state
    /// (for a [`Pass::Grads`] call, the given statistics).
    pub(super) fn pack(
        h: ArrayView2<'_, f32>,
        rows: Rows<'_>,
        pass: Pass<'_>,
        range: Range<usize>,
        hp: &mut Vec<f32>,
    ) -> Self {
        let hd = h.ncols();
        let (a0, a1) = (range.start, range.end);
        let nc = a1 - a0;
        let np = nc.div_ceil(NR);
        hp.clear();
        hp.resize(np * hd * NR, 0.0);
        for (i, &r) in rows.rows[a0..a1].iter().enumerate() {
            let (p, j) = (i / NR, i % NR);
            for (k, &x) in h.row(r).iter().enumerate() {
                hp[p * hd * NR + k * NR + j] = x;
            }
        }
        let labs: Vec<Vec<Lab>> = (0..np)
            .map(|p| {
                let mut l: Vec<Lab> = Vec::new();
                for j in 0..NR.min(nc - p * NR) {
                    let a = a0 + p * NR + j;
                    for slot in rows.starts[a]..rows.starts[a + 1] {
                        l.push(Lab {
                            v: rows.labels[slot],
                            j,
                            slot,
                        });
                    }
                }
                l.sort_by_key(|x| (x.v, x.slot));
                l
            })
            .collect();
        let wsum: Vec<[f32; NR]> = (0..np)
            .map(|p| {
                let mut w = [0.0f32; NR];
                for (j, wj) in w.iter_mut().enumerate().take(NR.min(nc - p * NR)) {
                    let a = a0 + p * NR + j;
                    let toks = rows.starts[a]..rows.starts[a + 1];
                    *wj = match pass {
                        Pass::Grads { weights, .. } => weights[toks].iter().sum(),
                        _ => toks.len() as f32,
                    };
                }
                w
            })
            .collect();
        let mut cols = vec![Cols::new(); np];
        let zs: Vec<Vec<f32>> = labs.iter().map(|l| vec![0.0; l.len()]).collect();
        if let Pass::Grads { max, log_sum, .. } = pass {
            for (p, c) in cols.iter_mut().enumerate() {
                // Padding columns weigh 0: finite statistics keep their G 0.
                c.m = [0.0; NR];
                c.s = [0.0; NR];
                for j in 0..NR.min(nc - p * NR) {
                    c.m[j] = max[a0 + p * NR + j];
                    c.s[j] = log_sum[a0 + p * NR + j];
                }
            }
        }
        Chunk {
            a0,
            a1,
            nc,
            np,
            labs,
            wsum,
            cols,
            zs,
            f: vec![[0.0f32; NR]; np],
        }
    }

    /// Columns of panel p that hold a row of the chunk.
    pub(super) fn width(&self, p: usize) -> usize {
        NR.min(self.nc - p * NR)
    }
}
