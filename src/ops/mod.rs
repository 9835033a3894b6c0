//! The differentiable ops, one module each: the forward, the state it
//! saves, the backward, and the [`Tape`](crate::Tape) method that records
//! the op, side by side. `docs/gradients.md` derives every backward step,
//! one section per op, and names the function that implements it.
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
//!
//! # The backward contract
//!
//! An op's backward is two pieces. Its `*_backward` function does the
//! arithmetic on arrays and never touches the sweep's store (layers call
//! some of them outside a tape: the split vocabulary's `backward_from`).
//! The [`Backward`](crate::tape::Backward) impl of the op's saved state
//! calls it during the reverse sweep, and is the code that hands what it
//! computed to the store, [`NodeGrads`](crate::tape::NodeGrads); the one
//! exception is the summed head's, below.
//! The impls are written with the `backward!` macro below, so the trait's
//! signature is written once (the fused heads' two, in [`fused_ce`] and
//! [`fused_ce_sum`], are written out), and the ops whose backward needs
//! nothing saved but their inputs share two saved states: one for an op of
//! one input (sum, mean, transpose, reshape, sigmoid, row norm, log-sum-exp)
//! and one for an op of two (add, sub, mul, matmul, row scale), each
//! holding its inputs and the `*_backward` of each.
//!
//! **What a `*_backward` receives**: views of the forward values it needs
//! (the inputs' values, which the impl reads with
//! [`NodeGrads::value`](crate::tape::NodeGrads::value), and the node's own
//! output `y`), what the op saved (ids, a mask, labels, norms), and `∂y`,
//! the gradient of the op's output: a view of it written out once
//! ([`Flow::into_owned_in`](crate::tape::Flow::into_owned_in); the gated
//! mix takes the array itself, to write ∂shared in its place), or, for the
//! ops that pass it on without arithmetic, the
//! [`Flow`](crate::tape::Flow) itself, which may be a lazy `c·R`.
//!
//! **What it adds.** Every contribution is *added* to the input's gradient,
//! never written over it, so a value read twice (by one op or by two)
//! accumulates both. A `*_backward` does this in one of two forms:
//!
//! 1. **Accumulating**: it takes the input's gradient buffer, `g: &mut
//!    ArrayD<T>` (the fused cross-entropy: several `ArrayViewMut2`), adds
//!    (`+=`) its contribution into it and returns nothing. It never
//!    zero-fills: the buffer is the input's gradient so far, and
//!    [`NodeGrads::buffer`](crate::tape::NodeGrads::buffer) makes it, a
//!    zero-filled buffer of the tape's pool, on the input's first touch (a
//!    lazy `c·R` already there is written out as `c·R + 0`). The impl lends
//!    the buffers through
//!    [`NodeGrads::accumulate`](crate::tape::NodeGrads::accumulate), which
//!    writes ∂y out once, calls the function for each input that wants a
//!    gradient, in input order, and gives ∂y back to the pool.
//! 2. **Giving**: it returns what flows into an input (an array it made,
//!    from the pool it is given, every element written by it and no zero
//!    buffer added into; rows of ∂y for a table; or the lazy pair), and the
//!    impl gives it to `NodeGrads`, which takes it as the input's gradient
//!    when the input has none yet and otherwise adds it in: a fresh array
//!    through [`NodeGrads::add`](crate::tape::NodeGrads::add) (on first touch it
//!    becomes the buffer, no zero fill and no add; otherwise it is added
//!    into the buffer and goes back to the pool), rows for a table (a
//!    [`RowPart`](crate::tape::RowPart)) through
//!    [`NodeGrads::add_rows`](crate::tape::NodeGrads::add_rows) (kept
//!    row-sparse for a 2-D parameter, added into the dense buffer
//!    otherwise), the pair `c·R` through
//!    [`NodeGrads::add_scaled`](crate::tape::NodeGrads::add_scaled) (kept as
//!    the pair on first touch).
//!
//! **Why two forms.** One form for all would change bits or cost a pass:
//! adding into the existing buffer is part of the arithmetic of the
//! accumulating ops. The matmul's gemm adds into the buffer with β = 1, one
//! K block after another; the cross-entropy subtracts the label's ∂y after
//! adding the softmax term; the fused cross-entropy adds every chunk's
//! product into ∂h and each ∂W_k. A fresh array added afterwards would
//! round differently there, and for the element-wise ops it would be one
//! more array and one more pass wherever the input already has a gradient
//! (and `0 + (−0)` is `+0`: the zero buffer's bits are part of the
//! result). The giving form is what an op must use that passes ∂y on as it
//! is (a gather's rows, the pair `(∂y, R)`: read in place later, never
//! written out), and what an op with a dense gradient written once uses to
//! skip the zero fill (the fusion penalty) or to reuse ∂y's own buffer (the
//! gated mix's ∂shared is ∂out scaled in place).
//!
//! | op | `*_backward` | form | to the tape |
//! |---|---|---|---|
//! | add, sub, mul, scale | [`add_backward`](elementwise::add_backward), [`sub_backward_rhs`](elementwise::sub_backward_rhs), [`mul_backward`](elementwise::mul_backward), [`scale_backward`](elementwise::scale_backward) | accumulating | `accumulate` |
//! | row scale | [`row_scale_backward_x`](row_scale::row_scale_backward_x), [`row_scale_backward_s`](row_scale::row_scale_backward_s) | accumulating | `accumulate` |
//! | sigmoid | [`sigmoid_backward`](sigmoid::sigmoid_backward) | accumulating | `accumulate` |
//! | select | [`select_backward`](select::select_backward) | accumulating | `accumulate` |
//! | segment sum, mean | [`segment_sum_backward`](segment::segment_sum_backward), [`segment_mean_backward`](segment::segment_mean_backward) | accumulating | `accumulate` |
//! | row norm | [`row_norm_backward`](row_norm::row_norm_backward) | accumulating | `accumulate` |
//! | sum, mean | [`sum_backward`](reduce::sum_backward), [`mean_backward`](reduce::mean_backward) | accumulating | `accumulate` |
//! | matmul | [`matmul_backward_lhs`](matmul::matmul_backward_lhs), [`matmul_backward_rhs`](matmul::matmul_backward_rhs) | accumulating | `accumulate` |
//! | transpose, reshape, concat | [`transpose_backward`](shape::transpose_backward), [`reshape_backward`](shape::reshape_backward), [`concat_rows_backward`](shape::concat_rows_backward) | accumulating | `accumulate` |
//! | logsumexp, cross-entropy | [`logsumexp_backward`](cross_entropy::logsumexp_backward), [`cross_entropy_backward`](cross_entropy::cross_entropy_backward) | accumulating | `accumulate` |
//! | fused cross-entropy | [`fused_ce_backward_on`](fused_ce::fused_ce_backward_on) | accumulating, into ∂h and every ∂W_k at once | `take_buffer` for each, then `add` to give them back |
//! | dot_const | [`dot_const_backward`](reduce::dot_const_backward) | giving: the pair `(∂y, R)` | `add_scaled` |
//! | gather | [`gather_backward`](gather::gather_backward) | giving: ∂y's rows | `add_rows` |
//! | routed gather | [`split_gather_backward`](split_gather::split_gather_backward) | giving: ∂y's rows, one part per split | `add_rows` |
//! | fusion penalty | [`fusion_penalty_backward`](fusion_penalty::fusion_penalty_backward) | giving: a fresh ∂x | `add` |
//! | gated mix | [`gated_mix_backward`](gated_mix::gated_mix_backward) | giving: ∂shared in ∂out's buffer, a fresh ∂gate, the rows' contributions | `add`, `add_rows` |
//! | summed fused cross-entropy | [`fused_ce_sum_backward`](fused_ce_sum::fused_ce_sum_backward) | giving: the pairs `(∂y, d°)` of the gradients its forward formed | `add_scaled`, called by `fused_ce_sum_backward` itself (it takes the `NodeGrads`) |
//!
//! The fused cross-entropy's impl takes the buffers out rather than
//! borrowing them one at a time because its kernel writes all of them in
//! one pass; the summed head's function is the one `*_backward` that is
//! handed the store.

/// Implements [`Backward`](crate::tape::Backward) for an op's saved state:
/// `backward!(State, |s, y, gy, grads| body)` is the impl whose `backward`
/// runs `body` with `s` the state, `y` the node's output, `gy` the
/// [`Flow`](crate::tape::Flow) into it and `grads` the sweep's
/// [`NodeGrads`](crate::tape::NodeGrads).
macro_rules! backward {
    ($state:ty, |$s:ident, $y:ident, $gy:ident, $grads:ident| $body:expr) => {
        impl<T: crate::kernels::Real> crate::tape::Backward<T> for $state {
            fn backward<'a>(
                &'a self,
                $y: ndarray::ArrayViewD<'a, T>,
                $gy: crate::tape::Flow<'a, T>,
                $grads: &mut crate::tape::NodeGrads<'a, T>,
            ) {
                let $s = self;
                $body
            }
        }
    };
}

use ndarray::{ArrayD, ArrayView2, ArrayViewD, ArrayViewMut2, Ix2};

use crate::tape::Var;

/// `x` as a 2-D view.
///
/// **Panics** with `"{message} {x's shape:?}"` if x is not 2-D.
#[track_caller]
fn as_2d<'a, T>(x: ArrayViewD<'a, T>, message: std::fmt::Arguments<'_>) -> ArrayView2<'a, T> {
    if x.ndim() != 2 {
        panic!("{message} {:?}", x.shape());
    }
    x.into_dimensionality::<Ix2>().expect("2-D")
}

/// The gradient buffer of a 2-D value, as a 2-D view.
fn grad_2d<T>(g: &mut ArrayD<T>) -> ArrayViewMut2<'_, T> {
    g.view_mut()
        .into_dimensionality::<Ix2>()
        .expect("2-D gradient")
}

/// **Panics** with `"{op}: shapes {a:?} and {b:?} differ{note}"` if the
/// shapes differ.
#[track_caller]
fn same_shape(op: &str, a: &[usize], b: &[usize], note: &str) {
    assert_eq!(a, b, "{op}: shapes {a:?} and {b:?} differ{note}");
}

/// An accumulating backward of one input that reads at most the input's
/// value `x`, the node's output `y` and ∂y: `backward(x, y, ∂y, g)` adds
/// into the input's buffer `g`.
type UnaryBackward<T> = fn(ArrayViewD<'_, T>, ArrayViewD<'_, T>, ArrayViewD<'_, T>, &mut ArrayD<T>);

/// The saved state of an op of one input with such a backward (sum, mean,
/// transpose, reshape, sigmoid, row norm, log-sum-exp).
struct Unary<T> {
    x: Var,
    backward: UnaryBackward<T>,
}

backward!(Unary<T>, |s, y, gy, grads| {
    let x = grads.value(s.x);
    grads.accumulate(gy, &[s.x], |_, gy, g| {
        (s.backward)(x.view(), y.view(), gy, g)
    });
});

/// An accumulating backward of one side of a two-input op that reads at
/// most the other side's value and ∂y: `backward(other, ∂y, g)` adds into
/// the side's buffer `g`.
type SideBackward<T> = fn(ArrayViewD<'_, T>, ArrayViewD<'_, T>, &mut ArrayD<T>);

/// The saved state of an op of two inputs with such backwards, `∂a` from
/// `backward[0](b, ∂y)` and `∂b` from `backward[1](a, ∂y)` (add, sub, mul,
/// matmul, row scale).
struct Binary<T> {
    a: Var,
    b: Var,
    backward: [SideBackward<T>; 2],
}

backward!(Binary<T>, |s, _y, gy, grads| {
    let other = [grads.value(s.b), grads.value(s.a)];
    grads.accumulate(gy, &[s.a, s.b], |k, gy, g| {
        (s.backward[k])(other[k].view(), gy, g)
    });
});

impl<T: crate::kernels::Real> crate::Tape<'_, T> {
    /// Records `y`, the output of an op of one input `x` whose backward is
    /// `backward` (a [`Unary`]).
    #[track_caller]
    fn push_unary(&mut self, y: ArrayD<T>, x: Var, backward: UnaryBackward<T>) -> Var {
        self.push_op(y, &[x], Unary { x, backward })
    }

    /// Records `y`, the output of an op of two inputs whose backwards are
    /// `backward` (a [`Binary`]).
    #[track_caller]
    fn push_binary(
        &mut self,
        y: ArrayD<T>,
        (a, b): (Var, Var),
        backward: [SideBackward<T>; 2],
    ) -> Var {
        self.push_op(y, &[a, b], Binary { a, b, backward })
    }
}

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

/// The gradients of the scalar `loss(tape, inputs)` with respect to inputs
/// of these values, in order: the unit tests' hand cases.
#[cfg(test)]
fn input_grads(
    values: Vec<ArrayD<f64>>,
    loss: impl FnOnce(&mut crate::Tape<'_, f64>, &[Var]) -> Var,
) -> Vec<ArrayD<f64>> {
    let mut t = crate::Tape::new();
    let inputs: Vec<Var> = values.into_iter().map(|v| t.input(v)).collect();
    let l = loss(&mut t, &inputs);
    let g = t.backward(l);
    let grad = |&v: &Var| g.input(v).expect("a gradient").clone();
    inputs.iter().map(grad).collect()
}
