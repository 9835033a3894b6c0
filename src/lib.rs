//! # splitgrad
//!
//! A minimal tape-based reverse-mode automatic differentiation engine over
//! [`ndarray`], written for split token embeddings, split vocabularies and
//! a fused split language-modelling head. Every gradient is derived by hand
//! (see `docs/gradients.md`) and checked against finite differences.
#![doc(test(attr(deny(warnings))))]
#![warn(missing_docs)]

mod alloc;
pub mod bench;
pub mod checkpoint;
pub mod error;
pub mod golden;
pub mod io;
pub mod optim;
pub mod param;
pub mod real;
pub mod rng;

pub use alloc::keep_large_buffers;
pub use error::{Error, ErrorKind, Result};
pub use param::{Grad, Gradients, ParamId, Parameter, RowSparse};
pub use real::Real;
pub use rng::Rng;
pub mod layers;
pub mod ops;
pub mod tape;
pub use tape::{Tape, Var};
pub mod model;
pub mod report;
pub mod select;
pub mod synthetic;
pub mod train;

/// The README's Rust examples, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
