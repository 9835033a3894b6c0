//! `splitgrad golden gen` and `splitgrad golden eval`: thin wrappers over
//! [`splitgrad::app::golden`].

use std::path::Path;
use std::process::ExitCode;

use crate::app::golden::{self, Layer};
use crate::io::RealDtype;

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
    let dtype = match dtype {
        "f64" => RealDtype::F64,
        "f32" => RealDtype::F32,
        other => return Err(format!("unknown dtype `{other}`: expected f64 or f32").into()),
    };
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
