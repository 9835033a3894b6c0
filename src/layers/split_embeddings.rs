//! `SplitTokenEmbeddings`: named embedding tables, each owning a contiguous
//! range of one global vocabulary (parity with d9d's layer of that name).
//!
//! `out[…, :] = table_k[id − start_k]` for the split k that owns `id`.
//! Gradients are row-sparse: only rows read in the batch carry gradient, a
//! token routed to split k sends nothing to any other split, and a frozen
//! split receives nothing. Derivation: `docs/gradients.md#gather` and
//! `docs/gradients.md#split-routing`.

use super::{Ids, SplitTables};
use crate::error::Result;
use crate::kernels::Real;
use crate::param::Parameter;
use crate::rng::Rng;
use crate::state::Module;
use crate::tape::{Tape, Var};

/// Token embeddings made of several named tables (splits).
///
/// The d9d documentation's prompt-tuning case — the original vocabulary
/// frozen, 16 new prompt tokens trained:
///
/// ```
/// use ndarray::array;
/// use splitgrad::{layers::SplitTokenEmbeddings, Rng, Tape};
/// let mut emb = SplitTokenEmbeddings::<f32>::new(&[("orig", 1000), ("prompt", 16)], &["orig", "prompt"], 8)?;
/// emb.reset_parameters(&mut Rng::new(0));
/// emb.set_trainable("orig", false)?;
/// let ids = array![[1i64, 2, 1000, 1001]];
/// let mut tape = Tape::new();
/// let hidden = emb.forward(&mut tape, &ids)?; // (1, 4, 8)
/// assert_eq!(tape.value(hidden).shape(), &[1, 4, 8]);
/// let loss = tape.sum(hidden);
/// let grads = tape.backward(loss);
/// assert!(grads.param(emb.split("orig").unwrap()).is_none());
/// assert!(grads.param(emb.split("prompt").unwrap()).is_some());
/// # Ok::<(), splitgrad::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct SplitTokenEmbeddings<T> {
    splits: SplitTables<T>,
}

impl<T: Real> SplitTokenEmbeddings<T> {
    /// Builds the layer from split sizes, their order and the hidden size;
    /// the tables start at zero (call [`Self::reset_parameters`]).
    ///
    /// Errors: empty order; a name in the order with no size; a name twice;
    /// a sized split missing from the order; hidden size 0.
    ///
    /// ```
    /// use splitgrad::layers::SplitTokenEmbeddings;
    /// assert!(SplitTokenEmbeddings::<f32>::new(&[("orig", 4)], &[] as &[&str], 8).is_err());
    /// ```
    pub fn new<S: AsRef<str>, O: AsRef<str>>(
        split_vocab_size: &[(S, usize)],
        split_order: &[O],
        hidden_size: usize,
    ) -> Result<Self> {
        Ok(SplitTokenEmbeddings {
            splits: SplitTables::new(
                "token_embedding",
                split_vocab_size,
                split_order,
                hidden_size,
            )?,
        })
    }

    /// Every element N(0, 1), as `nn.Embedding.reset_parameters`.
    ///
    /// ```
    /// use splitgrad::{layers::SplitTokenEmbeddings, Rng};
    /// let mut e = SplitTokenEmbeddings::<f64>::new(&[("a", 3)], &["a"], 2)?;
    /// e.reset_parameters(&mut Rng::new(1));
    /// assert!(e.split("a").unwrap().value().iter().all(|x| x.is_finite() && *x != 0.0));
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn reset_parameters(&mut self, rng: &mut Rng) {
        self.splits.fill(rng, |r| T::from_f64(r.normal()));
    }

    /// Looks up embeddings for global ids of any shape: → `(*ids.shape, H)`.
    ///
    /// An id outside `[0, V)` is an error naming the id, its position and
    /// the valid range (d9d would return a zero vector).
    ///
    /// ```
    /// use splitgrad::{layers::SplitTokenEmbeddings, Tape};
    /// let e = SplitTokenEmbeddings::<f32>::new(&[("a", 3)], &["a"], 2)?;
    /// let mut tape = Tape::new();
    /// let err = e.forward(&mut tape, &[0i64, 3]).unwrap_err();
    /// assert_eq!(err.to_string(), "input id 3 at position [1] is out of range 0..3");
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn forward<'p, 'i>(
        &'p self,
        tape: &mut Tape<'p, T>,
        input_ids: impl Ids<'i>,
    ) -> Result<Var> {
        let input_ids = input_ids.ids();
        let routed = self.splits.route(input_ids.view(), "input id")?;
        let tables: Vec<Var> = self.splits.tables().iter().map(|p| tape.param(p)).collect();
        Ok(tape.split_gather(&tables, &routed, input_ids.shape()))
    }

    /// The table of a split (`token_embedding.<split>.weight`).
    pub fn split(&self, name: &str) -> Option<&Parameter<T>> {
        self.splits.table(name)
    }

    /// The table of a split, to change in place.
    pub fn split_mut(&mut self, name: &str) -> Option<&mut Parameter<T>> {
        self.splits.table_mut(name)
    }

    /// Freezes (`false`) or unfreezes a split: a frozen split receives no
    /// gradient and is never updated. An unknown split is an error.
    pub fn set_trainable(&mut self, split: &str, trainable: bool) -> Result<()> {
        self.splits.set_trainable(split, trainable)
    }

    /// The splits: names, sizes, routing.
    pub fn splits(&self) -> &SplitTables<T> {
        &self.splits
    }

    /// The splits, to change in place.
    pub fn splits_mut(&mut self) -> &mut SplitTables<T> {
        &mut self.splits
    }

    /// V.
    pub fn vocab_size(&self) -> usize {
        self.splits.vocab_size()
    }

    /// H.
    pub fn hidden_size(&self) -> usize {
        self.splits.hidden_size()
    }
}

impl<T: Real> Module<T> for SplitTokenEmbeddings<T> {
    /// The tables, in split order.
    fn parameters(&self) -> Vec<&Parameter<T>> {
        self.splits.tables().iter().collect()
    }

    fn parameters_mut(&mut self) -> Vec<&mut Parameter<T>> {
        self.splits.tables_mut().iter_mut().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::param::ParamGrad;
    use ndarray::array;

    #[test]
    fn routed_gradient_touches_only_the_owner() {
        // Splits a (2 rows) and b (2 rows); ids [3, 3, 0]: b's row 1 twice,
        // a's row 0 once. ∂b[1] = R[0] + R[1], ∂a[0] = R[2]; nothing else.
        let mut e =
            SplitTokenEmbeddings::<f64>::new(&[("a", 2), ("b", 2)], &["a", "b"], 2).unwrap();
        e.reset_parameters(&mut Rng::new(3));
        let ids = [3i64, 3, 0];
        let mut t = Tape::new();
        let y = e.forward(&mut t, &ids).unwrap();
        let r = array![[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]].into_dyn();
        let loss = t.dot_const(y, r);
        let g = t.backward(loss);
        let ParamGrad::RowSparse(gb) = g.param(e.split("b").unwrap()).unwrap() else {
            panic!("dense")
        };
        assert_eq!(gb.rows, vec![1]);
        assert_eq!(gb.values, array![[11.0, 22.0]]);
        let ParamGrad::RowSparse(ga) = g.param(e.split("a").unwrap()).unwrap() else {
            panic!("dense")
        };
        assert_eq!(ga.rows, vec![0]);
        assert_eq!(ga.values, array![[100.0, 200.0]]);
    }

    #[test]
    fn reset_is_seeded() {
        let mut a = SplitTokenEmbeddings::<f32>::new(&[("x", 3000)], &["x"], 3).unwrap();
        let mut b = a.clone();
        a.reset_parameters(&mut Rng::new(9));
        b.reset_parameters(&mut Rng::new(9));
        assert_eq!(a.split("x").unwrap().value(), b.split("x").unwrap().value());
        let v = a.split("x").unwrap().value();
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.05, "{mean}");
    }
}
