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

/// An `.npy` v1.0 member: the header dict literal given, padded with
/// spaces and a newline to 64 bytes, then `data`.
pub fn npy(dict: &str, data: &[u8]) -> Vec<u8> {
    let text_len = (10 + dict.len() + 1).div_ceil(64) * 64 - 10;
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(text_len as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.resize(10 + text_len - 1, b' ');
    out.push(b'\n');
    out.extend_from_slice(data);
    out
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

/// Writes a stored zip of `members` (array name → npy bytes) to `path`.
pub fn write_npz(path: &Path, members: &[(&str, Vec<u8>)]) {
    let named: Vec<(String, Vec<u8>)> = members
        .iter()
        .map(|(n, b)| (format!("{n}.npy"), b.clone()))
        .collect();
    let refs: Vec<(&str, Vec<u8>)> = named.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
    std::fs::write(path, zip_bytes(&refs, CompressionMethod::Stored)).unwrap();
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
