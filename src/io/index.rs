//! The split-vocabulary index (`docs/spec.md#23-splitvocabulary`, `#62-index`): [`SplitIndex`],
//! [`load_index`], [`save_index`].

use std::path::Path;

use ndarray::Array1;

use super::lookup::PairMap;
use super::{NpzReader, NpzWriter, PairLookup, check_finite};
use crate::{Error, ErrorKind, Result};

/// Names the array a duplicate pair is found in: both.
const PAIR_ARRAYS: &str = "(language_index, token_index)";

/// The `(language, token)` pairs that own a split-vocabulary row: row `i`
/// specialises token `token_index[i]` in language `language_index[i]`.
///
/// `score` is optional: one finite real per pair (the interference
/// measured before training), carried along for reports.
///
/// ```
/// # fn main() -> splitgrad::Result<()> {
/// use splitgrad::io::SplitIndex;
/// let index = SplitIndex::new(vec![0, 1, 1], vec![7, 7, 2]);
/// index.validate(2, 10)?;
/// assert_eq!(index.lookup(2, 10).get(1, 7), Some(1));
/// // Token 7 is out of range for a vocabulary of 5.
/// let e = index.validate(2, 5).unwrap_err();
/// assert_eq!(e.to_string(), "array `token_index`: token id 7 at position [0] is out of range 0..5");
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct SplitIndex {
    /// The language of each row, `(n_rows)`.
    pub language_index: Vec<usize>,
    /// The token of each row, `(n_rows)`.
    pub token_index: Vec<usize>,
    /// An optional score per row, `(n_rows)`.
    pub score: Option<Vec<f64>>,
}

fn as_i64(x: usize) -> i64 {
    i64::try_from(x).unwrap_or(i64::MAX)
}

impl SplitIndex {
    /// An index of the rows `(language_index[i], token_index[i])`, without
    /// a score. Nothing is checked until [`validate`](Self::validate).
    pub fn new(language_index: Vec<usize>, token_index: Vec<usize>) -> Self {
        SplitIndex {
            language_index,
            token_index,
            score: None,
        }
    }

    /// The number of rows.
    ///
    /// ```
    /// assert_eq!(splitgrad::io::SplitIndex::new(vec![0, 0], vec![1, 2]).n_rows(), 2);
    /// ```
    pub fn n_rows(&self) -> usize {
        self.language_index.len()
    }

    /// Checks the index against `n_languages` (L) and `vocab_size` (V).
    ///
    /// Errors, in this order, each naming the array, and the position and
    /// value at fault: [`ErrorKind::Shape`] if the arrays differ in length;
    /// [`ErrorKind::Empty`] if there are no rows; [`ErrorKind::OutOfRange`]
    /// for a language ≥ L, then for a token ≥ V; [`ErrorKind::DuplicatePair`]
    /// for a pair listed twice (naming both positions); for the score,
    /// [`ErrorKind::Shape`] if its length differs and
    /// [`ErrorKind::NonFinite`] for a NaN or infinity.
    pub fn validate(&self, n_languages: usize, vocab_size: usize) -> Result<()> {
        let n = self.language_index.len();
        if self.token_index.len() != n {
            return Err(length_error("token_index", n, self.token_index.len()));
        }
        if n == 0 {
            return Err(Error::new(ErrorKind::Empty).in_array("language_index"));
        }
        let arrays = [
            (
                "language_index",
                "language id",
                &self.language_index,
                n_languages,
            ),
            ("token_index", "token id", &self.token_index, vocab_size),
        ];
        for (array, what, values, high) in arrays {
            if let Some(i) = values.iter().position(|&x| x >= high) {
                return Err(
                    Error::out_of_range(what, vec![i], as_i64(values[i]), 0, as_i64(high))
                        .in_array(array),
                );
            }
        }
        let mut first_seen = PairMap::with_capacity_and_hasher(n, Default::default());
        for (i, (&l, &t)) in self
            .language_index
            .iter()
            .zip(&self.token_index)
            .enumerate()
        {
            if let Some(&first) = first_seen.get(&(l, t)) {
                return Err(Error::new(ErrorKind::DuplicatePair {
                    position: i,
                    first,
                    language: as_i64(l),
                    token: as_i64(t),
                })
                .in_array(PAIR_ARRAYS));
            }
            first_seen.insert((l, t), i);
        }
        if let Some(score) = &self.score {
            if score.len() != n {
                return Err(length_error("score", n, score.len()));
            }
            check_finite(ndarray::ArrayView1::from(score), "score")?;
        }
        Ok(())
    }

    /// The `(language, token) → row` map of this index (see [`PairLookup`]).
    ///
    /// **Panics** if the index does not pass
    /// [`validate`](Self::validate)`(n_languages, vocab_size)` for lengths
    /// and ranges; validate it first.
    #[track_caller]
    pub fn lookup(&self, n_languages: usize, vocab_size: usize) -> PairLookup {
        PairLookup::new(
            &self.language_index,
            &self.token_index,
            n_languages,
            vocab_size,
        )
    }
}

fn length_error(array: &str, expected: usize, found: usize) -> Error {
    Error::shape(
        array,
        format!("({expected},), the length of language_index"),
        &[found],
    )
    .in_array(array)
}

/// Reads a split-vocabulary index from an `.npz` file with 1-D integer
/// arrays `language_index` and `token_index` (any integer dtype) and,
/// optionally, a 1-D float array `score`, and validates it for
/// `n_languages` languages and a vocabulary of `vocab_size`.
///
/// Errors (each naming the file, the array, and the position and value at
/// fault): the file unreadable or not an npz ([`ErrorKind::Io`],
/// [`ErrorKind::Format`]); an array missing ([`ErrorKind::Missing`]), not
/// 1-D ([`ErrorKind::Shape`]) or not integer ([`ErrorKind::Dtype`]); the
/// lengths differ; no rows; a negative value or one ≥ L (languages) or ≥ V
/// (tokens) ([`ErrorKind::OutOfRange`]); a duplicate pair; a `score` that
/// is not float, not 1-D, of another length or not finite.
///
/// ```
/// # fn main() -> splitgrad::Result<()> {
/// use splitgrad::io::{load_index, save_index, SplitIndex};
/// let path = std::env::temp_dir().join(format!("splitgrad-doc-index-{}.npz", std::process::id()));
/// let mut index = SplitIndex::new(vec![0, 2], vec![5, 5]);
/// index.score = Some(vec![0.25, 0.75]);
/// save_index(&path, &index)?;
/// assert_eq!(load_index(&path, 3, 6)?, index);
/// let e = load_index(&path, 2, 6).unwrap_err();
/// assert!(e.to_string().ends_with(
///     "array `language_index`: language id 2 at position [1] is out of range 0..2"
/// ));
/// # std::fs::remove_file(&path)?;
/// # Ok(()) }
/// ```
pub fn load_index(
    path: impl AsRef<Path>,
    n_languages: usize,
    vocab_size: usize,
) -> Result<SplitIndex> {
    let path = path.as_ref();
    let mut npz = NpzReader::open(path)?;
    let languages = npz.ints_1d("language_index")?;
    let tokens = npz.ints_1d("token_index")?;
    let in_file = |e: Error| e.in_file(path);
    if tokens.len() != languages.len() {
        return Err(in_file(length_error(
            "token_index",
            languages.len(),
            tokens.len(),
        )));
    }
    if languages.is_empty() {
        return Err(in_file(
            Error::new(ErrorKind::Empty).in_array("language_index"),
        ));
    }
    let language_index = to_ids(&languages, "language id", n_languages)
        .map_err(|e| in_file(e.in_array("language_index")))?;
    let token_index =
        to_ids(&tokens, "token id", vocab_size).map_err(|e| in_file(e.in_array("token_index")))?;
    let score = if npz.contains("score") {
        let score = npz.reals::<f64>("score")?;
        if score.ndim() != 1 {
            return Err(in_file(
                Error::shape("score", "1-D", score.shape()).in_array("score"),
            ));
        }
        Some(score.into_iter().collect())
    } else {
        None
    };
    let index = SplitIndex {
        language_index,
        token_index,
        score,
    };
    index.validate(n_languages, vocab_size).map_err(in_file)?;
    Ok(index)
}

/// Converts ids read from a file to `usize`, each in `0..high`.
pub(super) fn to_ids(values: &[i64], what: &'static str, high: usize) -> Result<Vec<usize>> {
    values
        .iter()
        .enumerate()
        .map(|(i, &v)| match usize::try_from(v) {
            Ok(id) if id < high => Ok(id),
            _ => Err(Error::out_of_range(what, vec![i], v, 0, as_i64(high))),
        })
        .collect()
}

/// Writes `index` as an `.npz` file (atomically): `language_index` and
/// `token_index` as `int64`, and `score` as `float64` if present. The
/// index is written as it is, valid or not.
///
/// Errors: [`ErrorKind::Io`] naming the path.
///
/// **Panics** if an id exceeds `i64::MAX`.
///
/// ```
/// # fn main() -> splitgrad::Result<()> {
/// use splitgrad::io::{save_index, NpzReader, SplitIndex};
/// let path = std::env::temp_dir().join(format!("splitgrad-doc-save-index-{}.npz", std::process::id()));
/// save_index(&path, &SplitIndex::new(vec![1], vec![9]))?;
/// assert_eq!(NpzReader::open(&path)?.names(), ["language_index", "token_index"]);
/// # std::fs::remove_file(&path)?;
/// # Ok(()) }
/// ```
#[track_caller]
pub fn save_index(path: impl AsRef<Path>, index: &SplitIndex) -> Result<()> {
    let ids = |v: &[usize]| -> Array1<i64> {
        v.iter()
            .map(|&x| i64::try_from(x).expect("save_index: an id exceeds i64::MAX"))
            .collect()
    };
    let mut npz = NpzWriter::new(path);
    npz.add("language_index", &ids(&index.language_index));
    npz.add("token_index", &ids(&index.token_index));
    if let Some(score) = &index.score {
        npz.add("score", &ndarray::ArrayView1::from(score));
    }
    npz.finish()
}
