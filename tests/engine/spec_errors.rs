//! The errors of `docs/spec.md#2-layers` through the layers' public API, as
//! one table: a row per error the specification lists (a row per value
//! where a case has several), each naming the call that fails, the
//! [`ErrorKind`] it must give, the array it must name, and what its
//! message must say (the split, the id and its range, the file, the
//! position, the value). A failing row is reported by its name.

use std::path::Path;

use ndarray::{Array2, ArrayD, IxDyn, array};
use splitgrad::io::SplitIndex;
use splitgrad::layers::{
    SplitLanguageModellingHead, SplitTokenEmbeddings, SplitVocabulary, SplitVocabularyConfig,
};
use splitgrad::{Error, ErrorKind, Tape};

use crate::common::table::Want::{self, Contains, EndsWith, Is, StartsWith};
use crate::common::table::run_rows;
use crate::io_common::Arr::{F64, I64, Zeros2};
use crate::io_common::{Arr, scratch, write_arrays};
use ErrorKind::{Config, Dtype, DuplicatePair, Empty, Format, Io, Missing, OutOfRange, Shape};

const L: usize = 3;
const V: usize = 10;

/// The split vocabulary's sizes: V = 10, D = 2, L = 3.
fn config() -> SplitVocabularyConfig {
    SplitVocabularyConfig::new(V, 2, L)
}

struct Row {
    name: &'static str,
    /// The failing call, given a fresh folder for the files it writes.
    error: fn(&Path) -> Error,
    /// The kind of error it must give.
    kind: fn(&ErrorKind) -> bool,
    /// The array the error must name.
    array: Option<&'static str>,
    /// Its message, `{dir}` standing for the folder.
    want: Want,
}

fn row(
    name: &'static str,
    error: fn(&Path) -> Error,
    kind: fn(&ErrorKind) -> bool,
    array: Option<&'static str>,
    want: Want,
) -> Row {
    Row {
        name,
        error,
        kind,
        array,
        want,
    }
}

/// The table. A row: its name, the failing call, the kind of error, the
/// array it names, its message.
#[rustfmt::skip]
fn rows() -> Vec<Row> {
    const LI: &str = "language_index";
    const TI: &str = "token_index";
    vec![
        // --- 1.1 SplitTokenEmbeddings and 1.2 SplitLanguageModellingHead:
        // construction (the two layers agree) ----------------------------
        row("split_layers_empty_order", |_| construction_error(&[("orig", 4)], &[], 8),
            |k| matches!(k, Config { .. }), None, Contains(&["split_order", "empty"])),
        row("split_layers_name_in_order_without_size", |_| construction_error(&[("orig", 4)], &["orig", "prompt"], 8),
            |k| matches!(k, Config { .. }), None, Contains(&["`prompt`", "no size"])),
        row("split_layers_name_twice_in_order",
            |_| construction_error(&[("orig", 4), ("prompt", 2)], &["orig", "prompt", "orig"], 8),
            |k| matches!(k, Config { .. }), None, Contains(&["`orig`", "twice"])),
        row("split_layers_sized_split_missing_from_order", |_| construction_error(&[("orig", 4), ("prompt", 2)], &["orig"], 8),
            |k| matches!(k, Config { .. }), None, Contains(&["`prompt`", "missing"])),
        row("split_layers_hidden_size_zero", |_| construction_error(&[("orig", 4)], &["orig"], 0),
            |k| matches!(k, Config { .. }), None, Contains(&["hidden_size", "0"])),
        // --- 1.1 SplitTokenEmbeddings: forward ---------------------------
        row("split_embeddings_id_out_of_range", |_| embedding_error(array![[0i64, 4], [5, 1]].into_dyn()),
            |k| matches!(k, OutOfRange { value: 5, low: 0, high: 5, .. }), None,
            Is("input id 5 at position [1, 0] is out of range 0..5")),
        row("split_embeddings_negative_id", |_| embedding_error(array![2i64, -1].into_dyn()),
            |k| matches!(k, OutOfRange { value: -1, low: 0, high: 5, .. }), None,
            Is("input id -1 at position [1] is out of range 0..5")),
        // --- 1.2 SplitLanguageModellingHead: labels (fused and naive agree)
        row("lm_head_label_out_of_range", |_| label_error(array![[0i64, -100], [4, 5]].into_dyn()),
            |k| matches!(k, OutOfRange { value: 5, low: 0, high: 5, .. }), None,
            Is("label 5 at position [1, 1] is out of range 0..5")),
        row("lm_head_negative_label_other_than_ignore_index", |_| label_error(array![-100i64, -1].into_dyn()),
            |k| matches!(k, OutOfRange { value: -1, .. }), None,
            Is("label -1 at position [1] is out of range 0..5")),
        row("lm_head_label_below_ignore_index", |_| label_error(array![-101i64].into_dyn()),
            |k| matches!(k, OutOfRange { value: -101, .. }), None,
            Is("label -101 at position [0] is out of range 0..5")),
        // --- 1.3 SplitVocabulary: the index file (the error names it) -----
        row("split_vocabulary_index_unreadable", |dir| load_error(&dir.join("absent.npz")),
            |k| matches!(k, Io(_)), None, StartsWith("{dir}/absent.npz: ")),
        row("split_vocabulary_index_not_npz", not_an_npz,
            |k| matches!(k, Format { .. }), None, Contains(&["not an npz"])),
        row("split_vocabulary_index_token_index_missing", |dir| index_error(dir, &[(LI, I64(&[0, 1]))]),
            |k| matches!(k, Missing), Some(TI), Contains(&["`token_index`"])),
        row("split_vocabulary_index_language_index_missing", |dir| index_error(dir, &[(TI, I64(&[0, 1]))]),
            |k| matches!(k, Missing), Some(LI), Contains(&["`language_index`"])),
        row("split_vocabulary_index_not_one_dimensional", |dir| index_error(dir, &[(LI, I64(&[0, 1])), (TI, Zeros2(2, 1))]),
            |k| matches!(k, Shape { found, .. } if found == &[2, 1]), Some(TI), Contains(&["[2, 1]", "1-D"])),
        row("split_vocabulary_index_not_integer", |dir| index_error(dir, &[(LI, F64(&[0.0, 1.0])), (TI, I64(&[0, 1]))]),
            |k| matches!(k, Dtype { found, .. } if found == "float64"), Some(LI), Contains(&["float64", "integer"])),
        row("split_vocabulary_index_lengths_differ", |dir| index_error(dir, &[(LI, I64(&[0, 1, 2])), (TI, I64(&[4, 5]))]),
            |k| matches!(k, Shape { found, .. } if found == &[2]), Some(TI), Contains(&["(3,)", "[2]"])),
        row("split_vocabulary_index_empty", |dir| index_error(dir, &[(LI, I64(&[])), (TI, I64(&[]))]),
            |k| matches!(k, Empty), None, Contains(&["language_index", "empty"])),
        row("split_vocabulary_index_negative_language_id", |dir| index_error(dir, &[(LI, I64(&[0, 1, -3])), (TI, I64(&[4, 5, 6]))]),
            |k| matches!(k, OutOfRange { value: -3, position, .. } if position == &[2]), Some(LI),
            EndsWith("language id -3 at position [2] is out of range 0..3")),
        row("split_vocabulary_index_negative_token_id", |dir| index_error(dir, &[(LI, I64(&[0, 1, 2])), (TI, I64(&[4, 5, -3]))]),
            |k| matches!(k, OutOfRange { value: -3, position, .. } if position == &[2]), Some(TI),
            EndsWith("token id -3 at position [2] is out of range 0..10")),
        row("split_vocabulary_index_language_out_of_range", |dir| index_error(dir, &[(LI, I64(&[0, 3, 1])), (TI, I64(&[1, 1, 1]))]),
            |k| matches!(k, OutOfRange { value: 3, low: 0, high: 3, .. }), Some(LI),
            EndsWith("array `language_index`: language id 3 at position [1] is out of range 0..3")),
        row("split_vocabulary_index_token_out_of_range", |dir| index_error(dir, &[(LI, I64(&[0, 1, 2, 0])), (TI, I64(&[9, 1, 0, 10]))]),
            |k| matches!(k, OutOfRange { value: 10, low: 0, high: 10, .. }), Some(TI),
            EndsWith("array `token_index`: token id 10 at position [3] is out of range 0..10")),
        row("split_vocabulary_index_duplicate_pair", |dir| index_error(dir, &[(LI, I64(&[2, 0, 1, 2])), (TI, I64(&[7, 7, 7, 7]))]),
            |k| matches!(k, DuplicatePair { position: 3, first: 0, language: 2, token: 7 }), None,
            Contains(&["language_index", "token_index", "(language 2, token 7)", "[3]", "[0]"])),
        // --- 1.3 SplitVocabulary: an index built in code, the same checks
        row("split_vocabulary_built_index_empty", |_| built_error(vec![], vec![]),
            |k| matches!(k, Empty), None, Contains(&["language_index", "empty"])),
        row("split_vocabulary_built_index_lengths_differ", |_| built_error(vec![0, 1], vec![1]),
            |k| matches!(k, Shape { .. }), Some(TI), Contains(&["(2,)", "[1]"])),
        row("split_vocabulary_built_index_language_out_of_range", |_| built_error(vec![3], vec![1]),
            |k| matches!(k, OutOfRange { value: 3, .. }), Some(LI),
            EndsWith("language id 3 at position [0] is out of range 0..3")),
        row("split_vocabulary_built_index_token_out_of_range", |_| built_error(vec![0], vec![10]),
            |k| matches!(k, OutOfRange { value: 10, .. }), Some(TI),
            EndsWith("token id 10 at position [0] is out of range 0..10")),
        row("split_vocabulary_built_index_duplicate_pair", |_| built_error(vec![1, 1], vec![4, 4]),
            |k| matches!(k, DuplicatePair { position: 1, first: 0, .. }), None,
            Contains(&["(language 1, token 4)", "[1]", "[0]"])),
        // --- 1.3 SplitVocabulary: seed_from (a failed call changes nothing)
        row("split_vocabulary_seed_from_too_wide", |_| seed_error((V, 3)),
            |k| matches!(k, Shape { found, .. } if found == &[V, 3]), None, Contains(&["[10, 3]", "(10, 2)"])),
        row("split_vocabulary_seed_from_too_few_rows", |_| seed_error((V - 1, 2)),
            |k| matches!(k, Shape { found, .. } if found == &[V - 1, 2]), None, Contains(&["[9, 2]", "(10, 2)"])),
        row("split_vocabulary_seed_from_too_many_rows", |_| seed_error((V + 1, 2)),
            |k| matches!(k, Shape { found, .. } if found == &[V + 1, 2]), None, Contains(&["[11, 2]", "(10, 2)"])),
        // --- 1.3 SplitVocabulary: forward --------------------------------
        row("split_vocabulary_forward_lengths_differ", |_| forward_error(&[1, 4, 1], &[0, 1], &[3, 2]),
            |k| matches!(k, Shape { found, .. } if found == &[2]), None, Contains(&["language_ids", "3"])),
        row("split_vocabulary_forward_token_id_past_the_vocabulary", |_| forward_error(&[1, 10, 1], &[0, 1, 2], &[3, 2]),
            |k| matches!(k, OutOfRange { value: 10, low: 0, high: 10, .. }), None,
            Is("token id 10 at position [1] is out of range 0..10")),
        row("split_vocabulary_forward_negative_token_id", |_| forward_error(&[1, -1, 1], &[0, 1, 2], &[3, 2]),
            |k| matches!(k, OutOfRange { value: -1, low: 0, high: 10, .. }), None,
            Is("token id -1 at position [1] is out of range 0..10")),
        row("split_vocabulary_forward_language_id_past_the_languages", |_| forward_error(&[1, 4, 1], &[0, 1, 3], &[3, 2]),
            |k| matches!(k, OutOfRange { value: 3, low: 0, high: 3, .. }), None,
            Is("language id 3 at position [2] is out of range 0..3")),
        row("split_vocabulary_forward_negative_language_id", |_| forward_error(&[1, 4, 1], &[0, 1, -2], &[3, 2]),
            |k| matches!(k, OutOfRange { value: -2, low: 0, high: 3, .. }), None,
            Is("language id -2 at position [2] is out of range 0..3")),
        row("split_vocabulary_forward_shared_too_wide", |_| forward_error(&[1, 4, 1], &[0, 1, 2], &[3, 3]),
            |k| matches!(k, Shape { found, .. } if found == &[3, 3]), None, Contains(&["shared", "(3, 2)"])),
        row("split_vocabulary_forward_shared_too_few_rows", |_| forward_error(&[1, 4, 1], &[0, 1, 2], &[2, 2]),
            |k| matches!(k, Shape { found, .. } if found == &[2, 2]), None, Contains(&["shared", "(3, 2)"])),
        row("split_vocabulary_forward_shared_of_rank_three", |_| forward_error(&[1, 4, 1], &[0, 1, 2], &[3, 2, 1]),
            |k| matches!(k, Shape { found, .. } if found == &[3, 2, 1]), None, Contains(&["shared", "(3, 2)"])),
        row("split_vocabulary_forward_shared_of_rank_one", |_| forward_error(&[1, 4, 1], &[0, 1, 2], &[6]),
            |k| matches!(k, Shape { found, .. } if found == &[6]), None, Contains(&["shared", "(3, 2)"])),
    ]
}

#[test]
fn the_specified_errors() {
    let rows = rows();
    assert_eq!(rows.len(), 40);
    run_rows(
        &rows,
        |r| r.name,
        |row| {
            let dir = scratch(&format!("spec_errors/{}", row.name));
            let e = (row.error)(&dir);
            let m = e.to_string();
            assert!((row.kind)(e.kind()), "{:?}: {m}", e.kind());
            if let Some(array) = row.array {
                assert_eq!(e.array(), Some(array), "{m}");
            }
            row.want.check(&m, dir.to_str().unwrap());
            let _ = std::fs::remove_dir_all(&dir);
        },
    );
}

#[test]
fn split_vocabulary_index_loads_any_integer_dtype() {
    let dir = scratch("spec_errors/ok");
    let path = dir.join("index.npz");
    let mut w = splitgrad::io::NpzWriter::new(&path);
    w.add("language_index", &ndarray::arr1(&[2u8, 0, 1]))
        .add("token_index", &ndarray::arr1(&[9i64, 9, 0]));
    w.finish().unwrap();
    let config = SplitVocabularyConfig {
        gate_init: 0.5,
        ..config()
    };
    let sv = SplitVocabulary::<f64>::from_npz(&path, &config).unwrap();
    assert_eq!(sv.n_rows(), 3);
    assert_eq!(sv.row_of(2, 9), Some(0));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The construction error of both split layers, which must agree.
fn construction_error(sizes: &[(&str, usize)], order: &[&str], hidden: usize) -> Error {
    let e = SplitTokenEmbeddings::<f32>::new(sizes, order, hidden).unwrap_err();
    let h = SplitLanguageModellingHead::<f32>::new(sizes, order, hidden).unwrap_err();
    assert!(matches!(h.kind(), Config { .. }), "{h:?}");
    assert_eq!(e.to_string(), h.to_string());
    e
}

/// The error of a forward pass on ids, V = 5 (splits of 3 and 2).
fn embedding_error(ids: ArrayD<i64>) -> Error {
    let e =
        SplitTokenEmbeddings::<f64>::new(&[("orig", 3), ("new", 2)], &["orig", "new"], 2).unwrap();
    let mut tape = Tape::new();
    e.forward(&mut tape, ids.view()).unwrap_err()
}

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

/// An index file that is a CSV text.
fn not_an_npz(dir: &Path) -> Error {
    let path = dir.join("index.npz");
    std::fs::write(&path, b"language_index,token_index\n0,1\n").unwrap();
    load_error(&path)
}

/// Loads the layer from an index file and returns the error, checking
/// that it names the file.
fn load_error(path: &Path) -> Error {
    let e = SplitVocabulary::<f64>::from_npz(path, &config()).unwrap_err();
    let m = e.to_string();
    assert_eq!(e.file(), Some(path), "{m}");
    assert!(m.starts_with(&format!("{}: ", path.display())), "{m}");
    e
}

/// [`load_error`] of `dir/index.npz` holding these arrays.
fn index_error(dir: &Path, arrays: &[(&str, Arr)]) -> Error {
    load_error(&write_arrays(dir, "index.npz", arrays))
}

/// The error of the layer on an index that did not come from a file.
fn built_error(languages: Vec<usize>, tokens: Vec<usize>) -> Error {
    SplitVocabulary::<f64>::new(SplitIndex::new(languages, tokens), &config()).unwrap_err()
}

/// Pairs (0, 1), (2, 1), (1, 4).
fn layer() -> SplitVocabulary<f64> {
    SplitVocabulary::new(SplitIndex::new(vec![0, 2, 1], vec![1, 1, 4]), &config()).unwrap()
}

/// The error of `seed_from` on a table of this shape, checking the call
/// changed nothing.
fn seed_error(shape: (usize, usize)) -> Error {
    let mut sv = layer();
    let e = sv.seed_from(Array2::zeros(shape).view()).unwrap_err();
    assert!(sv.rows().value().iter().all(|&x| x == 0.0));
    e
}

/// The error of a forward pass.
fn forward_error(tokens: &[i64], langs: &[i64], shared: &[usize]) -> Error {
    let sv = layer();
    let mut tape = Tape::new();
    let s = tape.input(ArrayD::zeros(IxDyn(shared)));
    sv.forward(&mut tape, tokens, langs, s, true).unwrap_err()
}
