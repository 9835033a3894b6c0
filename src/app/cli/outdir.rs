//! Output folders and files that are never silently replaced.
//!
//! A command that writes results checks, after its inputs are validated and
//! before it writes anything, that its output does not already hold a
//! finished result: a run's checkpoint, an index, a sweep. It refuses such
//! an output, naming what is there, unless the user asked to continue it
//! (`--resume`) or to replace it (`--force`). The default folder of a run is
//! unique per corpus file, not just per file name. Temporaries left by a
//! killed process are removed when a command next writes into the folder.
//!
//! A run holds an exclusive lock on its folder (`.lock`, holding the
//! holder's process id) for its whole life, so that two runs never write
//! into one folder at once; the kernel releases it when the process ends,
//! however it ends. A run without `--out` whose default folder is taken
//! writes the next free one (`runs/synthetic-2`, …).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
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

/// The name of the lock file in a run folder.
pub const LOCK_FILE: &str = ".lock";

/// An exclusive lock on a run folder, held until dropped (or until the
/// process ends).
#[derive(Debug)]
pub struct RunLock {
    _file: File,
}

/// Who holds a run folder's lock: the process id written in it, if it
/// could be read.
#[derive(Debug)]
pub struct Held(pub Option<u32>);

impl Held {
    /// "runs/x is in use by process 1234 (another train run); …"
    pub fn message(&self, out: &Path) -> String {
        let who = match self.0 {
            Some(pid) => format!("process {pid}"),
            None => "another process".to_string(),
        };
        format!(
            "{} is in use by {who} (another train run); wait for it or choose another --out",
            out.display()
        )
    }
}

/// Takes the exclusive lock on the run folder `out` (which must exist),
/// writing this process's id into the lock file; `Ok(Err(held))` when
/// another process holds it.
pub fn lock_run_folder(out: &Path) -> CliResult<Result<RunLock, Held>> {
    let path = out.join(LOCK_FILE);
    let cannot = |e: std::io::Error| format!("{}: cannot lock the run folder: {e}", path.display());
    // Never truncated before the lock is ours: the holder's pid is in it.
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(cannot)?;
    match file.try_lock() {
        Ok(()) => {
            file.set_len(0).map_err(cannot)?;
            file.rewind().map_err(cannot)?;
            writeln!(file, "{}", std::process::id()).map_err(cannot)?;
            file.flush().map_err(cannot)?;
            Ok(Ok(RunLock { _file: file }))
        }
        Err(TryLockError::WouldBlock) => Ok(Err(Held(holder(&mut file)))),
        Err(TryLockError::Error(e)) => Err(cannot(e).into()),
    }
}

/// The pid in a held lock file; the holder writes it just after taking the
/// lock, so an empty file is read again for a short while.
fn holder(file: &mut File) -> Option<u32> {
    for _ in 0..50 {
        let mut text = String::new();
        if file.rewind().is_ok()
            && (&mut *file).take(64).read_to_string(&mut text).is_ok()
            && let Ok(pid) = text.trim().parse()
        {
            return Some(pid);
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    None
}

/// Whether another process holds the lock of the run folder `out`, found
/// without writing anything (a folder without a lock file is not held).
fn probe(out: &Path) -> Option<Held> {
    let mut file = File::open(out.join(LOCK_FILE)).ok()?;
    match file.try_lock() {
        Err(TryLockError::WouldBlock) => Some(Held(holder(&mut file))),
        _ => None,
    }
}

/// The refusals that read the folder only: a file in its place, `resume`
/// without a checkpoint, a checkpoint without `resume` or `force`.
fn check_run_folder(out: &Path, ckpt: &Path, resume: bool, force: bool) -> CliResult<()> {
    if out.exists() && !out.is_dir() {
        return Err(format!("{}: --out must be a folder; this is a file", out.display()).into());
    }
    if ckpt.is_dir() {
        return Err(format!("{}: is a folder, not a file", ckpt.display()).into());
    }
    if resume && !ckpt.exists() {
        return Err(format!(
            "{}: --resume, but there is no checkpoint to resume from",
            ckpt.display()
        )
        .into());
    }
    if ckpt.exists() && !resume && !force {
        return Err(format!(
            "{}: already holds {} ({}); give --resume to continue it, --force to replace it, or another --out",
            out.display(),
            describe_run(ckpt),
            ckpt.file_name().unwrap_or_default().to_string_lossy()
        )
        .into());
    }
    Ok(())
}

/// Makes sure `out` may receive a run and locks it for this process:
/// refuses a folder another process holds (naming it), a folder holding a
/// finished or interrupted run (its checkpoint) unless `resume` (continue
/// it) or `force` (replace it), `resume` without a checkpoint, and a file
/// in the folder's place. A refusal writes nothing; the checks are made
/// again once the lock is held, before anything is replaced. Creates the
/// folder and removes stale temporaries. Returns the lock, to keep for the
/// run's life, and what it removed.
pub fn prepare_run_folder(
    out: &Path,
    checkpoint: &str,
    resume: bool,
    force: bool,
) -> CliResult<(RunLock, Vec<PathBuf>)> {
    let ckpt = out.join(checkpoint);
    if let Some(held) = probe(out) {
        return Err(held.message(out).into());
    }
    check_run_folder(out, &ckpt, resume, force)?;
    std::fs::create_dir_all(out)
        .map_err(|e| format!("{}: cannot create the output folder: {e}", out.display()))?;
    let lock = lock_run_folder(out)?.map_err(|held| held.message(out))?;
    check_run_folder(out, &ckpt, resume, force)?;
    Ok((lock, remove_stale_temporaries(out)?))
}

/// How many folders [`prepare_default_run_folder`] tries.
const DEFAULT_FOLDER_TRIES: u32 = 1000;

/// The default run folder `base` when it is free, else the first free one
/// of `base-2`, `base-3`, …, locked for this process, saying so on
/// standard error; a folder is taken when it is a file, is held by a live
/// process or holds a run's checkpoint (and nothing is written into a
/// taken one). Returns the folder, its lock and the stale temporaries it
/// removed.
pub fn prepare_default_run_folder(
    base: &Path,
    checkpoint: &str,
) -> CliResult<(PathBuf, RunLock, Vec<PathBuf>)> {
    let mut why = String::new();
    // The first reason is the default folder's own, the one to tell.
    fn note(why: &mut String, what: String) {
        if why.is_empty() {
            *why = what;
        }
    }
    let in_use = |Held(pid): Held| {
        let who = pid.map_or("another process".to_string(), |p| format!("process {p}"));
        format!("is in use by {who}")
    };
    for n in 1..=DEFAULT_FOLDER_TRIES {
        let out = if n == 1 {
            base.to_path_buf()
        } else {
            let mut name = base.as_os_str().to_owned();
            name.push(format!("-{n}"));
            PathBuf::from(name)
        };
        let ckpt = out.join(checkpoint);
        if out.exists() && !out.is_dir() {
            note(&mut why, "is a file".to_string());
            continue;
        }
        if let Some(held) = probe(&out) {
            note(&mut why, in_use(held));
            continue;
        }
        if ckpt.exists() {
            note(&mut why, format!("already holds {}", describe_run(&ckpt)));
            continue;
        }
        std::fs::create_dir_all(&out)
            .map_err(|e| format!("{}: cannot create the output folder: {e}", out.display()))?;
        let lock = match lock_run_folder(&out)? {
            Ok(lock) => lock,
            Err(held) => {
                note(&mut why, in_use(held));
                continue;
            }
        };
        if ckpt.exists() {
            note(&mut why, format!("already holds {}", describe_run(&ckpt)));
            continue;
        }
        if n > 1 {
            eprintln!(
                "splitgrad: {} {why}; writing this run to {} (give --out to choose the folder)",
                base.display(),
                out.display()
            );
        }
        let removed = remove_stale_temporaries(&out)?;
        return Ok((out, lock, removed));
    }
    Err(format!(
        "{} {why}, and so are {}-2 to -{DEFAULT_FOLDER_TRIES}; give --out",
        base.display(),
        base.display()
    )
    .into())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("splitgrad-outdir-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_held_folder_names_its_holder_until_released() {
        let dir = scratch("held");
        let first = lock_run_folder(&dir).unwrap().unwrap();
        let text = std::fs::read_to_string(dir.join(LOCK_FILE)).unwrap();
        assert_eq!(text.trim(), std::process::id().to_string());
        // A second open file description conflicts, even in this process.
        let Err(Held(pid)) = lock_run_folder(&dir).unwrap() else {
            panic!("locked twice");
        };
        assert_eq!(pid, Some(std::process::id()));
        let err = prepare_run_folder(&dir, "model.safetensors", false, true).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("is in use by process {}", std::process::id())),
            "{err}"
        );
        drop(first);
        assert!(probe(&dir).is_none());
        let (_lock, _) = prepare_run_folder(&dir, "model.safetensors", false, false).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_refusal_writes_nothing() {
        let dir = scratch("refuse");
        let out = dir.join("run");
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(out.join("model.safetensors"), b"x").unwrap();
        let err = prepare_run_folder(&out, "model.safetensors", false, false).unwrap_err();
        assert!(err.to_string().contains("already holds"), "{err}");
        assert!(!out.join(LOCK_FILE).exists());
        let missing = dir.join("missing");
        prepare_run_folder(&missing, "model.safetensors", true, false).unwrap_err();
        assert!(!missing.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_taken_default_folder_gives_way_to_the_next_free_one() {
        let dir = scratch("default");
        let base = dir.join("synthetic");
        std::fs::create_dir_all(&base).unwrap();
        std::fs::write(base.join("model.safetensors"), b"x").unwrap();
        let held = dir.join("synthetic-2");
        std::fs::create_dir_all(&held).unwrap();
        let _holder = lock_run_folder(&held).unwrap().unwrap();
        std::fs::write(dir.join("synthetic-3"), b"a file").unwrap();
        let (out, _lock, _) = prepare_default_run_folder(&base, "model.safetensors").unwrap();
        assert_eq!(out, dir.join("synthetic-4"));
        // Nothing was written into the finished run's folder.
        assert!(!base.join(LOCK_FILE).exists());
        // Free, it is taken as it is.
        let free = dir.join("free");
        let (out, _lock2, _) = prepare_default_run_folder(&free, "model.safetensors").unwrap();
        assert_eq!(out, free);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
