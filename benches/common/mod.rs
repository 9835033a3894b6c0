//! What the kernel benches share: a quick criterion configuration and
//! `main`, a one-thread and an all-threads pool to bench a kernel on each,
//! and seeded inputs.
#![allow(dead_code)]

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BatchSize, BenchmarkGroup, Criterion};
use ndarray::{Array2, ArrayD, IxDyn};
use rayon::{ThreadPool, ThreadPoolBuilder};
use splitgrad::Rng;
use splitgrad::io::SplitIndex;
use splitgrad::layers::{SplitVocabulary, SplitVocabularyConfig};
use splitgrad::rng::Zipf;

/// The embedding table of the gather, scatter and lazy Adam benches: V
/// rows of H, and N ids of a batch.
pub mod table {
    pub const V: usize = 32000;
    pub const H: usize = 256;
    pub const N: usize = 8192;
}

/// Ten samples, a second each: every bench runs in seconds.
pub fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
}

/// The bench's `main`: its targets in one group of [`config`].
macro_rules! bench_main {
    ($($target:path),+ $(,)?) => {
        criterion::criterion_group! {
            name = benches;
            config = crate::common::config();
            targets = $($target),+
        }
        criterion::criterion_main!(benches);
    };
}
pub(crate) use bench_main;

/// A pool of one thread and one of every core. A kernel run in the first
/// is its serial path (the same code, no fork).
pub struct Pools {
    /// One thread.
    pub one: ThreadPool,
    /// Every core.
    pub all: ThreadPool,
}

pub fn pools() -> Pools {
    Pools {
        one: ThreadPoolBuilder::new().num_threads(1).build().unwrap(),
        all: ThreadPoolBuilder::new().build().unwrap(),
    }
}

impl Pools {
    /// `("serial", one)` and `("parallel", all)`.
    pub fn both(&self) -> [(&'static str, &ThreadPool); 2] {
        [("serial", &self.one), ("parallel", &self.all)]
    }

    /// Benches `f` in `g` as "serial" and as "parallel", each run inside
    /// its pool.
    pub fn bench<O: Send>(
        &self,
        g: &mut BenchmarkGroup<'_, WallTime>,
        mut f: impl FnMut() -> O + Send,
    ) {
        for (name, pool) in self.both() {
            g.bench_function(name, |b| b.iter(|| pool.install(|| black_box(f()))));
        }
    }

    /// As [`Pools::bench`] for a routine that consumes what `setup` makes
    /// (set up outside the timing, a large input).
    pub fn bench_batched<I: Send, O: Send>(
        &self,
        g: &mut BenchmarkGroup<'_, WallTime>,
        mut setup: impl FnMut() -> I,
        mut routine: impl FnMut(I) -> O + Send,
    ) {
        for (name, pool) in self.both() {
            g.bench_function(name, |b| {
                b.iter_batched(
                    &mut setup,
                    |input| pool.install(|| black_box(routine(input))),
                    BatchSize::LargeInput,
                )
            });
        }
    }
}

/// `n` ids in `[0, v)`, Zipf with exponent 1.2 as in the workloads.
pub fn zipf_ids(seed: u64, v: usize, n: usize) -> Vec<usize> {
    let z = Zipf::new(v, 1.2);
    let mut rng = Rng::new(seed);
    (0..n).map(|_| z.sample(&mut rng)).collect()
}

/// A (rows, cols) array of N(0, 1) draws.
pub fn normal2(seed: u64, rows: usize, cols: usize) -> Array2<f32> {
    let mut rng = Rng::new(seed);
    Array2::from_shape_simple_fn((rows, cols), || rng.normal() as f32)
}

/// An array of N(0, 1) draws of any shape.
pub fn normal(seed: u64, shape: &[usize]) -> ArrayD<f32> {
    let mut rng = Rng::new(seed);
    ArrayD::from_shape_simple_fn(IxDyn(shape), || rng.normal() as f32)
}

/// A split vocabulary of `(languages[i], tokens[i])` rows, V tokens of D,
/// L languages, every gate logit `gate_init`.
pub fn split_vocabulary(
    languages: Vec<usize>,
    tokens: Vec<usize>,
    (v, d, l): (usize, usize, usize),
    gate_init: f64,
) -> SplitVocabulary<f32> {
    let config = SplitVocabularyConfig {
        gate_init,
        ..SplitVocabularyConfig::new(v, d, l)
    };
    SplitVocabulary::new(SplitIndex::new(languages, tokens), &config).unwrap()
}
