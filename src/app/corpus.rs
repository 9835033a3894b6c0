//! The training corpus (`docs/spec.md#61-corpus`): [`Corpus`] with its
//! optional [`CorpusMeta`], [`load_corpus`], [`save_corpus`].

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
    /// What the file says about the vocabulary and the languages (empty
    /// for a corpus made in code).
    pub meta: CorpusMeta,
}

/// What a corpus file may state besides its ids, every part optional
/// (`docs/spec.md#61-corpus`); `splitgrad tokenize` writes all of them.
///
/// When a part is present, [`Corpus::check_meta`] (and so
/// [`load_corpus`]) holds the ids to it: a stated `vocab_size` exceeds
/// every token id, a stated `n_languages` every language id,
/// `language_names` has [`Corpus::n_languages`] entries and
/// `token_strings` [`Corpus::vocab_size`].
///
/// ```
/// use splitgrad::app::corpus::{Corpus, CorpusMeta};
/// let mut corpus = Corpus::new(vec![5, 6], vec![0, 1]);
/// assert_eq!((corpus.vocab_size(), corpus.n_languages()), (7, 2));
/// corpus.meta = CorpusMeta {
///     vocab_size: Some(2000),
///     n_languages: Some(3),
///     language_names: Some(vec!["en".into(), "fr".into(), "ja".into()]),
///     ..CorpusMeta::default()
/// };
/// assert_eq!((corpus.vocab_size(), corpus.n_languages()), (2000, 3));
/// corpus.check_meta().unwrap();
/// corpus.meta.n_languages = Some(2);
/// assert_eq!(
///     corpus.check_meta().unwrap_err().to_string(),
///     "array `language_names`: language_names has shape [3], expected (2,), one name per language"
/// );
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CorpusMeta {
    /// V, the size of the vocabulary the ids come from (`vocab_size`, a
    /// 0-d integer); a tokenizer's can exceed the largest id seen.
    pub vocab_size: Option<usize>,
    /// L, the number of languages (`n_languages`, a 0-d integer).
    pub n_languages: Option<usize>,
    /// The name of each language id (`language_names`, 1-D unicode, `(L)`).
    pub language_names: Option<Vec<String>>,
    /// The decoded text of each token id (`token_strings`, 1-D unicode, `(V)`).
    pub token_strings: Option<Vec<String>>,
    /// Which tokenizer made the ids (`tokenizer_hash`, a 0-d unicode
    /// string such as `fnv1a64:0123456789abcdef`, the hash of the bytes
    /// of its `tokenizer.json`).
    pub tokenizer_hash: Option<String>,
}

/// The largest token id a corpus can hold plus one: ids are `u32`.
const MAX_SIZE: u64 = 1 << 32;

impl Corpus {
    /// A corpus that is one sequence, with no metadata. Nothing is checked
    /// until [`validate`](Self::validate).
    pub fn new(token_ids: Vec<u32>, language_ids: Vec<u32>) -> Self {
        Corpus {
            token_ids,
            language_ids,
            sequence_starts: vec![0],
            meta: CorpusMeta::default(),
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

    /// V: the stated [`CorpusMeta::vocab_size`] if there is one, else the
    /// largest token id plus one (0 for an empty corpus).
    pub fn vocab_size(&self) -> usize {
        self.meta
            .vocab_size
            .unwrap_or_else(|| max_plus_one(&self.token_ids))
    }

    /// L: the stated [`CorpusMeta::n_languages`] if there is one, else the
    /// largest language id plus one (0 for an empty corpus).
    pub fn n_languages(&self) -> usize {
        self.meta
            .n_languages
            .unwrap_or_else(|| max_plus_one(&self.language_ids))
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
    /// `n_languages` languages, and its metadata against itself
    /// ([`check_meta`](Self::check_meta)).
    ///
    /// Errors, each naming the array and the position and value at fault:
    /// [`ErrorKind::Shape`] if `language_ids` differs in length from
    /// `token_ids`; [`ErrorKind::Empty`] for no tokens;
    /// [`ErrorKind::OutOfRange`] for a token ≥ `vocab_size`, a language ≥
    /// `n_languages` or a sequence start ≥ N; [`ErrorKind::Format`] for
    /// sequence starts that do not begin at 0 or do not increase; those of
    /// [`check_meta`](Self::check_meta).
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
        check_starts(&starts, n)?;
        self.check_meta()
    }

    /// Checks the metadata that is present against the ids and itself.
    ///
    /// Errors, each naming the array at fault: [`ErrorKind::Format`] for a
    /// stated `vocab_size` that does not exceed some token id, or
    /// `n_languages` some language id (naming the first such id and its
    /// position), or either above 2³²; [`ErrorKind::Shape`] for
    /// `language_names` without [`n_languages`](Self::n_languages) entries
    /// or `token_strings` without [`vocab_size`](Self::vocab_size).
    ///
    /// ```
    /// use splitgrad::app::corpus::Corpus;
    /// let mut corpus = Corpus::new(vec![1, 40, 3], vec![0, 0, 0]);
    /// corpus.meta.vocab_size = Some(32);
    /// assert_eq!(
    ///     corpus.check_meta().unwrap_err().to_string(),
    ///     "array `vocab_size`: 32 does not exceed token id 40 at position [1] of `token_ids`"
    /// );
    /// ```
    pub fn check_meta(&self) -> Result<()> {
        let stated = [
            (
                "vocab_size",
                self.meta.vocab_size,
                "token",
                "token_ids",
                &self.token_ids,
            ),
            (
                "n_languages",
                self.meta.n_languages,
                "language",
                "language_ids",
                &self.language_ids,
            ),
        ];
        for (array, size, what, ids_array, ids) in stated {
            let Some(size) = size else { continue };
            if size as u64 > MAX_SIZE {
                return Err(Error::format(format!(
                    "{size} is above 2^32, one more than the largest {what} id a corpus holds"
                ))
                .in_array(array));
            }
            if let Some(i) = ids.iter().position(|&x| x as usize >= size) {
                return Err(Error::format(format!(
                    "{size} does not exceed {what} id {} at position [{i}] of `{ids_array}`",
                    ids[i]
                ))
                .in_array(array));
            }
        }
        let lists = [
            (
                "language_names",
                &self.meta.language_names,
                self.n_languages(),
                "one name per language",
            ),
            (
                "token_strings",
                &self.meta.token_strings,
                self.vocab_size(),
                "one string per token id",
            ),
        ];
        for (array, list, want, why) in lists {
            if let Some(list) = list.as_ref().filter(|l| l.len() != want) {
                return Err(
                    Error::shape(array, format!("({want},), {why}"), &[list.len()]).in_array(array),
                );
            }
        }
        Ok(())
    }
}

fn max_plus_one(ids: &[u32]) -> usize {
    ids.iter().max().map_or(0, |&x| x as usize + 1)
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
/// is not 0, 0 is prepended. The optional [`CorpusMeta`] arrays are read
/// when present: `vocab_size` and `n_languages` (0-d integers),
/// `language_names` and `token_strings` (1-D unicode), `tokenizer_hash`
/// (0-d unicode).
///
/// Errors (each naming the file, the array, and the position and value at
/// fault): the file unreadable or not an npz; an array missing, not 1-D
/// or not integer; lengths that differ; no tokens; a negative id or one
/// above `u32::MAX`; a sequence start out of range or not above the one
/// before it; a metadata array of the wrong dtype or rank, a negative
/// size, a string that is not valid Unicode, or metadata that does not
/// fit the ids ([`Corpus::check_meta`]).
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
    let meta = load_meta(&mut npz).map_err(in_file)?;
    let corpus = Corpus {
        token_ids,
        language_ids,
        sequence_starts,
        meta,
    };
    corpus.check_meta().map_err(in_file)?;
    Ok(corpus)
}

/// The metadata arrays that are present, each of the right dtype and rank.
fn load_meta(npz: &mut NpzReader) -> Result<CorpusMeta> {
    let mut meta = CorpusMeta::default();
    for (array, field) in [
        ("vocab_size", &mut meta.vocab_size),
        ("n_languages", &mut meta.n_languages),
    ] {
        if npz.contains(array) {
            *field = Some(size_scalar(npz, array)?);
        }
    }
    for (array, field) in [
        ("language_names", &mut meta.language_names),
        ("token_strings", &mut meta.token_strings),
    ] {
        if npz.contains(array) {
            *field = Some(npz.strings_1d(array)?);
        }
    }
    if npz.contains("tokenizer_hash") {
        meta.tokenizer_hash = Some(npz.string_scalar("tokenizer_hash")?);
    }
    Ok(meta)
}

/// A 0-d integer array holding a size (≥ 0).
fn size_scalar(npz: &mut NpzReader, array: &str) -> Result<usize> {
    let path = npz.path().to_path_buf();
    let in_place = |e: Error| e.in_file(&path).in_array(array);
    let values = npz.ints(array)?;
    if values.ndim() != 0 {
        return Err(in_place(Error::shape(
            array,
            "0-D (a scalar)",
            values.shape(),
        )));
    }
    let value = values.iter().next().copied().unwrap_or_default();
    usize::try_from(value).map_err(|_| {
        in_place(Error::format(format!(
            "{value} is negative: a size is at least 0"
        )))
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
/// `language_ids` and `sequence_starts`, all `int64`, and each part of
/// its [`CorpusMeta`] that is present (sizes as 0-d `int64`, strings as
/// numpy unicode arrays). The corpus is written as it is, valid or not.
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
    let meta = &corpus.meta;
    for (array, size) in [
        ("vocab_size", meta.vocab_size),
        ("n_languages", meta.n_languages),
    ] {
        if let Some(size) = size {
            npz.add_scalar(array, i64::try_from(size).unwrap_or(i64::MAX));
        }
    }
    for (array, list) in [
        ("language_names", &meta.language_names),
        ("token_strings", &meta.token_strings),
    ] {
        if let Some(list) = list {
            npz.add_strings(array, list);
        }
    }
    if let Some(hash) = &meta.tokenizer_hash {
        npz.add_string_scalar("tokenizer_hash", hash);
    }
    npz.finish()
}
