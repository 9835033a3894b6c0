//! Replays the fuzz corpora with stable Rust: every file under
//! `fuzz/corpus/<target>/`, `fuzz/artifacts/<target>/` (local crashes, not
//! committed) and `tests/fuzz_regressions/<target>/` goes through the same
//! body the fuzz target runs (`fuzz/src/bodies/`). No libFuzzer, no
//! nightly: CI runs this like any test.
//!
//! The seed files of the corpora are written by the ignored test
//! `write_seed_corpora`:
//!
//! ```text
//! cargo test --release --test main -- --ignored write_seed_corpora
//! ```

#[path = "../../fuzz/src/bodies/mod.rs"]
mod bodies;

pub use bodies::golden_input_names;

use std::collections::BTreeMap;
use std::io::Cursor;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use ndarray::{Array1, Array2, ArrayD, IxDyn, arr0, arr1};
use splitgrad::Rng;
use splitgrad::checkpoint::{self, TensorRef};
use splitgrad::io::NpzWriter;

use crate::common::table::panic_message;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The files of one target, in a stable order.
fn inputs(target: &str) -> Vec<PathBuf> {
    let dirs = [
        root().join("fuzz/corpus").join(target),
        root().join("fuzz/artifacts").join(target),
        root().join("tests/fuzz_regressions").join(target),
    ];
    let mut files = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut here: Vec<PathBuf> = entries
            .map(|e| e.expect("readable folder").path())
            .filter(|p| p.is_file())
            .collect();
        here.sort();
        files.extend(here);
    }
    files
}

/// Runs `body` on every input of `target`; a panic names the file.
fn replay(target: &str, body: fn(&[u8])) {
    let files = inputs(target);
    assert!(
        !files.is_empty(),
        "no corpus for {target}: run write_seed_corpora"
    );
    for path in &files {
        let bytes = std::fs::read(path).expect("readable input");
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| body(&bytes))) {
            let message = panic_message(&*panic);
            panic!("{target}: {} panics: {message}", path.display());
        }
    }
}

/// A test per target, `replay_TARGET`, replaying its inputs through
/// `bodies::TARGET`.
macro_rules! replay_tests {
    ($($test:ident: $target:ident),+ $(,)?) => {$(
        #[test]
        fn $test() {
            replay(stringify!($target), bodies::$target);
        }
    )+};
}

replay_tests!(
    replay_index_loader: index_loader,
    replay_corpus_loader: corpus_loader,
    replay_checkpoint_loader: checkpoint_loader,
    replay_routing: routing,
    replay_differential: differential,
    replay_golden_eval: golden_eval,
);

// ---------------------------------------------------------------------------
// Seeds

fn npz_bytes(fill: impl FnOnce(&mut NpzWriter)) -> Vec<u8> {
    let mut w = NpzWriter::new("seed.npz");
    fill(&mut w);
    let mut out = Cursor::new(Vec::new());
    w.write_to(&mut out).expect("write to memory");
    out.into_inner()
}

fn write_seeds(target: &str, seeds: Vec<(&str, Vec<u8>)>) {
    let dir = root().join("fuzz/corpus").join(target);
    std::fs::create_dir_all(&dir).expect("corpus folder");
    for (name, bytes) in seeds {
        std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("write a seed");
    }
}

/// `[L − 1, V − 1]` then the npz: the index target's framing.
fn index_seed(l: u8, v: u8, npz: Vec<u8>) -> Vec<u8> {
    let mut out = vec![l - 1, v - 1];
    out.extend(npz);
    out
}

fn checkpoint_bytes(trainer_steps: u64) -> Vec<u8> {
    let mut trainer = bodies::checkpoint_trainer();
    for _ in 0..trainer_steps {
        trainer.step().expect("step");
    }
    let dir = std::env::temp_dir().join(format!("splitgrad-seeds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp folder");
    let path = dir.join(format!("step{trainer_steps}.safetensors"));
    trainer.save(&path).expect("save");
    let bytes = std::fs::read(&path).expect("read back");
    std::fs::remove_dir_all(&dir).expect("clean up");
    bytes
}

fn random_bytes(seed: u64, n: usize, first: u8) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut out = vec![first];
    out.extend((1..n).map(|_| rng.below(256) as u8));
    out
}

#[test]
#[ignore = "writes the seed files of fuzz/corpus; run by hand"]
fn write_seed_corpora() {
    write_seeds(
        "index_loader",
        vec![
            (
                "valid",
                index_seed(
                    3,
                    10,
                    npz_bytes(|w| {
                        w.add("language_index", &arr1(&[0i64, 2, 1]))
                            .add("token_index", &arr1(&[5i64, 5, 9]));
                    }),
                ),
            ),
            (
                "valid-score-u8",
                index_seed(
                    2,
                    8,
                    npz_bytes(|w| {
                        w.add("language_index", &arr1(&[0u8, 1, 1, 0]))
                            .add("token_index", &arr1(&[7u8, 7, 0, 3]))
                            .add("score", &arr1(&[0.5f64, -1.0, 2.0, 0.0]));
                    }),
                ),
            ),
            (
                "duplicate",
                index_seed(
                    2,
                    4,
                    npz_bytes(|w| {
                        w.add("language_index", &arr1(&[1i64, 0, 1]))
                            .add("token_index", &arr1(&[3i64, 3, 3]));
                    }),
                ),
            ),
            ("structured", {
                let mut b = random_bytes(11, 300, 0x82);
                b[1] = 9;
                b
            }),
            (
                "negative-nan-score",
                index_seed(
                    2,
                    4,
                    npz_bytes(|w| {
                        w.add("language_index", &arr1(&[1i64, -1]))
                            .add("token_index", &arr1(&[3i64, 2]))
                            .add("score", &arr1(&[f32::NAN, 1.0]));
                    }),
                ),
            ),
        ],
    );

    write_seeds(
        "corpus_loader",
        vec![
            (
                "valid-sequences",
                npz_bytes(|w| {
                    w.add("token_ids", &arr1(&[4i64, 5, 6, 7, 1, 2]))
                        .add("language_ids", &arr1(&[1i64, 1, 0, 0, 1, 0]))
                        .add("sequence_starts", &arr1(&[0i64, 2, 5]));
                }),
            ),
            (
                "valid-u8-one-sequence",
                npz_bytes(|w| {
                    w.add("token_ids", &arr1(&[3u8, 0, 2, 3, 3]))
                        .add("language_ids", &arr1(&[0u8, 0, 0, 1, 1]));
                }),
            ),
            ("structured", random_bytes(12, 300, b'S')),
            (
                "unsorted-starts",
                npz_bytes(|w| {
                    w.add("token_ids", &arr1(&[1i64, 2, 3, 4]))
                        .add("language_ids", &arr1(&[0i64, 0, 0, 0]))
                        .add("sequence_starts", &arr1(&[2i64, 1]));
                }),
            ),
            (
                "float-ids",
                npz_bytes(|w| {
                    w.add("token_ids", &arr1(&[1.0f64, f64::NAN]))
                        .add("language_ids", &arr1(&[0i64, 0]));
                }),
            ),
        ],
    );

    let w2 = Array2::from_shape_fn((2, 3), |(i, j)| (i * 3 + j) as f32 - 2.5);
    let empty = ArrayD::<f64>::zeros(IxDyn(&[0, 4]));
    let (step, ids) = (arr0(7u64), Array1::from(vec![-1i64, 3, 9]));
    let nan = arr1(&[1.0f64, f64::INFINITY]);
    let entries: Vec<(&str, TensorRef<'_>)> = vec![
        ("a.weight", (&w2).into()),
        ("b.empty", (&empty).into()),
        ("c.step", (&step).into()),
        ("d.ids", (&ids).into()),
        ("e.inf", (&nan).into()),
    ];
    let dir = std::env::temp_dir().join(format!("splitgrad-seeds-ck-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp folder");
    let mixed = dir.join("mixed.safetensors");
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    checkpoint::save(&mixed, &entries, &meta).expect("save");
    let mixed = std::fs::read(&mixed).expect("read back");
    std::fs::remove_dir_all(&dir).expect("clean up");
    write_seeds(
        "checkpoint_loader",
        vec![
            ("trainer-step0", checkpoint_bytes(0)),
            ("trainer-step2", checkpoint_bytes(2)),
            ("mixed-dtypes", mixed),
        ],
    );

    write_seeds(
        "routing",
        vec![
            // 3 small splits, one empty; ids across every boundary.
            (
                "small",
                vec![2, 0, 5, 0, 3, 3, 5, 3, 6, 3, 7, 3, 8, 0, 255, 2, 0],
            ),
            // One split of size 2^40 (wide bit 0).
            (
                "wide",
                vec![
                    1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 4, 1, 0, 0, 0, 0, 0, 1, 0, 0, 2, 0,
                ],
            ),
            ("empty-splits", vec![5, 0, 0, 0, 0, 0, 0, 0, 3, 0, 3, 1]),
        ],
    );

    write_seeds(
        "differential",
        (0..6u8)
            .map(|k| {
                let name = [
                    "coalesce",
                    "fused-ce",
                    "lazy-adam",
                    "adam",
                    "gated-mix",
                    "fusion-penalty",
                ][k as usize];
                (name, random_bytes(u64::from(k), 400, k))
            })
            // Selectors 240 and up: the optimisers on half-precision arrays.
            .chain((0..4u8).map(|k| {
                let name = ["half-adam-0", "half-adam-1", "half-adam-2", "half-adam-3"];
                (
                    name[k as usize],
                    random_bytes(u64::from(k) + 100, 2000, 240 + k),
                )
            }))
            .collect(),
    );
}
