//! The main job's answers on held-out text, through the binary: the rule
//! keeps exactly the planted pairs of the synthetic corpus, keeps nothing
//! on a corpus where the language carries no information, says so when
//! training learned nothing, and `export` writes what a user takes away.

use std::path::{Path, PathBuf};

use serde_json::Value;
use splitgrad::app::corpus::save_corpus;
use splitgrad::app::synthetic::{SyntheticConfig, generate};
use splitgrad::checkpoint::Checkpoint;

use crate::common::cli::{self, run_ok, s};

fn scratch(name: &str) -> PathBuf {
    cli::scratch("heldout", name)
}

/// Runs `train` and returns its report.json.
fn train(out: &Path, extra: &[&str]) -> Value {
    run_ok(
        out.parent().unwrap(),
        &[&["train", "--out", s(out)][..], extra].concat(),
    );
    serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap()
}

fn rows(r: &Value) -> &Vec<Value> {
    r["rows"].as_array().expect("rows")
}

#[test]
fn the_default_run_keeps_exactly_the_planted_pairs_on_two_seeds() {
    let dir = scratch("default");
    for seed in ["0", "1"] {
        let r = train(&dir.join(seed), &["--seed", seed]);
        let planted: Vec<bool> = rows(&r).iter().map(|e| e["planted"] == true).collect();
        let kept: Vec<bool> = rows(&r).iter().map(|e| e["kept"] == true).collect();
        assert_eq!(planted.iter().filter(|&&p| p).count(), 40);
        assert_eq!(
            kept, planted,
            "seed {seed}: the kept rows are the planted ones"
        );
        assert_eq!(r["f1"], 1.0, "seed {seed}");
        assert_eq!(r["auc"], 1.0, "seed {seed}");
        let (ce, closed) = (
            r["heldout_ce"].as_f64().unwrap(),
            r["heldout_ce_closed"].as_f64().unwrap(),
        );
        assert!(
            ce < closed,
            "seed {seed}: held-out {ce} vs every gate closed {closed}"
        );
        assert_eq!(r["learned"], true);
        // Every kept row is in `kept`, with the fields of `rows`.
        let listed = r["kept"].as_array().unwrap();
        assert_eq!(listed.len(), 40);
        for e in listed {
            for field in ["language", "token", "gate", "heldout_gain"] {
                assert!(e.get(field).is_some(), "kept entry without {field}: {e}");
            }
            assert!(e["heldout_gain"].as_f64().unwrap() > 0.0);
        }
        // A kept row's gain is its tokens' loss with its one gate closed,
        // less their loss: positive, and the planted pairs rank first.
        let first = &listed[0];
        assert_eq!(first["planted"], true);
    }
}

#[test]
fn a_corpus_where_the_language_carries_nothing_keeps_no_row() {
    let dir = scratch("noise");
    // Every pair follows the shared distribution: no planted pair.
    let s = generate(&SyntheticConfig {
        n_contested: 0,
        seed: 5,
        ..SyntheticConfig::default()
    });
    let corpus = dir.join("noise.npz");
    save_corpus(&corpus, &s.corpus).unwrap();
    // In f32, and in bf16 with bf16 moments: rounding must not make a
    // row look needed.
    for (run, precision) in [
        ("run", &[][..]),
        (
            "run-bf16",
            &["--dtype", "bf16", "--state-dtype", "bf16"][..],
        ),
    ] {
        let args = [
            &["--corpus", corpus.to_str().unwrap(), "--seed", "5"][..],
            precision,
        ]
        .concat();
        let r = train(&dir.join(run), &args);
        nothing_kept(&r);
    }
}

/// The report of a run on a corpus where the language carries nothing:
/// rows for the frequent pairs, none kept, no gain beyond noise.
fn nothing_kept(r: &Value) {
    assert!(rows(r).len() > 1000, "every frequent pair has a row");
    assert_eq!(r["n_kept"], 0, "{}", r["kept"]);
    assert_eq!(r["effective_vocabularies"], 1.0);
    // No held-out gain is positive beyond noise: every row's evidence
    // against the shared distribution is below the bar.
    for e in rows(r) {
        let evidence = e["heldout_evidence"].as_f64().unwrap_or(0.0);
        assert!(
            evidence <= 1.0 || e["heldout_gain_per_token"].as_f64().unwrap() < 0.25,
            "a row beyond noise: {e}"
        );
    }
    let (ce, closed) = (
        r["heldout_ce"].as_f64().unwrap(),
        r["heldout_ce_closed"].as_f64().unwrap(),
    );
    assert!((ce - closed).abs() < 0.02, "{ce} vs {closed}");
}

#[test]
fn a_run_too_short_to_learn_says_so() {
    let dir = scratch("short");
    // Two steps of a learning rate too small to move anything.
    let r = train(&dir.join("run"), &["--steps", "2", "--lr", "1e-7"]);
    assert_eq!(r["learned"], false);
    assert_eq!(r["n_kept"], 0);
    let out = run_ok(&dir, &["report", "run/model.safetensors"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("nothing was learned"), "{text}");
    assert!(!text.contains("NaN"), "{text}");
}

#[test]
fn export_writes_each_languages_table_and_the_kept_pairs() {
    let dir = scratch("export");
    let run = dir.join("run");
    let r = train(&run, &["--steps", "300"]);
    let ckpt = run.join("model.safetensors");
    let out = dir.join("export");
    let export = ["export", s(&ckpt), "--out", s(&out)];
    run_ok(&dir, &export);
    let kept: Value =
        serde_json::from_slice(&std::fs::read(out.join("kept.json")).unwrap()).unwrap();
    assert_eq!(kept["kept"], r["kept"]);
    // Each language's table: the shared row, or the gated mix where the
    // pair has a row (language 0's rows differ from the shared table there).
    let model = Checkpoint::open(&ckpt).unwrap();
    let shared = model
        .get_real::<f32>("token_embedding.vocab.weight", &[500, 64])
        .unwrap();
    for l in 0..4 {
        let t = Checkpoint::open(out.join(format!("language-{l}.safetensors")))
            .unwrap()
            .get_real::<f32>("token_embedding.vocab.weight", &[500, 64])
            .unwrap();
        let with_row: Vec<usize> = rows(&r)
            .iter()
            .filter(|e| e["language"] == l)
            .map(|e| e["token"].as_u64().unwrap() as usize)
            .collect();
        for tok in 0..500 {
            let same =
                t.index_axis(ndarray::Axis(0), tok) == shared.index_axis(ndarray::Axis(0), tok);
            assert_eq!(same, !with_row.contains(&tok), "language {l}, token {tok}");
        }
    }
    // A second export into the same folder is refused, and changes nothing.
    let before = std::fs::read(out.join("kept.json")).unwrap();
    let again = cli::run(&dir, &export);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));
    assert_eq!(std::fs::read(out.join("kept.json")).unwrap(), before);
}

/// A small two-language corpus with its stated metadata.
fn small(vocab_size: usize, names: &[&str], hash: &str) -> splitgrad::app::corpus::Corpus {
    let mut c = splitgrad::app::corpus::Corpus::new(
        vec![1, 2, 3, 1, 2, 3, 4, 1],
        vec![0, 0, 0, 0, 1, 1, 1, 1],
    );
    c.sequence_starts = vec![0, 4];
    c.meta.vocab_size = Some(vocab_size);
    c.meta.n_languages = Some(names.len());
    c.meta.language_names = Some(names.iter().map(|n| n.to_string()).collect());
    c.meta.tokenizer_hash = Some(hash.to_string());
    c
}

fn load_err(source: &splitgrad::app::data::DataSource) -> String {
    match splitgrad::app::data::load(source) {
        Ok(_) => panic!("loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_heldout_corpus_from_another_tokenizer_is_refused_naming_both_files() {
    use splitgrad::app::data::DataSource;
    let dir = scratch("agree");
    let a = dir.join("a.npz");
    save_corpus(&a, &small(10, &["en", "fr"], "h1")).unwrap();
    let cases = [
        (
            "v.npz",
            small(12, &["en", "fr"], "h1"),
            "vocab_size 12 there, 10 here",
        ),
        (
            "n.npz",
            small(10, &["en", "fr", "de"], "h1"),
            "n_languages 3 there, 2 here",
        ),
        ("l.npz", small(10, &["en", "de"], "h1"), "language_names"),
        (
            "t.npz",
            small(10, &["en", "fr"], "h2"),
            "tokenizer_hash \"h2\" there, \"h1\" here",
        ),
    ];
    for (name, corpus, what) in cases {
        let b = dir.join(name);
        save_corpus(&b, &corpus).unwrap();
        let mut source = DataSource::of_corpus(Some(a.clone()), 1, 0);
        source.heldout = Some(b.clone());
        let e = load_err(&source);
        assert!(!e.contains('\n'), "{e}");
        assert!(e.contains(&b.display().to_string()), "{e}");
        assert!(e.contains(&a.display().to_string()), "{e}");
        assert!(e.contains(what), "{e}");
    }
    // The same tokenizer's corpus is accepted.
    let b = dir.join("same.npz");
    save_corpus(&b, &small(10, &["en", "fr"], "h1")).unwrap();
    let mut source = DataSource::of_corpus(Some(a.clone()), 1, 0);
    source.heldout = Some(b);
    splitgrad::app::data::load(&source).unwrap();
}

#[test]
fn a_corpus_of_one_language_says_nothing_can_be_split() {
    use splitgrad::app::data::DataSource;
    let dir = scratch("one-language");
    let a = dir.join("one.npz");
    let mut c = splitgrad::app::corpus::Corpus::new(vec![1, 2, 3, 1, 2], vec![0; 5]);
    c.meta.n_languages = Some(1);
    save_corpus(&a, &c).unwrap();
    let e = load_err(&DataSource::of_corpus(Some(a.clone()), 1, 0));
    assert!(e.contains(&a.display().to_string()), "{e}");
    assert!(e.contains("a single language: nothing can be split"), "{e}");
}
