//! `splitgrad train`: the main job.

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::Rng;
use crate::app::eval::{evaluate, heldout_ce};
use crate::app::model::{BigramModel, ModelConfig};
use crate::app::train::{RunLabels, TrainConfig, Trainer};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::data;
use super::outdir::{default_run_folder, prepare_run_folder, report_removed};
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
    if args.steps == 0 {
        return Err("--steps must be at least 1: a run of 0 steps trains nothing".into());
    }
    Ok(())
}

/// Set by SIGINT or SIGTERM: the run finishes its step, writes a
/// checkpoint and stops. A second signal while that happens exits at once
/// (with 130 or 143), leaving the last checkpoint, written atomically,
/// intact.
struct Stop {
    interrupt: Arc<AtomicBool>,
    terminate: Arc<AtomicBool>,
}

impl Stop {
    fn install() -> CliResult<Stop> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        use signal_hook::flag::{register, register_conditional_shutdown};
        let any = Arc::new(AtomicBool::new(false));
        let interrupt = Arc::new(AtomicBool::new(false));
        let terminate = Arc::new(AtomicBool::new(false));
        // The exit on a second signal is registered first, so that it sees
        // the flag the first signal sets.
        register_conditional_shutdown(SIGINT, 130, Arc::clone(&any))?;
        register_conditional_shutdown(SIGTERM, 143, Arc::clone(&any))?;
        register(SIGINT, Arc::clone(&any))?;
        register(SIGTERM, Arc::clone(&any))?;
        register(SIGINT, Arc::clone(&interrupt))?;
        register(SIGTERM, Arc::clone(&terminate))?;
        Ok(Stop {
            interrupt,
            terminate,
        })
    }

    /// The exit code to stop with, once a signal has come.
    fn requested(&self) -> Option<u8> {
        if self.terminate.load(Ordering::Relaxed) {
            Some(143)
        } else if self.interrupt.load(Ordering::Relaxed) {
            Some(130)
        } else {
            None
        }
    }
}

/// Runs `train` and prints the report.
pub fn run(args: TrainArgs) -> CliResult<ExitCode> {
    validate(&args)?;
    let stop = Stop::install()?;
    let threads = set_threads(args.threads)?;
    let data = data::load(&args)?;
    data.plan(args.dim, data.index.token_index.len(), args.batch)
        .check("--dim or --batch")?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| default_run_folder(&data.name, args.corpus.as_deref()));
    let ckpt = out.join(CHECKPOINT);
    if args.resume && !ckpt.exists() {
        return Err(format!(
            "{}: --resume, but there is no checkpoint to resume from",
            ckpt.display()
        )
        .into());
    }
    report_removed(&prepare_run_folder(
        &out,
        CHECKPOINT,
        args.resume,
        args.force,
    )?);

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
    trainer.bind_heldout(&data.heldout);
    if args.resume {
        trainer.load(&ckpt)?;
        println!(
            "splitgrad: resumed {} from step {} of {}",
            ckpt.display(),
            trainer.step_index(),
            args.steps
        );
    }

    let labels = RunLabels {
        corpus: data.name.clone(),
        language_names: data.corpus.meta.language_names.clone(),
        token_strings: data.corpus.meta.token_strings.clone(),
        planted: data.truth.as_ref().map(|truth| {
            let index = trainer.model().split.index();
            (0..index.token_index.len())
                .map(|i| {
                    truth
                        .binary_search(&(index.language_index[i], index.token_index[i]))
                        .is_ok()
                })
                .collect()
        }),
    };
    trainer.set_labels(labels);
    let use_gate = !args.no_gate;
    if trainer.step_index() == 0 {
        let (ce, ce_closed) = heldout_ce(trainer.model(), &data.heldout, use_gate)?;
        trainer.record_heldout(ce, ce_closed);
    }

    let bar = progress_bar(args.steps, trainer.step_index());
    // Tokens per second count the steps only: the held-out evaluations at
    // powers of two and the checkpoints are timed apart.
    let mut stepping = 0.0f64;
    // Distinct hidden rows (contexts) of the steps run, for the head's rate.
    let mut contexts = 0.0f64;
    let first = trainer.step_index();
    let mut heldout = trainer.heldout_curve().last().map_or(f64::NAN, |c| c.1);
    while !trainer.is_done() {
        if let Some(code) = stop.requested() {
            bar.finish_and_clear();
            return stopped(&mut trainer, &ckpt, first, code);
        }
        if let Some(code) = stop.requested() {
            bar.finish_and_clear();
            return stopped(&mut trainer, &ckpt, first, code);
        }
        let t0 = Instant::now();
        let s = trainer.step()?;
        stepping += t0.elapsed().as_secs_f64();
        contexts += trainer.last_contexts() as f64;
        let step = trainer.step_index();
        if step.is_power_of_two() && !trainer.is_done() {
            let (ce, ce_closed) = heldout_ce(trainer.model(), &data.heldout, use_gate)?;
            trainer.record_heldout(ce, ce_closed);
            heldout = ce;
        }
        bar.set_position(step);
        let tps = (step - first) as f64 * args.batch as f64 / stepping.max(1e-9);
        bar.set_message(format!(
            "loss {:.4}  held-out {heldout:.4}  {tps:.0} tok/s",
            s.total
        ));
        if step % args.checkpoint_every == 0 && !trainer.is_done() {
            trainer.save(&ckpt)?;
        }
    }
    bar.finish_and_clear();
    let steps_run = trainer.step_index() - first;
    let tokens_per_second = if steps_run > 0 {
        steps_run as f64 * args.batch as f64 / stepping.max(1e-9)
    } else {
        0.0
    };
    let evaluation = evaluate(trainer.model(), &data.heldout, use_gate)?;
    trainer.record_heldout(evaluation.ce, evaluation.ce_closed);
    trainer.set_evaluation(evaluation);
    trainer.save(&ckpt)?;

    let report = report::build(&ReportInput {
        model: trainer.model(),
        history: trainer.history(),
        labels: trainer.labels(),
        heldout_curve: trainer.heldout_curve(),
        evaluation: trainer.evaluation(),
        use_gate,
        tokens_per_second: Some(tokens_per_second),
        threads: Some(threads),
        checkpoint: &ckpt,
        kept_limit: super::report::ROWS_LISTED,
    });
    let mut report = report;
    report["heldout_source"] = serde_json::json!(data.heldout_source);
    if steps_run > 0 {
        // The head's work: 6·m·V·D flops a step for m distinct contexts.
        let m = contexts / steps_run as f64;
        let flops = 6.0 * m * data.vocab_size as f64 * args.dim as f64;
        report["contexts_per_step"] = serde_json::json!(m);
        report["head_gflops"] =
            serde_json::json!(flops * steps_run as f64 / stepping.max(1e-9) / 1e9);
    }
    report::write_json(&out.join("report.json"), &report)?;
    plots::loss_curve(
        &out.join("loss.svg"),
        trainer.history(),
        trainer.heldout_curve(),
    )?;
    plots::gate_histogram(
        &out.join("gates.svg"),
        &trainer
            .model()
            .split
            .gate()
            .iter()
            .map(|&g| g as f64)
            .collect::<Vec<_>>(),
        trainer.labels().planted.as_deref(),
    )?;
    report::print(&report);
    println!(
        "  held-out: {}; wrote {CHECKPOINT}, report.json, loss.svg, gates.svg in {}",
        data.heldout_source,
        out.display()
    );
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(ExitCode::SUCCESS)
}

/// Ends a run stopped by a signal: a checkpoint of the last finished step
/// (unless no step was run), and how to go on.
fn stopped(trainer: &mut Trainer<f32>, ckpt: &Path, first: u64, code: u8) -> CliResult<ExitCode> {
    let step = trainer.step_index();
    if step > first {
        trainer.save(ckpt)?;
        eprintln!(
            "splitgrad: stopped at step {step}: resume with --resume (checkpoint {})",
            ckpt.display()
        );
    } else if step > 0 {
        eprintln!(
            "splitgrad: stopped at step {step}, as resumed: {} is unchanged; resume with --resume",
            ckpt.display()
        );
    } else {
        eprintln!("splitgrad: stopped before the first step; no checkpoint was written");
    }
    Ok(ExitCode::from(code))
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
