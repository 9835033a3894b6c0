//! The built-in synthetic multilingual corpus: a seeded bigram source in
//! which a known set of (language, token) pairs has a next-token
//! distribution of its own while every other pair follows the shared one.
//!
//! How it is made ([`SyntheticConfig`] holds the numbers):
//!
//! 1. **Shared transitions.** Every token t gets `successors` distinct
//!    next tokens, drawn uniformly, with probabilities ∝ `1/(k + 1)` for the
//!    k-th of them: `P(next | t)`.
//! 2. **Contested pairs.** `n_contested` (language, token) pairs, drawn
//!    uniformly among all pairs, each get their own `successors` next tokens,
//!    disjoint from the shared ones of that token: `P_l(next | t)`. These
//!    are the planted truth: the pairs that need a row of their own.
//! 3. **Sequences.** Each sequence has one language, drawn uniformly, a
//!    first token drawn uniformly, and `sequence_len` tokens, each drawn from
//!    `P_l(· | previous)` where (l, previous) is contested and from
//!    `P(· | previous)` otherwise.
//! 4. **Index.** The contested pairs and as many uncontested **decoys**,
//!    drawn among the pairs that occur in the corpus at least as often as
//!    the rarest contested pair, so a decoy has as much data as a true pair
//!    and can only be told apart by what follows it.
//!
//! The same config and seed give the same corpus on every platform.

use std::collections::HashSet;

use crate::Rng;
use crate::app::corpus::{Corpus, CorpusMeta};
use crate::io::SplitIndex;

/// The numbers of the synthetic corpus.
#[derive(Clone, Debug, PartialEq)]
pub struct SyntheticConfig {
    /// V.
    pub vocab_size: usize,
    /// L.
    pub n_languages: usize,
    /// Sequences in the corpus.
    pub n_sequences: usize,
    /// Tokens per sequence.
    pub sequence_len: usize,
    /// Next tokens a context can have.
    pub successors: usize,
    /// Planted (language, token) pairs with a distribution of their own.
    pub n_contested: usize,
    /// Seed.
    pub seed: u64,
}

impl Default for SyntheticConfig {
    /// V = 500, L = 4, 2048 sequences of 512 tokens (about a million
    /// tokens), 8 successors, 40 contested pairs.
    fn default() -> Self {
        SyntheticConfig {
            vocab_size: 500,
            n_languages: 4,
            n_sequences: 2048,
            sequence_len: 512,
            successors: 8,
            n_contested: 40,
            seed: 0,
        }
    }
}

/// A synthetic corpus with its planted truth.
#[derive(Clone, Debug)]
pub struct Synthetic {
    /// The corpus.
    pub corpus: Corpus,
    /// The planted contested pairs (language, token), sorted.
    pub contested: Vec<(usize, usize)>,
    /// The index to train with: the contested pairs and as many decoys,
    /// shuffled.
    pub index: SplitIndex,
}

/// A next-token distribution: successors and their cumulative probabilities.
#[derive(Clone, Debug)]
struct Successors {
    next: Vec<usize>,
    cdf: Vec<f64>,
}

impl Successors {
    fn draw(rng: &mut Rng, vocab: usize, k: usize, exclude: &[usize]) -> Self {
        let k = k.min(vocab.saturating_sub(exclude.len())).max(1);
        let mut next = Vec::with_capacity(k);
        while next.len() < k {
            let t = rng.below(vocab as u64) as usize;
            if !next.contains(&t) && (!exclude.contains(&t) || exclude.len() >= vocab) {
                next.push(t);
            }
        }
        let weights: Vec<f64> = (0..k).map(|i| 1.0 / (i + 1) as f64).collect();
        let total: f64 = weights.iter().sum();
        let mut acc = 0.0;
        let cdf = weights.iter().map(|w| {
            acc += w / total;
            acc
        });
        Successors {
            next,
            cdf: cdf.collect(),
        }
    }

    fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.uniform();
        let i = self
            .cdf
            .partition_point(|&c| c <= u)
            .min(self.next.len() - 1);
        self.next[i]
    }
}

/// Generates the corpus, its planted truth and its index.
///
/// **Panics** if the config is degenerate (V < 2, L = 0, no sequences,
/// sequences shorter than 2, or more contested pairs than L·V / 2).
///
/// ```
/// use splitgrad::app::synthetic::{generate, SyntheticConfig};
/// let cfg = SyntheticConfig { n_sequences: 64, sequence_len: 64, n_contested: 4, ..Default::default() };
/// let s = generate(&cfg);
/// assert_eq!(s.corpus.token_ids.len(), 64 * 64);
/// assert_eq!(s.contested.len(), 4);
/// assert_eq!(s.index.token_index.len(), 8); // 4 contested + 4 decoys
/// ```
#[track_caller]
pub fn generate(cfg: &SyntheticConfig) -> Synthetic {
    let (v, l) = (cfg.vocab_size, cfg.n_languages);
    assert!(
        v >= 2 && l >= 1 && cfg.n_sequences >= 1 && cfg.sequence_len >= 2,
        "synthetic: degenerate config {cfg:?}"
    );
    assert!(
        cfg.n_contested * 2 <= l * v,
        "synthetic: {} contested pairs do not fit L·V = {}",
        cfg.n_contested,
        l * v
    );
    let mut rng = Rng::new(cfg.seed);
    let shared: Vec<Successors> = (0..v)
        .map(|_| Successors::draw(&mut rng, v, cfg.successors, &[]))
        .collect();
    let mut contested_set = HashSet::new();
    while contested_set.len() < cfg.n_contested {
        let pair = (rng.below(l as u64) as usize, rng.below(v as u64) as usize);
        contested_set.insert(pair);
    }
    let mut contested: Vec<(usize, usize)> = contested_set.into_iter().collect();
    contested.sort_unstable();
    let private: Vec<Successors> = contested
        .iter()
        .map(|&(_, t)| Successors::draw(&mut rng, v, cfg.successors, &shared[t].next))
        .collect();
    let lookup = |lang: usize, tok: usize| contested.binary_search(&(lang, tok)).ok();

    let total = cfg.n_sequences * cfg.sequence_len;
    let mut token_ids = Vec::with_capacity(total);
    let mut language_ids = Vec::with_capacity(total);
    let mut sequence_starts = Vec::with_capacity(cfg.n_sequences);
    let mut counts = vec![0usize; l * v];
    for _ in 0..cfg.n_sequences {
        sequence_starts.push(token_ids.len());
        let lang = rng.below(l as u64) as usize;
        let mut tok = rng.below(v as u64) as usize;
        for i in 0..cfg.sequence_len {
            token_ids.push(tok as u32);
            language_ids.push(lang as u32);
            if i + 1 < cfg.sequence_len {
                counts[lang * v + tok] += 1;
            }
            tok = match lookup(lang, tok) {
                Some(k) => private[k].sample(&mut rng),
                None => shared[tok].sample(&mut rng),
            };
        }
    }

    // Decoys: uncontested pairs seen at least as often as the rarest
    // contested pair (as contexts), drawn uniformly.
    let floor = contested
        .iter()
        .map(|&(a, t)| counts[a * v + t])
        .min()
        .unwrap_or(1)
        .max(1);
    let mut candidates: Vec<(usize, usize)> = (0..l * v)
        .filter(|&c| counts[c] >= floor)
        .map(|c| (c / v, c % v))
        .filter(|p| lookup(p.0, p.1).is_none())
        .collect();
    rng.shuffle(&mut candidates);
    candidates.truncate(contested.len());
    let mut pairs: Vec<(usize, usize)> = contested.iter().copied().chain(candidates).collect();
    rng.shuffle(&mut pairs);
    let index = SplitIndex::new(
        pairs.iter().map(|p| p.0).collect(),
        pairs.iter().map(|p| p.1).collect(),
    );
    Synthetic {
        corpus: Corpus {
            token_ids: token_ids.into(),
            language_ids: language_ids.into(),
            sequence_starts,
            meta: CorpusMeta::default(),
        },
        contested,
        index,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default corpus but for its size and planted pairs.
    fn config(n_sequences: usize, sequence_len: usize, n_contested: usize) -> SyntheticConfig {
        SyntheticConfig {
            n_sequences,
            sequence_len,
            n_contested,
            ..Default::default()
        }
    }

    #[test]
    fn seeded_and_planted() {
        let cfg = config(200, 100, 10);
        let a = generate(&cfg);
        let b = generate(&cfg);
        assert_eq!(a.corpus.token_ids, b.corpus.token_ids);
        assert_eq!(a.contested, b.contested);
        let c = generate(&SyntheticConfig {
            seed: 1,
            ..cfg.clone()
        });
        assert_ne!(a.corpus.token_ids, c.corpus.token_ids);
        // Every contested pair is in the index, and the decoys are not contested.
        let pairs: Vec<(usize, usize)> = a
            .index
            .language_index
            .iter()
            .copied()
            .zip(a.index.token_index.iter().copied())
            .collect();
        assert_eq!(pairs.len(), 20);
        for p in &a.contested {
            assert!(pairs.contains(p));
        }
        let decoys = pairs.iter().filter(|p| !a.contested.contains(p)).count();
        assert_eq!(decoys, 10);
    }

    #[test]
    fn contested_successors_differ() {
        let cfg = config(400, 200, 5);
        let s = generate(&cfg);
        // After a contested (l, t), the next token is never one of the shared successors of t.
        let (toks, langs) = (&s.corpus.token_ids, &s.corpus.language_ids);
        let shared_next: HashSet<(usize, usize)> = (0..toks.len() - 1)
            .filter(|&i| {
                (i + 1) % cfg.sequence_len != 0
                    && !s
                        .contested
                        .contains(&(langs.get(i) as usize, toks.get(i) as usize))
            })
            .map(|i| (toks.get(i) as usize, toks.get(i + 1) as usize))
            .collect();
        for i in 0..toks.len() - 1 {
            if (i + 1) % cfg.sequence_len != 0
                && s.contested
                    .contains(&(langs.get(i) as usize, toks.get(i) as usize))
            {
                assert!(!shared_next.contains(&(toks.get(i) as usize, toks.get(i + 1) as usize)));
            }
        }
    }
}
