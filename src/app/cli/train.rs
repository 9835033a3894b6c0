//! `splitgrad train`: the main job.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use crate::Rng;
use crate::app::model::{BigramModel, ModelConfig};
use crate::app::train::{TrainConfig, Trainer};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::data;
use super::report::{self, ReportInput};
use super::{CliResult, TrainArgs, plots, set_threads};

/// The checkpoint file inside a run's folder.
pub const CHECKPOINT: &str = "model.safetensors";

/// Checks `--batch`, `--dim` and `--lr`, which every training command has.
pub fn check_run_flags(batch: usize, dim: usize, lr: f64) -> CliResult<()> {
    if batch == 0 {
        return Err("--batch must be at least 1".into());
    }
    if dim == 0 {
        return Err("--dim must be at least 1".into());
    }
    if !(lr.is_finite() && lr > 0.0) {
        return Err(format!("--lr must be a finite number > 0, got {lr}").into());
    }
    Ok(())
}

/// Runs a trainer to its last step behind a progress bar whose message
/// starts with `what`.
pub fn run_to_end(trainer: &mut Trainer<f32>, what: &str) -> CliResult<()> {
    let bar = progress_bar(trainer.config().steps, trainer.step_index());
    while !trainer.is_done() {
        let s = trainer.step()?;
        bar.set_position(trainer.step_index());
        bar.set_message(format!("{what}, loss {:.4}", s.total));
    }
    bar.finish_and_clear();
    Ok(())
}

fn validate(args: &TrainArgs) -> CliResult<()> {
    let bad = |flag: &str, v: f64| -> CliResult<()> {
        Err(format!("{flag} must be a finite number ≥ 0, got {v}").into())
    };
    check_run_flags(args.batch, args.dim, args.lr)?;
    for (flag, v) in [
        ("--gate-penalty", args.gate_penalty),
        ("--fusion-penalty", args.fusion_penalty),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            bad(flag, v)?;
        }
    }
    if args.checkpoint_every == 0 {
        return Err("--checkpoint-every must be at least 1".into());
    }
    Ok(())
}

/// Runs `train` and prints the report.
pub fn run(args: TrainArgs) -> CliResult<ExitCode> {
    validate(&args)?;
    let threads = set_threads(args.threads)?;
    let data = data::load(&args)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("runs").join(&data.name));
    std::fs::create_dir_all(&out)
        .map_err(|e| format!("{}: cannot create the output folder: {e}", out.display()))?;
    let ckpt = out.join(CHECKPOINT);

    let mcfg = ModelConfig {
        vocab_size: data.vocab_size,
        n_languages: data.n_languages,
        dim: args.dim,
        gate_init: 0.0,
    };
    let mut model = BigramModel::<f32>::new(mcfg, data.index.clone())?;
    model.reset_parameters(&mut Rng::new(args.seed))?;
    let tcfg = TrainConfig {
        steps: args.steps,
        batch: args.batch,
        lr: args.lr,
        gate_penalty: args.gate_penalty,
        fusion_penalty: args.fusion_penalty,
        use_gate: !args.no_gate,
        seed: args.seed,
    };
    let mut trainer = Trainer::new(model, data.corpus.clone(), tcfg)?;
    if args.resume {
        if ckpt.exists() {
            trainer.load(&ckpt)?;
        } else {
            return Err(format!(
                "{}: --resume, but there is no checkpoint to resume from",
                ckpt.display()
            )
            .into());
        }
    }

    let bar = progress_bar(args.steps, trainer.step_index());
    let started = Instant::now();
    let first = trainer.step_index();
    while !trainer.is_done() {
        let s = trainer.step()?;
        bar.set_position(trainer.step_index());
        let secs = started.elapsed().as_secs_f64().max(1e-9);
        let tps = (trainer.step_index() - first) as f64 * args.batch as f64 / secs;
        bar.set_message(format!("loss {:.4}  {:.0} tok/s", s.total, tps));
        if trainer.step_index() % args.checkpoint_every == 0 && !trainer.is_done() {
            trainer.save(&ckpt)?;
        }
    }
    bar.finish_and_clear();
    let elapsed = started.elapsed().as_secs_f64();
    trainer.save(&ckpt)?;
    let steps_run = trainer.step_index() - first;
    let tokens_per_second = if steps_run > 0 {
        steps_run as f64 * args.batch as f64 / elapsed
    } else {
        0.0
    };

    let report = report::build(&ReportInput {
        model: trainer.model(),
        history: trainer.history(),
        corpus: &data.name,
        truth: data.truth.as_deref(),
        use_gate: !args.no_gate,
        tokens_per_second: Some(tokens_per_second),
        threads: Some(threads),
        checkpoint: &ckpt,
    });
    report::write_json(&out.join("report.json"), &report)?;
    let losses: Vec<f64> = trainer.history().iter().map(|s| s.total).collect();
    plots::loss_curve(&out.join("loss.svg"), &losses)?;
    plots::gate_histogram(
        &out.join("gates.svg"),
        &trainer
            .model()
            .split
            .gate()
            .iter()
            .map(|&g| g as f64)
            .collect::<Vec<_>>(),
    )?;
    report::print(&report);
    println!(
        "  wrote {CHECKPOINT}, report.json, loss.svg, gates.svg in {}",
        out.display()
    );
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(ExitCode::SUCCESS)
}

fn progress_bar(total: u64, at: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template("{bar:30} step {pos}/{len}  {msg}  [{elapsed_precise}]")
            .expect("valid template"),
    );
    bar.set_position(at);
    bar
}
