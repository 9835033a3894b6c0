//! How many distinct vocabularies the languages effectively use: under a
//! decision of which rows to keep, or measured on the embeddings; and each
//! split row's distance to its token's centroid.

use ndarray::{Array2, ArrayView1};

use crate::Real;
use crate::app::model::BigramModel;

/// Two embeddings of a token are the same when closer than this fraction of
/// the token's mean embedding norm: the tolerance of a fusion-mode report
/// and the default of `splitgrad sweep --tolerance`.
pub const SAME_EMBEDDING: f64 = 0.05;

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
    let rows = model.rows();
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
