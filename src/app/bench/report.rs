//! What [`run`](super::run) measured: the report of a run, and of the f32
//! workload timed beside it ([`Versus`]).

use super::Workload;
#[cfg(doc)]
use super::{BenchConfig, run};
use crate::param::Dtype;

/// The same workload in f32, timed alternating with the run's steps
/// ([`BenchConfig::versus_f32`]), and the run against it.
#[derive(Clone, Debug, PartialEq)]
pub struct Versus {
    /// Seconds of each f32 step, in order (the run's step of the same index
    /// in the same block, before or after it: the order alternates by
    /// block, [`BenchConfig::versus_block`]).
    pub step_s: Vec<f64>,
    /// The steps each side took in a turn ([`BenchConfig::versus_block`]).
    pub block: usize,
    /// The median of `step_s`.
    pub median_s: f64,
    /// The run's median over the f32 median.
    pub median_ratio: f64,
    /// The median of the run's step over the f32 step beside it, pair by
    /// pair: the ratio a load that drifts during the run disturbs least.
    pub pair_ratio: f64,
    /// Bytes of the f32 parameters.
    pub params_bytes: u64,
    /// Bytes of the f32 optimisers' state after the steps.
    pub state_bytes: u64,
    /// The run's parameters and state over the f32 ones.
    pub bytes_ratio: f64,
    /// Bytes an f32 step must move.
    pub bytes_moved: u64,
    /// `bytes_moved / median_s / memcpy rate` of the f32 steps.
    pub bandwidth_fraction: f64,
    /// `bytes_moved / (fastest f32 step) / memcpy rate`
    /// ([`BenchReport::best_bandwidth_fraction`]).
    pub best_bandwidth_fraction: f64,
    /// With paired copies, [`BenchReport::paired_bandwidth_fraction`] of
    /// the f32 steps.
    pub paired_bandwidth_fraction: Option<f64>,
    /// With paired copies, the median rate of the f32 steps' copies, GB/s
    /// ([`BenchReport::paired_memcpy_gbps`]).
    pub paired_memcpy_gbps: Option<f64>,
    /// The rate of each f32 step's paired copy, GB/s, in the order of
    /// `step_s` (empty without paired copies).
    pub copy_gbps: Vec<f64>,
    /// [`BenchReport::update_floor_s`] in f32 (f32 moments).
    pub update_floor_s: Option<f64>,
    /// The loss of the last f32 step (before its update).
    pub loss: f64,
}

/// What [`run`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchReport {
    /// The workload.
    pub workload: Workload,
    /// Timed steps.
    pub steps: usize,
    /// Rayon threads the steps ran on.
    pub threads: usize,
    /// The size divisor (1: as specified).
    pub scale: usize,
    /// Seconds of each timed step, in order.
    pub step_s: Vec<f64>,
    /// Median of `step_s` (the mean of the middle two for an even count).
    pub median_s: f64,
    /// Minimum of `step_s`.
    pub min_s: f64,
    /// Medians of the three phases of a step: forward (the tape built up
    /// to the loss), backward (gradients taken, the tape dropped) and the
    /// optimiser update.
    pub phase_median_s: [f64; 3],
    /// Medians of the step's operations, in the order they run, where the
    /// workload times them apart (all but `lmhead`, whose is empty):
    /// (what, seconds). They cover the three phases; the median of a sum
    /// is not the sum of the medians, so they need not add up to
    /// `median_s` exactly.
    pub op_median_s: Vec<(&'static str, f64)>,
    /// Seconds on a CPU per timed step, summed over the process's threads
    /// (rayon's spinning included); `None` without `/proc/self/task`.
    pub cpu_s_per_step: Option<f64>,
    /// Seconds per timed step that the process's threads were ready to run
    /// but waited for a CPU (summed over threads): what other processes on
    /// a shared machine took from this one.
    pub wait_s_per_step: Option<f64>,
    /// Peak resident memory of the process after the steps (`VmHWM`), MiB;
    /// `None` where `/proc/self/status` does not exist.
    pub peak_rss_mib: Option<f64>,
    /// How the parameters were kept.
    pub dtype: Dtype,
    /// How the optimisers kept their moments.
    pub state_dtype: Dtype,
    /// Bytes of the parameters (trainable or not), as they are kept.
    pub params_bytes: u64,
    /// Bytes of the optimisers' state after the steps (the moments of
    /// every parameter updated), as it is kept.
    pub state_bytes: u64,
    /// Bytes a step must move, the sum of `bytes_terms`.
    pub bytes_moved: u64,
    /// The terms of `bytes_moved`: (what, bytes).
    pub bytes_terms: Vec<(&'static str, u64)>,
    /// The rate of a large memory copy on the same threads, counting the
    /// bytes read and written, GB/s (10⁹ bytes).
    pub memcpy_gbps: f64,
    /// `bytes_moved / median_s / memcpy rate`.
    pub bandwidth_fraction: f64,
    /// `bytes_moved / min_s / memcpy rate`: the fastest step against the
    /// fastest copy (the rate is the best of five), best against best,
    /// where `bandwidth_fraction` sets the median step against it. On a
    /// shared machine the two differ by the steps' spread; a gap that
    /// stays in this one is the step's own.
    pub best_bandwidth_fraction: f64,
    /// With [`BenchConfig::paired_copy`](super::BenchConfig::paired_copy):
    /// the median over steps of `bytes_moved / step / (its paired copy's
    /// rate)`: each step against a copy of the same size run right after
    /// it, so that a load or a change of the machine's copy rate during the
    /// run meets both sides, where `bandwidth_fraction` sets the median
    /// step against the best copy after all the steps.
    pub paired_bandwidth_fraction: Option<f64>,
    /// With paired copies, their median rate, GB/s: after each timed step,
    /// a copy of as many bytes as the step moves (half read, half
    /// written), timed alone.
    pub paired_memcpy_gbps: Option<f64>,
    /// The rate of each step's paired copy, GB/s, in the order of `step_s`
    /// (empty without paired copies).
    pub copy_gbps: Vec<f64>,
    /// The elements lazy Adam moves in a step (the workloads but
    /// `lmhead`).
    pub lazy_adam_elements: Option<u64>,
    /// The rate of lazy Adam on rows of the workload's width in the run's
    /// dtypes, from a core's cache on one thread, times the threads, G
    /// elements a second: what its arithmetic allows when no byte waits
    /// for memory.
    pub lazy_adam_gelems: Option<f64>,
    /// `lazy_adam_elements / lazy_adam_gelems`: the seconds a step's
    /// update takes at least however fast the memory, the floor beside
    /// the copy rate's `bytes_moved / memcpy rate`.
    pub update_floor_s: Option<f64>,
    /// For `lmhead`: 6·N·V·H, the matmul work of a step.
    pub flops: Option<f64>,
    /// For `lmhead`: `flops / median_s`, GFLOP/s.
    pub gflops: Option<f64>,
    /// For `lmhead`: the rate of an (N, H)·(H, V) sgemm, GFLOP/s.
    pub sgemm_gflops: Option<f64>,
    /// For `lmhead`: `gflops / sgemm_gflops`.
    pub gflops_fraction: Option<f64>,
    /// For `lmhead`: the fused kernel's workspace, bytes.
    pub workspace_bytes: Option<u64>,
    /// For `lmhead`: 6·N_active·V·H, the products the summed head does
    /// (ignored tokens are skipped).
    pub useful_flops: Option<f64>,
    /// For `lmhead`: `useful_flops / median_s / sgemm rate`.
    pub useful_fraction: Option<f64>,
    /// For `lmhead`: the rate of the same sgemm on the crate's tile kernel
    /// ([`crate::kernels::gemm::gemm`]), GFLOP/s.
    pub tile_sgemm_gflops: Option<f64>,
    /// With [`BenchConfig::reference`]: seconds of each step on
    /// `matrixmultiply`, in order (each right after the step of `step_s`
    /// with the same index, or right before it: the order alternates).
    pub reference_step_s: Vec<f64>,
    /// The median of `reference_step_s`.
    pub reference_median_s: Option<f64>,
    /// With [`BenchConfig::versus_f32`]: the f32 steps beside the run's.
    /// (`peak_rss_mib` is then of both workloads.)
    pub versus_f32: Option<Versus>,
    /// The loss of the last step (before its update).
    pub loss: f64,
}

impl BenchReport {
    /// How many times faster than PyTorch's figure ([`Workload::pytorch_s`]);
    /// meaningful at scale 1 only.
    pub fn speedup_vs_pytorch(&self) -> f64 {
        self.workload.pytorch_s() / self.median_s
    }
}
