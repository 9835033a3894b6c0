//! The data a run trains and is evaluated on: a corpus split into a
//! training part and a held-out part, and an index, from files or from the
//! built-in synthetic generator.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rayon::prelude::*;

use crate::Rng;
use crate::app::corpus::{Corpus, inspect_corpus, load_corpus};
use crate::app::eval::split_heldout;
use crate::app::model::{BigramModel, ModelConfig};
use crate::app::plan::{CorpusSize, Plan};
use crate::app::synthetic::{SyntheticConfig, generate};
use crate::app::train::{RunLabels, TrainConfig, Trainer};
use crate::error::{Error, Result};
use crate::io::{SplitIndex, load_index};

/// Where a run's data come from (the options of `splitgrad train` that
/// name them). Errors about them name those options.
#[derive(Clone, Debug, PartialEq)]
pub struct DataSource {
    /// A corpus `.npz`; `None` for the built-in synthetic corpus.
    pub corpus: Option<PathBuf>,
    /// An index `.npz`; `None` for every pair seen `min_count` times.
    pub index: Option<PathBuf>,
    /// Pairs seen at least this often in the training part get a row when
    /// there is no index.
    pub min_count: usize,
    /// The fraction of the corpus's sequences held out (without `heldout`).
    pub heldout_fraction: f64,
    /// A held-out corpus, instead of a fraction of `corpus`.
    pub heldout: Option<PathBuf>,
    /// The seed of the synthetic corpus and of the held-out choice.
    pub seed: u64,
}

impl Default for DataSource {
    /// The synthetic corpus, every pair seen 20 times a row, a tenth held
    /// out, seed 0.
    fn default() -> Self {
        DataSource {
            corpus: None,
            index: None,
            min_count: 20,
            heldout_fraction: 0.1,
            heldout: None,
            seed: 0,
        }
    }
}

/// A corpus, its index and, for the synthetic corpus, the planted truth.
pub struct Data {
    /// The run's name: `synthetic`, or the corpus file's stem.
    pub name: String,
    /// The part trained on.
    pub corpus: Arc<Corpus>,
    /// The part evaluated on (never trained on, never used to choose pairs).
    pub heldout: Corpus,
    /// How the held-out part was made, for the report.
    pub heldout_source: String,
    /// The split rows: the index given, the synthetic corpus's, or every
    /// pair seen often enough in the training part.
    pub index: SplitIndex,
    /// V.
    pub vocab_size: usize,
    /// L.
    pub n_languages: usize,
    /// Where V came from, for errors about the sizes it implies.
    pub vocab_source: String,
    /// … and L.
    pub languages_source: String,
    /// The planted contested pairs, sorted (synthetic corpus only).
    pub truth: Option<Vec<(usize, usize)>>,
}

impl DataSource {
    /// `corpus` (`None`: the synthetic one) with the seed `seed`, every
    /// pair seen `min_count` times a row, the rest by default.
    pub fn of_corpus(corpus: Option<PathBuf>, min_count: usize, seed: u64) -> Self {
        DataSource {
            corpus,
            min_count,
            seed,
            ..DataSource::default()
        }
    }
}

/// A corpus file that must hold a bigram: `what` names what it is for.
fn load_with_bigrams(path: &Path, what: &str) -> Result<Corpus> {
    let corpus = load_corpus(path)?;
    if corpus.n_bigrams() == 0 {
        return Err(Error::config(format!(
            "{}: no bigram to {what}: every sequence holds a single token",
            path.display()
        )));
    }
    Ok(corpus)
}

impl Data {
    /// What a run on this data is about, for its reports, with `index` the
    /// model's: the corpus's name and labels, and which rows are planted.
    pub fn labels(&self, index: &SplitIndex) -> RunLabels {
        RunLabels {
            corpus: self.name.clone(),
            language_names: self.corpus.meta.language_names.clone(),
            token_strings: self.corpus.meta.token_strings.clone(),
            planted: self.truth.as_ref().map(|truth| {
                (0..index.token_index.len())
                    .map(|i| {
                        truth
                            .binary_search(&(index.language_index[i], index.token_index[i]))
                            .is_ok()
                    })
                    .collect()
            }),
        }
    }

    /// A trainer at step 0 on the training part, of a model of width `dim`
    /// with the split rows of `index` (`None`: the shared-only model), its
    /// weights drawn from the seed of `train`.
    pub fn trainer(
        &self,
        index: Option<&SplitIndex>,
        dim: usize,
        train: TrainConfig,
    ) -> Result<Trainer<f32>> {
        let config = ModelConfig::new(self.vocab_size, self.n_languages, dim);
        let mut model = match index {
            Some(index) => BigramModel::new(config, index.clone())?,
            None => BigramModel::shared_only(config)?,
        };
        model.reset_parameters(&mut Rng::new(train.seed))?;
        Trainer::new(model, Arc::clone(&self.corpus), train)
    }

    /// The training and held-out parts as they are held.
    pub fn corpus_size(&self) -> CorpusSize {
        let parts = [&*self.corpus, &self.heldout];
        CorpusSize {
            tokens: parts.iter().map(|c| c.len() as u64).sum(),
            sequences: parts.iter().map(|c| c.n_sequences() as u64).sum(),
            bytes_per_token: parts
                .iter()
                .map(|c| (c.token_ids.width().bytes() + c.language_ids.width().bytes()) as u64)
                .max()
                .unwrap_or(0),
            heldout_fraction: 0.0,
        }
    }

    /// The memory plan of a model of width `dim` with `n_rows` split rows
    /// trained `batch` bigrams a step on this data.
    pub fn plan(&self, dim: usize, n_rows: usize, batch: usize) -> Plan {
        Plan {
            vocab_size: self.vocab_size,
            vocab_source: self.vocab_source.clone(),
            n_languages: self.n_languages,
            languages_source: self.languages_source.clone(),
            dim,
            n_rows,
            batch,
            corpus: self.corpus_size(),
            real_bytes: 4,
            action: "training",
            ..Plan::default()
        }
    }
}

/// Where a corpus's V or L came from: stated in the file, or its largest
/// id + 1.
fn source_of(path: &Path, stated: bool, ids: &str) -> String {
    if stated {
        format!("stated by {}", path.display())
    } else {
        format!("the largest {ids} of {} + 1", path.display())
    }
}

/// Every (language, token) pair seen at least `min_count` times as a
/// context, in (language, token) order.
pub fn index_from_counts(corpus: &Corpus, min_count: usize) -> SplitIndex {
    counted_index(corpus, min_count, DENSE_COUNTS)
}

/// [`index_from_counts`], counting in a table when there are at most
/// `dense_cells` cells.
fn counted_index(corpus: &Corpus, min_count: usize, dense_cells: usize) -> SplitIndex {
    let (v, l) = (corpus.vocab_size(), corpus.n_languages());
    let min_count = min_count.max(1) as u64;
    let pairs: Vec<(usize, usize)> = match v.checked_mul(l).filter(|&c| c <= dense_cells) {
        // A count per (language, token) cell: one pass, no hashing.
        Some(cells) => {
            let count = |counts: &mut Vec<u64>, seqs: &[usize]| {
                for &k in seqs {
                    // Every token of the sequence but its last is a context.
                    let r = corpus.sequence_range(k);
                    let contexts = r.start..r.end - 1;
                    count_pairs(corpus, contexts, v, counts);
                }
            };
            let seqs: Vec<usize> = (0..corpus.n_sequences()).collect();
            // Threads count apart when their tables are small (counts are
            // integers: the sum is the same in any order).
            let counts = if cells <= 1 << 20 {
                seqs.par_chunks(256)
                    .fold(
                        || vec![0u64; cells],
                        |mut c, chunk| {
                            count(&mut c, chunk);
                            c
                        },
                    )
                    .reduce_with(|mut a, b| {
                        a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
                        a
                    })
                    .unwrap_or_else(|| vec![0u64; cells])
            } else {
                let mut c = vec![0u64; cells];
                count(&mut c, &seqs);
                c
            };
            counts
                .iter()
                .enumerate()
                .filter(|&(_, &c)| c >= min_count)
                .map(|(cell, _)| (cell / v, cell % v))
                .collect()
        }
        None => {
            let mut counts: BTreeMap<(usize, usize), u64> = BTreeMap::new();
            for (i, _) in corpus.bigrams() {
                *counts
                    .entry((
                        corpus.language_ids.get(i) as usize,
                        corpus.token_ids.get(i) as usize,
                    ))
                    .or_default() += 1;
            }
            counts
                .into_iter()
                .filter(|&(_, c)| c >= min_count)
                .map(|(p, _)| p)
                .collect()
        }
    };
    SplitIndex::new(
        pairs.iter().map(|p| p.0).collect(),
        pairs.iter().map(|p| p.1).collect(),
    )
}

/// Adds one to `counts[language · v + token]` for each position of
/// `range`, with the loop specialised to the columns' widths.
fn count_pairs(corpus: &Corpus, range: std::ops::Range<usize>, v: usize, counts: &mut [u64]) {
    fn run<T: Copy + Into<u32>, L: Copy + Into<u32>>(
        tokens: &[T],
        languages: &[L],
        v: usize,
        counts: &mut [u64],
    ) {
        for (&t, &l) in tokens.iter().zip(languages) {
            counts[l.into() as usize * v + t.into() as usize] += 1;
        }
    }
    let (t, l) = (&corpus.token_ids, &corpus.language_ids);
    macro_rules! with_languages {
        ($tokens:expr) => {{
            let tokens = &$tokens[range.clone()];
            if let Some(ls) = l.as_u8() {
                run(tokens, &ls[range], v, counts)
            } else if let Some(ls) = l.as_u16() {
                run(tokens, &ls[range], v, counts)
            } else {
                run(tokens, &l.as_u32().unwrap_or_default()[range], v, counts)
            }
        }};
    }
    if let Some(ts) = t.as_u8() {
        with_languages!(ts)
    } else if let Some(ts) = t.as_u16() {
        with_languages!(ts)
    } else {
        with_languages!(t.as_u32().unwrap_or_default())
    }
}

/// Above this many (language, token) cells, [`index_from_counts`] counts
/// the pairs seen in a map rather than in a table of every cell (8 bytes
/// a cell: 128 MiB at most).
const DENSE_COUNTS: usize = 1 << 24;

/// The training and held-out parts of `corpus`: a fraction of its
/// sequences (seeded), or a held-out corpus file.
fn heldout_of(corpus: Corpus, args: &DataSource) -> Result<(Corpus, Corpus, String)> {
    if let Some(path) = &args.heldout {
        let heldout = load_with_bigrams(path, "evaluate on")?;
        if let Some(train_path) = &args.corpus {
            check_agree(train_path, &corpus, path, &heldout)?;
        }
        return Ok((corpus, heldout, path.display().to_string()));
    }
    let f = args.heldout_fraction;
    if !(f > 0.0 && f < 1.0) {
        return Err(Error::config(format!(
            "--heldout-fraction must be in (0, 1), got {f}"
        )));
    }
    let n_sequences = corpus.n_sequences();
    let (train, heldout) = split_heldout(corpus, f, args.seed)?;
    let how = format!(
        "{} of {n_sequences} sequences ({f} of the corpus, seed {})",
        heldout.n_sequences(),
        args.seed
    );
    Ok((train, heldout, how))
}

/// A held-out corpus file must come from the training corpus's
/// tokenizer: its stated `vocab_size`, `n_languages`, `language_names`
/// and `tokenizer_hash` must equal the training corpus's (a value stated
/// by only one of them is not compared). The error is one line naming
/// both files and the first field that differs.
pub fn check_agree(
    train_path: &Path,
    train: &Corpus,
    heldout_path: &Path,
    heldout: &Corpus,
) -> Result<()> {
    let (a, b) = (&train.meta, &heldout.meta);
    let differs = |field: &str, x: String, y: String| {
        Err(Error::config(format!(
            "the held-out corpus {} does not agree with the training corpus {}: {field} {y} there, {x} here",
            heldout_path.display(),
            train_path.display()
        )))
    };
    if let (Some(x), Some(y)) = (a.vocab_size, b.vocab_size)
        && x != y
    {
        return differs("vocab_size", x.to_string(), y.to_string());
    }
    if let (Some(x), Some(y)) = (a.n_languages, b.n_languages)
        && x != y
    {
        return differs("n_languages", x.to_string(), y.to_string());
    }
    if let (Some(x), Some(y)) = (&a.language_names, &b.language_names)
        && x != y
    {
        return differs("language_names", format!("{x:?}"), format!("{y:?}"));
    }
    if let (Some(x), Some(y)) = (&a.tokenizer_hash, &b.tokenizer_hash)
        && x != y
    {
        return differs("tokenizer_hash", format!("{x:?}"), format!("{y:?}"));
    }
    Ok(())
}

/// Loads (or generates) the corpus, holds out its evaluation part, and
/// loads the index (or makes one from the training part's counts).
pub fn load(args: &DataSource) -> Result<Data> {
    load_planned(args, &|_| Ok(()))
}

/// As [`load`], with `plan` shown, before any id of a corpus file is
/// read, a [`Plan`] holding what its headers say ([`inspect_corpus`]):
/// the corpus's size with the held-out part that will be copied out of it,
/// and V and L where the file states them (0 where it does not). The
/// caller adds the model's sizes and checks it; an error stops the load
/// before the corpus takes any memory.
pub fn load_planned(args: &DataSource, plan: &dyn Fn(Plan) -> Result<()>) -> Result<Data> {
    let (name, corpus, truth, index, v, l, sources) = match &args.corpus {
        None => {
            let cfg = SyntheticConfig {
                seed: args.seed,
                ..SyntheticConfig::default()
            };
            let s = generate(&cfg);
            let (v, l) = (cfg.vocab_size, cfg.n_languages);
            // An index given for the synthetic corpus (e.g. from `select`).
            let index = match &args.index {
                Some(p) => Some(load_index(p, l, v)?),
                None => Some(s.index),
            };
            (
                "synthetic".to_string(),
                s.corpus,
                Some(s.contested),
                index,
                v,
                l,
                (
                    "the synthetic corpus".to_string(),
                    "the synthetic corpus".to_string(),
                ),
            )
        }
        Some(path) => {
            let shape = inspect_corpus(path)?;
            let unread = |stated: Option<usize>| match stated {
                Some(_) => format!("stated by {}", path.display()),
                None => format!("not stated by {}: 0 until its ids are read", path.display()),
            };
            plan(Plan {
                vocab_size: shape.vocab_size.unwrap_or(0),
                vocab_source: unread(shape.vocab_size),
                n_languages: shape.n_languages.unwrap_or(0),
                languages_source: unread(shape.n_languages),
                corpus: CorpusSize {
                    tokens: shape.tokens,
                    sequences: shape.sequences,
                    bytes_per_token: shape.bytes_per_token,
                    heldout_fraction: if args.heldout.is_some() {
                        0.0
                    } else {
                        args.heldout_fraction
                    },
                },
                real_bytes: 4,
                action: "training",
                ..Plan::default()
            })?;
            let corpus = load_with_bigrams(path, "train on")?;
            // V and L as the corpus states them, or its largest ids + 1.
            let (v, l) = (corpus.vocab_size(), corpus.n_languages());
            if l < 2 {
                return Err(Error::config(format!(
                    "{}: a single language: nothing can be split (a split row is a (language, token) pair's own row, so a corpus needs two or more languages)",
                    path.display()
                )));
            }
            let index = match &args.index {
                Some(ip) => Some(load_index(ip, l, v)?),
                None => None,
            };
            let name = path
                .file_stem()
                .map_or("corpus".into(), |s| s.to_string_lossy().into_owned());
            let sources = (
                source_of(path, corpus.meta.vocab_size.is_some(), "token id"),
                source_of(path, corpus.meta.n_languages.is_some(), "language id"),
            );
            (name, corpus, None, index, v, l, sources)
        }
    };
    let (train, heldout, heldout_source) = heldout_of(corpus, args)?;
    heldout.validate(v, l).map_err(|e| {
        Error::config(format!(
            "the held-out corpus does not fit the training corpus: {e}"
        ))
    })?;
    let index = match index {
        Some(i) => i,
        None => {
            let idx = index_from_counts(&train, args.min_count);
            if idx.token_index.is_empty() {
                return Err(Error::config(format!(
                    "{}: no (language, token) pair occurs {} times in the training part; lower --min-count",
                    args.corpus
                        .as_deref()
                        .unwrap_or(Path::new("the corpus"))
                        .display(),
                    args.min_count
                )));
            }
            idx
        }
    };
    Ok(Data {
        name,
        corpus: Arc::new(train),
        heldout,
        heldout_source,
        index,
        vocab_size: v,
        n_languages: l,
        vocab_source: sources.0,
        languages_source: sources.1,
        truth,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counting_in_a_table_and_in_a_map_agree() {
        let mut rng = Rng::new(11);
        for case in 0..20 {
            let n = 200 + rng.below(2000) as usize;
            let v = 2 + rng.below(if case % 2 == 0 { 40 } else { 70_000 }) as u32;
            let tokens: Vec<u32> = (0..n)
                .map(|_| rng.below(u64::from(v)) as u32 % 37)
                .collect();
            let langs: Vec<u32> = (0..n).map(|_| rng.below(3) as u32).collect();
            let mut c = Corpus::new(tokens, langs);
            c.sequence_starts = (0..n).step_by(17).collect();
            for min_count in [1, 2, 5] {
                let table = counted_index(&c, min_count, usize::MAX);
                let map = counted_index(&c, min_count, 0);
                assert_eq!(table.language_index, map.language_index, "case {case}");
                assert_eq!(table.token_index, map.token_index, "case {case}");
                assert!(!table.token_index.is_empty() || min_count > 1);
            }
        }
    }
}
