//! The training corpus (`docs/spec.md#61-corpus`): [`Corpus`] with its
//! optional [`CorpusMeta`], [`load_corpus`], [`save_corpus`].

use std::ops::Range;
use std::path::Path;

pub use crate::io::{Column, Width};
use crate::io::{NpzReader, NpzWriter};
use crate::{Error, ErrorKind, Result};

/// Token ids with the language of each token, cut into sequences.
///
/// Both are [`Column`]s, each at the narrowest width that holds its values
/// (`u16` tokens for a vocabulary of up to 65,536, `u8` languages for up
/// to 256): a corpus takes 3 to 5 bytes a token in memory.
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
    pub token_ids: Column,
    /// The language of each token, `(N)`.
    pub language_ids: Column,
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
    /// The ids are stored at the narrowest width that holds them.
    pub fn new(token_ids: Vec<u32>, language_ids: Vec<u32>) -> Self {
        Corpus::from_columns(token_ids.into(), language_ids.into())
    }

    /// As [`new`](Self::new), from columns.
    pub fn from_columns(token_ids: Column, language_ids: Column) -> Self {
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
            .unwrap_or_else(|| self.token_ids.max_plus_one())
    }

    /// L: the stated [`CorpusMeta::n_languages`] if there is one, else the
    /// largest language id plus one (0 for an empty corpus).
    pub fn n_languages(&self) -> usize {
        self.meta
            .n_languages
            .unwrap_or_else(|| self.language_ids.max_plus_one())
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

    /// The token range of sequence `k`.
    ///
    /// **Panics** if `k ≥ n_sequences()`.
    #[track_caller]
    pub fn sequence_range(&self, k: usize) -> Range<usize> {
        let end = self
            .sequence_starts
            .get(k + 1)
            .copied()
            .unwrap_or(self.len());
        self.sequence_starts[k]..end
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

    /// The context position of bigram `b`, the `b`-th of
    /// [`bigrams`](Self::bigrams) (`b` < [`n_bigrams`](Self::n_bigrams)),
    /// found from the sequence starts alone: sequence k's bigrams are
    /// numbered from `sequence_starts[k] − k`.
    ///
    /// ```
    /// use splitgrad::app::corpus::Corpus;
    /// let mut c = Corpus::new(vec![1, 2, 3, 4, 5, 6], vec![0; 6]);
    /// c.sequence_starts = vec![0, 2, 3];
    /// let contexts: Vec<usize> = (0..c.n_bigrams()).map(|b| c.bigram_context(b)).collect();
    /// assert_eq!(contexts, c.bigrams().map(|(i, _)| i).collect::<Vec<_>>());
    /// assert_eq!(contexts, [0, 3, 4]);
    /// ```
    pub fn bigram_context(&self, b: usize) -> usize {
        let starts = &self.sequence_starts;
        // The last sequence k whose first bigram is numbered at most b
        // (starts[0] − 0 = 0 ≤ b, so there is one).
        let (mut lo, mut hi) = (1, starts.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if starts[mid] - mid <= b {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        b + (lo - 1)
    }

    /// The bigrams from the `b`-th on, in order: [`bigrams`](Self::bigrams)
    /// skipped to `b` with one search of the sequence starts.
    ///
    /// ```
    /// use splitgrad::app::corpus::Corpus;
    /// let mut c = Corpus::new(vec![1, 2, 3, 4, 5, 6], vec![0; 6]);
    /// c.sequence_starts = vec![0, 2, 3];
    /// for b in 0..=c.n_bigrams() {
    ///     assert!(c.bigrams_from(b).eq(c.bigrams().skip(b)));
    /// }
    /// ```
    pub fn bigrams_from(&self, b: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        // Bigram b's context i, in sequence k = i − b; past the end, none.
        let (first, k) = if b < self.n_bigrams() {
            let i = self.bigram_context(b);
            (i, i - b)
        } else {
            (self.len(), self.n_sequences())
        };
        self.sequences()
            .skip(k)
            .flat_map(move |r| (r.start.max(first) + 1..r.end).map(|p| (p - 1, p)))
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
            if let Some(i) = ids.first_at_or_above(high as u64) {
                let high = i64::try_from(high).unwrap_or(i64::MAX);
                return Err(
                    Error::out_of_range(what, vec![i], i64::from(ids.get(i)), 0, high)
                        .in_array(array),
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
            if let Some(i) = ids.first_at_or_above(size as u64) {
                return Err(Error::format(format!(
                    "{size} does not exceed {what} id {} at position [{i}] of `{ids_array}`",
                    ids.get(i)
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
    let in_file = |e: Error| e.in_file(path);
    let mut npz = NpzReader::open(path)?;
    // The metadata first: a stated size sets the width the ids are read at.
    let meta = load_meta(&mut npz).map_err(in_file)?;
    let width_for = |size: Option<usize>| size.map_or(Width::U8, |v| Width::for_bound(v as u64));
    let starts = if npz.contains("sequence_starts") {
        npz.ints_1d("sequence_starts")?
    } else {
        Vec::new()
    };
    let token_ids = npz.ids_1d("token_ids", "token id", width_for(meta.vocab_size))?;
    let n = token_ids.len();
    if n == 0 {
        return Err(in_file(Error::new(ErrorKind::Empty).in_array("token_ids")));
    }
    check_starts(&starts, n).map_err(in_file)?;
    // In range and increasing, so each is a valid usize.
    let mut sequence_starts: Vec<usize> = starts.iter().map(|&s| s as usize).collect();
    drop(starts);
    if sequence_starts.first() != Some(&0) {
        sequence_starts.insert(0, 0);
    }
    let language_width = width_for(meta.n_languages);
    let language_ids = if npz.contains("language_ids") || !npz.contains(PER_SEQUENCE) {
        let languages = npz.ids_1d("language_ids", "language id", language_width)?;
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
        languages
    } else {
        let per_sequence = npz.ids_1d(PER_SEQUENCE, "language id", language_width)?;
        expand_per_sequence(&per_sequence, &sequence_starts, n).map_err(in_file)?
    };
    let corpus = Corpus {
        token_ids,
        language_ids,
        sequence_starts,
        meta,
    };
    corpus.check_meta().map_err(in_file)?;
    Ok(corpus)
}

/// What a corpus file's headers and metadata say of its size, read
/// without its ids ([`inspect_corpus`]): enough to plan a run's memory
/// before the corpus is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CorpusShape {
    /// N.
    pub tokens: u64,
    /// Sequences (1 without `sequence_starts`).
    pub sequences: u64,
    /// Bytes a token will take in memory: the widths [`load_corpus`] reads
    /// its token and language ids at (an upper bound when the file states
    /// no size: the file's own integer widths, at most 4 bytes).
    pub bytes_per_token: u64,
    /// The stated `vocab_size`.
    pub vocab_size: Option<usize>,
    /// The stated `n_languages`.
    pub n_languages: Option<usize>,
}

/// Reads the shape of the corpus file at `path` ([`CorpusShape`]) from
/// the headers of its arrays and its metadata, none of its ids.
///
/// Errors: those of [`load_corpus`] for the file, the metadata and the
/// arrays' dtypes and ranks (the values are not read, so not checked).
///
/// ```
/// # fn main() -> splitgrad::Result<()> {
/// use splitgrad::app::corpus::{inspect_corpus, save_corpus, Corpus};
/// let path = std::env::temp_dir().join(format!("splitgrad-doc-inspect-{}.npz", std::process::id()));
/// let mut corpus = Corpus::new(vec![3, 1, 2, 9], vec![0, 1, 0, 0]);
/// corpus.meta.vocab_size = Some(70_000);
/// save_corpus(&path, &corpus)?;
/// let shape = inspect_corpus(&path)?;
/// assert_eq!((shape.tokens, shape.sequences, shape.bytes_per_token), (4, 1, 5));
/// # std::fs::remove_file(&path)?;
/// # Ok(()) }
/// ```
pub fn inspect_corpus(path: impl AsRef<Path>) -> Result<CorpusShape> {
    let path = path.as_ref();
    let mut npz = NpzReader::open(path)?;
    let meta = load_meta(&mut npz).map_err(|e| e.in_file(path))?;
    let one_d = |npz: &mut NpzReader, name: &str| -> Result<(u64, u64)> {
        let (n, dtype) = npz.int_1d_len(name)?;
        Ok((n as u64, dtype.size().min(4) as u64))
    };
    let (tokens, token_size) = one_d(&mut npz, "token_ids")?;
    // A file with neither language array is refused by `load_corpus`,
    // after its token ids (so that their errors come first).
    let language_size = if npz.contains("language_ids") {
        one_d(&mut npz, "language_ids")?.1
    } else if npz.contains(PER_SEQUENCE) {
        one_d(&mut npz, PER_SEQUENCE)?.1
    } else {
        1
    };
    let sequences = if npz.contains("sequence_starts") {
        one_d(&mut npz, "sequence_starts")?.0.max(1)
    } else {
        1
    };
    let width = |stated: Option<usize>, size: u64| {
        stated.map_or(size, |v| Width::for_bound(v as u64).bytes() as u64)
    };
    Ok(CorpusShape {
        tokens,
        sequences,
        bytes_per_token: width(meta.vocab_size, token_size)
            + width(meta.n_languages, language_size),
        vocab_size: meta.vocab_size,
        n_languages: meta.n_languages,
    })
}

/// The array that gives one language per sequence, in a file that has no
/// `language_ids`.
const PER_SEQUENCE: &str = "sequence_languages";

/// The language of every token from the language of every sequence.
fn expand_per_sequence(per_sequence: &Column, starts: &[usize], n: usize) -> Result<Column> {
    if per_sequence.len() != starts.len() {
        return Err(Error::shape(
            PER_SEQUENCE,
            format!(
                "({},), one language per sequence (sequence_starts, with 0 first)",
                starts.len()
            ),
            &[per_sequence.len()],
        )
        .in_array(PER_SEQUENCE));
    }
    crate::io::check_memory(
        || format!("the language of each of {n} tokens"),
        n as u64 * per_sequence.width().bytes() as u64,
        "",
    )?;
    let mut out = Column::with_width(per_sequence.width(), n);
    let ends = starts.iter().skip(1).copied().chain([n]);
    let mut run = Vec::new();
    for (k, (&s, e)) in starts.iter().zip(ends).enumerate() {
        run.clear();
        run.resize(e - s, per_sequence.get(k));
        out.extend_from_u32(&run);
    }
    Ok(out)
}

/// The language of each sequence, if every sequence of `corpus` is in
/// one language (its languages can then be written one per sequence).
fn languages_per_sequence(corpus: &Corpus) -> Option<Column> {
    let mut out = Column::with_width(corpus.language_ids.width(), corpus.n_sequences());
    for r in corpus.sequences() {
        let first = corpus.language_ids.try_get(r.start)?;
        if (r.start..r.end).any(|i| corpus.language_ids.get(i) != first) {
            return None;
        }
        out.push(first);
    }
    Some(out)
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

/// How [`save_corpus_as`] writes a corpus.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CorpusFormat {
    /// Write `sequence_languages`, one language per sequence, instead of
    /// `language_ids` when every sequence is in one language (as text
    /// tokenized a document at a time is).
    pub per_sequence_languages: bool,
    /// Compress every array with deflate (`numpy.savez_compressed`'s
    /// format; slower to read, smaller on disk).
    pub deflate: bool,
}

/// Writes `corpus` as an `.npz` file (atomically) with
/// [`CorpusFormat::default`]: `token_ids` and `language_ids` at the width
/// their values need (`uint8`, `uint16` or `uint32`, the widths of their
/// [`Column`]s), `sequence_starts` as `int64`, and each part of its
/// [`CorpusMeta`] that is present (sizes as 0-d `int64`, strings as numpy
/// unicode arrays). The corpus is written as it is, valid or not.
///
/// Errors: [`ErrorKind::Io`] naming the path.
///
/// ```
/// # fn main() -> splitgrad::Result<()> {
/// use splitgrad::app::corpus::{load_corpus, save_corpus, Corpus};
/// use splitgrad::io::NpzReader;
/// let path = std::env::temp_dir().join(format!("splitgrad-doc-save-corpus-{}.npz", std::process::id()));
/// let corpus = Corpus::new(vec![3, 1, 2000], vec![0, 1, 0]);
/// save_corpus(&path, &corpus)?;
/// assert_eq!(load_corpus(&path)?, corpus);
/// let mut r = NpzReader::open(&path)?;
/// assert_eq!(r.dtype("token_ids")?.descr(), "<u2");
/// assert_eq!(r.dtype("language_ids")?.descr(), "|u1");
/// # std::fs::remove_file(&path)?;
/// # Ok(()) }
/// ```
pub fn save_corpus(path: impl AsRef<Path>, corpus: &Corpus) -> Result<()> {
    save_corpus_as(path, corpus, CorpusFormat::default())
}

/// Writes `corpus` as [`save_corpus`] does, in `format`.
///
/// ```
/// # fn main() -> splitgrad::Result<()> {
/// use splitgrad::app::corpus::{load_corpus, save_corpus_as, Corpus, CorpusFormat};
/// use splitgrad::io::NpzReader;
/// let path = std::env::temp_dir().join(format!("splitgrad-doc-save-as-{}.npz", std::process::id()));
/// let mut corpus = Corpus::new(vec![3, 1, 2, 4, 4], vec![0, 0, 1, 1, 1]);
/// corpus.sequence_starts = vec![0, 2];
/// let format = CorpusFormat { per_sequence_languages: true, deflate: true };
/// save_corpus_as(&path, &corpus, format)?;
/// let mut r = NpzReader::open(&path)?;
/// assert!(!r.contains("language_ids"));
/// assert_eq!(r.ints_1d("sequence_languages")?, [0, 1]);
/// assert_eq!(load_corpus(&path)?, corpus);
/// # std::fs::remove_file(&path)?;
/// # Ok(()) }
/// ```
pub fn save_corpus_as(path: impl AsRef<Path>, corpus: &Corpus, format: CorpusFormat) -> Result<()> {
    // The columns are borrowed and written a block at a time: a corpus of
    // a billion tokens is not held twice while it is saved.
    let starts: Vec<i64> = corpus
        .sequence_starts
        .iter()
        .map(|&s| i64::try_from(s).unwrap_or(i64::MAX))
        .collect();
    let per_sequence = languages_per_sequence(corpus).filter(|_| format.per_sequence_languages);
    let mut npz = NpzWriter::new(path);
    npz.deflate(format.deflate);
    npz.add_column("token_ids", &corpus.token_ids);
    match &per_sequence {
        Some(per_sequence) => npz.add_column(PER_SEQUENCE, per_sequence),
        None => npz.add_column("language_ids", &corpus.language_ids),
    };
    npz.add_slice("sequence_starts", &starts);
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
