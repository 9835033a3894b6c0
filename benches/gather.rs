//! The gather (embedding lookup) forward: `out[i] = table[ids[i]]`, and its
//! routed form over split tables. Serial (one thread) and parallel.

mod common;

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use splitgrad::kernels::routing::SplitRouting;
use splitgrad::ops::gather::gather_forward;
use splitgrad::ops::split_gather::split_gather_forward;

const V: usize = 32000;
const H: usize = 256;
const N: usize = 8192;

fn gather(c: &mut Criterion) {
    let (one, all) = common::pools();
    let table = common::normal(1, &[V, H]);
    let ids = common::zipf_ids(2, V, N);
    let mut g = c.benchmark_group("gather/forward");
    // Rows read plus rows written.
    g.throughput(Throughput::Bytes((2 * N * H * 4) as u64));
    g.bench_function("serial", |b| {
        b.iter(|| one.install(|| black_box(gather_forward(table.view(), black_box(&ids)))))
    });
    g.bench_function("parallel", |b| {
        b.iter(|| all.install(|| black_box(gather_forward(table.view(), black_box(&ids)))))
    });
    g.finish();

    let sizes = [V - 320, 256, 64];
    let tables: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(k, &s)| common::normal(10 + k as u64, &[s, H]))
        .collect();
    let views: Vec<_> = tables.iter().map(|t| t.view()).collect();
    let global: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
    let routed = SplitRouting::new(&sizes).route_all(&global).unwrap();
    let mut g = c.benchmark_group("split_gather/forward");
    g.throughput(Throughput::Bytes((2 * N * H * 4) as u64));
    g.bench_function("serial", |b| {
        b.iter(|| one.install(|| black_box(split_gather_forward(&views, &routed, &[N]))))
    });
    g.bench_function("parallel", |b| {
        b.iter(|| all.install(|| black_box(split_gather_forward(&views, &routed, &[N]))))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = gather
}
criterion_main!(benches);
