//! What a trained split vocabulary gives a user to take away: the
//! embedding table each language effectively sees.
//!
//! Language l sees, for token t, the shared row where (l, t) has no split
//! row, and where it has row r the mix the model uses:
//! `shared_t + g_r·(rows_r − shared_t)` with the gate, `rows_r` in fusion
//! mode. [`language_table`] builds that (V, D) table; the command line
//! writes one per language under d9d's name for a one-split embedding,
//! `token_embedding.vocab.weight`, so that d9d's `SplitTokenEmbeddings`
//! (or an `nn.Embedding`) loads it.

use ndarray::Array2;

use crate::app::model::BigramModel;
use crate::error::{Error, Result};
use crate::kernels::Real;
use crate::ops::sigmoid::sigmoid;

/// The (V, D) embedding table language `language` sees (see the module
/// docs).
///
/// Errors: a language outside the model's.
///
/// ```
/// use splitgrad::app::{export::language_table, model::{BigramModel, ModelConfig}};
/// use splitgrad::{io::SplitIndex, Rng};
/// let cfg = ModelConfig { vocab_size: 5, n_languages: 2, dim: 3, gate_init: 0.0 };
/// let mut m = BigramModel::<f32>::new(cfg, SplitIndex::new(vec![1], vec![2]))?;
/// m.reset_parameters(&mut Rng::new(0))?;
/// // Seeded rows equal their shared rows: every language sees the shared table.
/// let shared = m.shared_table().value().clone().into_dimensionality::<ndarray::Ix2>().unwrap();
/// assert_eq!(language_table(&m, 1, true)?, shared);
/// # Ok::<(), splitgrad::Error>(())
/// ```
pub fn language_table<T: Real>(
    model: &BigramModel<T>,
    language: usize,
    use_gate: bool,
) -> Result<Array2<T>> {
    let cfg = model.config();
    if language >= cfg.n_languages {
        return Err(Error::config(format!(
            "language {language} is out of range 0..{}",
            cfg.n_languages
        )));
    }
    let mut table = model.table().to_owned();
    let split = &model.split;
    let rows = model.rows();
    let logits = model.gate_logits();
    for (r, (&l, &t)) in split
        .index()
        .language_index
        .iter()
        .zip(&split.index().token_index)
        .enumerate()
    {
        if l != language {
            continue;
        }
        let mut dst = table.row_mut(t);
        let row = rows.row(r);
        if use_gate {
            let g = sigmoid(logits[[r]]);
            dst.zip_mut_with(&row, |s, &x| *s = *s + g * (x - *s));
        } else {
            dst.assign(&row);
        }
    }
    Ok(table)
}
