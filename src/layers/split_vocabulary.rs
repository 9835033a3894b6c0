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

use ndarray::{Array1, Array2, ArrayD, ArrayView2, Axis, Ix2};

use crate::io::{PairLookup, SplitIndex, load_index};
use crate::ops::fusion_penalty::RowGroups;
use crate::ops::sigmoid::sigmoid;
use crate::tape::{Op, Tape, Var};
use crate::{Error, Parameter, Real, Result};

pub use super::gated_mix::gated_mix_forward;
pub(crate) use super::gated_mix::{GatedMixSaved, NO_ROW};

/// Private rows for chosen (language, token) pairs, gated against the
/// shared embedding.
///
/// ```
/// use ndarray::Array2;
/// use splitgrad::{io::SplitIndex, layers::SplitVocabulary, Tape};
/// // Pairs (language 1, token 2) and (language 0, token 2).
/// let index = SplitIndex::new(vec![1, 0], vec![2, 2]);
/// let mut sv = SplitVocabulary::<f64>::new(index, 4, 3, 2, 0.0)?;
/// let table = Array2::from_shape_fn((4, 3), |(i, j)| (i * 3 + j) as f64);
/// sv.seed_from(table.view())?;
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
}

impl<T: Real> SplitVocabulary<T> {
    /// Builds the layer from an index of pairs; `rows` start at zero,
    /// `gate_logit` at `gate_init`. Errors: an index that SPEC 1.3 rejects
    /// (empty, a language ≥ L, a token ≥ V, a duplicate pair), `dim` 0, or a
    /// non-finite `gate_init`.
    ///
    /// ```
    /// use splitgrad::{io::SplitIndex, layers::SplitVocabulary};
    /// let bad = SplitIndex::new(vec![0, 0], vec![1, 1]);
    /// assert!(SplitVocabulary::<f32>::new(bad, 4, 2, 1, 0.0).is_err());
    /// ```
    pub fn new(
        index: SplitIndex,
        vocab_size: usize,
        dim: usize,
        n_languages: usize,
        gate_init: f64,
    ) -> Result<Self> {
        if dim == 0 {
            return Err(Error::config("dim must be positive, got 0"));
        }
        if !gate_init.is_finite() {
            return Err(Error::config(format!(
                "gate_init must be finite, got {gate_init}"
            )));
        }
        index.validate(n_languages, vocab_size)?;
        Ok(Self::build(index, vocab_size, dim, n_languages, gate_init))
    }

    /// A layer with no split rows: its output is `shared`, its penalties 0.
    /// The shared-only model of `splitgrad select` is built on it; an index
    /// file must still hold at least one pair (SPEC 1.3).
    pub(crate) fn without_rows(vocab_size: usize, dim: usize, n_languages: usize) -> Result<Self> {
        if dim == 0 {
            return Err(Error::config("dim must be positive, got 0"));
        }
        let index = SplitIndex::new(Vec::new(), Vec::new());
        Ok(Self::build(index, vocab_size, dim, n_languages, 0.0))
    }

    /// The layer for an index already checked: rows zero, gate logits
    /// `gate_init`, the pair lookup and each row's token group.
    fn build(
        index: SplitIndex,
        vocab_size: usize,
        dim: usize,
        n_languages: usize,
        gate_init: f64,
    ) -> Self {
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
        SplitVocabulary {
            rows: Parameter::new(
                "split_vocabulary.rows",
                Array2::<T>::zeros((n_rows, dim)).into_dyn(),
            ),
            gate_logit: Parameter::new(
                "split_vocabulary.gate_logit",
                ArrayD::from_elem(ndarray::IxDyn(&[n_rows]), T::from_f64(gate_init)),
            ),
            index,
            lookup,
            vocab_size,
            n_languages,
            dim,
            groups,
        }
    }

    /// Loads the index from an `.npz` file (arrays `language_index` and
    /// `token_index`), then [`Self::new`]. Errors name the file, the array,
    /// the position and the value.
    pub fn from_npz(
        path: impl AsRef<Path>,
        vocab_size: usize,
        dim: usize,
        n_languages: usize,
        gate_init: f64,
    ) -> Result<Self> {
        let index = load_index(path.as_ref(), n_languages, vocab_size)?;
        Self::new(index, vocab_size, dim, n_languages, gate_init)
            .map_err(|e| e.in_file(path.as_ref()))
    }

    /// Copies each row from the shared row it specialises:
    /// `rows[i] = table[token_index[i]]`. After it the layer's output equals
    /// `shared` exactly, whatever the gates. table: (V, D).
    pub fn seed_from(&mut self, table: ArrayView2<'_, T>) -> Result<()> {
        if table.dim() != (self.vocab_size, self.dim) {
            return Err(Error::shape(
                "seed table",
                format!("({}, {})", self.vocab_size, self.dim),
                table.shape(),
            ));
        }
        let rows = table.select(Axis(0), &self.index.token_index);
        *self.rows.value_mut() = rows.into_dyn();
        Ok(())
    }

    /// σ(gate_logit), (n_rows).
    pub fn gate(&self) -> Array1<T> {
        self.gate_logit
            .value()
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
    /// use splitgrad::{io::SplitIndex, layers::SplitVocabulary, Tape};
    /// let index = SplitIndex::new(vec![0, 1, 0], vec![2, 2, 1]);
    /// let mut sv = SplitVocabulary::<f64>::new(index, 4, 3, 2, 0.0)?;
    /// *sv.parameters_mut().0.value_mut() = Array2::from_shape_fn((3, 3), |(i, j)| (i * j) as f64).into_dyn();
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

    /// The row of each token ([`NO_ROW`] for none), checking lengths and
    /// ranges; errors name the token's position.
    pub(crate) fn rows_of(&self, token_ids: &[i64], language_ids: &[i64]) -> Result<Vec<u32>> {
        if token_ids.len() != language_ids.len() {
            return Err(Error::new(crate::ErrorKind::Shape {
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
    /// token_ids, language_ids: (N); shared: (N, D) on the tape. With the
    /// gate: `out_n = shared_n + g_r·(rows_r − shared_n)`; without it
    /// (fusion mode): `out_n = rows_r`; `out_n = shared_n` without a row.
    /// Gradient flows to `shared`, `rows` and `gate_logit`. Errors: lengths
    /// differ, an id out of range, `shared` of the wrong shape.
    pub fn forward<'p>(
        &'p self,
        tape: &mut Tape<'p, T>,
        token_ids: &[i64],
        language_ids: &[i64],
        shared: Var,
        use_gate: bool,
    ) -> Result<Var> {
        let row_of = self.rows_of(token_ids, language_ids)?;
        let shape = tape.value(shared).shape().to_vec();
        if shape != [token_ids.len(), self.dim] {
            return Err(Error::shape(
                "shared",
                format!("({}, {})", token_ids.len(), self.dim),
                &shape,
            ));
        }
        let rows = tape.param(&self.rows);
        let gate = use_gate.then(|| self.gate_var(tape));
        let out = {
            let g: Option<Vec<T>> = gate.map(|g| tape.value(g).iter().copied().collect());
            let s = tape
                .value(shared)
                .into_dimensionality::<Ix2>()
                .expect("checked 2-D");
            let r = tape
                .value(rows)
                .into_dimensionality::<Ix2>()
                .expect("2-D rows");
            gated_mix_forward(s, r, g.as_deref(), &row_of)
        };
        let mut inputs = vec![shared, rows];
        inputs.extend(gate);
        let saved = GatedMixSaved {
            shared,
            rows,
            gate,
            row_of,
        };
        Ok(tape.push(out.into_dyn(), Op::GatedMix(Box::new(saved)), &inputs))
    }

    /// `split_vocabulary.rows`, (n_rows, D).
    pub fn rows(&self) -> &Parameter<T> {
        &self.rows
    }

    /// `split_vocabulary.gate_logit`, (n_rows).
    pub fn gate_logit(&self) -> &Parameter<T> {
        &self.gate_logit
    }

    /// Both parameters, to change in place: (rows, gate_logit).
    pub fn parameters_mut(&mut self) -> (&mut Parameter<T>, &mut Parameter<T>) {
        (&mut self.rows, &mut self.gate_logit)
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
