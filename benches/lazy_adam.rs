//! The lazy Adam update of the rows of a table that a batch of Zipf ids
//! touched: the fast update on one thread and on all, and the naive one.

mod common;

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use splitgrad::kernels::scatter::coalesce_rows;
use splitgrad::optim::{LazyAdam, LazyAdamConfig, Optimizer};
use splitgrad::param::{Dtype, Rounding};
use splitgrad::{ParamGrad, Parameter, RowSparse};

use common::table::{H, N, V};

fn lazy_adam(c: &mut Criterion) {
    let pools = common::pools();
    let ids = common::zipf_ids(12, V, N);
    let rows = coalesce_rows(V, &ids, common::normal2(13, N, H).view());
    let grad = ParamGrad::RowSparse(RowSparse::from_coalesced(V, rows));
    let ParamGrad::RowSparse(rs) = &grad else {
        unreachable!()
    };
    let touched = rs.rows.len();
    let fresh = || {
        let p = Parameter::new("table", common::normal(14, &[V, H]));
        let opt = LazyAdam::new(LazyAdamConfig::default()).unwrap();
        (p, opt)
    };

    let mut g = c.benchmark_group("lazy_adam/update");
    // Read p, m, v, g and write p, m, v of the touched rows.
    g.throughput(Throughput::Bytes((7 * touched * H * 4) as u64));
    // A fresh table and optimiser for each.
    for (name, pool) in pools.both() {
        let (mut p, mut opt) = fresh();
        g.bench_function(name, |b| {
            b.iter(|| pool.install(|| opt.update(&mut p, black_box(&grad)).unwrap()))
        });
    }
    let (mut p, mut opt) = fresh();
    g.bench_function("naive", |b| {
        b.iter(|| opt.update_naive(&mut p, black_box(&grad)).unwrap())
    });
    g.finish();

    // The same rows of a bf16 table, the moments in f32 and in bf16, each
    // store rounded stochastically, then to nearest; the bytes of the same
    // elements at their widths.
    for (state, moment_bytes) in [(Dtype::F32, 4), (Dtype::BF16, 2)] {
        let mut g = c.benchmark_group(format!("lazy_adam/update_bf16_{state}_state"));
        g.throughput(Throughput::Bytes(
            ((4 + 2 * 2 + 4 * moment_bytes) * touched * H) as u64,
        ));
        for (rounding, suffix) in [
            (Rounding::Stochastic { seed: 0 }, ""),
            (Rounding::Nearest, "_nearest"),
        ] {
            for (name, pool) in pools.both() {
                let (mut p, mut opt) = fresh();
                p.set_dtype(Dtype::BF16).unwrap();
                opt.set_state_dtype(state).unwrap();
                opt.set_rounding(rounding);
                g.bench_function(format!("{name}{suffix}"), |b| {
                    b.iter(|| pool.install(|| opt.update(&mut p, black_box(&grad)).unwrap()))
                });
            }
        }
        g.finish();
    }
}

/// Every row of a 20000 × 512 table updated by rows, each row's gradient
/// computed as it is reached (as the split vocabulary's rows are): f32,
/// and bf16 with bf16 moments rounded stochastically.
fn by_rows(c: &mut Criterion) {
    let pools = common::pools();
    let (rows, width) = (20_000, 512);
    // A gradient that reads the row but keeps the moments away from
    // zero (moments decaying into subnormals would time the CPU's
    // subnormal assists, not the update).
    let grad_row = |r: usize, x: &[f32], g: &mut [f32]| {
        for (j, (g, &x)) in g.iter_mut().zip(x).enumerate() {
            *g = ((r + j) & 15) as f32 * 0.01 - 0.07 + 1e-9 * x;
        }
    };
    for (dtype, bytes) in [(Dtype::F32, 24), (Dtype::BF16, 12)] {
        let mut g = c.benchmark_group(format!("lazy_adam/update_by_rows_{dtype}"));
        // Read and write p, m and v (the gradient is never stored).
        g.throughput(Throughput::Bytes((bytes * rows * width) as u64));
        for (name, pool) in pools.both() {
            let mut p = Parameter::new("rows", common::normal(15, &[rows, width]));
            let mut opt = LazyAdam::new(LazyAdamConfig::default()).unwrap();
            p.set_dtype(dtype).unwrap();
            opt.set_state_dtype(dtype).unwrap();
            opt.set_rounding(Rounding::Stochastic { seed: 0 });
            g.bench_function(name, |b| {
                b.iter(|| pool.install(|| opt.update_by_rows(&mut p, &grad_row).unwrap()))
            });
        }
        g.finish();
    }
}

common::bench_main!(lazy_adam, by_rows);
