//! The loss of the embedding workloads, `Σ out ⊙ R`: the blocked inner
//! product (forward) on one thread and on all, and its one-accumulator twin;
//! the backward `∂out += c·R` when it has to be written out (the kernel
//! `add_scaled`, what the tape runs when a lazy `c·R` meets a buffer).

mod common;

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use half::bf16;
use splitgrad::kernels::reduce::{add_scaled, dot_half, dot_naive, dot_slices};

const N: usize = 8192;
const H: usize = 1024;

fn dot(c: &mut Criterion) {
    let pools = common::pools();
    let x = common::normal(1, &[N, H]);
    let r = common::normal(2, &[N, H]);
    let (xs, rs) = (x.as_slice().unwrap(), r.as_slice().unwrap());
    let mut g = c.benchmark_group("dot_const/forward");
    // Both arrays read.
    g.throughput(Throughput::Bytes((2 * N * H * 4) as u64));
    pools.bench(&mut g, || dot_slices(black_box(xs), rs));
    g.bench_function("naive", |b| {
        b.iter(|| black_box(dot_naive(black_box(xs), rs)))
    });
    g.finish();

    // The same product on bf16 copies of the arrays, widened as it goes:
    // half the bytes.
    let xh: Vec<bf16> = xs.iter().map(|&v| bf16::from_f32(v)).collect();
    let rh: Vec<bf16> = rs.iter().map(|&v| bf16::from_f32(v)).collect();
    let mut g = c.benchmark_group("dot_const/forward_bf16");
    g.throughput(Throughput::Bytes((2 * N * H * 2) as u64));
    pools.bench(&mut g, || dot_half::<f32, bf16>(black_box(&xh), &rh));
    g.finish();

    let mut g = c.benchmark_group("dot_const/backward");
    // R read, the gradient read and written.
    g.throughput(Throughput::Bytes((3 * N * H * 4) as u64));
    let mut grad = x.clone();
    pools.bench(&mut g, || add_scaled(0.5, r.view(), black_box(&mut grad)));
    g.finish();
}

common::bench_main!(dot);
