//! What a trained split vocabulary says: which gates opened, how that
//! agrees with a planted truth or a measured score, and how many distinct
//! vocabularies the languages effectively use.

use ndarray::{Array2, ArrayView1};

use crate::Real;
use crate::app::model::BigramModel;

/// Precision, recall and F1 of a predicted set against the true one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Agreement {
    /// True positives over predictions: `None` (undefined) when nothing is
    /// predicted.
    pub precision: Option<f64>,
    /// True positives over the truth: `None` when the truth is empty.
    pub recall: Option<f64>,
    /// `2·tp / (2·tp + fp + fn)`: 0 when something was to be found and
    /// nothing right was predicted, `None` when both sets are empty.
    pub f1: Option<f64>,
    /// Predictions that are not in the truth.
    pub false_positives: usize,
}

/// [`Agreement`] of one flag per item.
///
/// ```
/// use splitgrad::app::report::agreement;
/// let a = agreement(&[true, true, false, false], &[true, false, true, false]);
/// assert_eq!((a.precision, a.recall, a.f1), (Some(0.5), Some(0.5), Some(0.5)));
/// let none = agreement(&[false, false], &[true, false]);
/// assert_eq!((none.precision, none.recall, none.f1), (None, Some(0.0), Some(0.0)));
/// ```
pub fn agreement(predicted: &[bool], truth: &[bool]) -> Agreement {
    let count = |f: &dyn Fn(bool, bool) -> bool| {
        predicted
            .iter()
            .zip(truth)
            .filter(|&(&p, &t)| f(p, t))
            .count()
    };
    let tp = count(&|p, t| p && t);
    let fp = count(&|p, t| p && !t);
    let fn_ = count(&|p, t| !p && t);
    let ratio = |a: usize, b: usize| (b > 0).then(|| a as f64 / b as f64);
    Agreement {
        precision: ratio(tp, tp + fp),
        recall: ratio(tp, tp + fn_),
        f1: ratio(2 * tp, 2 * tp + fp + fn_),
        false_positives: fp,
    }
}

/// The area under the ROC curve of `scores` for the items flagged in
/// `truth` (the probability that a random true item outscores a random
/// other one, ties counting half); `None` unless both kinds occur.
///
/// ```
/// use splitgrad::app::report::roc_auc;
/// assert_eq!(roc_auc(&[0.9, 0.8, 0.1, 0.3], &[true, true, false, false]), Some(1.0));
/// assert_eq!(roc_auc(&[0.5, 0.5], &[true, false]), Some(0.5));
/// ```
pub fn roc_auc(scores: &[f64], truth: &[bool]) -> Option<f64> {
    let pos = truth.iter().filter(|&&t| t).count();
    let neg = truth.len() - pos;
    if pos == 0 || neg == 0 || scores.len() != truth.len() {
        return None;
    }
    let r = ranks(scores);
    let sum: f64 = r
        .iter()
        .zip(truth)
        .filter(|&(_, &t)| t)
        .map(|(x, _)| x)
        .sum();
    let u = sum - (pos * (pos + 1)) as f64 / 2.0;
    Some(u / (pos * neg) as f64)
}

/// Average precision of `scores` for the items flagged in `truth`: the mean
/// over thresholds (each distinct score, highest first) of the precision at
/// that threshold, weighted by the recall it adds; `None` without a true
/// item.
///
/// ```
/// use splitgrad::app::report::average_precision;
/// assert_eq!(average_precision(&[0.9, 0.8, 0.1], &[true, false, true]), Some((1.0 + 2.0 / 3.0) / 2.0));
/// ```
pub fn average_precision(scores: &[f64], truth: &[bool]) -> Option<f64> {
    let pos = truth.iter().filter(|&&t| t).count();
    if pos == 0 || scores.len() != truth.len() {
        return None;
    }
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    let (mut tp, mut seen, mut ap) = (0usize, 0usize, 0.0);
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && scores[order[j + 1]] == scores[order[i]] {
            j += 1;
        }
        let new_tp = order[i..=j].iter().filter(|&&k| truth[k]).count();
        tp += new_tp;
        seen += j - i + 1;
        ap += (new_tp as f64 / pos as f64) * (tp as f64 / seen as f64);
        i = j + 1;
    }
    Some(ap.min(1.0))
}

/// The effective number of vocabularies under a decision of which rows to
/// keep: for each token of the index, the distinct embeddings its L
/// languages use — one per kept row, plus the shared row when some language
/// of the token has no kept row — averaged over those tokens. 1 when no row
/// is kept; L when every language of every such token keeps its own.
///
/// ```
/// use splitgrad::{app::report::vocabularies_kept, io::SplitIndex};
/// let index = SplitIndex::new(vec![0, 1, 0], vec![7, 7, 9]);
/// assert_eq!(vocabularies_kept(&index, &[false, false, false], 2), 1.0);
/// assert_eq!(vocabularies_kept(&index, &[true, true, true], 2), (2.0 + 2.0) / 2.0);
/// assert_eq!(vocabularies_kept(&index, &[true, false, false], 2), (2.0 + 1.0) / 2.0);
/// ```
pub fn vocabularies_kept(index: &crate::io::SplitIndex, kept: &[bool], n_languages: usize) -> f64 {
    let mut per_token: std::collections::BTreeMap<usize, usize> = Default::default();
    for (i, &t) in index.token_index.iter().enumerate() {
        *per_token.entry(t).or_default() += usize::from(kept[i]);
    }
    if per_token.is_empty() {
        return 1.0;
    }
    let total: usize = per_token
        .values()
        .map(|&k| k + usize::from(k < n_languages))
        .sum();
    total as f64 / per_token.len() as f64
}

/// Ranks from 1, ties given their average rank.
fn ranks(x: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let mut r = vec![0.0; x.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && x[order[j + 1]] == x[order[i]] {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            r[k] = avg;
        }
        i = j + 1;
    }
    r
}

/// Spearman's rank correlation (Pearson's on average ranks); `None` with
/// fewer than two items or a constant side.
///
/// ```
/// use splitgrad::app::report::spearman;
/// assert_eq!(spearman(&[1.0, 2.0, 3.0], &[10.0, 20.0, 15.0]), Some(0.5));
/// ```
pub fn spearman(a: &[f64], b: &[f64]) -> Option<f64> {
    if a.len() != b.len() || a.len() < 2 {
        return None;
    }
    let (ra, rb) = (ranks(a), ranks(b));
    let n = a.len() as f64;
    let (ma, mb) = (ra.iter().sum::<f64>() / n, rb.iter().sum::<f64>() / n);
    let cov: f64 = ra.iter().zip(&rb).map(|(x, y)| (x - ma) * (y - mb)).sum();
    let va: f64 = ra.iter().map(|x| (x - ma) * (x - ma)).sum();
    let vb: f64 = rb.iter().map(|y| (y - mb) * (y - mb)).sum();
    (va > 0.0 && vb > 0.0).then(|| cov / (va * vb).sqrt())
}

/// How many vocabularies the languages effectively use.
#[derive(Clone, Debug, PartialEq)]
pub struct EffectiveVocabularies {
    /// Mean over tokens with split rows of the number of distinct
    /// embeddings the L languages give the token: from 1 (all share one)
    /// to L (each language its own).
    pub mean: f64,
    /// Tokens with at least one split row.
    pub tokens: usize,
    /// `apart[a][b]`: fraction of those tokens on which languages a and b
    /// use different embeddings.
    pub apart: Array2<f64>,
}

/// Counts distinct effective embeddings per token.
///
/// The embedding language l gives token t is `shared_t + g·(row − shared_t)`
/// with the gate (`row` in fusion mode) where (l, t) has a row, `shared_t`
/// where it has none. Two embeddings are the same when their distance is
/// at most `rel_tol` times the token's mean embedding norm; the distinct
/// ones are the connected components of that relation.
pub fn effective_vocabularies<T: Real>(
    model: &BigramModel<T>,
    use_gate: bool,
    rel_tol: f64,
) -> EffectiveVocabularies {
    let cfg = model.config();
    let l = cfg.n_languages;
    let table = model.table();
    let rows = model.rows();
    let gate = model.split.gate();
    let mut tokens: Vec<usize> = model.split.index().token_index.clone();
    tokens.sort_unstable();
    tokens.dedup();
    let mut apart = Array2::<f64>::zeros((l, l));
    let mut total = 0.0;
    for &t in &tokens {
        let shared = table.row(t);
        let emb: Vec<Vec<f64>> = (0..l)
            .map(|lang| match model.split.row_of(lang, t) {
                Some(r) => {
                    let row = rows.row(r);
                    if use_gate {
                        let g = gate[r].to_f64();
                        shared
                            .iter()
                            .zip(row.iter())
                            .map(|(&s, &x)| s.to_f64() + g * (x.to_f64() - s.to_f64()))
                            .collect()
                    } else {
                        row.iter().map(|&x| x.to_f64()).collect()
                    }
                }
                None => to_f64(shared),
            })
            .collect();
        let scale = emb
            .iter()
            .map(|e| e.iter().map(|x| x * x).sum::<f64>().sqrt())
            .sum::<f64>()
            / l as f64;
        let tol = rel_tol * scale.max(f64::MIN_POSITIVE);
        // Union-find over languages.
        let mut parent: Vec<usize> = (0..l).collect();
        fn find(p: &mut [usize], mut i: usize) -> usize {
            while p[i] != i {
                p[i] = p[p[i]];
                i = p[i];
            }
            i
        }
        for a in 0..l {
            for b in a + 1..l {
                let d = emb[a]
                    .iter()
                    .zip(&emb[b])
                    .map(|(x, y)| (x - y) * (x - y))
                    .sum::<f64>()
                    .sqrt();
                if d <= tol {
                    let (ra, rb) = (find(&mut parent, a), find(&mut parent, b));
                    parent[ra] = rb;
                }
            }
        }
        let roots: Vec<usize> = (0..l).map(|i| find(&mut parent, i)).collect();
        let mut distinct = roots.clone();
        distinct.sort_unstable();
        distinct.dedup();
        total += distinct.len() as f64;
        for a in 0..l {
            for b in 0..l {
                if roots[a] != roots[b] {
                    apart[[a, b]] += 1.0;
                }
            }
        }
    }
    let n = tokens.len();
    if n > 0 {
        apart /= n as f64;
    }
    EffectiveVocabularies {
        mean: if n > 0 { total / n as f64 } else { 1.0 },
        tokens: n,
        apart,
    }
}

/// Each split row's distance to the centroid of its token's rows,
/// `‖rows_i − c(token_i)‖₂` (the terms of the fusion penalty), in f64.
pub fn centroid_distances<T: Real>(model: &BigramModel<T>) -> Vec<f64> {
    let index = model.split.index();
    let rows = model.split.rows().value();
    let d = model.config().dim;
    let mut sum: std::collections::BTreeMap<usize, (Vec<f64>, usize)> = Default::default();
    for (i, &t) in index.token_index.iter().enumerate() {
        let e = sum.entry(t).or_insert_with(|| (vec![0.0; d], 0));
        for (acc, &x) in
            e.0.iter_mut()
                .zip(rows.index_axis(ndarray::Axis(0), i).iter())
        {
            *acc += x.to_f64();
        }
        e.1 += 1;
    }
    index
        .token_index
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let (c, n) = &sum[t];
            rows.index_axis(ndarray::Axis(0), i)
                .iter()
                .zip(c)
                .map(|(&x, &c)| {
                    let dx = x.to_f64() - c / *n as f64;
                    dx * dx
                })
                .sum::<f64>()
                .sqrt()
        })
        .collect()
}

fn to_f64<T: Real>(v: ArrayView1<'_, T>) -> Vec<f64> {
    v.iter().map(|&x| x.to_f64()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_average_ties() {
        assert_eq!(ranks(&[3.0, 1.0, 3.0, 2.0]), vec![3.5, 1.0, 3.5, 2.0]);
    }

    #[test]
    fn spearman_perfect_and_constant() {
        assert_eq!(spearman(&[1.0, 2.0, 3.0], &[2.0, 4.0, 8.0]), Some(1.0));
        assert_eq!(spearman(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]), Some(-1.0));
        assert_eq!(spearman(&[1.0, 1.0], &[1.0, 2.0]), None);
    }

    #[test]
    fn agreement_edges() {
        let a = agreement(&[false, false], &[false, false]);
        assert_eq!((a.precision, a.recall, a.f1), (None, None, None));
        let a = agreement(&[true, false], &[false, false]);
        assert_eq!((a.precision, a.recall, a.f1), (Some(0.0), None, Some(0.0)));
        assert_eq!(a.false_positives, 1);
    }

    #[test]
    fn auc_and_ap_against_brute_force() {
        let scores = [0.3, 0.9, 0.3, 0.1, 0.7, 0.3];
        let truth = [true, true, false, false, true, false];
        // Pairs (positive, negative): count wins and half ties.
        let mut wins = 0.0;
        for i in 0..6 {
            for j in 0..6 {
                if truth[i] && !truth[j] {
                    wins += if scores[i] > scores[j] {
                        1.0
                    } else if scores[i] == scores[j] {
                        0.5
                    } else {
                        0.0
                    };
                }
            }
        }
        assert_eq!(roc_auc(&scores, &truth), Some(wins / 9.0));
        assert!(average_precision(&scores, &truth).unwrap() <= 1.0);
        assert_eq!(average_precision(&[1.0, 0.0], &[true, false]), Some(1.0));
        assert_eq!(roc_auc(&[1.0], &[true]), None);
    }
}
