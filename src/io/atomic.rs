//! Replacing a file atomically: [`write_atomic`].

use std::fs::{File, OpenOptions};
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);

#[cfg(test)]
thread_local! {
    /// Test hook: fail the next `write_atomic` of this thread after the
    /// temporary file is written and synced, just before the rename.
    pub(crate) static FAIL_BEFORE_RENAME: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Removes the temporary file unless disarmed, so that neither an error nor
/// a panic in the caller's closure leaves it behind.
struct TempGuard {
    path: Option<PathBuf>,
}

impl Drop for TempGuard {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Writes the file at `path` through `write`, atomically: readers of `path`
/// see either the old file or the whole new one, never a part.
///
/// `write` fills a buffered temporary file created beside `path` (same
/// folder, named `.<name>.tmp-<pid>-<n>`); the buffer is then flushed, the
/// file synced to disk and renamed over `path`, and (on Unix) the folder
/// synced so the rename itself survives a crash. If `write` or any of these
/// steps fails, the temporary file is removed and `path` is left as it was.
/// Nothing else is created. The new file gets default permissions, not
/// those of the file it replaces.
///
/// Errors: whatever `write` returns, and [`crate::ErrorKind::Io`] for the
/// file-system steps (an unwritable or missing folder, a full disk), each
/// naming `path`.
///
/// ```
/// # fn main() -> splitgrad::Result<()> {
/// use std::io::Write;
/// use splitgrad::io::write_atomic;
/// let path = std::env::temp_dir().join(format!("splitgrad-doc-atomic-{}.txt", std::process::id()));
/// write_atomic(&path, |f| Ok(f.write_all(b"first")?))?;
/// // A failing writer leaves the old content in place.
/// let failed = write_atomic(&path, |f| {
///     f.write_all(b"half of the sec")?;
///     Err(splitgrad::Error::config("interrupted"))
/// });
/// assert!(failed.is_err());
/// assert_eq!(std::fs::read(&path)?, b"first");
/// # std::fs::remove_file(&path)?;
/// # Ok(()) }
/// ```
pub fn write_atomic(
    path: impl AsRef<Path>,
    write: impl FnOnce(&mut BufWriter<File>) -> Result<()>,
) -> Result<()> {
    let path = path.as_ref();
    write_atomic_inner(path, write).map_err(|e| e.in_file(path))
}

fn write_atomic_inner(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> Result<()>,
) -> Result<()> {
    let io_error = |what: String, e: std::io::Error| {
        Error::from(std::io::Error::new(e.kind(), format!("{what}: {e}")))
    };
    let Some(file_name) = path.file_name() else {
        return Err(Error::from(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the path names no file",
        )));
    };
    if path.is_dir() {
        return Err(Error::from(std::io::Error::new(
            std::io::ErrorKind::IsADirectory,
            "is a folder, not a file",
        )));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let (temp, file) = create_temp(dir, &file_name.to_string_lossy()).map_err(|e| {
        io_error(
            format!("cannot create a temporary file in {}", dir.display()),
            e,
        )
    })?;
    let mut guard = TempGuard {
        path: Some(temp.clone()),
    };
    let mut out = BufWriter::new(file);
    write(&mut out)?;
    let file = out
        .into_inner()
        .map_err(|e| io_error("cannot write".into(), e.into_error()))?;
    file.sync_all()
        .map_err(|e| io_error("cannot sync to disk".into(), e))?;
    drop(file);
    #[cfg(test)]
    if FAIL_BEFORE_RENAME.with(|f| f.replace(false)) {
        return Err(io_error(
            "cannot rename".into(),
            std::io::Error::other("injected failure before rename"),
        ));
    }
    std::fs::rename(&temp, path)
        .map_err(|e| io_error(format!("cannot rename {} over it", temp.display()), e))?;
    guard.path = None;
    sync_dir(dir);
    Ok(())
}

/// Removes the file at `path`; one that is not there is no error (it was
/// to be gone, and is).
///
/// ```
/// # fn main() -> std::io::Result<()> {
/// let path = std::env::temp_dir().join(format!("splitgrad-doc-gone-{}", std::process::id()));
/// std::fs::write(&path, b"old")?;
/// splitgrad::io::remove_if_present(&path)?;
/// splitgrad::io::remove_if_present(&path)?; // already gone
/// assert!(!path.exists());
/// # Ok(()) }
/// ```
pub fn remove_if_present(path: impl AsRef<Path>) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Removes the temporary files that [`write_atomic`] left in `dir` when its
/// process was killed mid-write (SIGKILL, power loss): files named
/// `.<name>.tmp-<pid>-<n>` whose process is gone. Those of a live process
/// (another run writing into the same folder right now) are left alone.
/// Returns the files removed.
///
/// Errors: [`crate::ErrorKind::Io`] naming `dir` if it cannot be listed.
///
/// ```
/// # fn main() -> splitgrad::Result<()> {
/// use splitgrad::io::remove_stale_temporaries;
/// let dir = std::env::temp_dir().join(format!("splitgrad-doc-stale-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// // A temporary of a process that no longer exists (pid 2^31 − 2 never runs).
/// let stale = dir.join(".model.safetensors.tmp-2147483646-0");
/// std::fs::write(&stale, b"half a checkpoint")?;
/// std::fs::write(dir.join("model.safetensors"), b"the checkpoint")?;
/// assert_eq!(remove_stale_temporaries(&dir)?, vec![stale.clone()]);
/// assert!(!stale.exists() && dir.join("model.safetensors").exists());
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(()) }
/// ```
pub fn remove_stale_temporaries(dir: impl AsRef<Path>) -> Result<Vec<PathBuf>> {
    let dir = dir.as_ref();
    let entries = std::fs::read_dir(dir).map_err(|e| Error::from(e).in_file(dir))?;
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = temp_owner(&name.to_string_lossy()) else {
            continue;
        };
        if pid != std::process::id() && !process_alive(pid) && entry.path().is_file() {
            let path = entry.path();
            if std::fs::remove_file(&path).is_ok() {
                removed.push(path);
            }
        }
    }
    removed.sort();
    Ok(removed)
}

/// The pid in a temporary's name `.<name>.tmp-<pid>-<n>`, if it is one.
fn temp_owner(file_name: &str) -> Option<u32> {
    let rest = file_name.strip_prefix('.')?;
    let at = rest.rfind(".tmp-")?;
    let mut parts = rest[at + 5..].split('-');
    let pid = parts.next()?.parse().ok()?;
    parts.next()?.parse::<u64>().ok()?;
    parts.next().is_none().then_some(pid)
}

/// Whether process `pid` exists (Linux: `/proc/<pid>`; elsewhere a
/// temporary is assumed to be in use).
fn process_alive(pid: u32) -> bool {
    let proc = Path::new("/proc");
    if !proc.join("self").exists() {
        return true;
    }
    proc.join(pid.to_string()).exists()
}

/// Creates a fresh temporary file in `dir`, never reusing an existing name.
fn create_temp(dir: &Path, name: &str) -> std::io::Result<(PathBuf, File)> {
    let pid = std::process::id();
    let mut attempts = 0;
    loop {
        let n = NEXT_TEMP.fetch_add(1, Ordering::Relaxed);
        let temp = dir.join(format!(".{name}.tmp-{pid}-{n}"));
        match OpenOptions::new().write(true).create_new(true).open(&temp) {
            Ok(file) => return Ok((temp, file)),
            // A leftover of a crashed process that had our pid: try the next n.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempts < 100 => {
                attempts += 1
            }
            Err(e) => return Err(e),
        }
    }
}

/// Syncs the folder so the rename is durable. Best effort: the new file is
/// complete and in place whether or not this succeeds.
fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}
