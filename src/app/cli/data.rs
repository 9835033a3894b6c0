//! The data a run trains on: a corpus and an index, from files or from the
//! built-in synthetic generator.

use std::collections::BTreeMap;

use crate::app::corpus::{Corpus, load_corpus};
use crate::app::synthetic::{SyntheticConfig, generate};
use crate::io::{SplitIndex, load_index};

use super::{CliResult, TrainArgs};

/// A corpus, its index and, for the synthetic corpus, the planted truth.
pub struct Data {
    pub name: String,
    pub corpus: Corpus,
    pub index: SplitIndex,
    pub vocab_size: usize,
    pub n_languages: usize,
    /// The planted contested pairs, sorted (synthetic corpus only).
    pub truth: Option<Vec<(usize, usize)>>,
}

/// Every (language, token) pair seen at least `min_count` times as a
/// context, in (language, token) order.
pub fn index_from_counts(corpus: &Corpus, vocab_size: usize, min_count: usize) -> SplitIndex {
    let mut counts: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    for (i, _) in corpus.bigrams() {
        *counts
            .entry((
                corpus.language_ids[i] as usize,
                corpus.token_ids[i] as usize,
            ))
            .or_default() += 1;
    }
    let _ = vocab_size;
    let pairs: Vec<(usize, usize)> = counts
        .into_iter()
        .filter(|&(_, c)| c >= min_count.max(1))
        .map(|(p, _)| p)
        .collect();
    SplitIndex::new(
        pairs.iter().map(|p| p.0).collect(),
        pairs.iter().map(|p| p.1).collect(),
    )
}

/// Loads (or generates) the corpus and the index of a run.
pub fn load(args: &TrainArgs) -> CliResult<Data> {
    match &args.corpus {
        None => {
            if let Some(index_path) = &args.index {
                // An index for the synthetic corpus (e.g. from `select`).
                let s = generate(&SyntheticConfig {
                    seed: args.seed,
                    ..SyntheticConfig::default()
                });
                let (v, l) = (
                    s.corpus
                        .vocab_size()
                        .max(SyntheticConfig::default().vocab_size),
                    SyntheticConfig::default().n_languages,
                );
                let index = load_index(index_path, l, v)?;
                return Ok(Data {
                    name: "synthetic".into(),
                    corpus: s.corpus,
                    index,
                    vocab_size: v,
                    n_languages: l,
                    truth: Some(s.contested),
                });
            }
            let cfg = SyntheticConfig {
                seed: args.seed,
                ..SyntheticConfig::default()
            };
            let s = generate(&cfg);
            Ok(Data {
                name: "synthetic".into(),
                corpus: s.corpus,
                index: s.index,
                vocab_size: cfg.vocab_size,
                n_languages: cfg.n_languages,
                truth: Some(s.contested),
            })
        }
        Some(path) => {
            let corpus = load_corpus(path)?;
            if corpus.n_bigrams() == 0 {
                return Err(format!(
                    "{}: no bigram to train on: every sequence holds a single token",
                    path.display()
                )
                .into());
            }
            let (v, l) = (corpus.vocab_size(), corpus.n_languages());
            let index = match &args.index {
                Some(ip) => {
                    // V and L are the corpus's (largest id + 1): a pair whose
                    // token or language never occurs could not learn anything,
                    // so the index is checked against them (`docs/spec.md#23-splitvocabulary` errors).
                    load_index(ip, l, v)?
                }
                None => {
                    let idx = index_from_counts(&corpus, v, args.min_count);
                    if idx.token_index.is_empty() {
                        return Err(format!(
                            "{}: no (language, token) pair occurs {} times; lower --min-count",
                            path.display(),
                            args.min_count
                        )
                        .into());
                    }
                    idx
                }
            };
            let name = path
                .file_stem()
                .map_or("corpus".into(), |s| s.to_string_lossy().into_owned());
            Ok(Data {
                name,
                corpus,
                index,
                vocab_size: v,
                n_languages: l,
                truth: None,
            })
        }
    }
}
