//! Keeping large buffers in the heap (glibc).
//!
//! A training step allocates and frees buffers of tens of MiB: the gathered
//! output of an embedding, dense gradients, optimiser temporaries. glibc
//! serves blocks of 32 MiB and more with a fresh `mmap` each time, so the
//! kernel faults in and zeroes every page of them, every step, and returns
//! them at `free`. On this project's workloads that was most of the time of
//! a step (`splitgrad bench`, 2 threads: `embed_prompt` 3.4 → 14.5 ms,
//! `embed_full` 8.0–9.2 → 18.6–19.3 ms, `splitvocab` 19.2–20.7 → 52.5 ms
//! with glibc's defaults).
//!
//! [`keep_large_buffers`] turns that off for the whole process: no `mmap`
//! for large blocks and no trimming of the heap, so a freed buffer is reused
//! by the next step. It changes a process-wide allocator setting, so a
//! library does not do it behind its caller's back: the `splitgrad` command
//! calls it first thing, and a program using the library can call it too.
//! The cost is that memory freed by a step stays with the process.

/// Asks glibc's `malloc` to keep large buffers in the heap (see the module
/// docs); returns whether it did. Elsewhere than Linux with glibc, and when
/// the environment variable `SPLITGRAD_MALLOC` is `default` (to measure the
/// difference), it does nothing and returns `false`.
///
/// Call it once, early in `main`.
///
/// ```
/// // First thing in `main`:
/// let kept = splitgrad::keep_large_buffers();
/// // On Linux with glibc, and unless SPLITGRAD_MALLOC=default:
/// let expected = cfg!(all(target_os = "linux", target_env = "gnu"))
///     && std::env::var_os("SPLITGRAD_MALLOC").is_none_or(|v| v != "default");
/// assert_eq!(kept, expected);
/// ```
pub fn keep_large_buffers() -> bool {
    if std::env::var_os("SPLITGRAD_MALLOC").is_some_and(|v| v == "default") {
        return false;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` takes two integers and no pointer; glibc
        // changes its allocator parameters under its arena lock, so any
        // call is memory-safe. M_TRIM_THRESHOLD = −1, M_MMAP_MAX = −4
        // (glibc's malloc.h); it returns 1 on success.
        unsafe { mallopt(-1, i32::MAX) == 1 && mallopt(-4, 0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

// SAFETY: this is glibc's `int mallopt(int param, int value)`.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe extern "C" {
    fn mallopt(param: i32, value: i32) -> i32;
}
