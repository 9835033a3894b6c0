//! The integration tests, one binary: `cargo test --release` builds and
//! links it once. `engine` tests the library (ops, layers, optimisers,
//! files, checkpoints); `app` the application and the command line.
//! The fused head's memory test is its own binary (`tests/memory.rs`),
//! since it counts every allocation of its process.

mod common;
mod engine;
mod io_common;

#[cfg(feature = "app")]
mod app;
