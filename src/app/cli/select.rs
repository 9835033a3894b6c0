//! `splitgrad select`: measure each (language, token) pair's interference on
//! the shared-only model and write the index of the pairs that need a row.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use super::report::fmt3;
use crate::Rng;
use crate::app::model::{BigramModel, ModelConfig};
use crate::app::report::agreement;
use crate::app::select::{Selection, interference, select};
use crate::app::train::{TrainConfig, Trainer};
use crate::checkpoint::{Snapshot, save_state};
use crate::io::save_index;

use super::outdir::{default_run_folder, refuse_existing, report_removed};
use clap::Args;
use serde_json::json;

use super::data::{self, Data};
use super::train::{check_run_flags, run_to_end};
use super::{CliResult, TrainArgs, set_threads};

/// Options of `splitgrad select`.
#[derive(Args, Debug, Clone)]
pub struct SelectArgs {
    /// Corpus `.npz`; without it, the built-in synthetic corpus.
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Only pairs seen at least this often as a context are scored.
    #[arg(long, default_value_t = 20)]
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
    #[arg(long, default_value_t = 1000)]
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
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Seed of the corpus, the weights and the batches.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print the result as one JSON object on the last line of standard output.
    #[arg(long)]
    pub json: bool,
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

/// The shared-only model: trained here, or read from a checkpoint.
fn shared_model(args: &SelectArgs, data: &Data) -> CliResult<BigramModel<f32>> {
    let config = ModelConfig {
        vocab_size: data.vocab_size,
        n_languages: data.n_languages,
        dim: args.dim,
        gate_init: 0.0,
    };
    if let Some(path) = &args.checkpoint {
        let snap = Snapshot::read(path)?;
        let table_name = "token_embedding.vocab.weight";
        let shape = snap.state.get(table_name).map(|t| t.shape().to_vec());
        let dim = match shape.as_deref() {
            Some(&[v, d]) if v == data.vocab_size => d,
            _ => {
                return Err(format!(
                    "{}: `{table_name}` has shape {}, the corpus needs ({}, D)",
                    path.display(),
                    shape.map_or("(missing)".to_string(), |s| format!("{s:?}")),
                    data.vocab_size
                )
                .into());
            }
        };
        data.plan(dim, 0, 0).check("")?;
        let mut model = BigramModel::<f32>::shared_only(ModelConfig { dim, ..config })?;
        snap.restore(&mut [&mut model.embeddings, &mut model.head], None)?;
        return Ok(model);
    }
    data.plan(args.dim, 0, args.batch)
        .check("--dim or --batch")?;
    let mut model = BigramModel::<f32>::shared_only(config)?;
    model.reset_parameters(&mut Rng::new(args.seed))?;
    let tcfg = TrainConfig {
        steps: args.steps,
        batch: args.batch,
        lr: args.lr,
        gate_penalty: 0.0,
        fusion_penalty: 0.0,
        use_gate: true,
        seed: args.seed,
    };
    let mut trainer = Trainer::new(model, data.corpus.clone(), tcfg)?;
    run_to_end(&mut trainer, "shared-only model")?;
    Ok(trainer.model().clone())
}

/// Writes the shared-only model's table and head under their state-dict
/// names, so that `--checkpoint` can score again without training.
fn save_shared(model: &BigramModel<f32>, path: &std::path::Path) -> CliResult<()> {
    let cfg = model.config();
    let meta: std::collections::BTreeMap<String, String> = [
        ("format", "splitgrad-shared-1".to_string()),
        ("vocab_size", cfg.vocab_size.to_string()),
        ("n_languages", cfg.n_languages.to_string()),
        ("dim", cfg.dim.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    save_state(path, &[&model.embeddings, &model.head], None, &[], &meta)?;
    Ok(())
}

/// `splitgrad select`.
pub fn run(args: SelectArgs) -> CliResult<ExitCode> {
    check_run_flags(args.batch, args.dim, args.lr)?;
    let how = selection(&args)?;
    let threads = set_threads(args.threads)?;
    let data = data::load(&TrainArgs::for_data(
        args.corpus.clone(),
        args.min_count,
        args.seed,
    ))?;
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
    let model = shared_model(&args, &data)?;
    if args.checkpoint.is_none() {
        save_shared(&model, &shared_path)?;
    }
    let scores = interference(&model, &data.corpus, args.min_count)?;
    let index = select(&scores, how)?;
    save_index(&out, &index)?;
    let elapsed = started.elapsed().as_secs_f64();

    println!(
        "splitgrad select: {} pairs scored on {}, {} selected ({how}) in {elapsed:.1} s on {threads} threads",
        scores.len(),
        data.name,
        index.token_index.len()
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
    if let Some(truth) = &data.truth {
        let selected: std::collections::HashSet<(usize, usize)> = index
            .language_index
            .iter()
            .copied()
            .zip(index.token_index.iter().copied())
            .collect();
        let chosen: Vec<bool> = scores
            .iter()
            .map(|p| selected.contains(&(p.language, p.token)))
            .collect();
        let planted: Vec<bool> = scores
            .iter()
            .map(|p| truth.binary_search(&(p.language, p.token)).is_ok())
            .collect();
        let a = agreement(&chosen, &planted);
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
