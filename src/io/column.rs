//! [`Column`]: a corpus's ids at the width their values need.
//!
//! A corpus of a billion tokens is most of a run's memory, so its ids are
//! kept as `u8`, `u16` or `u32`, whichever holds every value, rather than
//! as the `u32` (or numpy's `int64`) they arrive as: a vocabulary of up to
//! 65,536 tokens costs 2 bytes a token, up to 256 languages 1 byte. No
//! crate stores a `Vec` of integers at a width chosen at run time, which is
//! all this is.

// `each!` expands one body for every width; for `u32` its `u32::from` is
// the identity.
#![allow(clippy::useless_conversion)]

use std::ops::Range;

/// The widths a column can take, narrowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Width {
    /// `u8`: values below 256.
    U8,
    /// `u16`: values below 65,536.
    U16,
    /// `u32`: any id a corpus holds.
    U32,
}

impl Width {
    /// The narrowest width that holds every value below `bound` (a
    /// vocabulary size, a number of languages).
    ///
    /// ```
    /// use splitgrad::io::Width;
    /// assert_eq!(Width::for_bound(256), Width::U8);
    /// assert_eq!(Width::for_bound(257), Width::U16);
    /// assert_eq!(Width::for_bound(151_936), Width::U32);
    /// ```
    pub fn for_bound(bound: u64) -> Width {
        if bound <= 1 << 8 {
            Width::U8
        } else if bound <= 1 << 16 {
            Width::U16
        } else {
            Width::U32
        }
    }

    /// The narrowest width that holds `value`.
    pub fn for_value(value: u32) -> Width {
        Width::for_bound(u64::from(value) + 1)
    }

    /// Bytes of one value.
    pub fn bytes(self) -> usize {
        match self {
            Width::U8 => 1,
            Width::U16 => 2,
            Width::U32 => 4,
        }
    }

    /// numpy's name for it: `"uint8"`, `"uint16"` or `"uint32"`.
    pub fn numpy_name(self) -> &'static str {
        match self {
            Width::U8 => "uint8",
            Width::U16 => "uint16",
            Width::U32 => "uint32",
        }
    }
}

#[derive(Clone, Debug)]
enum Data {
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
}

/// Runs `$body` with `$v` bound to the column's vector, whatever its width.
macro_rules! each {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            Data::U8($v) => $body,
            Data::U16($v) => $body,
            Data::U32($v) => $body,
        }
    };
}

/// A sequence of ids (`u32` values), stored at a [`Width`] that holds them.
///
/// Two columns are equal when they hold the same values, whatever their
/// widths.
///
/// ```
/// use splitgrad::io::{Column, Width};
/// let mut c = Column::from(vec![3u32, 200, 7]);
/// assert_eq!(c.width(), Width::U8);
/// c.push(70_000);
/// assert_eq!((c.width(), c.len(), c.get(3)), (Width::U32, 4, 70_000));
/// assert_eq!(c.iter().collect::<Vec<_>>(), [3, 200, 7, 70_000]);
/// assert_eq!(c, Column::from(vec![3u32, 200, 7, 70_000]));
/// ```
#[derive(Clone, Debug)]
pub struct Column {
    data: Data,
}

impl Default for Column {
    fn default() -> Self {
        Column::with_width(Width::U8, 0)
    }
}

impl Column {
    /// An empty column of this width with room for `capacity` values.
    pub fn with_width(width: Width, capacity: usize) -> Column {
        let data = match width {
            Width::U8 => Data::U8(Vec::with_capacity(capacity)),
            Width::U16 => Data::U16(Vec::with_capacity(capacity)),
            Width::U32 => Data::U32(Vec::with_capacity(capacity)),
        };
        Column { data }
    }

    /// Its width.
    pub fn width(&self) -> Width {
        match self.data {
            Data::U8(_) => Width::U8,
            Data::U16(_) => Width::U16,
            Data::U32(_) => Width::U32,
        }
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        each!(&self.data, v => v.len())
    }

    /// Whether it holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes its values take (not counting spare capacity).
    pub fn bytes(&self) -> u64 {
        self.len() as u64 * self.width().bytes() as u64
    }

    /// Value `i`.
    ///
    /// **Panics** if `i ≥ len()`.
    #[inline]
    #[track_caller]
    pub fn get(&self, i: usize) -> u32 {
        each!(&self.data, v => u32::from(v[i]))
    }

    /// Value `i`, or `None` past the end.
    pub fn try_get(&self, i: usize) -> Option<u32> {
        each!(&self.data, v => v.get(i).map(|&x| u32::from(x)))
    }

    /// The values in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = u32> + '_ {
        (0..self.len()).map(move |i| self.get(i))
    }

    /// Applies `f` to each value in order, with the loop specialised to
    /// the width (faster than [`iter`](Self::iter) over a long column).
    pub fn for_each(&self, mut f: impl FnMut(u32)) {
        each!(&self.data, v => v.iter().for_each(|&x| f(u32::from(x))))
    }

    /// The position of the first value for which `pred` holds.
    pub fn position(&self, mut pred: impl FnMut(u32) -> bool) -> Option<usize> {
        each!(&self.data, v => v.iter().position(|&x| pred(u32::from(x))))
    }

    /// The position of the first value at or above `bound`, found with one
    /// pass for the largest value (which vectorises) and a second only when
    /// there is such a value.
    ///
    /// ```
    /// let c = splitgrad::io::Column::from(vec![3u32, 9, 4, 12]);
    /// assert_eq!(c.first_at_or_above(9), Some(1));
    /// assert_eq!(c.first_at_or_above(13), None);
    /// ```
    pub fn first_at_or_above(&self, bound: u64) -> Option<usize> {
        if (self.max_plus_one() as u64) <= bound {
            return None;
        }
        self.position(|x| u64::from(x) >= bound)
    }

    /// The largest value plus one (0 when empty).
    pub fn max_plus_one(&self) -> usize {
        if self.is_empty() {
            return 0;
        }
        each!(&self.data, v => u32::from(max_of(v)) as usize + 1)
    }

    /// Appends a value, widening the column first if it does not fit.
    pub fn push(&mut self, value: u32) {
        self.reserve_width(Width::for_value(value));
        match &mut self.data {
            // The width was just made to hold `value`.
            Data::U8(v) => v.push(value as u8),
            Data::U16(v) => v.push(value as u16),
            Data::U32(v) => v.push(value),
        }
    }

    /// Appends `values`, widening the column once if one of them does not
    /// fit.
    pub fn extend_from_u32(&mut self, values: &[u32]) {
        if values.is_empty() {
            return;
        }
        let max = values.iter().fold(0, |m, &x| m.max(x));
        self.reserve_width(Width::for_value(max));
        match &mut self.data {
            Data::U8(v) => v.extend(values.iter().map(|&x| x as u8)),
            Data::U16(v) => v.extend(values.iter().map(|&x| x as u16)),
            Data::U32(v) => v.extend_from_slice(values),
        }
    }

    /// Appends values `range` of `other`.
    ///
    /// **Panics** if `range` is not inside `other`.
    #[track_caller]
    pub fn extend_from(&mut self, other: &Column, range: Range<usize>) {
        if self.width() < other.width() {
            let max = each!(&other.data, v => u32::from(v[range.clone()].iter().fold(0, |m, &x| m.max(x))));
            self.reserve_width(Width::for_value(max));
        }
        match (&mut self.data, &other.data) {
            (Data::U8(a), Data::U8(b)) => a.extend_from_slice(&b[range]),
            (Data::U16(a), Data::U16(b)) => a.extend_from_slice(&b[range]),
            (Data::U32(a), Data::U32(b)) => a.extend_from_slice(&b[range]),
            (a, b) => {
                // Checked above: every value of the range fits `a`.
                each!(b, b => {
                    let b = &b[range];
                    match a {
                        Data::U8(a) => a.extend(b.iter().map(|&x| u32::from(x) as u8)),
                        Data::U16(a) => a.extend(b.iter().map(|&x| u32::from(x) as u16)),
                        Data::U32(a) => a.extend(b.iter().map(|&x| u32::from(x))),
                    }
                })
            }
        }
    }

    /// Appends the values of `bytes`, little-endian unsigned integers of
    /// `size` bytes each (1, 2 or 4), widening the column to that size
    /// first if it is narrower.
    ///
    /// **Panics** if `size` is not 1, 2 or 4 or `bytes` is not a whole
    /// number of values.
    #[track_caller]
    pub fn extend_from_le_bytes(&mut self, bytes: &[u8], size: usize) {
        assert!(
            matches!(size, 1 | 2 | 4) && bytes.len().is_multiple_of(size),
            "Column::extend_from_le_bytes: {} bytes of {size}-byte values",
            bytes.len()
        );
        let width = match size {
            1 => Width::U8,
            2 => Width::U16,
            _ => Width::U32,
        };
        self.reserve_width(width);
        match (&mut self.data, size) {
            (Data::U8(v), 1) => v.extend_from_slice(bytes),
            (Data::U16(v), 1) => v.extend(bytes.iter().map(|&b| u16::from(b))),
            (Data::U32(v), 1) => v.extend(bytes.iter().map(|&b| u32::from(b))),
            (Data::U16(v), 2) => v.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| u16::from_le_bytes([b[0], b[1]])),
            ),
            (Data::U32(v), 2) => v.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]]))),
            ),
            (Data::U32(v), _) => v.extend(
                bytes
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ),
            // The column was widened to hold `size` bytes above.
            _ => unreachable!("column narrower than {size} bytes after widening"),
        }
    }

    /// Copies values `src` to start at `dest`, in place (as
    /// [`slice::copy_within`]).
    ///
    /// **Panics** if either range is outside the column.
    #[track_caller]
    pub fn copy_within(&mut self, src: Range<usize>, dest: usize) {
        each!(&mut self.data, v => v.copy_within(src, dest))
    }

    /// Keeps the first `len` values.
    pub fn truncate(&mut self, len: usize) {
        each!(&mut self.data, v => v.truncate(len))
    }

    /// Gives back the spare capacity.
    pub fn shrink_to_fit(&mut self) {
        each!(&mut self.data, v => v.shrink_to_fit())
    }

    /// Makes the column at least `width` wide (one copy when it widens).
    pub fn reserve_width(&mut self, width: Width) {
        if width <= self.width() {
            return;
        }
        let data = std::mem::replace(&mut self.data, Data::U8(Vec::new()));
        self.data = match (data, width) {
            (Data::U8(v), Width::U16) => Data::U16(v.into_iter().map(u16::from).collect()),
            (d, Width::U32) => Data::U32(each!(d, v => v.into_iter().map(u32::from).collect())),
            // Narrower or equal widths returned above.
            (d, _) => d,
        };
    }

    /// The values as `u8`, if that is the width.
    pub fn as_u8(&self) -> Option<&[u8]> {
        match &self.data {
            Data::U8(v) => Some(v),
            _ => None,
        }
    }

    /// The values as `u16`, if that is the width.
    pub fn as_u16(&self) -> Option<&[u16]> {
        match &self.data {
            Data::U16(v) => Some(v),
            _ => None,
        }
    }

    /// The values as `u32`, if that is the width.
    pub fn as_u32(&self) -> Option<&[u32]> {
        match &self.data {
            Data::U32(v) => Some(v),
            _ => None,
        }
    }

    /// The values as `u32`, copied.
    pub fn to_vec(&self) -> Vec<u32> {
        self.iter().collect()
    }

    /// Values `range` as `u32`, copied.
    ///
    /// **Panics** if `range` is not inside the column.
    #[track_caller]
    pub fn values(&self, range: impl std::ops::RangeBounds<usize>) -> Vec<u32> {
        use std::ops::Bound;
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s + 1,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e + 1,
            Bound::Excluded(&e) => e,
            Bound::Unbounded => self.len(),
        };
        each!(&self.data, v => v[start..end].iter().map(|&x| u32::from(x)).collect())
    }
}

/// The largest value of `v` (0 when empty), with 32 running maxima so
/// that the loop vectorises.
fn max_of<T: Copy + Ord + Default>(v: &[T]) -> T {
    let mut lanes = [T::default(); 32];
    let chunks = v.chunks_exact(32);
    let rest = chunks.remainder();
    for c in chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            *m = (*m).max(x);
        }
    }
    let m = rest.iter().fold(T::default(), |m, &x| m.max(x));
    lanes.into_iter().fold(m, T::max)
}

impl From<Vec<u32>> for Column {
    /// The values at the narrowest width that holds them.
    fn from(values: Vec<u32>) -> Column {
        let width = values
            .iter()
            .max()
            .map_or(Width::U8, |&m| Width::for_value(m));
        if width == Width::U32 {
            return Column {
                data: Data::U32(values),
            };
        }
        let mut c = Column::with_width(width, values.len());
        c.extend_from_u32(&values);
        c
    }
}

impl FromIterator<u32> for Column {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Column {
        Column::from(iter.into_iter().collect::<Vec<u32>>())
    }
}

impl PartialEq for Column {
    fn eq(&self, other: &Column) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Column {}

impl PartialEq<[u32]> for Column {
    fn eq(&self, other: &[u32]) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter().copied())
    }
}

impl<const N: usize> PartialEq<[u32; N]> for Column {
    fn eq(&self, other: &[u32; N]) -> bool {
        *self == other[..]
    }
}

impl PartialEq<Vec<u32>> for Column {
    fn eq(&self, other: &Vec<u32>) -> bool {
        *self == other[..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widening_keeps_every_value() {
        let mut c = Column::default();
        let values = [0u32, 255, 256, 65_535, 65_536, u32::MAX, 9];
        for (i, &x) in values.iter().enumerate() {
            c.push(x);
            assert_eq!(c.to_vec(), values[..=i], "after {x}");
        }
        assert_eq!(c.width(), Width::U32);
    }

    #[test]
    fn extend_from_across_widths() {
        let wide = Column::from(vec![1u32, 70_000, 3, 4]);
        let mut narrow = Column::from(vec![5u32]);
        narrow.extend_from(&wide, 2..4);
        assert_eq!(
            (narrow.width(), narrow.to_vec()),
            (Width::U8, vec![5, 3, 4])
        );
        narrow.extend_from(&wide, 0..2);
        assert_eq!(narrow.to_vec(), [5, 3, 4, 1, 70_000]);
        let mut wider = Column::from(vec![100_000u32]);
        wider.extend_from(&Column::from(vec![7u32, 8]), 0..2);
        assert_eq!(wider.to_vec(), [100_000, 7, 8]);
    }

    #[test]
    fn in_place_compaction() {
        let mut c = Column::from(vec![1u32, 2, 3, 4, 5, 6]);
        c.copy_within(3..5, 1);
        c.truncate(3);
        c.shrink_to_fit();
        assert_eq!(c.to_vec(), [1, 4, 5]);
        assert_eq!(c.bytes(), 3);
    }
}
