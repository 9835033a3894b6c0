//! The optimisers against PyTorch's formulas computed by hand, and their
//! invariants: laziness, frozen parameters, sparse = dense, and
//! checkpoint round trips. (Parallel = naive is `src/optim/kernel_tests.rs`.)

use ndarray::{Array2, ArrayD, IxDyn, array};
use splitgrad::optim::{
    Adam, AdamConfig, LazyAdam, LazyAdamConfig, Optimizer, Sgd, SgdConfig, StateValue,
};
use splitgrad::{ErrorKind, ParamGrad, Parameter, Real, RowSparse};

fn close(found: f64, expected: f64) {
    assert!(
        (found - expected).abs() <= 1e-12,
        "found {found:e}, expected {expected:e}"
    );
}

fn dense(x: &[f64]) -> ParamGrad<f64> {
    ParamGrad::Dense(ArrayD::from_shape_vec(IxDyn(&[x.len()]), x.to_vec()).unwrap())
}

fn sparse<T: Real>(n_rows: usize, rows: Vec<usize>, values: Array2<T>) -> ParamGrad<T> {
    ParamGrad::RowSparse(RowSparse {
        n_rows,
        rows,
        values,
    })
}

/// The array of state entry `k`.
fn array_of<T>(state: &[(String, StateValue<T>)], k: usize) -> &ArrayD<T> {
    state[k].1.as_array().unwrap()
}

/// Row `r` of an array as a vector.
fn row<T: Copy>(a: &ArrayD<T>, r: usize) -> Vec<T> {
    a.index_axis(ndarray::Axis(0), r).iter().copied().collect()
}

#[test]
fn sgd_with_momentum_dampening_and_weight_decay_three_steps() {
    let (lr, mu, tau, wd) = (0.1, 0.9, 0.1, 0.01);
    let config = SgdConfig {
        lr,
        momentum: mu,
        dampening: tau,
        nesterov: false,
        weight_decay: wd,
    };
    let mut sgd = Sgd::new(config).unwrap();
    let mut p = Parameter::new("p", array![1.0].into_dyn());
    // step 1: d = 0.5 + 0.01·1 = 0.51; b = d = 0.51; p = 1 − 0.1·0.51 = 0.949
    // step 2: d = −1 + 0.01·0.949 = −0.99051; b = 0.9·0.51 + 0.9·d = −0.432459;
    //         p = 0.949 − 0.1·(−0.432459) = 0.9922459
    // step 3: d = 2 + 0.01·0.9922459 = 2.009922459; b = 0.9·(−0.432459) + 0.9·d = 1.4197171131;
    //         p = 0.9922459 − 0.14197171131 = 0.85027418869
    let (mut e_p, mut e_b) = (1.0f64, 0.0f64);
    for (step, g) in [0.5, -1.0, 2.0].into_iter().enumerate() {
        sgd.update(&mut p, &dense(&[g])).unwrap();
        let d = g + wd * e_p;
        e_b = if step == 0 {
            d
        } else {
            e_b * mu + (1.0 - tau) * d
        };
        e_p += -lr * e_b;
        close(p.value()[0], e_p);
    }
    close(p.value()[0], 0.85027418869);
    let state = sgd.state();
    assert_eq!(state.len(), 1);
    assert_eq!(state[0].0, "p.momentum_buffer");
    close(array_of(&state, 0)[0], 1.4197171131);
}

#[test]
fn sgd_nesterov_two_steps_and_plain_sgd_has_no_state() {
    let config = SgdConfig {
        lr: 0.1,
        momentum: 0.5,
        nesterov: true,
        ..SgdConfig::default()
    };
    let mut sgd = Sgd::new(config).unwrap();
    let mut p = Parameter::new("p", array![2.0].into_dyn());
    // step 1: b = 1; d = 1 + 0.5·1 = 1.5; p = 2 − 0.15 = 1.85
    sgd.update(&mut p, &dense(&[1.0])).unwrap();
    close(p.value()[0], 2.0 - 0.1 * 1.5);
    // step 2: b = 0.5·1 + (1 − 0)·(−0.5) = 0; d = −0.5 + 0.5·0 = −0.5; p = 1.85 + 0.05 = 1.9
    sgd.update(&mut p, &dense(&[-0.5])).unwrap();
    close(p.value()[0], 1.9);

    let mut plain = Sgd::new(SgdConfig {
        lr: 0.5,
        ..SgdConfig::default()
    })
    .unwrap();
    let mut q = Parameter::new("q", array![[1.0, 2.0], [3.0, 4.0]].into_dyn());
    // Row-sparse without momentum: only row 1 moves, p − 0.5·g.
    plain
        .update(&mut q, &sparse(2, vec![1], array![[2.0, -2.0]]))
        .unwrap();
    assert_eq!(q.value(), &array![[1.0, 2.0], [2.0, 5.0]].into_dyn());
    assert!(plain.state().is_empty());
}

#[test]
fn sgd_row_sparse_with_momentum_equals_its_dense_equivalent() {
    let config = SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        weight_decay: 0.01,
        ..SgdConfig::default()
    };
    let g = sparse(3, vec![0, 2], array![[1.0, -1.0], [0.5, 0.25]]);
    let d = ParamGrad::Dense(g.to_dense());
    let init = array![[1.0, -2.0], [3.0, -4.0], [0.5, 0.0]].into_dyn();
    let (mut a, mut b) = (Parameter::new("t", init.clone()), Parameter::new("t", init));
    let (mut sa, mut sb) = (Sgd::new(config).unwrap(), Sgd::new(config).unwrap());
    for _ in 0..3 {
        sa.update(&mut a, &g).unwrap();
        sb.update(&mut b, &d).unwrap();
    }
    assert_eq!(a.value(), b.value());
    // Row 1 has no gradient but moves through weight decay and momentum.
    assert!(a.value()[[1, 0]] < 3.0);
}

/// Adam by PyTorch's formula, step by step, on one element.
fn adam_reference(p0: f64, grads: &[f64], c: AdamConfig) -> Vec<f64> {
    let (mut p, mut m, mut v) = (p0, 0.0f64, 0.0f64);
    let mut out = Vec::new();
    for (i, &g0) in grads.iter().enumerate() {
        let t = (i + 1) as f64;
        let mut g = g0;
        if c.decoupled_weight_decay {
            p *= 1.0 - c.lr * c.weight_decay;
        } else if c.weight_decay != 0.0 {
            g += c.weight_decay * p;
        }
        m += (1.0 - c.beta1) * (g - m);
        v = v * c.beta2 + (1.0 - c.beta2) * g * g;
        let denom = v.sqrt() / (1.0 - c.beta2.powf(t)).sqrt() + c.eps;
        p += -(c.lr / (1.0 - c.beta1.powf(t))) * m / denom;
        out.push(p);
    }
    out
}

#[test]
fn adam_with_l2_weight_decay_three_steps() {
    let c = AdamConfig {
        lr: 0.1,
        weight_decay: 0.1,
        ..AdamConfig::default()
    };
    let mut adam = Adam::new(c).unwrap();
    let mut p = Parameter::new("p", array![1.0, -2.0].into_dyn());
    // Element 0, g = 0.5, −1, 2:
    // step 1: g = 0.5 + 0.1·1 = 0.6; m = 0.06; v = 0.001·0.36 = 3.6e-4;
    //         denom = √3.6e-4 / √0.001 + 1e-8 = 0.60000001; p = 1 − (0.1/0.1)·0.06/0.60000001 = 0.9000000016666666
    // step 2: g = −1 + 0.09 = −0.9099999998333334; m = −0.037; v = 0.00118774; p = 0.9252635194456061
    // step 3: g = 2.0925263519445605; p = 0.8776172608049325
    // Element 1, g = 0 throughout: the gradient is λ·p alone, p = −1.9000000049999999,
    // −1.8001664957181431, −1.7006234065937902.
    let grads = [[0.5, 0.0], [-1.0, 0.0], [2.0, 0.0]];
    for g in grads {
        adam.update(&mut p, &dense(&g)).unwrap();
    }
    let e0 = adam_reference(1.0, &[0.5, -1.0, 2.0], c);
    let e1 = adam_reference(-2.0, &[0.0; 3], c);
    close(p.value()[0], e0[2]);
    close(p.value()[1], e1[2]);
    close(e0[0], 0.9000000016666666);
    close(e0[2], 0.8776172608049325);
    close(e1[2], -1.7006234065937902);
    let state = adam.state();
    let names: Vec<&str> = state.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["p.exp_avg", "p.exp_avg_sq", "p.step"]);
    assert_eq!(state[2].1, StateValue::Step(3));
    close(array_of(&state, 0)[0], 0.17595263520945598);
}

#[test]
fn adamw_three_steps() {
    let c = AdamConfig {
        lr: 0.1,
        weight_decay: 0.1,
        ..AdamConfig::adamw()
    };
    let mut adamw = Adam::new(c).unwrap();
    let mut p = Parameter::new("p", array![1.0].into_dyn());
    // step 1: p = 1·(1 − 0.01) = 0.99; m = 0.05; v = 2.5e-4; denom = 0.50000001;
    //         p = 0.99 − 1·0.05/0.50000001 = 0.890000002
    // step 2: p = 0.88110000198, g = −1: p = 0.9177103542205653
    // step 3: g = 2: p = 0.8665676891558989
    for g in [0.5, -1.0, 2.0] {
        adamw.update(&mut p, &dense(&[g])).unwrap();
    }
    let e = adam_reference(1.0, &[0.5, -1.0, 2.0], c);
    close(e[0], 0.890000002);
    close(e[2], 0.8665676891558989);
    close(p.value()[0], e[2]);
}

#[test]
fn adam_and_adamw_differ_as_documented() {
    // Adam's λ enters the gradient (so the moments); AdamW's shrinks p
    // before a step whose moments see the raw gradient. Both bit for bit.
    let (lr, wd) = (0.05, 0.2);
    let p0 = array![1.5f32, -0.5, 0.25].into_dyn();
    let grads = [array![0.3f32, -0.2, 0.0], array![-0.1f32, 0.4, 0.7]];
    let l2 = AdamConfig {
        lr,
        weight_decay: wd,
        ..AdamConfig::default()
    };
    let w = AdamConfig {
        decoupled_weight_decay: true,
        ..l2
    };
    let none = AdamConfig {
        weight_decay: 0.0,
        ..l2
    };
    let (mut a, mut b, mut c, mut d) = (
        Parameter::new("p", p0.clone()),
        Parameter::new("p", p0.clone()),
        Parameter::new("p", p0.clone()),
        Parameter::new("p", p0),
    );
    let (mut adam, mut adamw) = (Adam::new(l2).unwrap(), Adam::new(w).unwrap());
    let (mut plain_c, mut plain_d) = (Adam::new(none).unwrap(), Adam::new(none).unwrap());
    for g in grads {
        let g = g.into_dyn();
        adam.update(&mut a, &ParamGrad::Dense(g.clone())).unwrap();
        // Adam(λ) = Adam(0) on g + λ·p.
        let with_l2 = &g + &c.value().mapv(|p| (wd as f32) * p);
        plain_c.update(&mut c, &ParamGrad::Dense(with_l2)).unwrap();
        adamw.update(&mut b, &ParamGrad::Dense(g.clone())).unwrap();
        // AdamW(λ) = p·(1 − γλ), then Adam(0) on g.
        d.value_mut().mapv_inplace(|p| p * (1.0 - lr * wd) as f32);
        plain_d.update(&mut d, &ParamGrad::Dense(g)).unwrap();
    }
    assert_eq!(a.value().mapv(f32::to_bits), c.value().mapv(f32::to_bits));
    assert_eq!(b.value().mapv(f32::to_bits), d.value().mapv(f32::to_bits));
    assert_ne!(a.value(), b.value());
}

#[test]
fn adam_row_sparse_equals_its_dense_equivalent_bit_for_bit() {
    for c in [
        AdamConfig::default(),
        AdamConfig {
            weight_decay: 0.1,
            ..AdamConfig::default()
        },
        AdamConfig::adamw(),
    ] {
        let c = AdamConfig { lr: 0.01, ..c };
        let init = ArrayD::from_shape_fn(IxDyn(&[5, 3]), |i| {
            (i[0] as f32 - 2.0) * 0.5 + i[1] as f32 * 0.125
        });
        let (mut a, mut b) = (Parameter::new("t", init.clone()), Parameter::new("t", init));
        let (mut sa, mut sb) = (Adam::new(c).unwrap(), Adam::new(c).unwrap());
        let steps = [
            (vec![0, 3], array![[1.0f32, -2.0, 0.5], [0.25, 0.0, -1.0]]),
            (vec![1], array![[3.0f32, 1.0, -0.5]]),
            (vec![], Array2::zeros((0, 3))),
        ];
        for (rows, values) in steps {
            let g = sparse(5, rows, values);
            let d = ParamGrad::Dense(g.to_dense());
            sa.update(&mut a, &g).unwrap();
            sb.update(&mut b, &d).unwrap();
        }
        assert_eq!(
            a.value().mapv(f32::to_bits),
            b.value().mapv(f32::to_bits),
            "{c:?}"
        );
        assert_eq!(sa.state(), sb.state());
        // Row 0 got a gradient only at step 1 but kept moving through m.
        assert_ne!(array_of(&sa.state(), 0)[[0, 0]], 0.0);
    }
}

#[test]
fn lazy_adam_three_steps_moves_only_present_rows() {
    let c = LazyAdamConfig {
        lr: 0.1,
        ..LazyAdamConfig::default()
    };
    let mut opt = LazyAdam::new(c).unwrap();
    let mut t = Parameter::new(
        "emb",
        array![[1.0, -1.0], [2.0, 3.0], [5.0, 7.0]].into_dyn(),
    );
    // step 1 (t = 1): row 0 g = (0.5, 0.25); row 2 g = (1, 1).
    opt.update(
        &mut t,
        &sparse(3, vec![0, 2], array![[0.5, 0.25], [1.0, 1.0]]),
    )
    .unwrap();
    // step 2 (t = 2): row 1 only.
    opt.update(&mut t, &sparse(3, vec![1], array![[-1.0, 4.0]]))
        .unwrap();
    // step 3 (t = 3): row 0 again, g = (2, 0).
    opt.update(&mut t, &sparse(3, vec![0], array![[2.0, 0.0]]))
        .unwrap();

    // Element (0, 0), g = 0.5 at t = 1 and 2 at t = 3:
    // t = 1: m = 0 + (0.5 − 0)·0.1 = 0.05; v = 0 + (0.25 − 0)·0.001 = 2.5e-4;
    //        step_size = 0.1·√0.001/0.1 = 0.0316227766; p = 1 − 0.0316227766·0.05/(0.0158113883 + 1e-8) = 0.9000000632455132
    // t = 3: m = 0.05 + (2 − 0.05)·0.1 = 0.245; v = 2.5e-4 + (4 − 2.5e-4)·0.001 = 0.00424975;
    //        step_size = 0.1·√(1 − 0.999³)/(1 − 0.9³) = 0.0202010597; p = 0.8240796646556365
    let lazy = |p: f64, steps: &[(u32, f64)]| {
        let (mut p, mut m, mut v) = (p, 0.0f64, 0.0f64);
        for &(t, g) in steps {
            m += (g - m) * (1.0 - 0.9);
            v += (g * g - v) * (1.0 - 0.999);
            let step_size =
                0.1 * (1.0 - 0.999f64.powf(t as f64)).sqrt() / (1.0 - 0.9f64.powf(t as f64));
            p += -step_size * (m / (v.sqrt() + 1e-8));
        }
        (p, m, v)
    };
    let e00 = lazy(1.0, &[(1, 0.5), (3, 2.0)]);
    close(e00.0, 0.8240796646556365);
    let expected = [
        [e00, lazy(-1.0, &[(1, 0.25), (3, 0.0)])],
        [lazy(2.0, &[(2, -1.0)]), lazy(3.0, &[(2, 4.0)])],
        [lazy(5.0, &[(1, 1.0)]), lazy(7.0, &[(1, 1.0)])],
    ];
    let state = opt.state();
    let (m, v) = (array_of(&state, 0), array_of(&state, 1));
    for r in 0..3 {
        for j in 0..2 {
            close(t.value()[[r, j]], expected[r][j].0);
            close(m[[r, j]], expected[r][j].1);
            close(v[[r, j]], expected[r][j].2);
        }
    }
    assert_eq!(state[2], ("emb.step".to_string(), StateValue::Step(3)));
}

#[test]
fn lazy_adam_leaves_absent_rows_and_their_moments_untouched() {
    let config = LazyAdamConfig {
        lr: 0.05,
        ..LazyAdamConfig::default()
    };
    let mut opt = LazyAdam::new(config).unwrap();
    let init = ArrayD::from_shape_fn(IxDyn(&[6, 4]), |i| (i[0] * 4 + i[1]) as f32 * 0.1 - 1.0);
    let mut t = Parameter::new("emb", init.clone());
    let g = |rows: Vec<usize>| {
        let values =
            Array2::from_shape_fn((rows.len(), 4), |(i, j)| 1.0 + i as f32 - j as f32 * 0.5);
        sparse(6, rows, values)
    };
    opt.update(&mut t, &g(vec![1, 4])).unwrap();
    let (p1, s1) = (t.value().clone(), opt.state());
    opt.update(&mut t, &g(vec![0, 5])).unwrap();
    let s2 = opt.state();
    for r in [1, 2, 3, 4] {
        assert_eq!(row(t.value(), r), row(&p1, r), "row {r}");
        for k in 0..2 {
            assert_eq!(
                row(array_of(&s2, k), r),
                row(array_of(&s1, k), r),
                "row {r} of {}",
                s2[k].0
            );
        }
    }
    for r in [2, 3] {
        assert_eq!(row(t.value(), r), row(&init, r));
        assert!(row(array_of(&s2, 0), r).iter().all(|&m| m == 0.0));
    }
    for r in [0, 5] {
        assert_ne!(row(t.value(), r), row(&init, r));
    }
    // An update with no rows only counts the step.
    let before = t.value().clone();
    opt.update(&mut t, &g(vec![])).unwrap();
    assert_eq!(t.value(), &before);
    assert_eq!(opt.state()[2].1, StateValue::Step(3));
}

#[test]
fn lazy_adam_dense_gradient_is_every_row_present() {
    let g = array![[0.5, -1.0], [0.0, 2.0], [3.0, 0.25]];
    let init = array![[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]].into_dyn();
    let (mut a, mut b) = (Parameter::new("t", init.clone()), Parameter::new("t", init));
    let mut oa = LazyAdam::new(LazyAdamConfig::default()).unwrap();
    let mut ob = LazyAdam::new(LazyAdamConfig::default()).unwrap();
    for _ in 0..2 {
        oa.update(&mut a, &ParamGrad::Dense(g.clone().into_dyn()))
            .unwrap();
        ob.update(&mut b, &sparse(3, vec![0, 1, 2], g.clone()))
            .unwrap();
    }
    assert_eq!(a.value(), b.value());
    assert_eq!(oa.state(), ob.state());
}

#[test]
fn frozen_parameters_are_never_moved_and_get_no_state() {
    let init = array![[1.0, 2.0], [3.0, 4.0]].into_dyn();
    let g = sparse(2, vec![1], array![[1.0, 1.0]]);
    let mut opts: Vec<Box<dyn Optimizer<f64>>> = vec![
        Box::new(
            Sgd::new(SgdConfig {
                lr: 0.1,
                momentum: 0.9,
                ..SgdConfig::default()
            })
            .unwrap(),
        ),
        Box::new(Adam::new(AdamConfig::adamw()).unwrap()),
        Box::new(LazyAdam::new(LazyAdamConfig::default()).unwrap()),
    ];
    for opt in &mut opts {
        let mut p = Parameter::new("frozen", init.clone());
        p.set_trainable(false);
        opt.update(&mut p, &g).unwrap();
        opt.update(
            &mut p,
            &ParamGrad::Dense(array![[1.0, 1.0], [1.0, 1.0]].into_dyn()),
        )
        .unwrap();
        assert_eq!(p.value(), &init);
        assert!(opt.state().is_empty());
    }
}

#[test]
fn a_mismatched_gradient_is_an_error_and_changes_nothing() {
    let mut adam = Adam::new(AdamConfig::default()).unwrap();
    let mut p = Parameter::new("w", array![[1.0, 2.0]].into_dyn());
    let e = adam.update(&mut p, &dense(&[1.0, 2.0])).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Shape { .. }));
    assert_eq!(
        e.to_string(),
        "array `w`: gradient has shape [2], expected [1, 2] (the parameter's)"
    );
    assert_eq!(p.value(), &array![[1.0, 2.0]].into_dyn());
    assert!(adam.state().is_empty());
    let mut lazy = LazyAdam::new(LazyAdamConfig::default()).unwrap();
    let e = lazy
        .update(&mut p, &sparse(1, vec![1], array![[1.0, 1.0]]))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "array `w`: gradient row 1 at position [0] is out of range 0..1"
    );
    assert!(lazy.state().is_empty());
}

/// Runs `steps` updates of a 2-row table (row-sparse gradients alternating
/// between rows, and one dense) in f32.
fn run_steps(opt: &mut dyn Optimizer<f32>, p: &mut Parameter<f32>, steps: std::ops::Range<usize>) {
    for s in steps {
        let g = match s % 3 {
            0 => sparse(2, vec![0], array![[0.5f32, -0.25, 1.0]]),
            1 => ParamGrad::Dense(array![[0.125f32, 2.0, -1.5], [0.75, -0.5, 0.3]].into_dyn()),
            _ => sparse(2, vec![1], array![[-0.7f32, 0.1, 0.9]]),
        };
        opt.update(p, &g).unwrap();
    }
}

#[test]
fn state_round_trip_resumes_bit_exactly() {
    type Make = fn() -> Box<dyn Optimizer<f32>>;
    let makers: [Make; 5] = [
        || {
            Box::new(
                Sgd::new(SgdConfig {
                    lr: 0.1,
                    momentum: 0.9,
                    dampening: 0.1,
                    weight_decay: 0.01,
                    ..SgdConfig::default()
                })
                .unwrap(),
            )
        },
        || {
            Box::new(
                Sgd::new(SgdConfig {
                    lr: 0.1,
                    momentum: 0.8,
                    nesterov: true,
                    ..SgdConfig::default()
                })
                .unwrap(),
            )
        },
        || {
            Box::new(
                Adam::new(AdamConfig {
                    lr: 0.01,
                    weight_decay: 0.1,
                    ..AdamConfig::default()
                })
                .unwrap(),
            )
        },
        || {
            Box::new(
                Adam::new(AdamConfig {
                    lr: 0.01,
                    ..AdamConfig::adamw()
                })
                .unwrap(),
            )
        },
        || {
            Box::new(
                LazyAdam::new(LazyAdamConfig {
                    lr: 0.01,
                    ..LazyAdamConfig::default()
                })
                .unwrap(),
            )
        },
    ];
    let init = array![[1.0f32, -2.0, 0.5], [0.25, 3.0, -1.0]].into_dyn();
    for (k, make) in makers.iter().enumerate() {
        let mut straight = Parameter::new("emb.weight", init.clone());
        let mut opt = make();
        run_steps(opt.as_mut(), &mut straight, 0..3);

        let mut resumed = Parameter::new("emb.weight", init.clone());
        let mut first = make();
        run_steps(first.as_mut(), &mut resumed, 0..1);
        let saved = first.state();
        let mut second = make();
        second.load_state(saved).unwrap();
        second.check_state(&[&resumed]).unwrap();
        run_steps(second.as_mut(), &mut resumed, 1..3);

        assert_eq!(
            straight.value().mapv(f32::to_bits),
            resumed.value().mapv(f32::to_bits),
            "optimiser {k}"
        );
        assert_eq!(opt.state(), second.state(), "optimiser {k}");
    }
}

#[test]
fn step_counts_past_two_to_the_24_stay_exact_in_f32() {
    let mut opt = Adam::<f32>::new(AdamConfig::default()).unwrap();
    let big = (1u64 << 24) + 1;
    opt.load_state(vec![
        (
            "w.exp_avg".into(),
            StateValue::Array(array![0.0f32].into_dyn()),
        ),
        (
            "w.exp_avg_sq".into(),
            StateValue::Array(array![0.0f32].into_dyn()),
        ),
        ("w.step".into(), StateValue::Step(big)),
    ])
    .unwrap();
    let mut w = Parameter::new("w", array![1.0f32].into_dyn());
    opt.update(&mut w, &ParamGrad::Dense(array![1.0f32].into_dyn()))
        .unwrap();
    assert_eq!(opt.state()[2].1, StateValue::Step(big + 1));
    let other = Parameter::new("w", array![1.0f32, 2.0].into_dyn());
    let e = opt.check_state(&[&other]).unwrap_err();
    assert_eq!(e.array(), Some("w.exp_avg"));
}
