//! `splitgrad`: train, select and report split vocabularies; write and
//! evaluate golden vectors; benchmark the kernels.
//!
//! Every error ends the program with one line on standard error and a
//! non-zero status.

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("splitgrad: error: {e}");
            ExitCode::FAILURE
        }
    }
}
