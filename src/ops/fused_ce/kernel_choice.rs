//! Which products the fused heads run on ([`HeadKernel`]), their chunk
//! sizes ([`ChunkSizes`]), and the f32 views of the inputs the tile kernel
//! takes (`None` where it cannot run: the element type is not f32).

use ndarray::ArrayView2;

use crate::kernels::Real;
use crate::kernels::gemm::{self, Isa};
use crate::kernels::pool::Pool;

/// The products the fused cross-entropy runs on.
///
/// ```
/// use splitgrad::ops::fused_ce::HeadKernel;
/// assert_eq!(HeadKernel::default(), HeadKernel::Auto);
/// assert_eq!(HeadKernel::Matrixmultiply.isa::<f32>(), None);
/// assert_eq!(HeadKernel::Auto.isa::<f64>(), None);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HeadKernel {
    /// The tile kernel ([`Isa::fast`]) for f32 where the CPU has AVX2 and
    /// FMA; `matrixmultiply` otherwise.
    #[default]
    Auto,
    /// `matrixmultiply`, the reference.
    Matrixmultiply,
    /// The tile kernel of this variant, for f32 (f64 uses `matrixmultiply`).
    ///
    /// **Panics** when used on a CPU that cannot run it.
    Tile(Isa),
}

impl HeadKernel {
    /// The tile kernel variant this choice runs for element type `T`, or
    /// `None` for `matrixmultiply`.
    pub fn isa<T: Real>(self) -> Option<Isa> {
        if T::NAME != "f32" {
            return None;
        }
        match self {
            HeadKernel::Auto => Isa::fast(),
            HeadKernel::Matrixmultiply => None,
            HeadKernel::Tile(isa) => Some(isa),
        }
    }
}

/// Chunk sizes of the fused cross-entropy: the workspace holds
/// `tokens × vocab` logits plus two `tokens × H` blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkSizes {
    /// Hidden rows per chunk.
    pub tokens: usize,
    /// Vocabulary rows per chunk.
    pub vocab: usize,
}

impl Default for ChunkSizes {
    fn default() -> Self {
        ChunkSizes {
            tokens: 256,
            vocab: 4096,
        }
    }
}

impl ChunkSizes {
    /// Bytes of workspace the kernel allocates for hidden size `h` and
    /// element type `T`: independent of N and V.
    ///
    /// ```
    /// use splitgrad::ops::fused_ce::ChunkSizes;
    /// let c = ChunkSizes { tokens: 256, vocab: 4096 };
    /// assert_eq!(c.workspace_bytes::<f32>(512), (256 * 4096 + 2 * 256 * 512) * 4);
    /// ```
    pub fn workspace_bytes<T: Real>(&self, h: usize) -> usize {
        (self.tokens * self.vocab + 2 * self.tokens * h) * std::mem::size_of::<T>()
    }
}

/// The weights as the f32 views they are, when `T` is `f32`.
pub(crate) fn f32_weights<'a, T: Real>(
    weights: &[ArrayView2<'a, T>],
) -> Option<Vec<ArrayView2<'a, f32>>> {
    weights.iter().map(|&w| gemm::f32_view(w)).collect()
}

/// `pool` as the f32 pool it is, when `T` is `f32`.
pub(crate) fn pool_f32<T: Real>(pool: &Pool<T>) -> Option<&Pool<f32>> {
    (T::NAME == "f32").then(|| {
        // SAFETY: `T` is the sealed `Real` whose NAME is "f32", so `T` is
        // `f32` and `Pool<T>` is `Pool<f32>`.
        unsafe { &*(pool as *const Pool<T>).cast::<Pool<f32>>() }
    })
}
