//! The split rows' gradient row by row, for an optimiser that forms it
//! inside its update ([`Optimizer::update_by_rows`](crate::optim::Optimizer::update_by_rows)):
//! the (n_rows, D) gradient of the fusion penalty, which reaches every
//! row, is then never stored, nor read back.

use crate::kernels::Real;
use crate::kernels::wide::wide;
use crate::ops::fusion_penalty::FusionRowGrads;
use crate::param::RowSparse;

/// The rows' gradient as the sum of the fusion penalty's
/// ([`SplitVocabulary::fusion_row_grads`](super::SplitVocabulary::fusion_row_grads))
/// and of row-sparse parts (each forward's ∂rows, as
/// [`SplitVocabulary::backward_saved`](super::SplitVocabulary::backward_saved)
/// returns them), added row by row in that order: row r is the fusion
/// penalty's row r, then each part's row r where the part has one. That
/// is the order the sum of the dense fusion gradient and the parts takes,
/// so an update by rows equals the update of that sum bit for bit.
///
/// ```
/// use ndarray::array;
/// use splitgrad::layers::RowsGrad;
/// use splitgrad::param::RowSparse;
/// let part = RowSparse { n_rows: 3, rows: vec![1], values: array![[1.0f32, 2.0]] };
/// let g = RowsGrad::new(3, None, &[&part, &part]);
/// let mut row = [9.0f32; 2];
/// g.row(1, &[0.0, 0.0], &mut row);
/// assert_eq!(row, [2.0, 4.0]);
/// g.row(0, &[0.0, 0.0], &mut row);
/// assert_eq!(row, [0.0, 0.0]);
/// ```
#[derive(Debug)]
pub struct RowsGrad<'a, T> {
    fusion: Option<&'a FusionRowGrads<T>>,
    /// Each part, and where each row is among its rows (`u32::MAX`: not).
    parts: Vec<(&'a RowSparse<T>, Vec<u32>)>,
}

impl<'a, T: Real> RowsGrad<'a, T> {
    /// The gradient of `n_rows` rows: the fusion penalty's (none: 0) plus
    /// the parts'.
    ///
    /// **Panics** if a part is not of `n_rows` rows.
    #[track_caller]
    pub fn new(
        n_rows: usize,
        fusion: Option<&'a FusionRowGrads<T>>,
        parts: &[&'a RowSparse<T>],
    ) -> Self {
        let parts = parts
            .iter()
            .map(|&rs| {
                assert_eq!(rs.n_rows, n_rows, "RowsGrad: a part of {} rows", rs.n_rows);
                let mut at = vec![u32::MAX; n_rows];
                for (k, &r) in rs.rows.iter().enumerate() {
                    at[r] = k as u32;
                }
                (rs, at)
            })
            .collect();
        RowsGrad { fusion, parts }
    }

    /// Row r's gradient into `g`, from `x`, row r of the rows now.
    ///
    /// **Panics** if r is out of range or a slice is not a row long.
    #[track_caller]
    pub fn row(&self, r: usize, x: &[T], g: &mut [T]) {
        match self.fusion {
            Some(f) => f.row(r, x, g),
            None => g.fill(T::zero()),
        }
        for (rs, at) in &self.parts {
            if let Some(k) = at.get(r).copied().filter(|&k| k != u32::MAX) {
                let v = rs.values.row(k as usize);
                match v.as_slice() {
                    Some(v) => wide(|| g.iter_mut().zip(v).for_each(|(g, &v)| *g += v)),
                    None => g.iter_mut().zip(v.iter()).for_each(|(g, &v)| *g += v),
                }
            }
        }
    }
}
