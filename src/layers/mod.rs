//! The three layers: [`SplitTokenEmbeddings`], [`SplitVocabulary`] and
//! [`SplitLanguageModellingHead`]. A layer validates its inputs (every id,
//! label and shape, with an [`Error`](crate::Error) naming what is wrong),
//! owns its named [`Parameter`]s and records its forward
//! pass on a [`Tape`](crate::Tape) with the ops of [`crate::ops`].
//!
//! All three take ids the same way — anything that is [`Ids`]: a slice,
//! a `Vec`, or an `ndarray` array or view of `i64` of any shape the layer
//! allows — and all three are [`Module`](crate::state::Module)s:
//! `parameters()`, `parameters_mut()`, `named_parameters()`,
//! `state_dict()` and `load_state_dict()` under their checkpoint names.
//!
//! Besides its tape forward, each layer has a tape-free pair for a caller
//! whose forward and backward are separate calls (a binding, another
//! framework's autograd function): `forward_saved` returns the output and
//! a small saved context ([`EmbeddingsSaved`], [`VocabularySaved`],
//! [`HeadSaved`]); `backward_saved` takes that context and the upstream
//! gradient and returns [`LayerGrads`]. Both run the ops the tape runs,
//! after the same checks, and give the same bits; their scratch and
//! output buffers come from a [`Workspace`].

mod grads;
pub mod lm_head;
pub mod split_embeddings;
pub mod split_vocabulary;
mod splits;

use ndarray::{ArrayBase, ArrayViewD, CowArray, Data, Dimension, Ix2};

pub use grads::{LayerGrads, NamedGrad};
pub use lm_head::{HeadSaved, SplitLanguageModellingHead};
pub use split_embeddings::{EmbeddingsSaved, SplitTokenEmbeddings, TableUpdate};
pub use split_vocabulary::{
    NO_ROW, RowsBlocks, RowsGrad, SplitVocabulary, SplitVocabularyConfig, VocabularyGrads,
    VocabularySaved,
};
pub use splits::SplitTables;

/// The layers' scratch buffers: a pool of arrays that the tape-free
/// passes (`forward_saved`, `backward_saved`, …) take their outputs,
/// gradients and workspaces from, and that a caller gives them back to
/// ([`Workspace::give`], [`NamedGrad::give_back`]) so that the next step
/// reuses them instead of allocating. Clones share one pool; a
/// [`Tape::with_pool`](crate::Tape::with_pool) draws from the same kind.
pub use crate::kernels::pool::Pool as Workspace;

/// The rule by which a [`Workspace`] reuses and frees its buffers, for a
/// caller that keeps buffers of its own element type the same way (the
/// Python binding's half-precision outputs).
pub mod reuse {
    pub use crate::kernels::pool::{keep, take_fitting};
}

use crate::kernels::Real;
use crate::param::Parameter;

/// Token ids (or labels, or language ids) as a layer takes them: an array
/// view of `i64` of any shape.
///
/// ```
/// use ndarray::array;
/// use splitgrad::layers::Ids;
/// let v = vec![1i64, 2, 3];
/// assert_eq!(v.as_slice().ids().shape(), &[3]);
/// assert_eq!((&v).ids().shape(), &[3]);
/// assert_eq!((&[4i64, 5]).ids().shape(), &[2]);
/// let a = array![[1i64, 2], [3, 4]];
/// assert_eq!((&a).ids().shape(), &[2, 2]);
/// assert_eq!(a.view().ids().shape(), &[2, 2]);
/// ```
pub trait Ids<'a> {
    /// The ids as a view.
    fn ids(self) -> ArrayViewD<'a, i64>;
}

impl<'a> Ids<'a> for &'a [i64] {
    fn ids(self) -> ArrayViewD<'a, i64> {
        ndarray::aview1(self).into_dyn()
    }
}

impl<'a, const N: usize> Ids<'a> for &'a [i64; N] {
    fn ids(self) -> ArrayViewD<'a, i64> {
        ndarray::aview1(&self[..]).into_dyn()
    }
}

impl<'a> Ids<'a> for &'a Vec<i64> {
    fn ids(self) -> ArrayViewD<'a, i64> {
        ndarray::aview1(self.as_slice()).into_dyn()
    }
}

impl<'a, D: Dimension> Ids<'a> for ndarray::ArrayView<'a, i64, D> {
    fn ids(self) -> ArrayViewD<'a, i64> {
        self.into_dyn()
    }
}

impl<'a, S: Data<Elem = i64>, D: Dimension> Ids<'a> for &'a ArrayBase<S, D> {
    fn ids(self) -> ArrayViewD<'a, i64> {
        self.view().into_dyn()
    }
}

/// A 2-D table of `T` as [`SplitVocabulary::seed_from`] takes it: a
/// [`Parameter`] (the shared embedding table itself, widened if it is kept
/// in half precision), or any 2-D array or view. `None` when the value is
/// not 2-D.
pub trait AsTable<'a, T> {
    /// The table as (rows, width), borrowed when it can be.
    fn into_table(self) -> Option<CowArray<'a, T, Ix2>>;
}

impl<'a, T: Real> AsTable<'a, T> for &'a Parameter<T> {
    fn into_table(self) -> Option<CowArray<'a, T, Ix2>> {
        let a = match self.stored().as_full() {
            Some(a) => CowArray::from(a.view()),
            None => CowArray::from(self.widened().into_owned()),
        };
        a.into_dimensionality::<Ix2>().ok()
    }
}

impl<'a, T: Real, D: Dimension> AsTable<'a, T> for ndarray::ArrayView<'a, T, D> {
    fn into_table(self) -> Option<CowArray<'a, T, Ix2>> {
        self.into_dimensionality::<Ix2>().ok().map(CowArray::from)
    }
}

impl<'a, T: Real, S: Data<Elem = T>, D: Dimension> AsTable<'a, T> for &'a ArrayBase<S, D> {
    fn into_table(self) -> Option<CowArray<'a, T, Ix2>> {
        self.view()
            .into_dimensionality::<Ix2>()
            .ok()
            .map(CowArray::from)
    }
}
