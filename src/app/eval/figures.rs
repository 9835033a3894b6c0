//! What an evaluation measures: the figures of the model, of each language
//! and of each split row, and their form in a checkpoint.

use ndarray::{Array2, ArrayViewD};

use crate::error::Result;

/// Columns of the `eval.rows` tensor.
const ROW_FIELDS: usize = 7;

/// Columns of the `eval.languages` tensor.
const LANGUAGE_FIELDS: usize = 3;

/// Held-out figures of one language.
#[derive(Clone, Debug, PartialEq)]
pub struct LanguageEval {
    /// Held-out bigrams whose context is in this language.
    pub n_tokens: usize,
    /// Their mean cross-entropy under the trained model (NaN for none).
    pub ce: f64,
    /// … with every gate closed.
    pub ce_closed: f64,
}

impl LanguageEval {
    /// A row of `eval.languages`: n_tokens, ce, ce_closed.
    fn fields(&self) -> [f64; LANGUAGE_FIELDS] {
        [self.n_tokens as f64, self.ce, self.ce_closed]
    }

    /// Reads back [`Self::fields`].
    fn from_fields(f: ArrayViewD<'_, f64>) -> Self {
        LanguageEval {
            n_tokens: f[0] as usize,
            ce: f[1],
            ce_closed: f[2],
        }
    }
}

/// Held-out figures of one split row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowEval {
    /// Held-out tokens whose context is this row's pair.
    pub n_tokens: usize,
    /// `Σ_n (ce_closed_n − ce_n)` over them, in nats: the held-out loss the
    /// row saves (0 when it was never seen).
    pub gain: f64,
    /// The mean saving per token (0 when never seen).
    pub gain_per_token: f64,
    /// The standard error of that mean (∞ with fewer than two tokens).
    pub gain_se: f64,
    /// Under the hypothesis that the tokens follow the shared row's
    /// distribution q°: the mean saving per token, `−KL(q° ‖ q)` (≤ 0).
    pub null_mean: f64,
    /// … its variance per token.
    pub null_var: f64,
    /// … the largest saving of one token less the mean.
    pub null_range: f64,
}

impl RowEval {
    /// A row of `eval.rows`: n_tokens, gain, gain_per_token, gain_se,
    /// null_mean, null_var, null_range.
    fn fields(self) -> [f64; ROW_FIELDS] {
        [
            self.n_tokens as f64,
            self.gain,
            self.gain_per_token,
            self.gain_se,
            self.null_mean,
            self.null_var,
            self.null_range,
        ]
    }

    /// Reads back [`Self::fields`].
    fn from_fields(f: ArrayViewD<'_, f64>) -> Self {
        RowEval {
            n_tokens: f[0] as usize,
            gain: f[1],
            gain_per_token: f[2],
            gain_se: f[3],
            null_mean: f[4],
            null_var: f[5],
            null_range: f[6],
        }
    }
}

/// Everything [`evaluate`](super::evaluate) measures on a held-out corpus.
#[derive(Clone, Debug, PartialEq)]
pub struct HeldOut {
    /// Held-out bigrams.
    pub n_tokens: usize,
    /// Mean cross-entropy of the model.
    pub ce: f64,
    /// Mean cross-entropy with every gate closed (the shared-only model).
    pub ce_closed: f64,
    /// Per language, in language order.
    pub per_language: Vec<LanguageEval>,
    /// Per split row, in index order.
    pub rows: Vec<RowEval>,
}

impl HeldOut {
    /// The figures as checkpoint tensors: per row (n_tokens, gain,
    /// gain_per_token, gain_se, null_mean, null_var, null_range) and per
    /// language (n_tokens, ce, ce_closed).
    pub fn to_state(&self) -> (Array2<f64>, Array2<f64>) {
        let rows = Array2::from_shape_fn((self.rows.len(), ROW_FIELDS), |(i, j)| {
            self.rows[i].fields()[j]
        });
        let langs = Array2::from_shape_fn((self.per_language.len(), LANGUAGE_FIELDS), |(i, j)| {
            self.per_language[i].fields()[j]
        });
        (rows, langs)
    }

    /// The overall figures as metadata entries.
    pub fn to_metadata(&self, meta: &mut std::collections::BTreeMap<String, String>) {
        meta.insert("heldout_tokens".into(), self.n_tokens.to_string());
        meta.insert("heldout_ce".into(), self.ce.to_string());
        meta.insert("heldout_ce_closed".into(), self.ce_closed.to_string());
    }

    /// Reads back what [`HeldOut::to_state`] and [`HeldOut::to_metadata`]
    /// wrote.
    pub fn from_state(
        state: &crate::state::StateDict,
        meta: &std::collections::BTreeMap<String, String>,
        n_rows: usize,
        n_languages: usize,
    ) -> Result<HeldOut> {
        // A standard error of ∞ is stored as it is; `real` refuses it, so
        // the rows are read without the finiteness check.
        let rows = match state.get("eval.rows").and_then(|t| t.as_real::<f64>()) {
            Some(a) if a.shape() == [n_rows, ROW_FIELDS] => a.to_owned(),
            _ => {
                return Err(state.error(
                    "eval.rows",
                    crate::ErrorKind::Shape {
                        what: "tensor".into(),
                        expected: format!("({n_rows}, {ROW_FIELDS}) F64"),
                        found: state
                            .get("eval.rows")
                            .map(|t| t.shape().to_vec())
                            .unwrap_or_default(),
                    },
                ));
            }
        };
        let langs = state.real::<f64>("eval.languages", &[n_languages, LANGUAGE_FIELDS]);
        let langs = match langs {
            Ok(l) => l.to_owned(),
            // A language with no held-out token has a NaN mean.
            Err(_) => match state.get("eval.languages").and_then(|t| t.as_real::<f64>()) {
                Some(a) if a.shape() == [n_languages, LANGUAGE_FIELDS] => a.to_owned(),
                _ => return Err(state.error("eval.languages", crate::ErrorKind::Missing)),
            },
        };
        let num = |k: &str| -> Result<f64> {
            meta.get(k)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| state.error(&format!("metadata `{k}`"), crate::ErrorKind::Missing))
        };
        Ok(HeldOut {
            n_tokens: num("heldout_tokens")? as usize,
            ce: num("heldout_ce")?,
            ce_closed: num("heldout_ce_closed")?,
            per_language: langs.outer_iter().map(LanguageEval::from_fields).collect(),
            rows: rows.outer_iter().map(RowEval::from_fields).collect(),
        })
    }
}
