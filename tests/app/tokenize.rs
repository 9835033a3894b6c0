//! `splitgrad tokenize` through the binary, on `tests/data/tokenize/`: the
//! corpus decodes back to the text, file by file and language by
//! language, with its metadata; bad input is a one-line error that leaves
//! no file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use splitgrad::app::corpus::{Corpus, load_corpus};
use splitgrad::app::tokenize::fnv1a64;
use tokenizers::Tokenizer;

use crate::common::cli::{self, BIN, error_after_progress, lang_args, last_json, run_ok, s};

/// The languages of the test data, in the order they are given.
const LANGS: [&str; 5] = ["en", "fr", "de", "ru", "ja"];

/// The ids per language Python's `tokenizers` gives (`train_tokenizer.py`).
const PYTHON_IDS: [usize; 5] = [6133, 5973, 6272, 7117, 6076];

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenize")
}

fn tokenizer_json() -> PathBuf {
    data().join("tokenizer.json")
}

fn scratch(name: &str) -> PathBuf {
    cli::scratch("tokenize", name)
}

fn tokenize(tokenizer: &Path, langs: &[(&str, &Path)], out: &Path, extra: &[&str]) -> Output {
    Command::new(BIN)
        .arg("tokenize")
        .arg("--tokenizer")
        .arg(tokenizer)
        .args(lang_args(langs))
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

fn text_dirs() -> Vec<(&'static str, PathBuf)> {
    LANGS
        .iter()
        .map(|&l| (l, data().join("text").join(l)))
        .collect()
}

/// The files of a folder of the test data, sorted.
fn files_of(dir: &Path) -> Vec<PathBuf> {
    let names = crate::io_common::listing(dir);
    names.iter().map(|n| dir.join(n)).collect()
}

#[test]
fn the_test_data_becomes_a_corpus_that_decodes_back_to_its_text() {
    let dir = scratch("data");
    let out = dir.join("corpus.npz");
    let dirs = text_dirs();
    let langs: Vec<(&str, &Path)> = dirs.iter().map(|(l, d)| (*l, d.as_path())).collect();
    let run = tokenize(&tokenizer_json(), &langs, &out, &[]);
    cli::assert_ok(&run);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.contains("15 files"), "{stdout}");
    assert!(stdout.contains("V 2000"), "{stdout}");
    for l in LANGS {
        assert!(
            stdout.lines().any(|line| line.trim_start().starts_with(l)),
            "{stdout}"
        );
    }

    let corpus = load_corpus(&out).unwrap();
    let tok = Tokenizer::from_file(tokenizer_json()).unwrap();
    assert_eq!((corpus.vocab_size(), corpus.n_languages()), (2000, 5));
    assert_eq!(corpus.meta.vocab_size, Some(2000));
    assert_eq!(corpus.meta.n_languages, Some(5));
    assert_eq!(corpus.meta.language_names.as_deref().unwrap(), LANGS);
    let hash = fnv1a64(&std::fs::read(tokenizer_json()).unwrap());
    assert_eq!(
        corpus.meta.tokenizer_hash.as_deref(),
        Some(format!("fnv1a64:{hash:016x}").as_str())
    );
    corpus.validate(2000, 5).unwrap();

    // One sequence per file, language by language, files sorted by path;
    // each decodes back to its file and has the ids Python gives.
    let mut sequences = corpus.sequences();
    let mut seen = 0;
    for (lang, (_, folder)) in dirs.iter().enumerate() {
        let mut lang_tokens = 0;
        for file in files_of(folder) {
            let range = sequences.next().expect("a sequence per file");
            let text = std::fs::read_to_string(&file).unwrap();
            let ids = &corpus.token_ids.values(range.clone());
            assert_eq!(tok.decode(ids, false).unwrap(), text, "{}", file.display());
            let expected = tok.encode(text.as_str(), false).unwrap();
            assert_eq!(ids, expected.get_ids(), "{}", file.display());
            assert!(
                corpus
                    .language_ids
                    .values(range.clone())
                    .iter()
                    .all(|&l| l as usize == lang)
            );
            lang_tokens += range.len();
            seen += 1;
        }
        assert_eq!(lang_tokens, PYTHON_IDS[lang], "{}", LANGS[lang]);
    }
    assert_eq!(seen, 15);
    assert!(sequences.next().is_none());
    assert_eq!(corpus.len(), PYTHON_IDS.iter().sum::<usize>());

    // token_strings: every id decoded alone, or its token where that is
    // not whole text.
    let strings = corpus.meta.token_strings.as_ref().unwrap();
    assert_eq!(strings.len(), 2000);
    assert_eq!(strings[0], "<|endoftext|>");
    let mut fragments = 0;
    for (id, s) in strings.iter().enumerate() {
        let decoded = tok.decode(&[id as u32], false).unwrap();
        if decoded.contains('\u{fffd}') || decoded.ends_with('\0') {
            assert_eq!(Some(s.clone()), tok.id_to_token(id as u32), "id {id}");
            fragments += 1;
        } else {
            assert_eq!(*s, decoded, "id {id}");
        }
    }
    // Byte-level BPE: the bytes ≥ 0x80 alone are fragments, and NUL.
    assert!(fragments >= 129, "{fragments}");
    // Byte-level BPE spells a space `Ġ`.
    let space_the = tok.token_to_id("Ġthe").unwrap() as usize;
    assert_eq!(strings[space_the], " the");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Standard error is not a terminal here, so the progress is plain lines:
/// one after the first bytes and one at the end, whose counts agree with
/// the input's size; `--quiet` writes none, and the summary stays.
#[test]
fn progress_is_plain_lines_in_a_log_and_nothing_with_quiet() {
    let dir = scratch("progress");
    let dirs = text_dirs();
    let langs: Vec<(&str, &Path)> = dirs.iter().map(|(l, d)| (*l, d.as_path())).collect();
    let run = tokenize(&tokenizer_json(), &langs, &dir.join("a.npz"), &[]);
    cli::assert_ok(&run);
    let stderr = String::from_utf8_lossy(&run.stderr);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("splitgrad tokenize: tokenizing "))
        .collect();
    assert!(lines.len() >= 2, "a first and a last line: {stderr}");
    // The last line: every byte done ("X of X").
    let last = lines.last().unwrap();
    let counts = last
        .trim_start_matches("splitgrad tokenize: tokenizing ")
        .split(" (")
        .next()
        .unwrap();
    let (done, total) = counts.split_once(" of ").expect("'done of total'");
    assert_eq!(done, total, "{stderr}");

    let quiet = tokenize(&tokenizer_json(), &langs, &dir.join("b.npz"), &["--quiet"]);
    cli::assert_ok(&quiet);
    assert_eq!(String::from_utf8_lossy(&quiet.stderr), "", "--quiet");
    let summary = String::from_utf8_lossy(&quiet.stdout);
    assert!(summary.contains("15 files"), "the summary stays: {summary}");
}

#[test]
fn folders_are_walked_sorted_recursively_without_hidden_or_empty_files() {
    let dir = scratch("walk");
    let write = |rel: &str, text: &[u8]| {
        let path = dir.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("a/z.txt", "Zeta – the last.\n".as_bytes());
    write("a/sub/m.txt", "Middle, nested.".as_bytes());
    write("a/empty.txt", b"");
    write("a/.hidden.txt", b"not read \xff");
    write("a/.git/objects/x", b"\xff\xfe");
    write("b/only.txt", "Только это.\n".as_bytes());
    let out = dir.join("out/nested/corpus.npz");
    let run = tokenize(
        &tokenizer_json(),
        &[("one", &dir.join("a")), ("two", &dir.join("b"))],
        &out,
        &[],
    );
    cli::assert_ok(&run);
    let corpus: Corpus = load_corpus(&out).unwrap();
    let tok = Tokenizer::from_file(tokenizer_json()).unwrap();
    let texts: Vec<String> = corpus
        .sequences()
        .map(|r| tok.decode(&corpus.token_ids.values(r), false).unwrap())
        .collect();
    assert_eq!(
        texts,
        ["Middle, nested.", "Zeta – the last.\n", "Только это.\n"]
    );
    let first_of_b = corpus.sequence_starts[2];
    assert!(
        corpus
            .language_ids
            .values(..first_of_b)
            .iter()
            .all(|&l| l == 0)
    );
    assert!(
        corpus
            .language_ids
            .values(first_of_b..)
            .iter()
            .all(|&l| l == 1)
    );
    assert_eq!(
        corpus.meta.language_names.as_deref().unwrap(),
        ["one", "two"]
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.contains("4 files, 3 sequences"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_file_that_is_not_utf8_is_named_with_its_line() {
    let dir = scratch("utf8");
    let lang = dir.join("en");
    std::fs::create_dir_all(&lang).unwrap();
    std::fs::write(lang.join("a.txt"), "fine\n").unwrap();
    std::fs::write(lang.join("b.txt"), b"line one\nline two\nbad \xff here\n").unwrap();
    let out = dir.join("corpus.npz");
    let err = error_after_progress(&tokenize(&tokenizer_json(), &[("en", &lang)], &out, &[]));
    let bad = lang.join("b.txt");
    assert!(err.contains(&bad.display().to_string()), "{err}");
    assert!(err.contains("not UTF-8"), "{err}");
    assert!(err.contains("line 3"), "{err}");
    assert!(!out.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_arguments_and_inputs_are_one_line_errors_that_leave_no_file() {
    let dir = scratch("errors");
    let en = data().join("text/en");
    let out = dir.join("corpus.npz");

    let missing = dir.join("no-such-folder");
    let err = error_after_progress(&tokenize(
        &tokenizer_json(),
        &[("en", &en), ("xx", &missing)],
        &out,
        &[],
    ));
    assert!(err.contains(&missing.display().to_string()), "{err}");
    assert!(!out.exists());

    let bad_json = dir.join("tokenizer.json");
    std::fs::write(&bad_json, "{\"model\": {\"type\": \"BPE\", \"vocab\": 7}}").unwrap();
    let err = error_after_progress(&tokenize(&bad_json, &[("en", &en)], &out, &[]));
    assert!(err.contains(&bad_json.display().to_string()), "{err}");
    assert!(err.contains("not a tokenizer.json"), "{err}");
    assert!(!out.exists());

    let err = error_after_progress(&tokenize(
        &dir.join("absent.json"),
        &[("en", &en)],
        &out,
        &[],
    ));
    assert!(err.contains("absent.json"), "{err}");

    let err = error_after_progress(&tokenize(
        &tokenizer_json(),
        &[("en", &en), ("fr", &en), ("en", &en)],
        &out,
        &[],
    ));
    assert!(err.contains("language `en` is given twice"), "{err}");
    assert!(!out.exists());

    for arg in ["en", "=dir", "en="] {
        let run = Command::new(BIN)
            .arg("tokenize")
            .arg("--tokenizer")
            .arg(tokenizer_json())
            .args(["--lang", arg, "--out"])
            .arg(&out)
            .output()
            .unwrap();
        let err = error_after_progress(&run);
        assert!(err.contains(&format!("language `{arg}`")), "{err}");
    }
    assert!(!out.exists());

    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let err = error_after_progress(&tokenize(&tokenizer_json(), &[("en", &empty)], &out, &[]));
    assert!(err.contains("no file under"), "{err}");
    assert!(!out.exists());

    // An existing --out is kept unless --force.
    std::fs::write(&out, b"keep me").unwrap();
    let err = error_after_progress(&tokenize(&tokenizer_json(), &[("en", &en)], &out, &[]));
    assert!(err.contains("--force"), "{err}");
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");
    cli::assert_ok(&tokenize(
        &tokenizer_json(),
        &[("en", &en)],
        &out,
        &["--force"],
    ));
    assert_eq!(load_corpus(&out).unwrap().n_languages(), 1);
    let leftovers: Vec<_> = crate::io_common::listing(&dir)
        .into_iter()
        .filter(|n| n != "corpus.npz" && n != "tokenizer.json" && n != "empty")
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Real text through the whole job: tokenize, train (with a held-out part),
/// report and export, with the language names and the decoded tokens in
/// what a user reads.
#[test]
fn tokenize_train_report_and_export_on_real_text() {
    let dir = scratch("job");
    let dirs = text_dirs();
    let langs: Vec<(&str, &Path)> = dirs.iter().map(|(n, d)| (*n, d.as_path())).collect();
    let corpus = dir.join("corpus.npz");
    cli::assert_ok(&tokenize(&tokenizer_json(), &langs, &corpus, &[]));
    let run = dir.join("run");
    let train = run_ok(
        &dir,
        &[
            "train",
            "--corpus",
            s(&corpus),
            "--out",
            s(&run),
            "--steps",
            "200",
            "--batch",
            "1024",
            "--heldout-fraction",
            "0.34",
        ],
    );
    let text = String::from_utf8_lossy(&train.stdout);
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("report.json")).unwrap()).unwrap();
    // V and L as the corpus states them, the names in the report.
    let rows = report["rows"].as_array().unwrap();
    assert!(!rows.is_empty());
    for e in rows {
        assert!(LANGS.contains(&e["language_name"].as_str().unwrap()), "{e}");
        assert!(e["token_string"].is_string(), "{e}");
        assert!(e["heldout_gain"].is_number(), "{e}");
    }
    let per_language = report["heldout_per_language"].as_array().unwrap();
    assert_eq!(per_language.len(), 5);
    for l in per_language {
        assert!(
            l["n_tokens"].as_u64().unwrap() > 0,
            "every language is held out: {l}"
        );
    }
    assert!(
        report["heldout_ce"].as_f64().unwrap() < report["heldout_ce_uniform"].as_f64().unwrap()
    );
    assert!(text.contains("held-out cross-entropy"), "{text}");
    // `report` reads the same back from the checkpoint.
    let ckpt = run.join("model.safetensors");
    let json = last_json(&run_ok(&dir, &["report", s(&ckpt), "--json"]));
    assert_eq!(json["rows"], report["rows"]);
    // `export`: one table per language, named after it, and kept.json.
    let out = dir.join("export");
    run_ok(&dir, &["export", s(&ckpt), "--out", s(&out)]);
    for name in LANGS {
        let t = splitgrad::checkpoint::Checkpoint::open(out.join(format!("{name}.safetensors")))
            .unwrap()
            .get_real::<f32>("token_embedding.vocab.weight", &[2000, 64])
            .unwrap();
        assert!(t.iter().all(|x| x.is_finite()));
    }
    let kept: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("kept.json")).unwrap()).unwrap();
    assert_eq!(kept["languages"], serde_json::json!(LANGS));
    assert_eq!(kept["kept"], report["kept"]);
}
