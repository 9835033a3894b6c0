//! What flows backwards: a node's gradient, and the rows sent to a table.
//!
//! A [`Flow`] is the gradient of a node's output. It is usually an array
//! ([`Flow::Dense`]); it may also be `c·R` for a constant `R` the tape holds
//! (the gradient of `Σ x ⊙ R` is `∂y·R`, and the summed head's gradients
//! are formed in its forward and only scaled by `∂y`), kept as that pair
//! until something needs the array. A gather reads the rows it routes
//! straight from `R`, times `c`, so an embedding step whose loss is
//! `Σ out ⊙ R` never writes `∂out` at all; any other op writes it out once
//! ([`Flow::into_owned`]), with the bits a zero buffer plus `c·R` would hold.
//!
//! Rows sent to a table ([`RowPart`]) are kept as they are — destination
//! ids and the rows of a flowing gradient they come from — and coalesced
//! into one [`RowSparse`](crate::RowSparse) gradient per table after the
//! sweep, in tape order, by [`crate::kernels::scatter::coalesce_sources`].

use std::borrow::Cow;
use std::rc::Rc;

use ndarray::{ArrayD, ArrayViewD};

use crate::kernels::Real;
use crate::kernels::pool::Pool;
use crate::kernels::reduce::scaled_copy;
use crate::kernels::scatter::RowSource;

/// The gradient flowing backwards into a node: an array of the node's
/// shape, or `c·R` for a constant `R` of that shape, not yet written out.
#[derive(Debug)]
pub enum Flow<'a, T> {
    /// The gradient itself.
    Dense(ArrayD<T>),
    /// `c·R`.
    Scaled(T, ArrayViewD<'a, T>),
}

impl<T: Real> Flow<'_, T> {
    /// The gradient as an array. `c·R` is written as `c·r + 0`, the bits a
    /// zero buffer plus `c·R` would hold.
    pub fn into_owned(self) -> ArrayD<T> {
        match self {
            Flow::Dense(a) => a,
            Flow::Scaled(c, r) => scaled_copy(c, r),
        }
    }

    /// [`Flow::into_owned`], writing `c·R` into a buffer from `pool`.
    pub fn into_owned_in(self, pool: &Pool<T>) -> ArrayD<T> {
        match self {
            Flow::Dense(a) => a,
            Flow::Scaled(c, r) => crate::kernels::reduce::scaled_copy_in(pool, c, r),
        }
    }

    /// The shape of the gradient.
    pub fn shape(&self) -> &[usize] {
        match self {
            Flow::Dense(a) => a.shape(),
            Flow::Scaled(_, r) => r.shape(),
        }
    }

    /// The single element of a scalar gradient (`c·r₀` for `c·R`).
    ///
    /// **Panics** if the gradient has no element.
    #[track_caller]
    pub fn first(&self) -> T {
        match self {
            Flow::Dense(a) => *a.iter().next().expect("a scalar gradient"),
            Flow::Scaled(c, r) => *c * *r.iter().next().expect("a scalar gradient"),
        }
    }

    /// The gradient as `n` rows of `width` for coalescing; `store` keeps a
    /// written-out copy alive when the layout needs one.
    pub(crate) fn rows<'s>(
        &'s self,
        n: usize,
        width: usize,
        rows: Option<&'s [usize]>,
        store: &'s mut Option<ArrayD<T>>,
    ) -> RowSource<'s, T> {
        let (a, scale) = match self {
            Flow::Dense(a) => (a.view(), None),
            Flow::Scaled(c, r) => (r.view(), Some(*c)),
        };
        let (values, scale) = match a.into_shape_with_order((n, width)) {
            Ok(v) => (v, scale),
            Err(_) => {
                let owned = store.insert(match self {
                    Flow::Dense(a) => a.as_standard_layout().into_owned(),
                    Flow::Scaled(c, r) => scaled_copy(*c, r.view()),
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

/// Rows sent to a table: destination row `ids[j]` receives row `rows[j]`
/// (or row j when `rows` is `None`) of a flowing gradient of `n_src` rows.
#[derive(Debug)]
pub struct RowPart<'a, T> {
    pub(crate) ids: Cow<'a, [usize]>,
    pub(crate) rows: Option<&'a [usize]>,
    pub(crate) n_src: usize,
    pub(crate) src: Rc<Flow<'a, T>>,
}

impl<'a, T: Real> RowPart<'a, T> {
    /// Row j of `src` (a gradient of `ids.len()` rows) goes to table row
    /// `ids[j]`: the backward of a gather.
    pub fn new(ids: &'a [usize], src: Flow<'a, T>) -> Self {
        RowPart {
            n_src: ids.len(),
            ids: Cow::Borrowed(ids),
            rows: None,
            src: Rc::new(src),
        }
    }

    /// Row `rows[j]` of `src` (a gradient of `n_src` rows, shared with
    /// other parts) goes to table row `ids[j]`: one split's share of a
    /// routed gather.
    ///
    /// **Panics** if `ids` and `rows` differ in length.
    #[track_caller]
    pub fn routed(ids: &'a [usize], rows: &'a [usize], n_src: usize, src: Rc<Flow<'a, T>>) -> Self {
        assert_eq!(ids.len(), rows.len(), "RowPart::routed: one row per id");
        RowPart {
            ids: Cow::Borrowed(ids),
            rows: Some(rows),
            n_src,
            src,
        }
    }

    /// Owned rows: `values[j]` goes to table row `ids[j]`.
    ///
    /// **Panics** if `values` does not have one row per id.
    #[track_caller]
    pub fn owned(ids: Vec<usize>, values: ArrayD<T>) -> Self {
        assert_eq!(
            values.shape().first().copied().unwrap_or(1),
            ids.len(),
            "RowPart::owned: one row per id"
        );
        RowPart {
            n_src: ids.len(),
            ids: Cow::Owned(ids),
            rows: None,
            src: Rc::new(Flow::Dense(values)),
        }
    }

    /// The destination rows.
    pub fn ids(&self) -> &[usize] {
        &self.ids
    }
}

/// Coalesces the parts sent to one `(n_rows, width)` table, in order.
pub(crate) fn coalesce_parts<T: Real>(
    pool: &Pool<T>,
    n_rows: usize,
    width: usize,
    parts: &[RowPart<'_, T>],
) -> crate::RowSparse<T> {
    let mut stores: Vec<Option<ArrayD<T>>> = parts.iter().map(|_| None).collect();
    let ids: Vec<usize> = parts.iter().flat_map(|p| p.ids.iter().copied()).collect();
    let sources: Vec<RowSource<'_, T>> = parts
        .iter()
        .zip(stores.iter_mut())
        .map(|(p, store)| p.src.rows(p.n_src, width, p.rows, store))
        .collect();
    let rows = crate::kernels::scatter::coalesce_sources_in(pool, n_rows, width, &ids, &sources);
    crate::RowSparse::from_coalesced(n_rows, rows)
}

/// Adds the rows of `part` into a dense `(n_rows, …)` buffer `g` (a table
/// that is not a 2-D parameter: an input, or an op's output).
pub(crate) fn scatter_part<T: Real>(part: &RowPart<'_, T>, g: &mut ArrayD<T>) {
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
