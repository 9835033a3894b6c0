//! The fusion penalty `(1/n_rows) Σ_i ‖rows_i − c(token_i)‖₂` through the
//! tape: forward, and backward apart. The fused op on one thread and on
//! all, and its naive twin (five generic tape ops) on all.

mod common;

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput};
use splitgrad::layers::SplitVocabulary;
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

common::bench_main!(fusion_penalty);
