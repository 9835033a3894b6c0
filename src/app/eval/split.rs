//! The held-out part of a corpus: a deterministic choice of its sequences.

use crate::app::corpus::{Column, Corpus};
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
/// The corpus is split in place: the held-out sequences are copied out
/// and the training ones moved up over them, so the split costs the
/// held-out part's bytes, not a second corpus.
///
/// Errors: a fraction outside (0, 1); a corpus too short to leave a bigram
/// on each side.
///
/// ```
/// use splitgrad::app::{corpus::Corpus, eval::split_heldout};
/// let mut c = Corpus::new((0..100).map(|i| i % 7).collect(), vec![0; 100]);
/// c.sequence_starts = (0..10).map(|i| i * 10).collect();
/// let (train, heldout) = split_heldout(c, 0.2, 0)?;
/// assert_eq!((train.n_sequences(), heldout.n_sequences()), (8, 2));
/// # Ok::<(), splitgrad::Error>(())
/// ```
pub fn split_heldout(mut corpus: Corpus, fraction: f64, seed: u64) -> Result<(Corpus, Corpus)> {
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
            .map(|r| corpus.language_ids.try_get(r.start).unwrap_or(0))
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
    let held_len: usize = parts[1].iter().map(|r| r.len()).sum();
    let mut heldout = Corpus {
        token_ids: Column::with_width(corpus.token_ids.width(), held_len),
        language_ids: Column::with_width(corpus.language_ids.width(), held_len),
        sequence_starts: Vec::with_capacity(parts[1].len()),
        meta: corpus.meta.clone(),
    };
    for r in &parts[1] {
        heldout.sequence_starts.push(heldout.token_ids.len());
        heldout.token_ids.extend_from(&corpus.token_ids, r.clone());
        heldout
            .language_ids
            .extend_from(&corpus.language_ids, r.clone());
    }
    // The training sequences, in order, moved up over the held-out ones.
    let mut starts = Vec::with_capacity(parts[0].len());
    let mut end = 0;
    for r in &parts[0] {
        starts.push(end);
        corpus.token_ids.copy_within(r.clone(), end);
        corpus.language_ids.copy_within(r.clone(), end);
        end += r.len();
    }
    for column in [&mut corpus.token_ids, &mut corpus.language_ids] {
        column.truncate(end);
        column.shrink_to_fit();
    }
    corpus.sequence_starts = starts;
    Ok((corpus, heldout))
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

    /// The split by copying every sequence into one part or the other.
    fn split_by_copy(corpus: &Corpus, fraction: f64, seed: u64) -> (Corpus, Corpus) {
        let languages: Vec<u32> = corpus
            .sequences()
            .map(|r| corpus.language_ids.get(r.start))
            .collect();
        let held = heldout_sequences(&languages, fraction, seed);
        let mut parts = [
            Corpus::new(Vec::<u32>::new(), Vec::<u32>::new()),
            Corpus::new(Vec::<u32>::new(), Vec::<u32>::new()),
        ];
        for p in &mut parts {
            p.sequence_starts.clear();
            p.meta = corpus.meta.clone();
        }
        for (r, h) in corpus.sequences().zip(held) {
            let p = &mut parts[h as usize];
            p.sequence_starts.push(p.len());
            for i in r {
                p.token_ids.push(corpus.token_ids.get(i));
                p.language_ids.push(corpus.language_ids.get(i));
            }
        }
        let [a, b] = parts;
        (a, b)
    }

    #[test]
    fn in_place_split_equals_the_split_by_copy() {
        let mut rng = crate::rng::Rng::new(5);
        for case in 0..40u64 {
            let n = 50 + rng.below(400) as usize;
            let wide = case % 3 == 0;
            let tokens: Vec<u32> = (0..n)
                .map(|_| rng.below(if wide { 100_000 } else { 300 }) as u32)
                .collect();
            let mut starts: Vec<usize> = (1..n).filter(|_| rng.below(8) == 0).collect();
            starts.insert(0, 0);
            let langs: Vec<u32> = (0..n)
                .map(|i| (starts.partition_point(|&s| s <= i) % 3) as u32)
                .collect();
            let mut c = Corpus::new(tokens, langs);
            c.sequence_starts = starts;
            if c.n_sequences() < 2 {
                continue;
            }
            let fraction = [0.1, 0.3, 0.5][case as usize % 3];
            let want = split_by_copy(&c, fraction, case);
            let got = split_heldout(c, fraction, case).unwrap();
            assert_eq!(got, want, "case {case}");
        }
    }

    #[test]
    fn split_is_deterministic_and_by_sequence() {
        let mut c = Corpus::new((0..1000).map(|i| i % 13).collect(), vec![0; 1000]);
        c.sequence_starts = (0..50).map(|i| i * 20).collect();
        let (a, b) = split_heldout(c.clone(), 0.1, 3).unwrap();
        let (a2, b2) = split_heldout(c.clone(), 0.1, 3).unwrap();
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
        let (_, h) = split_heldout(two, 0.1, 9).unwrap();
        assert_eq!(h.n_sequences(), 2);
        assert_eq!(h.language_ids.iter().filter(|&l| l == 1).count(), 10);
        // One sequence: its tail is held out.
        let one = Corpus::new((0..100).collect(), vec![0; 100]);
        let (tr, ho) = split_heldout(one.clone(), 0.1, 0).unwrap();
        assert_eq!((tr.len(), ho.len()), (90, 10));
        assert_eq!(ho.token_ids.get(0), 90);
        assert!(split_heldout(one, 0.0, 0).is_err());
        assert!(split_heldout(Corpus::new(vec![1, 2, 3], vec![0; 3]), 0.5, 0).is_err());
    }
}
