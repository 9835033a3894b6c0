//! Rows 44– of `docs/bad-inputs.md`: inputs made to exhaust memory, files
//! that are not regular files, and results that must not be replaced.
//!
//! Each row runs `splitgrad` under an address-space limit of 2 GiB
//! (`ulimit -v`), as a hostile input meets it on a small machine, and
//! checks that it fails with status 1 and one line `splitgrad: error: …`
//! (never an abort, a kill or a panic), and that no file under the row's
//! folder changed.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ndarray::arr1;
use splitgrad::io::NpzWriter;

const BIN: &str = env!("CARGO_BIN_EXE_splitgrad");

/// The address-space limit every row runs under, in KiB.
const LIMIT_KIB: u64 = 2 << 20;

fn scratch(row: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("resources")
        .join(row);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn npz(dir: &Path, name: &str, fill: impl FnOnce(&mut NpzWriter)) -> PathBuf {
    let path = dir.join(name);
    let mut w = NpzWriter::new(&path);
    fill(&mut w);
    w.finish().unwrap();
    path
}

/// `splitgrad ARGS` in `dir` under the address-space limit.
fn limited(dir: &Path, args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {LIMIT_KIB} && exec \"$0\" \"$@\""))
        .arg(BIN)
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

/// Every file under `dir` with its bytes (special files by name only).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    for e in fs::read_dir(dir).into_iter().flatten() {
        let p = e.unwrap().path();
        let meta = fs::symlink_metadata(&p).unwrap();
        if meta.is_dir() {
            out.extend(snapshot(&p));
        } else if meta.is_file() && meta.len() < 1 << 20 {
            out.insert(p.clone(), fs::read(&p).unwrap());
        } else {
            out.insert(p.clone(), meta.len().to_le_bytes().to_vec());
        }
    }
    out
}

/// Runs `splitgrad ARGS` in `dir` and checks the failure (status 1, one
/// line, no panic, no file changed); returns the line after `splitgrad:
/// error: ` with `dir` written `{dir}`.
fn fails(dir: &Path, args: &[&str]) -> String {
    let before = snapshot(dir);
    let run = limited(dir, args);
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    assert_eq!(
        run.status.code(),
        Some(1),
        "{args:?}: {:?} {stderr}",
        run.status
    );
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: not one line: {stderr}");
    assert_eq!(snapshot(dir), before, "{args:?} changed a file");
    let line = lines[0]
        .strip_prefix("splitgrad: error: ")
        .unwrap_or_else(|| panic!("{args:?}: {}", lines[0]));
    line.replace(s(dir), "{dir}")
}

/// A corpus of 8 tokens with `token` at position 2 and `language` at 3.
fn corpus_with(dir: &Path, token: i64, language: i64) -> PathBuf {
    npz(dir, "corpus.npz", |w| {
        w.add("token_ids", &arr1(&[1i64, 2, token, 1, 2, 0, 3, 2]))
            .add("language_ids", &arr1(&[0i64, 0, 0, language, 1, 1, 0, 0]))
            .add("sequence_starts", &arr1(&[0i64, 5]));
    })
}

/// Checks a "needs more memory than there is" line: what comes before
/// "needs", and the hint after the figures.
fn assert_too_large(line: &str, head: &str, hint: &str) {
    let (before, after) = line
        .split_once(" needs ")
        .unwrap_or_else(|| panic!("{line}"));
    assert_eq!(before, head);
    assert!(after.contains(", more than the "), "{line}");
    assert!(after.contains(" of memory available"), "{line}");
    assert!(after.ends_with(hint), "{line}");
}

#[test]
fn r44_corpus_token_id_of_four_billion() {
    let dir = scratch("r44");
    corpus_with(&dir, 4_000_000_000, 1);
    let line = fails(
        &dir,
        &[
            "train",
            "--corpus",
            "corpus.npz",
            "--min-count",
            "1",
            "--out",
            "out",
        ],
    );
    assert!(
        line.starts_with("training this model (V 4000000001 (the largest token id of corpus.npz + 1), L 2 (the largest language id of corpus.npz + 1), D 64, "),
        "{line}"
    );
    assert!(line.contains(" split rows, batch 4096) needs "), "{line}");
    assert!(line.ends_with("; lower --dim or --batch"), "{line}");
    assert!(
        !dir.join("out").exists(),
        "nothing is created before the check"
    );
}

#[test]
fn r45_corpus_language_id_of_four_billion() {
    let dir = scratch("r45");
    corpus_with(&dir, 3, 4_000_000_000);
    let line = fails(
        &dir,
        &[
            "train",
            "--corpus",
            "corpus.npz",
            "--min-count",
            "1",
            "--out",
            "out",
        ],
    );
    assert!(
        line.starts_with("training this model (V 4 (the largest token id of corpus.npz + 1), L 4000000001 (the largest language id of corpus.npz + 1)"),
        "{line}"
    );
}

#[test]
fn r46_dim_of_a_billion() {
    let dir = scratch("r46");
    let line = fails(&dir, &["train", "--dim", "1000000000", "--out", "out"]);
    assert_too_large(
        &line,
        "training this model (V 500 (the synthetic corpus), L 4 (the synthetic corpus), D 1000000000, 80 split rows, batch 4096)",
        "; lower --dim or --batch",
    );
}

#[test]
fn r47_batch_of_a_trillion() {
    let dir = scratch("r47");
    let line = fails(&dir, &["train", "--batch", "1000000000000", "--out", "out"]);
    assert!(line.contains(", batch 1000000000000) needs "), "{line}");
}

/// Rewrites the `__metadata__` of a safetensors file.
fn edit_metadata(path: &Path, key: &str, value: &str) {
    let bytes = fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header["__metadata__"][key] = serde_json::json!(value);
    let mut text = serde_json::to_vec(&header).unwrap();
    while text.len() % 8 != 0 {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + n..]);
    fs::write(path, out).unwrap();
}

#[test]
fn r48_checkpoint_metadata_claims_a_vocabulary_of_a_trillion() {
    let dir = scratch("r48");
    let run = Command::new(BIN)
        .args([
            "train", "--steps", "2", "--batch", "64", "--dim", "4", "--out",
        ])
        .arg(dir.join("run"))
        .output()
        .unwrap();
    assert!(run.status.success());
    let ckpt = dir.join("run/model.safetensors");
    edit_metadata(&ckpt, "vocab_size", "1000000000000");
    let line = fails(&dir, &["report", "run/model.safetensors"]);
    assert!(
        line.starts_with("run/model.safetensors: loading this model (V 1000000000000 (the checkpoint's metadata), L 4 (the checkpoint's metadata), D 4, 80 split rows) needs "),
        "{line}"
    );
}

/// A zip archive of one member `token_ids.npy`, stored with `method` (0
/// stored, 8 deflated), whose npy header claims `shape` of int64 and whose
/// zip entry claims the matching size, holding only `data`.
fn claimed_npz(path: &Path, shape: u64, method: u16, data: &[u8]) {
    let mut header = format!("{{'descr': '<i8', 'fortran_order': False, 'shape': ({shape},), }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut npy_head = b"\x93NUMPY\x01\x00".to_vec();
    npy_head.extend_from_slice(&(header.len() as u16).to_le_bytes());
    npy_head.extend_from_slice(header.as_bytes());
    let claimed = npy_head.len() as u64 + shape * 8;
    assert!(claimed < u32::MAX as u64, "no zip64 here");
    let mut body = npy_head.clone();
    body.extend_from_slice(data);
    // A stored member's data is the npy bytes; a deflated one is one
    // stored deflate block of them, so the claim is honest about the
    // method and wrong only where the row says.
    let payload = if method == 8 {
        let mut p = vec![0x01];
        p.extend_from_slice(&(body.len() as u16).to_le_bytes());
        p.extend_from_slice(&(!(body.len() as u16)).to_le_bytes());
        p.extend_from_slice(&body);
        p
    } else {
        body
    };
    let compressed = if method == 8 {
        payload.len() as u32
    } else {
        claimed as u32
    };
    let name = b"token_ids.npy";
    let mut z = Vec::new();
    let local = |z: &mut Vec<u8>| {
        z.extend_from_slice(&0x04034b50u32.to_le_bytes());
        z.extend_from_slice(&20u16.to_le_bytes());
        z.extend_from_slice(&0u16.to_le_bytes());
        z.extend_from_slice(&method.to_le_bytes());
        z.extend_from_slice(&[0, 0, 0x21, 0]);
        z.extend_from_slice(&0u32.to_le_bytes()); // crc
        z.extend_from_slice(&compressed.to_le_bytes());
        z.extend_from_slice(&(claimed as u32).to_le_bytes());
        z.extend_from_slice(&(name.len() as u16).to_le_bytes());
        z.extend_from_slice(&0u16.to_le_bytes());
        z.extend_from_slice(name);
    };
    local(&mut z);
    z.extend_from_slice(&payload);
    let cd_start = z.len() as u32;
    z.extend_from_slice(&0x02014b50u32.to_le_bytes());
    z.extend_from_slice(&20u16.to_le_bytes());
    z.extend_from_slice(&20u16.to_le_bytes());
    z.extend_from_slice(&0u16.to_le_bytes());
    z.extend_from_slice(&method.to_le_bytes());
    z.extend_from_slice(&[0, 0, 0x21, 0]);
    z.extend_from_slice(&0u32.to_le_bytes());
    z.extend_from_slice(&compressed.to_le_bytes());
    z.extend_from_slice(&(claimed as u32).to_le_bytes());
    z.extend_from_slice(&(name.len() as u16).to_le_bytes());
    z.extend_from_slice(&[0; 8]);
    z.extend_from_slice(&0u32.to_le_bytes()); // attributes
    z.extend_from_slice(&0u32.to_le_bytes()); // local header at 0
    z.extend_from_slice(name);
    let cd_len = z.len() as u32 - cd_start;
    z.extend_from_slice(&0x06054b50u32.to_le_bytes());
    z.extend_from_slice(&[0; 4]);
    z.extend_from_slice(&1u16.to_le_bytes());
    z.extend_from_slice(&1u16.to_le_bytes());
    z.extend_from_slice(&cd_len.to_le_bytes());
    z.extend_from_slice(&cd_start.to_le_bytes());
    z.extend_from_slice(&0u16.to_le_bytes());
    fs::write(path, z).unwrap();
}

#[test]
fn r49_npz_member_claims_more_elements_than_memory_holds() {
    let dir = scratch("r49");
    // 400 M int64 (3.2 GB), deflated: header and zip entry agree.
    claimed_npz(&dir.join("corpus.npz"), 400_000_000, 8, &[]);
    let line = fails(&dir, &["train", "--corpus", "corpus.npz", "--out", "out"]);
    let (head, _) = line
        .split_once(" needs ")
        .unwrap_or_else(|| panic!("{line}"));
    assert_eq!(
        head,
        "corpus.npz: array `token_ids`: shape [400000000] of int64 (400000000 elements)"
    );
}

#[test]
fn r50_npz_member_claims_more_bytes_than_the_file_has() {
    let dir = scratch("r50");
    claimed_npz(&dir.join("corpus.npz"), 1000, 0, &[0; 16]);
    let line = fails(&dir, &["train", "--corpus", "corpus.npz", "--out", "out"]);
    assert!(
        line.starts_with(
            "corpus.npz: array `token_ids`: truncated archive: the member's data would end at byte "
        ),
        "{line}"
    );
}

#[test]
fn r51_golden_case_of_sixteen_gibibytes() {
    let dir = scratch("r51");
    let layer = dir.join("cases/lm-head");
    fs::create_dir_all(&layer).unwrap();
    let f = fs::File::create(layer.join("huge.npz")).unwrap();
    f.set_len(16 << 30).unwrap(); // sparse: no disk used
    drop(f);
    let run = limited(
        &dir,
        &["golden", "eval", "--inputs", "cases", "--out", "results"],
    );
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "cases/lm-head/huge.npz: a case file of 16.0 GiB is larger than any case can be"
        ),
        "{stderr}"
    );
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn r52_report_of_a_device() {
    let dir = scratch("r52");
    let line = fails(&dir, &["report", "/dev/zero"]);
    assert_eq!(line, "/dev/zero: is a character device, not a regular file");
}

#[cfg(unix)]
#[test]
fn r53_corpus_is_a_fifo() {
    let dir = scratch("r53");
    let made = Command::new("mkfifo")
        .arg(dir.join("corpus.npz"))
        .status()
        .unwrap();
    assert!(made.success());
    let line = fails(&dir, &["train", "--corpus", "corpus.npz", "--out", "out"]);
    assert_eq!(
        line,
        "corpus.npz: is a FIFO (named pipe), not a regular file"
    );
}

fn quick_run(dir: &Path, out: &str) {
    let run = Command::new(BIN)
        .args([
            "train", "--steps", "3", "--batch", "64", "--dim", "4", "--out", out,
        ])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

#[test]
fn r54_train_over_a_finished_run() {
    let dir = scratch("r54");
    quick_run(&dir, "run");
    let line = fails(
        &dir,
        &[
            "train", "--steps", "2", "--batch", "64", "--dim", "4", "--out", "run",
        ],
    );
    assert_eq!(
        line,
        "run: already holds a run at step 3 of 3 on synthetic (model.safetensors); give --resume to continue it, --force to replace it, or another --out"
    );
    // --force replaces it.
    let forced = limited(
        &dir,
        &[
            "train", "--steps", "2", "--batch", "64", "--dim", "4", "--out", "run", "--force",
        ],
    );
    assert!(
        forced.status.success(),
        "{}",
        String::from_utf8_lossy(&forced.stderr)
    );
}

#[test]
fn r55_select_into_a_text_file() {
    let dir = scratch("r55");
    fs::write(dir.join("afile.txt"), "my notes").unwrap();
    let line = fails(&dir, &["select", "--steps", "2", "--out", "afile.txt"]);
    assert_eq!(line, "afile.txt: --out must name an .npz file");
}

#[test]
fn r56_select_over_an_existing_index() {
    let dir = scratch("r56");
    fs::write(dir.join("index.npz"), "an earlier index").unwrap();
    let line = fails(&dir, &["select", "--steps", "2", "--out", "index.npz"]);
    assert_eq!(
        line,
        "index.npz: already exists; give --force to replace it, or another --out"
    );
}

#[test]
fn r57_sweep_over_an_existing_sweep() {
    let dir = scratch("r57");
    fs::create_dir_all(dir.join("sw")).unwrap();
    fs::write(dir.join("sw/sweep.json"), "{}").unwrap();
    let line = fails(&dir, &["sweep", "--steps", "2", "--out", "sw"]);
    assert_eq!(
        line,
        "sw/sweep.json: already exists; give --force to replace it, or another --out"
    );
}

#[test]
fn r58_threads_beyond_reason() {
    let dir = scratch("r58");
    let line = fails(&dir, &["train", "--threads", "100000", "--out", "out"]);
    assert!(
        line.starts_with("--threads 100000 is more than 1024"),
        "{line}"
    );
}

#[test]
fn r59_steps_zero() {
    let dir = scratch("r59");
    let line = fails(&dir, &["train", "--steps", "0", "--out", "out"]);
    assert_eq!(
        line,
        "--steps must be at least 1: a run of 0 steps trains nothing"
    );
}

#[test]
fn default_run_folders_differ_for_corpora_of_one_name() {
    let dir = scratch("default_folders");
    for sub in ["a", "b"] {
        fs::create_dir_all(dir.join(sub)).unwrap();
        npz(&dir.join(sub), "corpus.npz", |w| {
            w.add("token_ids", &arr1(&[1i64, 2, 3, 1, 2, 0, 3, 2]))
                .add("language_ids", &arr1(&[0i64, 0, 0, 1, 1, 1, 0, 0]))
                .add("sequence_starts", &arr1(&[0i64, 5]));
        });
        let run = Command::new(BIN)
            .args([
                "train",
                "--steps",
                "2",
                "--batch",
                "16",
                "--dim",
                "4",
                "--min-count",
                "1",
            ])
            .args(["--corpus", &format!("{sub}/corpus.npz")])
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
    }
    let runs: Vec<String> = fs::read_dir(dir.join("runs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs.iter().all(|r| r.starts_with("corpus-")), "{runs:?}");
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn stale_temporaries_of_a_killed_run_are_removed_on_the_next_start() {
    let dir = scratch("stale");
    quick_run(&dir, "run");
    // A temporary of a process that no longer exists.
    let stale = dir.join("run/.model.safetensors.tmp-2147483646-3");
    fs::write(&stale, b"half a checkpoint").unwrap();
    let run = Command::new(BIN)
        .args([
            "train", "--steps", "5", "--batch", "64", "--dim", "4", "--out", "run", "--resume",
        ])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(!stale.exists());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("a temporary file left by a process that was killed"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        stdout.contains("resumed run/model.safetensors from step 3 of 5"),
        "{stdout}"
    );
    let _ = fs::remove_dir_all(&dir);
}

/// Sends `signal` to the process with `pid`.
fn kill(signal: &str, pid: u32) {
    let ok = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

/// A long run in `dir/run`, started; returns once its first checkpoint
/// (every 20 steps) is on disk.
fn long_run(dir: &Path) -> std::process::Child {
    let child = Command::new(BIN)
        .args([
            "train", "--steps", "1000000", "--batch", "256", "--dim", "8",
        ])
        .args(["--checkpoint-every", "20", "--out", "run"])
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ckpt = dir.join("run/model.safetensors");
    let start = std::time::Instant::now();
    while !ckpt.exists() {
        assert!(
            start.elapsed().as_secs() < 120,
            "no checkpoint after 2 minutes"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child
}

#[cfg(unix)]
#[test]
fn sigint_and_sigterm_finish_the_step_write_a_checkpoint_and_say_how_to_go_on() {
    for (signal, code) in [("-INT", 130), ("-TERM", 143)] {
        let dir = scratch(&format!("signal{signal}"));
        let child = long_run(&dir);
        kill(signal, child.id());
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(code), "{signal}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let line = stderr
            .lines()
            .find(|l| l.starts_with("splitgrad: stopped at step "))
            .unwrap_or_else(|| panic!("{signal}: {stderr}"));
        let step: u64 = line["splitgrad: stopped at step ".len()..]
            .split(':')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(line.contains(": resume with --resume"), "{line}");
        // The checkpoint is of that very step: resuming says so and goes on.
        let resumed = Command::new(BIN)
            .args([
                "train",
                "--steps",
                &(step + 3).to_string(),
                "--batch",
                "256",
                "--dim",
                "8",
            ])
            .args(["--checkpoint-every", "20", "--out", "run", "--resume"])
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            resumed.status.success(),
            "{}",
            String::from_utf8_lossy(&resumed.stderr)
        );
        let stdout = String::from_utf8_lossy(&resumed.stdout);
        assert!(
            stdout.contains(&format!(
                "resumed run/model.safetensors from step {step} of {}",
                step + 3
            )),
            "{stdout}"
        );
        let _ = fs::remove_dir_all(&dir);
    }
}

#[cfg(unix)]
#[test]
fn a_second_ctrl_c_stops_at_once_with_the_last_checkpoint_intact() {
    let dir = scratch("double-ctrl-c");
    let child = long_run(&dir);
    kill("-INT", child.id());
    kill("-INT", child.id());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    // Whichever checkpoint is there, periodic or the one the first signal
    // asked for, is whole: it resumes.
    let resumed = Command::new(BIN)
        .args([
            "train", "--steps", "1", "--batch", "256", "--dim", "8", "--out", "run",
        ])
        .arg("--resume")
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    let _ = fs::remove_dir_all(&dir);
}
