//! Reading `.npz` archives: [`NpzReader`].

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Cursor, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use ndarray::ArrayD;
use npyz::zip::result::ZipError;
use npyz::zip::{CompressionMethod, ZipArchive};

use super::check_finite;
use super::npy::{self, Dtype, DtypeKind, Header};
use super::{Column, Width};
use crate::{Error, ErrorKind, Real, Result};

/// The real element type of an array: `f32` (`float32`) or `f64` (`float64`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RealDtype {
    /// `float32`.
    F32,
    /// `float64`.
    F64,
}

impl RealDtype {
    /// `"f32"` or `"f64"`, as [`Real::NAME`].
    ///
    /// ```
    /// use splitgrad::io::RealDtype;
    /// assert_eq!(RealDtype::F64.name(), <f64 as splitgrad::Real>::NAME);
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            RealDtype::F32 => "f32",
            RealDtype::F64 => "f64",
        }
    }
}

/// The bytes behind a reader: a file or a buffer.
enum Source {
    File(BufReader<File>),
    Memory(Cursor<Vec<u8>>),
}

impl Read for Source {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Source::File(f) => f.read(buf),
            Source::Memory(m) => m.read(buf),
        }
    }
}

impl Seek for Source {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        match self {
            Source::File(f) => f.seek(pos),
            Source::Memory(m) => m.seek(pos),
        }
    }
}

/// Where a member lives in the archive and how it is stored.
struct Entry {
    index: usize,
    method: CompressionMethod,
    size: u64,
    /// Where the member's (compressed) data ends in the archive.
    data_end: u64,
}

/// An open `.npz` archive (a zip of `.npy` members, as `numpy.savez`
/// writes), read one named array at a time.
///
/// Every error names the file and, where one is concerned, the array.
/// Integer arrays of any width, signedness and byte order are read as
/// `i64` ([`ints`](Self::ints)); `float32` and `float64` arrays as either
/// real type ([`reals`](Self::reals)). Fortran-order arrays are read into
/// the usual row-major layout.
///
/// ```
/// # fn main() -> splitgrad::Result<()> {
/// use ndarray::{arr0, arr2};
/// use splitgrad::io::{NpzReader, NpzWriter};
/// let path = std::env::temp_dir().join(format!("splitgrad-doc-reader-{}.npz", std::process::id()));
/// let mut w = NpzWriter::new(&path);
/// w.add("ids", &arr2(&[[1i64, 2], [3, 4]]));
/// w.add("n", &arr0(7u8));
/// w.finish()?;
///
/// let mut r = NpzReader::open(&path)?;
/// assert_eq!(r.names(), ["ids", "n"]);
/// assert_eq!(r.shape("ids")?, [2, 2]);
/// assert_eq!(r.ints("ids")?, arr2(&[[1i64, 2], [3, 4]]).into_dyn());
/// assert_eq!(r.ints("n")?.into_dimensionality::<ndarray::Ix0>().unwrap()[()], 7);
/// let e = r.ints("missing").unwrap_err();
/// assert!(e.to_string().ends_with("array `missing`: is missing"));
/// # std::fs::remove_file(&path)?;
/// # Ok(()) }
/// ```
pub struct NpzReader {
    path: PathBuf,
    /// The archive's size in bytes.
    archive_len: u64,
    zip: ZipArchive<Source>,
    names: Vec<String>,
    entries: HashMap<String, Entry>,
}

impl std::fmt::Debug for NpzReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NpzReader")
            .field("path", &self.path)
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

impl NpzReader {
    /// Opens the `.npz` file at `path`.
    ///
    /// Errors: [`ErrorKind::Io`] if it cannot be read, [`ErrorKind::Format`]
    /// if it is not a zip archive, or a zip holding no `.npy` member.
    pub fn open(path: impl AsRef<Path>) -> Result<NpzReader> {
        let path = path.as_ref();
        let file = super::open_regular(path)?;
        Self::from_source(path, Source::File(BufReader::new(file)))
    }

    /// Reads an `.npz` archive held in memory; `label` names it in errors.
    ///
    /// ```
    /// use splitgrad::io::NpzReader;
    /// let e = NpzReader::from_bytes("upload.npz", b"not a zip".to_vec()).unwrap_err();
    /// assert!(e.to_string().starts_with("upload.npz: not an npz file"));
    /// ```
    pub fn from_bytes(label: impl AsRef<Path>, bytes: Vec<u8>) -> Result<NpzReader> {
        Self::from_source(label.as_ref(), Source::Memory(Cursor::new(bytes)))
    }

    fn from_source(path: &Path, mut source: Source) -> Result<NpzReader> {
        let in_file = |e: Error| e.in_file(path);
        let archive_len = source
            .seek(SeekFrom::End(0))
            .and_then(|n| source.seek(SeekFrom::Start(0)).map(|_| n))
            .map_err(|e| in_file(Error::from(e)))?;
        let mut zip = ZipArchive::new(source)
            .map_err(|e| zip_error(e, "not an npz file (no readable zip directory)"))
            .map_err(in_file)?;
        let mut names: Vec<String> = zip
            .file_names()
            .filter_map(npyz::npz::array_name_from_file_name)
            .map(str::to_string)
            .collect();
        names.sort();
        names.dedup();
        if names.is_empty() && !zip.is_empty() {
            return Err(in_file(Error::format(
                "not an npz file: a zip archive with no `.npy` member",
            )));
        }
        // The raw view reads only the member's local header, never its
        // data; a member whose local header is unreadable is left out here
        // and reported when it is asked for.
        let mut entries = HashMap::new();
        for index in 0..zip.len() {
            if let Ok(member) = zip.by_index_raw(index)
                && let Some(name) = npyz::npz::array_name_from_file_name(member.name())
            {
                let entry = Entry {
                    index,
                    method: member.compression(),
                    size: member.size(),
                    data_end: member.data_start().saturating_add(member.compressed_size()),
                };
                entries.insert(name.to_string(), entry);
            }
        }
        Ok(NpzReader {
            path: path.to_path_buf(),
            archive_len,
            zip,
            names,
            entries,
        })
    }

    /// The file this reader reads (or the label given to [`from_bytes`](Self::from_bytes)).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The names of the arrays, sorted.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Whether the archive holds an array called `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.names
            .binary_search_by(|n| n.as_str().cmp(name))
            .is_ok()
    }

    /// Opens member `name`, parses its header and hands the reader, left
    /// at the first element, to `f`. Errors get the file and array named.
    fn with_member<U>(
        &mut self,
        name: &str,
        f: impl FnOnce(&mut dyn Read, &Header) -> Result<U>,
    ) -> Result<U> {
        self.with_member_decoded(name, |_| 8, f)
    }

    /// As [`with_member`](Self::with_member), for a caller that keeps
    /// `decoded_bytes(header)` bytes an element (checked against the
    /// memory available before `f` runs).
    fn with_member_decoded<U>(
        &mut self,
        name: &str,
        decoded_bytes: impl FnOnce(&Header) -> u64,
        f: impl FnOnce(&mut dyn Read, &Header) -> Result<U>,
    ) -> Result<U> {
        self.member(name, decoded_bytes, f)
            .map_err(|e| e.in_file(&self.path).in_array(name))
    }

    fn member<U>(
        &mut self,
        name: &str,
        decoded_bytes: impl FnOnce(&Header) -> u64,
        f: impl FnOnce(&mut dyn Read, &Header) -> Result<U>,
    ) -> Result<U> {
        let Some(entry) = self.entries.get(name) else {
            return Err(if self.contains(name) {
                Error::format("corrupt archive: the member's local header cannot be read")
            } else {
                Error::new(ErrorKind::Missing)
            });
        };
        let supported = [
            CompressionMethod::Stored,
            CompressionMethod::Deflated,
            CompressionMethod::Bzip2,
        ];
        if !supported.contains(&entry.method) {
            return Err(Error::format(format!(
                "member is compressed with {:?}; stored, deflated and bzip2 members are read",
                entry.method
            )));
        }
        if entry.data_end > self.archive_len {
            return Err(Error::format(format!(
                "truncated archive: the member's data would end at byte {}, \
                 past the end of the file ({} bytes)",
                entry.data_end, self.archive_len
            )));
        }
        let size = entry.size;
        // An empty password is discarded for an unencrypted member; asking
        // for it keeps the zip crate from unwrapping a password error.
        let mut member = match self.zip.by_index_decrypt(entry.index, b"") {
            Ok(Ok(member)) => member,
            Ok(Err(_)) => return Err(Error::format("member is encrypted")),
            Err(e) => return Err(zip_error(e, "corrupt archive")),
        };
        let header = npy::read_header(&mut member, size)?;
        // Only for the dtypes that are ever decoded: the others are rejected
        // by dtype, whatever their data.
        let decoded = header.dtype.kind() != DtypeKind::Other;
        if decoded {
            let have = size - header.header_bytes;
            let need = header.data_bytes();
            if need != Some(have) {
                let need = need.map_or("more than 2^64".to_string(), |n| n.to_string());
                return Err(Error::format(format!(
                    "corrupt member: {have} bytes of data follow the header, \
                     but shape {:?} of {} needs {need}",
                    header.shape, header.dtype
                )));
            }
        }
        // Every element is decoded into at most `decoded_bytes` bytes (8 for
        // i64, f64): refuse a shape whose array would not fit before reading
        // any of it. The
        // reader is capped at the bytes the shape promises (and one more,
        // to see that the member ends there), whatever the stream inflates to.
        if decoded {
            let bytes = super::bytes_of(&[header.len as u64, decoded_bytes(&header)]);
            super::check_memory(
                || {
                    format!(
                        "shape {:?} of {} ({} elements)",
                        header.shape, header.dtype, header.len
                    )
                },
                bytes,
                "",
            )?;
        }
        let cap = header.data_bytes().unwrap_or(u64::MAX).saturating_add(1);
        f(&mut (&mut member).take(cap), &header)
    }

    /// The element type of array `name`.
    pub fn dtype(&mut self, name: &str) -> Result<Dtype> {
        self.with_member_decoded(name, |_| 0, |_, h| Ok(h.dtype.clone()))
    }

    /// The shape of array `name` (`[]` for a 0-d array).
    pub fn shape(&mut self, name: &str) -> Result<Vec<usize>> {
        self.with_member_decoded(name, |_| 0, |_, h| Ok(h.shape.clone()))
    }

    /// Whether array `name` holds `float32` or `float64` values.
    ///
    /// Errors: [`ErrorKind::Dtype`] for any other element type.
    pub fn real_dtype(&mut self, name: &str) -> Result<RealDtype> {
        self.with_member_decoded(name, |_| 0, |_, h| real_dtype_of(&h.dtype))
    }

    /// Array `name`, of any integer dtype (`int8` … `uint64`, either byte
    /// order), as `i64`.
    ///
    /// Errors: [`ErrorKind::Dtype`] for `bool`, floats and anything else;
    /// [`ErrorKind::Format`] for a `uint64` value above `i64::MAX` (naming
    /// it and its position) and for a truncated or corrupt member.
    pub fn ints(&mut self, name: &str) -> Result<ArrayD<i64>> {
        self.with_member(name, |r, h| {
            check_int_dtype(&h.dtype)?;
            npy::into_array(h, npy::read_ints(r, h)?)
        })
    }

    /// Array `name`, which must be 1-D and of an integer dtype, as a
    /// `Vec<i64>`.
    ///
    /// ```
    /// # fn main() -> splitgrad::Result<()> {
    /// use splitgrad::io::{NpzReader, NpzWriter};
    /// let path = std::env::temp_dir().join(format!("splitgrad-doc-ints1d-{}.npz", std::process::id()));
    /// let mut w = NpzWriter::new(&path);
    /// w.add("a", &ndarray::arr1(&[3u8, 1, 2]));
    /// w.add("b", &ndarray::arr2(&[[1i64]]));
    /// w.finish()?;
    /// let mut r = NpzReader::open(&path)?;
    /// assert_eq!(r.ints_1d("a")?, vec![3, 1, 2]);
    /// assert!(r.ints_1d("b").unwrap_err().to_string().contains("expected 1-D"));
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    pub fn ints_1d(&mut self, name: &str) -> Result<Vec<i64>> {
        self.with_member(name, |r, h| {
            check_int_dtype(&h.dtype)?;
            if h.shape.len() != 1 {
                return Err(Error::shape(name, "1-D", &h.shape));
            }
            npy::read_ints(r, h)
        })
    }

    /// The length and dtype of array `name`, checked as
    /// [`ints_1d`](Self::ints_1d) checks them (1-D, an integer dtype),
    /// none of its data read.
    ///
    /// ```
    /// # fn main() -> splitgrad::Result<()> {
    /// use splitgrad::io::{NpzReader, NpzWriter};
    /// let path = std::env::temp_dir().join(format!("splitgrad-doc-int1dlen-{}.npz", std::process::id()));
    /// let mut w = NpzWriter::new(&path);
    /// w.add("ids", &ndarray::arr1(&[3u16, 1, 2]));
    /// w.finish()?;
    /// let (n, dtype) = NpzReader::open(&path)?.int_1d_len("ids")?;
    /// assert_eq!((n, dtype.descr()), (3, "<u2"));
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    pub fn int_1d_len(&mut self, name: &str) -> Result<(usize, Dtype)> {
        self.with_member_decoded(
            name,
            |_| 0,
            |_, h| {
                check_int_dtype(&h.dtype)?;
                if h.shape.len() != 1 {
                    return Err(Error::shape(name, "1-D", &h.shape));
                }
                Ok((h.len, h.dtype.clone()))
            },
        )
    }

    /// Array `name`, which must be 1-D and of an integer dtype with every
    /// value in `0..2³²`, as a [`Column`] at least `width` wide (wider only
    /// if a value needs it). It is read a chunk at a time: nothing of the
    /// array's size is allocated but the column, whose bytes are checked
    /// against the memory available first at the widest it may become
    /// (`width`, or the dtype's width up to 4 bytes if that is wider: ids
    /// of a wide dtype may need it), and again before it widens past that.
    /// `what` names a value in errors ("token id").
    ///
    /// Errors: those of [`ints_1d`](Self::ints_1d); a value out of
    /// `0..2³²`, naming it and its position.
    ///
    /// ```
    /// # fn main() -> splitgrad::Result<()> {
    /// use splitgrad::io::{NpzReader, NpzWriter, Width};
    /// let path = std::env::temp_dir().join(format!("splitgrad-doc-column-{}.npz", std::process::id()));
    /// let mut w = NpzWriter::new(&path);
    /// w.add("ids", &ndarray::arr1(&[3i64, 1, 300]));
    /// w.add("bad", &ndarray::arr1(&[3i64, -1]));
    /// w.finish()?;
    /// let mut r = NpzReader::open(&path)?;
    /// let ids = r.ids_1d("ids", "token id", Width::U8)?;
    /// assert_eq!((ids.width(), ids.to_vec()), (Width::U16, vec![3, 1, 300]));
    /// let e = r.ids_1d("bad", "token id", Width::U8).unwrap_err();
    /// assert!(e.to_string().ends_with("array `bad`: token id -1 at position [1] is out of range 0..4294967296"), "{e}");
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    pub fn ids_1d(&mut self, name: &str, what: &'static str, width: Width) -> Result<Column> {
        let widest = |h: &Header| (h.dtype.size().min(4) as u64).max(width.bytes() as u64);
        self.with_member_decoded(name, widest, |r, h| {
            check_int_dtype(&h.dtype)?;
            if h.shape.len() != 1 {
                return Err(Error::shape(name, "1-D", &h.shape));
            }
            let unsigned = h.dtype.kind() == DtypeKind::UInt
                && matches!(h.dtype.size(), 1 | 2 | 4)
                && (h.dtype.size() == 1 || !h.dtype.is_big_endian());
            if unsigned {
                // Kept at the file's width (or `width`, if wider), with no
                // value to check: every one is below 2³².
                let size = h.dtype.size();
                let wide = Width::for_bound(1u64 << (8 * size));
                let mut column = Column::with_width(width.max(wide), h.len);
                npy::read_raw_chunks(r, h, &mut |raw| {
                    column.extend_from_le_bytes(raw, size);
                    Ok(())
                })?;
                return Ok(column);
            }
            let mut column = Column::with_width(width, h.len);
            let mut narrow: Vec<u32> = Vec::new();
            npy::read_int_chunks(r, h, &mut |first, values| {
                // One pass for the range (vectorised), then the narrowing.
                let (lo, hi) = values
                    .iter()
                    .fold((i64::MAX, i64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
                if values.is_empty() {
                    return Ok(());
                }
                if lo < 0 || hi > i64::from(u32::MAX) {
                    let j = values
                        .iter()
                        .position(|&v| u32::try_from(v).is_err())
                        .unwrap_or_default();
                    return Err(Error::out_of_range(
                        what,
                        vec![first + j],
                        values[j],
                        0,
                        1 << 32,
                    ));
                }
                narrow.clear();
                narrow.extend(values.iter().map(|&v| v as u32));
                let needs = Width::for_value(hi as u32);
                if needs > column.width() {
                    let bytes = super::bytes_of(&[h.len as u64, needs.bytes() as u64]);
                    super::check_memory(
                        || {
                            format!(
                                "shape {:?} of {} ({} elements) held as {}",
                                h.shape,
                                h.dtype,
                                h.len,
                                needs.numpy_name()
                            )
                        },
                        bytes,
                        "",
                    )?;
                    column.reserve_width(needs);
                }
                column.extend_from_u32(&narrow);
                Ok(())
            })?;
            Ok(column)
        })
    }

    /// Array `name`, which must be 1-D and of numpy's unicode dtype
    /// (`<U{n}`, either byte order), as strings, each without the trailing
    /// NULs that pad it (numpy strips them too).
    ///
    /// Errors, each naming the file and the array: [`ErrorKind::Dtype`]
    /// for any other dtype (byte strings `S` included); [`ErrorKind::Shape`]
    /// unless 1-D; [`ErrorKind::Format`] for a code unit that is not a
    /// Unicode scalar value (a surrogate or one above U+10FFFF), naming the
    /// string's position and the character's index, and for a truncated or
    /// corrupt member. The data's size is checked against the member's
    /// before anything is allocated.
    ///
    /// ```
    /// # fn main() -> splitgrad::Result<()> {
    /// use splitgrad::io::{NpzReader, NpzWriter};
    /// let path = std::env::temp_dir().join(format!("splitgrad-doc-strings-{}.npz", std::process::id()));
    /// let mut w = NpzWriter::new(&path);
    /// w.add_strings("names", &["en", "日本語", ""]);
    /// w.add_string_scalar("hash", "fnv1a64:0123456789abcdef");
    /// w.finish()?;
    /// let mut r = NpzReader::open(&path)?;
    /// assert_eq!(r.dtype("names")?.descr(), "<U3");
    /// assert_eq!(r.strings_1d("names")?, ["en", "日本語", ""]);
    /// assert_eq!(r.string_scalar("hash")?, "fnv1a64:0123456789abcdef");
    /// assert!(r.strings_1d("hash").unwrap_err().to_string().contains("expected 1-D"));
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    pub fn strings_1d(&mut self, name: &str) -> Result<Vec<String>> {
        self.with_member(name, |r, h| {
            check_unicode_dtype(&h.dtype)?;
            if h.shape.len() != 1 {
                return Err(Error::shape(name, "1-D", &h.shape));
            }
            npy::read_strings(r, h)
        })
    }

    /// Array `name`, which must be 0-d (a numpy scalar) and of numpy's
    /// unicode dtype, as a string; errors as for
    /// [`strings_1d`](Self::strings_1d), with [`ErrorKind::Shape`] unless
    /// 0-d.
    pub fn string_scalar(&mut self, name: &str) -> Result<String> {
        self.with_member(name, |r, h| {
            check_unicode_dtype(&h.dtype)?;
            if !h.shape.is_empty() {
                return Err(Error::shape(name, "0-D (a scalar)", &h.shape));
            }
            let mut strings = npy::read_strings(r, h)?;
            Ok(strings.pop().unwrap_or_default())
        })
    }

    /// Array `name`, of a 2-byte dtype (`float16`, or `uint16` / `int16`
    /// holding bf16's bits, numpy having no bfloat16; either byte order),
    /// as the bits of its elements.
    ///
    /// Errors: [`ErrorKind::Dtype`] for any other element type;
    /// [`ErrorKind::Format`] for a truncated or corrupt member.
    ///
    /// ```
    /// # fn main() -> splitgrad::Result<()> {
    /// use splitgrad::io::{NpzReader, NpzWriter};
    /// let mut w = NpzWriter::new("unused.npz");
    /// w.add("h", &ndarray::arr1(&[half::f16::from_f32(1.5)]));
    /// w.add("b", &ndarray::arr1(&[0x3FC0u16]));
    /// let mut bytes = std::io::Cursor::new(Vec::new());
    /// w.write_to(&mut bytes)?;
    /// let mut r = NpzReader::from_bytes("memory", bytes.into_inner())?;
    /// assert_eq!(r.bits16("h")?[[0]], 0x3E00);
    /// assert_eq!(r.bits16("b")?[[0]], 0x3FC0);
    /// # Ok(()) }
    /// ```
    pub fn bits16(&mut self, name: &str) -> Result<ArrayD<u16>> {
        self.with_member_decoded(
            name,
            |_| 2,
            |r, h| {
                let kind = h.dtype.kind();
                let two_bytes = matches!(kind, DtypeKind::Float | DtypeKind::Int | DtypeKind::UInt);
                if !two_bytes || h.dtype.size() != 2 {
                    return Err(Error::new(ErrorKind::Dtype {
                        expected: "a 2-byte dtype (float16, or uint16 holding bf16's bits)".into(),
                        found: h.dtype.to_string(),
                    }));
                }
                npy::into_array(h, npy::read_bits16(r, h)?)
            },
        )
    }

    /// Array `name`, of dtype `float32` or `float64`, converted to `T`.
    ///
    /// Errors: [`ErrorKind::Dtype`] for any other element type;
    /// [`ErrorKind::Format`] for a truncated or corrupt member. NaN and
    /// infinities are returned as they are: see
    /// [`finite_reals`](Self::finite_reals).
    pub fn reals<T: Real>(&mut self, name: &str) -> Result<ArrayD<T>> {
        self.with_member(name, |r, h| {
            real_dtype_of(&h.dtype)?;
            npy::into_array(h, npy::read_reals(r, h)?)
        })
    }

    /// As [`reals`](Self::reals), and then [`ErrorKind::NonFinite`] for the
    /// first NaN or infinity, with its position.
    ///
    /// ```
    /// # fn main() -> splitgrad::Result<()> {
    /// use splitgrad::io::{NpzReader, NpzWriter};
    /// let path = std::env::temp_dir().join(format!("splitgrad-doc-finite-{}.npz", std::process::id()));
    /// let mut w = NpzWriter::new(&path);
    /// w.add("x", &ndarray::arr2(&[[0.5f64, 1.0], [f64::NAN, 2.0]]));
    /// w.finish()?;
    /// let mut r = NpzReader::open(&path)?;
    /// assert_eq!(r.reals::<f32>("x")?[[0, 0]], 0.5);
    /// let e = r.finite_reals::<f64>("x").unwrap_err();
    /// assert!(e.to_string().ends_with("array `x`: non-finite value NaN at position [1, 0]"));
    /// # std::fs::remove_file(&path)?;
    /// # Ok(()) }
    /// ```
    pub fn finite_reals<T: Real>(&mut self, name: &str) -> Result<ArrayD<T>> {
        let array = self.reals(name)?;
        check_finite(array.view(), name).map_err(|e| e.in_file(&self.path))?;
        Ok(array)
    }
}

fn check_unicode_dtype(dtype: &Dtype) -> Result<()> {
    match dtype.kind() {
        DtypeKind::Unicode => Ok(()),
        _ => Err(Error::new(ErrorKind::Dtype {
            expected: "a unicode string dtype (<U1, <U2, …)".into(),
            found: dtype.to_string(),
        })),
    }
}

fn check_int_dtype(dtype: &Dtype) -> Result<()> {
    match dtype.kind() {
        DtypeKind::Int | DtypeKind::UInt => Ok(()),
        _ => Err(Error::new(ErrorKind::Dtype {
            expected: "an integer dtype (int8 … int64, uint8 … uint64)".into(),
            found: dtype.to_string(),
        })),
    }
}

fn real_dtype_of(dtype: &Dtype) -> Result<RealDtype> {
    match (dtype.kind(), dtype.size()) {
        (DtypeKind::Float, 4) => Ok(RealDtype::F32),
        (DtypeKind::Float, 8) => Ok(RealDtype::F64),
        _ => Err(Error::new(ErrorKind::Dtype {
            expected: "float32 or float64".into(),
            found: dtype.to_string(),
        })),
    }
}

/// A zip error as ours: a damaged archive is a format error, a failing
/// disk an I/O error.
pub(super) fn zip_error(e: ZipError, context: &str) -> Error {
    use std::io::ErrorKind as Io;
    match e {
        ZipError::Io(e) if !matches!(e.kind(), Io::UnexpectedEof | Io::InvalidData) => {
            Error::from(e)
        }
        ZipError::Io(e) => Error::format(format!("{context}: {e}")),
        ZipError::InvalidArchive(m) | ZipError::UnsupportedArchive(m) => {
            Error::format(format!("{context}: {m}"))
        }
        ZipError::FileNotFound => Error::new(ErrorKind::Missing),
    }
}
