//! The `split-vocabulary` case: [`SplitVocabulary`] with the loss
//! `Σ out ⊙ upstream + penalty_weight·penalty + fusion_weight·fusion_penalty`.

use ndarray::{Array1, ArrayD, IxDyn, arr0};

use super::case::{Case, Want};
use super::{Inputs, MAX_PAIR_CELLS, Named, random_reals};
use crate::io::SplitIndex;
use crate::layers::{SplitVocabulary, SplitVocabularyConfig};
use crate::{Error, ErrorKind, Real, Result, Rng, Tape};

/// The 0-d integer `name`, in `1..=MAX_PAIR_CELLS`.
fn count(case: &mut Case, name: &str, what: &'static str) -> Result<usize> {
    let v = case.int_scalar(name)?;
    let high = MAX_PAIR_CELLS as i64 + 1;
    if !(1..high).contains(&v) {
        return Err(case.fail(Error::out_of_range(what, vec![], v, 1, high), name));
    }
    Ok(v as usize)
}

fn to_usize(ids: &ArrayD<i64>) -> Vec<usize> {
    ids.iter().map(|&x| x as usize).collect()
}

/// Reads, validates and evaluates a case → `out`, `penalty`,
/// `fusion_penalty`, `loss`, `grad_shared`, `grad_rows`, `grad_gate_logit`.
pub(super) fn evaluate<T: Real>(case: &mut Case) -> Result<Named<T>> {
    let vocab = count(case, "vocab_size", "vocabulary size")?;
    let n_languages = count(case, "n_languages", "language count")?;
    if (vocab as u64) * (n_languages as u64) > MAX_PAIR_CELLS {
        let e = Error::config(format!(
            "n_languages · vocab_size = {n_languages} · {vocab} exceeds the limit of \
             {MAX_PAIR_CELLS} (language, token) cells"
        ));
        return Err(case.fail(e, "vocab_size"));
    }
    let languages = case.ints("language_index", Want::Vector(None))?;
    let n_rows = languages.len();
    let tokens = case.ints(
        "token_index",
        Want::Exact(&[n_rows], "the length of language_index"),
    )?;
    if n_rows == 0 {
        return Err(case.fail(Error::new(ErrorKind::Empty), "language_index"));
    }
    case.check_ids(&languages, "language_index", "language id", n_languages)?;
    case.check_ids(&tokens, "token_index", "token id", vocab)?;
    let index = SplitIndex::new(to_usize(&languages), to_usize(&tokens));
    // Lengths and ranges are checked: what is left is a duplicate pair.
    index
        .validate(n_languages, vocab)
        .map_err(|e| case.fail(e, "(language_index, token_index)"))?;

    let rows = case.reals::<T>("rows", Want::Rows(n_rows))?;
    let dim = rows.shape()[1];
    if dim == 0 {
        let e = Error::shape("rows", format!("({n_rows}, D) with D ≥ 1"), rows.shape());
        return Err(case.fail(e, "rows"));
    }
    let gate_logit = case.reals::<T>(
        "gate_logit",
        Want::Exact(&[n_rows], "one per row of the index"),
    )?;
    let token_ids = case.ints("token_ids", Want::Vector(None))?;
    let n = token_ids.len();
    let language_ids = case.ints("language_ids", Want::Exact(&[n], "the length of token_ids"))?;
    case.check_ids(&token_ids, "token_ids", "token id", vocab)?;
    case.check_ids(&language_ids, "language_ids", "language id", n_languages)?;
    let nd = [n, dim];
    let shared = case.reals::<T>("shared", Want::Exact(&nd, "N × D, D the width of rows"))?;
    let upstream = case.reals::<T>("upstream", Want::Exact(&nd, "the shape of shared"))?;
    let use_gate = case.flag("use_gate")?;
    let penalty_weight = case.real_scalar::<T>("penalty_weight")?;
    let fusion_weight = case.real_scalar::<T>("fusion_weight")?;

    let config = SplitVocabularyConfig::new(vocab, dim, n_languages);
    let mut layer =
        SplitVocabulary::<T>::new(index, &config).map_err(|e| case.fail(e, "language_index"))?;
    *layer.rows_mut().value_mut() = rows;
    *layer.gate_logit_mut().value_mut() = gate_logit;
    case.keep_in_storage(&mut layer)?;
    let token_ids: Vec<i64> = token_ids.iter().copied().collect();
    let language_ids: Vec<i64> = language_ids.iter().copied().collect();

    let mut tape = Tape::new();
    let shared = tape.input(shared);
    let out = layer
        .forward(&mut tape, &token_ids, &language_ids, shared, use_gate)
        .map_err(|e| case.fail(e, "token_ids"))?;
    let fit = tape.dot_const_view(out, upstream.view());
    let penalty = layer.penalty_var(&mut tape);
    let fusion = layer.fusion_penalty_var(&mut tape);
    let weighted_penalty = tape.scale(penalty, penalty_weight);
    let weighted_fusion = tape.scale(fusion, fusion_weight);
    let partial = tape.add(fit, weighted_penalty);
    let loss = tape.add(partial, weighted_fusion);
    let grads = tape.backward(loss);

    let scalar = |v| arr0(tape.scalar(v)).into_dyn();
    let grad_shared = grads
        .input(shared)
        .cloned()
        .unwrap_or_else(|| ArrayD::zeros(IxDyn(&nd)));
    Ok(vec![
        ("out".into(), tape.value(out).to_owned()),
        ("penalty".into(), scalar(penalty)),
        ("fusion_penalty".into(), scalar(fusion)),
        ("loss".into(), scalar(loss)),
        ("grad_shared".into(), grad_shared),
        ("grad_rows".into(), grads.dense(layer.rows())),
        ("grad_gate_logit".into(), grads.dense(layer.gate_logit())),
    ])
}

/// Adds random inputs: V in 1..=10, L in 1..=4, D in 1..=8, up to 12
/// distinct (language, token) pairs, up to 16 tokens (about half of them
/// aimed at a pair with a row), the gate on or off, random weights.
pub(super) fn random_inputs(rng: &mut Rng, w: &mut Inputs<'_>) {
    let vocab = 1 + rng.below(10) as usize;
    let n_languages = 1 + rng.below(4) as usize;
    let dim = 1 + rng.below(8) as usize;
    let mut pairs: Vec<(usize, usize)> = (0..n_languages)
        .flat_map(|l| (0..vocab).map(move |t| (l, t)))
        .collect();
    rng.shuffle(&mut pairs);
    let n_rows = 1 + rng.below(pairs.len().min(12) as u64) as usize;
    pairs.truncate(n_rows);
    let n = 1 + rng.below(16) as usize;
    let (mut language_ids, mut token_ids) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let (l, t) = if rng.below(2) == 0 {
            pairs[rng.below(n_rows as u64) as usize]
        } else {
            (
                rng.below(n_languages as u64) as usize,
                rng.below(vocab as u64) as usize,
            )
        };
        language_ids.push(l as i64);
        token_ids.push(t as i64);
    }

    let ids = |v: Vec<i64>| Array1::from(v);
    w.add_scalar("vocab_size", vocab as i64);
    w.add_scalar("n_languages", n_languages as i64);
    w.add(
        "language_index",
        &ids(pairs.iter().map(|p| p.0 as i64).collect()),
    );
    w.add(
        "token_index",
        &ids(pairs.iter().map(|p| p.1 as i64).collect()),
    );
    w.reals("rows", &random_reals(rng, &[n_rows, dim], 1.0));
    w.reals("gate_logit", &random_reals(rng, &[n_rows], 2.0));
    w.add("token_ids", &ids(token_ids));
    w.add("language_ids", &ids(language_ids));
    w.reals("shared", &random_reals(rng, &[n, dim], 1.0));
    w.reals("upstream", &random_reals(rng, &[n, dim], 1.0));
    w.add_scalar("use_gate", rng.below(2) as i64);
    w.real_scalar("penalty_weight", rng.uniform());
    w.real_scalar("fusion_weight", rng.uniform());
}
