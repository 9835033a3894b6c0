//! The four benchmark workloads of `docs/spec.md#5-benchmark-workloads`, timed step by step.
//!
//! One step is a forward pass, the backward pass and the optimiser
//! update, with the real layers and optimisers (on a [`Tape`], or through
//! the layers' tape-free saved pairs, which give the tape's bits; the
//! embedding workloads sum each touched row's gradient inside the update,
//! [`SplitTokenEmbeddings::backward_update_saved`]):
//!
//! | workload | layer | sizes | trainable (optimiser) | loss |
//! |---|---|---|---|---|
//! | `embed_prompt` | [`SplitTokenEmbeddings`] | orig 151936, prompt 16; H 1024; 8192 ids, every 8th a prompt id | prompt ([`LazyAdam`]) | Σ out ⊙ R |
//! | `embed_full` | [`SplitTokenEmbeddings`] | orig 32000, special 256, prompt 64; H 1024; 8192 ids | all ([`LazyAdam`]) | Σ out ⊙ R |
//! | `splitvocab` | a shared table gathered, then [`SplitVocabulary`] | 32000 × 512; 8 languages; 20000 rows; 8192 tokens | shared table, rows ([`LazyAdam`]); gate logits ([`Adam`]) | Σ out ⊙ R + 0.01·penalty + 0.01·fusion |
//! | `lmhead` | [`SplitLanguageModellingHead`] | 32000 + 256; H 512; 2048 tokens, 10 % labels −100 | weights ([`Adam`]), hidden's gradient | Σ per-token loss |
//!
//! Ids are drawn with [`Zipf`] (exponent 1.2) over the vocabulary, in
//! `embed_prompt` from the original split except at every 8th position
//! (`i mod 8 = 7`), which holds a prompt id (Zipf over the 16). The split
//! rows of `splitvocab` are 20000 distinct (language, token) pairs drawn
//! uniformly from the 8 × 32000 cells; token languages are uniform. R, the
//! hidden states and every weight are drawn once from a fixed seed; lr is
//! 1e-3 throughout.
//!
//! The head's weights get dense [`Adam`]: their gradient is dense (every
//! vocabulary row takes softmax mass from every token), so they are the
//! "dense parameters" of `docs/spec.md#5-benchmark-workloads`, as `nn.Linear` weights are in
//! PyTorch. Lazy Adam would update the same rows, every one of them, with
//! `SparseAdam`'s ε. The split rows of `splitvocab` use [`LazyAdam`] as a
//! table, but the fusion penalty reads every row, so their gradient is
//! dense and every row moves each step.
//!
//! [`run`] times one warm-up step and then `steps` steps, reads the peak
//! resident memory, measures a large memory copy (and, for `lmhead`, an
//! sgemm) in the same process and on the same threads, and relates the
//! step to them. With [`BenchConfig::reference`], `lmhead` alternates its
//! steps with steps of the same head on `matrixmultiply`, the reference
//! kernel, and reports both. With [`BenchConfig::versus_f32`], a workload
//! kept in half precision alternates its steps with those of the same
//! workload in f32, built beside it, in blocks of
//! [`BenchConfig::versus_block`] steps, and reports the two ([`Versus`]).
//! [`sweep()`] times the bigram model's training
//! step over vocabulary sizes and widths. The bytes a step must move are counted term by term in
//! [`BenchReport::bytes_terms`]; the formulas are in `docs/bench.md`.
//!
//! [`SplitTokenEmbeddings`]: crate::layers::SplitTokenEmbeddings
//! [`SplitTokenEmbeddings::backward_update_saved`]: crate::layers::SplitTokenEmbeddings::backward_update_saved
//! [`SplitVocabulary`]: crate::layers::SplitVocabulary
//! [`SplitLanguageModellingHead`]: crate::layers::SplitLanguageModellingHead
//! [`LazyAdam`]: crate::optim::LazyAdam
//! [`Adam`]: crate::optim::Adam
//! [`Zipf`]: crate::rng::Zipf
//! [`Tape`]: crate::Tape

use std::fmt;
use std::str::FromStr;
use std::time::Instant;

use crate::param::Dtype;
use crate::{Error, Result};

mod rates;
mod report;
pub mod sweep;
mod workloads;

pub use report::{BenchReport, Versus};

use rates::{PairedCopy, copy_rate_gbps, lazy_adam_gelems, peak_rss_mib, sched_ns, sgemm_gflops};
pub use sweep::{SweepConfig, SweepRow, sweep};
use workloads::build;

/// Bytes of one `f32`.
const F32: u64 = 4;

/// One of the four workloads of `docs/spec.md#5-benchmark-workloads`.
///
/// ```
/// use splitgrad::app::bench::Workload;
/// let w: Workload = "embed_full".parse()?;
/// assert_eq!(w, Workload::EmbedFull);
/// assert_eq!(w.to_string(), "embed_full");
/// assert!("embed".parse::<Workload>().is_err());
/// # Ok::<(), splitgrad::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Workload {
    /// Prompt tuning: a frozen 151936-row table, 16 trained prompt rows.
    EmbedPrompt,
    /// Three trained splits of 32000, 256 and 64 rows.
    EmbedFull,
    /// A shared table and a gated split vocabulary with both penalties.
    SplitVocab,
    /// The fused split LM head with per-token cross-entropy.
    LmHead,
}

impl Workload {
    /// All four, in the order of `docs/spec.md#5-benchmark-workloads`.
    pub const ALL: [Workload; 4] = [
        Workload::EmbedPrompt,
        Workload::EmbedFull,
        Workload::SplitVocab,
        Workload::LmHead,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Workload::EmbedPrompt => "embed_prompt",
            Workload::EmbedFull => "embed_full",
            Workload::SplitVocab => "splitvocab",
            Workload::LmHead => "lmhead",
        }
    }

    /// Its largest size (a vocabulary), which [`BenchConfig::scale`] may
    /// divide down to 1 at most.
    ///
    /// ```
    /// use splitgrad::app::bench::Workload;
    /// assert_eq!(Workload::EmbedPrompt.largest_size(), 151936);
    /// ```
    pub fn largest_size(self) -> usize {
        match self {
            Workload::EmbedPrompt => 151936,
            Workload::EmbedFull | Workload::SplitVocab | Workload::LmHead => 32000,
        }
    }

    /// PyTorch 2.15's seconds per step on the reference 2-core machine
    /// (MKL, 2 threads, best of dense Adam and SparseAdam), as issue 6
    /// quotes them: the figure the speed targets are ratios of.
    ///
    /// ```
    /// use splitgrad::app::bench::Workload;
    /// assert_eq!(Workload::LmHead.pytorch_s(), 1.18);
    /// ```
    pub fn pytorch_s(self) -> f64 {
        match self {
            Workload::EmbedPrompt => 0.085,
            Workload::EmbedFull => 0.179,
            Workload::SplitVocab => 0.277,
            Workload::LmHead => 1.18,
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Workload {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| {
                Error::config(format!(
                    "unknown workload `{s}` (expected embed_prompt, embed_full, splitvocab or lmhead)"
                ))
            })
    }
}

/// What [`run`] does.
///
/// ```
/// use splitgrad::app::bench::{BenchConfig, Workload};
/// let c = BenchConfig::new(Workload::LmHead);
/// assert_eq!((c.steps, c.threads, c.scale), (10, None, 1));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BenchConfig {
    /// The workload.
    pub workload: Workload,
    /// Timed steps after the warm-up step, at least 1.
    pub steps: usize,
    /// Rayon threads (a pool of its own); `None` runs in the current pool.
    /// The matrix products use `MATMUL_NUM_THREADS` threads, which
    /// `matrixmultiply` reads once per process.
    pub threads: Option<usize>,
    /// Every size divided by this (at least 1 each): 1 is the workload of
    /// `docs/spec.md#5-benchmark-workloads`, larger values make a quick smoke run.
    pub scale: usize,
    /// For `lmhead`: also time each step on `matrixmultiply`
    /// ([`HeadKernel::Matrixmultiply`](crate::ops::fused_ce::HeadKernel)),
    /// the two kernels alternating step by step.
    pub reference: bool,
    /// How the parameters are kept (f32, bf16 or f16; the math is f32).
    pub dtype: Dtype,
    /// How the optimisers keep their moments (f32 or bf16).
    pub state_dtype: Dtype,
    /// With a half-precision `dtype` or `state_dtype`: also build the
    /// workload in f32 and time its steps alternating with these, in blocks
    /// of [`Self::versus_block`] steps, the order swapped every block
    /// ([`BenchReport::versus_f32`]).
    pub versus_f32: bool,
    /// With `versus_f32`: the steps each side takes before the other takes
    /// its turn (at least 1). With 1 (the default) the two alternate step
    /// by step and every step starts on the caches the other workload left:
    /// the stricter figure for the side whose data would have stayed in
    /// cache. In a longer block the steps after the first follow steps of
    /// their own workload, as in a training loop.
    pub versus_block: usize,
    /// Right after each timed step (each side's, with `versus_f32`), time
    /// a copy of as many bytes as the step moves, and set each step
    /// against its copy ([`BenchReport::paired_bandwidth_fraction`]). The
    /// copies leave the caches cold for the next step, as alternating with
    /// `versus_f32` does, so the steps' times are those of a step that
    /// finds little of its data in the last-level cache.
    pub paired_copy: bool,
}

impl BenchConfig {
    /// The workload as specified: 10 steps, the current pool, full size.
    pub fn new(workload: Workload) -> Self {
        BenchConfig {
            workload,
            steps: 10,
            threads: None,
            scale: 1,
            reference: false,
            dtype: Dtype::F32,
            state_dtype: Dtype::F32,
            versus_f32: false,
            versus_block: VERSUS_BLOCK,
            paired_copy: false,
        }
    }
}

/// The default [`BenchConfig::versus_block`].
pub const VERSUS_BLOCK: usize = 1;

/// Runs a workload: builds it, one warm-up step, `steps` timed steps, then
/// the memory copy (and sgemm) it is compared with.
///
/// Errors ([`ErrorKind::Config`](crate::ErrorKind::Config)): 0 steps, scale
/// 0 or above the workload's largest size, 0 threads or a thread pool that cannot start; `versus_f32` with no
/// array in half precision, or with `reference`.
///
/// ```
/// use splitgrad::app::bench::{run, BenchConfig, Workload};
/// let cfg = BenchConfig { steps: 2, scale: 256, ..BenchConfig::new(Workload::EmbedFull) };
/// let r = run(&cfg)?;
/// assert_eq!(r.step_s.len(), 2);
/// assert!(r.min_s <= r.median_s && r.bytes_moved > 0 && r.loss.is_finite());
/// # Ok::<(), splitgrad::Error>(())
/// ```
pub fn run(cfg: &BenchConfig) -> Result<BenchReport> {
    if cfg.steps == 0 {
        return Err(Error::config("steps must be at least 1"));
    }
    if cfg.scale == 0 {
        return Err(Error::config("scale must be at least 1"));
    }
    let largest = cfg.workload.largest_size();
    if cfg.scale > largest {
        return Err(Error::config(format!(
            "scale {} is above {}'s largest size ({largest}): every size would be 1",
            cfg.scale, cfg.workload
        )));
    }
    if cfg.versus_f32 && !(cfg.dtype.is_half() || cfg.state_dtype.is_half()) {
        return Err(Error::config(
            "versus f32: the run keeps everything in f32 already (give a half-precision dtype or state dtype)",
        ));
    }
    if cfg.versus_block == 0 {
        return Err(Error::config(
            "versus f32: a block must hold at least 1 step",
        ));
    }
    if cfg.versus_f32 && cfg.reference {
        return Err(Error::config(
            "versus f32 and the reference kernel cannot alternate in one run: ask for one of them",
        ));
    }
    match cfg.threads {
        Some(0) => Err(Error::config("threads must be at least 1")),
        Some(n) => rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .map_err(|e| Error::config(format!("cannot start {n} threads: {e}")))?
            .install(|| run_here(cfg)),
        None => run_here(cfg),
    }
}

/// [`run`] in the current rayon pool.
fn run_here(cfg: &BenchConfig) -> Result<BenchReport> {
    use crate::ops::fused_ce::HeadKernel;
    let mut w = build(cfg.workload, cfg.scale, cfg.dtype, cfg.state_dtype)?;
    let reference = cfg.reference && w.set_kernel(HeadKernel::Matrixmultiply);
    if reference {
        w.step()?;
        w.set_kernel(HeadKernel::Auto);
    }
    w.step()?;
    let mut base = match cfg.versus_f32 {
        true => Some(build(cfg.workload, cfg.scale, Dtype::F32, Dtype::F32)?),
        false => None,
    };
    if let Some(b) = &mut base {
        b.step()?;
    }
    // lazy Adam's rate from cache in the run's dtypes (and in f32 beside
    // an f32 run), measured before the steps and after them, the faster
    // kept: a rate a passing load lowered would raise the floor.
    let adam_elements = w.lazy_adam_elements();
    let adam_rates = || -> Result<[Option<f64>; 2]> {
        let Some((_, width)) = adam_elements else {
            return Ok([None, None]);
        };
        Ok([
            Some(lazy_adam_gelems(width, cfg.dtype, cfg.state_dtype)?),
            match cfg.versus_f32 {
                true => Some(lazy_adam_gelems(width, Dtype::F32, Dtype::F32)?),
                false => None,
            },
        ])
    };
    let rates_before = adam_rates()?;
    // The paired copies' buffers, for the larger of a step's traffic and an
    // f32 step's, made before the steps: the peak memory leaves them out.
    let moved = |w: &workloads::Built| w.bytes_terms().iter().map(|t| t.1).sum::<u64>();
    let (run_moved, f32_moved) = (moved(&w), base.as_ref().map_or(0, moved));
    let rss_before_copies = peak_rss_mib();
    let mut paired = match cfg.paired_copy {
        true => Some(PairedCopy::new(run_moved.max(f32_moved))?),
        false => None,
    };
    let mut copy_gbps = Vec::with_capacity(cfg.steps);
    let mut base_copy_gbps = Vec::new();
    let mut base_step_s = Vec::new();
    let mut base_loss = 0.0;
    let mut step_s = Vec::with_capacity(cfg.steps);
    let mut reference_step_s = Vec::new();
    let mut phases: [Vec<f64>; 3] = Default::default();
    let mut ops: Vec<(&'static str, Vec<f64>)> = Vec::new();
    let mut loss = 0.0;
    let sched0 = sched_ns();
    let timed = |w: &mut workloads::Built, kernel| -> Result<(f64, workloads::StepOut)> {
        w.set_kernel(kernel);
        let t0 = Instant::now();
        let out = w.step()?;
        Ok((t0.elapsed().as_secs_f64(), out))
    };
    // n steps of the f32 workload, timed, each followed by its paired copy.
    let mut f32_steps = |base: &mut Option<workloads::Built>,
                         paired: &mut Option<PairedCopy>,
                         n: usize|
     -> Result<()> {
        if let Some(b) = base {
            for _ in 0..n {
                let (s, out) = timed(b, HeadKernel::Auto)?;
                base_step_s.push(s);
                if let Some(p) = paired {
                    base_copy_gbps.push(p.gbps(f32_moved));
                }
                base_loss = out.loss;
            }
        }
        Ok(())
    };
    for i in 0..cfg.steps {
        // The f32 workload takes its turn in blocks: first in every other
        // block, so that neither side always runs after the other.
        let block = cfg.versus_block;
        let f32_first = !(i / block).is_multiple_of(2);
        if f32_first && i.is_multiple_of(block) {
            f32_steps(&mut base, &mut paired, block.min(cfg.steps - i))?;
        }
        // With a reference, every other step runs it first.
        if reference && i % 2 == 1 {
            reference_step_s.push(timed(&mut w, HeadKernel::Matrixmultiply)?.0);
        }
        let (s, out) = timed(&mut w, HeadKernel::Auto)?;
        step_s.push(s);
        if let Some(p) = &mut paired {
            copy_gbps.push(p.gbps(run_moved));
        }
        let last_of_block = (i + 1).is_multiple_of(block) || i + 1 == cfg.steps;
        if last_of_block && !f32_first {
            f32_steps(&mut base, &mut paired, i % block + 1)?;
        }
        if reference && i % 2 == 0 {
            reference_step_s.push(timed(&mut w, HeadKernel::Matrixmultiply)?.0);
        }
        loss = out.loss;
        for (p, s) in phases.iter_mut().zip(out.phase_s) {
            p.push(s);
        }
        if ops.is_empty() {
            ops = out
                .op_s
                .iter()
                .map(|&(what, _)| (what, Vec::new()))
                .collect();
        }
        for ((what, all), (now, s)) in ops.iter_mut().zip(out.op_s) {
            debug_assert_eq!(*what, now, "a step's operations, in order");
            all.push(s);
        }
    }
    let per_step = |a: u64, b: u64| b.saturating_sub(a) as f64 / 1e9 / cfg.steps as f64;
    let (cpu_s_per_step, wait_s_per_step) = match (sched0, sched_ns()) {
        (Some(a), Some(b)) => (Some(per_step(a.0, b.0)), Some(per_step(a.1, b.1))),
        _ => (None, None),
    };
    // Before the copy's buffers raise it, and without the paired copies'.
    let paired_mib = paired.as_ref().map_or(0, |p| p.buffer_bytes()) as f64 / (1 << 20) as f64;
    let peak_rss_mib = peak_rss_mib().map(|after| {
        let steps = after - paired_mib;
        rss_before_copies.map_or(steps, |before| before.max(steps))
    });
    drop(paired);
    let median_s = median(&step_s);
    let min_s = fastest(&step_s);
    let bytes_terms = w.bytes_terms();
    let bytes_moved = run_moved;
    let params_bytes = w.params_bytes();
    let state_bytes = w.state_bytes();
    let workspace_bytes = w.workspace_bytes();
    let flops = w.flops();
    let useful_flops = w.useful_flops();
    let sgemm_shape = w.sgemm_shape();
    drop(w);
    let base = base.map(|b| (f32_moved, b.params_bytes(), b.state_bytes()));
    let memcpy_gbps = copy_rate_gbps((64 << 20) / cfg.scale);
    // Bytes moved in a step of `s` seconds, as a fraction of the copy rate.
    let of_copy_rate = |bytes: u64, s: f64| bytes as f64 / s / (memcpy_gbps * 1e9);
    // The median over steps of a step's rate against its paired copy's,
    // and the copies' median rate (none without paired copies).
    let of_paired = |bytes: u64, steps: &[f64], copies: &[f64]| {
        let pairs: Vec<f64> = steps
            .iter()
            .zip(copies)
            .map(|(s, c)| bytes as f64 / s / (c * 1e9))
            .collect();
        (!copies.is_empty()).then(|| (median(&pairs), median(copies)))
    };
    // The update's floor (rate, seconds) in the run's dtypes, and in f32.
    let [update_floor, f32_floor] = {
        let after = adam_rates()?;
        let n = adam_elements.map_or(0, |e| e.0) as f64;
        [0, 1].map(|i| {
            let rate = rates_before[i].zip(after[i]).map(|(a, b)| a.max(b))?;
            Some((rate, n / rate / 1e9))
        })
    };
    let f32_paired = of_paired(f32_moved, &base_step_s, &base_copy_gbps);
    let versus_f32 = base.map(|(f32_moved, f32_params, f32_state)| {
        let median_f32 = median(&base_step_s);
        let pairs: Vec<f64> = step_s
            .iter()
            .zip(&base_step_s)
            .map(|(a, b)| a / b)
            .collect();
        Versus {
            block: cfg.versus_block,
            median_s: median_f32,
            median_ratio: median_s / median_f32,
            pair_ratio: median(&pairs),
            params_bytes: f32_params,
            state_bytes: f32_state,
            bytes_ratio: (params_bytes + state_bytes) as f64 / (f32_params + f32_state) as f64,
            bytes_moved: f32_moved,
            bandwidth_fraction: of_copy_rate(f32_moved, median_f32),
            best_bandwidth_fraction: of_copy_rate(f32_moved, fastest(&base_step_s)),
            paired_bandwidth_fraction: f32_paired.map(|p| p.0),
            paired_memcpy_gbps: f32_paired.map(|p| p.1),
            copy_gbps: std::mem::take(&mut base_copy_gbps),
            update_floor_s: f32_floor.map(|f| f.1),
            loss: base_loss,
            step_s: std::mem::take(&mut base_step_s),
        }
    });
    let sgemm_rate = sgemm_shape.map(|(m, k, n)| sgemm_gflops(m, k, n, None));
    let tile_sgemm_gflops = sgemm_shape.and_then(|(m, k, n)| {
        crate::kernels::gemm::Isa::fast().map(|isa| sgemm_gflops(m, k, n, Some(isa)))
    });
    let gflops = flops.map(|f| f / median_s / 1e9);
    let paired = of_paired(bytes_moved, &step_s, &copy_gbps);
    Ok(BenchReport {
        workload: cfg.workload,
        steps: cfg.steps,
        threads: rayon::current_num_threads(),
        scale: cfg.scale,
        median_s,
        min_s,
        step_s,
        phase_median_s: phases.map(|p| median(&p)),
        op_median_s: ops.iter().map(|(what, s)| (*what, median(s))).collect(),
        cpu_s_per_step,
        wait_s_per_step,
        peak_rss_mib,
        dtype: cfg.dtype,
        state_dtype: cfg.state_dtype,
        params_bytes,
        state_bytes,
        bytes_moved,
        bytes_terms,
        memcpy_gbps,
        bandwidth_fraction: of_copy_rate(bytes_moved, median_s),
        best_bandwidth_fraction: of_copy_rate(bytes_moved, min_s),
        paired_bandwidth_fraction: paired.map(|p| p.0),
        paired_memcpy_gbps: paired.map(|p| p.1),
        copy_gbps,
        lazy_adam_elements: adam_elements.map(|e| e.0),
        lazy_adam_gelems: update_floor.map(|f| f.0),
        update_floor_s: update_floor.map(|f| f.1),
        flops,
        gflops,
        sgemm_gflops: sgemm_rate,
        gflops_fraction: gflops.zip(sgemm_rate).map(|(a, b)| a / b),
        workspace_bytes,
        useful_flops,
        useful_fraction: useful_flops
            .zip(sgemm_rate)
            .map(|(f, s)| f / median_s / 1e9 / s),
        tile_sgemm_gflops,
        reference_median_s: (!reference_step_s.is_empty()).then(|| median(&reference_step_s)),
        reference_step_s,
        versus_f32,
        loss,
    })
}

/// The smallest of a list (∞ for an empty one).
fn fastest(xs: &[f64]) -> f64 {
    xs.iter().copied().fold(f64::INFINITY, f64::min)
}

/// The median of a non-empty list.
fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn lmhead_alternates_with_its_reference() {
        let cfg = BenchConfig {
            steps: 3,
            scale: 64,
            reference: true,
            ..BenchConfig::new(Workload::LmHead)
        };
        let r = run(&cfg).unwrap();
        assert_eq!(r.reference_step_s.len(), 3);
        assert!(
            r.reference_median_s
                .is_some_and(|m| m.is_finite() && m > 0.0)
        );
        let (useful, all) = (r.useful_flops.unwrap(), r.flops.unwrap());
        assert!(useful > 0.0 && useful < all, "{useful} vs {all}");
        assert!(r.useful_fraction.is_some_and(f64::is_finite));
        // Only the head has a second kernel to compare with.
        let e = run(&BenchConfig {
            steps: 1,
            scale: 256,
            reference: true,
            ..BenchConfig::new(Workload::EmbedFull)
        })
        .unwrap();
        assert!(e.reference_step_s.is_empty() && e.reference_median_s.is_none());
        assert!(e.useful_flops.is_none() && e.tile_sgemm_gflops.is_none());
    }

    #[test]
    fn half_precision_workloads_keep_half_the_bytes() {
        for w in [
            Workload::EmbedPrompt,
            Workload::EmbedFull,
            Workload::SplitVocab,
            Workload::LmHead,
        ] {
            let c = BenchConfig {
                steps: 2,
                scale: 64,
                ..BenchConfig::new(w)
            };
            let f32_run = run(&c).unwrap();
            for (dtype, state) in [(Dtype::BF16, Dtype::BF16), (Dtype::F16, Dtype::F32)] {
                let r = run(&BenchConfig {
                    dtype,
                    state_dtype: state,
                    ..c
                })
                .unwrap();
                assert_eq!((r.dtype, r.state_dtype), (dtype, state));
                assert_eq!(2 * r.params_bytes, f32_run.params_bytes, "{w} {dtype}");
                // Step counts are 8 bytes each, whatever the dtype.
                let arrays = |r: &BenchReport| r.state_bytes - r.state_bytes % 8;
                assert!(r.state_bytes > 0 && f32_run.state_bytes > 0);
                if state == Dtype::BF16 {
                    assert!(arrays(&r) * 2 <= arrays(&f32_run) + 64, "{w}");
                }
                if state == Dtype::BF16 && w != Workload::LmHead {
                    assert!(r.bytes_moved < f32_run.bytes_moved, "{w}");
                }
                assert!(r.loss.is_finite());
                // The same loss to the rounding of the tables.
                let rel = (r.loss - f32_run.loss).abs() / f32_run.loss.abs().max(1.0);
                assert!(rel < 0.05, "{w} {dtype}: {} vs {}", r.loss, f32_run.loss);
            }
        }
        let c = BenchConfig {
            state_dtype: Dtype::F16,
            ..BenchConfig::new(Workload::EmbedFull)
        };
        assert!(run(&c).unwrap_err().to_string().contains("bf16"));
    }

    /// The update floor counts the elements lazy Adam moves, as the bytes
    /// model's lazy Adam terms do (f32: 28 bytes an element, the split
    /// rows' term less the gradient it does not read), at the rate
    /// measured; `lmhead`, updated by dense Adam, has none.
    #[test]
    fn the_update_floor_counts_lazy_adams_elements() {
        let term = |r: &BenchReport, what: &str| {
            r.bytes_terms
                .iter()
                .find(|t| t.0.starts_with(what))
                .unwrap_or_else(|| panic!("{what}"))
                .1
        };
        for w in Workload::ALL {
            let r = run(&BenchConfig {
                steps: 1,
                scale: 64,
                versus_f32: true,
                dtype: Dtype::BF16,
                state_dtype: Dtype::BF16,
                ..BenchConfig::new(w)
            })
            .unwrap();
            let v = r.versus_f32.as_ref().unwrap();
            let f32_run = run(&BenchConfig {
                steps: 1,
                scale: 64,
                ..BenchConfig::new(w)
            })
            .unwrap();
            let expected = match w {
                Workload::LmHead => None,
                Workload::EmbedPrompt | Workload::EmbedFull => {
                    Some(term(&f32_run, "lazy Adam: read p, m, v, g") / 28)
                }
                Workload::SplitVocab => {
                    let d = 512 / 64;
                    Some(term(&f32_run, "lazy Adam, shared table") / 28 + (20000 / 64) * d)
                }
            };
            assert_eq!(r.lazy_adam_elements, expected, "{w}");
            assert_eq!(f32_run.lazy_adam_elements, expected, "{w}");
            match (expected, r.lazy_adam_gelems, r.update_floor_s) {
                (None, None, None) => {
                    assert!(v.update_floor_s.is_none() && f32_run.update_floor_s.is_none())
                }
                (Some(n), Some(rate), Some(floor)) => {
                    assert!(n > 0 && rate.is_finite() && rate > 0.0, "{w}: {rate}");
                    assert_eq!(floor, n as f64 / rate / 1e9, "{w}");
                    assert!(v.update_floor_s.is_some_and(|f| f.is_finite() && f > 0.0));
                    assert!(f32_run.update_floor_s.is_some() && f32_run.versus_f32.is_none());
                }
                other => panic!("{w}: {other:?}"),
            }
        }
    }

    /// Versus f32: the f32 workload beside the run takes its own steps,
    /// neither disturbing the other (each ends on the loss it reaches
    /// alone, bit for bit), and the ratios are of the two.
    #[test]
    fn versus_f32_times_the_f32_workload_beside_the_run() {
        for w in Workload::ALL {
            let c = BenchConfig {
                steps: 3,
                scale: 64,
                ..BenchConfig::new(w)
            };
            let f32_alone = run(&c).unwrap();
            let half = BenchConfig {
                dtype: Dtype::BF16,
                state_dtype: Dtype::BF16,
                ..c
            };
            let half_alone = run(&half).unwrap();
            // Step by step (the default), in blocks of 2 (the last block
            // shorter) and of 5 (one block): each side takes its 3 steps.
            for block in [VERSUS_BLOCK, 2, 5] {
                let r = run(&BenchConfig {
                    versus_f32: true,
                    versus_block: block,
                    ..half
                })
                .unwrap();
                let v = r.versus_f32.as_ref().expect("the f32 steps");
                assert_eq!(
                    (r.step_s.len(), v.step_s.len(), v.block),
                    (3, 3, block),
                    "{w}"
                );
                assert_eq!(v.loss.to_bits(), f32_alone.loss.to_bits(), "{w}: f32");
                assert_eq!(r.loss.to_bits(), half_alone.loss.to_bits(), "{w}: bf16");
            }
            // With paired copies (which change no loss either).
            let r = run(&BenchConfig {
                versus_f32: true,
                paired_copy: true,
                ..half
            })
            .unwrap();
            let v = r.versus_f32.as_ref().expect("the f32 steps");
            assert_eq!(v.loss.to_bits(), f32_alone.loss.to_bits(), "{w}: f32");
            assert_eq!(r.loss.to_bits(), half_alone.loss.to_bits(), "{w}: bf16");
            assert_eq!(
                (v.params_bytes, v.state_bytes, v.bytes_moved),
                (
                    f32_alone.params_bytes,
                    f32_alone.state_bytes,
                    f32_alone.bytes_moved
                ),
                "{w}"
            );
            assert_eq!(v.median_s, median(&v.step_s));
            assert_eq!(v.median_ratio, r.median_s / v.median_s);
            let pairs: Vec<f64> = r.step_s.iter().zip(&v.step_s).map(|(a, b)| a / b).collect();
            assert_eq!(v.pair_ratio, median(&pairs));
            // Each side's steps against the copies paired with them.
            for (moved, steps, copies, fraction, rate) in [
                (
                    r.bytes_moved,
                    &r.step_s,
                    &r.copy_gbps,
                    r.paired_bandwidth_fraction,
                    r.paired_memcpy_gbps,
                ),
                (
                    v.bytes_moved,
                    &v.step_s,
                    &v.copy_gbps,
                    v.paired_bandwidth_fraction,
                    v.paired_memcpy_gbps,
                ),
            ] {
                assert_eq!(copies.len(), steps.len(), "{w}");
                assert!(copies.iter().all(|c| c.is_finite() && *c > 0.0), "{w}");
                assert_eq!(rate, Some(median(copies)), "{w}");
                let of: Vec<f64> = steps
                    .iter()
                    .zip(copies)
                    .map(|(s, c)| moved as f64 / s / (c * 1e9))
                    .collect();
                assert_eq!(fraction, Some(median(&of)), "{w}");
            }
            let bytes = (r.params_bytes + r.state_bytes) as f64;
            assert_eq!(
                v.bytes_ratio,
                bytes / (v.params_bytes + v.state_bytes) as f64
            );
            assert!(v.bytes_ratio < 0.55, "{w}: {}", v.bytes_ratio);
            assert!(v.bandwidth_fraction > 0.0);
            assert!(run(&c).unwrap().versus_f32.is_none());
        }
    }

    #[test]
    fn bad_configs_are_errors() {
        let c = BenchConfig::new(Workload::EmbedFull);
        for bad in [
            BenchConfig { steps: 0, ..c },
            BenchConfig { scale: 0, ..c },
            BenchConfig {
                threads: Some(0),
                ..c
            },
        ] {
            assert!(run(&bad).is_err(), "{bad:?}");
        }
        // Versus f32 needs something in half precision, and no reference.
        let e = run(&BenchConfig {
            versus_f32: true,
            ..c
        })
        .unwrap_err();
        assert!(e.to_string().contains("everything in f32 already"), "{e}");
        let e = run(&BenchConfig {
            versus_f32: true,
            reference: true,
            dtype: Dtype::BF16,
            ..BenchConfig::new(Workload::LmHead)
        })
        .unwrap_err();
        assert!(e.to_string().contains("one of them"), "{e}");
        let e = run(&BenchConfig {
            versus_f32: true,
            versus_block: 0,
            dtype: Dtype::BF16,
            ..c
        })
        .unwrap_err();
        assert!(e.to_string().contains("at least 1 step"), "{e}");
    }
}
