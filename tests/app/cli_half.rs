//! `train --dtype/--state-dtype/--rounding` end to end through the binary:
//! a bf16 run still finds the planted pairs and its parameters take half
//! the bytes; the precision is part of the checkpoint, so a resume with
//! other flags is refused naming both; a resumed half-precision run
//! continues bit for bit, on any number of threads; the flags the
//! optimiser cannot honour are refused; `select` and `sweep` train in
//! half precision too.

use std::path::{Path, PathBuf};
use std::process::Output;

use splitgrad::checkpoint::Checkpoint;
use splitgrad::param::Dtype;
use splitgrad::state::TensorData;

use crate::common::cli::{self, assert_same_tensors, last_json, run_ok, s};

fn scratch(name: &str) -> PathBuf {
    cli::scratch("cli_half", name)
}

/// A small, quick training run on the built-in corpus.
const SMALL: &[&str] = &[
    "--batch",
    "256",
    "--dim",
    "8",
    "--checkpoint-every",
    "5",
    "--quiet",
];

/// `train --steps STEPS --out OUT`, [`SMALL`] and `extra`, in `dir`.
fn train_args(out: &Path, steps: u64, extra: &[&str]) -> Vec<String> {
    let head = ["train", "--steps", &steps.to_string(), "--out", s(out)].map(String::from);
    head.into_iter()
        .chain(SMALL.iter().map(|a| a.to_string()))
        .chain(extra.iter().map(|a| a.to_string()))
        .collect()
}

fn train(out: &Path, steps: u64, extra: &[&str]) -> Output {
    let args = train_args(out, steps, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_ok(out.parent().unwrap(), &args)
}

fn metadata(ckpt: &Path, key: &str) -> String {
    Checkpoint::open(ckpt).unwrap().metadata()[key].clone()
}

#[test]
fn a_bf16_run_finds_the_planted_pairs_in_half_the_bytes() {
    let dir = scratch("bf16");
    // The default batch and width: 300 steps find every planted pair.
    let full = |out: &str, extra: &[&str]| {
        let out = dir.join(out);
        let steps = [
            "train",
            "--steps",
            "300",
            "--out",
            s(&out),
            "--quiet",
            "--json",
        ];
        run_ok(&dir, &[&steps[..], extra].concat())
    };
    let f32_run = full("f32", &[]);
    let bf16_run = full("bf16", &["--dtype", "bf16"]);
    let both_run = full("both", &["--dtype", "bf16", "--state-dtype", "bf16"]);
    let (a, b, c) = (
        last_json(&f32_run),
        last_json(&bf16_run),
        last_json(&both_run),
    );
    for (j, dtype, state) in [
        (&a, "f32", "f32"),
        (&b, "bf16", "f32"),
        (&c, "bf16", "bf16"),
    ] {
        assert_eq!(j["f1"], 1.0, "{dtype}/{state}: {j}");
        assert_eq!(j["dtype"], dtype);
        assert_eq!(j["state_dtype"], state);
        assert_eq!(j["rounding"], "stochastic");
    }
    let bytes = |j: &serde_json::Value, k: &str| j[k].as_u64().unwrap();
    assert_eq!(2 * bytes(&b, "params_bytes"), bytes(&a, "params_bytes"));
    assert_eq!(bytes(&b, "state_bytes"), bytes(&a, "state_bytes"));
    assert_eq!(bytes(&c, "params_bytes"), bytes(&b, "params_bytes"));
    // The moments halve; the step counts (8 bytes each) do not.
    let (s32, s16) = (bytes(&a, "state_bytes"), bytes(&c, "state_bytes"));
    let steps = 2 * s16 - s32;
    assert!(steps % 8 == 0 && steps < s16 / 100, "{s32} {s16}");
    // The report says it in words too.
    let text = String::from_utf8_lossy(&bf16_run.stdout);
    assert!(
        text.contains("  memory: parameters 135.2 KiB in bf16, optimiser state 540.7 KiB in f32; stochastic rounding"),
        "{text}"
    );
    let text = String::from_utf8_lossy(&f32_run.stdout);
    assert!(
        text.contains("  memory: parameters 270.3 KiB in f32, optimiser state 540.7 KiB in f32\n"),
        "{text}"
    );
    // And the loss plot's title (an f32 run's says nothing of it).
    let plot = |run: &str| std::fs::read_to_string(dir.join(run).join("loss.svg")).unwrap();
    assert!(
        plot("both")
            .contains("cross-entropy, parameters in bf16, moments in bf16 (stochastic rounding)")
    );
    assert!(!plot("f32").contains("parameters in"));
    // And so does `report` of the checkpoint.
    let ckpt = dir.join("both/model.safetensors");
    assert_eq!(metadata(&ckpt, "dtype"), "bf16");
    assert_eq!(metadata(&ckpt, "state_dtype"), "bf16");
    assert_eq!(metadata(&ckpt, "rounding"), "stochastic");
    let report = run_ok(&dir, &["report", s(&ckpt), "--json"]);
    let r = last_json(&report);
    for k in [
        "dtype",
        "state_dtype",
        "rounding",
        "params_bytes",
        "state_bytes",
        "f1",
    ] {
        assert_eq!(r[k], c[k], "{k}");
    }
    // `export` writes each language's table as the run kept its
    // parameters: the f32 table rounded once to nearest bf16, in half the
    // bytes; `--dtype f32` writes it whole.
    let table = |out: &str, extra: &[&str]| {
        let out = dir.join(out);
        run_ok(
            &dir,
            &[&["export", s(&ckpt), "--out", s(&out)][..], extra].concat(),
        );
        let c = Checkpoint::open(out.join("language-1.safetensors")).unwrap();
        c.get("token_embedding.vocab.weight").unwrap()
    };
    let (kept, wide) = (
        table("export", &[]),
        table("export-f32", &["--dtype", "f32"]),
    );
    assert_eq!(kept.dtype(), "BF16");
    assert_eq!(wide.dtype(), "F32");
    let (TensorData::BF16(kept), TensorData::F32(wide)) = (kept, wide) else {
        unreachable!("the dtypes were checked")
    };
    assert_eq!(kept, wide.mapv(half::bf16::from_f32));
    let refused = cli::fails(
        &dir,
        &["export", s(&ckpt), "--out", "x", "--dtype", "f64"],
        None,
    );
    assert_eq!(
        refused,
        "--dtype f64: export writes tables as f32, bf16 or f16"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `bench --versus-f32`: the f32 workload's steps beside the run's, in
/// the report and its JSON; refused with nothing in half precision or
/// beside `--reference` (bad-inputs rows 69 and 70).
#[test]
fn bench_versus_f32_reports_both_and_refuses_what_it_cannot_compare() {
    let dir = scratch("versus");
    let args = [
        "bench",
        "embed_full",
        "--dtype",
        "bf16",
        "--state-dtype",
        "bf16",
        "--scale",
        "64",
        "--steps",
        "4",
        "--versus-f32",
        "--json",
    ];
    let out = run_ok(&dir, &args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("in f32, alternating step by step: this run takes"),
        "{text}"
    );
    let j = last_json(&out);
    let v = &j["versus_f32"];
    assert_eq!(v["step_s"].as_array().unwrap().len(), 4);
    // (serde_json reads a float back to within an ulp, not always exactly.)
    let ratio = j["median_s"].as_f64().unwrap() / v["median_s"].as_f64().unwrap();
    assert!((v["median_ratio"].as_f64().unwrap() / ratio - 1.0).abs() < 1e-12);
    assert!(v["bytes_ratio"].as_f64().unwrap() < 0.55, "{v}");
    assert!(v["pair_ratio"].as_f64().unwrap() > 0.0);
    // No paired copies unless asked for.
    assert!(!text.contains("paired copy"), "{text}");
    for side in [&j, v] {
        assert!(side["copy_gbps"].as_array().unwrap().is_empty(), "{side}");
        assert!(side["paired_bandwidth_fraction"].is_null(), "{side}");
    }
    assert_eq!(v["block"], 1);
    // The update's floor beside the copy rate, in both dtypes.
    assert!(text.contains("update floor lazy Adam from cache"), "{text}");
    assert!(text.contains("; update floor "), "{text}");
    let floor = j["update_floor_s"].as_f64().unwrap();
    let (n, rate) = (
        j["lazy_adam_elements"].as_u64().unwrap(),
        j["lazy_adam_gelems"].as_f64().unwrap(),
    );
    assert!((floor * rate * 1e9 / n as f64 - 1.0).abs() < 1e-12, "{j}");
    assert!(v["update_floor_s"].as_f64().unwrap() > 0.0, "{v}");
    // In blocks of 3 steps: 4 steps each still, the report says how. With
    // paired copies: each side's steps against a copy after each of them.
    let blocks = run_ok(
        &dir,
        &args
            .iter()
            .chain(&["--versus-block", "3", "--paired-copy"])
            .copied()
            .collect::<Vec<_>>(),
    );
    let text = String::from_utf8_lossy(&blocks.stdout);
    assert!(
        text.contains("in f32, alternating in blocks of 3 steps: this run takes"),
        "{text}"
    );
    assert!(
        text.contains("paired copy  each step against a copy"),
        "{text}"
    );
    assert!(text.contains("; against the paired copies: "), "{text}");
    let j = last_json(&blocks);
    let v = &j["versus_f32"];
    assert_eq!(
        (v["step_s"].as_array().unwrap().len(), &v["block"]),
        (4, &3.into())
    );
    for side in [&j, v] {
        assert_eq!(side["copy_gbps"].as_array().unwrap().len(), 4, "{side}");
        assert!(side["paired_bandwidth_fraction"].as_f64().unwrap() > 0.0);
        assert!(side["paired_memcpy_gbps"].as_f64().unwrap() > 0.0);
    }
    // Without the flag: null.
    let plain = run_ok(
        &dir,
        &args[..args.len() - 2]
            .iter()
            .chain(&["--json"])
            .copied()
            .collect::<Vec<_>>(),
    );
    assert!(last_json(&plain)["versus_f32"].is_null());
    assert_eq!(
        cli::fails(&dir, &["bench", "embed_full", "--versus-f32"], None),
        "--versus-f32 sets a run kept in half precision beside the same run in f32, and this \
         one keeps everything in f32: give --dtype bf16 or f16, or --state-dtype bf16"
    );
    assert_eq!(
        cli::fails(
            &dir,
            &[
                "bench",
                "lmhead",
                "--dtype",
                "bf16",
                "--reference",
                "--versus-f32"
            ],
            None
        ),
        "--versus-f32 and --reference each alternate the steps with another run's: give one of them"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `bench` refuses, by name, the options the command it runs would not
/// honour (bad-inputs rows 71–76), where it once ignored them.
#[test]
fn bench_refuses_options_it_would_not_honour() {
    let dir = scratch("bench-options");
    let sweep_f32 = "the sweep times the bigram model's step in f32 (the workloads time bf16 and \
                     f16, with --versus-f32 beside f32)";
    for (args, want) in [
        (
            &["--sweep", "--dtype", "bf16"][..],
            format!("--dtype bf16 with --sweep: {sweep_f32}"),
        ),
        (
            &["--sweep", "--state-dtype", "bf16"],
            format!("--state-dtype bf16 with --sweep: {sweep_f32}"),
        ),
        (
            &["--sweep", "--versus-f32"],
            "--versus-f32 with --sweep: it compares a workload's steps: give a workload instead"
                .into(),
        ),
        (
            &["--sweep", "--reference"],
            "--reference with --sweep: it times lmhead's step: give lmhead instead".into(),
        ),
        (
            &["--sweep", "--paired-copy"],
            "--paired-copy with --sweep: it pairs a workload's steps with copies: give a \
             workload instead"
                .into(),
        ),
        (
            &["--sweep", "--scale", "4"],
            "--scale with --sweep: it divides a workload's sizes; the sweep's are --sweep-v and \
             --sweep-d"
                .into(),
        ),
        (
            &["embed_full", "--sweep-v", "100"],
            "--sweep-v and --sweep-d are the sizes of --sweep: use them with it".into(),
        ),
        (
            &["splitvocab", "--reference"],
            "--reference times lmhead's matrix products on matrixmultiply too, and splitvocab \
             has none: use it with lmhead"
                .into(),
        ),
    ] {
        let args: Vec<&str> = ["bench"].iter().chain(args).copied().collect();
        assert_eq!(cli::fails(&dir, &args, None), want, "{args:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_resume_with_another_precision_is_refused_naming_both() {
    let dir = scratch("refuse");
    let out = dir.join("run");
    train(&out, 5, &["--dtype", "bf16"]);
    let fails = |extra: &[&str]| {
        let args = train_args(&out, 10, &[&["--resume"], extra].concat());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cli::fails(&dir, &args, None)
    };
    let ckpt = format!("{}: ", out.join("model.safetensors").display());
    assert_eq!(
        fails(&[]),
        format!(
            "{ckpt}the checkpoint was written with dtype = bf16, this run has dtype = f32 (--dtype f32); resume with --dtype bf16"
        )
    );
    assert_eq!(
        fails(&["--dtype", "f16"]),
        format!(
            "{ckpt}the checkpoint was written with dtype = bf16, this run has dtype = f16 (--dtype f16); resume with --dtype bf16"
        )
    );
    assert_eq!(
        fails(&["--dtype", "bf16", "--state-dtype", "bf16"]),
        format!(
            "{ckpt}the checkpoint was written with state_dtype = f32, this run has state_dtype = bf16 (--state-dtype bf16); resume with --state-dtype f32"
        )
    );
    assert_eq!(
        fails(&["--dtype", "bf16", "--rounding", "nearest"]),
        format!(
            "{ckpt}the checkpoint was written with rounding = stochastic, this run has rounding = nearest (--rounding nearest); resume with --rounding stochastic"
        )
    );
    // The same flags resume it.
    train(
        &out,
        10,
        &["--resume", "--dtype", "bf16", "--rounding", "stochastic"],
    );
    // A precision written in a form no run writes is the file's fault, and
    // the message says what a checkpoint keeps instead of naming a flag
    // value that would be refused again (bad-inputs row 97).
    let model = out.join("model.safetensors");
    for (key, junk, keeps) in [
        ("dtype", "bfloat16", "f32, bf16, f16"),
        ("state_dtype", "BF16", "f32, bf16"),
        ("rounding", "Stochastic", "stochastic or nearest"),
    ] {
        let kept = metadata(&model, key);
        cli::edit_metadata(&model, key, junk);
        let args = train_args(&out, 20, &["--resume", "--dtype", "bf16"]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(
            cli::fails(&dir, &args, None),
            format!("{ckpt}metadata `{key}` = {junk:?}: a checkpoint keeps {keeps}"),
            "{key}"
        );
        cli::edit_metadata(&model, key, &kept);
    }
    train(&out, 20, &["--resume", "--dtype", "bf16"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_resumed_half_run_continues_bit_for_bit_on_any_threads() {
    let dir = scratch("resume");
    for (name, flags) in [
        ("bf16", &["--dtype", "bf16"][..]),
        ("bf16-state", &["--dtype", "bf16", "--state-dtype", "bf16"]),
        ("f16-nearest", &["--dtype", "f16", "--rounding", "nearest"]),
    ] {
        let whole = dir.join(format!("{name}-whole"));
        train(&whole, 40, &[flags, &["--threads", "2"]].concat());
        let cut = dir.join(format!("{name}-cut"));
        train(&cut, 20, &[flags, &["--threads", "1"]].concat());
        train(&cut, 40, &[flags, &["--threads", "2", "--resume"]].concat());
        // The held-out curve of the cut run has one more point, at the
        // end of its first part; every weight and moment is the same.
        assert_same_tensors(
            &whole.join("model.safetensors"),
            &cut.join("model.safetensors"),
            &["train.heldout"],
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn thread_counts_give_the_same_half_weights() {
    let dir = scratch("threads");
    let runs: Vec<PathBuf> = [1, 2]
        .iter()
        .map(|t| {
            let out = dir.join(format!("t{t}"));
            let threads = t.to_string();
            train(
                &out,
                20,
                &[
                    "--dtype",
                    "bf16",
                    "--state-dtype",
                    "bf16",
                    "--threads",
                    &threads,
                ],
            );
            out.join("model.safetensors")
        })
        .collect();
    assert_same_tensors(&runs[0], &runs[1], &[]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn precisions_the_run_cannot_keep_are_refused() {
    let dir = scratch("flags");
    let fails = |extra: &[&str]| {
        let args = train_args(&dir.join("run"), 5, extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cli::fails(&dir, &args, None)
    };
    assert_eq!(
        fails(&["--state-dtype", "f16"]),
        "--state-dtype f16: f16 cannot keep Adam's second moment (a squared gradient below 6e-8 is lost); keep the optimiser state in bf16 or f32"
    );
    assert_eq!(
        fails(&["--dtype", "bf16", "--state-dtype", "f64"]),
        "--state-dtype f64: the optimiser state is kept as f32 or bf16"
    );
    assert_eq!(
        fails(&["--dtype", "f64"]),
        "--dtype f64: the model keeps its parameters as f32, bf16 or f16"
    );
    assert_eq!(
        fails(&["--rounding", "nearest"]),
        "--rounding nearest rounds values kept in half precision, and this run keeps none: give --dtype bf16 or f16, or --state-dtype bf16, or leave --rounding out"
    );
    let args = train_args(&dir.join("run"), 5, &["--dtype", "int8"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(
        cli::clap_fails(&dir, &args),
        "error: invalid value 'int8' for '--dtype <DTYPE>': unknown dtype `int8` (expected f32, bf16 or f16)"
    );
    let args = train_args(&dir.join("run"), 5, &["--state-dtype", "f8"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(
        cli::clap_fails(&dir, &args),
        "error: invalid value 'f8' for '--state-dtype <STATE_DTYPE>': unknown dtype `f8` (expected f32 or bf16)"
    );
    // `bench` holds its flags to the same rule and names them.
    assert_eq!(
        cli::fails(&dir, &["bench", "embed_full", "--dtype", "f64"], None),
        "--dtype f64: the model keeps its parameters as f32, bf16 or f16"
    );
    assert_eq!(
        cli::fails(&dir, &["bench", "embed_full", "--state-dtype", "f16"], None),
        "--state-dtype f16: f16 cannot keep Adam's second moment (a squared gradient below 6e-8 is lost); keep the optimiser state in bf16 or f32"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dtypes_are_taken_in_any_case_and_by_torch_names() {
    for (given, kept) in [
        ("BF16", Dtype::BF16),
        ("Float16", Dtype::F16),
        ("half", Dtype::F16),
    ] {
        assert_eq!(given.parse::<Dtype>().unwrap(), kept, "{given}");
    }
    let dir = scratch("dtype-case");
    let out = train(&dir.join("run"), 2, &["--dtype", "BF16"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("bf16"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `select` trains its shared-only model in the precision asked for, says
/// so, and writes it as it was kept; reading that model back with
/// `--checkpoint` scores it the same, and precision flags beside
/// `--checkpoint` (which trains nothing) are refused. The checkpoint of a
/// bf16 `train` run is read as kept (it was refused as "dtype BF16,
/// expected F32").
#[test]
fn select_trains_its_shared_model_in_bf16_and_reads_it_back() {
    let dir = scratch("select");
    let first = dir.join("a").join("index.npz");
    let run = run_ok(
        &dir,
        &[
            "select",
            "--dtype",
            "bf16",
            "--state-dtype",
            "bf16",
            "--steps",
            "300",
            "--out",
            s(&first),
            "--quiet",
            "--json",
        ],
    );
    let v = last_json(&run);
    assert_eq!(
        (&v["dtype"], &v["state_dtype"], &v["rounding"]),
        (
            &serde_json::json!("bf16"),
            &serde_json::json!("bf16"),
            &serde_json::json!("stochastic")
        )
    );
    assert!(v["planted"]["f1"].as_f64().unwrap() >= 0.8, "{v}");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        stdout.contains("parameters in bf16, moments in bf16"),
        "{stdout}"
    );
    let shared = first.with_file_name("shared.safetensors");
    let ck = Checkpoint::open(&shared).unwrap();
    for name in ["token_embedding.vocab.weight", "lm_head.vocab.weight"] {
        assert_eq!(ck.get(name).unwrap().dtype(), "BF16", "{name}");
    }
    // The bf16 model read back selects the same pairs.
    let again = dir.join("b").join("index.npz");
    let reread = run_ok(
        &dir,
        &[
            "select",
            "--checkpoint",
            s(&shared),
            "--out",
            s(&again),
            "--quiet",
            "--json",
        ],
    );
    assert_eq!(
        last_json(&reread)["dtype"],
        serde_json::Value::Null,
        "nothing trained"
    );
    assert_eq!(
        std::fs::read(&first).unwrap(),
        std::fs::read(&again).unwrap()
    );
    // --dtype, and --rounding alone too (it was refused as rounding nothing
    // in half precision, which no flag could mend), train nothing here.
    for flag in [["--dtype", "bf16"], ["--rounding", "nearest"]] {
        let c = dir.join("c.npz");
        let args = [
            &["select", "--checkpoint", s(&shared)],
            &flag[..],
            &["--out", s(&c)],
        ];
        let err = cli::fails(&dir, &args.concat(), None);
        assert!(err.contains("with --checkpoint it trains none"), "{err}");
    }
    // A bf16 run of `train` is read as it was kept too.
    let run_dir = dir.join("run");
    train(&run_dir, 20, &["--dtype", "bf16"]);
    run_ok(
        &dir,
        &[
            "select",
            "--checkpoint",
            s(&run_dir.join("model.safetensors")),
            "--out",
            s(&dir.join("d").join("index.npz")),
            "--quiet",
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sweep --dtype bf16` trains every weight's model in bf16, records the
/// precision in sweep.json, and the fusion penalty still merges the
/// languages' rows.
#[test]
fn sweep_runs_in_bf16_and_records_it() {
    let dir = scratch("sweep");
    let out = dir.join("sweep");
    run_ok(
        &dir,
        &[
            "sweep",
            "--dtype",
            "bf16",
            "--steps",
            "200",
            "--weights",
            "0,0.3",
            "--out",
            s(&out),
            "--quiet",
        ],
    );
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("sweep.json")).unwrap()).unwrap();
    assert_eq!(v["dtype"], "bf16");
    assert_eq!(v["state_dtype"], "f32");
    let eff: Vec<f64> = v["sweep"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["effective_vocabularies"].as_f64().unwrap())
        .collect();
    assert!(eff[1] < eff[0] - 1.0, "the penalty merges rows: {eff:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
