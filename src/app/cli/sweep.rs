//! `splitgrad sweep`: fusion mode over several fusion weights. Every
//! (language, token) pair seen often enough gets a row, so with weight 0
//! each language has its own vocabulary; the fusion penalty pulls the rows
//! of a token toward their centroid, and the effective number of
//! vocabularies shows how many stay apart: read off rather than chosen.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::Rng;
use crate::app::model::{BigramModel, ModelConfig};
use crate::app::report::effective_vocabularies;
use crate::app::train::{TrainConfig, Trainer};
use clap::Args;
use serde_json::json;

use super::data::{self, index_from_counts};
use super::outdir::{default_run_folder, refuse_existing, report_removed};
use super::plots::{self, SweepPoint};
use super::report::write_json;
use super::train::{check_run_flags, run_to_end};
use super::{CliResult, TrainArgs, set_threads};
use crate::app::eval::heldout_ce;

/// Options of `splitgrad sweep`.
#[derive(Args, Debug, Clone)]
pub struct SweepArgs {
    /// Corpus `.npz`; without it, the built-in synthetic corpus.
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Pairs seen at least this often as a context get a row.
    #[arg(long, default_value_t = 20)]
    pub min_count: usize,
    /// Fusion-penalty weights, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,0.01,0.03,0.1,0.3,1,3")]
    pub weights: Vec<f64>,
    /// Training steps per weight.
    #[arg(long, default_value_t = 500)]
    pub steps: u64,
    /// Bigrams per step.
    #[arg(long, default_value_t = 4096)]
    pub batch: usize,
    /// Embedding width D.
    #[arg(long, default_value_t = 64)]
    pub dim: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 1e-2)]
    pub lr: f64,
    /// Two embeddings of a token are the same when closer than this
    /// fraction of the token's mean embedding norm.
    #[arg(long, default_value_t = 0.05)]
    pub tolerance: f64,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Seed of the corpus, the weights and the batches.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
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
}

/// `splitgrad sweep`.
pub fn run(args: SweepArgs) -> CliResult<ExitCode> {
    check_run_flags(args.batch, args.dim, args.lr)?;
    if args.weights.is_empty() {
        return Err("--weights needs at least one weight".into());
    }
    if let Some(w) = args.weights.iter().find(|w| !(w.is_finite() && **w >= 0.0)) {
        return Err(format!("--weights must be finite numbers ≥ 0, got {w}").into());
    }
    if !(args.tolerance.is_finite() && args.tolerance >= 0.0) {
        return Err(format!("--tolerance must be ≥ 0, got {}", args.tolerance).into());
    }
    let threads = set_threads(args.threads)?;
    let data = data::load(&TrainArgs::for_data(
        args.corpus.clone(),
        args.min_count,
        args.seed,
    ))?;
    let index = index_from_counts(&data.corpus, args.min_count);
    if index.token_index.is_empty() {
        return Err(format!(
            "no (language, token) pair is seen {} times or more: lower --min-count",
            args.min_count
        )
        .into());
    }
    data.plan(args.dim, index.token_index.len(), args.batch)
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
    let l = data.n_languages;
    println!(
        "splitgrad sweep: fusion mode on {}, {} rows (every pair seen ≥ {} times), {} steps per weight, {threads} threads",
        data.name,
        index.token_index.len(),
        args.min_count,
        args.steps
    );
    println!(
        "  {:>8}  {:>10}  {:>8}  {:>8}  languages apart (mean fraction of tokens on which a language differs from the others)",
        "weight", "effective", "CE", "held-out"
    );
    std::fs::create_dir_all(&out)
        .map_err(|e| format!("{}: cannot create the output folder: {e}", out.display()))?;
    report_removed(&crate::io::remove_stale_temporaries(&out)?);
    let mut rows = Vec::new();
    let mut points = Vec::new();
    for &w in &args.weights {
        let config = ModelConfig {
            vocab_size: data.vocab_size,
            n_languages: l,
            dim: args.dim,
            gate_init: 0.0,
        };
        let mut model = BigramModel::<f32>::new(config, index.clone())?;
        model.reset_parameters(&mut Rng::new(args.seed))?;
        let tcfg = TrainConfig {
            steps: args.steps,
            batch: args.batch,
            lr: args.lr,
            gate_penalty: 0.0,
            fusion_penalty: w,
            use_gate: false,
            seed: args.seed,
        };
        let mut trainer = Trainer::new(model, data.corpus.clone(), tcfg)?;
        run_to_end(&mut trainer, &format!("weight {w}"))?;
        let ev = effective_vocabularies(trainer.model(), false, args.tolerance);
        let per_language: Vec<f64> = (0..l)
            .map(|a| {
                if l < 2 {
                    0.0
                } else {
                    (0..l).map(|b| ev.apart[[a, b]]).sum::<f64>() / (l - 1) as f64
                }
            })
            .collect();
        let ce = trainer.history().last().map_or(f64::NAN, |s| s.ce);
        let (held_ce, held_ce_closed) = heldout_ce(trainer.model(), &data.heldout, false)?;
        let apart_text: Vec<String> = per_language
            .iter()
            .enumerate()
            .map(|(a, f)| format!("{a}:{f:.2}"))
            .collect();
        println!(
            "  {w:>8}  {:>10.3}  {ce:>8.4}  {:>8.4}  {}",
            ev.mean,
            held_ce,
            apart_text.join(" ")
        );
        points.push(SweepPoint {
            weight: w,
            effective: ev.mean,
            heldout_ce: held_ce,
        });
        rows.push(json!({
            "fusion_weight": w,
            "effective_vocabularies": ev.mean,
            "final_ce": ce,
            "heldout_ce": held_ce,
            "heldout_ce_shared_only": held_ce_closed,
            "language_apart": per_language,
            "apart": ev.apart.outer_iter().map(|r| r.to_vec()).collect::<Vec<_>>(),
        }));
    }
    let summary = json!({
        "corpus": data.name,
        "n_rows": index.token_index.len(),
        "n_languages": l,
        "steps": args.steps,
        "tolerance": args.tolerance,
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
