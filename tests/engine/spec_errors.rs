//! The errors of `docs/spec.md#2-layers` through the layers' public API, one test per
//! error the specification lists: each asserts the [`ErrorKind`] and that the
//! message names what it must (the split, the id and its range, the file,
//! the array, the position, the value).

use std::path::{Path, PathBuf};

use ndarray::{Array1, Array2, ArrayD, IxDyn, arr1};
use splitgrad::io::{NpzWriter, SplitIndex};
use splitgrad::layers::{
    SplitLanguageModellingHead, SplitTokenEmbeddings, SplitVocabulary, SplitVocabularyConfig,
};
use splitgrad::{Error, ErrorKind, Tape};

// ---------------------------------------------------------------------------
// 1.1 SplitTokenEmbeddings and 1.2 SplitLanguageModellingHead: construction
// ---------------------------------------------------------------------------

/// The construction error of both split layers, which must agree.
fn construction_error(sizes: &[(&str, usize)], order: &[&str], hidden: usize) -> String {
    let e = SplitTokenEmbeddings::<f32>::new(sizes, order, hidden).unwrap_err();
    let h = SplitLanguageModellingHead::<f32>::new(sizes, order, hidden).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Config { .. }), "{e:?}");
    assert!(matches!(h.kind(), ErrorKind::Config { .. }), "{h:?}");
    assert_eq!(e.to_string(), h.to_string());
    e.to_string()
}

#[test]
fn split_layers_empty_order() {
    let m = construction_error(&[("orig", 4)], &[], 8);
    assert!(m.contains("split_order") && m.contains("empty"), "{m}");
}

#[test]
fn split_layers_name_in_order_without_size() {
    let m = construction_error(&[("orig", 4)], &["orig", "prompt"], 8);
    assert!(m.contains("`prompt`") && m.contains("no size"), "{m}");
}

#[test]
fn split_layers_name_twice_in_order() {
    let m = construction_error(
        &[("orig", 4), ("prompt", 2)],
        &["orig", "prompt", "orig"],
        8,
    );
    assert!(m.contains("`orig`") && m.contains("twice"), "{m}");
}

#[test]
fn split_layers_sized_split_missing_from_order() {
    let m = construction_error(&[("orig", 4), ("prompt", 2)], &["orig"], 8);
    assert!(m.contains("`prompt`") && m.contains("missing"), "{m}");
}

#[test]
fn split_layers_hidden_size_zero() {
    let m = construction_error(&[("orig", 4)], &["orig"], 0);
    assert!(m.contains("hidden_size") && m.contains('0'), "{m}");
}

// ---------------------------------------------------------------------------
// 1.1 SplitTokenEmbeddings: forward
// ---------------------------------------------------------------------------

/// The error of a forward pass on ids, V = 5 (splits of 3 and 2).
fn embedding_error(ids: ArrayD<i64>) -> Error {
    let e =
        SplitTokenEmbeddings::<f64>::new(&[("orig", 3), ("new", 2)], &["orig", "new"], 2).unwrap();
    let mut tape = Tape::new();
    e.forward(&mut tape, ids.view()).unwrap_err()
}

#[test]
fn split_embeddings_id_out_of_range() {
    let e = embedding_error(ndarray::array![[0i64, 4], [5, 1]].into_dyn());
    assert!(matches!(
        e.kind(),
        ErrorKind::OutOfRange {
            value: 5,
            low: 0,
            high: 5,
            ..
        }
    ));
    assert_eq!(
        e.to_string(),
        "input id 5 at position [1, 0] is out of range 0..5"
    );
}

#[test]
fn split_embeddings_negative_id() {
    let e = embedding_error(ndarray::array![2i64, -1].into_dyn());
    assert!(matches!(
        e.kind(),
        ErrorKind::OutOfRange {
            value: -1,
            low: 0,
            high: 5,
            ..
        }
    ));
    assert_eq!(
        e.to_string(),
        "input id -1 at position [1] is out of range 0..5"
    );
}

// ---------------------------------------------------------------------------
// 1.2 SplitLanguageModellingHead: labels
// ---------------------------------------------------------------------------

/// The error of the head (V = 5) on these labels, fused and naive alike.
fn label_error(labels: ArrayD<i64>) -> Error {
    let head =
        SplitLanguageModellingHead::<f64>::new(&[("orig", 3), ("new", 2)], &["orig", "new"], 2)
            .unwrap();
    let mut shape = labels.shape().to_vec();
    shape.push(2);
    let mut tape = Tape::new();
    let h = tape.input(ArrayD::zeros(IxDyn(&shape)));
    let naive = head
        .forward_naive(&mut tape, h, labels.view())
        .unwrap_err()
        .to_string();
    let e = head.forward(&mut tape, h, labels.view()).unwrap_err();
    assert_eq!(e.to_string(), naive);
    e
}

#[test]
fn lm_head_label_out_of_range() {
    let e = label_error(ndarray::array![[0i64, -100], [4, 5]].into_dyn());
    assert!(matches!(
        e.kind(),
        ErrorKind::OutOfRange {
            value: 5,
            low: 0,
            high: 5,
            ..
        }
    ));
    assert_eq!(
        e.to_string(),
        "label 5 at position [1, 1] is out of range 0..5"
    );
}

#[test]
fn lm_head_negative_label_other_than_ignore_index() {
    let e = label_error(ndarray::array![-100i64, -1].into_dyn());
    assert!(matches!(e.kind(), ErrorKind::OutOfRange { value: -1, .. }));
    assert_eq!(
        e.to_string(),
        "label -1 at position [1] is out of range 0..5"
    );
    let e = label_error(ndarray::array![-101i64].into_dyn());
    assert!(matches!(
        e.kind(),
        ErrorKind::OutOfRange { value: -101, .. }
    ));
}

// ---------------------------------------------------------------------------
// 1.3 SplitVocabulary: the index file
// ---------------------------------------------------------------------------

const L: usize = 3;
const V: usize = 10;

/// A fresh scratch folder for one test under the system's temp dir.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir()
        .join(format!("splitgrad-spec-errors-{}", std::process::id()))
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `index.npz` in the test's folder with `fill`'s arrays.
fn index_file(test: &str, fill: impl FnOnce(&mut NpzWriter)) -> PathBuf {
    let path = scratch(test).join("index.npz");
    let mut w = NpzWriter::new(&path);
    fill(&mut w);
    w.finish().unwrap();
    path
}

/// Loads the layer (V = 10, D = 2, L = 3) from an index file and returns
/// the error, checking that it names the file.
fn load_error(path: &Path) -> (Error, String) {
    let e = SplitVocabulary::<f64>::from_npz(
        path,
        &SplitVocabularyConfig {
            vocab_size: V,
            dim: 2,
            n_languages: L,
            gate_init: 0.0,
        },
    )
    .unwrap_err();
    let m = e.to_string();
    assert_eq!(e.file(), Some(path), "{m}");
    assert!(m.starts_with(&format!("{}: ", path.display())), "{m}");
    (e, m)
}

fn ids(v: &[i64]) -> Array1<i64> {
    arr1(v)
}

fn cleanup(path: &Path) {
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn split_vocabulary_index_loads_any_integer_dtype() {
    let path = index_file("ok", |w| {
        w.add("language_index", &arr1(&[2u8, 0, 1]))
            .add("token_index", &ids(&[9, 9, 0]));
    });
    let sv = SplitVocabulary::<f64>::from_npz(
        &path,
        &SplitVocabularyConfig {
            vocab_size: V,
            dim: 2,
            n_languages: L,
            gate_init: 0.5,
        },
    )
    .unwrap();
    assert_eq!(sv.n_rows(), 3);
    assert_eq!(sv.row_of(2, 9), Some(0));
    cleanup(&path);
}

#[test]
fn split_vocabulary_index_unreadable() {
    let path = scratch("unreadable").join("absent.npz");
    let (e, m) = load_error(&path);
    assert!(matches!(e.kind(), ErrorKind::Io(_)), "{m}");
    cleanup(&path);
}

#[test]
fn split_vocabulary_index_not_npz() {
    let path = scratch("not_npz").join("index.npz");
    std::fs::write(&path, b"language_index,token_index\n0,1\n").unwrap();
    let (e, m) = load_error(&path);
    assert!(matches!(e.kind(), ErrorKind::Format { .. }), "{m}");
    assert!(m.contains("not an npz"), "{m}");
    cleanup(&path);
}

#[test]
fn split_vocabulary_index_array_missing() {
    for (present, missing) in [
        ("language_index", "token_index"),
        ("token_index", "language_index"),
    ] {
        let path = index_file(&format!("missing_{missing}"), |w| {
            w.add(present, &ids(&[0, 1]));
        });
        let (e, m) = load_error(&path);
        assert!(matches!(e.kind(), ErrorKind::Missing), "{m}");
        assert_eq!(e.array(), Some(missing));
        assert!(m.contains(&format!("`{missing}`")), "{m}");
        cleanup(&path);
    }
}

#[test]
fn split_vocabulary_index_not_one_dimensional() {
    let path = index_file("not_1d", |w| {
        w.add("language_index", &ids(&[0, 1]))
            .add("token_index", &Array2::<i64>::zeros((2, 1)));
    });
    let (e, m) = load_error(&path);
    assert!(
        matches!(e.kind(), ErrorKind::Shape { found, .. } if found == &[2, 1]),
        "{m}"
    );
    assert_eq!(e.array(), Some("token_index"));
    assert!(m.contains("[2, 1]") && m.contains("1-D"), "{m}");
    cleanup(&path);
}

#[test]
fn split_vocabulary_index_not_integer() {
    let path = index_file("not_integer", |w| {
        w.add("language_index", &arr1(&[0.0f64, 1.0]))
            .add("token_index", &ids(&[0, 1]));
    });
    let (e, m) = load_error(&path);
    assert!(
        matches!(e.kind(), ErrorKind::Dtype { found, .. } if found == "float64"),
        "{m}"
    );
    assert_eq!(e.array(), Some("language_index"));
    assert!(m.contains("float64") && m.contains("integer"), "{m}");
    cleanup(&path);
}

#[test]
fn split_vocabulary_index_lengths_differ() {
    let path = index_file("lengths", |w| {
        w.add("language_index", &ids(&[0, 1, 2]))
            .add("token_index", &ids(&[4, 5]));
    });
    let (e, m) = load_error(&path);
    assert!(
        matches!(e.kind(), ErrorKind::Shape { found, .. } if found == &[2]),
        "{m}"
    );
    assert_eq!(e.array(), Some("token_index"));
    assert!(m.contains("(3,)") && m.contains("[2]"), "{m}");
    cleanup(&path);
}

#[test]
fn split_vocabulary_index_empty() {
    let path = index_file("empty", |w| {
        w.add("language_index", &ids(&[]))
            .add("token_index", &ids(&[]));
    });
    let (e, m) = load_error(&path);
    assert!(matches!(e.kind(), ErrorKind::Empty), "{m}");
    assert!(m.contains("language_index") && m.contains("empty"), "{m}");
    cleanup(&path);
}

#[test]
fn split_vocabulary_index_negative_value() {
    for (array, what) in [
        ("language_index", "language id"),
        ("token_index", "token id"),
    ] {
        let path = index_file(&format!("negative_{array}"), |w| {
            let (mut li, mut ti) = (ids(&[0, 1, 2]), ids(&[4, 5, 6]));
            let a = if array == "language_index" {
                &mut li
            } else {
                &mut ti
            };
            a[2] = -3;
            w.add("language_index", &li).add("token_index", &ti);
        });
        let (e, m) = load_error(&path);
        assert!(
            matches!(e.kind(), ErrorKind::OutOfRange { value: -3, position, .. } if position == &[2]),
            "{m}"
        );
        assert_eq!(e.array(), Some(array));
        assert!(
            m.ends_with(&format!(
                "{what} -3 at position [2] is out of range 0..{}",
                if array == "language_index" { L } else { V }
            )),
            "{m}"
        );
        cleanup(&path);
    }
}

#[test]
fn split_vocabulary_index_language_out_of_range() {
    let path = index_file("language_range", |w| {
        w.add("language_index", &ids(&[0, 3, 1]))
            .add("token_index", &ids(&[1, 1, 1]));
    });
    let (e, m) = load_error(&path);
    assert!(matches!(
        e.kind(),
        ErrorKind::OutOfRange {
            value: 3,
            low: 0,
            high: 3,
            ..
        }
    ));
    assert_eq!(e.array(), Some("language_index"));
    assert!(
        m.ends_with("array `language_index`: language id 3 at position [1] is out of range 0..3"),
        "{m}"
    );
    cleanup(&path);
}

#[test]
fn split_vocabulary_index_token_out_of_range() {
    let path = index_file("token_range", |w| {
        w.add("language_index", &ids(&[0, 1, 2, 0]))
            .add("token_index", &ids(&[9, 1, 0, 10]));
    });
    let (e, m) = load_error(&path);
    assert!(matches!(
        e.kind(),
        ErrorKind::OutOfRange {
            value: 10,
            low: 0,
            high: 10,
            ..
        }
    ));
    assert_eq!(e.array(), Some("token_index"));
    assert!(
        m.ends_with("array `token_index`: token id 10 at position [3] is out of range 0..10"),
        "{m}"
    );
    cleanup(&path);
}

#[test]
fn split_vocabulary_index_duplicate_pair() {
    let path = index_file("duplicate", |w| {
        w.add("language_index", &ids(&[2, 0, 1, 2]))
            .add("token_index", &ids(&[7, 7, 7, 7]));
    });
    let (e, m) = load_error(&path);
    assert!(matches!(
        e.kind(),
        ErrorKind::DuplicatePair {
            position: 3,
            first: 0,
            language: 2,
            token: 7
        }
    ));
    assert!(
        m.contains("language_index") && m.contains("token_index"),
        "{m}"
    );
    assert!(
        m.contains("(language 2, token 7)") && m.contains("[3]") && m.contains("[0]"),
        "{m}"
    );
    cleanup(&path);
}

#[test]
fn split_vocabulary_index_built_in_code_has_the_same_errors() {
    // The same checks for an index that did not come from a file.
    let new = |li: Vec<usize>, ti: Vec<usize>| {
        SplitVocabulary::<f64>::new(
            SplitIndex::new(li, ti),
            &SplitVocabularyConfig {
                vocab_size: V,
                dim: 2,
                n_languages: L,
                gate_init: 0.0,
            },
        )
        .unwrap_err()
    };
    assert!(matches!(new(vec![], vec![]).kind(), ErrorKind::Empty));
    assert!(matches!(
        new(vec![0, 1], vec![1]).kind(),
        ErrorKind::Shape { .. }
    ));
    assert!(matches!(
        new(vec![3], vec![1]).kind(),
        ErrorKind::OutOfRange { value: 3, .. }
    ));
    assert!(matches!(
        new(vec![0], vec![10]).kind(),
        ErrorKind::OutOfRange { value: 10, .. }
    ));
    assert!(matches!(
        new(vec![1, 1], vec![4, 4]).kind(),
        ErrorKind::DuplicatePair {
            position: 1,
            first: 0,
            ..
        }
    ));
}

// ---------------------------------------------------------------------------
// 1.3 SplitVocabulary: seed_from and forward
// ---------------------------------------------------------------------------

/// Pairs (0, 1), (2, 1), (1, 4) for V = 10, D = 2, L = 3.
fn layer() -> SplitVocabulary<f64> {
    SplitVocabulary::new(
        SplitIndex::new(vec![0, 2, 1], vec![1, 1, 4]),
        &SplitVocabularyConfig {
            vocab_size: V,
            dim: 2,
            n_languages: L,
            gate_init: 0.0,
        },
    )
    .unwrap()
}

#[test]
fn split_vocabulary_seed_from_shape_mismatch() {
    let mut sv = layer();
    for shape in [(V, 3), (V - 1, 2), (V + 1, 2)] {
        let e = sv.seed_from(Array2::zeros(shape).view()).unwrap_err();
        let m = e.to_string();
        assert!(
            matches!(e.kind(), ErrorKind::Shape { found, .. } if found == &[shape.0, shape.1]),
            "{m}"
        );
        assert!(
            m.contains(&format!("[{}, {}]", shape.0, shape.1)) && m.contains("(10, 2)"),
            "{m}"
        );
    }
    // Nothing was changed by the failed calls.
    assert!(sv.rows().value().iter().all(|&x| x == 0.0));
}

/// The error of a forward pass.
fn forward_error(tokens: &[i64], langs: &[i64], shared: &[usize]) -> Error {
    let sv = layer();
    let mut tape = Tape::new();
    let s = tape.input(ArrayD::zeros(IxDyn(shared)));
    sv.forward(&mut tape, tokens, langs, s, true).unwrap_err()
}

#[test]
fn split_vocabulary_forward_lengths_differ() {
    let e = forward_error(&[1, 4, 1], &[0, 1], &[3, 2]);
    let m = e.to_string();
    assert!(
        matches!(e.kind(), ErrorKind::Shape { found, .. } if found == &[2]),
        "{m}"
    );
    assert!(m.contains("language_ids") && m.contains('3'), "{m}");
}

#[test]
fn split_vocabulary_forward_token_id_out_of_range() {
    for bad in [10, -1] {
        let e = forward_error(&[1, bad, 1], &[0, 1, 2], &[3, 2]);
        assert!(matches!(
            e.kind(),
            ErrorKind::OutOfRange { value, low: 0, high: 10, .. } if *value == bad
        ));
        assert_eq!(
            e.to_string(),
            format!("token id {bad} at position [1] is out of range 0..10")
        );
    }
}

#[test]
fn split_vocabulary_forward_language_id_out_of_range() {
    for bad in [3, -2] {
        let e = forward_error(&[1, 4, 1], &[0, 1, bad], &[3, 2]);
        assert!(matches!(
            e.kind(),
            ErrorKind::OutOfRange { value, low: 0, high: 3, .. } if *value == bad
        ));
        assert_eq!(
            e.to_string(),
            format!("language id {bad} at position [2] is out of range 0..3")
        );
    }
}

#[test]
fn split_vocabulary_forward_shared_of_wrong_shape() {
    for shape in [vec![3, 3], vec![2, 2], vec![3, 2, 1], vec![6]] {
        let e = forward_error(&[1, 4, 1], &[0, 1, 2], &shape);
        let m = e.to_string();
        assert!(
            matches!(e.kind(), ErrorKind::Shape { found, .. } if found == &shape),
            "{m}"
        );
        assert!(m.contains("shared") && m.contains("(3, 2)"), "{m}");
    }
}
