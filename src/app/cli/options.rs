//! Options several commands share, each set flattened into the commands
//! that have it. Their defaults are those of [`RunConfig`].

use std::collections::BTreeSet;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args};

use crate::app::data::{self, Data, DataSource};
use crate::app::run::RunConfig;
use crate::app::train::{Precision, RoundingMode, TrainConfig};
use crate::param::Dtype;

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

/// `--dtype`'s value: f32, bf16 or f16 (torch's names too, in any case).
/// A known dtype the model cannot keep (f64) is taken here and refused by
/// [`PrecisionArgs::precision`] with its reason.
pub fn param_dtype_arg(s: &str) -> Result<Dtype, String> {
    s.parse()
        .map_err(|_| format!("unknown dtype `{s}` (expected f32, bf16 or f16)"))
}

/// `--state-dtype`'s value: f32 or bf16, as [`param_dtype_arg`] takes them.
pub fn state_dtype_arg(s: &str) -> Result<Dtype, String> {
    s.parse()
        .map_err(|_| format!("unknown dtype `{s}` (expected f32 or bf16)"))
}

/// How a training command keeps the model's parameters and the
/// optimisers' moments, and how it rounds what it keeps in half precision.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct PrecisionArgs {
    /// How the model's parameters are kept: f32, bf16 or f16 (the math is
    /// f32).
    #[arg(long, default_value = "f32", value_parser = param_dtype_arg)]
    pub dtype: Dtype,
    /// How the optimisers keep their moments: f32 or bf16.
    #[arg(long, default_value = "f32", value_parser = state_dtype_arg)]
    pub state_dtype: Dtype,
    /// How values stored in bf16 or f16 are rounded: stochastic or nearest
    /// [default: stochastic]; only with --dtype or --state-dtype in half
    /// precision.
    #[arg(long)]
    pub rounding: Option<RoundingMode>,
}

impl Default for PrecisionArgs {
    /// The flags' defaults: f32 parameters and state, no `--rounding`.
    fn default() -> Self {
        PrecisionArgs {
            dtype: Dtype::F32,
            state_dtype: Dtype::F32,
            rounding: None,
        }
    }
}

impl PrecisionArgs {
    /// `--dtype`, `--state-dtype` and `--rounding`, checked.
    pub fn precision(&self) -> CliResult<Precision> {
        if !matches!(self.dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16) {
            return Err(format!(
                "--dtype {}: the model keeps its parameters as f32, bf16 or f16",
                self.dtype
            )
            .into());
        }
        match self.state_dtype {
            Dtype::F32 | Dtype::BF16 => {}
            Dtype::F16 => {
                return Err(
                    "--state-dtype f16: f16 cannot keep Adam's second moment (a squared gradient below 6e-8 is lost); keep the optimiser state in bf16 or f32"
                        .into(),
                );
            }
            other => {
                return Err(format!(
                    "--state-dtype {other}: the optimiser state is kept as f32 or bf16"
                )
                .into());
            }
        }
        let precision = Precision {
            dtype: self.dtype,
            state_dtype: self.state_dtype,
            rounding: self.rounding.unwrap_or_default(),
        };
        if let Some(r) = self.rounding
            && !precision.is_half()
        {
            return Err(format!(
                "--rounding {r} rounds values kept in half precision, and this run keeps none: give --dtype bf16 or f16, or --state-dtype bf16, or leave --rounding out"
            )
            .into());
        }
        Ok(precision)
    }
}

/// `", parameters in bf16, moments in f32 (stochastic rounding)"` for a
/// run that keeps something in half precision; nothing for f32.
pub fn kept_as(p: &Precision) -> String {
    if p.is_half() {
        format!(
            ", parameters in {}, moments in {} ({} rounding)",
            p.dtype, p.state_dtype, p.rounding
        )
    } else {
        String::new()
    }
}

/// The worker threads and the seed of a command that trains.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct RunArgs {
    /// Worker threads (default: RAYON_NUM_THREADS if set, else all cores).
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

/// The options given on the command line rather than left at their
/// defaults (clap's ids: the fields' names), so that a command can refuse
/// an option it would not honour even when the option has a default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Given(BTreeSet<String>);

impl Given {
    /// The options of `m` (one subcommand's matches) given on the command
    /// line.
    pub fn of(m: &ArgMatches) -> Given {
        Given(
            m.ids()
                .filter(|id| m.value_source(id.as_str()) == Some(ValueSource::CommandLine))
                .map(|id| id.as_str().to_string())
                .collect(),
        )
    }

    /// Whether the option with this id (its field's name) was given.
    pub fn has(&self, id: &str) -> bool {
        self.0.contains(id)
    }

    /// The flags (`--name`) of those of `ids` that were given, as a list
    /// in words (`--steps, --dim and --lr`); `None` when none was.
    pub fn flags(&self, ids: &[&str]) -> Option<String> {
        let flags: Vec<String> = ids
            .iter()
            .filter(|id| self.has(id))
            .map(|id| format!("--{}", id.replace('_', "-")))
            .collect();
        match flags.as_slice() {
            [] => None,
            [one] => Some(one.clone()),
            [rest @ .., last] => Some(format!("{} and {last}", rest.join(", "))),
        }
    }
}

/// `--min-count`, which must be at least 1.
pub fn check_min_count(min_count: usize) -> CliResult<()> {
    if min_count == 0 {
        return Err(
            "--min-count must be at least 1: a pair never seen has nothing to learn from".into(),
        );
    }
    Ok(())
}
