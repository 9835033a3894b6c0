//! Helpers shared by the `io_*` tests: scratch folders and hand-built
//! `.npy` members and zip archives, so fixtures are visibly correct.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};

use ndarray::{Array1, Array2};
use npyz::zip::write::FileOptions;
use npyz::zip::{CompressionMethod, ZipWriter};
use splitgrad::io::NpzWriter;

/// A fresh, empty folder for one test.
pub fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("io").join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One 1-D array (or 2-D zeros) of a fixture, written by [`write_arrays`].
#[derive(Clone, Copy, Debug)]
pub enum Arr {
    I64(&'static [i64]),
    F64(&'static [f64]),
    F32(&'static [f32]),
    /// An int64 array of zeros of this 2-D shape.
    Zeros2(usize, usize),
}

/// Writes `dir/name`, an `.npz` of these arrays through [`NpzWriter`],
/// and returns its path.
pub fn write_arrays(dir: &Path, name: &str, arrays: &[(&str, Arr)]) -> PathBuf {
    let path = dir.join(name);
    let mut w = NpzWriter::new(&path);
    for &(array, values) in arrays {
        match values {
            Arr::I64(v) => w.add(array, &Array1::from(v.to_vec())),
            Arr::F64(v) => w.add(array, &Array1::from(v.to_vec())),
            Arr::F32(v) => w.add(array, &Array1::from(v.to_vec())),
            Arr::Zeros2(r, c) => w.add(array, &Array2::<i64>::zeros((r, c))),
        };
    }
    w.finish().unwrap();
    path
}

/// The `.npy` member of the fuzz targets' structured inputs (the replay
/// of the fuzz corpora loads the same file with the bodies).
#[allow(clippy::duplicate_mod)]
#[path = "../../fuzz/src/bodies/npy.rs"]
mod npy;

pub use npy::npy;

/// The names in `dir`, sorted.
pub fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The usual header dict for `descr` and a shape written as Python does.
pub fn dict(descr: &str, shape: &str) -> String {
    format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}")
}

/// A zip archive of the given members (full member names, bytes).
pub fn zip_bytes(members: &[(&str, Vec<u8>)], method: CompressionMethod) -> Vec<u8> {
    let mut zip = ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, bytes) in members {
        zip.start_file(*name, FileOptions::default().compression_method(method))
            .unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

/// A stored zip of `members` (array name → npy bytes): an `.npz`.
pub fn npz_bytes(members: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let named: Vec<(String, Vec<u8>)> = members
        .iter()
        .map(|(n, b)| (format!("{n}.npy"), b.clone()))
        .collect();
    let refs: Vec<(&str, Vec<u8>)> = named.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
    zip_bytes(&refs, CompressionMethod::Stored)
}

/// Writes [`npz_bytes`] of `members` to `path`.
pub fn write_npz(path: &Path, members: &[(&str, Vec<u8>)]) {
    std::fs::write(path, npz_bytes(members)).unwrap();
}

/// Little-endian bytes of `i64` values.
pub fn le_i64(values: &[i64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Little-endian bytes of `f64` values.
pub fn le_f64(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// An `int64` 1-D member.
pub fn i64_member(values: &[i64]) -> Vec<u8> {
    npy(
        &dict("<i8", &format!("({},)", values.len())),
        &le_i64(values),
    )
}

/// The error's message, after checking that `result` failed.
#[track_caller]
pub fn message<T: std::fmt::Debug>(result: splitgrad::Result<T>) -> (splitgrad::Error, String) {
    let e = result.expect_err("expected an error");
    let m = e.to_string();
    (e, m)
}

/// The members of a file a row writes.
pub type Members = Vec<(&'static str, Vec<u8>)>;

/// A row of a table of load errors: what the file holds (`None`: no file
/// there), the kind of error the load gives and its message (`{dir}` for
/// the row's folder).
pub struct LoadRow {
    pub name: &'static str,
    pub members: Option<fn() -> Members>,
    pub kind: fn(&splitgrad::ErrorKind) -> bool,
    pub want: crate::common::table::Want,
}

/// A [`LoadRow`] of a file of these members.
pub fn load_row(
    name: &'static str,
    members: fn() -> Members,
    kind: fn(&splitgrad::ErrorKind) -> bool,
    want: crate::common::table::Want,
) -> LoadRow {
    LoadRow {
        name,
        members: Some(members),
        kind,
        want,
    }
}

/// Runs each row: writes `group/NAME/file` of its members (a stored npz),
/// loads it with `load`, and checks the error names the file and has the
/// row's kind and message.
pub fn run_load_rows<T: std::fmt::Debug>(
    group: &str,
    file: &str,
    rows: &[LoadRow],
    load: impl Fn(&Path) -> splitgrad::Result<T> + Sync,
) {
    crate::common::table::run_rows(
        rows,
        |r| r.name,
        |row| {
            let dir = scratch(&format!("{group}/{}", row.name));
            let path = dir.join(file);
            if let Some(members) = row.members {
                write_npz(&path, &members());
            }
            let (e, m) = message(load(&path));
            assert_eq!(e.file(), Some(path.as_path()), "{m}");
            assert!((row.kind)(e.kind()), "{:?}: {m}", e.kind());
            row.want.check(&m, dir.to_str().unwrap());
        },
    );
}
