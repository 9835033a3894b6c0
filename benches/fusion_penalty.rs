//! The fusion penalty `(1/n_rows) Σ_i ‖rows_i − c(token_i)‖₂` through the
//! tape: forward, and backward apart. The fused op on one thread and on
//! all, and its naive twin (five generic tape ops) on all. Then the
//! penalty with the rows' lazy Adam update at `splitvocab`'s size: a pass
//! for its terms and the update by rows, against the terms formed a block
//! at a time inside the update; and the blocks' formation alone.

mod common;

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput};
use splitgrad::layers::{RowsBlocks, RowsGrad, SplitVocabulary};
use splitgrad::optim::{LazyAdam, LazyAdamConfig, Optimizer};
use splitgrad::param::{Dtype, Rounding};
use splitgrad::tape::Pool;
use splitgrad::{Rng, Tape, Var};

const V: usize = 8192;
const D: usize = 256;
const L: usize = 8;
const ROWS: usize = 8192;

type Penalty = fn(&'static SplitVocabulary<f32>, &mut Tape<'static, f32>) -> Var;

fn fused(sv: &'static SplitVocabulary<f32>, tape: &mut Tape<'static, f32>) -> Var {
    sv.fusion_penalty_var(tape)
}

fn naive(sv: &'static SplitVocabulary<f32>, tape: &mut Tape<'static, f32>) -> Var {
    sv.fusion_penalty_var_naive(tape)
}

fn fusion_penalty(c: &mut Criterion) {
    let pools = common::pools();
    // Distinct (language, token) cells, uniformly.
    let mut cells: Vec<usize> = (0..L * V).collect();
    Rng::new(10).shuffle(&mut cells);
    cells.truncate(ROWS);
    let languages = cells.iter().map(|c| c / V).collect();
    let tokens = cells.iter().map(|c| c % V).collect();
    let mut sv = common::split_vocabulary(languages, tokens, (V, D, L), 0.0);
    *sv.rows_mut().value_mut() = common::normal(11, &[ROWS, D]);

    let sv: &'static SplitVocabulary<f32> = Box::leak(Box::new(sv));
    let variants = [
        ("serial", &pools.one, fused as Penalty),
        ("parallel", &pools.all, fused),
        ("naive", &pools.all, naive),
    ];

    let mut g = c.benchmark_group("fusion_penalty/forward");
    // Read the rows.
    g.throughput(Throughput::Bytes((ROWS * D * 4) as u64));
    for (name, pool, var) in variants {
        g.bench_function(name, |b| {
            b.iter(|| {
                pool.install(|| {
                    let mut tape = Tape::new();
                    let p = var(sv, &mut tape);
                    black_box(tape.scalar(p))
                })
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("fusion_penalty/backward");
    // Read the rows, write ∂rows.
    g.throughput(Throughput::Bytes((2 * ROWS * D * 4) as u64));
    for (name, pool, var) in variants {
        g.bench_function(name, |b| {
            b.iter_batched(
                || {
                    let mut tape = Tape::new();
                    let p = var(sv, &mut tape);
                    (tape, p)
                },
                |(tape, p)| pool.install(|| black_box(tape.backward(p))),
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

/// The split rows of `splitvocab` (20,000 of 8 × 32,000 cells, 512 wide)
/// and the fusion penalty's gradient (weight 0.01) with lazy Adam's update
/// of every row, rows and moments in f32 and in bf16 (stochastic
/// rounding), on all threads: the penalty's terms in a pass of their own,
/// then the update by rows (`fusion_penalty_row_grads`, `RowsGrad`),
/// against the terms formed a block at a time inside the update
/// (`rows_and_fusion_blocks`, `RowsBlocks`). The same bits either way.
fn with_update(c: &mut Criterion) {
    let pools = common::pools();
    let (v, d, l, n) = (32_000, 512, 8, 20_000);
    let mut cells: Vec<usize> = (0..l * v).collect();
    Rng::new(12).shuffle(&mut cells);
    cells.truncate(n);
    cells.sort_unstable();
    let languages = cells.iter().map(|c| c / v).collect();
    let tokens = cells.iter().map(|c| c % v).collect();
    let mut base = common::split_vocabulary(languages, tokens, (v, d, l), 0.0);
    *base.rows_mut().value_mut() = common::normal(13, &[n, d]);
    let work = Pool::new();
    for (dtype, bytes) in [(Dtype::F32, 24), (Dtype::BF16, 12)] {
        let mut g = c.benchmark_group(format!("fusion_penalty/with_update_{dtype}"));
        // Read and write p, m and v of every row.
        g.throughput(Throughput::Bytes((bytes * n * d) as u64));
        let fresh = || {
            let mut sv = base.clone();
            sv.rows_mut().set_dtype(dtype).unwrap();
            let mut opt = LazyAdam::new(LazyAdamConfig::default()).unwrap();
            opt.set_state_dtype(dtype).unwrap();
            opt.set_rounding(Rounding::Stochastic { seed: 0 });
            (sv, opt)
        };
        let (mut sv, mut opt) = fresh();
        g.bench_function("pass_then_rows", |b| {
            b.iter(|| {
                pools.all.install(|| {
                    let (p, _, terms) = sv.fusion_penalty_row_grads(&work, 0.01);
                    let grad = RowsGrad::new(n, Some(&terms), &[]);
                    opt.update_by_rows(sv.rows_mut(), &grad).unwrap();
                    terms.give_back(&work);
                    black_box(p)
                })
            })
        });
        // The blocks formed alone (their centroids, norms and terms, no
        // update), on one thread: the formation's arithmetic, the rows in
        // the last-level cache after the first formation.
        let (mut sv, _) = fresh();
        g.bench_function("form_serial", |b| {
            b.iter(|| {
                pools.one.install(|| {
                    let (rows, blocks) = sv.rows_and_fusion_blocks(0.01);
                    black_box(blocks.penalty(rows.stored().view()).0)
                })
            })
        });
        let (mut sv, mut opt) = fresh();
        g.bench_function("blocks", |b| {
            b.iter(|| {
                pools.all.install(|| {
                    let (rows, blocks) = sv.rows_and_fusion_blocks(0.01);
                    opt.update_by_blocks(rows, &RowsBlocks::new(&blocks, &[]))
                        .unwrap();
                    black_box(blocks.penalty(rows.stored().view()).0)
                })
            })
        });
        g.finish();
    }
}

common::bench_main!(fusion_penalty, with_update);
