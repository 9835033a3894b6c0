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
//!   inputs give byte-identical files.
//! - [`Checkpoint::open`] reads the whole file and validates its header; a
//!   file that is unreadable, truncated, not safetensors or inconsistent is
//!   an error naming the file, never a panic.
//! - Reading is strict: a tensor is returned only in its own dtype (an `F64`
//!   tensor asked for as `f32` is a [`Dtype`](crate::ErrorKind::Dtype)
//!   error, never a silent conversion) and only in the shape the caller
//!   expects. Every error names the file and the tensor.
//!
//! Memory: `safetensors::serialize` builds the whole file image in memory,
//! so saving copies each tensor's bytes once, into that image; a contiguous
//! array is otherwise borrowed as it is (on a little-endian machine), a
//! strided view is first gathered into row-major order. Loading holds the
//! file's bytes while the [`Checkpoint`] lives, and each `get_*` makes one
//! decoded copy of its tensor.

use ndarray::{Array, ArrayD, ArrayView, ArrayViewD, Dimension};
use safetensors::Dtype;

mod load;
mod save;

pub use load::Checkpoint;
pub use save::save;

/// A little-endian element type of a checkpoint tensor (private).
trait Element: Copy {
    const DTYPE: Dtype;
    const SIZE: usize = std::mem::size_of::<Self>();
    fn put_le(self, out: &mut Vec<u8>);
    fn get_le(bytes: &[u8]) -> Self;
}

macro_rules! impl_element {
    ($($t:ty => $dtype:ident, $variant:ident;)*) => {$(
        impl Element for $t {
            const DTYPE: Dtype = Dtype::$dtype;
            fn put_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get_le(bytes: &[u8]) -> Self {
                let mut b = [0u8; std::mem::size_of::<$t>()];
                b.copy_from_slice(bytes);
                <$t>::from_le_bytes(b)
            }
        }
        impl From<ArrayD<$t>> for TensorData {
            fn from(a: ArrayD<$t>) -> Self {
                TensorData::$variant(a)
            }
        }
        impl<'a, D: Dimension> From<ArrayView<'a, $t, D>> for TensorRef<'a> {
            fn from(a: ArrayView<'a, $t, D>) -> Self {
                TensorRef::$variant(a.into_dyn())
            }
        }
        impl<'a, D: Dimension> From<&'a Array<$t, D>> for TensorRef<'a> {
            fn from(a: &'a Array<$t, D>) -> Self {
                TensorRef::$variant(a.view().into_dyn())
            }
        }
    )*};
}

impl_element! {
    f32 => F32, F32;
    f64 => F64, F64;
    i64 => I64, I64;
    u64 => U64, U64;
}

/// An owned checkpoint array of one of the stored element types.
///
/// ```
/// use ndarray::{arr0, ArrayD, IxDyn};
/// use splitgrad::checkpoint::TensorData;
/// let t = TensorData::from(ArrayD::<i64>::zeros(IxDyn(&[3, 0])));
/// assert_eq!(t.shape(), &[3, 0]);
/// assert_eq!(TensorData::from(arr0(1.5f32).into_dyn()).dtype(), "F32");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    /// `F32` in the file.
    F32(ArrayD<f32>),
    /// `F64` in the file.
    F64(ArrayD<f64>),
    /// `I64` in the file.
    I64(ArrayD<i64>),
    /// `U64` in the file.
    U64(ArrayD<u64>),
}

/// A borrowed checkpoint array, what [`save`] takes: any `ndarray` view or
/// array of `f32`, `f64`, `i64` or `u64` converts into one with `.into()`.
///
/// ```
/// use ndarray::array;
/// use splitgrad::checkpoint::TensorRef;
/// let a = array![[1.0f64, 2.0], [3.0, 4.0]];
/// let r: TensorRef<'_> = a.t().into(); // any strides
/// assert_eq!(r.shape(), &[2, 2]);
/// assert_eq!(r.dtype(), "F64");
/// ```
#[derive(Clone, Debug)]
pub enum TensorRef<'a> {
    /// Saved as `F32`.
    F32(ArrayViewD<'a, f32>),
    /// Saved as `F64`.
    F64(ArrayViewD<'a, f64>),
    /// Saved as `I64`.
    I64(ArrayViewD<'a, i64>),
    /// Saved as `U64`.
    U64(ArrayViewD<'a, u64>),
}

/// A named owned array: one entry of a checkpoint.
///
/// ```
/// use ndarray::{ArrayD, IxDyn};
/// use splitgrad::checkpoint::{Tensor, TensorData};
/// let t = Tensor::new("split_vocabulary.gate_logit", ArrayD::<f32>::zeros(IxDyn(&[4])));
/// let (name, view) = t.entry();
/// assert_eq!((name, view.shape()), ("split_vocabulary.gate_logit", &[4usize][..]));
/// assert!(matches!(t.data, TensorData::F32(_)));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// The checkpoint name.
    pub name: String,
    /// The array.
    pub data: TensorData,
}

impl Tensor {
    /// A tensor named `name` holding `data` (any `ArrayD` of a stored type).
    ///
    /// ```
    /// use ndarray::{ArrayD, IxDyn};
    /// use splitgrad::checkpoint::Tensor;
    /// let t = Tensor::new("split_vocabulary.token_index", ArrayD::<i64>::zeros(IxDyn(&[5])));
    /// assert_eq!((t.name.as_str(), t.data.dtype()), ("split_vocabulary.token_index", "I64"));
    /// ```
    pub fn new(name: impl Into<String>, data: impl Into<TensorData>) -> Self {
        Tensor {
            name: name.into(),
            data: data.into(),
        }
    }

    /// The `(name, view)` pair that [`save`] takes.
    ///
    /// ```
    /// use std::collections::BTreeMap;
    /// use ndarray::{ArrayD, IxDyn};
    /// use splitgrad::checkpoint::{save, Checkpoint, Tensor};
    /// # fn main() -> splitgrad::Result<()> {
    /// # let path = std::env::temp_dir().join(format!("splitgrad-doc-entry-{}.safetensors", std::process::id()));
    /// let tensors = [
    ///     Tensor::new("token_embedding.orig.weight", ArrayD::<f32>::zeros(IxDyn(&[6, 4]))),
    ///     Tensor::new("token_embedding.prompt.weight", ArrayD::<f32>::ones(IxDyn(&[2, 4]))),
    /// ];
    /// let entries: Vec<_> = tensors.iter().map(Tensor::entry).collect();
    /// save(&path, &entries, &BTreeMap::new())?;
    /// assert_eq!(Checkpoint::open(&path)?.shape("token_embedding.prompt.weight")?, &[2, 4]);
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    pub fn entry(&self) -> (&str, TensorRef<'_>) {
        (&self.name, self.data.view())
    }
}

impl TensorData {
    /// A borrowed view of the array.
    ///
    /// ```
    /// use ndarray::{ArrayD, IxDyn};
    /// use splitgrad::checkpoint::TensorData;
    /// let t = TensorData::from(ArrayD::<u64>::zeros(IxDyn(&[2])));
    /// assert_eq!(t.view().shape(), &[2]);
    /// ```
    pub fn view(&self) -> TensorRef<'_> {
        match self {
            TensorData::F32(a) => TensorRef::F32(a.view()),
            TensorData::F64(a) => TensorRef::F64(a.view()),
            TensorData::I64(a) => TensorRef::I64(a.view()),
            TensorData::U64(a) => TensorRef::U64(a.view()),
        }
    }

    /// The shape.
    ///
    /// ```
    /// use ndarray::{ArrayD, IxDyn};
    /// use splitgrad::checkpoint::TensorData;
    /// assert_eq!(TensorData::from(ArrayD::<f64>::zeros(IxDyn(&[]))).shape(), &[] as &[usize]);
    /// ```
    pub fn shape(&self) -> &[usize] {
        match self {
            TensorData::F32(a) => a.shape(),
            TensorData::F64(a) => a.shape(),
            TensorData::I64(a) => a.shape(),
            TensorData::U64(a) => a.shape(),
        }
    }

    /// The safetensors dtype name: `"F32"`, `"F64"`, `"I64"` or `"U64"`.
    ///
    /// ```
    /// use ndarray::{ArrayD, IxDyn};
    /// use splitgrad::checkpoint::TensorData;
    /// assert_eq!(TensorData::from(ArrayD::<i64>::zeros(IxDyn(&[1]))).dtype(), "I64");
    /// ```
    pub fn dtype(&self) -> &'static str {
        self.view().dtype()
    }
}

impl TensorRef<'_> {
    /// The shape.
    ///
    /// ```
    /// use ndarray::Array3;
    /// use splitgrad::checkpoint::TensorRef;
    /// let a = Array3::<f32>::zeros((2, 0, 5));
    /// assert_eq!(TensorRef::from(&a).shape(), &[2, 0, 5]);
    /// ```
    pub fn shape(&self) -> &[usize] {
        match self {
            TensorRef::F32(a) => a.shape(),
            TensorRef::F64(a) => a.shape(),
            TensorRef::I64(a) => a.shape(),
            TensorRef::U64(a) => a.shape(),
        }
    }

    /// The safetensors dtype name: `"F32"`, `"F64"`, `"I64"` or `"U64"`.
    ///
    /// ```
    /// use ndarray::Array1;
    /// use splitgrad::checkpoint::TensorRef;
    /// assert_eq!(TensorRef::from(&Array1::<u64>::zeros(3)).dtype(), "U64");
    /// ```
    pub fn dtype(&self) -> &'static str {
        match self {
            TensorRef::F32(_) => "F32",
            TensorRef::F64(_) => "F64",
            TensorRef::I64(_) => "I64",
            TensorRef::U64(_) => "U64",
        }
    }
}
