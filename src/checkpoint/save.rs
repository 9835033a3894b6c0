//! Writing a checkpoint: encoding the tensors and replacing the file
//! atomically.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::path::Path;

use ndarray::ArrayViewD;
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, View};

use super::{Element, TensorRef};
use crate::error::{Error, Result};
use crate::io::write_atomic;

/// The bytes of the length prefix that opens a safetensors file.
const N_LEN: usize = 8;

/// One tensor as `safetensors::serialize` wants it: dtype, shape and the
/// little-endian row-major bytes, borrowed when the array allows.
struct Encoded<'a> {
    dtype: Dtype,
    shape: &'a [usize],
    bytes: Cow<'a, [u8]>,
}

impl TensorRef<'_> {
    fn encode(&self) -> Encoded<'_> {
        match self {
            TensorRef::F32(a) => Encoded::new(a),
            TensorRef::F64(a) => Encoded::new(a),
            TensorRef::BF16(a) => Encoded::new(a),
            TensorRef::F16(a) => Encoded::new(a),
            TensorRef::I64(a) => Encoded::new(a),
            TensorRef::U64(a) => Encoded::new(a),
        }
    }
}

impl<'a> Encoded<'a> {
    fn new<A: Element>(a: &'a ArrayViewD<'_, A>) -> Self {
        Encoded {
            dtype: A::DTYPE,
            shape: a.shape(),
            bytes: le_bytes(a),
        }
    }
}

impl View for &Encoded<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// The array's elements as little-endian bytes in row-major order.
fn le_bytes<'a, A: Element>(a: &'a ArrayViewD<'_, A>) -> Cow<'a, [u8]> {
    #[cfg(target_endian = "little")]
    if let Some(s) = a.as_slice() {
        // SAFETY: `s` is a valid, initialised slice of `size_of_val(s)`
        // bytes; every `A` here (f32, f64, i64, u64) is plain old data with
        // no padding, so each of its bytes is an initialised `u8`; `u8` has
        // alignment 1; the returned slice borrows `a`, so it cannot outlive
        // the data. On a little-endian target these are exactly the
        // little-endian bytes the format asks for.
        let bytes = unsafe {
            std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s))
        };
        return Cow::Borrowed(bytes);
    }
    let mut out = Vec::with_capacity(a.len() * A::SIZE);
    for &x in a.iter() {
        x.put_le(&mut out);
    }
    Cow::Owned(out)
}

/// Writes `tensors` and the string `metadata` to the safetensors file
/// `path`, atomically (see the [module docs](crate::checkpoint)).
///
/// The file loads in PyTorch with `safetensors.torch.load_file`. An empty
/// `metadata` writes no `__metadata__` entry.
///
/// Equal inputs give byte-identical files: tensors are laid out by dtype,
/// then name (the crate's order), and metadata entries are sorted by key.
///
/// Errors: a name given twice, or the reserved name `__metadata__`, is a
/// [`Config`](crate::ErrorKind::Config) error naming the tensor; a folder
/// that is missing or unwritable, a full disk, … is an
/// [`Io`](crate::ErrorKind::Io) error naming `path`. In every error case an
/// existing file at `path` is left as it was.
///
/// ```
/// use std::collections::BTreeMap;
/// use ndarray::{array, Array1};
/// use splitgrad::checkpoint::{save, Checkpoint};
/// # fn main() -> splitgrad::Result<()> {
/// # let dir = std::env::temp_dir().join(format!("splitgrad-doc-save-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// let path = dir.join("model.safetensors");
/// let weight = array![[0.5f32, -1.0], [2.0, 0.0]];
/// let index = Array1::<i64>::from(vec![3, 1, 4]);
/// let meta = BTreeMap::from([("step".to_string(), "100".to_string())]);
/// save(&path, &[("lm_head.orig.weight", (&weight).into()), ("token_index", (&index).into())], &meta)?;
/// let ck = Checkpoint::open(&path)?;
/// assert_eq!(ck.names(), ["lm_head.orig.weight", "token_index"]);
/// assert_eq!(ck.get_real::<f32>("lm_head.orig.weight", &[2, 2])?, weight.into_dyn());
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(()) }
/// ```
pub fn save<S: AsRef<str>>(
    path: impl AsRef<Path>,
    tensors: &[(S, TensorRef<'_>)],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let path = path.as_ref();
    let mut seen = BTreeSet::new();
    for (name, _) in tensors {
        let name = name.as_ref();
        if name == "__metadata__" {
            let e = Error::config("the name `__metadata__` is reserved by the safetensors format");
            return Err(e.in_file(path).in_array(name));
        }
        if !seen.insert(name) {
            let e = Error::config("the tensor name is given twice");
            return Err(e.in_file(path).in_array(name));
        }
    }
    let encoded: Vec<(&str, Encoded<'_>)> = tensors
        .iter()
        .map(|(name, t)| (name.as_ref(), t.encode()))
        .collect();
    let info = if metadata.is_empty() {
        None
    } else {
        Some(
            metadata
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<HashMap<_, _>>(),
        )
    };
    // The prefix and header as the crate makes them, the tensors' bytes
    // streamed after them from where they are: no image of the whole file
    // in memory, nor room reserved for one (`safetensors::serialize`
    // reserves the file's size, which fails under an address-space limit).
    let order = in_file_order(&encoded);
    let mut offset = 0usize;
    let mut infos = Vec::with_capacity(order.len());
    for (name, e) in &order {
        let end = offset.checked_add(e.bytes.len()).ok_or_else(|| {
            Error::format("the tensors' bytes overflow a file's length").in_file(path)
        })?;
        infos.push((
            name.to_string(),
            TensorInfo {
                dtype: e.dtype,
                shape: e.shape.to_vec(),
                data_offsets: (offset, end),
            },
        ));
        offset = end;
    }
    let cannot =
        |e: &dyn std::fmt::Display| Error::format(format!("cannot serialise: {e}")).in_file(path);
    let metadata = Metadata::new(info, infos).map_err(|e| cannot(&e))?;
    let mut json = serde_json::to_string(&metadata)
        .map_err(|e| cannot(&e))?
        .into_bytes();
    // Padded with spaces to a multiple of 8 bytes, as the crate pads it.
    json.resize(json.len().next_multiple_of(N_LEN), b' ');
    if json.len() as u64 > super::load::MAX_HEADER {
        return Err(cannot(&format!(
            "a header of {} bytes, more than the {} safetensors reads",
            json.len(),
            super::load::MAX_HEADER
        )));
    }
    let mut header = Vec::with_capacity(N_LEN + json.len());
    header.extend((json.len() as u64).to_le_bytes());
    header.extend(json);
    sort_metadata(&mut header);
    write_atomic(path, |f| {
        f.write_all(&header)?;
        for (_, e) in order {
            f.write_all(&e.bytes)?;
        }
        Ok(())
    })
}

/// The tensors in the order the header lays out their bytes: by dtype,
/// the widest alignment first, then by name (`safetensors`' own order;
/// the unit test `streamed_files_equal_the_crates_image` holds the two
/// equal).
fn in_file_order<'e, 'a>(encoded: &'e [(&'a str, Encoded<'a>)]) -> Vec<&'e (&'a str, Encoded<'a>)> {
    let mut order: Vec<_> = encoded.iter().collect();
    order.sort_by(|(ln, l), (rn, r)| r.dtype.cmp(&l.dtype).then(ln.cmp(rn)));
    order
}

/// Puts the `__metadata__` entries of a serialised file in sorted order, so
/// that equal inputs give equal files.
///
/// `safetensors::serialize` takes the metadata as a `HashMap` and writes it
/// in that map's (randomly seeded) order, first in the compact JSON header:
/// `{"__metadata__":{"k":"v","k":"v"},…`. Reordering the entries keeps the
/// header's length, so only those bytes change. Anything unexpected leaves
/// the image as it is.
fn sort_metadata(image: &mut [u8]) {
    const OPEN: &[u8] = b"{\"__metadata__\":{";
    let start = N_LEN + OPEN.len();
    if image.get(N_LEN..start) != Some(OPEN) {
        return;
    }
    // The end of the JSON string opening at `i`, just past its closing quote.
    let string_end = |mut i: usize| -> Option<usize> {
        (image.get(i) == Some(&b'"')).then_some(())?;
        i += 1;
        loop {
            match image.get(i)? {
                b'\\' => i += 2,
                b'"' => return Some(i + 1),
                _ => i += 1,
            }
        }
    };
    let mut entries: Vec<&[u8]> = Vec::new();
    let mut i = start;
    let end = loop {
        let key_end = match string_end(i) {
            Some(k) if image.get(k) == Some(&b':') => k,
            _ => return,
        };
        let Some(value_end) = string_end(key_end + 1) else {
            return;
        };
        entries.push(&image[i..value_end]);
        match image.get(value_end) {
            Some(b',') => i = value_end + 1,
            Some(b'}') => break value_end,
            _ => return,
        }
    };
    entries.sort_unstable();
    let sorted = entries.join(&b","[..]);
    image[start..end].copy_from_slice(&sorted);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use crate::checkpoint::Checkpoint;
    use ndarray::array;
    use std::fs;

    #[test]
    fn streamed_files_equal_the_crates_image() {
        let dir = crate::checkpoint::test_dir("stream");
        let path = dir.join("model.safetensors");
        let f32s = array![[1.0f32, -2.0], [0.5, 8.0]];
        let f64s = array![3.0f64, 4.0, 5.0];
        let bf16s = array![half::bf16::from_f32(1.5), half::bf16::from_f32(-0.25)];
        let f16s = array![[half::f16::from_f32(2.0)]];
        let i64s = array![7i64, -1];
        let u64s = array![9u64];
        let strided = array![[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]];
        let strided = strided.t().to_owned();
        let row = f32s.row(0).to_owned();
        let tensors: Vec<(&str, TensorRef<'_>)> = vec![
            ("b.weight", (&f32s).into()),
            ("a.weight", (&bf16s).into()),
            ("z.half", (&f16s).into()),
            ("m.double", (&f64s).into()),
            ("index", (&i64s).into()),
            ("step", (&u64s).into()),
            ("a.transposed", (&strided).into()),
            ("c.weight", (&row).into()),
        ];
        let meta = BTreeMap::from([
            ("zeta".to_string(), "1".to_string()),
            ("alpha".to_string(), "2".to_string()),
            ("mid".to_string(), "x".to_string()),
        ]);
        save(&path, &tensors, &meta).unwrap();
        let encoded: Vec<(&str, Encoded<'_>)> =
            tensors.iter().map(|(n, t)| (*n, t.encode())).collect();
        let info: HashMap<String, String> = meta.clone().into_iter().collect();
        let mut image =
            safetensors::serialize(encoded.iter().map(|(n, e)| (*n, e)), Some(info)).unwrap();
        sort_metadata(&mut image);
        assert_eq!(fs::read(&path).unwrap(), image);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn failure_before_rename_keeps_old_file_and_removes_temp() {
        let dir = crate::checkpoint::test_dir("inject");
        let path = dir.join("model.safetensors");
        let old = array![1.0f32, 2.0];
        save(&path, &[("w", (&old).into())], &BTreeMap::new()).unwrap();
        let before = fs::read(&path).unwrap();

        crate::io::FAIL_BEFORE_RENAME.with(|f| f.set(true));
        let new = array![3.0f32, 4.0, 5.0];
        let err = save(&path, &[("w", (&new).into())], &BTreeMap::new()).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Io(_)));
        assert_eq!(err.file(), Some(path.as_path()));
        assert!(err.to_string().contains("injected failure before rename"));

        assert_eq!(fs::read(&path).unwrap(), before);
        let left: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["model.safetensors"]);
        // The hook fired once: the next save goes through.
        save(&path, &[("w", (&new).into())], &BTreeMap::new()).unwrap();
        let ck = Checkpoint::open(&path).unwrap();
        assert_eq!(ck.get_real::<f32>("w", &[3]).unwrap(), new.into_dyn());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn metadata_entries_are_sorted_in_place() {
        let header = br#"{"__metadata__":{"b\",}":"x\\","a":"{,}","c":""},"t":{}}"#;
        let mut image = (header.len() as u64).to_le_bytes().to_vec();
        image.extend_from_slice(header);
        image.extend_from_slice(b"DATA");
        sort_metadata(&mut image);
        let sorted = br#"{"__metadata__":{"a":"{,}","b\",}":"x\\","c":""},"t":{}}"#;
        assert_eq!(&image[8..8 + sorted.len()], sorted);
        assert_eq!(&image[8 + sorted.len()..], b"DATA");

        // Anything unexpected is left alone.
        for odd in [
            &br#"{"a":{}}"#[..],
            br#"{"__metadata__":{"a""#,
            br#"{"__metadata__":{"a":1}}"#,
        ] {
            let mut image = (odd.len() as u64).to_le_bytes().to_vec();
            image.extend_from_slice(odd);
            let before = image.clone();
            sort_metadata(&mut image);
            assert_eq!(image, before);
        }
    }

    #[test]
    fn strided_views_are_saved_row_major() {
        let a = array![[1i64, 2, 3], [4, 5, 6]];
        let t = a.t().into_dyn();
        let bytes = le_bytes(&t);
        let back: Vec<i64> = bytes.chunks_exact(8).map(i64::get_le).collect();
        assert_eq!(back, [1, 4, 2, 5, 3, 6]);
        assert!(
            matches!(le_bytes(&a.view().into_dyn()), Cow::Borrowed(_))
                == cfg!(target_endian = "little")
        );
    }
}
