//! `splitgrad tokenize`: text files, one folder per language, through a
//! `tokenizer.json` (given, or trained here with `--train-vocab`) into a
//! corpus `.npz` with its metadata (`docs/spec.md#61-corpus`). The work is
//! [`crate::app::tokenize`]'s.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{ArgGroup, Args};
use indicatif::{ProgressBar, ProgressStyle};

use crate::app::corpus::{CorpusFormat, save_corpus_as};
use crate::app::tokenize::{
    HfTokenizer, LanguageSource, Plan, TextEncoder, Tokenized, VocabText, check_trained_vocab,
    train_byte_level_bpe,
};
use crate::error::human_bytes;

use super::options::{Given, defaults};
use super::{CliResult, set_threads};

/// Inputs larger than this get a progress bar (on a terminal).
const PROGRESS_BYTES: u64 = 4 << 20;

/// How often a line of progress is printed when standard error is not a
/// terminal.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// The file a trained tokenizer is written to, beside `--out`.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// Options of `splitgrad tokenize`.
#[derive(Args, Debug, Clone)]
#[command(group(ArgGroup::new("source").required(true).args(["tokenizer", "train_vocab"])))]
#[command(after_help = "\
Where a tokenizer.json comes from: give --train-vocab V (8192, say) and \
tokenize trains a byte-level BPE of V tokens on the languages' text itself, \
writes it as tokenizer.json beside --out and encodes with it; or pass \
--tokenizer with any Hugging Face tokenizer.json (one saved by Python's \
`tokenizers`, or the tokenizer.json of a model on the Hugging Face Hub).")]
pub struct TokenizeArgs {
    /// A Hugging Face `tokenizer.json` (byte-level BPE and the other
    /// pure-Rust pipelines of the `tokenizers` crate).
    #[arg(
        long,
        required_unless_present = "train_vocab",
        conflicts_with = "train_vocab"
    )]
    pub tokenizer: Option<PathBuf>,
    /// Train a byte-level BPE of V tokens (at least 257: the 256 bytes and
    /// <|endoftext|>) on the text, balanced across the languages and
    /// without the sequences `train` holds out; write it as tokenizer.json
    /// beside --out and encode with it.
    #[arg(long, value_name = "V")]
    pub train_vocab: Option<usize>,
    /// With --train-vocab: what `train --heldout-fraction` will hold out,
    /// left out of the tokenizer's text (give both the same).
    #[arg(long, default_value_t = defaults().data.heldout_fraction)]
    pub heldout_fraction: f64,
    /// With --train-vocab: the seed of `train` (which sequences it holds
    /// out), and of the order files are sampled in.
    #[arg(long, default_value_t = defaults().data.seed)]
    pub seed: u64,
    /// With --train-vocab: at most this many bytes of text from each
    /// language (each gives as many as the smallest has, up to this).
    #[arg(long, value_name = "BYTES", default_value_t = 100_000_000)]
    pub train_vocab_bytes: u64,
    /// A language and the folder of its text: every file under DIR
    /// (recursively, sorted by path, hidden ones skipped) is one sequence.
    /// Repeat for each language; their ids are 0, 1, … in this order.
    #[arg(long = "lang", value_name = "NAME=DIR", required = true)]
    pub langs: Vec<String>,
    /// The corpus to write: `token_ids` (uint16 for a vocabulary of up to
    /// 65,536 tokens, else uint32), `sequence_languages` (one language per
    /// sequence, uint8), `sequence_starts` and the metadata arrays.
    #[arg(long)]
    pub out: PathBuf,
    /// Write `language_ids`, the language of every token, instead of one
    /// per sequence (for readers that want it; one byte more a token).
    #[arg(long)]
    pub per_token_languages: bool,
    /// Compress the corpus's arrays with deflate (as
    /// `numpy.savez_compressed`): smaller, slower to read.
    #[arg(long)]
    pub deflate: bool,
    /// Replace --out (and, with --train-vocab, the tokenizer.json beside
    /// it) if it exists.
    #[arg(long)]
    pub force: bool,
    /// Worker threads (default: RAYON_NUM_THREADS if set, else all cores); the output is the same for any
    /// number.
    #[arg(long)]
    pub threads: Option<usize>,
    /// No progress on standard error (the summary on standard output stays).
    #[arg(long)]
    pub quiet: bool,
    /// The options given on the command line (filled after parsing).
    #[arg(skip)]
    pub given: Given,
}

/// Progress over a number of bytes: a bar on a terminal (for inputs over
/// [`PROGRESS_BYTES`]); otherwise (a log, a pipe) a plain line after the
/// first bytes, then every [`PROGRESS_EVERY`], then at the end of a phase
/// that succeeded, as `train` writes its steps. Nothing with `--quiet`.
struct Progress {
    what: &'static str,
    total: u64,
    done: AtomicU64,
    bar: Option<ProgressBar>,
    started: Instant,
    /// When the last plain line was written (`None`: none yet).
    last_line: Mutex<Option<Instant>>,
    lines: bool,
}

impl Progress {
    fn new(what: &'static str, total: u64, quiet: bool) -> Progress {
        let terminal = std::io::stderr().is_terminal();
        let bar = (!quiet && terminal && total > PROGRESS_BYTES).then(|| {
            let bar = ProgressBar::new(total);
            bar.set_style(
                ProgressStyle::with_template(
                    "{msg} {bar:30} {bytes}/{total_bytes}  {bytes_per_sec}  [{elapsed_precise}]",
                )
                .expect("valid template"),
            );
            bar.set_message(what);
            bar
        });
        let now = Instant::now();
        Progress {
            what,
            total,
            done: AtomicU64::new(0),
            bar,
            started: now,
            last_line: Mutex::new(None),
            lines: !quiet && !terminal,
        }
    }

    fn add(&self, bytes: u64) {
        let done = self.done.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if let Some(bar) = &self.bar {
            bar.inc(bytes);
        }
        if self.lines {
            let mut last = self.last_line.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
                *last = Some(Instant::now());
                self.line(done);
            }
        }
    }

    /// Clears the bar, or, for a phase that `succeeded`, writes the last
    /// plain line (where a first one was written). A phase that failed
    /// ends on its error instead.
    fn finish(&self, succeeded: bool) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        let last = self.last_line.lock().unwrap_or_else(|p| p.into_inner());
        if self.lines && succeeded && last.is_some() {
            self.line(self.done.load(Ordering::Relaxed));
        }
    }

    /// One plain line: `done` bytes of the total, the rate, the time gone.
    fn line(&self, done: u64) {
        let secs = self.started.elapsed().as_secs_f64();
        // A failed write to standard error has nowhere to be reported.
        let _ = writeln!(
            std::io::stderr(),
            "splitgrad tokenize: {} {} of {} ({:.1} MB/s, {secs:.0} s)",
            self.what,
            human_bytes(done),
            human_bytes(self.total),
            done as f64 / secs.max(1e-9) / 1e6
        );
    }
}

/// Fails if `path` exists and `--force` is not given.
fn refuse_existing(path: &Path, force: bool) -> CliResult<()> {
    if !force && std::fs::symlink_metadata(path).is_ok() {
        return Err(format!("{}: exists; pass --force to replace it", path.display()).into());
    }
    Ok(())
}

/// Where the trained tokenizer goes: `tokenizer.json` in --out's folder.
fn tokenizer_beside(out: &Path) -> PathBuf {
    out.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from(TOKENIZER_FILE), |p| p.join(TOKENIZER_FILE))
}

/// Runs `splitgrad tokenize`.
pub fn run(args: TokenizeArgs) -> CliResult<ExitCode> {
    let languages = args
        .langs
        .iter()
        .map(|a| LanguageSource::parse(a))
        .collect::<crate::Result<Vec<_>>>()?;
    crate::app::tokenize::check_languages(&languages)?;
    if args.tokenizer.is_some()
        && let Some(flags) = args
            .given
            .flags(&["heldout_fraction", "seed", "train_vocab_bytes"])
    {
        return Err(format!(
            "{flags} with --tokenizer: they choose the text a tokenizer is trained on here \
             (--train-vocab), and this one is given; leave them out"
        )
        .into());
    }
    refuse_existing(&args.out, args.force)?;
    let trained_path = args.train_vocab.map(|_| tokenizer_beside(&args.out));
    if let (Some(v), Some(path)) = (args.train_vocab, &trained_path) {
        check_trained_vocab(v)?;
        if args.out.file_name() == path.file_name() {
            return Err(format!(
                "{}: --out is where the trained tokenizer goes; name the corpus otherwise",
                args.out.display()
            )
            .into());
        }
        refuse_existing(path, args.force)?;
    }
    set_threads(args.threads)?;
    let tokenizer = match &args.tokenizer {
        Some(path) => Some(HfTokenizer::from_file(path)?),
        None => None,
    };
    let plan = Plan::new(&languages)?;
    let (tokenizer, trained) = match (tokenizer, args.train_vocab) {
        (Some(t), _) => (t, None),
        (None, Some(v)) => {
            let text = plan.vocab_text(args.heldout_fraction, args.seed, args.train_vocab_bytes)?;
            let progress =
                Progress::new("training the tokenizer on", text.total_bytes(), args.quiet);
            let json = train_byte_level_bpe(&plan, &text, v, &|b| progress.add(b));
            progress.finish(json.is_ok());
            let json = json?;
            (HfTokenizer::from_bytes(&json)?, Some((json, text, v)))
        }
        (None, None) => unreachable!("clap requires --tokenizer or --train-vocab"),
    };
    let progress = Progress::new("tokenizing", plan.total_bytes(), args.quiet);
    let result = plan.tokenize(&tokenizer, &|bytes| progress.add(bytes));
    progress.finish(result.is_ok());
    let tokenized = result?;
    if trained.is_some() {
        check_heldout_agrees(&plan, &tokenized, args.heldout_fraction, args.seed)?;
    }
    if let Some(parent) = args.out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("{}: cannot create the folder: {e}", parent.display()))?;
    }
    if let (Some((json, _, _)), Some(path)) = (&trained, &trained_path) {
        crate::io::write_atomic(path, |f| Ok(f.write_all(json)?))?;
    }
    let format = CorpusFormat {
        per_sequence_languages: !args.per_token_languages,
        deflate: args.deflate,
    };
    save_corpus_as(&args.out, &tokenized.corpus, format)?;
    if let (Some((_, text, asked)), Some(path)) = (&trained, &trained_path) {
        print_trained(&args, &plan, text, *asked, tokenizer.vocab_size(), path);
    }
    print_summary(&args, &plan, &tokenized, &tokenizer);
    Ok(ExitCode::SUCCESS)
}

/// Checks that the sequences `train` will hold out are those whose files
/// the tokenizer was not trained on (true unless a file changed while it
/// was read: every file with text gives a sequence).
fn check_heldout_agrees(
    plan: &Plan,
    tokenized: &Tokenized,
    fraction: f64,
    seed: u64,
) -> CliResult<()> {
    let predicted: Vec<bool> = plan
        .heldout_files(fraction, seed)
        .into_iter()
        .zip(&plan.files)
        .filter(|(_, f)| f.bytes > 0)
        .map(|(h, _)| h)
        .collect();
    let corpus = &tokenized.corpus;
    if corpus.n_sequences() != predicted.len() {
        return Err(format!(
            "{} files had text when listed but the corpus has {} sequences: did a file change while it was read?",
            predicted.len(),
            corpus.n_sequences()
        )
        .into());
    }
    if predicted.len() >= 2 {
        let languages: Vec<u32> = corpus
            .sequences()
            .map(|r| corpus.language_ids.get(r.start))
            .collect();
        let held = crate::app::eval::heldout_sequences(&languages, fraction, seed);
        if held != predicted {
            return Err("the sequences train will hold out are not those left out of the tokenizer's text: did a file change while it was read?".into());
        }
    }
    Ok(())
}

fn print_trained(
    args: &TokenizeArgs,
    plan: &Plan,
    text: &VocabText,
    asked: usize,
    got: usize,
    path: &Path,
) {
    let size = if got < asked {
        format!("V {got} (of {asked} asked: the text has no more pairs seen twice)")
    } else {
        format!("V {got}")
    };
    let given = text.taken.iter().filter(|&&t| t > 0).count();
    println!(
        "splitgrad tokenize: trained a byte-level BPE, {size}, on {} of text ({} from each of {given} languages, the most the smallest gives, capped at --train-vocab-bytes {}) -> {}",
        human_bytes(text.total_bytes()),
        human_bytes(text.per_language),
        args.train_vocab_bytes,
        path.display()
    );
    for (l, (&a, &t)) in plan
        .languages
        .iter()
        .zip(text.available.iter().zip(&text.taken))
    {
        if a == 0 {
            println!(
                "  {}: no training text (its only file is held out): not in the tokenizer's text",
                l.name
            );
        } else if t < a {
            println!(
                "  {}: {} of its {} of training text",
                l.name,
                human_bytes(t),
                human_bytes(a)
            );
        }
    }
    println!(
        "  left out: {} files ({}) that `train --heldout-fraction {} --seed {}` holds out; give train the same",
        text.heldout_files,
        human_bytes(text.heldout_bytes),
        args.heldout_fraction,
        args.seed
    );
}

fn print_summary(args: &TokenizeArgs, plan: &Plan, out: &Tokenized, tokenizer: &HfTokenizer) {
    let files: usize = out.stats.iter().map(|s| s.files).sum();
    let count = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    println!(
        "splitgrad tokenize: {}, {}, {}, V {}, {} -> {}",
        count(files, "file"),
        count(out.corpus.n_sequences(), "sequence"),
        count(out.corpus.len(), "token"),
        tokenizer.vocab_size(),
        count(plan.languages.len(), "language"),
        args.out.display()
    );
    let width = plan
        .languages
        .iter()
        .map(|l| l.name.chars().count())
        .max()
        .unwrap_or(0);
    for (language, s) in plan.languages.iter().zip(&out.stats) {
        let per_token = if s.tokens > 0 {
            format!("{:.2} bytes/token", s.bytes as f64 / s.tokens as f64)
        } else {
            "no token".to_string()
        };
        println!(
            "  {:<width$}  {:>6} files  {:>10} tokens  {}",
            language.name, s.files, s.tokens, per_token
        );
    }
}
