//! What a trained split vocabulary says, and the report of a run.
//!
//! The answer of a gated run is which split rows to keep, by the rule of
//! [`Rule`]: a row is kept when it saves held-out loss beyond noise. The
//! [`Report`] gives every row's gate and held-out gain, the kept rows ranked
//! by gain, the held-out cross-entropy of the model and of the same model
//! with every gate closed (overall and per language), and the effective
//! number of vocabularies under the rule. On the synthetic corpus it adds
//! the agreement of the kept rows with the planted pairs and the
//! threshold-free ROC AUC and average precision of the gates. A fusion-mode
//! run reports fusion statistics instead: distinct rows per token, each
//! row's distance to its token's centroid, held-out cross-entropy.
//!
//! The measures themselves: which gates opened, how that agrees with a
//! planted truth or a measured score ([`agreement`], [`roc_auc`],
//! [`average_precision`], [`spearman`]), and how many distinct vocabularies
//! the languages effectively use ([`vocabularies_kept`],
//! [`effective_vocabularies`]).

mod metrics;
mod vocabularies;

use std::path::{Path, PathBuf};

pub use metrics::{Agreement, agreement, average_precision, roc_auc, spearman};
pub use vocabularies::{
    EffectiveVocabularies, SAME_EMBEDDING, centroid_distances, effective_vocabularies,
    vocabularies_kept,
};

use crate::Real;
use crate::app::eval::{HeldOut, Rule};
use crate::app::model::BigramModel;
use crate::app::train::{RoundingMode, RunLabels, SavedModel, StepStats, Trainer};
use crate::param::Dtype;
use crate::state::Module;

/// The most rows a report lists (in `rows` and in `kept`): every row when
/// there are no more, else the most useful by held-out gain. An index of
/// millions of pairs would otherwise make a report of gigabytes; every
/// row's figures stay in the checkpoint (`eval.rows`) and `export` writes
/// every kept pair.
pub const ROWS_LISTED: usize = 10_000;

/// The held-out cross-entropy must be at least this much (nats) below that
/// of a uniform guess over the vocabulary, `ln V`, and below the untrained
/// model's, for the report to say something was learned.
const LEARNED: f64 = 0.01;

/// What a report is made from.
pub struct ReportInput<'a, T> {
    /// The trained model.
    pub model: &'a BigramModel<T>,
    /// The loss terms of every step run.
    pub history: &'a [StepStats],
    /// What the run is about.
    pub labels: &'a RunLabels,
    /// (step, held-out ce, with every gate closed) at each evaluation.
    pub heldout_curve: &'a [(u64, f64, f64)],
    /// The held-out evaluation of the trained model, if the run ended.
    pub evaluation: Option<&'a HeldOut>,
    /// Gated, or fusion mode.
    pub use_gate: bool,
    /// The checkpoint the report is of.
    pub checkpoint: &'a Path,
    /// The most kept rows listed in [`GatedOutcome::kept`] ([`ROWS_LISTED`]
    /// in a report; `export` lists them all).
    pub kept_limit: usize,
}

impl<'a, T> ReportInput<'a, T> {
    /// The input of a checkpoint read back, `checkpoint` its path.
    pub fn of_saved(saved: &'a SavedModel<T>, checkpoint: &'a Path, kept_limit: usize) -> Self {
        ReportInput {
            model: &saved.model,
            history: &saved.history,
            labels: &saved.labels,
            heldout_curve: &saved.heldout_curve,
            evaluation: saved.evaluation.as_ref(),
            use_gate: saved.use_gate(),
            checkpoint,
            kept_limit,
        }
    }
}

/// The report of a trained model (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The corpus, as the run names it.
    pub corpus: String,
    /// Steps run.
    pub steps: usize,
    /// Split rows.
    pub n_rows: usize,
    /// The loss terms of the last step, if a step ran.
    pub last_step: Option<StepStats>,
    /// (step, held-out ce, with every gate closed) at each evaluation.
    pub heldout_curve: Vec<(u64, f64, f64)>,
    /// The held-out cross-entropy before training, if it was measured.
    pub heldout_ce_initial: Option<f64>,
    /// `ln V`, the cross-entropy of a uniform guess.
    pub heldout_ce_uniform: f64,
    /// With a held-out evaluation: whether its cross-entropy is below both
    /// `ln V` and the untrained model's (by 0.01 nats).
    pub learned: Option<bool>,
    /// The checkpoint the report is of.
    pub checkpoint: PathBuf,
    /// Every row in index order, or the [`ROWS_LISTED`] most useful.
    pub rows: Vec<RowReport>,
    /// The held-out evaluation of the trained model, if the run ended.
    pub heldout: Option<HeldOutReport>,
    /// What the mode decides: the kept rows, or how far the rows fused.
    pub outcome: Outcome,
    /// How the held-out part was made (a training run's report only).
    pub heldout_source: Option<String>,
    /// How fast the run trained (a training run's report only).
    pub throughput: Option<Throughput>,
    /// What the parameters and the optimiser state take, and how they are
    /// kept.
    pub memory: Option<Memory>,
}

/// The bytes a run's parameters and optimiser state take, as kept.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Memory {
    /// How the parameters are kept.
    pub dtype: Dtype,
    /// Bytes of every parameter.
    pub params_bytes: u64,
    /// How the optimiser's moments are kept.
    pub state_dtype: Dtype,
    /// Bytes of the optimiser's state (moments and step counts).
    pub state_bytes: u64,
    /// How values stored in half precision are rounded.
    pub rounding: RoundingMode,
}

impl Memory {
    /// The memory of a trainer's model and optimiser now.
    pub fn of_trainer<T: Real>(t: &Trainer<T>) -> Memory {
        let p = t.config().precision;
        Memory {
            dtype: p.dtype_of::<T>(),
            params_bytes: t.params_bytes(),
            state_dtype: p.state_dtype_of::<T>(),
            state_bytes: t.state_bytes(),
            rounding: p.rounding,
        }
    }

    /// The memory of a checkpoint read back: its parameters as loaded, its
    /// optimiser state as saved, the dtypes and the rounding of its
    /// metadata.
    pub fn of_saved<T: Real>(s: &SavedModel<T>) -> Memory {
        let own = Dtype::of::<T>();
        let dtype = |key: &str| s.meta_or(key, own.name()).parse().unwrap_or(own);
        Memory {
            dtype: s.model.parameters().first().map_or(own, |p| p.dtype()),
            params_bytes: s.model.parameter_bytes(),
            state_dtype: dtype("state_dtype"),
            state_bytes: s.state_bytes,
            rounding: s
                .meta_or("rounding", "stochastic")
                .parse()
                .unwrap_or_default(),
        }
    }
}

/// One split row of a report.
#[derive(Clone, Debug, PartialEq)]
pub struct RowReport {
    /// Its language l.
    pub language: usize,
    /// Its token t.
    pub token: usize,
    /// The language's name, where the corpus has one.
    pub language_name: Option<String>,
    /// The token's decoded text, where the corpus has it.
    pub token_string: Option<String>,
    /// Its gate (gated runs).
    pub gate: Option<f64>,
    /// Its distance to its token's centroid (fusion mode).
    pub distance_to_centroid: Option<f64>,
    /// Its held-out figures, with an evaluation.
    pub heldout: Option<RowHeldOut>,
    /// Whether the rule keeps it (gated runs).
    pub kept: Option<bool>,
    /// Whether it is a planted pair, where the truth is known.
    pub planted: Option<bool>,
    /// The index's score of its pair, where the index has scores.
    pub score: Option<f64>,
}

/// A row's held-out figures (see [`crate::app::eval::RowEval`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowHeldOut {
    /// The held-out loss it saves, nats.
    pub gain: f64,
    /// … a token.
    pub gain_per_token: f64,
    /// The standard error of `gain_per_token`.
    pub gain_se: f64,
    /// Held-out tokens of its context.
    pub tokens: usize,
    /// The total saving expected of those tokens under the shared row.
    pub gain_null: f64,
    /// Its evidence against the shared row ([`Rule::evidence`]).
    pub evidence: f64,
}

/// The held-out figures of the model.
#[derive(Clone, Debug, PartialEq)]
pub struct HeldOutReport {
    /// Held-out bigrams.
    pub n_tokens: usize,
    /// Their mean cross-entropy.
    pub ce: f64,
    /// … with every gate closed.
    pub ce_closed: f64,
    /// The languages with held-out tokens, in language order.
    pub per_language: Vec<LanguageReport>,
}

/// One language's held-out figures.
#[derive(Clone, Debug, PartialEq)]
pub struct LanguageReport {
    /// The language l.
    pub language: usize,
    /// Its name, where the corpus has one.
    pub language_name: Option<String>,
    /// Its held-out bigrams.
    pub n_tokens: usize,
    /// Their mean cross-entropy.
    pub ce: f64,
    /// … with every gate closed.
    pub ce_closed: f64,
}

/// What a run's mode decides.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// A gated run: which rows to keep.
    Gated(Box<GatedOutcome>),
    /// Fusion mode: how far the rows of each token fused.
    Fusion(FusionOutcome),
}

/// The rows a gated run keeps, and how the gates agree with the gains, the
/// index's scores and the planted truth.
#[derive(Clone, Debug, PartialEq)]
pub struct GatedOutcome {
    /// The rule that decides.
    pub rule: Rule,
    /// The kept rows, most useful first (at most the input's `kept_limit`).
    pub kept: Vec<RowReport>,
    /// How many rows are kept.
    pub n_kept: usize,
    /// [`vocabularies_kept`] under the rule.
    pub effective_vocabularies: f64,
    /// The mean gate.
    pub gate_mean: f64,
    /// Spearman's correlation of the held-out gains with the gates: `None`
    /// without an evaluation, `Some(None)` where it is undefined.
    pub spearman_gain_gate: Option<Option<f64>>,
    /// … of the gains with the index's scores (with both).
    pub spearman_gain_score: Option<Option<f64>>,
    /// … of the gates with the index's scores (with scores).
    pub spearman_gate_score: Option<Option<f64>>,
    /// Against the planted pairs, where the truth is known.
    pub planted: Option<PlantedReport>,
}

/// How a gated run's rows agree with the planted pairs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlantedReport {
    /// Planted rows.
    pub n_planted: usize,
    /// Of the kept rows.
    pub agreement: Agreement,
    /// The ROC AUC of the gates (no threshold).
    pub gate_auc: Option<f64>,
    /// … their average precision.
    pub gate_average_precision: Option<f64>,
    /// Of the held-out gains, with an evaluation.
    pub gain_auc: Option<f64>,
}

/// How far a fusion-mode run's rows fused.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FusionOutcome {
    /// [`EffectiveVocabularies::mean`] at the relative tolerance
    /// [`SAME_EMBEDDING`].
    pub distinct_rows_per_token: f64,
    /// The mean of the finite [`centroid_distances`].
    pub mean_distance_to_centroid: f64,
}

/// How fast a run trained.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Throughput {
    /// Tokens per second of the training steps (evaluations and
    /// checkpoints timed apart); 0 when no step ran.
    pub tokens_per_second: f64,
    /// Worker threads.
    pub threads: usize,
    /// The head's work, when a step ran.
    pub head: Option<HeadRate>,
}

/// The work of the head in a run's steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeadRate {
    /// Distinct hidden rows (contexts) a step, on average.
    pub contexts_per_step: f64,
    /// `6·m·V·D` flops a step over the seconds of the steps, GFLOP/s.
    pub gflops: f64,
}

impl Report {
    /// The report of a model (see the module docs).
    pub fn build<T: Real>(r: &ReportInput<'_, T>) -> Report {
        let figures = RowFigures::new(r);
        let n_rows = figures.gates.len();
        let order = figures.by_usefulness();
        let initial = r.heldout_curve.iter().find(|c| c.0 == 0).map(|c| c.1);
        let uniform = (r.model.config().vocab_size as f64).ln();
        let learned = r
            .evaluation
            .map(|e| e.ce < uniform - LEARNED && initial.is_none_or(|i| e.ce < i - LEARNED));
        let listed: Vec<usize> = if n_rows <= ROWS_LISTED {
            (0..n_rows).collect()
        } else {
            order[..ROWS_LISTED].to_vec()
        };
        let outcome = if r.use_gate {
            Outcome::Gated(Box::new(figures.gated(&order)))
        } else {
            Outcome::Fusion(figures.fusion())
        };
        Report {
            corpus: r.labels.corpus.clone(),
            steps: r.history.len(),
            n_rows,
            last_step: r.history.last().copied(),
            heldout_curve: r.heldout_curve.to_vec(),
            heldout_ce_initial: initial,
            heldout_ce_uniform: uniform,
            learned,
            checkpoint: r.checkpoint.to_path_buf(),
            rows: listed.iter().map(|&i| figures.row(i)).collect(),
            heldout: r.evaluation.map(|e| HeldOutReport {
                n_tokens: e.n_tokens,
                ce: e.ce,
                ce_closed: e.ce_closed,
                per_language: e
                    .per_language
                    .iter()
                    .enumerate()
                    .filter(|(_, le)| le.n_tokens > 0)
                    .map(|(l, le)| LanguageReport {
                        language: l,
                        language_name: language_name(r.labels, l),
                        n_tokens: le.n_tokens,
                        ce: le.ce,
                        ce_closed: le.ce_closed,
                    })
                    .collect(),
            }),
            outcome,
            heldout_source: None,
            throughput: None,
            memory: None,
        }
    }

    /// Whether the run was gated (not fusion mode).
    pub fn use_gate(&self) -> bool {
        matches!(self.outcome, Outcome::Gated(_))
    }

    /// The gated outcome, if the run was gated.
    pub fn gated(&self) -> Option<&GatedOutcome> {
        match &self.outcome {
            Outcome::Gated(g) => Some(&**g),
            Outcome::Fusion(_) => None,
        }
    }
}

/// The name of language `l`, where the corpus has one.
fn language_name(labels: &RunLabels, l: usize) -> Option<String> {
    labels
        .language_names
        .as_ref()
        .and_then(|n| n.get(l))
        .cloned()
}

/// Every row's figures, from which a report's rows and outcome are made.
struct RowFigures<'r, 'a, T> {
    input: &'r ReportInput<'a, T>,
    rule: Rule,
    gates: Vec<f64>,
    /// Whether the rule keeps each row (none without an evaluation or in
    /// fusion mode).
    kept: Vec<bool>,
    /// Each row's distance to its token's centroid (fusion mode only).
    distances: Vec<f64>,
    /// Each row's [`Rule::evidence`] (NaN without an evaluation).
    evidence: Vec<f64>,
    /// Each row's held-out gain, with an evaluation.
    gains: Option<Vec<f64>>,
}

impl<'r, 'a, T: Real> RowFigures<'r, 'a, T> {
    fn new(r: &'r ReportInput<'a, T>) -> Self {
        let n_rows = r.model.split.n_rows();
        let rule = Rule::default();
        RowFigures {
            input: r,
            rule,
            gates: r.model.gates(),
            kept: match (r.use_gate, r.evaluation) {
                (true, Some(e)) => rule.keep(&e.rows),
                _ => vec![false; n_rows],
            },
            distances: if r.use_gate {
                Vec::new()
            } else {
                centroid_distances(r.model)
            },
            evidence: match r.evaluation {
                Some(e) => rule.evidence(&e.rows),
                None => vec![f64::NAN; n_rows],
            },
            gains: r
                .evaluation
                .map(|e| e.rows.iter().map(|row| row.gain).collect()),
        }
    }

    /// The rows ranked by held-out gain (by gate without an evaluation),
    /// ties in index order.
    fn by_usefulness(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.gates.len()).collect();
        let key = |i: usize| self.gains.as_ref().map_or(self.gates[i], |g| g[i]);
        order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
        order
    }

    /// Row `i` of the report.
    fn row(&self, i: usize) -> RowReport {
        let r = self.input;
        let index = r.model.split.index();
        let (l, t) = (index.language_index[i], index.token_index[i]);
        RowReport {
            language: l,
            token: t,
            language_name: language_name(r.labels, l),
            token_string: r
                .labels
                .token_strings
                .as_ref()
                .and_then(|s| s.get(t))
                .cloned(),
            gate: r.use_gate.then(|| self.gates[i]),
            distance_to_centroid: (!r.use_gate).then(|| self.distances[i]),
            heldout: r.evaluation.map(|e| {
                let row = &e.rows[i];
                RowHeldOut {
                    gain: row.gain,
                    gain_per_token: row.gain_per_token,
                    gain_se: row.gain_se,
                    tokens: row.n_tokens,
                    gain_null: row.null_mean * row.n_tokens as f64,
                    evidence: self.evidence[i],
                }
            }),
            kept: r.use_gate.then(|| self.kept[i]),
            planted: r.labels.planted.as_ref().map(|p| p[i]),
            score: index.score.as_ref().map(|s| s[i]),
        }
    }

    /// What a gated run keeps, `order` its rows by usefulness.
    fn gated(&self, order: &[usize]) -> GatedOutcome {
        let r = self.input;
        let index = r.model.split.index();
        let (gates, kept, gains) = (&self.gates, &self.kept, self.gains.as_ref());
        let score = index.score.as_deref();
        GatedOutcome {
            rule: self.rule,
            kept: order
                .iter()
                .filter(|&&i| kept[i])
                .take(r.kept_limit)
                .map(|&i| self.row(i))
                .collect(),
            n_kept: kept.iter().filter(|&&k| k).count(),
            effective_vocabularies: vocabularies_kept(index, kept, r.model.config().n_languages),
            gate_mean: gates.iter().sum::<f64>() / gates.len().max(1) as f64,
            spearman_gain_gate: gains.map(|g| spearman(g, gates)),
            spearman_gain_score: gains.zip(score).map(|(g, s)| spearman(g, s)),
            spearman_gate_score: score.map(|s| spearman(gates, s)),
            planted: r.labels.planted.as_deref().map(|p| PlantedReport {
                n_planted: p.iter().filter(|&&x| x).count(),
                agreement: agreement(kept, p),
                gate_auc: roc_auc(gates, p),
                gate_average_precision: average_precision(gates, p),
                gain_auc: gains.and_then(|g| roc_auc(g, p)),
            }),
        }
    }

    /// How far a fusion-mode run's rows fused.
    fn fusion(&self) -> FusionOutcome {
        let finite: Vec<f64> = self
            .distances
            .iter()
            .copied()
            .filter(|d| d.is_finite())
            .collect();
        FusionOutcome {
            distinct_rows_per_token: effective_vocabularies(
                self.input.model,
                false,
                SAME_EMBEDDING,
            )
            .mean,
            mean_distance_to_centroid: finite.iter().sum::<f64>() / finite.len().max(1) as f64,
        }
    }
}
