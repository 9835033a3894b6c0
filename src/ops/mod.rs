//! The primitive ops, one module each: forward, backward and the
//! [`Tape`](crate::Tape) method that records the op.
//!
//! Each `*_backward` function **adds** (`+=`) its contribution into the
//! gradient buffer of an input, so a value used twice accumulates both.
//! The derivation of every backward step is in `docs/gradients.md`, one
//! section per op.

pub mod cross_entropy;
pub mod elementwise;
pub mod exp;
pub mod fusion_penalty;
pub mod gather;
pub mod matmul;
pub mod reduce;
pub mod routing;
pub mod row_norm;
pub mod row_scale;
pub mod scatter;
pub mod segment;
pub mod select;
pub mod shape;
pub mod sigmoid;
mod stream;

/// Below this many elements a kernel runs serially: rayon's fork costs more
/// than it saves.
pub(crate) const PAR_MIN_ELEMS: usize = 1 << 15;
