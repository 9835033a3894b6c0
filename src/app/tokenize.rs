//! Real text in: a folder of text files per language, encoded by a
//! tokenizer into a [`Corpus`] with its metadata (`splitgrad tokenize`).
//!
//! Each language is a name and a folder ([`LanguageSource`], language ids
//! `0..L` in the order given). Every regular file under the folder (sorted
//! by path, recursively, hidden files and folders skipped) is one
//! sequence of the corpus; an empty file contributes none. Text must be
//! UTF-8: the first invalid byte is an error naming the file and its line.
//!
//! ```text
//! Plan::new(&languages) ─► plan.tokenize(&encoder, &progress) ─► Tokenized { corpus, stats }
//! ```
//!
//! The encoder is any [`TextEncoder`]; with the `cli` feature,
//! [`HfTokenizer`] reads a Hugging Face `tokenizer.json` with the
//! `tokenizers` crate.

use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::app::corpus::{Column, Corpus, CorpusMeta, Width};
use crate::{Error, Result};

/// Bytes of text read and encoded at once (in parallel, one file per task)
/// before their ids are appended: what bounds the text held in memory.
const BATCH_BYTES: u64 = 8 << 20;

/// What turns text into token ids.
pub trait TextEncoder: Sync {
    /// V: every id [`encode`](Self::encode) returns is below it.
    fn vocab_size(&self) -> usize;

    /// The ids of `text`, with no special token added.
    fn encode(&self, text: &str) -> Result<Vec<u32>>;

    /// The text of token `id` alone (for `token_strings`): one that
    /// [`NpzWriter::add_strings`](crate::io::NpzWriter::add_strings) keeps
    /// whole, so it does not end in NUL.
    fn token_string(&self, id: u32) -> String;

    /// What identifies the encoder (for `tokenizer_hash`), if anything.
    fn fingerprint(&self) -> Option<String> {
        None
    }
}

/// One language of the corpus: its name and the folder of its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LanguageSource {
    /// The name (`language_names`): non-empty, without `=`.
    pub name: String,
    /// The folder whose files are its sequences.
    pub dir: PathBuf,
}

impl LanguageSource {
    /// Parses `NAME=DIR` (split at the first `=`).
    ///
    /// Errors: [`Config`](crate::ErrorKind::Config) without `=`, with an
    /// empty name or an empty folder.
    ///
    /// ```
    /// use splitgrad::app::tokenize::LanguageSource;
    /// let l = LanguageSource::parse("ja=text/ja")?;
    /// assert_eq!((l.name.as_str(), l.dir.to_str()), ("ja", Some("text/ja")));
    /// assert_eq!(
    ///     LanguageSource::parse("text/ja").unwrap_err().to_string(),
    ///     "language `text/ja`: expected NAME=DIR"
    /// );
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn parse(arg: &str) -> Result<LanguageSource> {
        let Some((name, dir)) = arg.split_once('=') else {
            return Err(Error::config(format!(
                "language `{arg}`: expected NAME=DIR"
            )));
        };
        if name.is_empty() {
            return Err(Error::config(format!(
                "language `{arg}`: the name before `=` is empty"
            )));
        }
        if dir.is_empty() {
            return Err(Error::config(format!(
                "language `{arg}`: the folder after `=` is empty"
            )));
        }
        Ok(LanguageSource {
            name: name.to_string(),
            dir: PathBuf::from(dir),
        })
    }
}

/// Checks a list of languages: at least one, each name non-empty, without
/// `=`, and used once.
///
/// Errors: [`Config`](crate::ErrorKind::Config) naming the language at fault.
///
/// ```
/// use splitgrad::app::tokenize::{LanguageSource, check_languages};
/// let langs: Vec<LanguageSource> = ["en=a", "fr=b", "en=c"]
///     .iter()
///     .map(|a| LanguageSource::parse(a))
///     .collect::<splitgrad::Result<_>>()?;
/// assert_eq!(
///     check_languages(&langs).unwrap_err().to_string(),
///     "language `en` is given twice (languages 0 and 2)"
/// );
/// # Ok::<(), splitgrad::Error>(())
/// ```
pub fn check_languages(languages: &[LanguageSource]) -> Result<()> {
    if languages.is_empty() {
        return Err(Error::config("no language given"));
    }
    for (i, l) in languages.iter().enumerate() {
        if l.name.is_empty() || l.name.contains('=') {
            return Err(Error::config(format!(
                "language {i}: the name `{}` is empty or holds `=`",
                l.name
            )));
        }
        if let Some(j) = languages[..i].iter().position(|m| m.name == l.name) {
            return Err(Error::config(format!(
                "language `{}` is given twice (languages {j} and {i})",
                l.name
            )));
        }
    }
    Ok(())
}

/// Every regular file under `dir`, recursively, sorted by path; hidden
/// entries (names beginning with `.`) are skipped, files and folders alike.
/// A symbolic link to a file counts as the file; links to folders are not
/// followed (so no cycle is walked).
///
/// Errors: [`Io`](crate::ErrorKind::Io) naming `dir` if it cannot be
/// read (missing, say) or a folder under it that cannot;
/// [`Format`](crate::ErrorKind::Format) if `dir` is not a folder.
pub fn text_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(dir).map_err(|e| Error::from(e).in_file(dir))?;
    if !meta.is_dir() {
        return Err(Error::format("is not a folder").in_file(dir));
    }
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        let entries = std::fs::read_dir(&folder).map_err(|e| Error::from(e).in_file(&folder))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::from(e).in_file(&folder))?;
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let path = entry.path();
            let kind = entry
                .file_type()
                .map_err(|e| Error::from(e).in_file(&path))?;
            let is_file = kind.is_file()
                || (kind.is_symlink() && std::fs::metadata(&path).is_ok_and(|m| m.is_file()));
            if kind.is_dir() {
                pending.push(path);
            } else if is_file {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The text of `bytes` (the contents of `path`), which must be UTF-8.
///
/// Errors: [`Format`](crate::ErrorKind::Format) naming `path`, the line
/// (1-based) and the byte offset of the first byte that is not UTF-8.
///
/// ```
/// use splitgrad::app::tokenize::utf8_text;
/// assert_eq!(utf8_text("a.txt".as_ref(), "héllo".as_bytes().to_vec())?, "héllo");
/// let e = utf8_text("a.txt".as_ref(), b"one\ntwo\nth\xffree".to_vec()).unwrap_err();
/// assert_eq!(
///     e.to_string(),
///     "a.txt: not UTF-8: byte 0xff at line 3 (byte offset 10) is not valid UTF-8"
/// );
/// # Ok::<(), splitgrad::Error>(())
/// ```
pub fn utf8_text(path: &Path, bytes: Vec<u8>) -> Result<String> {
    String::from_utf8(bytes).map_err(|e| {
        let bytes = e.as_bytes();
        let at = e.utf8_error().valid_up_to();
        let line = 1 + bytes[..at].iter().filter(|&&b| b == b'\n').count();
        let message = match e.utf8_error().error_len() {
            Some(_) => format!(
                "not UTF-8: byte {:#04x} at line {line} (byte offset {at}) is not valid UTF-8",
                bytes[at]
            ),
            None => format!(
                "not UTF-8: the file ends inside a character begun at line {line} (byte offset {at})"
            ),
        };
        Error::format(message).in_file(path)
    })
}

/// The text of the file at `path` ([`utf8_text`]).
///
/// Errors: [`Io`](crate::ErrorKind::Io) naming `path` if it cannot be
/// read; those of [`utf8_text`].
pub fn read_text(path: &Path) -> Result<String> {
    let bytes = crate::io::read_regular(path, "the text file")?;
    utf8_text(path, bytes)
}

/// FNV-1a, 64 bits, of `bytes`: the `tokenizer_hash` of a `tokenizer.json`
/// is `fnv1a64:` and this in 16 hex digits.
///
/// ```
/// use splitgrad::app::tokenize::fnv1a64;
/// assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
/// assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
/// ```
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// One file to encode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextFile {
    /// Its language id.
    pub language: u32,
    /// Where it is.
    pub path: PathBuf,
    /// Its size when listed.
    pub bytes: u64,
}

/// The languages and the files of a corpus, listed but not yet read.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The languages, in id order.
    pub languages: Vec<LanguageSource>,
    /// Every file, language by language, each language's sorted by path.
    pub files: Vec<TextFile>,
}

/// What was encoded for one language.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LanguageStats {
    /// Files listed (empty ones included).
    pub files: usize,
    /// Sequences: the files that gave at least one token.
    pub sequences: usize,
    /// Tokens.
    pub tokens: usize,
    /// Bytes of text.
    pub bytes: u64,
}

/// The result of [`Plan::tokenize`].
#[derive(Clone, Debug)]
pub struct Tokenized {
    /// The corpus, with all of its [`CorpusMeta`].
    pub corpus: Corpus,
    /// Per language, in id order.
    pub stats: Vec<LanguageStats>,
}

impl Plan {
    /// Checks the languages ([`check_languages`]) and lists their files
    /// ([`text_files`]).
    ///
    /// Errors: those two functions'; [`Config`](crate::ErrorKind::Config)
    /// for more languages than `u32` ids, or a folder with no file.
    pub fn new(languages: &[LanguageSource]) -> Result<Plan> {
        check_languages(languages)?;
        let mut files = Vec::new();
        for (id, language) in languages.iter().enumerate() {
            let id =
                u32::try_from(id).map_err(|_| Error::config("more than 2^32 languages given"))?;
            let listed = text_files(&language.dir)?;
            if listed.is_empty() {
                return Err(Error::config(format!(
                    "language `{}`: no file under {}",
                    language.name,
                    language.dir.display()
                )));
            }
            for path in listed {
                let bytes = std::fs::metadata(&path)
                    .map_err(|e| Error::from(e).in_file(&path))?
                    .len();
                files.push(TextFile {
                    language: id,
                    path,
                    bytes,
                });
            }
        }
        Ok(Plan {
            languages: languages.to_vec(),
            files,
        })
    }

    /// Bytes of text in all files, as listed.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }

    /// Reads and encodes every file (several at once, on rayon's threads)
    /// and builds the corpus: one sequence per file that gives a token, in
    /// the plan's order; `vocab_size` the encoder's, `n_languages` the
    /// plan's, `language_names`, `token_strings` (every id's
    /// [`TextEncoder::token_string`]) and `tokenizer_hash` (its
    /// [`fingerprint`](TextEncoder::fingerprint)) filled in.
    /// `progress` is called, from the worker threads, with the listed size
    /// of each file as it is encoded.
    ///
    /// Errors: a file that cannot be read or is not UTF-8 ([`read_text`]);
    /// the encoder's, naming the file; [`Config`](crate::ErrorKind::Config)
    /// if no file gives a token; [`OutOfRange`](crate::ErrorKind::OutOfRange)
    /// for an id the encoder gives at or above its own vocabulary size,
    /// naming the file. The first error in the plan's order is returned.
    pub fn tokenize(
        &self,
        encoder: &dyn TextEncoder,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<Tokenized> {
        let vocab_size = encoder.vocab_size();
        let mut token_ids = Column::with_width(Width::for_bound(vocab_size as u64), 0);
        let mut language_ids = Column::with_width(Width::for_bound(self.languages.len() as u64), 0);
        let mut run: Vec<u32> = Vec::new();
        let mut sequence_starts: Vec<usize> = Vec::new();
        let mut stats = vec![LanguageStats::default(); self.languages.len()];
        for batch in batches(&self.files) {
            let encoded: Vec<Result<(u64, Vec<u32>)>> = batch
                .par_iter()
                .map(|f| {
                    let text = read_text(&f.path)?;
                    let ids = encoder.encode(&text).map_err(|e| e.in_file(&f.path))?;
                    progress(f.bytes);
                    Ok((text.len() as u64, ids))
                })
                .collect();
            for (file, result) in batch.iter().zip(encoded) {
                let (bytes, ids) = result?;
                if let Some(p) = ids.iter().position(|&id| id as usize >= vocab_size) {
                    let high = i64::try_from(vocab_size).unwrap_or(i64::MAX);
                    return Err(Error::out_of_range(
                        "token id from the tokenizer",
                        vec![p],
                        i64::from(ids[p]),
                        0,
                        high,
                    )
                    .in_file(&file.path));
                }
                let s = &mut stats[file.language as usize];
                s.files += 1;
                s.bytes += bytes;
                if !ids.is_empty() {
                    s.sequences += 1;
                    s.tokens += ids.len();
                    sequence_starts.push(token_ids.len());
                    run.clear();
                    run.resize(ids.len(), file.language);
                    language_ids.extend_from_u32(&run);
                    token_ids.extend_from_u32(&ids);
                }
            }
        }
        if token_ids.is_empty() {
            return Err(Error::config(
                "no text: every file under the language folders is empty",
            ));
        }
        let token_strings = (0..vocab_size)
            .map(|id| {
                u32::try_from(id).map_or_else(|_| String::new(), |id| encoder.token_string(id))
            })
            .collect();
        let meta = CorpusMeta {
            vocab_size: Some(vocab_size),
            n_languages: Some(self.languages.len()),
            language_names: Some(self.languages.iter().map(|l| l.name.clone()).collect()),
            token_strings: Some(token_strings),
            tokenizer_hash: encoder.fingerprint(),
        };
        let corpus = Corpus {
            token_ids,
            language_ids,
            sequence_starts,
            meta,
        };
        corpus.validate(vocab_size, self.languages.len())?;
        Ok(Tokenized { corpus, stats })
    }
}

/// The text a tokenizer is trained on ([`Plan::vocab_text`]): a prefix of
/// some of the plan's files, language by language.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VocabText {
    /// (index into [`Plan::files`], bytes to read from its start), in the
    /// order they are read.
    pub parts: Vec<(usize, u64)>,
    /// Per language: the bytes of its training text (the files `train`
    /// does not hold out).
    pub available: Vec<u64>,
    /// Per language: the bytes of it in `parts`.
    pub taken: Vec<u64>,
    /// What each language contributes at most: the smallest `available`
    /// of a language that has any, or the cap given, whichever is less.
    pub per_language: u64,
    /// The files left out because `train` holds them out.
    pub heldout_files: usize,
    /// The bytes left out with them (and, for a corpus of one sequence,
    /// its tail).
    pub heldout_bytes: u64,
}

impl VocabText {
    /// The bytes of text in all parts.
    pub fn total_bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.1).sum()
    }
}

/// SplitMix64's finaliser of (seed, i): the order files are sampled in.
fn sample_hash(seed: u64, i: u64) -> u64 {
    let mut z = (seed ^ 0x746f_6b76_6f63_6162)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(i.wrapping_add(1).wrapping_mul(0xD1B5_4A32_D192_ED03));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Plan {
    /// Per file of the plan: whether `train --heldout-fraction fraction
    /// --seed seed` holds out the sequence it becomes. A file with text is
    /// one sequence (a byte-level BPE gives every non-empty text a token;
    /// an empty file gives none), so this is
    /// [`heldout_sequences`](crate::app::eval::heldout_sequences) of the
    /// files with text, by their languages — the rule `train` applies to
    /// the corpus. With a single file of text, none is held out whole
    /// (`train` cuts that one's tail; [`vocab_text`](Self::vocab_text)
    /// leaves it out).
    pub fn heldout_files(&self, fraction: f64, seed: u64) -> Vec<bool> {
        let with_text: Vec<usize> = (0..self.files.len())
            .filter(|&i| self.files[i].bytes > 0)
            .collect();
        let languages: Vec<u32> = with_text.iter().map(|&i| self.files[i].language).collect();
        let held = crate::app::eval::heldout_sequences(&languages, fraction, seed);
        let mut out = vec![false; self.files.len()];
        for (&i, h) in with_text.iter().zip(held) {
            out[i] = h;
        }
        out
    }

    /// The text to train a tokenizer on, balanced across the languages and
    /// with what `train --heldout-fraction fraction --seed seed` will hold
    /// out left out ([`heldout_files`](Self::heldout_files)).
    ///
    /// Each language contributes the same number of bytes: as many as the
    /// language with the least training text has, and at most
    /// `max_per_language`. A language's files are taken in an order drawn
    /// from `seed` until its share is reached (the last one cut short); a
    /// language whose only file is held out contributes nothing. With a
    /// single file of text in the plan, its last `fraction` of bytes (at
    /// least 2) is left out, as `train` holds out the tail of a corpus of
    /// one sequence (by tokens: the cut is near, not at, the same place).
    ///
    /// Errors: [`Config`](crate::ErrorKind::Config) for a fraction outside
    /// (0, 1), a cap of 0, or no training text (every file empty).
    pub fn vocab_text(&self, fraction: f64, seed: u64, max_per_language: u64) -> Result<VocabText> {
        if !(fraction > 0.0 && fraction < 1.0) {
            return Err(Error::config(format!(
                "--heldout-fraction must be in (0, 1), got {fraction}"
            )));
        }
        if max_per_language == 0 {
            return Err(Error::config("--train-vocab-bytes must be at least 1"));
        }
        let held = self.heldout_files(fraction, seed);
        let n_with_text = self.files.iter().filter(|f| f.bytes > 0).count();
        let mut usable: Vec<u64> = self.files.iter().map(|f| f.bytes).collect();
        let (mut heldout_files, mut heldout_bytes) = (0, 0);
        for (i, f) in self.files.iter().enumerate() {
            if held[i] {
                heldout_files += 1;
                heldout_bytes += f.bytes;
                usable[i] = 0;
            } else if n_with_text == 1 && f.bytes > 0 {
                let tail = ((f.bytes as f64 * fraction).round() as u64)
                    .max(2)
                    .min(f.bytes);
                heldout_bytes += tail;
                usable[i] = f.bytes - tail;
            }
        }
        let n_lang = self.languages.len();
        let mut available = vec![0u64; n_lang];
        for (f, &u) in self.files.iter().zip(&usable) {
            available[f.language as usize] += u;
        }
        let Some(smallest) = available.iter().copied().filter(|&a| a > 0).min() else {
            return Err(Error::config(
                "no text to train a tokenizer on: every file under the language folders is empty (or held out)",
            ));
        };
        let per_language = smallest.min(max_per_language);
        let mut parts = Vec::new();
        let mut taken = vec![0u64; n_lang];
        for (lang, taken) in taken.iter_mut().enumerate() {
            let mut order: Vec<usize> = (0..self.files.len())
                .filter(|&i| self.files[i].language as usize == lang && usable[i] > 0)
                .collect();
            order.sort_by_key(|&i| (sample_hash(seed, i as u64), i));
            for i in order {
                if *taken >= per_language {
                    break;
                }
                let n = usable[i].min(per_language - *taken);
                parts.push((i, n));
                *taken += n;
            }
        }
        Ok(VocabText {
            parts,
            available,
            taken,
            per_language,
            heldout_files,
            heldout_bytes,
        })
    }
}

/// The files cut into runs of about [`BATCH_BYTES`] (at least one file each).
fn batches(files: &[TextFile]) -> Vec<&[TextFile]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, f) in files.iter().enumerate() {
        if i > start && bytes + f.bytes > BATCH_BYTES {
            out.push(&files[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += f.bytes;
    }
    if start < files.len() {
        out.push(&files[start..]);
    }
    out
}

#[cfg(feature = "cli")]
pub use hf::{
    HfTokenizer, MAX_TRAINED_VOCAB, MIN_TRAINED_VOCAB, SPECIAL_TOKEN, check_trained_vocab,
    train_byte_level_bpe,
};

#[cfg(feature = "cli")]
mod hf;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    /// A scratch folder for one test.
    fn scratch(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "splitgrad-tokenize-unit-{}-{test}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// One token per byte; V 256.
    struct Bytes;

    impl TextEncoder for Bytes {
        fn vocab_size(&self) -> usize {
            256
        }
        fn encode(&self, text: &str) -> Result<Vec<u32>> {
            Ok(text.bytes().map(u32::from).collect())
        }
        fn token_string(&self, id: u32) -> String {
            format!("<{id}>")
        }
    }

    #[test]
    fn files_are_sorted_recursive_and_not_hidden() {
        let dir = scratch("walk");
        for f in [
            "b.txt",
            "a/z.txt",
            "a/b/c.txt",
            ".hidden",
            ".git/x",
            "a/.y",
            "a.txt",
        ] {
            let path = dir.join(f);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "x").unwrap();
        }
        // A link to a file is the file; a link to a folder is not walked.
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(dir.join("b.txt"), dir.join("c.txt")).unwrap();
            std::os::unix::fs::symlink(&dir, dir.join("a/loop")).unwrap();
        }
        let files: Vec<String> = text_files(&dir)
            .unwrap()
            .iter()
            .map(|p| p.strip_prefix(&dir).unwrap().to_string_lossy().into_owned())
            .collect();
        let mut expected = vec!["a/b/c.txt", "a/z.txt", "a.txt", "b.txt"];
        if cfg!(unix) {
            expected.push("c.txt");
        }
        assert_eq!(files, expected);
        let e = text_files(&dir.join("b.txt")).unwrap_err();
        assert!(e.to_string().ends_with("b.txt: is not a folder"), "{e}");
        let e = text_files(&dir.join("missing")).unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::Io(_)), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn utf8_errors_name_the_line() {
        let p = Path::new("t.txt");
        let e = utf8_text(p, b"\xe6\x97".to_vec()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.txt: not UTF-8: the file ends inside a character begun at line 1 (byte offset 0)"
        );
        let e = utf8_text(p, b"ok\n\n\xc3(".to_vec()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.txt: not UTF-8: byte 0xc3 at line 3 (byte offset 4) is not valid UTF-8"
        );
    }

    #[test]
    fn language_arguments() {
        for (arg, message) in [
            ("=x", "language `=x`: the name before `=` is empty"),
            ("en=", "language `en=`: the folder after `=` is empty"),
        ] {
            assert_eq!(LanguageSource::parse(arg).unwrap_err().to_string(), message);
        }
        let l = LanguageSource::parse("en=a=b").unwrap();
        assert_eq!((l.name.as_str(), l.dir.to_str()), ("en", Some("a=b")));
        assert_eq!(
            check_languages(&[]).unwrap_err().to_string(),
            "no language given"
        );
        let bad = LanguageSource {
            name: "a=b".into(),
            dir: "x".into(),
        };
        assert!(check_languages(&[bad]).is_err());
    }

    #[test]
    fn a_plan_encodes_file_by_file() {
        let dir = scratch("plan");
        for (f, text) in [
            ("en/1.txt", "ab"),
            ("en/2.txt", ""),
            ("en/3.txt", "c"),
            ("fr/x.txt", "dé"),
        ] {
            let path = dir.join(f);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let langs = [
            LanguageSource::parse(&format!("en={}", dir.join("en").display())).unwrap(),
            LanguageSource::parse(&format!("fr={}", dir.join("fr").display())).unwrap(),
        ];
        let plan = Plan::new(&langs).unwrap();
        assert_eq!(plan.files.len(), 4);
        assert_eq!(plan.total_bytes(), 6);
        let seen = std::sync::Mutex::new(Vec::new());
        let out = plan
            .tokenize(&Bytes, &|b| seen.lock().unwrap().push(b))
            .unwrap();
        let mut seen = seen.into_inner().unwrap();
        seen.sort_unstable();
        assert_eq!(seen, [0, 1, 2, 3]);
        let c = &out.corpus;
        assert_eq!(c.token_ids, [97, 98, 99, 100, 0xc3, 0xa9]);
        assert_eq!(c.language_ids, [0, 0, 0, 1, 1, 1]);
        assert_eq!(c.sequence_starts, [0, 2, 3]);
        assert_eq!((c.vocab_size(), c.n_languages()), (256, 2));
        let names = c.meta.language_names.as_deref().unwrap();
        assert_eq!(names, ["en", "fr"]);
        assert_eq!(c.meta.token_strings.as_ref().unwrap()[7], "<7>");
        assert_eq!(c.meta.tokenizer_hash, None);
        assert_eq!(
            out.stats[0],
            LanguageStats {
                files: 3,
                sequences: 2,
                tokens: 3,
                bytes: 3
            }
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn batches_cover_every_file_once() {
        let file = |bytes| TextFile {
            language: 0,
            path: PathBuf::new(),
            bytes,
        };
        let files: Vec<TextFile> = [BATCH_BYTES, 1, BATCH_BYTES - 1, 5, 0]
            .into_iter()
            .map(file)
            .collect();
        let lens: Vec<usize> = batches(&files).iter().map(|b| b.len()).collect();
        assert_eq!(lens, [1, 2, 2]);
        assert!(batches(&[]).is_empty());
    }
}
