//! Parameters and their gradients.
//!
//! A [`Parameter`] owns its array. The tape borrows it during a forward pass
//! and never copies it; [`crate::Tape::backward`] returns
//! [`Gradients`](crate::Gradients) keyed by [`ParamId`]. A gradient is dense
//! or row-sparse ([`ParamGrad`]): a table that was only read through a gather
//! gets the sorted unique rows that occurred and one gradient row each
//! ([`RowSparse`], built from what the coalescing kernels of
//! [`crate::kernels::scatter`] return).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ndarray::{Array2, ArrayD, ArrayView1, ArrayViewMut2};

use crate::error::{Error, Result};
use crate::kernels::Real;
use crate::kernels::scatter::Coalesced;

mod row_gradient;
mod stored;

pub use row_gradient::{BlockGradient, RowForm, RowGradient, SparseRowGradient};
pub use stored::{
    Dtype, Part, Rounding, Stored, StoredMut, StoredView, WIDEN_CHUNK, update_widened_in,
};

/// The identity of a [`Parameter`], unique in the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ParamId(u64);

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

impl ParamId {
    fn fresh() -> Self {
        ParamId(NEXT_ID.fetch_add(1, Ordering::Relaxed))
    }
}

/// A named, trainable (or frozen) array, kept at the engine's precision
/// `T` or in half precision ([`Dtype`]; the math stays in `T`).
///
/// Cloning gives a parameter with a fresh [`ParamId`], so gradients of the
/// copy are never confused with those of the original.
///
/// ```
/// use ndarray::Array2;
/// use splitgrad::Parameter;
/// let mut p = Parameter::new("token_embedding.prompt.weight", Array2::<f32>::zeros((16, 8)).into_dyn());
/// assert!(p.is_trainable());
/// p.set_trainable(false);
/// assert_eq!(p.value().shape(), &[16, 8]);
/// ```
#[derive(Debug)]
pub struct Parameter<T> {
    id: ParamId,
    name: String,
    value: Stored<T>,
    trainable: bool,
    /// [`Parameter::set_rounding_rows`]'s rows (`None`: its own).
    rounding_rows: Option<Arc<[u64]>>,
}

impl<T: Clone> Clone for Parameter<T> {
    fn clone(&self) -> Self {
        Parameter {
            id: ParamId::fresh(),
            name: self.name.clone(),
            value: self.value.clone(),
            trainable: self.trainable,
            rounding_rows: self.rounding_rows.clone(),
        }
    }
}

impl<T> Parameter<T> {
    /// A trainable parameter with this name and value, kept as `T`.
    pub fn new(name: impl Into<String>, value: ArrayD<T>) -> Self {
        Self::new_stored(name, Stored::Full(value))
    }
    /// A trainable parameter with this name and value, kept as it is.
    pub fn new_stored(name: impl Into<String>, value: Stored<T>) -> Self {
        Parameter {
            id: ParamId::fresh(),
            name: name.into(),
            value,
            trainable: true,
            rounding_rows: None,
        }
    }
    /// Its shape.
    pub fn shape(&self) -> &[usize] {
        self.value.shape()
    }
    /// Its identity.
    pub fn id(&self) -> ParamId {
        self.id
    }
    /// Its checkpoint name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Its value, kept as `T`.
    ///
    /// **Panics** if it is kept in half precision: read it through
    /// [`Self::widened`] or [`Self::stored`].
    #[track_caller]
    pub fn value(&self) -> &ArrayD<T> {
        match &self.value {
            Stored::Full(a) => a,
            _ => panic!("{}", self.half_message()),
        }
    }
    /// Its value, kept as `T`, to change in place (an optimiser step, a
    /// load).
    ///
    /// **Panics** if it is kept in half precision: change it through
    /// [`Self::stored_mut`].
    #[track_caller]
    pub fn value_mut(&mut self) -> &mut ArrayD<T> {
        let message = self.half_message();
        match &mut self.value {
            Stored::Full(a) => a,
            _ => panic!("{message}"),
        }
    }
    fn half_message(&self) -> String {
        format!(
            "parameter `{}` is kept in half precision: read it with widened() or stored()",
            self.name
        )
    }
    /// Its value as it is kept.
    pub fn stored(&self) -> &Stored<T> {
        &self.value
    }
    /// Its value as it is kept, to change in place.
    pub fn stored_mut(&mut self) -> &mut Stored<T> {
        &mut self.value
    }
    /// Whether the tape records gradients for it.
    pub fn is_trainable(&self) -> bool {
        self.trainable
    }
    /// Freezes (`false`) or unfreezes (`true`) it: a frozen parameter
    /// receives no gradient and an optimiser never moves it.
    pub fn set_trainable(&mut self, trainable: bool) {
        self.trainable = trainable;
    }

    /// The rows of the table its stochastic roundings are keyed by
    /// ([`Self::set_rounding_rows`]); `None` when that table is itself.
    pub fn rounding_rows(&self) -> Option<&[u64]> {
        self.rounding_rows.as_deref()
    }

    /// [`Self::rounding_rows`], shared.
    pub(crate) fn rounding_rows_shared(&self) -> Option<Arc<[u64]>> {
        self.rounding_rows.clone()
    }

    /// Keys the stochastic roundings of its updates (and its moments') as
    /// if its row r were row `rows[r]` of a larger table of the same name:
    /// element (r, j) draws the bits of flat index `rows[r]·width + j`
    /// (`width` the elements of a row, 1 for a vector), so a table split
    /// into parts, each part a parameter with its rows' places in the whole,
    /// rounds bit for bit as the whole table would (the sharded layers of
    /// the Python package). `None`: its own rows (index `r·width + j`).
    /// Nothing else about it changes.
    ///
    /// Errors, leaving it as it was: a 0-d parameter, not one row each,
    /// a row given twice, or a flat index past 2⁶⁴.
    ///
    /// ```
    /// use ndarray::Array2;
    /// use splitgrad::Parameter;
    /// let mut p = Parameter::new("w", Array2::<f32>::zeros((2, 3)).into_dyn());
    /// p.set_rounding_rows(Some(vec![4, 1]))?;
    /// assert_eq!(p.rounding_rows(), Some(&[4u64, 1][..]));
    /// assert!(p.set_rounding_rows(Some(vec![4])).is_err());
    /// assert!(p.set_rounding_rows(Some(vec![1, 1])).is_err());
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn set_rounding_rows(&mut self, rows: Option<Vec<u64>>) -> Result<()> {
        let Some(rows) = rows else {
            self.rounding_rows = None;
            return Ok(());
        };
        let shape = self.value.shape();
        let Some(&n) = shape.first() else {
            return Err(Error::config(format!(
                "rounding rows of `{}`: a 0-d parameter has no rows",
                self.name
            )));
        };
        if rows.len() != n {
            return Err(Error::shape(
                "rounding rows",
                format!("({n},) (one per row)"),
                &[rows.len()],
            )
            .in_array(self.name.clone()));
        }
        let width = shape[1..].iter().product::<usize>() as u64;
        let mut sorted = rows.clone();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::config(format!(
                "rounding rows of `{}`: row {} given twice (each row draws its own bits)",
                self.name, w[0]
            )));
        }
        if let Some(&last) = sorted.last()
            && width > 0
            && last
                .checked_add(1)
                .and_then(|r| r.checked_mul(width))
                .is_none()
        {
            return Err(Error::config(format!(
                "rounding rows of `{}`: row {last} of {width} elements is past a flat index of 2^64",
                self.name
            )));
        }
        self.rounding_rows = Some(rows.into());
        Ok(())
    }
}

impl<T: Real> Parameter<T> {
    /// How its elements are kept.
    pub fn dtype(&self) -> Dtype {
        self.value.dtype()
    }
    /// The bytes its elements take.
    pub fn nbytes(&self) -> u64 {
        self.value.nbytes()
    }
    /// Its value as `T`: borrowed when kept as `T`, widened (exactly)
    /// otherwise.
    pub fn widened(&self) -> std::borrow::Cow<'_, ArrayD<T>> {
        self.value.widened()
    }
    /// Keeps its elements as `dtype` from now on, rounded to nearest when
    /// narrowed: `bf16` or `f16`, or `T`'s own to widen back. Its identity
    /// is kept. An error for another dtype (an `f32` parameter cannot be
    /// kept as `f64`); nothing changes then.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::{Parameter, param::Dtype};
    /// let mut p = Parameter::new("w", array![[0.1f32, 3.0]].into_dyn());
    /// p.set_dtype(Dtype::BF16)?;
    /// assert_eq!((p.dtype(), p.nbytes(), p.shape()), (Dtype::BF16, 4, &[1usize, 2][..]));
    /// assert_eq!(p.widened()[[0, 0]], 0.10009765625); // the nearest bf16
    /// assert!(p.set_dtype(Dtype::F64).is_err());
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn set_dtype(&mut self, dtype: Dtype) -> Result<()> {
        self.value
            .set_dtype(dtype)
            .map_err(|e| e.in_array(self.name.clone()))
    }
}

/// A row-sparse array of shape `(n_rows, width)`: the gradient of a table
/// whose other rows received nothing.
///
/// `rows` is sorted and unique; `values[i]` is the gradient of row
/// `rows[i]`; every other row's gradient is zero.
///
/// ```
/// use ndarray::array;
/// use splitgrad::RowSparse;
/// let g = RowSparse { n_rows: 3, rows: vec![1], values: array![[2.0f64, -1.0]] };
/// assert_eq!(g.to_dense(), array![[0.0, 0.0], [2.0, -1.0], [0.0, 0.0]]);
/// assert_eq!(g.row(1).unwrap(), array![2.0, -1.0]);
/// assert!(g.row(0).is_none());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct RowSparse<T> {
    /// Rows of the table.
    pub n_rows: usize,
    /// The sorted unique rows that carry gradient.
    pub rows: Vec<usize>,
    /// One gradient row per entry of `rows`: (rows.len(), width).
    pub values: Array2<T>,
}

impl<T> RowSparse<T> {
    /// The gradient of an `n_rows`-row table from its coalesced rows (what
    /// [`coalesce_rows`](crate::kernels::scatter::coalesce_rows) and
    /// [`coalesce_sources`](crate::kernels::scatter::coalesce_sources)
    /// return, rows already checked to be < n_rows).
    pub fn from_coalesced(n_rows: usize, c: Coalesced<T>) -> Self {
        RowSparse {
            n_rows,
            rows: c.rows,
            values: c.values,
        }
    }
}

impl<T: Real> RowSparse<T> {
    /// The dense `(n_rows, width)` gradient.
    pub fn to_dense(&self) -> Array2<T> {
        let mut out = Array2::zeros((self.n_rows, self.values.ncols()));
        for (&r, v) in self.rows.iter().zip(self.values.outer_iter()) {
            out.row_mut(r).assign(&v);
        }
        out
    }

    /// The gradient row of table row `r`, if it carries one.
    pub fn row(&self, r: usize) -> Option<ArrayView1<'_, T>> {
        self.rows.binary_search(&r).ok().map(|i| self.values.row(i))
    }

    /// Adds this gradient into a dense `(n_rows, width)` buffer.
    ///
    /// **Panics** if `dense` has another shape.
    #[track_caller]
    pub fn add_to(&self, mut dense: ArrayViewMut2<'_, T>) {
        assert_eq!(
            dense.dim(),
            (self.n_rows, self.values.ncols()),
            "RowSparse::add_to: shape mismatch"
        );
        for (&r, v) in self.rows.iter().zip(self.values.outer_iter()) {
            let mut d = dense.row_mut(r);
            d += &v;
        }
    }
}

/// The gradient of one parameter.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamGrad<T> {
    /// Same shape as the parameter.
    Dense(ArrayD<T>),
    /// Only the rows that were read carry gradient.
    RowSparse(RowSparse<T>),
}

impl<T: Real> ParamGrad<T> {
    /// The gradient as a dense array of the parameter's shape.
    pub fn to_dense(&self) -> ArrayD<T> {
        match self {
            ParamGrad::Dense(d) => d.clone(),
            ParamGrad::RowSparse(s) => s.to_dense().into_dyn(),
        }
    }
}

/// Where an optimiser finds the gradient of a parameter:
/// [`Gradients`](crate::Gradients) (what [`Tape::backward`](crate::Tape::backward)
/// returns) implements it, and so does a map from [`ParamId`] to [`ParamGrad`].
pub trait GradSource<T> {
    /// The gradient of `p`, or `None` when it received none.
    fn grad_of(&self, p: &Parameter<T>) -> Option<&ParamGrad<T>>;
}

impl<T> GradSource<T> for HashMap<ParamId, ParamGrad<T>> {
    fn grad_of(&self, p: &Parameter<T>) -> Option<&ParamGrad<T>> {
        self.get(&p.id())
    }
}
