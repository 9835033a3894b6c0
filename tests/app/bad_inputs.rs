//! The table of bad inputs (`docs/bad-inputs.md`), rows 1–43 as one table
//! in the document's order: each row feeds the program one bad input it
//! can meet and checks the error it gets. A failing row is reported by
//! its name, `rNN_…` after its row in the document.
//!
//! Rows run through the command line (`splitgrad train …`) unless the
//! input cannot reach it (a full disk). Every CLI row checks that the run
//! fails with status 1 (2 and clap's usage for clap's own errors), that
//! standard error is one line `splitgrad: error: …`, that nothing
//! panicked, and that no file under the row's folder changed (the output
//! folder holds a file written before the run).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use ndarray::Array1;
use splitgrad::checkpoint::{self, Checkpoint, TensorData, TensorRef};
use splitgrad::io::{NpzWriter, write_atomic};
use splitgrad::{ErrorKind, Result};

use crate::common::cli::{self, s, small_corpus};
use crate::common::table::{Want, run_rows};
use crate::io_common::{Arr, write_arrays};

/// Fast training flags for runs on [`small_corpus`].
const FAST: [&str; 8] = [
    "--steps",
    "2",
    "--batch",
    "64",
    "--dim",
    "4",
    "--min-count",
    "1",
];

use Arr::{F32, F64, I64};

/// How a row makes its bad input, and how it runs into it.
enum Input {
    /// `train --corpus` [`small_corpus`] `--index index.npz` of these
    /// arrays, [`FAST`].
    Index(&'static [(&'static str, Arr)]),
    /// `train --corpus corpus.npz` of these arrays, [`FAST`].
    Corpus(&'static [(&'static str, Arr)]),
    /// `train --corpus corpus.npz` of these bytes, [`FAST`].
    CorpusBytes(&'static [u8]),
    /// `train --resume` of [`trained`]'s run (4 steps) after `edit` on its
    /// checkpoint, with these flags besides (`--dim 4` unless they give
    /// one).
    Resume(fn(&Path), &'static [&'static str]),
    /// `train` with these flags alone.
    Flags(&'static [&'static str]),
    /// `train` with these flags, which clap rejects.
    Clap(&'static [&'static str]),
    /// Writes what the row needs and returns the `train` arguments.
    Train(fn(&Path) -> Vec<String>),
    /// Calls the library; the error's message, or `None` where this system
    /// cannot arrange the input (it says so).
    Library(fn(&Path) -> Option<String>),
}

use Input::{Clap, Corpus, CorpusBytes, Flags, Index, Library, Resume, Train};

struct Row {
    name: &'static str,
    input: Input,
    /// The message after `splitgrad: error: ` (all of a library row's,
    /// all of clap's line), `{dir}` standing for the row's folder.
    want: Want,
    /// A check of the folder after the run.
    then: Option<fn(&Path)>,
}

fn row(name: &'static str, input: Input, want: Want) -> Row {
    Row {
        name,
        input,
        want,
        then: None,
    }
}

/// `row` with a message to match whole.
fn is(name: &'static str, input: Input, message: &'static str) -> Row {
    row(name, input, Want::Is(message))
}

/// The table, in the document's order. A row: its name, its input, the
/// message it gets.
#[rustfmt::skip]
fn rows() -> Vec<Row> {
    const L: &str = "language_index";
    const T: &str = "token_index";
    const TOKENS: &str = "token_ids";
    const LANGS: &str = "language_ids";
    const STARTS: &str = "sequence_starts";
    vec![
        // --- the index ---------------------------------------------------
        is("r01_index_token_id_out_of_range", Train(index_of_the_synthetic_corpus),
            "{dir}/index.npz: array `token_index`: token id 500 at position [1] is out of range 0..500"),
        is("r02_index_negative_language_id", Index(&[(L, I64(&[0, -1])), (T, I64(&[3, 2]))]),
            "{dir}/index.npz: array `language_index`: language id -1 at position [1] is out of range 0..2"),
        is("r03_index_lengths_differ", Index(&[(L, I64(&[0, 1, 1])), (T, I64(&[3, 2]))]),
            "{dir}/index.npz: array `token_index`: token_index has shape [2], expected (3,), the length of language_index"),
        is("r04_index_float_ids", Index(&[(L, F64(&[0.0, 1.0])), (T, I64(&[3, 2]))]),
            "{dir}/index.npz: array `language_index`: has dtype float64, expected an integer dtype (int8 … int64, uint8 … uint64)"),
        is("r05_index_integer_score", Index(&[(L, I64(&[0, 1])), (T, I64(&[3, 2])), ("score", I64(&[1, 2]))]),
            "{dir}/index.npz: array `score`: has dtype int64, expected float32 or float64"),
        is("r06_index_duplicate_pair", Index(&[(L, I64(&[0, 1, 0])), (T, I64(&[3, 3, 3]))]),
            "{dir}/index.npz: array `(language_index, token_index)`: pair (language 0, token 3) at position [2] repeats position [0]"),
        is("r07_index_empty", Index(&[(L, I64(&[])), (T, I64(&[]))]),
            "{dir}/index.npz: array `language_index`: is empty"),
        is("r08_index_nan_score", Index(&[(L, I64(&[0, 1])), (T, I64(&[3, 2])), ("score", F64(&[0.5, f64::NAN]))]),
            "{dir}/index.npz: array `score`: non-finite value NaN at position [1]"),
        is("r09_index_infinite_score", Index(&[(L, I64(&[0, 1])), (T, I64(&[3, 2])), ("score", F32(&[f32::NEG_INFINITY, 0.5]))]),
            "{dir}/index.npz: array `score`: non-finite value -inf at position [0]"),
        is("r10_index_missing_array", Index(&[(L, I64(&[0, 1])), ("tokens", I64(&[3, 2]))]),
            "{dir}/index.npz: array `token_index`: is missing"),
        is("r11_index_not_one_dimensional", Index(&[(L, Arr::Zeros2(2, 1)), (T, I64(&[3, 2]))]),
            "{dir}/index.npz: array `language_index`: language_index has shape [2, 1], expected 1-D"),
        // --- the corpus --------------------------------------------------
        is("r12_corpus_nonexistent", Train(|_| with_fast(&["--corpus", "missing.npz"])),
            "missing.npz: No such file or directory (os error 2)"),
        is("r13_corpus_not_an_npz", CorpusBytes(b"token_ids,language_ids\n1,0\n2,0\n"),
            "{dir}/corpus.npz: not an npz file (no readable zip directory): Could not find central directory end"),
        is("r14_corpus_empty_file", CorpusBytes(b""),
            "{dir}/corpus.npz: not an npz file (no readable zip directory): Invalid zip header"),
        is("r15_corpus_truncated_file", Train(truncated_corpus),
            "{dir}/corpus.npz: not an npz file (no readable zip directory): Could not find central directory end"),
        is("r16_corpus_negative_token_id", Corpus(&[(TOKENS, I64(&[1, -3, 2])), (LANGS, I64(&[0, 0, 0]))]),
            "{dir}/corpus.npz: array `token_ids`: token id -3 at position [1] is out of range 0..4294967296"),
        is("r17_corpus_lengths_differ", Corpus(&[(TOKENS, I64(&[1, 2, 3])), (LANGS, I64(&[0, 0]))]),
            "{dir}/corpus.npz: array `language_ids`: language_ids has shape [2], expected (3,), the length of token_ids"),
        is("r18_corpus_float_ids_with_nan", Corpus(&[(TOKENS, F64(&[1.0, f64::NAN, 2.0])), (LANGS, I64(&[0, 0, 0]))]),
            "{dir}/corpus.npz: array `token_ids`: has dtype float64, expected an integer dtype (int8 … int64, uint8 … uint64)"),
        is("r19_corpus_sequence_starts_not_sorted",
            Corpus(&[(TOKENS, I64(&[1, 2, 3, 1, 2])), (LANGS, I64(&[0, 0, 0, 0, 0])), (STARTS, I64(&[0, 3, 2]))]),
            "{dir}/corpus.npz: array `sequence_starts`: sequence start 2 at position [2] does not exceed the one before it, 3"),
        is("r20_corpus_sequence_start_out_of_range",
            Corpus(&[(TOKENS, I64(&[1, 2, 3, 1, 2])), (LANGS, I64(&[0, 0, 0, 0, 0])), (STARTS, I64(&[0, 2, 5]))]),
            "{dir}/corpus.npz: array `sequence_starts`: sequence start 5 at position [2] is out of range 0..5"),
        is("r21_corpus_empty", Corpus(&[(TOKENS, I64(&[])), (LANGS, I64(&[]))]),
            "{dir}/corpus.npz: array `token_ids`: is empty"),
        is("r22_corpus_single_token", Corpus(&[(TOKENS, I64(&[7])), (LANGS, I64(&[0]))]),
            "{dir}/corpus.npz: no bigram to train on: every sequence holds a single token"),
        // --- the checkpoint ----------------------------------------------
        is("r23_checkpoint_of_another_dim", Resume(|_| {}, &["--dim", "8"]),
            "{dir}/out/model.safetensors: the checkpoint was written with dim = 4, this run has 8"),
        is("r24_checkpoint_missing_tensor", Resume(without_the_head, &[]),
            "{dir}/out/model.safetensors: array `lm_head.vocab.weight`: is missing"),
        is("r25_checkpoint_nan_weight", Resume(nan_in_the_rows, &[]),
            "{dir}/out/model.safetensors: array `split_vocabulary.rows`: non-finite value NaN at position [0, 1]"),
        is("r26_checkpoint_infinite_optimiser_state", Resume(inf_in_exp_avg_sq, &[]),
            "{dir}/out/model.safetensors: array `optimizer.dense.lm_head.vocab.weight.exp_avg_sq`: non-finite value inf at position [0, 1]"),
        row("r27_checkpoint_truncated", Resume(truncate, &[]),
            Want::StartsWith("{dir}/out/model.safetensors: not a valid safetensors file: ")),
        is("r28_checkpoint_of_another_corpus", Resume(another_corpus, &[]),
            "{dir}/out/model.safetensors: the checkpoint was written for another corpus (or another held-out split of it)"),
        is("r29_resume_without_checkpoint", Train(|dir| { small_corpus(dir); resume_args(dir, &[]) }),
            "{dir}/out/model.safetensors: --resume, but there is no checkpoint to resume from"),
        // --- the output --------------------------------------------------
        is("r30_out_under_a_file", Train(out_under_a_file),
            "{dir}/notes.txt/run: cannot create the output folder: Not a directory (os error 20)"),
        Row { then: Some(no_temporary_left),
            ..is("r31_checkpoint_path_is_a_folder", Train(checkpoint_path_is_a_folder),
                "{dir}/out/model.safetensors: is a folder, not a file") },
        is("r32_full_disk_during_an_atomic_write", Library(full_disk_during_an_atomic_write),
            "{dir}/model.safetensors: No space left on device (os error 28)"),
        row("r33_full_disk_under_the_npz_writer", Library(full_disk_under_the_npz_writer),
            Want::EndsWith("No space left on device (os error 28)")),
        // --- the flags ---------------------------------------------------
        is("r34_unknown_flag", Clap(&["--bogus"]), "error: unexpected argument '--bogus' found"),
        is("r35_steps_not_a_number", Clap(&["--steps", "abc"]),
            "error: invalid value 'abc' for '--steps <STEPS>': invalid digit found in string"),
        is("r36_batch_zero", Flags(&["--batch", "0"]), "--batch must be at least 1"),
        is("r37_dim_zero", Flags(&["--dim", "0"]), "--dim must be at least 1"),
        is("r38_negative_learning_rate", Flags(&["--lr=-1"]), "--lr must be a finite number > 0, got -1"),
        is("r39_nan_learning_rate", Flags(&["--lr", "NaN"]), "--lr must be a finite number > 0, got NaN"),
        is("r40_infinite_penalty_weight", Flags(&["--gate-penalty", "inf"]), "--gate-penalty must be a finite number ≥ 0, got inf"),
        is("r41_threads_zero", Flags(&["--threads", "0"]), "--threads must be at least 1"),
        is("r42_checkpoint_every_zero", Flags(&["--checkpoint-every", "0"]), "--checkpoint-every must be at least 1"),
        // A token id far past the corpus's vocabulary is an error, not a
        // vocabulary of 10^12 rows.
        is("r43_index_token_the_corpus_never_reaches", Index(&[(L, I64(&[0, 1])), (T, I64(&[3, 1_000_000_000_000]))]),
            "{dir}/index.npz: array `token_index`: token id 1000000000000 at position [1] is out of range 0..4"),
    ]
}

// ---------------------------------------------------------------------------
// The inputs of the rows that make their own.

/// Row 1: without --corpus, the index is checked against the synthetic
/// corpus.
fn index_of_the_synthetic_corpus(dir: &Path) -> Vec<String> {
    let arrays = [
        ("language_index", I64(&[0, 1])),
        ("token_index", I64(&[3, 500])),
    ];
    let idx = write_arrays(dir, "index.npz", &arrays);
    args(&["--index", s(&idx), "--steps", "2", "--batch", "64"])
}

/// Row 15: the first half of a valid corpus.
fn truncated_corpus(dir: &Path) -> Vec<String> {
    let c = small_corpus(dir);
    truncate(&c);
    with_fast(&["--corpus", s(&c)])
}

/// Row 24.
fn without_the_head(ck: &Path) {
    rewrite_checkpoint(ck, |t| t.retain(|(n, _)| n != "lm_head.vocab.weight"));
}

/// Row 25.
fn nan_in_the_rows(ck: &Path) {
    rewrite_checkpoint(ck, |t| poison(t, "split_vocabulary.rows", f32::NAN));
}

/// Row 26.
fn inf_in_exp_avg_sq(ck: &Path) {
    let name = "optimizer.dense.lm_head.vocab.weight.exp_avg_sq";
    rewrite_checkpoint(ck, |t| poison(t, name, f32::INFINITY));
}

/// Row 28: the corpus beside the run, one token changed.
fn another_corpus(ck: &Path) {
    let dir = ck.parent().unwrap().parent().unwrap();
    let arrays = [
        ("token_ids", I64(&[1, 2, 3, 1, 2, 0, 3, 3])),
        ("language_ids", I64(&[0, 0, 0, 1, 1, 1, 0, 0])),
        ("sequence_starts", I64(&[0, 5])),
    ];
    write_arrays(dir, "corpus.npz", &arrays);
}

/// Row 30: `--out` under a file.
fn out_under_a_file(dir: &Path) -> Vec<String> {
    let c = small_corpus(dir);
    fs::write(dir.join("notes.txt"), "a file, not a folder").unwrap();
    let out = dir.join("notes.txt").join("run");
    with_fast(&["--corpus", s(&c), "--out", s(&out)])
}

/// Row 31: a folder where the checkpoint goes.
fn checkpoint_path_is_a_folder(dir: &Path) -> Vec<String> {
    let c = small_corpus(dir);
    fs::create_dir(out_folder(dir).join("model.safetensors")).unwrap();
    with_fast(&["--corpus", s(&c)])
}

/// After row 31: the output folder holds the file written before the run
/// and the folder, nothing else.
fn no_temporary_left(dir: &Path) {
    let names: Vec<_> = fs::read_dir(dir.join("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "a temporary file was left: {names:?}");
}

#[test]
fn bad_inputs_rows_1_to_43() {
    let rows = rows();
    assert_eq!(rows.len(), 43);
    run_rows(&rows, |r| r.name, check);
}

/// Makes the row's input in a fresh folder, runs into it, and checks the
/// error.
fn check(row: &Row) {
    let dir = cli::scratch("bad_inputs", &row.name[..3]);
    let train = |args: Vec<String>| train_fails(&dir, &args);
    let message = match &row.input {
        Index(arrays) => {
            let c = small_corpus(&dir);
            let idx = write_arrays(&dir, "index.npz", arrays);
            train(with_fast(&["--corpus", s(&c), "--index", s(&idx)]))
        }
        Corpus(arrays) => {
            let c = write_arrays(&dir, "corpus.npz", arrays);
            train(with_fast(&["--corpus", s(&c)]))
        }
        CorpusBytes(bytes) => {
            let c = dir.join("corpus.npz");
            fs::write(&c, bytes).unwrap();
            train(with_fast(&["--corpus", s(&c)]))
        }
        Resume(edit, extra) => {
            edit(&trained(&dir));
            train(resume_args(&dir, extra))
        }
        Flags(flags) => train(args(flags)),
        Clap(flags) => cli::clap_fails(&dir, &[&["train"][..], flags].concat()),
        Train(setup) => train(setup(&dir)),
        Library(call) => match call(&dir) {
            Some(message) => message,
            None => return,
        },
    };
    row.want.check(&message, s(&dir));
    if let Some(then) = row.then {
        then(&dir);
    }
}

fn args(flags: &[&str]) -> Vec<String> {
    flags.iter().map(|f| f.to_string()).collect()
}

/// `flags` and [`FAST`].
fn with_fast(flags: &[&str]) -> Vec<String> {
    args(&[flags, &FAST].concat())
}

/// The output folder of a row, holding a file that must survive.
fn out_folder(dir: &Path) -> PathBuf {
    let out = dir.join("out");
    fs::create_dir_all(&out).unwrap();
    fs::write(out.join("keep.txt"), "written before the run").unwrap();
    out
}

/// Runs `splitgrad train ARGS --out OUT` (OUT unless ARGS names one) and
/// checks the failure ([`cli::fails`]); returns the message.
fn train_fails(dir: &Path, args: &[String]) -> String {
    let out = out_folder(dir);
    let mut all = vec!["train"];
    all.extend(args.iter().map(String::as_str));
    if !all.contains(&"--out") {
        all.extend(["--out", s(&out)]);
    }
    cli::fails(dir, &all, None)
}

/// Trains two steps on [`small_corpus`] into `dir/out` and returns the
/// checkpoint's path.
fn trained(dir: &Path) -> PathBuf {
    let c = small_corpus(dir);
    let out = dir.join("out");
    let mut args = vec!["train", "--corpus", s(&c), "--out", s(&out)];
    args.extend(FAST);
    cli::run_ok(dir, &args);
    out.join("model.safetensors")
}

/// `--resume` of [`trained`]'s run, 4 steps, `extra` besides.
fn resume_args(dir: &Path, extra: &[&str]) -> Vec<String> {
    let c = dir.join("corpus.npz");
    let mut all = vec!["--corpus", s(&c), "--resume"];
    all.extend(["--steps", "4", "--batch", "64", "--min-count", "1"]);
    all.extend_from_slice(extra);
    if !extra.contains(&"--dim") {
        all.extend(["--dim", "4"]);
    }
    args(&all)
}

/// Cuts a file to its first half.
fn truncate(path: &Path) {
    let bytes = fs::read(path).unwrap();
    fs::write(path, &bytes[..bytes.len() / 2]).unwrap();
}

/// Rewrites a checkpoint through `edit` on its (name, tensor) list.
fn rewrite_checkpoint(path: &Path, edit: impl FnOnce(&mut Vec<(String, TensorData)>)) {
    let ck = Checkpoint::open(path).unwrap();
    let mut tensors: Vec<(String, TensorData)> = ck
        .names()
        .iter()
        .map(|n| (n.to_string(), ck.get(n).unwrap()))
        .collect();
    let meta = ck.metadata().clone();
    edit(&mut tensors);
    let entries: Vec<(&str, TensorRef<'_>)> = tensors
        .iter()
        .map(|(n, t)| (n.as_str(), t.view()))
        .collect();
    checkpoint::save(path, &entries, &meta).unwrap();
}

/// Sets the second element of the F32 tensor `name` to `value`.
fn poison(tensors: &mut [(String, TensorData)], name: &str, value: f32) {
    let (_, t) = tensors.iter_mut().find(|(n, _)| n == name).unwrap();
    let TensorData::F32(a) = t else {
        panic!("{name} is not F32")
    };
    *a.iter_mut().nth(1).unwrap() = value;
}

/// Whether `/dev/full` is there to stand in for a full disk (it says so
/// when it is not).
fn have_dev_full() -> bool {
    let there = Path::new("/dev/full").exists();
    if !there {
        eprintln!("skipped: this system has no /dev/full to simulate a full disk");
    }
    there
}

/// A writer that hits a full disk: it copies what it has into `/dev/full`,
/// which fails every write with ENOSPC.
fn write_to_full_disk(f: &mut std::io::BufWriter<fs::File>) -> Result<()> {
    f.write_all(b"half of a new file")?;
    let mut full = fs::OpenOptions::new().write(true).open("/dev/full")?;
    full.write_all(&[0u8; 1 << 16])?;
    full.flush()?;
    Ok(())
}

/// Row 32: the last good file stays, and no temporary is left.
fn full_disk_during_an_atomic_write(dir: &Path) -> Option<String> {
    let path = dir.join("model.safetensors");
    fs::write(&path, "the last good checkpoint").unwrap();
    if !have_dev_full() {
        return None;
    }
    let e = write_atomic(&path, write_to_full_disk).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Io(io) if io.raw_os_error() == Some(28)));
    assert_eq!(fs::read(&path).unwrap(), b"the last good checkpoint");
    assert_eq!(
        fs::read_dir(dir).unwrap().count(),
        1,
        "a temporary file was left"
    );
    Some(e.to_string())
}

/// Row 33: the npz writer passes the full disk's error on.
fn full_disk_under_the_npz_writer(_: &Path) -> Option<String> {
    if !have_dev_full() {
        return None;
    }
    let mut w = NpzWriter::new("unused.npz");
    w.add("token_ids", &Array1::<i64>::zeros(100_000));
    let full = fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let e = w.write_to(full).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Io(_)), "{e}");
    Some(e.to_string())
}
