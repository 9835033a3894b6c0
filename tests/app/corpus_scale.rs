//! Corpora at scale: ids read at the width they need whatever the file's
//! dtype, the compact format `tokenize` writes, and the run's memory
//! planned from the headers before any id is read.

use std::fs;

use ndarray::arr1;

use crate::common::cli::{self, PROGRESS, scratch};
use splitgrad::app::corpus::{Corpus, CorpusFormat, Width, load_corpus, save_corpus_as};
use splitgrad::io::{NpzReader, NpzWriter};

/// One corpus written with each integer dtype the writer has reads back
/// the same, at the narrowest width that holds its values.
#[test]
fn every_dtype_reads_the_same_corpus_at_the_width_its_values_need() {
    let dir = scratch("corpus_scale", "dtypes");
    let tokens = [3u32, 0, 250, 7, 7, 1];
    let langs = [0u32, 0, 1, 1, 1, 0];
    let path = dir.join("c.npz");
    let write = |fill: &dyn Fn(&mut NpzWriter)| {
        let mut w = NpzWriter::new(&path);
        fill(&mut w);
        w.add("sequence_starts", &arr1(&[0i64, 2]));
        w.finish().unwrap();
        load_corpus(&path).unwrap()
    };
    let as_i64 = write(&|w| {
        w.add("token_ids", &arr1(&tokens.map(i64::from)))
            .add("language_ids", &arr1(&langs.map(i64::from)));
    });
    let as_u8 = write(&|w| {
        w.add("token_ids", &arr1(&tokens.map(|x| x as u8)))
            .add("language_ids", &arr1(&langs.map(|x| x as u8)));
    });
    let as_u32 = write(&|w| {
        w.add("token_ids", &arr1(&tokens))
            .add("language_ids", &arr1(&langs));
    });
    assert_eq!(as_i64, as_u8);
    assert_eq!(as_i64, as_u32);
    assert_eq!(as_i64.token_ids, tokens);
    // int64 ids are narrowed to what the values need; an unsigned file's
    // own width is kept.
    assert_eq!(as_i64.token_ids.width(), Width::U8);
    assert_eq!(as_u32.token_ids.width(), Width::U32);
}

/// An int64 column whose values outgrow its width after the first chunk
/// read is widened on the way, every value kept.
#[test]
fn a_column_widens_as_it_is_read() {
    let dir = scratch("corpus_scale", "widen");
    let n = 200_000usize;
    let tokens: Vec<i64> = (0..n as i64)
        .map(|i| {
            if i == 150_000 {
                4_000_000_000
            } else if i > 100_000 {
                70_000 + i % 3
            } else {
                i % 200
            }
        })
        .collect();
    let path = cli::npz(&dir, "c.npz", |w| {
        w.add("token_ids", &arr1(&tokens))
            .add("language_ids", &ndarray::Array1::<u8>::zeros(n));
    });
    let c = load_corpus(&path).unwrap();
    assert_eq!(c.token_ids.width(), Width::U32);
    assert!(
        c.token_ids
            .iter()
            .zip(&tokens)
            .all(|(a, &b)| i64::from(a) == b)
    );
    assert_eq!(c.vocab_size(), 4_000_000_001);
}

/// The format `tokenize` writes (uint16 ids, one uint8 language per
/// sequence, deflated or not) reads back to the same corpus, and numpy's
/// names and dtypes are as documented.
#[test]
fn the_compact_format_round_trips() {
    let dir = scratch("corpus_scale", "compact");
    let n = 5000u32;
    let mut c = Corpus::new(
        (0..n).map(|i| i * 13 % 9000).collect(),
        (0..n).map(|i| u32::from(i >= 3000)).collect(),
    );
    c.sequence_starts = vec![0, 1000, 3000, 4000];
    c.meta.vocab_size = Some(9000);
    c.meta.n_languages = Some(2);
    for deflate in [false, true] {
        let path = dir.join(format!("c{deflate}.npz"));
        let format = CorpusFormat {
            per_sequence_languages: true,
            deflate,
        };
        save_corpus_as(&path, &c, format).unwrap();
        let mut r = NpzReader::open(&path).unwrap();
        assert_eq!(r.dtype("token_ids").unwrap().descr(), "<u2");
        assert_eq!(r.dtype("sequence_languages").unwrap().descr(), "|u1");
        assert_eq!(r.ints_1d("sequence_languages").unwrap(), [0, 0, 1, 1]);
        assert!(!r.contains("language_ids"));
        assert_eq!(load_corpus(&path).unwrap(), c);
    }
    let plain = fs::metadata(dir.join("cfalse.npz")).unwrap().len();
    let deflated = fs::metadata(dir.join("ctrue.npz")).unwrap().len();
    assert!(deflated < plain, "{deflated} ≥ {plain}");
    // Languages that change inside a sequence are written per token.
    let mut mixed = c.clone();
    mixed.language_ids = (0..n).map(|i| i % 2).collect();
    let path = dir.join("mixed.npz");
    save_corpus_as(
        &path,
        &mixed,
        CorpusFormat {
            per_sequence_languages: true,
            deflate: false,
        },
    )
    .unwrap();
    assert!(NpzReader::open(&path).unwrap().contains("language_ids"));
    assert_eq!(load_corpus(&path).unwrap(), mixed);
}

/// `sequence_languages` of the wrong length is refused, naming it.
#[test]
fn per_sequence_languages_must_match_the_sequences() {
    let dir = scratch("corpus_scale", "per_sequence");
    let path = cli::npz(&dir, "c.npz", |w| {
        w.add("token_ids", &arr1(&[1u16, 2, 3, 4]))
            .add("sequence_starts", &arr1(&[0i64, 2]))
            .add("sequence_languages", &arr1(&[0u8, 1, 1]));
    });
    let e = load_corpus(&path).unwrap_err().to_string();
    assert!(
        e.ends_with("array `sequence_languages`: sequence_languages has shape [3], expected (2,), one language per sequence (sequence_starts, with 0 first)"),
        "{e}"
    );
}

/// A corpus whose headers promise more than the memory there is is refused
/// before any id is read: its data here is cut short, so a read would be a
/// truncation error instead. The line names the corpus's size and the
/// parts of the run; nothing is written.
#[test]
fn a_run_too_large_for_memory_is_refused_from_the_headers() {
    let dir = scratch("corpus_scale", "plan");
    let n: u64 = 50_000_000;
    let header = format!("{{'descr': '<u2', 'fortran_order': False, 'shape': ({n},), }}");
    let mut padded = header.clone();
    while (10 + padded.len() + 1) % 64 != 0 {
        padded.push(' ');
    }
    padded.push('\n');
    let mut npy = b"\x93NUMPY\x01\x00".to_vec();
    npy.extend_from_slice(&(padded.len() as u16).to_le_bytes());
    npy.extend_from_slice(padded.as_bytes());
    npy.extend_from_slice(&[0u8; 64]);
    // A valid zip holding the short member, beside valid small ones.
    let path = dir.join("corpus.npz");
    {
        use std::io::Write;
        let mut bytes = std::io::Cursor::new(Vec::new());
        let mut small = NpzWriter::new("unused.npz");
        small
            .add("sequence_languages", &arr1(&[0u8]))
            .add_scalar("vocab_size", 8192i64)
            .add_scalar("n_languages", 2i64);
        small.write_to(&mut bytes).unwrap();
        // Re-open it and add the short member with the zip crate's writer.
        let mut zip =
            npyz::zip::ZipWriter::new_append(std::io::Cursor::new(bytes.into_inner())).unwrap();
        zip.start_file(
            "token_ids.npy",
            npyz::zip::write::FileOptions::default()
                .compression_method(npyz::zip::CompressionMethod::Stored),
        )
        .unwrap();
        zip.write_all(&npy).unwrap();
        let out = zip.finish().unwrap().into_inner();
        fs::write(&path, out).unwrap();
    }
    let before = cli::snapshot(&dir);
    let run = cli::command(&dir, &["train", "--corpus", "corpus.npz", "--out", "run"])
        .env("SPLITGRAD_MEMORY_LIMIT", "150M")
        .output()
        .unwrap();
    let stderr = String::from_utf8(run.stderr).unwrap();
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.starts_with(PROGRESS))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    let line = lines[0];
    assert!(
        line.starts_with("splitgrad: error: training this model (V 8192 (stated by corpus.npz), L 2 (stated by corpus.npz), D 64, 0 split rows, batch 4096, a corpus of 50000000 tokens at 3 bytes each) needs "),
        "{line}"
    );
    assert!(line.contains("; the corpus 157."), "{line}");
    assert!(line.ends_with("; lower --dim or --batch"), "{line}");
    assert_eq!(cli::snapshot(&dir), before);
}
