//! The table of bad inputs (`docs/bad-inputs.md`): one test per row, in
//! the table's order. Each feeds the program one bad input it can meet and
//! checks the error it gets.
//!
//! Rows run through the command line (`splitgrad train …`) unless the
//! input cannot reach it (a full disk). Every CLI row checks that the run
//! fails with a non-zero status, that standard error is one line (clap's
//! own errors add its usage, as clap prints them), that nothing panicked,
//! and that the files already in the output folder are left as they were.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use ndarray::{Array2, arr1};
use splitgrad::checkpoint::{self, Checkpoint, TensorData, TensorRef};
use splitgrad::io::{NpzWriter, write_atomic};
use splitgrad::{ErrorKind, Result};

// ---------------------------------------------------------------------------
// Harness

/// A fresh folder for one row.
fn scratch(row: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("bad_inputs")
        .join(row);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes an `.npz` at `dir/name` and returns its path.
fn npz(dir: &Path, name: &str, fill: impl FnOnce(&mut NpzWriter)) -> PathBuf {
    let path = dir.join(name);
    let mut w = NpzWriter::new(&path);
    fill(&mut w);
    w.finish().unwrap();
    path
}

/// A small valid corpus: 4 tokens, 2 languages, 2 sequences.
fn corpus(dir: &Path) -> PathBuf {
    npz(dir, "corpus.npz", |w| {
        w.add("token_ids", &arr1(&[1i64, 2, 3, 1, 2, 0, 3, 2]))
            .add("language_ids", &arr1(&[0i64, 0, 0, 1, 1, 1, 0, 0]))
            .add("sequence_starts", &arr1(&[0i64, 5]));
    })
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Fast training flags for runs on [`corpus`].
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

/// The output folder of a row, holding a file that must survive.
fn out_folder(dir: &Path) -> PathBuf {
    let out = dir.join("out");
    fs::create_dir_all(&out).unwrap();
    fs::write(out.join("keep.txt"), "written before the run").unwrap();
    out
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for e in entries {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(snapshot(&p));
        } else {
            out.insert(p.clone(), fs::read(&p).unwrap());
        }
    }
    out
}

fn splitgrad(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_splitgrad"))
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

/// Runs `splitgrad train ARGS --out OUT` (OUT unless ARGS names one) and
/// checks the failure; returns the one line of standard error.
fn train_fails(dir: &Path, args: &[&str]) -> String {
    let out = out_folder(dir);
    let mut all = vec!["train"];
    all.extend_from_slice(args);
    if !args.contains(&"--out") {
        all.extend(["--out", s(&out)]);
    }
    let before = snapshot(dir);
    let run = splitgrad(dir, &all);
    let stderr = String::from_utf8(run.stderr).unwrap();
    assert!(!run.status.success(), "{all:?} succeeded");
    assert!(!stderr.contains("panicked"), "{all:?} panicked: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{all:?}: not one line: {stderr}");
    let after = snapshot(dir);
    for (path, bytes) in &before {
        assert_eq!(after.get(path), Some(bytes), "{} changed", path.display());
    }
    lines[0].to_string()
}

/// As [`train_fails`], for an error of clap's: exit status 2, the error on
/// the first line, then clap's usage.
fn clap_fails(dir: &Path, args: &[&str]) -> String {
    let mut all = vec!["train"];
    all.extend_from_slice(args);
    let run = splitgrad(dir, &all);
    let stderr = String::from_utf8(run.stderr).unwrap();
    assert_eq!(run.status.code(), Some(2), "{all:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{all:?} panicked: {stderr}");
    stderr.lines().next().unwrap().to_string()
}

/// Asserts `line` is `splitgrad: error: ` + `message`, where `{dir}` in
/// `message` stands for the row's folder.
#[track_caller]
fn assert_error(line: &str, dir: &Path, message: &str) {
    let want = format!("splitgrad: error: {}", message.replace("{dir}", s(dir)));
    assert_eq!(line, want);
}

/// Trains two steps on [`corpus`] into `dir/out` and returns the
/// checkpoint's path.
fn trained(dir: &Path) -> PathBuf {
    let c = corpus(dir);
    let out = dir.join("out");
    let mut args = vec!["train", "--corpus", s(&c), "--out", s(&out)];
    args.extend(FAST);
    let run = splitgrad(dir, &args);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    out.join("model.safetensors")
}

/// `train --resume` on [`trained`]'s run, 4 steps.
fn resume_fails(dir: &Path, extra: &[&str]) -> String {
    let c = dir.join("corpus.npz");
    let mut args = vec![
        "--corpus",
        s(&c),
        "--resume",
        "--steps",
        "4",
        "--batch",
        "64",
        "--min-count",
        "1",
    ];
    args.extend_from_slice(extra);
    if !extra.contains(&"--dim") {
        args.extend(["--dim", "4"]);
    }
    train_fails(dir, &args)
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

fn poison(tensors: &mut [(String, TensorData)], name: &str, value: f32) {
    let (_, t) = tensors.iter_mut().find(|(n, _)| n == name).unwrap();
    let TensorData::F32(a) = t else {
        panic!("{name} is not F32")
    };
    *a.iter_mut().nth(1).unwrap() = value;
}

// ---------------------------------------------------------------------------
// The rows, in the table's order.

// --- the index ---------------------------------------------------------------

#[test]
fn r01_index_token_id_out_of_range() {
    let dir = scratch("r01");
    let idx = npz(&dir, "index.npz", |w| {
        w.add("language_index", &arr1(&[0i64, 1]))
            .add("token_index", &arr1(&[3i64, 500]));
    });
    // Without --corpus, the index is checked against the synthetic corpus.
    let line = train_fails(&dir, &["--index", s(&idx), "--steps", "2", "--batch", "64"]);
    assert_error(
        &line,
        &dir,
        "{dir}/index.npz: array `token_index`: token id 500 at position [1] is out of range 0..500",
    );
}

#[test]
fn r02_index_negative_language_id() {
    let dir = scratch("r02");
    let c = corpus(&dir);
    let idx = npz(&dir, "index.npz", |w| {
        w.add("language_index", &arr1(&[0i64, -1]))
            .add("token_index", &arr1(&[3i64, 2]));
    });
    let mut args = vec!["--corpus", s(&c), "--index", s(&idx)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "{dir}/index.npz: array `language_index`: language id -1 at position [1] is out of range 0..2",
    );
}

#[test]
fn r03_index_lengths_differ() {
    let dir = scratch("r03");
    let c = corpus(&dir);
    let idx = npz(&dir, "index.npz", |w| {
        w.add("language_index", &arr1(&[0i64, 1, 1]))
            .add("token_index", &arr1(&[3i64, 2]));
    });
    let mut args = vec!["--corpus", s(&c), "--index", s(&idx)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "{dir}/index.npz: array `token_index`: token_index has shape [2], expected (3,), the length of language_index",
    );
}

#[test]
fn r04_index_float_ids() {
    let dir = scratch("r04");
    let c = corpus(&dir);
    let idx = npz(&dir, "index.npz", |w| {
        w.add("language_index", &arr1(&[0.0f64, 1.0]))
            .add("token_index", &arr1(&[3i64, 2]));
    });
    let mut args = vec!["--corpus", s(&c), "--index", s(&idx)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "{dir}/index.npz: array `language_index`: has dtype float64, expected an integer dtype (int8 … int64, uint8 … uint64)",
    );
}

#[test]
fn r05_index_integer_score() {
    let dir = scratch("r05");
    let c = corpus(&dir);
    let idx = npz(&dir, "index.npz", |w| {
        w.add("language_index", &arr1(&[0i64, 1]))
            .add("token_index", &arr1(&[3i64, 2]))
            .add("score", &arr1(&[1i64, 2]));
    });
    let mut args = vec!["--corpus", s(&c), "--index", s(&idx)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "{dir}/index.npz: array `score`: has dtype int64, expected float32 or float64",
    );
}

#[test]
fn r06_index_duplicate_pair() {
    let dir = scratch("r06");
    let c = corpus(&dir);
    let idx = npz(&dir, "index.npz", |w| {
        w.add("language_index", &arr1(&[0i64, 1, 0]))
            .add("token_index", &arr1(&[3i64, 3, 3]));
    });
    let mut args = vec!["--corpus", s(&c), "--index", s(&idx)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "{dir}/index.npz: array `(language_index, token_index)`: pair (language 0, token 3) at position [2] repeats position [0]",
    );
}

#[test]
fn r07_index_empty() {
    let dir = scratch("r07");
    let c = corpus(&dir);
    let idx = npz(&dir, "index.npz", |w| {
        w.add("language_index", &arr1::<i64>(&[]))
            .add("token_index", &arr1::<i64>(&[]));
    });
    let mut args = vec!["--corpus", s(&c), "--index", s(&idx)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "{dir}/index.npz: array `language_index`: is empty",
    );
}

#[test]
fn r08_index_nan_score() {
    let dir = scratch("r08");
    let c = corpus(&dir);
    let idx = npz(&dir, "index.npz", |w| {
        w.add("language_index", &arr1(&[0i64, 1]))
            .add("token_index", &arr1(&[3i64, 2]))
            .add("score", &arr1(&[0.5f64, f64::NAN]));
    });
    let mut args = vec!["--corpus", s(&c), "--index", s(&idx)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "{dir}/index.npz: array `score`: non-finite value NaN at position [1]",
    );
}

#[test]
fn r09_index_infinite_score() {
    let dir = scratch("r09");
    let c = corpus(&dir);
    let idx = npz(&dir, "index.npz", |w| {
        w.add("language_index", &arr1(&[0i64, 1]))
            .add("token_index", &arr1(&[3i64, 2]))
            .add("score", &arr1(&[f32::NEG_INFINITY, 0.5]));
    });
    let mut args = vec!["--corpus", s(&c), "--index", s(&idx)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "{dir}/index.npz: array `score`: non-finite value -inf at position [0]",
    );
}

#[test]
fn r10_index_missing_array() {
    let dir = scratch("r10");
    let c = corpus(&dir);
    let idx = npz(&dir, "index.npz", |w| {
        w.add("language_index", &arr1(&[0i64, 1]))
            .add("tokens", &arr1(&[3i64, 2]));
    });
    let mut args = vec!["--corpus", s(&c), "--index", s(&idx)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "{dir}/index.npz: array `token_index`: is missing",
    );
}

#[test]
fn r11_index_not_one_dimensional() {
    let dir = scratch("r11");
    let c = corpus(&dir);
    let idx = npz(&dir, "index.npz", |w| {
        w.add("language_index", &Array2::<i64>::zeros((2, 1)))
            .add("token_index", &arr1(&[3i64, 2]));
    });
    let mut args = vec!["--corpus", s(&c), "--index", s(&idx)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "{dir}/index.npz: array `language_index`: language_index has shape [2, 1], expected 1-D",
    );
}

// --- the corpus --------------------------------------------------------------

#[test]
fn r12_corpus_nonexistent() {
    let dir = scratch("r12");
    let mut args = vec!["--corpus", "missing.npz"];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "missing.npz: No such file or directory (os error 2)",
    );
}

#[test]
fn r13_corpus_not_an_npz() {
    let dir = scratch("r13");
    let c = dir.join("corpus.npz");
    fs::write(&c, "token_ids,language_ids\n1,0\n2,0\n").unwrap();
    let mut args = vec!["--corpus", s(&c)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "{dir}/corpus.npz: not an npz file (no readable zip directory): Could not find central directory end",
    );
}

#[test]
fn r14_corpus_empty_file() {
    let dir = scratch("r14");
    let c = dir.join("corpus.npz");
    fs::write(&c, "").unwrap();
    let mut args = vec!["--corpus", s(&c)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "{dir}/corpus.npz: not an npz file (no readable zip directory): Invalid zip header",
    );
}

#[test]
fn r15_corpus_truncated_file() {
    let dir = scratch("r15");
    let c = corpus(&dir);
    let bytes = fs::read(&c).unwrap();
    fs::write(&c, &bytes[..bytes.len() / 2]).unwrap();
    let mut args = vec!["--corpus", s(&c)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "{dir}/corpus.npz: not an npz file (no readable zip directory): Could not find central directory end",
    );
}

#[test]
fn r16_corpus_negative_token_id() {
    let dir = scratch("r16");
    let c = npz(&dir, "corpus.npz", |w| {
        w.add("token_ids", &arr1(&[1i64, -3, 2]))
            .add("language_ids", &arr1(&[0i64, 0, 0]));
    });
    let mut args = vec!["--corpus", s(&c)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "{dir}/corpus.npz: array `token_ids`: token id -3 at position [1] is out of range 0..4294967296",
    );
}

#[test]
fn r17_corpus_lengths_differ() {
    let dir = scratch("r17");
    let c = npz(&dir, "corpus.npz", |w| {
        w.add("token_ids", &arr1(&[1i64, 2, 3]))
            .add("language_ids", &arr1(&[0i64, 0]));
    });
    let mut args = vec!["--corpus", s(&c)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "{dir}/corpus.npz: array `language_ids`: language_ids has shape [2], expected (3,), the length of token_ids",
    );
}

#[test]
fn r18_corpus_float_ids_with_nan() {
    let dir = scratch("r18");
    let c = npz(&dir, "corpus.npz", |w| {
        w.add("token_ids", &arr1(&[1.0f64, f64::NAN, 2.0]))
            .add("language_ids", &arr1(&[0i64, 0, 0]));
    });
    let mut args = vec!["--corpus", s(&c)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "{dir}/corpus.npz: array `token_ids`: has dtype float64, expected an integer dtype (int8 … int64, uint8 … uint64)",
    );
}

#[test]
fn r19_corpus_sequence_starts_not_sorted() {
    let dir = scratch("r19");
    let c = npz(&dir, "corpus.npz", |w| {
        w.add("token_ids", &arr1(&[1i64, 2, 3, 1, 2]))
            .add("language_ids", &arr1(&[0i64, 0, 0, 0, 0]))
            .add("sequence_starts", &arr1(&[0i64, 3, 2]));
    });
    let mut args = vec!["--corpus", s(&c)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "{dir}/corpus.npz: array `sequence_starts`: sequence start 2 at position [2] does not exceed the one before it, 3",
    );
}

#[test]
fn r20_corpus_sequence_start_out_of_range() {
    let dir = scratch("r20");
    let c = npz(&dir, "corpus.npz", |w| {
        w.add("token_ids", &arr1(&[1i64, 2, 3, 1, 2]))
            .add("language_ids", &arr1(&[0i64, 0, 0, 0, 0]))
            .add("sequence_starts", &arr1(&[0i64, 2, 5]));
    });
    let mut args = vec!["--corpus", s(&c)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "{dir}/corpus.npz: array `sequence_starts`: sequence start 5 at position [2] is out of range 0..5",
    );
}

#[test]
fn r21_corpus_empty() {
    let dir = scratch("r21");
    let c = npz(&dir, "corpus.npz", |w| {
        w.add("token_ids", &arr1::<i64>(&[]))
            .add("language_ids", &arr1::<i64>(&[]));
    });
    let mut args = vec!["--corpus", s(&c)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(&line, &dir, "{dir}/corpus.npz: array `token_ids`: is empty");
}

#[test]
fn r22_corpus_single_token() {
    let dir = scratch("r22");
    let c = npz(&dir, "corpus.npz", |w| {
        w.add("token_ids", &arr1(&[7i64]))
            .add("language_ids", &arr1(&[0i64]));
    });
    let mut args = vec!["--corpus", s(&c)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "{dir}/corpus.npz: no bigram to train on: every sequence holds a single token",
    );
}

// --- the checkpoint ------------------------------------------------------------

#[test]
fn r23_checkpoint_of_another_dim() {
    let dir = scratch("r23");
    trained(&dir);
    let line = resume_fails(&dir, &["--dim", "8"]);
    assert_error(
        &line,
        &dir,
        "{dir}/out/model.safetensors: the checkpoint was written with dim = 4, this run has 8",
    );
}

#[test]
fn r24_checkpoint_missing_tensor() {
    let dir = scratch("r24");
    let ck = trained(&dir);
    rewrite_checkpoint(&ck, |t| t.retain(|(n, _)| n != "lm_head.vocab.weight"));
    let line = resume_fails(&dir, &[]);
    assert_error(
        &line,
        &dir,
        "{dir}/out/model.safetensors: array `lm_head.vocab.weight`: is missing",
    );
}

#[test]
fn r25_checkpoint_nan_weight() {
    let dir = scratch("r25");
    let ck = trained(&dir);
    rewrite_checkpoint(&ck, |t| poison(t, "split_vocabulary.rows", f32::NAN));
    let line = resume_fails(&dir, &[]);
    assert_error(
        &line,
        &dir,
        "{dir}/out/model.safetensors: array `split_vocabulary.rows`: non-finite value NaN at position [0, 1]",
    );
}

#[test]
fn r26_checkpoint_infinite_optimiser_state() {
    let dir = scratch("r26");
    let ck = trained(&dir);
    let name = "optimizer.dense.lm_head.vocab.weight.exp_avg_sq";
    rewrite_checkpoint(&ck, |t| poison(t, name, f32::INFINITY));
    let line = resume_fails(&dir, &[]);
    assert_error(
        &line,
        &dir,
        &format!(
            "{{dir}}/out/model.safetensors: array `{name}`: non-finite value inf at position [0, 1]"
        ),
    );
}

#[test]
fn r27_checkpoint_truncated() {
    let dir = scratch("r27");
    let ck = trained(&dir);
    let bytes = fs::read(&ck).unwrap();
    fs::write(&ck, &bytes[..bytes.len() / 2]).unwrap();
    let line = resume_fails(&dir, &[]);
    assert!(
        line.starts_with(&format!(
            "splitgrad: error: {}/out/model.safetensors: not a valid safetensors file: ",
            s(&dir)
        )),
        "{line}"
    );
}

#[test]
fn r28_checkpoint_of_another_corpus() {
    let dir = scratch("r28");
    trained(&dir);
    npz(&dir, "corpus.npz", |w| {
        w.add("token_ids", &arr1(&[1i64, 2, 3, 1, 2, 0, 3, 3]))
            .add("language_ids", &arr1(&[0i64, 0, 0, 1, 1, 1, 0, 0]))
            .add("sequence_starts", &arr1(&[0i64, 5]));
    });
    let line = resume_fails(&dir, &[]);
    assert_error(
        &line,
        &dir,
        "{dir}/out/model.safetensors: the checkpoint was written for another corpus (or another held-out split of it)",
    );
}

#[test]
fn r29_resume_without_checkpoint() {
    let dir = scratch("r29");
    corpus(&dir);
    let line = resume_fails(&dir, &[]);
    assert_error(
        &line,
        &dir,
        "{dir}/out/model.safetensors: --resume, but there is no checkpoint to resume from",
    );
}

// --- the output ----------------------------------------------------------------

#[test]
fn r30_out_under_a_file() {
    let dir = scratch("r30");
    let c = corpus(&dir);
    fs::write(dir.join("notes.txt"), "a file, not a folder").unwrap();
    let out = dir.join("notes.txt").join("run");
    let mut args = vec!["--corpus", s(&c), "--out", s(&out)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "{dir}/notes.txt/run: cannot create the output folder: Not a directory (os error 20)",
    );
}

#[test]
fn r31_checkpoint_path_is_a_folder() {
    let dir = scratch("r31");
    let c = corpus(&dir);
    let out = out_folder(&dir);
    fs::create_dir(out.join("model.safetensors")).unwrap();
    let mut args = vec!["--corpus", s(&c)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "{dir}/out/model.safetensors: is a folder, not a file",
    );
    let names: Vec<_> = fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "a temporary file was left: {names:?}");
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

#[test]
fn r32_full_disk_during_an_atomic_write() {
    let dir = scratch("r32");
    let path = dir.join("model.safetensors");
    fs::write(&path, "the last good checkpoint").unwrap();
    if !Path::new("/dev/full").exists() {
        eprintln!("skipped: this system has no /dev/full to simulate a full disk");
        return;
    }
    let e = write_atomic(&path, write_to_full_disk).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Io(io) if io.raw_os_error() == Some(28)));
    assert_eq!(
        e.to_string(),
        format!("{}: No space left on device (os error 28)", path.display())
    );
    assert_eq!(fs::read(&path).unwrap(), b"the last good checkpoint");
    assert_eq!(
        fs::read_dir(&dir).unwrap().count(),
        1,
        "a temporary file was left"
    );
}

#[test]
fn r33_full_disk_under_the_npz_writer() {
    if !Path::new("/dev/full").exists() {
        eprintln!("skipped: this system has no /dev/full to simulate a full disk");
        return;
    }
    let mut w = NpzWriter::new("unused.npz");
    w.add("token_ids", &ndarray::Array1::<i64>::zeros(100_000));
    let full = fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let e = w.write_to(full).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Io(_)), "{e}");
    assert!(
        e.to_string()
            .ends_with("No space left on device (os error 28)"),
        "{e}"
    );
}

// --- the flags -------------------------------------------------------------------

#[test]
fn r34_unknown_flag() {
    let dir = scratch("r34");
    let line = clap_fails(&dir, &["--bogus"]);
    assert_eq!(line, "error: unexpected argument '--bogus' found");
}

#[test]
fn r35_steps_not_a_number() {
    let dir = scratch("r35");
    let line = clap_fails(&dir, &["--steps", "abc"]);
    assert_eq!(
        line,
        "error: invalid value 'abc' for '--steps <STEPS>': invalid digit found in string"
    );
}

#[test]
fn r36_batch_zero() {
    let dir = scratch("r36");
    let line = train_fails(&dir, &["--batch", "0"]);
    assert_error(&line, &dir, "--batch must be at least 1");
}

#[test]
fn r37_dim_zero() {
    let dir = scratch("r37");
    let line = train_fails(&dir, &["--dim", "0"]);
    assert_error(&line, &dir, "--dim must be at least 1");
}

#[test]
fn r38_negative_learning_rate() {
    let dir = scratch("r38");
    let line = train_fails(&dir, &["--lr=-1"]);
    assert_error(&line, &dir, "--lr must be a finite number > 0, got -1");
}

#[test]
fn r39_nan_learning_rate() {
    let dir = scratch("r39");
    let line = train_fails(&dir, &["--lr", "NaN"]);
    assert_error(&line, &dir, "--lr must be a finite number > 0, got NaN");
}

#[test]
fn r40_infinite_penalty_weight() {
    let dir = scratch("r40");
    let line = train_fails(&dir, &["--gate-penalty", "inf"]);
    assert_error(
        &line,
        &dir,
        "--gate-penalty must be a finite number ≥ 0, got inf",
    );
}

#[test]
fn r41_threads_zero() {
    let dir = scratch("r41");
    let line = train_fails(&dir, &["--threads", "0"]);
    assert_error(&line, &dir, "--threads must be at least 1");
}

#[test]
fn r42_checkpoint_every_zero() {
    let dir = scratch("r42");
    let line = train_fails(&dir, &["--checkpoint-every", "0"]);
    assert_error(&line, &dir, "--checkpoint-every must be at least 1");
}

#[test]
fn r43_index_token_the_corpus_never_reaches() {
    // A token id far past the corpus's vocabulary is an error, not a
    // vocabulary of 10^12 rows.
    let dir = scratch("r43");
    let c = corpus(&dir);
    let idx = npz(&dir, "index.npz", |w| {
        w.add("language_index", &arr1(&[0i64, 1]))
            .add("token_index", &arr1(&[3i64, 1_000_000_000_000]));
    });
    let mut args = vec!["--corpus", s(&c), "--index", s(&idx)];
    args.extend(FAST);
    let line = train_fails(&dir, &args);
    assert_error(
        &line,
        &dir,
        "{dir}/index.npz: array `token_index`: token id 1000000000000 at position [1] is out of range 0..4",
    );
}
