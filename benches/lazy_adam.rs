//! The lazy Adam update of the rows of a table that a batch of Zipf ids
//! touched: the fast update on one thread and on all, and the naive one.

mod common;

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use splitgrad::kernels::scatter::coalesce_rows;
use splitgrad::optim::{LazyAdam, LazyAdamConfig, Optimizer};
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
}

common::bench_main!(lazy_adam);
