//! The held-out pass: every token's loss under the model and with its
//! gate closed, summed per language and per row, and each row's null
//! distribution (see the module docs of [`super`]).

use ndarray::{Array2, ArrayView2, Axis};
use rayon::prelude::*;

use super::{HeldOut, LanguageEval, RowEval};
use crate::app::corpus::Corpus;
use crate::app::model::BigramModel;
use crate::error::{Error, Result};
use crate::kernels::Real;
use crate::kernels::exp::scaled_exp;
use crate::ops::fused_ce::{ChunkSizes, Targets, fused_ce_forward};
use crate::ops::sigmoid::sigmoid;

/// Tokens per parallel task of the per-token pass.
const TOKENS_PER_TASK: usize = 1 << 14;
/// Tasks evaluated at once (their per-row gains are kept until added up).
const TASKS_PER_GROUP: usize = 64;

/// Split rows per block of the null distributions (each block's logits are
/// `2 × ROWS_PER_BLOCK × V` reals).
const ROWS_PER_BLOCK: usize = 64;

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
    // Bigrams are taken by number ([`Corpus::bigram_context`]): nothing of
    // the held-out part's size is allocated here.
    let n = heldout.n_bigrams();
    if n == 0 {
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
    for (i, _) in heldout.bigrams() {
        let (t, l) = (
            heldout.token_ids.get(i) as usize,
            heldout.language_ids.get(i) as usize,
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
    let table = model.table();
    let rows = model.rows();
    let mut hidden = Array2::<T>::zeros((shared_ids.len() + row_ids.len(), d));
    for (k, &t) in shared_ids.iter().enumerate() {
        hidden.row_mut(k).assign(&table.row(t));
    }
    let gate_logit = model.gate_logits();
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
    let head_weight = model.head_weight();
    let head: Vec<ArrayView2<'_, T>> = vec![head_weight.view()];
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
    let task = |k: usize| {
        let mut p = Part {
            ce: 0.0,
            ce_closed: 0.0,
            per_language: LangSums::new(n_lang),
            with_row: Vec::new(),
        };
        for (i, j) in heldout
            .bigrams_from(k * TOKENS_PER_TASK)
            .take(TOKENS_PER_TASK)
        {
            {
                let (t, l, y) = (
                    heldout.token_ids.get(i) as usize,
                    heldout.language_ids.get(i) as usize,
                    heldout.token_ids.get(j) as usize,
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
        }
        p
    };
    let mut ce = 0.0;
    let mut ce_closed = 0.0;
    let mut lang = vec![(0usize, 0.0f64, 0.0f64); n_lang];
    let mut sums = vec![(0usize, 0.0f64, 0.0f64); n_rows];
    // Tasks run a group at a time and are added up in order, so the sums
    // do not depend on the threads and the tasks' per-row gains never
    // take more than a group's memory.
    let n_tasks = n.div_ceil(TOKENS_PER_TASK);
    for group in (0..n_tasks).step_by(TASKS_PER_GROUP) {
        let parts: Vec<Part> = (group..(group + TASKS_PER_GROUP).min(n_tasks))
            .into_par_iter()
            .map(task)
            .collect();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::model::ModelConfig;
    use crate::io::SplitIndex;
    use crate::rng::Rng;
    use crate::tape::Tape;

    /// The model's loss of each (context, language) → next token, on the
    /// tape, token by token.
    fn token_losses(model: &BigramModel<f64>, ctx: &[i64], lang: &[i64], next: &[i64]) -> Vec<f64> {
        let mut tape = Tape::no_grad();
        let s = model.embeddings.forward(&mut tape, ctx).unwrap();
        let h = model.split.forward(&mut tape, ctx, lang, s, true).unwrap();
        let l = model.head.forward(&mut tape, h, next).unwrap();
        tape.value(l).iter().copied().collect()
    }

    /// The per-token losses equal the fused head's, token by token, and a
    /// row's gain is the difference of the two models' losses.
    #[test]
    fn losses_equal_the_model_and_gains_the_one_gate_ablation() {
        let cfg = ModelConfig::new(9, 2, 4);
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
            .map(|&(i, _)| c.token_ids.get(i) as i64)
            .collect();
        let lang: Vec<i64> = bigrams
            .iter()
            .map(|&(i, _)| c.language_ids.get(i) as i64)
            .collect();
        let next: Vec<i64> = bigrams
            .iter()
            .map(|&(_, j)| c.token_ids.get(j) as i64)
            .collect();
        let per_token = |model: &BigramModel<f64>| token_losses(model, &ctx, &lang, &next);
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
            let nll = |model: &BigramModel<f64>| token_losses(model, &ctx, &lang, &next);
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
}
