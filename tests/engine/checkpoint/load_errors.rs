//! Every way a load can fail: the kind, the file and the tensor named.

use std::fs;
use std::path::Path;

use ndarray::{Array, Array1, Array2};
use splitgrad::checkpoint::{Checkpoint, TensorRef, save};
use splitgrad::{ErrorKind, Rng};

use super::{no_meta, small_checkpoint, temp_dir};

fn assert_format_error(path: &Path) {
    let err = Checkpoint::open(path).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Format { .. }), "{err}");
    assert_eq!(err.file(), Some(path));
    assert!(
        err.to_string()
            .starts_with(&format!("{}: not a", path.display())),
        "{err}"
    );
}

#[test]
fn truncated_files_are_format_errors() {
    let dir = temp_dir("truncated");
    let (_, bytes) = small_checkpoint(&dir);
    let cut = dir.join("cut.safetensors");
    let header_end = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let lengths = [
        0,
        1,
        7,
        8,
        9,
        40,
        header_end - 1,
        header_end,
        header_end + 5,
        bytes.len() - 1,
    ];
    for len in lengths {
        fs::write(&cut, &bytes[..len]).unwrap();
        assert_format_error(&cut);
    }
    // One byte too many is as wrong as one too few.
    let mut long = bytes.clone();
    long.push(0);
    fs::write(&cut, &long).unwrap();
    assert_format_error(&cut);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn random_bytes_and_corrupt_headers_are_format_errors() {
    let dir = temp_dir("garbage");
    let path = dir.join("garbage.safetensors");
    let mut rng = Rng::new(11);
    for len in [3usize, 64, 1000] {
        let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        fs::write(&path, bytes).unwrap();
        assert_format_error(&path);
    }
    // A file of this header length, header and data bytes.
    let file = |len: usize, header: &[u8], data_len: usize| {
        let mut bytes = (len as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header);
        bytes.resize(bytes.len() + data_len, 0);
        fs::write(&path, &bytes).unwrap();
        assert_format_error(&path);
    };
    // A plausible small length followed by bytes that are not JSON.
    file(16, b"{\"a\": [1, 2, 3 ", 0);
    // A header that claims more data than the file has.
    let header = br#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    file(header.len(), header, 8);
    // Offsets that disagree with the shape.
    let header = br#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}}"#;
    file(header.len(), header, 16);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unreadable_paths_are_io_errors() {
    let dir = temp_dir("unreadable");
    let missing = dir.join("nope.safetensors");
    let err = Checkpoint::open(&missing).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Io(e) if e.kind() == std::io::ErrorKind::NotFound));
    assert!(
        err.to_string()
            .starts_with(&format!("{}: ", missing.display()))
    );
    let err = Checkpoint::open(&dir).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Io(_)));
    assert_eq!(err.file(), Some(dir.as_path()));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn dtype_shape_and_missing_errors_name_file_and_tensor() {
    let dir = temp_dir("lookups");
    let (path, _) = small_checkpoint(&dir);
    let ck = Checkpoint::open(&path).unwrap();
    let p = path.display();
    let name = "lm_head.orig.weight";

    let err = ck.get_real::<f32>(name, &[3, 4]).unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Dtype { expected, found } if expected == "F32" && found == "F64")
    );
    assert_eq!(
        err.to_string(),
        format!("{p}: array `{name}`: has dtype F64, expected F32")
    );
    let err = ck.get_i64(name, &[3, 4]).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{p}: array `{name}`: has dtype F64, expected I64")
    );
    let err = ck.get_u64("ids", &[3]).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{p}: array `ids`: has dtype I64, expected U64")
    );
    let err = ck.get_real::<f64>("ids", &[3]).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{p}: array `ids`: has dtype I64, expected F64")
    );

    let err = ck.get_real::<f64>(name, &[4, 3]).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Shape { found, .. } if found == &[3, 4]));
    assert_eq!(
        err.to_string(),
        format!("{p}: array `{name}`: tensor has shape [3, 4], expected (4, 3)")
    );
    let err = ck.get_i64("ids", &[]).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{p}: array `ids`: tensor has shape [3], expected ()")
    );
    let err = ck.get_i64("ids", &[3, 1]).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Shape { .. }));

    let missing = "token_embedding.orig.weight";
    for err in [
        ck.get_real::<f64>(missing, &[3, 4]).unwrap_err(),
        ck.get_i64(missing, &[3]).unwrap_err(),
        ck.get_u64(missing, &[3]).unwrap_err(),
        ck.get(missing).unwrap_err(),
        ck.shape(missing).unwrap_err(),
        ck.check_finite(missing).unwrap_err(),
    ] {
        assert!(matches!(err.kind(), ErrorKind::Missing));
        assert_eq!(
            err.to_string(),
            format!("{p}: array `{missing}`: is missing")
        );
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn expect_names_reports_missing_and_strict_extras() {
    let dir = temp_dir("expect");
    let (path, _) = small_checkpoint(&dir);
    let ck = Checkpoint::open(&path).unwrap();
    ck.expect_names(&["ids", "lm_head.orig.weight"], true)
        .unwrap();
    ck.expect_names(&["ids"], false).unwrap();
    ck.expect_names::<&str>(&[], false).unwrap();

    let err = ck
        .expect_names(&["ids", "lm_head.prompt.weight"], false)
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Missing));
    assert_eq!(err.array(), Some("lm_head.prompt.weight"));
    let err = ck.expect_names(&["lm_head.orig.weight"], true).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Format { .. }));
    assert_eq!(
        err.to_string(),
        format!(
            "{}: array `ids`: is not expected in this checkpoint",
            path.display()
        )
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn check_finite_finds_the_first_non_finite_element() {
    let dir = temp_dir("finite");
    let path = dir.join("model.safetensors");
    let mut a = Array2::<f32>::from_elem((3, 4), 1.0);
    a[[2, 1]] = f32::NEG_INFINITY;
    a[[2, 3]] = f32::NAN;
    let mut b = Array::<f64, _>::zeros((2, 2, 2));
    b[[1, 0, 1]] = f64::NAN;
    let good = Array1::from(vec![f64::MAX, f64::MIN, 5e-324, -0.0]);
    let ints = Array1::from(vec![1u64]);
    let bf = |x: f32| half::bf16::from_f32(x);
    let hb = Array2::from_shape_vec(
        (2, 2),
        vec![bf(1.0), bf(-0.0), half::bf16::INFINITY, bf(2.0)],
    )
    .unwrap();
    let hf = Array1::from(vec![
        half::f16::MAX,
        half::f16::from_f32(1.0),
        half::f16::NAN,
    ]);
    let good_halves = Array1::from(vec![
        half::bf16::MAX,
        half::bf16::MIN,
        half::bf16::from_bits(1),
        half::bf16::NEG_ZERO,
    ]);
    let tensors: Vec<(&str, TensorRef<'_>)> = vec![
        ("a", (&a).into()),
        ("b", (&b).into()),
        ("good", (&good).into()),
        ("ints", (&ints).into()),
        ("hb", (&hb).into()),
        ("hf", (&hf).into()),
        ("good_halves", (&good_halves).into()),
    ];
    save(&path, &tensors, &no_meta()).unwrap();
    let ck = Checkpoint::open(&path).unwrap();
    let p = path.display();

    let err = ck.check_finite("a").unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::NonFinite { position, value }
        if position == &[2, 1] && *value == f64::NEG_INFINITY)
    );
    assert_eq!(
        err.to_string(),
        format!("{p}: array `a`: non-finite value -inf at position [2, 1]")
    );
    let err = ck.check_finite("b").unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::NonFinite { position, value }
        if position == &[1, 0, 1] && value.is_nan())
    );
    ck.check_finite("good").unwrap();
    let err = ck.check_finite("hb").unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{p}: array `hb`: non-finite value inf at position [1, 0]")
    );
    let err = ck.check_finite("hf").unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::NonFinite { position, value }
        if position == &[2] && value.is_nan())
    );
    ck.check_finite("good_halves").unwrap();
    let err = ck.check_finite("ints").unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{p}: array `ints`: has dtype U64, expected F32, F64, BF16 or F16")
    );
    fs::remove_dir_all(&dir).unwrap();
}
