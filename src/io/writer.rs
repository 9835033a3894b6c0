//! Writing `.npz` archives: [`NpzWriter`].

use std::io::{Seek, Write};
use std::path::{Path, PathBuf};

use ndarray::{ArrayBase, Data, Dimension, arr0};
use npyz::zip::write::FileOptions;
use npyz::zip::{CompressionMethod, DateTime, ZipWriter};

use super::npz::zip_error;
use super::write_atomic;
use crate::Result;

mod sealed {
    pub trait Sealed {}
    impl Sealed for i64 {}
    impl Sealed for u8 {}
    impl Sealed for u16 {}
    impl Sealed for u32 {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for f64 {}
}

/// An element type [`NpzWriter`] stores: `i64`, `u8`, `u16`, `u32`,
/// `half::f16`, `f32` or `f64`. (numpy has no bfloat16: bf16 values are
/// stored as the `u16` of their bits.)
///
/// ```
/// use splitgrad::io::NpyElement;
/// assert_eq!(<i64 as NpyElement>::DESCR, "<i8");
/// assert_eq!(<u8 as NpyElement>::DESCR, "|u1");
/// ```
pub trait NpyElement: Copy + sealed::Sealed {
    /// numpy's `descr` for the type, little-endian: `<i8`, `|u1`, `<u2`,
    /// `<u4`, `<f2`, `<f4`, `<f8`.
    const DESCR: &'static str;
    /// Appends the little-endian bytes of `self`.
    fn put(self, out: &mut Vec<u8>);
}

macro_rules! impl_element {
    ($t:ty, $descr:literal) => {
        impl NpyElement for $t {
            const DESCR: &'static str = $descr;
            #[inline]
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    };
}

impl_element!(i64, "<i8");
impl_element!(u8, "|u1");
impl_element!(u16, "<u2");
impl_element!(u32, "<u4");
impl_element!(half::f16, "<f2");
impl_element!(f32, "<f4");
impl_element!(f64, "<f8");

/// An `.npy` v1.0 header exactly as numpy writes it: the dict literal,
/// padded with spaces and a newline to a multiple of 64 bytes.
fn npy_header(descr: &str, shape: &[usize]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // Magic (6), version (2), length (2 for v1.0, 4 for v2.0), text, '\n'.
    let (version, pre) = if dict.len() + 11 + 63 <= u16::MAX as usize {
        (1u8, 10)
    } else {
        (2u8, 12)
    };
    let padded = (pre + dict.len() + 1).div_ceil(64) * 64;
    let text_len = padded - pre;
    let mut out = Vec::with_capacity(padded);
    out.extend_from_slice(b"\x93NUMPY");
    out.extend_from_slice(&[version, 0]);
    if version == 1 {
        out.extend_from_slice(&(text_len as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(text_len as u32).to_le_bytes());
    }
    out.extend_from_slice(dict.as_bytes());
    out.resize(padded - 1, b' ');
    out.push(b'\n');
    out
}

/// Collects named arrays and writes them as one `.npz` file that
/// `numpy.load` reads: uncompressed `.npy` v1.0 members, as `numpy.savez`
/// writes them, with a fixed timestamp so the same arrays give the same
/// bytes.
///
/// [`finish`](Self::finish) replaces the target file atomically (see
/// [`write_atomic`]). Arrays given to [`add`](Self::add) are encoded when
/// added, in logical (row-major) order whatever their memory layout; 0-d
/// arrays become numpy scalars (shape `()`). Slices and columns
/// ([`add_slice`](Self::add_slice), [`add_column`](Self::add_column)) are
/// borrowed instead, for as long as the writer lives, and encoded a block
/// at a time as the archive is written: a large one is never held twice.
///
/// ```
/// # fn main() -> splitgrad::Result<()> {
/// use ndarray::{arr1, Array2};
/// use splitgrad::io::{NpzReader, NpzWriter};
/// let path = std::env::temp_dir().join(format!("splitgrad-doc-writer-{}.npz", std::process::id()));
/// let mut w = NpzWriter::new(&path);
/// w.add("weight", &Array2::<f32>::eye(2))
///     .add("ids", &arr1(&[4i64, 5]))
///     .add_scalar("vocab_size", 32000i64);
/// w.finish()?;
/// let mut r = NpzReader::open(&path)?;
/// assert_eq!(r.names(), ["ids", "vocab_size", "weight"]);
/// assert_eq!(r.shape("vocab_size")?, Vec::<usize>::new());
/// assert_eq!(r.reals::<f64>("weight")?[[1, 1]], 1.0);
/// # std::fs::remove_file(&path)?;
/// # Ok(()) }
/// ```
pub struct NpzWriter<'a> {
    path: PathBuf,
    members: Vec<(String, Member<'a>)>,
    deflate: bool,
}

/// Writes a streamed member's values to the archive.
type WriteValues<'a> = Box<dyn Fn(&mut dyn Write) -> std::io::Result<()> + 'a>;

/// A member of the archive: its `.npy` bytes encoded when added, or its
/// header and a borrowed slice encoded a block at a time as the archive is
/// written ([`NpzWriter::add_slice`]), never whole.
enum Member<'a> {
    Encoded(Vec<u8>),
    Streamed {
        header: Vec<u8>,
        /// Bytes of the values, after the header.
        len: u64,
        values: WriteValues<'a>,
    },
}

impl Member<'_> {
    /// Bytes of the `.npy` member: header and values.
    fn len(&self) -> u64 {
        match self {
            Member::Encoded(bytes) => bytes.len() as u64,
            Member::Streamed { header, len, .. } => header.len() as u64 + len,
        }
    }
}

impl std::fmt::Debug for NpzWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let members: Vec<(&str, u64)> = self
            .members
            .iter()
            .map(|(name, m)| (name.as_str(), m.len()))
            .collect();
        f.debug_struct("NpzWriter")
            .field("path", &self.path)
            .field("members (name, bytes)", &members)
            .field("deflate", &self.deflate)
            .finish()
    }
}

/// Bytes of values a streamed member encodes and writes at a time.
const BLOCK_BYTES: usize = 1 << 20;

impl<'a> NpzWriter<'a> {
    /// A writer that [`finish`](Self::finish) will write to `path`. Nothing
    /// is touched until then.
    pub fn new(path: impl AsRef<Path>) -> Self {
        NpzWriter {
            path: path.as_ref().to_path_buf(),
            members: Vec::new(),
            deflate: false,
        }
    }

    /// Compresses every member with deflate (as `numpy.savez_compressed`)
    /// when `yes`; members are stored uncompressed by default (as
    /// `numpy.savez`), which reads fastest.
    ///
    /// ```
    /// # fn main() -> splitgrad::Result<()> {
    /// use splitgrad::io::{NpzReader, NpzWriter};
    /// let mut w = NpzWriter::new("unused.npz");
    /// w.deflate(true).add("zeros", &ndarray::Array1::<u16>::zeros(10_000));
    /// let mut bytes = std::io::Cursor::new(Vec::new());
    /// w.write_to(&mut bytes)?;
    /// assert!(bytes.get_ref().len() < 1000);
    /// let mut r = NpzReader::from_bytes("memory", bytes.into_inner())?;
    /// assert_eq!(r.ints_1d("zeros")?, vec![0; 10_000]);
    /// # Ok(()) }
    /// ```
    pub fn deflate(&mut self, yes: bool) -> &mut Self {
        self.deflate = yes;
        self
    }

    /// Adds the values of `column` as a 1-D array `name` of its width
    /// (`uint8`, `uint16` or `uint32`), borrowed and encoded as the
    /// archive is written ([`add_slice`](Self::add_slice)).
    ///
    /// **Panics** if an array called `name` was already added.
    #[track_caller]
    pub fn add_column(&mut self, name: &str, column: &'a super::Column) -> &mut Self {
        if let Some(v) = column.as_u8() {
            self.add_slice(name, v)
        } else if let Some(v) = column.as_u16() {
            self.add_slice(name, v)
        } else {
            self.add_slice(name, column.as_u32().unwrap_or_default())
        }
    }

    /// Adds `values` as the 1-D array `name`, borrowed: its bytes are
    /// encoded a block at a time (1 MiB) as the archive is written, so
    /// writing a large array (a corpus's token ids) holds no second copy
    /// of it. The archive's bytes are those [`add`](Self::add) gives.
    ///
    /// **Panics** if an array called `name` was already added.
    ///
    /// ```
    /// # fn main() -> splitgrad::Result<()> {
    /// use splitgrad::io::{NpzReader, NpzWriter};
    /// let ids: Vec<u32> = (0..300_000).collect();
    /// let mut w = NpzWriter::new("unused.npz");
    /// w.add_slice("ids", &ids);
    /// let mut bytes = std::io::Cursor::new(Vec::new());
    /// w.write_to(&mut bytes)?;
    /// let mut r = NpzReader::from_bytes("memory", bytes.into_inner())?;
    /// assert_eq!(r.ints_1d("ids")?[299_999], 299_999);
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn add_slice<A: NpyElement>(&mut self, name: &str, values: &'a [A]) -> &mut Self {
        self.check_new(name);
        let size = std::mem::size_of::<A>();
        let write = move |out: &mut dyn Write| -> std::io::Result<()> {
            let mut block = Vec::with_capacity(BLOCK_BYTES.min(std::mem::size_of_val(values)));
            for chunk in values.chunks((BLOCK_BYTES / size).max(1)) {
                block.clear();
                for &x in chunk {
                    x.put(&mut block);
                }
                out.write_all(&block)?;
            }
            Ok(())
        };
        self.members.push((
            name.to_string(),
            Member::Streamed {
                header: npy_header(A::DESCR, &[values.len()]),
                len: std::mem::size_of_val(values) as u64,
                values: Box::new(write),
            },
        ));
        self
    }

    /// **Panics** if an array called `name` was already added.
    #[track_caller]
    fn check_new(&self, name: &str) {
        assert!(
            !self.members.iter().any(|(n, _)| n == name),
            "NpzWriter::add: array `{name}` added twice"
        );
    }

    /// Adds `array` as `name` (stored as `name.npy`).
    ///
    /// **Panics** if an array called `name` was already added.
    #[track_caller]
    pub fn add<A, S, D>(&mut self, name: &str, array: &ArrayBase<S, D>) -> &mut Self
    where
        A: NpyElement,
        S: Data<Elem = A>,
        D: Dimension,
    {
        self.check_new(name);
        let mut bytes = npy_header(A::DESCR, array.shape());
        bytes.reserve(array.len() * std::mem::size_of::<A>());
        for &x in array.iter() {
            x.put(&mut bytes);
        }
        self.members
            .push((name.to_string(), Member::Encoded(bytes)));
        self
    }

    /// Adds `value` as the 0-d array `name`.
    ///
    /// **Panics** if an array called `name` was already added.
    #[track_caller]
    pub fn add_scalar<A: NpyElement>(&mut self, name: &str, value: A) -> &mut Self {
        self.add(name, &arr0(value))
    }

    /// Adds `strings` as the 1-D array `name` of numpy's unicode dtype
    /// `<U{w}`, `w` the most characters of any string (at least 1, as
    /// numpy): `numpy.load` gives `array(['en', 'fr'], dtype='<U2')`.
    /// Each string is stored as UTF-32LE code units, NUL-padded to `w`.
    ///
    /// numpy drops a string's trailing NULs when it reads it, and so does
    /// [`NpzReader::strings_1d`](super::NpzReader::strings_1d): a string
    /// that ends in `'\0'` does not come back whole.
    ///
    /// **Panics** if an array called `name` was already added.
    ///
    /// ```
    /// # fn main() -> splitgrad::Result<()> {
    /// use splitgrad::io::{NpzReader, NpzWriter};
    /// let mut w = NpzWriter::new("unused.npz");
    /// w.add_strings("language_names", &["en", "fr"]);
    /// let mut bytes = std::io::Cursor::new(Vec::new());
    /// w.write_to(&mut bytes)?;
    /// let mut r = NpzReader::from_bytes("memory", bytes.into_inner())?;
    /// assert_eq!(r.dtype("language_names")?.descr(), "<U2");
    /// assert_eq!(r.strings_1d("language_names")?, ["en", "fr"]);
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn add_strings<S: AsRef<str>>(&mut self, name: &str, strings: &[S]) -> &mut Self {
        self.add_unicode(name, &[strings.len()], strings)
    }

    /// Adds `value` as the 0-d array `name` of numpy's unicode dtype
    /// `<U{w}` (`w` its number of characters, at least 1): `numpy.load`
    /// gives `array('fnv1a64:…', dtype='<U24')`. Trailing NULs are lost as
    /// for [`add_strings`](Self::add_strings).
    ///
    /// **Panics** if an array called `name` was already added.
    #[track_caller]
    pub fn add_string_scalar(&mut self, name: &str, value: &str) -> &mut Self {
        self.add_unicode(name, &[], &[value])
    }

    #[track_caller]
    fn add_unicode<S: AsRef<str>>(
        &mut self,
        name: &str,
        shape: &[usize],
        strings: &[S],
    ) -> &mut Self {
        self.check_new(name);
        let width = strings
            .iter()
            .map(|s| s.as_ref().chars().count())
            .max()
            .unwrap_or(0)
            .max(1);
        let mut bytes = npy_header(&format!("<U{width}"), shape);
        bytes.reserve(strings.len() * width * 4);
        for s in strings {
            let mut chars = 0;
            for c in s.as_ref().chars() {
                bytes.extend_from_slice(&u32::from(c).to_le_bytes());
                chars += 1;
            }
            bytes.resize(bytes.len() + (width - chars) * 4, 0);
        }
        self.members
            .push((name.to_string(), Member::Encoded(bytes)));
        self
    }

    /// The names added so far, in order.
    ///
    /// ```
    /// let mut w = splitgrad::io::NpzWriter::new("unused.npz");
    /// w.add_scalar("b", 1u8).add_scalar("a", 2.0f64);
    /// assert_eq!(w.names().collect::<Vec<_>>(), ["b", "a"]);
    /// ```
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.members.iter().map(|(n, _)| n.as_str())
    }

    /// Writes the archive to `out`, members in the order they were added.
    ///
    /// ```
    /// # fn main() -> splitgrad::Result<()> {
    /// use splitgrad::io::{NpzReader, NpzWriter};
    /// let mut w = NpzWriter::new("unused.npz");
    /// w.add_scalar("x", 3i64);
    /// let mut bytes = std::io::Cursor::new(Vec::new());
    /// w.write_to(&mut bytes)?;
    /// let mut r = NpzReader::from_bytes("memory", bytes.into_inner())?;
    /// assert_eq!(r.ints("x")?.sum(), 3);
    /// # Ok(()) }
    /// ```
    pub fn write_to<W: Write + Seek>(&self, out: W) -> Result<()> {
        let mut zip = ZipWriter::new(out);
        for (name, member) in &self.members {
            let options = FileOptions::default()
                .compression_method(if self.deflate {
                    CompressionMethod::Deflated
                } else {
                    CompressionMethod::Stored
                })
                .last_modified_time(DateTime::default())
                .unix_permissions(0o644)
                .large_file(member.len() >= u64::from(u32::MAX));
            zip.start_file(npyz::npz::file_name_from_array_name(name), options)
                .map_err(|e| zip_error(e, "cannot write the archive"))?;
            match member {
                Member::Encoded(bytes) => zip.write_all(bytes)?,
                Member::Streamed { header, values, .. } => {
                    zip.write_all(header)?;
                    values(&mut zip)?;
                }
            }
        }
        zip.finish()
            .map_err(|e| zip_error(e, "cannot write the archive"))?;
        Ok(())
    }

    /// Writes the archive to the path given to [`new`](Self::new),
    /// atomically: on any error an existing file there is left intact.
    ///
    /// Errors: [`crate::ErrorKind::Io`] naming the path.
    pub fn finish(self) -> Result<()> {
        write_atomic(&self.path, |file| self.write_to(file))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_numpys_padded_v1() {
        let h = npy_header("<i8", &[3]);
        let text = "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }";
        // 10 + 57 + 1 bytes, padded to 128 (numpy 2.4 writes these bytes).
        assert_eq!(text.len(), 57);
        assert_eq!(h.len(), 128);
        assert_eq!(&h[..8], b"\x93NUMPY\x01\x00");
        assert_eq!(u16::from_le_bytes([h[8], h[9]]), 118);
        assert_eq!(&h[10..10 + text.len()], text.as_bytes());
        assert!(h[10 + text.len()..127].iter().all(|&b| b == b' '));
        assert_eq!(h[127], b'\n');
        let scalar = npy_header("<f8", &[]);
        assert!(String::from_utf8_lossy(&scalar).contains("'shape': (), }"));
        let matrix = npy_header("|u1", &[2, 30]);
        assert!(String::from_utf8_lossy(&matrix).contains("'shape': (2, 30), }"));
    }

    /// A slice streamed in blocks gives the archive `add` gives, bit for
    /// bit: an empty slice, one of a block and a few elements more, and a
    /// column of each width.
    #[test]
    fn streamed_slices_are_the_added_arrays_bytes() {
        let archive = |w: &NpzWriter<'_>| {
            let mut out = std::io::Cursor::new(Vec::new());
            w.write_to(&mut out).unwrap();
            out.into_inner()
        };
        let long: Vec<u32> = (0..(BLOCK_BYTES / 4 + 3) as u32).collect();
        let wide: Vec<i64> = vec![-3, 1 << 40];
        let none: Vec<u16> = Vec::new();
        for deflate in [false, true] {
            let mut a = NpzWriter::new("a.npz");
            a.deflate(deflate)
                .add("long", &ndarray::ArrayView1::from(&long))
                .add("wide", &ndarray::ArrayView1::from(&wide))
                .add("none", &ndarray::ArrayView1::from(&none));
            let mut b = NpzWriter::new("b.npz");
            b.deflate(deflate)
                .add_slice("long", &long)
                .add_slice("wide", &wide)
                .add_slice("none", &none);
            assert_eq!(archive(&a), archive(&b), "deflate {deflate}");
        }
        use crate::io::{Column, Width};
        for width in [Width::U8, Width::U16, Width::U32] {
            let mut column = Column::with_width(width, 4);
            for x in [0u32, 7, 255] {
                column.push(x);
            }
            let mut a = NpzWriter::new("a.npz");
            a.add_column("c", &column);
            let mut r = crate::io::NpzReader::from_bytes("c", archive(&a)).unwrap();
            assert_eq!(r.ints_1d("c").unwrap(), [0, 7, 255], "{width:?}");
        }
    }

    /// The bytes numpy 2.4 writes for `np.save(f, np.array(['en', 'fr', 'é']))`
    /// and `np.save(f, np.array('ab'))`.
    #[test]
    fn strings_are_numpys_utf32_nul_padded() {
        let mut w = NpzWriter::new("unused.npz");
        w.add_strings("l", &["en", "fr", "é"])
            .add_string_scalar("s", "ab")
            .add_strings("none", &[] as &[&str])
            .add_strings("empty", &[""]);
        let member = |name: &str| match &w.members.iter().find(|(n, _)| n == name).unwrap().1 {
            Member::Encoded(bytes) => bytes,
            Member::Streamed { .. } => unreachable!("strings are encoded when added"),
        };
        let l = member("l");
        assert_eq!(&l[..128], npy_header("<U2", &[3]).as_slice());
        let text = String::from_utf8_lossy(&l[..128]);
        assert!(text.contains("{'descr': '<U2', 'fortran_order': False, 'shape': (3,), }"));
        let units: Vec<u32> = l[128..]
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(units, [0x65, 0x6e, 0x66, 0x72, 0xe9, 0]);
        let s = member("s");
        assert!(
            String::from_utf8_lossy(s)
                .contains("'descr': '<U2', 'fortran_order': False, 'shape': (), }")
        );
        assert_eq!(&s[s.len() - 8..], b"a\0\0\0b\0\0\0");
        // numpy's dtype for no strings, or only empty ones, is `<U1`.
        let none = member("none");
        assert!(String::from_utf8_lossy(none).contains("'<U1'"));
        assert_eq!(none.len(), 128);
        let empty = member("empty");
        assert!(String::from_utf8_lossy(empty).contains("'<U1'"));
        assert_eq!(&empty[128..], [0, 0, 0, 0]);
    }
}
