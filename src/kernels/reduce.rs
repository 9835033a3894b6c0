//! Reduction kernels: a blocked inner product whose summation order is
//! fixed, and the scaled copies and adds of a gradient `c·R`.
//!
//! The inner product is summed in a fixed order whatever the number of
//! threads: blocks of [`DOT_BLOCK`] elements, each summed in
//! [`DOT_LANES`] interleaved partial sums (element i goes to lane
//! i mod [`DOT_LANES`], which the compiler turns into vector adds), the lanes
//! then added left to right, and the block sums added in block order.
//! [`dot_naive`] is the one-accumulator twin.

use ndarray::{ArrayD, ArrayViewD, Zip};
use rayon::prelude::*;

use super::Real;
use super::pool::Pool;

/// `g += c·r`, in parallel blocks when both are contiguous and large.
///
/// **Panics** if the shapes differ.
#[track_caller]
pub fn add_scaled<T: Real>(c: T, r: ArrayViewD<'_, T>, g: &mut ArrayD<T>) {
    assert_eq!(
        g.shape(),
        r.shape(),
        "add_scaled: shapes {:?} and {:?} differ",
        g.shape(),
        r.shape()
    );
    match (g.as_slice_mut(), r.as_slice()) {
        (Some(g), Some(r)) if g.len() >= super::PAR_MIN_ELEMS => g
            .par_chunks_mut(DOT_BLOCK)
            .zip(r.par_chunks(DOT_BLOCK))
            .for_each(|(g, r)| g.iter_mut().zip(r).for_each(|(g, &r)| *g += c * r)),
        _ => Zip::from(g).and(&r).for_each(|g, &r| *g += c * r),
    }
}

/// `c·r + 0` as a new array in standard layout, in one pass: the bits
/// [`add_scaled`] leaves in a zero buffer, without writing the zeros first.
pub fn scaled_copy<T: Real>(c: T, r: ArrayViewD<'_, T>) -> ArrayD<T> {
    scaled_copy_in(&Pool::new(), c, r)
}

/// [`scaled_copy`] into a buffer from `pool`.
pub fn scaled_copy_in<T: Real>(pool: &Pool<T>, c: T, r: ArrayViewD<'_, T>) -> ArrayD<T> {
    let mut v = pool.take_vec(r.len());
    match r.as_slice() {
        Some(s) if s.len() >= super::PAR_MIN_ELEMS => {
            s.par_iter()
                .map(|&x| c * x + T::zero())
                .collect_into_vec(&mut v);
        }
        // Logical order, so the result is in standard layout whatever r's.
        _ => v.extend(r.iter().map(|&x| c * x + T::zero())),
    }
    ArrayD::from_shape_vec(r.raw_dim(), v).expect("one element per element")
}

/// Elements per block of the inner product.
pub const DOT_BLOCK: usize = 1 << 14;
/// Partial sums per block of the inner product.
pub const DOT_LANES: usize = 16;

/// `Σ x ⊙ r` over two slices of one length, in the fixed order of the
/// module docs, blocks in parallel.
///
/// **Panics** if the lengths differ.
#[track_caller]
pub fn dot_slices<T: Real>(x: &[T], r: &[T]) -> T {
    same_length(x, r);
    let block = |(x, r): (&[T], &[T])| dot_block(x, r);
    let sums: Vec<T> = if x.len() >= super::PAR_MIN_ELEMS {
        x.par_chunks(DOT_BLOCK)
            .zip(r.par_chunks(DOT_BLOCK))
            .map(block)
            .collect()
    } else {
        x.chunks(DOT_BLOCK)
            .zip(r.chunks(DOT_BLOCK))
            .map(block)
            .collect()
    };
    sums.into_iter().fold(T::zero(), |acc, s| acc + s)
}

/// [`dot_slices`] of two half-precision slices, widened (exactly) a few
/// hundred elements at a time: the bits of `dot_slices` of the widened
/// slices.
///
/// **Panics** if the lengths differ.
#[track_caller]
pub fn dot_half<T: Real, H: super::HalfFloat>(x: &[H], r: &[H]) -> T {
    same_length(x, r);
    let path = super::half::HalfPath::chosen();
    let block = |(x, r): (&[H], &[H])| {
        if T::NAME == "f32" {
            // Widened in registers: the same lanes, the same bits.
            let mut lanes = [0.0f32; DOT_LANES];
            super::half::dot_lanes_on(path, x, r, &mut lanes);
            return lanes
                .into_iter()
                .fold(T::zero(), |acc, s| acc + T::from_f64(f64::from(s)));
        }
        const STEP: usize = 256;
        let (mut bx, mut br) = ([T::zero(); STEP], [T::zero(); STEP]);
        let mut lanes = [T::zero(); DOT_LANES];
        for (xs, rs) in x.chunks(STEP).zip(r.chunks(STEP)) {
            let (bx, br) = (&mut bx[..xs.len()], &mut br[..rs.len()]);
            T::widen_half(xs, bx);
            T::widen_half(rs, br);
            // STEP is a multiple of DOT_LANES: every element keeps its
            // lane of `dot_block`.
            let mut xc = bx.chunks_exact(DOT_LANES);
            let mut rc = br.chunks_exact(DOT_LANES);
            for (a, b) in (&mut xc).zip(&mut rc) {
                for l in 0..DOT_LANES {
                    lanes[l] += a[l] * b[l];
                }
            }
            for (l, (&a, &b)) in xc.remainder().iter().zip(rc.remainder()).enumerate() {
                lanes[l] += a * b;
            }
        }
        lanes.into_iter().fold(T::zero(), |acc, s| acc + s)
    };
    let sums: Vec<T> = if x.len() >= super::PAR_MIN_ELEMS {
        x.par_chunks(DOT_BLOCK)
            .zip(r.par_chunks(DOT_BLOCK))
            .map(block)
            .collect()
    } else {
        x.chunks(DOT_BLOCK)
            .zip(r.chunks(DOT_BLOCK))
            .map(block)
            .collect()
    };
    sums.into_iter().fold(T::zero(), |acc, s| acc + s)
}

/// **Panics** if the two slices of an inner product differ in length.
#[track_caller]
fn same_length<T>(x: &[T], r: &[T]) {
    assert_eq!(
        x.len(),
        r.len(),
        "dot: lengths {} and {} differ",
        x.len(),
        r.len()
    );
}

/// One block: [`DOT_LANES`] interleaved sums, added left to right.
fn dot_block<T: Real>(x: &[T], r: &[T]) -> T {
    let mut lanes = [T::zero(); DOT_LANES];
    let mut xs = x.chunks_exact(DOT_LANES);
    let mut rs = r.chunks_exact(DOT_LANES);
    for (xc, rc) in (&mut xs).zip(&mut rs) {
        for l in 0..DOT_LANES {
            lanes[l] += xc[l] * rc[l];
        }
    }
    for (l, (&a, &b)) in xs.remainder().iter().zip(rs.remainder()).enumerate() {
        lanes[l] += a * b;
    }
    lanes.into_iter().fold(T::zero(), |acc, s| acc + s)
}

/// The naive twin of [`dot_slices`]: the same order, one element at a time
/// on one thread. Equal bit for bit.
pub fn dot_naive<T: Real>(x: &[T], r: &[T]) -> T {
    same_length(x, r);
    let mut total = T::zero();
    for (xb, rb) in x.chunks(DOT_BLOCK).zip(r.chunks(DOT_BLOCK)) {
        let mut lanes = [T::zero(); DOT_LANES];
        for (i, (&a, &b)) in xb.iter().zip(rb).enumerate() {
            lanes[i % DOT_LANES] += a * b;
        }
        let mut s = T::zero();
        for l in lanes {
            s += l;
        }
        total += s;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_equals_its_naive_twin_across_block_edges() {
        let mut rng = crate::Rng::new(7);
        for n in [
            0,
            1,
            15,
            16,
            17,
            DOT_BLOCK - 1,
            DOT_BLOCK,
            3 * DOT_BLOCK + 5,
        ] {
            let x: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
            let r: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
            let fast = dot_slices(&x, &r);
            assert_eq!(fast.to_bits(), dot_naive(&x, &r).to_bits(), "n = {n}");
            for threads in [1, 3] {
                let pool = crate::kernels::threads(threads);
                assert_eq!(
                    pool.install(|| dot_slices(&x, &r)).to_bits(),
                    fast.to_bits()
                );
            }
            let exact: f64 = x.iter().zip(&r).map(|(&a, &b)| a as f64 * b as f64).sum();
            assert!(
                (fast as f64 - exact).abs() <= 1e-5 * (1.0 + n as f64),
                "n = {n}"
            );
        }
    }
}
