//! Options several commands share, each set flattened into the commands
//! that have it. Their defaults are those of [`RunConfig`].

use clap::Args;

use crate::app::run::RunConfig;
use crate::app::train::TrainConfig;

use super::CliResult;

/// The defaults of the training commands' options.
fn defaults() -> RunConfig {
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
}
