//! What a benchmark step is related to, measured in the same process: the
//! machine's copy and sgemm rates, and the process's peak memory and CPU
//! time.

use std::time::Instant;

use ndarray::Array2;
use rayon::prelude::*;

use super::F32;
use super::workloads::{keep, lazy_adam};
use crate::error::Result;
use crate::optim::Optimizer;
use crate::param::{Dtype, ParamGrad, Parameter, RowSparse, Stored};
use crate::{Real, Rng};

/// `f32` elements in a 4 KiB page.
const PAGE: usize = 4096 / std::mem::size_of::<f32>();

/// `VmHWM` of `/proc/self/status` in MiB.
pub(super) fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Nanoseconds (on a CPU, waiting for one) summed over the threads of the
/// process, from `/proc/self/task/*/schedstat`.
pub(super) fn sched_ns() -> Option<(u64, u64)> {
    let mut total = (0u64, 0u64);
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let Ok(text) = std::fs::read_to_string(task.ok()?.path().join("schedstat")) else {
            continue;
        };
        let mut f = text.split_whitespace().map(|x| x.parse::<u64>().ok());
        total.0 += f.next()??;
        total.1 += f.next()??;
    }
    Some(total)
}

/// Elements a task of a parallel copy moves (256 KiB of `f32`).
const CHUNK: usize = 1 << 16;

/// `src` copied into `dst` by rayon tasks of [`CHUNK`] elements: seconds.
fn par_copy(dst: &mut [f32], src: &[f32]) -> f64 {
    let t0 = Instant::now();
    dst.par_chunks_mut(CHUNK)
        .zip(src.par_chunks(CHUNK))
        .for_each(|(d, s)| d.copy_from_slice(s));
    t0.elapsed().as_secs_f64()
}

/// Best of five parallel copies of `n` `f32` (after one that faults the
/// pages in), counting bytes read plus bytes written, GB/s.
///
/// Both buffers start on a page boundary: a destination a few bytes past
/// the source modulo 4096 makes every load wait on the store before it (4K
/// aliasing) and halves the rate, whichever way the allocator placed them.
pub(super) fn copy_rate_gbps(n: usize) -> f64 {
    let n = n.max(CHUNK);
    let page_aligned = |v: &[f32]| v.as_ptr().align_offset(4096);
    let src_buf: Vec<f32> = (0..n + PAGE).map(|i| i as f32).collect();
    let mut dst_buf = vec![0.0f32; n + PAGE];
    let s0 = page_aligned(&src_buf);
    let d0 = page_aligned(&dst_buf);
    let src = &src_buf[s0..s0 + n];
    let dst = &mut dst_buf[d0..d0 + n];
    let mut best = f64::INFINITY;
    for rep in 0..6 {
        let t = par_copy(dst, src);
        if rep > 0 {
            best = best.min(t);
        }
    }
    std::hint::black_box(&dst_buf);
    (2 * n as u64 * F32) as f64 / best / 1e9
}

/// The rate of lazy Adam, configured as the workloads' ([`lazy_adam`],
/// [`keep`]), on rows of `width` kept as `dtype` with moments kept as
/// `state`, from a core's cache, times the threads of the current pool:
/// on one thread, a table of about 64 Ki elements (0.4 MiB with its
/// moments in bf16, 0.75 MiB in f32, and the gradient's 0.25 MiB) with a
/// gradient on every row, updated again and again; best of forty rounds of
/// about 0.5 M elements (after one that warms up: a shared machine's load
/// leaves some rounds alone). G elements a second. What the update's
/// arithmetic (the square root, the division and, in half precision, the
/// widening and the stochastic rounding of three arrays) allows when no
/// byte waits for memory and no thread waits for another: the floor of a
/// step's update however fast its memory. One thread a core, scaled by the
/// threads, so that neither the memory nor the pool's hand-offs, which
/// the small table's calls would pay often, lower the rate (a lower rate
/// would raise the floor); with two threads a core it overstates the rate.
pub(super) fn lazy_adam_gelems(width: usize, dtype: Dtype, state: Dtype) -> Result<f64> {
    let threads = rayon::current_num_threads();
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .map_err(|e| crate::Error::config(format!("cannot start a thread: {e}")))?;
    let width = width.max(1);
    let rows = ((64 << 10) / width).max(1);
    let mut rng = Rng::new(13);
    let x = Array2::from_shape_fn((rows, width), |_| rng.normal() as f32 * 0.1);
    let mut p = Parameter::new_stored("rows", Stored::from_full(x.into_dyn(), dtype)?);
    let grad = ParamGrad::RowSparse(RowSparse {
        n_rows: rows,
        rows: (0..rows).collect(),
        values: Array2::from_shape_fn((rows, width), |_| rng.normal() as f32),
    });
    let mut opt = keep(lazy_adam()?, state)?;
    let reps = (500_000 / (rows * width)).max(1);
    let best = one.install(|| -> Result<f64> {
        let mut best = f64::INFINITY;
        for round in 0..41 {
            let t0 = Instant::now();
            for _ in 0..reps {
                opt.update(&mut p, &grad)?;
            }
            if round > 0 {
                best = best.min(t0.elapsed().as_secs_f64());
            }
        }
        Ok(best)
    })?;
    std::hint::black_box(p.stored());
    Ok(threads as f64 * (reps * rows * width) as f64 / best / 1e9)
}

/// Best of three (m, k)·(k, n) sgemms (after a warm-up one), GFLOP/s:
/// through `matrixmultiply` (`f32::gemm`), or the tile kernel `isa`.
pub(super) fn sgemm_gflops(
    m: usize,
    k: usize,
    n: usize,
    isa: Option<crate::kernels::gemm::Isa>,
) -> f64 {
    let mut rng = Rng::new(11);
    let a = Array2::from_shape_fn((m, k), |_| rng.normal() as f32);
    let b = Array2::from_shape_fn((k, n), |_| rng.normal() as f32);
    let mut c = Array2::<f32>::zeros((m, n));
    let mut best = f64::INFINITY;
    for rep in 0..4 {
        let t0 = Instant::now();
        match isa {
            None => f32::gemm(1.0, a.view(), b.view(), 0.0, c.view_mut()),
            Some(isa) => crate::kernels::gemm::gemm(isa, a.view(), b.view(), c.view_mut(), false),
        }
        let t = t0.elapsed().as_secs_f64();
        if rep > 0 {
            best = best.min(t);
        }
    }
    std::hint::black_box(&c);
    2.0 * (m * k * n) as f64 / best / 1e9
}

/// Copies as large as a step's traffic, one timed right after each timed
/// step (`bench`'s paired copy rate, [`super::BenchReport::paired_bandwidth_fraction`]):
/// a step of `b` bytes is followed by a parallel copy that reads `b / 2`
/// bytes and writes as many, by the same rayon chunks as
/// [`copy_rate_gbps`], so that the step and the copy it is set against
/// meet the same machine a few milliseconds apart. Copies take the two
/// halves of the buffers in turn, so a copy does not find the one before
/// it in cache; every page is faulted in when the buffers are made.
pub(super) struct PairedCopy {
    src: Vec<f32>,
    dst: Vec<f32>,
    /// Elements a half holds.
    half: usize,
    turn: usize,
}

impl PairedCopy {
    /// Buffers for copies of up to `bytes` (read plus written), checked
    /// against the memory available before they are allocated.
    pub(super) fn new(bytes: u64) -> Result<PairedCopy> {
        let half = Self::elements(bytes);
        // Two halves, and a page to start each buffer on a page boundary.
        let len = 2 * half + PAGE;
        crate::io::check_memory(
            || format!("the paired copy's two buffers of {len} f32"),
            crate::io::bytes_of(&[len as u64, 2, F32]),
            "",
        )?;
        let src: Vec<f32> = (0..len).map(|i| i as f32).collect();
        let dst = src.clone();
        Ok(PairedCopy {
            src,
            dst,
            half,
            turn: 0,
        })
    }

    /// The elements a copy of `bytes` reads: half of them, whole pages.
    fn elements(bytes: u64) -> usize {
        ((bytes / 2 / F32) as usize).div_ceil(PAGE).max(1) * PAGE
    }

    /// Bytes of the two buffers.
    pub(super) fn buffer_bytes(&self) -> u64 {
        (self.src.len() + self.dst.len()) as u64 * F32
    }

    /// One copy of about `bytes` (read plus written; at most the buffers'
    /// `bytes` at construction), timed: the copy's GB/s.
    pub(super) fn gbps(&mut self, bytes: u64) -> f64 {
        let n = Self::elements(bytes).min(self.half);
        let at = self.turn * self.half;
        self.turn ^= 1;
        let s0 = self.src.as_ptr().align_offset(4096) + at;
        let d0 = self.dst.as_ptr().align_offset(4096) + at;
        let src = &self.src[s0..s0 + n];
        let dst = &mut self.dst[d0..d0 + n];
        let t = par_copy(dst, src);
        std::hint::black_box(&self.dst);
        (2 * n as u64 * F32) as f64 / t / 1e9
    }
}
