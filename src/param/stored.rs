//! How an array's elements are kept: at the engine's own precision `T`
//! (`f32` or `f64`), or in bf16 or f16 with the math still in `T`.
//!
//! A [`Stored`] array is what a [`Parameter`](super::Parameter) holds, and
//! what an optimiser keeps its moments in. Half-precision elements are
//! widened (exactly) when read and narrowed when written: by rounding to
//! nearest (a load, a conversion) or, for an optimiser's store, by
//! stochastic rounding ([`Rounding`]), so that an update smaller than half
//! a unit in the last place still moves the value on average.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};
use ndarray::{ArrayD, ArrayViewD, IxDyn};

use crate::error::{Error, Result};
use crate::kernels::Real;
use crate::kernels::half::{HalfFloat, SrKey};
use crate::kernels::rows::{KeptRow, TableRows, row_major};

/// A storage element type.
///
/// ```
/// use splitgrad::param::Dtype;
/// let d: Dtype = "bf16".parse()?;
/// assert_eq!((d, d.size(), d.safetensors()), (Dtype::BF16, 2, "BF16"));
/// assert_eq!("bfloat16".parse::<Dtype>()?, Dtype::BF16);
/// assert!("int8".parse::<Dtype>().is_err());
/// # Ok::<(), splitgrad::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// bfloat16: f32's exponent, 8 bits of significand.
    BF16,
    /// IEEE half precision: 5 exponent bits, 11 of significand.
    F16,
}

impl Dtype {
    /// Every dtype, in the order of the error messages.
    pub const ALL: [Dtype; 4] = [Dtype::F32, Dtype::F64, Dtype::BF16, Dtype::F16];

    /// The engine type's own dtype.
    pub fn of<T: Real>() -> Dtype {
        if T::NAME == "f64" {
            Dtype::F64
        } else {
            Dtype::F32
        }
    }

    /// `"f32"`, `"f64"`, `"bf16"` or `"f16"`.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F64 => "f64",
            Dtype::BF16 => "bf16",
            Dtype::F16 => "f16",
        }
    }

    /// The safetensors dtype: `"F32"`, `"F64"`, `"BF16"` or `"F16"`.
    pub fn safetensors(self) -> &'static str {
        match self {
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
            Dtype::BF16 => "BF16",
            Dtype::F16 => "F16",
        }
    }

    /// [`Dtype::safetensors`] as the safetensors crate's type.
    ///
    /// ```
    /// use splitgrad::param::Dtype;
    /// assert_eq!(Dtype::BF16.safetensors_dtype(), safetensors::Dtype::BF16);
    /// ```
    pub fn safetensors_dtype(self) -> safetensors::Dtype {
        match self {
            Dtype::F32 => safetensors::Dtype::F32,
            Dtype::F64 => safetensors::Dtype::F64,
            Dtype::BF16 => safetensors::Dtype::BF16,
            Dtype::F16 => safetensors::Dtype::F16,
        }
    }

    /// The dtype of a safetensors dtype string ([`Dtype::safetensors`]'s
    /// inverse); `None` for any other (`"U64"`, …).
    ///
    /// ```
    /// use splitgrad::param::Dtype;
    /// for d in Dtype::ALL {
    ///     assert_eq!(Dtype::from_safetensors(d.safetensors()), Some(d));
    /// }
    /// assert_eq!(Dtype::from_safetensors("U64"), None);
    /// ```
    pub fn from_safetensors(s: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.safetensors() == s)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F64 => 8,
            Dtype::BF16 | Dtype::F16 => 2,
        }
    }

    /// bf16 or f16.
    pub fn is_half(self) -> bool {
        matches!(self, Dtype::BF16 | Dtype::F16)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Dtype {
    type Err = Error;
    /// `f32`, `f64`, `bf16`, `f16`, or torch's names (`float32`,
    /// `bfloat16`, `float16`, `half`, …), in any case.
    fn from_str(s: &str) -> Result<Dtype> {
        let s = s.strip_prefix("torch.").unwrap_or(s);
        // Any case: safetensors spells them `BF16`, `F16`, ….
        Ok(match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" | "float" => Dtype::F32,
            "f64" | "float64" | "double" => Dtype::F64,
            "bf16" | "bfloat16" => Dtype::BF16,
            "f16" | "float16" | "half" => Dtype::F16,
            _ => {
                return Err(Error::config(format!(
                    "unknown dtype `{s}` (expected f32, f64, bf16 or f16)"
                )));
            }
        })
    }
}

/// How an optimiser narrows a value it stores in half precision.
///
/// ```
/// use splitgrad::param::Rounding;
/// assert_eq!(Rounding::default(), Rounding::Stochastic { seed: 0 });
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rounding {
    /// To nearest, ties to even: an update below half an ulp is lost.
    Nearest,
    /// Stochastic rounding, unbiased: the expected stored value is the
    /// `f32` result. Its random bits are a pure function of
    /// `(seed, step, parameter name, element index)`
    /// ([`SrKey`](crate::kernels::SrKey)).
    Stochastic {
        /// The run's seed.
        seed: u64,
    },
}

impl Default for Rounding {
    fn default() -> Self {
        Rounding::Stochastic { seed: 0 }
    }
}

impl Rounding {
    /// The stochastic-rounding key of the array named `name` at optimiser
    /// step `step`, or `None` when rounding to nearest.
    pub fn key(self, step: u64, name: &str) -> Option<SrKey> {
        match self {
            Rounding::Nearest => None,
            Rounding::Stochastic { seed } => Some(SrKey::new(seed, step, SrKey::param_hash(name))),
        }
    }
}

/// An array whose elements are kept as `T` or in half precision.
///
/// ```
/// use ndarray::array;
/// use splitgrad::param::{Dtype, Stored};
/// let a = Stored::from_full(array![1.0f32, 1.0 + 1.0 / 512.0].into_dyn(), Dtype::BF16)?;
/// assert_eq!((a.dtype(), a.nbytes()), (Dtype::BF16, 4));
/// assert_eq!(a.widened().as_slice().unwrap(), &[1.0, 1.0]); // rounded to nearest
/// # Ok::<(), splitgrad::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum Stored<T> {
    /// At the engine's precision.
    Full(ArrayD<T>),
    /// bfloat16.
    BF16(ArrayD<bf16>),
    /// IEEE half.
    F16(ArrayD<f16>),
}

/// A view of a [`Stored`] array.
#[derive(Clone, Debug)]
pub enum StoredView<'a, T> {
    /// At the engine's precision.
    Full(ArrayViewD<'a, T>),
    /// bfloat16.
    BF16(ArrayViewD<'a, bf16>),
    /// IEEE half.
    F16(ArrayViewD<'a, f16>),
}

impl<'a, T: Real> StoredView<'a, T> {
    /// The rows of a 2-D view as they are kept, for a kernel that widens
    /// half-precision rows one at a time as it reads them (copied only
    /// when the view is not row-major).
    ///
    /// **Panics** if the view is not 2-D.
    #[track_caller]
    pub fn table_rows(&self) -> TableRows<'a, T> {
        let shape = self.shape();
        assert_eq!(shape.len(), 2, "table_rows: a table of shape {shape:?}");
        let w = shape[1];
        match self {
            StoredView::Full(a) => TableRows::Full(row_major(a), w),
            StoredView::BF16(a) => TableRows::BF16(row_major(a), w),
            StoredView::F16(a) => TableRows::F16(row_major(a), w),
        }
    }
}

/// The elements of a [`Stored`] array as one flat, row-major slice.
#[derive(Debug)]
pub enum StoredMut<'a, T> {
    /// At the engine's precision.
    Full(&'a mut [T]),
    /// bfloat16.
    BF16(&'a mut [bf16]),
    /// IEEE half.
    F16(&'a mut [f16]),
}

fn narrow_array<T: Real, H: HalfFloat + Default>(a: ArrayViewD<'_, T>) -> ArrayD<H> {
    let a = a.as_standard_layout();
    let src = a.as_slice().expect("standard layout is contiguous");
    let mut out = vec![H::default(); src.len()];
    T::narrow_half(src, &mut out, None);
    ArrayD::from_shape_vec(IxDyn(a.shape()), out).expect("one element per index")
}

fn widen_array<T: Real, H: HalfFloat>(a: &ArrayD<H>) -> ArrayD<T> {
    let a = a.as_standard_layout();
    let src = a.as_slice().expect("standard layout is contiguous");
    let mut out = vec![T::zero(); src.len()];
    T::widen_half(src, &mut out);
    ArrayD::from_shape_vec(IxDyn(a.shape()), out).expect("one element per index")
}

fn standard<E: Clone>(a: &mut ArrayD<E>) -> &mut [E] {
    if !a.is_standard_layout() {
        *a = a.as_standard_layout().into_owned();
    }
    a.as_slice_mut().expect("standard layout is contiguous")
}

impl<T> Stored<T> {
    /// The shape.
    pub fn shape(&self) -> &[usize] {
        match self {
            Stored::Full(a) => a.shape(),
            Stored::BF16(a) => a.shape(),
            Stored::F16(a) => a.shape(),
        }
    }

    /// The same elements, in row-major order, under `shape`.
    ///
    /// **Panics** if `shape` has another number of elements, or the array
    /// is not in standard layout (a fresh array always is).
    #[track_caller]
    pub fn into_shape(self, shape: &[usize]) -> Stored<T> {
        fn go<E>(a: ArrayD<E>, shape: &[usize]) -> ArrayD<E> {
            assert!(
                a.is_standard_layout(),
                "into_shape: an array in standard layout"
            );
            a.into_shape_with_order(IxDyn(shape))
                .expect("into_shape: as many elements")
        }
        match self {
            Stored::Full(a) => Stored::Full(go(a, shape)),
            Stored::BF16(a) => Stored::BF16(go(a, shape)),
            Stored::F16(a) => Stored::F16(go(a, shape)),
        }
    }
}

impl<T: Real> Stored<T> {
    /// `a` kept as `dtype`, rounded to nearest. An error when `dtype` is
    /// neither `T`'s own nor a half type (an `f32` array cannot be kept as
    /// `f64`).
    pub fn from_full(a: ArrayD<T>, dtype: Dtype) -> Result<Self> {
        if dtype == Dtype::of::<T>() {
            // Kept as it is: moved, not copied.
            return Ok(Stored::Full(a));
        }
        Self::from_full_view(a.view(), dtype)
    }

    /// [`Self::from_full`] of a view: narrowed straight from it (no copy of
    /// `a` first), or copied when `dtype` is `T`'s own.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::param::{Dtype, Stored};
    /// let a = array![[1.0f32, 2.5], [3.0, -0.5]].into_dyn();
    /// let s = Stored::from_full_view(a.view(), Dtype::BF16)?;
    /// assert_eq!(s.widened().into_owned(), a);
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    pub fn from_full_view(a: ArrayViewD<'_, T>, dtype: Dtype) -> Result<Self> {
        Ok(match dtype {
            Dtype::BF16 => Stored::BF16(narrow_array(a)),
            Dtype::F16 => Stored::F16(narrow_array(a)),
            d if d == Dtype::of::<T>() => Stored::Full(a.to_owned()),
            d => {
                return Err(Error::config(format!(
                    "an array of {} cannot be stored as {d} (only as {} or in half precision)",
                    T::NAME,
                    T::NAME
                )));
            }
        })
    }

    /// Zeros of this shape, kept as `dtype` (an error as [`Self::from_full`]).
    pub fn zeros(shape: &[usize], dtype: Dtype) -> Result<Self> {
        Ok(match dtype {
            Dtype::BF16 => Stored::BF16(ArrayD::from_elem(IxDyn(shape), bf16::ZERO)),
            Dtype::F16 => Stored::F16(ArrayD::from_elem(IxDyn(shape), f16::ZERO)),
            d => Self::from_full(ArrayD::zeros(IxDyn(shape)), d)?,
        })
    }

    /// How the elements are kept.
    pub fn dtype(&self) -> Dtype {
        match self {
            Stored::Full(_) => Dtype::of::<T>(),
            Stored::BF16(_) => Dtype::BF16,
            Stored::F16(_) => Dtype::F16,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.shape().iter().product()
    }

    /// Whether it has no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes its elements take.
    pub fn nbytes(&self) -> u64 {
        self.len() as u64 * self.dtype().size() as u64
    }

    /// The array at `T`'s precision if it is kept so.
    pub fn as_full(&self) -> Option<&ArrayD<T>> {
        match self {
            Stored::Full(a) => Some(a),
            _ => None,
        }
    }

    /// The array at `T`'s precision, to change in place, if it is kept so.
    pub fn as_full_mut(&mut self) -> Option<&mut ArrayD<T>> {
        match self {
            Stored::Full(a) => Some(a),
            _ => None,
        }
    }

    /// The values as `T`: borrowed when kept as `T`, widened (exactly)
    /// otherwise.
    pub fn widened(&self) -> Cow<'_, ArrayD<T>> {
        match self {
            Stored::Full(a) => Cow::Borrowed(a),
            Stored::BF16(a) => Cow::Owned(widen_array(a)),
            Stored::F16(a) => Cow::Owned(widen_array(a)),
        }
    }

    /// The values as `T`, widened if need be.
    pub fn into_full(self) -> ArrayD<T> {
        match self {
            Stored::Full(a) => a,
            other => other.widened().into_owned(),
        }
    }

    /// Keeps the values as `dtype` from now on (rounded to nearest when
    /// narrowed); an error as [`Self::from_full`], and nothing changes.
    pub fn set_dtype(&mut self, dtype: Dtype) -> Result<()> {
        if dtype == self.dtype() {
            return Ok(());
        }
        let full = self.widened().into_owned();
        *self = Self::from_full(full, dtype)?;
        Ok(())
    }

    /// Overwrites every element with `src` (same shape), rounded to
    /// nearest when kept in half precision.
    ///
    /// **Panics** if the shapes differ.
    #[track_caller]
    pub fn assign(&mut self, src: ArrayViewD<'_, T>) {
        assert_eq!(self.shape(), src.shape(), "Stored::assign: shapes differ");
        let src = src.as_standard_layout();
        let s = src.as_slice().expect("standard layout is contiguous");
        match self.flat_mut() {
            StoredMut::Full(d) => d.copy_from_slice(s),
            StoredMut::BF16(d) => T::narrow_half(s, d, None),
            StoredMut::F16(d) => T::narrow_half(s, d, None),
        }
    }

    /// A view.
    pub fn view(&self) -> StoredView<'_, T> {
        match self {
            Stored::Full(a) => StoredView::Full(a.view()),
            Stored::BF16(a) => StoredView::BF16(a.view()),
            Stored::F16(a) => StoredView::F16(a.view()),
        }
    }

    /// The elements as one flat row-major slice (an array of other strides
    /// is first made standard).
    pub fn flat_mut(&mut self) -> StoredMut<'_, T> {
        match self {
            Stored::Full(a) => StoredMut::Full(standard(a)),
            Stored::BF16(a) => StoredMut::BF16(standard(a)),
            Stored::F16(a) => StoredMut::F16(standard(a)),
        }
    }
}

impl<'a, T> From<ArrayViewD<'a, T>> for StoredView<'a, T> {
    fn from(a: ArrayViewD<'a, T>) -> Self {
        StoredView::Full(a)
    }
}

impl<'a, T: Real> StoredView<'a, T> {
    /// The view under `shape` (as many elements), in row-major order, when
    /// it is in standard layout; `None` otherwise.
    pub fn reshaped(&self, shape: &[usize]) -> Option<StoredView<'a, T>> {
        fn go<'a, E>(a: &ArrayViewD<'a, E>, shape: &[usize]) -> Option<ArrayViewD<'a, E>> {
            let a = a.clone();
            a.is_standard_layout()
                .then(|| a.into_shape_with_order(IxDyn(shape)).ok())
                .flatten()
        }
        Some(match self {
            StoredView::Full(a) => StoredView::Full(go(a, shape)?),
            StoredView::BF16(a) => StoredView::BF16(go(a, shape)?),
            StoredView::F16(a) => StoredView::F16(go(a, shape)?),
        })
    }

    /// The view with a shorter lifetime (views are invariant in theirs).
    pub fn reborrow<'b>(self) -> StoredView<'b, T>
    where
        'a: 'b,
    {
        match self {
            StoredView::Full(a) => StoredView::Full(a.reborrow()),
            StoredView::BF16(a) => StoredView::BF16(a.reborrow()),
            StoredView::F16(a) => StoredView::F16(a.reborrow()),
        }
    }

    /// A copy in standard layout.
    pub fn to_owned(&self) -> Stored<T> {
        match self {
            StoredView::Full(a) => Stored::Full(a.as_standard_layout().into_owned()),
            StoredView::BF16(a) => Stored::BF16(a.as_standard_layout().into_owned()),
            StoredView::F16(a) => Stored::F16(a.as_standard_layout().into_owned()),
        }
    }

    /// How the elements are kept.
    pub fn dtype(&self) -> Dtype {
        match self {
            StoredView::Full(_) => Dtype::of::<T>(),
            StoredView::BF16(_) => Dtype::BF16,
            StoredView::F16(_) => Dtype::F16,
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        match self {
            StoredView::Full(a) => a.shape(),
            StoredView::BF16(a) => a.shape(),
            StoredView::F16(a) => a.shape(),
        }
    }
}

impl<'a, T: Real> StoredMut<'a, T> {
    /// The address of its first element and the bytes of one element (for
    /// prefetching rows of a table another task holds).
    pub(crate) fn address(&self) -> (usize, usize) {
        match self {
            StoredMut::Full(s) => (s.as_ptr() as usize, std::mem::size_of::<T>()),
            StoredMut::BF16(s) => (s.as_ptr() as usize, 2),
            StoredMut::F16(s) => (s.as_ptr() as usize, 2),
        }
    }

    /// Its elements read-only, as they are kept.
    pub fn kept(&self) -> KeptRow<'_, T> {
        match self {
            StoredMut::Full(s) => KeptRow::Full(s),
            StoredMut::BF16(s) => KeptRow::BF16(s),
            StoredMut::F16(s) => KeptRow::F16(s),
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            StoredMut::Full(s) => s.len(),
            StoredMut::BF16(s) => s.len(),
            StoredMut::F16(s) => s.len(),
        }
    }

    /// Whether it has no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements before `mid`, and the rest.
    ///
    /// **Panics** if `mid > len`.
    pub fn split_at(self, mid: usize) -> (StoredMut<'a, T>, StoredMut<'a, T>) {
        match self {
            StoredMut::Full(s) => {
                let (a, b) = s.split_at_mut(mid);
                (StoredMut::Full(a), StoredMut::Full(b))
            }
            StoredMut::BF16(s) => {
                let (a, b) = s.split_at_mut(mid);
                (StoredMut::BF16(a), StoredMut::BF16(b))
            }
            StoredMut::F16(s) => {
                let (a, b) = s.split_at_mut(mid);
                (StoredMut::F16(a), StoredMut::F16(b))
            }
        }
    }

    /// Splits into pieces of `size` elements (the last may be shorter).
    pub fn chunks(self, size: usize) -> Vec<StoredMut<'a, T>> {
        let mut out = Vec::with_capacity(self.len().div_ceil(size.max(1)));
        let mut rest = self;
        while rest.len() > size {
            let (a, b) = rest.split_at(size);
            out.push(a);
            rest = b;
        }
        if !rest.is_empty() {
            out.push(rest);
        }
        out
    }

    /// The disjoint rows `rows` (sorted, unique, in range) of a row-major
    /// table of row length `width`.
    ///
    /// **Panics** if the rows are not sorted and unique or one is out of
    /// range.
    #[track_caller]
    pub fn pick_rows(self, width: usize, rows: &[usize]) -> Vec<StoredMut<'a, T>> {
        let mut out = Vec::with_capacity(rows.len());
        let mut rest = self;
        let mut next = 0;
        for &r in rows {
            assert!(r >= next, "pick_rows: rows must be sorted and unique");
            let (_, tail) = rest.split_at((r - next) * width);
            let (row, tail) = tail.split_at(width);
            out.push(row);
            rest = tail;
            next = r + 1;
        }
        out
    }

    /// Reborrows it.
    pub fn reborrow(&mut self) -> StoredMut<'_, T> {
        match self {
            StoredMut::Full(s) => StoredMut::Full(s),
            StoredMut::BF16(s) => StoredMut::BF16(s),
            StoredMut::F16(s) => StoredMut::F16(s),
        }
    }
}

/// Elements per step of [`update_widened_in`]: the buffers stay in L1.
pub const WIDEN_CHUNK: usize = 512;

/// One stored array taking part in an [`update_widened_in`]: its elements
/// and the key its half-precision store rounds with (`None`: to nearest;
/// ignored when kept as `T`).
pub struct Part<'a, T> {
    /// The elements.
    pub elems: StoredMut<'a, T>,
    /// The stochastic-rounding key.
    pub key: Option<SrKey>,
}

/// Runs `f` over `N` stored arrays of one length, in steps of
/// [`WIDEN_CHUNK`] elements: each array kept as `T` is passed in place;
/// each kept in half precision is widened into a buffer first and narrowed
/// back after (stochastically with its key, the element at offset `i`
/// being global index `first + i`). `f` gets the `N` slices and the offset
/// of the step. With every array kept as `T` it is `f` on the whole
/// slices, once. `bufs` are the buffers (a task reuses one set for all
/// its runs).
///
/// **Panics** if the lengths differ.
#[track_caller]
pub fn update_widened_in<T: Real, const N: usize>(
    mut parts: [Part<'_, T>; N],
    first: u64,
    bufs: &mut [[T; WIDEN_CHUNK]; N],
    mut f: impl FnMut([&mut [T]; N], usize),
) {
    let len = parts.first().map_or(0, |p| p.elems.len());
    assert!(
        parts.iter().all(|p| p.elems.len() == len),
        "update_widened_in: lengths differ"
    );
    if parts.iter().all(|p| matches!(p.elems, StoredMut::Full(_))) {
        let slices = parts.each_mut().map(|p| match &mut p.elems {
            StoredMut::Full(s) => &mut **s,
            _ => unreachable!("checked above"),
        });
        f(slices, 0);
        return;
    }
    let keys = parts.each_ref().map(|p| p.key);
    let mut chunked = parts
        .each_mut()
        .map(|p| p.elems.reborrow().chunks(WIDEN_CHUNK).into_iter());
    let mut start = 0;
    while start < len {
        let mut cs = chunked
            .each_mut()
            .map(|it| it.next().expect("every part has as many chunks"));
        let n = cs[0].len();
        for (c, b) in cs.iter().zip(bufs.iter_mut()) {
            match c {
                StoredMut::Full(_) => {}
                StoredMut::BF16(h) => T::widen_half(h, &mut b[..n]),
                StoredMut::F16(h) => T::widen_half(h, &mut b[..n]),
            }
        }
        {
            let mut bi = bufs.iter_mut();
            let slices = cs.each_mut().map(|c| {
                let b = bi.next().expect("one buffer per part");
                match c {
                    StoredMut::Full(s) => &mut **s,
                    _ => &mut b[..n],
                }
            });
            f(slices, start);
        }
        for ((c, b), key) in cs.iter_mut().zip(bufs.iter()).zip(keys) {
            let sr = key.map(|k| (k, first.wrapping_add(start as u64)));
            match c {
                StoredMut::Full(_) => {}
                StoredMut::BF16(h) => T::narrow_half(&b[..n], h, sr),
                StoredMut::F16(h) => T::narrow_half(&b[..n], h, sr),
            }
        }
        start += n;
    }
}
