//! The report of a trained model (printed and as JSON), and
//! `splitgrad report CHECKPOINT`.
//!
//! The answer of a gated run is which split rows to keep, by the rule of
//! [`Rule`]: a row is kept when it saves held-out loss beyond noise. The
//! report gives every row's gate and held-out gain, the kept rows ranked by
//! gain, the held-out cross-entropy of the model and of the same model
//! with every gate closed (overall and per language), and the effective
//! number of vocabularies under the rule. On the synthetic corpus it adds
//! the agreement of the kept rows with the planted pairs and the
//! threshold-free ROC AUC and average precision of the gates. A fusion-mode
//! run reports fusion statistics instead: distinct rows per token, each
//! row's distance to its token's centroid, held-out cross-entropy.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use serde_json::{Value, json};

use crate::app::eval::{HeldOut, Rule};
use crate::app::model::BigramModel;
use crate::app::report::{
    agreement, average_precision, centroid_distances, effective_vocabularies, roc_auc, spearman,
    vocabularies_kept,
};
use crate::app::train::{RunLabels, StepStats, load_model};
use crate::io::write_atomic;

use super::CliResult;

/// What a report is made from.
pub struct ReportInput<'a> {
    pub model: &'a BigramModel<f32>,
    pub history: &'a [StepStats],
    pub labels: &'a RunLabels,
    /// (step, held-out ce, with every gate closed) at each evaluation.
    pub heldout_curve: &'a [(u64, f64, f64)],
    pub evaluation: Option<&'a HeldOut>,
    pub use_gate: bool,
    pub tokens_per_second: Option<f64>,
    pub threads: Option<usize>,
    pub checkpoint: &'a Path,
    /// The most kept rows listed in `kept` ([`ROWS_LISTED`] in a report;
    /// `export` lists them all).
    pub kept_limit: usize,
}

/// A number with three decimals, or "undefined".
pub fn fmt3(x: Option<f64>) -> String {
    x.map_or_else(|| "undefined".to_string(), |v| format!("{v:.3}"))
}

/// A JSON number, or null for NaN and infinities.
fn num(x: f64) -> Value {
    if x.is_finite() { json!(x) } else { Value::Null }
}

/// The most rows a report lists (in `rows` and in `kept`): every row when
/// there are no more, else the most useful by held-out gain. An index of
/// millions of pairs would otherwise make a report of gigabytes; every
/// row's figures stay in the checkpoint (`eval.rows`) and `export` writes
/// every kept pair.
pub const ROWS_LISTED: usize = 10_000;

/// The held-out cross-entropy must be at least this much (nats) below that
/// of a uniform guess over the vocabulary, `ln V`, and below the untrained
/// model's, for the report to say something was learned.
const LEARNED: f64 = 0.01;

/// The report as JSON (see the module docs for what it holds).
pub fn build(r: &ReportInput<'_>) -> Value {
    let model = r.model;
    let index = model.split.index();
    let n_rows = model.split.n_rows();
    let gates: Vec<f64> = model.split.gate().iter().map(|&g| g as f64).collect();
    let names = r.labels.language_names.as_deref();
    let strings = r.labels.token_strings.as_deref();
    let planted = r.labels.planted.as_deref();
    let last = r.history.last();
    let rule = Rule::default();
    let kept: Vec<bool> = match (r.use_gate, r.evaluation) {
        (true, Some(e)) => rule.keep(&e.rows),
        _ => vec![false; n_rows],
    };
    let distances = if r.use_gate {
        Vec::new()
    } else {
        centroid_distances(model)
    };
    let evidence: Vec<f64> = match r.evaluation {
        Some(e) => rule.evidence(&e.rows),
        None => vec![f64::NAN; n_rows],
    };
    let entry = |i: usize| {
        let (l, t) = (index.language_index[i], index.token_index[i]);
        let mut e = json!({"language": l, "token": t});
        if let Some(n) = names.and_then(|n| n.get(l)) {
            e["language_name"] = json!(n);
        }
        if let Some(s) = strings.and_then(|s| s.get(t)) {
            e["token_string"] = json!(s);
        }
        if r.use_gate {
            e["gate"] = json!(gates[i]);
        } else {
            e["distance_to_centroid"] = num(distances[i]);
        }
        if let Some(ev) = r.evaluation {
            let row = &ev.rows[i];
            e["heldout_gain"] = json!(row.gain);
            e["heldout_gain_per_token"] = json!(row.gain_per_token);
            e["heldout_gain_se"] = num(row.gain_se);
            e["heldout_tokens"] = json!(row.n_tokens);
            e["heldout_gain_null"] = json!(row.null_mean * row.n_tokens as f64);
            e["heldout_evidence"] = num(evidence[i]);
        }
        if r.use_gate {
            e["kept"] = json!(kept[i]);
        }
        if let Some(p) = planted {
            e["planted"] = json!(p[i]);
        }
        if let Some(score) = &index.score {
            e["score"] = json!(score[i]);
        }
        e
    };
    let gains: Option<Vec<f64>> = r
        .evaluation
        .map(|e| e.rows.iter().map(|row| row.gain).collect());
    // Rows ranked by held-out gain (by gate without an evaluation).
    let mut order: Vec<usize> = (0..n_rows).collect();
    let key = |i: usize| gains.as_ref().map_or(gates[i], |g| g[i]);
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    let initial = r.heldout_curve.iter().find(|c| c.0 == 0).map(|c| c.1);
    let uniform = (model.config().vocab_size as f64).ln();
    let learned = r
        .evaluation
        .map(|e| e.ce < uniform - LEARNED && initial.is_none_or(|i| e.ce < i - LEARNED));
    let mut report = json!({
        "corpus": r.labels.corpus,
        "steps": r.history.len(),
        "n_rows": n_rows,
        "use_gate": r.use_gate,
        "final_loss": last.map(|s| s.total),
        "final_ce": last.map(|s| s.ce),
        "final_penalty": last.map(|s| s.penalty),
        "final_fusion_penalty": last.map(|s| s.fusion),
        "heldout_curve": r.heldout_curve.iter().map(|&(s, c, k)| json!({"step": s, "ce": num(c), "ce_closed": num(k)})).collect::<Vec<_>>(),
        "heldout_ce_initial": initial,
        "heldout_ce_uniform": uniform,
        "learned": learned,
        "tokens_per_second": r.tokens_per_second,
        "threads": r.threads,
        "checkpoint": r.checkpoint.display().to_string(),
    });
    // Every row in index order, or the most useful ROWS_LISTED.
    let listed: Vec<usize> = if n_rows <= ROWS_LISTED {
        (0..n_rows).collect()
    } else {
        order[..ROWS_LISTED].to_vec()
    };
    report["rows"] = listed.iter().map(|&i| entry(i)).collect();
    report["rows_listed"] = json!(listed.len());
    if let Some(e) = r.evaluation {
        report["heldout_tokens"] = json!(e.n_tokens);
        report["heldout_ce"] = json!(e.ce);
        report["heldout_ce_closed"] = json!(e.ce_closed);
        report["heldout_per_language"] = e
            .per_language
            .iter()
            .enumerate()
            .filter(|(_, le)| le.n_tokens > 0)
            .map(|(l, le)| {
                let mut v = json!({"language": l, "n_tokens": le.n_tokens, "ce": num(le.ce), "ce_closed": num(le.ce_closed)});
                if let Some(n) = names.and_then(|n| n.get(l)) {
                    v["language_name"] = json!(n);
                }
                v
            })
            .collect();
    }
    if r.use_gate {
        report["rule"] = json!({
            "description": "a row is kept when its held-out tokens do not follow the shared row's distribution (their total saving exceeds its expectation under that distribution by more than Bennett's bound at the family-wise level alpha, Bonferroni over all rows: heldout_evidence > 1), it saves more than margin nats a token, and it was seen at least min_count times on held-out text",
            "alpha": rule.alpha,
            "min_count": rule.min_count,
            "margin": rule.margin,
        });
        report["kept"] = order
            .iter()
            .filter(|&&i| kept[i])
            .take(r.kept_limit)
            .map(|&i| entry(i))
            .collect();
        report["n_kept"] = json!(kept.iter().filter(|&&k| k).count());
        report["effective_vocabularies"] =
            json!(vocabularies_kept(index, &kept, model.config().n_languages));
        report["gate_mean"] = json!(gates.iter().sum::<f64>() / gates.len().max(1) as f64);
        if let Some(g) = &gains {
            report["spearman_gain_gate"] = json!(spearman(g, &gates));
            if let Some(score) = &index.score {
                report["spearman_gain_score"] = json!(spearman(g, score));
            }
        }
        if let Some(score) = &index.score {
            report["spearman_gate_score"] = json!(spearman(&gates, score));
        }
        if let Some(p) = planted {
            let a = agreement(&kept, p);
            report["f1"] = json!(a.f1);
            report["auc"] = json!(roc_auc(&gates, p));
            report["planted"] = json!({
                "n_planted": p.iter().filter(|&&x| x).count(),
                "precision": a.precision,
                "recall": a.recall,
                "f1": a.f1,
                "decoys_kept": a.false_positives,
                "gate_auc": roc_auc(&gates, p),
                "gate_average_precision": average_precision(&gates, p),
                "gain_auc": gains.as_ref().and_then(|g| roc_auc(g, p)),
            });
        }
    } else {
        let ev = effective_vocabularies(model, false, 0.05);
        report["distinct_rows_per_token"] = json!(ev.mean);
        let finite: Vec<f64> = distances
            .iter()
            .copied()
            .filter(|d| d.is_finite())
            .collect();
        let mean = finite.iter().sum::<f64>() / finite.len().max(1) as f64;
        report["mean_distance_to_centroid"] = json!(mean);
        report["effective_vocabularies"] = json!(ev.mean);
    }
    report
}

/// Writes the report as pretty JSON, atomically.
pub fn write_json(path: &Path, report: &Value) -> CliResult<()> {
    let text = serde_json::to_string_pretty(report)? + "\n";
    write_atomic(path, |w| Ok(w.write_all(text.as_bytes())?))?;
    Ok(())
}

/// "language 2" or "language 2 (fr)"; "token 17" or "token 17 ' the'".
fn describe(e: &Value) -> String {
    let lang = match e.get("language_name").and_then(Value::as_str) {
        Some(n) => format!("{n:<6}"),
        None => format!("language {:>3}", e["language"]),
    };
    let tok = match e.get("token_string").and_then(Value::as_str) {
        Some(s) => format!("token {:>6} {:<12}", e["token"], format!("{s:?}")),
        None => format!("token {:>6}", e["token"]),
    };
    format!("{lang}  {tok}")
}

/// Prints the report for a person.
pub fn print(r: &Value) {
    let gated = r["use_gate"].as_bool() != Some(false);
    println!(
        "splitgrad: {} steps on {} ({} split rows, {})",
        r["steps"],
        r["corpus"].as_str().unwrap_or("?"),
        r["n_rows"],
        if gated { "gated" } else { "fusion mode" }
    );
    println!(
        "  final training loss {:.4} (cross-entropy {:.4})",
        r["final_loss"].as_f64().unwrap_or(f64::NAN),
        r["final_ce"].as_f64().unwrap_or(f64::NAN)
    );
    if let Some(ce) = r["heldout_ce"].as_f64() {
        println!(
            "  held-out cross-entropy {ce:.4} on {} tokens; every gate closed {:.4}{}",
            r["heldout_tokens"],
            r["heldout_ce_closed"].as_f64().unwrap_or(f64::NAN),
            r["heldout_ce_initial"]
                .as_f64()
                .map(|i| format!("; before training {i:.4}"))
                .unwrap_or_default()
        );
        let langs: Vec<String> = r["heldout_per_language"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|l| l["n_tokens"].as_u64() > Some(0))
            .map(|l| {
                let name = l
                    .get("language_name")
                    .and_then(Value::as_str)
                    .map_or_else(|| l["language"].to_string(), str::to_string);
                format!(
                    "{name} {:.3}/{:.3}",
                    l["ce"].as_f64().unwrap_or(f64::NAN),
                    l["ce_closed"].as_f64().unwrap_or(f64::NAN)
                )
            })
            .collect();
        println!("  per language (model/closed): {}", langs.join("  "));
    }
    if r["learned"].as_bool() == Some(false) {
        println!(
            "  nothing was learned: the held-out cross-entropy is not below ln V = {:.4}, a uniform guess{}",
            r["heldout_ce_uniform"].as_f64().unwrap_or(f64::NAN),
            if r["n_kept"].as_u64() == Some(0) {
                "; no row is kept"
            } else {
                ""
            }
        );
    }
    if !gated {
        println!(
            "  distinct rows per token: {:.3}; mean distance of a row to its token's centroid {:.4}",
            r["distinct_rows_per_token"].as_f64().unwrap_or(f64::NAN),
            r["mean_distance_to_centroid"].as_f64().unwrap_or(f64::NAN)
        );
    } else {
        println!(
            "  kept rows: {} of {} (their held-out text does not follow the shared row, beyond chance over all rows, and they save > {} nats a token); effective number of vocabularies {:.3}",
            r["n_kept"],
            r["n_rows"],
            r["rule"]["margin"],
            r["effective_vocabularies"].as_f64().unwrap_or(f64::NAN)
        );
        if let Some(p) = r.get("planted") {
            println!(
                "  against the planted pairs: precision {}, recall {}, F1 {}; decoys kept: {}",
                fmt3(p["precision"].as_f64()),
                fmt3(p["recall"].as_f64()),
                fmt3(p["f1"].as_f64()),
                p["decoys_kept"]
            );
            println!(
                "  gates against the planted pairs, with no threshold: ROC AUC {}, average precision {}",
                fmt3(p["gate_auc"].as_f64()),
                fmt3(p["gate_average_precision"].as_f64())
            );
        }
        if let Some(s) = r.get("spearman_gain_gate").and_then(Value::as_f64) {
            println!("  rank correlation of held-out gains with the gates: {s:.3}");
        }
        if let Some(s) = r.get("spearman_gain_score").and_then(Value::as_f64) {
            println!("  … with the index's score: {s:.3}");
        }
        let show = |title: &str, list: Vec<&Value>| {
            if list.is_empty() {
                return;
            }
            println!("  {title}:");
            for e in list {
                let planted = match e.get("planted").and_then(Value::as_bool) {
                    Some(true) => "  planted",
                    Some(false) => "  not planted",
                    None => "",
                };
                let gain = e
                    .get("heldout_gain")
                    .and_then(Value::as_f64)
                    .map(|g| {
                        format!(
                            "  held-out gain {g:>9.3} nats ({} tokens, evidence {})",
                            e["heldout_tokens"],
                            e["heldout_evidence"]
                                .as_f64()
                                .map_or("–".to_string(), |x| format!("{x:.2}"))
                        )
                    })
                    .unwrap_or_default();
                println!(
                    "    {}  gate {:.3}{gain}{planted}",
                    describe(e),
                    e["gate"].as_f64().unwrap_or(f64::NAN)
                );
            }
        };
        let kept: Vec<&Value> = r["kept"].as_array().into_iter().flatten().collect();
        show(
            "kept, most useful first",
            kept.iter().take(5).copied().collect(),
        );
        let rows: Vec<&Value> = r["rows"].as_array().into_iter().flatten().collect();
        let mut rest: Vec<&Value> = rows
            .into_iter()
            .filter(|e| e["kept"].as_bool() != Some(true))
            .collect();
        rest.sort_by(|a, b| {
            let g = |e: &Value| e["heldout_evidence"].as_f64().unwrap_or(f64::NEG_INFINITY);
            g(b).total_cmp(&g(a))
        });
        show(
            "not kept, closest to the rule",
            rest.into_iter().take(3).collect(),
        );
    }
    if let Some(tps) = r["tokens_per_second"].as_f64() {
        match (r["contexts_per_step"].as_f64(), r["head_gflops"].as_f64()) {
            (Some(m), Some(g)) => println!(
                "  {tps:.0} tokens/s on {} threads (training steps only; {m:.0} distinct contexts a step, the head at {g:.1} GFLOP/s)",
                r["threads"]
            ),
            _ => println!("  {tps:.0} tokens/s on {} threads", r["threads"]),
        }
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
    let use_gate = saved.metadata.get("use_gate").map(String::as_str) != Some("false");
    let report = build(&ReportInput {
        model: &saved.model,
        history: &saved.history,
        labels: &saved.labels,
        heldout_curve: &saved.heldout_curve,
        evaluation: saved.evaluation.as_ref(),
        use_gate,
        tokens_per_second: None,
        threads: None,
        checkpoint: &args.checkpoint,
        kept_limit: ROWS_LISTED,
    });
    print(&report);
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(ExitCode::SUCCESS)
}
