//! Reading a checkpoint holds the arrays decoded so far and a block of at
//! most 1 MiB of raw bytes, never the whole file or a whole tensor's bytes
//! beside them (`Checkpoint::open` reads only the header): a 32 MiB file of
//! two tensors is decoded at a peak of its two arrays plus about a block. A
//! counting global allocator measures it; this file holds exactly one test
//! so that nothing else allocates while it measures.

#[path = "common/counting.rs"]
mod counting;
use counting::measure;

use std::collections::BTreeMap;

use ndarray::Array2;
use splitgrad::checkpoint::{Checkpoint, Snapshot, save};

#[test]
fn a_checkpoint_is_read_a_tensor_at_a_time() {
    const MIB: usize = 1 << 20;
    let dir = std::env::temp_dir().join(format!("splitgrad-ckpt-memory-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.safetensors");
    // Two f32 tensors of 16 MiB each.
    let rows = 4 * MIB / 64;
    let a = Array2::from_shape_fn((rows, 64), |(i, j)| (i * 64 + j) as f32);
    let b = Array2::from_shape_fn((rows, 64), |(i, j)| -((i + j) as f32));
    save(
        &path,
        &[("a", (&a).into()), ("b", (&b).into())],
        &BTreeMap::new(),
    )
    .unwrap();
    let file = std::fs::metadata(&path).unwrap().len() as usize;
    let tensor = 16 * MIB;
    assert!(file > 2 * tensor);

    // Opening reads the header only.
    let (opened, _, ck) = measure(|| Checkpoint::open(&path).unwrap());
    assert!(opened < MIB, "open held {opened} bytes");
    drop(ck);

    // Decoding both: the two arrays it returns and a block of raw bytes (a
    // whole-file read would add the file's 32 MiB, a whole tensor's 16).
    let (peak, largest, snap) = measure(|| Snapshot::read(&path).unwrap());
    assert!(largest <= tensor, "one allocation of {largest} bytes");
    assert!(
        peak <= 2 * tensor + 2 * MIB,
        "peak {peak} bytes for a {file}-byte file of two {tensor}-byte tensors"
    );
    assert_eq!(snap.state.get("a").unwrap().shape(), &[rows, 64]);
    drop(snap);
    std::fs::remove_dir_all(&dir).unwrap();
}
