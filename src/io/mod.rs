//! Data files: `.npz` arrays, the split-vocabulary index, atomic writes and
//! the memory limits every size from outside is checked against. The corpus
//! is read on top of these, by `app::corpus`.
//!
//! - [`NpzReader`] reads any `.npz` written by `numpy.savez` (or
//!   `savez_compressed`): integer arrays of every width and byte order as
//!   `i64`, `float32`/`float64` arrays as either [`Real`] type, 0-d arrays,
//!   Fortran-order arrays.
//! - [`NpzWriter`] writes one that `numpy.load` reads, atomically
//!   ([`write_atomic`]).
//! - [`SplitIndex`] and [`load_index`] / [`save_index`]: the
//!   `(language, token)` pairs of a split vocabulary (`docs/spec.md#23-splitvocabulary`), and
//!   [`PairLookup`], their O(1) map to rows.
//!
//! Input from files never panics. Every error names the file, the array
//! and, for a bad value, its position and the value:
//!
//! ```text
//! index.npz: array `token_index`: token id 70000 at position [12] is out of range 0..32000
//! ```

mod atomic;
mod column;
mod index;
mod limits;
mod lookup;
mod npy;
mod npz;
mod pylit;
mod writer;

#[cfg(test)]
pub(crate) use atomic::FAIL_BEFORE_RENAME;
pub use atomic::{remove_if_present, remove_stale_temporaries, write_atomic};
pub use column::{Column, Width};
pub use index::{SplitIndex, load_index, save_index};
pub use limits::{
    MEMORY_LIMIT_VAR, bytes_of, check_memory, memory_available, open_regular, read_regular,
    regular_file,
};
pub use lookup::PairLookup;
pub use npy::{Dtype, DtypeKind};
pub use npz::{NpzReader, RealDtype};
pub use writer::{NpyElement, NpzWriter};

use ndarray::{ArrayView, Dimension};

use crate::error::{Error, ErrorKind, Result};
use crate::kernels::Real;

/// Checks that every element of `array` is finite.
///
/// Errors: [`ErrorKind::NonFinite`] for the first NaN or infinity in
/// row-major order, with its multi-index and value, naming array `name`.
///
/// ```
/// use ndarray::arr2;
/// use splitgrad::io::check_finite;
/// let a = arr2(&[[1.0f32, 2.0], [3.0, f32::INFINITY]]);
/// let e = check_finite(a.view(), "rows").unwrap_err();
/// assert_eq!(e.to_string(), "array `rows`: non-finite value inf at position [1, 1]");
/// assert!(check_finite(a.slice(ndarray::s![0, ..]), "rows").is_ok());
/// ```
pub fn check_finite<T: Real, D: Dimension>(array: ArrayView<'_, T, D>, name: &str) -> Result<()> {
    match first_non_finite(array) {
        None => Ok(()),
        Some((position, value)) => {
            Err(Error::new(ErrorKind::NonFinite { position, value }).in_array(name))
        }
    }
}

/// The multi-index and value of the first NaN or infinity of `array`, in
/// row-major order ([`check_finite`]'s search, without the error).
pub(crate) fn first_non_finite<T: Real, D: Dimension>(
    array: ArrayView<'_, T, D>,
) -> Option<(Vec<usize>, f64)> {
    if array.iter().all(|x| x.is_finite()) {
        return None;
    }
    array
        .into_dyn()
        .indexed_iter()
        .find(|(_, x)| !x.is_finite())
        .map(|(i, &x)| (i.slice().to_vec(), Real::to_f64(x)))
}
