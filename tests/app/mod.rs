//! Tests of the application: golden vectors, the corpus file, the bench
//! workloads, and (with the `cli` feature) the command line end to end.

mod bench_smoke;
mod corpus_scale;
mod fuzz_replay;
mod io_corpus;

#[cfg(feature = "cli")]
mod bad_inputs;
#[cfg(feature = "cli")]
mod checkpoint_header;
#[cfg(feature = "cli")]
mod cli_crash;
#[cfg(feature = "cli")]
mod cli_half;
#[cfg(feature = "cli")]
mod cli_train;
#[cfg(feature = "cli")]
mod golden;
#[cfg(feature = "cli")]
mod golden_fuzz;
#[cfg(feature = "cli")]
mod golden_half;
#[cfg(feature = "cli")]
mod heldout;
#[cfg(feature = "cli")]
mod resources;
#[cfg(feature = "cli")]
mod run_lock;
#[cfg(feature = "cli")]
mod simd_paths;
#[cfg(feature = "cli")]
mod tokenize;
#[cfg(feature = "cli")]
mod tokenize_train;
