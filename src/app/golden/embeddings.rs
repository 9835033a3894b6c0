//! The `split-embeddings` case: [`SplitTokenEmbeddings`] with the loss
//! `Σ out ⊙ upstream`.

use ndarray::Array1;

use super::case::{Case, Splits, Want};
use super::{Inputs, Named, random_ids, random_reals, random_sizes};
use crate::layers::SplitTokenEmbeddings;
use crate::state::Module;
use crate::{Real, Result, Rng, Tape};

/// Reads, validates and evaluates a case → `out`, then `grad_weight_<k>`
/// for each trainable split (dense, zeros for rows no id touched).
pub(super) fn evaluate<T: Real>(case: &mut Case) -> Result<Named<T>> {
    let splits = Splits::<T>::read(case, true)?;
    let ids = case.ints("input_ids", Want::Any)?;
    case.check_ids(&ids, "input_ids", "input id", splits.vocab_size())?;
    let mut shape = ids.shape().to_vec();
    shape.push(splits.hidden);
    let upstream = case.reals::<T>("upstream", Want::Exact(&shape, "input_ids' shape + (H,)"))?;

    let mut layer = SplitTokenEmbeddings::<T>::new(&splits.sized(), &splits.names, splits.hidden)
        .map_err(|e| case.fail(e, "split_sizes"))?;
    let tables = splits.weights.into_iter().zip(splits.trainable);
    for (p, (weight, trainable)) in layer.parameters_mut().iter_mut().zip(tables) {
        *p.value_mut() = weight;
        p.set_trainable(trainable);
    }
    case.keep_in_storage(&mut layer)?;
    let mut tape = Tape::new();
    let out = layer
        .forward(&mut tape, ids.view())
        .map_err(|e| case.fail(e, "input_ids"))?;
    let loss = tape.dot_const_view(out, upstream.view());
    let grads = tape.backward(loss);

    let mut results = vec![("out".to_string(), tape.value(out).to_owned())];
    for (k, p) in layer.parameters().iter().enumerate() {
        if p.is_trainable() {
            results.push((format!("grad_weight_{k}"), grads.dense(p)));
        }
    }
    Ok(results)
}

/// Adds random inputs: 1 to 4 splits (sometimes one of size 0), some
/// frozen, H in 1..=8, ids of rank 1 to 3 with a repeated id.
pub(super) fn random_inputs(rng: &mut Rng, w: &mut Inputs<'_>) {
    let sizes = random_sizes(rng);
    let hidden = 1 + rng.below(8) as usize;
    let trainable: Array1<u8> = sizes.iter().map(|_| u8::from(rng.below(4) != 0)).collect();
    let vocab: usize = sizes.iter().sum();
    let rank = 1 + rng.below(3) as usize;
    let shape: Vec<usize> = (0..rank).map(|_| 1 + rng.below(4) as usize).collect();
    let mut ids = random_ids(rng, &shape, vocab);
    let first = ids.iter().next().copied();
    if let (Some(first), Some(last)) = (first, ids.iter_mut().last()) {
        *last = first;
    }

    let sizes_i64: Array1<i64> = sizes.iter().map(|&s| s as i64).collect();
    w.add("split_sizes", &sizes_i64);
    w.add("split_trainable", &trainable);
    for (k, &size) in sizes.iter().enumerate() {
        w.reals(
            &format!("weight_{k}"),
            &random_reals(rng, &[size, hidden], 1.0),
        );
    }
    w.add("input_ids", &ids);
    let mut up_shape = shape;
    up_shape.push(hidden);
    w.reals("upstream", &random_reals(rng, &up_shape, 1.0));
}
