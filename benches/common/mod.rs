//! What the kernel benches share: a quick criterion configuration, a
//! one-thread and an all-threads pool, and seeded inputs.
#![allow(dead_code)]

use std::time::Duration;

use criterion::Criterion;
use ndarray::{Array2, ArrayD, IxDyn};
use rayon::{ThreadPool, ThreadPoolBuilder};
use splitgrad::Rng;
use splitgrad::rng::Zipf;

/// Ten samples, a second each: every bench runs in seconds.
pub fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
}

/// `(serial, parallel)`: a pool of one thread and one of every core. A
/// kernel run in the first is its serial path (the same code, no fork).
pub fn pools() -> (ThreadPool, ThreadPool) {
    let one = ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let all = ThreadPoolBuilder::new().build().unwrap();
    (one, all)
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
