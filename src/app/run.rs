//! A training run of `splitgrad train`: the model built for the data and
//! trained step by step, with the held-out cross-entropy at every power of
//! two, a checkpoint every few steps, the training speed, and at the end
//! the held-out evaluation and the report.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::app::data::{Data, DataSource};
use crate::app::eval::{evaluate, heldout_ce};
use crate::app::report::{HeadRate, Memory, ROWS_LISTED, Report, ReportInput, Throughput};
use crate::app::train::{StepStats, TrainConfig, Trainer};
use crate::error::Result;

/// Everything a run is told, with the defaults of `splitgrad train`.
#[derive(Clone, Debug, PartialEq)]
pub struct RunConfig {
    /// Where the data come from.
    pub data: DataSource,
    /// The steps, the batch, the optimiser and the penalties.
    pub train: TrainConfig,
    /// The embedding width D.
    pub dim: usize,
    /// A checkpoint every this many steps (and at the end).
    pub checkpoint_every: u64,
}

impl Default for RunConfig {
    /// 1000 steps of 4096 bigrams at width 64, a checkpoint every 100.
    fn default() -> Self {
        RunConfig {
            data: DataSource::default(),
            train: TrainConfig::default(),
            dim: 64,
            checkpoint_every: 100,
        }
    }
}

/// How a run stopped early, by [`Run::stop`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// At this step, with a checkpoint of it.
    Saved(u64),
    /// At the step it was resumed from: the checkpoint is unchanged.
    AsResumed(u64),
    /// Before its first step: no checkpoint was written.
    BeforeFirstStep,
}

/// A run in progress (see the module docs).
pub struct Run<'a> {
    data: &'a Data,
    trainer: Trainer<f32>,
    checkpoint: PathBuf,
    checkpoint_every: u64,
    /// The step the run started (or resumed) at.
    first: u64,
    /// Seconds in the steps only: the held-out evaluations and the
    /// checkpoints are timed apart.
    stepping: f64,
    /// Distinct hidden rows (contexts) of the steps run, for the head's rate.
    contexts: f64,
    /// The latest held-out cross-entropy (NaN before any).
    heldout: f64,
    /// Files that describe the checkpoint this run replaces (a finished
    /// run's report and plots), removed when it is first replaced.
    stale: Vec<PathBuf>,
}

impl<'a> Run<'a> {
    /// A run on `data` at its first step, or, with `resume`, continued from
    /// the checkpoint at `checkpoint` (which every later checkpoint
    /// replaces). The held-out cross-entropy of a run at step 0 is measured
    /// before it trains.
    pub fn start(
        data: &'a Data,
        config: &RunConfig,
        checkpoint: PathBuf,
        resume: bool,
    ) -> Result<Self> {
        let mut trainer = data.trainer(Some(&data.index), config.dim, config.train)?;
        trainer.bind_heldout(&data.heldout);
        if resume {
            trainer.load(&checkpoint)?;
        }
        trainer.set_labels(data.labels(trainer.model().split.index()));
        if trainer.step_index() == 0 {
            let (ce, ce_closed) =
                heldout_ce(trainer.model(), &data.heldout, config.train.use_gate)?;
            trainer.record_heldout(ce, ce_closed);
        }
        let heldout = trainer.heldout_curve().last().map_or(f64::NAN, |c| c.1);
        Ok(Run {
            data,
            first: trainer.step_index(),
            trainer,
            checkpoint,
            checkpoint_every: config.checkpoint_every,
            stepping: 0.0,
            contexts: 0.0,
            heldout,
            stale: Vec::new(),
        })
    }

    /// Files that describe the checkpoint in place when the run started
    /// (the report and plots of a run finished there, which `--force`
    /// replaces or `--resume` takes further): removed as soon as this run
    /// replaces that checkpoint, so that none is left beside a checkpoint
    /// it does not describe, and none is lost while the old checkpoint
    /// stays.
    pub fn set_stale(&mut self, files: Vec<PathBuf>) {
        self.stale = files;
    }

    /// Writes the checkpoint, then removes the stale files.
    fn save(&mut self) -> Result<()> {
        self.trainer.save(&self.checkpoint)?;
        for f in std::mem::take(&mut self.stale) {
            crate::io::remove_if_present(&f).map_err(|e| crate::Error::from(e).in_file(&f))?;
        }
        Ok(())
    }

    /// The trainer, its model and its record.
    pub fn trainer(&self) -> &Trainer<f32> {
        &self.trainer
    }

    /// The checkpoint the run writes.
    pub fn checkpoint(&self) -> &Path {
        &self.checkpoint
    }

    /// Whether every step has run.
    pub fn is_done(&self) -> bool {
        self.trainer.is_done()
    }

    /// Runs one step; then, unless it was the last, the held-out
    /// cross-entropy at a power of two and a checkpoint every
    /// `checkpoint_every` steps.
    pub fn step(&mut self) -> Result<StepStats> {
        let t0 = Instant::now();
        let s = self.trainer.step()?;
        self.stepping += t0.elapsed().as_secs_f64();
        self.contexts += self.trainer.last_contexts() as f64;
        let step = self.trainer.step_index();
        if step.is_power_of_two() && !self.trainer.is_done() {
            let use_gate = self.trainer.config().use_gate;
            let (ce, ce_closed) = heldout_ce(self.trainer.model(), &self.data.heldout, use_gate)?;
            self.trainer.record_heldout(ce, ce_closed);
            self.heldout = ce;
        }
        if step.is_multiple_of(self.checkpoint_every) && !self.trainer.is_done() {
            self.save()?;
        }
        Ok(s)
    }

    /// The latest held-out cross-entropy (NaN before any).
    pub fn heldout_ce(&self) -> f64 {
        self.heldout
    }

    /// Steps run since the start (or the resume).
    pub fn steps_run(&self) -> u64 {
        self.trainer.step_index() - self.first
    }

    /// Tokens per second of the steps run so far.
    pub fn tokens_per_second(&self) -> f64 {
        self.steps_run() as f64 * self.trainer.config().batch as f64 / self.stepping.max(1e-9)
    }

    /// Ends the run early: a checkpoint of the last step finished, unless
    /// no step was run.
    pub fn stop(&mut self) -> Result<Stopped> {
        let step = self.trainer.step_index();
        Ok(if step > self.first {
            self.save()?;
            Stopped::Saved(step)
        } else if step > 0 {
            Stopped::AsResumed(step)
        } else {
            Stopped::BeforeFirstStep
        })
    }

    /// Ends the run at its last step: the held-out evaluation, the last
    /// checkpoint, and the report with the training speed on `threads`
    /// threads.
    pub fn finish(&mut self, threads: usize) -> Result<Report> {
        let steps_run = self.steps_run();
        let tokens_per_second = if steps_run > 0 {
            self.tokens_per_second()
        } else {
            0.0
        };
        let use_gate = self.trainer.config().use_gate;
        let evaluation = evaluate(self.trainer.model(), &self.data.heldout, use_gate)?;
        self.trainer
            .record_heldout(evaluation.ce, evaluation.ce_closed);
        self.trainer.set_evaluation(evaluation);
        self.save()?;
        let t = &self.trainer;
        let mut report = Report::build(&ReportInput {
            model: t.model(),
            history: t.history(),
            labels: t.labels(),
            heldout_curve: t.heldout_curve(),
            evaluation: t.evaluation(),
            use_gate,
            checkpoint: &self.checkpoint,
            kept_limit: ROWS_LISTED,
        });
        report.heldout_source = Some(self.data.heldout_source.clone());
        report.memory = Some(Memory::of_trainer(t));
        report.throughput = Some(Throughput {
            tokens_per_second,
            threads,
            head: (steps_run > 0).then(|| {
                // The head's work: 6·m·V·D flops a step for m distinct contexts.
                let m = self.contexts / steps_run as f64;
                let flops = 6.0 * m * self.data.vocab_size as f64 * t.model().config().dim as f64;
                HeadRate {
                    contexts_per_step: m,
                    gflops: flops * steps_run as f64 / self.stepping.max(1e-9) / 1e9,
                }
            }),
        });
        Ok(report)
    }
}
