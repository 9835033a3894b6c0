//! Kernels: the loops under the ops, on plain slices and `ndarray` views.
//!
//! Nothing here knows the tape, an op or a layer: a kernel takes arrays and
//! returns arrays, and panics only on a caller's bug (shapes that disagree,
//! an index out of range), which the layers rule out before calling. Each
//! fast kernel has a naive twin the tests hold it equal to, bit for bit
//! where the docs say so.
//!
//! | module | what |
//! |---|---|
//! | [`real`] | the element types `f32`/`f64` and their `matrixmultiply` gemm |
//! | [`gemm`] | the f32 tile kernel (scalar, AVX2 + FMA) and the fused LM head's products on it |
//! | [`half`] | bf16 and f16 storage: widening to f32, narrowing by rounding to nearest or stochastically ([`HalfFloat`], [`SrKey`]) |
//! | [`exp`] | the vectorised softmax arithmetic (row max, `Σ exp`, scaled `exp`) |
//! | [`reduce`] | the blocked inner product, scaled copies and adds |
//! | [`rows`] | row copies (gathers), dense row scatter-adds, and a table's rows read as kept ([`TableRows`](rows::TableRows): half-precision rows widened one at a time) |
//! | [`scatter`] | coalescing a row scatter-add: the sorted unique rows and their sums ([`Coalesced`](scatter::Coalesced)) |
//! | [`pool`] | a pool of large buffers, reused across training steps |
//! | [`routing`] | global id → (split, local row) for split vocabularies |
//! | `stream` | copies with streaming (non-temporal) stores |
//! | [`wide`] | portable loops compiled for the widest vector unit the CPU has (the same bits on every path) |

pub mod exp;
pub mod gemm;
pub mod half;
pub mod pool;
pub mod real;
pub mod reduce;
pub mod routing;
pub mod rows;
pub mod scatter;
pub(crate) mod stream;
pub mod wide;

pub use self::half::{HalfFloat, SrKey};
pub use real::Real;

/// The row-major multi-index of flat index `flat` in an array of `shape`
/// (what error messages name a position by).
///
/// ```
/// assert_eq!(splitgrad::kernels::unravel(23, &[2, 3, 4]), [1, 2, 3]);
/// ```
pub fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for (i, &n) in shape.iter().enumerate().rev() {
        if n > 0 {
            index[i] = flat % n;
            flat /= n;
        }
    }
    index
}

/// Below this many elements a kernel runs serially: rayon's fork costs more
/// than it saves.
pub const PAR_MIN_ELEMS: usize = 1 << 15;

/// A rayon pool of `n` threads, for the tests that hold a result to be
/// the same bits on any number of threads.
#[cfg(test)]
pub(crate) fn threads(n: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .expect("a test's thread pool")
}
