//! `write_atomic` and `NpzWriter::finish`: the target is replaced whole or
//! not at all, and nothing but the target is left in its folder.

use std::io::Write;

use crate::io_common::{listing, message, scratch};
use ndarray::arr1;
use splitgrad::io::{NpzReader, NpzWriter, write_atomic};
use splitgrad::{Error, ErrorKind};

#[test]
fn a_successful_write_replaces_the_file_and_leaves_nothing_else() {
    let dir = scratch("atomic_success");
    let path = dir.join("out.bin");
    std::fs::write(&path, b"old contents, longer than the new").unwrap();
    write_atomic(&path, |f| Ok(f.write_all(b"new")?)).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"new");
    assert_eq!(listing(&dir), ["out.bin"]);
}

#[test]
fn a_failing_closure_leaves_the_old_file_and_no_temporary() {
    let dir = scratch("atomic_failure");
    let path = dir.join("out.bin");
    std::fs::write(&path, b"precious").unwrap();
    let (e, m) = message(write_atomic(&path, |f| {
        f.write_all(&[0u8; 100_000])?;
        Err(Error::config("the writer gave up"))
    }));
    assert!(matches!(e.kind(), ErrorKind::Config { .. }));
    assert_eq!(m, format!("{}: the writer gave up", path.display()));
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    assert_eq!(listing(&dir), ["out.bin"]);
}

#[test]
fn a_panicking_closure_leaves_the_old_file_and_no_temporary() {
    let dir = scratch("atomic_panic");
    let path = dir.join("out.bin");
    std::fs::write(&path, b"precious").unwrap();
    let result = std::panic::catch_unwind(|| {
        let _ = write_atomic(&path, |f| {
            f.write_all(b"partial").unwrap();
            panic!("writer bug");
        });
    });
    assert!(result.is_err());
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    assert_eq!(listing(&dir), ["out.bin"]);
}

#[test]
fn a_missing_or_unusable_folder_is_an_io_error_naming_the_path() {
    let dir = scratch("atomic_no_folder");
    let path = dir.join("no-such-folder").join("out.npz");
    let (e, m) = message(write_atomic(&path, |_| Ok(())));
    assert!(matches!(e.kind(), ErrorKind::Io(_)));
    assert_eq!(e.file(), Some(path.as_path()));
    let folder = dir.join("no-such-folder");
    assert!(
        m.starts_with(&format!(
            "{}: cannot create a temporary file in {}: ",
            path.display(),
            folder.display()
        )),
        "{m}"
    );
    // A file where the folder should be.
    std::fs::write(dir.join("plain"), b"").unwrap();
    let under_file = dir.join("plain").join("out.npz");
    let (e, _) = message(write_atomic(&under_file, |_| Ok(())));
    assert!(matches!(e.kind(), ErrorKind::Io(_)));
    // The path is a folder: refused before any temporary file is made.
    std::fs::create_dir(dir.join("taken")).unwrap();
    std::fs::write(dir.join("taken").join("inside"), b"x").unwrap();
    let (e, m) = message(write_atomic(dir.join("taken"), |f| {
        Ok(f.write_all(b"data")?)
    }));
    assert!(matches!(e.kind(), ErrorKind::Io(_)));
    assert!(m.ends_with("taken: is a folder, not a file"), "{m}");
    assert_eq!(listing(&dir), ["plain", "taken"]);
}

#[test]
fn npz_finish_is_atomic() {
    let dir = scratch("npz_finish");
    let path = dir.join("arrays.npz");
    let mut first = NpzWriter::new(&path);
    first.add("x", &arr1(&[1i64, 2]));
    first.finish().unwrap();
    let mut second = NpzWriter::new(&path);
    second.add("y", &arr1(&[3.5f64]));
    second.finish().unwrap();
    let mut r = NpzReader::open(&path).unwrap();
    assert_eq!(r.names(), ["y"]);
    assert_eq!(r.reals::<f64>("y").unwrap(), arr1(&[3.5]).into_dyn());
    assert_eq!(listing(&dir), ["arrays.npz"]);

    let mut w = NpzWriter::new(dir.join("missing").join("a.npz"));
    w.add_scalar("z", 1u8);
    let (e, _) = message(w.finish());
    assert!(matches!(e.kind(), ErrorKind::Io(_)));
}

#[test]
#[should_panic(expected = "NpzWriter::add: array `x` added twice")]
fn adding_a_name_twice_is_a_caller_bug() {
    let mut w = NpzWriter::new("unused.npz");
    w.add_scalar("x", 1i64).add_scalar("x", 2i64);
}
