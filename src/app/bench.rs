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
mod tests;
