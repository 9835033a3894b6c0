//! `splitgrad sweep`: fusion mode over several fusion weights, measured by
//! [`crate::app::sweep`], tabulated and plotted.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde_json::json;

use crate::app::plan::Plan;
use crate::app::report::SAME_EMBEDDING;
use crate::app::sweep::{measure, sweep_index};
use crate::app::train::TrainConfig;

use super::CliResult;
use super::options::{Given, ModelArgs, PrecisionArgs, RunArgs, check_min_count, defaults};
use super::outdir::{default_run_folder, refuse_existing, report_removed};
use super::plots;
use super::progress::run_to_end;
use super::report::write_json;

/// Options of `splitgrad sweep`.
#[derive(Args, Debug, Clone)]
pub struct SweepArgs {
    /// Corpus `.npz`; without it, the built-in synthetic corpus.
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Pairs seen at least this often as a context get a row.
    #[arg(long, default_value_t = defaults().data.min_count)]
    pub min_count: usize,
    /// Fusion-penalty weights, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,0.01,0.03,0.1,0.3,1,3")]
    pub weights: Vec<f64>,
    /// Training steps per weight.
    #[arg(long, default_value_t = 500)]
    pub steps: u64,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Two embeddings of a token are the same when closer than this
    /// fraction of the token's mean embedding norm.
    #[arg(long, default_value_t = SAME_EMBEDDING)]
    pub tolerance: f64,
    #[command(flatten)]
    pub precision: PrecisionArgs,
    #[command(flatten)]
    pub run: RunArgs,
    /// Output folder for sweep.json and sweep.svg (default `sweep/` in the
    /// corpus's run folder).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Replace a sweep already there.
    #[arg(long)]
    pub force: bool,
    /// Print the table as one JSON object on the last line of standard output.
    #[arg(long)]
    pub json: bool,
    /// The options given on the command line (filled after parsing).
    #[arg(skip)]
    pub given: Given,
}

/// `splitgrad sweep`.
pub fn run(args: SweepArgs) -> CliResult<ExitCode> {
    args.model.check()?;
    let precision = args.precision.precision()?;
    if args.weights.is_empty() {
        return Err("--weights needs at least one weight".into());
    }
    if let Some(w) = args.weights.iter().find(|w| !(w.is_finite() && **w >= 0.0)) {
        return Err(format!("--weights must be finite numbers ≥ 0, got {w}").into());
    }
    if !(args.tolerance.is_finite() && args.tolerance >= 0.0) {
        return Err(format!("--tolerance must be ≥ 0, got {}", args.tolerance).into());
    }
    if args.steps == 0 {
        return Err("--steps must be at least 1: a run of 0 steps trains nothing".into());
    }
    check_min_count(args.min_count)?;
    let (threads, data) = args.run.start(args.corpus.clone(), args.min_count)?;
    let index = sweep_index(&data, args.min_count)?;
    let dim = args.model.dim;
    Plan {
        param_dtype: Some(precision.dtype),
        state_dtype: Some(precision.state_dtype),
        ..data.plan(dim, index.token_index.len(), args.model.batch)
    }
    .check("--dim or --batch")?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| default_run_folder(&data.name, args.corpus.as_deref()).join("sweep"));
    if out.exists() && !out.is_dir() {
        return Err(format!("{}: --out must be a folder; this is a file", out.display()).into());
    }
    refuse_existing(
        &[&out.join("sweep.json"), &out.join("sweep.svg")],
        args.force,
    )?;
    println!(
        "splitgrad sweep: fusion mode on {}, {} rows (every pair seen ≥ {} times), {} steps per weight, {threads} threads{}",
        data.name,
        index.token_index.len(),
        args.min_count,
        args.steps,
        super::options::kept_as(&precision)
    );
    println!(
        "  {:>8}  {:>10}  {:>8}  {:>8}  languages apart (mean fraction of tokens on which a language differs from the others)",
        "weight", "effective", "CE", "held-out"
    );
    std::fs::create_dir_all(&out)
        .map_err(|e| format!("{}: cannot create the output folder: {e}", out.display()))?;
    report_removed(&crate::io::remove_stale_temporaries(&out)?);
    let mut points = Vec::new();
    for &w in &args.weights {
        let train = TrainConfig {
            fusion_penalty: w,
            use_gate: false,
            precision,
            ..args.model.train(args.steps, args.run.seed)
        };
        let mut trainer = data.trainer(Some(&index), dim, train)?;
        run_to_end(&mut trainer, &format!("weight {w}"), args.run.quiet)?;
        let p = measure(&trainer, &data, w, args.tolerance)?;
        let apart_text: Vec<String> = p
            .language_apart
            .iter()
            .enumerate()
            .map(|(a, f)| format!("{a}:{f:.2}"))
            .collect();
        println!(
            "  {w:>8}  {:>10.3}  {:>8.4}  {:>8.4}  {}",
            p.effective_vocabularies,
            p.final_ce,
            p.heldout_ce,
            apart_text.join(" ")
        );
        points.push(p);
    }
    let rows: Vec<_> = points
        .iter()
        .map(|p| {
            json!({
                "fusion_weight": p.fusion_weight,
                "effective_vocabularies": p.effective_vocabularies,
                "final_ce": p.final_ce,
                "heldout_ce": p.heldout_ce,
                "heldout_ce_shared_only": p.heldout_ce_shared_only,
                "language_apart": p.language_apart,
                "apart": p.apart.outer_iter().map(|r| r.to_vec()).collect::<Vec<_>>(),
            })
        })
        .collect();
    let summary = json!({
        "corpus": data.name,
        "n_rows": index.token_index.len(),
        "n_languages": data.n_languages,
        "steps": args.steps,
        "tolerance": args.tolerance,
        "dtype": precision.dtype.name(),
        "state_dtype": precision.state_dtype.name(),
        "rounding": precision.rounding.name(),
        "heldout": data.heldout_source,
        "sweep": rows,
    });
    write_json(&out.join("sweep.json"), &summary)?;
    plots::sweep(&out.join("sweep.svg"), &points)?;
    println!("  wrote sweep.json and sweep.svg in {}", out.display());
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    }
    Ok(ExitCode::SUCCESS)
}
