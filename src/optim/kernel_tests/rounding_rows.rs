//! Rounding rows (`Parameter::set_rounding_rows`): a table split into
//! parts, each keyed by its rows' places in the whole, updates as the whole
//! table does, bit for bit, in every half-precision update path.

use ndarray::{Array2, ArrayD, IxDyn};

use super::{ByRows, Formed, case, written};
use crate::kernels::threads;
use crate::optim::{Adam, AdamConfig, LazyAdam, LazyAdamConfig, Optimizer, StateValue};
use crate::param::{RowForm, RowGradient};
use crate::{ParamGrad, Parameter, RowSparse};

/// A row gradient of a table's rows `rows`, each row the table's
/// (`whole`'s) row at its place.
struct RowsOf<'a, G>(&'a G, &'a [usize]);

impl<G: RowGradient<f32>> RowGradient<f32> for RowsOf<'_, G> {
    fn write(&self, r: usize, x: &[f32], g: &mut [f32]) {
        self.0.write(self.1[r], x, g)
    }
    fn form(&self, r: usize) -> RowForm<'_, f32> {
        self.0.form(self.1[r])
    }
}

/// A gradient of a table restricted to its rows `rows` (in that order).
fn grad_of_rows(g: &ParamGrad<f32>, rows: &[usize]) -> ParamGrad<f32> {
    match g {
        ParamGrad::Dense(d) => ParamGrad::Dense(d.select(ndarray::Axis(0), rows)),
        ParamGrad::RowSparse(s) => {
            let (mut local, mut values) = (vec![], vec![]);
            for (i, &r) in rows.iter().enumerate() {
                if let Ok(k) = s.rows.binary_search(&r) {
                    local.push(i);
                    values.push(s.values.row(k).to_owned());
                }
            }
            let w = s.values.ncols();
            let flat: Vec<f32> = values.iter().flatten().copied().collect();
            ParamGrad::RowSparse(RowSparse {
                n_rows: rows.len(),
                rows: local,
                values: Array2::from_shape_vec((values.len(), w), flat).unwrap(),
            })
        }
    }
}

/// Each moment of `o`'s state, widened, by name.
fn moments_of(o: &dyn Optimizer<f32>) -> Vec<(String, ArrayD<f32>)> {
    o.state()
        .into_iter()
        .filter_map(|(name, v)| match v {
            StateValue::Array(a) => Some((name, a)),
            StateValue::Half(h) => Some((name, h.widened().into_owned())),
            StateValue::Step(_) => None,
        })
        .collect()
}

/// Adam or lazy Adam, with its naive update.
enum Opt {
    Adam(Adam<f32>),
    Lazy(LazyAdam<f32>),
}

impl Opt {
    fn dy(&mut self) -> &mut dyn Optimizer<f32> {
        match self {
            Opt::Adam(o) => o,
            Opt::Lazy(o) => o,
        }
    }
    fn naive(&mut self, p: &mut Parameter<f32>, g: &ParamGrad<f32>) {
        match self {
            Opt::Adam(o) => o.update_naive(p, g).unwrap(),
            Opt::Lazy(o) => o.update_naive(p, g).unwrap(),
        }
    }
}

/// A table split into strided parts (rows r, r + 2, …, as the sharded
/// layers split one over two processes), each part a parameter of the table's name whose
/// roundings are keyed by its rows' places in the table
/// (`Parameter::set_rounding_rows`), takes the table's updates bit for
/// bit, moments included: Adam on dense gradients (a matrix and a vector)
/// and lazy Adam on row-sparse ones, by rows (written and formed) and
/// sparse by rows; the fast and the naive paths; bf16 and f16 rows, bf16
/// and f32 moments; 1 and 2 threads. Without the rows the parts draw other
/// bits.
#[test]
fn parts_keyed_by_their_rows_update_as_the_whole_table() {
    use crate::param::{Dtype, Rounding};
    type Step<'a> = &'a (dyn Fn(&mut Opt, &mut Parameter<f32>, Option<&[usize]>) + Sync);
    let (n, w) = (4099, 37);
    let (init, grads) = case(n, w);
    let vector = init.index_axis(ndarray::Axis(1), 0).to_owned();
    let vector_grad = ParamGrad::Dense(vector.mapv(|x| x * 0.3 - 0.01));
    let formed = Formed::<f32>::new(w);
    let written = written::<f32>;
    let of = |g: &ParamGrad<f32>, rows: Option<&[usize]>| match rows {
        Some(rows) => grad_of_rows(g, rows),
        None => g.clone(),
    };
    let all: Vec<usize> = (0..n).collect();
    let dense: Step<'_> = &|o, p, rows| o.dy().update(p, &of(&grads[2], rows)).unwrap();
    let naive: Step<'_> = &|o, p, rows| o.naive(p, &of(&grads[0], rows));
    let sparse: Step<'_> = &|o, p, rows| o.dy().update(p, &of(&grads[0], rows)).unwrap();
    let by_rows: Step<'_> = &|o, p, rows| {
        let rows = rows.unwrap_or(&all);
        o.dy().update_by_rows(p, &RowsOf(&written, rows)).unwrap();
        o.dy().update_by_rows(p, &RowsOf(&formed, rows)).unwrap();
    };
    let sparse_by_rows: Step<'_> = &|o, p, rows| {
        let ParamGrad::RowSparse(s) = of(&grads[0], rows) else {
            unreachable!()
        };
        let by = ByRows {
            s: &s,
            asked: Default::default(),
        };
        o.dy().update_sparse_by_rows(p, &by).unwrap();
    };
    let vector_step: Step<'_> = &|o, p, rows| o.dy().update(p, &of(&vector_grad, rows)).unwrap();
    let adam = || Opt::Adam(Adam::new(AdamConfig::default()).unwrap());
    let lazy = || Opt::Lazy(LazyAdam::new(LazyAdamConfig::default()).unwrap());
    type Make = fn() -> Opt;
    let cases: [(&str, Make, Step<'_>, &ArrayD<f32>); 6] = [
        ("adam dense", adam, dense, &init),
        ("adam vector", adam, vector_step, &vector.into_dyn()),
        ("lazy naive", lazy, naive, &init),
        ("lazy sparse", lazy, sparse, &init),
        ("lazy by rows", lazy, by_rows, &init),
        ("lazy sparse by rows", lazy, sparse_by_rows, &init),
    ];
    let layouts = [
        (Dtype::BF16, Dtype::BF16),
        (Dtype::F16, Dtype::F32),
        (Dtype::F32, Dtype::BF16),
    ];
    // (Every part holds rows of the row-sparse gradient, rows 1, 4, 7, ….)
    let parts: Vec<Vec<usize>> = (0..2).map(|r| (r..n).step_by(2).collect()).collect();
    for (what, make, step, init) in cases {
        for (dtype, state) in layouts {
            let fresh = |value: ArrayD<f32>, rows: Option<&[usize]>| {
                let mut p = Parameter::new("t", value);
                p.set_dtype(dtype).unwrap();
                if let Some(rows) = rows {
                    p.set_rounding_rows(Some(rows.iter().map(|&r| r as u64).collect()))
                        .unwrap();
                }
                let mut o = make();
                o.dy().set_state_dtype(state).unwrap();
                o.dy().set_rounding(Rounding::Stochastic { seed: 9 });
                (p, o)
            };
            let (mut whole, mut ow) = fresh(init.clone(), None);
            for _ in 0..2 {
                step(&mut ow, &mut whole, None);
            }
            let want = whole.widened().mapv(f32::to_bits);
            let want_moments = moments_of(ow.dy());
            for t in [1, 2] {
                for (keyed, part) in [true, false]
                    .into_iter()
                    .flat_map(|k| parts.iter().map(move |p| (k, p)))
                {
                    let value = init.select(ndarray::Axis(0), part);
                    let (mut p, mut o) = fresh(value, keyed.then_some(&part[..]));
                    threads(t).install(|| {
                        for _ in 0..2 {
                            step(&mut o, &mut p, Some(part));
                        }
                    });
                    let got = p.widened().mapv(f32::to_bits);
                    let rows_of = |a: &ArrayD<u32>| a.select(ndarray::Axis(0), part);
                    let label = format!("{what}, {dtype} {state}, {t} threads, rows {}..", part[0]);
                    if !keyed {
                        // Keyed by their own places, the parts round otherwise.
                        if dtype != Dtype::F32 {
                            assert_ne!(got, rows_of(&want), "{label}: unkeyed");
                        }
                        continue;
                    }
                    assert_eq!(got, rows_of(&want), "{label}");
                    for ((name, m), (_, wm)) in moments_of(o.dy()).iter().zip(&want_moments) {
                        let bits = |a: &ArrayD<f32>| a.mapv(f32::to_bits);
                        assert_eq!(bits(m), rows_of(&bits(wm)), "{label}: {name}");
                    }
                }
            }
        }
    }
}

/// The same in `f64` (whose half-precision updates widen through buffers,
/// and whose narrowing goes through `f32`): parts keyed by their rows equal
/// the whole table, a matrix by rows and a vector dense, bf16 rows and
/// moments.
#[test]
fn parts_keyed_by_their_rows_update_as_the_whole_table_in_f64() {
    use crate::param::{Dtype, Rounding};
    let (n, w) = (301, 9);
    let matrix = ArrayD::from_shape_fn(IxDyn(&[n, w]), |i| {
        ((i[0] * 31 + i[1] * 17) % 101) as f64 * 0.01 - 0.5
    });
    let vector = matrix.index_axis(ndarray::Axis(1), 0).to_owned().into_dyn();
    let written = written::<f64>;
    let parts: Vec<Vec<usize>> = (0..2).map(|r| (r..n).step_by(2).collect()).collect();
    for init in [&matrix, &vector] {
        let fresh = |value: ArrayD<f64>, rows: Option<&[usize]>| {
            let mut p = Parameter::new("t", value);
            p.set_dtype(Dtype::BF16).unwrap();
            if let Some(rows) = rows {
                p.set_rounding_rows(Some(rows.iter().map(|&r| r as u64).collect()))
                    .unwrap();
            }
            let mut o = LazyAdam::<f64>::new(LazyAdamConfig::default()).unwrap();
            o.set_state_dtype(Dtype::BF16).unwrap();
            o.set_rounding(Rounding::Stochastic { seed: 2 });
            (p, o)
        };
        let step = |o: &mut LazyAdam<f64>, p: &mut Parameter<f64>, rows: &[usize]| {
            if p.shape().len() == 2 {
                let of_rows = |r: usize, x: &[f64], g: &mut [f64]| written(rows[r], x, g);
                o.update_by_rows(p, &of_rows).unwrap();
            } else {
                let g =
                    ArrayD::from_shape_fn(IxDyn(&[rows.len()]), |i| rows[i[0]] as f64 * 0.01 - 1.0);
                o.update(p, &ParamGrad::Dense(g)).unwrap();
            }
        };
        let all: Vec<usize> = (0..n).collect();
        let (mut whole, mut ow) = fresh(init.clone(), None);
        for _ in 0..2 {
            step(&mut ow, &mut whole, &all);
        }
        for part in &parts {
            let (mut p, mut o) = fresh(init.select(ndarray::Axis(0), part), Some(part));
            for _ in 0..2 {
                step(&mut o, &mut p, part);
            }
            let want = whole.widened().select(ndarray::Axis(0), part);
            assert_eq!(
                p.widened().mapv(f64::to_bits),
                want.mapv(f64::to_bits),
                "{:?}",
                init.shape()
            );
        }
    }
}
