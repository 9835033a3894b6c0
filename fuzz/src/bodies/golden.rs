//! The `golden eval` body.

use splitgrad::Rng;
use splitgrad::app::golden::{CaseDtype, Layer, evaluate_bytes, generate_case};
use splitgrad::io::NpzReader;

use super::{Bytes, structured_npz};

/// The input arrays of a layer's golden case (everything else a generated
/// case holds is a result), a case of two splits for the split layers.
pub fn golden_input_names(layer: Layer) -> &'static [&'static str] {
    match layer {
        Layer::SplitEmbeddings => &[
            "split_sizes",
            "split_trainable",
            "weight_0",
            "weight_1",
            "input_ids",
            "upstream",
        ],
        Layer::SplitVocabulary => &[
            "vocab_size",
            "n_languages",
            "language_index",
            "token_index",
            "rows",
            "gate_logit",
            "token_ids",
            "language_ids",
            "shared",
            "upstream",
            "use_gate",
            "penalty_weight",
            "fusion_weight",
        ],
        Layer::LmHead => &[
            "split_sizes",
            "weight_0",
            "weight_1",
            "hidden",
            "labels",
            "upstream",
        ],
    }
}

/// `golden eval` on one case, in three modes chosen by the first byte's
/// top bits: a zip file as given (`PK…`), a structured npz built from the
/// input with the layer's array names (wrong dtypes, shapes and values),
/// or a valid generated case whose evaluation must reproduce its stored
/// results bit for bit. Never a panic; an `Ok` result is an npz whose
/// arrays are finite.
pub fn golden_eval(data: &[u8]) {
    let mut b = Bytes::new(data);
    let head = b.u8();
    let layer = Layer::ALL[head as usize % 3];
    let names = golden_input_names(layer);
    let rest = b.rest();
    let (bytes, generated) = if rest.starts_with(b"PK") {
        (rest.to_vec(), false)
    } else if head & 0x80 != 0 {
        (structured_npz(&mut b, names), false)
    } else {
        let seed = b.u64();
        let dtype = match (b.bool(), b.bool()) {
            (false, false) => CaseDtype::F64,
            (true, false) => CaseDtype::F32,
            (false, true) => CaseDtype::BF16,
            (true, true) => CaseDtype::F16,
        };
        (generate_case(layer, &mut Rng::new(seed), dtype), true)
    };
    let result = evaluate_bytes(layer, "fuzz-case.npz", bytes.clone());
    if generated {
        let out = result.unwrap_or_else(|e| panic!("a generated case fails: {e}"));
        let mut got = NpzReader::from_bytes("result", out).expect("results are an npz");
        let mut case = NpzReader::from_bytes("case", bytes).expect("cases are an npz");
        for name in got.names().to_vec() {
            let a = CaseDtype::read_any(&mut got, &name).expect("a real result");
            let want = CaseDtype::read_any(&mut case, &name).expect("the case stores its results");
            assert_eq!(a.shape(), want.shape(), "{name}");
            assert!(
                a.iter()
                    .zip(want.iter())
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{name} differs from the stored result"
            );
        }
    } else if let Ok(out) = result {
        let mut got = NpzReader::from_bytes("result", out).expect("results are an npz");
        for name in got.names().to_vec() {
            let half = !matches!(got.dtype(&name).map(|d| d.size()), Ok(4 | 8));
            let a = CaseDtype::read_any(&mut got, &name).expect("a real result");
            // A half-precision output may round past its type's range to ±∞.
            assert!(
                half || a.iter().all(|x| x.is_finite()),
                "{name} is not finite"
            );
            assert!(a.iter().all(|x| !x.is_nan()), "{name} is NaN");
        }
    }
}
