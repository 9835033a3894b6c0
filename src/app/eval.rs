//! Held-out evaluation of the bigram model: the answer to "which pairs
//! needed a row of their own?" on text the model did not train on.
//!
//! [`split_heldout`] sets aside a deterministic part of a corpus, by
//! sequence. [`evaluate`] computes, on it:
//!
//! - the mean cross-entropy of the trained model, and of the same model
//!   with every gate closed (every context reads its shared row: the
//!   shared-only ablation), overall and per language;
//! - for every split row r, its **held-out gain**: what the held-out
//!   tokens whose context is r's pair lose when that one gate is closed,
//!   `d_n = ce_closed_n − ce_n`, summed (nats) and as a mean per token with
//!   its standard error. Closing one gate changes only the tokens of that
//!   context, so every row's gain comes from the two per-token losses.
//!
//! [`Rule`] decides which rows to keep, by testing each row against the
//! hypothesis that its pair needs no row: that its tokens follow the
//! shared row's distribution q° (the model with that gate closed). Under
//! that hypothesis each held-out token's saving `d(y) = ln q(y) − ln q°(y)`
//! is a draw of a known distribution — its mean `μ₀ = −KL(q° ‖ q) ≤ 0`,
//! its variance `σ₀²` and its largest value follow from the two rows of
//! logits — so the n tokens' total saving `S` exceeds `n·μ₀ + r` with
//! probability at most `exp(−(v/b²)·h(b·r/v))`, `v = n·σ₀²`,
//! `h(u) = (1 + u)·ln(1 + u) − u` (Bennett's inequality, b the largest
//! `d − μ₀`). A row is kept when
//!
//! - `S − n·μ₀ > r`, with r set so that this probability is α/n_rows
//!   (α = 5 %, Bonferroni over all rows): its tokens do not follow the
//!   shared distribution;
//! - the saving per token `S/n` exceeds [`Rule::margin`], a quarter of a
//!   nat (the row cuts its contexts' perplexity by a fifth): the row is
//!   worth having. A pair that follows its own distribution saves whole
//!   nats a token; a row that only adds capacity — it fits its token's
//!   shared distribution a little better, or the model learned to rely on
//!   the mix — saves a few hundredths, even on a corpus where the language
//!   carries no information at all;
//! - it was seen at least [`Rule::min_count`] times.
//!
//! The bound holds for any number of tokens and any shape of q°, so a
//! handful of tokens that happen to agree (a sample variance of 0) cannot
//! pass for evidence. No fixed cut-off on the gates enters: a gate that
//! closed to 0.2 after a long run still keeps its row if the row still
//! saves loss on held-out text, and a gate that opened on noise does not.
//!
//! Cost: the model's hidden state depends only on the context (l, t), so
//! the held-out tokens read at most one shared row per distinct context
//! token and one mixed row per split row they visit (never more than V +
//! n_rows, and rows no held-out token visits cost nothing). Their
//! log-sum-exp is computed once, with the fused head's kernel (no V × n
//! logits), and each token's loss is then one dot product:
//! `loss_n = (m_h − h·W_y) + ln Σ_v e^{z_hv − m_h}`. Tokens run in parallel
//! in chunks whose sums are added in a fixed order, so the figures do not
//! depend on the thread count.

use ndarray::{Array2, ArrayView2, Axis, Ix2};
use rayon::prelude::*;

use crate::app::corpus::Corpus;
use crate::app::model::BigramModel;
use crate::error::{Error, Result};
use crate::kernels::Real;
use crate::kernels::exp::scaled_exp;
use crate::ops::fused_ce::{ChunkSizes, Targets, fused_ce_forward};
use crate::ops::sigmoid::sigmoid;
use crate::state::Module;

/// Tokens per parallel task of the per-token pass.
const TOKENS_PER_TASK: usize = 1 << 14;

/// Split rows per block of the null distributions (each block's logits are
/// `2 × ROWS_PER_BLOCK × V` reals).
const ROWS_PER_BLOCK: usize = 64;

/// Columns of the `eval.rows` tensor.
const ROW_FIELDS: usize = 7;

/// Splits `corpus` into (train, held-out) by sequence, language by
/// language: of the k sequences that begin in a language, the
/// `round(fraction·k)` whose hash of (seed, sequence number) is lowest are
/// held out — at least one and at most k − 1 when k ≥ 2, none when k = 1 —
/// so every language with two sequences or more is evaluated, and the split
/// is a function of the corpus's sequences, the fraction and the seed
/// only. A corpus of one sequence is cut in two instead: its last
/// `fraction` of tokens (at least 2) is the held-out sequence.
///
/// Errors: a fraction outside (0, 1); a corpus too short to leave a bigram
/// on each side.
///
/// ```
/// use splitgrad::app::{corpus::Corpus, eval::split_heldout};
/// let mut c = Corpus::new((0..100).map(|i| i % 7).collect(), vec![0; 100]);
/// c.sequence_starts = (0..10).map(|i| i * 10).collect();
/// let (train, heldout) = split_heldout(&c, 0.2, 0)?;
/// assert_eq!((train.n_sequences(), heldout.n_sequences()), (8, 2));
/// # Ok::<(), splitgrad::Error>(())
/// ```
pub fn split_heldout(corpus: &Corpus, fraction: f64, seed: u64) -> Result<(Corpus, Corpus)> {
    if !(fraction > 0.0 && fraction < 1.0) {
        return Err(Error::config(format!(
            "the held-out fraction must be in (0, 1), got {fraction}"
        )));
    }
    let sequences: Vec<std::ops::Range<usize>> = corpus.sequences().collect();
    let mut parts: [Vec<std::ops::Range<usize>>; 2] = [Vec::new(), Vec::new()];
    if sequences.len() >= 2 {
        let mut by_language: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
        for (i, r) in sequences.iter().enumerate() {
            let l = corpus.language_ids.get(r.start).copied().unwrap_or(0);
            by_language.entry(l).or_default().push(i);
        }
        let mut held = vec![false; sequences.len()];
        for members in by_language.values() {
            let k = members.len();
            if k < 2 {
                continue;
            }
            let take = ((fraction * k as f64).round() as usize).clamp(1, k - 1);
            let mut order = members.clone();
            order.sort_by(|&a, &b| {
                unit_hash(seed, a as u64)
                    .total_cmp(&unit_hash(seed, b as u64))
                    .then(a.cmp(&b))
            });
            for &i in &order[..take] {
                held[i] = true;
            }
        }
        if !held.iter().any(|&h| h) {
            // Every language has a single sequence: hold out the one whose
            // hash is lowest.
            let i = (0..sequences.len())
                .min_by(|&a, &b| unit_hash(seed, a as u64).total_cmp(&unit_hash(seed, b as u64)))
                .expect("two or more sequences");
            held[i] = true;
        }
        for (r, &h) in sequences.into_iter().zip(&held) {
            parts[h as usize].push(r);
        }
    } else {
        let n = corpus.len();
        let cut = n - ((n as f64 * fraction).round() as usize).max(2).min(n);
        if cut < 2 {
            return Err(Error::config(format!(
                "the corpus has {n} tokens in one sequence: too few to hold out {fraction} of them and train on the rest"
            )));
        }
        parts = [
            std::iter::once(0..cut).collect(),
            std::iter::once(cut..n).collect(),
        ];
    }
    let take = |ranges: &[std::ops::Range<usize>]| {
        let mut c = corpus.clone();
        c.token_ids.clear();
        c.language_ids.clear();
        c.sequence_starts.clear();
        for r in ranges {
            c.sequence_starts.push(c.token_ids.len());
            c.token_ids.extend_from_slice(&corpus.token_ids[r.clone()]);
            c.language_ids
                .extend_from_slice(&corpus.language_ids[r.clone()]);
        }
        c
    };
    Ok((take(&parts[0]), take(&parts[1])))
}

/// A hash of (seed, i) as a real in [0, 1) (SplitMix64's finaliser).
fn unit_hash(seed: u64, i: u64) -> f64 {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(i.wrapping_add(1).wrapping_mul(0xD1B5_4A32_D192_ED03));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

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

/// Everything [`evaluate`] measures on a held-out corpus.
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
            let r = &self.rows[i];
            [
                r.n_tokens as f64,
                r.gain,
                r.gain_per_token,
                r.gain_se,
                r.null_mean,
                r.null_var,
                r.null_range,
            ][j]
        });
        let langs = Array2::from_shape_fn((self.per_language.len(), 3), |(i, j)| {
            let l = &self.per_language[i];
            [l.n_tokens as f64, l.ce, l.ce_closed][j]
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
        let langs = state.real::<f64>("eval.languages", &[n_languages, 3]);
        let langs = match langs {
            Ok(l) => l.to_owned(),
            // A language with no held-out token has a NaN mean.
            Err(_) => match state.get("eval.languages").and_then(|t| t.as_real::<f64>()) {
                Some(a) if a.shape() == [n_languages, 3] => a.to_owned(),
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
            per_language: langs
                .outer_iter()
                .map(|r| LanguageEval {
                    n_tokens: r[0] as usize,
                    ce: r[1],
                    ce_closed: r[2],
                })
                .collect(),
            rows: rows
                .outer_iter()
                .map(|r| RowEval {
                    n_tokens: r[0] as usize,
                    gain: r[1],
                    gain_per_token: r[2],
                    gain_se: r[3],
                    null_mean: r[4],
                    null_var: r[5],
                    null_range: r[6],
                })
                .collect(),
        })
    }
}

/// Evaluates `model` on the bigrams of `heldout` (see the module docs);
/// `use_gate` false is fusion mode, where a row replaces its shared row
/// (closing it means reading the shared row instead).
///
/// Errors: an id of the held-out corpus outside the model's vocabulary or
/// languages (naming its position); a corpus with no bigram.
pub fn evaluate<T: Real>(
    model: &BigramModel<T>,
    heldout: &Corpus,
    use_gate: bool,
) -> Result<HeldOut> {
    evaluate_on(model, heldout, use_gate, true)
}

/// The held-out cross-entropy of the model and of its all-gates-closed
/// ablation, `(ce, ce_closed)`, per token: [`evaluate`] without the rows'
/// null distributions (the curve points of a run need only these two).
pub fn heldout_ce<T: Real>(
    model: &BigramModel<T>,
    heldout: &Corpus,
    use_gate: bool,
) -> Result<(f64, f64)> {
    let e = evaluate_on(model, heldout, use_gate, false)?;
    Ok((e.ce, e.ce_closed))
}

/// [`evaluate`]; the rows' null distributions only `with_nulls` (zeros
/// otherwise).
fn evaluate_on<T: Real>(
    model: &BigramModel<T>,
    heldout: &Corpus,
    use_gate: bool,
    with_nulls: bool,
) -> Result<HeldOut> {
    let cfg = model.config();
    let (v, d) = (cfg.vocab_size, cfg.dim);
    heldout
        .validate(v, cfg.n_languages)
        .map_err(|e| e.in_array("held-out corpus"))?;
    let bigrams: Vec<(usize, usize)> = heldout.bigrams().collect();
    if bigrams.is_empty() {
        return Err(Error::new(crate::ErrorKind::Empty)
            .in_array("held-out corpus (no bigram within a sequence)"));
    }
    let split = &model.split;
    let n_rows = split.n_rows();

    // The distinct hidden rows the held-out tokens read: the shared row of
    // every token seen as a context, then every split row seen, as the
    // model mixes it. Rows never seen cost nothing (an index may hold
    // millions of pairs the held-out text never visits).
    let row_of = |l: usize, t: usize| split.row_of(l, t);
    let mut seen_shared = vec![false; v];
    let mut seen_row = vec![false; n_rows];
    for &(i, _) in &bigrams {
        let (t, l) = (
            heldout.token_ids[i] as usize,
            heldout.language_ids[i] as usize,
        );
        seen_shared[t] = true;
        if let Some(r) = row_of(l, t) {
            seen_row[r] = true;
        }
    }
    let shared_ids: Vec<usize> = (0..v).filter(|&t| seen_shared[t]).collect();
    let row_ids: Vec<usize> = (0..n_rows).filter(|&r| seen_row[r]).collect();
    drop((seen_shared, seen_row));
    // Slot of each hidden row: shared token t → slot_of_shared[t], split row
    // r → slot_of_row[r] (u32::MAX where unseen).
    let mut slot_of_shared = vec![u32::MAX; v];
    for (k, &t) in shared_ids.iter().enumerate() {
        slot_of_shared[t] = k as u32;
    }
    let mut slot_of_row = vec![u32::MAX; n_rows];
    for (k, &r) in row_ids.iter().enumerate() {
        slot_of_row[r] = (shared_ids.len() + k) as u32;
    }
    let table = model
        .shared_table()
        .value()
        .view()
        .into_dimensionality::<Ix2>()
        .expect("2-D table");
    let rows = split
        .rows()
        .value()
        .view()
        .into_dimensionality::<Ix2>()
        .expect("2-D rows");
    let mut hidden = Array2::<T>::zeros((shared_ids.len() + row_ids.len(), d));
    for (k, &t) in shared_ids.iter().enumerate() {
        hidden.row_mut(k).assign(&table.row(t));
    }
    let gate_logit = split.gate_logit().value();
    for (k, &r) in row_ids.iter().enumerate() {
        let t = split.index().token_index[r];
        let mut h = hidden.row_mut(shared_ids.len() + k);
        let (s, x) = (table.row(t), rows.row(r));
        if use_gate {
            let g = sigmoid(gate_logit[[r]]);
            h.iter_mut()
                .zip(s.iter().zip(x.iter()))
                .for_each(|(h, (&s, &x))| *h = s + g * (x - s));
        } else {
            h.assign(&x);
        }
    }
    let head: Vec<ArrayView2<'_, T>> = model
        .head
        .parameters()
        .into_iter()
        .map(|p| p.value().view().into_dimensionality::<Ix2>().expect("2-D"))
        .collect();
    let w = ndarray::concatenate(Axis(0), &head).expect("one width");

    // Each hidden row's log-sum-exp, once: one "token" per row.
    let m = hidden.nrows();
    let targets = Targets::grouped(vec![0; m], (0..m).collect(), m);
    let (_, stats) = fused_ce_forward(hidden.view(), &head, &targets, ChunkSizes::default());

    let loss = |h: usize, y: usize| -> f64 {
        let z = hidden.row(h).dot(&w.row(y));
        ((stats.max[h] - z) + stats.log_sum[h]).to_f64()
    };
    // Per token: (language, open loss, closed loss, row or none).
    struct Part {
        ce: f64,
        ce_closed: f64,
        per_language: LangSums,
        with_row: Vec<(usize, f64)>,
    }
    let n_lang = cfg.n_languages;
    let parts: Vec<Part> = bigrams
        .par_chunks(TOKENS_PER_TASK)
        .map(|chunk| {
            let mut p = Part {
                ce: 0.0,
                ce_closed: 0.0,
                per_language: LangSums::new(n_lang),
                with_row: Vec::new(),
            };
            for &(i, j) in chunk {
                let (t, l, y) = (
                    heldout.token_ids[i] as usize,
                    heldout.language_ids[i] as usize,
                    heldout.token_ids[j] as usize,
                );
                let closed = loss(slot_of_shared[t] as usize, y);
                let open = match row_of(l, t) {
                    Some(r) => {
                        let o = loss(slot_of_row[r] as usize, y);
                        p.with_row.push((r, closed - o));
                        o
                    }
                    None => closed,
                };
                p.ce += open;
                p.ce_closed += closed;
                p.per_language.add(l, open, closed);
            }
            p
        })
        .collect();
    let n = bigrams.len();
    let mut ce = 0.0;
    let mut ce_closed = 0.0;
    let mut lang = vec![(0usize, 0.0f64, 0.0f64); n_lang];
    let mut sums = vec![(0usize, 0.0f64, 0.0f64); n_rows];
    for p in parts {
        ce += p.ce;
        ce_closed += p.ce_closed;
        p.per_language.add_into(&mut lang);
        for (r, dn) in p.with_row {
            let s = &mut sums[r];
            s.0 += 1;
            s.1 += dn;
            s.2 += dn * dn;
        }
    }
    // The null of each row seen (a row never seen has nothing to test).
    let pairs: Vec<(usize, usize)> = row_ids
        .iter()
        .map(|&r| {
            let t = split.index().token_index[r];
            (slot_of_row[r] as usize, slot_of_shared[t] as usize)
        })
        .collect();
    let mut nulls = vec![(0.0, 0.0, 0.0); n_rows];
    if with_nulls {
        for (&r, null) in row_ids
            .iter()
            .zip(null_distributions(&hidden, &w, &stats, &pairs))
        {
            nulls[r] = null;
        }
    }
    let rows = sums
        .into_iter()
        .zip(nulls)
        .map(|((k, s, s2), (null_mean, null_var, null_range))| {
            let mean = if k > 0 { s / k as f64 } else { 0.0 };
            let se = if k >= 2 {
                let var = ((s2 - s * mean) / (k - 1) as f64).max(0.0);
                (var / k as f64).sqrt()
            } else {
                f64::INFINITY
            };
            RowEval {
                n_tokens: k,
                gain: s,
                gain_per_token: mean,
                gain_se: se,
                null_mean,
                null_var,
                null_range,
            }
        })
        .collect();
    Ok(HeldOut {
        n_tokens: n,
        ce: ce / n as f64,
        ce_closed: ce_closed / n as f64,
        per_language: lang
            .into_iter()
            .map(|(k, o, c)| LanguageEval {
                n_tokens: k,
                ce: o / k as f64,
                ce_closed: c / k as f64,
            })
            .collect(),
        rows,
    })
}

/// Per-language sums of one task: (tokens, open loss, closed loss). A
/// dense vector for a few languages; a map of the languages seen when L is
/// large (a task of 2¹⁴ tokens would otherwise carry L entries).
enum LangSums {
    Dense(Vec<(usize, f64, f64)>),
    Sparse(std::collections::BTreeMap<usize, (usize, f64, f64)>),
}

impl LangSums {
    fn new(n_languages: usize) -> Self {
        if n_languages <= 1024 {
            LangSums::Dense(vec![(0, 0.0, 0.0); n_languages])
        } else {
            LangSums::Sparse(Default::default())
        }
    }

    fn add(&mut self, l: usize, open: f64, closed: f64) {
        let e = match self {
            LangSums::Dense(v) => &mut v[l],
            LangSums::Sparse(m) => m.entry(l).or_insert((0, 0.0, 0.0)),
        };
        e.0 += 1;
        e.1 += open;
        e.2 += closed;
    }

    /// Adds these sums into `total` (one entry per language).
    fn add_into(self, total: &mut [(usize, f64, f64)]) {
        let mut add = |l: usize, b: (usize, f64, f64)| {
            let a = &mut total[l];
            a.0 += b.0;
            a.1 += b.1;
            a.2 += b.2;
        };
        match self {
            LangSums::Dense(v) => v.into_iter().enumerate().for_each(|(l, b)| add(l, b)),
            LangSums::Sparse(m) => m.into_iter().for_each(|(l, b)| add(l, b)),
        }
    }
}

/// For each (open, closed) pair of hidden rows: the mean, variance and
/// largest excess of the saving `d(y) = ln q(y) − ln q°(y)` of one token
/// drawn from q°, the closed row's distribution (q the open row's).
/// `stats` holds the log-sum-exp of every row of `hidden`.
fn null_distributions<T: Real>(
    hidden: &Array2<T>,
    w: &Array2<T>,
    stats: &crate::ops::fused_ce::RowStats<T>,
    pairs: &[(usize, usize)],
) -> Vec<(f64, f64, f64)> {
    let n_rows = pairs.len();
    let blocks: Vec<usize> = (0..n_rows).step_by(ROWS_PER_BLOCK).collect();
    blocks
        .par_iter()
        .flat_map_iter(|&r0| {
            let r1 = (r0 + ROWS_PER_BLOCK).min(n_rows);
            let open_rows: Vec<usize> = pairs[r0..r1].iter().map(|p| p.0).collect();
            let closed_rows: Vec<usize> = pairs[r0..r1].iter().map(|p| p.1).collect();
            let h_open = hidden.select(Axis(0), &open_rows);
            let h_closed = hidden.select(Axis(0), &closed_rows);
            let mut z_open = Array2::<T>::zeros((r1 - r0, w.nrows()));
            let mut z_closed = Array2::<T>::zeros((r1 - r0, w.nrows()));
            T::gemm(T::one(), h_open.view(), w.t(), T::zero(), z_open.view_mut());
            T::gemm(
                T::one(),
                h_closed.view(),
                w.t(),
                T::zero(),
                z_closed.view_mut(),
            );
            // Per pair, over the vocabulary: the closed row's log-probability
            // lc, the saving d = lo − lc, and q = exp(lc) by the vectorised
            // exp of the kernels (in the model's precision; the moments are
            // summed in f64).
            let mut q = vec![T::zero(); w.nrows()];
            (0..r1 - r0)
                .map(|i| {
                    let (ho, hc) = (open_rows[i], closed_rows[i]);
                    let shift_o = stats.max[ho] + stats.log_sum[ho];
                    let shift_c = stats.max[hc] + stats.log_sum[hc];
                    let mut zo = z_open.row_mut(i);
                    let zo = zo.as_slice_mut().expect("standard layout");
                    let zc = z_closed.row(i);
                    let zc = zc.as_slice().expect("standard layout");
                    for ((d, q), &c) in zo.iter_mut().zip(q.iter_mut()).zip(zc) {
                        let o = *d;
                        let lc = c - shift_c;
                        *d = (o - shift_o) - lc;
                        *q = lc;
                    }
                    scaled_exp(&mut q, T::zero(), T::one());
                    let (mut mean, mut sq, mut top) = (0.0, 0.0, f64::NEG_INFINITY);
                    for (&d, &q) in zo.iter().zip(q.iter()) {
                        let (d, q) = (d.to_f64(), q.to_f64());
                        mean += q * d;
                        sq += q * d * d;
                        top = top.max(d);
                    }
                    let var = (sq - mean * mean).max(0.0);
                    (mean, var, (top - mean).max(0.0))
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The decision rule: which split rows are kept (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rule {
    /// The family-wise error rate over all rows (default 0.05).
    pub alpha: f64,
    /// A row seen fewer times than this on held-out text is not kept
    /// (default 5: a standard error of fewer tokens is not worth trusting).
    pub min_count: usize,
    /// The saving per token (nats) a row must exceed (default 0.25: it
    /// must cut the perplexity of its contexts by a fifth).
    pub margin: f64,
}

impl Default for Rule {
    fn default() -> Self {
        Rule {
            alpha: 0.05,
            min_count: 5,
            margin: 0.25,
        }
    }
}

impl Rule {
    /// The radius r of Bennett's bound for a row: the excess of its
    /// tokens' total saving over the null mean that chance reaches with
    /// probability at most α / n_rows. With `v = n·σ₀²`, b the range and
    /// `L = ln(n_rows / α)`, Bennett's inequality
    /// `P(S − n·μ₀ ≥ r) ≤ exp(−(v/b²)·h(b·r/v))`, `h(u) = (1 + u)·ln(1 + u) − u`,
    /// gives `r = (v/b)·h⁻¹(L·b²/v)`; it is never looser than Bernstein's.
    pub fn radius(&self, n_rows: usize, row: &RowEval) -> f64 {
        let l = (n_rows.max(1) as f64 / self.alpha).ln();
        let v = row.n_tokens as f64 * row.null_var;
        let b = row.null_range;
        if b <= 0.0 || v <= 0.0 {
            // A degenerate null: every token saves the same (its mean), so
            // any excess at all is evidence.
            return 0.0;
        }
        let target = l * b * b / v;
        let h = |u: f64| (1.0 + u) * u.ln_1p() - u;
        // h is increasing on u ≥ 0: bisect for h(u) = target.
        let (mut lo, mut hi) = (0.0, 1.0);
        while h(hi) < target {
            hi *= 2.0;
        }
        for _ in 0..200 {
            let mid = 0.5 * (lo + hi);
            if h(mid) < target {
                lo = mid;
            } else {
                hi = mid;
            }
            if hi - lo <= 1e-12 * hi {
                break;
            }
        }
        (v / b) * hi
    }

    /// Each row's evidence against the shared distribution: its total
    /// saving's excess over the null mean, in units of the radius (> 1:
    /// significant at the family-wise level α).
    pub fn evidence(&self, rows: &[RowEval]) -> Vec<f64> {
        rows.iter()
            .map(|r| {
                let excess = r.gain - r.n_tokens as f64 * r.null_mean;
                let radius = self.radius(rows.len(), r);
                if radius > 0.0 {
                    excess / radius
                } else if excess > 0.0 {
                    f64::INFINITY
                } else {
                    0.0
                }
            })
            .collect()
    }

    /// Which rows are kept: seen at least `min_count` times, significant
    /// (evidence above 1), and saving more than `margin` nats a token.
    pub fn keep(&self, rows: &[RowEval]) -> Vec<bool> {
        rows.iter()
            .zip(self.evidence(rows))
            .map(|(r, e)| r.n_tokens >= self.min_count && e > 1.0 && r.gain_per_token > self.margin)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::model::ModelConfig;
    use crate::io::SplitIndex;
    use crate::rng::Rng;
    use crate::tape::Tape;

    #[test]
    fn split_is_deterministic_and_by_sequence() {
        let mut c = Corpus::new((0..1000).map(|i| i % 13).collect(), vec![0; 1000]);
        c.sequence_starts = (0..50).map(|i| i * 20).collect();
        let (a, b) = split_heldout(&c, 0.1, 3).unwrap();
        let (a2, b2) = split_heldout(&c, 0.1, 3).unwrap();
        assert_eq!((a, b.clone()), (a2, b2));
        assert!(b.sequence_starts.iter().all(|&s| s % 20 == 0));
        assert_eq!(b.n_sequences(), 5);
        // Stratified by language: two languages of 10 sequences each give
        // one held-out sequence each at 0.1.
        let mut two = Corpus::new(
            (0..200).map(|i| i % 13).collect(),
            (0..200).map(|i| (i / 10 % 2) as u32).collect(),
        );
        two.sequence_starts = (0..20).map(|i| i * 10).collect();
        let (_, h) = split_heldout(&two, 0.1, 9).unwrap();
        assert_eq!(h.n_sequences(), 2);
        assert_eq!(h.language_ids.iter().filter(|&&l| l == 1).count(), 10);
        // One sequence: its tail is held out.
        let one = Corpus::new((0..100).collect(), vec![0; 100]);
        let (tr, ho) = split_heldout(&one, 0.1, 0).unwrap();
        assert_eq!((tr.len(), ho.len()), (90, 10));
        assert_eq!(ho.token_ids[0], 90);
        assert!(split_heldout(&one, 0.0, 0).is_err());
        assert!(split_heldout(&Corpus::new(vec![1, 2, 3], vec![0; 3]), 0.5, 0).is_err());
    }

    /// The per-token losses equal the fused head's, token by token, and a
    /// row's gain is the difference of the two models' losses.
    #[test]
    fn losses_equal_the_model_and_gains_the_one_gate_ablation() {
        let cfg = ModelConfig {
            vocab_size: 9,
            n_languages: 2,
            dim: 4,
            gate_init: 0.0,
        };
        let index = SplitIndex::new(vec![0, 1], vec![3, 5]);
        let mut m = BigramModel::<f64>::new(cfg, index).unwrap();
        m.reset_parameters(&mut Rng::new(1)).unwrap();
        let mut rng = Rng::new(2);
        m.split
            .rows_mut()
            .value_mut()
            .mapv_inplace(|x| x + rng.normal());
        m.split
            .gate_logit_mut()
            .value_mut()
            .mapv_inplace(|_| rng.normal());
        let tokens: Vec<u32> = (0..400).map(|_| rng.below(9) as u32).collect();
        let langs: Vec<u32> = (0..400).map(|i| (i / 200) as u32).collect();
        let mut c = Corpus::new(tokens, langs);
        c.sequence_starts = vec![0, 200];
        let e = evaluate(&m, &c, true).unwrap();
        // The model's own per-token loss on the same bigrams.
        let bigrams: Vec<(usize, usize)> = c.bigrams().collect();
        let ctx: Vec<i64> = bigrams
            .iter()
            .map(|&(i, _)| c.token_ids[i] as i64)
            .collect();
        let lang: Vec<i64> = bigrams
            .iter()
            .map(|&(i, _)| c.language_ids[i] as i64)
            .collect();
        let next: Vec<i64> = bigrams
            .iter()
            .map(|&(_, j)| c.token_ids[j] as i64)
            .collect();
        let per_token = |model: &BigramModel<f64>| -> Vec<f64> {
            let mut tape = Tape::no_grad();
            let s = model.embeddings.forward(&mut tape, &ctx).unwrap();
            let h = model
                .split
                .forward(&mut tape, &ctx, &lang, s, true)
                .unwrap();
            let l = model.head.forward(&mut tape, h, &next).unwrap();
            tape.value(l).iter().copied().collect()
        };
        let open = per_token(&m);
        let mean = open.iter().sum::<f64>() / open.len() as f64;
        assert!((e.ce - mean).abs() < 1e-12, "{} vs {mean}", e.ce);
        for r in 0..2 {
            let mut closed = m.clone();
            closed.split.gate_logit_mut().value_mut()[[r]] = -1e9;
            let c_loss = per_token(&closed);
            let gain: f64 = open.iter().zip(&c_loss).map(|(o, c)| c - o).sum();
            assert!(
                (e.rows[r].gain - gain).abs() < 1e-9,
                "row {r}: {} vs {gain}",
                e.rows[r].gain
            );
            assert!(e.rows[r].n_tokens > 0);
        }
        // The null distribution of a row's saving, by brute force over every
        // target: q°(y) from the closed model, d(y) = ln q(y) − ln q°(y).
        for r in 0..2 {
            let (l, t) = (
                m.split.index().language_index[r],
                m.split.index().token_index[r],
            );
            let ctx = vec![t as i64; 9];
            let lang = vec![l as i64; 9];
            let next: Vec<i64> = (0..9).collect();
            let nll = |model: &BigramModel<f64>| -> Vec<f64> {
                let mut tape = Tape::no_grad();
                let s = model.embeddings.forward(&mut tape, &ctx).unwrap();
                let h = model
                    .split
                    .forward(&mut tape, &ctx, &lang, s, true)
                    .unwrap();
                let l = model.head.forward(&mut tape, h, &next).unwrap();
                tape.value(l).iter().copied().collect()
            };
            let mut closed = m.clone();
            closed.split.gate_logit_mut().value_mut()[[r]] = -1e9;
            let (open, shut) = (nll(&m), nll(&closed));
            let q: Vec<f64> = shut.iter().map(|x| (-x).exp()).collect();
            let d: Vec<f64> = open.iter().zip(&shut).map(|(o, c)| c - o).collect();
            let mean: f64 = q.iter().zip(&d).map(|(q, d)| q * d).sum();
            let var: f64 = q
                .iter()
                .zip(&d)
                .map(|(q, d)| q * (d - mean) * (d - mean))
                .sum();
            let top = d.iter().copied().fold(f64::NEG_INFINITY, f64::max) - mean;
            let row = &e.rows[r];
            assert!(
                (row.null_mean - mean).abs() < 1e-9,
                "{} vs {mean}",
                row.null_mean
            );
            assert!(
                (row.null_var - var).abs() < 1e-9,
                "{} vs {var}",
                row.null_var
            );
            assert!(
                (row.null_range - top).abs() < 1e-9,
                "{} vs {top}",
                row.null_range
            );
            assert!(mean <= 0.0, "the null mean is −KL ≤ 0");
        }
        let mut all_closed = m.clone();
        all_closed.split.gate_logit_mut().value_mut().fill(-1e9);
        let cl = per_token(&all_closed);
        let mean_closed = cl.iter().sum::<f64>() / cl.len() as f64;
        assert!((e.ce_closed - mean_closed).abs() < 1e-12);
        assert_eq!(
            e.per_language.iter().map(|l| l.n_tokens).sum::<usize>(),
            e.n_tokens
        );
    }

    #[test]
    fn the_rule_keeps_what_saves_beyond_noise_and_by_a_margin() {
        // (tokens, total saving, null mean, null variance, null range).
        let row = |n: usize, gain: f64, mean: f64, var: f64, range: f64| RowEval {
            n_tokens: n,
            gain,
            gain_per_token: gain / n as f64,
            gain_se: 0.0,
            null_mean: mean,
            null_var: var,
            null_range: range,
        };
        let rows = [
            // Twelve tokens that follow the row's own distribution.
            row(12, 68.0, -5.0, 4.0, 11.0),
            // Noise: a saving within what the shared distribution gives.
            row(40, 2.0, -0.01, 0.04, 0.5),
            // Too few tokens.
            row(3, 30.0, -5.0, 4.0, 11.0),
            // Significant, but a few hundredths of a nat a token.
            row(10_000, 300.0, -0.001, 0.002, 0.2),
            // Seven tokens that agree exactly: no sample variance, yet well
            // within the null.
            row(7, 1.04, -0.005, 0.03, 0.4),
        ];
        assert_eq!(
            Rule::default().keep(&rows),
            [true, false, false, false, false]
        );
        let e = Rule::default().evidence(&rows);
        assert!(e[3] > 1.0, "the large row is significant: {}", e[3]);
    }
}
