//! What [`Tape::backward`](super::Tape::backward) returns: the gradient of
//! every trainable parameter and differentiable input the loss depends on.

use std::collections::HashMap;

use ndarray::{ArrayD, IxDyn};

use super::Var;
use crate::kernels::Real;
use crate::kernels::pool::Pool;
use crate::param::{GradSource, ParamGrad, ParamId, Parameter};

/// Gradients returned by [`Tape::backward`](super::Tape::backward), keyed
/// by parameter and by input node. Dropping them gives their large buffers
/// back to the tape's [`Pool`].
#[derive(Debug)]
pub struct Gradients<T: Real> {
    pub(crate) params: HashMap<ParamId, ParamGrad<T>>,
    pub(crate) inputs: HashMap<usize, ArrayD<T>>,
    pool: Pool<T>,
}

impl<T: Real> Drop for Gradients<T> {
    fn drop(&mut self) {
        for (_, g) in self.params.drain() {
            match g {
                ParamGrad::Dense(d) => self.pool.give(d),
                ParamGrad::RowSparse(s) => self.pool.give(s.values),
            }
        }
        for (_, g) in self.inputs.drain() {
            self.pool.give(g);
        }
    }
}

impl<T: Real> GradSource<T> for Gradients<T> {
    fn grad_of(&self, p: &Parameter<T>) -> Option<&ParamGrad<T>> {
        self.param(p)
    }
}

impl<T: Real> Gradients<T> {
    /// No gradient yet; buffers go back to `pool` when dropped.
    pub(crate) fn with_pool(pool: Pool<T>) -> Self {
        Gradients {
            params: HashMap::new(),
            inputs: HashMap::new(),
            pool,
        }
    }

    /// Adds a dense gradient of parameter `id`.
    pub(crate) fn add_dense(&mut self, id: ParamId, g: ArrayD<T>) {
        match self.params.get_mut(&id) {
            Some(ParamGrad::Dense(d)) => {
                *d += &g;
                self.pool.give(g);
            }
            Some(ParamGrad::RowSparse(_)) => {
                unreachable!("sparse gradients are merged after the sweep")
            }
            None => {
                self.params.insert(id, ParamGrad::Dense(g));
            }
        }
    }

    /// The gradient of a parameter, or `None` when it is frozen or did not
    /// contribute to the loss.
    pub fn param(&self, p: &Parameter<T>) -> Option<&ParamGrad<T>> {
        self.params.get(&p.id())
    }

    /// The gradient of a parameter by id.
    pub fn by_id(&self, id: ParamId) -> Option<&ParamGrad<T>> {
        self.params.get(&id)
    }

    /// Removes and returns a parameter's gradient.
    pub fn take(&mut self, id: ParamId) -> Option<ParamGrad<T>> {
        self.params.remove(&id)
    }

    /// The gradient of a differentiable input made by
    /// [`Tape::input`](super::Tape::input).
    pub fn input(&self, v: Var) -> Option<&ArrayD<T>> {
        self.inputs.get(&v.index())
    }

    /// Removes and returns the gradient of a differentiable input.
    pub fn take_input(&mut self, v: Var) -> Option<ArrayD<T>> {
        self.inputs.remove(&v.index())
    }

    /// The gradient of a parameter as a dense array of its shape (zeros when
    /// it received none).
    pub fn dense(&self, p: &Parameter<T>) -> ArrayD<T> {
        match self.param(p) {
            Some(g) => g.to_dense(),
            None => ArrayD::zeros(IxDyn(p.shape())),
        }
    }

    /// Iterates over (parameter id, gradient).
    pub fn iter(&self) -> impl Iterator<Item = (ParamId, &ParamGrad<T>)> {
        self.params.iter().map(|(k, v)| (*k, v))
    }
}
