//! Running the `splitgrad` binary from the tests: scratch folders, small
//! corpora, a run's success, and a run's failure as the bad-input tables
//! check it (status 1, one line `splitgrad: error: …`, no panic, nothing
//! under the row's folder changed).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ndarray::arr1;
use splitgrad::checkpoint::Checkpoint;
use splitgrad::io::NpzWriter;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_splitgrad");

/// What a failed run's one line of standard error begins with.
pub const ERROR: &str = "splitgrad: error: ";

/// What a plain progress line begins with.
pub const PROGRESS: &str = "splitgrad: step ";

/// What a plain progress line of `tokenize` begins with.
pub const TOKENIZE_PROGRESS: &str = "splitgrad tokenize: ";

/// A fresh, empty folder `group/name` under the target's temporary folder.
pub fn scratch(group: &str, name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(group)
        .join(name);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// A path as the `&str` an argument list takes.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Writes an `.npz` at `dir/name` and returns its path.
pub fn npz(dir: &Path, name: &str, fill: impl FnOnce(&mut NpzWriter)) -> PathBuf {
    let path = dir.join(name);
    let mut w = NpzWriter::new(&path);
    fill(&mut w);
    w.finish().unwrap();
    path
}

/// `dir/corpus.npz`: 8 tokens in 2 sequences, `token` at position 2 and
/// `language` at 3 (3 and 1 make [`small_corpus`]).
pub fn corpus_with(dir: &Path, token: i64, language: i64) -> PathBuf {
    npz(dir, "corpus.npz", |w| {
        w.add("token_ids", &arr1(&[1i64, 2, token, 1, 2, 0, 3, 2]))
            .add("language_ids", &arr1(&[0i64, 0, 0, language, 1, 1, 0, 0]))
            .add("sequence_starts", &arr1(&[0i64, 5]));
    })
}

/// A small valid corpus `dir/corpus.npz`: 4 token ids, 2 languages, 2
/// sequences.
pub fn small_corpus(dir: &Path) -> PathBuf {
    corpus_with(dir, 3, 1)
}

/// The command `splitgrad ARGS` in `dir`, without colours.
pub fn command(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args).current_dir(dir).env("NO_COLOR", "1");
    c
}

/// Runs `splitgrad ARGS` in `dir`.
pub fn run(dir: &Path, args: &[&str]) -> Output {
    command(dir, args).output().unwrap()
}

/// Runs `splitgrad ARGS` in `dir` under an address-space limit
/// (`ulimit -v`, in KiB).
pub fn run_limited(dir: &Path, args: &[&str], limit_kib: u64) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {limit_kib} && exec \"$0\" \"$@\""))
        .arg(BIN)
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

/// Asserts the run succeeded, showing its standard error if not.
#[track_caller]
pub fn assert_ok(run: &Output) {
    assert!(
        run.status.success(),
        "{:?}: {}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
}

/// Runs `splitgrad ARGS` in `dir` and asserts it succeeded.
#[track_caller]
pub fn run_ok(dir: &Path, args: &[&str]) -> Output {
    let out = run(dir, args);
    assert_ok(&out);
    out
}

/// The last line of a run's standard output, read as JSON (`--json`).
pub fn last_json(run: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&run.stdout);
    serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
}

/// Every file under `dir` with its bytes; a file that is not a regular
/// file (a FIFO, a device) by its length only, unread; run folders' lock
/// files (`.lock`) left out.
pub fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    for e in fs::read_dir(dir).into_iter().flatten() {
        let p = e.unwrap().path();
        let meta = fs::symlink_metadata(&p).unwrap();
        if p.file_name().is_some_and(|n| n == ".lock") {
            // A run folder's lock, taken (and its holder's pid written)
            // by any `train` into it, a refused one too: not a result.
            continue;
        }
        if meta.is_dir() {
            out.extend(snapshot(&p));
        } else if meta.is_file() {
            out.insert(p.clone(), fs::read(&p).unwrap());
        } else {
            out.insert(p.clone(), meta.len().to_le_bytes().to_vec());
        }
    }
    out
}

/// Runs `splitgrad ARGS` in `dir` (under `limit_kib` of address space if
/// given) and checks the failure: status 1, one line of standard error
/// (progress lines aside)
/// starting [`ERROR`], no panic, no file under `dir` changed, added or
/// removed. Returns the line after [`ERROR`].
#[track_caller]
pub fn fails(dir: &Path, args: &[&str], limit_kib: Option<u64>) -> String {
    let before = snapshot(dir);
    let run = match limit_kib {
        Some(kib) => run_limited(dir, args, kib),
        None => run(dir, args),
    };
    failed(dir, args, &before, run)
}

/// As [`fails`] (with no address-space limit), the command set up by
/// `env` first: an environment variable, say.
#[track_caller]
pub fn fails_with(
    dir: &Path,
    args: &[&str],
    env: impl FnOnce(&mut Command) -> &mut Command,
) -> String {
    let before = snapshot(dir);
    let run = env(&mut command(dir, args)).output().unwrap();
    failed(dir, args, &before, run)
}

/// The checks of [`fails`] on `run`, `before` the folder's snapshot taken
/// before it.
#[track_caller]
fn failed(dir: &Path, args: &[&str], before: &BTreeMap<PathBuf, Vec<u8>>, run: Output) -> String {
    let stderr = String::from_utf8(run.stderr).unwrap();
    assert_eq!(
        run.status.code(),
        Some(1),
        "{args:?}: {:?} {stderr}",
        run.status
    );
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    // Progress lines (standard error is not a terminal here) aside.
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.starts_with(PROGRESS))
        .collect();
    assert_eq!(lines.len(), 1, "{args:?}: not one line: {stderr}");
    assert_eq!(&snapshot(dir), before, "{args:?} changed a file");
    lines[0]
        .strip_prefix(ERROR)
        .unwrap_or_else(|| panic!("{args:?}: {}", lines[0]))
        .to_string()
}

/// As [`fails`], for an error of clap's: exit status 2, the error on the
/// first line, then clap's usage. Returns the first line.
#[track_caller]
pub fn clap_fails(dir: &Path, args: &[&str]) -> String {
    let run = run(dir, args);
    let stderr = String::from_utf8(run.stderr).unwrap();
    assert_eq!(run.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    stderr.lines().next().unwrap().to_string()
}

/// `--lang NAME=DIR` for each pair (`tokenize`'s languages).
pub fn lang_args(langs: &[(&str, &Path)]) -> Vec<String> {
    langs
        .iter()
        .flat_map(|(name, dir)| ["--lang".to_string(), format!("{name}={}", dir.display())])
        .collect()
}

/// [`one_line_error`] of a `tokenize` run that may have written plain
/// progress lines ([`TOKENIZE_PROGRESS`]) before it failed: those lines
/// are set aside, and the rest must be the one-line error.
#[track_caller]
pub fn error_after_progress(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    let rest: String = err
        .lines()
        .filter(|l| !l.starts_with(TOKENIZE_PROGRESS))
        .map(|l| format!("{l}\n"))
        .collect();
    one_line_error(&Output {
        status: out.status,
        stdout: out.stdout.clone(),
        stderr: rest.into_bytes(),
    })
}

/// The error line of a failed run, checked to be one line with status 1
/// or 2 and no panic.
#[track_caller]
pub fn one_line_error(out: &Output) -> String {
    assert!(
        matches!(out.status.code(), Some(1 | 2)),
        "status {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.starts_with("splitgrad: error: "), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

/// Every tensor of two checkpoints but those named in `except`, byte for
/// byte, and the same names.
pub fn assert_same_tensors(a: &Path, b: &Path, except: &[&str]) {
    let (ca, cb) = (Checkpoint::open(a).unwrap(), Checkpoint::open(b).unwrap());
    let mut na = ca.names();
    let mut nb = cb.names();
    na.sort_unstable();
    nb.sort_unstable();
    assert_eq!(na, nb);
    for name in na.into_iter().filter(|n| !except.contains(n)) {
        assert_eq!(
            ca.get(name).unwrap(),
            cb.get(name).unwrap(),
            "tensor {name} differs between {} and {}",
            a.display(),
            b.display()
        );
    }
}

/// Rewrites the `__metadata__` of a safetensors file.
pub fn edit_metadata(path: &Path, key: &str, value: &str) {
    let bytes = fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header["__metadata__"][key] = serde_json::json!(value);
    let mut text = serde_json::to_vec(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + n..]);
    fs::write(path, out).unwrap();
}
