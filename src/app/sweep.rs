//! `splitgrad sweep`'s measure: fusion mode over several fusion weights.
//! Every (language, token) pair seen often enough gets a row, so with
//! weight 0 each language has its own vocabulary; the fusion penalty pulls
//! the rows of a token toward their centroid, and the effective number of
//! vocabularies shows how many stay apart: read off rather than chosen.

use ndarray::Array2;

use crate::app::data::{Data, index_from_counts};
use crate::app::eval::heldout_ce;
use crate::app::report::effective_vocabularies;
use crate::app::train::Trainer;
use crate::error::{Error, Result};
use crate::io::SplitIndex;

/// What one fusion weight gives.
#[derive(Clone, Debug, PartialEq)]
pub struct FusionPoint {
    /// The weight of the fusion penalty.
    pub fusion_weight: f64,
    /// The effective number of vocabularies at the sweep's tolerance.
    pub effective_vocabularies: f64,
    /// The last step's training cross-entropy.
    pub final_ce: f64,
    /// The held-out cross-entropy.
    pub heldout_ce: f64,
    /// … of the shared-only ablation (every context on its shared row).
    pub heldout_ce_shared_only: f64,
    /// For each language, the mean over the other languages of the
    /// fraction of tokens on which the two differ (0 with one language).
    pub language_apart: Vec<f64>,
    /// [`EffectiveVocabularies::apart`](crate::app::report::EffectiveVocabularies::apart).
    pub apart: Array2<f64>,
}

/// The index of a sweep: every pair of the training part seen at least
/// `min_count` times as a context.
///
/// Errors: no such pair.
pub fn sweep_index(data: &Data, min_count: usize) -> Result<SplitIndex> {
    let index = index_from_counts(&data.corpus, min_count);
    if index.token_index.is_empty() {
        return Err(Error::config(format!(
            "no (language, token) pair is seen {min_count} times or more: lower --min-count"
        )));
    }
    Ok(index)
}

/// Measures a fusion-mode model trained with `fusion_weight` on `data`:
/// two embeddings of a token are the same when closer than `tolerance`
/// times the token's mean embedding norm.
pub fn measure(
    trainer: &Trainer<f32>,
    data: &Data,
    fusion_weight: f64,
    tolerance: f64,
) -> Result<FusionPoint> {
    let l = data.n_languages;
    let ev = effective_vocabularies(trainer.model(), false, tolerance);
    let language_apart: Vec<f64> = (0..l)
        .map(|a| {
            if l < 2 {
                0.0
            } else {
                (0..l).map(|b| ev.apart[[a, b]]).sum::<f64>() / (l - 1) as f64
            }
        })
        .collect();
    let final_ce = trainer.history().last().map_or(f64::NAN, |s| s.ce);
    let (heldout_ce, heldout_ce_shared_only) = heldout_ce(trainer.model(), &data.heldout, false)?;
    Ok(FusionPoint {
        fusion_weight,
        effective_vocabularies: ev.mean,
        final_ce,
        heldout_ce,
        heldout_ce_shared_only,
        language_apart,
        apart: ev.apart,
    })
}
