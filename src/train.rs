//! Training the bigram model: batches, optimiser steps, checkpoints that
//! resume exactly.
//!
//! A step draws `batch` bigrams uniformly (with replacement) from the
//! corpus with a generator that depends only on the seed and the step, so a
//! run resumed from a checkpoint draws the same batches as one that never
//! stopped. The shared table and the split rows (the tables) use
//! [`LazyAdam`]; the gate logits and the head use [`Adam`].

use std::collections::BTreeMap;
use std::path::Path;

use ndarray::{Array2, ArrayD};

use crate::checkpoint::{self, Checkpoint, TensorRef};
use crate::io::{Corpus, SplitIndex};
use crate::model::{Batch, BigramModel, ModelConfig};
use crate::optim::{Adam, AdamConfig, LazyAdam, LazyAdamConfig, Optimizer, StateValue};
use crate::{Error, ErrorKind, Real, Result, Rng, Tape};

/// What a training run does each step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainConfig {
    /// Steps to run in all (a resumed run stops at the same step).
    pub steps: u64,
    /// Bigrams per step.
    pub batch: usize,
    /// Learning rate of both optimisers.
    pub lr: f64,
    /// λ_g, the weight of `penalty()` (mean gate).
    pub gate_penalty: f64,
    /// λ_f, the weight of `fusion_penalty()`.
    pub fusion_penalty: f64,
    /// `false` for fusion mode (no gate).
    pub use_gate: bool,
    /// Seed of the batches.
    pub seed: u64,
}

/// The loss terms of one step (before the update).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepStats {
    /// The step (0-based).
    pub step: u64,
    /// ce + λ_g·penalty + λ_f·fusion.
    pub total: f64,
    /// Mean cross-entropy.
    pub ce: f64,
    /// mean(σ(gate_logit)), 0 in fusion mode.
    pub penalty: f64,
    /// The fusion penalty (computed even when its weight is 0).
    pub fusion: f64,
}

/// A model, its optimisers and where it is in its run.
pub struct Trainer<T: Real> {
    model: BigramModel<T>,
    /// Every bigram as (context token, language, next token), packed so
    /// that drawing one touches one cache line.
    bigrams: Vec<[u32; 3]>,
    /// [`corpus_fingerprint`] of the corpus, computed once.
    fingerprint: u64,
    config: TrainConfig,
    tables: LazyAdam<T>,
    dense: Adam<T>,
    step: u64,
    history: Vec<StepStats>,
}

/// A fingerprint of a corpus (FNV-1a over its arrays), kept in checkpoints
/// so that a run is never resumed on other data.
pub fn corpus_fingerprint(c: &Corpus) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |x: u64| {
        for b in x.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    eat(c.token_ids.len() as u64);
    c.token_ids.iter().for_each(|&t| eat(t as u64));
    c.language_ids.iter().for_each(|&l| eat(l as u64));
    c.sequence_starts.iter().for_each(|&s| eat(s as u64));
    h
}

const OPT_TABLES: &str = "optimizer.tables.";
const OPT_DENSE: &str = "optimizer.dense.";
const HISTORY: &str = "train.history";
/// The index's `score` (interference), saved when the index has one.
const SCORE: &str = "split_vocabulary.score";

/// A model read back from a checkpoint of [`Trainer::save`], for reports.
#[derive(Clone, Debug)]
pub struct SavedModel<T> {
    /// The model, its index (with `score` when saved) and weights.
    pub model: BigramModel<T>,
    /// The checkpoint's metadata (sizes, settings, step, corpus fingerprint).
    pub metadata: BTreeMap<String, String>,
    /// The loss terms of every step run.
    pub history: Vec<StepStats>,
}

fn meta_parse<V: std::str::FromStr>(
    meta: &BTreeMap<String, String>,
    key: &str,
    path: &Path,
) -> Result<V> {
    let raw = meta.get(key).ok_or_else(|| {
        Error::new(ErrorKind::Missing)
            .in_file(path)
            .in_array(format!("metadata `{key}`"))
    })?;
    raw.parse().map_err(|_| {
        Error::format(format!("metadata `{key}` = {raw:?} does not parse")).in_file(path)
    })
}

/// Reads the model of a checkpoint written by [`Trainer::save`] (no corpus
/// needed): sizes from the metadata, the index and every weight checked.
pub fn load_model<T: Real>(path: impl AsRef<Path>) -> Result<SavedModel<T>> {
    let path = path.as_ref();
    let ck = Checkpoint::open(path)?;
    let meta = ck.metadata().clone();
    let config = ModelConfig {
        vocab_size: meta_parse(&meta, "vocab_size", path)?,
        n_languages: meta_parse(&meta, "n_languages", path)?,
        dim: meta_parse(&meta, "dim", path)?,
        gate_init: meta_parse(&meta, "gate_init", path)?,
    };
    let n = ck
        .shape("split_vocabulary.token_index")?
        .first()
        .copied()
        .unwrap_or(0);
    let ids = |name: &str| -> Result<Vec<usize>> {
        ck.get_i64(name, &[n])?
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                usize::try_from(x).map_err(|_| {
                    Error::out_of_range("index entry", vec![i], x, 0, i64::MAX)
                        .in_file(path)
                        .in_array(name)
                })
            })
            .collect()
    };
    let mut index = SplitIndex::new(
        ids("split_vocabulary.language_index")?,
        ids("split_vocabulary.token_index")?,
    );
    if ck.names().contains(&SCORE) {
        index.score = Some(ck.get_real::<f64>(SCORE, &[n])?.iter().copied().collect());
    }
    let mut model = BigramModel::new(config, index).map_err(|e| e.in_file(path))?;
    for p in model.parameters_mut() {
        let v = ck.get_real::<T>(p.name(), p.value().shape())?;
        crate::io::check_finite(v.view(), p.name()).map_err(|e| e.in_file(path))?;
        *p.value_mut() = v;
    }
    let step: usize = meta_parse(&meta, "step", path)?;
    let hist = ck.get_real::<f64>(HISTORY, &[step, 4])?;
    let history = (0..step)
        .map(|i| StepStats {
            step: i as u64,
            total: hist[[i, 0]],
            ce: hist[[i, 1]],
            penalty: hist[[i, 2]],
            fusion: hist[[i, 3]],
        })
        .collect();
    Ok(SavedModel {
        model,
        metadata: meta,
        history,
    })
}

impl<T: Real> Trainer<T> {
    /// A trainer at step 0. The corpus must fit the model (ids below V and
    /// L) and hold at least one bigram.
    pub fn new(model: BigramModel<T>, corpus: Corpus, config: TrainConfig) -> Result<Self> {
        let mc = model.config();
        corpus.validate(mc.vocab_size, mc.n_languages)?;
        let bigrams: Vec<[u32; 3]> = corpus
            .bigrams()
            .map(|(i, j)| {
                [
                    corpus.token_ids[i],
                    corpus.language_ids[i],
                    corpus.token_ids[j],
                ]
            })
            .collect();
        if bigrams.is_empty() {
            return Err(
                Error::new(ErrorKind::Empty).in_array("token_ids (no bigram within a sequence)")
            );
        }
        if config.batch == 0 {
            return Err(Error::config("batch must be positive"));
        }
        let tables = LazyAdam::new(LazyAdamConfig {
            lr: config.lr,
            ..LazyAdamConfig::default()
        })?;
        let dense = Adam::new(AdamConfig {
            lr: config.lr,
            ..AdamConfig::default()
        })?;
        let fingerprint = corpus_fingerprint(&corpus);
        Ok(Trainer {
            model,
            fingerprint,
            bigrams,
            config,
            tables,
            dense,
            step: 0,
            history: Vec::new(),
        })
    }

    /// The model.
    pub fn model(&self) -> &BigramModel<T> {
        &self.model
    }

    /// The next step to run.
    pub fn step_index(&self) -> u64 {
        self.step
    }

    /// The configuration.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// Loss terms of every step run so far (also across a resume).
    pub fn history(&self) -> &[StepStats] {
        &self.history
    }

    /// Whether every step has run.
    pub fn is_done(&self) -> bool {
        self.step >= self.config.steps
    }

    /// The batch of step `step`: a function of the seed and the step only.
    pub fn batch_at(&self, step: u64) -> Batch {
        let mut rng = Rng::new(self.config.seed ^ 0x6261_7463_6865_7321).fork(step);
        let n = self.bigrams.len() as u64;
        let mut b = Batch::default();
        for _ in 0..self.config.batch {
            let [token, language, next] = self.bigrams[rng.below(n) as usize];
            b.tokens.push(token as i64);
            b.languages.push(language as i64);
            b.targets.push(next as i64);
        }
        b
    }

    /// Runs one step: forward, backward, update. A non-finite loss stops
    /// with [`ErrorKind::Diverged`] naming the step, before any update.
    pub fn step(&mut self) -> Result<StepStats> {
        let batch = self.batch_at(self.step);
        let c = self.config;
        let (stats, grads) = {
            let mut tape = Tape::new();
            let terms = self.model.loss(
                &mut tape,
                &batch,
                c.use_gate,
                c.gate_penalty,
                c.fusion_penalty,
            )?;
            let fusion = match terms.fusion {
                Some(f) => tape.scalar(f).to_f64(),
                None => self.model.split.fusion_penalty().to_f64(),
            };
            let stats = StepStats {
                step: self.step,
                total: tape.scalar(terms.total).to_f64(),
                ce: tape.scalar(terms.ce).to_f64(),
                penalty: match terms.penalty {
                    Some(p) => tape.scalar(p).to_f64(),
                    None if c.use_gate => self.model.split.penalty().to_f64(),
                    None => 0.0,
                },
                fusion,
            };
            if !stats.total.is_finite() {
                return Err(Error::new(ErrorKind::Diverged {
                    step: self.step,
                    message: format!("the loss is {}", stats.total),
                }));
            }
            (stats, tape.backward(terms.total))
        };
        let n_tables = 2; // the shared table and the split rows
        for (k, p) in self.model.parameters_mut().into_iter().enumerate() {
            let Some(g) = grads.by_id(p.id()) else {
                continue;
            };
            if k < n_tables {
                self.tables.update(p, g)?;
            } else {
                self.dense.update(p, g)?;
            }
        }
        self.history.push(stats);
        self.step += 1;
        Ok(stats)
    }

    /// Checks that every parameter and every optimiser moment is finite
    /// (before a checkpoint is written over the last good one).
    pub fn check_finite(&self) -> Result<()> {
        let diverged = |what: String, i: usize, v: T| {
            Err(Error::new(ErrorKind::Diverged {
                step: self.step.saturating_sub(1),
                message: format!("{what} has {} at flat position {i}", v.to_f64()),
            }))
        };
        for p in self.model.parameters() {
            if let Some((i, v)) = p.value().iter().enumerate().find(|(_, v)| !v.is_finite()) {
                return diverged(format!("parameter `{}`", p.name()), i, *v);
            }
        }
        for (prefix, state) in [
            (OPT_TABLES, self.tables.state()),
            (OPT_DENSE, self.dense.state()),
        ] {
            for (name, value) in state {
                let StateValue::Array(a) = value else {
                    continue;
                };
                if let Some((i, v)) = a.iter().enumerate().find(|(_, v)| !v.is_finite()) {
                    return diverged(format!("optimiser state `{prefix}{name}`"), i, *v);
                }
            }
        }
        Ok(())
    }

    /// Writes the checkpoint: the model under the names of SPEC section 1,
    /// the optimisers' state, the step and the loss history, atomically.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        self.check_finite()?;
        let model = &self.model;
        let lang: ArrayD<i64> = model
            .split
            .index()
            .language_index
            .iter()
            .map(|&x| x as i64)
            .collect::<ndarray::Array1<i64>>()
            .into_dyn();
        let tok: ArrayD<i64> = model
            .split
            .index()
            .token_index
            .iter()
            .map(|&x| x as i64)
            .collect::<ndarray::Array1<i64>>()
            .into_dyn();
        let mut entries: Vec<(String, TensorRef<'_>)> = Vec::new();
        for p in model.parameters() {
            entries.push((p.name().to_string(), T::tensor_ref(p.value().view())));
        }
        entries.push((
            "split_vocabulary.language_index".into(),
            TensorRef::from(&lang),
        ));
        entries.push(("split_vocabulary.token_index".into(), TensorRef::from(&tok)));
        let score: Option<ArrayD<f64>> = model
            .split
            .index()
            .score
            .as_ref()
            .map(|s| ndarray::Array1::from(s.clone()).into_dyn());
        if let Some(score) = &score {
            entries.push((SCORE.into(), TensorRef::from(score)));
        }
        let tables = self.tables.state();
        let dense = self.dense.state();
        let mut steps: Vec<(String, ndarray::Array0<u64>)> = Vec::new();
        for (prefix, state) in [(OPT_TABLES, &tables), (OPT_DENSE, &dense)] {
            for (name, v) in state {
                match v {
                    StateValue::Array(a) => {
                        entries.push((format!("{prefix}{name}"), T::tensor_ref(a.view())))
                    }
                    StateValue::Step(s) => {
                        steps.push((format!("{prefix}{name}"), ndarray::arr0(*s)))
                    }
                }
            }
        }
        for (name, s) in &steps {
            entries.push((name.clone(), TensorRef::from(s)));
        }
        let hist = Array2::from_shape_fn((self.history.len(), 4), |(i, j)| {
            let s = &self.history[i];
            [s.total, s.ce, s.penalty, s.fusion][j]
        });
        entries.push((HISTORY.into(), TensorRef::from(&hist)));
        let mc = model.config();
        let c = self.config;
        let meta: BTreeMap<String, String> = [
            ("format", "splitgrad-bigram-1".to_string()),
            ("dtype", T::NAME.to_string()),
            ("step", self.step.to_string()),
            ("vocab_size", mc.vocab_size.to_string()),
            ("n_languages", mc.n_languages.to_string()),
            ("dim", mc.dim.to_string()),
            ("gate_init", mc.gate_init.to_string()),
            ("steps", c.steps.to_string()),
            ("batch", c.batch.to_string()),
            ("lr", c.lr.to_string()),
            ("gate_penalty", c.gate_penalty.to_string()),
            ("fusion_penalty", c.fusion_penalty.to_string()),
            ("use_gate", c.use_gate.to_string()),
            ("seed", c.seed.to_string()),
            ("corpus_fingerprint", format!("{:016x}", self.fingerprint)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        checkpoint::save(path, &entries, &meta)
    }

    /// Restores the weights, the optimisers, the step and the history from
    /// a checkpoint written by [`Self::save`] for this model and corpus.
    /// Every tensor is checked by name, dtype and shape, and the weights and
    /// optimiser moments for NaN and infinity.
    pub fn load(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let ck = Checkpoint::open(path)?;
        let meta = ck.metadata();
        let get = |k: &str| {
            meta.get(k).cloned().ok_or_else(|| {
                Error::new(ErrorKind::Missing)
                    .in_file(path)
                    .in_array(format!("metadata `{k}`"))
            })
        };
        let fp = format!("{:016x}", self.fingerprint);
        if get("corpus_fingerprint")? != fp {
            return Err(
                Error::config("the checkpoint was written for another corpus").in_file(path),
            );
        }
        // Resuming is exact only with the same settings; `steps` may grow.
        let mc = self.model.config();
        let c = self.config;
        for (key, ours) in [
            ("dtype", T::NAME.to_string()),
            ("vocab_size", mc.vocab_size.to_string()),
            ("n_languages", mc.n_languages.to_string()),
            ("dim", mc.dim.to_string()),
            ("gate_init", mc.gate_init.to_string()),
            ("batch", c.batch.to_string()),
            ("lr", c.lr.to_string()),
            ("gate_penalty", c.gate_penalty.to_string()),
            ("fusion_penalty", c.fusion_penalty.to_string()),
            ("use_gate", c.use_gate.to_string()),
            ("seed", c.seed.to_string()),
        ] {
            let theirs = get(key)?;
            if theirs != ours {
                return Err(Error::config(format!(
                    "the checkpoint was written with {key} = {theirs}, this run has {ours}"
                ))
                .in_file(path));
            }
        }
        let step: u64 = get("step")?
            .parse()
            .map_err(|_| Error::format("metadata `step` is not an integer").in_file(path))?;
        let mut values = Vec::new();
        for p in self.model.parameters() {
            let v = ck.get_real::<T>(p.name(), p.value().shape())?;
            crate::io::check_finite(v.view(), p.name()).map_err(|e| e.in_file(path))?;
            values.push(v);
        }
        let n = self.model.split.n_rows();
        let idx = self.model.split.index();
        let lang = ck.get_i64("split_vocabulary.language_index", &[n])?;
        let tok = ck.get_i64("split_vocabulary.token_index", &[n])?;
        if lang
            .iter()
            .zip(&idx.language_index)
            .any(|(&a, &b)| a != b as i64)
            || tok
                .iter()
                .zip(&idx.token_index)
                .any(|(&a, &b)| a != b as i64)
        {
            return Err(Error::config(
                "the checkpoint's split_vocabulary index differs from this run's index",
            )
            .in_file(path));
        }
        let mut tables = LazyAdam::new(LazyAdamConfig {
            lr: self.config.lr,
            ..LazyAdamConfig::default()
        })?;
        let mut dense = Adam::new(AdamConfig {
            lr: self.config.lr,
            ..AdamConfig::default()
        })?;
        for (prefix, opt) in [
            (OPT_TABLES, &mut tables as &mut dyn Optimizer<T>),
            (OPT_DENSE, &mut dense as &mut dyn Optimizer<T>),
        ] {
            let mut entries = Vec::new();
            for name in ck.names() {
                let Some(rest) = name.strip_prefix(prefix) else {
                    continue;
                };
                let value = if rest.ends_with(".step") {
                    StateValue::Step(*ck.get_u64(name, &[])?.first().expect("0-d"))
                } else {
                    let shape = ck.shape(name)?.to_vec();
                    let moments = ck.get_real::<T>(name, &shape)?;
                    crate::io::check_finite(moments.view(), name).map_err(|e| e.in_file(path))?;
                    StateValue::Array(moments)
                };
                entries.push((rest.to_string(), value));
            }
            opt.load_state(entries).map_err(|e| e.in_file(path))?;
            opt.check_state(&self.model.parameters())
                .map_err(|e| e.in_file(path))?;
        }
        let hist_shape = ck.shape(HISTORY)?.to_vec();
        if hist_shape.len() != 2 || hist_shape[1] != 4 || hist_shape[0] as u64 != step {
            return Err(Error::shape(HISTORY, format!("({step}, 4)"), &hist_shape)
                .in_file(path)
                .in_array(HISTORY));
        }
        let hist = ck.get_real::<f64>(HISTORY, &hist_shape)?;
        let history = (0..hist_shape[0])
            .map(|i| StepStats {
                step: i as u64,
                total: hist[[i, 0]],
                ce: hist[[i, 1]],
                penalty: hist[[i, 2]],
                fusion: hist[[i, 3]],
            })
            .collect();
        for (p, v) in self.model.parameters_mut().into_iter().zip(values) {
            *p.value_mut() = v;
        }
        self.tables = tables;
        self.dense = dense;
        self.step = step;
        self.history = history;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::SplitIndex;
    use crate::model::ModelConfig;

    /// Found by the `checkpoint_loader` fuzz target: with weights that are
    /// finite but huge, one step overflowed a second moment to +∞ while
    /// every parameter stayed finite, and `save` wrote a checkpoint that
    /// `load` rejects. The run now stops, naming the step and the state.
    #[test]
    fn an_overflowing_moment_stops_the_run_before_a_checkpoint() {
        let config = ModelConfig {
            vocab_size: 4,
            n_languages: 1,
            dim: 2,
            gate_init: 0.0,
        };
        let index = SplitIndex::new(vec![0], vec![1]);
        let mut model = BigramModel::<f32>::new(config, index).unwrap();
        model.reset_parameters(&mut Rng::new(0)).unwrap();
        model.parameters_mut()[3].value_mut().fill(1e30);
        let corpus = Corpus::new(vec![0, 1, 2, 3, 0, 1], vec![0; 6]);
        let train = TrainConfig {
            steps: 2,
            batch: 4,
            lr: 1e-2,
            gate_penalty: 0.0,
            fusion_penalty: 0.0,
            use_gate: true,
            seed: 0,
        };
        let mut trainer = Trainer::new(model, corpus, train).unwrap();
        trainer.step().unwrap();
        let path = std::env::temp_dir().join(format!(
            "splitgrad-train-unit-{}.safetensors",
            std::process::id()
        ));
        let e = trainer.save(&path).unwrap_err();
        match e.kind() {
            ErrorKind::Diverged { step, message } => {
                assert_eq!(*step, 0);
                assert!(
                    message.starts_with("optimiser state `optimizer."),
                    "{message}"
                );
                assert!(message.contains(".exp_avg_sq` has inf"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert!(!path.exists());
    }
}
