//! The split-vocabulary index: every error of `docs/spec.md#23-splitvocabulary`, each naming the
//! file, the array, the position and the value; round trips; the lookup.

use crate::common::table::Want::{Is, StartsWith};
use crate::io_common::{
    LoadRow, Members, dict, i64_member, le_f64, le_i64, load_row, message, npy, run_load_rows,
    scratch, write_npz,
};
use splitgrad::ErrorKind::{
    self, Dtype, DuplicatePair, Empty, Io, Missing, NonFinite, OutOfRange, Shape,
};
use splitgrad::io::{SplitIndex, load_index, save_index};

const L: usize = 3;
const V: usize = 10;

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

/// The members `language_index` and `token_index`, int64.
fn pair(languages: &[i64], tokens: &[i64]) -> Members {
    vec![
        ("language_index", i64_member(languages)),
        ("token_index", i64_member(tokens)),
    ]
}

/// [`pair`] `[0, 1]`, `[2, 2]` and a `score`.
fn with_score(score: Vec<u8>) -> Members {
    let mut m = pair(&[0, 1], &[2, 2]);
    m.push(("score", score));
    m
}

/// Every error of a file: the table. A row: its name, the file's members,
/// the kind of error, its message.
#[rustfmt::skip]
fn load_error_rows() -> Vec<LoadRow> {
    vec![
        LoadRow { members: None, ..load_row("unreadable_file", Vec::new, |k| matches!(k, Io(_)),
            StartsWith("{dir}/index.npz: ")) },
        load_row("missing_language_index", || vec![("token_index", i64_member(&[1]))], |k| matches!(k, Missing),
            Is("{dir}/index.npz: array `language_index`: is missing")),
        load_row("missing_token_index", || vec![("language_index", i64_member(&[1]))], |k| matches!(k, Missing),
            Is("{dir}/index.npz: array `token_index`: is missing")),
        load_row("not_one_dimensional",
            || vec![("language_index", i64_member(&[0, 1])), ("token_index", npy(&dict("<i8", "(1, 2)"), &le_i64(&[1, 2])))],
            |k| matches!(k, Shape { .. }),
            Is("{dir}/index.npz: array `token_index`: token_index has shape [1, 2], expected 1-D")),
        load_row("not_integer",
            || vec![("language_index", npy(&dict("<f8", "(2,)"), &le_f64(&[0.0, 1.0]))), ("token_index", i64_member(&[1, 2]))],
            |k| matches!(k, Dtype { .. }),
            Is("{dir}/index.npz: array `language_index`: has dtype float64, expected an integer dtype (int8 … int64, uint8 … uint64)")),
        load_row("lengths_differ", || pair(&[0, 1, 2], &[1, 2]), |k| matches!(k, Shape { .. }),
            Is("{dir}/index.npz: array `token_index`: token_index has shape [2], expected (3,), the length of language_index")),
        load_row("empty_index", || pair(&[], &[]), |k| matches!(k, Empty),
            Is("{dir}/index.npz: array `language_index`: is empty")),
        load_row("negative_value", || pair(&[0, 1, 2], &[4, -7, 5]), |k| matches!(k, OutOfRange { value: -7, .. }),
            Is("{dir}/index.npz: array `token_index`: token id -7 at position [1] is out of range 0..10")),
        load_row("language_out_of_range", || pair(&[0, 1, 2, 3], &[1, 1, 1, 1]),
            |k| matches!(k, OutOfRange { value: 3, low: 0, high: 3, .. }),
            Is("{dir}/index.npz: array `language_index`: language id 3 at position [3] is out of range 0..3")),
        load_row("token_out_of_range", || pair(&[0, 1], &[10, 9]), |k| matches!(k, OutOfRange { value: 10, .. }),
            Is("{dir}/index.npz: array `token_index`: token id 10 at position [0] is out of range 0..10")),
        load_row("duplicate_pair_names_both_positions", || pair(&[0, 1, 2, 1, 0], &[5, 5, 5, 6, 5]),
            |k| matches!(k, DuplicatePair { position: 4, first: 0, language: 0, token: 5 }),
            Is("{dir}/index.npz: array `(language_index, token_index)`: pair (language 0, token 5) at position [4] repeats position [0]")),
        load_row("score_int", || with_score(i64_member(&[1, 2])), |k| matches!(k, Dtype { .. }),
            Is("{dir}/index.npz: array `score`: has dtype int64, expected float32 or float64")),
        load_row("score_2d", || with_score(npy(&dict("<f8", "(2, 1)"), &le_f64(&[1.0, 2.0]))), |k| matches!(k, Shape { .. }),
            Is("{dir}/index.npz: array `score`: score has shape [2, 1], expected 1-D")),
        load_row("score_length", || with_score(npy(&dict("<f8", "(3,)"), &le_f64(&[1.0, 2.0, 3.0]))), |k| matches!(k, Shape { .. }),
            Is("{dir}/index.npz: array `score`: score has shape [3], expected (2,), the length of language_index")),
        load_row("score_nan", || with_score(npy(&dict("<f8", "(2,)"), &le_f64(&[1.0, f64::NAN]))), |k| matches!(k, NonFinite { .. }),
            Is("{dir}/index.npz: array `score`: non-finite value NaN at position [1]")),
    ]
}

#[test]
fn load_errors() {
    run_load_rows("io_index", "index.npz", &load_error_rows(), |path| {
        load_index(path, L, V)
    });
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
