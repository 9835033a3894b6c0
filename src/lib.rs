//! # splitgrad
//!
//! A small tape-based reverse-mode automatic differentiation engine over
//! [`ndarray`], written for two embedding layers and the head that goes
//! with them:
//!
//! - [`SplitTokenEmbeddings`](layers::SplitTokenEmbeddings): named
//!   embedding tables, each owning a contiguous range of one global
//!   vocabulary (prompt tuning: freeze `orig`, train `prompt`);
//! - [`SplitVocabulary`](layers::SplitVocabulary): chosen (language, token)
//!   pairs get a private row, mixed with the shared row by a learned
//!   sigmoid gate, with an L1 penalty on the gates and a fusion penalty on
//!   the rows;
//! - [`SplitLanguageModellingHead`](layers::SplitLanguageModellingHead):
//!   per-token cross-entropy over the same splits, fused so that the N × V
//!   logits are never materialised.
//!
//! Every gradient is derived by hand (`docs/gradients.md`, one section per
//! op) and checked against finite differences; the contract — semantics,
//! errors, file formats, golden vectors, benchmark workloads — is
//! `docs/spec.md`.
//!
//! # Quick start
//!
//! ```
//! use ndarray::array;
//! use splitgrad::prelude::*;
//! use splitgrad::layers::SplitTokenEmbeddings;
//! use splitgrad::optim::{LazyAdam, LazyAdamConfig};
//!
//! // d9d's prompt-tuning case: the original vocabulary frozen, the prompt trained.
//! let mut emb = SplitTokenEmbeddings::<f32>::new(&[("orig", 6), ("prompt", 2)], &["orig", "prompt"], 4)?;
//! emb.reset_parameters(&mut Rng::new(0));
//! emb.set_trainable("orig", false)?;
//! let mut opt = LazyAdam::new(LazyAdamConfig { lr: 1e-2, ..LazyAdamConfig::default() })?;
//! for _ in 0..3 {
//!     let grads = {
//!         let mut tape = Tape::new();
//!         let out = emb.forward(&mut tape, &array![[0i64, 6, 7]])?; // (1, 3, 4)
//!         let loss = tape.sum(out);
//!         tape.backward(loss)
//!     };
//!     opt.step(emb.parameters_mut(), &grads)?;
//! }
//! assert_eq!(opt.state().len(), 3); // exp_avg, exp_avg_sq, step of `prompt` only
//! # Ok::<(), splitgrad::Error>(())
//! ```
//!
//! `examples/prompt_tuning.rs` adds a checkpoint and a resume;
//! `examples/split_vocabulary.rs` walks through the split vocabulary.
//!
//! # The layers of the crate
//!
//! Dependencies run one way; no module imports one above it
//! (`docs/architecture.md`, checked by a test):
//!
//! | layer | modules | knows |
//! |---|---|---|
//! | kernels | [`kernels`] | nothing of the crate: loops over slices and views |
//! | foundation | [`error`], [`param`], [`state`], [`rng`], [`io`] | kernels |
//! | tape | [`tape`] | the foundation: nodes, the reverse sweep, gradients; no op |
//! | ops | [`ops`] | the tape: each op's forward, saved state and backward |
//! | layers | [`layers`] | ops: validation, parameters, recording ops |
//! | optimisers | [`optim`] | parameters and gradients |
//! | checkpoints | [`checkpoint`] | named state, optimisers |
//! | application | `app` (feature `app`) | everything above: the bigram model, training, the command line |
//!
//! # Shapes
//!
//! N tokens, H (or D) the hidden size, V the vocabulary size, L the number
//! of languages; `(N, H)` is an array of N rows of H. Ids are `i64` in any
//! shape a layer allows ([`layers::Ids`]); reals are `f32` or `f64`
//! ([`Real`]): gradient checks run in `f64`, training in `f32`.
//!
//! # Errors and panics
//!
//! Every fallible function returns [`Result`] with the one [`Error`] type:
//! a kind with structured fields ([`ErrorKind`]) plus the file and the
//! array it concerns, displayed as one line
//! (`index.npz: array `token_index`: token id 70000 at position [12] is out
//! of range 0..32000`). Input from files and users is never a panic. A
//! panic is a caller's bug — two arrays of different shapes handed to a
//! kernel, a [`Var`] of another tape — and each such function says so
//! under **Panics**.
//!
//! # Features
//!
//! - `app`: the application as a library (the bigram model, trainer,
//!   selection, reports, synthetic corpus, golden vectors and benchmark
//!   workloads, under `splitgrad::app`); no extra dependencies.
//! - `cli` (default): the `splitgrad` command line and the crates only it
//!   needs. A library user depends on the crate with
//!   `default-features = false`.
//!
//! # Minimum Rust version
//!
//! 1.85 (edition 2024).
#![doc(test(attr(deny(warnings))))]
#![warn(missing_docs)]
// `serde_json::json!` expands recursively, once a field: the bench report's
// object needs more than the default 128 levels.
#![recursion_limit = "256"]

pub mod checkpoint;
pub mod error;
pub mod io;
pub mod kernels;
pub mod layers;
pub mod ops;
pub mod optim;
pub mod param;
pub mod rng;
pub mod state;
pub mod tape;

#[cfg(feature = "app")]
pub mod app;

pub use error::{Error, ErrorKind, Result};
pub use kernels::Real;
pub use param::{GradSource, ParamGrad, ParamId, Parameter, RowSparse};
pub use rng::Rng;
pub use tape::{Gradients, Tape, Var};

/// The names most programs use: `use splitgrad::prelude::*;`.
pub mod prelude {
    pub use crate::layers::Ids;
    pub use crate::optim::Optimizer;
    pub use crate::state::Module;
    pub use crate::{Error, Parameter, Real, Result, Rng, Tape, Var};
}

/// The README's Rust examples, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
