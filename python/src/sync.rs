//! The locks of the layer and optimiser classes.
//!
//! Each class is `frozen` (Python shares it between threads freely) and
//! keeps its state behind a `RwLock`: forwards, backwards and reads of
//! the state share the read lock; whatever changes the state (an
//! optimiser's step, loads, `seed_from`, `set_trainable`,
//! `reset_parameters`) takes the write lock, so it waits for the calls
//! running and runs alone.
//!
//! A thread never waits for a lock while it holds the GIL: the lock is
//! tried first, and if it is taken the thread waits inside
//! `Python::detach`, so the thread holding the lock can take the GIL back
//! (no deadlock between the GIL and a lock). Several locks are taken in
//! one order (optimisers, then layers, each by address).
//!
//! A panic while a lock is held poisons it; the next call raises
//! `RuntimeError` saying so instead of panicking again (a layer's
//! `load_state_dict` clears it).

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// A value moved out of `Python::detach` on the thread that called it.
struct SameThread<T>(T);

// SAFETY: `Python::detach` runs its closure on the calling thread and
// returns on it; the guard inside never reaches another thread, which is
// all that its `!Send` guards against.
unsafe impl<T> Send for SameThread<T> {}

fn poisoned(what: &str) -> PyErr {
    PyRuntimeError::new_err(format!(
        "{what}: a call panicked while it was changing this object, whose state may be \
         partly updated; build a new one (or load a state dict into it)"
    ))
}

/// The read lock of `lock` (`what` names the object in errors).
pub fn read<'a, T: Send + Sync>(
    py: Python<'_>,
    lock: &'a RwLock<T>,
    what: &str,
) -> PyResult<RwLockReadGuard<'a, T>> {
    match lock.try_read() {
        Ok(g) => return Ok(g),
        Err(TryLockError::Poisoned(_)) => return Err(poisoned(what)),
        Err(TryLockError::WouldBlock) => {}
    }
    py.detach(|| SameThread(lock.read()))
        .0
        .map_err(|_| poisoned(what))
}

/// The write lock of `lock` (`what` names the object in errors).
pub fn write<'a, T: Send + Sync>(
    py: Python<'_>,
    lock: &'a RwLock<T>,
    what: &str,
) -> PyResult<RwLockWriteGuard<'a, T>> {
    write_any(py, lock).map_err(|_| poisoned(what))
}

/// The write lock of `lock` even if it is poisoned (`Err` holding it
/// then), for a call that replaces the whole state.
pub fn write_any<'a, T: Send + Sync>(
    py: Python<'_>,
    lock: &'a RwLock<T>,
) -> Result<RwLockWriteGuard<'a, T>, RwLockWriteGuard<'a, T>> {
    match lock.try_write() {
        Ok(g) => return Ok(g),
        Err(TryLockError::Poisoned(p)) => return Err(p.into_inner()),
        Err(TryLockError::WouldBlock) => {}
    }
    py.detach(|| SameThread(lock.write()))
        .0
        .map_err(|p| p.into_inner())
}
