//! The `lm-head` case: [`SplitLanguageModellingHead`] with the loss
//! `Σ loss ⊙ upstream` over the per-token cross-entropy.

use ndarray::{ArrayD, Dimension, IxDyn};

use super::case::{Case, Splits, Want};
use super::{Inputs, MAX_HEAD_WORK, Named, random_reals, random_sizes};
use crate::layers::SplitLanguageModellingHead;
use crate::ops::cross_entropy::IGNORE_INDEX;
use crate::state::Module;
use crate::{Error, Real, Result, Rng, Tape};

/// Reads, validates and evaluates a case → `loss` (labels' shape),
/// `grad_hidden`, `grad_weight_<k>` for every split.
pub(super) fn evaluate<T: Real>(case: &mut Case) -> Result<Named<T>> {
    let splits = Splits::<T>::read(case, false)?;
    let vocab = splits.vocab_size();
    if vocab == 0 {
        let e = Error::config("every split has size 0: cross-entropy needs a vocabulary");
        return Err(case.fail(e, "split_sizes"));
    }
    let hidden = case.reals::<T>("hidden", Want::NotScalar)?;
    let (lead, width) = hidden.shape().split_at(hidden.ndim() - 1);
    if width != [splits.hidden] {
        let expected = format!("(…, {}), H from weight_0", splits.hidden);
        return Err(case.fail(Error::shape("hidden", expected, hidden.shape()), "hidden"));
    }
    let lead = lead.to_vec();
    let labels = case.ints("labels", Want::Exact(&lead, "hidden's shape without H"))?;
    let bad = labels
        .indexed_iter()
        .find(|&(_, &l)| l != IGNORE_INDEX && !(0..vocab as i64).contains(&l));
    if let Some((i, &l)) = bad {
        let e = Error::out_of_range("label", i.slice().to_vec(), l, 0, vocab as i64);
        return Err(case.fail(e, "labels"));
    }
    let work = (labels.len() as u64)
        .saturating_mul(vocab as u64)
        .saturating_mul(splits.hidden as u64);
    if work > MAX_HEAD_WORK {
        let e = Error::config(format!(
            "N · V · H = {work} multiply-adds exceeds the limit of {MAX_HEAD_WORK}"
        ));
        return Err(case.fail(e, "hidden"));
    }
    let upstream = case.reals::<T>("upstream", Want::Exact(&lead, "the shape of labels"))?;

    let mut layer =
        SplitLanguageModellingHead::<T>::new(&splits.sized(), &splits.names, splits.hidden)
            .map_err(|e| case.fail(e, "split_sizes"))?;
    for (p, weight) in layer.parameters_mut().iter_mut().zip(splits.weights) {
        *p.value_mut() = weight;
    }
    case.keep_in_storage(&mut layer)?;
    let mut tape = Tape::new();
    let h = tape.input(hidden);
    let loss = layer
        .forward(&mut tape, h, labels.view())
        .map_err(|e| case.fail(e, "labels"))?;
    let total = tape.dot_const_view(loss, upstream.view());
    let grads = tape.backward(total);

    let grad_hidden = grads
        .input(h)
        .cloned()
        .unwrap_or_else(|| ArrayD::zeros(IxDyn(tape.value(h).shape())));
    let mut results = vec![
        ("loss".to_string(), tape.value(loss).to_owned()),
        ("grad_hidden".to_string(), grad_hidden),
    ];
    for (k, p) in layer.parameters().iter().enumerate() {
        results.push((format!("grad_weight_{k}"), grads.dense(p)));
    }
    Ok(results)
}

/// Adds random inputs: 1 to 4 splits (sometimes one of size 0), H in
/// 1..=8, weights as `nn.Linear` initialises them, labels of rank 1 or 2
/// with about one in five −100, and in one case out of four hidden states
/// scaled by 3000 so that the logits reach the thousands.
pub(super) fn random_inputs(rng: &mut Rng, w: &mut Inputs<'_>) {
    let sizes = random_sizes(rng);
    let hidden = 1 + rng.below(8) as usize;
    let vocab: usize = sizes.iter().sum();
    let rank = 1 + rng.below(2) as usize;
    let lead: Vec<usize> = (0..rank).map(|_| 1 + rng.below(5) as usize).collect();
    let n: usize = lead.iter().product();
    let labels: Vec<i64> = (0..n)
        .map(|_| match rng.below(5) {
            0 => IGNORE_INDEX,
            _ => rng.below(vocab as u64) as i64,
        })
        .collect();
    let scale = if rng.below(4) == 0 { 3000.0 } else { 1.0 };
    let bound = 1.0 / (hidden as f64).sqrt();

    let sizes_i64: ndarray::Array1<i64> = sizes.iter().map(|&s| s as i64).collect();
    w.add("split_sizes", &sizes_i64);
    for (k, &size) in sizes.iter().enumerate() {
        let weight =
            ArrayD::from_shape_simple_fn(IxDyn(&[size, hidden]), || rng.uniform_in(-bound, bound));
        w.reals(&format!("weight_{k}"), &weight);
    }
    let mut h_shape = lead.clone();
    h_shape.push(hidden);
    w.reals("hidden", &random_reals(rng, &h_shape, scale));
    let labels = ArrayD::from_shape_vec(IxDyn(&lead), labels).expect("one label per token");
    w.add("labels", &labels);
    w.reals("upstream", &random_reals(rng, &lead, 1.0));
}
