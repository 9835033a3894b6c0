//! The element types the engine computes in: `f32` and `f64`.
//!
//! [`Real`] is sealed: it adds to [`ndarray::NdFloat`] the few things the
//! engine needs that `num-traits` does not give — exact conversions to and
//! from `f64`, the dtype name, little-endian bytes, the view of an array as
//! its concrete type, and the `matrixmultiply` kernel for the type.

use ndarray::{ArrayView2, ArrayViewMut2, NdFloat};

use super::half::{
    self, FusedArray, HalfFloat, LaneRule, SrKey, narrow_nearest, narrow_stochastic,
};

mod sealed {
    /// `matrixmultiply`'s `sgemm` or `dgemm`: m, k, n, α, a and its row
    /// and column strides, b and its strides, β, c and its strides.
    pub type RawGemm<T> = unsafe fn(
        usize,
        usize,
        usize,
        T,
        *const T,
        isize,
        isize,
        *const T,
        isize,
        isize,
        T,
        *mut T,
        isize,
        isize,
    );

    pub trait Sealed: Sized {
        /// The type's `matrixmultiply` kernel.
        const RAW_GEMM: RawGemm<Self>;
    }

    impl Sealed for f32 {
        const RAW_GEMM: RawGemm<f32> = matrixmultiply::sgemm;
    }

    impl Sealed for f64 {
        const RAW_GEMM: RawGemm<f64> = matrixmultiply::dgemm;
    }
}

/// A floating-point element type: `f32` or `f64`.
///
/// Gradient checks run in `f64`; training and the benchmarks run in `f32`.
///
/// ```
/// use splitgrad::Real;
/// assert_eq!(<f32 as Real>::NAME, "f32");
/// assert_eq!(f64::from_f64(0.5), 0.5);
/// ```
pub trait Real: NdFloat + Default + std::iter::Sum + sealed::Sealed {
    /// `"f32"` or `"f64"`.
    const NAME: &'static str;
    /// Rounds an `f64` to this type.
    fn from_f64(x: f64) -> Self;
    /// Widens this value to `f64` (exact).
    fn to_f64(self) -> f64;
    /// Little-endian bytes of one value.
    fn write_le(self, out: &mut Vec<u8>);
    /// Reads one value from exactly `size_of::<Self>()` little-endian bytes.
    fn read_le(bytes: &[u8]) -> Self;

    /// The view as the concrete type it is (for writers that store `f32`
    /// and `f64` apart).
    fn real_view(a: ndarray::ArrayViewD<'_, Self>) -> RealView<'_>;

    /// The array as the concrete type it is.
    fn into_real_array(a: ndarray::ArrayD<Self>) -> RealArray;

    /// A view of this type, if `v` holds one.
    fn from_real_view(v: RealView<'_>) -> Option<ndarray::ArrayViewD<'_, Self>>;

    /// Widens half-precision values (exact).
    ///
    /// **Panics** if the lengths differ.
    fn widen_half<H: HalfFloat>(src: &[H], dst: &mut [Self]);

    /// Narrows to half precision: to nearest (even) when `sr` is `None`,
    /// else stochastically with key `sr.0`, `src[0]` being the element of
    /// global index `sr.1` ([`narrow_stochastic`]). An `f64` value goes
    /// through `f32` first: half-precision storage computes in `f32`.
    ///
    /// **Panics** if the lengths differ.
    fn narrow_half<H: HalfFloat>(src: &[Self], dst: &mut [H], sr: Option<(SrKey, u64)>);

    /// `dst[i] += src[i]` widened, or `dst[i] += scale·src[i]` (product
    /// then sum, in `Self`): for `f32`, [`half::add_widened`].
    ///
    /// **Panics** if the lengths differ.
    fn add_widened<H: HalfFloat>(src: &[H], dst: &mut [Self], scale: Option<Self>);

    /// Whether [`Real::update_fused`] runs: `f32`'s updates of
    /// half-precision arrays are fused in registers; `f64`'s widen through
    /// buffers of `f32` ([`update_widened_in`](crate::param::update_widened_in)).
    const FUSED: bool;

    /// [`half::update_fused`] on arrays of this type (`f32`).
    ///
    /// **Panics** for `f64` ([`Real::FUSED`] is false), and as
    /// `update_fused` does.
    #[track_caller]
    fn update_fused<const N: usize, const K: usize, F: LaneRule<Self, N, K>>(
        arrays: [FusedArray<'_, Self>; N],
        inputs: [&[Self]; K],
        first: u64,
        f: F,
    );

    /// `c ← α·a·b + β·c` through `matrixmultiply`.
    ///
    /// a: (m, k), b: (k, n), c: (m, n); any strides.
    ///
    /// **Panics** if the shapes do not agree.
    #[track_caller]
    fn gemm(
        alpha: Self,
        a: ArrayView2<'_, Self>,
        b: ArrayView2<'_, Self>,
        beta: Self,
        mut c: ArrayViewMut2<'_, Self>,
    ) {
        let (m, k) = a.dim();
        let (k2, n) = b.dim();
        assert!(
            k == k2 && c.dim() == (m, n),
            "gemm: shapes ({m}, {k}) · ({k2}, {n}) → {:?} do not agree",
            c.dim()
        );
        if m == 0 || n == 0 {
            return;
        }
        let (rsa, csa) = (a.strides()[0], a.strides()[1]);
        let (rsb, csb) = (b.strides()[0], b.strides()[1]);
        let (rsc, csc) = (c.strides()[0], c.strides()[1]);
        // SAFETY: the three views are valid for their shapes and strides
        // (ndarray guarantees it), `c` is a unique mutable view so it
        // aliases neither input, and the dimensions passed are exactly the
        // views' dimensions, checked above.
        unsafe {
            <Self as sealed::Sealed>::RAW_GEMM(
                m,
                k,
                n,
                alpha,
                a.as_ptr(),
                rsa,
                csa,
                b.as_ptr(),
                rsb,
                csb,
                beta,
                c.as_mut_ptr(),
                rsc,
                csc,
            );
        }
    }
}

macro_rules! impl_real {
    ($t:ty, $name:literal, $variant:ident) => {
        impl Real for $t {
            const NAME: &'static str = $name;
            #[inline]
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            #[inline]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline]
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            #[inline]
            fn read_le(bytes: &[u8]) -> Self {
                let mut b = [0u8; std::mem::size_of::<$t>()];
                b.copy_from_slice(bytes);
                <$t>::from_le_bytes(b)
            }
            fn real_view(a: ndarray::ArrayViewD<'_, Self>) -> RealView<'_> {
                RealView::$variant(a)
            }
            fn into_real_array(a: ndarray::ArrayD<Self>) -> RealArray {
                RealArray::$variant(a)
            }
            fn from_real_view(v: RealView<'_>) -> Option<ndarray::ArrayViewD<'_, Self>> {
                match v {
                    RealView::$variant(a) => Some(a),
                    _ => None,
                }
            }
            fn widen_half<H: HalfFloat>(src: &[H], dst: &mut [Self]) {
                <$t as HalfConvert>::widen_half_impl(src, dst)
            }
            fn narrow_half<H: HalfFloat>(src: &[Self], dst: &mut [H], sr: Option<(SrKey, u64)>) {
                <$t as HalfConvert>::narrow_half_impl(src, dst, sr)
            }
            fn add_widened<H: HalfFloat>(src: &[H], dst: &mut [Self], scale: Option<Self>) {
                <$t as HalfConvert>::add_widened_impl(src, dst, scale)
            }
            const FUSED: bool = <$t as HalfConvert>::FUSED;
            #[track_caller]
            fn update_fused<const N: usize, const K: usize, F: LaneRule<Self, N, K>>(
                arrays: [FusedArray<'_, Self>; N],
                inputs: [&[Self]; K],
                first: u64,
                f: F,
            ) {
                <$t as HalfConvert>::update_fused_impl(arrays, inputs, first, f)
            }
        }
    };
}

impl_real!(f32, "f32", F32);
impl_real!(f64, "f64", F64);

/// The `Real` methods that differ between `f32` and `f64`.
trait HalfConvert: Sized {
    const FUSED: bool;
    fn widen_half_impl<H: HalfFloat>(src: &[H], dst: &mut [Self]);
    fn narrow_half_impl<H: HalfFloat>(src: &[Self], dst: &mut [H], sr: Option<(SrKey, u64)>);
    fn add_widened_impl<H: HalfFloat>(src: &[H], dst: &mut [Self], scale: Option<Self>);
    fn update_fused_impl<const N: usize, const K: usize, F: LaneRule<Self, N, K>>(
        arrays: [FusedArray<'_, Self>; N],
        inputs: [&[Self]; K],
        first: u64,
        f: F,
    );
}

impl HalfConvert for f32 {
    const FUSED: bool = true;
    fn add_widened_impl<H: HalfFloat>(src: &[H], dst: &mut [f32], scale: Option<f32>) {
        half::add_widened(src, dst, scale)
    }
    #[track_caller]
    fn update_fused_impl<const N: usize, const K: usize, F: LaneRule<f32, N, K>>(
        arrays: [FusedArray<'_, f32>; N],
        inputs: [&[f32]; K],
        first: u64,
        f: F,
    ) {
        half::update_fused(arrays, inputs, first, f)
    }
    fn widen_half_impl<H: HalfFloat>(src: &[H], dst: &mut [f32]) {
        half::widen(src, dst);
    }
    fn narrow_half_impl<H: HalfFloat>(src: &[f32], dst: &mut [H], sr: Option<(SrKey, u64)>) {
        match sr {
            None => narrow_nearest(src, dst),
            Some((key, first)) => narrow_stochastic(src, dst, key, first),
        }
    }
}

/// Elements per step of `f64`'s conversions through an `f32` buffer.
const F64_CHUNK: usize = 256;

impl HalfConvert for f64 {
    const FUSED: bool = false;
    fn add_widened_impl<H: HalfFloat>(src: &[H], dst: &mut [f64], scale: Option<f64>) {
        assert_eq!(src.len(), dst.len(), "add_widened: lengths differ");
        let mut buf = [0f64; F64_CHUNK];
        for (s, d) in src.chunks(F64_CHUNK).zip(dst.chunks_mut(F64_CHUNK)) {
            let b = &mut buf[..s.len()];
            Self::widen_half_impl(s, b);
            match scale {
                None => d.iter_mut().zip(b.iter()).for_each(|(d, &x)| *d += x),
                Some(c) => d.iter_mut().zip(b.iter()).for_each(|(d, &x)| *d += c * x),
            }
        }
    }
    #[track_caller]
    fn update_fused_impl<const N: usize, const K: usize, F: LaneRule<f64, N, K>>(
        _: [FusedArray<'_, f64>; N],
        _: [&[f64]; K],
        _: u64,
        _: F,
    ) {
        panic!("update_fused: f64 updates widen through f32 buffers (Real::FUSED is false)")
    }
    fn widen_half_impl<H: HalfFloat>(src: &[H], dst: &mut [f64]) {
        assert_eq!(src.len(), dst.len(), "widen_half: lengths differ");
        let mut buf = [0f32; F64_CHUNK];
        for (s, d) in src.chunks(F64_CHUNK).zip(dst.chunks_mut(F64_CHUNK)) {
            let b = &mut buf[..s.len()];
            half::widen(s, b);
            d.iter_mut().zip(b.iter()).for_each(|(d, &x)| *d = x as f64);
        }
    }
    fn narrow_half_impl<H: HalfFloat>(src: &[f64], dst: &mut [H], sr: Option<(SrKey, u64)>) {
        assert_eq!(src.len(), dst.len(), "narrow_half: lengths differ");
        let mut buf = [0f32; F64_CHUNK];
        for (i, (s, d)) in src
            .chunks(F64_CHUNK)
            .zip(dst.chunks_mut(F64_CHUNK))
            .enumerate()
        {
            let b = &mut buf[..s.len()];
            b.iter_mut().zip(s).for_each(|(b, &x)| *b = x as f32);
            let sr = sr.map(|(k, first)| (k, first.wrapping_add((i * F64_CHUNK) as u64)));
            f32::narrow_half_impl(b, d, sr);
        }
    }
}

/// An owned array of a [`Real`] type, as the type it is.
#[derive(Clone, Debug, PartialEq)]
pub enum RealArray {
    /// An `f32` array.
    F32(ndarray::ArrayD<f32>),
    /// An `f64` array.
    F64(ndarray::ArrayD<f64>),
}

/// A view of an array of a [`Real`] type, as the type it is.
#[derive(Clone, Debug)]
pub enum RealView<'a> {
    /// An `f32` array.
    F32(ndarray::ArrayViewD<'a, f32>),
    /// An `f64` array.
    F64(ndarray::ArrayViewD<'a, f64>),
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array2, array};

    #[test]
    fn gemm_matches_hand_product() {
        let a = array![[1.0f64, 2.0], [3.0, 4.0], [5.0, 6.0]];
        let b = array![[1.0f64, 0.0, 2.0], [0.0, 1.0, 3.0]];
        let mut c = Array2::<f64>::ones((3, 3));
        f64::gemm(1.0, a.view(), b.view(), 2.0, c.view_mut());
        assert_eq!(
            c,
            array![[3.0, 4.0, 10.0], [5.0, 6.0, 20.0], [7.0, 8.0, 30.0]]
        );
        // Transposed views (column-major strides) work too.
        let mut d = Array2::<f64>::zeros((2, 2));
        f64::gemm(1.0, a.t(), a.view(), 0.0, d.view_mut());
        assert_eq!(d, array![[35.0, 44.0], [44.0, 56.0]]);
    }

    #[test]
    fn bytes_round_trip() {
        let mut v = Vec::new();
        1.5f32.write_le(&mut v);
        (-2.25f64).write_le(&mut v);
        assert_eq!(f32::read_le(&v[..4]), 1.5);
        assert_eq!(f64::read_le(&v[4..]), -2.25);
    }
}
