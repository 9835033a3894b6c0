//! splitgrad for Python: the three layers, their optimisers, checkpoints
//! and golden vectors over numpy arrays (module `splitgrad._splitgrad`;
//! the package `splitgrad` re-exports it and adds `splitgrad.torch`).
//!
//! Every class may be shared between Python threads: the layers and
//! optimisers keep their state behind a read-write lock (forwards and
//! backwards share it, what changes the state runs alone; see `sync`).

mod checkpoint;
mod convert;
mod embeddings;
mod gradients;
mod halfio;
mod head;
mod layer;
mod optim;
mod params;
mod sync;
mod vocabulary;

use pyo3::prelude::*;

/// The most threads `set_num_threads` starts (as the command line's
/// `--threads`).
const MAX_THREADS: usize = 1024;

/// Sizes rayon's global pool (the kernels' threads); only before the first
/// parallel call of the process. The matrix products of the head read
/// `MATMUL_NUM_THREADS` once.
#[pyfunction]
fn set_num_threads(n: usize) -> PyResult<()> {
    if n == 0 {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "threads must be at least 1",
        ));
    }
    if n > MAX_THREADS {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "{n} threads is more than {MAX_THREADS}; this machine has {} cores",
            std::thread::available_parallelism().map_or(1, |c| c.get())
        )));
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()
        .map_err(|e| {
            pyo3::exceptions::PyRuntimeError::new_err(format!(
                "cannot size the thread pool now ({e}); call set_num_threads before the first computation"
            ))
        })
}

/// The number of threads of rayon's global pool.
#[pyfunction]
fn num_threads() -> usize {
    rayon::current_num_threads()
}

#[pymodule]
fn _splitgrad(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<embeddings::PyEmbeddings>()?;
    m.add_class::<head::PyHead>()?;
    m.add_class::<head::PyHeadSaved>()?;
    m.add_class::<vocabulary::PyVocabulary>()?;
    m.add_class::<gradients::PyGradients>()?;
    m.add_class::<optim::PyOptimizer>()?;
    m.add_function(wrap_pyfunction!(checkpoint::save_checkpoint, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::load_checkpoint, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::golden_evaluate, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::golden_generate, m)?)?;
    m.add_function(wrap_pyfunction!(checkpoint::golden_evaluate_dir, m)?)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(num_threads, m)?)?;
    // How the extension was compiled: "release" (what `pip install ./python`
    // builds) or "debug" (a development build, many times slower), so that
    // a timing can say which it measured.
    m.add(
        "BUILD",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
    )?;
    Ok(())
}
