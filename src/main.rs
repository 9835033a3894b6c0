//! `splitgrad`: train, select and report split vocabularies; write and
//! evaluate golden vectors; benchmark the kernels.
//!
//! Every error ends the program with one line on standard error and a
//! non-zero status.

mod cli;

use std::process::ExitCode;

use clap::Parser;

// SAFETY: this is POSIX `sighandler_t signal(int, sighandler_t)`, with the
// handler passed as a pointer-sized integer (SIG_DFL is 0).
#[cfg(unix)]
unsafe extern "C" {
    fn signal(signum: i32, handler: usize) -> usize;
}

/// Restores the default action of SIGPIPE, so that `splitgrad … | head`
/// ends quietly instead of failing on a closed standard output.
fn quiet_broken_pipe() {
    #[cfg(unix)]
    // SAFETY: `signal(SIGPIPE = 13, SIG_DFL = 0)` is async-signal-safe and
    // runs first in `main`, before any other thread exists; 13 is SIGPIPE on
    // every Unix Rust supports.
    unsafe {
        signal(13, 0);
    }
}

// SAFETY: this is glibc's `int mallopt(int param, int value)`.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe extern "C" {
    fn mallopt(param: i32, value: i32) -> i32;
}

/// Keeps large buffers in the heap. A training step allocates and frees
/// buffers of tens of MiB (outputs, gradients); glibc would map each one
/// afresh and the kernel would fault in and zero every page of it, every
/// step (half the time of the embedding workloads). With no mmap for
/// large blocks and no trimming, freed buffers are reused.
fn keep_large_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only changes allocator parameters; it runs first in
    // `main`, before any other thread exists. M_TRIM_THRESHOLD = −1,
    // M_MMAP_MAX = −4 (glibc's malloc.h).
    unsafe {
        mallopt(-1, i32::MAX);
        mallopt(-4, 0);
    }
}

fn main() -> ExitCode {
    quiet_broken_pipe();
    keep_large_buffers();
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("splitgrad: error: {e}");
            ExitCode::FAILURE
        }
    }
}
