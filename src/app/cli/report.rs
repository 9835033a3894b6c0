//! The report of a trained model ([`Report`], built by the application)
//! printed for a person and as JSON, and `splitgrad report CHECKPOINT`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use serde_json::{Value, json};

use crate::app::report::{
    GatedOutcome, Memory, Outcome, PlantedReport, ROWS_LISTED, Report, ReportInput, RowReport,
};
use crate::app::train::load_model;
use crate::error::human_bytes;
use crate::io::write_atomic;

use super::CliResult;

/// `n` and the noun, plural unless n is 1 (`1 step`, `2 steps`).
fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("{n} {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// A number with three decimals, or "undefined".
pub fn fmt3(x: Option<f64>) -> String {
    x.map_or_else(|| "undefined".to_string(), |v| format!("{v:.3}"))
}

/// A JSON number, or null for NaN and infinities.
fn num(x: f64) -> Value {
    if x.is_finite() { json!(x) } else { Value::Null }
}

/// A finite number; `None` for NaN and infinities (which JSON cannot hold).
fn finite(x: f64) -> Option<f64> {
    // (+ 0.0: a −0 prints as 0, not as `-0.0000`.)
    x.is_finite().then_some(x + 0.0)
}

/// `x` where finite, NaN otherwise: a figure as the JSON report holds it.
fn shown(x: f64) -> f64 {
    finite(x).unwrap_or(f64::NAN)
}

/// One row as JSON.
fn row_json(e: &RowReport) -> Value {
    let mut v = json!({"language": e.language, "token": e.token});
    if let Some(n) = &e.language_name {
        v["language_name"] = json!(n);
    }
    if let Some(s) = &e.token_string {
        v["token_string"] = json!(s);
    }
    if let Some(g) = e.gate {
        v["gate"] = json!(g);
    }
    if let Some(d) = e.distance_to_centroid {
        v["distance_to_centroid"] = num(d);
    }
    if let Some(h) = &e.heldout {
        v["heldout_gain"] = json!(h.gain);
        v["heldout_gain_per_token"] = json!(h.gain_per_token);
        v["heldout_gain_se"] = num(h.gain_se);
        v["heldout_tokens"] = json!(h.tokens);
        v["heldout_gain_null"] = json!(h.gain_null);
        v["heldout_evidence"] = num(h.evidence);
    }
    if let Some(k) = e.kept {
        v["kept"] = json!(k);
    }
    if let Some(p) = e.planted {
        v["planted"] = json!(p);
    }
    if let Some(s) = e.score {
        v["score"] = json!(s);
    }
    v
}

/// The rule of a gated report as JSON.
pub fn rule_json(g: &GatedOutcome) -> Value {
    json!({
        "description": crate::app::eval::Rule::DESCRIPTION,
        "alpha": g.rule.alpha,
        "min_count": g.rule.min_count,
        "margin": g.rule.margin,
    })
}

/// Rows as a JSON array.
pub fn rows_json(rows: &[RowReport]) -> Value {
    rows.iter().map(row_json).collect()
}

/// The report as one JSON object.
pub fn to_json(r: &Report) -> Value {
    let last = r.last_step.as_ref();
    let throughput = r.throughput.as_ref();
    let mut v = json!({
        "corpus": r.corpus,
        "steps": r.steps,
        "n_rows": r.n_rows,
        "use_gate": r.use_gate(),
        "final_loss": last.map(|s| s.total),
        "final_ce": last.map(|s| s.ce),
        "final_penalty": last.map(|s| s.penalty),
        "final_fusion_penalty": last.map(|s| s.fusion),
        "heldout_curve": r.heldout_curve.iter().map(|&(s, c, k)| json!({"step": s, "ce": num(c), "ce_closed": num(k)})).collect::<Vec<_>>(),
        "heldout_ce_initial": r.heldout_ce_initial,
        "heldout_ce_uniform": r.heldout_ce_uniform,
        "learned": r.learned,
        "tokens_per_second": throughput.map(|t| t.tokens_per_second),
        "threads": throughput.map(|t| t.threads),
        "checkpoint": r.checkpoint.display().to_string(),
        "rows": rows_json(&r.rows),
        "rows_listed": r.rows.len(),
    });
    if let Some(h) = &r.heldout {
        v["heldout_tokens"] = json!(h.n_tokens);
        v["heldout_ce"] = json!(h.ce);
        v["heldout_ce_closed"] = json!(h.ce_closed);
        v["heldout_per_language"] = h
            .per_language
            .iter()
            .map(|le| {
                let mut l = json!({"language": le.language, "n_tokens": le.n_tokens, "ce": num(le.ce), "ce_closed": num(le.ce_closed)});
                if let Some(n) = &le.language_name {
                    l["language_name"] = json!(n);
                }
                l
            })
            .collect();
    }
    match &r.outcome {
        Outcome::Gated(g) => {
            v["rule"] = rule_json(g);
            v["kept"] = rows_json(&g.kept);
            v["n_kept"] = json!(g.n_kept);
            v["effective_vocabularies"] = json!(g.effective_vocabularies);
            v["gate_mean"] = json!(g.gate_mean);
            for (key, s) in [
                ("spearman_gain_gate", g.spearman_gain_gate),
                ("spearman_gain_score", g.spearman_gain_score),
                ("spearman_gate_score", g.spearman_gate_score),
            ] {
                if let Some(s) = s {
                    v[key] = json!(s);
                }
            }
            if let Some(p) = &g.planted {
                v["f1"] = json!(p.agreement.f1);
                v["auc"] = json!(p.gate_auc);
                v["planted"] = planted_json(p);
            }
        }
        Outcome::Fusion(f) => {
            v["distinct_rows_per_token"] = json!(f.distinct_rows_per_token);
            v["mean_distance_to_centroid"] = json!(f.mean_distance_to_centroid);
            v["effective_vocabularies"] = json!(f.distinct_rows_per_token);
        }
    }
    if let Some(s) = &r.heldout_source {
        v["heldout_source"] = json!(s);
    }
    if let Some(h) = throughput.and_then(|t| t.head) {
        v["contexts_per_step"] = json!(h.contexts_per_step);
        v["head_gflops"] = json!(h.gflops);
    }
    if let Some(m) = &r.memory {
        v["dtype"] = json!(m.dtype.name());
        v["state_dtype"] = json!(m.state_dtype.name());
        v["rounding"] = json!(m.rounding.name());
        v["params_bytes"] = json!(m.params_bytes);
        v["state_bytes"] = json!(m.state_bytes);
    }
    v
}

/// The memory line: what the parameters and the optimiser state take.
fn print_memory(m: &Memory) {
    let rounding = if m.dtype.is_half() || m.state_dtype.is_half() {
        format!("; {} rounding", m.rounding)
    } else {
        String::new()
    };
    println!(
        "  memory: parameters {} in {}, optimiser state {} in {}{rounding}",
        human_bytes(m.params_bytes),
        m.dtype,
        human_bytes(m.state_bytes),
        m.state_dtype
    );
}

fn planted_json(p: &PlantedReport) -> Value {
    let a = &p.agreement;
    json!({
        "n_planted": p.n_planted,
        "precision": a.precision,
        "recall": a.recall,
        "f1": a.f1,
        "decoys_kept": a.false_positives,
        "gate_auc": p.gate_auc,
        "gate_average_precision": p.gate_average_precision,
        "gain_auc": p.gain_auc,
    })
}

/// Writes a JSON value pretty-printed, atomically.
pub fn write_json(path: &Path, value: &Value) -> CliResult<()> {
    let text = serde_json::to_string_pretty(value)? + "\n";
    write_atomic(path, |w| Ok(w.write_all(text.as_bytes())?))?;
    Ok(())
}

/// "language 2" or "fr    "; "token 17" or "token 17 \" the\"      ".
fn describe(e: &RowReport) -> String {
    let lang = match &e.language_name {
        Some(n) => format!("{n:<6}"),
        None => format!("language {}", e.language),
    };
    let tok = match &e.token_string {
        Some(s) => format!("token {} {:<12}", e.token, format!("{s:?}")),
        None => format!("token {}", e.token),
    };
    format!("{lang}  {tok}")
}

/// Prints rows under a title (nothing for none).
fn print_rows(title: &str, rows: &[&RowReport]) {
    if rows.is_empty() {
        return;
    }
    println!("  {title}:");
    for e in rows {
        let planted = match e.planted {
            Some(true) => "  planted",
            Some(false) => "  not planted",
            None => "",
        };
        let gain = e
            .heldout
            .as_ref()
            .and_then(|h| finite(h.gain).map(|g| (g, h)))
            .map(|(g, h)| {
                format!(
                    "  held-out gain {g:>9.3} nats ({} tokens, evidence {})",
                    h.tokens,
                    finite(h.evidence).map_or("–".to_string(), |x| format!("{x:.2}"))
                )
            })
            .unwrap_or_default();
        println!(
            "    {}  gate {:.3}{gain}{planted}",
            describe(e),
            shown(e.gate.unwrap_or(f64::NAN))
        );
    }
}

/// Prints what a gated run keeps.
fn print_gated(r: &Report, g: &GatedOutcome) {
    println!(
        "  kept rows: {} of {} (their held-out text does not follow the shared row, beyond chance over all rows, and they save > {} nats a token); effective number of vocabularies {:.3}",
        g.n_kept,
        r.n_rows,
        json!(g.rule.margin),
        shown(g.effective_vocabularies)
    );
    if let Some(p) = &g.planted {
        let a = &p.agreement;
        println!(
            "  against the planted pairs: precision {}, recall {}, F1 {}; decoys kept: {}",
            fmt3(a.precision.and_then(finite)),
            fmt3(a.recall.and_then(finite)),
            fmt3(a.f1.and_then(finite)),
            a.false_positives
        );
        println!(
            "  gates against the planted pairs, with no threshold: ROC AUC {}, average precision {}",
            fmt3(p.gate_auc.and_then(finite)),
            fmt3(p.gate_average_precision.and_then(finite))
        );
    }
    if let Some(s) = g.spearman_gain_gate.flatten().and_then(finite) {
        println!("  rank correlation of held-out gains with the gates: {s:.3}");
    }
    if let Some(s) = g.spearman_gain_score.flatten().and_then(finite) {
        println!("  … with the index's score: {s:.3}");
    }
    let kept: Vec<&RowReport> = g.kept.iter().take(5).collect();
    print_rows("kept, most useful first", &kept);
    let mut rest: Vec<&RowReport> = r.rows.iter().filter(|e| e.kept != Some(true)).collect();
    let evidence = |e: &RowReport| {
        e.heldout
            .as_ref()
            .and_then(|h| finite(h.evidence))
            .unwrap_or(f64::NEG_INFINITY)
    };
    rest.sort_by(|a, b| evidence(b).total_cmp(&evidence(a)));
    rest.truncate(3);
    print_rows("not kept, closest to the rule", &rest);
}

/// The report's first two lines: `steps` (how far the run went) on its
/// corpus, its rows and mode; then its `which` ("final", "latest")
/// training loss.
fn print_head(r: &Report, steps: &str, which: &str) {
    println!(
        "splitgrad: {steps} on {} ({} split rows, {})",
        r.corpus,
        r.n_rows,
        if r.use_gate() { "gated" } else { "fusion mode" }
    );
    println!(
        "  {which} training loss {:.4} (cross-entropy {:.4})",
        r.last_step.map_or(f64::NAN, |s| shown(s.total)),
        r.last_step.map_or(f64::NAN, |s| shown(s.ce))
    );
}

/// Prints the report for a person.
pub fn print(r: &Report) {
    print_head(r, &count(r.steps as u64, "step"), "final");
    if let Some((h, ce)) = r
        .heldout
        .as_ref()
        .and_then(|h| finite(h.ce).map(|c| (h, c)))
    {
        println!(
            "  held-out cross-entropy {ce:.4} on {} tokens; every gate closed {:.4}{}",
            h.n_tokens,
            shown(h.ce_closed),
            r.heldout_ce_initial
                .and_then(finite)
                .map(|i| format!("; before training {i:.4}"))
                .unwrap_or_default()
        );
        let langs: Vec<String> = h
            .per_language
            .iter()
            .map(|l| {
                let name = l
                    .language_name
                    .clone()
                    .unwrap_or_else(|| l.language.to_string());
                format!("{name} {:.3}/{:.3}", shown(l.ce), shown(l.ce_closed))
            })
            .collect();
        println!("  per language (model/closed): {}", langs.join("  "));
    }
    if r.learned == Some(false) {
        println!(
            "  nothing was learned: the held-out cross-entropy is not below ln V = {:.4}, a uniform guess{}",
            shown(r.heldout_ce_uniform),
            if r.gated().is_some_and(|g| g.n_kept == 0) {
                "; no row is kept"
            } else {
                ""
            }
        );
    }
    match &r.outcome {
        Outcome::Fusion(f) => println!(
            "  distinct rows per token: {:.3}; mean distance of a row to its token's centroid {:.4}",
            shown(f.distinct_rows_per_token),
            shown(f.mean_distance_to_centroid)
        ),
        Outcome::Gated(g) => print_gated(r, g),
    }
    if let Some(t) = r.throughput.filter(|t| t.tokens_per_second.is_finite()) {
        let tps = t.tokens_per_second;
        match t
            .head
            .filter(|h| h.contexts_per_step.is_finite() && h.gflops.is_finite())
        {
            Some(h) => println!(
                "  {tps:.0} tokens/s on {} (training steps only; {:.0} distinct contexts a step, the head at {:.1} GFLOP/s)",
                count(t.threads as u64, "thread"),
                h.contexts_per_step,
                h.gflops
            ),
            None => println!(
                "  {tps:.0} tokens/s on {}",
                count(t.threads as u64, "thread")
            ),
        }
    }
    if let Some(m) = &r.memory {
        print_memory(m);
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
    let mut report = Report::build(&ReportInput::of_saved(
        &saved,
        &args.checkpoint,
        ROWS_LISTED,
    ));
    report.memory = Some(Memory::of_saved(&saved));
    // A run stopped before its last step has no held-out evaluation: no
    // row is kept or scored yet, and the report says so instead.
    let finished = saved.evaluation.is_some();
    if finished {
        print(&report);
    } else {
        let planned = saved.metadata.get("steps").and_then(|s| s.parse().ok());
        print_unfinished(&report, planned);
    }
    if args.json {
        let mut v = to_json(&report);
        v["finished"] = json!(finished);
        println!("{}", serde_json::to_string(&v)?);
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints the report of a run stopped before its last step (`planned`
/// steps, where the checkpoint says): what it has, and that the decision
/// waits for the held-out evaluation at the end.
fn print_unfinished(r: &Report, planned: Option<u64>) {
    let planned = planned.map_or("its".to_string(), |p| p.to_string());
    print_head(
        r,
        &format!("unfinished run, {} of {planned} steps", r.steps),
        "latest",
    );
    println!(
        "  no held-out evaluation yet: it runs at the last step, and decides which rows are kept; \
         finish the run with `splitgrad train --resume` and the same settings"
    );
    if let Some(m) = &r.memory {
        print_memory(m);
    }
}
