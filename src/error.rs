//! The crate's one error type.
//!
//! An [`Error`] is a [`ErrorKind`] — what went wrong, with structured
//! fields (the id and the range it missed, the shape expected and found) —
//! plus where: the file and the array (or checkpoint tensor) it concerns.
//! Its `Display` is one line that names all of them, so a command-line
//! user sees e.g.
//!
//! ```text
//! index.npz: array `token_index`: token id 70000 at position [12] is out of range 0..32000
//! ```

use std::fmt;
use std::path::{Path, PathBuf};

/// `Result<T, splitgrad::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong.
#[derive(Debug)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A layer or optimiser was configured inconsistently (empty split
    /// order, a split named twice, hidden size 0, …).
    Config {
        /// What is wrong, in words.
        message: String,
    },
    /// An integer (an id, a label, an index entry) outside its valid range.
    OutOfRange {
        /// What the value is: `"input id"`, `"label"`, `"token id"`, ….
        what: &'static str,
        /// Its position (multi-index) in the array it came from.
        position: Vec<usize>,
        /// The value.
        value: i64,
        /// The smallest valid value.
        low: i64,
        /// One past the largest valid value.
        high: i64,
    },
    /// An array whose shape is not the one expected.
    Shape {
        /// What the array is.
        what: String,
        /// The shape expected, in words (`"(32000, 64)"`, `"1-D"`).
        expected: String,
        /// The shape found.
        found: Vec<usize>,
    },
    /// An array whose element type is not the one expected.
    Dtype {
        /// The dtypes accepted, in words.
        expected: String,
        /// The dtype found.
        found: String,
    },
    /// A required array (or checkpoint tensor) is absent.
    Missing,
    /// An index or corpus with no entries.
    Empty,
    /// A (language, token) pair listed twice in an index.
    DuplicatePair {
        /// Position of the second occurrence.
        position: usize,
        /// Position of the first occurrence.
        first: usize,
        /// The language.
        language: i64,
        /// The token.
        token: i64,
    },
    /// A NaN or infinite real.
    NonFinite {
        /// Its position (multi-index).
        position: Vec<usize>,
        /// The value.
        value: f64,
    },
    /// Training produced a non-finite loss or parameter.
    Diverged {
        /// The step at which it was detected (0-based).
        step: u64,
        /// What became non-finite.
        message: String,
    },
    /// A file that is not in the expected format (not a zip, a truncated
    /// header, a corrupt safetensors file, …).
    Format {
        /// What the parser said.
        message: String,
    },
    /// Something a file or a flag asks for would take more memory than
    /// the machine has (checked before it is allocated).
    TooLarge {
        /// What would be allocated, and where its size came from.
        what: String,
        /// The bytes it would take (`u64::MAX` when that overflows).
        bytes: u64,
        /// The bytes available.
        available: u64,
        /// What changes it (a flag), or empty.
        hint: String,
    },
    /// An operating-system error while reading or writing.
    Io(std::io::Error),
}

/// The error of every fallible function in the crate.
///
/// ```
/// use splitgrad::{Error, ErrorKind};
/// let e = Error::new(ErrorKind::Missing).in_file("index.npz").in_array("token_index");
/// assert_eq!(e.to_string(), "index.npz: array `token_index`: is missing");
/// assert!(matches!(e.kind(), ErrorKind::Missing));
/// ```
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    file: Option<PathBuf>,
    array: Option<String>,
}

impl Error {
    /// An error of this kind, with no file or array yet.
    pub fn new(kind: ErrorKind) -> Self {
        Error {
            kind,
            file: None,
            array: None,
        }
    }

    /// A [`ErrorKind::Config`] error.
    pub fn config(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Config {
            message: message.into(),
        })
    }

    /// A [`ErrorKind::Format`] error.
    pub fn format(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Format {
            message: message.into(),
        })
    }

    /// A [`ErrorKind::Shape`] error.
    pub fn shape(what: impl Into<String>, expected: impl Into<String>, found: &[usize]) -> Self {
        Error::new(ErrorKind::Shape {
            what: what.into(),
            expected: expected.into(),
            found: found.to_vec(),
        })
    }

    /// A [`ErrorKind::OutOfRange`] error for `value` at `position`, valid range `low..high`.
    pub fn out_of_range(
        what: &'static str,
        position: Vec<usize>,
        value: i64,
        low: i64,
        high: i64,
    ) -> Self {
        Error::new(ErrorKind::OutOfRange {
            what,
            position,
            value,
            low,
            high,
        })
    }

    /// Names the file this error concerns (kept if one is already named).
    pub fn in_file(mut self, path: impl AsRef<Path>) -> Self {
        if self.file.is_none() {
            self.file = Some(path.as_ref().to_path_buf());
        }
        self
    }

    /// Names the array (or checkpoint tensor) this error concerns (kept if
    /// one is already named).
    pub fn in_array(mut self, name: impl Into<String>) -> Self {
        if self.array.is_none() {
            self.array = Some(name.into());
        }
        self
    }

    /// Puts `prefix` before the array's name, if one is named (an entry
    /// of a group, reported under its full name).
    pub fn prefix_array(mut self, prefix: &str) -> Self {
        if let Some(a) = &self.array {
            self.array = Some(format!("{prefix}{a}"));
        }
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }

    /// The file, if one is named.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// The array or tensor, if one is named.
    pub fn array(&self) -> Option<&str> {
        self.array.as_deref()
    }
}

impl From<crate::kernels::routing::Unrouted> for Error {
    /// An id no split owns: [`ErrorKind::OutOfRange`] with the valid range
    /// `0..V`.
    fn from(u: crate::kernels::routing::Unrouted) -> Self {
        Error::out_of_range(u.what, vec![u.position], u.id, 0, u.vocab_size)
    }
}

pub(crate) fn fmt_position(p: &[usize]) -> String {
    let parts: Vec<String> = p.iter().map(|i| i.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}: ", file.display())?;
        }
        if let Some(array) = &self.array {
            write!(f, "array `{array}`: ")?;
        }
        match &self.kind {
            ErrorKind::Config { message } => write!(f, "{message}"),
            ErrorKind::OutOfRange {
                what,
                position,
                value,
                low,
                high,
            } => write!(
                f,
                "{what} {value} at position {} is out of range {low}..{high}",
                fmt_position(position)
            ),
            ErrorKind::Shape {
                what,
                expected,
                found,
            } => {
                write!(f, "{what} has shape {found:?}, expected {expected}")
            }
            ErrorKind::Dtype { expected, found } => {
                write!(f, "has dtype {found}, expected {expected}")
            }
            ErrorKind::Missing => write!(f, "is missing"),
            ErrorKind::Empty => write!(f, "is empty"),
            ErrorKind::DuplicatePair {
                position,
                first,
                language,
                token,
            } => write!(
                f,
                "pair (language {language}, token {token}) at position [{position}] repeats position [{first}]"
            ),
            ErrorKind::NonFinite { position, value } => {
                write!(
                    f,
                    "non-finite value {value} at position {}",
                    fmt_position(position)
                )
            }
            ErrorKind::Diverged { step, message } => {
                write!(f, "training diverged at step {step}: {message}")
            }
            ErrorKind::Format { message } => write!(f, "{message}"),
            ErrorKind::TooLarge {
                what,
                bytes,
                available,
                hint,
            } => {
                let need = if *bytes == u64::MAX {
                    "more than 16.0 EiB".to_string()
                } else {
                    human_bytes(*bytes)
                };
                write!(
                    f,
                    "{what} needs {need}, more than the {} of memory available",
                    human_bytes(*available)
                )?;
                if !hint.is_empty() {
                    write!(f, "; {hint}")?;
                }
                Ok(())
            }
            ErrorKind::Io(e) => write!(f, "{e}"),
        }
    }
}

/// A byte count for a person: `512 B`, `3.2 MiB`, `8.0 TiB`, as the memory
/// errors above and the memory plans of the application print it.
///
/// ```
/// use splitgrad::error::human_bytes;
/// assert_eq!(human_bytes(512), "512 B");
/// assert_eq!(human_bytes(3 << 20), "3.0 MiB");
/// assert_eq!(human_bytes(8_000_000_000_000), "7.3 TiB");
/// ```
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut x = bytes as f64 / 1024.0;
    let mut unit = 0;
    while x >= 1024.0 && unit + 1 < UNITS.len() {
        x /= 1024.0;
        unit += 1;
    }
    format!("{x:.1} {}", UNITS[unit])
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::new(ErrorKind::Io(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_file_array_position_and_range() {
        let e = Error::out_of_range("token id", vec![12], 70000, 0, 32000)
            .in_file("index.npz")
            .in_array("token_index");
        assert_eq!(
            e.to_string(),
            "index.npz: array `token_index`: token id 70000 at position [12] is out of range 0..32000"
        );
    }

    #[test]
    fn first_context_wins() {
        let e = Error::new(ErrorKind::Empty)
            .in_array("a")
            .in_array("b")
            .in_file("x")
            .in_file("y");
        assert_eq!(e.to_string(), "x: array `a`: is empty");
    }
}
