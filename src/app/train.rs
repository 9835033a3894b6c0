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
use std::sync::Arc;

use ndarray::Array2;

use crate::app::corpus::Corpus;
use crate::app::eval::HeldOut;
use crate::app::model::{Batch, BigramModel};
use crate::checkpoint::{Checkpoint, Snapshot, save_state};
use crate::error::{Error, ErrorKind, Result};
use crate::kernels::Real;
use crate::optim::{
    Adam, AdamConfig, LazyAdam, LazyAdamConfig, Optimizer, ParamGroups, StateValue,
};
use crate::rng::Rng;
use crate::state::{Module, TensorData, TensorRef};
use crate::tape::{Pool, Tape};

mod fingerprint;
mod precision;
mod saved;

use fingerprint::FINGERPRINT_VERSION;
pub use fingerprint::corpus_fingerprint;
pub use precision::{Precision, RoundingMode};
pub use saved::{SavedModel, index_of, load_model};
use saved::{history_from, record_from};

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
    /// Seed of the batches (and of the stochastic rounding).
    pub seed: u64,
    /// How the parameters and the optimiser state are kept.
    pub precision: Precision,
}

impl Default for TrainConfig {
    /// 1000 steps of 4096 bigrams at lr 0.01, gated, gate penalty 0.005,
    /// no fusion penalty, seed 0, at the engine's own precision.
    fn default() -> Self {
        TrainConfig {
            steps: 1000,
            batch: 4096,
            lr: 1e-2,
            gate_penalty: 0.005,
            fusion_penalty: 0.0,
            use_gate: true,
            seed: 0,
            precision: Precision::default(),
        }
    }
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
    /// The training corpus; a step draws its bigrams by number
    /// ([`Corpus::bigram_context`]), so nothing of the corpus's size is
    /// kept beside it.
    corpus: Arc<Corpus>,
    /// Its number of bigrams.
    n_bigrams: u64,
    /// [`corpus_fingerprint`] of the corpus, computed once.
    fingerprint: u64,
    config: TrainConfig,
    /// Lazy Adam for the tables, Adam for the rest, by parameter name.
    optimizer: ParamGroups<T>,
    /// The buffers every step reuses.
    pool: Pool<T>,
    step: u64,
    history: Vec<StepStats>,
    /// What the run is about, for its reports (saved in the checkpoint).
    labels: RunLabels,
    /// Held-out cross-entropy at each evaluation: (step, model, all gates
    /// closed).
    heldout_curve: Vec<(u64, f64, f64)>,
    /// The held-out evaluation of the trained model, once made.
    evaluation: Option<HeldOut>,
    /// The distinct contexts of the last step's batch (not saved).
    last_contexts: usize,
}

/// What a run is about, kept with its checkpoint for the reports: the
/// corpus's name, its language names and decoded token strings when it has
/// them, and which rows are planted when the truth is known (the synthetic
/// corpus).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunLabels {
    /// The corpus, as the report names it.
    pub corpus: String,
    /// One name per language.
    pub language_names: Option<Vec<String>>,
    /// The decoded text of each token id.
    pub token_strings: Option<Vec<String>>,
    /// Whether each split row is a planted pair.
    pub planted: Option<Vec<bool>>,
}

/// Strings joined for a metadata value: each escaped (`\\` for a
/// backslash, `\s` for the unit separator U+001F, which byte-level
/// vocabularies do hold as a token), then joined by U+001F.
const SEP: char = '\u{1f}';

fn join(v: &[String]) -> String {
    let escape = |s: &String| s.replace('\\', "\\\\").replace(SEP, "\\s");
    v.iter()
        .map(escape)
        .collect::<Vec<_>>()
        .join(&SEP.to_string())
}

fn split_joined(s: &str) -> Vec<String> {
    let unescape = |part: &str| {
        let mut out = String::with_capacity(part.len());
        let mut chars = part.chars();
        while let Some(c) = chars.next() {
            if c != '\\' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some('s') => out.push(SEP),
                Some(other) => out.push(other),
                None => out.push('\\'),
            }
        }
        out
    };
    s.split(SEP).map(unescape).collect()
}

/// The held-out curve, one row per evaluation: step, ce, ce with every gate
/// closed.
pub const HELDOUT_CURVE: &str = "train.heldout";

/// The loss history of a run, one row per step: total, ce, penalty, fusion.
pub const HISTORY: &str = "train.history";

/// The optimiser of a run: lazy (row-sparse) Adam for the tables — the
/// shared embedding and the split rows — and Adam for the gate logits and
/// the head, chosen by parameter name, both keeping their moments and
/// rounding as `precision` says (stochastic rounding keyed by `seed`).
/// Its state is saved as `optimizer.tables.<param>.<field>` and
/// `optimizer.dense.<param>.<field>`.
pub fn optimizer<T: Real>(lr: f64, precision: Precision, seed: u64) -> Result<ParamGroups<T>> {
    let state = precision.state_dtype_of::<T>();
    let rounding = precision.rounding.rounding(seed);
    let mut tables = LazyAdam::new(LazyAdamConfig {
        lr,
        ..LazyAdamConfig::default()
    })?;
    tables.set_state_dtype(state)?;
    tables.set_rounding(rounding);
    let mut dense = Adam::new(AdamConfig {
        lr,
        ..AdamConfig::default()
    })?;
    dense.set_state_dtype(state)?;
    dense.set_rounding(rounding);
    Ok(ParamGroups::new()
        .group("tables", is_table, tables)
        .group("dense", |_| true, dense))
}

/// Whether a parameter is a table the lazy Adam updates.
fn is_table(name: &str) -> bool {
    name.starts_with("token_embedding.") || name == "split_vocabulary.rows"
}

impl<T: Real> Trainer<T> {
    /// Binds the run to its held-out text as well: a checkpoint then resumes
    /// only with the same training and held-out parts (the same corpus and
    /// held-out split), so that the held-out curve stays one curve.
    pub fn bind_heldout(&mut self, heldout: &Corpus) {
        let h = corpus_fingerprint(heldout);
        self.fingerprint = (self.fingerprint ^ h.rotate_left(29)).wrapping_mul(0x0100_0000_01b3);
    }

    /// A trainer at step 0, the model's parameters kept in the
    /// configuration's dtype (narrowed to nearest, or widened back). The corpus must fit the model (ids
    /// below V and L) and hold at least one bigram.
    pub fn new(
        mut model: BigramModel<T>,
        corpus: impl Into<Arc<Corpus>>,
        config: TrainConfig,
    ) -> Result<Self> {
        let corpus = corpus.into();
        let mc = model.config();
        corpus.validate(mc.vocab_size, mc.n_languages)?;
        let n_bigrams = corpus.n_bigrams() as u64;
        if n_bigrams == 0 {
            return Err(
                Error::new(ErrorKind::Empty).in_array("token_ids (no bigram within a sequence)")
            );
        }
        if config.batch == 0 {
            return Err(Error::config("batch must be positive"));
        }
        let fingerprint = corpus_fingerprint(&corpus);
        let optimizer = optimizer(config.lr, config.precision, config.seed)?;
        // A no-op for a model kept as the engine's own type and run so.
        model.set_dtype(config.precision.dtype_of::<T>())?;
        Ok(Trainer {
            model,
            fingerprint,
            corpus,
            n_bigrams,
            config,
            optimizer,
            pool: Pool::new(),
            step: 0,
            history: Vec::new(),
            labels: RunLabels::default(),
            heldout_curve: Vec::new(),
            evaluation: None,
            last_contexts: 0,
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

    /// Bytes of the model's parameters, as they are kept.
    pub fn params_bytes(&self) -> u64 {
        self.model.parameter_bytes()
    }

    /// Bytes of the optimiser's state now, as it is kept (its moments, and
    /// 8 bytes a step count).
    pub fn state_bytes(&self) -> u64 {
        let real = std::mem::size_of::<T>() as u64;
        self.optimizer
            .state()
            .iter()
            .map(|(_, v)| match v {
                StateValue::Array(a) => real * a.len() as u64,
                StateValue::Half(h) => h.nbytes(),
                StateValue::Step(_) => 8,
            })
            .sum()
    }

    /// Loss terms of every step run so far (also across a resume).
    pub fn history(&self) -> &[StepStats] {
        &self.history
    }

    /// What the run is about.
    pub fn labels(&self) -> &RunLabels {
        &self.labels
    }

    /// Sets what the run is about (saved with every checkpoint).
    pub fn set_labels(&mut self, labels: RunLabels) {
        self.labels = labels;
    }

    /// Held-out cross-entropy at each evaluation so far.
    pub fn heldout_curve(&self) -> &[(u64, f64, f64)] {
        &self.heldout_curve
    }

    /// Records a held-out evaluation at the current step (replacing one
    /// already recorded at this step).
    pub fn record_heldout(&mut self, ce: f64, ce_closed: f64) {
        self.heldout_curve.retain(|&(s, _, _)| s != self.step);
        self.heldout_curve.push((self.step, ce, ce_closed));
    }

    /// The held-out evaluation of the trained model, once made.
    pub fn evaluation(&self) -> Option<&HeldOut> {
        self.evaluation.as_ref()
    }

    /// Sets the held-out evaluation of the trained model (saved with the
    /// checkpoint).
    pub fn set_evaluation(&mut self, e: HeldOut) {
        self.evaluation = Some(e);
    }

    /// The distinct contexts (hidden rows) of the last step's batch: the
    /// head's work is `6·contexts·V·D` flops (0 before any step).
    pub fn last_contexts(&self) -> usize {
        self.last_contexts
    }

    /// Whether every step has run.
    pub fn is_done(&self) -> bool {
        self.step >= self.config.steps
    }

    /// The batch of step `step`: a function of the seed and the step only.
    pub fn batch_at(&self, step: u64) -> Batch {
        let mut rng = Rng::new(self.config.seed ^ 0x6261_7463_6865_7321).fork(step);
        let c = &*self.corpus;
        let mut b = Batch::default();
        for _ in 0..self.config.batch {
            let i = c.bigram_context(rng.below(self.n_bigrams) as usize);
            b.tokens.push(i64::from(c.token_ids.get(i)));
            b.languages.push(i64::from(c.language_ids.get(i)));
            b.targets.push(i64::from(c.token_ids.get(i + 1)));
        }
        b
    }

    /// Runs one step: forward, backward, update. A non-finite loss stops
    /// with [`ErrorKind::Diverged`] naming the step, before any update.
    pub fn step(&mut self) -> Result<StepStats> {
        let batch = self.batch_at(self.step);
        let c = self.config;
        let (stats, grads) = {
            let mut tape = Tape::with_pool(&self.pool);
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
            self.last_contexts = terms.contexts;
            (stats, tape.backward(terms.total))
        };
        self.optimizer.step(self.model.parameters_mut(), &grads)?;
        self.history.push(stats);
        self.step += 1;
        Ok(stats)
    }

    /// Checks that every parameter and every optimiser moment is finite
    /// (before a checkpoint is written over the last good one).
    pub fn check_finite(&self) -> Result<()> {
        let diverged = |what: String, i: usize, v: f64| {
            Err(Error::new(ErrorKind::Diverged {
                step: self.step.saturating_sub(1),
                message: format!("{what} has {v} at flat position {i}"),
            }))
        };
        for p in self.model.parameters() {
            let value = p.widened();
            if let Some((i, v)) = value.iter().enumerate().find(|(_, v)| !v.is_finite()) {
                return diverged(format!("parameter `{}`", p.name()), i, Real::to_f64(*v));
            }
        }
        for (name, t) in self.optimizer.state_dict().iter() {
            let first_bad = match t {
                TensorData::BF16(a) => a
                    .iter()
                    .map(|x| x.to_f64())
                    .enumerate()
                    .find(|(_, v)| !v.is_finite()),
                TensorData::F16(a) => a
                    .iter()
                    .map(|x| x.to_f64())
                    .enumerate()
                    .find(|(_, v)| !v.is_finite()),
                _ => t.as_real::<T>().and_then(|a| {
                    a.iter()
                        .map(|&x| Real::to_f64(x))
                        .enumerate()
                        .find(|(_, v)| !v.is_finite())
                }),
            };
            if let Some((i, v)) = first_bad {
                return diverged(
                    format!("optimiser state `{}{name}`", crate::checkpoint::OPTIMIZER),
                    i,
                    v,
                );
            }
        }
        Ok(())
    }

    /// The checkpoint's metadata: the format, the sizes, the settings, the
    /// step and the corpus.
    fn metadata(&self) -> BTreeMap<String, String> {
        let mc = self.model.config();
        let c = self.config;
        [
            ("format", "splitgrad-bigram-1".to_string()),
            ("dtype", c.precision.dtype_of::<T>().name().to_string()),
            (
                "state_dtype",
                c.precision.state_dtype_of::<T>().name().to_string(),
            ),
            ("rounding", c.precision.rounding.name().to_string()),
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
            (
                "corpus_fingerprint",
                format!("{FINGERPRINT_VERSION}{:016x}", self.fingerprint),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Writes the checkpoint, atomically: the model under its state-dict
    /// names (`docs/spec.md#63-checkpoint`), the optimiser's state under
    /// `optimizer.`, the loss history under [`HISTORY`], and the metadata.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        self.check_finite()?;
        let hist = Array2::from_shape_fn((self.history.len(), 4), |(i, j)| {
            let s = &self.history[i];
            [s.total, s.ce, s.penalty, s.fusion][j]
        });
        let curve = Array2::from_shape_fn((self.heldout_curve.len(), 3), |(i, j)| {
            let (s, a, b) = self.heldout_curve[i];
            [s as f64, a, b][j]
        });
        let planted = self.labels.planted.as_ref().map(|p| {
            p.iter()
                .map(|&x| i64::from(x))
                .collect::<ndarray::Array1<i64>>()
        });
        let eval = self.evaluation.as_ref().map(HeldOut::to_state);
        let mut extra = vec![
            (HISTORY.to_string(), TensorRef::from(&hist)),
            (HELDOUT_CURVE.to_string(), TensorRef::from(&curve)),
        ];
        if let Some(p) = &planted {
            extra.push(("eval.planted".to_string(), TensorRef::from(p)));
        }
        if let Some((rows, langs)) = &eval {
            extra.push(("eval.rows".to_string(), TensorRef::from(rows)));
            extra.push(("eval.languages".to_string(), TensorRef::from(langs)));
        }
        let mut meta = self.metadata();
        meta.insert("corpus".into(), self.labels.corpus.clone());
        if let Some(n) = &self.labels.language_names {
            meta.insert("language_names".into(), join(n));
        }
        if let Some(t) = &self.labels.token_strings {
            meta.insert("token_strings".into(), join(t));
        }
        if let Some(e) = &self.evaluation {
            e.to_metadata(&mut meta);
        }
        save_state(path, &[&self.model], Some(&self.optimizer), &extra, &meta)
    }

    /// Restores the weights, the optimisers, the step and the history from
    /// a checkpoint written by [`Self::save`] for this model, these settings
    /// and this corpus (`steps` may differ). Every tensor is checked by
    /// name, dtype and shape, the weights and moments for NaN and
    /// infinity, the second moments for their sign; on an error nothing is
    /// changed.
    pub fn load(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        // The metadata and the header are checked before any tensor is
        // read: a file for another run, or whose tensors its metadata does
        // not describe, is refused without reading it.
        let snap = Snapshot::read_checked(path, |ck| {
            self.check_metadata(ck)?;
            saved::check_header(ck)
        })?;
        let step: u64 = snap.meta_parse("step")?;
        saved::check_steps(&snap, step)?;
        let hist = snap.state.get(HISTORY).map(TensorData::shape);
        let want = [usize::try_from(step).unwrap_or(usize::MAX), 4];
        if hist != Some(&want[..]) {
            let found = hist.map(<[usize]>::to_vec).unwrap_or_default();
            return Err(Error::shape(HISTORY, format!("({step}, 4)"), &found)
                .in_file(path)
                .in_array(HISTORY));
        }
        let history = history_from(&snap.state, step)?;
        let cfg = self.model.config();
        let (_, curve, _) = record_from(
            &snap,
            &snap.state,
            self.model.split.n_rows(),
            cfg.n_languages,
        )?;
        let mut optimizer = optimizer(self.config.lr, self.config.precision, self.config.seed)?;
        // `restore` checks every tensor before it changes the model.
        snap.restore(&mut [&mut self.model], Some(&mut optimizer))?;
        self.optimizer = optimizer;
        self.heldout_curve = curve;
        self.evaluation = None;
        self.step = step;
        self.history = history;
        Ok(())
    }

    /// Checks that a checkpoint's metadata is of this run: its corpus,
    /// precision and settings (`steps` may differ).
    fn check_metadata(&self, ck: &Checkpoint) -> Result<()> {
        let path = ck.path();
        let fp = format!("{FINGERPRINT_VERSION}{:016x}", self.fingerprint);
        let theirs = ck.meta("corpus_fingerprint")?;
        if !theirs.starts_with(FINGERPRINT_VERSION) {
            return Err(Error::config(
                "the checkpoint was written by an earlier splitgrad, whose corpus fingerprint this one no longer computes; finish it with that version, or start again with --force",
            )
            .in_file(path));
        }
        if theirs != fp {
            return Err(Error::config(
                "the checkpoint was written for another corpus (or another held-out split of it)",
            )
            .in_file(path));
        }
        // Resuming is exact only with the same settings; `steps` may grow.
        let ours = self.metadata();
        // A precision the file names in no form a run writes (an alias, a
        // name in capitals) is the file's fault: no flag could match it.
        saved::kept_dtypes(ck)?;
        let rounding = saved::kept_rounding(ck)?;
        // Kept as the flags say; a checkpoint from before `state_dtype`
        // and `rounding` were recorded kept its state as its parameters
        // and rounded nothing.
        for (key, flag) in [
            ("dtype", "--dtype"),
            ("state_dtype", "--state-dtype"),
            ("rounding", "--rounding"),
        ] {
            let theirs = match ck.metadata().get(key) {
                Some(v) => v.as_str(),
                None if key == "state_dtype" => T::NAME,
                None if key == "rounding" => rounding.name(),
                None => ck.meta(key)?,
            };
            if theirs != ours[key] {
                return Err(Error::config(format!(
                    "the checkpoint was written with {key} = {theirs}, this run has {key} = {} ({flag} {}); resume with {flag} {theirs}",
                    ours[key], ours[key]
                ))
                .in_file(path));
            }
        }
        for key in [
            "vocab_size",
            "n_languages",
            "dim",
            "gate_init",
            "batch",
            "lr",
            "gate_penalty",
            "fusion_penalty",
            "use_gate",
            "seed",
        ] {
            let theirs = ck.meta(key)?;
            if theirs != ours[key] {
                return Err(Error::config(format!(
                    "the checkpoint was written with {key} = {theirs}, this run has {}",
                    ours[key]
                ))
                .in_file(path));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
