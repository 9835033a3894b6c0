//! What a file or a flag may ask of the machine: regular files only, and
//! no allocation beyond the memory there is.
//!
//! Every size that comes from outside (a header's shape, a file's length, a
//! vocabulary inferred from the largest id, a flag) is checked here before
//! memory is asked for, so that a hostile or merely large input gets an
//! error naming the size and where it came from instead of an abort
//! ("memory allocation of N bytes failed") or the kernel's OOM killer.
//!
//! The memory available is the least of what the system reports as
//! available (`MemAvailable` of `/proc/meminfo`), what the cgroup allows
//! (`memory.max` less `memory.current`, cgroup v2), and what the address
//! space limit leaves (`ulimit -v`, from `/proc/self/limits`, less the
//! process's current size), with `SPLITGRAD_MEMORY_LIMIT` (bytes; `k`, `M`,
//! `G` suffixes) as a further cap a user or a test can set. Where none of
//! these can be read (not Linux), nothing is refused here and allocation
//! failures are the only limit.
//!
//! Reading those files costs tens of microseconds, which a small forward
//! pass checking its output and its copies would pay several times a call
//! (about 30 µs of a 16-id numpy forward). [`check_memory`] therefore
//! answers a request small against the figures (at most 1/8 of them, and
//! while what it granted since stays within half) from a reading at most
//! 100 ms old; anything larger, and any refusal, reads them again, and
//! [`memory_available`] always does. Over a long run the figures follow
//! the machine within 100 ms, and memory the process itself takes after a
//! check is counted against the reading until the next one.
//!
//! These are hand-written because no maintained crate reads the cgroup and
//! rlimit figures without also pulling in a system-information library
//! many times this module's size.

use std::fs::{File, Metadata};
use std::path::Path;

use crate::error::{Error, ErrorKind, Result, human_bytes};

/// The environment variable that caps the memory splitgrad plans for.
pub const MEMORY_LIMIT_VAR: &str = "SPLITGRAD_MEMORY_LIMIT";

/// Bytes kept back from the available memory for everything a plan does
/// not count (thread stacks, the allocator's own bookkeeping, buffers).
const HEADROOM: u64 = 64 << 20;

/// Parses `123`, `64k`, `512M`, `2G`, `1T` (powers of 1024).
fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let (digits, shift) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 10),
        b'm' | b'M' => (&s[..s.len() - 1], 20),
        b'g' | b'G' => (&s[..s.len() - 1], 30),
        b't' | b'T' => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    digits.trim().parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// A `Key:   123 kB` field of a `/proc` file, in bytes.
fn proc_field(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let mut words = line[key.len()..].split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => n.checked_mul(1024),
        _ => Some(n),
    }
}

/// What the address-space limit (`ulimit -v`) leaves this process.
fn address_space_left() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    let soft = line["Max address space".len()..]
        .split_whitespace()
        .next()?;
    let limit: u64 = soft.parse().ok()?; // "unlimited" does not parse
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let used = proc_field(&status, "VmSize:").unwrap_or(0);
    Some(limit.saturating_sub(used))
}

/// What the cgroup (v2) still allows.
fn cgroup_left() -> Option<u64> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
    let max = std::fs::read_to_string(dir.join("memory.max")).ok()?;
    let max: u64 = max.trim().parse().ok()?; // "max" does not parse
    let current = std::fs::read_to_string(dir.join("memory.current"))
        .ok()
        .and_then(|c| c.trim().parse().ok())
        .unwrap_or(0);
    Some(max.saturating_sub(current))
}

/// The least of the system's, the cgroup's and the address space's
/// figures, read now; `None` where none can be read.
fn read_system_limits() -> Option<u64> {
    let system = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| proc_field(&m, "MemAvailable:"));
    [system, cgroup_left(), address_space_left()]
        .into_iter()
        .flatten()
        .min()
}

/// `SPLITGRAD_MEMORY_LIMIT`, read on every call (an environment lookup,
/// not a file): a change of it counts at once.
fn user_limit() -> Option<u64> {
    std::env::var(MEMORY_LIMIT_VAR)
        .ok()
        .and_then(|v| parse_bytes(&v))
}

/// The figure [`memory_available`] gives from the system's limits and the
/// user's cap.
fn plan_limit(system: Option<u64>, user: Option<u64>) -> u64 {
    [system, user]
        .into_iter()
        .flatten()
        .min()
        .map_or(u64::MAX, |m| m.saturating_sub(HEADROOM))
}

/// The largest request a reading answers without a new one. The process
/// itself may have mapped gigabytes since the last reading (a reading
/// cannot see that), and a larger request costs far more to fill than the
/// tens of microseconds a reading takes.
const CACHED_MAX: u64 = 16 << 20;

/// How long a reading of the `/proc` and cgroup files answers small
/// requests. Reading them takes tens of microseconds (five files), which a
/// small forward pass would otherwise pay several times per call.
const REFRESH: std::time::Duration = std::time::Duration::from_millis(100);

/// The last reading of the system's limits, and what has been granted from
/// it since.
///
/// A reading answers a request without a new one only while it is younger
/// than [`REFRESH`], only for a request of at most [`CACHED_MAX`] and 1/8
/// of the figure read,
/// and only while everything it granted (which the process may now hold)
/// stays within half of it: memory that other processes take within
/// 100 ms would have to exceed half of what was free for a granted request
/// not to fit. Every other request reads the files again, and a request is
/// refused only on a fresh reading, so a grown limit is never missed.
#[derive(Debug, Clone, Copy)]
struct LimitCache {
    read_at: std::time::Instant,
    /// [`read_system_limits`] then; `None` where nothing could be read.
    system: Option<u64>,
    /// Bytes granted from this reading.
    granted: u64,
}

impl LimitCache {
    /// Whether `bytes` may be granted from this reading at `now`, under the
    /// user's cap `user`; counts them as granted if so.
    fn grant(&mut self, bytes: u64, now: std::time::Instant, user: Option<u64>) -> bool {
        if now.saturating_duration_since(self.read_at) >= REFRESH {
            return false;
        }
        let limit = plan_limit(self.system, user);
        let total = self.granted.saturating_add(bytes);
        if bytes > CACHED_MAX || bytes > limit / 8 || total > limit / 2 {
            return false;
        }
        self.granted = total;
        true
    }
}

static LIMITS: std::sync::Mutex<Option<LimitCache>> = std::sync::Mutex::new(None);

#[cfg(test)]
thread_local! {
    /// The readings this thread has made (the tests' view of the cache).
    static READS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Reads the system's limits now and keeps the reading for [`check_memory`].
fn refresh(now: std::time::Instant) -> Option<u64> {
    #[cfg(test)]
    READS.with(|r| r.set(r.get() + 1));
    let system = read_system_limits();
    let cache = LimitCache {
        read_at: now,
        system,
        granted: 0,
    };
    *LIMITS.lock().unwrap_or_else(|p| p.into_inner()) = Some(cache);
    system
}

/// The memory this process can still plan to use, in bytes (see the module
/// docs); `u64::MAX` where nothing is known. Always read afresh (and the
/// reading kept for [`check_memory`]'s small requests).
pub fn memory_available() -> u64 {
    plan_limit(refresh(std::time::Instant::now()), user_limit())
}

/// Checks that `bytes` (what `what` would take) fit in the memory
/// available; `hint` says what changes it (a flag, a smaller file).
///
/// A small request is answered from a reading of the limits at most
/// 100 ms old (see `LimitCache` in the source for the bounds); anything
/// else, and every refusal, on a fresh reading.
///
/// Errors: [`ErrorKind::TooLarge`] naming `what`, its size and the memory
/// available.
///
/// ```
/// use splitgrad::io::check_memory;
/// assert!(check_memory(|| "a small table".into(), 1 << 10, "").is_ok());
/// let e = check_memory(|| "the model (V 10^12)".into(), u64::MAX, "lower --dim").unwrap_err();
/// assert!(e.to_string().starts_with("the model (V 10^12) needs more than 16.0 EiB"), "{e}");
/// ```
pub fn check_memory(what: impl FnOnce() -> String, bytes: u64, hint: &str) -> Result<()> {
    let now = std::time::Instant::now();
    let user = user_limit();
    {
        let mut cache = LIMITS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = cache.as_mut()
            && c.grant(bytes, now, user)
        {
            return Ok(());
        }
    }
    let available = plan_limit(refresh(now), user);
    if bytes <= available {
        if let Some(c) = LIMITS.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            c.granted = c.granted.saturating_add(bytes);
        }
        return Ok(());
    }
    Err(Error::new(ErrorKind::TooLarge {
        what: what(),
        bytes,
        available,
        hint: hint.to_string(),
    }))
}

/// `a · b · …` in bytes, or `u64::MAX` when the product overflows (it is
/// then refused by [`check_memory`] as too large, never wrapped).
pub fn bytes_of(factors: &[u64]) -> u64 {
    factors
        .iter()
        .try_fold(1u64, |acc, &f| acc.checked_mul(f))
        .unwrap_or(u64::MAX)
}

/// The kind of a file that is not a regular file, in words.
fn special_kind(meta: &Metadata) -> Option<&'static str> {
    let ft = meta.file_type();
    if ft.is_file() {
        return None;
    }
    if ft.is_dir() {
        return Some("a folder");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_fifo() {
            return Some("a FIFO (named pipe)");
        }
        if ft.is_char_device() {
            return Some("a character device");
        }
        if ft.is_block_device() {
            return Some("a block device");
        }
        if ft.is_socket() {
            return Some("a socket");
        }
    }
    Some("not a regular file")
}

/// The metadata of the regular file at `path` (symbolic links followed),
/// checked before the file is opened: a FIFO would block the open, a
/// device never ends.
///
/// Errors: [`ErrorKind::Io`] naming the file if it does not exist or is a
/// folder, a FIFO, a device or a socket.
///
/// ```
/// use splitgrad::io::regular_file;
/// let e = regular_file("/dev/zero").unwrap_err();
/// assert_eq!(e.to_string(), "/dev/zero: is a character device, not a regular file");
/// ```
pub fn regular_file(path: impl AsRef<Path>) -> Result<Metadata> {
    let path = path.as_ref();
    let meta = std::fs::metadata(path).map_err(|e| Error::from(e).in_file(path))?;
    match special_kind(&meta) {
        None => Ok(meta),
        Some(kind) => Err(Error::from(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("is {kind}, not a regular file"),
        ))
        .in_file(path)),
    }
}

/// Opens the regular file at `path` for reading (see [`regular_file`]).
pub fn open_regular(path: impl AsRef<Path>) -> Result<File> {
    let path = path.as_ref();
    regular_file(path)?;
    File::open(path).map_err(|e| Error::from(e).in_file(path))
}

/// Reads the whole regular file at `path`, after checking that its size
/// fits in memory (`what` names it in the error, e.g. "the checkpoint").
pub fn read_regular(path: impl AsRef<Path>, what: &str) -> Result<Vec<u8>> {
    use std::io::Read;
    let path = path.as_ref();
    let len = regular_file(path)?.len();
    check_memory(|| format!("reading {what} ({})", human_bytes(len)), len, "")
        .map_err(|e| e.in_file(path))?;
    let mut file = File::open(path).map_err(|e| Error::from(e).in_file(path))?;
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(len as usize)
        .map_err(|_| {
            Error::new(ErrorKind::TooLarge {
                what: format!("reading {what}"),
                bytes: len,
                available: memory_available(),
                hint: String::new(),
            })
        })
        .map_err(|e| e.in_file(path))?;
    // Read no more than the file's size said: a file that grows while it
    // is read is cut where it was measured.
    file.by_ref()
        .take(len)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::from(e).in_file(path))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_parse_with_suffixes() {
        assert_eq!(parse_bytes("123"), Some(123));
        assert_eq!(parse_bytes("64k"), Some(64 << 10));
        assert_eq!(parse_bytes(" 2G "), Some(2 << 30));
        assert_eq!(parse_bytes("1T"), Some(1 << 40));
        assert_eq!(parse_bytes("x"), None);
        assert_eq!(parse_bytes(""), None);
        assert_eq!(parse_bytes("99999999999999T"), None);
    }

    #[test]
    fn proc_fields_read_kilobytes() {
        let text = "MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(proc_field(text, "MemAvailable:"), Some(20_000_000 * 1024));
        assert_eq!(proc_field(text, "Missing:"), None);
    }

    #[test]
    fn products_that_overflow_are_too_large_not_wrapped() {
        assert_eq!(bytes_of(&[4, 1 << 40]), 1 << 42);
        assert_eq!(bytes_of(&[1 << 40, 1 << 40]), u64::MAX);
        assert!(check_memory(|| "x".into(), u64::MAX, "").is_err());
    }

    #[test]
    fn a_reading_answers_small_requests_until_it_is_old_or_half_spent() {
        let t0 = std::time::Instant::now();
        let mib = 1u64 << 20;
        let small = CACHED_MAX;
        let reading = |system: u64| LimitCache {
            read_at: t0,
            system: Some(system + HEADROOM),
            granted: 0,
        };
        let mut c = reading(4 * small);
        let soon = t0 + std::time::Duration::from_millis(10);
        // (a figure of 4 requests: an eighth of it is half a request)
        assert!(!c.grant(small / 2 + 1, soon, None));
        let mut c2 = reading(64 * small);
        // small requests come from the reading, and are counted
        assert!(c2.grant(small, soon, None));
        assert!(c2.grant(small, soon, None));
        assert_eq!(c2.granted, 2 * small);
        // more than CACHED_MAX, however large the figure: read again
        assert!(!c2.grant(small + 1, soon, None));
        // half of the figure granted: read again
        for _ in 2..32 {
            assert!(c2.grant(small, soon, None));
        }
        assert!(!c2.grant(1, soon, None));
        // a fresh reading at the same figure grants again
        c2.granted = 0;
        assert!(c2.grant(1, soon, None));
        // the user's cap counts at once
        assert!(!c2.grant(small, soon, Some(8 * mib)));
        // an old reading answers nothing
        assert!(!c2.grant(1, t0 + REFRESH, None));
        // nothing known: everything up to CACHED_MAX
        let mut none = LimitCache {
            read_at: t0,
            system: None,
            granted: 0,
        };
        assert!(none.grant(small, soon, None));
        assert!(!none.grant(small + 1, soon, None));
    }

    #[test]
    fn check_memory_uses_a_fresh_reading_and_renews_an_old_one() {
        let reads = || READS.with(|r| r.get());
        // (one test: the reading is the process's; other tests' calls only
        // ever leave fresh readings of the real figures)
        let plenty = LimitCache {
            read_at: std::time::Instant::now(),
            system: Some(1 << 40),
            granted: 0,
        };
        *LIMITS.lock().unwrap() = Some(plenty);
        let before = reads();
        for _ in 0..100 {
            assert!(check_memory(|| "x".into(), 1 << 10, "").is_ok());
        }
        assert_eq!(reads(), before, "a fresh reading was not used");
        // Another test's call may replace the cache between this test
        // setting it and using it (a stale or tight reading then renewed on
        // that thread, not counted on this one): each case is tried until
        // one attempt runs on the cache it set, as it does but for such a race.
        let renews = |cache: LimitCache| {
            (0..50).any(|_| {
                *LIMITS.lock().unwrap() = Some(cache);
                let at = reads();
                assert!(check_memory(|| "x".into(), 1 << 10, "").is_ok());
                reads() == at + 1
            })
        };
        // an old reading claiming nothing is free: the files are read again
        // and the request granted from what they say
        let stale = LimitCache {
            read_at: std::time::Instant::now() - 2 * REFRESH,
            system: Some(0),
            granted: 0,
        };
        assert!(renews(stale), "an old reading was not renewed");
        // a refusal is made only on a fresh reading
        let tight = LimitCache {
            read_at: std::time::Instant::now(),
            system: Some(0),
            granted: 0,
        };
        assert!(renews(tight), "refused from a kept reading");
        let before = reads();
        assert!(check_memory(|| "x".into(), u64::MAX, "").is_err());
        assert_eq!(reads(), before + 1);
    }

    #[test]
    fn special_files_are_refused_by_kind() {
        let dir = std::env::temp_dir();
        let e = regular_file(&dir).unwrap_err().to_string();
        assert!(e.ends_with(": is a folder, not a regular file"), "{e}");
        assert!(regular_file("/dev/null").is_err());
    }
}
