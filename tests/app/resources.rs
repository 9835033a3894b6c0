//! Rows 44– of `docs/bad-inputs.md`: inputs made to exhaust memory, files
//! that are not regular files, and results that must not be replaced.
//!
//! Each row runs `splitgrad` under an address-space limit of 2 GiB
//! (`ulimit -v`), as a hostile input meets it on a small machine, and
//! checks that it fails with status 1 and one line `splitgrad: error: …`
//! (never an abort, a kill or a panic), and that no file under the row's
//! folder changed. The rows are one table (row 51, a golden case, is a
//! test of its own); a failing row is reported by its name.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use crate::common::cli::{self, scratch, small_corpus};
use crate::common::table::Want::{self, Contains, EndsWith, Is, StartsWith};
use crate::common::table::run_rows;

/// The address-space limit every row runs under, in KiB.
const LIMIT_KIB: u64 = 2 << 20;

/// `splitgrad ARGS` in `dir` under the address-space limit.
fn limited(dir: &Path, args: &[&str]) -> Output {
    cli::run_limited(dir, args, LIMIT_KIB)
}

struct Row {
    name: &'static str,
    /// Writes the row's files into its folder.
    setup: fn(&Path),
    /// The arguments, run in the row's folder.
    args: &'static [&'static str],
    /// What the line after `splitgrad: error: ` must be.
    want: &'static [Want],
    /// A check of the folder after the run.
    then: fn(&Path),
}

fn row(
    name: &'static str,
    setup: fn(&Path),
    args: &'static [&'static str],
    want: &'static [Want],
) -> Row {
    Row {
        name,
        setup,
        args,
        want,
        then: |_| {},
    }
}

/// What a "needs more memory than there is" line says after its figures.
const NEEDS_MORE: Want = Contains(&[", more than the ", " of memory available"]);

const QUICK: &[&str] = &[
    "train", "--steps", "2", "--batch", "64", "--dim", "4", "--out", "run",
];

/// The table. A row: its name, what it writes, the arguments, what the
/// line must be.
#[rustfmt::skip]
fn rows() -> Vec<Row> {
    const CORPUS: &[&str] = &["train", "--corpus", "corpus.npz", "--out", "out"];
    const CORPUS_MIN_COUNT_1: &[&str] = &["train", "--corpus", "corpus.npz", "--min-count", "1", "--out", "out"];
    let rows = vec![
        Row { then: nothing_created, ..row("r44_corpus_token_id_of_four_billion",
            |dir| drop(cli::corpus_with(dir, 4_000_000_000, 1)), CORPUS_MIN_COUNT_1, &[
                StartsWith("training this model (V 4000000001 (the largest token id of corpus.npz + 1), L 2 (the largest language id of corpus.npz + 1), D 64, "),
                Contains(&[" split rows, batch 4096, a corpus of 8 tokens at 5 bytes each) needs "]),
                Contains(&["; the corpus 56 B + the model with its optimiser state "]),
                EndsWith("; lower --dim or --batch"),
            ]) },
        row("r45_corpus_language_id_of_four_billion", |dir| drop(cli::corpus_with(dir, 3, 4_000_000_000)), CORPUS_MIN_COUNT_1,
            &[StartsWith("training this model (V 4 (the largest token id of corpus.npz + 1), L 4000000001 (the largest language id of corpus.npz + 1)")]),
        row("r46_dim_of_a_billion", |_| {}, &["train", "--dim", "1000000000", "--out", "out"], &[
            StartsWith("training this model (V 500 (the synthetic corpus), L 4 (the synthetic corpus), D 1000000000, 80 split rows, batch 4096, a corpus of 1048576 tokens at 3 bytes each) needs "),
            NEEDS_MORE,
            EndsWith("; lower --dim or --batch"),
        ]),
        row("r47_batch_of_a_trillion", |_| {}, &["train", "--batch", "1000000000000", "--out", "out"],
            &[Contains(&[", batch 1000000000000, a corpus of 1048576 tokens at 3 bytes each) needs "])]),
        row("r48_checkpoint_metadata_claims_a_vocabulary_of_a_trillion", vocabulary_of_a_trillion, &["report", "run/model.safetensors"],
            &[StartsWith("run/model.safetensors: loading this model (V 1000000000000 (the checkpoint's metadata), L 4 (the checkpoint's metadata), D 4, 80 split rows) needs ")]),
        // 530 M int64 (4.2 GB; 2.1 GB as the u32 ids they may need),
        // deflated: header and zip entry agree; refused from the headers.
        row("r49_npz_member_claims_more_elements_than_memory_holds", |dir| claimed_npz(&dir.join("corpus.npz"), 530_000_000, 8, &[]), CORPUS,
            &[StartsWith("training this model (V 0 (not stated by corpus.npz: 0 until its ids are read), L 0 (not stated by corpus.npz: 0 until its ids are read), D 64, 0 split rows, batch 4096, a corpus of 530000000 tokens at 5 bytes each) needs "),
              Contains(&["; the corpus 2.7 GiB + "])]),
        row("r50_npz_member_claims_more_bytes_than_the_file_has", |dir| claimed_npz(&dir.join("corpus.npz"), 1000, 0, &[0; 16]), CORPUS,
            &[StartsWith("corpus.npz: array `token_ids`: truncated archive: the member's data would end at byte ")]),
        row("r52_report_of_a_device", |_| {}, &["report", "/dev/zero"],
            &[Is("/dev/zero: is a character device, not a regular file")]),
        row("r53_corpus_is_a_fifo", fifo, CORPUS,
            &[Is("corpus.npz: is a FIFO (named pipe), not a regular file")]),
        Row { then: force_replaces_it, ..row("r54_train_over_a_finished_run", |dir| quick_run(dir, "run"), QUICK,
            &[Is("run: already holds a run at step 3 of 3 on synthetic (model.safetensors); give --resume to continue it, --force to replace it, or another --out")]) },
        row("r55_select_into_a_text_file", |dir| fs::write(dir.join("afile.txt"), "my notes").unwrap(),
            &["select", "--steps", "2", "--out", "afile.txt"], &[Is("afile.txt: --out must name an .npz file")]),
        row("r56_select_over_an_existing_index", |dir| fs::write(dir.join("index.npz"), "an earlier index").unwrap(),
            &["select", "--steps", "2", "--out", "index.npz"], &[Is("index.npz: already exists; give --force to replace it, or another --out")]),
        row("r57_sweep_over_an_existing_sweep", existing_sweep, &["sweep", "--steps", "2", "--out", "sw"],
            &[Is("sw/sweep.json: already exists; give --force to replace it, or another --out")]),
        row("r58_threads_beyond_reason", |_| {}, &["train", "--threads", "100000", "--out", "out"],
            &[StartsWith("--threads 100000 is more than 1024")]),
        row("r59_steps_zero", |_| {}, &["train", "--steps", "0", "--out", "out"],
            &[Is("--steps must be at least 1: a run of 0 steps trains nothing")]),
    ];
    // A FIFO is made with mkfifo.
    rows.into_iter().filter(|r| cfg!(unix) || !r.name.contains("fifo")).collect()
}

/// After row 44.
fn nothing_created(dir: &Path) {
    assert!(
        !dir.join("out").exists(),
        "nothing is created before the check"
    );
}

/// Row 48: a quick run whose checkpoint's metadata claims V = 10^12.
fn vocabulary_of_a_trillion(dir: &Path) {
    cli::run_ok(dir, QUICK);
    cli::edit_metadata(
        &dir.join("run/model.safetensors"),
        "vocab_size",
        "1000000000000",
    );
}

/// Row 53.
fn fifo(dir: &Path) {
    let made = Command::new("mkfifo")
        .arg(dir.join("corpus.npz"))
        .status()
        .unwrap();
    assert!(made.success());
}

/// After row 54: `--force` replaces the run.
fn force_replaces_it(dir: &Path) {
    cli::assert_ok(&limited(dir, &[QUICK, &["--force"]].concat()));
}

/// Row 57.
fn existing_sweep(dir: &Path) {
    fs::create_dir_all(dir.join("sw")).unwrap();
    fs::write(dir.join("sw/sweep.json"), "{}").unwrap();
}

/// Rows 44–59 but 51 (below): each runs under the address-space limit and
/// checks the failure ([`cli::fails`]) and its line.
#[test]
fn resource_rows_44_to_59() {
    run_rows(
        &rows(),
        |r| r.name,
        |row| {
            let dir = scratch("resources", &row.name[..3]);
            (row.setup)(&dir);
            let line = cli::fails(&dir, row.args, Some(LIMIT_KIB));
            for want in row.want {
                want.check(&line, cli::s(&dir));
            }
            (row.then)(&dir);
        },
    );
}

/// A zip archive of one member `token_ids.npy`, stored with `method` (0
/// stored, 8 deflated), whose npy header claims `shape` of int64 and whose
/// zip entry claims the matching size, holding only `data`.
fn claimed_npz(path: &Path, shape: u64, method: u16, data: &[u8]) {
    let mut header = format!("{{'descr': '<i8', 'fortran_order': False, 'shape': ({shape},), }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut npy_head = b"\x93NUMPY\x01\x00".to_vec();
    npy_head.extend_from_slice(&(header.len() as u16).to_le_bytes());
    npy_head.extend_from_slice(header.as_bytes());
    let claimed = npy_head.len() as u64 + shape * 8;
    assert!(claimed < u32::MAX as u64, "no zip64 here");
    let mut body = npy_head.clone();
    body.extend_from_slice(data);
    // A stored member's data is the npy bytes; a deflated one is one
    // stored deflate block of them, so the claim is honest about the
    // method and wrong only where the row says.
    let payload = if method == 8 {
        let mut p = vec![0x01];
        p.extend_from_slice(&(body.len() as u16).to_le_bytes());
        p.extend_from_slice(&(!(body.len() as u16)).to_le_bytes());
        p.extend_from_slice(&body);
        p
    } else {
        body
    };
    let compressed = if method == 8 {
        payload.len() as u32
    } else {
        claimed as u32
    };
    let name = b"token_ids.npy";
    let mut z = Vec::new();
    let local = |z: &mut Vec<u8>| {
        z.extend_from_slice(&0x04034b50u32.to_le_bytes());
        z.extend_from_slice(&20u16.to_le_bytes());
        z.extend_from_slice(&0u16.to_le_bytes());
        z.extend_from_slice(&method.to_le_bytes());
        z.extend_from_slice(&[0, 0, 0x21, 0]);
        z.extend_from_slice(&0u32.to_le_bytes()); // crc
        z.extend_from_slice(&compressed.to_le_bytes());
        z.extend_from_slice(&(claimed as u32).to_le_bytes());
        z.extend_from_slice(&(name.len() as u16).to_le_bytes());
        z.extend_from_slice(&0u16.to_le_bytes());
        z.extend_from_slice(name);
    };
    local(&mut z);
    z.extend_from_slice(&payload);
    let cd_start = z.len() as u32;
    z.extend_from_slice(&0x02014b50u32.to_le_bytes());
    z.extend_from_slice(&20u16.to_le_bytes());
    z.extend_from_slice(&20u16.to_le_bytes());
    z.extend_from_slice(&0u16.to_le_bytes());
    z.extend_from_slice(&method.to_le_bytes());
    z.extend_from_slice(&[0, 0, 0x21, 0]);
    z.extend_from_slice(&0u32.to_le_bytes());
    z.extend_from_slice(&compressed.to_le_bytes());
    z.extend_from_slice(&(claimed as u32).to_le_bytes());
    z.extend_from_slice(&(name.len() as u16).to_le_bytes());
    z.extend_from_slice(&[0; 8]);
    z.extend_from_slice(&0u32.to_le_bytes()); // attributes
    z.extend_from_slice(&0u32.to_le_bytes()); // local header at 0
    z.extend_from_slice(name);
    let cd_len = z.len() as u32 - cd_start;
    z.extend_from_slice(&0x06054b50u32.to_le_bytes());
    z.extend_from_slice(&[0; 4]);
    z.extend_from_slice(&1u16.to_le_bytes());
    z.extend_from_slice(&1u16.to_le_bytes());
    z.extend_from_slice(&cd_len.to_le_bytes());
    z.extend_from_slice(&cd_start.to_le_bytes());
    z.extend_from_slice(&0u16.to_le_bytes());
    fs::write(path, z).unwrap();
}

#[test]
fn r51_golden_case_of_sixteen_gibibytes() {
    let dir = scratch("resources", "r51");
    let layer = dir.join("cases/lm-head");
    fs::create_dir_all(&layer).unwrap();
    let f = fs::File::create(layer.join("huge.npz")).unwrap();
    f.set_len(16 << 30).unwrap(); // sparse: no disk used
    drop(f);
    let run = limited(
        &dir,
        &["golden", "eval", "--inputs", "cases", "--out", "results"],
    );
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "cases/lm-head/huge.npz: a case file of 16.0 GiB is larger than any case can be"
        ),
        "{stderr}"
    );
    let _ = fs::remove_dir_all(&dir);
}

/// Three quick steps into `dir/out`.
fn quick_run(dir: &Path, out: &str) {
    cli::run_ok(
        dir,
        &[
            "train", "--steps", "3", "--batch", "64", "--dim", "4", "--out", out,
        ],
    );
}

#[test]
fn default_run_folders_differ_for_corpora_of_one_name() {
    let dir = scratch("resources", "default_folders");
    for sub in ["a", "b"] {
        fs::create_dir_all(dir.join(sub)).unwrap();
        small_corpus(&dir.join(sub));
        let corpus = format!("{sub}/corpus.npz");
        let args = [
            "--steps",
            "2",
            "--batch",
            "16",
            "--dim",
            "4",
            "--min-count",
            "1",
        ];
        cli::run_ok(
            &dir,
            &[&["train"][..], &args, &["--corpus", &corpus]].concat(),
        );
    }
    let runs = crate::io_common::listing(&dir.join("runs"));
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs.iter().all(|r| r.starts_with("corpus-")), "{runs:?}");
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn stale_temporaries_of_a_killed_run_are_removed_on_the_next_start() {
    let dir = scratch("resources", "stale");
    quick_run(&dir, "run");
    // A temporary of a process that no longer exists.
    let stale = dir.join("run/.model.safetensors.tmp-2147483646-3");
    fs::write(&stale, b"half a checkpoint").unwrap();
    let run = cli::run_ok(
        &dir,
        &[
            "train", "--steps", "5", "--batch", "64", "--dim", "4", "--out", "run", "--resume",
        ],
    );
    assert!(!stale.exists());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("a temporary file left by a process that was killed"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        stdout.contains("resumed run/model.safetensors from step 3 of 5"),
        "{stdout}"
    );
    let _ = fs::remove_dir_all(&dir);
}

/// Sends `signal` to the process with `pid`.
fn kill(signal: &str, pid: u32) {
    let ok = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

/// The flags of [`long_run`] and its resumptions, after `--steps N`.
const LONG: &[&str] = &[
    "--batch",
    "256",
    "--dim",
    "8",
    "--checkpoint-every",
    "20",
    "--out",
    "run",
];

/// A long run in `dir/run`, started; returns once its first checkpoint
/// (every 20 steps) is on disk.
fn long_run(dir: &Path) -> std::process::Child {
    let child = cli::command(dir, &[&["train", "--steps", "1000000"][..], LONG].concat())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ckpt = dir.join("run/model.safetensors");
    let start = std::time::Instant::now();
    while !ckpt.exists() {
        assert!(
            start.elapsed().as_secs() < 120,
            "no checkpoint after 2 minutes"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child
}

/// `train --steps STEPS` of [`LONG`] with `--resume`; its output.
fn resume_long(dir: &Path, steps: u64) -> Output {
    let steps = steps.to_string();
    cli::run_ok(
        dir,
        &[&["train", "--steps", &steps][..], LONG, &["--resume"]].concat(),
    )
}

#[cfg(unix)]
#[test]
fn sigint_and_sigterm_finish_the_step_write_a_checkpoint_and_say_how_to_go_on() {
    for (signal, code) in [("-INT", 130), ("-TERM", 143)] {
        let dir = scratch("resources", &format!("signal{signal}"));
        let child = long_run(&dir);
        kill(signal, child.id());
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(code), "{signal}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let line = stderr
            .lines()
            .find(|l| l.starts_with("splitgrad: stopped at step "))
            .unwrap_or_else(|| panic!("{signal}: {stderr}"));
        let step: u64 = line["splitgrad: stopped at step ".len()..]
            .split(':')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(line.contains(": resume with --resume"), "{line}");
        // The checkpoint is of that very step: resuming says so and goes on.
        let resumed = resume_long(&dir, step + 3);
        let stdout = String::from_utf8_lossy(&resumed.stdout);
        assert!(
            stdout.contains(&format!(
                "resumed run/model.safetensors from step {step} of {}",
                step + 3
            )),
            "{stdout}"
        );
        let _ = fs::remove_dir_all(&dir);
    }
}

#[cfg(unix)]
#[test]
fn a_second_ctrl_c_stops_at_once_with_the_last_checkpoint_intact() {
    let dir = scratch("resources", "double-ctrl-c");
    let child = long_run(&dir);
    kill("-INT", child.id());
    kill("-INT", child.id());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    // Whichever checkpoint is there, periodic or the one the first signal
    // asked for, is whole: it resumes, for one step more.
    let report = cli::run_ok(&dir, &["report", "run/model.safetensors", "--json"]);
    let at = crate::common::cli::last_json(&report)["steps"]
        .as_u64()
        .unwrap();
    let steps = (at + 1).to_string();
    cli::run_ok(
        &dir,
        &[
            "train", "--steps", &steps, "--batch", "256", "--dim", "8", "--out", "run", "--resume",
        ],
    );
    let _ = fs::remove_dir_all(&dir);
}

/// `RAYON_NUM_THREADS` that is not a count, or beyond reason, is refused
/// as `--threads` would be (rayon alone would fall back to every core
/// without a word); unset, empty or 0 is every core (bad-inputs row 99).
#[test]
fn rayon_num_threads_that_is_not_a_count_is_refused() {
    let dir = scratch("resources", "rayon_env");
    let args = ["train", "--steps", "2", "--batch", "64", "--quiet", "--out"];
    for (value, want) in [
        (
            "abc",
            "RAYON_NUM_THREADS=\"abc\" is not a number of threads: set a count from 1 to 1024 \
             (0 or unset: every core), or give --threads",
        ),
        (
            "-2",
            "RAYON_NUM_THREADS=\"-2\" is not a number of threads: set a count from 1 to 1024 \
             (0 or unset: every core), or give --threads",
        ),
        (
            "100000",
            "RAYON_NUM_THREADS=100000 is more than 1024; this machine has",
        ),
    ] {
        // Status 1, one line, nothing written (no output folder made).
        let err = cli::fails_with(&dir, &[&args[..], &["refused"]].concat(), |c| {
            c.env("RAYON_NUM_THREADS", value)
        });
        assert!(err.starts_with(want), "{value}: {err}");
    }
    // --threads wins over the variable; 0, empty and a count run.
    for (i, (value, extra)) in [
        ("abc", &["--threads", "1"][..]),
        ("0", &[]),
        ("", &[]),
        (" 2 ", &[]),
    ]
    .into_iter()
    .enumerate()
    {
        let out_dir = format!("ran{i}");
        let out = cli::command(&dir, &[&args[..], &[out_dir.as_str()], extra].concat())
            .env("RAYON_NUM_THREADS", value)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{value:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(dir.join(&out_dir).join("model.safetensors").exists());
    }
}
