//! The half-precision storage kernels on 1 M elements, bf16 and f16:
//! widening to f32, rounding to nearest and stochastic rounding, on every
//! code path this CPU can run (the chosen one is the widest) and their
//! naive twins. One thread: the kernels are serial, their callers chunk.

mod common;

use std::hint::black_box;

use criterion::{BenchmarkGroup, Criterion, Throughput, measurement::WallTime};
use half::{bf16, f16};
use splitgrad::kernels::half::{
    HalfFloat, HalfPath, SrKey, narrow_nearest_naive, narrow_nearest_on, narrow_stochastic_naive,
    narrow_stochastic_on, widen_naive, widen_on,
};

const N: usize = 1 << 20;

fn paths() -> Vec<HalfPath> {
    HalfPath::ALL
        .into_iter()
        .filter(|p| p.available())
        .collect()
}

/// Reads of 2 bytes and writes of 4 per element, or the reverse.
fn group<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Bytes((N * (2 + 4)) as u64));
    g
}

fn kernels<H: HalfFloat>(c: &mut Criterion) {
    let x: Vec<f32> = common::normal(40, &[N]).iter().map(|v| v * 1e-2).collect();
    let mut h = vec![H::from_bits(0); N];
    narrow_nearest_naive(&x, &mut h);
    let mut wide = vec![0.0f32; N];
    let mut narrow = vec![H::from_bits(0); N];
    let key = SrKey::new(1, 2, SrKey::param_hash("table"));

    let mut g = group(c, &format!("half/widen/{}", H::NAME));
    for p in paths() {
        g.bench_function(format!("{p:?}"), |b| {
            b.iter(|| widen_on(p, black_box(&h), &mut wide))
        });
    }
    g.bench_function("naive", |b| {
        b.iter(|| widen_naive(black_box(&h), &mut wide))
    });
    g.finish();

    let mut g = group(c, &format!("half/narrow_nearest/{}", H::NAME));
    for p in paths() {
        g.bench_function(format!("{p:?}"), |b| {
            b.iter(|| narrow_nearest_on(p, black_box(&x), &mut narrow))
        });
    }
    g.bench_function("naive", |b| {
        b.iter(|| narrow_nearest_naive(black_box(&x), &mut narrow))
    });
    g.finish();

    let mut g = group(c, &format!("half/narrow_stochastic/{}", H::NAME));
    for p in paths() {
        g.bench_function(format!("{p:?}"), |b| {
            b.iter(|| narrow_stochastic_on(p, black_box(&x), &mut narrow, key, 0))
        });
    }
    g.bench_function("naive", |b| {
        b.iter(|| narrow_stochastic_naive(black_box(&x), &mut narrow, key, 0))
    });
    g.finish();
}

fn half_kernels(c: &mut Criterion) {
    kernels::<bf16>(c);
    kernels::<f16>(c);
}

common::bench_main!(half_kernels);
