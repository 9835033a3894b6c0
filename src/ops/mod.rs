//! The differentiable ops, one module each: the forward, the state it
//! saves, the backward, and the [`Tape`](crate::Tape) method that records
//! the op, side by side.
//!
//! Each op's saved state implements [`Backward`](crate::tape::Backward),
//! whose `backward` calls the op's documented `*_backward` function; each
//! `*_backward` **adds** (`+=`) its contribution into the gradient of an
//! input, so a value used twice accumulates both. `docs/gradients.md`
//! derives every backward step, one section per op, and names the function
//! that implements it.
//!
//! | op | tape method | forward | module |
//! |---|---|---|---|
//! | gather | [`gather`](crate::Tape::gather) | `out[i] = table[ids[i]]` | [`gather`] |
//! | routed gather | [`split_gather`](crate::Tape::split_gather) | `out[n] = table_{k(n)}[local(n)]` | [`split_gather`] |
//! | add, sub, mul, scale | [`add`](crate::Tape::add), … | element-wise | [`elementwise`] |
//! | row scale | [`row_scale`](crate::Tape::row_scale) | `out[i] = s[i]·x[i]` | [`row_scale`] |
//! | sigmoid | [`sigmoid`](crate::Tape::sigmoid) | `σ(x)` | [`sigmoid`] |
//! | select | [`select`](crate::Tape::select) | `mask ? a : b` by row | [`select`] |
//! | segment sum, mean | [`segment_sum`](crate::Tape::segment_sum), … | rows summed by segment | [`segment`] |
//! | row norm | [`row_norm`](crate::Tape::row_norm) | `‖x_i‖₂` | [`row_norm`] |
//! | sum, mean, dot_const | [`sum`](crate::Tape::sum), … | to a scalar | [`reduce`] |
//! | matmul | [`matmul`](crate::Tape::matmul) | `a·b` | [`matmul`] |
//! | transpose, reshape, concat | [`transpose`](crate::Tape::transpose), … | shapes | [`shape`] |
//! | logsumexp, cross-entropy | [`cross_entropy`](crate::Tape::cross_entropy), … | per row | [`cross_entropy`] |
//! | fusion penalty | [`fusion_penalty`](crate::Tape::fusion_penalty) | `(1/n) Σ ‖x_i − c_g(i)‖` | [`fusion_penalty`] |
//! | gated mix | [`gated_mix`](crate::Tape::gated_mix) | `shared + g·(row − shared)` | [`gated_mix`] |
//! | fused cross-entropy | [`fused_cross_entropy`](crate::Tape::fused_cross_entropy) | per token, no N × V logits | [`fused_ce`] |
//! | summed fused cross-entropy | [`fused_cross_entropy_sum`](crate::Tape::fused_cross_entropy_sum) | `Σ_n loss_n` | [`fused_ce_sum`] |

pub mod cross_entropy;
pub mod elementwise;
pub mod fused_ce;
pub mod fused_ce_sum;
pub mod fusion_penalty;
pub mod gated_mix;
pub mod gather;
pub mod matmul;
pub mod reduce;
pub mod row_norm;
pub mod row_scale;
pub mod segment;
pub mod select;
pub mod shape;
pub mod sigmoid;
pub mod split_gather;
