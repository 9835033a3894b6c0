//! Named state: tensors by name, and the trait every layer implements.
//!
//! A layer names its parameters with its checkpoint names
//! (`token_embedding.<split>.weight`, `lm_head.<split>.weight`,
//! `split_vocabulary.rows`, …; `docs/spec.md#2-layers`) and implements
//! [`Module`]: its parameters in a fixed order, the persistent tensors
//! that are not parameters (an index), and from them, with default
//! methods, [`Module::named_parameters`], [`Module::state_dict`] and
//! [`Module::load_state_dict`], as PyTorch's `nn.Module` has them. Saving,
//! loading and handing parameters to optimisers are functions of these
//! names, never of positions. A [`StateDict`] is the owned map from names
//! to tensors; [`crate::checkpoint`] writes and reads one as a safetensors
//! file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ndarray::ArrayViewD;

use crate::error::{Error, ErrorKind, Result};
use crate::kernels::real::{Real, RealArray, RealView};
use crate::kernels::unravel;
use crate::param::{Dtype as StoredDtype, Parameter, Stored, StoredView};

use ndarray::{Array, ArrayD, ArrayView, Dimension};
use safetensors::Dtype;

/// A little-endian element type of a stored tensor.
pub(crate) trait Element: Copy {
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
    half::bf16 => BF16, BF16;
    half::f16 => F16, F16;
    i64 => I64, I64;
    u64 => U64, U64;
}

/// An owned checkpoint array of one of the stored element types.
///
/// ```
/// use ndarray::{arr0, ArrayD, IxDyn};
/// use splitgrad::state::TensorData;
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
    /// `BF16` in the file.
    BF16(ArrayD<half::bf16>),
    /// `F16` in the file.
    F16(ArrayD<half::f16>),
    /// `I64` in the file.
    I64(ArrayD<i64>),
    /// `U64` in the file.
    U64(ArrayD<u64>),
}

/// A borrowed checkpoint array, what [`save`](crate::checkpoint::save)
/// takes: any `ndarray` view or array of `f32`, `f64`, `i64` or `u64`
/// converts into one with `.into()`.
///
/// ```
/// use ndarray::array;
/// use splitgrad::state::TensorRef;
/// let a = array![[1.0f64, 2.0], [3.0, 4.0]];
/// let r: TensorRef<'_> = a.t().into(); // any strides
/// assert_eq!(r.shape(), &[2, 2]);
/// assert_eq!(r.dtype(), "F64");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum TensorRef<'a> {
    /// Saved as `F32`.
    F32(ArrayViewD<'a, f32>),
    /// Saved as `F64`.
    F64(ArrayViewD<'a, f64>),
    /// Saved as `BF16`.
    BF16(ArrayViewD<'a, half::bf16>),
    /// Saved as `F16`.
    F16(ArrayViewD<'a, half::f16>),
    /// Saved as `I64`.
    I64(ArrayViewD<'a, i64>),
    /// Saved as `U64`.
    U64(ArrayViewD<'a, u64>),
}

/// A named owned array: one entry of a checkpoint.
///
/// ```
/// use ndarray::{ArrayD, IxDyn};
/// use splitgrad::state::{Tensor, TensorData};
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

    /// The `(name, view)` pair that [`save`](crate::checkpoint::save) takes.
    ///
    /// ```
    /// use std::collections::BTreeMap;
    /// use ndarray::{ArrayD, IxDyn};
    /// use splitgrad::checkpoint::{save, Checkpoint};
    /// use splitgrad::state::Tensor;
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
    /// use splitgrad::state::TensorData;
    /// let t = TensorData::from(ArrayD::<u64>::zeros(IxDyn(&[2])));
    /// assert_eq!(t.view().shape(), &[2]);
    /// ```
    pub fn view(&self) -> TensorRef<'_> {
        match self {
            TensorData::F32(a) => TensorRef::F32(a.view()),
            TensorData::F64(a) => TensorRef::F64(a.view()),
            TensorData::BF16(a) => TensorRef::BF16(a.view()),
            TensorData::F16(a) => TensorRef::F16(a.view()),
            TensorData::I64(a) => TensorRef::I64(a.view()),
            TensorData::U64(a) => TensorRef::U64(a.view()),
        }
    }

    /// The shape.
    ///
    /// ```
    /// use ndarray::{ArrayD, IxDyn};
    /// use splitgrad::state::TensorData;
    /// assert_eq!(TensorData::from(ArrayD::<f64>::zeros(IxDyn(&[]))).shape(), &[] as &[usize]);
    /// ```
    pub fn shape(&self) -> &[usize] {
        match self {
            TensorData::F32(a) => a.shape(),
            TensorData::F64(a) => a.shape(),
            TensorData::BF16(a) => a.shape(),
            TensorData::F16(a) => a.shape(),
            TensorData::I64(a) => a.shape(),
            TensorData::U64(a) => a.shape(),
        }
    }

    /// The safetensors dtype name: `"F32"`, `"F64"`, `"I64"` or `"U64"`.
    ///
    /// ```
    /// use ndarray::{ArrayD, IxDyn};
    /// use splitgrad::state::TensorData;
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
    /// use splitgrad::state::TensorRef;
    /// let a = Array3::<f32>::zeros((2, 0, 5));
    /// assert_eq!(TensorRef::from(&a).shape(), &[2, 0, 5]);
    /// ```
    pub fn shape(&self) -> &[usize] {
        match self {
            TensorRef::F32(a) => a.shape(),
            TensorRef::F64(a) => a.shape(),
            TensorRef::BF16(a) => a.shape(),
            TensorRef::F16(a) => a.shape(),
            TensorRef::I64(a) => a.shape(),
            TensorRef::U64(a) => a.shape(),
        }
    }

    /// The safetensors dtype name: `"F32"`, `"F64"`, `"I64"` or `"U64"`.
    ///
    /// ```
    /// use ndarray::Array1;
    /// use splitgrad::state::TensorRef;
    /// assert_eq!(TensorRef::from(&Array1::<u64>::zeros(3)).dtype(), "U64");
    /// ```
    pub fn dtype(&self) -> &'static str {
        match self {
            TensorRef::F32(_) => "F32",
            TensorRef::F64(_) => "F64",
            TensorRef::BF16(_) => "BF16",
            TensorRef::F16(_) => "F16",
            TensorRef::I64(_) => "I64",
            TensorRef::U64(_) => "U64",
        }
    }

    /// The multi-index and value of the first NaN or infinity, in the
    /// array's logical order (integers have none).
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::state::TensorRef;
    /// let a = array![[1.0f32, 2.0], [f32::NAN, f32::INFINITY]];
    /// let (at, value) = TensorRef::from(&a).first_non_finite().unwrap();
    /// assert_eq!(at, vec![1, 0]);
    /// assert!(value.is_nan());
    /// ```
    pub fn first_non_finite(&self) -> Option<(Vec<usize>, f64)> {
        use crate::io::first_non_finite;
        match self {
            TensorRef::F32(a) => first_non_finite(a.view()),
            TensorRef::F64(a) => first_non_finite(a.view()),
            TensorRef::BF16(a) => first_non_finite_half(a),
            TensorRef::F16(a) => first_non_finite_half(a),
            TensorRef::I64(_) | TensorRef::U64(_) => None,
        }
    }
}

/// [`TensorRef::first_non_finite`] of a half-precision array.
fn first_non_finite_half<H: crate::kernels::HalfFloat + Into<f64>>(
    a: &ArrayViewD<'_, H>,
) -> Option<(Vec<usize>, f64)> {
    let a = a.as_standard_layout();
    let flat = a.as_slice().expect("standard layout is contiguous");
    let i = crate::kernels::half::first_non_finite(flat)?;
    Some((unravel(i, a.shape()), flat[i].into()))
}

impl TensorData {
    /// An owned real array as the dtype it is.
    pub fn from_real<T: Real>(a: ArrayD<T>) -> Self {
        match T::into_real_array(a) {
            RealArray::F32(a) => TensorData::F32(a),
            RealArray::F64(a) => TensorData::F64(a),
        }
    }

    /// A view of the array as `T`, if it is stored as `T`.
    pub fn as_real<T: Real>(&self) -> Option<ArrayViewD<'_, T>> {
        match self {
            TensorData::F32(a) => T::from_real_view(RealView::F32(a.view())),
            TensorData::F64(a) => T::from_real_view(RealView::F64(a.view())),
            _ => None,
        }
    }
}

impl<'a> TensorRef<'a> {
    /// A view of a real array as the dtype it is.
    pub fn from_real<T: Real>(a: ArrayViewD<'a, T>) -> Self {
        match T::real_view(a) {
            RealView::F32(a) => TensorRef::F32(a),
            RealView::F64(a) => TensorRef::F64(a),
        }
    }

    /// A view of a parameter's value as it is kept.
    pub fn from_stored<T: Real>(a: StoredView<'a, T>) -> Self {
        match a {
            StoredView::Full(a) => Self::from_real(a),
            StoredView::BF16(a) => TensorRef::BF16(a),
            StoredView::F16(a) => TensorRef::F16(a),
        }
    }

    /// The same view, borrowed for a shorter time (views are invariant in
    /// their lifetime, so views of different lifetimes meet this way).
    pub fn reborrow(&self) -> TensorRef<'_> {
        match self {
            TensorRef::F32(a) => TensorRef::F32(a.view()),
            TensorRef::F64(a) => TensorRef::F64(a.view()),
            TensorRef::BF16(a) => TensorRef::BF16(a.view()),
            TensorRef::F16(a) => TensorRef::F16(a.view()),
            TensorRef::I64(a) => TensorRef::I64(a.view()),
            TensorRef::U64(a) => TensorRef::U64(a.view()),
        }
    }

    /// An owned copy.
    pub fn to_owned(&self) -> TensorData {
        match self {
            TensorRef::F32(a) => TensorData::F32(a.to_owned()),
            TensorRef::F64(a) => TensorData::F64(a.to_owned()),
            TensorRef::BF16(a) => TensorData::BF16(a.to_owned()),
            TensorRef::F16(a) => TensorData::F16(a.to_owned()),
            TensorRef::I64(a) => TensorData::I64(a.to_owned()),
            TensorRef::U64(a) => TensorData::U64(a.to_owned()),
        }
    }
}

fn fmt_shape(shape: &[usize]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    if parts.len() == 1 {
        format!("({},)", parts[0])
    } else {
        format!("({})", parts.join(", "))
    }
}

/// Named tensors: the state of one module, of several, or of a whole
/// training run (weights, optimiser state, history), in name order.
///
/// Reading a tensor back checks it: [`StateDict::real`] gives a view only
/// in the dtype and shape asked for, and only if every element is finite;
/// every error names the tensor and, for a state read from a file, the
/// file.
///
/// ```
/// use ndarray::array;
/// use splitgrad::state::{StateDict, TensorData};
/// let mut sd = StateDict::new();
/// sd.insert("lm_head.orig.weight", TensorData::from_real(array![[1.0f32, 2.0]].into_dyn()));
/// assert_eq!(sd.real::<f32>("lm_head.orig.weight", &[1, 2])?, array![[1.0f32, 2.0]].into_dyn());
/// let err = sd.real::<f64>("lm_head.orig.weight", &[1, 2]).unwrap_err();
/// assert_eq!(err.to_string(), "array `lm_head.orig.weight`: has dtype F32, expected F64");
/// # Ok::<(), splitgrad::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StateDict {
    tensors: BTreeMap<String, TensorData>,
    source: Option<PathBuf>,
}

impl StateDict {
    /// An empty state.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty state whose errors name `path` (the file it is read from).
    pub fn from_file(path: impl AsRef<Path>) -> Self {
        StateDict {
            tensors: BTreeMap::new(),
            source: Some(path.as_ref().to_path_buf()),
        }
    }

    /// The file this state was read from, if any.
    pub fn source(&self) -> Option<&Path> {
        self.source.as_deref()
    }

    /// Adds (or replaces) a tensor.
    pub fn insert(&mut self, name: impl Into<String>, data: TensorData) {
        self.tensors.insert(name.into(), data);
    }

    /// Moves every tensor of `other` in, names prefixed with `prefix`.
    pub fn extend_prefixed(&mut self, prefix: &str, other: StateDict) {
        for (name, t) in other.tensors {
            self.tensors.insert(format!("{prefix}{name}"), t);
        }
    }

    /// The tensors whose names start with `prefix`, with the prefix cut.
    pub fn prefixed(&self, prefix: &str) -> StateDict {
        StateDict {
            tensors: self
                .tensors
                .iter()
                .filter_map(|(n, t)| n.strip_prefix(prefix).map(|r| (r.to_string(), t.clone())))
                .collect(),
            source: self.source.clone(),
        }
    }

    /// A tensor by name.
    pub fn get(&self, name: &str) -> Option<&TensorData> {
        self.tensors.get(name)
    }

    /// Removes and returns a tensor.
    pub fn remove(&mut self, name: &str) -> Option<TensorData> {
        self.tensors.remove(name)
    }

    /// Whether a tensor of this name is present.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// (name, tensor), sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &TensorData)> {
        self.tensors.iter().map(|(n, t)| (n.as_str(), t))
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether there is no tensor.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// An error about tensor `name`, naming the source file.
    pub fn error(&self, name: &str, kind: ErrorKind) -> Error {
        self.locate(Error::new(kind), name)
    }

    /// Names tensor `name` and the source file in `e` (where it names
    /// neither yet).
    pub fn locate(&self, e: Error, name: &str) -> Error {
        let e = e.in_array(name);
        match &self.source {
            Some(p) => e.in_file(p),
            None => e,
        }
    }

    fn present(&self, name: &str) -> Result<&TensorData> {
        self.tensors
            .get(name)
            .ok_or_else(|| self.error(name, ErrorKind::Missing))
    }

    fn check_shape(&self, name: &str, found: &[usize], expected: &[usize]) -> Result<()> {
        if found == expected {
            return Ok(());
        }
        let e = Error::shape("tensor", fmt_shape(expected), found).in_array(name);
        Err(match &self.source {
            Some(p) => e.in_file(p),
            None => e,
        })
    }

    /// Real tensor `name` as `T` of shape `shape`, every element finite.
    ///
    /// Errors, naming the tensor (and the file): [`ErrorKind::Missing`];
    /// [`ErrorKind::Dtype`] when it is stored as another type (no
    /// conversion); [`ErrorKind::Shape`]; [`ErrorKind::NonFinite`] with the
    /// position of the first NaN or infinity.
    pub fn real<T: Real>(&self, name: &str, shape: &[usize]) -> Result<ArrayViewD<'_, T>> {
        let t = self.present(name)?;
        let Some(a) = t.as_real::<T>() else {
            return Err(self.error(
                name,
                ErrorKind::Dtype {
                    expected: T::NAME.to_uppercase(),
                    found: t.dtype().to_string(),
                },
            ));
        };
        self.check_shape(name, a.shape(), shape)?;
        crate::io::check_finite(a.view(), name).map_err(|e| match &self.source {
            Some(p) => e.in_file(p),
            None => e,
        })?;
        Ok(a)
    }

    /// Tensor `name` as a parameter kept as `dtype` holds it (`T` itself,
    /// `BF16` or `F16`), of shape `shape`, every element finite; errors as
    /// [`StateDict::real`] (no conversion: a bf16 parameter loads `BF16`).
    pub fn stored<T: Real>(
        &self,
        name: &str,
        shape: &[usize],
        dtype: StoredDtype,
    ) -> Result<StoredView<'_, T>> {
        let t = self.present(name)?;
        let view = match (dtype, t) {
            (StoredDtype::BF16, TensorData::BF16(a)) => StoredView::BF16(a.view()),
            (StoredDtype::F16, TensorData::F16(a)) => StoredView::F16(a.view()),
            (d, _) if !d.is_half() => return self.real::<T>(name, shape).map(StoredView::Full),
            (d, t) => {
                return Err(self.error(
                    name,
                    ErrorKind::Dtype {
                        expected: d.safetensors().into(),
                        found: t.dtype().to_string(),
                    },
                ));
            }
        };
        self.check_shape(name, view.shape(), shape)?;
        let bad = match &view {
            StoredView::BF16(a) => first_non_finite_half(a),
            StoredView::F16(a) => first_non_finite_half(a),
            StoredView::Full(_) => None,
        };
        if let Some((position, value)) = bad {
            let e = Error::new(ErrorKind::NonFinite { position, value }).in_array(name);
            return Err(match &self.source {
                Some(p) => e.in_file(p),
                None => e,
            });
        }
        Ok(view)
    }

    /// Integer tensor `name` (`I64`) of shape `shape`; errors as
    /// [`StateDict::real`].
    pub fn i64s(&self, name: &str, shape: &[usize]) -> Result<ArrayViewD<'_, i64>> {
        match self.present(name)? {
            TensorData::I64(a) => {
                self.check_shape(name, a.shape(), shape)?;
                Ok(a.view())
            }
            other => Err(self.error(
                name,
                ErrorKind::Dtype {
                    expected: "I64".into(),
                    found: other.dtype().to_string(),
                },
            )),
        }
    }

    /// A step count: the `U64` 0-d tensor `name`.
    pub fn step(&self, name: &str) -> Result<u64> {
        match self.present(name)? {
            TensorData::U64(a) => {
                self.check_shape(name, a.shape(), &[])?;
                Ok(a.iter().next().copied().unwrap_or(0))
            }
            other => Err(self.error(
                name,
                ErrorKind::Dtype {
                    expected: "U64".into(),
                    found: other.dtype().to_string(),
                },
            )),
        }
    }
}

/// A layer (or a model of layers): named parameters and persistent
/// buffers, and from them its state.
///
/// Implement [`Module::parameters`], [`Module::parameters_mut`] and, when
/// the module has persistent tensors that are not parameters,
/// [`Module::buffers`]; the rest follows.
///
/// ```
/// use splitgrad::layers::SplitTokenEmbeddings;
/// use splitgrad::state::Module;
/// use splitgrad::Rng;
/// let mut a = SplitTokenEmbeddings::<f32>::new(&[("orig", 6), ("prompt", 2)], &["orig", "prompt"], 4)?;
/// a.reset_parameters(&mut Rng::new(0));
/// let names: Vec<&str> = a.named_parameters().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["token_embedding.orig.weight", "token_embedding.prompt.weight"]);
/// let mut b = SplitTokenEmbeddings::<f32>::new(&[("orig", 6), ("prompt", 2)], &["orig", "prompt"], 4)?;
/// b.load_state_dict(&a.state_dict())?;
/// assert_eq!(b.state_dict(), a.state_dict());
/// # Ok::<(), splitgrad::Error>(())
/// ```
pub trait Module<T: Real> {
    /// Every parameter, in a fixed order.
    fn parameters(&self) -> Vec<&Parameter<T>>;

    /// Every parameter, to change in place, in the order of
    /// [`Module::parameters`].
    fn parameters_mut(&mut self) -> Vec<&mut Parameter<T>>;

    /// The persistent tensors that are not parameters (a split
    /// vocabulary's index), by name. None by default.
    fn buffers(&self) -> Vec<(String, TensorRef<'_>)> {
        Vec::new()
    }

    /// Keeps every parameter as `dtype` from now on (rounded to nearest
    /// when narrowed): `bf16` or `f16` (the math stays in `T`), or `T`'s
    /// own to widen back. An error for another dtype, and nothing changes.
    ///
    /// ```
    /// use splitgrad::layers::SplitTokenEmbeddings;
    /// use splitgrad::param::Dtype;
    /// use splitgrad::state::Module;
    /// let mut e = SplitTokenEmbeddings::<f32>::new(&[("orig", 6), ("prompt", 2)], &["orig", "prompt"], 4)?;
    /// assert_eq!(e.parameter_bytes(), 8 * 4 * 4);
    /// e.set_dtype(Dtype::BF16)?;
    /// assert_eq!(e.parameter_bytes(), 8 * 4 * 2);
    /// assert_eq!(e.state_dict().get("token_embedding.prompt.weight").unwrap().dtype(), "BF16");
    /// assert!(e.set_dtype(Dtype::F64).is_err());
    /// # Ok::<(), splitgrad::Error>(())
    /// ```
    fn set_dtype(&mut self, dtype: StoredDtype) -> Result<()> {
        if !dtype.is_half() && dtype != StoredDtype::of::<T>() {
            return Err(Error::config(format!(
                "a {} module keeps its parameters as {} or in bf16 or f16, not {dtype}",
                T::NAME,
                T::NAME
            )));
        }
        for p in self.parameters_mut() {
            p.set_dtype(dtype)?;
        }
        Ok(())
    }

    /// The bytes the parameters' values take, as they are kept.
    fn parameter_bytes(&self) -> u64 {
        self.parameters().iter().map(|p| p.nbytes()).sum()
    }

    /// (name, parameter), in the order of [`Module::parameters`].
    fn named_parameters(&self) -> Vec<(&str, &Parameter<T>)> {
        self.parameters()
            .into_iter()
            .map(|p| (p.name(), p))
            .collect()
    }

    /// Every tensor of the state, borrowed: the parameters, then the
    /// buffers.
    fn state_refs(&self) -> Vec<(String, TensorRef<'_>)> {
        let mut out: Vec<(String, TensorRef<'_>)> = self
            .parameters()
            .into_iter()
            .map(|p| {
                (
                    p.name().to_string(),
                    TensorRef::from_stored(p.stored().view()),
                )
            })
            .collect();
        out.extend(self.buffers());
        out
    }

    /// The state, copied: every parameter and buffer by name.
    fn state_dict(&self) -> StateDict {
        let mut sd = StateDict::new();
        for (name, t) in self.state_refs() {
            sd.insert(name, t.to_owned());
        }
        sd
    }

    /// Checks that `state` holds every tensor of this module: each
    /// parameter by name in this module's dtype and shape with every
    /// element finite, each buffer equal to this module's (an index must be
    /// the same one). Names of `state` that belong to no tensor of this
    /// module are ignored (a checkpoint holds several modules).
    fn check_state_dict(&self, state: &StateDict) -> Result<()> {
        for (name, ours) in self.buffers() {
            let theirs = state
                .get(&name)
                .ok_or_else(|| state.error(&name, ErrorKind::Missing))?;
            if theirs.view() != ours {
                return Err(state.error(
                    &name,
                    ErrorKind::Config {
                        message: "differs from this module's (a state of another index)".into(),
                    },
                ));
            }
        }
        for p in self.parameters() {
            state.stored::<T>(p.name(), p.shape(), p.dtype())?;
        }
        Ok(())
    }

    /// Loads every parameter from `state` by name after
    /// [`Module::check_state_dict`]; on an error nothing is changed.
    fn load_state_dict(&mut self, state: &StateDict) -> Result<()> {
        self.check_state_dict(state)?;
        for p in self.parameters_mut() {
            let (shape, dtype) = (p.shape().to_vec(), p.dtype());
            match (state.stored::<T>(p.name(), &shape, dtype)?, p.stored_mut()) {
                (StoredView::Full(v), Stored::Full(a)) => a.assign(&v),
                (StoredView::BF16(v), Stored::BF16(a)) => a.assign(&v),
                (StoredView::F16(v), Stored::F16(a)) => a.assign(&v),
                _ => unreachable!("`stored` checked the dtype"),
            }
        }
        Ok(())
    }
}
