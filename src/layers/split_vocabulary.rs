//! `SplitVocabulary`: chosen (language, token) pairs get a private row,
//! mixed with the shared row by a learned sigmoid gate (parity with the
//! seed `split-vocabulary.py`).
//!
//! ```text
//! out_n = shared_n + g_r·(rows_r − shared_n)   with a row r for (language_n, token_n), g = σ(gate_logit)
//! out_n = rows_r                               in fusion mode (no gate)
//! out_n = shared_n                             without a row
//! ```
//!
//! `shared + g·(row − shared)` is `(1 − g)·shared + g·row` written so that a
//! row equal to its shared row gives `shared` exactly, whatever the gate.
//! Penalties: `penalty = mean(σ(gate_logit))` (an L1 on the gates) and
//! `fusion_penalty = (1/n_rows) Σ_i ‖rows_i − c(token_i)‖₂` with `c(t)` the
//! mean of the rows of token t. Derivations:
//! `docs/gradients.md#the-gated-mix` and `docs/gradients.md#the-fusion-penalty`.

use std::path::Path;
use std::sync::OnceLock;

use ndarray::{Array1, ArrayD, ArrayViewD, Axis, Ix2};

use super::splits::table_bytes;
use super::{AsTable, Ids};
use crate::error::{Error, ErrorKind, Result};
use crate::io::{PairLookup, SplitIndex, check_memory, load_index};
use crate::kernels::Real;
use crate::kernels::pool::Pool;
use crate::ops::fusion_penalty::{
    FusionBlocks, FusionLayout, FusionRowGrads, RowGroups, fusion_penalty_backward_stored,
    fusion_penalty_forward_row_grads, fusion_penalty_forward_stored,
};
pub use crate::ops::gated_mix::NO_ROW;
use crate::ops::sigmoid::sigmoid;
use crate::param::RowSparse;
use crate::param::{Dtype, Parameter, Stored};
use crate::state::{Module, TensorRef};
use crate::tape::{Tape, Var};

mod rows_grad;
mod saved;
pub use rows_grad::{RowsBlocks, RowsGrad};
pub use saved::VocabularySaved;

/// The gradients [`SplitVocabulary::backward_from`] returns; `None` where
/// not asked for or not trainable.
#[derive(Clone, Debug)]
pub struct VocabularyGrads<T> {
    /// ∂shared, of shared's shape.
    pub shared: Option<ArrayD<T>>,
    /// ∂rows, row-sparse: the rows the tokens used.
    pub rows: Option<RowSparse<T>>,
    /// ∂gate_logit, (n_rows).
    pub gate_logit: Option<ArrayD<T>>,
}

/// The sizes of a [`SplitVocabulary`], named so that they cannot be
/// swapped unnoticed.
///
/// ```
/// use splitgrad::layers::SplitVocabularyConfig;
/// let c = SplitVocabularyConfig { vocab_size: 32000, dim: 512, n_languages: 8, gate_init: 0.0 };
/// assert_eq!(c, SplitVocabularyConfig::new(32000, 512, 8));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SplitVocabularyConfig {
    /// V, the size of the shared vocabulary.
    pub vocab_size: usize,
    /// D, the width of every row.
    pub dim: usize,
    /// L, the number of languages.
    pub n_languages: usize,
    /// The initial value of every gate logit (σ(0) = 0.5).
    pub gate_init: f64,
}

impl SplitVocabularyConfig {
    /// V, D and L, with `gate_init` 0.
    pub fn new(vocab_size: usize, dim: usize, n_languages: usize) -> Self {
        SplitVocabularyConfig {
            vocab_size,
            dim,
            n_languages,
            gate_init: 0.0,
        }
    }
}

/// Private rows for chosen (language, token) pairs, gated against the
/// shared embedding.
///
/// ```
/// use ndarray::Array2;
/// use splitgrad::{io::SplitIndex, layers::{SplitVocabulary, SplitVocabularyConfig}, Tape};
/// // Pairs (language 1, token 2) and (language 0, token 2).
/// let index = SplitIndex::new(vec![1, 0], vec![2, 2]);
/// let config = SplitVocabularyConfig { vocab_size: 4, dim: 3, n_languages: 2, gate_init: 0.0 };
/// let mut sv = SplitVocabulary::<f64>::new(index, &config)?;
/// let table = Array2::from_shape_fn((4, 3), |(i, j)| (i * 3 + j) as f64);
/// sv.seed_from(&table)?;
/// let tokens = [2i64, 2, 1];
/// let langs = [1i64, 0, 1];
/// let shared = table.select(ndarray::Axis(0), &[2, 2, 1]);
/// let mut tape = Tape::new();
/// let s = tape.input(shared.clone().into_dyn());
/// let out = sv.forward(&mut tape, &tokens, &langs, s, true)?;
/// assert_eq!(tape.value(out), shared.into_dyn()); // exactly, after seed_from
/// # Ok::<(), splitgrad::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct SplitVocabulary<T> {
    rows: Parameter<T>,
    gate_logit: Parameter<T>,
    index: SplitIndex,
    lookup: PairLookup,
    vocab_size: usize,
    n_languages: usize,
    dim: usize,
    /// The rows of each distinct token (groups in increasing token order).
    groups: RowGroups,
    /// The index as the `I64` tensors of the state: (language, token).
    index_i64: (Array1<i64>, Array1<i64>),
    /// The index's `score` as the `F64` tensor of the state.
    score: Option<Array1<f64>>,
    /// The groups cut into the fusion penalty's blocks, once asked for
    /// ([`Self::rows_and_fusion_blocks`]; the groups never change).
    fusion_layout: OnceLock<FusionLayout>,
}

impl<T: Real> SplitVocabulary<T> {
    /// Builds the layer from an index of pairs; `rows` start at zero,
    /// `gate_logit` at `gate_init`. Errors: an index that `docs/spec.md#23-splitvocabulary` rejects
    /// (empty, a language ≥ L, a token ≥ V, a duplicate pair), `dim` 0, or a
    /// non-finite `gate_init`.
    ///
    /// ```
    /// use splitgrad::{io::SplitIndex, layers::{SplitVocabulary, SplitVocabularyConfig}};
    /// let bad = SplitIndex::new(vec![0, 0], vec![1, 1]);
    /// assert!(SplitVocabulary::<f32>::new(bad, &SplitVocabularyConfig::new(4, 2, 1)).is_err());
    /// ```
    pub fn new(index: SplitIndex, config: &SplitVocabularyConfig) -> Result<Self> {
        Self::with_dtype(index, config, Dtype::of::<T>())
    }

    /// [`Self::new`] with the rows and gate logits kept as `dtype` (`T`'s
    /// own, bf16 or f16) from the start: half-precision rows never pass
    /// through `T`, so the layer costs their bytes only. Errors: those of
    /// [`Self::new`]; a dtype that is neither `T`'s nor a half type.
    ///
    /// ```
    /// use splitgrad::{io::SplitIndex, layers::{SplitVocabulary, SplitVocabularyConfig}, param::Dtype, state::Module};
    /// let index = SplitIndex::new(vec![0, 1], vec![3, 3]);
    /// let sv = SplitVocabulary::<f32>::with_dtype(index, &SplitVocabularyConfig::new(4, 8, 2), Dtype::BF16)?;
    /// assert_eq!(sv.parameter_bytes(), 2 * 8 * 2 + 2 * 2);
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn with_dtype(
        index: SplitIndex,
        config: &SplitVocabularyConfig,
        dtype: Dtype,
    ) -> Result<Self> {
        let SplitVocabularyConfig {
            vocab_size,
            dim,
            n_languages,
            gate_init,
        } = *config;
        if dtype != Dtype::of::<T>() && !dtype.is_half() {
            return Err(Error::config(format!(
                "a {} layer cannot keep its rows as {dtype}",
                T::NAME
            )));
        }
        if dim == 0 {
            return Err(Error::config("dim must be positive, got 0"));
        }
        if !gate_init.is_finite() {
            return Err(Error::config(format!(
                "gate_init must be finite, got {gate_init}"
            )));
        }
        index.validate(n_languages, vocab_size)?;
        let n_rows = index.token_index.len();
        let bytes = table_bytes(n_rows, dim.saturating_add(1), dtype);
        check_memory(
            || format!("`split_vocabulary.rows` ({n_rows} × {dim} {dtype}) and its gates"),
            bytes,
            "",
        )?;
        Self::build(index, vocab_size, dim, n_languages, gate_init, dtype)
    }

    /// A layer with no split rows: its output is `shared`, its penalties 0
    /// (the shared-only model a selection of pairs is measured on). An
    /// index file must still hold at least one pair
    /// (`docs/spec.md#23-splitvocabulary`).
    pub fn without_rows(vocab_size: usize, dim: usize, n_languages: usize) -> Result<Self> {
        if dim == 0 {
            return Err(Error::config("dim must be positive, got 0"));
        }
        let index = SplitIndex::new(Vec::new(), Vec::new());
        Self::build(index, vocab_size, dim, n_languages, 0.0, Dtype::of::<T>())
    }

    /// The layer for an index already checked: rows zero, gate logits
    /// `gate_init`, both kept as `dtype` (checked), the pair lookup and
    /// each row's token group.
    fn build(
        index: SplitIndex,
        vocab_size: usize,
        dim: usize,
        n_languages: usize,
        gate_init: f64,
        dtype: Dtype,
    ) -> Result<Self> {
        let n_rows = index.token_index.len();
        let lookup = index.lookup(n_languages, vocab_size);
        let mut uniq: Vec<usize> = index.token_index.clone();
        uniq.sort_unstable();
        uniq.dedup();
        let group: Vec<usize> = index
            .token_index
            .iter()
            .map(|t| uniq.binary_search(t).expect("present"))
            .collect();
        let groups = RowGroups::new(&group, uniq.len());
        let as_i64 = |v: &[usize]| v.iter().map(|&x| x as i64).collect::<Array1<i64>>();
        let index_i64 = (as_i64(&index.language_index), as_i64(&index.token_index));
        let score = index.score.as_ref().map(|s| Array1::from(s.clone()));
        let gates = ArrayD::from_elem(ndarray::IxDyn(&[n_rows]), T::from_f64(gate_init));
        Ok(SplitVocabulary {
            rows: Parameter::new_stored(
                "split_vocabulary.rows",
                Stored::zeros(&[n_rows, dim], dtype)?,
            ),
            gate_logit: Parameter::new_stored(
                "split_vocabulary.gate_logit",
                Stored::from_full(gates, dtype)?,
            ),
            index,
            lookup,
            vocab_size,
            n_languages,
            dim,
            groups,
            index_i64,
            score,
            fusion_layout: OnceLock::new(),
        })
    }

    /// Loads the index from an `.npz` file (arrays `language_index` and
    /// `token_index`, optional `score`), then [`Self::new`]. Errors name the
    /// file, the array, the position and the value.
    pub fn from_npz(path: impl AsRef<Path>, config: &SplitVocabularyConfig) -> Result<Self> {
        Self::from_npz_with_dtype(path, config, Dtype::of::<T>())
    }

    /// [`Self::from_npz`], the rows and gate logits kept as `dtype` from the
    /// start ([`Self::with_dtype`]).
    pub fn from_npz_with_dtype(
        path: impl AsRef<Path>,
        config: &SplitVocabularyConfig,
        dtype: Dtype,
    ) -> Result<Self> {
        let index = load_index(path.as_ref(), config.n_languages, config.vocab_size)?;
        Self::with_dtype(index, config, dtype).map_err(|e| e.in_file(path.as_ref()))
    }

    /// Copies each row from the shared row it specialises:
    /// `rows[i] = table[token_index[i]]`. After it the layer's output equals
    /// `shared` exactly, whatever the gates. table: (V, D) — the shared
    /// embedding [`Parameter`] itself, or any 2-D array or view. The rows
    /// are written into their own buffer (a view of it stays valid); on an
    /// error nothing changes.
    ///
    /// ```
    /// use splitgrad::{io::SplitIndex, layers::{SplitTokenEmbeddings, SplitVocabulary, SplitVocabularyConfig}, Rng};
    /// let mut emb = SplitTokenEmbeddings::<f32>::new(&[("vocab", 5)], &["vocab"], 3)?;
    /// emb.reset_parameters(&mut Rng::new(0));
    /// let mut sv = SplitVocabulary::<f32>::new(SplitIndex::new(vec![0], vec![4]), &SplitVocabularyConfig::new(5, 3, 1))?;
    /// sv.seed_from(emb.split("vocab").unwrap())?;
    /// let row = |a: &ndarray::ArrayD<f32>, i| a.index_axis(ndarray::Axis(0), i).to_owned();
    /// assert_eq!(row(sv.rows().value(), 0), row(emb.split("vocab").unwrap().value(), 4));
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn seed_from<'t>(&mut self, table: impl AsTable<'t, T>) -> Result<()> {
        let expected = format!("({}, {})", self.vocab_size, self.dim);
        let table = table
            .into_table()
            .ok_or_else(|| Error::shape("seed table", expected.clone(), &[]))?;
        if table.dim() != (self.vocab_size, self.dim) {
            return Err(Error::shape("seed table", expected, table.shape()));
        }
        match self.rows.stored_mut().as_full_mut() {
            Some(rows) => {
                let mut rows = rows
                    .view_mut()
                    .into_dimensionality::<Ix2>()
                    .expect("rows are 2-D");
                for (mut row, &t) in rows.outer_iter_mut().zip(&self.index.token_index) {
                    row.assign(&table.index_axis(Axis(0), t));
                }
            }
            None => {
                // Kept in half precision: the copied rows rounded to nearest
                // (exact when the table is kept in the same precision).
                let picked = table.select(Axis(0), &self.index.token_index);
                self.rows.stored_mut().assign(picked.view().into_dyn());
            }
        }
        Ok(())
    }

    /// σ(gate_logit), (n_rows).
    pub fn gate(&self) -> Array1<T> {
        self.gate_logit
            .widened()
            .iter()
            .map(|&x| sigmoid(x))
            .collect()
    }

    /// mean(σ(gate_logit)): the L1 penalty's value.
    pub fn penalty(&self) -> T {
        let g = self.gate();
        g.sum() / T::from_f64(g.len().max(1) as f64)
    }

    /// σ(gate_logit) on the tape, (n_rows).
    pub fn gate_var<'p>(&'p self, tape: &mut Tape<'p, T>) -> Var {
        let logit = tape.param(&self.gate_logit);
        tape.sigmoid(logit)
    }

    /// mean(σ(gate_logit)) on the tape (a scalar).
    pub fn penalty_var<'p>(&'p self, tape: &mut Tape<'p, T>) -> Var {
        let g = self.gate_var(tape);
        tape.mean(g)
    }

    /// `(1/n_rows) Σ_i ‖rows_i − c(token_i)‖₂` on the tape (a scalar), the
    /// gradient flowing through the centroid too; 0 gradient where a
    /// deviation is exactly zero (as at `seed_from`). One fused op,
    /// [`Tape::fusion_penalty`].
    pub fn fusion_penalty_var<'p>(&'p self, tape: &mut Tape<'p, T>) -> Var {
        let rows = tape.param(&self.rows);
        tape.fusion_penalty(rows, &self.groups)
    }

    /// [`Self::fusion_penalty_var`] built from five generic ops (segment
    /// mean, gather, sub, row norm, mean): the reference the fused op is
    /// tested against. It writes several (n_rows, D) arrays and gradient
    /// buffers.
    ///
    /// ```
    /// use ndarray::Array2;
    /// use splitgrad::{io::SplitIndex, layers::{SplitVocabulary, SplitVocabularyConfig}, Tape};
    /// let index = SplitIndex::new(vec![0, 1, 0], vec![2, 2, 1]);
    /// let mut sv = SplitVocabulary::<f64>::new(index, &SplitVocabularyConfig::new(4, 3, 2))?;
    /// *sv.rows_mut().value_mut() = Array2::from_shape_fn((3, 3), |(i, j)| (i * j) as f64).into_dyn();
    /// let mut tape = Tape::new();
    /// let naive = sv.fusion_penalty_var_naive(&mut tape);
    /// let fused = sv.fusion_penalty_var(&mut tape);
    /// assert!((tape.scalar(naive) - tape.scalar(fused)).abs() < 1e-15);
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn fusion_penalty_var_naive<'p>(&'p self, tape: &mut Tape<'p, T>) -> Var {
        let rows = tape.param(&self.rows);
        let group = self.groups.group_of_rows();
        let centroid = tape.segment_mean(rows, group, self.groups.n_groups());
        let own = tape.gather(centroid, group);
        let dev = tape.sub(rows, own);
        let norms = tape.row_norm(dev);
        tape.mean(norms)
    }

    /// The fusion penalty's value.
    pub fn fusion_penalty(&self) -> T {
        if self.n_rows() == 0 {
            return T::zero();
        }
        let mut tape = Tape::no_grad();
        let p = self.fusion_penalty_var(&mut tape);
        tape.scalar(p)
    }

    /// The fusion penalty's value and the distance of each row from its
    /// token's centroid, (n_rows): the state [`Self::fusion_penalty_grad`]
    /// takes, for a caller whose forward and backward are separate calls
    /// (the Python package's autograd functions) and would otherwise run
    /// the forward pass twice.
    pub fn fusion_penalty_norms(&self) -> (T, Array1<T>) {
        fusion_penalty_forward_stored(self.rows.stored().view(), &self.groups)
    }

    /// `weight · ∂fusion_penalty/∂rows`, (n_rows, D), from the norms
    /// [`Self::fusion_penalty_norms`] returned for the rows as they are
    /// now: the fused op's backward without its forward pass, equal bit
    /// for bit to the gradient the tape gives `weight · fusion_penalty_var`.
    /// Norms of other rows give a wrong gradient; that is the caller's to
    /// prevent.
    ///
    /// Errors if `norms` does not have one element per row.
    ///
    /// ```
    /// use ndarray::Array2;
    /// use splitgrad::{io::SplitIndex, kernels::pool::Pool, Tape};
    /// use splitgrad::layers::{SplitVocabulary, SplitVocabularyConfig};
    /// let index = SplitIndex::new(vec![0, 1, 0], vec![2, 2, 1]);
    /// let mut sv = SplitVocabulary::<f64>::new(index, &SplitVocabularyConfig::new(4, 3, 2))?;
    /// *sv.rows_mut().value_mut() = Array2::from_shape_fn((3, 3), |(i, j)| (i * j) as f64).into_dyn();
    /// let (value, norms) = sv.fusion_penalty_norms();
    /// let g = sv.fusion_penalty_grad(&Pool::new(), norms.as_slice().unwrap(), 0.5)?;
    /// let mut tape = Tape::new();
    /// let p = sv.fusion_penalty_var(&mut tape);
    /// let loss = tape.scale(p, 0.5);
    /// let grads = tape.backward(loss);
    /// assert_eq!(value, tape.scalar(p));
    /// assert_eq!(g, grads.param(sv.rows()).unwrap().to_dense());
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn fusion_penalty_grad(&self, pool: &Pool<T>, norms: &[T], weight: T) -> Result<ArrayD<T>> {
        self.check_norms(norms)?;
        Ok(fusion_penalty_backward_stored(
            pool,
            self.rows.stored().view(),
            &self.groups,
            norms,
            ndarray::arr0(weight).into_dyn().view(),
        ))
    }

    /// `weight · ∂fusion_penalty/∂rows` row by row ([`FusionRowGrads`]),
    /// from the norms [`Self::fusion_penalty_norms`] returned for the rows
    /// as they are now: the rows of [`Self::fusion_penalty_grad`], bit for
    /// bit, for an optimiser's [`update_by_rows`](crate::optim::Optimizer::update_by_rows),
    /// which then never stores the (n_rows, D) gradient.
    ///
    /// Errors if `norms` does not have one element per row.
    pub fn fusion_row_grads(&self, norms: &[T], weight: T) -> Result<FusionRowGrads<T>> {
        self.check_norms(norms)?;
        Ok(FusionRowGrads::from_stored(
            self.rows.stored().view(),
            &self.groups,
            norms,
            weight,
        ))
    }

    /// [`Self::fusion_penalty_norms`] and [`Self::fusion_row_grads`] for
    /// `weight` in one pass over the rows (each group's rows read once), the
    /// same bits: for a training step that knows the penalty's weight
    /// before its forward pass. The terms are kept in a buffer of `pool`
    /// ([`FusionRowGrads::give_back`] returns it).
    ///
    /// ```
    /// use splitgrad::io::SplitIndex;
    /// use splitgrad::layers::{SplitVocabulary, SplitVocabularyConfig};
    /// let index = SplitIndex::new(vec![0, 1, 0], vec![2, 2, 1]);
    /// let mut sv = SplitVocabulary::<f32>::new(index, &SplitVocabularyConfig::new(4, 3, 2))?;
    /// sv.rows_mut().value_mut().mapv_inplace(|_| 0.5);
    /// sv.rows_mut().value_mut()[[0, 1]] = 2.0;
    /// let (value, norms, grads) = sv.fusion_penalty_row_grads(&Default::default(), 0.1);
    /// assert_eq!((value, norms.clone()), sv.fusion_penalty_norms());
    /// let one = sv.fusion_row_grads(norms.as_slice().unwrap(), 0.1)?;
    /// let (mut a, mut b) = ([0.0f32; 3], [0.0f32; 3]);
    /// grads.row(0, &[0.5, 2.0, 0.5], &mut a);
    /// one.row(0, &[0.5, 2.0, 0.5], &mut b);
    /// assert_eq!(a, b);
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn fusion_penalty_row_grads(
        &self,
        pool: &Pool<T>,
        weight: T,
    ) -> (T, Array1<T>, FusionRowGrads<T>) {
        fusion_penalty_forward_row_grads(pool, self.rows.stored().view(), &self.groups, weight)
    }

    /// The rows, to update, and the fusion penalty with the gradient of
    /// `weight · fusion_penalty` formed a block of groups at a time inside
    /// that update ([`FusionBlocks`]; with each forward's ∂rows,
    /// [`RowsBlocks`], for
    /// [`Optimizer::update_by_blocks`](crate::optim::Optimizer::update_by_blocks)):
    /// each block's rows are read from memory once, for their norms, their
    /// groups' terms and their update. [`FusionBlocks::penalty`] then gives
    /// the penalty of the rows before the update and each row's distance
    /// from its centroid, as [`Self::fusion_penalty_norms`] does. The same
    /// bits as [`Self::fusion_penalty_row_grads`] and `update_by_rows` with
    /// [`RowsGrad`], which read the rows twice and keep every group's terms
    /// between the two.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::io::SplitIndex;
    /// use splitgrad::layers::{RowsBlocks, RowsGrad, SplitVocabulary, SplitVocabularyConfig};
    /// use splitgrad::optim::{LazyAdam, LazyAdamConfig, Optimizer};
    /// use splitgrad::RowSparse;
    /// # fn main() -> splitgrad::Result<()> {
    /// let index = SplitIndex::new(vec![0, 1, 0], vec![2, 2, 1]);
    /// let mut a = SplitVocabulary::<f32>::new(index, &SplitVocabularyConfig::new(4, 2, 2))?;
    /// a.rows_mut().value_mut().assign(&array![[0.5f32, 1.0], [2.0, 0.0], [1.0, 1.0]].into_dyn());
    /// let mut b = a.clone();
    /// let part = RowSparse { n_rows: 3, rows: vec![1], values: array![[1.0f32, 2.0]] };
    /// // The terms of every group first, then the update by rows …
    /// let (pa, norms, terms) = a.fusion_penalty_row_grads(&Default::default(), 0.1);
    /// let grad = RowsGrad::new(3, Some(&terms), &[&part]);
    /// LazyAdam::new(LazyAdamConfig::default())?.update_by_rows(a.rows_mut(), &grad)?;
    /// // … or each block's terms inside the update: the same bits.
    /// let (rows, blocks) = b.rows_and_fusion_blocks(0.1);
    /// LazyAdam::new(LazyAdamConfig::default())?.update_by_blocks(rows, &RowsBlocks::new(&blocks, &[&part]))?;
    /// assert_eq!(blocks.penalty(rows.stored().view()), (pa, norms));
    /// assert_eq!(b.rows().value(), a.rows().value());
    /// # Ok(()) }
    /// ```
    pub fn rows_and_fusion_blocks(
        &mut self,
        weight: T,
    ) -> (&mut Parameter<T>, FusionBlocks<'_, T>) {
        (
            &mut self.rows,
            FusionBlocks::with_layout(
                &self.groups,
                self.fusion_layout
                    .get_or_init(|| FusionLayout::new::<T>(&self.groups, self.dim)),
                weight,
            ),
        )
    }

    /// Errors unless `norms` has one element per row (the distances
    /// [`Self::fusion_penalty_norms`] returns).
    pub fn check_norms(&self, norms: &[T]) -> Result<()> {
        if norms.len() != self.n_rows() {
            return Err(Error::shape(
                "norms",
                format!("({},) (one per row)", self.n_rows()),
                &[norms.len()],
            ));
        }
        Ok(())
    }

    /// The row of each token ([`NO_ROW`] for none), checking lengths and
    /// ranges; errors name the token's position.
    pub fn rows_of(&self, token_ids: &[i64], language_ids: &[i64]) -> Result<Vec<u32>> {
        if token_ids.len() != language_ids.len() {
            return Err(Error::new(ErrorKind::Shape {
                what: "language_ids".into(),
                expected: format!("({},) like token_ids", token_ids.len()),
                found: vec![language_ids.len()],
            }));
        }
        let mut out = Vec::with_capacity(token_ids.len());
        for (n, (&t, &l)) in token_ids.iter().zip(language_ids).enumerate() {
            if t < 0 || t as u64 >= self.vocab_size as u64 {
                return Err(Error::out_of_range(
                    "token id",
                    vec![n],
                    t,
                    0,
                    self.vocab_size as i64,
                ));
            }
            if l < 0 || l as u64 >= self.n_languages as u64 {
                return Err(Error::out_of_range(
                    "language id",
                    vec![n],
                    l,
                    0,
                    self.n_languages as i64,
                ));
            }
            out.push(
                self.lookup
                    .get(l as usize, t as usize)
                    .map_or(NO_ROW, |r| r as u32),
            );
        }
        Ok(out)
    }

    /// Mixes each token's shared row with its private row, if any.
    ///
    /// token_ids, language_ids: ids of one shape (…); shared: (…, D) on the
    /// tape. With the gate: `out_n = shared_n + g_r·(rows_r − shared_n)`;
    /// without it (fusion mode): `out_n = rows_r`; `out_n = shared_n`
    /// without a row. Gradient flows to `shared`, `rows` and `gate_logit`.
    /// Errors: shapes differ, an id out of range (named by its position),
    /// `shared` of the wrong shape.
    pub fn forward<'p, 'i, 'j>(
        &'p self,
        tape: &mut Tape<'p, T>,
        token_ids: impl Ids<'i>,
        language_ids: impl Ids<'j>,
        shared: Var,
        use_gate: bool,
    ) -> Result<Var> {
        let shape = tape.value(shared).shape().to_vec();
        let row_of = self.route_rows(token_ids.ids(), language_ids.ids(), &shape)?;
        let flat = if shape.len() == 2 {
            shared
        } else {
            tape.reshape(shared, &[row_of.len(), self.dim])
        };
        let rows = tape.param(&self.rows);
        let gate = use_gate.then(|| self.gate_var(tape));
        let out = tape.gated_mix(flat, rows, gate, row_of);
        Ok(if shape.len() == 2 {
            out
        } else {
            tape.reshape(out, &shape)
        })
    }

    /// The row of each token for ids of one shape and shared of that shape
    /// plus D, the errors naming positions in the ids' shape.
    fn route_rows(
        &self,
        tokens: ArrayViewD<'_, i64>,
        languages: ArrayViewD<'_, i64>,
        shared_shape: &[usize],
    ) -> Result<Vec<u32>> {
        if languages.shape() != tokens.shape() {
            return Err(Error::shape(
                "language_ids",
                format!("{:?} like token_ids", tokens.shape()),
                languages.shape(),
            ));
        }
        let t: Vec<i64> = tokens.iter().copied().collect();
        let l: Vec<i64> = languages.iter().copied().collect();
        let row_of = self.rows_of(&t, &l).map_err(|e| match e.kind() {
            ErrorKind::OutOfRange {
                what,
                position,
                value,
                low,
                high,
            } if tokens.ndim() != 1 => Error::out_of_range(
                what,
                crate::kernels::unravel(position[0], tokens.shape()),
                *value,
                *low,
                *high,
            ),
            _ => e,
        })?;
        let mut want = tokens.shape().to_vec();
        want.push(self.dim);
        if shared_shape != want {
            return Err(shared_shape_error(&want, shared_shape));
        }
        Ok(row_of)
    }

    /// `split_vocabulary.rows`, (n_rows, D).
    pub fn rows(&self) -> &Parameter<T> {
        &self.rows
    }

    /// `split_vocabulary.gate_logit`, (n_rows).
    pub fn gate_logit(&self) -> &Parameter<T> {
        &self.gate_logit
    }

    /// `split_vocabulary.rows`, to change in place.
    pub fn rows_mut(&mut self) -> &mut Parameter<T> {
        &mut self.rows
    }

    /// `split_vocabulary.gate_logit`, to change in place.
    pub fn gate_logit_mut(&mut self) -> &mut Parameter<T> {
        &mut self.gate_logit
    }

    /// The index of pairs.
    pub fn index(&self) -> &SplitIndex {
        &self.index
    }

    /// The row of a (language, token) pair.
    pub fn row_of(&self, language: usize, token: usize) -> Option<usize> {
        self.lookup.get(language, token)
    }

    /// n_rows.
    pub fn n_rows(&self) -> usize {
        self.index.token_index.len()
    }

    /// D.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// V.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// L.
    pub fn n_languages(&self) -> usize {
        self.n_languages
    }
}

impl<T: Real> Module<T> for SplitVocabulary<T> {
    /// `split_vocabulary.rows`, then `split_vocabulary.gate_logit`.
    fn parameters(&self) -> Vec<&Parameter<T>> {
        vec![&self.rows, &self.gate_logit]
    }

    fn parameters_mut(&mut self) -> Vec<&mut Parameter<T>> {
        vec![&mut self.rows, &mut self.gate_logit]
    }

    /// The index: `split_vocabulary.language_index` and
    /// `split_vocabulary.token_index` (I64), and `split_vocabulary.score`
    /// (F64) when the index has one. Loading a state checks that its index
    /// is this layer's.
    fn buffers(&self) -> Vec<(String, TensorRef<'_>)> {
        let mut out = vec![
            (
                "split_vocabulary.language_index".to_string(),
                TensorRef::I64(self.index_i64.0.view().into_dyn()),
            ),
            (
                "split_vocabulary.token_index".to_string(),
                TensorRef::I64(self.index_i64.1.view().into_dyn()),
            ),
        ];
        if let Some(score) = &self.score {
            out.push((
                "split_vocabulary.score".to_string(),
                TensorRef::F64(score.view().into_dyn()),
            ));
        }
        out
    }
}

/// The error of a `shared` of shape `found` where `want` was due.
fn shared_shape_error(want: &[usize], found: &[usize]) -> Error {
    let dims: Vec<String> = want.iter().map(|d| d.to_string()).collect();
    Error::shape("shared", format!("({})", dims.join(", ")), found)
}
