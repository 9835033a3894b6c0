//! The f32 matrix products of the fused LM head, on a micro-kernel of our
//! own.
//!
//! | module | what |
//! |---|---|
//! | [`micro`] | the 6 × 16 tile kernel: a scalar reference and AVX2 + FMA |
//! | [`pack`] | copies of operands into the layouts the tile kernel streams |
//! | [`head`] | the fused cross-entropy on the tile kernel: logits, softmax on the tile, both gradient products |
//! | this module | the variant chosen at run time ([`Isa`]), a general product [`gemm`] and the naive twin [`gemm_naive`] |
//!
//! Every variant computes each element of a product as one chain of fused
//! multiply-adds in increasing k, so the AVX2 kernel gives the scalar
//! kernel's bits, and the blocking and the thread count never change a
//! result. There is no AVX-512 variant: the machines the kernel was written
//! and measured on had none. On a CPU with AVX-512 the AVX2 kernel runs,
//! and stays the better choice there for the main job: on a 2-core Intel
//! Xeon with AVX-512, where `matrixmultiply`'s AVX-512 sgemm runs at 255
//! GFLOP/s against the tile kernel's 153, the `lmhead` step took 958 ms on
//! `matrixmultiply` against 1048 ms on the tile kernel
//! (`splitgrad bench lmhead --reference`), but the main job's grouped head
//! ran 1.7× faster on the tile kernel (V 8000, D 64: 68,500 against
//! 37,000–41,000 tokens/s; 1.1–1.2× at D 512; `splitgrad bench --sweep`
//! beside a build that sent the products to `matrixmultiply`).
//!
//! `matrixmultiply` ([`crate::kernels::Real::gemm`]) stays the reference
//! and the fallback: f64, and f32 on a CPU without AVX2 and FMA (or with
//! `SPLITGRAD_SIMD=baseline`), go through it.

pub mod head;
pub mod micro;
pub mod pack;

use ndarray::{Array2, ArrayView2, ArrayViewMut2};
use rayon::prelude::*;

use micro::{Dst, Lhs, MR, NR, Rhs, Tile, TileFn};

/// A variant of the micro-kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Plain Rust, one `mul_add` per step: the reference (slow where the CPU
    /// has no FMA, since `mul_add` is then computed in software).
    Scalar,
    /// AVX2 and FMA (x86-64).
    Avx2Fma,
}

impl Isa {
    /// Every variant, the reference first.
    pub const ALL: [Isa; 2] = [Isa::Scalar, Isa::Avx2Fma];

    /// Whether this CPU can run the variant.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Fma => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2Fma => false,
        }
    }

    /// The fast variant of this CPU, checked once: `Some(Avx2Fma)` where the
    /// CPU has AVX2 and FMA, unless `SPLITGRAD_SIMD=baseline`; `None`
    /// otherwise (the callers then use `matrixmultiply`).
    pub fn fast() -> Option<Isa> {
        use std::sync::OnceLock;
        static FAST: OnceLock<Option<Isa>> = OnceLock::new();
        *FAST.get_or_init(|| {
            (!super::exp::baseline_forced() && Isa::Avx2Fma.available()).then_some(Isa::Avx2Fma)
        })
    }

    /// The variant's tile kernel.
    ///
    /// **Panics** if the CPU cannot run it.
    #[track_caller]
    pub fn tile_fn(self) -> TileFn {
        assert!(self.available(), "{self:?} is not available on this CPU");
        match self {
            Isa::Scalar => micro::tile_scalar,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Fma => micro::avx2::tile,
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2Fma => unreachable!("checked above"),
        }
    }
}

/// `a` as the f32 view it is, when `T` is `f32`.
pub fn f32_view<'a, T: super::Real>(a: ArrayView2<'a, T>) -> Option<ArrayView2<'a, f32>> {
    match T::real_view(a.into_dyn()) {
        super::real::RealView::F32(v) => v.into_dimensionality().ok(),
        super::real::RealView::F64(_) => None,
    }
}

/// `a` as the mutable f32 view it is, when `T` is `f32` and `a`'s strides
/// are not negative.
pub fn f32_view_mut<'a, T: super::Real>(
    mut a: ArrayViewMut2<'a, T>,
) -> Option<ArrayViewMut2<'a, f32>> {
    let (dim, (rs, cs)) = (a.dim(), (a.strides()[0], a.strides()[1]));
    (T::NAME == "f32" && rs >= 0 && cs >= 0).then(|| {
        // SAFETY: `T` is the sealed `Real` whose NAME is "f32", so `T` is
        // `f32` (same size, alignment and bit validity); the new view has
        // `a`'s shape, non-negative strides, pointer and lifetime, and the
        // borrow stays unique.
        unsafe {
            ArrayViewMut2::from_shape_ptr(
                ndarray::ShapeBuilder::strides(dim, (rs as usize, cs as usize)),
                a.as_mut_ptr().cast::<f32>(),
            )
        }
    })
}

/// Depth of a block of k in [`gemm`]: a 16-column panel of B is 16 KiB.
const KC: usize = 256;
/// Rows of C per task in [`gemm`] (12 tiles).
const MC: usize = 72;
/// Columns of C per block in [`gemm`].
const NC: usize = 2048;

/// `c ← a·b`, or `c ← c + a·b` when `accumulate`, with the micro-kernel of
/// `isa`. a: (m, k), b: (k, n), c: (m, n), any strides. Each element is one
/// chain of fused multiply-adds in increasing k (from 0, or from c's
/// value), whatever the blocking or the thread count: every variant gives
/// the same bits. Blocks of C's rows run in parallel.
///
/// **Panics** if the shapes do not agree or `isa` is not available.
///
/// ```
/// use ndarray::array;
/// use splitgrad::kernels::gemm::{gemm, Isa};
/// let a = array![[1.0f32, 2.0], [3.0, 4.0]];
/// let b = array![[5.0f32, 6.0], [7.0, 8.0]];
/// let mut c = ndarray::Array2::zeros((2, 2));
/// gemm(Isa::Scalar, a.view(), b.view(), c.view_mut(), false);
/// assert_eq!(c, array![[19.0, 22.0], [43.0, 50.0]]);
/// ```
#[track_caller]
pub fn gemm(
    isa: Isa,
    a: ArrayView2<'_, f32>,
    b: ArrayView2<'_, f32>,
    mut c: ArrayViewMut2<'_, f32>,
    accumulate: bool,
) {
    let (m, k) = a.dim();
    let (k2, n) = b.dim();
    assert!(
        k == k2 && c.dim() == (m, n),
        "gemm: shapes ({m}, {k}) · ({k2}, {n}) → {:?} do not agree",
        c.dim()
    );
    let tile = isa.tile_fn();
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            c.fill(0.0);
        }
        return;
    }
    let (rsc, csc) = (c.strides()[0], c.strides()[1]);
    let cptr = SendPtr(c.as_mut_ptr());
    let mut bpack = Vec::new();
    for j0 in (0..n).step_by(NC) {
        let nc = NC.min(n - j0);
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            pack::pack_cols(b, k0, kc, j0, nc, &mut bpack);
            let from_c = accumulate || k0 > 0;
            let bp = &bpack;
            (0..m.div_ceil(MC))
                .into_par_iter()
                .for_each_init(Vec::new, |apack, blk| {
                    let i0 = blk * MC;
                    let mc = MC.min(m - i0);
                    pack::pack_rows(a, i0, mc, k0, kc, apack);
                    let mut t: Tile = [[0.0; NR]; MR];
                    for jp in 0..nc.div_ceil(NR) {
                        let cols = NR.min(nc - jp * NR);
                        for ip in 0..mc.div_ceil(MR) {
                            let rows = MR.min(mc - ip * MR);
                            let (ci, cj) = (i0 + ip * MR, j0 + jp * NR);
                            let lhs = Lhs::strided(apack[ip * MR * kc..].as_ptr(), 1, MR);
                            let rhs = Rhs {
                                ptr: bp[jp * NR * kc..].as_ptr(),
                                rs: NR,
                            };
                            if cols == NR && csc == 1 && rsc >= 0 {
                                // SAFETY: the packed panels hold kc steps of
                                // MR rows and NR columns (zero-padded); rows
                                // ci..ci + rows, columns cj..cj + 16 are
                                // inside c, which this task alone writes for
                                // rows i0..i0 + mc (tasks own disjoint rows);
                                // `isa` was checked to be available.
                                unsafe {
                                    let dst = Dst {
                                        ptr: cptr.get().offset(ci as isize * rsc + cj as isize),
                                        rs: rsc as usize,
                                    };
                                    tile(kc, rows, lhs, rhs, dst, from_c)
                                };
                                continue;
                            }
                            let block = CBlock {
                                c: cptr.get(),
                                rsc,
                                csc,
                                ci,
                                cj,
                                rows,
                                cols,
                            };
                            // SAFETY: (ci + r, cj + j) for r < rows, j < cols
                            // is inside c, owned by this task as above.
                            unsafe { block.load(from_c, &mut t) };
                            // SAFETY: as above, into the tile.
                            unsafe { tile(kc, rows, lhs, rhs, Dst::tile(&mut t), from_c) };
                            // SAFETY: as for the load.
                            unsafe { block.store(&t) };
                        }
                    }
                });
        }
    }
}

/// A pointer that may cross to other threads (each writes its own part).
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);

impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}
// SAFETY: the tasks that share it write disjoint elements.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

/// A (rows × cols) block of C at (ci, cj), C at `c` with strides (rsc, csc).
struct CBlock {
    c: *mut f32,
    rsc: isize,
    csc: isize,
    ci: usize,
    cj: usize,
    rows: usize,
    cols: usize,
}

impl CBlock {
    /// The address of element (ci + r, cj).
    ///
    /// # Safety
    ///
    /// Row ci + r must be inside C.
    unsafe fn row(&self, r: usize) -> *mut f32 {
        // SAFETY: row ci + r, columns cj..cj + cols are inside C (the
        // caller's contract).
        unsafe {
            self.c
                .offset((self.ci + r) as isize * self.rsc + self.cj as isize * self.csc)
        }
    }

    /// Copies the block into `t` (zeros elsewhere), or zeros when `!from_c`.
    ///
    /// # Safety
    ///
    /// The block must be inside C.
    unsafe fn load(&self, from_c: bool, t: &mut Tile) {
        if !from_c {
            *t = [[0.0; NR]; MR];
            return;
        }
        for (r, row) in t.iter_mut().enumerate() {
            if r >= self.rows {
                *row = [0.0; NR];
                continue;
            }
            // SAFETY: row ci + r is inside the block, which the caller
            // guarantees.
            let base = unsafe { self.row(r) };
            for (j, x) in row.iter_mut().enumerate() {
                // SAFETY: as above, for j < cols.
                *x = if j < self.cols {
                    unsafe { *base.offset(j as isize * self.csc) }
                } else {
                    0.0
                };
            }
        }
    }

    /// Writes the (rows × cols) corner of `t` into the block.
    ///
    /// # Safety
    ///
    /// As [`CBlock::load`], and nothing else may access the block meanwhile.
    unsafe fn store(&self, t: &Tile) {
        for (r, row) in t.iter().enumerate().take(self.rows) {
            // SAFETY: row ci + r is inside the block, which the caller
            // guarantees.
            let base = unsafe { self.row(r) };
            if self.csc == 1 && self.cols == NR {
                // SAFETY: the 16 floats of the row are inside the block.
                unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), base, NR) };
            } else {
                for (j, &x) in row.iter().enumerate().take(self.cols) {
                    // SAFETY: as above, for j < cols.
                    unsafe { *base.offset(j as isize * self.csc) = x };
                }
            }
        }
    }
}

/// The naive twin of [`gemm`]: `a·b` by the textbook triple loop, each sum
/// in f64 in increasing k, rounded once.
///
/// ```
/// use ndarray::array;
/// use splitgrad::kernels::gemm::gemm_naive;
/// assert_eq!(gemm_naive(array![[1.0f32, 2.0]].view(), array![[3.0f32], [4.0]].view()), array![[11.0]]);
/// ```
pub fn gemm_naive(a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>) -> Array2<f32> {
    let (m, k) = a.dim();
    assert_eq!(k, b.nrows(), "gemm_naive: inner sizes differ");
    Array2::from_shape_fn((m, b.ncols()), |(i, j)| {
        (0..k)
            .map(|kk| a[[i, kk]] as f64 * b[[kk, j]] as f64)
            .sum::<f64>() as f32
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_is_available_when_chosen() {
        if let Some(isa) = Isa::fast() {
            assert!(isa.available());
        }
        assert!(Isa::Scalar.available());
    }
}
