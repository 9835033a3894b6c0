//! Portable loops compiled for the widest vector unit the CPU has.
//!
//! The crate is built for baseline x86-64, whose vectors hold four f32. A
//! loop written on plain slices (an element rule, or a sum in a fixed
//! number of interleaved partial sums) is the same sequence of IEEE
//! operations whatever it is compiled for: Rust never reassociates or
//! fuses floating-point operations, so compiling it for AVX2 or AVX-512
//! changes how many elements an instruction holds, never a result's bits.
//! [`wide`] runs a closure compiled so, on the path
//! [`HalfPath::chosen`] picks (and `SPLITGRAD_SIMD` forces): the plain
//! code is its naive twin, and the tests that run under every forced path
//! hold them equal.

use super::half::HalfPath;

/// `f()`, with `f` (and what it inlines) compiled for the widest vector
/// unit of [`HalfPath::chosen`]: AVX-512F, else AVX2, else baseline.
///
/// For a loop's sake `f` should do the work itself, or through functions
/// marked `#[inline]`: a call that is not inlined runs as compiled for
/// baseline.
///
/// ```
/// use splitgrad::kernels::wide::wide;
/// let (x, mut y) = ([1.0f32, 2.0, 3.0], [0.5f32; 3]);
/// wide(|| y.iter_mut().zip(&x).for_each(|(y, &x)| *y += 2.0 * x));
/// assert_eq!(y, [2.5, 4.5, 6.5]);
/// ```
#[inline(always)]
pub fn wide<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f")]
        fn avx512<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        #[target_feature(enable = "avx2")]
        fn avx2<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        match HalfPath::chosen() {
            // SAFETY: the chosen path is one this CPU runs.
            HalfPath::Avx512 => return unsafe { avx512(f) },
            // SAFETY: as above (the AVX2 path needs AVX2).
            HalfPath::Avx2 => return unsafe { avx2(f) },
            HalfPath::Scalar => {}
        }
    }
    f()
}

/// Defines `fn $name<T: Real>(args) -> R` whose body, marked
/// `#[inline(always)]`, is compiled three times (AVX-512F, AVX2, baseline)
/// and run on the path of [`HalfPath::chosen`]: [`wide`] for a body too
/// large for the compiler to inline into a closure's wrapper.
macro_rules! wide_fn {
    (
        $(#[$attr:meta])*
        $vis:vis fn $name:ident<$T:ident: Real>($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?
        $body:block
    ) => {
        $(#[$attr])*
        $vis fn $name<$T: $crate::kernels::Real>($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body<$T: $crate::kernels::Real>($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                use $crate::kernels::half::HalfPath;
                #[target_feature(enable = "avx512f")]
                fn avx512<$T: $crate::kernels::Real>($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                fn avx2<$T: $crate::kernels::Real>($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                match HalfPath::chosen() {
                    // SAFETY: the chosen path is one this CPU runs.
                    HalfPath::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: as above (the AVX2 path needs AVX2).
                    HalfPath::Avx2 => return unsafe { avx2($($arg),*) },
                    HalfPath::Scalar => {}
                }
            }
            body($($arg),*)
        }
    };
}
pub(crate) use wide_fn;
