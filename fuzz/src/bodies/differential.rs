//! The differential body: each fast kernel against its naive twin.

use ndarray::{Array1, Array2, ArrayView2, ArrayViewMut2, Axis};
use splitgrad::io::SplitIndex;
use splitgrad::kernels::scatter::{coalesce_rows, coalesce_rows_naive};
use splitgrad::layers::{SplitVocabulary, SplitVocabularyConfig};
use splitgrad::ops::cross_entropy::IGNORE_INDEX;
use splitgrad::ops::fused_ce::{
    ChunkSizes, Targets, fused_ce_backward, fused_ce_forward, naive_ce_backward, naive_ce_forward,
};
use splitgrad::ops::gated_mix::gated_mix_forward;
use splitgrad::optim::{Adam, AdamConfig, LazyAdam, LazyAdamConfig, Optimizer};
use splitgrad::param::{Dtype, Rounding, RowForm, RowGradient};
use splitgrad::{ParamGrad, Parameter, Real, RowSparse, Tape};

use super::Bytes;

// ---------------------------------------------------------------------------
// differential

/// `|a − b| ≤ tol·max(1, scale)`.
fn close(a: f64, b: f64, tol: f64, scale: f64) -> bool {
    (a - b).abs() <= tol * scale.max(1.0) || (a.is_nan() && b.is_nan())
}

fn assert_close<'a>(
    what: &str,
    a: impl IntoIterator<Item = &'a f64>,
    b: impl IntoIterator<Item = &'a f64>,
    tol: f64,
    scale: f64,
) {
    for (i, (x, y)) in a.into_iter().zip(b).enumerate() {
        assert!(
            close(*x, *y, tol, scale),
            "{what}[{i}]: fast {x} vs naive {y}"
        );
    }
}

/// Bytes: a kernel selector, then the sizes and values of a small case.
/// Each fast kernel is run against its naive twin: scatter coalescing and
/// the optimisers bit for bit (in f64, and in f32 on half-precision
/// parameters and moments: selectors 240 and up), the fused cross-entropy,
/// the gated mix and the fusion penalty (forward and backward) within a
/// tolerance.
pub fn differential(data: &[u8]) {
    let mut b = Bytes::new(data);
    match b.u8() {
        240.. => diff_half_adam(&mut b),
        s => match s % 6 {
            0 => diff_coalesce(&mut b),
            1 => diff_fused_ce(&mut b),
            2 => diff_lazy_adam(&mut b),
            3 => diff_adam(&mut b),
            4 => diff_gated_mix(&mut b),
            _ => diff_fusion_penalty(&mut b),
        },
    }
}

fn diff_coalesce(b: &mut Bytes) {
    let n_rows = b.below(16) + 1;
    let width = b.below(9);
    let n = b.below(64);
    // Tiled past 4096 contributions the kernel sorts in parallel.
    let tile = if b.u8() == 255 { 80 } else { 1 };
    let ids: Vec<usize> = (0..n).map(|_| b.below(n_rows)).collect();
    let values: Vec<f64> = (0..n * width).map(|_| b.real(100.0)).collect();
    let ids: Vec<usize> = ids.iter().copied().cycle().take(n * tile).collect();
    let values: Vec<f64> = values
        .iter()
        .copied()
        .cycle()
        .take(n * width * tile)
        .collect();
    let v = Array2::from_shape_vec((n * tile, width), values).expect("shape");
    let fast = coalesce_rows(n_rows, &ids, v.view());
    let naive = coalesce_rows_naive(n_rows, &ids, v.view());
    assert_eq!(fast.rows, naive.rows);
    assert!(
        fast.values
            .iter()
            .zip(naive.values.iter())
            .all(|(x, y)| x.to_bits() == y.to_bits()),
        "coalesce_rows differs from its naive twin"
    );
    let v32 = v.mapv(|x| x as f32);
    assert_eq!(
        coalesce_rows(n_rows, &ids, v32.view()),
        coalesce_rows_naive(n_rows, &ids, v32.view())
    );
}

fn diff_fused_ce(b: &mut Bytes) {
    let m = b.below(6) + 1;
    let h = b.below(6) + 1;
    let n_splits = b.below(3) + 1;
    let sizes: Vec<usize> = (0..n_splits).map(|_| b.below(7)).collect();
    let v: usize = sizes.iter().sum();
    let scale = [1.0, 4.0, 30.0][b.below(3)];
    let n = b.below(12);
    let chunks = ChunkSizes {
        tokens: b.below(4) + 1,
        vocab: b.below(5) + 1,
    };
    let labels: Vec<i64> = (0..n)
        .map(|_| {
            let x = b.u8();
            if v == 0 || x & 0x80 != 0 {
                IGNORE_INDEX
            } else {
                (x as usize % v) as i64
            }
        })
        .collect();
    let row_of: Vec<usize> = (0..n).map(|_| b.below(m)).collect();
    let hid = Array2::from_shape_fn((m, h), |_| b.real(scale));
    let ws: Vec<Array2<f64>> = sizes
        .iter()
        .map(|&s| Array2::from_shape_fn((s, h), |_| b.real(scale)))
        .collect();
    let gy: Vec<f64> = (0..n).map(|_| b.real(2.0)).collect();
    let targets = Targets::grouped(labels, row_of, m);
    let wv: Vec<ArrayView2<'_, f64>> = ws.iter().map(|w| w.view()).collect();

    // Logits are at most H·scale² in size; the tolerance follows them.
    let size = h as f64 * scale * scale;
    let (l0, s0) = naive_ce_forward(hid.view(), &wv, &targets);
    let (l1, s1) = fused_ce_forward(hid.view(), &wv, &targets, chunks);
    assert_close("loss", &l1, &l0, 1e-12, size);
    assert_close("lse", &s1.lse(), &s0.lse(), 1e-12, size);
    assert!(
        l1.iter()
            .all(|x| x.is_finite() && *x >= -1e-9 * size.max(1.0))
    );

    let (gh0, gw0) = naive_ce_backward(hid.view(), &wv, &targets, &gy);
    let mut gh = Array2::zeros(hid.dim());
    let mut gws: Vec<Array2<f64>> = ws.iter().map(|w| Array2::zeros(w.dim())).collect();
    let mut views: Vec<Option<ArrayViewMut2<'_, f64>>> =
        gws.iter_mut().map(|g| Some(g.view_mut())).collect();
    fused_ce_backward(
        hid.view(),
        &wv,
        &targets,
        &s1,
        &gy,
        chunks,
        Some(gh.view_mut()),
        &mut views,
    );
    let gsize = 2.0 * n as f64 * scale;
    assert_close("grad hidden", gh.iter(), gh0.iter(), 1e-10, gsize);
    for (k, (a, b)) in gws.iter().zip(&gw0).enumerate() {
        assert_close(
            &format!("grad weight {k}"),
            a.iter(),
            b.iter(),
            1e-10,
            gsize,
        );
    }
}

/// A parameter and a sequence of gradients for the optimiser twins.
/// A table and the gradients of a few steps.
type OptimiserCase = (Array2<f64>, Vec<ParamGrad<f64>>);

fn optimiser_case(b: &mut Bytes, sparse: bool) -> OptimiserCase {
    let rows = b.below(8) + 1;
    let width = b.below(4) + 1;
    let p = Array2::from_shape_fn((rows, width), |_| b.real(4.0));
    let steps = b.below(4) + 1;
    let grads = (0..steps)
        .map(|_| {
            if sparse && b.bool() {
                let mask = b.u8();
                let picked: Vec<usize> = (0..rows).filter(|r| mask & (1 << r) != 0).collect();
                let values = Array2::from_shape_fn((picked.len(), width), |_| b.real(10.0));
                ParamGrad::RowSparse(RowSparse {
                    n_rows: rows,
                    rows: picked,
                    values,
                })
            } else {
                ParamGrad::Dense(Array2::from_shape_fn((rows, width), |_| b.real(10.0)).into_dyn())
            }
        })
        .collect();
    (p, grads)
}

fn bits_equal<T: Real>(a: &Parameter<T>, b: &Parameter<T>) -> bool {
    a.value()
        .iter()
        .zip(b.value().iter())
        .all(|(x, y)| Real::to_f64(*x).to_bits() == Real::to_f64(*y).to_bits())
}

/// An optimiser with a naive twin of its update.
trait NaiveTwin: Optimizer<f64> {
    fn twin(&mut self, p: &mut Parameter<f64>, g: &ParamGrad<f64>) -> splitgrad::Result<()>;
}

impl NaiveTwin for LazyAdam<f64> {
    fn twin(&mut self, p: &mut Parameter<f64>, g: &ParamGrad<f64>) -> splitgrad::Result<()> {
        self.update_naive(p, g)
    }
}

impl NaiveTwin for Adam<f64> {
    fn twin(&mut self, p: &mut Parameter<f64>, g: &ParamGrad<f64>) -> splitgrad::Result<()> {
        self.update_naive(p, g)
    }
}

/// Steps two copies of the case's table through its gradients, one by
/// `fast.update`, one by `naive.update_naive`, and asserts they stay equal
/// bit for bit after every step.
fn same_updates<O: NaiveTwin>(what: &str, [fast, naive]: &mut [O; 2], case: OptimiserCase) {
    let (p, grads) = case;
    let mut fast_p = Parameter::new("t", p.clone().into_dyn());
    let mut naive_p = Parameter::new("t", p.into_dyn());
    for g in &grads {
        fast.update(&mut fast_p, g).expect("update");
        naive.twin(&mut naive_p, g).expect("update_naive");
        assert!(
            bits_equal(&fast_p, &naive_p),
            "{what}: update ≠ update_naive"
        );
    }
}

fn diff_lazy_adam(b: &mut Bytes) {
    let config = LazyAdamConfig {
        lr: [1e-3, 0.1, 1.0][b.below(3)],
        beta1: [0.9, 0.0, 0.5][b.below(3)],
        beta2: [0.999, 0.0, 0.9][b.below(3)],
        eps: [1e-8, 1e-3][b.below(2)],
    };
    let mut opts = [(); 2].map(|_| LazyAdam::new(config).expect("valid config"));
    same_updates("lazy Adam", &mut opts, optimiser_case(b, true));
    assert_eq!(opts[0].state(), opts[1].state());
}

fn diff_adam(b: &mut Bytes) {
    let config = AdamConfig {
        lr: [1e-3, 0.1, 0.0][b.below(3)],
        beta1: [0.9, 0.0][b.below(2)],
        beta2: [0.999, 0.5][b.below(2)],
        eps: [1e-8, 0.0][b.below(2)],
        weight_decay: [0.0, 1e-2][b.below(2)],
        decoupled_weight_decay: b.bool(),
    };
    let mut opts = [(); 2].map(|_| Adam::new(config).expect("valid config"));
    same_updates("Adam", &mut opts, optimiser_case(b, true));
}

/// A gradient given row by row from the bytes: each row zero, of the
/// fusion penalty's form `k·(x − c) − s` (one c and s for every such row,
/// a k per row), or written (`x·a − w`).
struct FuzzRows {
    width: usize,
    /// Per row: 0 zero, 1 the form, 2 written.
    kind: Vec<u8>,
    k: Vec<f32>,
    c: Vec<f32>,
    s: Vec<f32>,
    a: f32,
    w: Vec<f32>,
}

impl RowGradient<f32> for FuzzRows {
    fn write(&self, r: usize, x: &[f32], g: &mut [f32]) {
        assert_eq!((x.len(), g.len()), (self.width, self.width), "row {r}");
        match self.form(r) {
            RowForm::Zero => g.fill(0.0),
            RowForm::Deviation { k, c, s } => {
                for (j, (g, &x)) in g.iter_mut().zip(x).enumerate() {
                    *g = k * (x - c[j]) - s[j];
                }
            }
            RowForm::Written => {
                for ((g, &x), &w) in g.iter_mut().zip(x).zip(&self.w) {
                    *g = x * self.a - w;
                }
            }
        }
    }

    fn form(&self, r: usize) -> RowForm<'_, f32> {
        match self.kind[r] {
            0 => RowForm::Zero,
            1 => RowForm::Deviation {
                k: self.k[r],
                c: &self.c,
                s: &self.s,
            },
            _ => RowForm::Written,
        }
    }
}

/// The dense gradient of `grad` for `p` as it is now: each row written
/// from the row widened (the definition `update_by_rows` must match).
fn dense_rows(p: &Parameter<f32>, grad: &FuzzRows) -> ParamGrad<f32> {
    let x = p.widened().into_owned();
    let x = x.into_dimensionality::<ndarray::Ix2>().expect("2-D");
    let mut g = Array2::<f32>::zeros(x.dim());
    for (r, (x, mut g)) in x.rows().into_iter().zip(g.rows_mut()).enumerate() {
        let x = x.to_vec();
        let mut out = vec![0.0; x.len()];
        grad.write(r, &x, &mut out);
        g.assign(&Array1::from(out));
    }
    ParamGrad::Dense(g.into_dyn())
}

/// Adam or lazy Adam in f32 on a bf16, f16 or f32 parameter with f32 or
/// bf16 moments (at least one of the two in half precision), its stores
/// rounded stochastically or to nearest: `update` against `update_naive`
/// on dense and row-sparse gradients, and `update_by_rows` (rows of every
/// [`RowForm`]) against `update_naive` of the dense gradient, parameter
/// and state bit for bit after every step. Widths up to 80 cross the
/// fused kernels' 32-element blocks and their tails.
fn diff_half_adam(b: &mut Bytes) {
    let (dtype, state) = match b.below(5) {
        0 => (Dtype::BF16, Dtype::BF16),
        1 => (Dtype::BF16, Dtype::F32),
        2 => (Dtype::F16, Dtype::F32),
        3 => (Dtype::F16, Dtype::BF16),
        _ => (Dtype::F32, Dtype::BF16),
    };
    let rounding = if b.bool() {
        Rounding::Stochastic {
            seed: b.u16() as u64,
        }
    } else {
        Rounding::Nearest
    };
    let rows = b.below(4) + 1;
    let width = b.below(80) + 1;
    let init = Array2::from_shape_fn((rows, width), |_| b.real(4.0) as f32).into_dyn();
    let lazy = b.bool();
    let by_rows = b.bool();
    let steps = b.below(3) + 1;
    let grads: Vec<ParamGrad<f32>> = (0..steps)
        .map(|_| {
            if b.bool() {
                let mask = b.u8();
                let picked: Vec<usize> = (0..rows).filter(|r| mask & (1 << r) != 0).collect();
                let values = Array2::from_shape_fn((picked.len(), width), |_| b.real(10.0) as f32);
                ParamGrad::RowSparse(RowSparse {
                    n_rows: rows,
                    rows: picked,
                    values,
                })
            } else {
                ParamGrad::Dense(
                    Array2::from_shape_fn((rows, width), |_| b.real(10.0) as f32).into_dyn(),
                )
            }
        })
        .collect();
    let row_grad = FuzzRows {
        width,
        kind: (0..rows).map(|_| b.below(3) as u8).collect(),
        k: (0..rows).map(|_| b.real(2.0) as f32).collect(),
        c: (0..width).map(|_| b.real(4.0) as f32).collect(),
        s: (0..width).map(|_| b.real(1.0) as f32).collect(),
        a: b.real(1.0) as f32,
        w: (0..width).map(|_| b.real(1.0) as f32).collect(),
    };
    let fresh = || {
        let mut p = Parameter::new("t", init.clone());
        p.set_dtype(dtype).expect("a float dtype");
        p
    };
    let (mut fast_p, mut naive_p) = (fresh(), fresh());
    let what = format!(
        "{} {dtype} {state} {rounding:?} ({rows}, {width}){}",
        if lazy { "lazy Adam" } else { "Adam" },
        if by_rows { " by rows" } else { "" }
    );
    // The first element whose bits differ, with both values.
    let first_diff = |a: &Parameter<f32>, b: &Parameter<f32>| {
        let (a, b) = (a.widened().into_owned(), b.widened().into_owned());
        a.iter()
            .zip(b.iter())
            .enumerate()
            .find(|(_, (x, y))| x.to_bits() != y.to_bits())
            .map(|(i, (x, y))| {
                format!(
                    "element {i}: update {x:e} ({:#010x}), naive {y:e} ({:#010x})",
                    x.to_bits(),
                    y.to_bits()
                )
            })
    };
    macro_rules! run {
        ($new:expr) => {{
            let mut opts = [(); 2].map(|_| {
                let mut o = $new;
                o.set_state_dtype(state).expect("f32 or bf16 state");
                o.set_rounding(rounding);
                o
            });
            for g in &grads {
                if by_rows {
                    let dense = dense_rows(&naive_p, &row_grad);
                    opts[0]
                        .update_by_rows(&mut fast_p, &row_grad)
                        .expect("update_by_rows");
                    opts[1]
                        .update_naive(&mut naive_p, &dense)
                        .expect("update_naive");
                } else {
                    opts[0].update(&mut fast_p, g).expect("update");
                    opts[1].update_naive(&mut naive_p, g).expect("update_naive");
                }
                if let Some(d) = first_diff(&fast_p, &naive_p) {
                    let kind = match g {
                        _ if by_rows => "by rows",
                        ParamGrad::Dense(_) => "dense",
                        ParamGrad::RowSparse(_) => "row-sparse",
                    };
                    panic!("{what}, a {kind} gradient: the parameter differs, {d}");
                }
                assert!(
                    opts[0].state() == opts[1].state(),
                    "{what}: the state differs"
                );
            }
        }};
    }
    // The configuration is drawn once, for both optimisers.
    let lr = [1e-3, 0.1][b.below(2)];
    if lazy {
        let config = LazyAdamConfig {
            lr,
            ..LazyAdamConfig::default()
        };
        run!(LazyAdam::new(config).expect("valid config"));
    } else {
        let config = AdamConfig {
            lr,
            weight_decay: [0.0, 1e-2][b.below(2)],
            decoupled_weight_decay: b.bool(),
            ..AdamConfig::default()
        };
        run!(Adam::new(config).expect("valid config"));
    }
}

/// The layer's rows, (n_rows, D).
fn rows_of(sv: &SplitVocabulary<f64>) -> Array2<f64> {
    let rows = sv.rows().value().clone();
    rows.into_dimensionality::<ndarray::Ix2>().expect("2-D")
}

/// A small split vocabulary with random rows and gates, and a batch.
struct MixCase {
    sv: SplitVocabulary<f64>,
    tokens: Vec<i64>,
    languages: Vec<i64>,
    shared: Array2<f64>,
    upstream: Array2<f64>,
}

fn mix_case(b: &mut Bytes) -> Option<MixCase> {
    let (l, v, d) = (b.below(3) + 1, b.below(6) + 1, b.below(4) + 1);
    // Rows: the distinct cells picked by a bit mask over the L × V grid.
    let mask = b.u16() as usize | (b.u16() as usize) << 16;
    let (mut langs, mut toks) = (Vec::new(), Vec::new());
    for cell in 0..l * v {
        if mask & (1 << (cell % 32)) != 0 && langs.len() < 12 {
            langs.push(cell / v);
            toks.push(cell % v);
        }
    }
    if langs.is_empty() {
        return None;
    }
    let n_rows = langs.len();
    let mut sv = SplitVocabulary::<f64>::new(
        SplitIndex::new(langs, toks),
        &SplitVocabularyConfig {
            vocab_size: v,
            dim: d,
            n_languages: l,
            gate_init: 0.0,
        },
    )
    .expect("valid");
    {
        sv.rows_mut().value_mut().mapv_inplace(|_| b.real(3.0));
        sv.gate_logit_mut()
            .value_mut()
            .mapv_inplace(|_| b.real(8.0));
    }
    // Sometimes a row equal to another row of its token: a deviation of
    // exactly zero, where the norm's gradient is taken to be 0.
    let twin = (1..n_rows).find(|&j| sv.index().token_index[j] == sv.index().token_index[0]);
    if let (true, Some(j)) = (b.bool(), twin) {
        let rows = sv.rows_mut();
        let first = rows.value().index_axis(Axis(0), 0).to_owned();
        rows.value_mut().index_axis_mut(Axis(0), j).assign(&first);
    }
    let n = b.below(10);
    let tokens: Vec<i64> = (0..n).map(|_| b.below(v) as i64).collect();
    let languages: Vec<i64> = (0..n).map(|_| b.below(l) as i64).collect();
    let shared = Array2::from_shape_fn((n, d), |_| b.real(3.0));
    let upstream = Array2::from_shape_fn((n, d), |_| b.real(1.0));
    Some(MixCase {
        sv,
        tokens,
        languages,
        shared,
        upstream,
    })
}

fn diff_gated_mix(b: &mut Bytes) {
    let Some(c) = mix_case(b) else { return };
    let use_gate = b.bool();
    let sv = &c.sv;
    let mut tape = Tape::new();
    let s = tape.input(c.shared.clone().into_dyn());
    let out = sv
        .forward(&mut tape, &c.tokens, &c.languages, s, use_gate)
        .expect("valid batch");
    let loss = tape.dot_const(out, c.upstream.clone().into_dyn());
    let grads = tape.backward(loss);

    // The naive twin: token by token, from the formulas of `docs/spec.md#23-splitvocabulary`.
    let rows = rows_of(sv);
    let gate: Vec<f64> = sv.gate().to_vec();
    let (n, d) = c.shared.dim();
    let mut want = c.shared.clone();
    let mut g_shared = c.upstream.clone();
    let mut g_rows = Array2::<f64>::zeros(rows.dim());
    let mut g_logit = vec![0.0; gate.len()];
    for i in 0..n {
        let Some(r) = sv.row_of(c.languages[i] as usize, c.tokens[i] as usize) else {
            continue;
        };
        for j in 0..d {
            let (sh, x, u) = (c.shared[[i, j]], rows[[r, j]], c.upstream[[i, j]]);
            if use_gate {
                let g = gate[r];
                want[[i, j]] = (1.0 - g) * sh + g * x;
                g_shared[[i, j]] = (1.0 - g) * u;
                g_rows[[r, j]] += g * u;
                g_logit[r] += u * (x - sh) * g * (1.0 - g);
            } else {
                want[[i, j]] = x;
                g_shared[[i, j]] = 0.0;
                g_rows[[r, j]] += u;
            }
        }
    }
    let fast_out = tape.value(out).to_owned();
    assert_close("gated mix", fast_out.iter(), want.iter(), 1e-12, 3.0);
    let direct = gated_mix_forward(
        c.shared.view(),
        rows.view(),
        use_gate.then_some(gate.as_slice()),
        &c.tokens
            .iter()
            .zip(&c.languages)
            .map(|(&t, &l)| {
                sv.row_of(l as usize, t as usize)
                    .map_or(u32::MAX, |r| r as u32)
            })
            .collect::<Vec<_>>(),
    );
    assert_eq!(
        direct.into_dyn(),
        fast_out,
        "the kernel and the layer differ"
    );
    let gs = grads.input(s).expect("shared gradient");
    assert_close("grad shared", gs.iter(), g_shared.iter(), 1e-12, 3.0);
    assert_close(
        "grad rows",
        grads.dense(sv.rows()).iter(),
        g_rows.iter(),
        1e-12,
        30.0,
    );
    if use_gate {
        let gl = grads.dense(sv.gate_logit());
        assert_close("grad gate_logit", gl.iter(), g_logit.iter(), 1e-12, 30.0);
    } else {
        assert!(grads.param(sv.gate_logit()).is_none());
    }
}

fn diff_fusion_penalty(b: &mut Bytes) {
    let Some(c) = mix_case(b) else { return };
    let sv = &c.sv;
    let mut tape = Tape::new();
    let p = sv.fusion_penalty_var(&mut tape);
    let value = tape.scalar(p);
    let grads = tape.backward(p);
    assert_eq!(value.to_bits(), sv.fusion_penalty().to_bits());

    // The naive twin: centroids by token, unit deviations, and the
    // gradient (1/n)(u_i − mean of u over rows of token t_i).
    let rows = rows_of(sv);
    let tokens = &sv.index().token_index;
    let (n, d) = rows.dim();
    let centroid = |t: usize| -> Array1<f64> {
        let members: Vec<usize> = (0..n).filter(|&i| tokens[i] == t).collect();
        let mut c = Array1::zeros(d);
        for &i in &members {
            c += &rows.row(i);
        }
        c / members.len() as f64
    };
    let mut total = 0.0;
    let mut units = Array2::<f64>::zeros((n, d));
    let mut ill_conditioned = false;
    for (i, &t) in tokens.iter().enumerate() {
        let dev = &rows.row(i) - &centroid(t);
        let norm = dev.dot(&dev).sqrt();
        total += norm;
        // A deviation of a few ulps is zero or not depending on the order
        // of the centroid's sum: its unit vector is noise.
        ill_conditioned |= norm > 0.0 && norm < 1e-9;
        if norm >= 1e-9 {
            units.row_mut(i).assign(&(dev / norm));
        }
    }
    let want = total / n as f64;
    assert!(
        close(value, want, 1e-12, 3.0),
        "fusion penalty: fast {value} vs naive {want}"
    );
    let mut g = Array2::<f64>::zeros((n, d));
    for i in 0..n {
        let same: Vec<usize> = (0..n).filter(|&j| tokens[j] == tokens[i]).collect();
        let mut mean_u = Array1::<f64>::zeros(d);
        for &j in &same {
            mean_u += &units.row(j);
        }
        mean_u /= same.len() as f64;
        g.row_mut(i).assign(&((&units.row(i) - &mean_u) / n as f64));
    }
    if ill_conditioned {
        return;
    }
    let fast = grads.dense(sv.rows());
    assert_close("grad fusion rows", fast.iter(), g.iter(), 1e-9, 1.0);
}
