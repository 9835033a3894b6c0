//! How many tokens a chunk of the summed head holds ([`SumChunks`]): a
//! chunk's logits against the whole vocabulary are its workspace.

use crate::kernels::Real;

/// Token chunks of the summed kernel. A chunk's logits against the whole
/// vocabulary (`chunk_tokens × V`) are its workspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SumChunks {
    /// As many tokens as a block of logits of at most this many bytes
    /// holds, `budget / (V·size_of::<T>())`, rounded down to a multiple of
    /// [`SumChunks::ALIGN`] when it is at least that, else of
    /// [`SumChunks::PANEL`] when it is at least that, and at least 1.
    Budget(usize),
    /// Exactly this many tokens (at least 1), whatever the workspace.
    Tokens(usize),
}

impl Default for SumChunks {
    /// A budget of 32 MiB: 256 tokens of a 32256-word vocabulary in f32.
    fn default() -> Self {
        SumChunks::Budget(32 << 20)
    }
}

impl SumChunks {
    /// The multiple a budgeted chunk is rounded down to: matrixmultiply
    /// sums the inner dimension in blocks of 256, and the inner dimension
    /// of `∂W_k += G_{c,k}ᵀ·h_c` is the chunk's token count, so a chunk of
    /// 260 tokens would cost a second pass over ∂W (V × H) for 4 tokens.
    pub const ALIGN: usize = 256;

    /// The multiple a budgeted chunk below [`SumChunks::ALIGN`] is rounded
    /// down to: the tile kernel takes the chunk's rows 16 at a time, so a
    /// chunk of 65 would compute a whole panel of 16 for its last row.
    pub const PANEL: usize = 16;

    /// Tokens per chunk for a vocabulary of `v` words in `T`: at least 1.
    ///
    /// ```
    /// use splitgrad::ops::fused_ce_sum::SumChunks;
    /// assert_eq!(SumChunks::default().tokens::<f32>(32256), 256);
    /// assert_eq!(SumChunks::Budget(100 * 5 * 8).tokens::<f64>(5), 96);
    /// assert_eq!(SumChunks::Budget(10 * 5 * 8).tokens::<f64>(5), 10);
    /// assert_eq!(SumChunks::Budget(0).tokens::<f64>(5), 1);
    /// // 32 MiB of a 128000-word vocabulary: 65 rows, rounded to 64.
    /// assert_eq!(SumChunks::default().tokens::<f32>(128_000), 64);
    /// assert_eq!(SumChunks::Tokens(3).tokens::<f32>(32256), 3);
    /// ```
    pub fn tokens<T: Real>(&self, v: usize) -> usize {
        match *self {
            SumChunks::Budget(bytes) => {
                let t = bytes / (v.max(1) * std::mem::size_of::<T>());
                if t >= Self::ALIGN {
                    t / Self::ALIGN * Self::ALIGN
                } else if t >= Self::PANEL {
                    t / Self::PANEL * Self::PANEL
                } else {
                    t.max(1)
                }
            }
            SumChunks::Tokens(t) => t.max(1),
        }
    }

    /// Bytes of workspace the kernel allocates for at most `n` tokens, a
    /// vocabulary of `v` words and hidden size `h` in `T`: the block of
    /// logits (`chunk × V`) and two `chunk × H` blocks (the chunk's hidden
    /// rows and their gradient), where the chunk is [`Self::tokens`] but
    /// never more than N. Bounded independently of N; the gradients the
    /// kernel returns are not counted.
    ///
    /// ```
    /// use splitgrad::ops::fused_ce_sum::SumChunks;
    /// let c = SumChunks::default();
    /// assert_eq!(c.workspace_bytes::<f32>(2048, 32256, 512), (256 * 32256 + 2 * 256 * 512) * 4);
    /// assert_eq!(c.workspace_bytes::<f32>(10, 32256, 512), (10 * 32256 + 2 * 10 * 512) * 4);
    /// ```
    pub fn workspace_bytes<T: Real>(&self, n: usize, v: usize, h: usize) -> usize {
        let t = self.tokens::<T>(v).min(n).max(1);
        (t * v + 2 * t * h) * std::mem::size_of::<T>()
    }
}
