//! Phase A of [`super::fused_ce`], the tile softmax: each logits tile of a
//! vocabulary block against the chunk's panels, the softmax arithmetic done
//! on it as it leaves the registers (the exponentials E, or G itself given
//! the statistics); then the labels folded into E with each row's factor f,
//! and at the chunk's end its rows' statistics and tokens' losses.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::super::micro::{Dst, Lhs, MR, NR, Rhs, Tile, TileFn};
use super::layout::{Block, Chunk, Lab, Panel, WPtr};
use super::{Isa, MARGIN, Stats, Task, run_on};
use crate::kernels::exp::exp_fma;

/// Depth of the blocks of H in the logits product (32 KiB of a packed
/// chunk panel, 512 steps of 16 floats, which stays in L1 while the panels
/// of W pass).
const KC_H: usize = 512;
/// Vocabulary panels whose rows of W stay in L2 while the chunk panels
/// pass (96 rows: 192 KiB of a block of 512 of H).
const PANELS_A: usize = 16;

/// The running state of the 16 chunk rows of one panel.
#[derive(Clone, Copy, Debug)]
pub(super) struct Cols {
    /// The shift the exponentials are taken from (in a [`super::Pass::Grads`]
    /// call: the row's given log-sum).
    pub(super) s: [f32; NR],
    /// The running maximum (in a [`super::Pass::Grads`] call: the given one).
    pub(super) m: [f32; NR],
    /// Σ e^{z − s} so far.
    pub(super) t: [f64; NR],
}

impl Cols {
    pub(super) fn new() -> Self {
        Cols {
            s: [f32::NEG_INFINITY; NR],
            m: [f32::NEG_INFINITY; NR],
            t: [0.0; NR],
        }
    }
}

/// 16-row panels of the chunk per task: every thread busy, and a task's
/// packed rows (`gt·H·16` floats) within 256 KiB of L2.
pub(super) fn group_size(np: usize, hd: usize, threads: usize) -> usize {
    let l2 = ((256 << 10) / (hd.max(1) * NR * 4)).max(1);
    np.div_ceil(threads).clamp(1, l2)
}

/// A task of phase A: its first chunk panel, their running states and
/// their label logits.
type Group<'a> = (usize, &'a mut [Cols], &'a mut [Vec<f32>]);

/// What phase A reads.
pub(super) struct AJob<'a> {
    /// The variant's tile kernel.
    pub(super) tile: TileFn,
    /// The chunk's rows packed ([`Chunk::pack`]), H of them.
    pub(super) hp: &'a [f32],
    pub(super) hd: usize,
    /// The splits, and the block's panels of them.
    pub(super) w: &'a [WPtr],
    pub(super) panels: &'a [Panel],
    /// The block's first vocabulary row and its rows.
    pub(super) vb0: usize,
    pub(super) vbw: usize,
    /// Whether E (or G) is stored.
    pub(super) store: bool,
    /// In a [`super::Pass::Grads`] call, each token's weight: write G.
    pub(super) grads_given: Option<&'a [f32]>,
}

/// Phase A on one vocabulary block: the chunk's panels in groups of `gt`,
/// a task each, every vocabulary panel of the block against them; each
/// group's rows of E (or G) into its part of `e` when the job stores them.
pub(super) fn tile_softmax(
    isa: Isa,
    job: &AJob<'_>,
    gt: usize,
    c: &mut Chunk,
    e: &mut [MaybeUninit<f32>],
) {
    let stride = if job.store { gt * NR * job.vbw } else { 0 };
    let groups: Vec<Group<'_>> = {
        let mut v = Vec::new();
        let mut cs: &mut [Cols] = &mut c.cols;
        let mut zr: &mut [Vec<f32>] = &mut c.zs;
        let mut g = 0;
        while !cs.is_empty() {
            let n = gt.min(cs.len());
            let (c0, c1) = cs.split_at_mut(n);
            let (z0, z1) = zr.split_at_mut(n);
            v.push((g, c0, z0));
            cs = c1;
            zr = z1;
            g += n;
        }
        v
    };
    let mut eparts: Vec<&mut [MaybeUninit<f32>]> = if job.store {
        e.chunks_mut(stride).collect()
    } else {
        (0..groups.len())
            .map(|_| <&mut [MaybeUninit<f32>]>::default())
            .collect()
    };
    let (labs, wsum) = (&c.labs, &c.wsum);
    groups
        .into_par_iter()
        .zip(eparts.par_iter_mut())
        .for_each(|((g0, cols, zs), e)| {
            let n = cols.len();
            let task = ATask {
                job,
                g0,
                cols,
                zs,
                e,
                labs: &labs[g0..g0 + n],
                wsum: &wsum[g0..g0 + n],
            };
            run_on(isa, task);
        });
}

/// One task of phase A: chunk panels `g0..g0 + cols.len()`, their states,
/// label logits and part of E.
struct ATask<'a, 'j> {
    job: &'a AJob<'j>,
    g0: usize,
    cols: &'a mut [Cols],
    zs: &'a mut [Vec<f32>],
    e: &'a mut [MaybeUninit<f32>],
    labs: &'a [Vec<Lab>],
    wsum: &'a [[f32; NR]],
}

impl Task for ATask<'_, '_> {
    #[inline(always)]
    fn run<const AVX2: bool>(self) {
        phase_a_body::<AVX2>(
            self.job, self.g0, self.cols, self.zs, self.e, self.labs, self.wsum,
        )
    }
}

/// Phase A for the chunk panels `g0..g0 + cols.len()`: every vocabulary
/// panel of the block against each of them.
///
/// `AVX2`: the caller is compiled for AVX2 and FMA, so the kernel of six
/// rows is called directly (and inlined) rather than through `job.tile`.
#[inline(always)]
fn phase_a_body<const AVX2: bool>(
    job: &AJob<'_>,
    g0: usize,
    cols: &mut [Cols],
    zs: &mut [Vec<f32>],
    e: &mut [MaybeUninit<f32>],
    labs: &[Vec<Lab>],
    wsum: &[[f32; NR]],
) {
    let n = cols.len();
    let pe = NR * job.vbw;
    let mut cursor: Vec<usize> = labs
        .iter()
        .map(|l| l.partition_point(|x| x.v < job.vb0))
        .collect();
    // BLIS order: a block of vocabulary panels (their rows of W stay in
    // L2) against one chunk panel at a time (its 16 KiB of packed rows
    // stay in L1), H in blocks of KC_H; the tiles wait in `tiles` between
    // blocks of H, and take the softmax after the last.
    let (kc_h, panels_a) = (KC_H, PANELS_A);
    // With H in one block each tile takes its softmax at once: one tile.
    let multi = job.hd > kc_h;
    let at = |q: usize, i: usize| if multi { q * panels_a + i } else { 0 };
    let mut tiles: Vec<Tile> = vec![[[0.0; NR]; MR]; if multi { n * panels_a } else { 1 }];
    for blk in job.panels.chunks(panels_a) {
        for k0 in (0..job.hd).step_by(kc_h) {
            let kc = kc_h.min(job.hd - k0);
            let last = k0 + kc == job.hd;
            for q in 0..n {
                let rhs = Rhs {
                    ptr: job.hp[(g0 + q) * job.hd * NR + k0 * NR..].as_ptr(),
                    rs: NR,
                };
                for (i, pan) in blk.iter().enumerate() {
                    let w = job.w[pan.split];
                    let lhs =
                        Lhs::strided(w.ptr.wrapping_add(pan.local * w.rs + k0 * w.cs), w.rs, w.cs);
                    let t = &mut tiles[at(q, i)];
                    // SAFETY: rows local..local + rows of the split exist
                    // (panels never pass a split's end) and are read
                    // through the view's own strides at columns k0..k0 + kc
                    // < H; the packed chunk panel holds hd steps of 16
                    // floats.
                    #[cfg(target_arch = "x86_64")]
                    if AVX2 && pan.rows == MR {
                        // SAFETY: as above; with AVX2 set, the caller is
                        // compiled for, and runs on, a CPU with AVX2 and FMA.
                        unsafe {
                            super::super::micro::avx2::rows::<MR>(
                                kc,
                                lhs,
                                rhs,
                                Dst::tile(t),
                                k0 > 0,
                            )
                        };
                    } else {
                        // SAFETY: as above.
                        unsafe { (job.tile)(kc, pan.rows, lhs, rhs, Dst::tile(t), k0 > 0) };
                    }
                    #[cfg(not(target_arch = "x86_64"))]
                    // SAFETY: as above.
                    unsafe {
                        (job.tile)(kc, pan.rows, lhs, rhs, Dst::tile(t), k0 > 0)
                    };
                    if !last {
                        continue;
                    }
                    let t = &tiles[at(q, i)];
                    let vrow = pan.global - job.vb0;
                    let c = &mut cols[q];
                    let ep: &mut [MaybeUninit<f32>] = if job.store {
                        &mut e[q * pe..(q + 1) * pe]
                    } else {
                        &mut []
                    };
                    let l = &labs[q];
                    if let Some(gw) = job.grads_given {
                        grads_tile(t, pan.rows, c, &wsum[q], &mut ep[vrow * NR..]);
                        while cursor[q] < l.len() && l[cursor[q]].v < pan.global + pan.rows {
                            let x = l[cursor[q]];
                            // SAFETY: the label's row is in this panel, whose
                            // rows `grads_tile` has just written.
                            unsafe {
                                *ep[(x.v - job.vb0) * NR + x.j].assume_init_mut() -= gw[x.slot]
                            };
                            cursor[q] += 1;
                        }
                    } else {
                        while cursor[q] < l.len() && l[cursor[q]].v < pan.global + pan.rows {
                            let x = l[cursor[q]];
                            zs[q][cursor[q]] = t[x.v - pan.global][x.j];
                            cursor[q] += 1;
                        }
                        #[cfg(target_arch = "x86_64")]
                        if AVX2 && pan.rows == MR {
                            // SAFETY: with AVX2 set, the CPU has AVX2 and
                            // FMA; a stored panel of E holds rows vrow..vrow
                            // + 6 of 16 floats (the block's rows).
                            unsafe {
                                if job.store {
                                    forward_tile6_avx2::<true>(t, c, ep, vrow);
                                } else {
                                    forward_tile6_avx2::<false>(t, c, ep, vrow);
                                }
                            }
                            continue;
                        }
                        if job.store {
                            forward_tile::<true>(t, pan.rows, c, ep, vrow);
                        } else {
                            forward_tile::<false>(t, pan.rows, c, ep, vrow);
                        }
                    }
                }
            }
        }
    }
}

/// The softmax arithmetic on a tile of logits: the column max, the shift
/// raised where a logit exceeds it by [`MARGIN`], `e = exp(z − s)` into the
/// column sums, and (when `STORE`) into rows `vrow..` of the panel's E.
#[inline(always)]
fn forward_tile<const STORE: bool>(
    t: &Tile,
    rows: usize,
    c: &mut Cols,
    e: &mut [MaybeUninit<f32>],
    vrow: usize,
) {
    let mut cm = [f32::NEG_INFINITY; NR];
    for row in t.iter().take(rows) {
        for (m, &x) in cm.iter_mut().zip(row) {
            *m = if x > *m { x } else { *m };
        }
    }
    let mut raise = false;
    for ((&x, &s), m) in cm.iter().zip(&c.s).zip(c.m.iter_mut()) {
        raise |= x > s + MARGIN;
        *m = if x > *m { x } else { *m };
    }
    if raise {
        raise_shift(c, &cm, if STORE { Some(e) } else { None }, vrow);
    }
    let mut ts = [0.0f32; NR];
    for (r, row) in t.iter().enumerate().take(rows) {
        let mut x = [0.0f32; NR];
        for (((x, sum), &z), &s) in x.iter_mut().zip(ts.iter_mut()).zip(row).zip(&c.s) {
            // A column with no logit above −∞ yet keeps its shift at −∞:
            // its −∞ logits weigh e^{−∞} = 0, not e^{NaN} (a NaN logit still
            // gives NaN).
            *x = if z == f32::NEG_INFINITY && s == f32::NEG_INFINITY {
                0.0
            } else {
                exp_fma(z - s)
            };
            *sum += *x;
        }
        if STORE {
            put_row(&mut e[(vrow + r) * NR..(vrow + r + 1) * NR], &x);
        }
    }
    for (t, &x) in c.t.iter_mut().zip(&ts) {
        *t += x as f64;
    }
}

/// [`forward_tile`] for a whole tile of six rows on AVX2 + FMA: the same
/// operations in the same order on 8-lane vectors (so the same bits), with
/// the column state, the exponentials and their sums in registers. A tile
/// that raises a shift (rare: only when a logit exceeds the row's shift by
/// [`MARGIN`]), or with a column whose shift is still −∞, takes
/// [`forward_tile`].
///
/// # Safety
///
/// The CPU must have AVX2 and FMA; when `STORE`, `e` holds rows `vrow..vrow
/// + 6` of 16 floats.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn forward_tile6_avx2<const STORE: bool>(
    t: &Tile,
    c: &mut Cols,
    e: &mut [MaybeUninit<f32>],
    vrow: usize,
) {
    use crate::kernels::exp::avx2::exp_fma_ps;
    use std::arch::x86_64::*;
    // SAFETY (all loads and stores below): a tile row and the columns'
    // arrays hold 16 floats (two vectors of 8); c.t holds 16 f64 (four
    // vectors of 4); e's rows vrow..vrow + 6 hold 16 floats each (the
    // caller's contract), checked by the slice index.
    unsafe {
        let ld = |p: &[f32; NR]| {
            (
                _mm256_loadu_ps(p.as_ptr()),
                _mm256_loadu_ps(p.as_ptr().add(8)),
            )
        };
        let mut cm = (
            _mm256_set1_ps(f32::NEG_INFINITY),
            _mm256_set1_ps(f32::NEG_INFINITY),
        );
        for row in t.iter() {
            let (x0, x1) = ld(row);
            cm = (_mm256_max_ps(x0, cm.0), _mm256_max_ps(x1, cm.1));
        }
        let s = ld(&c.s);
        let margin = _mm256_set1_ps(MARGIN);
        let raise = _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_GT_OQ>(cm.0, _mm256_add_ps(s.0, margin)),
            _mm256_cmp_ps::<_CMP_GT_OQ>(cm.1, _mm256_add_ps(s.1, margin)),
        );
        // A column whose shift is still −∞ (every logit so far −∞) takes
        // the plain code too, which weighs its −∞ logits 0.
        let never = _mm256_set1_ps(f32::NEG_INFINITY);
        let unshifted = _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_EQ_OQ>(s.0, never),
            _mm256_cmp_ps::<_CMP_EQ_OQ>(s.1, never),
        );
        if _mm256_movemask_ps(_mm256_or_ps(raise, unshifted)) != 0 {
            forward_tile::<STORE>(t, MR, c, e, vrow);
            return;
        }
        let m = ld(&c.m);
        _mm256_storeu_ps(c.m.as_mut_ptr(), _mm256_max_ps(cm.0, m.0));
        _mm256_storeu_ps(c.m.as_mut_ptr().add(8), _mm256_max_ps(cm.1, m.1));
        let mut ts = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let dst = if STORE {
            e[vrow * NR..(vrow + MR) * NR].as_mut_ptr().cast::<f32>()
        } else {
            std::ptr::null_mut()
        };
        for (r, row) in t.iter().enumerate() {
            let (z0, z1) = ld(row);
            let x0 = exp_fma_ps(_mm256_sub_ps(z0, s.0));
            let x1 = exp_fma_ps(_mm256_sub_ps(z1, s.1));
            ts = (_mm256_add_ps(ts.0, x0), _mm256_add_ps(ts.1, x1));
            if STORE {
                _mm256_storeu_ps(dst.add(r * NR), x0);
                _mm256_storeu_ps(dst.add(r * NR + 8), x1);
            }
        }
        let tp = c.t.as_mut_ptr();
        let halves = [
            _mm256_castps256_ps128(ts.0),
            _mm256_extractf128_ps::<1>(ts.0),
            _mm256_castps256_ps128(ts.1),
            _mm256_extractf128_ps::<1>(ts.1),
        ];
        for (i, h) in halves.into_iter().enumerate() {
            let p = tp.add(4 * i);
            _mm256_storeu_pd(p, _mm256_add_pd(_mm256_loadu_pd(p), _mm256_cvtps_pd(h)));
        }
    }
}

/// Writes a row of 16 floats.
#[inline(always)]
fn put_row(dst: &mut [MaybeUninit<f32>], x: &[f32; NR]) {
    for (d, &x) in dst[..NR].iter_mut().zip(x) {
        d.write(x);
    }
}

/// Raises the shift of the columns whose tile maximum `cm` exceeds it by
/// [`MARGIN`] to that maximum, rescaling their sum and their `vrow` rows
/// of E already written.
#[cold]
#[inline(never)]
fn raise_shift(c: &mut Cols, cm: &[f32; NR], e: Option<&mut [MaybeUninit<f32>]>, vrow: usize) {
    let mut e = e;
    for j in 0..NR {
        if cm[j] > c.s[j] + MARGIN {
            let f = if c.s[j] == f32::NEG_INFINITY {
                0.0
            } else {
                (c.s[j] as f64 - cm[j] as f64).exp()
            };
            c.t[j] *= f;
            if let Some(e) = e.as_deref_mut() {
                let f = f as f32;
                for v in 0..vrow {
                    // SAFETY: rows before `vrow` were written by the tiles
                    // before this one.
                    unsafe { *e[v * NR + j].assume_init_mut() *= f };
                }
            }
            c.s[j] = cm[j];
        }
    }
}

/// G on a tile, given the statistics (`c.m` the max, `c.s` the log-sum):
/// `w·exp((z − m) − ln Σ)` into the first `rows` rows of `e`.
#[inline(always)]
fn grads_tile(t: &Tile, rows: usize, c: &Cols, w: &[f32; NR], e: &mut [MaybeUninit<f32>]) {
    for (r, row) in t.iter().enumerate().take(rows) {
        let mut x = [0.0f32; NR];
        for (((x, &z), (&m, &l)), &w) in x.iter_mut().zip(row).zip(c.m.iter().zip(&c.s)).zip(w) {
            *x = w * exp_fma((z - m) - l);
        }
        put_row(&mut e[r * NR..(r + 1) * NR], &x);
    }
}

/// After phase A of a block that forms gradients: each row's factor f of
/// G = f·E, and the labels folded into E. Given the statistics (`given`),
/// phase A wrote G itself: f = 1. Otherwise `f = Σw / T` and each label's
/// entry gets `−T / Σw` (so that f·E has `−w` there).
pub(super) fn fold_labels(c: &mut Chunk, e: &mut [f32], blk: &Block, given: bool) {
    if given {
        for p in 0..c.np {
            let width = c.width(p);
            c.f[p][..width].fill(1.0);
        }
        return;
    }
    for (p, cl) in c.cols.iter().enumerate() {
        for j in 0..c.width(p) {
            c.f[p][j] = (c.wsum[p][j] as f64 / cl.t[j]) as f32;
        }
        for l in &c.labs[p] {
            let at = p * NR * blk.rows + (l.v - blk.v0) * NR + l.j;
            e[at] -= (cl.t[l.j] / c.wsum[p][l.j] as f64) as f32;
        }
    }
}

/// The chunk's rows' statistics and its tokens' losses, into `stats`:
/// `ln Σ_v e^{z_v − m} = ln T + (s − m)` in f64, the loss
/// `(m − z_label) + log_sum`.
pub(super) fn chunk_stats(c: &Chunk, stats: &mut Stats) {
    for (p, cl) in c.cols.iter().enumerate() {
        for j in 0..c.width(p) {
            let a = c.a0 + p * NR + j;
            let ls = cl.t[j].ln() + (cl.s[j] as f64 - cl.m[j] as f64);
            stats.max[a] = cl.m[j];
            stats.log_sum[a] = ls as f32;
        }
        for (l, &z) in c.labs[p].iter().zip(&c.zs[p]) {
            let a = c.a0 + p * NR + l.j;
            stats.loss[l.slot] = (stats.max[a] - z) + stats.log_sum[a];
        }
    }
}
