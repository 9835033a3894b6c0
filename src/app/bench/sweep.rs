//! The scaling table: the bigram model's training step (the main job of
//! `splitgrad train`) over vocabulary sizes V and widths D.
//!
//! For each (V, D) the built-in synthetic corpus is generated at that V
//! ([`crate::app::synthetic`], L languages), a [`BigramModel`] of width D is
//! trained on it with the command line's optimisers and settings (batch
//! 4096, lr 0.01, gate penalty 0.005), and one warm-up step and `steps`
//! timed steps are run. Each row relates the median step to the machine's
//! rates measured in the same process, on the same threads:
//!
//! - the head's products, `6·m·V·D` flops per step (m the distinct hidden
//!   rows of the batch, the rows the head computes), against the rate of an
//!   (m, D)·(D, V) sgemm through `matrixmultiply`;
//! - the bytes a step must move over the V × D arrays, `9·V·D·4` (read W,
//!   write ∂W, Adam's read of p, m, v, g and write of p, m, v), against the
//!   rate of a large copy.
//!
//! `docs/bench.md#the-scaling-table` has the table of this machine.

use std::time::Instant;

use crate::app::model::{BigramModel, ModelConfig};
use crate::app::synthetic::{SyntheticConfig, generate};
use crate::app::train::{TrainConfig, Trainer};
use crate::error::{Error, Result};
use crate::rng::Rng;

use super::{copy_rate_gbps, median, sgemm_gflops};

/// What [`sweep`] runs.
///
/// ```
/// use splitgrad::app::bench::SweepConfig;
/// let c = SweepConfig::default();
/// assert_eq!(c.vocab_sizes, vec![500, 2000, 8000, 32000, 128000]);
/// assert_eq!(c.dims, vec![64, 512]);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct SweepConfig {
    /// The vocabulary sizes V.
    pub vocab_sizes: Vec<usize>,
    /// The widths D.
    pub dims: Vec<usize>,
    /// Timed steps per (V, D), after one warm-up step; at least 1.
    pub steps: usize,
    /// Bigrams per step.
    pub batch: usize,
    /// Languages of the synthetic corpus.
    pub n_languages: usize,
    /// Seed of the corpus, the weights and the batches.
    pub seed: u64,
}

impl Default for SweepConfig {
    /// V ∈ {500, 2000, 8000, 32000, 128000}, D ∈ {64, 512}, 5 steps of
    /// 4096 bigrams, 8 languages, seed 0.
    fn default() -> Self {
        SweepConfig {
            vocab_sizes: vec![500, 2000, 8000, 32000, 128000],
            dims: vec![64, 512],
            steps: 5,
            batch: 4096,
            n_languages: 8,
            seed: 0,
        }
    }
}

/// One (V, D) of the table.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepRow {
    /// V.
    pub vocab_size: usize,
    /// D.
    pub dim: usize,
    /// Bigrams per step.
    pub batch: usize,
    /// The split rows of the model (the synthetic index).
    pub split_rows: usize,
    /// Distinct hidden rows per timed step, on average: the rows the head
    /// computes.
    pub hidden_rows: f64,
    /// Seconds of each timed step.
    pub step_s: Vec<f64>,
    /// Median of `step_s`.
    pub median_s: f64,
    /// `batch / median_s`.
    pub tokens_per_s: f64,
    /// `6·m·V·D`, the head's products per step (m = `hidden_rows`).
    pub head_flops: f64,
    /// `head_flops / median_s`, GFLOP/s.
    pub gflops: f64,
    /// The rate of an (m, D)·(D, V) sgemm through `matrixmultiply`, GFLOP/s.
    pub sgemm_gflops: f64,
    /// `gflops / sgemm_gflops`: the share of the step the head's products
    /// would take at the sgemm's rate.
    pub sgemm_fraction: f64,
    /// `9·V·D·4`: the bytes a step must move over the V × D arrays.
    pub bytes: u64,
    /// The rate of a large copy (read plus write), GB/s.
    pub memcpy_gbps: f64,
    /// `bytes / median_s / copy rate`.
    pub copy_fraction: f64,
}

/// Runs the table, calling `each` with every row as it is done.
///
/// Errors ([`ErrorKind::Config`](crate::ErrorKind::Config)): no sizes, a
/// size, a width, the batch or the steps 0, or no language.
///
/// ```
/// use splitgrad::app::bench::{sweep, SweepConfig};
/// let c = SweepConfig { vocab_sizes: vec![50], dims: vec![4], steps: 1, batch: 64, ..SweepConfig::default() };
/// let rows = sweep(&c, |_| {})?;
/// assert_eq!(rows.len(), 1);
/// assert!(rows[0].tokens_per_s > 0.0 && rows[0].hidden_rows >= 1.0);
/// # Ok::<(), splitgrad::Error>(())
/// ```
pub fn sweep(cfg: &SweepConfig, mut each: impl FnMut(&SweepRow)) -> Result<Vec<SweepRow>> {
    if cfg.vocab_sizes.is_empty() || cfg.dims.is_empty() {
        return Err(Error::config("the sweep needs at least one V and one D"));
    }
    if cfg.vocab_sizes.contains(&0) || cfg.dims.contains(&0) {
        return Err(Error::config("every V and D must be at least 1"));
    }
    if cfg.steps == 0 || cfg.batch == 0 || cfg.n_languages == 0 {
        return Err(Error::config(
            "steps, batch and languages must be at least 1",
        ));
    }
    let mut rows = Vec::new();
    for &dim in &cfg.dims {
        for &vocab_size in &cfg.vocab_sizes {
            let row = one(cfg, vocab_size, dim)?;
            each(&row);
            rows.push(row);
        }
    }
    Ok(rows)
}

/// One (V, D).
fn one(cfg: &SweepConfig, vocab_size: usize, dim: usize) -> Result<SweepRow> {
    let synth = generate(&SyntheticConfig {
        vocab_size,
        n_languages: cfg.n_languages,
        n_contested: 40.min(vocab_size * cfg.n_languages / 4).max(1),
        seed: cfg.seed,
        ..SyntheticConfig::default()
    });
    let split_rows = synth.index.token_index.len();
    let mut model = BigramModel::<f32>::new(
        ModelConfig::new(vocab_size, cfg.n_languages, dim),
        synth.index,
    )?;
    model.reset_parameters(&mut Rng::new(cfg.seed))?;
    let steps = cfg.steps as u64 + 1;
    let mut trainer = Trainer::new(
        model,
        synth.corpus,
        TrainConfig {
            steps,
            batch: cfg.batch,
            lr: 0.01,
            gate_penalty: 0.005,
            fusion_penalty: 0.0,
            use_gate: true,
            seed: cfg.seed,
            ..TrainConfig::default()
        },
    )?;
    trainer.step()?;
    let mut step_s = Vec::with_capacity(cfg.steps);
    let mut m_sum = 0usize;
    for _ in 0..cfg.steps {
        let t0 = Instant::now();
        trainer.step()?;
        step_s.push(t0.elapsed().as_secs_f64());
        m_sum += trainer.last_contexts();
    }
    let median_s = median(&step_s);
    let hidden_rows = m_sum as f64 / cfg.steps as f64;
    drop(trainer);
    let m = hidden_rows.round().max(1.0) as usize;
    let head_flops = 6.0 * hidden_rows * vocab_size as f64 * dim as f64;
    let gflops = head_flops / median_s / 1e9;
    let sgemm = sgemm_gflops(m, dim, vocab_size, None);
    let bytes = 9 * 4 * (vocab_size * dim) as u64;
    let copy = copy_rate_gbps(64 << 20);
    Ok(SweepRow {
        vocab_size,
        dim,
        batch: cfg.batch,
        split_rows,
        hidden_rows,
        median_s,
        tokens_per_s: cfg.batch as f64 / median_s,
        head_flops,
        gflops,
        sgemm_gflops: sgemm,
        sgemm_fraction: gflops / sgemm,
        bytes,
        memcpy_gbps: copy,
        copy_fraction: bytes as f64 / median_s / (copy * 1e9),
        step_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_configs_are_errors() {
        let c = SweepConfig::default();
        for bad in [
            SweepConfig {
                vocab_sizes: vec![],
                ..c.clone()
            },
            SweepConfig {
                dims: vec![0],
                ..c.clone()
            },
            SweepConfig {
                steps: 0,
                ..c.clone()
            },
            SweepConfig {
                batch: 0,
                ..c.clone()
            },
        ] {
            assert!(sweep(&bad, |_| {}).is_err(), "{bad:?}");
        }
    }
}
