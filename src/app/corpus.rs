//! The training corpus (`docs/spec.md#61-corpus`): [`Corpus`], [`load_corpus`],
//! [`save_corpus`].

use std::ops::Range;
use std::path::Path;

use ndarray::Array1;

use crate::io::{NpzReader, NpzWriter};
use crate::{Error, ErrorKind, Result};

/// Token ids with the language of each token, cut into sequences.
///
/// The model predicts each token from the one before it; no such bigram
/// crosses a sequence start. `sequence_starts` is strictly increasing and
/// begins at 0.
///
/// ```
/// use splitgrad::app::corpus::Corpus;
/// let mut corpus = Corpus::new(vec![5, 6, 7, 8, 9], vec![0, 0, 1, 1, 1]);
/// corpus.sequence_starts = vec![0, 2];
/// assert_eq!(corpus.sequences().collect::<Vec<_>>(), [0..2, 2..5]);
/// assert_eq!(corpus.bigrams().collect::<Vec<_>>(), [(0, 1), (2, 3), (3, 4)]);
/// assert_eq!((corpus.vocab_size(), corpus.n_languages()), (10, 2));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Corpus {
    /// The tokens, `(N)`.
    pub token_ids: Vec<u32>,
    /// The language of each token, `(N)`.
    pub language_ids: Vec<u32>,
    /// Where each sequence begins: `[0, …]`, strictly increasing, each `< N`.
    pub sequence_starts: Vec<usize>,
}

impl Corpus {
    /// A corpus that is one sequence. Nothing is checked until
    /// [`validate`](Self::validate).
    pub fn new(token_ids: Vec<u32>, language_ids: Vec<u32>) -> Self {
        Corpus {
            token_ids,
            language_ids,
            sequence_starts: vec![0],
        }
    }

    /// N, the number of tokens.
    pub fn len(&self) -> usize {
        self.token_ids.len()
    }

    /// Whether there are no tokens.
    ///
    /// ```
    /// assert!(splitgrad::app::corpus::Corpus::new(vec![], vec![]).is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.token_ids.is_empty()
    }

    /// The largest token id plus one (0 for an empty corpus).
    pub fn vocab_size(&self) -> usize {
        self.token_ids.iter().max().map_or(0, |&t| t as usize + 1)
    }

    /// The largest language id plus one (0 for an empty corpus).
    pub fn n_languages(&self) -> usize {
        self.language_ids
            .iter()
            .max()
            .map_or(0, |&l| l as usize + 1)
    }

    /// The token ranges of the sequences, in order.
    pub fn sequences(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        let ends = self
            .sequence_starts
            .iter()
            .skip(1)
            .copied()
            .chain([self.len()]);
        self.sequence_starts
            .iter()
            .copied()
            .zip(ends)
            .map(|(s, e)| s..e)
    }

    /// The number of sequences.
    pub fn n_sequences(&self) -> usize {
        self.sequence_starts.len()
    }

    /// Every `(context, target)` pair of positions `(p − 1, p)` inside one
    /// sequence, in order: none crosses a sequence start.
    pub fn bigrams(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.sequences()
            .flat_map(|r| (r.start + 1..r.end).map(|p| (p - 1, p)))
    }

    /// The number of [`bigrams`](Self::bigrams): N minus the number of
    /// sequences, for a valid corpus.
    ///
    /// ```
    /// let corpus = splitgrad::app::corpus::Corpus::new(vec![1, 2, 3], vec![0, 0, 0]);
    /// assert_eq!(corpus.n_bigrams(), 2);
    /// ```
    pub fn n_bigrams(&self) -> usize {
        self.sequences().map(|r| r.len().saturating_sub(1)).sum()
    }

    /// Checks the corpus against a vocabulary of `vocab_size` and
    /// `n_languages` languages.
    ///
    /// Errors, each naming the array and the position and value at fault:
    /// [`ErrorKind::Shape`] if `language_ids` differs in length from
    /// `token_ids`; [`ErrorKind::Empty`] for no tokens;
    /// [`ErrorKind::OutOfRange`] for a token ≥ `vocab_size`, a language ≥
    /// `n_languages` or a sequence start ≥ N; [`ErrorKind::Format`] for
    /// sequence starts that do not begin at 0 or do not increase.
    ///
    /// ```
    /// use splitgrad::app::corpus::Corpus;
    /// let corpus = Corpus::new(vec![1, 40, 3], vec![0, 0, 0]);
    /// let e = corpus.validate(32, 1).unwrap_err();
    /// assert_eq!(e.to_string(), "array `token_ids`: token id 40 at position [1] is out of range 0..32");
    /// ```
    pub fn validate(&self, vocab_size: usize, n_languages: usize) -> Result<()> {
        let n = self.len();
        if self.language_ids.len() != n {
            return Err(Error::shape(
                "language_ids",
                format!("({n},), the length of token_ids"),
                &[self.language_ids.len()],
            )
            .in_array("language_ids"));
        }
        if n == 0 {
            return Err(Error::new(ErrorKind::Empty).in_array("token_ids"));
        }
        let arrays = [
            ("token_ids", "token id", &self.token_ids, vocab_size),
            (
                "language_ids",
                "language id",
                &self.language_ids,
                n_languages,
            ),
        ];
        for (array, what, ids, high) in arrays {
            if let Some(i) = ids.iter().position(|&x| x as usize >= high) {
                let high = i64::try_from(high).unwrap_or(i64::MAX);
                return Err(
                    Error::out_of_range(what, vec![i], i64::from(ids[i]), 0, high).in_array(array),
                );
            }
        }
        if self.sequence_starts.first() != Some(&0) {
            return Err(
                Error::format("the first sequence must start at 0").in_array("sequence_starts")
            );
        }
        let starts: Vec<i64> = self
            .sequence_starts
            .iter()
            .map(|&s| i64::try_from(s).unwrap_or(i64::MAX))
            .collect();
        check_starts(&starts, n)
    }
}

/// Sequence starts must be in `0..n` and strictly increasing.
fn check_starts(starts: &[i64], n: usize) -> Result<()> {
    let in_array = |e: Error| e.in_array("sequence_starts");
    for (i, &s) in starts.iter().enumerate() {
        if !usize::try_from(s).is_ok_and(|s| s < n) {
            let high = i64::try_from(n).unwrap_or(i64::MAX);
            return Err(in_array(Error::out_of_range(
                "sequence start",
                vec![i],
                s,
                0,
                high,
            )));
        }
        if i > 0 && s <= starts[i - 1] {
            return Err(in_array(Error::format(format!(
                "sequence start {s} at position [{i}] does not exceed the one before it, {}",
                starts[i - 1]
            ))));
        }
    }
    Ok(())
}

/// Reads a corpus from an `.npz` file: `token_ids` and `language_ids`,
/// 1-D integer arrays (any integer dtype) of one length, and optionally
/// `sequence_starts`, a 1-D integer array of strictly increasing offsets
/// in `[0, N)`. Without it the corpus is one sequence; if the first start
/// is not 0, 0 is prepended.
///
/// Errors (each naming the file, the array, and the position and value at
/// fault): the file unreadable or not an npz; an array missing, not 1-D
/// or not integer; lengths that differ; no tokens; a negative id or one
/// above `u32::MAX`; a sequence start out of range or not above the one
/// before it.
///
/// ```
/// # fn main() -> splitgrad::Result<()> {
/// use splitgrad::{app::corpus::load_corpus, io::NpzWriter};
/// let path = std::env::temp_dir().join(format!("splitgrad-doc-corpus-{}.npz", std::process::id()));
/// let mut w = NpzWriter::new(&path);
/// w.add("token_ids", &ndarray::arr1(&[4i64, 5, 6, 7]))
///     .add("language_ids", &ndarray::arr1(&[1u8, 1, 0, 0]))
///     .add("sequence_starts", &ndarray::arr1(&[2i64]));
/// w.finish()?;
/// let corpus = load_corpus(&path)?;
/// assert_eq!(corpus.sequence_starts, [0, 2]);
/// assert_eq!(corpus.bigrams().collect::<Vec<_>>(), [(0, 1), (2, 3)]);
/// # std::fs::remove_file(&path)?;
/// # Ok(()) }
/// ```
pub fn load_corpus(path: impl AsRef<Path>) -> Result<Corpus> {
    let path = path.as_ref();
    let mut npz = NpzReader::open(path)?;
    let tokens = npz.ints_1d("token_ids")?;
    let languages = npz.ints_1d("language_ids")?;
    let starts = if npz.contains("sequence_starts") {
        npz.ints_1d("sequence_starts")?
    } else {
        Vec::new()
    };
    let in_file = |e: Error| e.in_file(path);
    let n = tokens.len();
    if languages.len() != n {
        return Err(in_file(
            Error::shape(
                "language_ids",
                format!("({n},), the length of token_ids"),
                &[languages.len()],
            )
            .in_array("language_ids"),
        ));
    }
    if n == 0 {
        return Err(in_file(Error::new(ErrorKind::Empty).in_array("token_ids")));
    }
    let token_ids = to_u32(&tokens, "token id").map_err(|e| in_file(e.in_array("token_ids")))?;
    let language_ids =
        to_u32(&languages, "language id").map_err(|e| in_file(e.in_array("language_ids")))?;
    check_starts(&starts, n).map_err(in_file)?;
    // In range and increasing, so each is a valid usize.
    let mut sequence_starts: Vec<usize> = starts.iter().map(|&s| s as usize).collect();
    if sequence_starts.first() != Some(&0) {
        sequence_starts.insert(0, 0);
    }
    Ok(Corpus {
        token_ids,
        language_ids,
        sequence_starts,
    })
}

fn to_u32(values: &[i64], what: &'static str) -> Result<Vec<u32>> {
    values
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            u32::try_from(v).map_err(|_| Error::out_of_range(what, vec![i], v, 0, 1 << 32))
        })
        .collect()
}

/// Writes `corpus` as an `.npz` file (atomically): `token_ids`,
/// `language_ids` and `sequence_starts`, all `int64`. The corpus is
/// written as it is, valid or not.
///
/// Errors: [`ErrorKind::Io`] naming the path.
///
/// ```
/// # fn main() -> splitgrad::Result<()> {
/// use splitgrad::app::corpus::{load_corpus, save_corpus, Corpus};
/// let path = std::env::temp_dir().join(format!("splitgrad-doc-save-corpus-{}.npz", std::process::id()));
/// let corpus = Corpus::new(vec![3, 1, 2], vec![0, 1, 0]);
/// save_corpus(&path, &corpus)?;
/// assert_eq!(load_corpus(&path)?, corpus);
/// # std::fs::remove_file(&path)?;
/// # Ok(()) }
/// ```
pub fn save_corpus(path: impl AsRef<Path>, corpus: &Corpus) -> Result<()> {
    let ids = |v: &[u32]| -> Array1<i64> { v.iter().map(|&x| i64::from(x)).collect() };
    let starts: Array1<i64> = corpus
        .sequence_starts
        .iter()
        .map(|&s| i64::try_from(s).unwrap_or(i64::MAX))
        .collect();
    let mut npz = NpzWriter::new(path);
    npz.add("token_ids", &ids(&corpus.token_ids))
        .add("language_ids", &ids(&corpus.language_ids))
        .add("sequence_starts", &starts);
    npz.finish()
}
