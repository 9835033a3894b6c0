//! The application: the bigram model that uses the three layers, its
//! trainer, pair selection, reports, the synthetic corpus, golden vectors,
//! the benchmark workloads and, with the `cli` feature, the command line.
//!
//! Everything here is built on the engine's public API; nothing in the
//! engine knows this module. It is behind the `app` feature (on with the
//! default `cli`), so a library user who wants only the layers does not
//! compile it.

pub mod bench;
pub mod corpus;
pub mod data;
pub mod eval;
pub mod export;
pub mod golden;
pub mod model;
pub mod plan;
pub mod report;
pub mod run;
pub mod select;
pub mod sweep;
pub mod synthetic;
pub mod tokenize;
pub mod train;

#[cfg(feature = "cli")]
pub mod cli;
