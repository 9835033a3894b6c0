//! Options several commands share, each set flattened into the commands
//! that have it. Their defaults are those of [`RunConfig`].

use std::path::PathBuf;

use clap::Args;

use crate::app::data::{self, Data, DataSource};
use crate::app::run::RunConfig;
use crate::app::train::TrainConfig;

use super::{CliResult, set_threads};

/// The defaults of the training commands' options.
pub fn defaults() -> RunConfig {
    RunConfig::default()
}

/// What every training command trains with: the batch, the width and the
/// learning rate.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct ModelArgs {
    /// Bigrams per step.
    #[arg(long, default_value_t = defaults().train.batch)]
    pub batch: usize,
    /// Embedding width D.
    #[arg(long, default_value_t = defaults().dim)]
    pub dim: usize,
    /// Learning rate.
    #[arg(long, default_value_t = defaults().train.lr)]
    pub lr: f64,
}

impl ModelArgs {
    /// Checks `--batch`, `--dim` and `--lr`.
    pub fn check(&self) -> CliResult<()> {
        if self.batch == 0 {
            return Err("--batch must be at least 1".into());
        }
        if self.dim == 0 {
            return Err("--dim must be at least 1".into());
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(format!("--lr must be a finite number > 0, got {}", self.lr).into());
        }
        Ok(())
    }

    /// `steps` steps with these options and `seed`, gated, with no penalty.
    pub fn train(&self, steps: u64, seed: u64) -> TrainConfig {
        TrainConfig {
            steps,
            batch: self.batch,
            lr: self.lr,
            gate_penalty: 0.0,
            fusion_penalty: 0.0,
            use_gate: true,
            seed,
            ..TrainConfig::default()
        }
    }
}

/// The worker threads and the seed of a command that trains.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct RunArgs {
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Seed of the corpus, the weights and the batches.
    #[arg(long, default_value_t = defaults().data.seed)]
    pub seed: u64,
    /// Show no progress (the report and errors still print). Without it,
    /// progress is a bar on a terminal and a plain line every few seconds
    /// otherwise.
    #[arg(long)]
    pub quiet: bool,
}

impl RunArgs {
    /// Starts the worker threads, then loads `corpus` (`None`: the
    /// synthetic one) with every pair seen `min_count` times a row, by the
    /// seed: the threads started, and the data.
    pub fn start(&self, corpus: Option<PathBuf>, min_count: usize) -> CliResult<(usize, Data)> {
        let threads = set_threads(self.threads)?;
        let data = data::load(&DataSource::of_corpus(corpus, min_count, self.seed))?;
        Ok((threads, data))
    }
}
