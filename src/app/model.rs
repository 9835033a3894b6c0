//! The bigram language model of the command line:
//! `SplitTokenEmbeddings → SplitVocabulary → SplitLanguageModellingHead`,
//! trained to predict each token from the one before it, in its language.
//!
//! ```text
//! shared_n = E[t_n]                                   (SplitTokenEmbeddings, one split `vocab`)
//! h_n      = SplitVocabulary(t_n, l_n, shared_n)      (gated, or fusion mode)
//! loss     = mean_n CE(h_n·Wᵀ, t_{n+1}) + λ_g·penalty() + λ_f·fusion_penalty()
//! ```
//!
//! Tokens of a batch with the same hidden row share every activation: a
//! context (l, t) with a split row has its own, and every context of token
//! t without one reads the shared row `E[t]`. The model computes each
//! distinct hidden row once (at most V + n_rows of them, whatever the batch)
//! and lets the head's grouped, summed cross-entropy give every token its
//! own loss, with the head's gradients formed in the same pass: the same
//! numbers as the token-by-token computation, at a fraction of the cost.

use std::borrow::Cow;

use ndarray::{CowArray, Ix1, Ix2};

use crate::error::Result;
use crate::io::SplitIndex;
use crate::kernels::Real;
use crate::layers::{
    SplitLanguageModellingHead, SplitTokenEmbeddings, SplitVocabulary, SplitVocabularyConfig,
};
use crate::ops::gated_mix::NO_ROW;
use crate::param::Parameter;
use crate::rng::Rng;
use crate::state::{Module, TensorRef};
use crate::tape::{Tape, Var};

/// Sizes of the model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelConfig {
    /// V.
    pub vocab_size: usize,
    /// L.
    pub n_languages: usize,
    /// D, the width of every embedding.
    pub dim: usize,
    /// The initial gate logit of every split row (σ(0) = 0.5).
    pub gate_init: f64,
}

impl ModelConfig {
    /// V, L and D, every gate starting at σ(0) = 0.5.
    ///
    /// ```
    /// use splitgrad::app::model::ModelConfig;
    /// let c = ModelConfig::new(10, 2, 4);
    /// assert_eq!((c.vocab_size, c.n_languages, c.dim, c.gate_init), (10, 2, 4, 0.0));
    /// ```
    pub fn new(vocab_size: usize, n_languages: usize, dim: usize) -> Self {
        ModelConfig {
            vocab_size,
            n_languages,
            dim,
            gate_init: 0.0,
        }
    }
}

/// A batch of bigrams: context (token, language) → target token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// Context tokens (N).
    pub tokens: Vec<i64>,
    /// Context languages (N).
    pub languages: Vec<i64>,
    /// Next tokens (N).
    pub targets: Vec<i64>,
}

/// The terms of the loss, each a scalar node on the tape.
#[derive(Clone, Copy, Debug)]
pub struct LossTerms {
    /// Mean cross-entropy over the batch.
    pub ce: Var,
    /// mean(σ(gate_logit)), or `None` in fusion mode.
    pub penalty: Option<Var>,
    /// The fusion penalty, or `None` when its weight is 0.
    pub fusion: Option<Var>,
    /// `ce + λ_g·penalty + λ_f·fusion`.
    pub total: Var,
    /// The batch's distinct hidden rows (contexts), each computed once:
    /// the head's work is `6·contexts·V·D` flops.
    pub contexts: usize,
}

/// The bigram model.
#[derive(Clone, Debug)]
pub struct BigramModel<T> {
    /// The shared table, `token_embedding.vocab.weight`.
    pub embeddings: SplitTokenEmbeddings<T>,
    /// The split rows and their gates.
    pub split: SplitVocabulary<T>,
    /// The output layer, `lm_head.vocab.weight`.
    pub head: SplitLanguageModellingHead<T>,
    config: ModelConfig,
}

impl<T: Real> BigramModel<T> {
    /// A model with zero weights (call [`Self::reset_parameters`]).
    ///
    /// ```
    /// use splitgrad::{io::SplitIndex, app::model::{BigramModel, ModelConfig}, prelude::*};
    /// let cfg = ModelConfig { vocab_size: 10, n_languages: 2, dim: 4, gate_init: 0.0 };
    /// let mut m = BigramModel::<f32>::new(cfg, SplitIndex::new(vec![1], vec![3]))?;
    /// m.reset_parameters(&mut Rng::new(0))?;
    /// assert_eq!(m.parameters().len(), 4);
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn new(config: ModelConfig, index: SplitIndex) -> Result<Self> {
        let splits = [("vocab", config.vocab_size)];
        Ok(BigramModel {
            embeddings: SplitTokenEmbeddings::new(&splits, &["vocab"], config.dim)?,
            split: SplitVocabulary::new(
                index,
                &SplitVocabularyConfig {
                    vocab_size: config.vocab_size,
                    dim: config.dim,
                    n_languages: config.n_languages,
                    gate_init: config.gate_init,
                },
            )?,
            head: SplitLanguageModellingHead::new(&splits, &["vocab"], config.dim)?,
            config,
        })
    }

    /// The shared-only model: the same tables and head with no split rows,
    /// so every language uses the shared row (the model `splitgrad select`
    /// measures interference on).
    ///
    /// ```
    /// use splitgrad::app::model::{BigramModel, ModelConfig};
    /// let cfg = ModelConfig { vocab_size: 10, n_languages: 2, dim: 4, gate_init: 0.0 };
    /// let m = BigramModel::<f32>::shared_only(cfg)?;
    /// assert_eq!(m.split.n_rows(), 0);
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn shared_only(config: ModelConfig) -> Result<Self> {
        let splits = [("vocab", config.vocab_size)];
        Ok(BigramModel {
            embeddings: SplitTokenEmbeddings::new(&splits, &["vocab"], config.dim)?,
            split: SplitVocabulary::without_rows(
                config.vocab_size,
                config.dim,
                config.n_languages,
            )?,
            head: SplitLanguageModellingHead::new(&splits, &["vocab"], config.dim)?,
            config,
        })
    }

    /// The sizes.
    pub fn config(&self) -> ModelConfig {
        self.config
    }

    /// Initialises the tables as PyTorch does, then seeds every split row
    /// from its shared row (so the model starts as the shared-only one).
    pub fn reset_parameters(&mut self, rng: &mut Rng) -> Result<()> {
        self.embeddings.reset_parameters(rng);
        self.head.reset_parameters(rng);
        self.seed_split_rows()
    }

    /// `split.seed_from(shared table)`.
    pub fn seed_split_rows(&mut self) -> Result<()> {
        let table = self.embeddings.split("vocab").expect("the one split");
        self.split.seed_from(table)
    }

    /// The shared table, `token_embedding.vocab.weight`.
    pub fn shared_table(&self) -> &Parameter<T> {
        self.embeddings.split("vocab").expect("the one split")
    }

    /// The shared table as (V, D): borrowed when kept at the engine's
    /// precision, widened (exactly) when kept in half precision.
    pub fn table(&self) -> CowArray<'_, T, Ix2> {
        two_d(self.shared_table())
    }

    /// The split rows as (n_rows, D), borrowed or widened as
    /// [`Self::table`].
    pub fn rows(&self) -> CowArray<'_, T, Ix2> {
        two_d(self.split.rows())
    }

    /// The head's weight `lm_head.vocab.weight` as (V, D), borrowed or
    /// widened as [`Self::table`].
    pub fn head_weight(&self) -> CowArray<'_, T, Ix2> {
        two_d(self.head.parameters()[0])
    }

    /// The gate logits (n_rows), borrowed or widened as [`Self::table`].
    pub fn gate_logits(&self) -> CowArray<'_, T, Ix1> {
        match self.split.gate_logit().widened() {
            Cow::Borrowed(a) => a.view().into_dimensionality().expect("1-D gates").into(),
            Cow::Owned(a) => a.into_dimensionality().expect("1-D gates").into(),
        }
    }

    /// Each split row's gate σ(gate_logit), in f64.
    pub fn gates(&self) -> Vec<f64> {
        self.split.gate().iter().map(|&g| g.to_f64()).collect()
    }

    /// The distinct hidden rows of a batch: how many rows the head computes
    /// for it. Errors as [`Self::loss`] on ids out of range.
    ///
    /// ```
    /// use splitgrad::{io::SplitIndex, app::model::{Batch, BigramModel, ModelConfig}};
    /// let cfg = ModelConfig { vocab_size: 10, n_languages: 2, dim: 4, gate_init: 0.0 };
    /// let m = BigramModel::<f32>::new(cfg, SplitIndex::new(vec![1], vec![3]))?;
    /// // Token 3 in language 1 has a row of its own; token 3 in language 0 and
    /// // token 5 in both languages read the shared rows.
    /// let b = Batch { tokens: vec![3, 3, 5, 5], languages: vec![0, 1, 0, 1], targets: vec![0; 4] };
    /// assert_eq!(m.hidden_rows(&b)?, 3);
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn hidden_rows(&self, batch: &Batch) -> Result<usize> {
        Ok(unique_hidden(&self.split, &batch.tokens, &batch.languages)?
            .0
            .len())
    }

    /// Records the loss of a batch. Contexts that repeat are computed once.
    ///
    /// `use_gate = false` is fusion mode; a penalty weight of 0 leaves its
    /// term off the tape.
    pub fn loss<'p>(
        &'p self,
        tape: &mut Tape<'p, T>,
        batch: &Batch,
        use_gate: bool,
        gate_weight: f64,
        fusion_weight: f64,
    ) -> Result<LossTerms> {
        let (tokens, langs, row_of) = unique_hidden(&self.split, &batch.tokens, &batch.languages)?;
        let shared = self.embeddings.forward(tape, &tokens)?;
        let hidden = self
            .split
            .forward(tape, &tokens, &langs, shared, use_gate)?;
        // Σ_n loss_n with its gradients formed in the forward (the head's
        // 6·m·V·D flops once, not 8·m·V·D), then the mean.
        let total_ce = self
            .head
            .forward_grouped_sum(tape, hidden, &row_of, &batch.targets)?;
        let n = batch.targets.len().max(1);
        let ce = tape.scale(total_ce, T::from_f64(1.0 / n as f64));
        let mut total = ce;
        let has_rows = self.split.n_rows() > 0;
        let penalty =
            (has_rows && use_gate && gate_weight != 0.0).then(|| self.split.penalty_var(tape));
        if let Some(p) = penalty {
            let w = tape.scale(p, T::from_f64(gate_weight));
            total = tape.add(total, w);
        }
        let fusion =
            (has_rows && fusion_weight != 0.0).then(|| self.split.fusion_penalty_var(tape));
        if let Some(f) = fusion {
            let w = tape.scale(f, T::from_f64(fusion_weight));
            total = tape.add(total, w);
        }
        Ok(LossTerms {
            ce,
            penalty,
            fusion,
            total,
            contexts: tokens.len(),
        })
    }
}

impl<T: Real> Module<T> for BigramModel<T> {
    /// In checkpoint order: the shared table, the split rows, the gate
    /// logits, the head.
    fn parameters(&self) -> Vec<&Parameter<T>> {
        let mut out = self.embeddings.parameters();
        out.extend(self.split.parameters());
        out.extend(self.head.parameters());
        out
    }

    fn parameters_mut(&mut self) -> Vec<&mut Parameter<T>> {
        let mut out = self.embeddings.parameters_mut();
        out.extend(self.split.parameters_mut());
        out.extend(self.head.parameters_mut());
        out
    }

    /// The split vocabulary's index.
    fn buffers(&self) -> Vec<(String, TensorRef<'_>)> {
        self.split.buffers()
    }
}

/// A 2-D parameter as (rows, width), borrowed when kept at the engine's
/// precision, widened otherwise.
fn two_d<T: Real>(p: &Parameter<T>) -> CowArray<'_, T, Ix2> {
    match p.widened() {
        Cow::Borrowed(a) => a.view().into_dimensionality().expect("a 2-D table").into(),
        Cow::Owned(a) => a.into_dimensionality().expect("a 2-D table").into(),
    }
}

/// The distinct hidden rows of a batch. A context (l, t) with a split row
/// has a hidden row of its own; every other context of token t reads the
/// shared row `E[t]` unchanged, so all of them share one hidden row. Returns
/// a representative (token, language) per hidden row, in increasing key
/// order (key t for a shared row, `V·(1 + l) + t` for a split row), and the
/// hidden row of each token of the batch. Errors name the batch position
/// of an id out of range.
fn unique_hidden<T: Real>(
    split: &SplitVocabulary<T>,
    tokens: &[i64],
    languages: &[i64],
) -> Result<(Vec<i64>, Vec<i64>, Vec<usize>)> {
    let v = split.vocab_size() as u64;
    let keyed: Vec<(u64, usize)> = split
        .rows_of(tokens, languages)?
        .into_iter()
        .zip(tokens.iter().zip(languages))
        .enumerate()
        .map(|(n, (r, (&t, &l)))| match r {
            NO_ROW => (t as u64, n),
            _ => (v * (1 + l as u64) + t as u64, n),
        })
        .collect();
    let mut order = keyed.clone();
    order.sort_unstable();
    let mut keys: Vec<u64> = Vec::new();
    let (mut rep_t, mut rep_l) = (Vec::new(), Vec::new());
    for &(key, n) in &order {
        if keys.last() != Some(&key) {
            keys.push(key);
            rep_t.push(tokens[n]);
            rep_l.push(languages[n]);
        }
    }
    let row_of = keyed
        .iter()
        .map(|(k, _)| keys.binary_search(k).expect("present"))
        .collect();
    Ok((rep_t, rep_l, row_of))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ParamGrad;
    use ndarray::Array1;

    fn model() -> BigramModel<f64> {
        let cfg = ModelConfig {
            vocab_size: 7,
            n_languages: 3,
            dim: 4,
            gate_init: 0.3,
        };
        let index = SplitIndex::new(vec![0, 2, 1, 0], vec![1, 1, 5, 6]);
        let mut m = BigramModel::new(cfg, index).unwrap();
        m.reset_parameters(&mut Rng::new(1)).unwrap();
        // Give split rows and gates their own values so every path matters.
        let mut r = Rng::new(2);
        for p in m.parameters_mut().into_iter().skip(1).take(2) {
            p.value_mut().mapv_inplace(|x| x + 0.3 * r.normal());
        }
        m
    }

    #[test]
    fn grouped_loss_equals_token_by_token() {
        let m = model();
        let batch = Batch {
            // (1, 1), (0, 0) and (2, 0) have no row: token 1 in language 1
            // shares the shared row with nobody else, token 0 shares it
            // across languages 0, 1 and 2.
            tokens: vec![1, 1, 5, 1, 6, 0, 5, 1, 0, 0],
            languages: vec![0, 0, 1, 2, 0, 1, 1, 1, 0, 2],
            targets: vec![2, 3, 2, 2, 0, 6, 4, 4, 5, 1],
        };
        let mut tape = Tape::new();
        let terms = m.loss(&mut tape, &batch, true, 0.1, 0.2).unwrap();
        let grads = tape.backward(terms.total);

        // The same loss, token by token, with no grouping.
        let mut t2 = Tape::new();
        let ids = Array1::from(batch.tokens.clone()).into_dyn();
        let shared = m.embeddings.forward(&mut t2, ids.view()).unwrap();
        let h = m
            .split
            .forward(&mut t2, &batch.tokens, &batch.languages, shared, true)
            .unwrap();
        let l = m
            .head
            .forward(
                &mut t2,
                h,
                Array1::from(batch.targets.clone()).into_dyn().view(),
            )
            .unwrap();
        let ce = t2.mean(l);
        let p = m.split.penalty_var(&mut t2);
        let p = t2.scale(p, 0.1);
        let f = m.split.fusion_penalty_var(&mut t2);
        let f = t2.scale(f, 0.2);
        let total = t2.add(ce, p);
        let total = t2.add(total, f);
        let g2 = t2.backward(total);
        assert!((tape.scalar(terms.total) - t2.scalar(total)).abs() < 1e-12);
        for p in m.parameters() {
            let (a, b) = (grads.dense(p), g2.dense(p));
            for (x, y) in a.iter().zip(b.iter()) {
                assert!((x - y).abs() < 1e-12, "{}: {x} vs {y}", p.name());
            }
        }
        assert!(matches!(
            grads.param(m.parameters()[0]),
            Some(ParamGrad::RowSparse(_))
        ));
        // Token 0 in three languages without a row is one hidden row.
        let (t, _, row_of) = unique_hidden(&m.split, &batch.tokens, &batch.languages).unwrap();
        assert_eq!(t.len(), 6);
        assert_eq!(row_of[5], row_of[8]);
        assert_eq!(row_of[5], row_of[9]);
        assert_ne!(row_of[1], row_of[7]);
    }

    #[test]
    fn ids_out_of_range_name_the_batch_position() {
        let m = model();
        let batch = Batch {
            tokens: vec![1, 7],
            languages: vec![0, 0],
            targets: vec![2, 3],
        };
        let err = m
            .loss(&mut Tape::new(), &batch, true, 0.0, 0.0)
            .unwrap_err();
        assert!(err.to_string().contains("7"), "{err}");
        let batch = Batch {
            tokens: vec![1, 2],
            languages: vec![0, 3],
            targets: vec![2, 3],
        };
        assert!(m.loss(&mut Tape::new(), &batch, true, 0.0, 0.0).is_err());
    }
}
