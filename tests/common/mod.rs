//! The gradient-check harness shared by the test files: the tape's
//! hand-derived backward against central finite differences, in f64, plus
//! the proptest strategies that make small random inputs.
//!
//! A check builds a function `y = build(leaves)` of any shape on a fresh
//! [`Tape<f64>`] and reduces it to the scalar `L = Σ y ⊙ R` with a fixed
//! random constant `R` of y's shape ([`Tape::dot_const`]), so that every
//! output element receives its own upstream gradient: a backward that
//! sends element i's gradient to the place of element j, or sums where it
//! should not, is caught even when the op itself is linear.

// Each test crate that includes this module uses only part of it.
#![allow(dead_code)]

#[cfg(feature = "cli")]
pub mod cli;
pub mod table;

use ndarray::{ArrayD, IxDyn};

/// A rayon pool of `n` threads, for the tests that hold a result to be
/// the same bits on any number of threads.
pub fn threads(n: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .expect("a test's thread pool")
}

use proptest::prelude::*;
use splitgrad::state::Module;
use splitgrad::{ParamGrad, Parameter, Real, Rng, Tape, Var};

/// Two property tests of one check of a case, `check::<T>(&case, ε_T)`: in
/// f64 (named `$f64`) and in f32 (`$f32`), `cases` cases of `strategy`
/// each, failing seeds saved in `regressions` (see [`config`]).
macro_rules! in_f64_and_f32 {
    ($cases:expr, $regressions:literal, $strategy:expr, $check:ident => $f64:ident, $f32:ident) => {
        proptest::proptest! {
            #![proptest_config($crate::common::config($cases, $regressions))]

            #[test]
            fn $f64(c in $strategy) {
                $check::<f64>(&c, f64::EPSILON)?;
            }

            #[test]
            fn $f32(c in $strategy) {
                $check::<f32>(&c, f32::EPSILON as f64)?;
            }
        }
    };
}
pub(crate) use in_f64_and_f32;

/// How a leaf enters the tape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `tape.input(..)`: gradient from `Gradients::input`.
    Input,
    /// `tape.param(&p)`: gradient from `Gradients::dense(&p)`.
    Param,
}

/// A value the loss is differentiated against.
#[derive(Clone, Debug)]
pub struct Leaf {
    /// How it enters the tape.
    pub kind: Kind,
    /// Its value.
    pub value: ArrayD<f64>,
}

/// A differentiable input leaf.
pub fn input(value: ArrayD<f64>) -> Leaf {
    Leaf {
        kind: Kind::Input,
        value,
    }
}

/// A trainable parameter leaf.
pub fn param(value: ArrayD<f64>) -> Leaf {
    Leaf {
        kind: Kind::Param,
        value,
    }
}

/// The step is `REL_STEP·max(1, |x|)`. Central differences have a
/// truncation error of `h²·f'''/6` and a rounding error of about
/// `ε·|L| / h` (ε = 2⁻⁵²): with h = 1e-6 both are ≈ 1e-10 for the O(1)
/// values, losses of at most a few thousand, and third derivatives of
/// O(1) the strategies produce, so the finite difference is good to about
/// 1e-9. Scaling h with |x| keeps `x ± h` distinct from x in floating
/// point when x is in the thousands (the large-logit cases).
pub const REL_STEP: f64 = 1e-6;

/// Agreement asked of analytic (a) and numeric (n) derivatives:
/// `|a − n| ≤ TOL·max(1, |a|, |n|)` — relative for large derivatives,
/// absolute for small ones (a derivative that should be 0 is computed by
/// differences as ~1e-10, never exactly 0). 1e-6 is three orders above the
/// finite difference's own error (see [`REL_STEP`]) and several orders
/// below any real mistake in a backward (a wrong sign, a dropped term, a
/// gradient sent to the wrong element are O(1) errors).
pub const TOL: f64 = 1e-6;

/// Whether an analytic and a numeric derivative agree within [`TOL`].
pub fn close(a: f64, n: f64) -> bool {
    (a - n).abs() <= TOL * 1f64.max(a.abs()).max(n.abs())
}

/// What a successful check saw.
#[derive(Clone, Debug)]
pub struct Report {
    /// Number of derivatives compared.
    pub checked: usize,
    /// The largest |numeric derivative|, to show a check was not vacuous.
    pub max_abs_grad: f64,
}

/// The checks of one property test, counted across its cases: a case may
/// be vacuous (every label ignored, a softmax saturated past what finite
/// differences resolve), the test may not. Declare one per test, `static T:
/// Tally = Tally::new();`, and pass each case's report to [`Tally::count`].
pub struct Tally {
    runs: std::sync::atomic::AtomicU32,
    nonzero: std::sync::atomic::AtomicU32,
}

impl Tally {
    /// No case yet.
    pub const fn new() -> Self {
        Tally {
            runs: std::sync::atomic::AtomicU32::new(0),
            nonzero: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// Counts one passing case; at the `cases`-th, an error unless at least
    /// one case compared a non-zero derivative.
    pub fn count(&self, report: &Report, cases: u32) -> Result<(), String> {
        use std::sync::atomic::Ordering::Relaxed;
        if report.checked > 0 && report.max_abs_grad > 0.0 {
            self.nonzero.fetch_add(1, Relaxed);
        }
        let runs = self.runs.fetch_add(1, Relaxed) + 1;
        if runs == cases && self.nonzero.load(Relaxed) == 0 {
            return Err(format!(
                "vacuous property test: none of {runs} cases compared a non-zero derivative"
            ));
        }
        Ok(())
    }
}

impl Report {
    /// The report, or an error when the check compared nothing or only
    /// zeros: a gradient check that cannot fail is not a check.
    pub fn non_vacuous(self) -> Result<Report, String> {
        if self.checked == 0 || self.max_abs_grad == 0.0 {
            return Err(format!(
                "vacuous gradient check: {} derivatives compared, every one 0",
                self.checked
            ));
        }
        Ok(self)
    }
}

/// The upstream constant R for an output of this shape: standard normal
/// draws from a fixed seed, so every evaluation of a check uses the same
/// R, rounded to f32 so that f32 and f64 tapes can share it exactly.
pub fn upstream(shape: &[usize]) -> ArrayD<f64> {
    let mut rng = Rng::new(0x5EED_DA7A);
    ArrayD::from_shape_simple_fn(IxDyn(shape), || rng.normal() as f32 as f64)
}

/// One forward and backward pass: the output y, `L = Σ y ⊙ R` and the
/// gradient of L for each leaf (zeros for a leaf that received none).
pub struct Pass<T> {
    /// `build(..)`'s value.
    pub output: ArrayD<T>,
    /// L.
    pub loss: T,
    /// One gradient per leaf, in the leaves' order and shapes.
    pub grads: Vec<ArrayD<T>>,
}

/// Builds the leaves on a fresh recording tape — `tape.input(..)` for a
/// [`Kind::Input`], `tape.param(..)` of a new parameter for a
/// [`Kind::Param`] — then `y = build(..)`, `L = Σ y ⊙ R` and its backward.
pub fn evaluate<T, F>(kinds: &[Kind], values: &[ArrayD<T>], build: &F) -> Pass<T>
where
    T: Real,
    F: for<'p> Fn(&mut Tape<'p, T>, &[Var], &[&'p Parameter<T>]) -> Var,
{
    let params: Vec<Parameter<T>> = values
        .iter()
        .zip(kinds)
        .filter(|&(_, &k)| k == Kind::Param)
        .enumerate()
        .map(|(j, (v, _))| Parameter::new(format!("p{j}"), v.clone()))
        .collect();
    let refs: Vec<&Parameter<T>> = params.iter().collect();
    let mut tape = Tape::new();
    let mut next = refs.iter();
    let vars: Vec<Var> = values
        .iter()
        .zip(kinds)
        .map(|(v, k)| match k {
            Kind::Input => tape.input(v.clone()),
            Kind::Param => tape.param(next.next().expect("one per param leaf")),
        })
        .collect();
    let y = build(&mut tape, &vars, &refs);
    let output = tape.value(y).to_owned();
    let r = upstream(output.shape()).mapv(T::from_f64);
    let loss = tape.dot_const(y, r);
    let grads = tape.backward(loss);
    let mut next = refs.iter();
    let grads = vars
        .iter()
        .zip(values)
        .zip(kinds)
        .map(|((&v, x), k)| match k {
            Kind::Input => grads
                .input(v)
                .cloned()
                .unwrap_or_else(|| ArrayD::zeros(x.raw_dim())),
            Kind::Param => grads.dense(next.next().expect("one per param leaf")),
        })
        .collect();
    Pass {
        output,
        loss: tape.scalar(loss),
        grads,
    }
}

/// Checks the gradient of `Σ build(leaves) ⊙ R` with respect to every leaf
/// against central differences, element by element.
///
/// `build` gets the fresh tape, one node per leaf (in order) and the
/// parameters behind the [`Kind::Param`] leaves (in order), so it may
/// register a parameter a second time. The error lists the first
/// disagreements: leaf, element, analytic and numeric derivative.
pub fn check<F>(leaves: &[Leaf], build: F) -> Result<Report, String>
where
    F: for<'p> Fn(&mut Tape<'p, f64>, &[Var], &[&'p Parameter<f64>]) -> Var,
{
    let kinds: Vec<Kind> = leaves.iter().map(|l| l.kind).collect();
    let mut values: Vec<ArrayD<f64>> = leaves
        .iter()
        .map(|l| l.value.as_standard_layout().into_owned())
        .collect();
    let analytic = evaluate(&kinds, &values, &build).grads;
    let mut report = Report {
        checked: 0,
        max_abs_grad: 0.0,
    };
    let mut failures = Vec::new();
    for i in 0..values.len() {
        let shape = values[i].shape().to_vec();
        for k in 0..values[i].len() {
            let x = values[i].as_slice().expect("standard layout")[k];
            let h = REL_STEP * x.abs().max(1.0);
            let (xp, xm) = (x + h, x - h);
            values[i].as_slice_mut().expect("standard layout")[k] = xp;
            let fp = evaluate(&kinds, &values, &build).loss;
            values[i].as_slice_mut().expect("standard layout")[k] = xm;
            let fm = evaluate(&kinds, &values, &build).loss;
            values[i].as_slice_mut().expect("standard layout")[k] = x;
            // Divide by the step actually taken, not the one asked for.
            let n = (fp - fm) / (xp - xm);
            let a = analytic[i].as_slice().expect("standard layout")[k];
            report.checked += 1;
            report.max_abs_grad = report.max_abs_grad.max(n.abs());
            if !close(a, n) && failures.len() < 8 {
                failures.push(format!(
                    "leaf {i} ({:?}, shape {shape:?}) flat element {k} (x = {x}): analytic {a}, numeric {n}",
                    kinds[i]
                ));
            }
        }
    }
    if !failures.is_empty() {
        return Err(failures.join("\n"));
    }
    Ok(report)
}

/// A proptest configuration of `cases` cases that saves failing seeds
/// in `regressions` (a path from the package root, under
/// `proptest-regressions/`), which is committed: every later run replays
/// them first. (proptest's default location needs a `lib.rs` beside the
/// test file, which integration tests do not have.)
pub fn config(cases: u32, regressions: &'static str) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct(regressions),
        )),
        ..ProptestConfig::default()
    }
}

/// An array of this shape, elements uniform in `[low, high)`.
pub fn array(shape: Vec<usize>, low: f64, high: f64) -> impl Strategy<Value = ArrayD<f64>> {
    let n: usize = shape.iter().product();
    prop::collection::vec(low..high, n)
        .prop_map(move |v| ArrayD::from_shape_vec(IxDyn(&shape), v).expect("n elements"))
}

/// A matrix of `1..=max_rows` × `1..=max_cols`, elements in `[-2, 2)`.
pub fn matrix(max_rows: usize, max_cols: usize) -> impl Strategy<Value = ArrayD<f64>> {
    (1..=max_rows, 1..=max_cols).prop_flat_map(|(n, m)| array(vec![n, m], -2.0, 2.0))
}

/// `len` ids in `0..n_rows`; with few rows, repeats are the rule.
pub fn ids(
    n_rows: usize,
    len: std::ops::RangeInclusive<usize>,
) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0..n_rows, len)
}

/// Two arrays of one shape whose elements are all finite and each within
/// `tol` (absolute) of the other's; `names` say which array is which in
/// the failure.
pub fn all_within(
    a: &ArrayD<f64>,
    b: &ArrayD<f64>,
    tol: f64,
    what: &str,
    names: (&str, &str),
) -> Result<(), TestCaseError> {
    prop_assert_eq!(a.shape(), b.shape(), "{}", what);
    for (i, (x, y)) in a.iter().zip(b.iter()).enumerate() {
        prop_assert!(
            x.is_finite() && y.is_finite() && (x - y).abs() <= tol,
            "{} element {}: {} {} {} {} (tol {})",
            what,
            i,
            names.0,
            x,
            names.1,
            y,
            tol
        );
    }
    Ok(())
}

/// The rows of a row-sparse gradient should be: the ids, sorted, unique.
pub fn sorted_unique(ids: &[usize]) -> Vec<usize> {
    let mut rows = ids.to_vec();
    rows.sort_unstable();
    rows.dedup();
    rows
}

/// [`check`] for a loss that is not built from leaves on one tape (a
/// layer that owns its parameters): `analytic` holds the hand-derived
/// gradient of `loss` for each of `values` (same shapes), and every element
/// is compared with the central difference of `loss`, with the step and
/// the tolerance of [`check`] ([`REL_STEP`], [`close`]).
pub fn check_grads<F>(
    values: &[ArrayD<f64>],
    analytic: &[ArrayD<f64>],
    loss: F,
) -> Result<Report, String>
where
    F: Fn(&[ArrayD<f64>]) -> f64,
{
    assert_eq!(values.len(), analytic.len(), "one gradient per value");
    let mut values: Vec<ArrayD<f64>> = values
        .iter()
        .map(|v| v.as_standard_layout().into_owned())
        .collect();
    let mut report = Report {
        checked: 0,
        max_abs_grad: 0.0,
    };
    let mut failures = Vec::new();
    for i in 0..values.len() {
        assert_eq!(
            values[i].shape(),
            analytic[i].shape(),
            "gradient {i} has the shape of its value"
        );
        let a_flat: Vec<f64> = analytic[i].iter().copied().collect();
        for (k, &a) in a_flat.iter().enumerate() {
            let x = values[i].as_slice().expect("standard layout")[k];
            let h = REL_STEP * x.abs().max(1.0);
            let (xp, xm) = (x + h, x - h);
            values[i].as_slice_mut().expect("standard layout")[k] = xp;
            let fp = loss(&values);
            values[i].as_slice_mut().expect("standard layout")[k] = xm;
            let fm = loss(&values);
            values[i].as_slice_mut().expect("standard layout")[k] = x;
            let n = (fp - fm) / (xp - xm);
            report.checked += 1;
            report.max_abs_grad = report.max_abs_grad.max(n.abs());
            if !close(a, n) && failures.len() < 8 {
                failures.push(format!(
                    "value {i} (shape {:?}) flat element {k} (x = {x}): analytic {a}, numeric {n}",
                    values[i].shape()
                ));
            }
        }
    }
    if !failures.is_empty() {
        return Err(failures.join("\n"));
    }
    Ok(report)
}

/// A random split head's inputs (see [`head_inputs`]).
#[derive(Clone, Debug)]
pub struct HeadInputs {
    pub sizes: Vec<usize>,
    pub hidden_size: usize,
    /// (size_k, H) each.
    pub weights: Vec<ArrayD<f64>>,
    /// (…, H)
    pub hidden: ArrayD<f64>,
    /// (…), in [0, V) or −100.
    pub labels: ArrayD<i64>,
}

impl HeadInputs {
    /// N, the number of tokens.
    pub fn n_tokens(&self) -> usize {
        self.labels.len()
    }

    /// V, the size of the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.sizes.iter().sum()
    }
}

/// One token whose logits are in the thousands: splits of 2 and 1 rows,
/// H = 1, z = [3000, 2990, −3000], label 1 (loss 10 + ln(1 + e^−10)).
pub fn head_with_logits_in_the_thousands() -> HeadInputs {
    HeadInputs {
        sizes: vec![2, 1],
        hidden_size: 1,
        weights: vec![
            ndarray::array![[3000.0], [2990.0]].into_dyn(),
            ndarray::array![[-3000.0]].into_dyn(),
        ],
        hidden: ndarray::array![[1.0]].into_dyn(),
        labels: ndarray::array![1i64].into_dyn(),
    }
}

/// Random heads: 1–3 splits of 0–12 rows (V ≥ 1), H ≤ 8, up to 24 tokens
/// in a shape of rank 0 to 2, a quarter of the labels −100, weights scaled
/// so that logits are O(1), O(10–100) or in the thousands.
pub fn head_inputs() -> impl Strategy<Value = HeadInputs> {
    (
        prop::collection::vec(0..=12usize, 1..=3),
        1..=8usize,
        prop::collection::vec(1..=6usize, 0..=2),
        prop_oneof![Just(1.0), Just(30.0), Just(1000.0)],
    )
        .prop_filter("V ≥ 1, N ≤ 24", |(s, _, shape, _)| {
            s.iter().sum::<usize>() > 0 && shape.iter().product::<usize>() <= 24
        })
        .prop_flat_map(|(sizes, h, shape, scale)| {
            let (weights, hidden, labels) = head_arrays(&sizes, h, shape, scale);
            (Just(sizes), Just(h), weights, hidden, labels)
        })
        .prop_map(|(sizes, hidden_size, weights, hidden, labels)| HeadInputs {
            sizes,
            hidden_size,
            weights,
            hidden,
            labels,
        })
}

/// The random arrays of a head of splits of these sizes and H = `h`: each
/// split's weights (size_k, H) in `[-scale, scale)`, hidden states
/// (…`shape`, H) in `[-1, 1)`, and labels of `shape`, a quarter of them
/// −100 and the others in [0, V).
#[allow(clippy::type_complexity)]
pub fn head_arrays(
    sizes: &[usize],
    h: usize,
    shape: Vec<usize>,
    scale: f64,
) -> (
    Vec<impl Strategy<Value = ArrayD<f64>> + use<>>,
    impl Strategy<Value = ArrayD<f64>> + use<>,
    impl Strategy<Value = ArrayD<i64>> + use<>,
) {
    let v = sizes.iter().sum::<usize>();
    let n: usize = shape.iter().product();
    let weights: Vec<_> = sizes
        .iter()
        .map(|&s| array(vec![s, h], -1.0, 1.0).prop_map(move |w| w * scale))
        .collect();
    let mut hshape = shape.clone();
    hshape.push(h);
    let label = prop_oneof![1 => Just(-100i64), 3 => 0..v as i64];
    let labels = prop::collection::vec(label, n)
        .prop_map(move |l| ArrayD::from_shape_vec(IxDyn(&shape), l).unwrap());
    (weights, array(hshape, -1.0, 1.0), labels)
}

/// The trainable ones of `weights`, in order (what [`with_trainable`]
/// puts back).
pub fn trainable_values(weights: &[ArrayD<f64>], trainable: &[bool]) -> Vec<ArrayD<f64>> {
    weights
        .iter()
        .zip(trainable)
        .filter(|&(_, &tr)| tr)
        .map(|(w, _)| w.clone())
        .collect()
}

/// The gradients of the trainable ones of `values`, dense (zeros for one
/// that got none), in the order of [`trainable_values`].
pub fn trainable_grads(
    grads: &[Option<ParamGrad<f64>>],
    values: &[ArrayD<f64>],
    trainable: &[bool],
) -> Vec<ArrayD<f64>> {
    grads
        .iter()
        .zip(values)
        .zip(trainable)
        .filter(|&(_, &tr)| tr)
        .map(|((g, v), _)| {
            g.as_ref()
                .map_or_else(|| ArrayD::zeros(v.raw_dim()), ParamGrad::to_dense)
        })
        .collect()
}

/// A head with splits `s0, s1, …` of these sizes, the weights given (as
/// `T`), each split trainable or frozen as given.
pub fn split_head<T: Real>(
    sizes: &[usize],
    hidden_size: usize,
    weights: &[ArrayD<f64>],
    trainable: &[bool],
) -> splitgrad::layers::SplitLanguageModellingHead<T> {
    let names: Vec<String> = (0..sizes.len()).map(|k| format!("s{k}")).collect();
    let named: Vec<(&str, usize)> = names
        .iter()
        .map(String::as_str)
        .zip(sizes.iter().copied())
        .collect();
    let mut head =
        splitgrad::layers::SplitLanguageModellingHead::new(&named, &names, hidden_size).unwrap();
    for ((p, w), &tr) in head.parameters_mut().iter_mut().zip(weights).zip(trainable) {
        *p.value_mut() = w.mapv(T::from_f64);
        p.set_trainable(tr);
    }
    head
}

/// `weights` with the trainable ones replaced, in order, by the first
/// `values`; and the values left after them.
pub fn with_trainable<'v>(
    weights: &[ArrayD<f64>],
    trainable: &[bool],
    values: &'v [ArrayD<f64>],
) -> (Vec<ArrayD<f64>>, &'v [ArrayD<f64>]) {
    let mut used = 0;
    let replaced = weights
        .iter()
        .zip(trainable)
        .map(|(w, &tr)| {
            if tr {
                used += 1;
                values[used - 1].clone()
            } else {
                w.clone()
            }
        })
        .collect();
    (replaced, &values[used..])
}
