//! A run folder is locked for a run's life: a second run into it refuses
//! naming the holder, a killed holder leaves nothing stuck, and the default
//! folder gives way to the next free one instead of refusing.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use splitgrad::checkpoint::Checkpoint;

use crate::common::cli::{self, assert_ok, s};

/// A small, quick model.
const SMALL: &[&str] = &["--batch", "256", "--dim", "8", "--checkpoint-every", "5"];

fn train_command(dir: &Path, steps: u64, extra: &[&str]) -> Command {
    let steps = steps.to_string();
    cli::command(
        dir,
        &[&["train", "--steps", &steps][..], SMALL, extra].concat(),
    )
}

fn spawn(dir: &Path, steps: u64, extra: &[&str]) -> Child {
    train_command(dir, steps, extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn step_of(ckpt: &Path) -> Option<u64> {
    let ck = Checkpoint::open(ckpt).ok()?;
    ck.metadata().get("step")?.parse().ok()
}

/// A finished run's files, all there and readable, at `steps`.
#[track_caller]
fn assert_whole(out: &Path, steps: u64) {
    assert_eq!(step_of(&out.join("model.safetensors")), Some(steps));
    let report = std::fs::read(out.join("report.json")).unwrap();
    serde_json::from_slice::<serde_json::Value>(&report).unwrap();
    for svg in ["loss.svg", "gates.svg"] {
        let text = std::fs::read_to_string(out.join(svg)).unwrap();
        assert!(text.trim_end().ends_with("</svg>"), "{svg} is cut short");
    }
}

fn stderr(run: &Output) -> String {
    String::from_utf8_lossy(&run.stderr).into_owned()
}

/// Waits until `path` exists, for at most two minutes.
fn wait_for(path: &Path) {
    let started = Instant::now();
    while !path.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn two_runs_into_one_folder_one_refuses_naming_the_other() {
    let dir = cli::scratch("run_lock", "together");
    let out = dir.join("x");
    let steps = 300;
    let args = ["--out", s(&out)];
    let (a, b) = (spawn(&dir, steps, &args), spawn(&dir, steps, &args));
    let pids = [a.id(), b.id()];
    let runs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
    let ok: Vec<usize> = (0..2).filter(|&i| runs[i].status.success()).collect();
    assert_eq!(ok.len(), 1, "{} | {}", stderr(&runs[0]), stderr(&runs[1]));
    let (winner, loser) = (ok[0], 1 - ok[0]);
    let message = stderr(&runs[loser]);
    assert_eq!(runs[loser].status.code(), Some(1), "{message}");
    assert!(
        message.contains(&format!(
            "{} is in use by process {} (another train run)",
            out.display(),
            pids[winner]
        )),
        "{message}"
    );
    assert_whole(&out, steps);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_killed_holder_leaves_the_folder_usable() {
    let dir = cli::scratch("run_lock", "killed");
    let out = dir.join("x");
    let args = ["--out", s(&out)];
    let mut holder = spawn(&dir, 1_000_000, &args);
    wait_for(&out.join("model.safetensors"));

    // While it runs, even --force is refused, naming it.
    let second = train_command(&dir, 10, &["--out", s(&out), "--force"])
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(1));
    let expected = format!("is in use by process {}", holder.id());
    assert!(stderr(&second).contains(&expected), "{}", stderr(&second));

    holder.kill().unwrap();
    holder.wait().unwrap();
    let at = step_of(&out.join("model.safetensors")).unwrap();
    assert!(at < 1_000_000);

    // The kernel released the lock: --force replaces the run, then
    // --resume continues it.
    assert_ok(
        &train_command(&dir, 10, &["--out", s(&out), "--force"])
            .output()
            .unwrap(),
    );
    assert_whole(&out, 10);
    assert_ok(
        &train_command(&dir, 20, &["--out", s(&out), "--resume"])
            .output()
            .unwrap(),
    );
    assert_whole(&out, 20);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_default_folder_gives_way_to_the_next_free_one() {
    let dir = cli::scratch("run_lock", "default");
    let first = train_command(&dir, 10, &[]).output().unwrap();
    assert_ok(&first);
    assert_whole(&dir.join("runs/synthetic"), 10);
    let second = train_command(&dir, 12, &[]).output().unwrap();
    assert_ok(&second);
    assert!(
        stderr(&second).contains("runs/synthetic already holds a run at step 10 of 10"),
        "{}",
        stderr(&second)
    );
    assert!(
        stderr(&second).contains("writing this run to runs/synthetic-2"),
        "{}",
        stderr(&second)
    );
    assert_whole(&dir.join("runs/synthetic"), 10);
    assert_whole(&dir.join("runs/synthetic-2"), 12);
    // --resume names the default folder itself, and continues its run.
    assert_ok(&train_command(&dir, 15, &["--resume"]).output().unwrap());
    assert_whole(&dir.join("runs/synthetic"), 15);
    let _ = std::fs::remove_dir_all(&dir);
}
