//! The report of a trained model (printed and as JSON), and
//! `splitgrad report CHECKPOINT`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::app::model::BigramModel;
use crate::app::report::{OPEN_THRESHOLD, effective_vocabularies, precision_recall_f1, spearman};
use crate::app::synthetic::{SyntheticConfig, generate};
use crate::app::train::{StepStats, corpus_fingerprint, load_model};
use crate::io::write_atomic;
use clap::Args;
use serde_json::{Value, json};

use super::CliResult;

/// What a report is made from.
pub struct ReportInput<'a> {
    pub model: &'a BigramModel<f32>,
    pub history: &'a [StepStats],
    pub corpus: &'a str,
    /// The planted pairs, sorted, when the corpus is the synthetic one.
    pub truth: Option<&'a [(usize, usize)]>,
    pub use_gate: bool,
    pub tokens_per_second: Option<f64>,
    pub threads: Option<usize>,
    pub checkpoint: &'a Path,
}

/// The report as JSON: every gate, the most open and most closed, how many
/// are open, agreement with the planted truth and with the index's score,
/// the effective number of vocabularies, the speed.
pub fn build(r: &ReportInput<'_>) -> Value {
    let model = r.model;
    let index = model.split.index();
    let gates: Vec<f64> = model.split.gate().iter().map(|&g| g as f64).collect();
    let planted: Option<Vec<bool>> = r.truth.map(|truth| {
        (0..gates.len())
            .map(|i| {
                truth
                    .binary_search(&(index.language_index[i], index.token_index[i]))
                    .is_ok()
            })
            .collect()
    });
    let entry = |i: usize| {
        let (l, t) = (index.language_index[i], index.token_index[i]);
        let mut e = json!({"language": l, "token": t, "gate": gates[i]});
        if let Some(p) = &planted {
            e["planted"] = json!(p[i]);
        }
        if let Some(score) = &index.score {
            e["score"] = json!(score[i]);
        }
        e
    };
    let mut order: Vec<usize> = (0..gates.len()).collect();
    order.sort_by(|&a, &b| gates[b].total_cmp(&gates[a]).then(a.cmp(&b)));
    let open: Vec<bool> = gates.iter().map(|&g| g > OPEN_THRESHOLD).collect();
    let n_open = open.iter().filter(|&&o| o).count();
    let last = r.history.last();
    let ev = effective_vocabularies(model, r.use_gate, 0.05);
    let mut report = json!({
        "corpus": r.corpus,
        "steps": r.history.len(),
        "n_rows": gates.len(),
        "use_gate": r.use_gate,
        "open_threshold": OPEN_THRESHOLD,
        "n_open": n_open,
        "most_open": order.iter().take(10).map(|&i| entry(i)).collect::<Vec<_>>(),
        "most_closed": order.iter().rev().take(10).map(|&i| entry(i)).collect::<Vec<_>>(),
        "final_loss": last.map(|s| s.total),
        "final_ce": last.map(|s| s.ce),
        "final_penalty": last.map(|s| s.penalty),
        "final_fusion_penalty": last.map(|s| s.fusion),
        "effective_vocabularies": ev.mean,
        "tokens_per_second": r.tokens_per_second,
        "threads": r.threads,
        "checkpoint": r.checkpoint.display().to_string(),
        "gates": (0..gates.len()).map(entry).collect::<Vec<_>>(),
    });
    if let (Some(truth), Some(planted)) = (r.truth, &planted) {
        let (p, rc, f1) = precision_recall_f1(&open, planted);
        let decoys_open = open.iter().zip(planted).filter(|&(&o, &p)| o && !p).count();
        let extreme = |want: bool, pick: fn(f64, f64) -> f64, start: f64| {
            let v = (0..gates.len())
                .filter(|&i| planted[i] == want)
                .map(|i| gates[i])
                .fold(start, pick);
            v.is_finite().then_some(v)
        };
        report["planted"] = json!({
            "precision": p,
            "recall": rc,
            "f1": f1,
            "n_planted": truth.len(),
            "decoys_open": decoys_open,
            "lowest_planted_gate": extreme(true, f64::min, f64::INFINITY),
            "highest_decoy_gate": extreme(false, f64::max, f64::NEG_INFINITY),
        });
    }
    if let Some(score) = &index.score {
        report["gate_score_spearman"] = json!(spearman(&gates, score));
    }
    report
}

/// Writes the report as pretty JSON, atomically.
pub fn write_json(path: &Path, report: &Value) -> CliResult<()> {
    let text = serde_json::to_string_pretty(report)? + "\n";
    write_atomic(path, |w| Ok(w.write_all(text.as_bytes())?))?;
    Ok(())
}

/// Prints the report for a person.
pub fn print(r: &Value) {
    println!(
        "splitgrad: {} steps on {} ({} split rows, {})",
        r["steps"],
        r["corpus"].as_str().unwrap_or("?"),
        r["n_rows"],
        if r["use_gate"].as_bool() == Some(false) {
            "fusion mode"
        } else {
            "gated"
        }
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
        if let (Some(lo), Some(hi)) = (
            p["lowest_planted_gate"].as_f64(),
            p["highest_decoy_gate"].as_f64(),
        ) {
            println!("  lowest planted gate {lo:.3}, highest other gate {hi:.3}");
        }
    }
    if let Some(s) = r.get("gate_score_spearman").and_then(Value::as_f64) {
        println!("  rank correlation (Spearman) of gates with the index's score: {s:.3}");
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
                Some(false) => "  not planted",
                None => "",
            };
            let score = e
                .get("score")
                .and_then(Value::as_f64)
                .map(|s| format!("  score {s:.4}"))
                .unwrap_or_default();
            println!(
                "    language {:>3}  token {:>6}  gate {:.3}{score}{planted}",
                e["language"],
                e["token"],
                e["gate"].as_f64().unwrap_or(0.0)
            );
        }
    };
    show("most open", &r["most_open"]);
    show("most closed", &r["most_closed"]);
    if let Some(tps) = r["tokens_per_second"].as_f64() {
        println!("  {tps:.0} tokens/s on {} threads", r["threads"]);
    }
}

/// Options of `splitgrad report`.
#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// A checkpoint written by `splitgrad train`.
    pub checkpoint: PathBuf,
    /// Print the report as one JSON object on the last line of standard output.
    #[arg(long)]
    pub json: bool,
}

/// `splitgrad report CHECKPOINT`.
pub fn run(args: ReportArgs) -> CliResult<ExitCode> {
    let saved = load_model::<f32>(&args.checkpoint)?;
    let meta = &saved.metadata;
    let use_gate = meta.get("use_gate").map(String::as_str) != Some("false");
    // The synthetic corpus is recognised by regenerating it from the seed
    // and comparing fingerprints; then the planted truth is known.
    let cfg = saved.model.config();
    let default = SyntheticConfig::default();
    let mut truth = None;
    let mut corpus = "a corpus file".to_string();
    if let Some(seed) = meta.get("seed").and_then(|s| s.parse::<u64>().ok())
        && (cfg.vocab_size, cfg.n_languages) == (default.vocab_size, default.n_languages)
    {
        let s = generate(&SyntheticConfig { seed, ..default });
        let fp = format!("{:016x}", corpus_fingerprint(&s.corpus));
        if meta.get("corpus_fingerprint") == Some(&fp) {
            truth = Some(s.contested);
            corpus = "synthetic".into();
        }
    }
    let report = build(&ReportInput {
        model: &saved.model,
        history: &saved.history,
        corpus: &corpus,
        truth: truth.as_deref(),
        use_gate,
        tokens_per_second: None,
        threads: None,
        checkpoint: &args.checkpoint,
    });
    print(&report);
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(ExitCode::SUCCESS)
}
