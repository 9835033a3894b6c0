//! One harness for every update kernel: the parallel [`Optimizer::update`]
//! of [`Adam`] and [`LazyAdam`], on dense and row-sparse gradients, under
//! 1, 2 and 4 threads, against the serial `update_naive`, bit for bit.

use ndarray::{Array2, ArrayD, IxDyn};

use super::{Adam, AdamConfig, LazyAdam, LazyAdamConfig, Optimizer, StateValue};
use crate::Real;
use crate::param::{RowForm, RowGradient, SparseRowGradient};
use crate::{ParamGrad, Parameter, RowSparse};

/// Which path to run: the naive reference, or the parallel update in a
/// pool of this many threads.
#[derive(Clone, Copy, Debug)]
enum Path {
    Naive,
    Threads(usize),
}

type Outcome = (ArrayD<u32>, Vec<(String, StateValue<f32>)>);

/// A `(n, w)` table (n·w above the parallel threshold; w does not divide
/// the chunk size) and gradients: every third row, no row, and dense.
fn case(n: usize, w: usize) -> (ArrayD<f32>, Vec<ParamGrad<f32>>) {
    let init = ArrayD::from_shape_fn(IxDyn(&[n, w]), |i| {
        ((i[0] * 31 + i[1] * 17) % 101) as f32 * 0.01 - 0.5
    });
    let rows: Vec<usize> = (0..n).filter(|r| r % 3 == 1).collect();
    let values = Array2::from_shape_fn((rows.len(), w), |(i, j)| {
        ((i * 13 + j * 7) % 29) as f32 * 0.1 - 1.4
    });
    let third = ParamGrad::RowSparse(RowSparse {
        n_rows: n,
        rows,
        values,
    });
    let none = ParamGrad::RowSparse(RowSparse {
        n_rows: n,
        rows: vec![],
        values: Array2::zeros((0, w)),
    });
    let dense = ParamGrad::Dense(third.to_dense().mapv(|g| g * 0.5 + 0.25));
    (init, vec![third, none, dense])
}

/// Runs every gradient of the case, in order, twice.
fn run<F>(path: Path, init: &ArrayD<f32>, grads: &[ParamGrad<f32>], mut step: F) -> ArrayD<u32>
where
    F: FnMut(bool, &mut Parameter<f32>, &ParamGrad<f32>) + Send,
{
    let mut p = Parameter::new("t", init.clone());
    let mut all = || {
        for g in grads.iter().chain(grads) {
            step(matches!(path, Path::Naive), &mut p, g);
        }
    };
    match path {
        Path::Naive => all(),
        Path::Threads(n) => {
            let pool = crate::kernels::threads(n);
            pool.install(all);
        }
    }
    p.value().mapv(f32::to_bits)
}

/// The update of an optimiser's naive reference.
type NaiveUpdate<O> = fn(&mut O, &mut Parameter<f32>, &ParamGrad<f32>) -> crate::Result<()>;

/// The parameter and state after [`run`] with `opt`: its `update_naive`
/// on the naive path, its `update` otherwise.
fn outcome<O: Optimizer<f32> + Send>(
    path: Path,
    (mut opt, update_naive): (O, NaiveUpdate<O>),
    init: &ArrayD<f32>,
    grads: &[ParamGrad<f32>],
) -> Outcome {
    let p = run(path, init, grads, |naive, p, g| {
        if naive {
            update_naive(&mut opt, p, g).unwrap()
        } else {
            opt.update(p, g).unwrap()
        }
    });
    (p, opt.state())
}

fn adam(path: Path, config: AdamConfig, init: &ArrayD<f32>, grads: &[ParamGrad<f32>]) -> Outcome {
    let opt = Adam::new(config).unwrap();
    outcome(path, (opt, Adam::update_naive), init, grads)
}

fn lazy(path: Path, init: &ArrayD<f32>, grads: &[ParamGrad<f32>]) -> Outcome {
    let opt = LazyAdam::new(LazyAdamConfig::default()).unwrap();
    outcome(path, (opt, LazyAdam::update_naive), init, grads)
}

#[test]
fn every_kernel_equals_the_naive_one_for_any_thread_count() {
    let configs = [
        AdamConfig::default(),
        AdamConfig {
            weight_decay: 0.01,
            ..AdamConfig::default()
        },
        AdamConfig::adamw(),
    ];
    for (n, w) in [(4099, 37), (7, 5)] {
        let (init, grads) = case(n, w);
        for g in 0..grads.len() {
            let grads = &grads[g..=g];
            for config in configs {
                let naive = adam(Path::Naive, config, &init, grads);
                for t in [1, 2, 4] {
                    let fast = adam(Path::Threads(t), config, &init, grads);
                    assert!(
                        fast == naive,
                        "Adam {config:?}, ({n}, {w}), gradient {g}, {t} threads"
                    );
                }
            }
            let naive = lazy(Path::Naive, &init, grads);
            for t in [1, 2, 4] {
                assert!(
                    lazy(Path::Threads(t), &init, grads) == naive,
                    "LazyAdam ({n}, {w}), gradient {g}, {t} threads"
                );
            }
        }
    }
}

#[test]
fn a_transposed_parameter_is_updated_like_its_standard_copy() {
    let (init, grads) = case(64, 3);
    // The same values, stored column-major.
    let column_major = init.t().as_standard_layout().t().to_owned();
    assert!(!column_major.is_standard_layout() && column_major == init);
    let config = AdamConfig::default();
    let mut naive = (
        Parameter::new("t", init.clone()),
        Adam::new(config).unwrap(),
    );
    let mut fast = (
        Parameter::new("t", column_major),
        Adam::new(config).unwrap(),
    );
    for g in &grads {
        naive.1.update_naive(&mut naive.0, g).unwrap();
        fast.1.update(&mut fast.0, g).unwrap();
    }
    assert_eq!(
        naive.0.value().mapv(f32::to_bits),
        fast.0.value().mapv(f32::to_bits)
    );
}

/// `update_by_rows`: LazyAdam's override (rows in parallel, each gradient
/// row computed as it is used) against the naive update of the
/// materialised dense gradient, under 1, 2 and 4 threads; the gradient
/// reads the row it is given (as the fusion penalty's does). Adam takes
/// the trait's default.
#[test]
fn update_by_rows_equals_the_update_of_the_dense_gradient() {
    let grad_row = |r: usize, x: &[f32], g: &mut [f32]| {
        for (j, (g, &x)) in g.iter_mut().zip(x).enumerate() {
            *g = if r % 5 == 2 {
                0.0
            } else {
                x * 0.5 - ((r * 7 + j) % 11) as f32 * 0.1
            };
        }
    };
    for (n, w) in [(4099, 37), (7, 5)] {
        let (init, _) = case(n, w);
        // The reference: the dense gradient of the current rows, updated naively.
        let mut want = (
            Parameter::new("t", init.clone()),
            LazyAdam::new(LazyAdamConfig::default()).unwrap(),
        );
        for _ in 0..3 {
            let g = super::grads::dense_by_rows(&want.0, &grad_row).unwrap();
            want.1
                .update_naive(&mut want.0, &ParamGrad::Dense(g))
                .unwrap();
        }
        for t in [1, 2, 4] {
            let pool = crate::kernels::threads(t);
            let mut p = Parameter::new("t", init.clone());
            let mut opt = LazyAdam::new(LazyAdamConfig::default()).unwrap();
            pool.install(|| {
                for _ in 0..3 {
                    opt.update_by_rows(&mut p, &grad_row).unwrap();
                }
            });
            assert_eq!(
                p.value().mapv(f32::to_bits),
                want.0.value().mapv(f32::to_bits),
                "({n}, {w}), {t} threads"
            );
            assert!(
                opt.state() == want.1.state(),
                "({n}, {w}), {t} threads: state"
            );
        }
        // Adam's default builds the dense gradient: the same as update.
        let (mut a, mut b) = (
            Parameter::new("t", init.clone()),
            Parameter::new("t", init.clone()),
        );
        let (mut oa, mut ob) = (
            Adam::new(AdamConfig::default()).unwrap(),
            Adam::new(AdamConfig::default()).unwrap(),
        );
        oa.update_by_rows(&mut a, &grad_row).unwrap();
        let g = super::grads::dense_by_rows(&b, &grad_row).unwrap();
        ob.update(&mut b, &ParamGrad::Dense(g)).unwrap();
        assert_eq!(a.value(), b.value());
    }
    // A frozen parameter does not move; a 1-D one is refused.
    let mut frozen = Parameter::new("t", case(7, 5).0);
    frozen.set_trainable(false);
    let before = frozen.value().clone();
    LazyAdam::new(LazyAdamConfig::default())
        .unwrap()
        .update_by_rows(&mut frozen, &grad_row)
        .unwrap();
    assert_eq!(frozen.value(), &before);
    let mut flat = Parameter::new("b", ArrayD::<f32>::zeros(IxDyn(&[4])));
    let err = LazyAdam::new(LazyAdamConfig::default())
        .unwrap()
        .update_by_rows(&mut flat, &grad_row)
        .unwrap_err();
    assert!(err.to_string().contains("2-D"), "{err}");
}

/// The written rows' gradient of these tests: `x/4 − ((3r + j) mod 7)/100`
/// for element j of row r.
fn written<T: Real>(r: usize, x: &[T], g: &mut [T]) {
    for (j, (g, &x)) in g.iter_mut().zip(x).enumerate() {
        let at = T::from_f64(((r * 3 + j) % 7) as f64 * 0.01);
        *g = x * T::from_f64(0.25) - at;
    }
}

/// `update_by_rows` with the parameter, or its moments, kept in half
/// precision: each row widened, its gradient computed and the row updated
/// as it is reached; the same bits as the naive update of the dense
/// gradient, under 1, 2 and 4 threads, with stochastic and nearest
/// rounding, in bf16 and f16 (and in f32).
/// Every fourth row zero, a quarter of rows written, the rest of the
/// fusion penalty's form (two factors, five pairs of terms; k = 0 too).
struct Formed<T> {
    terms: Vec<(Vec<T>, Vec<T>)>,
}

impl<T: Real> Formed<T> {
    fn new(w: usize) -> Self {
        let v = |x: usize, scale: f64, at: f64| T::from_f64(x as f64 * scale - at);
        let terms = (0..5)
            .map(|t| {
                let c = (0..w).map(|j| v((t * 7 + j) % 13, 0.03, 0.2));
                let s = (0..w).map(|j| v((t * 5 + j * 3) % 11, 0.02, 0.1));
                (c.collect(), s.collect())
            })
            .collect();
        Formed { terms }
    }
}

impl<T: Real> RowGradient<T> for Formed<T> {
    fn write(&self, r: usize, x: &[T], g: &mut [T]) {
        match self.form(r) {
            RowForm::Zero => g.fill(T::zero()),
            RowForm::Deviation { k, c, s } => {
                for (j, (g, &x)) in g.iter_mut().zip(x).enumerate() {
                    *g = k * (x - c[j]) - s[j];
                }
            }
            RowForm::Written => written(r, x, g),
        }
    }

    fn form(&self, r: usize) -> RowForm<'_, T> {
        let (c, s) = &self.terms[r % 5];
        match r % 4 {
            0 => RowForm::Zero,
            1 => RowForm::Deviation { k: T::zero(), c, s },
            2 => RowForm::Written,
            _ => RowForm::Deviation {
                k: T::from_f64(0.75),
                c,
                s,
            },
        }
    }
}

/// `update_by_rows` in `f64` (whose half-precision updates widen through
/// buffers, with no fused kernel) on a bf16 parameter and moments, rows of
/// every form: the naive update of the dense gradient, under 1 and 2
/// threads.
#[test]
fn update_by_rows_of_formed_rows_in_f64_equals_the_update_of_the_dense_gradient() {
    use crate::param::{Dtype, Rounding};
    let (n, w) = (300, 37);
    let init = ArrayD::from_shape_fn(IxDyn(&[n, w]), |i| {
        ((i[0] * 31 + i[1] * 17) % 101) as f64 * 0.01 - 0.5
    });
    let formed = Formed::<f64>::new(w);
    let fresh = || {
        let mut p = Parameter::new("t", init.clone());
        p.set_dtype(Dtype::BF16).unwrap();
        let mut o = LazyAdam::<f64>::new(LazyAdamConfig::default()).unwrap();
        o.set_state_dtype(Dtype::BF16).unwrap();
        o.set_rounding(Rounding::Stochastic { seed: 3 });
        (p, o)
    };
    let mut want = fresh();
    for _ in 0..3 {
        let g = super::grads::dense_by_rows(&want.0, &formed).unwrap();
        want.1
            .update_naive(&mut want.0, &ParamGrad::Dense(g))
            .unwrap();
    }
    for t in [1, 2] {
        let pool = crate::kernels::threads(t);
        let mut got = fresh();
        pool.install(|| {
            for _ in 0..3 {
                got.1.update_by_rows(&mut got.0, &formed).unwrap();
            }
        });
        assert_eq!(
            got.0.widened().mapv(f64::to_bits),
            want.0.widened().mapv(f64::to_bits),
            "{t} threads"
        );
        assert!(got.1.state() == want.1.state(), "{t} threads: state");
    }
}

#[test]
fn update_by_rows_in_half_precision_equals_the_update_of_the_dense_gradient() {
    use crate::param::{Dtype, Rounding};
    let written = written::<f32>;
    let layouts = [
        (Dtype::BF16, Dtype::BF16),
        (Dtype::BF16, Dtype::F32),
        (Dtype::F16, Dtype::F32),
        (Dtype::F16, Dtype::BF16),
        (Dtype::F32, Dtype::BF16),
        // And all in f32, whose path writes every row, forms too.
        (Dtype::F32, Dtype::F32),
    ];
    for (n, w) in [(4099, 37), (7, 5), (300, 64)] {
        let (init, _) = case(n, w);
        let formed = Formed::<f32>::new(w);
        // Every row written, or rows of each form.
        let grads: [&dyn RowGradient<f32>; 2] = [&written, &formed];
        for ((dtype, state), grad) in layouts
            .into_iter()
            .flat_map(|l| grads.iter().map(move |&g| (l, g)))
        {
            for rounding in [Rounding::Stochastic { seed: 3 }, Rounding::Nearest] {
                let fresh = || {
                    let mut p = Parameter::new("t", init.clone());
                    p.set_dtype(dtype).unwrap();
                    let mut o = LazyAdam::new(LazyAdamConfig::default()).unwrap();
                    o.set_state_dtype(state).unwrap();
                    o.set_rounding(rounding);
                    (p, o)
                };
                let mut want = fresh();
                for _ in 0..3 {
                    let g = super::grads::dense_by_rows(&want.0, grad).unwrap();
                    want.1
                        .update_naive(&mut want.0, &ParamGrad::Dense(g))
                        .unwrap();
                }
                for t in [1, 2, 4] {
                    let pool = crate::kernels::threads(t);
                    let mut got = fresh();
                    pool.install(|| {
                        for _ in 0..3 {
                            got.1.update_by_rows(&mut got.0, grad).unwrap();
                        }
                    });
                    let what = format!("({n}, {w}) {dtype} {state} {rounding:?}, {t} threads");
                    assert_eq!(
                        got.0.widened().mapv(f32::to_bits),
                        want.0.widened().mapv(f32::to_bits),
                        "{what}"
                    );
                    assert!(got.1.state() == want.1.state(), "{what}: state");
                }
            }
        }
    }
}

/// A stored row-sparse gradient given row by row, each row copied out on
/// demand (and counted, to see every row asked for once).
struct ByRows<'a> {
    s: &'a RowSparse<f32>,
    asked: std::sync::atomic::AtomicUsize,
}

impl SparseRowGradient<f32> for ByRows<'_> {
    fn n_rows(&self) -> usize {
        self.s.n_rows
    }
    fn rows(&self) -> &[usize] {
        &self.s.rows
    }
    fn write_cols(&self, j: usize, cols: std::ops::Range<usize>, g: &mut [f32]) {
        self.asked
            .fetch_add(cols.len(), std::sync::atomic::Ordering::Relaxed);
        g.iter_mut()
            .zip(self.s.values.row(j).iter().skip(cols.start))
            .for_each(|(g, &v)| *g = v);
    }

    /// Every fifth row far heavier than the others: an optimiser cuts it
    /// into runs of columns where the rows are wide enough.
    fn weight(&self, j: usize) -> usize {
        if j.is_multiple_of(5) { 60 } else { 1 }
    }
}

/// `update_sparse_by_rows` equals `update` of the stored row-sparse
/// gradient, bit for bit, every element asked for once: lazy Adam (its own
/// path, its heavy rows cut into runs of columns where they are wide) in
/// every layout of parameter and state, stochastic and nearest rounding,
/// 1, 2 and 4 threads, and the default of Adam and SGD; a frozen parameter
/// is left alone and gets no state.
#[test]
fn update_sparse_by_rows_equals_the_update_of_the_stored_gradient() {
    use crate::optim::{Sgd, SgdConfig};
    use crate::param::{Dtype, Rounding};
    let layouts = [
        (Dtype::F32, Dtype::F32),
        (Dtype::BF16, Dtype::BF16),
        (Dtype::BF16, Dtype::F32),
        (Dtype::F16, Dtype::F32),
        (Dtype::F32, Dtype::BF16),
    ];
    type Make = fn(Dtype, Rounding) -> Box<dyn Optimizer<f32> + Send>;
    let lazy: Make = |state, rounding| {
        let mut o = LazyAdam::new(LazyAdamConfig::default()).unwrap();
        o.set_state_dtype(state).unwrap();
        o.set_rounding(rounding);
        Box::new(o)
    };
    let adam: Make = |state, rounding| {
        let mut o = Adam::new(AdamConfig::default()).unwrap();
        o.set_state_dtype(state).unwrap();
        o.set_rounding(rounding);
        Box::new(o)
    };
    let sgd: Make = |_, _| Box::new(Sgd::new(SgdConfig::default()).unwrap());
    for (n, w) in [(4099, 37), (7, 5), (300, 64), (40, 1100)] {
        let (init, grads) = case(n, w);
        let sparse: Vec<&RowSparse<f32>> = grads
            .iter()
            .filter_map(|g| match g {
                ParamGrad::RowSparse(s) => Some(s),
                ParamGrad::Dense(_) => None,
            })
            .collect();
        for ((dtype, state), rounding, (kind, make)) in layouts.into_iter().flat_map(|l| {
            [Rounding::Stochastic { seed: 3 }, Rounding::Nearest]
                .into_iter()
                .flat_map(move |r| {
                    [("lazy", lazy), ("adam", adam), ("sgd", sgd)].map(move |k| (l, r, k))
                })
        }) {
            if kind == "sgd" && dtype != Dtype::F32 {
                continue; // SGD refuses half-precision parameters
            }
            let fresh = || {
                let mut p = Parameter::new("t", init.clone());
                p.set_dtype(dtype).unwrap();
                (p, make(state, rounding))
            };
            for s in &sparse {
                let mut want = fresh();
                for _ in 0..3 {
                    want.1
                        .update(&mut want.0, &ParamGrad::RowSparse((*s).clone()))
                        .unwrap();
                }
                for t in [1, 2, 4] {
                    let pool = crate::kernels::threads(t);
                    let mut got = fresh();
                    let by = ByRows {
                        s,
                        asked: Default::default(),
                    };
                    pool.install(|| {
                        for _ in 0..3 {
                            got.1.update_sparse_by_rows(&mut got.0, &by).unwrap();
                        }
                    });
                    let what = format!(
                        "{kind} ({n}, {w}) {} rows, {dtype} {state} {rounding:?}, {t} threads",
                        s.rows.len()
                    );
                    assert_eq!(
                        got.0.widened().mapv(f32::to_bits),
                        want.0.widened().mapv(f32::to_bits),
                        "{what}"
                    );
                    assert!(got.1.state() == want.1.state(), "{what}: state");
                    let asked = by.asked.into_inner();
                    assert_eq!(asked, 3 * s.rows.len() * w, "{what}: elements asked for");
                }
            }
        }
    }
    // Frozen: no update, no state, no row asked for.
    let (init, grads) = case(7, 5);
    let ParamGrad::RowSparse(s) = &grads[0] else {
        panic!("the first case is row-sparse")
    };
    let mut p = Parameter::new("t", init.clone());
    p.set_trainable(false);
    let by = ByRows {
        s,
        asked: Default::default(),
    };
    let mut o = LazyAdam::new(LazyAdamConfig::default()).unwrap();
    o.update_sparse_by_rows(&mut p, &by).unwrap();
    assert_eq!(p.value(), &init);
    assert!(o.state().is_empty());
    assert_eq!(by.asked.into_inner(), 0);
}

/// A gradient by rows for another shape, or reaching a row out of range,
/// is an error before any state is made; rows out of order panic.
#[test]
fn update_sparse_by_rows_checks_the_gradient() {
    struct Rows(usize, Vec<usize>);
    impl SparseRowGradient<f32> for Rows {
        fn n_rows(&self) -> usize {
            self.0
        }
        fn rows(&self) -> &[usize] {
            &self.1
        }
        fn write_cols(&self, _: usize, _: std::ops::Range<usize>, g: &mut [f32]) {
            g.fill(1.0);
        }
    }
    let opt = || LazyAdam::new(LazyAdamConfig::default()).unwrap();
    let table = || Parameter::new("t", ArrayD::<f32>::zeros(IxDyn(&[4, 3])));
    for (bad, says) in [
        (Rows(5, vec![0]), "row-sparse gradient"),
        (Rows(4, vec![1, 4]), "out of range"),
    ] {
        let mut o = opt();
        let err = o.update_sparse_by_rows(&mut table(), &bad).unwrap_err();
        assert!(err.to_string().contains(says), "{err}");
        assert!(o.state().is_empty());
    }
    let mut flat = Parameter::new("b", ArrayD::<f32>::zeros(IxDyn(&[4])));
    let err = opt()
        .update_sparse_by_rows(&mut flat, &Rows(4, vec![0]))
        .unwrap_err();
    assert!(err.to_string().contains("2-D"), "{err}");
    let unsorted = std::panic::catch_unwind(|| {
        opt().update_sparse_by_rows(&mut table(), &Rows(4, vec![2, 1]))
    });
    assert!(unsorted.is_err());
}

/// The runs of `pieces` cover every column of every row once, in order,
/// each starting on a multiple of 32; rows of equal weight stay whole, and
/// so do rows too narrow to cut; a heavy row is cut where it is wide.
#[test]
fn runs_cover_each_row_once_and_cut_only_heavy_wide_rows() {
    use super::moments::{SparseRows, pieces};
    struct W(Vec<usize>);
    impl SparseRows<f32> for W {
        fn cols<'b>(
            &'b self,
            _: usize,
            _: std::ops::Range<usize>,
            b: &'b mut Vec<f32>,
        ) -> &'b [f32] {
            b
        }
        fn weight(&self, j: usize) -> usize {
            self.0[j]
        }
    }
    let pool = crate::kernels::threads(2);
    pool.install(|| {
        for (weights, width, cut) in [
            (vec![5, 5, 5], 2048, false),
            (vec![1, 400, 1, 1], 300, false),
            (vec![1, 400, 1, 1], 2048, true),
            (vec![0], 1000, false),
        ] {
            let n = weights.len();
            let (runs, split) = pieces(n, width, &W(weights.clone()));
            assert_eq!(split, cut, "{weights:?} {width}");
            for j in 0..n {
                let mine: Vec<_> = runs
                    .iter()
                    .filter(|r| r.0 == j)
                    .map(|r| r.1.clone())
                    .collect();
                assert_eq!(mine.first().unwrap().start, 0);
                assert_eq!(mine.last().unwrap().end, width);
                assert!(
                    mine.windows(2)
                        .all(|w| w[0].end == w[1].start && w[1].start % 32 == 0)
                );
            }
            assert!(runs.windows(2).all(|w| w[0].0 <= w[1].0), "rows in order");
        }
    });
}

mod rounding_rows;
