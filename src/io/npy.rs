//! The `.npy` member format: the header and the decoding of its data.
//!
//! A member is the magic `\x93NUMPY`, a version (1.0, 2.0 or 3.0), the
//! header length (u16 for 1.0, u32 after), a Python dict literal such as
//! `{'descr': '<i8', 'fortran_order': False, 'shape': (3, 4), }` and the
//! raw elements. The header is parsed here rather than by `npyz`, whose
//! parser allocates the header length a file claims and multiplies the
//! claimed shape without checking for overflow; a corrupt file must give an
//! error, not an abort.

use std::fmt;
use std::io::Read;

use ndarray::{ArrayD, IxDyn, ShapeBuilder};

use super::pylit::{self, Lit};
use crate::{Error, Real, Result};

/// A header longer than this is rejected as implausible.
const MAX_HEADER_LEN: usize = 1 << 20;
/// Elements decoded per read.
const CHUNK: usize = 8192;

/// The family of an `.npy` element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DtypeKind {
    /// `b1` / `?`.
    Bool,
    /// `i1`, `i2`, `i4`, `i8`.
    Int,
    /// `u1`, `u2`, `u4`, `u8`.
    UInt,
    /// `f2`, `f4`, `f8`, ….
    Float,
    /// `U{n}`: numpy's fixed-width unicode strings, `n` UTF-32 code units
    /// each, NUL-padded.
    Unicode,
    /// Anything else: complex, byte strings, structured records, objects.
    Other,
}

/// The element type of an array in an `.npz` file, as its header states it.
///
/// `Display` gives numpy's name (`int64`, `float32`, `bool`) or, for
/// anything else, the header's `descr`.
///
/// ```
/// # fn main() -> splitgrad::Result<()> {
/// use splitgrad::io::{DtypeKind, NpzReader, NpzWriter};
/// let path = std::env::temp_dir().join(format!("splitgrad-doc-dtype-{}.npz", std::process::id()));
/// let mut w = NpzWriter::new(&path);
/// w.add("x", &ndarray::arr1(&[1.5f32, 2.0]));
/// w.finish()?;
/// let dtype = NpzReader::open(&path)?.dtype("x")?;
/// assert_eq!(dtype.kind(), DtypeKind::Float);
/// assert_eq!(dtype.size(), 4);
/// assert_eq!(dtype.to_string(), "float32");
/// # std::fs::remove_file(&path)?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dtype {
    descr: String,
    kind: DtypeKind,
    size: usize,
    big_endian: bool,
}

impl Dtype {
    /// The family.
    pub fn kind(&self) -> DtypeKind {
        self.kind
    }

    /// Bytes per element (0 when the header does not say).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether multi-byte elements are stored big-endian.
    pub fn is_big_endian(&self) -> bool {
        self.big_endian
    }

    /// The header's `descr`, e.g. `<i8` (`structured` for a record dtype).
    pub fn descr(&self) -> &str {
        &self.descr
    }

    fn parse(descr: &str) -> Dtype {
        let (big_endian, rest) = match descr.as_bytes().first() {
            Some(b'<') | Some(b'|') => (false, &descr[1..]),
            Some(b'>') => (true, &descr[1..]),
            Some(b'=') => (cfg!(target_endian = "big"), &descr[1..]),
            _ => (cfg!(target_endian = "big"), descr),
        };
        let mut chars = rest.chars();
        let code = chars.next();
        let size = chars.as_str().parse::<usize>().ok();
        let (kind, size) = match (code, size) {
            (Some('?'), None) => (DtypeKind::Bool, 1),
            (Some('b'), Some(1)) => (DtypeKind::Bool, 1),
            (Some('i'), Some(s @ (1 | 2 | 4 | 8))) => (DtypeKind::Int, s),
            (Some('u'), Some(s @ (1 | 2 | 4 | 8))) => (DtypeKind::UInt, s),
            (Some('f'), Some(s @ (2 | 4 | 8 | 10 | 12 | 16))) => (DtypeKind::Float, s),
            // numpy's `U` counts UCS-4 characters, not bytes.
            (Some('U'), Some(s)) => match s.checked_mul(4) {
                Some(bytes) => (DtypeKind::Unicode, bytes),
                None => (DtypeKind::Other, 0),
            },
            (_, s) => (DtypeKind::Other, s.unwrap_or(0)),
        };
        Dtype {
            descr: descr.to_string(),
            kind,
            size,
            big_endian,
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bits = self.size * 8;
        match self.kind {
            DtypeKind::Bool => write!(f, "bool"),
            DtypeKind::Int => write!(f, "int{bits}"),
            DtypeKind::UInt => write!(f, "uint{bits}"),
            DtypeKind::Float => write!(f, "float{bits}"),
            DtypeKind::Unicode | DtypeKind::Other => write!(f, "'{}'", self.descr),
        }
    }
}

/// A parsed `.npy` header.
#[derive(Clone, Debug)]
pub(crate) struct Header {
    pub(crate) dtype: Dtype,
    pub(crate) shape: Vec<usize>,
    pub(crate) fortran_order: bool,
    /// Number of elements (the product of `shape`).
    pub(crate) len: usize,
    /// Bytes from the start of the member to the first element.
    pub(crate) header_bytes: u64,
}

impl Header {
    /// The multi-index (in the array's logical shape) of the `flat`-th
    /// element in storage order.
    pub(crate) fn position(&self, flat: usize) -> Vec<usize> {
        let mut position = vec![0; self.shape.len()];
        let mut rest = flat;
        let mut unravel = |axis: usize| {
            let n = self.shape[axis].max(1);
            position[axis] = rest % n;
            rest /= n;
        };
        if self.fortran_order {
            (0..self.shape.len()).for_each(&mut unravel);
        } else {
            (0..self.shape.len()).rev().for_each(&mut unravel);
        }
        position
    }

    /// Bytes of element data the header promises, if it fits in a `u64`.
    pub(crate) fn data_bytes(&self) -> Option<u64> {
        (self.len as u64).checked_mul(self.dtype.size as u64)
    }
}

/// Reads the pre-header and header of a member from `r`, which is left at
/// the first element. `member_size` (the size the archive declares for the
/// member) bounds the header length.
pub(crate) fn read_header(r: &mut impl Read, member_size: u64) -> Result<Header> {
    let mut pre = [0u8; 8];
    r.read_exact(&mut pre)
        .map_err(|e| truncated_or_corrupt(e, "npy magic"))?;
    if &pre[..6] != b"\x93NUMPY" {
        return Err(Error::format(
            "not an npy member: the magic `\\x93NUMPY` is missing",
        ));
    }
    let (len, pre_len) = match (pre[6], pre[7]) {
        (1, 0) => {
            let mut b = [0u8; 2];
            r.read_exact(&mut b)
                .map_err(|e| truncated_or_corrupt(e, "npy header length"))?;
            (u64::from(u16::from_le_bytes(b)), 10)
        }
        (2 | 3, 0) => {
            let mut b = [0u8; 4];
            r.read_exact(&mut b)
                .map_err(|e| truncated_or_corrupt(e, "npy header length"))?;
            (u64::from(u32::from_le_bytes(b)), 12)
        }
        (major, minor) => {
            return Err(Error::format(format!(
                "unsupported npy format version {major}.{minor} (1.0, 2.0 and 3.0 are read)"
            )));
        }
    };
    if len > MAX_HEADER_LEN as u64 || len + pre_len > member_size {
        return Err(Error::format(format!(
            "npy header length {len} is impossible for a member of {member_size} bytes"
        )));
    }
    let mut text = Vec::with_capacity(len as usize);
    r.take(len)
        .read_to_end(&mut text)
        .map_err(|e| truncated_or_corrupt(e, "npy header"))?;
    if text.len() as u64 != len {
        return Err(Error::format("npy header is truncated"));
    }
    interpret(pylit::parse(&text)?, len + pre_len)
}

fn interpret(lit: Lit, header_bytes: u64) -> Result<Header> {
    let Lit::Dict(pairs) = lit else {
        return Err(Error::format("malformed npy header: not a dict"));
    };
    let get = |key: &str| {
        pairs
            .iter()
            .find(|(k, _)| matches!(k, Lit::Str(s) if s == key))
            .map(|(_, v)| v)
            .ok_or_else(|| Error::format(format!("malformed npy header: no `{key}` key")))
    };
    let dtype = match get("descr")? {
        Lit::Str(s) => Dtype::parse(s),
        Lit::Seq(_) => Dtype {
            descr: "structured".into(),
            kind: DtypeKind::Other,
            size: 0,
            big_endian: false,
        },
        _ => {
            return Err(Error::format(
                "malformed npy header: `descr` is not a string",
            ));
        }
    };
    let fortran_order = match get("fortran_order")? {
        Lit::Bool(b) => *b,
        _ => {
            return Err(Error::format(
                "malformed npy header: `fortran_order` is not a bool",
            ));
        }
    };
    let shape_lit = get("shape")?;
    let Lit::Seq(dims) = shape_lit else {
        return Err(Error::format(format!(
            "malformed npy header: shape {shape_lit} is not a tuple"
        )));
    };
    let shape = dims
        .iter()
        .map(|d| match d {
            Lit::Int(n) => usize::try_from(*n).ok(),
            _ => None,
        })
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| {
            Error::format(format!(
                "malformed npy header: shape {shape_lit} is not a tuple of non-negative integers"
            ))
        })?;
    let len = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(|| Error::format(format!("npy shape {shape:?} has too many elements")))?;
    Ok(Header {
        dtype,
        shape,
        fortran_order,
        len,
        header_bytes,
    })
}

fn truncated_or_corrupt(e: std::io::Error, what: &str) -> Error {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        Error::format(format!("truncated member: the file ends inside the {what}"))
    } else {
        Error::format(format!("corrupt member ({e}) while reading the {what}"))
    }
}

/// Reads `n` elements of `size` bytes, handing them to `sink` `chunk`
/// elements at a time with the flat index of each chunk's first, then
/// checks that the member ends there (reading on to the end also makes the
/// zip reader check the CRC). The one read loop of every decoder here.
fn read_chunks(
    r: &mut dyn Read,
    n: usize,
    size: usize,
    chunk: usize,
    sink: &mut dyn FnMut(usize, &[u8]) -> Result<()>,
) -> Result<()> {
    let mut buf = vec![0u8; chunk.min(n.max(1)) * size];
    let mut done = 0;
    while done < n {
        let k = (n - done).min(chunk);
        let bytes = &mut buf[..k * size];
        if let Err(e) = r.read_exact(bytes) {
            return Err(truncated_or_corrupt(e, &format!("data of {n} elements")));
        }
        sink(done, bytes)?;
        done += k;
    }
    let mut probe = [0u8; 1];
    match r.read(&mut probe) {
        Ok(0) => Ok(()),
        Ok(_) => Err(Error::format(format!(
            "corrupt member: bytes follow the {n} elements its header announces"
        ))),
        Err(e) => Err(truncated_or_corrupt(e, "end of the data")),
    }
}

/// Reads `n` elements of `N` bytes each, converting each (with its flat
/// index) through `conv`, then checks that the member ends there.
fn read_items<const N: usize, U>(
    r: &mut dyn Read,
    n: usize,
    mut conv: impl FnMut(usize, [u8; N]) -> Result<U>,
) -> Result<Vec<U>> {
    let mut out = Vec::with_capacity(n.min(1 << 20));
    read_chunks(r, n, N, CHUNK, &mut |first, bytes| {
        for (j, chunk) in bytes.chunks_exact(N).enumerate() {
            let mut item = [0u8; N];
            item.copy_from_slice(chunk);
            out.push(conv(first + j, item)?);
        }
        Ok(())
    })?;
    Ok(out)
}

/// Little-endian bytes of an element stored with the given endianness.
fn le<const N: usize>(mut b: [u8; N], big_endian: bool) -> [u8; N] {
    if big_endian {
        b.reverse();
    }
    b
}

/// `data`, in the header's storage order, as a row-major array of its shape.
pub(crate) fn into_array<U: Clone>(header: &Header, data: Vec<U>) -> Result<ArrayD<U>> {
    let dim = IxDyn(&header.shape);
    let array = if header.fortran_order {
        ArrayD::from_shape_vec(dim.f(), data).map(|a| a.as_standard_layout().into_owned())
    } else {
        ArrayD::from_shape_vec(dim, data)
    };
    array.map_err(|e| Error::format(format!("npy data does not fit its shape: {e}")))
}

/// The elements of an integer array (any width, signedness, endianness)
/// as `i64`, in storage order. The caller has checked that `header.dtype`
/// is an integer.
pub(crate) fn read_ints(r: &mut dyn Read, header: &Header) -> Result<Vec<i64>> {
    let mut out = Vec::with_capacity(header.len.min(1 << 20));
    read_int_chunks(r, header, &mut |_, values| {
        out.extend_from_slice(values);
        Ok(())
    })?;
    Ok(out)
}

/// The raw little-endian bytes of an unsigned array's elements, handed to
/// `sink` a chunk of whole elements at a time, then the check that the
/// member ends there: for a reader that keeps the values at their width
/// (no decoding). The caller has checked that the dtype is unsigned and
/// little-endian (or one byte).
pub(crate) fn read_raw_chunks(
    r: &mut dyn Read,
    header: &Header,
    sink: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    read_chunks(
        r,
        header.len,
        header.dtype.size,
        INT_CHUNK,
        &mut |_, raw| sink(raw),
    )
}

/// Elements decoded per chunk by [`read_int_chunks`].
const INT_CHUNK: usize = 1 << 16;

/// The elements of an integer array (any width, signedness, endianness),
/// in storage order, handed to `sink` as `i64` a chunk at a time with the
/// flat index of the chunk's first element; nothing of the array's size is
/// allocated here. Then checks that the member ends there. The caller has
/// checked that `header.dtype` is an integer.
pub(crate) fn read_int_chunks(
    r: &mut dyn Read,
    header: &Header,
    sink: &mut dyn FnMut(usize, &[i64]) -> Result<()>,
) -> Result<()> {
    let be = header.dtype.big_endian;
    let size = header.dtype.size;
    let mut values = vec![0i64; INT_CHUNK.min(header.len)];
    macro_rules! decode {
        ($t:ty, $raw:expr, $out:expr) => {{
            const W: usize = std::mem::size_of::<$t>();
            for (o, b) in $out.iter_mut().zip($raw.chunks_exact(W)) {
                let mut a = [0u8; W];
                a.copy_from_slice(b);
                *o = <$t>::from_le_bytes(le(a, be)) as i64;
            }
        }};
    }
    read_chunks(r, header.len, size, INT_CHUNK, &mut |done, raw| {
        let out = &mut values[..raw.len() / size];
        match (header.dtype.kind, size) {
            (DtypeKind::Int, 1) => decode!(i8, raw, out),
            (DtypeKind::Int, 2) => decode!(i16, raw, out),
            (DtypeKind::Int, 4) => decode!(i32, raw, out),
            (DtypeKind::Int, 8) => decode!(i64, raw, out),
            (DtypeKind::UInt, 1) => decode!(u8, raw, out),
            (DtypeKind::UInt, 2) => decode!(u16, raw, out),
            (DtypeKind::UInt, 4) => decode!(u32, raw, out),
            (DtypeKind::UInt, 8) => {
                for (j, (o, b)) in out.iter_mut().zip(raw.chunks_exact(8)).enumerate() {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    let v = u64::from_le_bytes(le(a, be));
                    *o = i64::try_from(v).map_err(|_| {
                        Error::format(format!(
                            "uint64 value {v} at position {:?} does not fit in int64 (range {}..={})",
                            header.position(done + j),
                            i64::MIN,
                            i64::MAX
                        ))
                    })?;
                }
            }
            _ => unreachable!("read_int_chunks called for dtype {}", header.dtype),
        }
        sink(done, out)
    })
}

/// The elements of a `U{n}` array as strings, in storage order, each
/// without its trailing NULs (numpy pads with them and strips them when it
/// reads). The caller has checked the dtype.
///
/// Every code unit must be a Unicode scalar value (not a surrogate, not
/// above U+10FFFF); the first that is not is an error naming the string's
/// position, the character's index in it and the code unit. Strings grow
/// only as their characters are read, so a header that lies about its
/// size costs no memory.
pub(crate) fn read_strings(r: &mut dyn Read, header: &Header) -> Result<Vec<String>> {
    let (n, be) = (header.len, header.dtype.big_endian);
    let width = header.dtype.size / 4;
    if width == 0 {
        if n == 0 {
            return Ok(Vec::new());
        }
        return Err(Error::format(format!(
            "dtype {} holds no character (numpy writes `<U1` at least)",
            header.dtype
        )));
    }
    let units = n.checked_mul(width).ok_or_else(|| {
        Error::format(format!(
            "npy shape {:?} of {} has too many characters",
            header.shape, header.dtype
        ))
    })?;
    let mut out: Vec<String> = Vec::with_capacity(n.min(1 << 16));
    let mut current = String::new();
    // NULs seen since the last other character: kept if one follows.
    let mut nuls = 0usize;
    read_items::<4, ()>(r, units, |i, b| {
        let unit = u32::from_le_bytes(le(b, be));
        let (element, index) = (i / width, i % width);
        if unit == 0 {
            nuls += 1;
        } else {
            let c = char::from_u32(unit).ok_or_else(|| {
                Error::format(format!(
                    "string at position {:?}: code unit {unit:#x} (character {index}) \
                     is not a Unicode scalar value",
                    header.position(element)
                ))
            })?;
            current.extend(std::iter::repeat_n('\0', nuls));
            current.push(c);
            nuls = 0;
        }
        if index + 1 == width {
            out.push(std::mem::take(&mut current));
            nuls = 0;
        }
        Ok(())
    })?;
    Ok(out)
}

/// The elements of an `f4` or `f8` array as `T`, in storage order. The
/// caller has checked the dtype.
pub(crate) fn read_reals<T: Real>(r: &mut dyn Read, header: &Header) -> Result<Vec<T>> {
    let (n, be) = (header.len, header.dtype.big_endian);
    match header.dtype.size {
        4 => read_items::<4, _>(r, n, |_, b| {
            Ok(T::from_f64(f64::from(f32::from_le_bytes(le(b, be)))))
        }),
        8 => read_items::<8, _>(r, n, |_, b| Ok(T::from_f64(f64::from_le_bytes(le(b, be))))),
        _ => unreachable!("read_reals called for dtype {}", header.dtype),
    }
}

/// The 16-bit elements of a 2-byte array (`float16`, `uint16`, `int16`,
/// either byte order) as their bits, in storage order.
pub(crate) fn read_bits16(r: &mut dyn Read, header: &Header) -> Result<Vec<u16>> {
    let be = header.dtype.big_endian;
    assert_eq!(
        header.dtype.size, 2,
        "read_bits16 called for dtype {}",
        header.dtype
    );
    read_items::<2, _>(r, header.len, |_, b| Ok(u16::from_le_bytes(le(b, be))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Header> {
        interpret(pylit::parse(text.as_bytes())?, 0)
    }

    #[test]
    fn dtype_strings() {
        let cases = [
            ("<i8", DtypeKind::Int, 8, false, "int64"),
            (">u2", DtypeKind::UInt, 2, true, "uint16"),
            ("|u1", DtypeKind::UInt, 1, false, "uint8"),
            ("|b1", DtypeKind::Bool, 1, false, "bool"),
            ("<f2", DtypeKind::Float, 2, false, "float16"),
            (">f8", DtypeKind::Float, 8, true, "float64"),
            ("<c16", DtypeKind::Other, 16, false, "'<c16'"),
            ("<U3", DtypeKind::Unicode, 12, false, "'<U3'"),
            (">U1", DtypeKind::Unicode, 4, true, "'>U1'"),
            ("<U", DtypeKind::Other, 0, false, "'<U'"),
            (
                "<U18446744073709551615",
                DtypeKind::Other,
                0,
                false,
                "'<U18446744073709551615'",
            ),
            ("|S3", DtypeKind::Other, 3, false, "'|S3'"),
            ("<i3", DtypeKind::Other, 3, false, "'<i3'"),
        ];
        for (descr, kind, size, big, name) in cases {
            let d = Dtype::parse(descr);
            assert_eq!(
                (d.kind(), d.size(), d.is_big_endian()),
                (kind, size, big),
                "{descr}"
            );
            assert_eq!(d.to_string(), name);
            assert_eq!(d.descr(), descr);
        }
    }

    #[test]
    fn header_literals() {
        let h = parse("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }").unwrap();
        assert_eq!(
            (h.shape.as_slice(), h.fortran_order, h.len),
            (&[2, 3][..], true, 6)
        );
        let h =
            parse("{'shape': [], 'descr': \"|u1\", 'fortran_order': False, 'x': None}").unwrap();
        assert_eq!((h.shape.len(), h.len), (0, 1));
        let h = parse("{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (5L,)}").unwrap();
        assert_eq!((h.dtype.descr(), h.len), ("structured", 5));
        for (text, message) in [
            ("[1, 2]", "malformed npy header: not a dict"),
            (
                "{'descr': '<i8' 'x'}",
                "malformed npy header: expected `,` or a closing bracket at byte 16 of the header text",
            ),
            (
                "{'descr': '<i8', 'fortran_order': 0, 'shape': ()}",
                "malformed npy header: `fortran_order` is not a bool",
            ),
            (
                "{'descr': '<i8', 'fortran_order': False, 'shape': 3}",
                "malformed npy header: shape 3 is not a tuple",
            ),
            (
                "{'descr': '<i8', 'fortran_order': False, 'shape': ('a',)}",
                "malformed npy header: shape (\"a\",) is not a tuple of non-negative integers",
            ),
            (
                "{'descr': 'abc",
                "malformed npy header: unterminated string at byte 14 of the header text",
            ),
            (
                "{'descr': nan}",
                "malformed npy header: unknown name at byte 10 of the header text",
            ),
            (
                "{'n': 99999999999999999999999999999999999999999}",
                "malformed npy header: integer too large at byte 44 of the header text",
            ),
        ] {
            assert_eq!(parse(text).unwrap_err().to_string(), message, "{text}");
        }
    }

    #[test]
    fn positions_follow_the_storage_order() {
        let mut h = parse("{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3, 4)}").unwrap();
        assert_eq!(h.position(0), [0, 0, 0]);
        assert_eq!(h.position(4 * 3 + 2 * 4 + 1), [1, 2, 1]);
        h.fortran_order = true;
        assert_eq!(h.position(1 + 2 * 2 + 6), [1, 2, 1]);
        h.shape.clear();
        assert_eq!(h.position(0), Vec::<usize>::new());
    }
}
