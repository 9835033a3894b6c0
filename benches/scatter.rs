//! The gather's backward: coalescing row contributions with repeated
//! (Zipf) ids into a row-sparse gradient, never touching a V × H buffer.
//! The fast kernel on one thread and on all, and its naive twin; then the
//! same contributions read in place as the embedding backward reads them:
//! rows of `c·R` listed by position, never copied out, and rows kept in
//! bf16.

mod common;

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use splitgrad::kernels::pool::Pool;
use splitgrad::kernels::scatter::{
    RowSource, coalesce_rows, coalesce_rows_naive, coalesce_sources, coalesce_sources_in,
};

use common::table::{H, N, V};

fn scatter(c: &mut Criterion) {
    let pools = common::pools();
    let ids = common::zipf_ids(3, V, N);
    let values = common::normal2(4, N, H);
    let mut g = c.benchmark_group("coalesce_rows/backward");
    // The contributions read (the unique rows written are fewer).
    g.throughput(Throughput::Bytes((N * H * 4) as u64));
    pools.bench(&mut g, || coalesce_rows(V, black_box(&ids), values.view()));
    g.bench_function("naive", |b| {
        b.iter(|| black_box(coalesce_rows_naive(V, black_box(&ids), values.view())))
    });
    g.finish();

    // R has twice the rows; every other row is routed here, times 0.5.
    let r = common::normal2(5, 2 * N, H);
    let rows: Vec<usize> = (0..N).map(|i| 2 * i).collect();
    let src = [RowSource {
        values: r.view(),
        rows: Some(&rows[..]),
        scale: Some(0.5f32),
    }];
    let mut g = c.benchmark_group("coalesce_sources/backward");
    g.throughput(Throughput::Bytes((N * H * 4) as u64));
    pools.bench(&mut g, || coalesce_sources(V, H, black_box(&ids), &src));
    g.finish();

    // The same rows kept in bf16, unscaled (a bf16 layer's ∂out), widened
    // as they are summed into f32 rows.
    let r16 = r.mapv(half::bf16::from_f32);
    let src16 = [RowSource::<f32, half::bf16> {
        values: r16.view(),
        rows: Some(&rows[..]),
        scale: None,
    }];
    let mut g = c.benchmark_group("coalesce_sources/backward_bf16");
    g.throughput(Throughput::Bytes((N * H * 2) as u64));
    let pool = Pool::new();
    pools.bench(&mut g, || {
        let out = coalesce_sources_in(&pool, V, H, black_box(&ids), &src16);
        pool.give(out.values.into_dyn());
    });
    g.finish();
}

common::bench_main!(scatter);
