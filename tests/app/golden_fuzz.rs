//! `splitgrad golden fuzz` end to end, with programs under test in
//! `tests/data/golden_fuzz/`: a numpy implementation of the three layers
//! agrees with splitgrad in both dtypes; each of its planted bugs is found
//! and shrunk to a case of one id or token; a program that crashes, hangs
//! or writes nothing is reported, not waited for; a non-empty output folder
//! and bad arguments are refused with status 2.
//!
//! The numpy tests need a Python with numpy: `$SPLITGRAD_TEST_PYTHON`, else
//! `python3`, else `~/.cache/splitgrad/venv/bin/python`. Without one they
//! print why and pass.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use splitgrad::io::NpzReader;

fn scratch(test: &str) -> PathBuf {
    // The folder itself must not exist: fuzz refuses a non-empty one.
    let dir = crate::io_common::scratch(&format!("golden-fuzz-{test}"));
    dir.join("out")
}

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/golden_fuzz")
        .join(name)
}

/// `'…'` for the shell.
fn quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

/// A Python that imports numpy, or `None` (and why, printed once).
fn python() -> Option<&'static str> {
    static PYTHON: OnceLock<Option<String>> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let mut options = Vec::new();
            if let Ok(p) = std::env::var("SPLITGRAD_TEST_PYTHON") {
                options.push(p);
            }
            options.push("python3".to_string());
            if let Some(home) = std::env::var_os("HOME") {
                let venv = Path::new(&home).join(".cache/splitgrad/venv/bin/python");
                options.push(venv.display().to_string());
            }
            let found = options.iter().find(|p| {
                Command::new(p)
                    .args(["-c", "import numpy"])
                    .output()
                    .is_ok_and(|o| o.status.success())
            });
            if found.is_none() {
                // Straight to standard error, past the test harness's capture.
                let _ = writeln!(
                    std::io::stderr(),
                    "golden_fuzz: SKIPPING the numpy candidate's tests: none of {options:?} \
                     imports numpy (set SPLITGRAD_TEST_PYTHON to a Python that does)"
                );
            }
            found.cloned()
        })
        .as_deref()
}

/// The numpy candidate as a command, with its planted bug.
fn candidate(python: &str, bug: &str) -> String {
    let script = quote(&data("candidate.py"));
    if bug.is_empty() {
        format!("'{python}' {script}")
    } else {
        format!("SPLITGRAD_CANDIDATE_BUG={bug} '{python}' {script}")
    }
}

fn fuzz(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_splitgrad"))
        .args(["golden", "fuzz"])
        .args(args)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs a search that must find a difference; returns the summary line and
/// the minimal case's reader.
fn find(layer: &str, exec: &str, out: &Path, extra: &[&str]) -> (String, NpzReader) {
    let mut args = vec![
        "--layer",
        layer,
        "--exec",
        exec,
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = fuzz(&args);
    let (text, log) = (stdout(&o), stderr(&o));
    assert_eq!(o.status.code(), Some(1), "{text}\n{log}");
    let summary = text.lines().last().unwrap_or_default().to_string();
    assert!(summary.starts_with("difference: "), "{text}\n{log}");
    assert_eq!(
        text.lines().count(),
        1,
        "one line on standard output: {text}"
    );
    let minimal = out.join("minimal").join(layer).join("minimal.npz");
    assert!(
        summary.contains(&minimal.display().to_string()),
        "{summary}"
    );
    assert!(out.join("summary.txt").is_file());
    assert!(
        !out.join("scratch").exists(),
        "the scratch folder is removed"
    );
    (summary, NpzReader::open(&minimal).unwrap())
}

/// `golden eval` replays the minimal case folder.
fn replays(out: &Path) {
    let o = Command::new(env!("CARGO_BIN_EXE_splitgrad"))
        .args(["golden", "eval", "--inputs"])
        .arg(out.join("minimal"))
        .arg("--out")
        .arg(out.join("replay"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn the_numpy_candidate_agrees_on_every_layer_in_every_dtype() {
    let Some(py) = python() else { return };
    let exec = candidate(py, "");
    for layer in ["split-embeddings", "split-vocabulary", "lm-head"] {
        for dtype in ["f64", "f32", "bf16", "f16"] {
            let out = scratch(&format!("agree-{layer}-{dtype}"));
            let o = fuzz(&[
                "--layer",
                layer,
                "--dtype",
                dtype,
                "--cases",
                "48",
                "--seed",
                "3",
                "--exec",
                &exec,
                "--out",
                out.to_str().unwrap(),
            ]);
            let text = stdout(&o);
            assert_eq!(o.status.code(), Some(0), "{text}\n{}", stderr(&o));
            assert!(text.starts_with("no difference: "), "{text}");
            assert!(text.contains("48"), "{text}");
            let answers = std::fs::read_dir(out.join("answers").join(layer)).unwrap();
            assert_eq!(answers.count(), 48);
            assert!(
                out.join("cases")
                    .join(layer)
                    .join("case-0047.npz")
                    .is_file()
            );
            assert!(!out.join("minimal").exists());
        }
    }
}

#[test]
fn an_off_by_one_at_a_split_boundary_shrinks_to_one_id_at_a_boundary() {
    let Some(py) = python() else { return };
    let out = scratch("boundary");
    let (summary, mut case) = find(
        "split-embeddings",
        &candidate(py, "boundary"),
        &out,
        &["--cases", "32"],
    );
    assert!(summary.contains("split-embeddings float64"), "{summary}");
    assert!(summary.contains("`out` at [0, 0]"), "{summary}");
    let ids = case.ints("input_ids").unwrap();
    assert_eq!(ids.len(), 1, "{summary}");
    let sizes = case.ints_1d("split_sizes").unwrap();
    assert_eq!(sizes, [1, 1], "{summary}");
    assert_eq!(
        ids.iter().next(),
        Some(&1),
        "the first id of the second split"
    );
    assert_eq!(case.shape("weight_0").unwrap(), [1, 1], "H = 1");
    assert!(
        out.join("minimal-answer/split-embeddings/minimal.npz")
            .is_file()
    );
    replays(&out);
}

#[test]
fn a_minus_100_label_not_ignored_shrinks_to_one_ignored_token() {
    let Some(py) = python() else { return };
    let out = scratch("ignore-index");
    let (summary, mut case) = find(
        "lm-head",
        &candidate(py, "ignore_index"),
        &out,
        &["--cases", "32", "--dtype", "f32"],
    );
    assert!(summary.contains("lm-head float32"), "{summary}");
    assert!(summary.contains("`loss` at [0] is"), "{summary}");
    let labels = case.ints("labels").unwrap();
    assert_eq!(
        labels.iter().copied().collect::<Vec<_>>(),
        [-100],
        "{summary}"
    );
    let sizes = case.ints_1d("split_sizes").unwrap();
    // With V = 1 a label of -100 taken as an index gives a loss of 0 too.
    assert_eq!(sizes.iter().sum::<i64>(), 2, "{summary}");
    assert_eq!(case.shape("hidden").unwrap(), [1, 1], "{summary}");
    replays(&out);
}

#[test]
fn a_gate_mixed_the_wrong_way_shrinks_to_one_token_and_one_row() {
    let Some(py) = python() else { return };
    let out = scratch("gate");
    let (summary, mut case) = find(
        "split-vocabulary",
        &candidate(py, "gate"),
        &out,
        &["--cases", "32", "--seed", "1"],
    );
    assert!(summary.contains("`out`"), "{summary}");
    assert_eq!(case.ints_1d("token_ids").unwrap().len(), 1, "{summary}");
    assert_eq!(case.ints_1d("token_index").unwrap().len(), 1, "{summary}");
    assert_eq!(case.shape("rows").unwrap(), [1, 1], "{summary}");
    assert_eq!(case.ints("vocab_size").unwrap().sum(), 1, "{summary}");
    assert_eq!(case.ints("use_gate").unwrap().sum(), 1, "{summary}");
    replays(&out);
}

#[test]
fn in_bf16_a_gate_mixed_the_wrong_way_shrinks_to_one_token_and_one_row_of_bf16_values() {
    let Some(py) = python() else { return };
    let out = scratch("gate-bf16");
    let (summary, mut case) = find(
        "split-vocabulary",
        &candidate(py, "gate"),
        &out,
        &["--cases", "32", "--seed", "1", "--dtype", "bf16"],
    );
    assert!(
        summary.contains("split-vocabulary uint16 (bf16 bits)"),
        "{summary}"
    );
    assert!(summary.contains("`out`"), "{summary}");
    assert_eq!(case.ints_1d("token_ids").unwrap().len(), 1, "{summary}");
    assert_eq!(case.shape("rows").unwrap(), [1, 1], "{summary}");
    let rows = case.dtype("rows").unwrap();
    assert_eq!(
        (rows.to_string().as_str(), rows.size()),
        ("uint16", 2),
        "{summary}"
    );
    // the minimal case holds splitgrad's results in their dtypes
    assert_eq!(case.dtype("out").unwrap().to_string(), "uint16");
    assert_eq!(case.dtype("grad_rows").unwrap().to_string(), "float32");
    replays(&out);
}

#[test]
fn a_program_failing_on_one_kind_of_case_is_run_case_by_case() {
    let Some(py) = python() else { return };
    let out = scratch("empty-split");
    let (summary, mut case) = find(
        "split-embeddings",
        &candidate(py, "empty_split"),
        &out,
        &["--cases", "16"],
    );
    assert!(summary.contains("exited with status 1"), "{summary}");
    assert!(
        summary.contains("ValueError: a split of size 0"),
        "{summary}"
    );
    let sizes = case.ints_1d("split_sizes").unwrap();
    assert_eq!(sizes.len(), 2, "{summary}");
    assert!(sizes.contains(&0) && sizes.contains(&1), "{summary}");
    assert_eq!(case.ints("input_ids").unwrap().len(), 1, "{summary}");
}

#[test]
fn a_program_failing_only_on_several_cases_together_is_reported_so() {
    let Some(py) = python() else { return };
    let out = scratch("together");
    let exec = format!(
        "PY='{py}' SCRIPT={} sh {}",
        quote(&data("candidate.py")),
        quote(&data("one_at_a_time.sh"))
    );
    let o = fuzz(&[
        "--layer",
        "split-embeddings",
        "--cases",
        "3",
        "--exec",
        &exec,
        "--out",
        out.to_str().unwrap(),
    ]);
    let text = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{text}\n{}", stderr(&o));
    assert!(
        text.starts_with("difference: the program exited with status 4"),
        "{text}"
    );
    assert!(text.contains("one_at_a_time.sh: 3 cases"), "{text}");
    assert!(text.contains("on none of them alone"), "{text}");
    // One run on the three, then one on each.
    let alone = stderr(&o).matches("failed as a whole").count();
    assert_eq!(alone, 1, "{}", stderr(&o));
    assert!(!out.join("minimal").exists());
}

#[test]
fn a_crashing_program_is_a_difference_with_its_message() {
    let out = scratch("crash");
    let exec = format!("sh {}", quote(&data("crash.sh")));
    let (summary, mut case) = find("lm-head", &exec, &out, &["--cases", "4"]);
    assert!(
        summary.contains("the program exited with status 3"),
        "{summary}"
    );
    assert!(summary.contains("crash.sh: cannot read"), "{summary}");
    // Every case fails: the minimal one is as small as a case gets.
    assert_eq!(case.ints("labels").unwrap().len(), 1, "{summary}");
    assert_eq!(case.ints_1d("split_sizes").unwrap(), [1], "{summary}");
    assert!(out.join("program.log").is_file());
    replays(&out);
}

/// The process ids `hang.sh` wrote to `answers`.
fn hang_pids(answers: &Path) -> Vec<u32> {
    std::fs::read_to_string(answers.join("pids"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Whether process `pid` still runs (not gone, not a zombie); Linux only,
/// elsewhere assumed gone.
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Waits up to 5 s for each of `pids` to end.
fn all_ended(pids: &[u32]) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|&p| running(p)) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

#[test]
fn a_hanging_program_is_stopped_at_the_timeout() {
    let out = scratch("hang");
    let exec = format!("sh {}", quote(&data("hang.sh")));
    let start = Instant::now();
    let (summary, mut case) = find(
        "split-embeddings",
        &exec,
        &out,
        &["--cases", "3", "--timeout", "0.3"],
    );
    assert!(
        summary.contains("did not finish within the timeout of 0.3 s"),
        "{summary}"
    );
    assert_eq!(case.ints("input_ids").unwrap().len(), 1, "{summary}");
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
    // The shell and the child it waited for, of the first run.
    let pids = hang_pids(&out.join("answers"));
    assert_eq!(pids.len(), 2);
    assert!(all_ended(&pids), "{pids:?} still run");
}

#[test]
fn an_interrupt_stops_the_program_under_test_and_exits_with_130() {
    let out = scratch("interrupt");
    let exec = format!("sh {}", quote(&data("hang.sh")));
    let mut child = Command::new(env!("CARGO_BIN_EXE_splitgrad"))
        .args(["golden", "fuzz", "--layer", "lm-head", "--cases", "1"])
        .args(["--exec", &exec, "--out", out.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let answers = out.join("answers");
    let deadline = Instant::now() + Duration::from_secs(20);
    while hang_pids(&answers).len() < 2 {
        assert!(Instant::now() < deadline, "hang.sh did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pids = hang_pids(&answers);
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("splitgrad did not end after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    assert!(stderr(&o).contains("interrupted"), "{}", stderr(&o));
    assert!(all_ended(&pids), "{pids:?} still run");
    assert!(!out.join("scratch").exists());
}

#[test]
fn a_program_that_writes_nothing_has_no_answer() {
    let out = scratch("silent");
    let exec = format!("sh {}", quote(&data("silent.sh")));
    let (summary, _) = find("split-vocabulary", &exec, &out, &["--cases", "2"]);
    assert!(summary.contains("no answer file"), "{summary}");
    assert!(!out.join("minimal-answer").exists());
}

#[test]
fn a_non_empty_output_folder_and_bad_arguments_are_refused_with_status_2() {
    let out = scratch("refuse");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("earlier.txt"), "kept").unwrap();
    let exec = format!("sh {}", quote(&data("silent.sh")));
    let dir = out.to_str().unwrap();
    let o = fuzz(&["--layer", "lm-head", "--exec", &exec, "--out", dir]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("not empty"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(out.join("earlier.txt")).unwrap(),
        "kept"
    );
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 1);

    let fresh = out.with_file_name("fresh");
    let fresh = fresh.to_str().unwrap();
    for bad in [
        vec!["--layer", "embeddings", "--exec", &exec, "--out", fresh],
        vec!["--layer", "lm-head", "--exec", " ", "--out", fresh],
        vec![
            "--layer", "lm-head", "--exec", &exec, "--out", fresh, "--cases", "0",
        ],
        vec![
            "--layer",
            "lm-head",
            "--exec",
            &exec,
            "--out",
            fresh,
            "--timeout",
            "0",
        ],
        vec![
            "--layer", "lm-head", "--exec", &exec, "--out", fresh, "--dtype", "f8",
        ],
        vec!["--layer", "lm-head", "--out", fresh],
    ] {
        let o = fuzz(&bad);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", stderr(&o));
        assert!(!Path::new(fresh).exists(), "{bad:?}");
    }
}
