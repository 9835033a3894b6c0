//! `splitgrad golden gen` and `splitgrad golden eval`.

use std::path::Path;
use std::process::ExitCode;

use super::CliResult;

pub fn generate(
    _layer: &str,
    _cases: usize,
    _seed: u64,
    _out: &Path,
    _dtype: &str,
) -> CliResult<ExitCode> {
    Err("golden gen: not built yet".into())
}

pub fn evaluate(_inputs: &Path, _out: &Path) -> CliResult<ExitCode> {
    Err("golden eval: not built yet".into())
}
