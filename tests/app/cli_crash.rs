//! Crash safety: `train` killed with SIGKILL at many random moments always
//! leaves a checkpoint that loads (or none yet), `--resume` goes on from
//! it, and the run ends with the weights of a run that was never killed:
//! in f32, and with bf16 tables and moments rounded stochastically (whose
//! random bits must come back the same after every resume).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use splitgrad::Rng;
use splitgrad::app::train::load_model;
use splitgrad::checkpoint::Checkpoint;

use crate::common::cli::{self, BIN};

const STEPS: u64 = 2500;
const ARGS: &[&str] = &["--batch", "256", "--dim", "8", "--checkpoint-every", "3"];

fn scratch(name: &str) -> PathBuf {
    cli::scratch("cli_crash", name)
}

fn command(out: &Path, resume: bool, precision: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(["train", "--steps", &STEPS.to_string(), "--out"])
        .arg(out)
        .args(ARGS)
        .args(precision);
    if resume {
        c.arg("--resume");
    }
    c
}

#[test]
fn sigkill_at_random_moments_never_loses_the_last_checkpoint() {
    kill_at_random_moments("kill", &[]);
}

#[test]
fn sigkill_at_random_moments_never_loses_a_bf16_run() {
    kill_at_random_moments(
        "kill-bf16",
        &[
            "--dtype",
            "bf16",
            "--state-dtype",
            "bf16",
            "--rounding",
            "stochastic",
        ],
    );
}

fn kill_at_random_moments(name: &str, precision: &[&str]) {
    let dir = scratch(name);
    let whole = dir.join("whole");
    let started = std::time::Instant::now();
    let status = command(&whole, false, precision)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    // Kills land within a tenth of a whole run's time after each start, so
    // about twenty of them fit in one run whatever the machine's speed.
    let window = (started.elapsed().as_micros() as u64 / 10).max(1);

    let cut = dir.join("cut");
    let ckpt = cut.join("model.safetensors");
    let mut rng = Rng::new(2024);
    let mut last_step = 0u64;
    let mut kills = 0;
    let mut mid_run = 0;
    while kills < 24 {
        let resume = ckpt.exists();
        let mut child = command(&cut, resume, precision)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Anywhere from start-up (corpus generation) to deep in training.
        let wait = Duration::from_micros(rng.below(window));
        std::thread::sleep(wait);
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        kills += 1;
        if ckpt.exists() {
            let step: u64 = Checkpoint::open(&ckpt)
                .unwrap_or_else(|e| panic!("kill {kills}: the checkpoint does not open: {e}"))
                .metadata()["step"]
                .parse()
                .unwrap();
            let saved = load_model::<f32>(&ckpt)
                .unwrap_or_else(|e| panic!("kill {kills}: the checkpoint does not load: {e}"));
            assert_eq!(saved.history.len() as u64, step);
            assert!(
                step >= last_step,
                "kill {kills}: step went back {last_step} → {step}"
            );
            if status.code().is_none() && step < STEPS {
                mid_run += 1;
            }
            last_step = step;
        }
    }
    eprintln!(
        "{kills} kills, {mid_run} after a checkpoint and before the end, last checkpoint at step {last_step}"
    );
    assert!(mid_run >= 10, "only {mid_run} kills landed mid-run");
    let status = command(&cut, ckpt.exists(), precision)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let (a, b) = (
        Checkpoint::open(whole.join("model.safetensors")).unwrap(),
        Checkpoint::open(&ckpt).unwrap(),
    );
    let dtype = if precision.is_empty() { "f32" } else { "bf16" };
    assert_eq!(b.metadata()["dtype"], dtype);
    for name in a.names() {
        assert_eq!(a.get(name).unwrap(), b.get(name).unwrap(), "{name}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
