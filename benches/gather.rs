//! The gather (embedding lookup) forward: `out[i] = table[ids[i]]`, and its
//! routed form over split tables. Serial (one thread) and parallel.

mod common;

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use splitgrad::kernels::routing::SplitRouting;
use splitgrad::ops::gather::gather_forward;
use splitgrad::ops::split_gather::split_gather_forward;

use common::table::{H, N, V};

fn gather(c: &mut Criterion) {
    let pools = common::pools();
    let table = common::normal(1, &[V, H]);
    let ids = common::zipf_ids(2, V, N);
    let mut g = c.benchmark_group("gather/forward");
    // Rows read plus rows written.
    g.throughput(Throughput::Bytes((2 * N * H * 4) as u64));
    pools.bench(&mut g, || gather_forward(table.view(), black_box(&ids)));
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
    pools.bench(&mut g, || split_gather_forward(&views, &routed, &[N]));
    g.finish();
}

common::bench_main!(gather);
