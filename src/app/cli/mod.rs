//! The command line: argument definitions and dispatch.
//!
//! Every error ends the program with one line on standard error and a
//! non-zero status.

mod bench;
mod export;
mod golden;
mod options;
mod outdir;
mod plots;
mod progress;
mod report;
mod select;
mod sweep;
mod tokenize;
mod train;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// A result whose error is printed as one line.
pub type CliResult<T> = Result<T, Box<dyn std::error::Error>>;

/// splitgrad: split token embeddings, split vocabularies and a fused split
/// LM head, with hand-derived gradients.
#[derive(Parser, Debug)]
#[command(name = "splitgrad", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Train a bigram model with a split vocabulary and report its gates.
    Train(train::TrainArgs),
    /// Score each (language, token) pair's interference on the shared-only
    /// model and write the index of the pairs that need a row.
    Select(select::SelectArgs),
    /// Print the report of a checkpoint written by `train`.
    Report(report::ReportArgs),
    /// Train in fusion mode over several fusion weights and tabulate the
    /// effective number of vocabularies.
    Sweep(sweep::SweepArgs),
    /// Write or evaluate golden conformance vectors.
    Golden {
        #[command(subcommand)]
        command: GoldenCommand,
    },
    /// Time one of the four benchmark workloads of `docs/spec.md#5-benchmark-workloads`.
    Bench(bench::BenchArgs),
    /// Encode text files, one folder per language, with a tokenizer.json
    /// into a corpus `.npz`.
    Tokenize(tokenize::TokenizeArgs),
    /// Write each language's effective embedding table and the kept pairs
    /// of a trained checkpoint.
    Export(export::ExportArgs),
}

#[derive(Subcommand, Debug)]
enum GoldenCommand {
    /// Write random cases with their results.
    Gen {
        /// Layer: split-embeddings, split-vocabulary or lm-head.
        #[arg(long)]
        layer: String,
        /// Number of cases.
        #[arg(long, default_value_t = 8)]
        cases: usize,
        /// Seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Output folder (cases go to OUT/<layer>/NAME.npz).
        #[arg(long)]
        out: PathBuf,
        /// Real dtype of the cases: f64, f32, or bf16 / f16 (the layer kept
        /// in half precision, activations in it, computed in f32).
        #[arg(long, default_value = "f64")]
        dtype: String,
    },
    /// Evaluate every case under a folder and write the results.
    Eval {
        /// Folder of cases (INPUTS/<layer>/NAME.npz).
        #[arg(long)]
        inputs: PathBuf,
        /// Output folder (OUT/<layer>/NAME.npz).
        #[arg(long)]
        out: PathBuf,
    },
    /// Run another implementation on generated cases, compare its answers
    /// and shrink a case that differs to a minimal one.
    Fuzz(golden::FuzzArgs),
}

/// The most worker threads a command starts.
const MAX_THREADS: usize = 1024;

/// The count `RAYON_NUM_THREADS` (`var`) asks for: none where it is
/// unset, empty or 0 (every core, as rayon reads it). A value that is not
/// a count is refused rather than ignored (rayon would fall back to every
/// core, silently); [`set_threads`] bounds a count as it bounds
/// `--threads`.
fn env_threads(var: Option<std::ffi::OsString>) -> CliResult<Option<usize>> {
    let Some(var) = var else {
        return Ok(None);
    };
    let text = var.to_string_lossy();
    match text.trim() {
        "" => Ok(None),
        t => match t.parse::<usize>() {
            Ok(n) => Ok((n > 0).then_some(n)),
            Err(_) => Err(format!(
                "RAYON_NUM_THREADS={text:?} is not a number of threads: set a count from 1 to \
                 {MAX_THREADS} (0 or unset: every core), or give --threads"
            )
            .into()),
        },
    }
}

/// Sets the worker threads of rayon and of the matrix products.
pub fn set_threads(threads: Option<usize>) -> CliResult<usize> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // The count asked for, and how it was asked (none: every core).
    let asked = match threads {
        Some(0) => return Err("--threads must be at least 1".into()),
        Some(n) => Some((n, format!("--threads {n}"))),
        None => env_threads(std::env::var_os("RAYON_NUM_THREADS"))?
            .map(|n| (n, format!("RAYON_NUM_THREADS={n}"))),
    };
    let n = match asked {
        Some((n, how)) if n > MAX_THREADS => {
            return Err(format!(
                "{how} is more than {MAX_THREADS}; this machine has {cores} cores"
            )
            .into());
        }
        Some((n, _)) => n,
        None => cores,
    };
    if n > cores {
        eprintln!(
            "splitgrad: {n} threads on {cores} cores: the extra threads only wait their turn (results are the same for any count)"
        );
    }
    // SAFETY: called once at start-up, before any other thread exists, so
    // nothing reads the environment concurrently.
    unsafe { std::env::set_var("MATMUL_NUM_THREADS", n.to_string()) };
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()
        .map_err(|e| format!("cannot start {n} threads: {e}"))?;
    Ok(n)
}

// SAFETY: this is POSIX `sighandler_t signal(int, sighandler_t)`, with the
// handler passed as a pointer-sized integer (SIG_DFL is 0).
#[cfg(unix)]
unsafe extern "C" {
    fn signal(signum: i32, handler: usize) -> usize;
}

/// Restores the default action of SIGPIPE, so that `splitgrad … | head`
/// ends quietly instead of failing on a closed standard output.
fn quiet_broken_pipe() {
    #[cfg(unix)]
    // SAFETY: `signal(SIGPIPE = 13, SIG_DFL = 0)` is async-signal-safe and
    // runs first in `main`, before any other thread exists; 13 is SIGPIPE on
    // every Unix Rust supports.
    unsafe {
        signal(13, 0);
    }
}

/// A signal that repeats within this time of the first is the same
/// request: `timeout` (without `--foreground`) sends its signal to the
/// program and again to its process group, microseconds apart.
const SAME_REQUEST: std::time::Duration = std::time::Duration::from_millis(250);

/// Exits at once with 130 on SIGINT and 143 on SIGTERM when either comes
/// a second time, [`SAME_REQUEST`] or more after the first; the first (and
/// its repeats within that time) only set the flags registered after this.
/// Register before those flags.
fn exit_on_second_signal() -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Instant;
    let start = Instant::now();
    // Nanoseconds from `start` to the first signal, plus one (0: none yet).
    let first = Arc::new(AtomicU64::new(0));
    for (sig, code) in [(SIGINT, 130), (SIGTERM, 143)] {
        let first = Arc::clone(&first);
        let action = move || {
            let now = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX - 1) + 1;
            match first.compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => {}
                Err(seen) if now.saturating_sub(seen) >= SAME_REQUEST.as_nanos() as u64 => {
                    signal_hook::low_level::exit(code)
                }
                Err(_) => {}
            }
        };
        // SAFETY: the action is async-signal-safe: it reads the monotonic
        // clock (`clock_gettime`), does atomic operations on memory it
        // owns, and may call `_exit`; it neither allocates nor locks.
        unsafe { signal_hook::low_level::register(sig, action) }?;
    }
    Ok(())
}

/// The `splitgrad` program: parses the arguments, runs the command, and
/// prints any error as one line.
pub fn main() -> ExitCode {
    quiet_broken_pipe();
    let args = parse_args();
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("splitgrad: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The command line's grammar: clap's, with every subcommand taking a
/// value that looks like a negative number as the option's value (so that
/// `--steps -5` is answered with what is wrong with -5, not with clap's
/// "unexpected argument '-5' found").
pub fn command() -> clap::Command {
    fn numbers_are_values(cmd: clap::Command) -> clap::Command {
        cmd.allow_negative_numbers(true)
            .mut_subcommands(numbers_are_values)
    }
    numbers_are_values(Cli::command())
}

/// Parses the process's arguments, exiting with clap's usage error (status
/// 2) on a bad command line; a negative number given to an option that
/// takes none is named as such.
fn parse_args() -> Cli {
    let parsed = command().try_get_matches().and_then(|m| {
        let mut cli = Cli::from_arg_matches(&m)?;
        if let Some((_, sub)) = m.subcommand() {
            cli.command.set_given(options::Given::of(sub));
        }
        Ok(cli)
    });
    match parsed {
        Ok(cli) => cli,
        Err(e) => match negative_value(&e) {
            Some((arg, value)) => {
                eprintln!("splitgrad: error: {arg} must not be negative, got {value}");
                std::process::exit(2)
            }
            None => e.exit(),
        },
    }
}

/// The option and value of an error that rejects a negative number (an
/// unsigned option given `-5`), if `e` is one.
fn negative_value(e: &clap::Error) -> Option<(String, String)> {
    if e.kind() != ErrorKind::ValueValidation {
        return None;
    }
    let value = match e.get(ContextKind::InvalidValue)? {
        ContextValue::String(v) => v.clone(),
        _ => return None,
    };
    let arg = match e.get(ContextKind::InvalidArg)? {
        ContextValue::String(a) => a.split_whitespace().next()?.to_string(),
        _ => return None,
    };
    let negative = value.starts_with('-') && value[1..].parse::<f64>().is_ok_and(|x| x > 0.0);
    negative.then_some((arg, value))
}

impl Command {
    /// Records which of a command's options were given on the command line
    /// (for the commands that refuse an option they would not honour).
    fn set_given(&mut self, given: options::Given) {
        match self {
            Command::Train(a) => a.given = given,
            Command::Select(a) => a.given = given,
            Command::Sweep(a) => a.given = given,
            Command::Tokenize(a) => a.given = given,
            _ => {}
        }
    }
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> CliResult<ExitCode> {
    match cli.command {
        Command::Train(args) => train::run(args),
        Command::Select(args) => select::run(args),
        Command::Report(args) => report::run(args),
        Command::Sweep(args) => sweep::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Tokenize(args) => tokenize::run(args),
        Command::Export(args) => export::run(args),
        Command::Golden { command } => match command {
            GoldenCommand::Gen {
                layer,
                cases,
                seed,
                out,
                dtype,
            } => golden::generate(&layer, cases, seed, &out, &dtype),
            GoldenCommand::Eval { inputs, out } => golden::evaluate(&inputs, &out),
            GoldenCommand::Fuzz(args) => golden::fuzz(args),
        },
    }
}
