//! The tape: an append-only record of a forward pass, replayed backwards.
//!
//! Every op appends one node — its value and, when gradients are recorded,
//! the state its backward step needs — and returns the node's [`Var`], an
//! index. Since a node's inputs always come before it, walking the tape
//! from the end is a topological order, and [`Tape::backward`] needs no
//! graph search.
//!
//! The tape knows no op. An op is a type that implements [`Backward`]: the
//! op's module computes the forward value, records it with
//! [`Tape::push_op`] together with the state its backward needs, and the
//! reverse sweep calls that state's [`Backward::backward`] with the
//! gradient flowing into the node. The gradients themselves live in
//! [`NodeGrads`], whose methods add into the buffer of a node
//! ([`NodeGrads::accumulate`], [`NodeGrads::buffer`], [`NodeGrads::add`],
//! [`NodeGrads::add_scaled`]) or send rows to a table
//! ([`NodeGrads::add_rows`], the row-sparse flow of [`RowPart`]s); the ops'
//! contract for them is in [`crate::ops`].
//!
//! Parameters are borrowed, not copied: [`Tape::param`] stores a view of the
//! parameter's array, so using a 151936 × 1024 table costs nothing but the
//! rows actually gathered from it.
//!
//! A node whose inputs need no gradient (constants, frozen parameters, or
//! everything in a [`Tape::no_grad`] tape) is recorded as a constant: its
//! backward state is never stored and the sweep never visits it.
//!
//! Large buffers come from a [`Pool`]: a tape made with [`Tape::with_pool`]
//! takes its node values and gradient buffers from the pool and gives them
//! back when it (and the [`Gradients`] it returned) are dropped, so a
//! training loop that keeps one pool allocates its big arrays once.

mod flow;
mod gradients;
mod grads;

use std::sync::{Arc, OnceLock};

use ndarray::{ArrayD, ArrayViewD, Ix2, IxDyn};

pub use flow::{Flow, RowPart};
pub use gradients::Gradients;
pub use grads::NodeGrads;

pub use crate::kernels::pool::Pool;

use crate::kernels::Real;
use crate::param::{ParamGrad, ParamId, Parameter, StoredView};

/// A node of a [`Tape`]: an index, valid only for the tape that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Var(pub(crate) usize);

impl Var {
    /// Its position on the tape.
    pub fn index(self) -> usize {
        self.0
    }
}

/// A node's value: owned, or borrowed from a parameter or the caller.
#[derive(Debug)]
pub enum Value<'p, T> {
    /// An array the tape owns.
    Owned(ArrayD<T>),
    /// A view of an array that outlives the tape.
    Borrowed(ArrayViewD<'p, T>),
    /// A parameter kept in half precision: the gathers, the gated mix and
    /// the fusion penalty read its rows widened one by one
    /// ([`Tape::stored_value`], [`NodeGrads::stored_value`]); any other op
    /// that reads it gets the whole array widened once, the first time.
    Half {
        /// The parameter's value as it is kept.
        stored: StoredView<'p, T>,
        /// The widened array, made on first use in a buffer of `pool`
        /// (shared by every leaf of the same parameter).
        wide: Arc<OnceLock<ArrayD<T>>>,
        /// The tape's pool.
        pool: Pool<T>,
    },
}

impl<T: Real> Value<'_, T> {
    /// The value as a view.
    pub fn view(&self) -> ArrayViewD<'_, T> {
        match self {
            Value::Owned(a) => a.view(),
            Value::Borrowed(v) => v.view(),
            Value::Half { stored, wide, pool } => wide
                .get_or_init(|| match stored {
                    StoredView::Full(a) => a.to_owned(),
                    StoredView::BF16(a) => widen_view(pool, a),
                    StoredView::F16(a) => widen_view(pool, a),
                })
                .view(),
        }
    }
}

/// What the reverse sweep reads of a node's value: its shape always, the
/// array only when an op asks for it (a half-precision parameter is not
/// widened for its shape).
pub(crate) trait NodeValue<T>: Sync {
    /// The value as a view.
    fn view(&self) -> ArrayViewD<'_, T>;
    /// Its shape.
    fn shape(&self) -> &[usize];
    /// The value as it is kept ([`Tape::stored_value`]).
    fn stored(&self) -> StoredView<'_, T>;
}

impl<T: Real> NodeValue<T> for Value<'_, T> {
    fn view(&self) -> ArrayViewD<'_, T> {
        Value::view(self)
    }
    fn shape(&self) -> &[usize] {
        match self {
            Value::Owned(a) => a.shape(),
            Value::Borrowed(v) => v.shape(),
            Value::Half { stored, .. } => stored.shape(),
        }
    }
    fn stored(&self) -> StoredView<'_, T> {
        match self {
            Value::Half { stored, .. } => match stored {
                StoredView::Full(a) => StoredView::Full(a.view()),
                StoredView::BF16(a) => StoredView::BF16(a.view()),
                StoredView::F16(a) => StoredView::F16(a.view()),
            },
            other => StoredView::Full(other.view()),
        }
    }
}

/// A half-precision array widened to `T` (exactly), in parallel blocks,
/// into a buffer of `pool`.
fn widen_view<T: Real, H: crate::kernels::HalfFloat>(
    pool: &Pool<T>,
    a: &ArrayViewD<'_, H>,
) -> ArrayD<T> {
    use rayon::prelude::*;
    let src = a.as_standard_layout();
    let src = src.as_slice().expect("standard layout is contiguous");
    let mut out = pool.zeros(a.shape());
    let dst = out.as_slice_mut().expect("a fresh array");
    let block = crate::kernels::PAR_MIN_ELEMS;
    dst.par_chunks_mut(block)
        .zip(src.par_chunks(block))
        .for_each(|(d, s)| T::widen_half(s, d));
    out
}

/// The backward step of an op: the state an op saved in its forward pass,
/// and what to do with the gradient of its output.
///
/// `backward` receives `y`, the node's own output (so an op whose
/// derivative needs only f(x), as the sigmoid's, saves nothing), `gy`, the
/// gradient of that output (an array of its shape, or a scaled constant not
/// yet written out: [`Flow`]), and adds the gradients of the op's inputs
/// through `grads`. It must **add**, never overwrite: an input used twice
/// accumulates both contributions. The ops add into buffers the store
/// lends them ([`NodeGrads::accumulate`]) or give it arrays, rows or a lazy
/// pair ([`NodeGrads::add`], [`NodeGrads::add_rows`],
/// [`NodeGrads::add_scaled`]): the contract of [`crate::ops`].
///
/// A saved state is `Send` and `Sync` (a tape may be handed to another
/// thread, or read from several). A new op is a type implementing this
/// trait plus a function that computes the forward value and calls
/// [`Tape::push_op`]:
///
/// ```
/// use ndarray::{ArrayD, ArrayViewD};
/// use splitgrad::tape::{Backward, Flow, NodeGrads};
/// use splitgrad::{Tape, Var};
///
/// /// y = x³, element-wise; ∂x += 3x²·∂y.
/// struct Cube { x: Var }
///
/// impl Backward<f64> for Cube {
///     fn backward<'a>(&'a self, _y: ArrayViewD<'a, f64>, gy: Flow<'a, f64>, grads: &mut NodeGrads<'a, f64>) {
///         let x = grads.value(self.x);
///         grads.accumulate(gy, &[self.x], |_, gy, g| {
///             ndarray::Zip::from(g).and(&gy).and(&x).for_each(|g, &gy, &x| *g += 3.0 * x * x * gy);
///         });
///     }
/// }
///
/// let mut tape = Tape::<f64>::new();
/// let x = tape.input(ndarray::array![2.0, -1.0].into_dyn());
/// let y: ArrayD<f64> = tape.value(x).mapv(|v| v * v * v);
/// let y = tape.push_op(y, &[x], Cube { x });
/// let loss = tape.sum(y);
/// let grads = tape.backward(loss);
/// assert_eq!(grads.input(x).unwrap(), &ndarray::array![12.0, 3.0].into_dyn());
/// ```
pub trait Backward<T: Real>: Send + Sync {
    /// Adds the gradients of the op's inputs, given its output `y` and the
    /// gradient `gy` of that output.
    fn backward<'a>(&'a self, y: ArrayViewD<'a, T>, gy: Flow<'a, T>, grads: &mut NodeGrads<'a, T>);
}

/// What a node is: a leaf, or the output of an op with its backward state.
enum Kind<'p, T> {
    /// No gradient flows here.
    Constant,
    /// A differentiable input; its gradient is returned by [`Gradients::input`].
    Input,
    /// A trainable parameter.
    Param(ParamId),
    /// The output of an op.
    Op(Box<dyn Backward<T> + 'p>),
}

struct Node<'p, T> {
    value: Value<'p, T>,
    kind: Kind<'p, T>,
    requires_grad: bool,
}

/// The record of one forward pass.
///
/// `'p` is the lifetime of the parameters it borrows; `T` is `f32` or `f64`.
///
/// ```
/// use ndarray::array;
/// use splitgrad::{Parameter, Tape};
/// let w = Parameter::new("w", array![[1.0f64, 2.0], [3.0, 4.0]].into_dyn());
/// let mut tape = Tape::new();
/// let table = tape.param(&w);
/// let rows = tape.gather(table, &[1, 1, 0]); // (3, 2)
/// let loss = tape.sum(rows);
/// assert_eq!(tape.scalar(loss), 3.0 + 4.0 + 3.0 + 4.0 + 1.0 + 2.0);
/// let grads = tape.backward(loss);
/// // Row 1 was read twice, row 0 once: the gradient is row-sparse.
/// let g = grads.dense(&w);
/// assert_eq!(g, array![[1.0, 1.0], [2.0, 2.0]].into_dyn());
/// ```
pub struct Tape<'p, T: Real> {
    nodes: Vec<Node<'p, T>>,
    record: bool,
    pool: Pool<T>,
    /// The widened value of each half-precision parameter read on this
    /// tape, shared by all its leaves: made at most once.
    widened: Vec<(ParamId, Arc<OnceLock<ArrayD<T>>>)>,
}

impl<T: Real> Default for Tape<'_, T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Real> Drop for Tape<'_, T> {
    /// Gives the node values back to the pool.
    fn drop(&mut self) {
        for node in self.nodes.drain(..) {
            match node.value {
                Value::Owned(a) => self.pool.give(a),
                Value::Half { .. } => {}
                Value::Borrowed(_) => {}
            }
        }
        for (_, wide) in self.widened.drain(..) {
            if let Some(a) = Arc::into_inner(wide).and_then(OnceLock::into_inner) {
                self.pool.give(a);
            }
        }
    }
}

impl<'p, T: Real> Tape<'p, T> {
    /// An empty tape that records gradients, with a pool of its own.
    pub fn new() -> Self {
        Self::with_pool(&Pool::new())
    }

    /// An empty tape that records gradients and takes its large buffers
    /// from `pool` (a handle: the pool is shared, not copied). Keep one
    /// pool across the steps of a training loop and every step after the
    /// first reuses the buffers of the one before.
    ///
    /// ```
    /// use ndarray::Array2;
    /// use splitgrad::{tape::Pool, Parameter, Tape};
    /// let pool = Pool::<f32>::new();
    /// let w = Parameter::new("w", Array2::<f32>::ones((4096, 64)).into_dyn());
    /// for _ in 0..3 {
    ///     let mut tape = Tape::with_pool(&pool);
    ///     let t = tape.param(&w);
    ///     let rows = tape.gather(t, &vec![1; 4096]);
    ///     let loss = tape.sum(rows);
    ///     let grads = tape.backward(loss);
    ///     assert!(grads.param(&w).is_some());
    /// } // the tape and the gradients give their buffers back here
    /// assert!(pool.held_bytes() > 0);
    /// ```
    pub fn with_pool(pool: &Pool<T>) -> Self {
        Tape {
            nodes: Vec::new(),
            record: true,
            pool: pool.clone(),
            widened: Vec::new(),
        }
    }

    /// An empty tape that records nothing: every node is a constant, so a
    /// forward pass stores only values, and [`Tape::backward`] returns no
    /// gradients.
    pub fn no_grad() -> Self {
        let mut t = Self::new();
        t.record = false;
        t
    }

    /// [`Tape::no_grad`] with buffers from `pool`.
    pub fn no_grad_with_pool(pool: &Pool<T>) -> Self {
        let mut t = Self::with_pool(pool);
        t.record = false;
        t
    }

    /// The tape's buffer pool.
    pub fn pool(&self) -> &Pool<T> {
        &self.pool
    }

    /// Whether this tape records gradients.
    pub fn is_recording(&self) -> bool {
        self.record
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the tape has no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Borrows a parameter. A frozen parameter (or any parameter on a
    /// no-grad tape) is a constant.
    pub fn param(&mut self, p: &'p Parameter<T>) -> Var {
        let kind = if self.record && p.is_trainable() {
            Kind::Param(p.id())
        } else {
            Kind::Constant
        };
        let value = match p.stored() {
            crate::param::Stored::Full(a) => Value::Borrowed(a.view()),
            // Kept in half precision: the tape computes on the widened
            // values (exact); the gathers widen only the rows they read.
            stored => {
                let wide = match self.widened.iter().find(|(id, _)| *id == p.id()) {
                    Some((_, w)) => Arc::clone(w),
                    None => {
                        let w = Arc::new(OnceLock::new());
                        self.widened.push((p.id(), Arc::clone(&w)));
                        w
                    }
                };
                Value::Half {
                    stored: stored.view(),
                    wide,
                    pool: self.pool.clone(),
                }
            }
        };
        self.push_leaf(value, kind)
    }

    /// An owned constant (no gradient).
    pub fn constant(&mut self, value: ArrayD<T>) -> Var {
        self.push_leaf(Value::Owned(value), Kind::Constant)
    }

    /// A borrowed constant (no gradient, no copy).
    pub fn constant_view(&mut self, value: ArrayViewD<'p, T>) -> Var {
        self.push_leaf(Value::Borrowed(value), Kind::Constant)
    }

    /// A differentiable input (an activation from outside the tape, such as
    /// the `shared` rows of a split vocabulary or the hidden states of the
    /// head): its gradient is returned by [`Gradients::input`].
    pub fn input(&mut self, value: ArrayD<T>) -> Var {
        let kind = if self.record {
            Kind::Input
        } else {
            Kind::Constant
        };
        self.push_leaf(Value::Owned(value), kind)
    }

    /// A borrowed differentiable input.
    pub fn input_view(&mut self, value: ArrayViewD<'p, T>) -> Var {
        let kind = if self.record {
            Kind::Input
        } else {
            Kind::Constant
        };
        self.push_leaf(Value::Borrowed(value), kind)
    }

    fn push_leaf(&mut self, value: Value<'p, T>, kind: Kind<'p, T>) -> Var {
        let requires_grad = !matches!(kind, Kind::Constant);
        self.nodes.push(Node {
            value,
            kind,
            requires_grad,
        });
        Var(self.nodes.len() - 1)
    }

    /// Appends the output of an op: its value, the nodes it read, and the
    /// state its backward step needs. When none of `inputs` needs a
    /// gradient (or the tape does not record), `saved` is dropped and the
    /// node is a constant.
    ///
    /// **Panics** if an input is not a node of this tape.
    #[track_caller]
    pub fn push_op<B: Backward<T> + 'p>(
        &mut self,
        value: ArrayD<T>,
        inputs: &[Var],
        saved: B,
    ) -> Var {
        let requires_grad = self.record && inputs.iter().any(|v| self.nodes[v.0].requires_grad);
        let kind = if requires_grad {
            Kind::Op(Box::new(saved))
        } else {
            Kind::Constant
        };
        self.nodes.push(Node {
            value: Value::Owned(value),
            kind,
            requires_grad,
        });
        Var(self.nodes.len() - 1)
    }

    /// [`Tape::push_op`] for an op whose state is expensive to build: `saved`
    /// runs only when the node needs a gradient.
    #[track_caller]
    pub fn push_op_with<B: Backward<T> + 'p>(
        &mut self,
        value: ArrayD<T>,
        inputs: &[Var],
        saved: impl FnOnce() -> B,
    ) -> Var {
        if self.record && inputs.iter().any(|v| self.nodes[v.0].requires_grad) {
            self.push_op(value, inputs, saved())
        } else {
            self.constant(value)
        }
    }

    /// Whether gradient flows into this node.
    ///
    /// **Panics** if `v` is not a node of this tape.
    #[track_caller]
    pub fn requires_grad(&self, v: Var) -> bool {
        self.nodes[v.0].requires_grad
    }

    /// The value of a node.
    ///
    /// **Panics** if `v` is not a node of this tape.
    #[track_caller]
    pub fn value(&self, v: Var) -> ArrayViewD<'_, T> {
        self.nodes[v.0].value.view()
    }

    /// The value of a node as it is kept: a parameter's in half precision
    /// as [`StoredView::BF16`] or [`StoredView::F16`] (not widened), any
    /// other as [`StoredView::Full`].
    pub fn stored_value(&self, v: Var) -> StoredView<'_, T> {
        NodeValue::stored(&self.nodes[v.0].value)
    }

    /// The value of a node with a single element (a loss).
    ///
    /// **Panics** if the node has more or fewer than one element.
    #[track_caller]
    pub fn scalar(&self, v: Var) -> T {
        let a = self.value(v);
        assert_eq!(a.len(), 1, "scalar: node {} has shape {:?}", v.0, a.shape());
        *a.iter().next().expect("one element")
    }

    /// Reverse-mode gradients of `loss` (a single-element node) with respect
    /// to every trainable parameter and differentiable input it depends on.
    ///
    /// Gradients accumulate where a value is used more than once. A 2-D
    /// parameter that was only read through row gathers gets a row-sparse
    /// gradient; anything else a dense one.
    ///
    /// **Panics** if `loss` does not have exactly one element.
    #[track_caller]
    pub fn backward(&self, loss: Var) -> Gradients<T> {
        let n = self.nodes.len();
        assert!(loss.0 < n, "backward: {loss:?} is not a node of this tape");
        let shape = NodeValue::shape(&self.nodes[loss.0].value).to_vec();
        assert_eq!(
            shape.iter().product::<usize>(),
            1,
            "backward: the loss must have one element, it has shape {shape:?}"
        );
        self.sweep(loss, |grads| {
            grads.seed(loss, ArrayD::from_elem(IxDyn(&shape), T::one()))
        })
    }

    /// The gradients of `Σ y ⊙ seed` for a node y of any shape: the
    /// vector-Jacobian product with `seed` as y's gradient (torch's
    /// `y.backward(seed)`). The same gradients, bit for bit, as
    /// `backward(dot_const_view(y, seed))`, without computing that sum.
    ///
    /// **Panics** if `seed` does not have y's shape.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::Tape;
    /// let mut t = Tape::<f64>::new();
    /// let x = t.input(array![1.0, 2.0].into_dyn());
    /// let y = t.mul(x, x);
    /// let seed = array![3.0, 0.5].into_dyn();
    /// let g = t.backward_from(y, seed.view());
    /// assert_eq!(g.input(x).unwrap(), &array![6.0, 2.0].into_dyn());
    /// ```
    #[track_caller]
    pub fn backward_from(&self, y: Var, seed: ArrayViewD<'_, T>) -> Gradients<T> {
        assert!(
            y.0 < self.nodes.len(),
            "backward_from: {y:?} is not a node of this tape"
        );
        let shape = NodeValue::shape(&self.nodes[y.0].value).to_vec();
        assert_eq!(
            seed.shape(),
            &shape[..],
            "backward_from: a seed of shape {:?} for a node of shape {shape:?}",
            seed.shape()
        );
        self.sweep(y, |grads| grads.add_scaled(y, T::one(), seed))
    }

    /// The reverse sweep from `root`, whose gradient `seed` puts in place.
    fn sweep<'a>(&'a self, root: Var, seed: impl FnOnce(&mut NodeGrads<'a, T>)) -> Gradients<T> {
        let mut out = Gradients::with_pool(self.pool.clone());
        if !self.nodes[root.0].requires_grad {
            return out;
        }
        let mut grads = NodeGrads::new(
            self.nodes.iter().map(|node| {
                let value: &dyn NodeValue<T> = &node.value;
                let sparse = matches!(node.kind, Kind::Param(_)) && value.shape().len() == 2;
                (value, node.requires_grad, sparse)
            }),
            self.pool.clone(),
        );
        seed(&mut grads);

        for i in (0..=root.0).rev() {
            let Some(gy) = grads.take(Var(i)) else {
                continue;
            };
            match &self.nodes[i].kind {
                Kind::Constant => {}
                Kind::Input => {
                    out.inputs.insert(i, gy.into_owned_in(&self.pool));
                }
                Kind::Param(id) => out.add_dense(*id, gy.into_owned_in(&self.pool)),
                Kind::Op(saved) => saved.backward(self.nodes[i].value.view(), gy, &mut grads),
            }
        }

        // Row-sparse table gradients: coalesced in tape order, merged into a
        // dense gradient where the same table was also used densely.
        let mut per_param: Vec<(ParamId, Vec<usize>)> = Vec::new();
        for node in grads.nodes_with_rows() {
            let Kind::Param(id) = self.nodes[node].kind else {
                unreachable!("only 2-D parameters collect rows")
            };
            match per_param.iter_mut().find(|(p, _)| *p == id) {
                Some((_, nodes)) => nodes.push(node),
                None => per_param.push((id, vec![node])),
            }
        }
        for (id, nodes) in per_param {
            let rs = grads.coalesce_rows(&nodes);
            match out.params.get_mut(&id) {
                Some(ParamGrad::Dense(d)) => rs.add_to(
                    d.view_mut()
                        .into_dimensionality::<Ix2>()
                        .expect("2-D table"),
                ),
                Some(ParamGrad::RowSparse(_)) => unreachable!("one entry per parameter"),
                None => {
                    out.params.insert(id, ParamGrad::RowSparse(rs));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn backward_from_equals_the_dot_bit_for_bit() {
        // A table read by a gather (row-sparse gradient), an input used
        // twice, and a seed with repeated rows.
        let mut rng = crate::Rng::new(3);
        let w = Parameter::new(
            "w",
            ndarray::Array2::from_shape_simple_fn((5, 3), || rng.normal()).into_dyn(),
        );
        let x0 = ndarray::Array2::from_shape_simple_fn((4, 3), || rng.normal()).into_dyn();
        let seed = ndarray::Array2::from_shape_simple_fn((4, 3), || rng.normal()).into_dyn();
        fn build<'p>(t: &mut Tape<'p, f64>, w: &'p Parameter<f64>, x0: &ArrayD<f64>) -> (Var, Var) {
            let table = t.param(w);
            let rows = t.gather(table, &[1, 4, 1, 0]);
            let x = t.input(x0.clone());
            let xx = t.mul(x, x);
            let y = t.mul(rows, xx);
            (x, t.add(y, x))
        }
        let mut a = Tape::new();
        let (xa, ya) = build(&mut a, &w, &x0);
        let ga = a.backward_from(ya, seed.view());
        let mut b = Tape::new();
        let (xb, yb) = build(&mut b, &w, &x0);
        let loss = b.dot_const_view(yb, seed.view());
        let gb = b.backward(loss);
        let bits = |v: &ArrayD<f64>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(matches!(ga.param(&w), Some(ParamGrad::RowSparse(_))));
        assert_eq!(bits(&ga.dense(&w)), bits(&gb.dense(&w)));
        assert_eq!(bits(ga.input(xa).unwrap()), bits(gb.input(xb).unwrap()));
    }

    #[test]
    #[should_panic(expected = "backward_from: a seed of shape [2] for a node of shape [3]")]
    fn backward_from_refuses_a_seed_of_another_shape() {
        let mut t = Tape::<f64>::new();
        let x = t.input(array![1.0, 2.0, 3.0].into_dyn());
        t.backward_from(x, array![1.0, 2.0].into_dyn().view());
    }

    #[test]
    fn empty_gather_keeps_the_table_width() {
        // An empty gather then a gather of row 1: ∂w = [[0, 0], [1, 1]].
        let w = Parameter::new("w", array![[1.0f64, 2.0], [3.0, 4.0]].into_dyn());
        let mut t = Tape::new();
        let table = t.param(&w);
        let none = t.gather(table, &[]);
        let one = t.gather(table, &[1]);
        let a = t.sum(none);
        let b = t.sum(one);
        let loss = t.add(a, b);
        let g = t.backward(loss);
        assert_eq!(g.dense(&w), array![[0.0, 0.0], [1.0, 1.0]].into_dyn());

        let mut t = Tape::new();
        let table = t.param(&w);
        let none = t.gather(table, &[]);
        let loss = t.sum(none);
        let g = t.backward(loss);
        assert_eq!(g.dense(&w).shape(), &[2, 2]);
    }

    #[test]
    fn no_grad_tape_records_no_gradient() {
        let w = Parameter::new("w", array![[1.0f64, 2.0]].into_dyn());
        let mut t = Tape::no_grad();
        let table = t.param(&w);
        let y = t.gather(table, &[0, 0]);
        let loss = t.sum(y);
        assert_eq!(t.scalar(loss), 6.0);
        assert!(t.backward(loss).param(&w).is_none());
    }
}
