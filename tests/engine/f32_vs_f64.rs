//! The same inputs through an f32 and an f64 tape, for every op: the
//! values and the gradients must agree within f32 rounding.
//!
//! The inputs (and the upstream R, see `common::upstream`) are rounded to
//! f32 first and given to both tapes, so the two runs differ only in the arithmetic. Each case is
//! drawn from the crate's seeded [`Rng`], 48 seeds per op.

use crate::common::{Kind, Leaf, input};
use ndarray::{ArrayD, IxDyn};
use splitgrad::{Real, Rng, Tape, Var};

/// An op with its non-differentiable arguments.
enum Op {
    Gather(Vec<usize>),
    Add,
    Sub,
    Mul,
    MulSelf,
    Scale(f64),
    RowScale,
    Sigmoid,
    Select(Vec<bool>),
    SegmentSum(Vec<usize>, usize),
    SegmentMean(Vec<usize>, usize),
    RowNorm,
    Sum,
    Mean,
    DotConst(ArrayD<f64>),
    MatMul,
    Transpose,
    Reshape(Vec<usize>),
    ConcatRows,
    LogSumExp,
    CrossEntropy(Vec<i64>),
}

/// One op on its leaves.
struct Case {
    op: Op,
    leaves: Vec<Leaf>,
}

fn build<T: Real>(op: &Op, t: &mut Tape<'_, T>, v: &[Var]) -> Var {
    match op {
        Op::Gather(ids) => t.gather(v[0], ids),
        Op::Add => t.add(v[0], v[1]),
        Op::Sub => t.sub(v[0], v[1]),
        Op::Mul => t.mul(v[0], v[1]),
        Op::MulSelf => t.mul(v[0], v[0]),
        Op::Scale(c) => t.scale(v[0], T::from_f64(*c)),
        Op::RowScale => t.row_scale(v[0], v[1]),
        Op::Sigmoid => t.sigmoid(v[0]),
        Op::Select(mask) => t.select(mask, v[0], v[1]),
        Op::SegmentSum(seg, n) => t.segment_sum(v[0], seg, *n),
        Op::SegmentMean(seg, n) => t.segment_mean(v[0], seg, *n),
        Op::RowNorm => t.row_norm(v[0]),
        Op::Sum => t.sum(v[0]),
        Op::Mean => t.mean(v[0]),
        Op::DotConst(r) => t.dot_const(v[0], r.mapv(T::from_f64)),
        Op::MatMul => t.matmul(v[0], v[1]),
        Op::Transpose => t.transpose(v[0]),
        Op::Reshape(shape) => t.reshape(v[0], shape),
        Op::ConcatRows => t.concat_rows(v),
        Op::LogSumExp => t.logsumexp(v[0]),
        Op::CrossEntropy(labels) => t.cross_entropy(v[0], labels),
    }
}

/// The op's output and the gradient of `Σ y ⊙ R` for each leaf, computed
/// in T and widened to f64.
fn run<T: Real>(case: &Case) -> (ArrayD<f64>, Vec<ArrayD<f64>>) {
    let kinds: Vec<Kind> = case.leaves.iter().map(|l| l.kind).collect();
    let values: Vec<ArrayD<T>> = case
        .leaves
        .iter()
        .map(|l| l.value.mapv(T::from_f64))
        .collect();
    let pass = crate::common::evaluate(&kinds, &values, &|t, v, _| build(&case.op, t, v));
    let widen = |a: &ArrayD<T>| a.mapv(<T as Real>::to_f64);
    (widen(&pass.output), pass.grads.iter().map(widen).collect())
}

/// Largest `|a32 − a64| / max(1, |a64|)` over the output and the
/// gradients of 48 random cases, which must be ≤ `rtol`; ops that only
/// move elements must agree exactly (`rtol` 0).
#[track_caller]
fn agree(rtol: f64, make: impl Fn(&mut Rng) -> Case) {
    let mut worst = 0f64;
    for seed in 0..48 {
        let mut case = make(&mut Rng::new(seed));
        for leaf in &mut case.leaves {
            leaf.value.mapv_inplace(|x| x as f32 as f64);
        }
        if let Op::Scale(c) = &mut case.op {
            *c = *c as f32 as f64;
        }
        if let Op::DotConst(r) = &mut case.op {
            r.mapv_inplace(|x| x as f32 as f64);
        }
        let (y32, g32) = run::<f32>(&case);
        let (y64, g64) = run::<f64>(&case);
        let pairs = std::iter::once((&y32, &y64)).chain(g32.iter().zip(&g64));
        for (k, (a, b)) in pairs.enumerate() {
            assert_eq!(a.shape(), b.shape());
            for (&x, &y) in a.iter().zip(b) {
                let err = (x - y).abs() / y.abs().max(1.0);
                assert!(
                    err <= rtol,
                    "seed {seed}, {}: f32 {x} vs f64 {y} (relative {err:.2e} > {rtol:.0e})",
                    if k == 0 {
                        "output".to_string()
                    } else {
                        format!("gradient of leaf {}", k - 1)
                    }
                );
                worst = worst.max(err);
            }
        }
    }
    println!("worst relative difference {worst:.2e} (allowed {rtol:.0e})");
}

fn dim(rng: &mut Rng, max: u64) -> usize {
    1 + rng.below(max) as usize
}

fn arr(rng: &mut Rng, shape: &[usize], low: f64, high: f64) -> ArrayD<f64> {
    ArrayD::from_shape_simple_fn(IxDyn(shape), || rng.uniform_in(low, high))
}

fn shape(rng: &mut Rng) -> Vec<usize> {
    let ndim = dim(rng, 3);
    (0..ndim).map(|_| dim(rng, 4)).collect()
}

fn ids(rng: &mut Rng, n: usize, below: usize) -> Vec<usize> {
    (0..n).map(|_| rng.below(below as u64) as usize).collect()
}

/// Ordinary cases: O(1) inputs, at most 8 terms per sum. f32 rounds each
/// operation to u = 2⁻²⁴ ≈ 6e-8; a sum of k terms is off by about √k·u
/// of Σ|terms| on average (k·u at worst), and Σ|terms| / max(1, |result|)
/// stays below ~50 here: a few 1e-6 at most, 5e-7 observed. 1e-5 leaves
/// that room and is still four orders below what a backward that differs
/// between the types in anything but rounding would produce.
const RTOL: f64 = 1e-5;

#[test]
fn gather() {
    agree(RTOL, |rng| {
        let (r, w) = (dim(rng, 5), dim(rng, 4));
        let kind = if rng.below(2) == 0 {
            Kind::Input
        } else {
            Kind::Param
        };
        let n = dim(rng, 8);
        Case {
            op: Op::Gather(ids(rng, n, r)),
            leaves: vec![Leaf {
                kind,
                value: arr(rng, &[r, w], -2.0, 2.0),
            }],
        }
    });
}

/// An element-wise op on two arrays of one random shape.
fn two(rng: &mut Rng, op: Op) -> Case {
    let s = shape(rng);
    Case {
        op,
        leaves: vec![
            input(arr(rng, &s, -2.0, 2.0)),
            input(arr(rng, &s, -2.0, 2.0)),
        ],
    }
}

/// An op on one array of a random shape, elements in `[low, high)`.
fn one(rng: &mut Rng, op: Op, low: f64, high: f64) -> Case {
    let s = shape(rng);
    Case {
        op,
        leaves: vec![input(arr(rng, &s, low, high))],
    }
}

#[test]
fn add_sub_mul() {
    agree(RTOL, |rng| two(rng, Op::Add));
    agree(RTOL, |rng| two(rng, Op::Sub));
    agree(RTOL, |rng| two(rng, Op::Mul));
    agree(RTOL, |rng| one(rng, Op::MulSelf, -2.0, 2.0));
}

#[test]
fn scale_sigmoid_sum_mean() {
    agree(RTOL, |rng| {
        let c = rng.uniform_in(-3.0, 3.0);
        one(rng, Op::Scale(c), -2.0, 2.0)
    });
    agree(RTOL, |rng| one(rng, Op::Sigmoid, -8.0, 8.0));
    agree(RTOL, |rng| one(rng, Op::Sum, -2.0, 2.0));
    agree(RTOL, |rng| one(rng, Op::Mean, -2.0, 2.0));
}

#[test]
fn dot_const() {
    agree(RTOL, |rng| {
        let s = shape(rng);
        let r = arr(rng, &s, -2.0, 2.0);
        Case {
            op: Op::DotConst(r),
            leaves: vec![input(arr(rng, &s, -2.0, 2.0))],
        }
    });
}

#[test]
fn row_scale_select_row_norm() {
    agree(RTOL, |rng| {
        let (n, m) = (dim(rng, 6), dim(rng, 4));
        let leaves = vec![
            input(arr(rng, &[n, m], -2.0, 2.0)),
            input(arr(rng, &[n], -2.0, 2.0)),
        ];
        Case {
            op: Op::RowScale,
            leaves,
        }
    });
    // Select only moves elements: exact agreement.
    agree(0.0, |rng| {
        let (n, m) = (dim(rng, 6), dim(rng, 4));
        let mask = (0..n).map(|_| rng.below(2) == 1).collect();
        let leaves = vec![
            input(arr(rng, &[n, m], -2.0, 2.0)),
            input(arr(rng, &[n, m], -2.0, 2.0)),
        ];
        Case {
            op: Op::Select(mask),
            leaves,
        }
    });
    // Rows of norm ≥ 1/2 (x / ‖x‖ is ill-conditioned near 0), and one
    // exact zero row: both types must give it gradient 0.
    agree(RTOL, |rng| {
        let (n, m) = (dim(rng, 6), dim(rng, 4));
        let mut x = arr(rng, &[n, m], 0.5, 2.0);
        x.index_axis_mut(ndarray::Axis(0), rng.below(n as u64) as usize)
            .fill(0.0);
        Case {
            op: Op::RowNorm,
            leaves: vec![input(x)],
        }
    });
}

#[test]
fn segment_sum_and_mean() {
    for mean in [false, true] {
        agree(RTOL, |rng| {
            let (n, m, s) = (dim(rng, 8), dim(rng, 4), dim(rng, 4));
            let seg = ids(rng, n, s);
            let n_seg = s + rng.below(3) as usize;
            let op = if mean {
                Op::SegmentMean(seg, n_seg)
            } else {
                Op::SegmentSum(seg, n_seg)
            };
            Case {
                op,
                leaves: vec![input(arr(rng, &[n, m], -2.0, 2.0))],
            }
        });
    }
}

#[test]
fn matmul() {
    agree(RTOL, |rng| {
        let (m, k, n) = (dim(rng, 8), dim(rng, 8), dim(rng, 8));
        let leaves = vec![
            input(arr(rng, &[m, k], -2.0, 2.0)),
            input(arr(rng, &[k, n], -2.0, 2.0)),
        ];
        Case {
            op: Op::MatMul,
            leaves,
        }
    });
}

#[test]
fn transpose_reshape_concat_rows() {
    // Moving elements involves no arithmetic: exact agreement.
    agree(0.0, |rng| {
        let (n, m) = (dim(rng, 6), dim(rng, 6));
        Case {
            op: Op::Transpose,
            leaves: vec![input(arr(rng, &[n, m], -2.0, 2.0))],
        }
    });
    agree(0.0, |rng| {
        let (a, b, c) = (dim(rng, 4), dim(rng, 4), dim(rng, 4));
        Case {
            op: Op::Reshape(vec![c, a * b]),
            leaves: vec![input(arr(rng, &[a, b, c], -2.0, 2.0))],
        }
    });
    agree(0.0, |rng| {
        let m = dim(rng, 4);
        let parts = dim(rng, 3);
        let leaves = (0..parts).map(|_| {
            let n = dim(rng, 4);
            input(arr(rng, &[n, m], -2.0, 2.0))
        });
        Case {
            op: Op::ConcatRows,
            leaves: leaves.collect(),
        }
    });
}

/// Logits of (n, V), O(1) or spread over the thousands, with labels
/// (a quarter of them −100).
fn logits(rng: &mut Rng, spread: f64) -> (ArrayD<f64>, Vec<i64>) {
    let (n, v) = (dim(rng, 5), dim(rng, 6));
    let x = arr(rng, &[n, v], -spread, spread);
    let labels = (0..n)
        .map(|_| {
            if rng.below(4) == 0 {
                -100
            } else {
                rng.below(v as u64) as i64
            }
        })
        .collect();
    (x, labels)
}

#[test]
fn logsumexp_and_cross_entropy() {
    agree(RTOL, |rng| Case {
        op: Op::LogSumExp,
        leaves: vec![input(logits(rng, 3.0).0)],
    });
    agree(RTOL, |rng| {
        let (x, labels) = logits(rng, 3.0);
        Case {
            op: Op::CrossEntropy(labels),
            leaves: vec![input(x)],
        }
    });
}

#[test]
fn logsumexp_and_cross_entropy_in_the_thousands() {
    // Logits up to ±3000 carry an absolute f32 rounding of up to
    // ulp(2048)/2 = 1.2e-4, and `x − lse` inherits a few of them as an
    // absolute error: outputs of magnitude ~1000 still agree to ~u
    // relative, but the softmax e^{x − lse} (the gradient) only to
    // ~2·|x|·u ≈ 3.6e-4 relative (5.7e-5 observed). 5e-4 covers it; a
    // max-shift broken in one type would give inf or NaN, not 5e-4.
    agree(5e-4, |rng| Case {
        op: Op::LogSumExp,
        leaves: vec![input(logits(rng, 3000.0).0)],
    });
    agree(5e-4, |rng| {
        let (x, labels) = logits(rng, 3000.0);
        Case {
            op: Op::CrossEntropy(labels),
            leaves: vec![input(x)],
        }
    });
}
