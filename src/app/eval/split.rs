//! The held-out part of a corpus: a deterministic choice of its sequences.

use crate::app::corpus::Corpus;
use crate::error::{Error, Result};

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
        let languages: Vec<u32> = sequences
            .iter()
            .map(|r| corpus.language_ids.get(r.start).copied().unwrap_or(0))
            .collect();
        let held = heldout_sequences(&languages, fraction, seed);
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

/// Which of a corpus's sequences [`split_heldout`] holds out, given the
/// language each begins in (`languages[i]` for sequence `i`, two sequences
/// or more): `true` for a held-out one. This is the whole rule, so text can
/// be kept out of what is fitted before the corpus exists (`splitgrad
/// tokenize --train-vocab` trains its tokenizer on the other sequences).
/// The fraction must be in (0, 1) (checked by the caller); with fewer than
/// two sequences, nothing is held out (the caller cuts the one sequence).
///
/// ```
/// use splitgrad::app::eval::heldout_sequences;
/// let held = heldout_sequences(&[0, 0, 0, 0, 1, 1, 7], 0.25, 0);
/// assert_eq!(held.len(), 7);
/// // One of language 0's four, one of language 1's two, none of the one of 7.
/// assert_eq!(held[..4].iter().filter(|&&h| h).count(), 1);
/// assert_eq!(held[4..6].iter().filter(|&&h| h).count(), 1);
/// assert!(!held[6]);
/// ```
pub fn heldout_sequences(languages: &[u32], fraction: f64, seed: u64) -> Vec<bool> {
    let mut held = vec![false; languages.len()];
    if languages.len() < 2 {
        return held;
    }
    let mut by_language: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
    for (i, &l) in languages.iter().enumerate() {
        by_language.entry(l).or_default().push(i);
    }
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
        let i = (0..languages.len())
            .min_by(|&a, &b| unit_hash(seed, a as u64).total_cmp(&unit_hash(seed, b as u64)))
            .expect("two or more sequences");
        held[i] = true;
    }
    held
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
