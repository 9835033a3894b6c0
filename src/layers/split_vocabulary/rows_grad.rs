//! The split rows' gradient row by row, for an optimiser that forms it
//! inside its update ([`Optimizer::update_by_rows`](crate::optim::Optimizer::update_by_rows)):
//! the (n_rows, D) gradient of the fusion penalty, which reaches every
//! row, is then never stored, nor read back.

use crate::kernels::Real;
use crate::kernels::rows::KeptRow;
use crate::kernels::wide::wide;
use crate::ops::fusion_penalty::{FusionBlock, FusionBlocks, FusionRowGrads};
use crate::param::{BlockGradient, RowForm, RowGradient, RowSparse};

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
    parts: Parts<'a, T>,
}

/// Row-sparse parts of a gradient, added row by row in order.
#[derive(Debug)]
struct Parts<'a, T>(
    /// Each part, and where each row is among its rows (`u32::MAX`: not).
    Vec<(&'a RowSparse<T>, Vec<u32>)>,
);

impl<'a, T: Real> Parts<'a, T> {
    /// **Panics** if a part is not of `n_rows` rows.
    #[track_caller]
    fn new(n_rows: usize, parts: &[&'a RowSparse<T>]) -> Self {
        Parts(
            parts
                .iter()
                .map(|&rs| {
                    assert_eq!(rs.n_rows, n_rows, "RowsGrad: a part of {} rows", rs.n_rows);
                    let mut at = vec![u32::MAX; n_rows];
                    for (k, &r) in rs.rows.iter().enumerate() {
                        at[r] = k as u32;
                    }
                    (rs, at)
                })
                .collect(),
        )
    }

    /// Whether a part reaches row r.
    fn reach(&self, r: usize) -> bool {
        self.0.iter().any(|(_, at)| part_row(at, r).is_some())
    }

    /// Each part's row r, where it has one, added to `g` in order.
    fn add(&self, r: usize, g: &mut [T]) {
        for (rs, at) in &self.0 {
            if let Some(k) = part_row(at, r) {
                let v = rs.values.row(k);
                match v.as_slice() {
                    Some(v) => wide(|| g.iter_mut().zip(v).for_each(|(g, &v)| *g += v)),
                    None => g.iter_mut().zip(v.iter()).for_each(|(g, &v)| *g += v),
                }
            }
        }
    }
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
        RowsGrad {
            fusion,
            parts: Parts::new(n_rows, parts),
        }
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
        self.parts.add(r, g);
    }

    /// The fusion penalty's form (zero without it) for a row no part
    /// reaches; `Written` for a row a part reaches.
    fn form(&self, r: usize) -> RowForm<'_, T> {
        match self.fusion {
            _ if self.parts.reach(r) => RowForm::Written,
            Some(f) => f.form(r),
            None => RowForm::Zero,
        }
    }
}

/// [`RowsGrad`] with the fusion penalty's gradient formed a block at a time
/// inside the update ([`FusionBlocks`],
/// [`Optimizer::update_by_blocks`](crate::optim::Optimizer::update_by_blocks)):
/// each block's row r is the fusion penalty's row r, then each part's row
/// r where the part has one, the bits of [`RowsGrad`]'s.
///
/// [`SplitVocabulary::rows_and_fusion_blocks`](super::SplitVocabulary::rows_and_fusion_blocks)
/// has an example.
#[derive(Debug)]
pub struct RowsBlocks<'a, 'g, T> {
    fusion: &'a FusionBlocks<'g, T>,
    parts: Parts<'a, T>,
}

impl<'a, 'g, T: Real> RowsBlocks<'a, 'g, T> {
    /// The gradient of the fusion penalty's rows (`fusion.rows`) plus
    /// the parts'.
    ///
    /// **Panics** if a part is not of the fusion penalty's number of rows.
    #[track_caller]
    pub fn new(fusion: &'a FusionBlocks<'g, T>, parts: &[&'a RowSparse<T>]) -> Self {
        RowsBlocks {
            fusion,
            parts: Parts::new(fusion.n_rows(), parts),
        }
    }
}

impl<T: Real> BlockGradient<T> for RowsBlocks<'_, '_, T> {
    fn n_blocks(&self) -> usize {
        self.fusion.n_blocks()
    }

    fn rows(&self, b: usize) -> &[usize] {
        self.fusion.rows(b)
    }

    fn block<'s>(
        &'s self,
        b: usize,
        rows: &[KeptRow<'_, T>],
        scratch: &'s mut Vec<T>,
    ) -> Box<dyn RowGradient<T> + 's> {
        Box::new(BlockRows {
            fusion: self.fusion.block(b, rows, scratch),
            parts: &self.parts,
        })
    }
}

/// One block of [`RowsBlocks`].
struct BlockRows<'s, T> {
    fusion: FusionBlock<'s, T>,
    parts: &'s Parts<'s, T>,
}

impl<T: Real> RowGradient<T> for BlockRows<'_, T> {
    fn write(&self, r: usize, x: &[T], g: &mut [T]) {
        self.fusion.row(r, x, g);
        self.parts.add(r, g);
    }

    fn form(&self, r: usize) -> RowForm<'_, T> {
        if self.parts.reach(r) {
            RowForm::Written
        } else {
            self.fusion.form(r)
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

    /// A vocabulary of rows `d` wide in three languages: tokens
    /// 0..`grouped` in every language (groups of three rows), the next
    /// `alone` tokens in one language each (rows alone), its rows normal
    /// draws from `seed`.
    fn vocabulary(d: usize, grouped: usize, alone: usize, seed: u64) -> SplitVocabulary<f32> {
        let l = 3;
        let cells: Vec<(usize, usize)> = (0..l)
            .flat_map(|lang| (0..grouped).map(move |t| (lang, t)))
            .chain((grouped..grouped + alone).map(|t| (t % l, t)))
            .collect();
        let index = SplitIndex::new(
            cells.iter().map(|c| c.0).collect(),
            cells.iter().map(|c| c.1).collect(),
        );
        let config = SplitVocabularyConfig::new(2 * (grouped + alone), d, l);
        let mut sv = SplitVocabulary::<f32>::new(index, &config).expect("a valid index");
        let mut rng = crate::Rng::new(seed);
        sv.rows_mut()
            .value_mut()
            .mapv_inplace(|_| rng.normal() as f32);
        sv
    }

    /// `sv` with its rows kept as `dtype`, and lazy Adam keeping its
    /// moments as `state`, rounding stochastically.
    fn kept(
        mut sv: SplitVocabulary<f32>,
        dtype: Dtype,
        state: Dtype,
    ) -> (SplitVocabulary<f32>, LazyAdam<f32>) {
        sv.rows_mut().set_dtype(dtype).unwrap();
        let mut o = LazyAdam::new(LazyAdamConfig::default()).unwrap();
        o.set_state_dtype(state).unwrap();
        o.set_rounding(Rounding::Stochastic { seed: 4 });
        (sv, o)
    }

    /// A row-sparse gradient of `sv`'s rows reaching `rows`.
    fn part(sv: &SplitVocabulary<f32>, rows: Vec<usize>, scale: f32) -> RowSparse<f32> {
        RowSparse {
            n_rows: sv.n_rows(),
            values: Array2::from_shape_fn((rows.len(), sv.dim()), |(i, j)| {
                ((i * 7 + j * 3) % 13) as f32 * scale - 0.3
            }),
            rows,
        }
    }

    /// The split rows' update by rows with `RowsGrad` (rows alone, rows in
    /// groups, rows a part reaches twice, a row a part reaches alone)
    /// equals the naive update of the dense gradient (the fusion penalty's
    /// plus the parts'), rows and moments in bf16 or rows in f32 with bf16
    /// moments, under 1 and 2 threads, for three steps.
    #[test]
    fn the_update_by_rows_equals_the_update_of_the_summed_gradient() {
        // Tokens 0..12 in every language (groups of 3), 12..20 in one.
        let sv = vocabulary(37, 12, 8, 5);
        let n = sv.n_rows();
        // Rows 1 and 40 (alone) in both parts, row 5 in one.
        let (a, b) = (
            part(&sv, vec![1, 5, 40], 0.05),
            part(&sv, vec![1, 40], 0.02),
        );
        for (dtype, state) in [(Dtype::BF16, Dtype::BF16), (Dtype::F32, Dtype::BF16)] {
            let fresh = || kept(sv.clone(), dtype, state);
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
                let pool = crate::kernels::threads(threads);
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

    /// The rows' update with the fusion penalty formed a block at a time
    /// inside it (`rows_and_fusion_blocks`) equals the terms of every group
    /// first and the update by rows (`RowsGrad`), bit for bit: the rows,
    /// the moments, the penalty and the norms, for lazy Adam's fused path
    /// (rows and moments in f32, bf16, f16 and mixed, a non-finite row
    /// alone in half precision) under 1 and 2 threads and several blocks,
    /// and for Adam's default (the dense gradient block by block); a frozen
    /// table is not moved and still gets its penalty.
    /// The rows' update by blocks with the fusion penalty (`weight` 0.5)
    /// and `parts`; the penalty and norms of the rows before it.
    fn update_with_fusion(
        sv: &mut SplitVocabulary<f32>,
        opt: &mut dyn Optimizer<f32>,
        parts: &[&RowSparse<f32>],
    ) -> (f32, ndarray::Array1<f32>) {
        let (rows, blocks) = sv.rows_and_fusion_blocks(0.5);
        opt.update_by_blocks(rows, &RowsBlocks::new(&blocks, parts))
            .unwrap();
        blocks.penalty(rows.stored().view())
    }

    #[test]
    fn the_update_by_blocks_equals_the_update_by_rows() {
        // Tokens 0..150 in every language (groups of 3), 150..250 in one:
        // 550 rows in three blocks, 165,000 elements (the parallel path).
        let sv = vocabulary(300, 150, 100, 6);
        let n = sv.n_rows();
        assert_eq!(sv.clone().rows_and_fusion_blocks(0.5).1.n_blocks(), 3);
        // Row 1 (in a group) in both parts, 5 in one, 500 (alone) in both.
        let (a, b) = (
            part(&sv, vec![1, 5, 500], 0.05),
            part(&sv, vec![1, 500], 0.02),
        );
        let nan_bits =
            |x: &ndarray::ArrayD<f32>| x.mapv(|x| if x.is_nan() { u32::MAX } else { x.to_bits() });
        let cases = [
            (Dtype::F32, Dtype::F32, false),
            (Dtype::BF16, Dtype::BF16, false),
            (Dtype::BF16, Dtype::BF16, true),
            (Dtype::F16, Dtype::F32, true),
            (Dtype::F32, Dtype::BF16, false),
        ];
        for (dtype, state, poisoned) in cases {
            let fresh = || {
                let mut s = sv.clone();
                if poisoned {
                    // Row 520 is alone in its group.
                    s.rows_mut().value_mut()[[520, 3]] = f32::INFINITY;
                }
                kept(s, dtype, state)
            };
            let mut want = fresh();
            let mut penalties = Vec::new();
            for _ in 0..3 {
                let (p, norms, f) = want.0.fusion_penalty_row_grads(&Pool::new(), 0.5);
                let grad = RowsGrad::new(n, Some(&f), &[&a, &b]);
                want.1.update_by_rows(want.0.rows_mut(), &grad).unwrap();
                penalties.push((p, norms));
            }
            for threads in [1, 2] {
                let pool = crate::kernels::threads(threads);
                let mut got = fresh();
                let what =
                    format!("{dtype} rows, {state} state, poisoned {poisoned}, {threads} threads");
                pool.install(|| {
                    for (step, (p, norms)) in penalties.iter().enumerate() {
                        let (q, got_norms) = update_with_fusion(&mut got.0, &mut got.1, &[&a, &b]);
                        assert_eq!(p.is_nan(), poisoned);
                        assert!(
                            p.to_bits() == q.to_bits() || p.is_nan() && q.is_nan(),
                            "{what}, step {step}: penalty {q} against {p}"
                        );
                        assert_eq!(got_norms[520].is_nan(), poisoned, "{what}");
                        assert_eq!(
                            nan_bits(&got_norms.into_dyn()),
                            nan_bits(&norms.clone().into_dyn()),
                            "{what}, step {step}: norms"
                        );
                    }
                });
                assert_eq!(
                    nan_bits(&got.0.rows().widened()),
                    nan_bits(&want.0.rows().widened()),
                    "{what}"
                );
                // (Debug: a NaN equals a NaN.)
                assert_eq!(
                    format!("{:?}", got.1.state()),
                    format!("{:?}", want.1.state()),
                    "{what}: state"
                );
            }
        }
        // Adam's default: the dense gradient of the blocks.
        let mut want = sv.clone();
        let mut got = sv.clone();
        let adam = || crate::optim::Adam::new(crate::optim::AdamConfig::default()).unwrap();
        let (mut oa, mut ob) = (adam(), adam());
        for _ in 0..2 {
            let (p, norms) = want.fusion_penalty_norms();
            let mut g = want
                .fusion_penalty_grad(&Pool::new(), norms.as_slice().unwrap(), 0.5)
                .unwrap();
            g += &a.to_dense();
            g += &b.to_dense();
            oa.update(want.rows_mut(), &ParamGrad::Dense(g)).unwrap();
            assert_eq!(update_with_fusion(&mut got, &mut ob, &[&a, &b]), (p, norms));
        }
        assert_eq!(got.rows().value(), want.rows().value(), "Adam");
        // A frozen table: not moved, its penalty from the rows as they are.
        got.rows_mut().set_trainable(false);
        let before = got.rows().value().clone();
        let mut o = LazyAdam::new(LazyAdamConfig::default()).unwrap();
        assert_eq!(
            update_with_fusion(&mut got, &mut o, &[&a]),
            got.fusion_penalty_norms()
        );
        assert_eq!(got.rows().value(), &before);
    }
}
