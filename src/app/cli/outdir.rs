//! Output folders and files that are never silently replaced.
//!
//! A command that writes results checks, after its inputs are validated and
//! before it writes anything, that its output does not already hold a
//! finished result: a run's checkpoint, an index, a sweep. It refuses such
//! an output, naming what is there, unless the user asked to continue it
//! (`--resume`) or to replace it (`--force`). The default folder of a run is
//! unique per corpus file, not just per file name. Temporaries left by a
//! killed process are removed when a command next writes into the folder.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::io::remove_stale_temporaries;

use super::CliResult;

/// `runs/synthetic` for the built-in corpus; `runs/<stem>-<hash>` for a
/// corpus file, the hash (8 hex digits) of its absolute path, so that two
/// corpora called `corpus.npz` in different folders get different runs.
pub fn default_run_folder(name: &str, corpus: Option<&Path>) -> PathBuf {
    let runs = PathBuf::from("runs");
    let Some(path) = corpus else {
        return runs.join(name);
    };
    let absolute = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let h = crate::app::tokenize::fnv1a64(absolute.as_os_str().as_encoded_bytes());
    runs.join(format!("{name}-{:08x}", h as u32))
}

/// The `__metadata__` of a safetensors file, read from its header only (a
/// checkpoint may be gigabytes; this reads at most its first 16 MiB).
pub fn checkpoint_metadata(path: &Path) -> Option<serde_json::Map<String, serde_json::Value>> {
    crate::io::regular_file(path).ok()?;
    let mut file = std::fs::File::open(path).ok()?;
    let mut n = [0u8; 8];
    file.read_exact(&mut n).ok()?;
    let n = u64::from_le_bytes(n);
    if n > 16 << 20 {
        return None;
    }
    let mut header = Vec::new();
    file.take(n).read_to_end(&mut header).ok()?;
    let json: serde_json::Value = serde_json::from_slice(&header).ok()?;
    json.get("__metadata__")?.as_object().cloned()
}

/// "step 5000 of 5000 on corpus.npz" for a run's checkpoint, as far as its
/// metadata says.
pub fn describe_run(checkpoint: &Path) -> String {
    let Some(meta) = checkpoint_metadata(checkpoint) else {
        return "a file that is not a readable checkpoint".to_string();
    };
    let get = |k: &str| meta.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let mut s = String::from("a run");
    if let Some(step) = get("step") {
        s += &format!(" at step {step}");
        if let Some(total) = get("steps") {
            s += &format!(" of {total}");
        }
    }
    if let Some(corpus) = get("corpus") {
        s += &format!(" on {corpus}");
    }
    s
}

/// Makes sure `out` may receive a run: refuses a folder holding a finished
/// or interrupted run (its checkpoint) unless `resume` (continue it) or
/// `force` (replace it); refuses a file in the folder's place. Creates the
/// folder and removes stale temporaries. Returns what it removed.
pub fn prepare_run_folder(
    out: &Path,
    checkpoint: &str,
    resume: bool,
    force: bool,
) -> CliResult<Vec<PathBuf>> {
    if out.exists() && !out.is_dir() {
        return Err(format!("{}: --out must be a folder; this is a file", out.display()).into());
    }
    let ckpt = out.join(checkpoint);
    if ckpt.is_dir() {
        return Err(format!("{}: is a folder, not a file", ckpt.display()).into());
    }
    if ckpt.exists() && !resume && !force {
        return Err(format!(
            "{}: already holds {} ({}); give --resume to continue it, --force to replace it, or another --out",
            out.display(),
            describe_run(&ckpt),
            checkpoint
        )
        .into());
    }
    std::fs::create_dir_all(out)
        .map_err(|e| format!("{}: cannot create the output folder: {e}", out.display()))?;
    Ok(remove_stale_temporaries(out)?)
}

/// Refuses to replace existing result files (any of `files`) unless
/// `force`, naming the first one found; refuses a folder where a file is to
/// be written.
pub fn refuse_existing(files: &[&Path], force: bool) -> CliResult<()> {
    for f in files {
        if f.is_dir() {
            return Err(format!("{}: is a folder; give a file name", f.display()).into());
        }
        if f.exists() && !force {
            return Err(format!(
                "{}: already exists; give --force to replace it, or another --out",
                f.display()
            )
            .into());
        }
    }
    Ok(())
}

/// Prints what [`prepare_run_folder`] cleaned up, if anything.
pub fn report_removed(removed: &[PathBuf]) {
    for p in removed {
        eprintln!(
            "splitgrad: removed {}, a temporary file left by a process that was killed",
            p.display()
        );
    }
}
