//! `splitgrad train`: the main job.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Args;

use crate::app::data::{self, Data, DataSource};
use crate::app::plan::Plan;
use crate::app::report::Report;
use crate::app::run::{Run, RunConfig, Stopped};
use crate::app::train::{TrainConfig, Trainer};

use super::options::{Given, ModelArgs, PrecisionArgs, RunArgs, check_min_count, defaults};
use super::outdir::{
    RunLock, default_run_folder, prepare_default_run_folder, prepare_run_folder, report_removed,
};
use super::progress::Progress;
use super::report::{self, to_json, write_json};
use super::{CliResult, plots, set_threads};

/// The checkpoint file inside a run's folder.
pub const CHECKPOINT: &str = "model.safetensors";

/// Options of `splitgrad train`.
#[derive(Args, Debug, Clone)]
// The shared `--lr`, in train's words: it sets both optimisers.
#[command(mut_arg("lr", |a| a.help("Learning rate (Adam and lazy Adam)")))]
pub struct TrainArgs {
    /// Corpus `.npz` (`token_ids`, `language_ids`, optional `sequence_starts`);
    /// without it, the built-in synthetic corpus.
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Index `.npz` (`language_index`, `token_index`, optional `score`); without
    /// it, every (language, token) pair seen at least `--min-count` times.
    #[arg(long)]
    pub index: Option<PathBuf>,
    /// Pairs seen at least this often (in the training part) get a row when
    /// there is no `--index`.
    #[arg(long, default_value_t = defaults().data.min_count)]
    pub min_count: usize,
    /// Fraction of the corpus's sequences held out for evaluation (chosen by
    /// the seed; a corpus of one sequence gives up its tail).
    #[arg(long, default_value_t = defaults().data.heldout_fraction)]
    pub heldout_fraction: f64,
    /// A held-out corpus to evaluate on, instead of a fraction of `--corpus`.
    #[arg(long, conflicts_with = "heldout_fraction")]
    pub heldout: Option<PathBuf>,
    /// Output folder (checkpoint, report.json, plots); default
    /// `runs/synthetic`, or `runs/<corpus stem>-<hash of its path>`.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Training steps.
    #[arg(long, default_value_t = defaults().train.steps)]
    pub steps: u64,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Weight of the gate penalty mean(σ(gate_logit)).
    #[arg(long, default_value_t = defaults().train.gate_penalty)]
    pub gate_penalty: f64,
    /// Weight of the fusion penalty.
    #[arg(long, default_value_t = defaults().train.fusion_penalty)]
    pub fusion_penalty: f64,
    /// Fusion mode: split rows replace the shared row, no gate.
    #[arg(long)]
    pub no_gate: bool,
    #[command(flatten)]
    pub run: RunArgs,
    /// Continue from the checkpoint in the output folder.
    #[arg(long, conflicts_with = "force")]
    pub resume: bool,
    /// Replace a run already in the output folder.
    #[arg(long)]
    pub force: bool,
    /// Write a checkpoint every this many steps (and at the end).
    #[arg(long, default_value_t = defaults().checkpoint_every)]
    pub checkpoint_every: u64,
    /// Print the report as one JSON object on the last line of standard output.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub precision: PrecisionArgs,
    /// The options given on the command line (filled after parsing).
    #[arg(skip)]
    pub given: Given,
}

impl TrainArgs {
    /// Checks the numbers the command line cannot.
    fn validate(&self) -> CliResult<()> {
        self.model.check()?;
        for (flag, v) in [
            ("--gate-penalty", self.gate_penalty),
            ("--fusion-penalty", self.fusion_penalty),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{flag} must be a finite number ≥ 0, got {v}").into());
            }
        }
        if self.checkpoint_every == 0 {
            return Err("--checkpoint-every must be at least 1".into());
        }
        if self.steps == 0 {
            return Err("--steps must be at least 1: a run of 0 steps trains nothing".into());
        }
        check_min_count(self.min_count)?;
        if self.no_gate && self.given.has("gate_penalty") {
            return Err(
                "--gate-penalty with --no-gate: it weighs the gates, and fusion mode has \
                        none; leave it out (fusion mode's penalty is --fusion-penalty)"
                    .into(),
            );
        }
        if self.given.has("min_count") && self.corpus.is_none() {
            return Err(
                "--min-count without --corpus: the synthetic corpus brings its own index \
                        (its 40 planted pairs and 40 decoys); give --corpus, or leave it out"
                    .into(),
            );
        }
        if self.heldout.is_some() && self.corpus.is_none() {
            return Err(
                "--heldout without --corpus: a held-out corpus must come from the \
                        training corpus's tokenizer, and the synthetic corpus has none; give \
                        --corpus, or --heldout-fraction"
                    .into(),
            );
        }
        self.precision.precision()?;
        Ok(())
    }

    /// The output folder for a run on `data`, made ready and locked for
    /// this run: `--resume` needs its checkpoint, a finished run in it needs
    /// `--resume` or `--force`, a folder another run holds is refused.
    /// Without `--out` (and without `--resume` or `--force`, which name
    /// the default folder's run), a taken default folder gives way to the
    /// next free one.
    fn prepare_out(&self, data: &Data) -> CliResult<(PathBuf, RunLock)> {
        let (out, lock, removed) = match &self.out {
            Some(out) => {
                let (lock, removed) = prepare_run_folder(out, CHECKPOINT, self.resume, self.force)?;
                (out.clone(), lock, removed)
            }
            None => {
                let base = default_run_folder(&data.name, self.corpus.as_deref());
                if self.resume || self.force {
                    let (lock, removed) =
                        prepare_run_folder(&base, CHECKPOINT, self.resume, self.force)?;
                    (base, lock, removed)
                } else {
                    prepare_default_run_folder(&base, CHECKPOINT)?
                }
            }
        };
        report_removed(&removed);
        Ok((out, lock))
    }

    /// The run these options describe (after [`Self::validate`]).
    fn config(&self) -> CliResult<RunConfig> {
        Ok(RunConfig {
            data: DataSource {
                index: self.index.clone(),
                heldout_fraction: self.heldout_fraction,
                heldout: self.heldout.clone(),
                ..DataSource::of_corpus(self.corpus.clone(), self.min_count, self.run.seed)
            },
            train: TrainConfig {
                gate_penalty: self.gate_penalty,
                fusion_penalty: self.fusion_penalty,
                use_gate: !self.no_gate,
                precision: self.precision.precision()?,
                ..self.model.train(self.steps, self.run.seed)
            },
            dim: self.model.dim,
            checkpoint_every: self.checkpoint_every,
        })
    }
}

/// Set by SIGINT or SIGTERM: the run finishes its step, writes a
/// checkpoint and stops. A second signal while that happens exits at once
/// (with 130 or 143), leaving the last checkpoint, written atomically,
/// intact; one within a quarter of a second of the first is taken for the
/// same request (as `timeout` sends it twice).
struct Stop {
    interrupt: Arc<AtomicBool>,
    terminate: Arc<AtomicBool>,
}

impl Stop {
    fn install() -> CliResult<Stop> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        use signal_hook::flag::register;
        let interrupt = Arc::new(AtomicBool::new(false));
        let terminate = Arc::new(AtomicBool::new(false));
        // The exit on a second signal is registered first.
        super::exit_on_second_signal()?;
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

/// Corpora of this many tokens or more (or that take a second) are
/// reported when loaded.
const LOUD_CORPUS: u64 = 10_000_000;

/// Runs `train` and prints the report.
pub fn run(args: TrainArgs) -> CliResult<ExitCode> {
    args.validate()?;
    let stop = Stop::install()?;
    let threads = set_threads(args.run.threads)?;
    let config = args.config()?;
    let precision = config.train.precision;
    let (param_dtype, state_dtype) = (Some(precision.dtype), Some(precision.state_dtype));
    // The corpus's size and the model's, before the corpus is read; then
    // the whole run, with the split rows chosen.
    let started = std::time::Instant::now();
    let data = data::load_planned(&config.data, &|plan| {
        Plan {
            dim: config.dim,
            batch: config.train.batch,
            param_dtype,
            state_dtype,
            ..plan
        }
        .check("--dim or --batch")
    })?;
    Plan {
        param_dtype,
        state_dtype,
        ..data.plan(config.dim, data.index.token_index.len(), config.train.batch)
    }
    .check("--dim or --batch")?;
    // A corpus that took a while to load says so (a small one is quiet).
    let size = data.corpus_size();
    let took = started.elapsed().as_secs_f64();
    if let (Some(path), false) = (&config.data.corpus, args.run.quiet)
        && (took >= 1.0 || size.tokens >= LOUD_CORPUS)
    {
        eprintln!(
            "splitgrad: loaded {} in {:.2} s: {} tokens in {} sequences, {} in memory with the held-out part",
            path.display(),
            took,
            size.tokens,
            size.sequences,
            crate::error::human_bytes(size.bytes()),
        );
    }
    // Held until the run ends: no other run writes into this folder.
    let (out, _lock) = args.prepare_out(&data)?;
    let ckpt = out.join(CHECKPOINT);
    let mut run = Run::start(&data, &config, ckpt.clone(), args.resume)?;
    // A run finished in this folder (replaced by --force, or taken further
    // by --resume) has its report and plots removed with its checkpoint.
    run.set_stale(RUN_FILES.iter().map(|f| out.join(f)).collect());
    if args.resume && run.trainer().step_index() > args.steps {
        return Err(format!(
            "--steps {} with --resume: {} is at step {} already; give --steps above it to train \
             on, or read it with `splitgrad report`",
            args.steps,
            ckpt.display(),
            run.trainer().step_index()
        )
        .into());
    }
    if args.resume {
        println!(
            "splitgrad: resumed {} from step {} of {}",
            ckpt.display(),
            run.trainer().step_index(),
            args.steps
        );
    }
    if let Some(code) = train_to_end(&mut run, &stop, args.run.quiet)? {
        return Ok(code);
    }
    let report = run.finish(threads)?;
    write_run(&out, &report, run.trainer())?;
    report::print(&report);
    println!(
        "  held-out: {}; wrote {CHECKPOINT}, report.json, loss.svg, gates.svg in {}",
        data.heldout_source,
        out.display()
    );
    if args.json {
        println!("{}", serde_json::to_string(&to_json(&report))?);
    }
    Ok(ExitCode::SUCCESS)
}

/// Trains to the last step behind a progress bar; on a signal, stops with
/// a checkpoint and returns the exit code.
fn train_to_end(run: &mut Run<'_>, stop: &Stop, quiet: bool) -> CliResult<Option<ExitCode>> {
    let mut progress = Progress::new(
        run.trainer().config().steps,
        run.trainer().step_index(),
        quiet,
    );
    while !run.is_done() {
        if let Some(code) = stop.requested() {
            progress.finish();
            print_stopped(run.stop()?, run.checkpoint());
            return Ok(Some(ExitCode::from(code)));
        }
        let s = run.step()?;
        progress.update(
            run.trainer().step_index(),
            format!(
                "loss {:.4}  held-out {:.4}  {:.0} tok/s",
                s.total,
                run.heldout_ce(),
                run.tokens_per_second()
            ),
        );
    }
    progress.finish();
    Ok(None)
}

/// What a finished run writes beside its checkpoint.
const RUN_FILES: [&str; 3] = ["report.json", "loss.svg", "gates.svg"];

/// Writes `report.json` and the two plots of a finished run into `out`.
fn write_run(out: &Path, report: &Report, trainer: &Trainer<f32>) -> CliResult<()> {
    write_json(&out.join("report.json"), &to_json(report))?;
    plots::loss_curve(
        &out.join("loss.svg"),
        trainer.history(),
        trainer.heldout_curve(),
        // A run that keeps anything in half precision says so.
        &super::options::kept_as(&trainer.config().precision),
    )?;
    plots::gate_histogram(
        &out.join("gates.svg"),
        &trainer.model().gates(),
        trainer.labels().planted.as_deref(),
    )
}

/// Says how a run stopped by a signal can go on.
fn print_stopped(stopped: Stopped, ckpt: &Path) {
    match stopped {
        Stopped::Saved(step) => eprintln!(
            "splitgrad: stopped at step {step}: resume with --resume (checkpoint {})",
            ckpt.display()
        ),
        Stopped::AsResumed(step) => eprintln!(
            "splitgrad: stopped at step {step}, as resumed: {} is unchanged; resume with --resume",
            ckpt.display()
        ),
        Stopped::BeforeFirstStep => {
            eprintln!("splitgrad: stopped before the first step; no checkpoint was written")
        }
    }
}
