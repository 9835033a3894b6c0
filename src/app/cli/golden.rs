//! `splitgrad golden gen` and `splitgrad golden eval`: thin wrappers over
//! [`splitgrad::app::golden`].

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::app::golden::{self, Layer};

use super::CliResult;

/// Writes `cases` random cases of `layer` under `out/<layer>/`.
pub fn generate(
    layer: &str,
    cases: usize,
    seed: u64,
    out: &Path,
    dtype: &str,
) -> CliResult<ExitCode> {
    let layer: Layer = layer.parse()?;
    let dtype: golden::CaseDtype = dtype.parse()?;
    let paths = golden::generate(layer, cases, seed, out, dtype)?;
    println!(
        "wrote {} {} case(s) ({}) to {}",
        paths.len(),
        layer,
        dtype.name(),
        out.join(layer.name()).display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Evaluates every case under `inputs` and writes the results under `out`;
/// fails if any case does.
pub fn evaluate(inputs: &Path, out: &Path) -> CliResult<ExitCode> {
    let summary = golden::evaluate_dir(inputs, out).map_err(|e| {
        if matches!(e.kind(), crate::ErrorKind::Empty) {
            format!(
                "{}: no case found (expected {}/<layer>/NAME.npz, <layer> one of \
                 split-embeddings, split-vocabulary, lm-head)",
                inputs.display(),
                inputs.display()
            )
        } else {
            e.to_string()
        }
    })?;
    for f in &summary.failed {
        eprintln!("{}/{}: {}", f.layer, f.name, f.error);
    }
    for (path, why) in &summary.skipped {
        eprintln!("{}: skipped: {why}", path.display());
    }
    println!(
        "evaluated {} case(s): {} ok, {} failed{}; results in {}",
        summary.total(),
        summary.ok.len(),
        summary.failed.len(),
        if summary.skipped.is_empty() {
            String::new()
        } else {
            format!(
                "; {} other entr{} skipped (listed above)",
                summary.skipped.len(),
                if summary.skipped.len() == 1 {
                    "y"
                } else {
                    "ies"
                }
            )
        },
        out.display()
    );
    Ok(if summary.all_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Options of `splitgrad golden fuzz`.
#[derive(clap::Args, Debug)]
pub struct FuzzArgs {
    /// Layer: split-embeddings, split-vocabulary or lm-head.
    #[arg(long, value_parser = ["split-embeddings", "split-vocabulary", "lm-head"])]
    layer: String,
    /// The program to test, a shell command line: it is run as `CMD INPUTS OUTPUTS`
    /// and writes OUTPUTS/<layer>/NAME.npz for each case INPUTS/<layer>/NAME.npz.
    #[arg(long, value_name = "CMD", value_parser = non_empty)]
    exec: String,
    /// Number of generated cases, in the first run.
    #[arg(long, default_value_t = 64, value_parser = at_least_one)]
    cases: usize,
    /// Seed (case i is the same as `golden gen`'s case i).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Real dtype of the cases: f64, f32, or bf16 / f16 (the layer kept in
    /// half precision, activations in it).
    #[arg(long, default_value = "f64", value_parser = ["f64", "f32", "bf16", "f16"])]
    dtype: String,
    /// The longest one run of the program may take, in seconds; then it is
    /// stopped and the run is a difference.
    #[arg(long, value_name = "SECS", default_value_t = 60.0, value_parser = seconds)]
    timeout: f64,
    /// Output folder, empty or new: the cases, the answers and, on a
    /// difference, the minimal case (OUT/minimal/<layer>/minimal.npz).
    #[arg(long)]
    out: std::path::PathBuf,
}

fn non_empty(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        Err("the command is empty".into())
    } else {
        Ok(s.to_string())
    }
}

fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(t) if t > 0.0 && std::time::Duration::try_from_secs_f64(t).is_ok() => Ok(t),
        Ok(_) => Err("must be a positive number of seconds".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// A flag that SIGINT and SIGTERM set, so that the search stops the
/// program under test (it runs in its own process group, which a terminal's
/// Ctrl-C does not reach) before it ends; a second signal exits at once.
fn stop_on_signal() -> CliResult<Arc<AtomicBool>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    use signal_hook::flag::register;
    let stop = Arc::new(AtomicBool::new(false));
    // The exit on a second signal is registered first.
    super::exit_on_second_signal()?;
    register(SIGINT, Arc::clone(&stop))?;
    register(SIGTERM, Arc::clone(&stop))?;
    Ok(stop)
}

/// Runs `golden fuzz`: progress on standard error, the outcome on standard
/// output. Exit status 0 when every case agrees, 1 on a difference, 2 when
/// the search could not run (after the message `splitgrad: error: …`), 130
/// when interrupted.
pub fn fuzz(args: FuzzArgs) -> CliResult<ExitCode> {
    use crate::app::golden::{Event, FuzzConfig, FuzzOutcome};
    let config = FuzzConfig {
        layer: args.layer.parse()?,
        cases: args.cases,
        seed: args.seed,
        dtype: args.dtype.parse()?,
        timeout: std::time::Duration::from_secs_f64(args.timeout),
        command: args.exec,
        out: args.out,
        stop: Some(stop_on_signal()?),
    };
    let mut progress = |event: Event<'_>| match event {
        Event::Generated { cases, dir } => eprintln!(
            "fuzz: wrote {cases} {} case(s) ({}, seed {}) to {}; running the program on them",
            config.layer,
            config.dtype.name(),
            config.seed,
            dir.display()
        ),
        Event::Checked {
            cases,
            differing,
            elapsed,
        } => eprintln!(
            "fuzz: the program answered {cases} case(s) in {:.1} s: {differing} differ",
            elapsed.as_secs_f64()
        ),
        Event::BatchFailed { cases, failure } => eprintln!(
            "fuzz: a run on {cases} cases failed as a whole (the program {failure}); \
             running them one at a time"
        ),
        Event::Found {
            name,
            case,
            differences,
        } => {
            eprintln!("fuzz: {name} differs: {case}");
            for d in differences {
                eprintln!("fuzz:   {d}");
            }
            eprintln!("fuzz: shrinking");
        }
        Event::Shrunk { step, change, case } => {
            eprintln!("fuzz: step {step}: {change}: {case}")
        }
    };
    let outcome = match golden::fuzz(&config, &mut progress) {
        Ok(outcome) => outcome,
        Err(e) => {
            eprintln!("splitgrad: error: {e}");
            let interrupted = config
                .stop
                .as_ref()
                .is_some_and(|s| s.load(Ordering::Relaxed));
            return Ok(ExitCode::from(if interrupted { 130 } else { 2 }));
        }
    };
    match outcome {
        FuzzOutcome::Agree { cases } => {
            println!(
                "no difference: the program agrees with splitgrad on {cases} {} case(s) ({}, seed {}); cases in {}",
                config.layer,
                config.dtype.name(),
                config.seed,
                config.out.join("cases").display()
            );
            Ok(ExitCode::SUCCESS)
        }
        FuzzOutcome::Differ(finding) => {
            for d in &finding.differences {
                eprintln!("fuzz:   {d}");
            }
            eprintln!(
                "fuzz: replay with: splitgrad golden eval --inputs {} --out REFERENCE",
                finding.minimal_dir.display()
            );
            println!("{}", finding.summary());
            Ok(ExitCode::FAILURE)
        }
        FuzzOutcome::BatchOnly { cases, failure } => {
            println!(
                "difference: the program {failure} on the {cases} {} cases of {} together, \
                 and on none of them alone",
                config.layer,
                config.out.join("cases").display()
            );
            Ok(ExitCode::FAILURE)
        }
    }
}
