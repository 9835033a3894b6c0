//! Reading and writing `.npz` files: every integer dtype, reals, 0-d and
//! Fortran-order arrays, round trips, and damaged files (errors, never
//! panics).

use crate::io_common::{
    dict, i64_member, le_f64, le_i64, message, npy, scratch, write_npz, zip_bytes,
};
use ndarray::{Array, ArrayD, IxDyn, arr0, arr1, arr2};
use npyz::zip::CompressionMethod;
use splitgrad::io::{DtypeKind, NpzReader, NpzWriter, RealDtype};
use splitgrad::{ErrorKind, Rng};

/// Bytes of each value through `f`, concatenated.
fn bytes<T: Copy, const N: usize>(values: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(|&v| f(v)).collect()
}

/// (name, descr, data, the values read) of every integer dtype; each type
/// wider than a byte in both byte orders.
#[rustfmt::skip]
fn integer_cases() -> Vec<(&'static str, &'static str, Vec<u8>, Vec<i64>)> {
    macro_rules! both_orders {
        ($t:literal, $values:expr, $read:expr) => {[
            (concat!($t, "le"), concat!("<", $t), bytes(&$values, |v| v.to_le_bytes()), $read),
            (concat!($t, "be"), concat!(">", $t), bytes(&$values, |v| v.to_be_bytes()), $read),
        ]};
    }
    [
        vec![
            ("i1", "|i1", bytes(&[-128i8, -1, 127], |v| v.to_le_bytes()), vec![-128, -1, 127]),
            ("u1", "|u1", bytes(&[0u8, 200, 255], |v| v.to_le_bytes()), vec![0, 200, 255]),
        ],
        both_orders!("i2", [i16::MIN, -2, 300], vec![-32768, -2, 300]).to_vec(),
        both_orders!("u2", [0u16, 258, u16::MAX], vec![0, 258, 65535]).to_vec(),
        both_orders!("i4", [i32::MIN, -7, 70000], vec![-2147483648, -7, 70000]).to_vec(),
        both_orders!("u4", [1u32, 65536, u32::MAX], vec![1, 65536, 4294967295]).to_vec(),
        both_orders!("i8", [i64::MIN, -1, i64::MAX], vec![i64::MIN, -1, i64::MAX]).to_vec(),
        both_orders!("u8", [0u64, 1 << 40, i64::MAX as u64], vec![0, 1 << 40, i64::MAX]).to_vec(),
    ]
    .concat()
}

#[test]
fn every_integer_dtype_reads_as_i64() {
    let dir = scratch("every_integer_dtype");
    let path = dir.join("ints.npz");
    let cases = integer_cases();
    let members: Vec<(&str, Vec<u8>)> = cases
        .iter()
        .map(|(name, descr, data, _)| (*name, npy(&dict(descr, "(3,)"), data)))
        .collect();
    write_npz(&path, &members);
    let mut r = NpzReader::open(&path).unwrap();
    for (name, descr, _, expected) in &cases {
        let dtype = r.dtype(name).unwrap();
        assert_eq!(dtype.descr(), *descr);
        assert_eq!(dtype.is_big_endian(), descr.starts_with('>'), "{name}");
        let kind = if descr.contains('u') {
            DtypeKind::UInt
        } else {
            DtypeKind::Int
        };
        assert_eq!(dtype.kind(), kind, "{name}");
        assert_eq!(r.ints(name).unwrap(), arr1(expected).into_dyn(), "{name}");
        assert_eq!(r.ints_1d(name).unwrap(), *expected, "{name}");
    }
}

#[test]
fn uint64_above_i64_max_is_an_error_naming_position_and_value() {
    let dir = scratch("uint64_too_large");
    let path = dir.join("big.npz");
    let data = bytes(&[5u64, 6, 7, 1 << 63], |v| v.to_le_bytes());
    // The same bytes in Fortran order: the fourth stored value is still at
    // [1, 1]; the second stored one would be at [1, 0].
    let fortran = "{'descr': '<u8', 'fortran_order': True, 'shape': (2, 2), }";
    let data_f = bytes(&[5u64, 1 << 63, 6, 7], |v| v.to_le_bytes());
    write_npz(
        &path,
        &[
            ("big", npy(&dict("<u8", "(2, 2)"), &data)),
            ("bigf", npy(fortran, &data_f)),
        ],
    );
    let mut r = NpzReader::open(&path).unwrap();
    let (_, m) = message(r.ints("bigf"));
    assert!(
        m.contains("value 9223372036854775808 at position [1, 0]"),
        "{m}"
    );
    let (e, m) = message(r.ints("big"));
    assert!(matches!(e.kind(), ErrorKind::Format { .. }));
    assert_eq!(
        m,
        format!(
            "{}: array `big`: uint64 value 9223372036854775808 at position [1, 1] does not fit in int64 \
             (range -9223372036854775808..=9223372036854775807)",
            path.display()
        )
    );
}

#[test]
fn bool_float_and_other_dtypes_are_not_integers() {
    let dir = scratch("not_integers");
    let path = dir.join("x.npz");
    write_npz(
        &path,
        &[
            ("b", npy(&dict("|b1", "(2,)"), &[1, 0])),
            ("f", npy(&dict("<f8", "(1,)"), &le_f64(&[1.0]))),
            ("u", npy(&dict("<U3", "(1,)"), &[0; 12])),
        ],
    );
    let mut r = NpzReader::open(&path).unwrap();
    for (name, found) in [("b", "bool"), ("f", "float64"), ("u", "'<U3'")] {
        let (e, m) = message(r.ints(name));
        assert!(matches!(e.kind(), ErrorKind::Dtype { .. }), "{name}");
        assert_eq!(
            m,
            format!(
                "{}: array `{name}`: has dtype {found}, expected an integer dtype (int8 … int64, uint8 … uint64)",
                path.display()
            )
        );
    }
}

#[test]
fn reals_accept_f4_and_f8_of_either_byte_order_and_nothing_else() {
    let dir = scratch("reals");
    let path = dir.join("r.npz");
    let f4 = bytes(&[1.5f32, -0.1], |v| v.to_be_bytes());
    let f8 = bytes(&[0.1f64, -2.5e300], |v| v.to_le_bytes());
    write_npz(
        &path,
        &[
            ("f4", npy(&dict(">f4", "(2,)"), &f4)),
            ("f8", npy(&dict("<f8", "(2,)"), &f8)),
            ("f2", npy(&dict("<f2", "(1,)"), &[0, 0x3c])),
            ("i", i64_member(&[1])),
        ],
    );
    let mut r = NpzReader::open(&path).unwrap();
    assert_eq!(
        r.reals::<f32>("f4").unwrap(),
        arr1(&[1.5f32, -0.1]).into_dyn()
    );
    assert_eq!(
        r.reals::<f64>("f4").unwrap(),
        arr1(&[1.5, f64::from(-0.1f32)]).into_dyn()
    );
    assert_eq!(
        r.reals::<f64>("f8").unwrap(),
        arr1(&[0.1, -2.5e300]).into_dyn()
    );
    assert_eq!(
        r.reals::<f32>("f8").unwrap(),
        arr1(&[0.1f32, f32::NEG_INFINITY]).into_dyn()
    );
    assert_eq!(r.real_dtype("f4").unwrap(), RealDtype::F32);
    assert_eq!(r.real_dtype("f8").unwrap(), RealDtype::F64);
    for (name, found) in [("f2", "float16"), ("i", "int64")] {
        for (e, m) in [message(r.reals::<f64>(name)), message(r.real_dtype(name))] {
            assert!(matches!(e.kind(), ErrorKind::Dtype { .. }));
            assert_eq!(
                m,
                format!(
                    "{}: array `{name}`: has dtype {found}, expected float32 or float64",
                    path.display()
                )
            );
        }
    }
}

#[test]
fn scalars_and_fortran_order_read_correctly() {
    let dir = scratch("scalar_fortran");
    let path = dir.join("s.npz");
    // Column-major storage of [[0, 1, 2], [3, 4, 5]].
    let fortran = "{'descr': '<i8', 'fortran_order': True, 'shape': (2, 3), }";
    let f3 = "{'descr': '<f8', 'fortran_order': True, 'shape': (2, 2, 2), }";
    write_npz(
        &path,
        &[
            ("n", npy(&dict("<i8", "()"), &le_i64(&[3]))),
            ("x", npy(&dict("<f4", "()"), &0.25f32.to_le_bytes())),
            ("m", npy(fortran, &le_i64(&[0, 3, 1, 4, 2, 5]))),
            (
                "t",
                npy(f3, &le_f64(&[0.0, 4.0, 2.0, 6.0, 1.0, 5.0, 3.0, 7.0])),
            ),
        ],
    );
    let mut r = NpzReader::open(&path).unwrap();
    assert_eq!(r.shape("n").unwrap(), Vec::<usize>::new());
    assert_eq!(r.ints("n").unwrap(), arr0(3i64).into_dyn());
    assert_eq!(r.reals::<f64>("x").unwrap(), arr0(0.25).into_dyn());
    let m = r.ints("m").unwrap();
    assert_eq!(m, arr2(&[[0i64, 1, 2], [3, 4, 5]]).into_dyn());
    assert!(m.is_standard_layout());
    let t = r.reals::<f64>("t").unwrap();
    assert_eq!(
        t,
        Array::from_shape_fn((2, 2, 2), |(a, b, c)| (4 * a + 2 * b + c) as f64).into_dyn()
    );
}

#[test]
fn writer_round_trips_every_dtype_and_rank() {
    let dir = scratch("round_trip");
    let path = dir.join("rt.npz");
    let i = Array::from_shape_fn((2, 3, 4), |(a, b, c)| {
        (a as i64 - 1) * 1_000_000_007 * (b * 4 + c) as i64
    });
    let u = arr2(&[[0u8, 1, 255], [7, 8, 9]]);
    let f = arr2(&[[1.5f32, -0.0, f32::MAX], [f32::MIN_POSITIVE, 3.25, -1e-30]]);
    let d = arr1(&[std::f64::consts::PI, -1e308, 5e-324]);
    let transposed = f.t().to_owned();
    let mut w = NpzWriter::new(&path);
    w.add("i", &i)
        .add("u", &u)
        .add("f", &f)
        .add("d", &d)
        .add("ft", &f.t())
        .add("empty", &Array::<f64, _>::zeros((0, 3)))
        .add_scalar("i0", -5i64)
        .add_scalar("u0", 200u8)
        .add_scalar("f0", 0.5f32)
        .add_scalar("d0", -0.125f64);
    w.finish().unwrap();
    let mut r = NpzReader::open(&path).unwrap();
    assert_eq!(
        r.names(),
        ["d", "d0", "empty", "f", "f0", "ft", "i", "i0", "u", "u0"]
    );
    assert_eq!(r.ints("i").unwrap(), i.into_dyn());
    assert_eq!(r.ints("u").unwrap(), u.mapv(i64::from).into_dyn());
    assert_eq!(r.dtype("u").unwrap().to_string(), "uint8");
    assert_eq!(r.reals::<f32>("f").unwrap(), f.clone().into_dyn());
    assert_eq!(r.reals::<f32>("ft").unwrap(), transposed.into_dyn());
    assert_eq!(r.reals::<f64>("f").unwrap(), f.mapv(f64::from).into_dyn());
    assert_eq!(r.reals::<f64>("d").unwrap(), d.into_dyn());
    assert_eq!(r.shape("empty").unwrap(), [0, 3]);
    assert_eq!(
        r.reals::<f64>("empty").unwrap(),
        ArrayD::<f64>::zeros(IxDyn(&[0, 3]))
    );
    assert_eq!(r.ints("i0").unwrap(), arr0(-5i64).into_dyn());
    assert_eq!(r.ints("u0").unwrap(), arr0(200i64).into_dyn());
    assert_eq!(r.reals::<f32>("f0").unwrap(), arr0(0.5f32).into_dyn());
    assert_eq!(r.reals::<f64>("d0").unwrap(), arr0(-0.125).into_dyn());
    for (name, descr) in [("i", "<i8"), ("u", "|u1"), ("f", "<f4"), ("d0", "<f8")] {
        assert_eq!(r.dtype(name).unwrap().descr(), descr);
    }
    // The same arrays give the same bytes (fixed timestamps).
    let first = std::fs::read(&path).unwrap();
    let mut again = std::io::Cursor::new(Vec::new());
    let mut w = NpzWriter::new("unused");
    w.add("x", &arr1(&[1i64]));
    w.write_to(&mut again).unwrap();
    let mut w2 = NpzWriter::new(dir.join("x.npz"));
    w2.add("x", &arr1(&[1i64]));
    w2.finish().unwrap();
    assert_eq!(
        std::fs::read(dir.join("x.npz")).unwrap(),
        again.into_inner()
    );
    assert!(!first.is_empty());
}

#[test]
fn missing_array_names_file_and_array() {
    let dir = scratch("missing");
    let path = dir.join("m.npz");
    write_npz(&path, &[("a", i64_member(&[1]))]);
    let mut r = NpzReader::open(&path).unwrap();
    assert!(r.contains("a") && !r.contains("b"));
    for (e, m) in [
        message(r.ints("b")),
        message(r.shape("b")),
        message(r.reals::<f32>("b")),
    ] {
        assert!(matches!(e.kind(), ErrorKind::Missing));
        assert_eq!(e.file(), Some(path.as_path()));
        assert_eq!(e.array(), Some("b"));
        assert_eq!(m, format!("{}: array `b`: is missing", path.display()));
    }
}

#[test]
fn unreadable_non_zip_and_non_npz_files_are_errors_naming_the_file() {
    let dir = scratch("not_npz");
    let absent = dir.join("absent.npz");
    let (e, m) = message(NpzReader::open(&absent));
    assert!(matches!(e.kind(), ErrorKind::Io(_)));
    assert!(m.starts_with(&format!("{}: ", absent.display())), "{m}");

    let text = dir.join("text.npz");
    std::fs::write(&text, "token_index,language_index\n1,2\n").unwrap();
    let empty = dir.join("empty.npz");
    std::fs::write(&empty, "").unwrap();
    for path in [&text, &empty] {
        let (e, m) = message(NpzReader::open(path));
        assert!(matches!(e.kind(), ErrorKind::Format { .. }), "{m}");
        assert!(
            m.starts_with(&format!("{}: not an npz file", path.display())),
            "{m}"
        );
    }

    let plain_zip = dir.join("plain.zip");
    std::fs::write(
        &plain_zip,
        zip_bytes(&[("readme.txt", b"hi".to_vec())], CompressionMethod::Stored),
    )
    .unwrap();
    let (e, m) = message(NpzReader::open(&plain_zip));
    assert!(matches!(e.kind(), ErrorKind::Format { .. }));
    assert_eq!(
        m,
        format!(
            "{}: not an npz file: a zip archive with no `.npy` member",
            plain_zip.display()
        )
    );
}

/// A small valid archive for the damage tests.
fn sample_archive() -> Vec<u8> {
    let mut w = NpzWriter::new("unused");
    w.add("ids", &arr1(&[1i64, 2, 3, 4]))
        .add("x", &arr2(&[[0.5f64, 1.5], [2.5, 3.5]]))
        .add_scalar("n", 9u8);
    let mut out = std::io::Cursor::new(Vec::new());
    w.write_to(&mut out).unwrap();
    out.into_inner()
}

/// Reads every array every way; returns how many reads failed.
fn read_everything(bytes: Vec<u8>) -> usize {
    let Ok(mut r) = NpzReader::from_bytes("damaged.npz", bytes) else {
        return 1;
    };
    let mut failures = 0;
    for name in ["ids", "x", "n"] {
        failures += usize::from(r.ints(name).is_err());
        failures += usize::from(r.reals::<f64>(name).is_err());
        failures += usize::from(r.shape(name).is_err());
    }
    failures
}

#[test]
fn every_truncation_is_an_error() {
    let full = sample_archive();
    assert_eq!(
        read_everything(full.clone()),
        3,
        "ids and n are not reals, x is not ints"
    );
    for len in 0..full.len() {
        let (e, m) = message(NpzReader::from_bytes("cut.npz", full[..len].to_vec()));
        assert!(
            matches!(e.kind(), ErrorKind::Format { .. }),
            "length {len}: {m}"
        );
        assert!(
            m.starts_with("cut.npz: not an npz file"),
            "length {len}: {m}"
        );
    }
}

#[test]
fn a_corrupt_member_is_a_format_error() {
    let full = sample_archive();
    let npy_start = full.windows(6).position(|w| w == b"\x93NUMPY").unwrap();
    let ids_data = npy_start
        + full[npy_start..]
            .windows(8)
            .position(|w| w == 3i64.to_le_bytes())
            .unwrap();
    let mut flipped = full.clone();
    flipped[ids_data] ^= 0x40;
    let mut r = NpzReader::from_bytes("crc.npz", flipped).unwrap();
    let (e, m) = message(r.ints("ids"));
    assert!(matches!(e.kind(), ErrorKind::Format { .. }));
    assert!(m.starts_with("crc.npz: array `ids`: corrupt member"), "{m}");
    assert!(m.contains("checksum"), "{m}");
    assert_eq!(
        r.reals::<f64>("x").unwrap()[[1, 1]],
        3.5,
        "other members still read"
    );
}

#[test]
fn a_header_that_disagrees_with_the_data_is_a_format_error() {
    let dir = scratch("short_data");
    let path = dir.join("s.npz");
    write_npz(
        &path,
        &[
            ("short", npy(&dict("<i8", "(4,)"), &le_i64(&[1, 2, 3]))),
            ("long", npy(&dict("<i8", "(2,)"), &le_i64(&[1, 2, 3]))),
            ("huge", npy(&dict("<i8", "(4294967296, 4294967296)"), &[])),
            (
                "bad",
                npy("{'descr': '<i8', 'shape': (1,), }", &le_i64(&[1])),
            ),
            ("neg", npy(&dict("<i8", "(-1,)"), &[])),
            ("deep", npy(&"(".repeat(5000), &[])),
        ],
    );
    let mut r = NpzReader::open(&path).unwrap();
    let expected = [
        (
            "short",
            "corrupt member: 24 bytes of data follow the header, but shape [4] of int64 needs 32",
        ),
        (
            "long",
            "corrupt member: 24 bytes of data follow the header, but shape [2] of int64 needs 16",
        ),
        (
            "huge",
            "npy shape [4294967296, 4294967296] has too many elements",
        ),
        ("bad", "malformed npy header: no `fortran_order` key"),
        (
            "neg",
            "malformed npy header: shape (-1,) is not a tuple of non-negative integers",
        ),
        (
            "deep",
            "malformed npy header: nesting too deep at byte 17 of the header text",
        ),
    ];
    for (name, why) in expected {
        let (e, m) = message(r.ints(name));
        assert!(matches!(e.kind(), ErrorKind::Format { .. }), "{name}");
        assert_eq!(m, format!("{}: array `{name}`: {why}", path.display()));
    }
}

#[test]
fn headers_numpy_might_write_are_understood() {
    let dir = scratch("header_variants");
    let path = dir.join("h.npz");
    // Keys in another order, double quotes, a Python 2 long, no trailing comma.
    let odd = "{\"shape\": (2L, 1), \"fortran_order\": False, \"descr\": \"<i8\"}";
    // Version 2.0: a 4-byte header length.
    let mut v2 = b"\x93NUMPY\x02\x00".to_vec();
    let text = format!("{:<115}\n", dict("<i8", "(1,)"));
    v2.extend_from_slice(&(text.len() as u32).to_le_bytes());
    v2.extend_from_slice(text.as_bytes());
    v2.extend_from_slice(&le_i64(&[42]));
    assert_eq!(v2.len() % 16, 8);
    write_npz(&path, &[("odd", npy(odd, &le_i64(&[7, 8]))), ("v2", v2)]);
    let mut r = NpzReader::open(&path).unwrap();
    assert_eq!(r.ints("odd").unwrap(), arr2(&[[7i64], [8]]).into_dyn());
    assert_eq!(r.ints("v2").unwrap(), arr1(&[42i64]).into_dyn());
}

#[test]
fn compressed_members_read_and_unsupported_methods_are_errors() {
    let member = i64_member(&[5, 6]);
    let deflated = zip_bytes(&[("a.npy", member.clone())], CompressionMethod::Deflated);
    let mut r = NpzReader::from_bytes("z.npz", deflated).unwrap();
    assert_eq!(r.ints_1d("a").unwrap(), [5, 6]);

    // Patch the method of the stored member to 14 (LZMA), which numpy
    // never writes, in the local and the central header.
    let mut lzma = zip_bytes(&[("a.npy", member)], CompressionMethod::Stored);
    let local = lzma.windows(4).position(|w| w == b"PK\x03\x04").unwrap();
    let central = lzma.windows(4).position(|w| w == b"PK\x01\x02").unwrap();
    lzma[local + 8..local + 10].copy_from_slice(&14u16.to_le_bytes());
    lzma[central + 10..central + 12].copy_from_slice(&14u16.to_le_bytes());
    let mut r = NpzReader::from_bytes("lzma.npz", lzma).unwrap();
    let (e, m) = message(r.ints("a"));
    assert!(matches!(e.kind(), ErrorKind::Format { .. }));
    assert_eq!(
        m,
        "lzma.npz: array `a`: member is compressed with Unsupported(14); \
         stored, deflated and bzip2 members are read"
    );
}

#[test]
fn random_damage_never_panics() {
    let full = sample_archive();
    let mut rng = Rng::new(2024);
    let mut failed = 0;
    for _ in 0..3000 {
        let mut bytes = full.clone();
        for _ in 0..1 + rng.next_u64() % 4 {
            let at = (rng.next_u64() % bytes.len() as u64) as usize;
            bytes[at] = rng.next_u64() as u8;
        }
        failed += usize::from(read_everything(bytes) > 3);
    }
    // Most single-byte damage is caught by a header check or the CRC.
    assert!(failed > 1000, "only {failed} damaged archives were noticed");
}

#[test]
fn finite_reals_names_the_first_non_finite_value() {
    let dir = scratch("finite");
    let path = dir.join("f.npz");
    let mut w = NpzWriter::new(&path);
    w.add("x", &arr2(&[[1.0f32, 2.0], [3.0, f32::NEG_INFINITY]]))
        .add("ok", &arr1(&[0.0f64]));
    w.finish().unwrap();
    let mut r = NpzReader::open(&path).unwrap();
    assert_eq!(
        r.finite_reals::<f64>("ok").unwrap(),
        arr1(&[0.0]).into_dyn()
    );
    let (e, m) = message(r.finite_reals::<f64>("x"));
    match e.kind() {
        ErrorKind::NonFinite { position, value } => {
            assert_eq!(position, &[1, 1]);
            assert_eq!(*value, f64::NEG_INFINITY);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(
        m,
        format!(
            "{}: array `x`: non-finite value -inf at position [1, 1]",
            path.display()
        )
    );
}

/// UTF-32 code units, little- or big-endian, as numpy stores `U` arrays.
fn utf32(units: &[u32], big_endian: bool) -> Vec<u8> {
    units
        .iter()
        .flat_map(|u| {
            if big_endian {
                u.to_be_bytes()
            } else {
                u.to_le_bytes()
            }
        })
        .collect()
}

#[test]
fn string_arrays_round_trip() {
    let dir = scratch("strings_round_trip");
    let path = dir.join("s.npz");
    let names = ["en", "日本語", "", "a\0b", "Ωmega😀", "русский"];
    let mut w = NpzWriter::new(&path);
    w.add_strings("names", &names)
        .add_strings("none", &[] as &[String])
        .add_strings("owned", &[String::from("x")])
        .add_string_scalar("hash", "fnv1a64:0123456789abcdef")
        .add_string_scalar("blank", "");
    w.finish().unwrap();
    let mut r = NpzReader::open(&path).unwrap();
    let dtype = r.dtype("names").unwrap();
    assert_eq!(
        (dtype.kind(), dtype.descr(), dtype.size()),
        (DtypeKind::Unicode, "<U7", 28)
    );
    assert_eq!(r.shape("names").unwrap(), [6]);
    assert_eq!(r.strings_1d("names").unwrap(), names);
    assert!(r.strings_1d("none").unwrap().is_empty());
    assert_eq!(r.dtype("none").unwrap().descr(), "<U1");
    assert_eq!(r.strings_1d("owned").unwrap(), ["x"]);
    assert_eq!(r.shape("hash").unwrap(), Vec::<usize>::new());
    assert_eq!(r.string_scalar("hash").unwrap(), "fnv1a64:0123456789abcdef");
    assert_eq!(r.string_scalar("blank").unwrap(), "");
    // Trailing NULs are padding, to numpy and to the reader alike.
    let mut w = NpzWriter::new(dir.join("nul.npz"));
    w.add_strings("t", &["ab\0\0", "\0"]);
    w.finish().unwrap();
    let mut r = NpzReader::open(dir.join("nul.npz")).unwrap();
    assert_eq!(r.strings_1d("t").unwrap(), ["ab", ""]);
}

/// The files of `tests/data/npz/`, written by numpy (their README has the
/// script), stored and deflated.
#[test]
fn numpy_string_arrays_read_back() {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/npz");
    for file in ["strings.npz", "strings_compressed.npz"] {
        let mut r = NpzReader::open(data.join(file)).unwrap();
        assert_eq!(
            r.strings_1d("names").unwrap(),
            ["en", "fr", "日本語", "", "a\0b", "Ωmega😀"],
            "{file}"
        );
        assert_eq!(r.dtype("names").unwrap().descr(), "<U6");
        assert_eq!(r.string_scalar("hash").unwrap(), "fnv1a64:0123456789abcdef");
        assert_eq!(r.strings_1d("big").unwrap(), ["xy", "z"], "{file}");
        assert!(r.dtype("big").unwrap().is_big_endian());
        assert_eq!(r.ints_1d("ints").unwrap(), [0, 1, 2]);
    }
}

#[test]
fn string_arrays_of_either_byte_order_and_layout_read() {
    let dir = scratch("strings_layouts");
    let path = dir.join("s.npz");
    let units = [0x61, 0, 0x1f600, 0x62];
    let fortran = "{'descr': '<U2', 'fortran_order': True, 'shape': (2,), }";
    write_npz(
        &path,
        &[
            ("le", npy(&dict("<U2", "(2,)"), &utf32(&units, false))),
            ("be", npy(&dict(">U2", "(2,)"), &utf32(&units, true))),
            ("f", npy(fortran, &utf32(&units, false))),
            ("zero", npy(&dict("<U0", "(0,)"), &[])),
            (
                "scalar",
                npy(&dict("<U3", "()"), &utf32(&[0x6f, 0x6b, 0], false)),
            ),
        ],
    );
    let mut r = NpzReader::open(&path).unwrap();
    for name in ["le", "be", "f"] {
        assert_eq!(r.strings_1d(name).unwrap(), ["a", "😀b"], "{name}");
    }
    assert!(r.strings_1d("zero").unwrap().is_empty());
    assert_eq!(r.string_scalar("scalar").unwrap(), "ok");
}

/// A read of a bad string array.
type Read = fn(&mut NpzReader) -> splitgrad::Result<()>;

/// The bad string arrays of
/// `bad_string_arrays_are_errors_naming_file_array_and_position`: what,
/// the read, its message (`p`, the file).
#[rustfmt::skip]
fn bad_string_reads(p: &str) -> [(&'static str, Read, String); 12] {
    [
        ("surrogate", |r| r.strings_1d("surrogate").map(drop),
            format!("{p}: array `surrogate`: string at position [1]: code unit 0xd800 (character 1) is not a Unicode scalar value")),
        ("above", |r| r.strings_1d("above").map(drop),
            format!("{p}: array `above`: string at position [1]: code unit 0x110000 (character 0) is not a Unicode scalar value")),
        ("matrix", |r| r.strings_1d("matrix").map(drop),
            format!("{p}: array `matrix`: matrix has shape [1, 1], expected 1-D")),
        ("vector as scalar", |r| r.string_scalar("above").map(drop),
            format!("{p}: array `above`: above has shape [2], expected 0-D (a scalar)")),
        ("ints", |r| r.strings_1d("ints").map(drop),
            format!("{p}: array `ints`: has dtype int64, expected a unicode string dtype (<U1, <U2, …)")),
        ("bytes", |r| r.strings_1d("bytes").map(drop),
            format!("{p}: array `bytes`: has dtype '|S2', expected a unicode string dtype (<U1, <U2, …)")),
        ("strings as ints", |r| r.ints("short").map(drop),
            format!("{p}: array `short`: corrupt member: 20 bytes of data follow the header, but shape [3] of '<U2' needs 24")),
        ("short", |r| r.strings_1d("short").map(drop),
            format!("{p}: array `short`: corrupt member: 20 bytes of data follow the header, but shape [3] of '<U2' needs 24")),
        ("long", |r| r.strings_1d("long").map(drop),
            format!("{p}: array `long`: corrupt member: 8 bytes of data follow the header, but shape [1] of '<U1' needs 4")),
        ("huge", |r| r.strings_1d("huge").map(drop),
            format!("{p}: array `huge`: corrupt member: 0 bytes of data follow the header, but shape [1152921504606846976] of '<U4' needs more than 2^64")),
        ("overflow", |r| r.strings_1d("overflow").map(drop),
            format!("{p}: array `overflow`: corrupt member: 0 bytes of data follow the header, but shape [16777216] of '<U1099511627776' needs more than 2^64")),
        ("nothing", |r| r.strings_1d("nothing").map(drop),
            format!("{p}: array `nothing`: dtype '<U0' holds no character (numpy writes `<U1` at least)")),
    ]
}

#[test]
fn bad_string_arrays_are_errors_naming_file_array_and_position() {
    let dir = scratch("strings_bad");
    let path = dir.join("s.npz");
    let p = path.display();
    write_npz(
        &path,
        &[
            (
                "surrogate",
                npy(
                    &dict("<U2", "(3,)"),
                    &utf32(&[0x61, 0, 0x62, 0xd800, 0, 0], false),
                ),
            ),
            (
                "above",
                npy(&dict(">U1", "(2,)"), &utf32(&[0x61, 0x110000], true)),
            ),
            (
                "matrix",
                npy(&dict("<U1", "(1, 1)"), &utf32(&[0x61], false)),
            ),
            ("ints", i64_member(&[1, 2])),
            ("bytes", npy(&dict("|S2", "(1,)"), b"ab")),
            (
                "short",
                npy(&dict("<U2", "(3,)"), &utf32(&[0x61; 5], false)),
            ),
            ("long", npy(&dict("<U1", "(1,)"), &utf32(&[0x61; 2], false))),
            ("huge", npy(&dict("<U4", "(1152921504606846976,)"), &[])),
            (
                "overflow",
                npy(&dict("<U1099511627776", "(16777216,)"), &[]),
            ),
            ("nothing", npy(&dict("<U0", "(3,)"), &[])),
        ],
    );
    let mut r = NpzReader::open(&path).unwrap();
    let cases = bad_string_reads(&p.to_string());
    for (what, f, expected) in cases {
        let (e, m) = message(f(&mut r));
        assert_eq!(m, expected, "{what}");
        assert_eq!(e.file(), Some(path.as_path()), "{what}");
    }
    // A bad string leaves the other arrays readable.
    assert_eq!(r.ints_1d("ints").unwrap(), [1, 2]);
}
