//! Choosing which (language, token) pairs get a row: interference measured
//! on the shared-only model.
//!
//! In the shared-only bigram model every language reads the same row
//! `E[t]` for token t, and the head turns it into next-token probabilities
//! `p_t = softmax(W·E[t])` (W: (V, D)). One occurrence of context (l, t)
//! followed by token j sends the shared row the gradient
//! `∂CE/∂E[t] = Wᵀ(p_t − e_j)`. Averaged over the `n_lt` occurrences of the
//! pair, with `q_lt` the empirical next-token distribution of language l
//! after t:
//!
//! ```text
//! g_lt  = Wᵀ(p_t − q_lt)                       (D)
//! score = ‖g_lt‖₂
//! ```
//!
//! Why it measures interference: at the shared-only model's optimum the
//! languages' gradients cancel, `Σ_l n_lt·g_lt ≈ 0`, so a pair whose own
//! mean gradient is large is one whose language keeps pulling the shared
//! row one way while the other languages pull it back. A pair that follows
//! the shared distribution has `q_lt ≈ p_t` and a score near 0 (up to
//! sampling noise of order `1/√n_lt`); a pair with a next-token
//! distribution of its own scores high, and the pairs it shares a token
//! with score in proportion to how much it drags `p_t` away from them. The
//! score is a gradient norm, so it is in the units of the loss per unit of
//! embedding: compare scores within one model, not across models.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use ndarray::{Array2, ArrayView2, Axis, s};
use rayon::prelude::*;

use crate::app::corpus::Corpus;
use crate::app::data::Data;
use crate::app::model::{BigramModel, ModelConfig};
use crate::app::report::{Agreement, agreement};
use crate::checkpoint::{Checkpoint, Snapshot, save_state};
use crate::io::SplitIndex;
use crate::param::Dtype;
use crate::state::Module;
use crate::{Error, Real, Result};

/// One (language, token) pair with its interference score.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PairScore {
    /// Language l.
    pub language: usize,
    /// Token t.
    pub token: usize,
    /// Occurrences of (l, t) as a context in the corpus.
    pub count: usize,
    /// `‖Wᵀ(p_t − q_lt)‖₂`.
    pub score: f64,
}

/// A context (language, token) and its (next token, count) pairs, sorted.
type ContextCounts = ((usize, usize), Vec<(usize, usize)>);

/// Next-token counts of every context (language, token) seen at least
/// `min_count` times, in (language, token) order.
fn context_counts(corpus: &Corpus, min_count: usize) -> Vec<ContextCounts> {
    let mut map: HashMap<(usize, usize), HashMap<usize, usize>> = HashMap::new();
    for (i, j) in corpus.bigrams() {
        let key = (
            corpus.language_ids.get(i) as usize,
            corpus.token_ids.get(i) as usize,
        );
        *map.entry(key)
            .or_default()
            .entry(corpus.token_ids.get(j) as usize)
            .or_default() += 1;
    }
    let mut out: Vec<ContextCounts> = map
        .into_iter()
        .map(|(k, next)| {
            let mut next: Vec<(usize, usize)> = next.into_iter().collect();
            next.sort_unstable();
            (k, next)
        })
        .filter(|(_, next)| next.iter().map(|&(_, c)| c).sum::<usize>() >= min_count.max(1))
        .collect();
    out.sort_unstable_by_key(|&(k, _)| k);
    out
}

/// `Wᵀ softmax(W·e)` for every row e of `emb`, in f64: (n, D).
fn expected_head_rows<T: Real>(emb: ArrayView2<'_, T>, w: ArrayView2<'_, T>) -> Array2<f64> {
    const CHUNK: usize = 64;
    let (n, d) = emb.dim();
    let mut out = Array2::<f64>::zeros((n, d));
    out.axis_chunks_iter_mut(Axis(0), CHUNK)
        .into_par_iter()
        .enumerate()
        .for_each(|(c, mut block)| {
            let rows = block.nrows();
            let e = emb.slice(s![c * CHUNK..c * CHUNK + rows, ..]);
            let mut logits = Array2::<T>::zeros((rows, w.nrows()));
            T::gemm(T::one(), e, w.t(), T::zero(), logits.view_mut());
            for (mut dst, z) in block.outer_iter_mut().zip(logits.outer_iter()) {
                let m = z.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b.to_f64()));
                let p: Vec<f64> = z.iter().map(|&x| (x.to_f64() - m).exp()).collect();
                let total: f64 = p.iter().sum();
                for (v, &pv) in p.iter().enumerate() {
                    let pv = pv / total;
                    for (o, &x) in dst.iter_mut().zip(w.row(v)) {
                        *o += pv * x.to_f64();
                    }
                }
            }
        });
    out
}

/// The interference score of every (language, token) pair seen at least
/// `min_count` times as a context, measured on a shared-only model (the
/// split rows, if any, are ignored: every language reads the shared row).
/// Sorted by decreasing score, ties by (language, token).
///
/// ```
/// use splitgrad::{Rng, app::model::{BigramModel, ModelConfig}, app::corpus::Corpus};
/// use splitgrad::app::select::interference;
/// let cfg = ModelConfig { vocab_size: 4, n_languages: 2, dim: 3, gate_init: 0.0 };
/// let mut model = BigramModel::<f64>::shared_only(cfg)?;
/// model.reset_parameters(&mut Rng::new(0))?;
/// let corpus = Corpus::new(vec![0, 1, 0, 2, 0, 1], vec![0, 0, 0, 0, 1, 1]);
/// let scores = interference(&model, &corpus, 1)?;
/// assert_eq!(scores.len(), 4); // (0,0), (0,1), (0,2), (1,0) as contexts
/// assert!(scores.windows(2).all(|w| w[0].score >= w[1].score));
/// # Ok::<(), splitgrad::Error>(())
/// ```
pub fn interference<T: Real>(
    model: &BigramModel<T>,
    corpus: &Corpus,
    min_count: usize,
) -> Result<Vec<PairScore>> {
    let cfg = model.config();
    corpus.validate(cfg.vocab_size, cfg.n_languages)?;
    let contexts = context_counts(corpus, min_count);
    if contexts.is_empty() {
        return Err(Error::new(crate::ErrorKind::Empty).in_array(format!(
            "token_ids (no context seen at least {} times)",
            min_count.max(1)
        )));
    }
    let table = model.table();
    let head = model.head_weight();
    let w = head.view();
    let mut tokens: Vec<usize> = contexts.iter().map(|&((_, t), _)| t).collect();
    tokens.sort_unstable();
    tokens.dedup();
    let emb = table.select(Axis(0), &tokens);
    let expected = expected_head_rows(emb.view(), w);
    let mut scores: Vec<PairScore> = contexts
        .par_iter()
        .map(|&((l, t), ref next)| {
            let n: usize = next.iter().map(|&(_, c)| c).sum();
            let k = tokens.binary_search(&t).expect("present");
            let mut g = expected.row(k).to_owned();
            for &(j, c) in next {
                let f = c as f64 / n as f64;
                for (o, &x) in g.iter_mut().zip(w.row(j)) {
                    *o -= f * x.to_f64();
                }
            }
            PairScore {
                language: l,
                token: t,
                count: n,
                score: g.iter().map(|x| x * x).sum::<f64>().sqrt(),
            }
        })
        .collect();
    scores.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then((a.language, a.token).cmp(&(b.language, b.token)))
    });
    Ok(scores)
}

/// How many pairs to keep.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Selection {
    /// The `k` highest scores.
    Top(usize),
    /// Every pair scoring at least this.
    Threshold(f64),
    /// Every pair scoring at least this fraction of the highest score.
    Relative(f64),
}

impl std::fmt::Display for Selection {
    /// `the 80 highest scores`, `every score ≥ 0.3`, `every score ≥ 0.6 of the highest`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Selection::Top(k) => write!(f, "the {k} highest scores"),
            Selection::Threshold(x) => write!(f, "every score ≥ {x}"),
            Selection::Relative(r) => write!(f, "every score ≥ {r} of the highest"),
        }
    }
}

/// The index of the selected pairs, with their scores, in decreasing score
/// order. `scores` must be sorted as [`interference`] returns them.
///
/// ```
/// use splitgrad::app::select::{PairScore, Selection, select};
/// let s = |l, t, score| PairScore { language: l, token: t, count: 5, score };
/// let scores = [s(0, 3, 2.0), s(1, 3, 1.5), s(1, 4, 0.1)];
/// let index = select(&scores, Selection::Relative(0.5))?;
/// assert_eq!(index.token_index, vec![3, 3]);
/// assert_eq!(index.score, Some(vec![2.0, 1.5]));
/// # Ok::<(), splitgrad::Error>(())
/// ```
pub fn select(scores: &[PairScore], how: Selection) -> Result<SplitIndex> {
    let keep: Vec<&PairScore> = match how {
        Selection::Top(k) => scores.iter().take(k).collect(),
        Selection::Threshold(x) => scores.iter().filter(|p| p.score >= x).collect(),
        Selection::Relative(f) => {
            let top = scores.first().map_or(0.0, |p| p.score);
            scores.iter().filter(|p| p.score >= f * top).collect()
        }
    };
    if keep.is_empty() {
        return Err(Error::new(crate::ErrorKind::Empty)
            .in_array(format!("selected pairs ({how:?} keeps none)")));
    }
    let mut index = SplitIndex::new(
        keep.iter().map(|p| p.language).collect(),
        keep.iter().map(|p| p.token).collect(),
    );
    index.score = Some(keep.iter().map(|p| p.score).collect());
    Ok(index)
}

/// The name of the shared table in a checkpoint.
const TABLE: &str = "token_embedding.vocab.weight";
/// The shared-only model's head, as its state dict names it.
const HEAD: &str = "lm_head.vocab.weight";

/// The shared-only model of a checkpoint (of `train` or of an earlier
/// `select`) for the corpus of `data`: its shared table, of any width, and
/// its head.
pub fn shared_from_checkpoint(path: &Path, data: &Data) -> Result<BigramModel<f32>> {
    // Only the table and the head are read, once their header agrees with
    // the corpus and their size with the memory.
    let ck = Checkpoint::open(path)?;
    let shape = ck.shape(TABLE).ok().map(<[usize]>::to_vec);
    let dim = match shape.as_deref() {
        Some(&[v, d]) if v == data.vocab_size => d,
        _ => {
            return Err(Error::config(format!(
                "{}: `{TABLE}` has shape {}, the corpus needs ({}, D)",
                path.display(),
                shape.map_or("(missing)".to_string(), |s| format!("{s:?}")),
                data.vocab_size
            )));
        }
    };
    let table_dtype = ck.dtype(TABLE)?;
    if ck.shape(HEAD)? != [data.vocab_size, dim] || ck.dtype(HEAD)? != table_dtype {
        return Err(ck.error(
            HEAD,
            crate::ErrorKind::Format {
                message: format!(
                    "is {} {:?}, where the table `{TABLE}` is {table_dtype} {:?}: a model's head is its table's shape and dtype",
                    ck.dtype(HEAD)?,
                    ck.shape(HEAD)?,
                    [data.vocab_size, dim]
                ),
            },
        ));
    }
    data.plan(dim, 0, 0).check("")?;
    let mut state = crate::state::StateDict::from_file(path);
    for name in [TABLE, HEAD] {
        state.insert(name, ck.get(name)?);
    }
    let snap = Snapshot {
        state,
        metadata: ck.metadata().clone(),
    };
    let config = ModelConfig::new(data.vocab_size, data.n_languages, dim);
    let mut model = BigramModel::<f32>::shared_only(config)?;
    // A model trained in half precision is read as it was kept.
    let kept = |name: &str| {
        let d = Dtype::from_safetensors(snap.state.get(name)?.dtype())?;
        d.is_half().then_some(d)
    };
    if let Some(d) = kept(TABLE) {
        model.embeddings.set_dtype(d)?;
    }
    if let Some(d) = kept(HEAD) {
        model.head.set_dtype(d)?;
    }
    snap.restore(&mut [&mut model.embeddings, &mut model.head], None)?;
    Ok(model)
}

/// Writes the shared-only model's table and head under their state-dict
/// names, so that [`shared_from_checkpoint`] can score again without
/// training.
pub fn save_shared(model: &BigramModel<f32>, path: &Path) -> Result<()> {
    let cfg = model.config();
    let meta: BTreeMap<String, String> = [
        ("format", "splitgrad-shared-1".to_string()),
        ("vocab_size", cfg.vocab_size.to_string()),
        ("n_languages", cfg.n_languages.to_string()),
        ("dim", cfg.dim.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    save_state(path, &[&model.embeddings, &model.head], None, &[], &meta)
}

/// How the pairs of `index` agree with the planted ones (`truth`, sorted),
/// over the pairs scored.
pub fn planted_agreement(
    scores: &[PairScore],
    index: &SplitIndex,
    truth: &[(usize, usize)],
) -> Agreement {
    let selected: HashSet<(usize, usize)> = index
        .language_index
        .iter()
        .copied()
        .zip(index.token_index.iter().copied())
        .collect();
    let chosen: Vec<bool> = scores
        .iter()
        .map(|p| selected.contains(&(p.language, p.token)))
        .collect();
    let planted: Vec<bool> = scores
        .iter()
        .map(|p| truth.binary_search(&(p.language, p.token)).is_ok())
        .collect();
    agreement(&chosen, &planted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::model::ModelConfig;
    use crate::app::synthetic::{SyntheticConfig, generate};
    use crate::state::Module;

    /// The score is the norm of the mean gradient of the pair's
    /// occurrences with respect to the shared row, as the tape computes it.
    #[test]
    fn score_is_the_mean_gradient_norm_of_the_shared_row() {
        use crate::Tape;
        let cfg = ModelConfig::new(6, 2, 3);
        let mut model = BigramModel::<f64>::shared_only(cfg).unwrap();
        model.reset_parameters(&mut crate::Rng::new(3)).unwrap();
        let corpus = Corpus::new(vec![2, 5, 2, 1, 2, 5, 2, 0], vec![1, 1, 1, 1, 1, 1, 0, 0]);
        let scores = interference(&model, &corpus, 1).unwrap();
        let s = scores
            .iter()
            .find(|p| (p.language, p.token) == (1, 2))
            .unwrap();
        assert_eq!(s.count, 3);
        // Tape: mean CE over the three bigrams of (1, 2): next 5, 1, 5.
        let mut tape = Tape::new();
        let ids = ndarray::arr1(&[2i64]).into_dyn();
        let shared = model.embeddings.forward(&mut tape, ids.view()).unwrap();
        let ce = model
            .head
            .forward_grouped(&mut tape, shared, &[0, 0, 0], &[5, 1, 5])
            .unwrap();
        let loss = tape.mean(ce);
        let grads = tape.backward(loss);
        let g = grads
            .param(model.embeddings.parameters()[0])
            .unwrap()
            .to_dense();
        let norm = g
            .index_axis(Axis(0), 2)
            .iter()
            .map(|x| x * x)
            .sum::<f64>()
            .sqrt();
        assert!((norm - s.score).abs() < 1e-12, "{norm} vs {}", s.score);
    }

    #[test]
    fn scores_are_finite_sorted_and_respect_min_count() {
        let s = generate(&SyntheticConfig {
            n_sequences: 64,
            sequence_len: 64,
            n_contested: 4,
            ..SyntheticConfig::default()
        });
        let cfg = ModelConfig::new(500, 4, 8);
        let mut model = BigramModel::<f32>::shared_only(cfg).unwrap();
        model.reset_parameters(&mut crate::Rng::new(0)).unwrap();
        let scores = interference(&model, &s.corpus, 2).unwrap();
        assert!(scores.iter().all(|p| p.score.is_finite() && p.count >= 2));
        assert!(scores.windows(2).all(|w| w[0].score >= w[1].score));
        assert!(select(&scores, Selection::Threshold(f64::INFINITY)).is_err());
    }
}
