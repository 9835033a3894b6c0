//! The split rows' gradient row by row, for an optimiser that forms it
//! inside its update ([`Optimizer::update_by_rows`](crate::optim::Optimizer::update_by_rows)):
//! the (n_rows, D) gradient of the fusion penalty, which reaches every
//! row, is then never stored, nor read back.

use crate::kernels::Real;
use crate::kernels::wide::wide;
use crate::ops::fusion_penalty::FusionRowGrads;
use crate::param::{RowForm, RowGradient, RowSparse};

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
/// use splitgrad::param::{RowGradient, RowSparse};
/// let part = RowSparse { n_rows: 3, rows: vec![1], values: array![[1.0f32, 2.0]] };
/// let g = RowsGrad::new(3, None, &[&part, &part]);
/// let mut row = [9.0f32; 2];
/// g.write(1, &[0.0, 0.0], &mut row);
/// assert_eq!(row, [2.0, 4.0]);
/// g.write(0, &[0.0, 0.0], &mut row);
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
}

/// Where row r is among a part's rows (`at`, [`RowsGrad`]'s), if it is.
fn part_row(at: &[u32], r: usize) -> Option<usize> {
    at.get(r)
        .copied()
        .filter(|&k| k != u32::MAX)
        .map(|k| k as usize)
}

impl<T: Real> RowGradient<T> for RowsGrad<'_, T> {
    /// Row r's gradient into `g`, from `x`, row r of the rows now.
    ///
    /// **Panics** if r is out of range or a slice is not a row long.
    #[track_caller]
    fn write(&self, r: usize, x: &[T], g: &mut [T]) {
        match self.fusion {
            Some(f) => f.row(r, x, g),
            None => g.fill(T::zero()),
        }
        for (rs, at) in &self.parts {
            if let Some(k) = part_row(at, r) {
                let v = rs.values.row(k);
                match v.as_slice() {
                    Some(v) => wide(|| g.iter_mut().zip(v).for_each(|(g, &v)| *g += v)),
                    None => g.iter_mut().zip(v.iter()).for_each(|(g, &v)| *g += v),
                }
            }
        }
    }

    /// The fusion penalty's form (zero without it) for a row no part
    /// reaches; `Written` for a row a part reaches.
    fn form(&self, r: usize) -> RowForm<'_, T> {
        let reached = self.parts.iter().any(|(_, at)| part_row(at, r).is_some());
        match self.fusion {
            _ if reached => RowForm::Written,
            Some(f) => f.form(r),
            None => RowForm::Zero,
        }
    }
}

#[cfg(test)]
mod tests {
    use ndarray::Array2;

    use super::*;
    use crate::io::SplitIndex;
    use crate::layers::{SplitVocabulary, SplitVocabularyConfig};
    use crate::optim::{LazyAdam, LazyAdamConfig, Optimizer};
    use crate::param::{Dtype, ParamGrad, Rounding};
    use crate::tape::Pool;

    /// The split rows' update by rows with `RowsGrad` (rows alone, rows in
    /// groups, rows a part reaches twice, a row a part reaches alone)
    /// equals the naive update of the dense gradient (the fusion penalty's
    /// plus the parts'), rows and moments in bf16 or rows in f32 with bf16
    /// moments, under 1 and 2 threads, for three steps.
    #[test]
    fn the_update_by_rows_equals_the_update_of_the_summed_gradient() {
        let (v, d, l) = (40, 37, 3);
        // Tokens 0..12 in every language (groups of 3), 12..20 in one.
        let cells: Vec<(usize, usize)> = (0..l)
            .flat_map(|lang| (0..12).map(move |t| (lang, t)))
            .chain((12..20).map(|t| (t % l, t)))
            .collect();
        let index = SplitIndex::new(
            cells.iter().map(|c| c.0).collect(),
            cells.iter().map(|c| c.1).collect(),
        );
        let mut sv = SplitVocabulary::<f32>::new(index, &SplitVocabularyConfig::new(v, d, l))
            .expect("a valid index");
        let n = sv.n_rows();
        let mut rng = crate::Rng::new(5);
        sv.rows_mut()
            .value_mut()
            .mapv_inplace(|_| rng.normal() as f32);
        let part = |rows: Vec<usize>, scale: f32| RowSparse {
            n_rows: n,
            values: Array2::from_shape_fn((rows.len(), d), |(i, j)| {
                ((i * 7 + j * 3) % 13) as f32 * scale - 0.3
            }),
            rows,
        };
        // Rows 1 and 40 (alone) in both parts, row 5 in one.
        let (a, b) = (part(vec![1, 5, 40], 0.05), part(vec![1, 40], 0.02));
        for (dtype, state) in [(Dtype::BF16, Dtype::BF16), (Dtype::F32, Dtype::BF16)] {
            let fresh = || {
                let mut s = sv.clone();
                s.rows_mut().set_dtype(dtype).unwrap();
                let mut o = LazyAdam::new(LazyAdamConfig::default()).unwrap();
                o.set_state_dtype(state).unwrap();
                o.set_rounding(Rounding::Stochastic { seed: 4 });
                (s, o)
            };
            let mut want = fresh();
            for _ in 0..3 {
                let (_, norms) = want.0.fusion_penalty_norms();
                let mut g = want
                    .0
                    .fusion_penalty_grad(&Pool::new(), norms.as_slice().unwrap(), 0.5)
                    .unwrap();
                g += &a.to_dense();
                g += &b.to_dense();
                want.1
                    .update_naive(want.0.rows_mut(), &ParamGrad::Dense(g))
                    .unwrap();
            }
            for threads in [1, 2] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut got = fresh();
                pool.install(|| {
                    for _ in 0..3 {
                        let (_, norms) = got.0.fusion_penalty_norms();
                        let f = got
                            .0
                            .fusion_row_grads(norms.as_slice().unwrap(), 0.5)
                            .unwrap();
                        let grad = RowsGrad::new(n, Some(&f), &[&a, &b]);
                        assert!(matches!(grad.form(1), RowForm::Written));
                        assert!(matches!(grad.form(0), RowForm::Deviation { .. }));
                        assert!(matches!(grad.form(39), RowForm::Zero));
                        got.1.update_by_rows(got.0.rows_mut(), &grad).unwrap();
                    }
                });
                let what = format!("{dtype} rows, {state} state, {threads} threads");
                assert_eq!(
                    got.0.rows().widened().mapv(f32::to_bits),
                    want.0.rows().widened().mapv(f32::to_bits),
                    "{what}"
                );
                assert!(got.1.state() == want.1.state(), "{what}: state");
            }
        }
    }
}
