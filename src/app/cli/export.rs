//! `splitgrad export CHECKPOINT --out DIR`: the results of a run, in forms
//! a user takes away.
//!
//! For each language, `DIR/<language>.safetensors` holds the (V, D)
//! embedding table that language sees (the shared row, or the gated mix
//! where the pair has a row) as `token_embedding.vocab.weight`, d9d's name
//! for a one-split embedding, with the metadata `language` (its name, or
//! its index where the corpus names none) and `language_index`, in the
//! dtype the run kept its parameters in (`--dtype` chooses another; a
//! half-precision table is the f32 table rounded once to nearest, as a
//! layer's output is). `DIR/kept.json` lists the rows the decision
//! rule keeps, with their gates and held-out gains (and the language names
//! and decoded token strings where the corpus had them), and every row
//! besides.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde_json::json;

use super::CliResult;
use super::report::{rows_json, rule_json};
use crate::app::export::language_table;
use crate::app::report::{Report, ReportInput};
use crate::app::train::load_model;
use crate::checkpoint::save;
use crate::param::{Dtype, Stored};
use crate::state::TensorRef;

/// Options of `splitgrad export`.
#[derive(Args, Debug, Clone)]
pub struct ExportArgs {
    /// A checkpoint written by `splitgrad train` (at the end of its run).
    pub checkpoint: PathBuf,
    /// The folder to write (one safetensors file per language and kept.json).
    #[arg(long)]
    pub out: PathBuf,
    /// Replace files already in the folder.
    #[arg(long)]
    pub force: bool,
    /// How the tables are written: f32, bf16 or f16 (rounded to nearest
    /// once) [default: as the checkpoint keeps its parameters].
    #[arg(long, value_parser = super::options::param_dtype_arg)]
    pub dtype: Option<Dtype>,
}

/// The dtype of the exported tables: `--dtype`, else the one `kept` (the
/// checkpoint's shared table, as it was read).
fn table_dtype(args: &ExportArgs, kept: Dtype) -> CliResult<Dtype> {
    let dtype = args.dtype.unwrap_or(kept);
    if !matches!(dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16) {
        return Err(format!("--dtype {dtype}: export writes tables as f32, bf16 or f16").into());
    }
    Ok(dtype)
}

/// A file name for a language: its name where the corpus has one (letters,
/// digits, `-` and `_` kept), else `language-<l>`.
fn file_stem(names: Option<&[String]>, l: usize) -> String {
    match names.and_then(|n| n.get(l)) {
        Some(n) => {
            let clean: String = n
                .chars()
                .map(|c| {
                    if c.is_alphanumeric() || c == '-' || c == '_' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            if clean.is_empty() {
                format!("language-{l}")
            } else {
                clean
            }
        }
        None => format!("language-{l}"),
    }
}

/// The language file stems a previous export's `kept.json` names (none
/// when there is none, or it does not read as one: then nothing is
/// removed).
fn previous_tables(kept: &std::path::Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(kept) else {
        return Vec::new();
    };
    let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Vec::new();
    };
    json["languages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str())
        // Only a stem export writes: no path, no hidden file.
        .filter(|s| file_stem(Some(&[s.to_string()]), 0) == *s && !s.starts_with('.'))
        .map(str::to_string)
        .collect()
}

/// `splitgrad export`.
pub fn run(args: ExportArgs) -> CliResult<ExitCode> {
    let saved = load_model::<f32>(&args.checkpoint)?;
    let Some(evaluation) = saved.evaluation.as_ref() else {
        return Err(format!(
            "{}: the checkpoint has no held-out evaluation (its run did not reach its last step); finish it with `splitgrad train --resume`",
            args.checkpoint.display()
        )
        .into());
    };
    let dtype = table_dtype(&args, saved.model.shared_table().dtype())?;
    let use_gate = saved.use_gate();
    let model = &saved.model;
    let l = model.config().n_languages;
    let names = saved.labels.language_names.as_deref();
    let stems: Vec<String> = (0..l).map(|i| file_stem(names, i)).collect();
    let mut files: Vec<PathBuf> = stems
        .iter()
        .map(|s| args.out.join(format!("{s}.safetensors")))
        .collect();
    files.push(args.out.join("kept.json"));
    if !args.force
        && let Some(f) = files.iter().find(|f| f.exists())
    {
        return Err(format!(
            "{}: already exists; pass --force to replace the export in {}",
            f.display(),
            args.out.display()
        )
        .into());
    }
    // Every table is held to the dtype before any file is written: an f16
    // table whose values overflow it is refused, not written as infinity.
    for (lang, path) in files.iter().take(l).enumerate() {
        let wide = language_table(model, lang, use_gate)?;
        let table = Stored::from_full(wide.clone().into_dyn(), dtype)?;
        let narrow = table.widened();
        let overflow = wide
            .indexed_iter()
            .zip(narrow.iter())
            .find(|((_, x), y)| x.is_finite() && !y.is_finite());
        if let Some(((at, x), _)) = overflow {
            return Err(format!(
                "{}: {} does not fit in {dtype}: row {}, column {} is {x}, beyond {dtype}'s \
                 largest finite value; export with --dtype bf16 or f32",
                path.display(),
                names
                    .and_then(|n| n.get(lang))
                    .map_or(format!("language {lang}'s table"), |n| format!(
                        "the table of {n}"
                    )),
                at.0,
                at.1
            )
            .into());
        }
    }
    // With --force, the tables of a previous export there (named in its
    // kept.json) that this one does not write are removed once it is
    // written, so that none of another run is left among them.
    let previous = if args.force {
        previous_tables(&files[l])
    } else {
        Vec::new()
    };
    std::fs::create_dir_all(&args.out).map_err(|e| {
        format!(
            "{}: cannot create the output folder: {e}",
            args.out.display()
        )
    })?;
    for (lang, path) in files.iter().take(l).enumerate() {
        let table = Stored::from_full(language_table(model, lang, use_gate)?.into_dyn(), dtype)?;
        let meta = BTreeMap::from([
            // The language's name where the corpus has one, and its index.
            (
                "language".to_string(),
                names
                    .and_then(|n| n.get(lang))
                    .cloned()
                    .unwrap_or_else(|| lang.to_string()),
            ),
            ("language_index".to_string(), lang.to_string()),
            ("source".to_string(), args.checkpoint.display().to_string()),
        ]);
        save(
            path,
            &[(
                "token_embedding.vocab.weight",
                TensorRef::from_stored(table.view()),
            )],
            &meta,
        )?;
    }
    let report = Report::build(&ReportInput::of_saved(&saved, &args.checkpoint, usize::MAX));
    let gated = report.gated();
    let kept = json!({
        "checkpoint": args.checkpoint.display().to_string(),
        "use_gate": use_gate,
        "rule": gated.map(rule_json),
        "heldout_ce": evaluation.ce,
        "heldout_ce_closed": evaluation.ce_closed,
        "languages": stems,
        "kept": gated.map(|g| rows_json(&g.kept)),
        "rows": rows_json(&report.rows),
        "rows_listed": report.rows.len(),
    });
    let text = serde_json::to_string_pretty(&kept)? + "\n";
    crate::io::write_atomic(&files[l], |w| Ok(w.write_all(text.as_bytes())?))?;
    for stem in previous {
        let old = args.out.join(format!("{stem}.safetensors"));
        if !files.contains(&old) {
            crate::io::remove_if_present(&old).map_err(|e| {
                format!(
                    "{}: cannot remove the previous export's table: {e}",
                    old.display()
                )
            })?;
        }
    }
    println!(
        "splitgrad export: {l} embedding tables ({} × {}, {dtype}) and kept.json ({} kept of {} rows) in {}",
        model.config().vocab_size,
        model.config().dim,
        gated.map_or(0, |g| g.kept.len()),
        model.split.n_rows(),
        args.out.display()
    );
    Ok(ExitCode::SUCCESS)
}
