//! `splitgrad train`: the main job.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{Value, json};
use splitgrad::Rng;
use splitgrad::model::{BigramModel, ModelConfig};
use splitgrad::report::{OPEN_THRESHOLD, effective_vocabularies, precision_recall_f1, spearman};
use splitgrad::train::{TrainConfig, Trainer};

use super::data::{self, Data};
use super::{CliResult, TrainArgs, plots, set_threads};

/// The checkpoint file inside a run's folder.
pub const CHECKPOINT: &str = "model.safetensors";

fn validate(args: &TrainArgs) -> CliResult<()> {
    let bad = |flag: &str, v: f64| -> CliResult<()> {
        Err(format!("{flag} must be a finite number ≥ 0, got {v}").into())
    };
    if args.batch == 0 {
        return Err("--batch must be at least 1".into());
    }
    if args.dim == 0 {
        return Err("--dim must be at least 1".into());
    }
    if !(args.lr.is_finite() && args.lr > 0.0) {
        return Err(format!("--lr must be a finite number > 0, got {}", args.lr).into());
    }
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

    let report = build_report(
        &trainer,
        &data,
        !args.no_gate,
        tokens_per_second,
        threads,
        &ckpt,
    );
    std::fs::write(
        out.join("report.json"),
        serde_json::to_string_pretty(&report)? + "\n",
    )
    .map_err(|e| format!("{}: {e}", out.join("report.json").display()))?;
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
    print_report(&report, &out);
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

/// The report of a trained model, as JSON.
pub fn build_report(
    trainer: &Trainer<f32>,
    data: &Data,
    use_gate: bool,
    tokens_per_second: f64,
    threads: usize,
    ckpt: &Path,
) -> Value {
    let model = trainer.model();
    let index = model.split.index();
    let gates: Vec<f64> = model.split.gate().iter().map(|&g| g as f64).collect();
    let mut order: Vec<usize> = (0..gates.len()).collect();
    order.sort_by(|&a, &b| gates[b].total_cmp(&gates[a]).then(a.cmp(&b)));
    let entry = |i: usize| {
        let (l, t) = (index.language_index[i], index.token_index[i]);
        let mut e = json!({"language": l, "token": t, "gate": gates[i]});
        if let Some(truth) = &data.truth {
            e["planted"] = json!(truth.binary_search(&(l, t)).is_ok());
        }
        if let Some(score) = &index.score {
            e["score"] = json!(score[i]);
        }
        e
    };
    let open: Vec<bool> = gates.iter().map(|&g| g > OPEN_THRESHOLD).collect();
    let n_open = open.iter().filter(|&&o| o).count();
    let history = trainer.history();
    let last = history.last();
    let ev = effective_vocabularies(model, use_gate, 0.05);
    let mut report = json!({
        "corpus": data.name,
        "steps": trainer.step_index(),
        "n_rows": gates.len(),
        "use_gate": use_gate,
        "open_threshold": OPEN_THRESHOLD,
        "n_open": n_open,
        "most_open": order.iter().take(10).map(|&i| entry(i)).collect::<Vec<_>>(),
        "most_closed": order.iter().rev().take(10).map(|&i| entry(i)).collect::<Vec<_>>(),
        "final_loss": last.map(|s| s.total),
        "final_ce": last.map(|s| s.ce),
        "final_penalty": last.map(|s| s.penalty),
        "final_fusion_penalty": last.map(|s| s.fusion),
        "effective_vocabularies": ev.mean,
        "tokens_per_second": tokens_per_second,
        "threads": threads,
        "checkpoint": ckpt.display().to_string(),
    });
    if let Some(truth) = &data.truth {
        let planted: Vec<bool> = (0..gates.len())
            .map(|i| {
                truth
                    .binary_search(&(index.language_index[i], index.token_index[i]))
                    .is_ok()
            })
            .collect();
        let (p, r, f1) = precision_recall_f1(&open, &planted);
        let decoys_open = open
            .iter()
            .zip(&planted)
            .filter(|&(&o, &p)| o && !p)
            .count();
        let lowest_planted = (0..gates.len())
            .filter(|&i| planted[i])
            .map(|i| gates[i])
            .fold(f64::INFINITY, f64::min);
        let highest_other = (0..gates.len())
            .filter(|&i| !planted[i])
            .map(|i| gates[i])
            .fold(f64::NEG_INFINITY, f64::max);
        report["planted"] = json!({
            "precision": p,
            "recall": r,
            "f1": f1,
            "n_planted": truth.len(),
            "decoys_open": decoys_open,
            "lowest_planted_gate": lowest_planted.is_finite().then_some(lowest_planted),
            "highest_decoy_gate": highest_other.is_finite().then_some(highest_other),
        });
    }
    if let Some(score) = &index.score {
        report["gate_score_spearman"] = json!(spearman(&gates, score));
    }
    report
}

fn print_report(r: &Value, out: &Path) {
    println!(
        "splitgrad train: {} steps on {} ({} split rows)",
        r["steps"],
        r["corpus"].as_str().unwrap_or("?"),
        r["n_rows"]
    );
    println!(
        "  final loss {:.4} (cross-entropy {:.4})",
        r["final_loss"].as_f64().unwrap_or(f64::NAN),
        r["final_ce"].as_f64().unwrap_or(f64::NAN)
    );
    println!(
        "  open gates (σ > {}): {} of {}",
        r["open_threshold"], r["n_open"], r["n_rows"]
    );
    if let Some(p) = r.get("planted") {
        println!(
            "  against the planted pairs: precision {:.3}, recall {:.3}, F1 {:.3}; decoys open: {}",
            p["precision"].as_f64().unwrap_or(0.0),
            p["recall"].as_f64().unwrap_or(0.0),
            p["f1"].as_f64().unwrap_or(0.0),
            p["decoys_open"]
        );
    }
    if let Some(s) = r.get("gate_score_spearman") {
        println!("  rank correlation of gates with the index's score: {s}");
    }
    println!(
        "  effective number of vocabularies: {:.3}",
        r["effective_vocabularies"].as_f64().unwrap_or(0.0)
    );
    let show = |title: &str, list: &Value| {
        println!("  {title}:");
        for e in list.as_array().into_iter().flatten().take(5) {
            let planted = match e.get("planted").and_then(Value::as_bool) {
                Some(true) => "  planted",
                Some(false) => "  decoy",
                None => "",
            };
            println!(
                "    language {:>3}  token {:>6}  gate {:.3}{planted}",
                e["language"],
                e["token"],
                e["gate"].as_f64().unwrap_or(0.0)
            );
        }
    };
    show("most open", &r["most_open"]);
    show("most closed", &r["most_closed"]);
    println!(
        "  {:.0} tokens/s on {} threads",
        r["tokens_per_second"].as_f64().unwrap_or(0.0),
        r["threads"]
    );
    println!(
        "  wrote {}, report.json, loss.svg, gates.svg in {}",
        CHECKPOINT,
        out.display()
    );
}
