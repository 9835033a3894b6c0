//! The corpus: loading (every error naming file, array, position, value),
//! sequence starts, round trips, and bigrams that never cross a sequence.

use std::path::PathBuf;

use crate::common::table::Want::{Is, StartsWith};
use crate::io_common::{
    LoadRow, Members, dict, i64_member, le_f64, le_i64, load_row, message, npy, run_load_rows,
    scratch, write_npz,
};
use splitgrad::ErrorKind::{Dtype, Empty, Format, Missing, OutOfRange, Shape};
use splitgrad::app::corpus::{Column, Corpus, CorpusMeta, load_corpus, save_corpus};

fn load_err(test: &str, members: &[(&str, Vec<u8>)]) -> (PathBuf, splitgrad::Error, String) {
    let path = scratch(test).join("corpus.npz");
    write_npz(&path, members);
    let (e, m) = message(load_corpus(&path));
    assert_eq!(e.file(), Some(path.as_path()), "{m}");
    (path, e, m)
}

fn ids(tokens: &[i64], languages: &[i64]) -> Members {
    vec![
        ("token_ids", i64_member(tokens)),
        ("language_ids", i64_member(languages)),
    ]
}

#[test]
fn without_sequence_starts_the_corpus_is_one_sequence() {
    let path = scratch("corpus_one").join("corpus.npz");
    write_npz(
        &path,
        &[
            (
                "token_ids",
                npy(&dict("<u2", "(4,)"), &[7, 0, 8, 0, 9, 0, 0xff, 0xff]),
            ),
            ("language_ids", npy(&dict("|i1", "(4,)"), &[1, 1, 0, 2])),
        ],
    );
    let corpus = load_corpus(&path).unwrap();
    assert_eq!(corpus.token_ids, [7, 8, 9, 65535]);
    assert_eq!(corpus.language_ids, [1, 1, 0, 2]);
    assert_eq!(corpus.sequence_starts, [0]);
    assert_eq!((corpus.vocab_size(), corpus.n_languages()), (65536, 3));
    assert_eq!(
        corpus.bigrams().collect::<Vec<_>>(),
        [(0, 1), (1, 2), (2, 3)]
    );
    corpus.validate(65536, 3).unwrap();
}

#[test]
fn zero_is_prepended_to_sequence_starts() {
    let dir = scratch("corpus_starts");
    let mut members = ids(&[1, 2, 3, 4, 5, 6], &[0; 6]);
    members.push(("sequence_starts", i64_member(&[2, 3, 5])));
    write_npz(&dir.join("a.npz"), &members);
    let corpus = load_corpus(dir.join("a.npz")).unwrap();
    assert_eq!(corpus.sequence_starts, [0, 2, 3, 5]);
    assert_eq!(
        corpus.sequences().collect::<Vec<_>>(),
        [0..2, 2..3, 3..5, 5..6]
    );
    assert_eq!(corpus.bigrams().collect::<Vec<_>>(), [(0, 1), (3, 4)]);
    assert_eq!(corpus.n_bigrams(), 2);

    let mut members = ids(&[1, 2, 3], &[0; 3]);
    members.push(("sequence_starts", i64_member(&[0, 1])));
    write_npz(&dir.join("b.npz"), &members);
    assert_eq!(
        load_corpus(dir.join("b.npz")).unwrap().sequence_starts,
        [0, 1]
    );

    let mut members = ids(&[1, 2, 3], &[0; 3]);
    members.push(("sequence_starts", i64_member(&[])));
    write_npz(&dir.join("c.npz"), &members);
    assert_eq!(load_corpus(dir.join("c.npz")).unwrap().sequence_starts, [0]);
}

#[test]
fn bigrams_never_cross_a_sequence_start() {
    let n = 1000;
    let starts: Vec<usize> = (0..n).filter(|p| p % 7 == 0 || p % 11 == 3).collect();
    let corpus = Corpus {
        token_ids: (0..n as u32).collect(),
        language_ids: Column::from(vec![0; n]),
        sequence_starts: starts.clone(),
        meta: CorpusMeta::default(),
    };
    corpus.validate(n, 1).unwrap();
    let bigrams: Vec<(usize, usize)> = corpus.bigrams().collect();
    let expected: Vec<(usize, usize)> = (1..n)
        .filter(|p| !starts.contains(p))
        .map(|p| (p - 1, p))
        .collect();
    assert_eq!(bigrams, expected);
    assert_eq!(corpus.n_bigrams(), n - starts.len());
}

#[test]
fn round_trip() {
    let path = scratch("corpus_round_trip").join("corpus.npz");
    let corpus = Corpus {
        token_ids: Column::from(vec![0, u32::MAX, 5, 5, 9]),
        language_ids: Column::from(vec![3, 3, 0, 1, 1]),
        sequence_starts: vec![0, 2, 4],
        meta: CorpusMeta::default(),
    };
    save_corpus(&path, &corpus).unwrap();
    assert_eq!(load_corpus(&path).unwrap(), corpus);
}

/// [`ids`] `[1, 2, 3, 4]` in language 0, and these sequence starts.
fn with_starts(starts: &[i64]) -> Members {
    let mut members = ids(&[1, 2, 3, 4], &[0; 4]);
    members.push(("sequence_starts", i64_member(starts)));
    members
}

/// Every error of the arrays of a corpus file: the table. A row: its
/// name, the file's members, the kind of error, its message.
#[rustfmt::skip]
fn load_error_rows() -> Vec<LoadRow> {
    vec![
        load_row("corpus_missing_tokens", || vec![("language_ids", i64_member(&[0]))], |k| matches!(k, Missing),
            Is("{dir}/corpus.npz: array `token_ids`: is missing")),
        load_row("corpus_missing_languages", || vec![("token_ids", i64_member(&[0]))], |k| matches!(k, Missing),
            Is("{dir}/corpus.npz: array `language_ids`: is missing")),
        load_row("corpus_2d", || vec![("token_ids", npy(&dict("<i8", "()"), &le_i64(&[4]))), ("language_ids", i64_member(&[0]))],
            |k| matches!(k, Shape { .. }),
            Is("{dir}/corpus.npz: array `token_ids`: token_ids has shape [], expected 1-D")),
        load_row("corpus_float", || vec![("token_ids", i64_member(&[1])), ("language_ids", npy(&dict("<f8", "(1,)"), &le_f64(&[0.0])))],
            |k| matches!(k, Dtype { .. }),
            Is("{dir}/corpus.npz: array `language_ids`: has dtype float64, expected an integer dtype (int8 … int64, uint8 … uint64)")),
        load_row("corpus_bool_starts",
            || { let mut m = ids(&[1, 2], &[0, 0]); m.push(("sequence_starts", npy(&dict("|b1", "(1,)"), &[1]))); m },
            |k| matches!(k, Dtype { .. }), StartsWith("{dir}/corpus.npz: array `sequence_starts`: has dtype bool")),
        load_row("corpus_lengths", || ids(&[1, 2, 3], &[0, 0]), |k| matches!(k, Shape { .. }),
            Is("{dir}/corpus.npz: array `language_ids`: language_ids has shape [2], expected (3,), the length of token_ids")),
        load_row("corpus_empty", || ids(&[], &[]), |k| matches!(k, Empty),
            Is("{dir}/corpus.npz: array `token_ids`: is empty")),
        load_row("corpus_negative", || ids(&[1, 2, 3], &[0, -2, 0]), |k| matches!(k, OutOfRange { value: -2, .. }),
            Is("{dir}/corpus.npz: array `language_ids`: language id -2 at position [1] is out of range 0..4294967296")),
        load_row("corpus_too_large", || ids(&[1, 1 << 32], &[0, 0]), |k| matches!(k, OutOfRange { value: 4294967296, .. }),
            Is("{dir}/corpus.npz: array `token_ids`: token id 4294967296 at position [1] is out of range 0..4294967296")),
        load_row("starts_range", || with_starts(&[0, 2, 4]), |k| matches!(k, OutOfRange { value: 4, .. }),
            Is("{dir}/corpus.npz: array `sequence_starts`: sequence start 4 at position [2] is out of range 0..4")),
        load_row("starts_negative", || with_starts(&[-1, 2]), |k| matches!(k, OutOfRange { value: -1, .. }),
            Is("{dir}/corpus.npz: array `sequence_starts`: sequence start -1 at position [0] is out of range 0..4")),
        load_row("starts_order", || with_starts(&[0, 2, 2]), |k| matches!(k, Format { .. }),
            Is("{dir}/corpus.npz: array `sequence_starts`: sequence start 2 at position [2] does not exceed the one before it, 2")),
        load_row("starts_2d",
            || { let mut m = ids(&[1, 2], &[0, 0]); m.push(("sequence_starts", npy(&dict("<i8", "(1, 1)"), &le_i64(&[0])))); m },
            |k| matches!(k, Shape { .. }),
            Is("{dir}/corpus.npz: array `sequence_starts`: sequence_starts has shape [1, 1], expected 1-D")),
    ]
}

#[test]
fn load_errors() {
    run_load_rows("io_corpus", "corpus.npz", &load_error_rows(), |path| {
        load_corpus(path)
    });
}

#[test]
fn validate_checks_ids_against_the_model() {
    let corpus = Corpus {
        token_ids: Column::from(vec![1, 2, 3]),
        language_ids: Column::from(vec![0, 2, 1]),
        sequence_starts: vec![0, 2],
        meta: CorpusMeta::default(),
    };
    corpus.validate(4, 3).unwrap();
    let cases = [
        (
            (3, 3),
            "array `token_ids`: token id 3 at position [2] is out of range 0..3",
        ),
        (
            (4, 2),
            "array `language_ids`: language id 2 at position [1] is out of range 0..2",
        ),
    ];
    for ((v, l), expected) in cases {
        assert_eq!(corpus.validate(v, l).unwrap_err().to_string(), expected);
    }
    let bad_starts = [
        (
            vec![1, 2],
            "array `sequence_starts`: the first sequence must start at 0",
        ),
        (
            vec![0, 3],
            "array `sequence_starts`: sequence start 3 at position [1] is out of range 0..3",
        ),
        (
            vec![0, 2, 1],
            "array `sequence_starts`: sequence start 1 at position [2] does not exceed the one before it, 2",
        ),
    ];
    for (starts, expected) in bad_starts {
        let c = Corpus {
            sequence_starts: starts,
            ..corpus.clone()
        };
        assert_eq!(c.validate(4, 3).unwrap_err().to_string(), expected);
    }
    let short = Corpus {
        language_ids: Column::from(vec![0]),
        ..corpus.clone()
    };
    assert_eq!(
        short.validate(4, 3).unwrap_err().to_string(),
        "array `language_ids`: language_ids has shape [1], expected (3,), the length of token_ids"
    );
    assert_eq!(
        Corpus::new(vec![], vec![])
            .validate(4, 3)
            .unwrap_err()
            .to_string(),
        "array `token_ids`: is empty"
    );
}

/// A 1-D `<U{width}` member of `strings`.
fn unicode_member(strings: &[&str]) -> Vec<u8> {
    let width = strings
        .iter()
        .map(|s| s.chars().count())
        .max()
        .unwrap_or(0)
        .max(1);
    let mut data = Vec::new();
    for s in strings {
        let mut units: Vec<u32> = s.chars().map(u32::from).collect();
        units.resize(width, 0);
        data.extend(units.iter().flat_map(|u| u.to_le_bytes()));
    }
    npy(
        &dict(&format!("<U{width}"), &format!("({},)", strings.len())),
        &data,
    )
}

fn i64_scalar(value: i64) -> Vec<u8> {
    npy(&dict("<i8", "()"), &value.to_le_bytes())
}

#[test]
fn metadata_round_trips_and_states_v_and_l() {
    let path = scratch("corpus_meta_round_trip").join("corpus.npz");
    let mut corpus = Corpus::new(vec![3, 1, 2, 0], vec![0, 0, 1, 1]);
    corpus.sequence_starts = vec![0, 2];
    assert_eq!((corpus.vocab_size(), corpus.n_languages()), (4, 2));
    corpus.meta = CorpusMeta {
        vocab_size: Some(6),
        n_languages: Some(3),
        language_names: Some(vec!["en".into(), "日本語".into(), "ru".into()]),
        token_strings: Some(
            ["<|endoftext|>", "a", " the", "é", "\n", ""]
                .map(String::from)
                .to_vec(),
        ),
        tokenizer_hash: Some("fnv1a64:0123456789abcdef".into()),
    };
    assert_eq!((corpus.vocab_size(), corpus.n_languages()), (6, 3));
    corpus.validate(6, 3).unwrap();
    save_corpus(&path, &corpus).unwrap();
    let loaded = load_corpus(&path).unwrap();
    assert_eq!(loaded, corpus);
    let mut npz = splitgrad::io::NpzReader::open(&path).unwrap();
    assert_eq!(npz.dtype("language_names").unwrap().descr(), "<U3");
    assert_eq!(npz.shape("vocab_size").unwrap(), Vec::<usize>::new());

    // Each part alone is optional.
    let mut partial = corpus.clone();
    partial.meta = CorpusMeta {
        n_languages: Some(2),
        ..CorpusMeta::default()
    };
    save_corpus(&path, &partial).unwrap();
    let loaded = load_corpus(&path).unwrap();
    assert_eq!(loaded, partial);
    assert_eq!((loaded.vocab_size(), loaded.n_languages()), (4, 2));
}

#[test]
fn metadata_that_does_not_fit_the_ids_is_an_error() {
    let base = || ids(&[0, 5, 2], &[0, 1, 1]);
    let with = |extra: Vec<(&'static str, Vec<u8>)>| {
        let mut m = base();
        m.extend(extra);
        m
    };
    let cases: Vec<(&str, Members, &str)> = vec![
        (
            "meta_small_v",
            with(vec![("vocab_size", i64_scalar(5))]),
            "array `vocab_size`: 5 does not exceed token id 5 at position [1] of `token_ids`",
        ),
        (
            "meta_small_l",
            with(vec![("n_languages", i64_scalar(1))]),
            "array `n_languages`: 1 does not exceed language id 1 at position [1] of `language_ids`",
        ),
        (
            "meta_huge_v",
            with(vec![("vocab_size", i64_scalar(1 << 40))]),
            "array `vocab_size`: 1099511627776 is above 2^32, one more than the largest token id a corpus holds",
        ),
        (
            "meta_negative",
            with(vec![("n_languages", i64_scalar(-2))]),
            "array `n_languages`: -2 is negative: a size is at least 0",
        ),
        (
            "meta_v_1d",
            with(vec![("vocab_size", i64_member(&[8]))]),
            "array `vocab_size`: vocab_size has shape [1], expected 0-D (a scalar)",
        ),
        (
            "meta_v_float",
            with(vec![(
                "vocab_size",
                npy(&dict("<f8", "()"), &le_f64(&[8.0])),
            )]),
            "array `vocab_size`: has dtype float64, expected an integer dtype (int8 … int64, uint8 … uint64)",
        ),
        (
            "meta_names_short",
            with(vec![("language_names", unicode_member(&["en"]))]),
            "array `language_names`: language_names has shape [1], expected (2,), one name per language",
        ),
        (
            "meta_names_stated_l",
            with(vec![
                ("n_languages", i64_scalar(3)),
                ("language_names", unicode_member(&["en", "fr"])),
            ]),
            "array `language_names`: language_names has shape [2], expected (3,), one name per language",
        ),
        (
            "meta_strings_long",
            with(vec![
                ("vocab_size", i64_scalar(6)),
                ("token_strings", unicode_member(&["a"; 7])),
            ]),
            "array `token_strings`: token_strings has shape [7], expected (6,), one string per token id",
        ),
        (
            "meta_names_ints",
            with(vec![("language_names", i64_member(&[1, 2]))]),
            "array `language_names`: has dtype int64, expected a unicode string dtype (<U1, <U2, …)",
        ),
        (
            "meta_hash_1d",
            with(vec![("tokenizer_hash", unicode_member(&["x"]))]),
            "array `tokenizer_hash`: tokenizer_hash has shape [1], expected 0-D (a scalar)",
        ),
        (
            "meta_bad_char",
            with(vec![(
                "language_names",
                npy(&dict("<U1", "(2,)"), &[0x65, 0, 0, 0, 0x00, 0xd8, 0, 0]),
            )]),
            "array `language_names`: string at position [1]: code unit 0xd800 (character 0) is not a Unicode scalar value",
        ),
    ];
    for (test, members, expected) in cases {
        let (path, _, m) = load_err(test, &members);
        assert_eq!(m, format!("{}: {expected}", path.display()), "{test}");
    }
    // The same checks hold for a corpus made in code.
    let mut corpus = Corpus::new(vec![0, 5, 2], vec![0, 1, 1]);
    corpus.meta.token_strings = Some(vec![String::new(); 5]);
    assert_eq!(
        corpus.validate(6, 2).unwrap_err().to_string(),
        "array `token_strings`: token_strings has shape [5], expected (6,), one string per token id"
    );
}
