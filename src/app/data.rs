//! The data a run trains and is evaluated on: a corpus split into a
//! training part and a held-out part, and an index, from files or from the
//! built-in synthetic generator.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::Rng;
use crate::app::corpus::{Corpus, load_corpus};
use crate::app::eval::split_heldout;
use crate::app::model::{BigramModel, ModelConfig};
use crate::app::plan::Plan;
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
    pub corpus: Corpus,
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
        Trainer::new(model, self.corpus.clone(), train)
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
            n_bigrams: self.corpus.n_bigrams(),
            real_bytes: 4,
            action: "training",
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
    let mut counts: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    for (i, _) in corpus.bigrams() {
        *counts
            .entry((
                corpus.language_ids[i] as usize,
                corpus.token_ids[i] as usize,
            ))
            .or_default() += 1;
    }
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
    let (train, heldout) = split_heldout(&corpus, f, args.seed)?;
    let how = format!(
        "{} of {} sequences ({f} of the corpus, seed {})",
        heldout.n_sequences(),
        corpus.n_sequences(),
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
        corpus: train,
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
