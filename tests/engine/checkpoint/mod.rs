//! Safetensors checkpoints: bit-exact round trips, the exact file layout,
//! every load error, and atomic saves.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use ndarray::{Array, Array1, Array2, ArrayD, IxDyn, arr0, s};
use splitgrad::checkpoint::{Checkpoint, Tensor, TensorData, TensorRef, save};
use splitgrad::{ErrorKind, Rng};

use crate::io_common::listing as files_in;

// One test binary; its modules live in `tests/checkpoint/`.
mod load_errors;
mod saving;

/// A fresh, empty folder for one test.
fn temp_dir(tag: &str) -> PathBuf {
    crate::io_common::scratch(&format!("checkpoint/{tag}"))
}

fn no_meta() -> BTreeMap<String, String> {
    BTreeMap::new()
}

/// The specials of a float type: both zeros, the smallest normal, a
/// subnormal (the smallest normal over `d`, negated), the smallest
/// subnormal, the extremes, epsilon, both infinities and two ordinary
/// values.
macro_rules! specials {
    ($t:ident, $d:expr, $smallest:expr) => {
        [
            0.0,
            -0.0,
            $t::MIN_POSITIVE,
            -$t::MIN_POSITIVE / $d,
            $smallest,
            $t::MAX,
            $t::MIN,
            $t::EPSILON,
            $t::INFINITY,
            $t::NEG_INFINITY,
            1.0 / 3.0,
            -7.25,
        ]
    };
}

const F32_SPECIALS: [f32; 12] = specials!(f32, 2.0, 1e-45);
const F64_SPECIALS: [f64; 12] = specials!(f64, 4.0, 5e-324);

/// Random bit patterns (every class of float, NaNs with payloads too)
/// followed by the specials.
fn f32_values(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..n)
        .map(|_| f32::from_bits(rng.next_u64() as u32))
        .collect();
    v.extend_from_slice(&F32_SPECIALS);
    v
}

fn f64_values(rng: &mut Rng, n: usize) -> Vec<f64> {
    let mut v: Vec<f64> = (0..n).map(|_| f64::from_bits(rng.next_u64())).collect();
    v.extend_from_slice(&F64_SPECIALS);
    v
}

#[test]
fn reals_round_trip_bit_exact_in_every_shape() {
    let dir = temp_dir("reals");
    let path = dir.join("model.safetensors");
    let mut rng = Rng::new(7);
    let a32 = Array::from_shape_vec((4, 7), f32_values(&mut rng, 16)).unwrap();
    let a64 = Array::from_shape_vec((2, 3, 4), f64_values(&mut rng, 12)).unwrap();
    let scalar32 = arr0(-0.0f32);
    let scalar64 = arr0(f64::from_bits(1)); // a subnormal 0-d tensor
    let empty_rows = Array2::<f32>::zeros((0, 8));
    let empty_cols = Array2::<f64>::zeros((8, 0));
    let nan_payload = Array1::from(vec![
        f32::from_bits(0x7fc0_1234),
        f32::from_bits(0xffa0_0001),
    ]);
    let tensors: Vec<(&str, TensorRef<'_>)> = vec![
        ("a32", (&a32).into()),
        ("a64", (&a64).into()),
        ("scalar32", (&scalar32).into()),
        ("scalar64", (&scalar64).into()),
        ("empty_rows", (&empty_rows).into()),
        ("empty_cols", (&empty_cols).into()),
        ("nan_payload", (&nan_payload).into()),
    ];
    save(&path, &tensors, &no_meta()).unwrap();

    let ck = Checkpoint::open(&path).unwrap();
    assert_eq!(
        ck.names(),
        [
            "a32",
            "a64",
            "empty_cols",
            "empty_rows",
            "nan_payload",
            "scalar32",
            "scalar64"
        ]
    );
    let bits32 = |a: &ArrayD<f32>| a.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let bits64 = |a: &ArrayD<f64>| a.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let back = ck.get_real::<f32>("a32", &[4, 7]).unwrap();
    assert_eq!(bits32(&back), bits32(&a32.into_dyn()));
    let back = ck.get_real::<f64>("a64", &[2, 3, 4]).unwrap();
    assert_eq!(bits64(&back), bits64(&a64.into_dyn()));
    let back = ck.get_real::<f32>("scalar32", &[]).unwrap();
    assert_eq!(back.shape(), &[] as &[usize]);
    assert_eq!(back.first().unwrap().to_bits(), 0x8000_0000);
    let back = ck.get_real::<f64>("scalar64", &[]).unwrap();
    assert_eq!(back.shape(), &[] as &[usize]);
    assert_eq!(back.first().unwrap().to_bits(), 1);
    assert_eq!(
        ck.get_real::<f32>("empty_rows", &[0, 8]).unwrap().shape(),
        &[0, 8]
    );
    assert_eq!(
        ck.get_real::<f64>("empty_cols", &[8, 0]).unwrap().shape(),
        &[8, 0]
    );
    let back = ck.get_real::<f32>("nan_payload", &[2]).unwrap();
    assert_eq!(bits32(&back), [0x7fc0_1234, 0xffa0_0001]);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn integers_and_metadata_round_trip() {
    let dir = temp_dir("ints");
    let path = dir.join("model.safetensors");
    let i = Array1::from(vec![i64::MIN, -1, 0, 1, i64::MAX]);
    let u = Array2::from_shape_vec((2, 2), vec![0u64, 1, u64::MAX - 1, u64::MAX]).unwrap();
    let step = arr0(123_456_789u64);
    let meta = BTreeMap::from([
        ("format".to_string(), "pt".to_string()),
        ("splits".to_string(), "orig,prompt".to_string()),
        (
            "note".to_string(),
            "quotes \" and \\ and ünïcode".to_string(),
        ),
    ]);
    save(
        &path,
        &[
            ("i", (&i).into()),
            ("u", (&u).into()),
            ("step", (&step).into()),
        ],
        &meta,
    )
    .unwrap();
    let ck = Checkpoint::open(&path).unwrap();
    assert_eq!(ck.get_i64("i", &[5]).unwrap(), i.into_dyn());
    assert_eq!(ck.get_u64("u", &[2, 2]).unwrap(), u.into_dyn());
    assert_eq!(
        ck.get_u64("step", &[]).unwrap(),
        arr0(123_456_789u64).into_dyn()
    );
    assert_eq!(ck.metadata(), &meta);
    fs::remove_dir_all(&dir).unwrap();
}

/// The crate hands metadata to `safetensors` in a randomly seeded
/// `HashMap`; the file must not depend on that seed.
#[test]
fn equal_inputs_give_identical_files() {
    let dir = temp_dir("deterministic");
    let w = Array2::from_shape_fn((3, 2), |(i, j)| (i + j) as f32);
    let ids = Array1::from(vec![1i64, 2]);
    let meta: BTreeMap<String, String> = (0..8)
        .map(|k| (format!("key{k}"), format!("value {k}")))
        .collect();
    let first = dir.join("first.safetensors");
    save(&first, &[("w", (&w).into()), ("ids", (&ids).into())], &meta).unwrap();
    let expected = fs::read(&first).unwrap();
    let again = dir.join("again.safetensors");
    for _ in 0..10 {
        save(&again, &[("ids", (&ids).into()), ("w", (&w).into())], &meta).unwrap();
        assert_eq!(fs::read(&again).unwrap(), expected);
    }
    assert_eq!(Checkpoint::open(&again).unwrap().metadata(), &meta);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn strided_views_are_stored_row_major() {
    let dir = temp_dir("strided");
    let path = dir.join("model.safetensors");
    let a = Array2::from_shape_fn((4, 6), |(i, j)| (10 * i + j) as f32);
    let t = a.t();
    let stepped = a.slice(s![..;2, 1..;2]);
    save(
        &path,
        &[("t", t.into()), ("stepped", stepped.into())],
        &no_meta(),
    )
    .unwrap();
    let ck = Checkpoint::open(&path).unwrap();
    assert_eq!(
        ck.get_real::<f32>("t", &[6, 4]).unwrap(),
        t.to_owned().into_dyn()
    );
    let back = ck.get_real::<f32>("stepped", &[2, 3]).unwrap();
    assert_eq!(back.as_slice().unwrap(), &[1.0, 3.0, 5.0, 21.0, 23.0, 25.0]);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn owned_tensors_round_trip_through_get() {
    let dir = temp_dir("owned");
    let path = dir.join("model.safetensors");
    let tensors = vec![
        Tensor::new("f32", Array1::from(vec![1.5f32, -2.0]).into_dyn()),
        Tensor::new("f64", arr0(0.1f64).into_dyn()),
        Tensor::new("i64", ArrayD::<i64>::zeros(IxDyn(&[0]))),
        Tensor::new("u64", Array2::from_elem((1, 3), 9u64).into_dyn()),
    ];
    let entries: Vec<_> = tensors.iter().map(Tensor::entry).collect();
    save(&path, &entries, &no_meta()).unwrap();
    let ck = Checkpoint::open(&path).unwrap();
    for t in &tensors {
        assert_eq!(ck.get(&t.name).unwrap(), t.data);
        assert_eq!(ck.shape(&t.name).unwrap(), t.data.shape());
    }
    fs::remove_dir_all(&dir).unwrap();
}

/// The layout PyTorch's loader expects: u64 header length, JSON header
/// padded with spaces to a multiple of 8, little-endian row-major data.
#[test]
fn file_layout_is_plain_safetensors() {
    let dir = temp_dir("layout");
    let path = dir.join("model.safetensors");
    let w = Array2::from_shape_vec((2, 2), vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let idx = Array1::from(vec![-2i64]);
    save(
        &path,
        &[("w", (&w).into()), ("idx", (&idx).into())],
        &no_meta(),
    )
    .unwrap();
    let bytes = fs::read(&path).unwrap();
    let header = r#"{"idx":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},"w":{"dtype":"F32","shape":[2,2],"data_offsets":[8,24]}}"#;
    let padded = header.len().next_multiple_of(8);
    assert_eq!(&bytes[..8], &(padded as u64).to_le_bytes());
    assert_eq!(
        std::str::from_utf8(&bytes[8..8 + padded])
            .unwrap()
            .trim_end(),
        header
    );
    let mut data = (-2i64).to_le_bytes().to_vec();
    for x in [1.0f32, 2.0, 3.0, 4.0] {
        data.extend_from_slice(&x.to_le_bytes());
    }
    assert_eq!(&bytes[8 + padded..], &data[..]);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_file_written_by_the_safetensors_crate_loads() {
    let dir = temp_dir("foreign");
    let path = dir.join("model.safetensors");
    let data: Vec<u8> = [0.25f64, -1.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F64, vec![2, 1], &data).unwrap();
    let small: Vec<u8> = vec![1, 0, 0, 0];
    let other =
        safetensors::tensor::TensorView::new(safetensors::Dtype::I32, vec![1], &small).unwrap();
    let bytes = safetensors::serialize([("x", &view), ("n", &other)], None).unwrap();
    fs::write(&path, bytes).unwrap();

    let ck = Checkpoint::open(&path).unwrap();
    assert_eq!(
        ck.get_real::<f64>("x", &[2, 1])
            .unwrap()
            .as_slice()
            .unwrap(),
        &[0.25, -1.0]
    );
    // A dtype this crate does not store is listed but never converted.
    assert_eq!(ck.names(), ["n", "x"]);
    let err = ck.get("n").unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Dtype { .. }));
    assert_eq!(
        err.to_string(),
        format!(
            "{}: array `n`: has dtype I32, expected F32, F64, BF16, F16, I64 or U64",
            path.display()
        )
    );
    fs::remove_dir_all(&dir).unwrap();
}

/// A small valid checkpoint and its bytes.
fn small_checkpoint(dir: &Path) -> (PathBuf, Vec<u8>) {
    let path = dir.join("model.safetensors");
    let w = Array2::from_shape_fn((3, 4), |(i, j)| (i * 4 + j) as f64 * 0.5);
    let ids = Array1::from(vec![5i64, 6, 7]);
    let meta = BTreeMap::from([("step".to_string(), "3".to_string())]);
    save(
        &path,
        &[("lm_head.orig.weight", (&w).into()), ("ids", (&ids).into())],
        &meta,
    )
    .unwrap();
    let bytes = fs::read(&path).unwrap();
    (path, bytes)
}

#[test]
fn tensor_data_reports_shape_and_dtype() {
    let t = TensorData::from(ArrayD::<u64>::zeros(IxDyn(&[2, 0, 3])));
    assert_eq!((t.shape(), t.dtype()), (&[2usize, 0, 3][..], "U64"));
    assert_eq!(t.view().shape(), &[2, 0, 3]);
    let a = Array2::<f32>::zeros((5, 2));
    let r: TensorRef<'_> = a.t().into();
    assert_eq!((r.shape(), r.dtype()), (&[2usize, 5][..], "F32"));
}
