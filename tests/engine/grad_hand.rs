//! Tiny hand cases through the tape, one or more per op, each with its
//! derivative worked out in a comment. Values are chosen so the expected
//! gradients are exact in binary; where a transcendental function makes
//! that impossible the bound is a few ulps. Then the tape's own rules:
//! frozen parameters, no-grad tapes, accumulation, row-sparse layout.
//!
//! Each loss is `L = Σ y ⊙ R` (dot_const), so `∂y = R`.

use ndarray::{ArrayD, Axis, array};
use splitgrad::{ParamGrad, Parameter, Tape};

fn d(a: ndarray::Array2<f64>) -> ArrayD<f64> {
    a.into_dyn()
}

#[track_caller]
fn assert_close(got: &ArrayD<f64>, expect: &ArrayD<f64>, tol: f64) {
    assert_eq!(got.shape(), expect.shape());
    for (g, e) in got.iter().zip(expect) {
        assert!((g - e).abs() <= tol, "got {got}, expected {expect}");
    }
}

#[test]
fn gather_from_parameter_is_row_sparse() {
    // y = [t2, t0, t2]: ∂t0 = R1 = [100, 1000]; ∂t2 = R0 + R2 = [10001, 100010];
    // row 1 was never read and carries nothing.
    let p = Parameter::new("t", d(array![[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]));
    let mut t = Tape::new();
    let tv = t.param(&p);
    let y = t.gather(tv, &[2, 0, 2]);
    assert_eq!(t.value(y), d(array![[5.0, 6.0], [1.0, 2.0], [5.0, 6.0]]));
    let r = array![[1.0, 10.0], [100.0, 1000.0], [10000.0, 100000.0]];
    let loss = t.dot_const(y, d(r));
    let g = t.backward(loss);
    let Some(ParamGrad::RowSparse(rs)) = g.param(&p) else {
        panic!("expected a row-sparse gradient, got {:?}", g.param(&p))
    };
    assert_eq!(rs.n_rows, 3);
    assert_eq!(rs.rows, vec![0, 2]);
    assert_eq!(rs.values, array![[100.0, 1000.0], [10001.0, 100010.0]]);
}

#[test]
fn gather_from_input_is_dense() {
    // The same through an input: ∂t = [R1, 0, R0 + R2] as one dense array.
    let mut t = Tape::new();
    let tv = t.input(d(array![[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]));
    let y = t.gather(tv, &[2, 0, 2]);
    let r = array![[1.0, 10.0], [100.0, 1000.0], [10000.0, 100000.0]];
    let loss = t.dot_const(y, d(r));
    let g = t.backward(loss);
    let expect = array![[100.0, 1000.0], [0.0, 0.0], [10001.0, 100010.0]];
    assert_eq!(g.input(tv).unwrap(), &d(expect));
}

#[test]
fn gather_of_no_ids_gives_a_gradient_of_the_table_shape() {
    // y = gather(t, []) has shape (0, 2) and L = Σ y = 0 reads no row:
    // ∂t = 0, of t's shape (3, 2).
    let p = Parameter::new("t", d(array![[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]));
    let mut t = Tape::new();
    let tv = t.param(&p);
    let y = t.gather(tv, &[]);
    assert_eq!(t.value(y).shape(), &[0, 2]);
    let loss = t.sum(y);
    let g = t.backward(loss);
    assert_eq!(g.dense(&p), ArrayD::<f64>::zeros(ndarray::IxDyn(&[3, 2])));
}

#[test]
fn gather_of_no_ids_then_some_ids() {
    // y = [gather(t, []); gather(t, [1])] = [t1]: ∂t1 = R0 = [7, 8].
    let p = Parameter::new("t", d(array![[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]));
    let mut t = Tape::new();
    let tv = t.param(&p);
    let none = t.gather(tv, &[]);
    let one = t.gather(tv, &[1]);
    let y = t.concat_rows(&[none, one]);
    let loss = t.dot_const(y, d(array![[7.0, 8.0]]));
    let g = t.backward(loss);
    let expect = array![[0.0, 0.0], [7.0, 8.0], [0.0, 0.0]];
    assert_eq!(g.dense(&p), d(expect));
}

#[test]
fn add_sub_mul_scale() {
    // y = 3·(a ⊙ b) + (a − b), R = [1, 10]:
    // ∂a = R ⊙ (3b + 1) = [1·7, 10·(−2)] = [7, −20]
    // ∂b = R ⊙ (3a − 1) = [1·5, 10·8] = [5, 80]
    let mut t = Tape::new();
    let a = t.input(array![2.0, 3.0].into_dyn());
    let b = t.input(array![2.0, -1.0].into_dyn());
    let ab = t.mul(a, b);
    let ab3 = t.scale(ab, 3.0);
    let diff = t.sub(a, b);
    let y = t.add(ab3, diff);
    assert_eq!(t.value(y), array![12.0, -5.0].into_dyn());
    let loss = t.dot_const(y, array![1.0, 10.0].into_dyn());
    let g = t.backward(loss);
    assert_eq!(g.input(a).unwrap(), &array![7.0, -20.0].into_dyn());
    assert_eq!(g.input(b).unwrap(), &array![5.0, 80.0].into_dyn());
}

#[test]
fn mul_of_a_value_by_itself() {
    // y = a ⊙ a: both sides of the product are a, ∂a = 2a ⊙ R = [2·3·1, 2·(−5)·2].
    let mut t = Tape::new();
    let a = t.input(array![3.0, -5.0].into_dyn());
    let y = t.mul(a, a);
    let loss = t.dot_const(y, array![1.0, 2.0].into_dyn());
    let g = t.backward(loss);
    assert_eq!(g.input(a).unwrap(), &array![6.0, -20.0].into_dyn());
}

#[test]
fn row_scale() {
    // y[i] = s_i·x[i], R = [[1, 2], [3, 4]]:
    // ∂x[i, j] = s_i·R[i, j] = [[2, 4], [−1.5, −2]]
    // ∂s_i = Σ_j R[i, j]·x[i, j] = [1·1 + 2·2, 3·3 + 4·4] = [5, 25]
    let mut t = Tape::new();
    let x = t.input(d(array![[1.0, 2.0], [3.0, 4.0]]));
    let s = t.input(array![2.0, -0.5].into_dyn());
    let y = t.row_scale(x, s);
    let loss = t.dot_const(y, d(array![[1.0, 2.0], [3.0, 4.0]]));
    let g = t.backward(loss);
    assert_eq!(g.input(x).unwrap(), &d(array![[2.0, 4.0], [-1.5, -2.0]]));
    assert_eq!(g.input(s).unwrap(), &array![5.0, 25.0].into_dyn());
}

#[test]
fn sigmoid() {
    // σ(0) = 1/2, σ'(0) = 1/4; σ(ln 3) = 3/4, σ'(ln 3) = 3/4·1/4 = 3/16;
    // σ(−ln 3) = 1/4, σ' = 3/16 too; σ(±40) saturates: σ' ≈ e^{−40} ≈ 4e-18.
    // (At +40 the saved output rounds to 1, so the backward, which uses
    // only y, gives exactly 0: an absolute error of 4e-18, never a NaN.)
    let mut t = Tape::new();
    let l3 = 3f64.ln();
    let x = t.input(array![0.0, l3, -l3, 40.0, -40.0].into_dyn());
    let y = t.sigmoid(x);
    let loss = t.sum(y);
    let g = t.backward(loss);
    let tiny = (-40f64).exp();
    let expect = array![0.25, 0.1875, 0.1875, tiny, tiny].into_dyn();
    assert_close(g.input(x).unwrap(), &expect, 1e-16);
    assert!(
        g.input(x)
            .unwrap()
            .iter()
            .all(|v| v.is_finite() && *v >= 0.0)
    );
}

#[test]
fn select() {
    // y = [a0, b1]: ∂a = [R0, 0], ∂b = [0, R1].
    let mut t = Tape::new();
    let a = t.input(d(array![[1.0, 2.0], [3.0, 4.0]]));
    let b = t.input(d(array![[5.0, 6.0], [7.0, 8.0]]));
    let y = t.select(&[true, false], a, b);
    let loss = t.dot_const(y, d(array![[1.0, 2.0], [3.0, 4.0]]));
    let g = t.backward(loss);
    assert_eq!(g.input(a).unwrap(), &d(array![[1.0, 2.0], [0.0, 0.0]]));
    assert_eq!(g.input(b).unwrap(), &d(array![[0.0, 0.0], [3.0, 4.0]]));
}

#[test]
fn segment_sum_with_an_empty_segment() {
    // segments [1, 0, 1] of 3: y0 = x1, y1 = x0 + x2, y2 = 0 (empty).
    // ∂x_i = R[seg_i] = [R1, R0, R1]; R2 reaches nothing.
    let mut t = Tape::new();
    let x = t.input(d(array![[1.0], [2.0], [4.0]]));
    let y = t.segment_sum(x, &[1, 0, 1], 3);
    assert_eq!(t.value(y), d(array![[2.0], [5.0], [0.0]]));
    let loss = t.dot_const(y, d(array![[10.0], [20.0], [30.0]]));
    let g = t.backward(loss);
    assert_eq!(g.input(x).unwrap(), &d(array![[20.0], [10.0], [20.0]]));
}

#[test]
fn segment_mean_with_an_empty_segment() {
    // segments [1, 1, 0, 1, 1] of 3: counts [1, 4, 0]; y2 = 0 (empty).
    // ∂x_i = R[seg_i] / count[seg_i] = [20/4, 20/4, 10/1, 20/4, 20/4].
    let mut t = Tape::new();
    let x = t.input(d(array![[1.0], [2.0], [3.0], [4.0], [5.0]]));
    let y = t.segment_mean(x, &[1, 1, 0, 1, 1], 3);
    assert_eq!(t.value(y), d(array![[3.0], [3.0], [0.0]]));
    let loss = t.dot_const(y, d(array![[10.0], [20.0], [30.0]]));
    let g = t.backward(loss);
    let expect = array![[5.0], [5.0], [10.0], [5.0], [5.0]];
    assert_eq!(g.input(x).unwrap(), &d(expect));
}

#[test]
fn row_norm_including_a_zero_row() {
    // y = [‖(3, 4)‖, ‖(0, 0)‖] = [5, 0]. ∂x[0] = R0·x[0]/5 = 5·(3, 4)/5;
    // at the zero row the derivative does not exist: the convention is 0.
    let mut t = Tape::new();
    let x = t.input(d(array![[3.0, 4.0], [0.0, 0.0]]));
    let y = t.row_norm(x);
    assert_eq!(t.value(y), array![5.0, 0.0].into_dyn());
    let loss = t.dot_const(y, array![5.0, 7.0].into_dyn());
    let g = t.backward(loss);
    assert_eq!(g.input(x).unwrap(), &d(array![[3.0, 4.0], [0.0, 0.0]]));
}

#[test]
fn sum_mean_dot_const() {
    // L = Σx + mean(x) + Σ x ⊙ C over 4 elements:
    // ∂x = 1 + 1/4 + C.
    let c = d(array![[1.0, -1.0], [2.0, 0.0]]);
    let mut t = Tape::new();
    let x = t.input(d(array![[1.0, 2.0], [3.0, 4.0]]));
    let s = t.sum(x);
    let m = t.mean(x);
    let k = t.dot_const_view(x, c.view());
    assert_eq!((t.scalar(s), t.scalar(m), t.scalar(k)), (10.0, 2.5, 5.0));
    let sm = t.add(s, m);
    let loss = t.add(sm, k);
    let g = t.backward(loss);
    assert_eq!(g.input(x).unwrap(), &d(array![[2.25, 0.25], [3.25, 1.25]]));
}

#[test]
fn matmul() {
    // C = A·B, R = [[1, 0], [0, 2]]:
    // ∂A = R·Bᵀ = [[5, 7], [12, 16]], ∂B = Aᵀ·R = [[1, 6], [2, 8]].
    let mut t = Tape::new();
    let a = t.input(d(array![[1.0, 2.0], [3.0, 4.0]]));
    let b = t.input(d(array![[5.0, 6.0], [7.0, 8.0]]));
    let c = t.matmul(a, b);
    assert_eq!(t.value(c), d(array![[19.0, 22.0], [43.0, 50.0]]));
    let loss = t.dot_const(c, d(array![[1.0, 0.0], [0.0, 2.0]]));
    let g = t.backward(loss);
    assert_eq!(g.input(a).unwrap(), &d(array![[5.0, 7.0], [12.0, 16.0]]));
    assert_eq!(g.input(b).unwrap(), &d(array![[1.0, 6.0], [2.0, 8.0]]));
}

#[test]
fn transpose_and_reshape() {
    // y = reshape(xᵀ, (6)) for x of (2, 3): y = [x00, x10, x01, x11, x02, x12],
    // so ∂x[i, j] = R[2j + i] = [[R0, R2, R4], [R1, R3, R5]].
    let mut t = Tape::new();
    let x = t.input(d(array![[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]));
    let xt = t.transpose(x);
    let y = t.reshape(xt, &[6]);
    assert_eq!(t.value(y), array![1.0, 4.0, 2.0, 5.0, 3.0, 6.0].into_dyn());
    let loss = t.dot_const(y, array![0.0, 1.0, 2.0, 3.0, 4.0, 5.0].into_dyn());
    let g = t.backward(loss);
    assert_eq!(
        g.input(x).unwrap(),
        &d(array![[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]])
    );
}

#[test]
fn concat_rows_with_a_part_used_twice() {
    // y = [a; b; a]: ∂a = R0 + R2, ∂b = R1.
    let mut t = Tape::new();
    let a = t.input(d(array![[1.0, 2.0]]));
    let b = t.input(d(array![[3.0, 4.0]]));
    let y = t.concat_rows(&[a, b, a]);
    let loss = t.dot_const(y, d(array![[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]]));
    let g = t.backward(loss);
    assert_eq!(g.input(a).unwrap(), &d(array![[101.0, 202.0]]));
    assert_eq!(g.input(b).unwrap(), &d(array![[10.0, 20.0]]));
}

#[test]
fn logsumexp_small_and_in_the_thousands() {
    // lse(0, ln 3) = ln 4, softmax = [1/4, 3/4]; lse(1000, 1000) = 1000 + ln 2,
    // softmax = [1/2, 1/2] — no overflow. ∂x[i] = R_i·softmax[i], R = [4, 2].
    // At 1000, lse carries ulp(1000) ≈ 1.1e-13 of rounding into e^{x − lse}.
    let mut t = Tape::new();
    let x = t.input(d(array![[0.0, 3f64.ln()], [1000.0, 1000.0]]));
    let y = t.logsumexp(x);
    let v = t.value(y).to_owned();
    assert!((v[[0]] - 4f64.ln()).abs() < 1e-15 && (v[[1]] - 1000.0 - 2f64.ln()).abs() < 1e-12);
    let loss = t.dot_const(y, array![4.0, 2.0].into_dyn());
    let g = t.backward(loss);
    assert_close(
        g.input(x).unwrap(),
        &d(array![[1.0, 3.0], [1.0, 1.0]]),
        1e-12,
    );
}

#[test]
fn cross_entropy_with_ignored_labels_and_large_logits() {
    // Row 0: (0, 0), label 1: ce = ln 2, ∂ = softmax − onehot = [1/2, −1/2].
    // Row 1: label −100: ce = 0, no gradient.
    // Row 2: (1000, 1000 + ln 3), label 0: softmax = [1/4, 3/4],
    //        ce = ln 4, ∂ = [1/4 − 1, 3/4] = [−3/4, 3/4]. Times R = [1, 5, 2].
    let mut t = Tape::new();
    let x = t.input(d(array![
        [0.0, 0.0],
        [5.0, 1.0],
        [1000.0, 1000.0 + 3f64.ln()]
    ]));
    let ce = t.cross_entropy(x, &[1, -100, 0]);
    let v = t.value(ce).to_owned();
    assert_eq!(v[[1]], 0.0);
    assert!((v[[0]] - 2f64.ln()).abs() < 1e-15 && (v[[2]] - 4f64.ln()).abs() < 1e-12);
    let loss = t.dot_const(ce, array![1.0, 5.0, 2.0].into_dyn());
    let g = t.backward(loss);
    let expect = d(array![[0.5, -0.5], [0.0, 0.0], [-1.5, 1.5]]);
    assert_close(g.input(x).unwrap(), &expect, 1e-12);
    let ignored = g.input(x).unwrap().index_axis(Axis(0), 1).to_owned();
    assert_eq!(ignored, array![0.0, 0.0].into_dyn());
}

#[test]
fn frozen_parameter_gets_no_gradient() {
    // L = Σ gather(frozen, [0]) ⊙ x: x still gets ∂x = frozen[0] = [1, 2];
    // the frozen table gets nothing at all.
    let mut frozen = Parameter::new("frozen", d(array![[1.0, 2.0], [3.0, 4.0]]));
    frozen.set_trainable(false);
    let mut t = Tape::new();
    let fv = t.param(&frozen);
    assert!(!t.requires_grad(fv));
    let rows = t.gather(fv, &[0]);
    let x = t.input(d(array![[5.0, 6.0]]));
    let y = t.mul(rows, x);
    let loss = t.sum(y);
    let g = t.backward(loss);
    assert!(g.param(&frozen).is_none());
    assert_eq!(g.iter().count(), 0);
    assert_eq!(g.input(x).unwrap(), &d(array![[1.0, 2.0]]));

    // A loss that depends on frozen values only: no gradient anywhere.
    let mut t = Tape::new();
    let fv = t.param(&frozen);
    let loss = t.sum(fv);
    assert!(!t.requires_grad(loss));
    assert_eq!(t.backward(loss).iter().count(), 0);
}

/// A small graph touching most ops, on the given tape; returns its nodes.
fn network<'p>(t: &mut Tape<'p, f64>, table: &'p Parameter<f64>) -> Vec<splitgrad::Var> {
    let tv = t.param(table);
    let h = t.input(d(array![[0.5, -1.0], [2.0, 0.25], [-0.75, 1.5]]));
    let rows = t.gather(tv, &[2, 0, 2]);
    let s = t.sigmoid(rows);
    let n = t.row_norm(h);
    let scaled = t.row_scale(s, n);
    let m = t.mul(scaled, h);
    let w = t.transpose(tv);
    let logits = t.matmul(m, w);
    let ce = t.cross_entropy(logits, &[1, -100, 0]);
    let loss = t.mean(ce);
    vec![tv, h, rows, s, n, scaled, m, w, logits, ce, loss]
}

#[test]
fn no_grad_tape_computes_the_same_values_and_no_gradients() {
    let table = Parameter::new("t", d(array![[1.0, -2.0], [0.5, 3.0], [-1.5, 0.25]]));
    let mut rec = Tape::new();
    let mut off = Tape::no_grad();
    let a = network(&mut rec, &table);
    let b = network(&mut off, &table);
    assert!(rec.is_recording() && !off.is_recording());
    for (&va, &vb) in a.iter().zip(&b) {
        let bits =
            |t: &Tape<'_, f64>, v| t.value(v).iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&rec, va), bits(&off, vb), "node {}", va.index());
        assert!(rec.requires_grad(va) && !off.requires_grad(vb));
    }
    let loss = *b.last().unwrap();
    let g = off.backward(loss);
    assert_eq!(g.iter().count(), 0);
    assert!(g.input(b[1]).is_none());
    // The recording tape does give both gradients (so the above can fail).
    let g = rec.backward(*a.last().unwrap());
    assert!(g.param(&table).is_some() && g.input(a[1]).is_some());
}

#[test]
fn parameter_registered_twice_accumulates() {
    // Two registrations a, b of p, both gathered: y = [a[1]; b[1]; b[0]]:
    // ∂p0 = R2, ∂p1 = R0 + R1, still row-sparse.
    let p = Parameter::new("p", d(array![[1.0, 2.0], [3.0, 4.0]]));
    let mut t = Tape::new();
    let (a, b) = (t.param(&p), t.param(&p));
    let ga = t.gather(a, &[1]);
    let gb = t.gather(b, &[1, 0]);
    let y = t.concat_rows(&[ga, gb]);
    let loss = t.dot_const(y, d(array![[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]]));
    let g = t.backward(loss);
    let Some(ParamGrad::RowSparse(rs)) = g.param(&p) else {
        panic!("expected row-sparse, got {:?}", g.param(&p))
    };
    assert_eq!(rs.rows, vec![0, 1]);
    assert_eq!(rs.values, array![[100.0, 200.0], [11.0, 22.0]]);

    // Two registrations used densely: y = a ⊙ b = p², ∂p = 2p ⊙ R.
    let mut t = Tape::new();
    let (a, b) = (t.param(&p), t.param(&p));
    let y = t.mul(a, b);
    let loss = t.dot_const(y, d(array![[1.0, 1.0], [2.0, -1.0]]));
    let g = t.backward(loss);
    assert_eq!(
        g.param(&p),
        Some(&ParamGrad::Dense(d(array![[2.0, 4.0], [12.0, -8.0]])))
    );
}

#[test]
fn gather_and_dense_use_of_one_parameter_mix_into_a_dense_gradient() {
    // y = [p[1]; p] (gather, then the table whole): ∂p = [R1, R2] + [0, R0].
    let p = Parameter::new("p", d(array![[1.0, 2.0], [3.0, 4.0]]));
    let mut t = Tape::new();
    let pv = t.param(&p);
    let row = t.gather(pv, &[1]);
    let y = t.concat_rows(&[row, pv]);
    let loss = t.dot_const(y, d(array![[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]]));
    let g = t.backward(loss);
    let expect = d(array![[10.0, 20.0], [101.0, 202.0]]);
    assert_eq!(g.param(&p), Some(&ParamGrad::Dense(expect)));
}

#[test]
fn row_sparse_rows_are_sorted_and_unique() {
    // ids [5, 1, 5, 3, 1] of a 6-row table: rows [1, 3, 5], each the sum of
    // its R rows in order: row 1 = R1 + R4, row 3 = R3, row 5 = R0 + R2.
    let p = Parameter::new("p", ArrayD::zeros(ndarray::IxDyn(&[6, 1])));
    let mut t = Tape::new();
    let pv = t.param(&p);
    let y = t.gather(pv, &[5, 1, 5, 3, 1]);
    let loss = t.dot_const(y, d(array![[1.0], [2.0], [4.0], [8.0], [16.0]]));
    let g = t.backward(loss);
    let Some(ParamGrad::RowSparse(rs)) = g.param(&p) else {
        panic!("expected row-sparse, got {:?}", g.param(&p))
    };
    assert_eq!(rs.rows, vec![1, 3, 5]);
    assert_eq!(rs.values, array![[18.0], [8.0], [5.0]]);
}

#[test]
fn harness_finite_differences_find_a_known_derivative() {
    // y = x ⊙ x with L = Σ y ⊙ R: ∂x = 2x ⊙ R. The harness must agree with
    // that, and its tolerance must reject a derivative off by 1e-4.
    let x = array![0.5, -1.5, 2.0].into_dyn();
    let report = crate::common::check(&[crate::common::input(x.clone())], |t, v, _| {
        t.mul(v[0], v[0])
    })
    .unwrap();
    let r = crate::common::upstream(&[3]);
    let largest = (&x * &r * 2.0).iter().fold(0f64, |m, v| m.max(v.abs()));
    assert_eq!(report.checked, 3);
    assert!(
        (report.max_abs_grad - largest).abs() < 1e-8,
        "{report:?} vs {largest}"
    );
    assert!(crate::common::close(1.0, 1.0 + 1e-7) && !crate::common::close(1.0, 1.0 + 1e-4));
    assert!(crate::common::close(1e-9, 0.0) && !crate::common::close(1e-5, 0.0));
}
