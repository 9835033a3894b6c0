//! Safetensors checkpoints: named arrays saved atomically and loaded back
//! with every name, dtype and shape checked.
//!
//! A checkpoint is one [safetensors](https://github.com/huggingface/safetensors)
//! file: an 8-byte little-endian header length, a JSON header (for each
//! tensor its dtype, shape and byte range, plus an optional `__metadata__`
//! map of strings), then the tensors' bytes, little-endian and row-major.
//! The module knows no layer: it stores `f32`, `f64`, `i64` and `u64` arrays
//! of any shape — 0-d (one element) and zero-sized (no bytes) included —
//! under the names the layers choose (`token_embedding.<split>.weight`,
//! `lm_head.<split>.weight`, `split_vocabulary.rows`, …).
//!
//! PyTorch reads a checkpoint as it is:
//!
//! ```text
//! python -c "from safetensors.torch import load_file; print({k: v.shape for k, v in load_file('run/model.safetensors').items()})"
//! ```
//!
//! - [`save`] is atomic: it writes a temporary file beside the target,
//!   syncs it to disk and renames it over the target. If anything fails, the
//!   previous file is untouched and the temporary file is removed. Equal
//!   inputs give byte-identical files. The tensors' bytes are streamed to
//!   the file from the arrays themselves (a copy only of an array that is
//!   not contiguous): saving holds no image of the file in memory.
//! - [`Checkpoint::open`] reads the whole file and validates its header; a
//!   file that is unreadable, truncated, not safetensors or inconsistent is
//!   an error naming the file, never a panic.
//! - Reading is strict: a tensor is returned only in its own dtype (an `F64`
//!   tensor asked for as `f32` is a [`Dtype`](crate::ErrorKind::Dtype)
//!   error, never a silent conversion) and only in the shape the caller
//!   expects. Every error names the file and the tensor.
//!
//! Memory: saving writes the header, then each tensor's bytes from where
//! they are (a contiguous array is borrowed as it is on a little-endian
//! machine, a strided view first gathered into row-major order); no image
//! of the file is built, nor room reserved for one. Loading reads the
//! header, then each tensor when it is asked for (its size checked against
//! the memory available first), and each `get_*` makes one decoded copy
//! of its tensor.

mod load;
mod save;
mod snapshot;

pub use load::Checkpoint;
pub use save::save;
pub use snapshot::{OPTIMIZER, Snapshot, load_state, save_state};

pub(crate) use crate::state::Element;
pub use crate::state::{Tensor, TensorData, TensorRef};

/// A fresh, empty folder for one of this module's unit tests (`tag`
/// names the test).
#[cfg(test)]
fn test_dir(tag: &str) -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("splitgrad-ckpt-unit-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
