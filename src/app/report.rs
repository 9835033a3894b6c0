//! What a trained split vocabulary says: which gates opened, how that
//! agrees with a planted truth or a measured score, and how many distinct
//! vocabularies the languages effectively use.

use ndarray::{Array2, ArrayView1};

use crate::Real;
use crate::app::model::BigramModel;
use crate::state::Module;

/// A gate is open when σ(gate_logit) exceeds this (σ(0), where gates start).
pub const OPEN_THRESHOLD: f64 = 0.5;

/// Precision, recall and F1 of a predicted set against the true one, both
/// given as one flag per item. Empty predictions have precision 1; an empty
/// truth has recall 1.
///
/// ```
/// use splitgrad::app::report::precision_recall_f1;
/// let (p, r, f) = precision_recall_f1(&[true, true, false, false], &[true, false, true, false]);
/// assert_eq!((p, r, f), (0.5, 0.5, 0.5));
/// ```
pub fn precision_recall_f1(predicted: &[bool], truth: &[bool]) -> (f64, f64, f64) {
    let tp = predicted
        .iter()
        .zip(truth)
        .filter(|&(&p, &t)| p && t)
        .count() as f64;
    let np = predicted.iter().filter(|&&p| p).count() as f64;
    let nt = truth.iter().filter(|&&t| t).count() as f64;
    let p = if np == 0.0 { 1.0 } else { tp / np };
    let r = if nt == 0.0 { 1.0 } else { tp / nt };
    let f = if p + r == 0.0 {
        0.0
    } else {
        2.0 * p * r / (p + r)
    };
    (p, r, f)
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
    let table = model.embeddings.parameters()[0]
        .value()
        .view()
        .into_dimensionality::<ndarray::Ix2>()
        .expect("2-D table");
    let rows = model
        .split
        .rows()
        .value()
        .view()
        .into_dimensionality::<ndarray::Ix2>()
        .expect("2-D rows");
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
    fn prf_edges() {
        assert_eq!(
            precision_recall_f1(&[false, false], &[false, false]),
            (1.0, 1.0, 1.0)
        );
        assert_eq!(
            precision_recall_f1(&[false, false], &[true, false]),
            (1.0, 0.0, 0.0)
        );
    }
}
