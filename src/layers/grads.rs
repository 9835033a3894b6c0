//! What the layers' tape-free backward passes return ([`LayerGrads`]):
//! each parameter's gradient with its name and id ([`NamedGrad`]), plus
//! the gradient of the differentiable input where there is one.
//!
//! A tape-free pair is a layer's `forward_saved` (the output and what the
//! backward needs, a small saved-context struct) and `backward_saved`
//! (from the upstream gradient to the gradients): for a caller whose
//! forward and backward are separate calls — a binding, another
//! framework's autograd function — with the same bits as the tape.

use ndarray::{ArrayD, ArrayView2};

use crate::kernels::Real;
use crate::kernels::pool::Pool;
use crate::kernels::scatter::{RowSource, coalesce_sources_in};
use crate::param::{GradSource, ParamGrad, ParamId, Parameter, RowSparse};
use crate::state::Module;
use crate::tape::Gradients;

/// One parameter's gradient, under the parameter's checkpoint name and
/// its [`ParamId`]: row-sparse ([`ParamGrad::RowSparse`]) for a table a
/// batch reads rows of, dense otherwise.
#[derive(Clone, Debug)]
pub struct NamedGrad<T> {
    /// The parameter's name (`token_embedding.orig.weight`, …).
    pub name: String,
    /// The parameter's id (what an optimiser looks a gradient up by).
    pub id: ParamId,
    /// The gradient.
    pub grad: ParamGrad<T>,
}

impl<T: Real> NamedGrad<T> {
    /// `grad` as the gradient of `p`.
    pub fn new(p: &Parameter<T>, grad: ParamGrad<T>) -> Self {
        NamedGrad {
            name: p.name().to_string(),
            id: p.id(),
            grad,
        }
    }

    /// The row-sparse gradient of the 2-D parameter `p` that sends row i
    /// of `values` (times `scale` when given) to row `rows[i]`, repeats
    /// summed in order; its values in a buffer from `ws`.
    ///
    /// **Panics** if `p` is not 2-D, `values` is not `(rows.len(), width
    /// of p)` or a row is out of range (check them first).
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::{layers::{NamedGrad, Workspace}, ParamGrad, Parameter};
    /// let p = Parameter::new("w", ndarray::Array2::<f64>::zeros((4, 2)).into_dyn());
    /// let g = NamedGrad::from_rows(&Workspace::new(), &p, &[3, 1, 3], array![[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]].view(), Some(2.0));
    /// let ParamGrad::RowSparse(rs) = g.grad else { panic!() };
    /// assert_eq!(rs.rows, vec![1, 3]);
    /// assert_eq!(rs.values, array![[6.0, 8.0], [12.0, 16.0]]);
    /// ```
    #[track_caller]
    pub fn from_rows(
        ws: &Pool<T>,
        p: &Parameter<T>,
        rows: &[usize],
        values: ArrayView2<'_, T>,
        scale: Option<T>,
    ) -> Self {
        let shape = p.shape();
        assert_eq!(shape.len(), 2, "NamedGrad::from_rows: a 2-D parameter");
        let source = RowSource {
            values,
            rows: None,
            scale,
        };
        let rs = RowSparse::from_coalesced(
            shape[0],
            coalesce_sources_in(ws, shape[0], shape[1], rows, &[source]),
        );
        NamedGrad::new(p, ParamGrad::RowSparse(rs))
    }

    /// The gradients a tape's backward left for `module`'s parameters, in
    /// the module's parameter order (those with none are left out).
    pub fn of_module(module: &dyn Module<T>, mut grads: Gradients<T>) -> Vec<Self> {
        module
            .parameters()
            .into_iter()
            .filter_map(|p| grads.take(p.id()).map(|g| NamedGrad::new(p, g)))
            .collect()
    }

    /// Gives the gradient's buffer back to `ws`.
    pub fn give_back(self, ws: &Pool<T>) {
        match self.grad {
            ParamGrad::Dense(d) => ws.give(d),
            ParamGrad::RowSparse(s) => ws.give(s.values),
        }
    }
}

/// What a layer's tape-free backward returns: the parameters' gradients
/// in parameter order (only the trainable ones that receive one), and the
/// gradient of the differentiable input (the head's hidden states, the
/// split vocabulary's shared rows) when asked for.
///
/// `I` is how ∂input is kept: an array of `T`, or a
/// [`Stored`](crate::param::Stored) in the activations' dtype where the
/// layer takes half-precision activations
/// ([`SplitVocabulary::backward_saved_stored`](crate::layers::SplitVocabulary::backward_saved_stored)).
#[derive(Clone, Debug)]
pub struct LayerGrads<T, I = ArrayD<T>> {
    /// ∂input, of the input's shape; `None` when not asked for (always for
    /// the embeddings, whose input is ids).
    pub input: Option<I>,
    /// The parameters' gradients.
    pub params: Vec<NamedGrad<T>>,
}

impl<T, I> LayerGrads<T, I> {
    /// The gradient of the parameter named `name`.
    pub fn get(&self, name: &str) -> Option<&ParamGrad<T>> {
        self.params.iter().find(|g| g.name == name).map(|g| &g.grad)
    }
}

impl<T, I> GradSource<T> for LayerGrads<T, I> {
    fn grad_of(&self, p: &Parameter<T>) -> Option<&ParamGrad<T>> {
        self.params.iter().find(|g| g.id == p.id()).map(|g| &g.grad)
    }
}

/// Where `x·1 + 0` is what the tape leaves: a gradient formed whole and
/// handed to the tape as `1·d` is written out as `1·d + 0` (a −0 as +0).
pub(crate) fn as_tape_leaves<T: Real>(d: &mut ArrayD<T>) {
    d.mapv_inplace(|x| T::one() * x + T::zero());
}

/// Bit-for-bit comparisons for the layers' tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use ndarray::ArrayViewD;

    /// The shape and every element's bits (f32 widened exactly).
    pub(crate) fn bits<T: Real>(a: ArrayViewD<'_, T>) -> (Vec<usize>, Vec<u64>) {
        let b = a.iter().map(|&x| Real::to_f64(x).to_bits()).collect();
        (a.shape().to_vec(), b)
    }

    fn grad_bits<T: Real>(g: &ParamGrad<T>) -> (bool, Vec<usize>, (Vec<usize>, Vec<u64>)) {
        match g {
            ParamGrad::Dense(d) => (false, Vec::new(), bits(d.view())),
            ParamGrad::RowSparse(s) => {
                let mut shape = bits(s.values.view().into_dyn());
                shape.0.insert(0, s.n_rows);
                (true, s.rows.clone(), shape)
            }
        }
    }

    /// `got` holds, for every parameter of `module`, what the tape's
    /// `want` holds: the same kind of gradient with the same bits, or none.
    pub(crate) fn assert_same_grads<T: Real>(
        module: &dyn Module<T>,
        got: &LayerGrads<T>,
        want: &Gradients<T>,
    ) {
        for p in module.parameters() {
            let g = got.get(p.name()).map(grad_bits);
            let w = want.param(p).map(grad_bits);
            assert_eq!(g, w, "{}", p.name());
        }
        let names: Vec<&str> = module.parameters().iter().map(|p| p.name()).collect();
        assert!(got.params.iter().all(|g| names.contains(&g.name.as_str())));
    }

    /// The input's gradients, bit for bit.
    pub(crate) fn assert_same_input<T: Real>(got: Option<&ArrayD<T>>, want: Option<ArrayD<T>>) {
        assert_eq!(got.map(|g| bits(g.view())), want.map(|g| bits(g.view())));
    }

    /// A test `$test` running the generic `$check` in f32 and in f64.
    macro_rules! in_f32_and_f64 {
        ($test:ident, $check:ident) => {
            #[test]
            fn $test() {
                $check::<f32>();
                $check::<f64>();
            }
        };
    }
    pub(crate) use in_f32_and_f64;
}
