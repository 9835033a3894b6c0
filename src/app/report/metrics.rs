//! How a decision agrees with a truth, and how two orders agree:
//! precision and recall, ROC AUC, average precision, Spearman's rank
//! correlation.

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
