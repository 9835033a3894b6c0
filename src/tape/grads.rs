//! The gradient store of one reverse sweep.
//!
//! [`NodeGrads`] holds, for every node of the tape, the gradient flowing into
//! it so far (none, an array, or a lazy `c·R`), and for every 2-D parameter
//! the rows sent to it by gathers. An op's [`Backward`](super::Backward)
//! reads the values it needs ([`NodeGrads::value`]) and adds its inputs'
//! gradients through [`NodeGrads::accumulate`] (or [`NodeGrads::buffer`]),
//! [`NodeGrads::add`], [`NodeGrads::add_scaled`] or [`NodeGrads::add_rows`]
//! (the contract of [`crate::ops`]); the first touch of a node decides its
//! buffer, so a fresh array handed over by an op becomes the buffer with no
//! zero-fill and no add.

use std::collections::BTreeMap;

use ndarray::{ArrayD, ArrayViewD};

use super::Var;
use super::flow::{Flow, RowPart, coalesce_parts, scatter_part};
use crate::kernels::Real;
use crate::kernels::pool::Pool;
use crate::kernels::reduce::add_scaled;

/// What the sweep knows of one node.
struct Slot<'a, T> {
    value: &'a dyn super::NodeValue<T>,
    requires_grad: bool,
    /// A 2-D parameter: rows sent to it are kept row-sparse.
    row_sparse: bool,
    flow: Option<Flow<'a, T>>,
}

/// The gradients of one backward sweep, node by node.
pub struct NodeGrads<'a, T> {
    slots: Vec<Slot<'a, T>>,
    /// Rows sent to 2-D parameters, by node, in the order they were sent
    /// (reverse tape order).
    rows: BTreeMap<usize, Vec<RowPart<'a, T>>>,
    pool: Pool<T>,
}

impl<'a, T: Real> NodeGrads<'a, T> {
    /// A store for nodes given as (value, requires gradient, is a 2-D
    /// parameter).
    pub(crate) fn new(
        nodes: impl Iterator<Item = (&'a dyn super::NodeValue<T>, bool, bool)>,
        pool: Pool<T>,
    ) -> Self {
        NodeGrads {
            slots: nodes
                .map(|(value, requires_grad, row_sparse)| Slot {
                    value,
                    requires_grad,
                    row_sparse,
                    flow: None,
                })
                .collect(),
            rows: BTreeMap::new(),
            pool,
        }
    }

    /// Sets the gradient of the loss.
    pub(crate) fn seed(&mut self, loss: Var, g: ArrayD<T>) {
        self.slots[loss.0].flow = Some(Flow::Dense(g));
    }

    /// Takes the gradient that flowed into `v`, leaving none.
    pub(crate) fn take(&mut self, v: Var) -> Option<Flow<'a, T>> {
        self.slots[v.0].flow.take()
    }

    /// The nodes that received rows, in tape order.
    pub(crate) fn nodes_with_rows(&self) -> Vec<usize> {
        self.rows.keys().copied().collect()
    }

    /// Coalesces the rows sent to these nodes (one parameter's), in tape
    /// order.
    pub(crate) fn coalesce_rows(&mut self, nodes: &[usize]) -> crate::RowSparse<T> {
        let shape = self.slots[nodes[0]].value.shape().to_vec();
        let mut parts = Vec::new();
        for node in nodes {
            // Contributions were sent in reverse tape order; restore tape order.
            let mut sent = self.rows.remove(node).unwrap_or_default();
            sent.reverse();
            parts.extend(sent);
        }
        let rs = coalesce_parts(&self.pool, shape[0], shape[1], &parts);
        for part in parts {
            if let Ok(Flow::Dense(a)) = std::rc::Rc::try_unwrap(part.src) {
                self.pool.give(a);
            }
        }
        rs
    }

    /// Whether gradient flows into `v`.
    ///
    /// **Panics** if `v` is not a node of the tape.
    #[track_caller]
    pub fn wants(&self, v: Var) -> bool {
        self.slots[v.0].requires_grad
    }

    /// The forward value of `v`.
    ///
    /// **Panics** if `v` is not a node of the tape.
    #[track_caller]
    pub fn value(&self, v: Var) -> ArrayViewD<'a, T> {
        self.slots[v.0].value.view()
    }

    /// The forward value of `v` as it is kept: a parameter's in half
    /// precision not widened ([`Tape::stored_value`](super::Tape::stored_value)).
    ///
    /// **Panics** if `v` is not a node of the tape.
    #[track_caller]
    pub fn stored_value(&self, v: Var) -> crate::param::StoredView<'a, T> {
        self.slots[v.0].value.stored()
    }

    /// The pool the sweep takes its buffers from.
    pub fn pool(&self) -> &Pool<T> {
        &self.pool
    }

    /// Gives a gradient array that an op has finished with back to the
    /// pool.
    pub fn recycle(&self, a: ArrayD<T>) {
        self.pool.give(a);
    }

    /// The gradient buffer of `v`, zero-initialised on first use (a lazy
    /// `c·R` is written out); `None` when no gradient flows into `v`.
    pub fn buffer(&mut self, v: Var) -> Option<&mut ArrayD<T>> {
        let slot = &mut self.slots[v.0];
        if !slot.requires_grad {
            return None;
        }
        let owned = match slot.flow.take() {
            None => self.pool.zeros(slot.value.shape()),
            Some(flow) => flow.into_owned_in(&self.pool),
        };
        match slot.flow.insert(Flow::Dense(owned)) {
            Flow::Dense(a) => Some(a),
            Flow::Scaled(..) => unreachable!("just stored an array"),
        }
    }

    /// Takes `v`'s gradient buffer out (zero-initialised when it has none),
    /// so that an op can write several buffers at once; give it back with
    /// [`NodeGrads::add`]. `None` when no gradient flows into `v`.
    pub fn take_buffer(&mut self, v: Var) -> Option<ArrayD<T>> {
        self.buffer(v)?;
        match self.slots[v.0].flow.take() {
            Some(Flow::Dense(a)) => Some(a),
            _ => unreachable!("buffer() stored an array"),
        }
    }

    /// Adds a fresh gradient array `d` of `v`'s shape to `v`'s gradient,
    /// taking it as the buffer when there is none yet (no zero-fill, no add).
    ///
    /// **Panics** if `d` does not have `v`'s shape.
    #[track_caller]
    pub fn add(&mut self, v: Var, d: ArrayD<T>) {
        self.add_flow(v, "add", Flow::Dense(d));
    }

    /// Adds `c·r` (r of `v`'s shape, held by the tape) to `v`'s gradient:
    /// kept as the pair when `v` has no gradient yet, written out only when
    /// something needs the array.
    ///
    /// **Panics** if `r` does not have `v`'s shape.
    #[track_caller]
    pub fn add_scaled(&mut self, v: Var, c: T, r: ArrayViewD<'a, T>) {
        self.add_flow(v, "add_scaled", Flow::Scaled(c, r));
    }

    /// [`NodeGrads::add`] and [`NodeGrads::add_scaled`]: `flow` becomes
    /// `v`'s gradient as it is when `v` has none yet, and is added into
    /// its buffer otherwise (a fresh array then goes back to the pool).
    #[track_caller]
    fn add_flow(&mut self, v: Var, method: &str, flow: Flow<'a, T>) {
        let slot = &mut self.slots[v.0];
        assert_eq!(
            flow.shape(),
            slot.value.shape(),
            "NodeGrads::{method}: a gradient of another shape than its node"
        );
        if !slot.requires_grad {
            if let Flow::Dense(d) = flow {
                self.pool.give(d);
            }
            return;
        }
        if slot.flow.is_none() {
            slot.flow = Some(flow);
            return;
        }
        let g = self.buffer(v).expect("gradient flows into v");
        match flow {
            Flow::Dense(d) => {
                *g += &d;
                self.pool.give(d);
            }
            Flow::Scaled(c, r) => add_scaled(c, r, g),
        }
    }

    /// The accumulating form's hand-over (see [`crate::ops`]): writes `gy`
    /// out once (a buffer from the pool), then calls `add(k, ∂y, g)` for
    /// each `inputs[k]` that wants a gradient, in order, `g` its buffer
    /// ([`NodeGrads::buffer`]: zero-filled on first use), and gives ∂y back
    /// to the pool.
    pub fn accumulate(
        &mut self,
        gy: Flow<'a, T>,
        inputs: &[Var],
        mut add: impl FnMut(usize, ArrayViewD<'_, T>, &mut ArrayD<T>),
    ) {
        let gy = gy.into_owned_in(&self.pool);
        for (k, &v) in inputs.iter().enumerate() {
            if let Some(g) = self.buffer(v) {
                add(k, gy.view(), g);
            }
        }
        self.pool.give(gy);
    }

    /// Sends rows to `table`: kept row-sparse when the table is a 2-D
    /// parameter (coalesced after the sweep), added into its dense buffer
    /// otherwise.
    pub fn add_rows(&mut self, table: Var, part: RowPart<'a, T>) {
        let slot = &self.slots[table.0];
        if !slot.requires_grad {
            return;
        }
        if slot.row_sparse {
            self.rows.entry(table.0).or_default().push(part);
        } else if let Some(g) = self.buffer(table) {
            scatter_part(&part, g);
        }
    }
}
