//! The tape: an append-only record of a forward pass, replayed backwards.
//!
//! Every op appends one node — its value and, when gradients are recorded,
//! what its backward step needs — and returns the node's [`Var`], an index.
//! Since a node's inputs always come before it, walking the tape from the
//! end is a topological order, and [`Tape::backward`] needs no graph search.
//!
//! Parameters are borrowed, not copied: [`Tape::param`] stores a view of the
//! parameter's array, so using a 151936 × 1024 table costs nothing but the
//! rows actually gathered from it.
//!
//! A node whose inputs need no gradient (constants, frozen parameters, or
//! everything in a [`Tape::no_grad`] tape) is recorded as a constant: its
//! backward information is never stored and backward never visits it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::rc::Rc;

use ndarray::{ArrayD, ArrayViewD, Ix2, IxDyn};

use crate::Real;
use crate::ops::scatter::RowSource;
use crate::param::{Grad, Gradients, ParamId, Parameter};

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
pub(crate) enum Value<'p, T> {
    Owned(ArrayD<T>),
    Borrowed(ArrayViewD<'p, T>),
}

impl<T> Value<'_, T> {
    pub(crate) fn view(&self) -> ArrayViewD<'_, T> {
        match self {
            Value::Owned(a) => a.view(),
            Value::Borrowed(v) => v.view(),
        }
    }
}

/// What made a node, with what its backward step needs.
///
/// The closed set of primitive ops: each arm of [`Tape::backward`] calls
/// the documented `*_backward` function of its op's module.
pub(crate) enum Op<'p, T> {
    /// No gradient flows here.
    Constant,
    /// A differentiable input; its gradient is returned by [`Gradients::input`].
    Input,
    /// A trainable parameter.
    Param(ParamId),
    Gather {
        table: Var,
        ids: Vec<usize>,
    },
    Add(Var, Var),
    Sub(Var, Var),
    Mul(Var, Var),
    Scale(Var, T),
    RowScale {
        x: Var,
        s: Var,
    },
    Sigmoid(Var),
    Select {
        mask: Vec<bool>,
        a: Var,
        b: Var,
    },
    SegmentSum {
        x: Var,
        segments: Vec<usize>,
    },
    SegmentMean {
        x: Var,
        segments: Vec<usize>,
        counts: Vec<usize>,
    },
    RowNorm(Var),
    FusionPenalty {
        x: Var,
        groups: &'p crate::ops::fusion_penalty::RowGroups,
        /// ‖x_i − c_{g(i)}‖, (n).
        norms: Vec<T>,
    },
    Sum(Var),
    Mean(Var),
    DotConst {
        x: Var,
        r: Value<'p, T>,
    },
    MatMul(Var, Var),
    Transpose(Var),
    Reshape(Var),
    ConcatRows(Vec<Var>),
    LogSumExp(Var),
    CrossEntropy {
        logits: Var,
        labels: Vec<i64>,
    },
    SplitGather {
        tables: Vec<Var>,
        routed: crate::ops::routing::Routed,
    },
    GatedMix(Box<crate::layers::split_vocabulary::GatedMixSaved>),
    FusedCrossEntropy(Box<crate::layers::lm_head::FusedCeSaved<T>>),
    FusedCrossEntropySum(Box<crate::layers::lm_head::FusedCeSumSaved<T>>),
}

struct Node<'p, T> {
    value: Value<'p, T>,
    op: Op<'p, T>,
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
pub struct Tape<'p, T> {
    nodes: Vec<Node<'p, T>>,
    record: bool,
}

impl<T: Real> Default for Tape<'_, T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'p, T: Real> Tape<'p, T> {
    /// An empty tape that records gradients.
    pub fn new() -> Self {
        Tape {
            nodes: Vec::new(),
            record: true,
        }
    }

    /// An empty tape that records nothing: every node is a constant, so a
    /// forward pass stores only values, and [`Tape::backward`] returns no
    /// gradients.
    pub fn no_grad() -> Self {
        Tape {
            nodes: Vec::new(),
            record: false,
        }
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
        let op = if self.record && p.is_trainable() {
            Op::Param(p.id())
        } else {
            Op::Constant
        };
        self.push_leaf(Value::Borrowed(p.value().view()), op)
    }

    /// An owned constant (no gradient).
    pub fn constant(&mut self, value: ArrayD<T>) -> Var {
        self.push_leaf(Value::Owned(value), Op::Constant)
    }

    /// A borrowed constant (no gradient, no copy).
    pub fn constant_view(&mut self, value: ArrayViewD<'p, T>) -> Var {
        self.push_leaf(Value::Borrowed(value), Op::Constant)
    }

    /// A differentiable input (an activation from outside the tape, such as
    /// the `shared` rows of a split vocabulary or the hidden states of the
    /// head): its gradient is returned by [`Gradients::input`].
    pub fn input(&mut self, value: ArrayD<T>) -> Var {
        let op = if self.record { Op::Input } else { Op::Constant };
        self.push_leaf(Value::Owned(value), op)
    }

    /// A borrowed differentiable input.
    pub fn input_view(&mut self, value: ArrayViewD<'p, T>) -> Var {
        let op = if self.record { Op::Input } else { Op::Constant };
        self.push_leaf(Value::Borrowed(value), op)
    }

    fn push_leaf(&mut self, value: Value<'p, T>, op: Op<'p, T>) -> Var {
        let requires_grad = !matches!(op, Op::Constant);
        self.nodes.push(Node {
            value,
            op,
            requires_grad,
        });
        Var(self.nodes.len() - 1)
    }

    /// Appends an op's node. `inputs` are the nodes it reads; when none of
    /// them needs a gradient (or the tape does not record), the op's
    /// backward information is dropped and the node is a constant.
    pub(crate) fn push(&mut self, value: ArrayD<T>, op: Op<'p, T>, inputs: &[Var]) -> Var {
        let requires_grad = self.record && inputs.iter().any(|v| self.nodes[v.0].requires_grad);
        let op = if requires_grad { op } else { Op::Constant };
        self.nodes.push(Node {
            value: Value::Owned(value),
            op,
            requires_grad,
        });
        Var(self.nodes.len() - 1)
    }

    /// Whether gradient flows into this node.
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

    /// The value of a node with a single element (a loss).
    ///
    /// **Panics** if the node has more or fewer than one element.
    #[track_caller]
    pub fn scalar(&self, v: Var) -> T {
        let a = self.value(v);
        assert_eq!(a.len(), 1, "scalar: node {} has shape {:?}", v.0, a.shape());
        *a.iter().next().unwrap()
    }

    /// Reverse-mode gradients of `loss` (a single-element node) with respect
    /// to every trainable parameter and differentiable input it depends on.
    ///
    /// Gradients accumulate where a value is used more than once. A table
    /// that was only read through [`Tape::gather`] gets a row-sparse
    /// gradient; anything else a dense one.
    ///
    /// **Panics** if `loss` does not have exactly one element.
    #[track_caller]
    pub fn backward(&self, loss: Var) -> Gradients<T> {
        let n = self.nodes.len();
        assert!(loss.0 < n, "backward: {loss:?} is not a node of this tape");
        let shape = self.nodes[loss.0].value.view().shape().to_vec();
        assert_eq!(
            shape.iter().product::<usize>(),
            1,
            "backward: the loss must have one element, it has shape {shape:?}"
        );

        let mut out = Gradients {
            params: HashMap::new(),
            inputs: HashMap::new(),
        };
        if !self.nodes[loss.0].requires_grad {
            return out;
        }
        let mut grads: Vec<Option<Flow<'_, T>>> = (0..n).map(|_| None).collect();
        grads[loss.0] = Some(Flow::Owned(ArrayD::from_elem(IxDyn(&shape), T::one())));
        // Row-sparse contributions to 2-D parameter tables, by node.
        let mut sparse: SparseParts<T> = HashMap::new();

        for i in (0..=loss.0).rev() {
            let Some(flow) = grads[i].take() else {
                continue;
            };
            let node = &self.nodes[i];
            let nodes = &self.nodes;
            // Gathers read their rows straight from the flowing gradient,
            // which may be `c·R` never materialised.
            match &node.op {
                Op::Gather { table, ids } => {
                    let part = RowPart {
                        ids: Cow::Borrowed(ids),
                        rows: None,
                        n_src: ids.len(),
                        src: Rc::new(flow),
                    };
                    send_part(nodes, &mut grads, &mut sparse, *table, part);
                    continue;
                }
                Op::SplitGather { tables, routed } => {
                    let src = Rc::new(flow);
                    for (k, &t) in tables.iter().enumerate() {
                        if nodes[t.0].requires_grad && !routed.positions[k].is_empty() {
                            let part = RowPart {
                                ids: Cow::Borrowed(&routed.local[k]),
                                rows: Some(&routed.positions[k]),
                                n_src: routed.n_ids(),
                                src: Rc::clone(&src),
                            };
                            send_part(nodes, &mut grads, &mut sparse, t, part);
                        }
                    }
                    continue;
                }
                _ => {}
            }
            let gy = flow.into_owned();
            let y = node.value.view();
            let val = |v: Var| nodes[v.0].value.view();
            use crate::ops::*;
            match &node.op {
                Op::Constant => {}
                Op::Input => {
                    out.inputs.insert(i, gy);
                }
                Op::Param(id) => {
                    accumulate_dense(&mut out.params, *id, gy);
                }
                Op::Gather { .. } | Op::SplitGather { .. } => unreachable!("handled above"),
                Op::GatedMix(saved) => {
                    let (shared, rows) = (saved.shared, saved.rows);
                    let want = |v: Var| nodes[v.0].requires_grad;
                    let wanted = crate::layers::gated_mix::Want {
                        shared: want(shared),
                        rows: want(rows),
                        gate: saved.gate.is_some_and(want),
                    };
                    let (gs, row_contrib, gg) =
                        saved.backward(val(shared), val(rows), saved.gate.map(val), gy, wanted);
                    // ∂shared is ∂out changed in place: it becomes the
                    // buffer when there is none yet.
                    if let Some(d) = gs {
                        add_owned(&mut grads, nodes, shared, d);
                    }
                    if let (Some(gate), Some(d)) = (saved.gate, gg) {
                        if let Some(g) = grad_buf(&mut grads, nodes, gate) {
                            *g += &d;
                        }
                    }
                    if let Some((ids, vals)) = row_contrib {
                        send_rows(nodes, &mut grads, &mut sparse, rows, ids, vals);
                    }
                }
                Op::FusedCrossEntropy(saved) => {
                    // Take the buffers out so that all can be written at once.
                    let mut take = |v: Var| grad_buf(&mut grads, nodes, v).map(std::mem::take);
                    let mut gh = take(saved.hidden);
                    let mut gws: Vec<Option<ArrayD<T>>> =
                        saved.weights.iter().map(|&w| take(w)).collect();
                    let ws: Vec<ArrayViewD<'_, T>> =
                        saved.weights.iter().map(|&w| val(w)).collect();
                    saved.backward(
                        val(saved.hidden),
                        &ws,
                        gy.view(),
                        gh.as_mut(),
                        gws.iter_mut().map(Option::as_mut).collect(),
                    );
                    if let Some(g) = gh {
                        grads[saved.hidden.0] = Some(Flow::Owned(g));
                    }
                    for (w, g) in saved.weights.iter().zip(gws) {
                        if let Some(g) = g {
                            grads[w.0] = Some(Flow::Owned(g));
                        }
                    }
                }
                Op::FusedCrossEntropySum(saved) => {
                    // The gradients were formed in the forward; scale them by gy.
                    let gy = *gy.iter().next().expect("the summed loss is a scalar");
                    for (v, d) in saved.held() {
                        add_scaled(&mut grads, nodes, v, gy, d);
                    }
                }
                Op::Add(a, b) => {
                    if let Some(g) = grad_buf(&mut grads, nodes, *a) {
                        elementwise::add_backward(gy.view(), g);
                    }
                    if let Some(g) = grad_buf(&mut grads, nodes, *b) {
                        elementwise::add_backward(gy.view(), g);
                    }
                }
                Op::Sub(a, b) => {
                    if let Some(g) = grad_buf(&mut grads, nodes, *a) {
                        elementwise::add_backward(gy.view(), g);
                    }
                    if let Some(g) = grad_buf(&mut grads, nodes, *b) {
                        elementwise::sub_backward_rhs(gy.view(), g);
                    }
                }
                Op::Mul(a, b) => {
                    if let Some(g) = grad_buf(&mut grads, nodes, *a) {
                        elementwise::mul_backward(gy.view(), val(*b), g);
                    }
                    if let Some(g) = grad_buf(&mut grads, nodes, *b) {
                        elementwise::mul_backward(gy.view(), val(*a), g);
                    }
                }
                Op::Scale(a, c) => {
                    if let Some(g) = grad_buf(&mut grads, nodes, *a) {
                        elementwise::scale_backward(gy.view(), *c, g);
                    }
                }
                Op::RowScale { x, s } => {
                    if let Some(g) = grad_buf(&mut grads, nodes, *x) {
                        row_scale::row_scale_backward_x(gy.view(), val(*s), g);
                    }
                    if let Some(g) = grad_buf(&mut grads, nodes, *s) {
                        row_scale::row_scale_backward_s(gy.view(), val(*x), g);
                    }
                }
                Op::Sigmoid(x) => {
                    if let Some(g) = grad_buf(&mut grads, nodes, *x) {
                        sigmoid::sigmoid_backward(y.view(), gy.view(), g);
                    }
                }
                Op::Select { mask, a, b } => {
                    if let Some(g) = grad_buf(&mut grads, nodes, *a) {
                        select::select_backward(mask, true, gy.view(), g);
                    }
                    if let Some(g) = grad_buf(&mut grads, nodes, *b) {
                        select::select_backward(mask, false, gy.view(), g);
                    }
                }
                Op::SegmentSum { x, segments } => {
                    if let Some(g) = grad_buf(&mut grads, nodes, *x) {
                        segment::segment_sum_backward(segments, gy.view(), g);
                    }
                }
                Op::SegmentMean {
                    x,
                    segments,
                    counts,
                } => {
                    if let Some(g) = grad_buf(&mut grads, nodes, *x) {
                        segment::segment_mean_backward(segments, counts, gy.view(), g);
                    }
                }
                Op::RowNorm(x) => {
                    if let Some(g) = grad_buf(&mut grads, nodes, *x) {
                        row_norm::row_norm_backward(val(*x), y.view(), gy.view(), g);
                    }
                }
                Op::FusionPenalty { x, groups, norms } => {
                    if nodes[x.0].requires_grad {
                        let d = fusion_penalty::fusion_penalty_backward(
                            val(*x),
                            groups,
                            norms,
                            gy.view(),
                        );
                        add_owned(&mut grads, nodes, *x, d);
                    }
                }
                Op::Sum(x) => {
                    if let Some(g) = grad_buf(&mut grads, nodes, *x) {
                        reduce::sum_backward(gy.view(), g);
                    }
                }
                Op::Mean(x) => {
                    if let Some(g) = grad_buf(&mut grads, nodes, *x) {
                        reduce::mean_backward(gy.view(), g);
                    }
                }
                Op::DotConst { x, r } => {
                    // ∂x = ∂y·R (`reduce::dot_const_backward`), kept as that
                    // product until something needs the array (a gather
                    // reads only the rows it routes).
                    let c = *gy.iter().next().expect("a scalar gradient");
                    add_scaled(&mut grads, nodes, *x, c, r.view());
                }
                Op::MatMul(a, b) => {
                    if let Some(g) = grad_buf(&mut grads, nodes, *a) {
                        matmul::matmul_backward_lhs(gy.view(), val(*b), g);
                    }
                    if let Some(g) = grad_buf(&mut grads, nodes, *b) {
                        matmul::matmul_backward_rhs(gy.view(), val(*a), g);
                    }
                }
                Op::Transpose(x) => {
                    if let Some(g) = grad_buf(&mut grads, nodes, *x) {
                        shape::transpose_backward(gy.view(), g);
                    }
                }
                Op::Reshape(x) => {
                    if let Some(g) = grad_buf(&mut grads, nodes, *x) {
                        shape::reshape_backward(gy.view(), g);
                    }
                }
                Op::ConcatRows(parts) => {
                    let mut start = 0;
                    for p in parts {
                        let rows = nodes[p.0].value.view().shape()[0];
                        if let Some(g) = grad_buf(&mut grads, nodes, *p) {
                            shape::concat_rows_backward(start, gy.view(), g);
                        }
                        start += rows;
                    }
                }
                Op::LogSumExp(x) => {
                    if let Some(g) = grad_buf(&mut grads, nodes, *x) {
                        cross_entropy::logsumexp_backward(val(*x), y.view(), gy.view(), g);
                    }
                }
                Op::CrossEntropy { logits, labels } => {
                    if let Some(g) = grad_buf(&mut grads, nodes, *logits) {
                        cross_entropy::cross_entropy_backward(val(*logits), labels, gy.view(), g);
                    }
                }
            }
        }

        // Row-sparse table gradients: coalesced in tape order, merged into a
        // dense gradient where the same table was also used densely.
        let mut nodes_with_rows: Vec<usize> = sparse.keys().copied().collect();
        nodes_with_rows.sort_unstable();
        let mut per_param: Vec<(ParamId, RowParts<T>)> = Vec::new();
        for node in nodes_with_rows {
            let Op::Param(id) = self.nodes[node].op else {
                unreachable!("only parameters collect rows")
            };
            let k = match per_param.iter().position(|(p, _)| *p == id) {
                Some(k) => k,
                None => {
                    let shape = self.nodes[node].value.view().shape().to_vec();
                    per_param.push((
                        id,
                        RowParts {
                            n_rows: shape[0],
                            width: shape[1],
                            parts: Vec::new(),
                        },
                    ));
                    per_param.len() - 1
                }
            };
            // Contributions were pushed in reverse tape order; restore tape order.
            let parts = sparse.remove(&node).unwrap_or_default();
            per_param[k].1.parts.extend(parts.into_iter().rev());
        }
        for (id, parts) in per_param {
            let rs = parts.coalesce();
            match out.params.get_mut(&id) {
                Some(Grad::Dense(d)) => rs.add_to(
                    d.view_mut()
                        .into_dimensionality::<Ix2>()
                        .expect("2-D table"),
                ),
                Some(Grad::RowSparse(_)) => unreachable!("one entry per parameter"),
                None => {
                    out.params.insert(id, Grad::RowSparse(rs));
                }
            }
        }
        out
    }
}

/// A gradient flowing backwards into a node: an array, or `c·R` for a
/// constant `R` held by a `dot_const` node, not yet materialised.
enum Flow<'a, T> {
    Owned(ArrayD<T>),
    Scaled(T, ArrayViewD<'a, T>),
}

impl<T: Real> Flow<'_, T> {
    /// The gradient as an array. `c·R` is written as `c·r + 0`, the bits a
    /// zero buffer plus [`reduce::dot_const_backward`] would hold.
    ///
    /// [`reduce::dot_const_backward`]: crate::ops::reduce::dot_const_backward
    fn into_owned(self) -> ArrayD<T> {
        match self {
            Flow::Owned(a) => a,
            Flow::Scaled(c, r) => crate::ops::reduce::scaled_copy(c, r),
        }
    }

    /// The gradient as `n` rows of `width` for coalescing; `store` keeps a
    /// materialised copy alive when the layout needs one.
    fn rows<'s>(
        &'s self,
        n: usize,
        width: usize,
        rows: Option<&'s [usize]>,
        store: &'s mut Option<ArrayD<T>>,
    ) -> RowSource<'s, T> {
        let (a, scale) = match self {
            Flow::Owned(a) => (a.view(), None),
            Flow::Scaled(c, r) => (r.view(), Some(*c)),
        };
        let (values, scale) = match a.into_shape_with_order((n, width)) {
            Ok(v) => (v, scale),
            Err(_) => {
                let owned = store.insert(match self {
                    Flow::Owned(a) => a.as_standard_layout().into_owned(),
                    Flow::Scaled(c, r) => crate::ops::reduce::scaled_copy(*c, r.view()),
                });
                let v = owned
                    .view()
                    .into_shape_with_order((n, width))
                    .expect("the gradient has the shape of its value");
                (v, None)
            }
        };
        RowSource {
            values,
            rows,
            scale,
        }
    }
}

/// Rows sent to a table: destination ids, and the rows of a flowing
/// gradient of `n_src` rows they come from (`rows[j]`, or row j when
/// `None`).
struct RowPart<'a, T> {
    ids: Cow<'a, [usize]>,
    rows: Option<&'a [usize]>,
    n_src: usize,
    src: Rc<Flow<'a, T>>,
}

/// The row contributions to one 2-D parameter, in tape order.
struct RowParts<'a, T> {
    n_rows: usize,
    width: usize,
    parts: Vec<RowPart<'a, T>>,
}

impl<T: Real> RowParts<'_, T> {
    fn coalesce(self) -> crate::RowSparse<T> {
        let mut stores: Vec<Option<ArrayD<T>>> = self.parts.iter().map(|_| None).collect();
        let ids: Vec<usize> = self
            .parts
            .iter()
            .flat_map(|p| p.ids.iter().copied())
            .collect();
        let sources: Vec<RowSource<'_, T>> = self
            .parts
            .iter()
            .zip(stores.iter_mut())
            .map(|(p, store)| p.src.rows(p.n_src, self.width, p.rows, store))
            .collect();
        crate::ops::scatter::coalesce_sources(self.n_rows, self.width, &ids, &sources)
    }
}

type SparseParts<'a, T> = HashMap<usize, Vec<RowPart<'a, T>>>;

/// Sends owned `values[i]` to row `ids[i]` of `table` (see [`send_part`]).
fn send_rows<'a, T: Real>(
    nodes: &[Node<'_, T>],
    grads: &mut [Option<Flow<'a, T>>],
    sparse: &mut SparseParts<'a, T>,
    table: Var,
    ids: Vec<usize>,
    values: ArrayD<T>,
) {
    let part = RowPart {
        n_src: ids.len(),
        ids: Cow::Owned(ids),
        rows: None,
        src: Rc::new(Flow::Owned(values)),
    };
    send_part(nodes, grads, sparse, table, part);
}

/// Sends rows to a table: kept row-sparse when the table is a 2-D
/// parameter (coalesced after the walk), a dense scatter-add otherwise.
fn send_part<'a, T: Real>(
    nodes: &[Node<'_, T>],
    grads: &mut [Option<Flow<'a, T>>],
    sparse: &mut SparseParts<'a, T>,
    table: Var,
    part: RowPart<'a, T>,
) {
    let t = &nodes[table.0];
    if matches!(t.op, Op::Param(_)) && t.value.view().ndim() == 2 {
        sparse.entry(table.0).or_default().push(part);
    } else if let Some(g) = grad_buf(grads, nodes, table) {
        let n_rows = g.shape().first().copied().unwrap_or(1);
        let width: usize = g.shape().iter().skip(1).product();
        let mut store = None;
        let src = part.src.rows(part.n_src, width, part.rows, &mut store);
        let mut g2 = g
            .view_mut()
            .into_shape_with_order((n_rows, width))
            .expect("fresh gradient buffers are contiguous");
        for (j, &id) in part.ids.iter().enumerate() {
            let r = src.rows.map_or(j, |rows| rows[j]);
            let mut dst = g2.row_mut(id);
            match src.scale {
                None => dst += &src.values.row(r),
                Some(c) => dst.zip_mut_with(&src.values.row(r), |d, &x| *d += c * x),
            }
        }
    }
}

/// Adds `c·r` (r of node `v`'s shape, held by the tape) to `v`'s gradient:
/// kept as the pair when `v` has no gradient yet, written out only when
/// something needs the array ([`Flow::into_owned`]).
fn add_scaled<'a, T: Real>(
    grads: &mut [Option<Flow<'a, T>>],
    nodes: &[Node<'_, T>],
    v: Var,
    c: T,
    r: ArrayViewD<'a, T>,
) {
    if !nodes[v.0].requires_grad {
        return;
    }
    if grads[v.0].is_none() {
        grads[v.0] = Some(Flow::Scaled(c, r));
    } else if let Some(g) = grad_buf(grads, nodes, v) {
        crate::ops::reduce::add_scaled(c, r, g);
    }
}

/// Adds a fresh gradient array `d` of node `v`'s shape to its gradient,
/// taking it as the buffer when there is none yet (no zero-fill, no add).
fn add_owned<'a, T: Real>(
    grads: &mut [Option<Flow<'a, T>>],
    nodes: &[Node<'_, T>],
    v: Var,
    d: ArrayD<T>,
) {
    if !nodes[v.0].requires_grad {
        return;
    }
    if grads[v.0].is_none() {
        grads[v.0] = Some(Flow::Owned(d));
    } else if let Some(g) = grad_buf(grads, nodes, v) {
        *g += &d;
    }
}

/// The gradient buffer of node `v`, zero-initialised on first use; `None`
/// when no gradient flows into it.
fn grad_buf<'g, T: Real>(
    grads: &'g mut [Option<Flow<'_, T>>],
    nodes: &[Node<'_, T>],
    v: Var,
) -> Option<&'g mut ArrayD<T>> {
    if !nodes[v.0].requires_grad {
        return None;
    }
    let slot = &mut grads[v.0];
    let owned = match slot.take() {
        None => ArrayD::zeros(nodes[v.0].value.view().raw_dim()),
        Some(flow) => flow.into_owned(),
    };
    match slot.insert(Flow::Owned(owned)) {
        Flow::Owned(a) => Some(a),
        Flow::Scaled(..) => unreachable!("just stored an owned array"),
    }
}

fn accumulate_dense<T: Real>(params: &mut HashMap<ParamId, Grad<T>>, id: ParamId, g: ArrayD<T>) {
    match params.get_mut(&id) {
        Some(Grad::Dense(d)) => *d += &g,
        Some(Grad::RowSparse(_)) => unreachable!("sparse gradients are merged after the walk"),
        None => {
            params.insert(id, Grad::Dense(g));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

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
