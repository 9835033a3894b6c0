//! The `tokenizers` crate's side of `tokenize` (the `cli` feature): a
//! Hugging Face `tokenizer.json` as a [`TextEncoder`], and the training of
//! a byte-level BPE on the languages' text.

use std::path::Path;

use std::sync::Mutex;

use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, TokenizerBuilder, TokenizerImpl};

use super::{Plan, TextEncoder, VocabText, fnv1a64, read_text};
use crate::{Error, Result};

/// The special token of a trained tokenizer (id 0).
pub const SPECIAL_TOKEN: &str = "<|endoftext|>";

/// The smallest vocabulary [`train_byte_level_bpe`] takes: the special
/// token and the 256 byte symbols.
pub const MIN_TRAINED_VOCAB: usize = 257;

/// The largest: the trainer sets aside room for V tokens before it
/// starts, so V is bounded (about 2^20; the largest vocabularies in use
/// are a quarter of it).
pub const MAX_TRAINED_VOCAB: usize = 1 << 20;

/// Checks a vocabulary size for [`train_byte_level_bpe`]: from
/// [`MIN_TRAINED_VOCAB`] to [`MAX_TRAINED_VOCAB`].
///
/// Errors: [`Config`](crate::ErrorKind::Config), naming `--train-vocab`.
pub fn check_trained_vocab(vocab_size: usize) -> Result<()> {
    if vocab_size < MIN_TRAINED_VOCAB {
        return Err(Error::config(format!(
            "--train-vocab {vocab_size} is too small: a byte-level BPE holds the 256 byte symbols and {SPECIAL_TOKEN}, so V must be at least {MIN_TRAINED_VOCAB} (and larger for any merge)"
        )));
    }
    if vocab_size > MAX_TRAINED_VOCAB {
        return Err(Error::config(format!(
            "--train-vocab {vocab_size} is too large: at most {MAX_TRAINED_VOCAB}"
        )));
    }
    Ok(())
}

/// Bytes of text fed to the trainer at once (one task of its counting).
const PIECE_BYTES: usize = 64 << 10;

/// Trains a byte-level BPE of at most `vocab_size` tokens on `text` (a
/// [`Plan::vocab_text`] of `plan`) with the `tokenizers` crate, and
/// returns its `tokenizer.json`.
///
/// The pipeline is GPT-2's, without a normalizer (so decoding gives the
/// text back byte for byte): the ByteLevel pre-tokenizer (the GPT-2
/// split regex, no prefix space), BPE with the 256 byte symbols as its
/// initial alphabet and merges of pairs seen twice or more, the
/// ByteLevel decoder and post-processor, and [`SPECIAL_TOKEN`] as id 0.
/// The text is read one file at a time and fed in pieces of about 64
/// KiB (counted on rayon's threads); `progress` is called with the
/// bytes of each piece as it is read. The result depends on the text
/// only: the same text gives the same bytes, for any number of threads.
/// The vocabulary is smaller than `vocab_size` when the text has fewer
/// pairs seen twice.
///
/// Errors: [`Config`](crate::ErrorKind::Config) for `vocab_size` below
/// [`MIN_TRAINED_VOCAB`] or above [`MAX_TRAINED_VOCAB`]; a file that
/// cannot be read or is not UTF-8, naming it ([`read_text`]);
/// [`Format`](crate::ErrorKind::Format) if the trainer fails.
pub fn train_byte_level_bpe(
    plan: &Plan,
    text: &VocabText,
    vocab_size: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Vec<u8>> {
    check_trained_vocab(vocab_size)?;
    let trainer_error = |e: &dyn std::error::Error| {
        Error::format(format!("cannot train the tokenizer: {}", one_line(e)))
    };
    let mut tokenizer: TokenizerImpl<BPE, NormalizerWrapper, ByteLevel, ByteLevel, ByteLevel> =
        TokenizerBuilder::new()
            .with_model(BPE::default())
            .with_normalizer(None)
            .with_pre_tokenizer(Some(ByteLevel::new(false, true, true)))
            .with_post_processor(Some(ByteLevel::new(true, false, true)))
            .with_decoder(Some(ByteLevel::default()))
            .build()
            .map_err(|e| trainer_error(&*e))?;
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(vec![AddedToken::from(SPECIAL_TOKEN, true)])
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let failed: Mutex<Option<Error>> = Mutex::new(None);
    let mut files = text.parts.iter();
    let mut current: Vec<String> = Vec::new();
    let feed = std::iter::from_fn(|| {
        loop {
            if let Some(piece) = current.pop() {
                progress(piece.len() as u64);
                return Some(piece);
            }
            let &(i, n) = files.next()?;
            let path = &plan.files[i].path;
            match read_text(path) {
                Ok(t) => {
                    let n = usize::try_from(n).unwrap_or(usize::MAX);
                    current = pieces(prefix(&t, n), PIECE_BYTES)
                        .map(str::to_string)
                        .collect();
                    current.reverse();
                }
                Err(e) => {
                    *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                    return None;
                }
            }
        }
    });
    let trained = tokenizer.train(&mut trainer, feed).map(|_| ());
    if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    trained.map_err(|e| trainer_error(&*e))?;
    let json = tokenizer.to_string(true).map_err(|e| trainer_error(&*e))?;
    Ok(json.into_bytes())
}

/// A Hugging Face `tokenizer.json`, read with the `tokenizers` crate
/// (its pure-Rust pipelines: byte-level BPE and the like).
///
/// Truncation and padding settings in the file are dropped: a file is
/// encoded whole. V is the vocabulary with the added tokens (or the
/// largest id plus one, if the ids have holes).
pub struct HfTokenizer {
    tokenizer: tokenizers::Tokenizer,
    vocab_size: usize,
    hash: String,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("hash", &self.hash)
            .finish_non_exhaustive()
    }
}

/// A `tokenizers` error as one line.
fn one_line(e: &dyn std::error::Error) -> String {
    e.to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

impl HfTokenizer {
    /// Reads `tokenizer.json` at `path`.
    ///
    /// Errors, naming `path`: [`crate::ErrorKind::Io`] if it cannot be
    /// read, [`crate::ErrorKind::Format`] if the `tokenizers` crate
    /// does not take it.
    pub fn from_file(path: impl AsRef<Path>) -> Result<HfTokenizer> {
        let path = path.as_ref();
        let bytes = crate::io::read_regular(path, "the tokenizer")?;
        Self::from_bytes(&bytes).map_err(|e| e.in_file(path))
    }

    /// Reads a `tokenizer.json` held in memory.
    ///
    /// Errors: [`crate::ErrorKind::Format`] if the `tokenizers` crate
    /// does not take it.
    pub fn from_bytes(bytes: &[u8]) -> Result<HfTokenizer> {
        let mut tokenizer = tokenizers::Tokenizer::from_bytes(bytes)
            .map_err(|e| Error::format(format!("not a tokenizer.json: {}", one_line(&*e))))?;
        tokenizer
            .with_truncation(None)
            .map_err(|e| Error::format(one_line(&*e)))?;
        tokenizer.with_padding(None);
        let largest = tokenizer.get_vocab(true).into_values().max();
        let vocab_size = tokenizer
            .get_vocab_size(true)
            .max(largest.map_or(0, |id| id as usize + 1));
        if vocab_size == 0 {
            return Err(Error::format(
                "not a tokenizer.json: the vocabulary is empty",
            ));
        }
        Ok(HfTokenizer {
            tokenizer,
            vocab_size,
            hash: format!("fnv1a64:{:016x}", fnv1a64(bytes)),
        })
    }
}

impl TextEncoder for HfTokenizer {
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .tokenizer
            .encode_fast(text, false)
            .map_err(|e| Error::format(format!("cannot encode: {}", one_line(&*e))))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The id decoded alone; an id whose text is not whole (a fragment
    /// of a UTF-8 character decodes to U+FFFD), ends in NUL, or does
    /// not decode, gets its `id_to_token` form; an id with no token
    /// (a hole in the vocabulary) gets the empty string.
    fn token_string(&self, id: u32) -> String {
        match self.tokenizer.decode(&[id], false) {
            Ok(s) if !s.contains('\u{fffd}') && !s.ends_with('\0') => s,
            _ => self.tokenizer.id_to_token(id).unwrap_or_default(),
        }
    }

    fn fingerprint(&self) -> Option<String> {
        Some(self.hash.clone())
    }
}

/// The longest prefix of `text` of at most `n` bytes that ends on a
/// character boundary.
fn prefix(text: &str, n: usize) -> &str {
    let mut n = n.min(text.len());
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    &text[..n]
}

/// `text` cut into pieces of at most about `max` bytes, each ending just
/// after a newline where one falls in its second half, else on a character
/// boundary (what a tokenizer's trainer is fed, so that no one piece is
/// the whole of a large file).
fn pieces(text: &str, max: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let head = prefix(rest, max.max(4));
        let cut = match head.rfind('\n') {
            Some(p) if p + 1 >= head.len() / 2 && head.len() < rest.len() => p + 1,
            _ => head.len(),
        };
        let (piece, tail) = rest.split_at(cut);
        rest = tail;
        Some(piece)
    })
}
