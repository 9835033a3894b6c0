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

/// A run too large for the memory there is (here under a cap of 100 MB)
/// is refused from the corpus's headers before any id is read: its ids
/// are corrupt
/// (a byte changed, so the archive's checksum fails when they are read),
/// which the same run without the cap reports. The line names the
/// corpus's size and the parts of the run; nothing is written.
#[test]
fn a_run_too_large_for_memory_is_refused_from_the_headers() {
    let dir = scratch("corpus_scale", "plan");
    let n = 4usize << 20;
    let path = cli::npz(&dir, "corpus.npz", |w| {
        w.add(
            "token_ids",
            &ndarray::Array1::from_iter((0..n).map(|i| (i % 8000) as u16)),
        )
        .add("sequence_starts", &arr1(&[0i64, n as i64 / 2]))
        .add("sequence_languages", &arr1(&[0u8, 1]))
        .add_scalar("vocab_size", 8192i64)
        .add_scalar("n_languages", 2i64);
    });
    let mut bytes = fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x55;
    fs::write(&path, bytes).unwrap();
    let args = ["train", "--corpus", "corpus.npz", "--out", "run"];
    let before = cli::snapshot(&dir);
    let run = |cap: Option<&str>| {
        let mut c = cli::command(&dir, &args);
        if let Some(cap) = cap {
            c.env("SPLITGRAD_MEMORY_LIMIT", cap);
        }
        let out = c.output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        let lines: Vec<String> = stderr
            .lines()
            .filter(|l| !l.starts_with(PROGRESS))
            .map(str::to_string)
            .collect();
        assert_eq!(lines.len(), 1, "{stderr}");
        lines[0].clone()
    };
    let refused = run(Some("100M"));
    assert!(
        refused.starts_with("splitgrad: error: training this model (V 8192 (stated by corpus.npz), L 2 (stated by corpus.npz), D 64, 0 split rows, batch 4096, a corpus of 4194304 tokens at 3 bytes each) needs "),
        "{refused}"
    );
    assert!(
        refused.contains("; the corpus 13.2 MiB + the model with its optimiser state 18.0 MiB + a step 12.2 MiB + workspace 96.0 MiB;"),
        "{refused}"
    );
    assert!(refused.ends_with("; lower --dim or --batch"), "{refused}");
    assert_eq!(cli::snapshot(&dir), before);
    let read = run(None);
    assert!(
        read.contains("array `token_ids`") && read.contains("checksum"),
        "{read}"
    );
    assert_eq!(cli::snapshot(&dir), before);
}
