//! The grouped, summed head (`SplitLanguageModellingHead::forward_grouped_sum`,
//! tokens sharing hidden rows, the gradients formed in the forward) equals
//! the grouped per-token head followed by `Tape::sum`, in f64 and f32, on
//! the tile kernel and on `matrixmultiply`, for the loss and every gradient;
//! and the tile kernel gives the same bits on any thread count.

use ndarray::{Array2, ArrayD};

use crate::common::split_head;
use splitgrad::kernels::gemm::Isa;
use splitgrad::ops::fused_ce::HeadKernel;
use splitgrad::ops::fused_ce_sum::SumChunks;
use splitgrad::state::Module;
use splitgrad::{Real, Rng, Tape};

struct Case {
    sizes: Vec<usize>,
    hidden: Array2<f64>,
    weights: Vec<Array2<f64>>,
    row_of: Vec<usize>,
    labels: Vec<i64>,
    /// The upstream gradient of the sum.
    g: f64,
}

fn case(seed: u64, m: usize, n: usize, h: usize, sizes: &[usize], scale: f64) -> Case {
    let mut rng = Rng::new(seed);
    let v: usize = sizes.iter().sum();
    Case {
        sizes: sizes.to_vec(),
        hidden: Array2::from_shape_fn((m, h), |_| scale * rng.normal()),
        weights: sizes
            .iter()
            .map(|&s| Array2::from_shape_fn((s, h), |_| scale * rng.normal()))
            .collect(),
        row_of: (0..n).map(|_| rng.below(m as u64) as usize).collect(),
        labels: (0..n)
            .map(|i| {
                if i % 5 == 4 {
                    -100
                } else {
                    rng.below(v as u64) as i64
                }
            })
            .collect(),
        g: 0.375,
    }
}

/// (loss, ∂hidden, ∂W_k...) of `g·Σ_n loss_n`, as f64.
fn run<T: Real>(
    c: &Case,
    summed: bool,
    kernel: HeadKernel,
    chunks: SumChunks,
) -> (f64, Vec<ArrayD<f64>>) {
    let weights: Vec<ArrayD<f64>> = c.weights.iter().map(|w| w.clone().into_dyn()).collect();
    let trainable = vec![true; c.sizes.len()];
    let mut head = split_head::<T>(&c.sizes, c.hidden.ncols(), &weights, &trainable);
    head.set_kernel(kernel);
    head.set_sum_chunks(chunks);
    let mut tape = Tape::new();
    let h = tape.input(c.hidden.mapv(T::from_f64).into_dyn());
    let s = if summed {
        head.forward_grouped_sum(&mut tape, h, &c.row_of, &c.labels)
            .unwrap()
    } else {
        let l = head
            .forward_grouped(&mut tape, h, &c.row_of, &c.labels)
            .unwrap();
        tape.sum(l)
    };
    let loss = tape.scale(s, T::from_f64(c.g));
    let value = tape.scalar(s).to_f64();
    let grads = tape.backward(loss);
    let mut out = vec![grads.input(h).unwrap().mapv(Real::to_f64)];
    for p in head.parameters() {
        out.push(grads.dense(p).mapv(Real::to_f64));
    }
    (value, out)
}

fn assert_close(a: &(f64, Vec<ArrayD<f64>>), b: &(f64, Vec<ArrayD<f64>>), rel: f64, what: &str) {
    assert!(
        (a.0 - b.0).abs() <= rel * b.0.abs().max(1.0),
        "{what}: loss {} vs {}",
        a.0,
        b.0
    );
    for (k, (x, y)) in a.1.iter().zip(&b.1).enumerate() {
        let scale = y.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
        for (p, q) in x.iter().zip(y) {
            assert!(
                (p - q).abs() <= rel * scale,
                "{what}: gradient {k}: {p} vs {q}"
            );
        }
    }
}

#[test]
fn grouped_sum_equals_grouped_per_token_then_sum() {
    let kernels: Vec<HeadKernel> = std::iter::once(HeadKernel::Matrixmultiply)
        .chain(
            Isa::ALL
                .into_iter()
                .filter(|i| i.available())
                .map(HeadKernel::Tile),
        )
        .collect();
    for (c, what) in [
        (case(1, 9, 30, 5, &[7, 0, 10], 1.0), "three splits"),
        (case(2, 40, 100, 17, &[33, 20], 0.5), "H 17"),
        (case(3, 6, 12, 4, &[50], 30.0), "logits in the thousands"),
    ] {
        let reference = run::<f64>(&c, false, HeadKernel::Matrixmultiply, SumChunks::default());
        for chunks in [
            SumChunks::Tokens(1),
            SumChunks::Tokens(3),
            SumChunks::default(),
        ] {
            let f64_sum = run::<f64>(&c, true, HeadKernel::Auto, chunks);
            assert_close(
                &f64_sum,
                &reference,
                1e-12,
                &format!("{what}, f64, {chunks:?}"),
            );
            for &k in &kernels {
                let got = run::<f32>(&c, true, k, chunks);
                assert_close(
                    &got,
                    &reference,
                    2e-4,
                    &format!("{what}, f32 {k:?}, {chunks:?}"),
                );
            }
        }
    }
}

#[test]
fn the_tile_kernel_gives_the_same_bits_on_any_thread_count() {
    let Some(isa) = Isa::fast() else {
        return;
    };
    let c = case(4, 60, 200, 24, &[90, 7], 1.0);
    let run_on = |threads: usize| {
        crate::common::threads(threads)
            .install(|| run::<f32>(&c, true, HeadKernel::Tile(isa), SumChunks::Tokens(20)))
    };
    let one = run_on(1);
    for threads in [2, 4] {
        let other = run_on(threads);
        assert_eq!(
            one.0.to_bits(),
            other.0.to_bits(),
            "{threads} threads: loss"
        );
        for (a, b) in one.1.iter().zip(&other.1) {
            assert!(
                a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{threads} threads: gradients"
            );
        }
    }
}
