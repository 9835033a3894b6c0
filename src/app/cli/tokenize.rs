//! `splitgrad tokenize`: text files, one folder per language, through a
//! `tokenizer.json` into a corpus `.npz` with its metadata
//! (`docs/spec.md#61-corpus`). The work is [`crate::app::tokenize`]'s.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::app::corpus::save_corpus;
use crate::app::tokenize::{HfTokenizer, LanguageSource, Plan, TextEncoder, Tokenized};

use super::CliResult;

/// Inputs larger than this get a progress bar (on a terminal).
const PROGRESS_BYTES: u64 = 4 << 20;

/// Options of `splitgrad tokenize`.
#[derive(Args, Debug, Clone)]
pub struct TokenizeArgs {
    /// A Hugging Face `tokenizer.json` (byte-level BPE and the other
    /// pure-Rust pipelines of the `tokenizers` crate).
    #[arg(long)]
    pub tokenizer: PathBuf,
    /// A language and the folder of its text: every file under DIR
    /// (recursively, sorted by path, hidden ones skipped) is one sequence.
    /// Repeat for each language; their ids are 0, 1, … in this order.
    #[arg(long = "lang", value_name = "NAME=DIR", required = true)]
    pub langs: Vec<String>,
    /// The corpus to write (`token_ids`, `language_ids`,
    /// `sequence_starts` and the metadata arrays).
    #[arg(long)]
    pub out: PathBuf,
    /// Replace --out if it exists.
    #[arg(long)]
    pub force: bool,
}

/// Runs `splitgrad tokenize`.
pub fn run(args: TokenizeArgs) -> CliResult<ExitCode> {
    let languages = args
        .langs
        .iter()
        .map(|a| LanguageSource::parse(a))
        .collect::<crate::Result<Vec<_>>>()?;
    crate::app::tokenize::check_languages(&languages)?;
    if !args.force && std::fs::symlink_metadata(&args.out).is_ok() {
        return Err(format!("{}: exists; pass --force to replace it", args.out.display()).into());
    }
    let tokenizer = HfTokenizer::from_file(&args.tokenizer)?;
    let plan = Plan::new(&languages)?;
    let total = plan.total_bytes();
    let bar = (total > PROGRESS_BYTES && std::io::stderr().is_terminal()).then(|| {
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:30} {bytes}/{total_bytes}  {bytes_per_sec}  [{elapsed_precise}]",
            )
            .expect("valid template"),
        );
        bar
    });
    let result = plan.tokenize(&tokenizer, &|bytes| {
        if let Some(bar) = &bar {
            bar.inc(bytes);
        }
    });
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let tokenized = result?;
    if let Some(parent) = args.out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("{}: cannot create the folder: {e}", parent.display()))?;
    }
    save_corpus(&args.out, &tokenized.corpus)?;
    print_summary(&args, &plan, &tokenized, &tokenizer);
    Ok(ExitCode::SUCCESS)
}

fn print_summary(args: &TokenizeArgs, plan: &Plan, out: &Tokenized, tokenizer: &HfTokenizer) {
    let files: usize = out.stats.iter().map(|s| s.files).sum();
    println!(
        "splitgrad tokenize: {files} files, {} sequences, {} tokens, V {}, {} languages -> {}",
        out.corpus.n_sequences(),
        out.corpus.len(),
        tokenizer.vocab_size(),
        plan.languages.len(),
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
