//! The bodies of splitgrad's fuzz targets, as plain functions of bytes so
//! that `tests/fuzz_replay.rs` in the main crate can replay the corpora
//! without libFuzzer (it includes `bodies/mod.rs` with `#[path]`).
#![allow(missing_docs)]

pub mod bodies;
