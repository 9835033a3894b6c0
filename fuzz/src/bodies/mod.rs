//! The fuzz target bodies: plain functions of bytes, free of libFuzzer
//! types, so the same code runs under `cargo fuzz` (one `fuzz_target!` per
//! function) and in the main crate's `tests/fuzz_replay.rs`, which replays
//! the committed corpora and the regressions with stable Rust.
//!
//! A body returns normally for every input; a panic is a finding. Inputs
//! from files may be rejected with an `Err` (that is the point), but an
//! `Ok` result must satisfy the invariants asserted here.
//!
//! Here: the byte reader and the helpers every body uses; the bodies are
//! in `loaders` (the index, corpus and checkpoint loaders, and the
//! routing), `differential` (fast kernels against their naive twins) and
//! `golden` (`golden eval`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use splitgrad::io::NpzReader;

mod differential;
mod golden;
mod loaders;
mod npy;

pub use differential::differential;
pub use golden::{golden_eval, golden_input_names};
pub use loaders::{checkpoint_loader, checkpoint_trainer, corpus_loader, index_loader, routing};
pub use npy::npy;

// ---------------------------------------------------------------------------
// Helpers

/// Reads fuzz bytes as small numbers; past the end it yields zeros, so
/// every input decodes to something.
pub(crate) struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Bytes { data }
    }

    pub(crate) fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    pub(crate) fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub(crate) fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        b.iter_mut().for_each(|x| *x = self.u8());
        u64::from_le_bytes(b)
    }

    /// A number in `0..n` (n ≥ 1).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        if n <= 256 {
            self.u8() as usize % n
        } else {
            self.u16() as usize % n
        }
    }

    pub(crate) fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// A finite real in `[-scale, scale]`, on a grid of 2^-14 of the scale.
    pub(crate) fn real(&mut self, scale: f64) -> f64 {
        f64::from(self.u16() as i16) / 32768.0 * scale
    }

    pub(crate) fn rest(&self) -> &'a [u8] {
        self.data
    }
}

static NEXT_FILE: AtomicU64 = AtomicU64::new(0);

/// A scratch file that is removed when dropped. Names are unique per
/// process and call, so replay tests may run in parallel.
pub(crate) struct ScratchFile(pub(crate) PathBuf);

impl ScratchFile {
    pub(crate) fn with(tag: &str, bytes: &[u8]) -> Self {
        let dir = std::env::temp_dir().join(format!("splitgrad-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp folder");
        let n = NEXT_FILE.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("{tag}-{n}"));
        std::fs::write(&path, bytes).expect("write a scratch file");
        ScratchFile(path)
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Touches every array of an archive the way the loaders do; errors are
/// fine, panics are not.
pub(crate) fn read_every_member(npz: &mut NpzReader) {
    for name in npz.names().to_vec() {
        let _ = npz.dtype(&name);
        let _ = npz.shape(&name);
        let _ = npz.ints(&name);
        let _ = npz.ints_1d(&name);
        let _ = npz.reals::<f32>(&name);
        let _ = npz.finite_reals::<f64>(&name);
        let _ = npz.real_dtype(&name);
        let _ = npz.strings_1d(&name);
        let _ = npz.string_scalar(&name);
    }
}

/// One element type a structured member may have: numpy's `descr`, its
/// size, whether it is a float, an integer (and signed) or neither.
const DTYPES: [(&str, usize, char); 10] = [
    ("<i8", 8, 'i'),
    ("<i4", 4, 'i'),
    ("|u1", 1, 'u'),
    ("<u8", 8, 'u'),
    (">i2", 2, 'i'),
    ("<f8", 8, 'f'),
    ("<f4", 4, 'f'),
    (">f8", 8, 'f'),
    ("|b1", 1, 'b'),
    ("<U2", 8, 'o'),
];

/// One element, mostly small (a valid id), sometimes extreme.
fn element(b: &mut Bytes, kind: char, size: usize, big_endian: bool) -> Vec<u8> {
    let x = b.u8();
    let int: i64 = match x {
        0..=199 => i64::from(x % 12),
        200 => -1,
        201 => i64::MAX,
        202 => i64::MIN,
        203 => 1 << 32,
        204 => -(1 << 40),
        _ => i64::from(x),
    };
    let float: f64 = match x {
        0..=199 => f64::from(x % 12) / 2.0,
        200 => f64::NAN,
        201 => f64::INFINITY,
        202 => f64::NEG_INFINITY,
        203 => 1e300,
        204 => -0.0,
        _ => f64::from(x),
    };
    let mut bytes = match (kind, size) {
        ('f', 4) => (float as f32).to_le_bytes().to_vec(),
        ('f', _) => float.to_le_bytes().to_vec(),
        (_, 8) => int.to_le_bytes().to_vec(),
        (_, 4) => (int as i32).to_le_bytes().to_vec(),
        (_, 2) => (int as i16).to_le_bytes().to_vec(),
        (_, n) => int.to_le_bytes()[..n].to_vec(),
    };
    if big_endian {
        bytes.reverse();
    }
    bytes
}

/// An `.npz` built from fuzz bytes, so that inputs reach past the zip
/// layer (whose CRCs a byte-level mutation rarely keeps): members named
/// from `names`, each a `.npy` v1.0 member with a header of a chosen dtype,
/// order and shape (now and then raw fuzz text instead), and data of the
/// size the header promises (now and then a byte short or long), stored
/// or deflated.
pub(crate) fn structured_npz(b: &mut Bytes, names: &[&str]) -> Vec<u8> {
    use npyz::zip::write::FileOptions;
    use npyz::zip::{CompressionMethod, ZipWriter};
    use std::io::Write;

    let mut zip = ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let n_members = b.below(names.len() + 1) + 1;
    for _ in 0..n_members {
        let name = names[b.below(names.len())];
        let (descr, size, kind) = DTYPES[b.below(DTYPES.len())];
        let fortran = b.bool();
        let ndim = b.below(3);
        let shape: Vec<usize> = (0..ndim).map(|_| b.below(9)).collect();
        let n: usize = shape.iter().product();
        let shape_text = match shape.as_slice() {
            [d] => format!("({d},)"),
            _ => format!(
                "({})",
                shape
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let flaw = b.u8() % 16;
        let dict = if flaw == 0 {
            let len = b.below(48);
            let raw: Vec<u8> = (0..len).map(|_| b.u8()).collect();
            String::from_utf8_lossy(&raw).into_owned()
        } else {
            let order = if fortran { "True" } else { "False" };
            format!("{{'descr': '{descr}', 'fortran_order': {order}, 'shape': {shape_text}, }}")
        };
        let data: Vec<u8> = (0..n)
            .flat_map(|_| element(b, kind, size, descr.starts_with('>')))
            .collect();
        let mut member = npy(&dict, &data);
        match flaw {
            1 => {
                member.pop();
            }
            2 => member.push(0),
            _ => {}
        }
        let method = if b.bool() {
            CompressionMethod::Deflated
        } else {
            CompressionMethod::Stored
        };
        let options = FileOptions::default().compression_method(method);
        if zip.start_file(format!("{name}.npy"), options).is_ok() {
            zip.write_all(&member).expect("write to memory");
        }
    }
    zip.finish().expect("finish in memory").into_inner()
}
