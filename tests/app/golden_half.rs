//! Golden cases in bf16 and f16 (`docs/spec.md#4-golden-vectors`): the layer kept in the half
//! type with activations in it, computed in f32. A half case's output is
//! the output of the f32 case on the widened values rounded once to the
//! half type, and every other result is that case's, bit for bit; the
//! arrays are stored as the format says, and bad half arrays are errors
//! naming the array.

use std::collections::BTreeMap;

use half::{bf16, f16};
use ndarray::{ArrayD, arr1, arr2};
use splitgrad::app::golden::{
    CaseDtype, Layer, evaluate_bytes, evaluate_dir, generate, generate_case,
};
use splitgrad::io::{DtypeKind, NpzReader, NpzWriter, RealDtype};
use splitgrad::{ErrorKind, Rng};

use super::golden::{bytes_of, is_input, members};

fn output_of(layer: Layer) -> &'static str {
    match layer {
        Layer::LmHead => "loss",
        _ => "out",
    }
}

fn is_result(layer: Layer, name: &str) -> bool {
    !is_input(layer, name)
}

/// Whether array `name` of `r` is stored as `dtype`'s half type.
fn is_half(r: &mut NpzReader, name: &str, dtype: CaseDtype) -> bool {
    let d = r.dtype(name).unwrap();
    match dtype {
        CaseDtype::BF16 => d.kind() == DtypeKind::UInt && d.size() == 2,
        _ => d.kind() == DtypeKind::Float && d.size() == 2,
    }
}

fn widen(bits: &ArrayD<u16>, dtype: CaseDtype) -> ArrayD<f32> {
    match dtype {
        CaseDtype::BF16 => bits.mapv(|b| bf16::from_bits(b).to_f32()),
        _ => bits.mapv(|b| f16::from_bits(b).to_f32()),
    }
}

fn narrow(x: &ArrayD<f32>, dtype: CaseDtype) -> ArrayD<u16> {
    match dtype {
        CaseDtype::BF16 => x.mapv(|v| bf16::from_f32(v).to_bits()),
        _ => x.mapv(|v| f16::from_f32(v).to_bits()),
    }
}

/// The inputs of a half case with every half array widened to float32:
/// the f32 case on the same values.
fn widened_twin(layer: Layer, case: &[u8], dtype: CaseDtype) -> Vec<u8> {
    let mut r = NpzReader::from_bytes("case", case.to_vec()).unwrap();
    let mut w = NpzWriter::new("twin.npz");
    for name in r.names().to_vec() {
        if is_result(layer, &name) {
            continue;
        }
        if is_half(&mut r, &name, dtype) {
            w.add(&name, &widen(&r.bits16(&name).unwrap(), dtype));
        } else {
            w.add(&name, &r.ints(&name).unwrap());
        }
    }
    bytes_of(&w)
}

#[test]
fn a_half_case_is_the_f32_case_on_its_widened_values_with_the_output_rounded_once() {
    for dtype in [CaseDtype::BF16, CaseDtype::F16] {
        for layer in Layer::ALL {
            for i in 0..60 {
                let case = generate_case(layer, &mut Rng::new(21).fork(i), dtype);
                let mut r = NpzReader::from_bytes("case", case.clone()).unwrap();
                let output = output_of(layer);
                for name in r.names().to_vec() {
                    let real = r.dtype(&name).unwrap().kind() == DtypeKind::Float
                        || is_half(&mut r, &name, dtype);
                    if !real {
                        continue;
                    }
                    if is_result(layer, &name) && name != output {
                        assert_eq!(
                            r.real_dtype(&name).unwrap(),
                            RealDtype::F32,
                            "{layer} {name}"
                        );
                    } else {
                        assert!(
                            is_half(&mut r, &name, dtype),
                            "{layer} {dtype}: `{name}` not in {dtype}"
                        );
                    }
                }
                let twin = widened_twin(layer, &case, dtype);
                let f32_results = evaluate_bytes(layer, "twin", twin).unwrap();
                let mut t = NpzReader::from_bytes("twin", f32_results.clone()).unwrap();
                assert_eq!(t.real_dtype(output).unwrap(), RealDtype::F32);
                let rounded = narrow(&t.reals::<f32>(output).unwrap(), dtype);
                assert_eq!(
                    r.bits16(output).unwrap(),
                    rounded,
                    "{layer} {dtype} case {i}"
                );
                let (half_m, f32_m) = (members(&case), members(&f32_results));
                for (name, bytes) in &f32_m {
                    if name != output {
                        assert!(
                            bytes == &half_m[name],
                            "{layer} {dtype} case {i}: `{name}` differs"
                        );
                    }
                }
                // and evaluating the half case's inputs gives its results again
                let inputs: BTreeMap<_, _> = half_m
                    .iter()
                    .filter(|(n, _)| !is_result(layer, n))
                    .map(|(n, b)| (n.clone(), b.clone()))
                    .collect();
                let refs: Vec<(&str, Vec<u8>)> = inputs
                    .iter()
                    .map(|(n, b)| (n.as_str(), b.clone()))
                    .collect();
                let again = members(
                    &evaluate_bytes(layer, "again", crate::io_common::npz_bytes(&refs)).unwrap(),
                );
                for (name, bytes) in &again {
                    assert!(
                        bytes == &half_m[name],
                        "{layer} {dtype} case {i}: `{name}` is not reproduced"
                    );
                }
            }
        }
    }
}

#[test]
fn half_cases_through_the_folders() {
    let dir = crate::io_common::scratch("golden-half-folders");
    for dtype in ["bf16", "f16"] {
        let dtype: CaseDtype = dtype.parse().unwrap();
        for layer in Layer::ALL {
            generate(layer, 3, 0, &dir.join(dtype.name()), dtype).unwrap();
        }
        let summary =
            evaluate_dir(&dir.join(dtype.name()), &dir.join(format!("{dtype}-out"))).unwrap();
        assert!(summary.all_ok(), "{:?}", summary.failed);
        assert_eq!(summary.ok.len(), 9);
    }
    let e = "float16".parse::<CaseDtype>().unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown dtype `float16`: expected f64, f32, bf16 or f16"
    );
}

/// A one-row embeddings case with these `weight_0` and `upstream` arrays.
fn embeddings_case(
    weight: impl FnOnce(&mut NpzWriter),
    upstream: impl FnOnce(&mut NpzWriter),
) -> Vec<u8> {
    let mut w = NpzWriter::new("hand.npz");
    w.add("split_sizes", &arr1(&[2i64]))
        .add("split_trainable", &arr1(&[1u8]))
        .add("input_ids", &arr1(&[1i64]));
    weight(&mut w);
    upstream(&mut w);
    bytes_of(&w)
}

#[test]
fn bad_half_arrays_are_errors_naming_the_array() {
    let bf = |v: f32| bf16::from_f32(v).to_bits();
    let ok_weight = |w: &mut NpzWriter| {
        w.add(
            "weight_0",
            &arr2(&[[bf(0.5), bf(1.0)], [bf(-2.0), bf(3.0)]]),
        );
    };
    let ok_up = |w: &mut NpzWriter| {
        w.add("upstream", &arr2(&[[bf(1.0), bf(2.0)]]));
    };
    let r = evaluate_bytes(
        Layer::SplitEmbeddings,
        "ok.npz",
        embeddings_case(ok_weight, ok_up),
    )
    .unwrap();
    let mut r = NpzReader::from_bytes("r", r).unwrap();
    assert_eq!(
        r.bits16("out").unwrap(),
        arr2(&[[bf(-2.0), bf(3.0)]]).into_dyn()
    );
    assert_eq!(
        r.reals::<f32>("grad_weight_0").unwrap(),
        arr2(&[[0.0f32, 0.0], [1.0, 2.0]]).into_dyn()
    );

    // NaN bits, with their position
    let nan = |w: &mut NpzWriter| {
        w.add("weight_0", &arr2(&[[bf(0.5), bf(1.0)], [bf(-2.0), 0x7FC0]]));
    };
    let e = evaluate_bytes(
        Layer::SplitEmbeddings,
        "nan.npz",
        embeddings_case(nan, ok_up),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "nan.npz: array `weight_0`: non-finite value NaN at position [1, 1]"
    );
    assert!(matches!(e.kind(), ErrorKind::NonFinite { .. }));

    // f16 infinity
    let h = |v: f32| f16::from_f32(v);
    let inf = |w: &mut NpzWriter| {
        w.add("weight_0", &arr2(&[[h(0.5), h(1.0)], [h(-2.0), h(3.0)]]));
    };
    let up_inf = |w: &mut NpzWriter| {
        w.add("upstream", &arr2(&[[h(1.0), f16::INFINITY]]));
    };
    let e = evaluate_bytes(
        Layer::SplitEmbeddings,
        "inf.npz",
        embeddings_case(inf, up_inf),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "inf.npz: array `upstream`: non-finite value inf at position [0, 1]"
    );

    // a float32 weight in a bf16 case: both arrays named
    let f32_weight = |w: &mut NpzWriter| {
        w.add("weight_0", &arr2(&[[0.5f32, 1.0], [-2.0, 3.0]]));
    };
    let e = evaluate_bytes(
        Layer::SplitEmbeddings,
        "mixed.npz",
        embeddings_case(f32_weight, ok_up),
    )
    .unwrap_err();
    assert!(
        e.to_string().starts_with(
            "mixed.npz: real arrays differ in dtype: `upstream` is uint16 (bf16 bits), `weight_0` is float32"
        ),
        "{e}"
    );

    // an anchor of no real dtype
    let int_up = |w: &mut NpzWriter| {
        w.add("upstream", &arr2(&[[1i64, 2]]));
    };
    let e = evaluate_bytes(
        Layer::SplitEmbeddings,
        "int.npz",
        embeddings_case(ok_weight, int_up),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "int.npz: array `upstream`: has dtype int64, expected float64, float32, float16, or uint16 (bf16 bits)"
    );
}
