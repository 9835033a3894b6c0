//! Parameters and optimiser state kept in bf16 or f16 (`param::Stored`),
//! through the layers, the optimisers and the checkpoints:
//!
//! - each layer on half-precision tables gives, bit for bit, the outputs
//!   and gradients of the same layer in f32 on the widened values (the
//!   math is f32; only the storage changed), through the tape and the
//!   tape-free pair;
//! - Adam and lazy Adam on half-precision parameters and state: the
//!   parallel update equals its serial twin bit for bit, on 1, 2 and 4
//!   threads, and equals the f32 update narrowed once (to nearest, or
//!   stochastically with the documented key);
//! - the stall: updates below half an ulp never move a parameter rounded
//!   to nearest, while stochastic rounding follows the f32 trajectory;
//! - state dicts and checkpoints hold BF16/F16 tensors, load back bit for
//!   bit, and refuse another dtype by name; optimiser state in bf16 resumes
//!   bit for bit.

use half::bf16;
use ndarray::{Array2, ArrayD, IxDyn, array};
use splitgrad::io::SplitIndex;
use splitgrad::kernels::half::{SrKey, narrow_nearest, narrow_stochastic};
use splitgrad::layers::{
    SplitLanguageModellingHead, SplitTokenEmbeddings, SplitVocabulary, SplitVocabularyConfig,
    Workspace,
};
use splitgrad::optim::{Adam, AdamConfig, LazyAdam, LazyAdamConfig, Optimizer};
use splitgrad::param::{Dtype, Rounding, Stored};
use splitgrad::state::Module;
use splitgrad::{ParamGrad, Parameter, Rng, RowSparse, Tape};

const HALVES: [Dtype; 2] = [Dtype::BF16, Dtype::F16];

fn bits(a: &ArrayD<f32>) -> Vec<u32> {
    a.iter().map(|x| x.to_bits()).collect()
}

fn normal(shape: &[usize], rng: &mut Rng, scale: f64) -> ArrayD<f32> {
    ArrayD::from_shape_fn(IxDyn(shape), |_| (rng.normal() * scale) as f32)
}

/// A module kept as `dtype`, and the same module in f32 on the widened
/// values.
fn pair<M: Module<f32> + Clone>(mut m: M, dtype: Dtype) -> (M, M) {
    m.set_dtype(dtype).unwrap();
    let mut wide = m.clone();
    wide.set_dtype(Dtype::F32).unwrap();
    (m, wide)
}

fn same_grads(a: &[splitgrad::layers::NamedGrad<f32>], b: &[splitgrad::layers::NamedGrad<f32>]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.name, y.name);
        assert_eq!(
            bits(&x.grad.to_dense()),
            bits(&y.grad.to_dense()),
            "{}",
            x.name
        );
    }
}

#[test]
fn embeddings_on_half_tables_are_the_f32_layer_on_the_widened_values() {
    for dtype in HALVES {
        let mut e = SplitTokenEmbeddings::<f32>::new(
            &[("orig", 40), ("prompt", 6)],
            &["orig", "prompt"],
            8,
        )
        .unwrap();
        e.reset_parameters(&mut Rng::new(1));
        let (half, wide) = pair(e, dtype);
        assert_eq!(half.parameter_bytes() * 2, wide.parameter_bytes());
        let ids = array![[0i64, 41, 41, 7], [45, 3, 0, 40]];
        let ws = Workspace::new();
        let (out_h, saved_h) = half.forward_saved(&ws, &ids).unwrap();
        let (out_w, saved_w) = wide.forward_saved(&ws, &ids).unwrap();
        assert_eq!(bits(&out_h), bits(&out_w), "{dtype}");
        let up = normal(out_h.shape(), &mut Rng::new(2), 1.0);
        let gh = half.backward_saved(&ws, &saved_h, up.view()).unwrap();
        let gw = wide.backward_saved(&ws, &saved_w, up.view()).unwrap();
        same_grads(&gh.params, &gw.params);
        // The tape: the same bits as the tape-free pair.
        let mut tape = Tape::new();
        let y = half.forward(&mut tape, &ids).unwrap();
        assert_eq!(bits(&tape.value(y).to_owned()), bits(&out_h));
    }
}

#[test]
fn split_vocabulary_on_half_rows_is_the_f32_layer_on_the_widened_values() {
    let index = SplitIndex::new(vec![0, 1, 1, 0], vec![2, 2, 4, 1]);
    let mut sv = SplitVocabulary::<f32>::new(index, &SplitVocabularyConfig::new(6, 3, 2)).unwrap();
    let mut rng = Rng::new(3);
    for p in sv.parameters_mut() {
        let v = normal(p.shape(), &mut rng, 1.0);
        *p.value_mut() = v;
    }
    for dtype in HALVES {
        let (half, wide) = pair(sv.clone(), dtype);
        let tokens = array![2i64, 2, 4, 1, 5];
        let langs = array![0i64, 1, 1, 0, 1];
        let shared = normal(&[5, 3], &mut Rng::new(4), 1.0);
        let ws = Workspace::new();
        for use_gate in [true, false] {
            let (oh, sh) = half
                .forward_saved(&ws, &tokens, &langs, shared.view(), use_gate)
                .unwrap();
            let (ow, sw) = wide
                .forward_saved(&ws, &tokens, &langs, shared.view(), use_gate)
                .unwrap();
            assert_eq!(bits(&oh), bits(&ow), "{dtype} gate {use_gate}");
            let up = normal(oh.shape(), &mut Rng::new(5), 1.0);
            let gh = half
                .backward_saved(&ws, &sh, shared.view(), up.view(), use_gate, true)
                .unwrap();
            let gw = wide
                .backward_saved(&ws, &sw, shared.view(), up.view(), use_gate, true)
                .unwrap();
            same_grads(&gh.params, &gw.params);
            assert_eq!(
                bits(gh.input.as_ref().unwrap()),
                bits(gw.input.as_ref().unwrap())
            );
        }
        let (ph, nh) = half.fusion_penalty_norms();
        let (pw, nw) = wide.fusion_penalty_norms();
        assert_eq!((ph.to_bits(), nh), (pw.to_bits(), nw));
        // Seeding from a half-precision table copies its rows exactly.
        let mut table = Parameter::new("t", normal(&[6, 3], &mut Rng::new(6), 1.0));
        table.set_dtype(dtype).unwrap();
        let mut seeded = half.clone();
        seeded.seed_from(&table).unwrap();
        let rows = seeded.rows().widened().into_owned();
        let t = table.widened().into_owned();
        for (i, &tok) in [2usize, 2, 4, 1].iter().enumerate() {
            assert_eq!(
                rows.index_axis(ndarray::Axis(0), i),
                t.index_axis(ndarray::Axis(0), tok)
            );
        }
    }
}

#[test]
fn head_on_half_weights_is_the_f32_head_on_the_widened_values() {
    let mut h =
        SplitLanguageModellingHead::<f32>::new(&[("a", 7), ("b", 5)], &["a", "b"], 4).unwrap();
    h.reset_parameters(&mut Rng::new(7));
    for dtype in HALVES {
        let (half, wide) = pair(h.clone(), dtype);
        let hidden = normal(&[6, 4], &mut Rng::new(8), 1.0);
        let labels = array![0i64, 11, -100, 7, 3, 3];
        let ws = Workspace::new();
        let (lh, sh) = half.forward_saved(hidden.view(), &labels).unwrap();
        let (lw, sw) = wide.forward_saved(hidden.view(), &labels).unwrap();
        assert_eq!(bits(&lh), bits(&lw), "{dtype}");
        let up = normal(&[6], &mut Rng::new(9), 1.0);
        let gh = half
            .backward_saved(&ws, &sh, hidden.view(), up.view(), true)
            .unwrap();
        let gw = wide
            .backward_saved(&ws, &sw, hidden.view(), up.view(), true)
            .unwrap();
        same_grads(&gh.params, &gw.params);
        assert_eq!(
            bits(gh.input.as_ref().unwrap()),
            bits(gw.input.as_ref().unwrap())
        );
    }
}

/// A (rows, width) table kept as `dtype` with random values, and a
/// row-sparse gradient of some of its rows.
fn table_and_grad(
    dtype: Dtype,
    rows: usize,
    width: usize,
    seed: u64,
) -> (Parameter<f32>, RowSparse<f32>) {
    let mut rng = Rng::new(seed);
    let mut p = Parameter::new(
        "token_embedding.orig.weight",
        normal(&[rows, width], &mut rng, 1.0),
    );
    p.set_dtype(dtype).unwrap();
    let picked: Vec<usize> = (0..rows).filter(|r| r % 3 != 1).collect();
    let values = normal(&[picked.len(), width], &mut rng, 0.1)
        .into_dimensionality()
        .unwrap();
    (
        p,
        RowSparse {
            n_rows: rows,
            rows: picked,
            values,
        },
    )
}

fn stored_bits(p: &Parameter<f32>) -> Vec<u32> {
    bits(&p.widened())
}

fn state_bits<O: Optimizer<f32>>(o: &O) -> Vec<(String, Vec<u32>)> {
    o.state_dict()
        .iter()
        .map(|(n, t)| {
            let b = match t {
                splitgrad::state::TensorData::F32(a) => a.iter().map(|x| x.to_bits()).collect(),
                splitgrad::state::TensorData::BF16(a) => {
                    a.iter().map(|x| x.to_bits() as u32).collect()
                }
                splitgrad::state::TensorData::U64(a) => a.iter().map(|&x| x as u32).collect(),
                other => panic!("unexpected {}", other.dtype()),
            };
            (n.to_string(), b)
        })
        .collect()
}

#[test]
fn half_updates_equal_their_serial_twin_on_any_number_of_threads() {
    // Wide enough for the parallel paths (PAR_MIN_ELEMS) and for rows of
    // several widening chunks.
    let (rows, width) = (300, 1100);
    for dtype in HALVES {
        for state in [Dtype::F32, Dtype::BF16] {
            for dense in [false, true] {
                let (p0, g) = table_and_grad(dtype, rows, width, 11);
                let grad = if dense {
                    ParamGrad::Dense(g.to_dense().into_dyn())
                } else {
                    ParamGrad::RowSparse(g)
                };
                let make_lazy = || {
                    let mut o = LazyAdam::new(LazyAdamConfig {
                        lr: 1e-3,
                        ..LazyAdamConfig::default()
                    })
                    .unwrap();
                    o.set_state_dtype(state).unwrap();
                    o.set_rounding(Rounding::Stochastic { seed: 5 });
                    o
                };
                let mut naive_p = p0.clone();
                let mut naive = make_lazy();
                for _ in 0..3 {
                    naive.update_naive(&mut naive_p, &grad).unwrap();
                }
                for threads in [1, 2, 4] {
                    let pool = crate::common::threads(threads);
                    let mut p = p0.clone();
                    let mut o = make_lazy();
                    pool.install(|| {
                        for _ in 0..3 {
                            o.update(&mut p, &grad).unwrap();
                        }
                    });
                    assert_eq!(p.dtype(), dtype);
                    assert_eq!(
                        stored_bits(&p),
                        stored_bits(&naive_p),
                        "{dtype} {state} dense {dense} threads {threads}"
                    );
                    assert_eq!(
                        state_bits(&o),
                        state_bits(&naive),
                        "{dtype} {state} dense {dense}"
                    );
                }
                // Dense Adam too.
                let make_adam = || {
                    let mut o = Adam::new(AdamConfig {
                        lr: 1e-3,
                        weight_decay: 0.01,
                        ..AdamConfig::default()
                    })
                    .unwrap();
                    o.set_state_dtype(state).unwrap();
                    o
                };
                let (mut a, mut b) = (p0.clone(), p0.clone());
                let (mut oa, mut ob) = (make_adam(), make_adam());
                for _ in 0..2 {
                    oa.update(&mut a, &grad).unwrap();
                    ob.update_naive(&mut b, &grad).unwrap();
                }
                assert_eq!(stored_bits(&a), stored_bits(&b), "adam {dtype} {state}");
            }
        }
    }
}

#[test]
fn a_half_update_is_the_f32_update_narrowed_once() {
    let (p0, g) = table_and_grad(Dtype::BF16, 40, 24, 12);
    let grad = ParamGrad::RowSparse(g);
    for rounding in [Rounding::Nearest, Rounding::Stochastic { seed: 9 }] {
        let mut p = p0.clone();
        let mut o = LazyAdam::new(LazyAdamConfig {
            lr: 1e-2,
            ..LazyAdamConfig::default()
        })
        .unwrap();
        o.set_rounding(rounding);
        o.update(&mut p, &grad).unwrap();
        // The same step in f32 from the widened table, then one narrowing.
        let mut wide = Parameter::new(p0.name(), p0.widened().into_owned());
        let mut o32 = LazyAdam::new(LazyAdamConfig {
            lr: 1e-2,
            ..LazyAdamConfig::default()
        })
        .unwrap();
        o32.update(&mut wide, &grad).unwrap();
        let w = wide.value().as_slice().unwrap();
        let mut want = vec![bf16::ZERO; w.len()];
        match rounding {
            Rounding::Nearest => narrow_nearest(w, &mut want),
            Rounding::Stochastic { seed } => {
                let key = SrKey::new(seed, 1, SrKey::param_hash(p0.name()));
                narrow_stochastic(w, &mut want, key, 0);
            }
        }
        let Stored::BF16(got) = p.stored() else {
            panic!("kept as bf16")
        };
        assert_eq!(got.as_slice().unwrap(), &want[..], "{rounding:?}");
    }
}

#[test]
fn nearest_rounding_stalls_where_stochastic_rounding_follows_f32() {
    // Plain gradient steps through Adam of lr 2e-4 on values near 1: each
    // update (about lr) is below half of bf16's ulp at 1 (2^-8 = 3.9e-3).
    let n = 4096;
    let start = ArrayD::from_elem(IxDyn(&[n, 1]), 1.0f32);
    let g = ParamGrad::Dense(ArrayD::from_elem(IxDyn(&[n, 1]), 1.0f32));
    let cfg = LazyAdamConfig {
        lr: 2e-4,
        ..LazyAdamConfig::default()
    };
    let run = |dtype: Dtype, rounding: Rounding| {
        let mut p = Parameter::new("w", start.clone());
        p.set_dtype(dtype).unwrap();
        let mut o = LazyAdam::new(cfg).unwrap();
        o.set_rounding(rounding);
        for _ in 0..100 {
            o.update(&mut p, &g).unwrap();
        }
        p.widened().iter().map(|&x| x as f64).sum::<f64>() / n as f64
    };
    let f32_mean = run(Dtype::F32, Rounding::Nearest);
    let nearest = run(Dtype::BF16, Rounding::Nearest);
    let stochastic = run(Dtype::BF16, Rounding::Stochastic { seed: 1 });
    assert!(
        (1.0 - f32_mean - 0.02).abs() < 1e-3,
        "f32 moved {}",
        1.0 - f32_mean
    );
    assert_eq!(nearest, 1.0, "rounding to nearest never moves");
    // The mean over 4096 independent values: within 5 standard errors of
    // a bf16 ulp below 1 (2^-9 = 1.95e-3) per value's last rounding.
    let bound = 5.0 * 1.95e-3 / (n as f64).sqrt() + 1e-4;
    assert!(
        (stochastic - f32_mean).abs() < bound,
        "stochastic {stochastic}, f32 {f32_mean}"
    );
}

#[test]
fn half_state_dicts_and_checkpoints_keep_their_dtype() {
    let dir = std::env::temp_dir().join(format!("splitgrad-half-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut e =
        SplitTokenEmbeddings::<f32>::new(&[("orig", 20), ("prompt", 4)], &["orig", "prompt"], 6)
            .unwrap();
    e.reset_parameters(&mut Rng::new(13));
    e.set_dtype(Dtype::BF16).unwrap();
    let sd = e.state_dict();
    assert!(sd.iter().all(|(_, t)| t.dtype() == "BF16"));
    let path = dir.join("e.safetensors");
    let refs: Vec<(String, splitgrad::state::TensorRef<'_>)> = e.state_refs();
    let refs: Vec<(&str, splitgrad::state::TensorRef<'_>)> = refs
        .iter()
        .map(|(n, t)| (n.as_str(), t.reborrow()))
        .collect();
    splitgrad::checkpoint::save(&path, &refs, &Default::default()).unwrap();
    let loaded = splitgrad::checkpoint::Checkpoint::open(&path).unwrap();
    let back = loaded.get("token_embedding.prompt.weight").unwrap();
    assert_eq!(back.dtype(), "BF16");
    let mut again =
        SplitTokenEmbeddings::<f32>::new(&[("orig", 20), ("prompt", 4)], &["orig", "prompt"], 6)
            .unwrap();
    again.set_dtype(Dtype::BF16).unwrap();
    let mut state = splitgrad::state::StateDict::new();
    for name in loaded.names() {
        state.insert(name.to_string(), loaded.get(name).unwrap());
    }
    again.load_state_dict(&state).unwrap();
    assert_eq!(again.state_dict(), e.state_dict());
    // An f32 layer refuses the BF16 tensors by name, and is unchanged.
    let mut f32_layer =
        SplitTokenEmbeddings::<f32>::new(&[("orig", 20), ("prompt", 4)], &["orig", "prompt"], 6)
            .unwrap();
    let before = f32_layer.state_dict();
    let err = f32_layer.load_state_dict(&state).unwrap_err().to_string();
    assert!(
        err.contains("token_embedding.orig.weight") && err.contains("BF16") && err.contains("F32"),
        "{err}"
    );
    assert_eq!(f32_layer.state_dict(), before);
    // A non-finite half value is refused with its position.
    let mut bad = state.clone();
    if let Some(splitgrad::state::TensorData::BF16(a)) =
        bad.remove("token_embedding.prompt.weight").as_mut()
    {
        a[[2, 3]] = bf16::INFINITY;
        bad.insert(
            "token_embedding.prompt.weight",
            splitgrad::state::TensorData::BF16(a.clone()),
        );
    }
    let err = again.load_state_dict(&bad).unwrap_err().to_string();
    assert!(err.contains("[2, 3]") && err.contains("inf"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bf16_optimiser_state_resumes_bit_for_bit() {
    let (p0, g) = table_and_grad(Dtype::BF16, 50, 16, 21);
    let grad = ParamGrad::RowSparse(g);
    let make = || {
        let mut o = LazyAdam::new(LazyAdamConfig {
            lr: 1e-2,
            ..LazyAdamConfig::default()
        })
        .unwrap();
        o.set_state_dtype(Dtype::BF16).unwrap();
        o.set_rounding(Rounding::Stochastic { seed: 3 });
        o
    };
    let mut straight = p0.clone();
    let mut o = make();
    for _ in 0..6 {
        o.update(&mut straight, &grad).unwrap();
    }
    let mut resumed = p0.clone();
    let mut first = make();
    for _ in 0..3 {
        first.update(&mut resumed, &grad).unwrap();
    }
    let sd = first.state_dict();
    assert!(sd.iter().any(|(_, t)| t.dtype() == "BF16"));
    let mut second = make();
    second.load_state_dict(&sd, &[&resumed]).unwrap();
    for _ in 0..3 {
        second.update(&mut resumed, &grad).unwrap();
    }
    assert_eq!(stored_bits(&resumed), stored_bits(&straight));
    assert_eq!(state_bits(&second), state_bits(&o));
    // The state takes half the bytes.
    let bytes: usize = sd
        .iter()
        .map(|(_, t)| t.shape().iter().product::<usize>() * if t.dtype() == "BF16" { 2 } else { 0 })
        .sum();
    assert_eq!(bytes, 2 * 50 * 16 * 2);
}

#[test]
fn what_half_storage_refuses() {
    let mut p = Parameter::new("w", Array2::<f32>::zeros((2, 2)).into_dyn());
    assert!(
        p.set_dtype(Dtype::F64)
            .unwrap_err()
            .to_string()
            .contains("`w`")
    );
    p.set_dtype(Dtype::F16).unwrap();
    let mut sgd = splitgrad::optim::Sgd::new(splitgrad::optim::SgdConfig::default()).unwrap();
    let err = sgd
        .update(&mut p, &ParamGrad::Dense(ArrayD::zeros(IxDyn(&[2, 2]))))
        .unwrap_err()
        .to_string();
    assert!(err.contains("Adam"), "{err}");
    let mut adam = Adam::<f32>::new(AdamConfig::default()).unwrap();
    assert!(
        adam.set_state_dtype(Dtype::F16)
            .unwrap_err()
            .to_string()
            .contains("bf16")
    );
    assert!(adam.set_state_dtype(Dtype::F64).is_err());
    assert!(sgd.set_state_dtype(Dtype::BF16).is_err());
}

#[test]
fn activations_in_the_tables_dtype_are_the_f32_ones_rounded_once() {
    use splitgrad::kernels::reduce::{dot_half, dot_slices};
    use splitgrad::param::StoredView;
    for dtype in HALVES {
        let mut e = SplitTokenEmbeddings::<f32>::new(
            &[("orig", 300), ("prompt", 20)],
            &["orig", "prompt"],
            300,
        )
        .unwrap();
        e.reset_parameters(&mut Rng::new(31));
        e.set_trainable("orig", false).unwrap();
        e.set_dtype(dtype).unwrap();
        // Enough ids for the parallel gather and coalescing.
        let z = splitgrad::rng::Zipf::new(320, 1.1);
        let mut rng = Rng::new(32);
        let ids: Vec<i64> = (0..700).map(|_| z.sample(&mut rng) as i64).collect();
        let ws = Workspace::new();
        let (out, saved) = e.forward_saved_stored(&ws, &ids).unwrap();
        let (wide, _) = e.forward_saved(&ws, &ids).unwrap();
        assert_eq!(out.dtype(), dtype);
        assert_eq!(bits(&out.widened()), bits(&wide), "{dtype}");
        // A half-precision upstream gradient: the gradient of its widened
        // values, bit for bit.
        let up = Stored::from_full(normal(&[700, 300], &mut rng, 1.0), dtype).unwrap();
        let g_half = e.backward_saved(&ws, &saved, up.view()).unwrap();
        let up_wide = up.widened().into_owned();
        let g_wide = e.backward_saved(&ws, &saved, up_wide.view()).unwrap();
        assert_eq!(g_half.params.len(), 1);
        same_grads(&g_half.params, &g_wide.params);
        // The loss summed from half-precision arrays.
        let (a, b) = match (&out, &up) {
            (Stored::BF16(a), Stored::BF16(b)) => (
                dot_half::<f32, _>(a.as_slice().unwrap(), b.as_slice().unwrap()),
                dot_slices(wide.as_slice().unwrap(), up_wide.as_slice().unwrap()),
            ),
            (Stored::F16(a), Stored::F16(b)) => (
                dot_half::<f32, _>(a.as_slice().unwrap(), b.as_slice().unwrap()),
                dot_slices(wide.as_slice().unwrap(), up_wide.as_slice().unwrap()),
            ),
            _ => panic!("half"),
        };
        assert_eq!(a.to_bits(), b.to_bits());
        // An f32 layer's forward_saved_stored is its forward_saved.
        let mut f = e.clone();
        f.set_dtype(Dtype::F32).unwrap();
        let (o32, _) = f.forward_saved_stored(&ws, &ids).unwrap();
        assert!(matches!(o32, Stored::Full(_)));
        let _ = StoredView::<f32>::from(wide.view());
    }
}

#[test]
fn layers_built_in_half_precision_never_hold_f32_tables() {
    let e = SplitTokenEmbeddings::<f32>::with_dtype(
        &[("orig", 300), ("prompt", 4)],
        &["orig", "prompt"],
        8,
        Dtype::F16,
    )
    .unwrap();
    assert!(e.parameters().iter().all(|p| p.dtype() == Dtype::F16));
    assert_eq!(e.parameter_bytes(), 304 * 8 * 2);
    // The same draws as an f32 layer narrowed afterwards.
    let mut a = e.clone();
    a.reset_parameters(&mut Rng::new(3));
    let mut b =
        SplitTokenEmbeddings::<f32>::new(&[("orig", 300), ("prompt", 4)], &["orig", "prompt"], 8)
            .unwrap();
    b.reset_parameters(&mut Rng::new(3));
    b.set_dtype(Dtype::F16).unwrap();
    assert_eq!(a.state_dict(), b.state_dict());
    let err = SplitTokenEmbeddings::<f32>::with_dtype(&[("a", 3)], &["a"], 2, Dtype::F64)
        .unwrap_err()
        .to_string();
    assert!(err.contains("f32") && err.contains("f64"), "{err}");
    let h =
        SplitLanguageModellingHead::<f32>::with_dtype(&[("a", 5)], &["a"], 4, Dtype::BF16).unwrap();
    assert_eq!(h.parameter_bytes(), 40);
}

#[test]
fn a_non_finite_half_value_far_into_a_table_is_found_at_its_position() {
    let mut e =
        SplitTokenEmbeddings::<f32>::with_dtype(&[("a", 3000)], &["a"], 7, Dtype::F16).unwrap();
    e.reset_parameters(&mut Rng::new(1));
    let mut state = e.state_dict();
    if let Some(splitgrad::state::TensorData::F16(a)) =
        state.remove("token_embedding.a.weight").as_mut()
    {
        a[[2999, 5]] = half::f16::NAN;
        a[[2999, 6]] = half::f16::INFINITY;
        state.insert(
            "token_embedding.a.weight",
            splitgrad::state::TensorData::F16(a.clone()),
        );
    } else {
        panic!("an f16 layer's state dict holds F16 tensors");
    }
    let err = e.load_state_dict(&state).unwrap_err().to_string();
    assert!(err.contains("[2999, 5]") && err.contains("NaN"), "{err}");
}
