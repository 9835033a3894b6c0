//! The main job end to end through the binary: kill-and-resume is exact,
//! thread counts do not change the weights, and select → train → report
//! runs on the synthetic corpus.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use splitgrad::checkpoint::Checkpoint;

use crate::common::cli::{self, assert_same_tensors, last_json, run_ok, s};

fn scratch(name: &str) -> PathBuf {
    cli::scratch("cli_train", name)
}

/// A small, quick training run.
const SMALL: &[&str] = &["--batch", "256", "--dim", "8", "--checkpoint-every", "5"];

/// `train --steps STEPS --out OUT`, [`SMALL`] and `extra`, in `dir`.
fn train_command(dir: &Path, out: &Path, steps: u64, extra: &[&str]) -> std::process::Command {
    let steps = steps.to_string();
    let head = ["train", "--steps", &steps, "--out", s(out)];
    cli::command(dir, &[&head[..], SMALL, extra].concat())
}

fn train(out: &Path, steps: u64, extra: &[&str]) -> Output {
    let run = train_command(out.parent().unwrap(), out, steps, extra)
        .output()
        .unwrap();
    cli::assert_ok(&run);
    run
}

fn step_of(ckpt: &Path) -> Option<u64> {
    let ck = Checkpoint::open(ckpt).ok()?;
    ck.metadata().get("step")?.parse().ok()
}

#[test]
fn a_killed_and_resumed_run_ends_with_the_same_weights() {
    let dir = scratch("resume");
    let steps = 400;
    let whole = dir.join("whole");
    train(&whole, steps, &[]);

    // Kill a second run (SIGKILL) once it has written a checkpoint but has
    // not finished, then resume it; repeat until a kill lands mid-run.
    let cut = dir.join("cut");
    let mut interrupted_at = None;
    for _ in 0..5 {
        let _ = std::fs::remove_dir_all(&cut);
        let mut child = train_command(&dir, &cut, steps, &[])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let ckpt = cut.join("model.safetensors");
        let started = Instant::now();
        while !ckpt.exists() && started.elapsed() < Duration::from_secs(120) {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(20));
        child.kill().unwrap();
        child.wait().unwrap();
        match step_of(&ckpt) {
            Some(s) if s < steps => {
                interrupted_at = Some(s);
                break;
            }
            _ => continue,
        }
    }
    let at = interrupted_at.expect("no kill landed before the end of the run");
    assert!(at > 0 && at % 5 == 0, "checkpoint at step {at}");
    train(&cut, steps, &["--resume"]);
    assert_eq!(step_of(&cut.join("model.safetensors")), Some(steps));
    assert_same_tensors(
        &whole.join("model.safetensors"),
        &cut.join("model.safetensors"),
        &[],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn thread_counts_give_the_same_weights() {
    let dir = scratch("threads");
    let runs: Vec<PathBuf> = [1, 2, 4]
        .iter()
        .map(|t| {
            let out = dir.join(format!("t{t}"));
            train(&out, 20, &["--threads", &t.to_string()]);
            out.join("model.safetensors")
        })
        .collect();
    assert_same_tensors(&runs[0], &runs[1], &[]);
    assert_same_tensors(&runs[0], &runs[2], &[]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn resume_refuses_other_settings_and_a_missing_checkpoint() {
    let dir = scratch("refuse");
    let out = dir.join("run");
    let missing = train_command(&dir, &out, 5, &["--resume"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("no checkpoint"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");

    train(&out, 5, &[]);
    let before = std::fs::read(out.join("model.safetensors")).unwrap();
    let other = train_command(&dir, &out, 10, &["--resume", "--lr", "0.5"])
        .output()
        .unwrap();
    assert!(!other.status.success());
    let err = String::from_utf8_lossy(&other.stderr);
    assert!(err.contains("lr"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        std::fs::read(out.join("model.safetensors")).unwrap(),
        before
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn select_then_train_then_report() {
    let dir = scratch("select");
    let index = dir.join("index.npz");
    let select = ["select", "--steps", "30", "--batch", "512", "--dim", "8"];
    let out = run_ok(
        &dir,
        &[&select[..], &["--top", "12", "--json", "--out", s(&index)]].concat(),
    );
    let summary = last_json(&out);
    assert_eq!(summary["selected"], 12);
    assert!(dir.join("shared.safetensors").exists());

    let run = dir.join("run");
    train(&run, 10, &["--index", index.to_str().unwrap()]);
    let ckpt = run.join("model.safetensors");
    let report = last_json(&run_ok(&dir, &["report", s(&ckpt), "--json"]));
    assert_eq!(report["n_rows"], 12);
    assert_eq!(report["corpus"], "synthetic");
    // F1 is undefined only when there is nothing to find and nothing kept.
    let planted = &report["planted"];
    let undefined = planted["n_planted"] == 0 && report["n_kept"] == 0;
    assert_eq!(planted["f1"].is_null(), undefined, "{planted}");
    assert!(report["spearman_gate_score"].is_number());
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 12);
    assert!(
        rows.iter()
            .all(|r| r["gate"].is_number() && r["score"].is_number())
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sweep_tabulates_every_weight() {
    let dir = scratch("sweep");
    let sweep = ["sweep", "--steps", "5", "--batch", "256", "--dim", "4"];
    let weights = [
        "--weights",
        "0,1",
        "--min-count",
        "400",
        "--json",
        "--out",
        s(&dir),
    ];
    let table = last_json(&run_ok(&dir, &[&sweep[..], &weights].concat()));
    let rows = table["sweep"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        let ev = r["effective_vocabularies"].as_f64().unwrap();
        assert!((1.0..=4.0).contains(&ev), "{ev}");
    }
}

#[test]
fn negative_numbers_are_named_not_taken_for_flags() {
    let dir = scratch("negative-numbers");
    for (args, flag, value) in [
        (&["train", "--steps", "-5"][..], "--steps", "-5"),
        (&["train", "--steps=-5"], "--steps", "-5"),
        (&["bench", "embed_prompt", "--steps", "-3"], "--steps", "-3"),
        (&["train", "--threads", "-1.5"], "--threads", "-1.5"),
    ] {
        let out = cli::run(&dir, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(
            err.trim(),
            format!("splitgrad: error: {flag} must not be negative, got {value}"),
            "{args:?}"
        );
    }
    // A value clap rejects for another reason keeps clap's message.
    let out = cli::run(&dir, &["train", "--steps", "many"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value 'many'"));
}

#[test]
fn progress_is_plain_lines_off_a_terminal_and_quiet_silences_it() {
    let dir = scratch("progress-lines");
    // The test's standard error is a pipe, not a terminal.
    let run = train(&dir.join("run"), 12, &[]);
    let err = String::from_utf8_lossy(&run.stderr);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with(cli::PROGRESS))
        .collect();
    assert!(lines.len() >= 2, "{err}");
    assert!(lines[0].starts_with("splitgrad: step 1/12 "), "{err}");
    let last = lines[lines.len() - 1];
    assert!(last.starts_with("splitgrad: step 12/12 (100%)"), "{err}");
    for part in ["loss ", "tok/s", "elapsed ", "left "] {
        assert!(last.contains(part), "{part}: {last}");
    }
    let quiet = train(&dir.join("quiet"), 12, &["--quiet"]);
    let err = String::from_utf8_lossy(&quiet.stderr);
    assert!(!err.contains(cli::PROGRESS), "{err}");
    assert!(String::from_utf8_lossy(&quiet.stdout).contains("wrote"));
}

/// Options a command would not honour are refused by name, where they were
/// once taken and ignored (bad-inputs rows 77–88).
#[test]
fn options_a_command_would_not_honour_are_refused() {
    let dir = scratch("not-honoured");
    let corpus = cli::small_corpus(&dir);
    let run = dir.join("run");
    train(&run, 5, &[]);
    let tok_dir = dir.join("text");
    std::fs::create_dir_all(&tok_dir).unwrap();
    std::fs::write(tok_dir.join("a.txt"), "some text").unwrap();
    let lang = format!("en={}", s(&tok_dir));
    let cases: Vec<(Vec<&str>, String)> =
        vec![
        (
            vec!["train", "--no-gate", "--gate-penalty", "0.1"],
            "--gate-penalty with --no-gate: it weighs the gates, and fusion mode has none; leave \
             it out (fusion mode's penalty is --fusion-penalty)"
                .into(),
        ),
        (
            vec!["train", "--min-count", "3"],
            "--min-count without --corpus: the synthetic corpus brings its own index (its 40 \
             planted pairs and 40 decoys); give --corpus, or leave it out"
                .into(),
        ),
        (
            vec!["train", "--corpus", s(&corpus), "--min-count", "0"],
            "--min-count must be at least 1: a pair never seen has nothing to learn from".into(),
        ),
        (
            vec!["train", "--heldout", s(&corpus)],
            "--heldout without --corpus: a held-out corpus must come from the training corpus's \
             tokenizer, and the synthetic corpus has none; give --corpus, or --heldout-fraction"
                .into(),
        ),
        (
            vec![
                "train", "--resume", "--steps", "3", "--batch", "256", "--dim", "8", "--out",
                s(&run),
            ],
            format!(
                "--steps 3 with --resume: {} is at step 5 already; give --steps above it to \
                 train on, or read it with `splitgrad report`",
                run.join("model.safetensors").display()
            ),
        ),
        (
            vec![
                "select",
                "--checkpoint",
                "run/model.safetensors",
                "--dim",
                "9",
                "--lr",
                "0.5",
            ],
            "--dim and --lr set how select trains the shared-only model; with --checkpoint it \
             trains none (its width D is the checkpoint's)"
                .into(),
        ),
        (
            vec!["select", "--steps", "0"],
            "--steps must be at least 1: a run of 0 steps trains nothing; to score a trained \
             model, give --checkpoint"
                .into(),
        ),
        (
            vec!["sweep", "--steps", "0"],
            "--steps must be at least 1: a run of 0 steps trains nothing".into(),
        ),
        (
            vec![
                "tokenize",
                "--tokenizer",
                "tok.json",
                "--lang",
                &lang,
                "--out",
                "c.npz",
                "--seed",
                "3",
                "--heldout-fraction",
                "0.2",
            ],
            "--heldout-fraction and --seed with --tokenizer: they choose the text a tokenizer is \
             trained on here (--train-vocab), and this one is given; leave them out"
                .into(),
        ),
        (
            vec!["bench", "lmhead", "--scale", "100000"],
            "--scale 100000 is above lmhead's largest size (32000): every size would be 1".into(),
        ),
        (
            vec!["bench", "embed_full", "--dtype", "bf16", "--versus-block", "1"],
            "--versus-block sets how --versus-f32 alternates the two workloads' steps: use it \
             with --versus-f32"
                .into(),
        ),
        (
            vec![
                "bench",
                "embed_full",
                "--dtype",
                "bf16",
                "--versus-f32",
                "--versus-block",
                "0",
            ],
            "--versus-block must be at least 1: each workload takes at least one step a turn"
                .into(),
        ),
    ];
    for (args, want) in cases {
        assert_eq!(cli::fails(&dir, &args, None), want, "{args:?}");
    }
    // The run refused a resume below its step and is as it was.
    assert_eq!(step_of(&run.join("model.safetensors")), Some(5));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A finished run's report and plots go with its checkpoint: a `--force`
/// run stopped (SIGINT) after its first step leaves none of them beside
/// its own checkpoint, and one stopped before it leaves the finished run
/// whole.
#[test]
fn a_replaced_run_leaves_no_report_beside_the_new_checkpoint() {
    let dir = scratch("stale");
    let out = dir.join("run");
    let files = ["report.json", "loss.svg", "gates.svg"];
    let ckpt = out.join("model.safetensors");
    let mut replaced = false;
    for _ in 0..5 {
        let _ = std::fs::remove_dir_all(&out);
        train(&out, 10, &[]);
        for f in files {
            assert!(out.join(f).exists(), "{f}");
        }
        let before = std::fs::read(&ckpt).unwrap();
        let mut child = train_command(&dir, &out, 4000, &["--force", "--seed", "3"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while step_of(&ckpt) == Some(10) && started.elapsed() < Duration::from_secs(120) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let pid = child.id().to_string();
        let sent = std::process::Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap();
        assert!(sent.success());
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(130));
        if std::fs::read(&ckpt).unwrap() == before {
            // Stopped before its first step: the finished run is whole.
            for f in files {
                assert!(out.join(f).exists(), "{f}");
            }
            continue;
        }
        assert!(step_of(&ckpt).is_some_and(|s| s < 4000));
        for f in files {
            assert!(
                !out.join(f).exists(),
                "{f} left beside another run's checkpoint"
            );
        }
        // Its report says it is unfinished, and keeps nothing yet.
        let report = run_ok(&dir, &["report", s(&ckpt), "--json"]);
        let text = String::from_utf8_lossy(&report.stdout);
        assert!(
            text.contains("unfinished run, ") && text.contains(" of 4000 steps"),
            "{text}"
        );
        assert!(!text.contains("kept rows"), "{text}");
        assert_eq!(last_json(&report)["finished"], false);
        replaced = true;
        break;
    }
    assert!(replaced, "no kill landed after the first checkpoint");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `timeout -s INT` (without `--foreground`) sends its signal to the run
/// and again to its process group: the run takes both for one request,
/// finishes its step and writes its checkpoint, every time.
#[test]
fn a_signal_sent_twice_at_once_stops_the_run_cleanly() {
    if std::process::Command::new("timeout")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("no `timeout` here: skipped");
        return;
    }
    let dir = scratch("timeout");
    for round in 0..4 {
        let out = dir.join(format!("run{round}"));
        let steps = "1000000";
        let args = ["train", "--steps", steps, "--out", s(&out)];
        let run = std::process::Command::new("timeout")
            .args(["--preserve-status", "-s", "INT", "2.5", cli::BIN])
            .args([&args[..], SMALL].concat())
            .current_dir(&dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(130), "round {round}: {err}");
        let ckpt = out.join("model.safetensors");
        if err.contains("stopped before the first step") {
            // A loaded machine still setting up: a clean stop too.
            assert!(!ckpt.exists(), "round {round}: {err}");
            continue;
        }
        let said: u64 = err
            .split("stopped at step ")
            .nth(1)
            .and_then(|t| t.split(':').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("round {round}: {err}"));
        assert_eq!(step_of(&ckpt), Some(said));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
