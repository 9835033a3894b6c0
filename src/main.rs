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

fn main() -> ExitCode {
    quiet_broken_pipe();
    splitgrad::keep_large_buffers();
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("splitgrad: error: {e}");
            ExitCode::FAILURE
        }
    }
}
