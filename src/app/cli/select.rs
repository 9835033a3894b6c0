//! `splitgrad select`: measure each (language, token) pair's interference on
//! the shared-only model and write the index of the pairs that need a row.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use serde_json::json;

use crate::app::plan::Plan;
use crate::app::select::{
    Selection, interference, planted_agreement, save_shared, select, shared_from_checkpoint,
};
use crate::app::train::TrainConfig;
use crate::io::save_index;

use super::CliResult;
use super::options::{Given, ModelArgs, PrecisionArgs, RunArgs, check_min_count, defaults};
use super::outdir::{default_run_folder, refuse_existing, report_removed};
use super::progress::run_to_end;
use super::report::fmt3;

/// Options of `splitgrad select`.
#[derive(Args, Debug, Clone)]
pub struct SelectArgs {
    /// Corpus `.npz`; without it, the built-in synthetic corpus.
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Only pairs seen at least this often as a context are scored.
    #[arg(long, default_value_t = defaults().data.min_count)]
    pub min_count: usize,
    /// Read the shared table and head from this checkpoint (of `train` or
    /// of an earlier `select`) instead of training the shared-only model.
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Keep the K highest-scoring pairs.
    #[arg(long, conflicts_with_all = ["threshold", "relative"])]
    pub top: Option<usize>,
    /// Keep every pair scoring at least this.
    #[arg(long, conflicts_with = "relative")]
    pub threshold: Option<f64>,
    /// Keep every pair scoring at least this fraction of the highest score
    /// (the default when neither --top nor --threshold is given). On the
    /// synthetic corpus the planted pairs score about three times as high
    /// as the other languages of their tokens, so 0.6 separates them.
    #[arg(long, default_value_t = 0.6)]
    pub relative: f64,
    /// The index to write, an `.npz` (default `select/index.npz` in the
    /// corpus's run folder); `shared.safetensors` is written beside it.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Replace an index (and shared model) already there.
    #[arg(long)]
    pub force: bool,
    /// Training steps of the shared-only model.
    #[arg(long, default_value_t = defaults().train.steps)]
    pub steps: u64,
    #[command(flatten)]
    pub model: ModelArgs,
    /// How the shared-only model is kept while it trains (without
    /// --checkpoint); the scores are computed in f64 either way.
    #[command(flatten)]
    pub precision: PrecisionArgs,
    #[command(flatten)]
    pub run: RunArgs,
    /// Print the result as one JSON object on the last line of standard output.
    #[arg(long)]
    pub json: bool,
    /// The options given on the command line (filled after parsing).
    #[arg(skip)]
    pub given: Given,
}

fn selection(args: &SelectArgs) -> CliResult<Selection> {
    if let Some(k) = args.top {
        if k == 0 {
            return Err("--top must be at least 1".into());
        }
        return Ok(Selection::Top(k));
    }
    if let Some(x) = args.threshold {
        if !x.is_finite() {
            return Err(format!("--threshold must be a finite number, got {x}").into());
        }
        return Ok(Selection::Threshold(x));
    }
    if !(args.relative.is_finite() && (0.0..=1.0).contains(&args.relative)) {
        return Err(format!("--relative must be in [0, 1], got {}", args.relative).into());
    }
    Ok(Selection::Relative(args.relative))
}

/// `splitgrad select`.
pub fn run(args: SelectArgs) -> CliResult<ExitCode> {
    args.model.check()?;
    // (Before the flags' own check: with --checkpoint, any of them is the
    // mistake, whatever its value.)
    if args.checkpoint.is_some() && args.precision != PrecisionArgs::default() {
        return Err(
            "--dtype, --state-dtype and --rounding set how select trains the shared-only model; with --checkpoint it trains none (it reads the model as the checkpoint keeps it)"
                .into(),
        );
    }
    let precision = args.precision.precision()?;
    if args.checkpoint.is_some()
        && let Some(flags) = args.given.flags(&["steps", "batch", "dim", "lr"])
    {
        return Err(format!(
            "{flags} set how select trains the shared-only model; with --checkpoint it trains \
             none (its width D is the checkpoint's)"
        )
        .into());
    }
    if args.steps == 0 {
        return Err(
            "--steps must be at least 1: a run of 0 steps trains nothing; to score a \
                    trained model, give --checkpoint"
                .into(),
        );
    }
    check_min_count(args.min_count)?;
    let how = selection(&args)?;
    let (threads, data) = args.run.start(args.corpus.clone(), args.min_count)?;
    let out = args.out.clone().unwrap_or_else(|| {
        default_run_folder(&data.name, args.corpus.as_deref())
            .join("select")
            .join("index.npz")
    });
    if out.extension().is_none_or(|x| x != "npz") {
        return Err(format!("{}: --out must name an .npz file", out.display()).into());
    }
    let shared_path = out.with_file_name("shared.safetensors");
    let mut outputs = vec![out.as_path()];
    if args.checkpoint.is_none() {
        outputs.push(&shared_path);
    }
    refuse_existing(&outputs, args.force)?;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("{}: cannot create the output folder: {e}", dir.display()))?;
        report_removed(&crate::io::remove_stale_temporaries(dir)?);
    }
    let started = Instant::now();
    let model = match &args.checkpoint {
        Some(path) => shared_from_checkpoint(path, &data)?,
        None => {
            let dim = args.model.dim;
            Plan {
                param_dtype: Some(precision.dtype),
                state_dtype: Some(precision.state_dtype),
                ..data.plan(dim, 0, args.model.batch)
            }
            .check("--dim or --batch")?;
            let train = TrainConfig {
                precision,
                ..args.model.train(args.steps, args.run.seed)
            };
            let mut trainer = data.trainer(None, dim, train)?;
            run_to_end(&mut trainer, "shared-only model", args.run.quiet)?;
            save_shared(trainer.model(), &shared_path)?;
            trainer.model().clone()
        }
    };
    let scores = interference(&model, &data.corpus, args.min_count)?;
    let index = select(&scores, how)?;
    save_index(&out, &index)?;
    let elapsed = started.elapsed().as_secs_f64();

    println!(
        "splitgrad select: {} pairs scored on {}, {} selected ({how}) in {elapsed:.1} s on {threads} threads{}",
        scores.len(),
        data.name,
        index.token_index.len(),
        if args.checkpoint.is_none() {
            super::options::kept_as(&precision)
        } else {
            String::new()
        }
    );
    println!("  score = ‖Wᵀ(p_t − q_lt)‖₂, the mean gradient the pair sends its shared row");
    println!("  highest:");
    for p in scores.iter().take(5) {
        println!(
            "    language {:>3}  token {:>6}  score {:.4}  ({} times)",
            p.language, p.token, p.score, p.count
        );
    }
    let mut summary = json!({
        "corpus": data.name,
        "scored": scores.len(),
        "selected": index.token_index.len(),
        "index": out.display().to_string(),
        "shared_checkpoint": args.checkpoint.is_none().then(|| shared_path.display().to_string()),
        "highest_score": scores.first().map(|p| p.score),
        "seconds": elapsed,
    });
    if args.checkpoint.is_none() {
        summary["dtype"] = json!(precision.dtype.name());
        summary["state_dtype"] = json!(precision.state_dtype.name());
        summary["rounding"] = json!(precision.rounding.name());
    }
    if let Some(truth) = &data.truth {
        let a = planted_agreement(&scores, &index, truth);
        println!(
            "  against the planted pairs: precision {}, recall {}, F1 {} ({} planted)",
            fmt3(a.precision),
            fmt3(a.recall),
            fmt3(a.f1),
            truth.len()
        );
        summary["planted"] = json!({"precision": a.precision, "recall": a.recall, "f1": a.f1, "n_planted": truth.len()});
    }
    println!("  wrote {}", out.display());
    if args.checkpoint.is_none() {
        println!(
            "  wrote {} (the shared-only model; reuse it with --checkpoint)",
            shared_path.display()
        );
    }
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    }
    Ok(ExitCode::SUCCESS)
}
