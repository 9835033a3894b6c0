//! Reading a checkpoint: validating the file, then decoding tensors of
//! the dtype and shape the caller expects.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ndarray::{ArrayD, IxDyn};
use safetensors::tensor::Metadata;
use safetensors::{Dtype, SafeTensorError};

use super::{Element, TensorData};
use crate::error::{Error, ErrorKind, Result};
use crate::kernels::{Real, unravel};

/// The bytes of the length prefix that opens a safetensors file.
const N_LEN: usize = 8;

/// Where one tensor lies in a checkpoint file.
#[derive(Debug)]
struct Entry {
    dtype: Dtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// An opened safetensors checkpoint: its validated header and metadata,
/// and the file itself. Opening reads only the header; each tensor is read
/// from the file when it is asked for, checked against the dtype and shape
/// the caller expects, so that decoding a checkpoint holds the arrays
/// decoded so far and one tensor's bytes, never the whole file beside
/// them. The file stays open: a checkpoint replaced (renamed over) after
/// it was opened is still read as it was.
///
/// ```
/// use std::collections::BTreeMap;
/// use ndarray::Array2;
/// use splitgrad::checkpoint::{save, Checkpoint};
/// # fn main() -> splitgrad::Result<()> {
/// # let dir = std::env::temp_dir().join(format!("splitgrad-doc-ck-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// let path = dir.join("model.safetensors");
/// let rows = Array2::<f64>::zeros((3, 4));
/// save(&path, &[("split_vocabulary.rows", (&rows).into())], &BTreeMap::new())?;
/// let ck = Checkpoint::open(&path)?;
/// let err = ck.get_real::<f32>("split_vocabulary.rows", &[3, 4]).unwrap_err();
/// assert!(err.to_string().ends_with("array `split_vocabulary.rows`: has dtype F64, expected F32"));
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Checkpoint {
    path: PathBuf,
    /// The file, read at an entry's offsets (a lock, as a read is a seek
    /// and a read).
    file: Mutex<File>,
    entries: BTreeMap<String, Entry>,
    metadata: BTreeMap<String, String>,
}

/// The largest header safetensors 0.8 reads (its `MAX_HEADER_SIZE`).
pub(super) const MAX_HEADER: u64 = 100_000_000;

impl Checkpoint {
    /// Reads and validates the safetensors file at `path`.
    ///
    /// Errors (all naming `path`): [`ErrorKind::Io`] if it cannot be read;
    /// [`ErrorKind::Format`] if it is not a complete, consistent safetensors
    /// file (too short, a header that is not JSON, byte ranges that do not
    /// tile the data or that claim more bytes than the file has).
    ///
    /// ```
    /// use splitgrad::{checkpoint::Checkpoint, ErrorKind};
    /// # fn main() -> splitgrad::Result<()> {
    /// # let dir = std::env::temp_dir().join(format!("splitgrad-doc-open-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir)?;
    /// let path = dir.join("notes.txt");
    /// std::fs::write(&path, "not a checkpoint")?;
    /// let err = Checkpoint::open(&path).unwrap_err();
    /// assert!(matches!(err.kind(), ErrorKind::Format { .. }));
    /// assert_eq!(err.file(), Some(path.as_path()));
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok(()) }
    /// ```
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
        let path = path.as_ref();
        let mut file = crate::io::open_regular(path)?;
        let len = file
            .metadata()
            .map_err(|e| Error::from(e).in_file(path))?
            .len();
        let bad = |message: String| Error::format(message).in_file(path);
        let invalid = |e: SafeTensorError| bad(format!("not a valid safetensors file: {e}"));
        // The header, checked as `SafeTensors::read_metadata` checks it,
        // which needs the whole file in memory: the length prefix, the
        // header's bounds, UTF-8, the JSON and its tensors' byte ranges
        // (`Metadata`'s validation), and a data section of exactly the
        // length they describe.
        if len < N_LEN as u64 {
            return Err(invalid(SafeTensorError::HeaderTooSmall));
        }
        let mut prefix = [0u8; N_LEN];
        file.read_exact(&mut prefix)
            .map_err(|e| Error::from(e).in_file(path))?;
        let n = u64::from_le_bytes(prefix);
        if n > MAX_HEADER {
            return Err(invalid(SafeTensorError::HeaderTooLarge));
        }
        if n > len - N_LEN as u64 {
            return Err(invalid(SafeTensorError::InvalidHeaderLength));
        }
        let mut head = prefix.to_vec();
        head.resize(N_LEN + n as usize, 0);
        file.read_exact(&mut head[N_LEN..])
            .map_err(|e| Error::from(e).in_file(path))?;
        let text = std::str::from_utf8(&head[N_LEN..])
            .map_err(|e| invalid(SafeTensorError::InvalidHeader(e)))?;
        let header: Metadata = serde_json::from_str(text).map_err(|e| match diagnose(text) {
            Some((name, what)) => bad(format!(
                "not a valid safetensors file: tensor `{name}`: {what}"
            )),
            None => invalid(SafeTensorError::InvalidHeaderDeserialization(e)),
        })?;
        let tensors = header.tensors();
        // The validated ranges tile 0..data_len in offset order.
        let data_len = tensors
            .values()
            .map(|info| info.data_offsets.1)
            .max()
            .unwrap_or(0);
        // Every offset is at most data_len (the ranges tile it), so with
        // this sum checked no offset arithmetic below can overflow.
        match (data_len as u64).checked_add(N_LEN as u64 + n) {
            Some(end) if end == len => {}
            Some(_) => return Err(invalid(SafeTensorError::MetadataIncompleteBuffer)),
            None => {
                return Err(bad(
                    "not a safetensors file: a byte offset in the header is too large".into(),
                ));
            }
        }
        let base = N_LEN + n as usize;
        let entries = tensors
            .into_iter()
            .map(|(name, info)| {
                let (start, end) = info.data_offsets;
                let entry = Entry {
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start: base + start,
                    end: base + end,
                };
                (name, entry)
            })
            .collect();
        let metadata = header
            .metadata()
            .as_ref()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        Ok(Checkpoint {
            path: path.to_path_buf(),
            file: Mutex::new(file),
            entries,
            metadata,
        })
    }

    /// The elements of entry `e` (of tensor `name`), `size` bytes each,
    /// decoded by `read`: the vector is reserved once its bytes fit in
    /// memory, then filled from the file a block at a time, so that the
    /// raw bytes never take more than [`READ_BLOCK`] beside it.
    fn values<A>(
        &self,
        name: &str,
        e: &Entry,
        size: usize,
        read: impl Fn(&[u8]) -> A,
    ) -> Result<Vec<A>> {
        let bytes = (e.end - e.start) as u64;
        let too_large = || {
            self.err(
                name,
                ErrorKind::TooLarge {
                    what: "reading the tensor".to_string(),
                    bytes,
                    available: crate::io::memory_available(),
                    hint: String::new(),
                },
            )
        };
        crate::io::check_memory(|| "reading the tensor".to_string(), bytes, "")
            .map_err(|err| err.in_file(&self.path).in_array(name))?;
        let mut values = Vec::new();
        values
            .try_reserve_exact((e.end - e.start) / size)
            .map_err(|_| too_large())?;
        self.blocks(name, e, size, |block, _| {
            values.extend(block.chunks_exact(size).map(&read));
            true
        })?;
        Ok(values)
    }

    /// Reads entry `e` (of tensor `name`) from the file in blocks of at
    /// most [`READ_BLOCK`] bytes, whole elements of `size` bytes each, and
    /// hands each to `each` with the index of its first element; stops
    /// early where `each` returns false.
    fn blocks(
        &self,
        name: &str,
        e: &Entry,
        size: usize,
        mut each: impl FnMut(&[u8], usize) -> bool,
    ) -> Result<()> {
        let io = |err: std::io::Error| Error::from(err).in_file(&self.path).in_array(name);
        let block_len = (READ_BLOCK / size).max(1) * size;
        let mut block = vec![0u8; block_len.min(e.end - e.start)];
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.seek(SeekFrom::Start(e.start as u64)).map_err(io)?;
        let mut at = e.start;
        while at < e.end {
            let n = block_len.min(e.end - at);
            file.read_exact(&mut block[..n]).map_err(io)?;
            if !each(&block[..n], (at - e.start) / size) {
                break;
            }
            at += n;
        }
        Ok(())
    }
}

/// The most bytes of a tensor read from the file at once.
const READ_BLOCK: usize = 1 << 20;

/// The index of the first little-endian 16-bit element of `data` whose
/// bits under `exponent` are all set.
fn first_all_ones(data: &[u8], exponent: u16) -> Option<usize> {
    data.chunks_exact(2)
        .position(|b| u16::from_le_bytes([b[0], b[1]]) & exponent == exponent)
}

/// The first tensor (by name) of a header that does not deserialise whose
/// entry says why: an unknown dtype, a shape that is not a list of sizes
/// or whose bytes overflow, byte offsets that are not two increasing
/// numbers or do not span the shape's bytes. `None` when the header is not
/// a JSON object or no entry is at fault (then the JSON error says why).
fn diagnose(text: &str) -> Option<(String, String)> {
    let serde_json::Value::Object(map) = serde_json::from_str(text).ok()? else {
        return None;
    };
    map.iter()
        .filter(|(k, _)| *k != "__metadata__")
        .find_map(|(name, entry)| {
            let fault = |what: String| Some((name.clone(), what));
            // The dtypes safetensors names, as it reads them.
            let dtype = entry
                .get("dtype")
                .and_then(|d| serde_json::from_value::<Dtype>(d.clone()).ok());
            let Some(dtype) = dtype else {
                return fault(format!(
                    "dtype {}: not a safetensors dtype",
                    entry.get("dtype")?
                ));
            };
            let shape: Option<Vec<u64>> = entry
                .get("shape")
                .and_then(|s| s.as_array())
                .and_then(|s| s.iter().map(|d| d.as_u64()).collect());
            let Some(shape) = shape else {
                return fault(format!(
                    "shape {}: not a list of sizes",
                    entry.get("shape")?
                ));
            };
            let bits = shape
                .iter()
                .try_fold(dtype.bitsize() as u64, |a, &d| a.checked_mul(d));
            let Some(bytes) = bits.map(|b| b.div_ceil(8)) else {
                return fault(format!(
                    "shape {shape:?} of {dtype} is more bytes than a file can hold"
                ));
            };
            let offsets: Option<Vec<u64>> = entry
                .get("data_offsets")
                .and_then(|s| s.as_array())
                .and_then(|s| s.iter().map(|d| d.as_u64()).collect());
            match offsets.as_deref() {
                Some(&[a, b]) if b >= a && b - a == bytes => None,
                Some(&[a, b]) if b >= a => fault(format!(
                    "data_offsets [{a}, {b}] span {} bytes; shape {shape:?} of {dtype} is {bytes}",
                    b - a
                )),
                _ => fault(format!(
                    "data_offsets {}: not two increasing byte offsets",
                    entry.get("data_offsets")?
                )),
            }
        })
}

/// `(3, 4)`, `(5,)`, `()`: a shape as PyTorch prints it.
fn fmt_shape(shape: &[usize]) -> String {
    match shape {
        [d] => format!("({d},)"),
        _ => {
            let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
            format!("({})", parts.join(", "))
        }
    }
}

impl Checkpoint {
    /// The file this checkpoint was read from.
    ///
    /// ```
    /// # use std::collections::BTreeMap;
    /// # use splitgrad::checkpoint::{save, Checkpoint};
    /// # fn main() -> splitgrad::Result<()> {
    /// # let path = std::env::temp_dir().join(format!("splitgrad-doc-path-{}.safetensors", std::process::id()));
    /// save(&path, &[] as &[(&str, _)], &BTreeMap::new())?;
    /// assert_eq!(Checkpoint::open(&path)?.path(), path.as_path());
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tensor names, sorted.
    ///
    /// ```
    /// # use std::collections::BTreeMap;
    /// # use ndarray::arr0;
    /// # use splitgrad::checkpoint::{save, Checkpoint};
    /// # fn main() -> splitgrad::Result<()> {
    /// # let path = std::env::temp_dir().join(format!("splitgrad-doc-names-{}.safetensors", std::process::id()));
    /// let (b, a) = (arr0(1u64), arr0(2.0f32));
    /// save(&path, &[("b", (&b).into()), ("a", (&a).into())], &BTreeMap::new())?;
    /// assert_eq!(Checkpoint::open(&path)?.names(), ["a", "b"]);
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    pub fn names(&self) -> Vec<&str> {
        self.entries.keys().map(String::as_str).collect()
    }

    /// The string metadata stored with the tensors (empty if none).
    ///
    /// ```
    /// # use std::collections::BTreeMap;
    /// # use splitgrad::checkpoint::{save, Checkpoint};
    /// # fn main() -> splitgrad::Result<()> {
    /// # let path = std::env::temp_dir().join(format!("splitgrad-doc-meta-{}.safetensors", std::process::id()));
    /// let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    /// save(&path, &[] as &[(&str, _)], &meta)?;
    /// assert_eq!(Checkpoint::open(&path)?.metadata(), &meta);
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    fn entry(&self, name: &str) -> Result<&Entry> {
        self.entries
            .get(name)
            .ok_or_else(|| self.err(name, ErrorKind::Missing))
    }

    fn err(&self, name: &str, kind: ErrorKind) -> Error {
        Error::new(kind).in_file(&self.path).in_array(name)
    }

    /// The shape of tensor `name`, whatever its dtype; [`ErrorKind::Missing`]
    /// if there is none.
    ///
    /// ```
    /// # use std::collections::BTreeMap;
    /// # use ndarray::Array2;
    /// # use splitgrad::checkpoint::{save, Checkpoint};
    /// # fn main() -> splitgrad::Result<()> {
    /// # let path = std::env::temp_dir().join(format!("splitgrad-doc-shape-{}.safetensors", std::process::id()));
    /// let w = Array2::<f32>::zeros((0, 8));
    /// save(&path, &[("token_embedding.prompt.weight", (&w).into())], &BTreeMap::new())?;
    /// let ck = Checkpoint::open(&path)?;
    /// assert_eq!(ck.shape("token_embedding.prompt.weight")?, &[0, 8]);
    /// assert!(ck.shape("lm_head.prompt.weight").is_err());
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    pub fn shape(&self, name: &str) -> Result<&[usize]> {
        Ok(&self.entry(name)?.shape)
    }

    /// The dtype of tensor `name` as the header gives it;
    /// [`ErrorKind::Missing`] if there is none.
    ///
    /// ```
    /// # use std::collections::BTreeMap;
    /// # use ndarray::Array1;
    /// # use splitgrad::checkpoint::{save, Checkpoint};
    /// # fn main() -> splitgrad::Result<()> {
    /// # let path = std::env::temp_dir().join(format!("splitgrad-doc-dtype-{}.safetensors", std::process::id()));
    /// let w = Array1::<f64>::zeros(3);
    /// save(&path, &[("w", (&w).into())], &BTreeMap::new())?;
    /// assert_eq!(Checkpoint::open(&path)?.dtype("w")?, safetensors::Dtype::F64);
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    pub fn dtype(&self, name: &str) -> Result<Dtype> {
        Ok(self.entry(name)?.dtype)
    }

    /// Metadata value `key`, or an error naming the key and the file.
    pub fn meta(&self, key: &str) -> Result<&str> {
        super::snapshot::meta_in(&self.metadata, Some(&self.path), key)
    }

    /// [`Self::meta`], parsed; an error names the key, the value and the
    /// file.
    pub fn meta_parse<V: std::str::FromStr>(&self, key: &str) -> Result<V> {
        super::snapshot::meta_parse_in(&self.metadata, Some(&self.path), key)
    }

    /// Checks, from the header alone, that tensor `name` is of `dtype` and
    /// of `expected_shape`: [`ErrorKind::Missing`], [`ErrorKind::Dtype`]
    /// or [`ErrorKind::Shape`] as [`Self::get_real`] gives them.
    pub fn expect(&self, name: &str, dtype: Dtype, expected_shape: &[usize]) -> Result<()> {
        self.checked(name, dtype, expected_shape).map(|_| ())
    }

    /// An error about tensor `name` of this file: `kind`, naming both.
    pub fn error(&self, name: &str, kind: ErrorKind) -> Error {
        self.err(name, kind)
    }

    /// Checks that every name in `expected` is present and, if `strict`, that
    /// no other tensor is.
    ///
    /// Errors: the first absent name is [`ErrorKind::Missing`]; with
    /// `strict`, the first extra name (in sorted order) is
    /// [`ErrorKind::Format`]; both name the file and the tensor.
    ///
    /// ```
    /// # use std::collections::BTreeMap;
    /// # use ndarray::arr0;
    /// # use splitgrad::checkpoint::{save, Checkpoint};
    /// # fn main() -> splitgrad::Result<()> {
    /// # let path = std::env::temp_dir().join(format!("splitgrad-doc-expect-{}.safetensors", std::process::id()));
    /// let (x, step) = (arr0(0.5f64), arr0(7u64));
    /// save(&path, &[("x", (&x).into()), ("optim.step", (&step).into())], &BTreeMap::new())?;
    /// let ck = Checkpoint::open(&path)?;
    /// ck.expect_names(&["x"], false)?;
    /// let err = ck.expect_names(&["x"], true).unwrap_err();
    /// assert_eq!(err.array(), Some("optim.step"));
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    pub fn expect_names<S: AsRef<str>>(&self, expected: &[S], strict: bool) -> Result<()> {
        for name in expected {
            self.entry(name.as_ref())?;
        }
        if strict {
            let wanted: BTreeSet<&str> = expected.iter().map(AsRef::as_ref).collect();
            if let Some(extra) = self.entries.keys().find(|k| !wanted.contains(k.as_str())) {
                let kind = ErrorKind::Format {
                    message: "is not expected in this checkpoint".into(),
                };
                return Err(self.err(extra, kind));
            }
        }
        Ok(())
    }

    /// The entry of `name` if its dtype is `dtype` and its shape is
    /// `expected_shape`.
    fn checked(&self, name: &str, dtype: Dtype, expected_shape: &[usize]) -> Result<&Entry> {
        let e = self.entry(name)?;
        if e.dtype != dtype {
            let kind = ErrorKind::Dtype {
                expected: dtype.to_string(),
                found: e.dtype.to_string(),
            };
            return Err(self.err(name, kind));
        }
        if e.shape != expected_shape {
            let err = Error::shape("tensor", fmt_shape(expected_shape), &e.shape);
            return Err(err.in_file(&self.path).in_array(name));
        }
        Ok(e)
    }

    fn decode<A: Element>(
        &self,
        name: &str,
        expected_shape: &[usize],
        read: fn(&[u8]) -> A,
    ) -> Result<ArrayD<A>> {
        let e = self.checked(name, A::DTYPE, expected_shape)?;
        let values = self.values(name, e, A::SIZE, read)?;
        ArrayD::from_shape_vec(IxDyn(expected_shape), values).map_err(|e| {
            self.err(
                name,
                ErrorKind::Format {
                    message: e.to_string(),
                },
            )
        })
    }

    /// Tensor `name` as an array of `T` (`f32` or `f64`), bit for bit as
    /// saved.
    ///
    /// Errors, naming the file and the tensor: [`ErrorKind::Missing`];
    /// [`ErrorKind::Dtype`] if it is not stored as `T` (no conversion,
    /// not even `F32` → `f64`); [`ErrorKind::Shape`] if its shape is not
    /// `expected_shape`. Non-finite values are returned as they are: see
    /// [`Checkpoint::check_finite`].
    ///
    /// ```
    /// # use std::collections::BTreeMap;
    /// # use ndarray::Array2;
    /// # use splitgrad::{checkpoint::{save, Checkpoint}, ErrorKind};
    /// # fn main() -> splitgrad::Result<()> {
    /// # let path = std::env::temp_dir().join(format!("splitgrad-doc-real-{}.safetensors", std::process::id()));
    /// let w = Array2::from_shape_fn((3, 2), |(i, j)| (i * 2 + j) as f32 / 7.0);
    /// save(&path, &[("w", (&w).into())], &BTreeMap::new())?;
    /// let ck = Checkpoint::open(&path)?;
    /// assert_eq!(ck.get_real::<f32>("w", &[3, 2])?, w.into_dyn());
    /// let err = ck.get_real::<f32>("w", &[2, 3]).unwrap_err();
    /// assert!(matches!(err.kind(), ErrorKind::Shape { .. }));
    /// assert!(err.to_string().ends_with("array `w`: tensor has shape [3, 2], expected (2, 3)"));
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    pub fn get_real<T: Real>(&self, name: &str, expected_shape: &[usize]) -> Result<ArrayD<T>> {
        let dtype = if T::NAME == "f32" {
            Dtype::F32
        } else {
            Dtype::F64
        };
        let e = self.checked(name, dtype, expected_shape)?;
        let values = self.values(name, e, std::mem::size_of::<T>(), T::read_le)?;
        ArrayD::from_shape_vec(IxDyn(expected_shape), values).map_err(|e| {
            self.err(
                name,
                ErrorKind::Format {
                    message: e.to_string(),
                },
            )
        })
    }

    /// Tensor `name` as an `i64` array; errors as [`Checkpoint::get_real`].
    ///
    /// ```
    /// # use std::collections::BTreeMap;
    /// # use ndarray::Array1;
    /// # use splitgrad::checkpoint::{save, Checkpoint};
    /// # fn main() -> splitgrad::Result<()> {
    /// # let path = std::env::temp_dir().join(format!("splitgrad-doc-i64-{}.safetensors", std::process::id()));
    /// let idx = Array1::from(vec![-1i64, i64::MAX]);
    /// save(&path, &[("split_vocabulary.token_index", (&idx).into())], &BTreeMap::new())?;
    /// let ck = Checkpoint::open(&path)?;
    /// assert_eq!(ck.get_i64("split_vocabulary.token_index", &[2])?, idx.into_dyn());
    /// assert!(ck.get_u64("split_vocabulary.token_index", &[2]).is_err());
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    pub fn get_i64(&self, name: &str, expected_shape: &[usize]) -> Result<ArrayD<i64>> {
        self.decode(name, expected_shape, i64::get_le)
    }

    /// Tensor `name` as a `u64` array; errors as [`Checkpoint::get_real`].
    ///
    /// ```
    /// # use std::collections::BTreeMap;
    /// # use ndarray::arr0;
    /// # use splitgrad::checkpoint::{save, Checkpoint};
    /// # fn main() -> splitgrad::Result<()> {
    /// # let path = std::env::temp_dir().join(format!("splitgrad-doc-u64-{}.safetensors", std::process::id()));
    /// save(&path, &[("optim.step", (&arr0(u64::MAX)).into())], &BTreeMap::new())?;
    /// let step = Checkpoint::open(&path)?.get_u64("optim.step", &[])?;
    /// assert_eq!(step.first(), Some(&u64::MAX));
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    pub fn get_u64(&self, name: &str, expected_shape: &[usize]) -> Result<ArrayD<u64>> {
        self.decode(name, expected_shape, u64::get_le)
    }

    /// Tensor `name` in whichever of the six stored dtypes it has, any
    /// shape; [`ErrorKind::Dtype`] for another dtype (`I32`, `U8`, …).
    ///
    /// ```
    /// # use std::collections::BTreeMap;
    /// # use ndarray::Array1;
    /// # use splitgrad::checkpoint::{save, Checkpoint, TensorData};
    /// # fn main() -> splitgrad::Result<()> {
    /// # let path = std::env::temp_dir().join(format!("splitgrad-doc-get-{}.safetensors", std::process::id()));
    /// let lang = Array1::from(vec![0i64, 2, 1]);
    /// save(&path, &[("split_vocabulary.language_index", (&lang).into())], &BTreeMap::new())?;
    /// let t = Checkpoint::open(&path)?.get("split_vocabulary.language_index")?;
    /// assert_eq!(t, TensorData::I64(lang.into_dyn()));
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    pub fn get(&self, name: &str) -> Result<TensorData> {
        let e = self.entry(name)?;
        let shape = e.shape.as_slice();
        Ok(match e.dtype {
            Dtype::F32 => TensorData::F32(self.get_real(name, shape)?),
            Dtype::F64 => TensorData::F64(self.get_real(name, shape)?),
            Dtype::BF16 => TensorData::BF16(self.decode(name, shape, half::bf16::get_le)?),
            Dtype::F16 => TensorData::F16(self.decode(name, shape, half::f16::get_le)?),
            Dtype::I64 => TensorData::I64(self.get_i64(name, shape)?),
            Dtype::U64 => TensorData::U64(self.get_u64(name, shape)?),
            other => {
                let kind = ErrorKind::Dtype {
                    expected: "F32, F64, BF16, F16, I64 or U64".into(),
                    found: other.to_string(),
                };
                return Err(self.err(name, kind));
            }
        })
    }

    /// Checks that the real tensor `name` (`F32`, `F64`, `BF16` or `F16`) holds no NaN or
    /// infinity, without decoding it into an array.
    ///
    /// Errors: [`ErrorKind::NonFinite`] with the multi-index of the first
    /// non-finite element in row-major order; [`ErrorKind::Missing`];
    /// [`ErrorKind::Dtype`] if the tensor is not real. All name the file and
    /// the tensor.
    ///
    /// ```
    /// # use std::collections::BTreeMap;
    /// # use ndarray::array;
    /// # use splitgrad::{checkpoint::{save, Checkpoint}, ErrorKind};
    /// # fn main() -> splitgrad::Result<()> {
    /// # let path = std::env::temp_dir().join(format!("splitgrad-doc-finite-{}.safetensors", std::process::id()));
    /// let w = array![[0.0f32, 1.0], [f32::NAN, 2.0]];
    /// save(&path, &[("w", (&w).into())], &BTreeMap::new())?;
    /// let err = Checkpoint::open(&path)?.check_finite("w").unwrap_err();
    /// assert!(matches!(err.kind(), ErrorKind::NonFinite { position, .. } if position == &[1, 0]));
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    pub fn check_finite(&self, name: &str) -> Result<()> {
        let e = self.entry(name)?;
        // The first non-finite element of a block: its index there, and
        // its value.
        let scan: fn(&[u8]) -> Option<(usize, f64)> = match e.dtype {
            Dtype::F32 => |data| {
                data.chunks_exact(4)
                    .map(|b| f64::from(f32::get_le(b)))
                    .enumerate()
                    .find(|(_, x)| !x.is_finite())
            },
            Dtype::F64 => |data| {
                data.chunks_exact(8)
                    .map(f64::get_le)
                    .enumerate()
                    .find(|(_, x)| !x.is_finite())
            },
            // On the bits: a half value is not finite when its exponent
            // bits are all ones (only that one is widened, for the message).
            Dtype::BF16 => |data| {
                first_all_ones(data, 0x7F80)
                    .map(|i| (i, half::bf16::get_le(&data[2 * i..2 * i + 2]).to_f64()))
            },
            Dtype::F16 => |data| {
                first_all_ones(data, 0x7C00)
                    .map(|i| (i, half::f16::get_le(&data[2 * i..2 * i + 2]).to_f64()))
            },
            other => {
                let kind = ErrorKind::Dtype {
                    expected: "F32, F64, BF16 or F16".into(),
                    found: other.to_string(),
                };
                return Err(self.err(name, kind));
            }
        };
        let size = e.dtype.bitsize() / 8;
        let mut first_bad = None;
        self.blocks(name, e, size, |block, first| {
            first_bad = scan(block).map(|(i, v)| (first + i, v));
            first_bad.is_none()
        })?;
        match first_bad {
            None => Ok(()),
            Some((flat, value)) => {
                let position = unravel(flat, &e.shape);
                Err(self.err(name, ErrorKind::NonFinite { position, value }))
            }
        }
    }
}

#[cfg(test)]
mod tests;
