//! Copies of operands into the layouts the tile kernel streams: panels of
//! [`MR`] rows or [`NR`] columns, k-major, zero-padded to whole panels.

use std::mem::MaybeUninit;

use ndarray::ArrayView2;

use super::micro::{MR, NR};

/// Packs rows `i0..i0 + mc` × columns `k0..k0 + kc` of `a` as panels of
/// [`MR`] rows: `out[p·kc·MR + kk·MR + r] = a[i0 + p·MR + r, k0 + kk]`, zero
/// past row `i0 + mc`. `out` is resized to `ceil(mc / MR)·kc·MR`.
///
/// ```
/// use ndarray::array;
/// use splitgrad::kernels::gemm::pack::pack_rows;
/// let a = array![[1.0f32, 2.0], [3.0, 4.0]];
/// let mut out = Vec::new();
/// pack_rows(a.view(), 0, 2, 0, 2, &mut out);
/// assert_eq!(&out[..8], &[1.0, 3.0, 0.0, 0.0, 0.0, 0.0, 2.0, 4.0]);
/// ```
pub fn pack_rows(
    a: ArrayView2<'_, f32>,
    i0: usize,
    mc: usize,
    k0: usize,
    kc: usize,
    out: &mut Vec<f32>,
) {
    let panels = mc.div_ceil(MR);
    out.clear();
    out.resize(panels * kc * MR, 0.0);
    for p in 0..panels {
        let dst = &mut out[p * kc * MR..(p + 1) * kc * MR];
        for r in 0..MR.min(mc - p * MR) {
            let row = a.row(i0 + p * MR + r);
            for kk in 0..kc {
                dst[kk * MR + r] = row[k0 + kk];
            }
        }
    }
}

/// Packs rows `k0..k0 + kc` × columns `j0..j0 + nc` of `b` as panels of
/// [`NR`] columns: `out[p·kc·NR + kk·NR + j] = b[k0 + kk, j0 + p·NR + j]`,
/// zero past column `j0 + nc`. `out` is resized to `ceil(nc / NR)·kc·NR`.
///
/// ```
/// use ndarray::array;
/// use splitgrad::kernels::gemm::pack::pack_cols;
/// let b = array![[1.0f32, 2.0], [3.0, 4.0]];
/// let mut out = Vec::new();
/// pack_cols(b.view(), 0, 2, 0, 2, &mut out);
/// assert_eq!(&out[..2], &[1.0, 2.0]);
/// assert_eq!(&out[16..18], &[3.0, 4.0]);
/// ```
pub fn pack_cols(
    b: ArrayView2<'_, f32>,
    k0: usize,
    kc: usize,
    j0: usize,
    nc: usize,
    out: &mut Vec<f32>,
) {
    let panels = nc.div_ceil(NR);
    out.clear();
    out.resize(panels * kc * NR, 0.0);
    for p in 0..panels {
        let cols = NR.min(nc - p * NR);
        let dst = &mut out[p * kc * NR..(p + 1) * kc * NR];
        for kk in 0..kc {
            let row = b.row(k0 + kk);
            let d = &mut dst[kk * NR..kk * NR + cols];
            match row.as_slice() {
                Some(s) => d.copy_from_slice(&s[j0 + p * NR..j0 + p * NR + cols]),
                None => {
                    for (j, x) in d.iter_mut().enumerate() {
                        *x = row[j0 + p * NR + j];
                    }
                }
            }
        }
    }
}

/// Packs the transpose of `w` (rows v, columns h) as panels of [`MR`]
/// columns of `w`, for the products whose broadcast operand is `wᵀ`:
/// `out[p·stride + (v_off + v)·MR + r] = w[v, p·MR + r]` for every row v of
/// `w` and panel p < ceil(H / MR), zero past column H. `out` must hold
/// `ceil(H / MR)·stride` floats, with `stride ≥ (v_off + rows)·MR`; it may
/// be uninitialised (the elements named are written, no others).
///
/// ```
/// use ndarray::array;
/// use splitgrad::kernels::gemm::pack::pack_transposed_into;
/// let w = array![[1.0f32, 2.0], [3.0, 4.0]];
/// let mut out: Vec<f32> = Vec::with_capacity(12);
/// pack_transposed_into(w.view(), 0, 12, &mut out.spare_capacity_mut()[..12]);
/// // SAFETY: the two rows of one panel of stride 12 are all 12 elements.
/// unsafe { out.set_len(12) };
/// assert_eq!(out, [1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0]);
/// ```
///
/// **Panics** if `out` is too short.
pub fn pack_transposed_into(
    w: ArrayView2<'_, f32>,
    v_off: usize,
    stride: usize,
    out: &mut [MaybeUninit<f32>],
) {
    let (rows, h) = w.dim();
    let panels = h.div_ceil(MR);
    assert!(
        stride >= (v_off + rows) * MR && out.len() >= panels * stride,
        "pack_transposed_into: {} floats for {panels} panels of stride {stride}",
        out.len()
    );
    for (v, row) in w.outer_iter().enumerate() {
        let base = (v_off + v) * MR;
        match row.as_slice() {
            Some(s) => {
                for p in 0..panels {
                    let cols = MR.min(h - p * MR);
                    let d = &mut out[p * stride + base..p * stride + base + MR];
                    for (r, x) in d.iter_mut().enumerate() {
                        x.write(if r < cols { s[p * MR + r] } else { 0.0 });
                    }
                }
            }
            None => {
                for p in 0..panels {
                    for r in 0..MR {
                        let c = p * MR + r;
                        out[p * stride + base + r].write(if c < h { row[c] } else { 0.0 });
                    }
                }
            }
        }
    }
}
