//! The loader's unit tests: offsets, header faults, and reading from the
//! file as it was opened.
use super::*;
use std::fs;

/// Eight tensors of 2^61 − 1 bytes each end at 2^64 − 8: safetensors
/// 0.8 overflows `buffer_end + N_LEN + n` on this header (a panic in a
/// debug build) unless it is rejected first.
#[test]
fn offsets_near_usize_max_are_a_format_error_not_a_panic() {
    let big: u64 = (1 << 61) - 1;
    let parts: Vec<String> = (0..8u64)
        .map(|i| {
            format!(
                "\"t{i}\":{{\"dtype\":\"U8\",\"shape\":[{big}],\"data_offsets\":[{},{}]}}",
                i * big,
                (i + 1) * big
            )
        })
        .collect();
    let header = format!("{{{}}}", parts.join(","));
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());

    let dir = crate::checkpoint::test_dir("overflow");
    let path = dir.join("evil.safetensors");
    fs::write(&path, &bytes).unwrap();
    let err = Checkpoint::open(&path).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Format { .. }));
    assert_eq!(
        err.to_string(),
        format!(
            "{}: not a safetensors file: a byte offset in the header is too large",
            path.display()
        )
    );
    fs::remove_dir_all(&dir).unwrap();
}

/// A header that does not deserialise names the tensor at fault and
/// what is wrong with its entry.
#[test]
fn a_bad_entry_is_named_with_its_fault() {
    let dir = crate::checkpoint::test_dir("diagnose");
    let cases = [
        (
            r#""dtype":"BF17","shape":[2],"data_offsets":[0,4]"#,
            "dtype \"BF17\": not a safetensors dtype",
        ),
        (
            r#""dtype":"F32","shape":[-2],"data_offsets":[0,8]"#,
            "shape [-2]: not a list of sizes",
        ),
        (
            r#""dtype":"F32","shape":[4000000000,4000000000,4000000000],"data_offsets":[0,8]"#,
            "shape [4000000000, 4000000000, 4000000000] of F32 is more bytes than a file can hold",
        ),
        (
            r#""dtype":"F32","shape":[3],"data_offsets":[0,8]"#,
            "data_offsets [0, 8] span 8 bytes; shape [3] of F32 is 12",
        ),
    ];
    for (i, (entry, fault)) in cases.iter().enumerate() {
        let header = format!(
            r#"{{"a":{{"dtype":"F32","shape":[2],"data_offsets":[0,8]}},"b":{{{entry}}}}}"#
        );
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(&[0; 16]);
        let path = dir.join(format!("{i}.safetensors"));
        fs::write(&path, &bytes).unwrap();
        let err = Checkpoint::open(&path).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "{}: not a valid safetensors file: tensor `b`: {fault}",
                path.display()
            )
        );
    }
    fs::remove_dir_all(&dir).unwrap();
}

/// Numbers near `u64::MAX` in the metadata (a run's seed, a corpus
/// named by one) are not offsets: such a file opens and reads.
#[test]
fn large_numbers_in_the_metadata_are_not_taken_for_offsets() {
    let dir = crate::checkpoint::test_dir("bigmeta");
    let path = dir.join("seed.safetensors");
    let meta = BTreeMap::from([
        ("seed".to_string(), u64::MAX.to_string()),
        ("corpus".to_string(), "18446744073709551610.npz".to_string()),
    ]);
    let w = ndarray::arr1(&[1.5f32, -2.0]);
    super::super::save(&path, &[("w", (&w).into())], &meta).unwrap();
    let ck = Checkpoint::open(&path).unwrap();
    assert_eq!(ck.metadata(), &meta);
    assert_eq!(ck.get_real::<f32>("w", &[2]).unwrap(), w.into_dyn());
    fs::remove_dir_all(&dir).unwrap();
}

/// Tensors are read from the file opened: one replaced by a rename
/// (how every checkpoint is written) still reads as it was, and one
/// cut short afterwards is an error naming the file and the tensor.
#[test]
fn tensors_come_from_the_file_as_it_was_opened() {
    use ndarray::Array1;
    let dir = crate::checkpoint::test_dir("reopen");
    let path = dir.join("model.safetensors");
    let old = Array1::from(vec![1.0f32, 2.0, 3.0]);
    let new = Array1::from(vec![7.0f32, 8.0, 9.0]);
    super::super::save(&path, &[("w", (&old).into())], &BTreeMap::new()).unwrap();
    let ck = Checkpoint::open(&path).unwrap();
    let other = dir.join("next.safetensors");
    super::super::save(&other, &[("w", (&new).into())], &BTreeMap::new()).unwrap();
    fs::rename(&other, &path).unwrap();
    assert_eq!(
        ck.get_real::<f32>("w", &[3]).unwrap(),
        old.clone().into_dyn()
    );
    assert_eq!(
        Checkpoint::open(&path)
            .unwrap()
            .get_real::<f32>("w", &[3])
            .unwrap(),
        new.into_dyn()
    );

    let ck = Checkpoint::open(&path).unwrap();
    let len = fs::metadata(&path).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - 4)
        .unwrap();
    let err = ck.get_real::<f32>("w", &[3]).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Io { .. }), "{err}");
    assert_eq!(err.file(), Some(path.as_path()));
    assert_eq!(err.array(), Some("w"));
    fs::remove_dir_all(&dir).unwrap();
}

/// A tensor larger than a read block: its values and the position of
/// a non-finite element past the first block come out as written.
#[test]
fn tensors_past_one_block_read_whole_and_place_their_first_non_finite() {
    use ndarray::Array2;
    let dir = crate::checkpoint::test_dir("blocks");
    let path = dir.join("model.safetensors");
    let cols = 1000;
    let rows = 3 * READ_BLOCK / (4 * cols) + 1;
    let mut w = Array2::from_shape_fn((rows, cols), |(i, j)| (i * cols + j) as f32);
    let last = rows - 1;
    w[[last, 7]] = f32::INFINITY;
    w[[last, 9]] = f32::NAN;
    let h = w.mapv(half::bf16::from_f32);
    super::super::save(
        &path,
        &[("w", (&w).into()), ("h", (&h).into())],
        &BTreeMap::new(),
    )
    .unwrap();
    let ck = Checkpoint::open(&path).unwrap();
    let back = ck.get_real::<f32>("w", &[rows, cols]).unwrap();
    assert!(
        back.iter()
            .zip(w.iter())
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
    for name in ["w", "h"] {
        let err = ck.check_finite(name).unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::NonFinite { position, value }
                if position == &[last, 7] && *value == f64::INFINITY),
            "{name}: {err}"
        );
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unravel_is_row_major() {
    assert_eq!(unravel(0, &[]), Vec::<usize>::new());
    assert_eq!(unravel(5, &[2, 3]), [1, 2]);
    assert_eq!(unravel(23, &[2, 3, 4]), [1, 2, 3]);
    assert_eq!(unravel(13, &[2, 3, 4]), [1, 0, 1]);
}

#[test]
fn shapes_print_as_pytorch_does() {
    assert_eq!(fmt_shape(&[]), "()");
    assert_eq!(fmt_shape(&[5]), "(5,)");
    assert_eq!(fmt_shape(&[3, 0]), "(3, 0)");
}
