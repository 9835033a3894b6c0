//! The fusion penalty `(1/n_rows) Σ_i ‖rows_i − c(token_i)‖₂` through the
//! tape: forward, and backward apart. On one thread and on all.

mod common;

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use splitgrad::io::SplitIndex;
use splitgrad::layers::SplitVocabulary;
use splitgrad::{Rng, Tape};

const V: usize = 8192;
const D: usize = 256;
const L: usize = 8;
const ROWS: usize = 8192;

fn fusion_penalty(c: &mut Criterion) {
    let (one, all) = common::pools();
    // Distinct (language, token) cells, uniformly.
    let mut cells: Vec<usize> = (0..L * V).collect();
    Rng::new(10).shuffle(&mut cells);
    cells.truncate(ROWS);
    let index = SplitIndex::new(
        cells.iter().map(|c| c / V).collect(),
        cells.iter().map(|c| c % V).collect(),
    );
    let mut sv = SplitVocabulary::<f32>::new(index, V, D, L, 0.0).unwrap();
    *sv.parameters_mut().0.value_mut() = common::normal(11, &[ROWS, D]);

    let mut g = c.benchmark_group("fusion_penalty/forward");
    g.throughput(Throughput::Elements((ROWS * D) as u64));
    for (name, pool) in [("serial", &one), ("parallel", &all)] {
        g.bench_function(name, |b| {
            b.iter(|| {
                pool.install(|| {
                    let mut tape = Tape::new();
                    let p = sv.fusion_penalty_var(&mut tape);
                    black_box(tape.scalar(p))
                })
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("fusion_penalty/backward");
    g.throughput(Throughput::Elements((ROWS * D) as u64));
    for (name, pool) in [("serial", &one), ("parallel", &all)] {
        g.bench_function(name, |b| {
            b.iter_batched(
                || {
                    let mut tape = Tape::new();
                    let p = sv.fusion_penalty_var(&mut tape);
                    (tape, p)
                },
                |(tape, p)| pool.install(|| black_box(tape.backward(p))),
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = fusion_penalty
}
criterion_main!(benches);
