//! Failed saves: refused names, missing and unwritable folders, a rename
//! that fails; the old file survives and no temporary file is left.

use std::fs;

use ndarray::{Array1, arr0};
use splitgrad::ErrorKind;
use splitgrad::checkpoint::{Checkpoint, save};

use super::{files_in, no_meta, small_checkpoint, temp_dir};

#[test]
fn bad_names_are_refused_before_anything_is_written() {
    let dir = temp_dir("names");
    let path = dir.join("model.safetensors");
    let x = arr0(1.0f32);
    let err = save(&path, &[("x", (&x).into()), ("x", (&x).into())], &no_meta()).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Config { .. }));
    assert_eq!(err.array(), Some("x"));
    assert_eq!(err.file(), Some(path.as_path()));
    let err = save(&path, &[("__metadata__", (&x).into())], &no_meta()).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Config { .. }));
    assert!(files_in(&dir).is_empty());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn saving_into_a_missing_folder_is_an_io_error_naming_the_path() {
    let dir = temp_dir("noparent");
    let path = dir.join("no/such/folder/model.safetensors");
    let x = arr0(1.0f32);
    let err = save(&path, &[("x", (&x).into())], &no_meta()).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Io(e) if e.kind() == std::io::ErrorKind::NotFound));
    assert!(
        err.to_string()
            .starts_with(&format!("{}: ", path.display()))
    );
    assert!(files_in(&dir).is_empty());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_save_overwrites_and_a_failed_save_leaves_the_old_file() {
    let dir = temp_dir("overwrite");
    let (path, before) = small_checkpoint(&dir);
    // A successful save replaces the file.
    let y = Array1::from(vec![4u64, 2]);
    save(&path, &[("y", (&y).into())], &no_meta()).unwrap();
    assert_eq!(Checkpoint::open(&path).unwrap().names(), ["y"]);
    let (path, before_again) = small_checkpoint(&dir);
    assert_eq!(before_again, before);

    // The rename fails when the target is a non-empty folder: the folder
    // and the file beside it are untouched and no temporary file remains.
    let target = dir.join("taken");
    fs::create_dir(&target).unwrap();
    fs::write(target.join("keep"), b"keep").unwrap();
    let err = save(&target, &[("y", (&y).into())], &no_meta()).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Io(_)));
    assert_eq!(err.file(), Some(target.as_path()));
    assert_eq!(files_in(&dir), ["model.safetensors", "taken"]);
    assert_eq!(fs::read(target.join("keep")).unwrap(), b"keep");
    assert_eq!(fs::read(&path).unwrap(), before);
    fs::remove_dir_all(&dir).unwrap();
}

/// Only meaningful when not root (root writes into read-only folders):
/// the test then checks nothing and says so.
#[cfg(unix)]
#[test]
fn a_read_only_folder_keeps_its_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir("readonly");
    let (path, before) = small_checkpoint(&dir);
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o555)).unwrap();
    let probe = dir.join("probe");
    if fs::write(&probe, b"").is_ok() {
        eprintln!("running as root: a read-only folder is writable, nothing to check");
        fs::remove_file(&probe).unwrap();
    } else {
        let y = arr0(2.0f64);
        let err = save(&path, &[("y", (&y).into())], &no_meta()).unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::Io(e) if e.kind() == std::io::ErrorKind::PermissionDenied)
        );
        assert_eq!(err.file(), Some(path.as_path()));
        assert_eq!(fs::read(&path).unwrap(), before);
        assert_eq!(files_in(&dir), ["model.safetensors"]);
    }
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    fs::remove_dir_all(&dir).unwrap();
}
