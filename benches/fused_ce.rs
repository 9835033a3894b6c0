//! The fused cross-entropy of the LM head against its naive twin (the full
//! logits), forward and backward apart, on a small case; then the summed
//! head, whose forward forms the gradients (its backward only scales them),
//! against the per-token kernel's forward plus backward. The matrix
//! products run on `MATMUL_NUM_THREADS` threads (`matrixmultiply` reads it
//! once per process), so there is no serial/parallel pair here.

mod common;

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use ndarray::{Array2, ArrayView2, ArrayViewMut2};
use splitgrad::ops::fused_ce::{
    ChunkSizes, RowStats, Targets, fused_ce_backward, fused_ce_forward, naive_ce_backward,
    naive_ce_forward,
};
use splitgrad::ops::fused_ce_sum::{SumChunks, fused_ce_sum_forward};

const N: usize = 256;
const H: usize = 128;
const SIZES: [usize; 2] = [4000, 96];
const CHUNKS: ChunkSizes = ChunkSizes {
    tokens: 64,
    vocab: 1024,
};

fn fused_ce(c: &mut Criterion) {
    let v: usize = SIZES.iter().sum();
    let hidden = common::normal2(15, N, H);
    let ws: Vec<Array2<f32>> = SIZES
        .iter()
        .enumerate()
        .map(|(k, &s)| common::normal2(16 + k as u64, s, H) * 0.1)
        .collect();
    let wv: Vec<ArrayView2<'_, f32>> = ws.iter().map(|w| w.view()).collect();
    let labels: Vec<i64> = common::zipf_ids(18, v, N)
        .into_iter()
        .enumerate()
        .map(|(i, l)| if i % 10 == 9 { -100 } else { l as i64 })
        .collect();
    let targets = Targets::per_token(labels.clone());
    let (_, lse) = fused_ce_forward(hidden.view(), &wv, &targets, CHUNKS);
    let gy = vec![1.0f32; N];

    let mut g = c.benchmark_group("fused_ce/forward");
    // One logit per (token, vocabulary row).
    g.throughput(Throughput::Elements((N * v) as u64));
    g.bench_function("fused", |b| {
        b.iter(|| black_box(fused_ce_forward(hidden.view(), &wv, &targets, CHUNKS)))
    });
    g.bench_function("naive", |b| {
        b.iter(|| black_box(naive_ce_forward(hidden.view(), &wv, &targets)))
    });
    g.finish();

    let mut g = c.benchmark_group("fused_ce/backward");
    g.throughput(Throughput::Elements((N * v) as u64));
    let mut gh = Array2::<f32>::zeros((N, H));
    let mut gws: Vec<Array2<f32>> = ws.iter().map(|w| Array2::zeros(w.dim())).collect();
    // The fused backward into ∂hidden and every ∂W_k.
    let backward = |stats: &RowStats<f32>, gh: &mut Array2<f32>, gws: &mut [Array2<f32>]| {
        let mut views: Vec<Option<ArrayViewMut2<'_, f32>>> =
            gws.iter_mut().map(|w| Some(w.view_mut())).collect();
        let (h, t) = (hidden.view(), &targets);
        fused_ce_backward(
            h,
            &wv,
            t,
            stats,
            &gy,
            CHUNKS,
            Some(gh.view_mut()),
            &mut views,
        );
    };
    g.bench_function("fused", |b| b.iter(|| backward(&lse, &mut gh, &mut gws)));
    g.bench_function("naive", |b| {
        b.iter(|| black_box(naive_ce_backward(hidden.view(), &wv, &targets, &gy)))
    });
    g.finish();

    // Forward and gradients together: 6·N·V·H flops for the summed head,
    // 8·N·V·H for the per-token kernel's forward plus backward.
    let mut g = c.benchmark_group("fused_ce_sum/forward_with_gradients");
    g.throughput(Throughput::Elements((N * v) as u64));
    g.bench_function("summed", |b| {
        b.iter(|| {
            black_box(fused_ce_sum_forward(
                hidden.view(),
                &wv,
                &labels,
                SumChunks::Tokens(CHUNKS.tokens),
                true,
                &[true, true],
            ))
        })
    });
    g.bench_function("per_token", |b| {
        b.iter(|| {
            let (_, lse) = fused_ce_forward(hidden.view(), &wv, &targets, CHUNKS);
            backward(&lse, &mut gh, &mut gws);
        })
    });
    g.finish();
}

common::bench_main!(fused_ce);
