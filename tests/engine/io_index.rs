//! The split-vocabulary index: every error of `docs/spec.md#23-splitvocabulary`, each naming the
//! file, the array, the position and the value; round trips; the lookup.

use std::path::PathBuf;

use crate::io_common::{dict, i64_member, le_f64, message, npy, scratch, write_npz};
use splitgrad::ErrorKind;
use splitgrad::io::{SplitIndex, load_index, save_index};

const L: usize = 3;
const V: usize = 10;

/// Writes an index file of the given members and loads it for L = 3,
/// V = 10; returns the path and the error message.
fn load_err(test: &str, members: &[(&str, Vec<u8>)]) -> (PathBuf, splitgrad::Error, String) {
    let path = scratch(test).join("index.npz");
    write_npz(&path, members);
    let (e, m) = message(load_index(&path, L, V));
    assert_eq!(e.file(), Some(path.as_path()), "{m}");
    (path, e, m)
}

#[test]
fn loads_any_integer_dtype_and_a_score() {
    let path = scratch("index_ok").join("index.npz");
    write_npz(
        &path,
        &[
            ("language_index", npy(&dict("|u1", "(3,)"), &[2, 0, 1])),
            (
                "token_index",
                npy(&dict(">i4", "(3,)"), &[0, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0, 9]),
            ),
            (
                "score",
                npy(
                    &dict("<f4", "(3,)"),
                    &[0.5f32, 0.25, -1.0].map(f32::to_le_bytes).concat(),
                ),
            ),
        ],
    );
    let index = load_index(&path, L, V).unwrap();
    assert_eq!(index.language_index, [2, 0, 1]);
    assert_eq!(index.token_index, [9, 1, 9]);
    assert_eq!(index.score, Some(vec![0.5, 0.25, -1.0]));
}

#[test]
fn round_trip_with_and_without_score() {
    let dir = scratch("index_round_trip");
    let mut index = SplitIndex::new(vec![0, 1, 2, 0], vec![3, 3, 9, 4]);
    save_index(dir.join("plain.npz"), &index).unwrap();
    assert_eq!(load_index(dir.join("plain.npz"), L, V).unwrap(), index);
    index.score = Some(vec![0.1, f64::MAX, -0.0, 1e-300]);
    save_index(dir.join("scored.npz"), &index).unwrap();
    assert_eq!(load_index(dir.join("scored.npz"), L, V).unwrap(), index);
}

#[test]
fn unreadable_file() {
    let path = scratch("index_unreadable").join("absent.npz");
    let (e, m) = message(load_index(&path, L, V));
    assert!(matches!(e.kind(), ErrorKind::Io(_)));
    assert!(m.starts_with(&format!("{}: ", path.display())), "{m}");
}

#[test]
fn not_npz() {
    let path = scratch("index_not_npz").join("index.npz");
    std::fs::write(&path, "language_index = [0, 1]").unwrap();
    let (e, m) = message(load_index(&path, L, V));
    assert!(matches!(e.kind(), ErrorKind::Format { .. }));
    assert!(
        m.starts_with(&format!("{}: not an npz file", path.display())),
        "{m}"
    );
}

#[test]
fn missing_arrays() {
    let (path, e, m) = load_err(
        "index_missing_language",
        &[("token_index", i64_member(&[1]))],
    );
    assert!(matches!(e.kind(), ErrorKind::Missing));
    assert_eq!(
        m,
        format!("{}: array `language_index`: is missing", path.display())
    );
    let (path, e, m) = load_err(
        "index_missing_token",
        &[("language_index", i64_member(&[1]))],
    );
    assert!(matches!(e.kind(), ErrorKind::Missing));
    assert_eq!(
        m,
        format!("{}: array `token_index`: is missing", path.display())
    );
}

#[test]
fn not_one_dimensional() {
    let (path, e, m) = load_err(
        "index_not_1d",
        &[
            ("language_index", i64_member(&[0, 1])),
            (
                "token_index",
                npy(&dict("<i8", "(1, 2)"), &crate::io_common::le_i64(&[1, 2])),
            ),
        ],
    );
    assert!(matches!(e.kind(), ErrorKind::Shape { .. }));
    assert_eq!(
        m,
        format!(
            "{}: array `token_index`: token_index has shape [1, 2], expected 1-D",
            path.display()
        )
    );
}

#[test]
fn not_integer() {
    let (path, e, m) = load_err(
        "index_not_integer",
        &[
            (
                "language_index",
                npy(&dict("<f8", "(2,)"), &le_f64(&[0.0, 1.0])),
            ),
            ("token_index", i64_member(&[1, 2])),
        ],
    );
    assert!(matches!(e.kind(), ErrorKind::Dtype { .. }));
    assert_eq!(
        m,
        format!(
            "{}: array `language_index`: has dtype float64, expected an integer dtype (int8 … int64, uint8 … uint64)",
            path.display()
        )
    );
}

#[test]
fn lengths_differ() {
    let (path, e, m) = load_err(
        "index_lengths",
        &[
            ("language_index", i64_member(&[0, 1, 2])),
            ("token_index", i64_member(&[1, 2])),
        ],
    );
    assert!(matches!(e.kind(), ErrorKind::Shape { .. }));
    assert_eq!(
        m,
        format!(
            "{}: array `token_index`: token_index has shape [2], expected (3,), the length of language_index",
            path.display()
        )
    );
}

#[test]
fn empty_index() {
    let (path, e, m) = load_err(
        "index_empty",
        &[
            ("language_index", i64_member(&[])),
            ("token_index", i64_member(&[])),
        ],
    );
    assert!(matches!(e.kind(), ErrorKind::Empty));
    assert_eq!(
        m,
        format!("{}: array `language_index`: is empty", path.display())
    );
}

#[test]
fn negative_value() {
    let (path, e, m) = load_err(
        "index_negative",
        &[
            ("language_index", i64_member(&[0, 1, 2])),
            ("token_index", i64_member(&[4, -7, 5])),
        ],
    );
    assert!(matches!(e.kind(), ErrorKind::OutOfRange { value: -7, .. }));
    assert_eq!(
        m,
        format!(
            "{}: array `token_index`: token id -7 at position [1] is out of range 0..10",
            path.display()
        )
    );
}

#[test]
fn language_out_of_range() {
    let (path, e, m) = load_err(
        "index_language_range",
        &[
            ("language_index", i64_member(&[0, 1, 2, 3])),
            ("token_index", i64_member(&[1, 1, 1, 1])),
        ],
    );
    assert!(matches!(
        e.kind(),
        ErrorKind::OutOfRange {
            value: 3,
            low: 0,
            high: 3,
            ..
        }
    ));
    assert_eq!(
        m,
        format!(
            "{}: array `language_index`: language id 3 at position [3] is out of range 0..3",
            path.display()
        )
    );
}

#[test]
fn token_out_of_range() {
    let (path, e, m) = load_err(
        "index_token_range",
        &[
            ("language_index", i64_member(&[0, 1])),
            ("token_index", i64_member(&[10, 9])),
        ],
    );
    assert!(matches!(e.kind(), ErrorKind::OutOfRange { value: 10, .. }));
    assert_eq!(
        m,
        format!(
            "{}: array `token_index`: token id 10 at position [0] is out of range 0..10",
            path.display()
        )
    );
}

#[test]
fn duplicate_pair_names_both_positions() {
    let (path, e, m) = load_err(
        "index_duplicate",
        &[
            ("language_index", i64_member(&[0, 1, 2, 1, 0])),
            ("token_index", i64_member(&[5, 5, 5, 6, 5])),
        ],
    );
    assert!(matches!(
        e.kind(),
        ErrorKind::DuplicatePair {
            position: 4,
            first: 0,
            language: 0,
            token: 5
        }
    ));
    assert_eq!(
        m,
        format!(
            "{}: array `(language_index, token_index)`: pair (language 0, token 5) at position [4] repeats position [0]",
            path.display()
        )
    );
}

#[test]
fn bad_scores() {
    let ids = || {
        vec![
            ("language_index", i64_member(&[0, 1])),
            ("token_index", i64_member(&[2, 2])),
        ]
    };
    let with = |score: Vec<u8>| {
        let mut m = ids();
        m.push(("score", score));
        m
    };
    let (path, e, m) = load_err("score_int", &with(i64_member(&[1, 2])));
    assert!(matches!(e.kind(), ErrorKind::Dtype { .. }));
    assert_eq!(
        m,
        format!(
            "{}: array `score`: has dtype int64, expected float32 or float64",
            path.display()
        )
    );

    let (path, e, m) = load_err(
        "score_2d",
        &with(npy(&dict("<f8", "(2, 1)"), &le_f64(&[1.0, 2.0]))),
    );
    assert!(matches!(e.kind(), ErrorKind::Shape { .. }));
    assert_eq!(
        m,
        format!(
            "{}: array `score`: score has shape [2, 1], expected 1-D",
            path.display()
        )
    );

    let (path, e, m) = load_err(
        "score_length",
        &with(npy(&dict("<f8", "(3,)"), &le_f64(&[1.0, 2.0, 3.0]))),
    );
    assert!(matches!(e.kind(), ErrorKind::Shape { .. }));
    assert_eq!(
        m,
        format!(
            "{}: array `score`: score has shape [3], expected (2,), the length of language_index",
            path.display()
        )
    );

    let (path, e, m) = load_err(
        "score_nan",
        &with(npy(&dict("<f8", "(2,)"), &le_f64(&[1.0, f64::NAN]))),
    );
    assert!(matches!(e.kind(), ErrorKind::NonFinite { .. }));
    assert_eq!(
        m,
        format!(
            "{}: array `score`: non-finite value NaN at position [1]",
            path.display()
        )
    );
}

#[test]
fn validate_checks_an_index_built_in_code() {
    let cases: Vec<(SplitIndex, &str)> = vec![
        (
            SplitIndex::new(vec![0, 1], vec![1]),
            "array `token_index`: token_index has shape [1], expected (2,), the length of language_index",
        ),
        (
            SplitIndex::new(vec![], vec![]),
            "array `language_index`: is empty",
        ),
        (
            SplitIndex::new(vec![0, 5], vec![1, 1]),
            "array `language_index`: language id 5 at position [1] is out of range 0..3",
        ),
        (
            SplitIndex::new(vec![0, 1], vec![1, 99]),
            "array `token_index`: token id 99 at position [1] is out of range 0..10",
        ),
        (
            SplitIndex::new(vec![2, 2, 2], vec![1, 2, 1]),
            "array `(language_index, token_index)`: pair (language 2, token 1) at position [2] repeats position [0]",
        ),
        (
            SplitIndex {
                score: Some(vec![1.0]),
                ..SplitIndex::new(vec![0, 1], vec![1, 1])
            },
            "array `score`: score has shape [1], expected (2,), the length of language_index",
        ),
        (
            SplitIndex {
                score: Some(vec![1.0, f64::INFINITY]),
                ..SplitIndex::new(vec![0, 1], vec![1, 1])
            },
            "array `score`: non-finite value inf at position [1]",
        ),
    ];
    for (index, expected) in cases {
        assert_eq!(index.validate(L, V).unwrap_err().to_string(), expected);
    }
}

#[test]
fn lookup_maps_every_pair_to_its_row() {
    let index = SplitIndex::new(vec![0, 2, 1, 2], vec![7, 7, 0, 9]);
    index.validate(L, V).unwrap();
    let lookup = index.lookup(L, V);
    let mut rows = 0;
    for l in 0..L {
        for t in 0..V {
            let expected =
                (0..4).find(|&i| index.language_index[i] == l && index.token_index[i] == t);
            assert_eq!(lookup.get(l, t), expected, "({l}, {t})");
            rows += usize::from(expected.is_some());
        }
    }
    assert_eq!(rows, 4);
    assert_eq!(lookup.n_rows(), 4);
}
