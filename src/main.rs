//! `splitgrad`: train, select and report split vocabularies; write and
//! evaluate golden vectors; benchmark the kernels. The command line lives
//! in the library (`splitgrad::app::cli`); this is its entry point.

fn main() -> std::process::ExitCode {
    splitgrad::app::cli::main()
}
