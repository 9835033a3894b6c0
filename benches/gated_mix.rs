//! The gated mix of the split vocabulary,
//! `out_n = shared_n + g_r·(rows_r − shared_n)`: the forward kernel, and
//! the backward through the tape (the gated mix's backward plus the
//! `Σ out ⊙ R` loss's, which writes ∂out). On one thread and on all; the
//! forward's serial twin beside them.

mod common;

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use splitgrad::Tape;
use splitgrad::ops::gated_mix::gated_mix_forward;
use splitgrad::ops::gated_mix::gated_mix_forward_naive;

const V: usize = 8192;
const D: usize = 256;
const L: usize = 8;
const N: usize = 8192;
/// Every language gets a row for the 1024 most frequent tokens.
const TOP: usize = 1024;

fn gated_mix(c: &mut Criterion) {
    let pools = common::pools();
    let langs_of_rows: Vec<usize> = (0..L * TOP).map(|i| i / TOP).collect();
    let tokens_of_rows: Vec<usize> = (0..L * TOP).map(|i| i % TOP).collect();
    let mut sv = common::split_vocabulary(langs_of_rows, tokens_of_rows, (V, D, L), 0.5);
    sv.seed_from(common::normal2(5, V, D).view()).unwrap();
    let tokens: Vec<i64> = common::zipf_ids(6, V, N)
        .into_iter()
        .map(|t| t as i64)
        .collect();
    let langs: Vec<i64> = common::zipf_ids(7, L, N)
        .into_iter()
        .map(|l| l as i64)
        .collect();
    let row_of: Vec<u32> = tokens
        .iter()
        .zip(&langs)
        .map(|(&t, &l)| {
            sv.row_of(l as usize, t as usize)
                .map_or(u32::MAX, |r| r as u32)
        })
        .collect();
    let hits = row_of.iter().filter(|&&r| r != u32::MAX).count();
    let shared = common::normal(8, &[N, D]);
    let r = common::normal(9, &[N, D]);
    let rows = sv.rows().value().view().into_dimensionality().unwrap();
    let shared2 = shared.view().into_dimensionality().unwrap();
    let gate: Vec<f32> = sv.gate().to_vec();

    let mut g = c.benchmark_group("gated_mix/forward");
    // Read shared and the rows hit, write out.
    g.throughput(Throughput::Bytes(((2 * N + hits) * D * 4) as u64));
    pools.bench(&mut g, || {
        gated_mix_forward(shared2, rows, Some(&gate), &row_of)
    });
    g.bench_function("naive", |b| {
        b.iter(|| black_box(gated_mix_forward_naive(shared2, rows, Some(&gate), &row_of)))
    });
    g.finish();

    let mut g = c.benchmark_group("gated_mix/backward");
    // Read ∂out, shared and the rows hit; write ∂shared and the row
    // contributions.
    g.throughput(Throughput::Bytes(((3 * N + 2 * hits) * D * 4) as u64));
    pools.bench_batched(
        &mut g,
        || {
            let mut tape = Tape::new();
            let s = tape.input_view(shared.view());
            let out = sv.forward(&mut tape, &tokens, &langs, s, true).unwrap();
            let loss = tape.dot_const_view(out, r.view());
            (tape, loss)
        },
        |(tape, loss)| tape.backward(loss),
    );
    g.finish();
}

common::bench_main!(gated_mix);
