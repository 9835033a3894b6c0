//! A checkpoint is held to its own metadata before any tensor is read:
//! `report`, `export` and `train --resume` refuse a header whose tensors
//! the metadata does not describe (another dtype, a tensor larger than the
//! run could have), naming the tensor, without reading it; optimiser step
//! counts must be the run's step; and numbers in the metadata (a seed near
//! `u64::MAX`) are not taken for byte offsets. `export` refuses a table
//! that overflows the dtype it is asked for, and `--force` removes the
//! tables of the export it replaces.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::common::cli::{self, run, run_limited, run_ok, s};

fn scratch(name: &str) -> PathBuf {
    cli::scratch("checkpoint_header", name)
}

/// A short run on the built-in corpus into `dir/out`; its checkpoint.
fn trained(dir: &Path, extra: &[&str]) -> PathBuf {
    let out = dir.join("out");
    let mut args = vec!["train", "--steps", "6", "--batch", "128", "--dim", "8"];
    args.extend(["--quiet", "--out", s(&out)]);
    args.extend_from_slice(extra);
    run_ok(dir, &args);
    out.join("model.safetensors")
}

/// `train --resume` of [`trained`]'s run in `out` to step 8, `extra`
/// besides.
fn resume_args<'a>(out: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["train", "--steps", "8", "--batch", "128", "--dim", "8"];
    args.extend(["--quiet", "--resume", "--out", s(out)]);
    args.extend_from_slice(extra);
    args
}

/// The header of a safetensors file and its data section.
fn split(path: &Path) -> (Value, Vec<u8>) {
    let bytes = fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (header, bytes[8 + n..].to_vec())
}

/// Writes `header` and `data` as a safetensors file at `path`, then makes
/// the file `extra` bytes longer (a hole: nothing written).
fn join(path: &Path, header: &Value, data: &[u8], extra: u64) {
    let text = serde_json::to_string(header).unwrap();
    let mut f = fs::File::create(path).unwrap();
    f.write_all(&(text.len() as u64).to_le_bytes()).unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f.write_all(data).unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len + extra).unwrap();
}

/// Runs `splitgrad ARGS` in `dir`, asserts it failed with a message (no
/// panic), and returns its standard error.
#[track_caller]
fn fails(dir: &Path, args: &[&str]) -> String {
    let out = run(dir, args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

#[test]
fn a_seed_near_u64_max_is_not_taken_for_an_offset() {
    let dir = scratch("seed");
    let ck = trained(&dir, &["--seed", "18446744073709551615"]);
    run_ok(&dir, &["report", s(&ck)]);
    let out = ck.parent().unwrap();
    run_ok(&dir, &resume_args(out, &["--seed", "18446744073709551615"]));
}

#[test]
fn a_weight_of_another_dtype_than_the_metadata_says_is_refused() {
    let dir = scratch("dtype");
    let ck = trained(&dir, &["--dtype", "bf16", "--state-dtype", "bf16"]);
    // The table's bytes read as f16 instead: as long, other values.
    let (mut header, data) = split(&ck);
    header["token_embedding.vocab.weight"]["dtype"] = json!("F16");
    let bad = dir.join("f16_table.safetensors");
    join(&bad, &header, &data, 0);
    let want = "array `token_embedding.vocab.weight`: has dtype F16, expected BF16";
    for cmd in [
        vec!["report", s(&bad)],
        vec!["export", s(&bad), "--out", "ex"],
    ] {
        let err = fails(&dir, &cmd);
        assert!(err.contains(want), "{cmd:?}: {err}");
    }
    assert!(!dir.join("ex").exists());

    // Metadata that says the moments are f32 when they are bf16.
    let (mut header, data) = split(&ck);
    header["__metadata__"]["state_dtype"] = json!("f32");
    let bad = dir.join("state_f32.safetensors");
    join(&bad, &header, &data, 0);
    let err = fails(&dir, &["report", s(&bad)]);
    assert!(
        err.contains("array `optimizer.") && err.contains("has dtype BF16, expected F32"),
        "{err}"
    );
}

#[test]
fn a_tensor_larger_than_the_run_could_have_is_refused_unread() {
    let dir = scratch("large");
    let ck = trained(&dir, &[]);
    let (mut header, data) = split(&ck);
    // 1.6 GB more of a tensor the metadata's sizes cannot account for,
    // as a hole in the file: read, it would need the memory.
    let big: u64 = 50_000_000 * 8 * 4;
    let end = data.len() as u64;
    header["eval.extra"] = json!({
        "dtype": "F32", "shape": [50_000_000u64, 8], "data_offsets": [end, end + big]
    });
    let bad_dir = dir.join("bad");
    fs::create_dir_all(&bad_dir).unwrap();
    let bad = bad_dir.join("model.safetensors");
    join(&bad, &header, &data, big);
    let want = "array `eval.extra`: has shape [50000000, 8], larger than any tensor of the run";
    // Under a 600 MiB address space: refused before the tensor is read.
    for cmd in [
        vec!["report", s(&bad)],
        vec!["export", s(&bad), "--out", "ex"],
    ] {
        let out = run_limited(&dir, &cmd, 600 << 10);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{cmd:?}: {err}");
        assert!(err.contains(want), "{cmd:?}: {err}");
    }
    let out = run_limited(&dir, &resume_args(&bad_dir, &[]), 600 << 10);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(want), "{err}");
}

#[test]
fn an_optimiser_step_count_other_than_the_runs_is_refused() {
    let dir = scratch("steps");
    let ck = trained(&dir, &[]);
    let (header, mut data) = split(&ck);
    let name = "optimizer.dense.lm_head.vocab.weight.step";
    let at = header[name]["data_offsets"][0].as_u64().unwrap() as usize;
    data[at..at + 8].copy_from_slice(&1_000_000u64.to_le_bytes());
    join(&ck, &header, &data, 0);
    let want = format!(
        "array `{name}`: an optimiser's step count of 1000000, where the run's metadata says step 6"
    );
    let err = fails(&dir, &["report", s(&ck)]);
    assert!(err.contains(&want), "{err}");
    let out = ck.parent().unwrap();
    let err = fails(&dir, &resume_args(out, &[]));
    assert!(err.contains(&want), "{err}");
}

#[test]
fn export_refuses_a_table_beyond_f16_and_force_removes_the_previous_tables() {
    let dir = scratch("export");
    let ck = trained(&dir, &[]);
    // The shared table's row 3, column 2 beyond f16's largest value.
    let (header, mut data) = split(&ck);
    let name = "token_embedding.vocab.weight";
    let at = header[name]["data_offsets"][0].as_u64().unwrap() as usize + (3 * 8 + 2) * 4;
    data[at..at + 4].copy_from_slice(&70000.0f32.to_le_bytes());
    let big = dir.join("big.safetensors");
    join(&big, &header, &data, 0);
    let err = fails(
        &dir,
        &["export", s(&big), "--out", "ex16", "--dtype", "f16"],
    );
    assert!(
        err.contains("does not fit in f16: row 3, column 2 is 70000"),
        "{err}"
    );
    assert!(!dir.join("ex16").exists());
    run_ok(
        &dir,
        &["export", s(&big), "--out", "exbf", "--dtype", "bf16"],
    );

    // A previous export's tables this one does not write are removed by
    // --force; other files stay.
    let out = dir.join("ex");
    run_ok(&dir, &["export", s(&ck), "--out", s(&out)]);
    let kept = out.join("kept.json");
    let mut json: Value = serde_json::from_slice(&fs::read(&kept).unwrap()).unwrap();
    json["languages"].as_array_mut().unwrap().push(json!("xx"));
    fs::write(&kept, serde_json::to_string(&json).unwrap()).unwrap();
    fs::write(out.join("xx.safetensors"), b"another run's table").unwrap();
    fs::write(out.join("notes.txt"), b"mine").unwrap();
    run_ok(&dir, &["export", s(&ck), "--out", s(&out), "--force"]);
    assert!(!out.join("xx.safetensors").exists());
    assert!(out.join("language-0.safetensors").exists());
    assert_eq!(fs::read(out.join("notes.txt")).unwrap(), b"mine");
}
