//! `splitgrad tokenize --train-vocab V` through the binary: the tokenizer
//! is trained without the sequences `train` holds out, balanced across the
//! languages, the same bytes from run to run and for any number of
//! threads; the corpus decodes back to the text byte for byte; bad input
//! is a one-line error that leaves no file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use splitgrad::app::corpus::load_corpus;
use splitgrad::app::eval::split_heldout;
use tokenizers::Tokenizer;

use crate::common::cli::{self, BIN, error_after_progress, lang_args};

fn scratch(name: &str) -> PathBuf {
    cli::scratch("tokenize_train", name)
}

fn tokenize(langs: &[(&str, &Path)], out: &Path, extra: &[&str]) -> Output {
    Command::new(BIN)
        .arg("tokenize")
        .args(lang_args(langs))
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

/// A made-up word of 9 letters for file `i` of language `l`, unlike any
/// other's and any word of the filler text.
fn marker(l: usize, i: usize) -> String {
    let mut x = (l * 131 + i * 7919 + 17) as u64;
    (0..9)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            char::from(b'a' + ((x >> 33) % 26) as u8)
        })
        .collect()
}

const FILLER: [&str; 3] = [
    "The quick brown fox jumps over the lazy dog. ",
    "Le vif renard brun saute par-dessus le chien paresseux. ",
    "Съешь же ещё этих мягких французских булок, да выпей чаю. ",
];

/// [`FILLER`]`[l]` padded with `-` to the longest one's bytes, so that
/// every language has as much text and each gives the tokenizer all of
/// its training files.
fn filler(l: usize) -> String {
    let longest = FILLER.iter().map(|f| f.len()).max().unwrap();
    let pad = "-".repeat(longest - FILLER[l].len());
    format!("{}{pad} ", FILLER[l].trim_end())
}

/// Three languages of `n` files each, file `i` of language `l` holding its
/// marker 12 times among filler text; the folders, in order.
fn marked_text(dir: &Path, n: usize) -> Vec<(String, PathBuf)> {
    (0..3)
        .map(|l| {
            let folder = dir.join(format!("l{l}"));
            std::fs::create_dir_all(&folder).unwrap();
            for i in 0..n {
                let mut text = String::new();
                for k in 0..12 {
                    text.push_str(&filler(l));
                    text.push_str(&marker(l, i));
                    text.push_str(if k % 4 == 3 { ".\n" } else { " " });
                }
                std::fs::write(folder.join(format!("f{i:02}.txt")), text).unwrap();
            }
            (format!("l{l}"), folder)
        })
        .collect()
}

fn as_langs(dirs: &[(String, PathBuf)]) -> Vec<(&str, &Path)> {
    dirs.iter()
        .map(|(n, d)| (n.as_str(), d.as_path()))
        .collect()
}

/// Whether the tokenizer learned `word` after a space as one token.
fn learned(tok: &Tokenizer, word: &str) -> bool {
    tok.token_to_id(&format!("Ġ{word}")).is_some()
}

#[test]
fn the_tokenizer_never_sees_what_train_holds_out() {
    let dir = scratch("heldout");
    let dirs = marked_text(&dir, 10);
    for (fraction, seed) in [("0.1", "0"), ("0.3", "5")] {
        let out = dir.join(format!("out-{seed}/corpus.npz"));
        let run = tokenize(
            &as_langs(&dirs),
            &out,
            &[
                "--train-vocab",
                "3000",
                "--heldout-fraction",
                fraction,
                "--seed",
                seed,
            ],
        );
        cli::assert_ok(&run);
        let stdout = String::from_utf8_lossy(&run.stdout);
        // Every pair seen twice is merged before V is reached.
        assert!(stdout.contains("of 3000 asked"), "{stdout}");
        let tok_path = out.parent().unwrap().join("tokenizer.json");
        let tok = Tokenizer::from_file(&tok_path).unwrap();
        let corpus = load_corpus(&out).unwrap();
        assert_eq!(corpus.meta.vocab_size, Some(tok.get_vocab_size(true)));
        // What train holds out, by train's own split of the corpus.
        let fraction: f64 = fraction.parse().unwrap();
        let (_, heldout) = split_heldout(corpus.clone(), fraction, seed.parse().unwrap()).unwrap();
        let held_text: Vec<String> = heldout
            .sequences()
            .map(|r| tok.decode(&heldout.token_ids.values(r), false).unwrap())
            .collect();
        assert_eq!(held_text.len(), 3 * (10.0 * fraction).round() as usize);
        let (mut seen, mut unseen) = (0, 0);
        for l in 0..3 {
            for i in 0..10 {
                let word = marker(l, i);
                let is_held = held_text.iter().any(|t| t.contains(&word));
                // Every training file is read whole (the languages are the
                // same size), and each marker is seen 12 times.
                assert_eq!(learned(&tok, &word), !is_held, "{word} (l{l}/f{i})");
                if is_held { unseen += 1 } else { seen += 1 }
            }
        }
        assert!(seen > 0 && unseen > 0, "{seen} {unseen}");
        // The corpus decodes back to its files byte for byte (no normalizer).
        let mut sequences = corpus.sequences();
        for (_, folder) in &dirs {
            for i in 0..10 {
                let text = std::fs::read_to_string(folder.join(format!("f{i:02}.txt"))).unwrap();
                let r = sequences.next().unwrap();
                assert_eq!(
                    tok.decode(&corpus.token_ids.values(r), false).unwrap(),
                    text
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn training_is_balanced_deterministic_and_the_same_for_any_thread_count() {
    let dir = scratch("determinism");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenize/text");
    let dirs: Vec<(String, PathBuf)> = ["en", "fr", "de", "ru", "ja"]
        .iter()
        .map(|l| (l.to_string(), data.join(l)))
        .collect();
    let mut outputs = Vec::new();
    for (name, threads) in [("a", "1"), ("b", "2"), ("c", "2")] {
        let out = dir.join(name).join("corpus.npz");
        let run = tokenize(
            &as_langs(&dirs),
            &out,
            &["--train-vocab", "400", "--threads", threads],
        );
        cli::assert_ok(&run);
        let tok = std::fs::read(dir.join(name).join("tokenizer.json")).unwrap();
        outputs.push((tok, std::fs::read(&out).unwrap()));
        if name == "a" {
            // Each language gives as much as the smallest's training text.
            let stdout = String::from_utf8_lossy(&run.stdout);
            let line = stdout.lines().next().unwrap();
            assert!(line.contains("from each of 5 languages"), "{stdout}");
        }
    }
    assert!(outputs[0] == outputs[1], "1 and 2 threads differ");
    assert!(outputs[1] == outputs[2], "two runs differ");
    // Another seed samples other files: another tokenizer.
    let out = dir.join("d/corpus.npz");
    cli::assert_ok(&tokenize(
        &as_langs(&dirs),
        &out,
        &["--train-vocab", "400", "--seed", "7"],
    ));
    assert_ne!(
        std::fs::read(dir.join("d/tokenizer.json")).unwrap(),
        outputs[0].0
    );
    // Python's `tokenizers` (the crate here) reads it and gives the same ids.
    let tok = Tokenizer::from_file(dir.join("a/tokenizer.json")).unwrap();
    let corpus = load_corpus(dir.join("a/corpus.npz")).unwrap();
    let first = std::fs::read_to_string(data.join("en/debian-handbook--sect.backup.txt")).unwrap();
    let r = corpus.sequences().next().unwrap();
    assert_eq!(
        tok.encode(first.as_str(), false).unwrap().get_ids(),
        &corpus.token_ids.values(r)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_given_tokenizer_gives_the_same_corpus_for_one_and_two_threads() {
    let dir = scratch("threads");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenize");
    let langs: Vec<(String, PathBuf)> = ["en", "ru", "ja"]
        .iter()
        .map(|l| (l.to_string(), data.join("text").join(l)))
        .collect();
    let tok = data.join("tokenizer.json");
    let mut corpora = Vec::new();
    for threads in ["1", "2"] {
        let out = dir.join(format!("{threads}.npz"));
        cli::assert_ok(&tokenize(
            &as_langs(&langs),
            &out,
            &["--tokenizer", cli::s(&tok), "--threads", threads],
        ));
        corpora.push(std::fs::read(&out).unwrap());
    }
    assert!(corpora[0] == corpora[1]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_vocabularies_and_inputs_are_one_line_errors_that_leave_no_file() {
    let dir = scratch("errors");
    let dirs = marked_text(&dir.join("text"), 2);
    let langs = as_langs(&dirs);
    let out = dir.join("out/corpus.npz");
    let tok = dir.join("out/tokenizer.json");
    let gone = |what: &str| {
        assert!(!out.exists(), "{what}: corpus written");
        assert!(!tok.exists(), "{what}: tokenizer written");
    };

    for v in ["0", "256"] {
        let err = error_after_progress(&tokenize(&langs, &out, &["--train-vocab", v]));
        assert!(
            err.contains(&format!("--train-vocab {v} is too small")),
            "{err}"
        );
        assert!(err.contains("at least 257"), "{err}");
        gone(v);
    }
    let err = error_after_progress(&tokenize(&langs, &out, &["--train-vocab", "99999999999"]));
    assert!(err.contains("too large"), "{err}");
    gone("huge");

    // Neither or both of --tokenizer and --train-vocab: clap's errors.
    for (extra, says) in [
        (&[][..], "--tokenizer <TOKENIZER>|--train-vocab <V>"),
        (
            &["--train-vocab", "300", "--tokenizer", "x.json"][..],
            "cannot be used with",
        ),
    ] {
        let run = tokenize(&langs, &out, extra);
        assert_eq!(run.status.code(), Some(2));
        let err = String::from_utf8_lossy(&run.stderr);
        assert!(err.contains(says), "{err}");
    }
    gone("neither or both");

    let err = error_after_progress(&tokenize(
        &langs,
        &out,
        &["--train-vocab", "300", "--heldout-fraction", "1.5"],
    ));
    assert!(err.contains("--heldout-fraction"), "{err}");
    gone("fraction");

    // Folders of empty files; an empty folder.
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let err = error_after_progress(&tokenize(
        &[("xx", &empty)],
        &out,
        &["--train-vocab", "300"],
    ));
    assert!(err.contains("no file under"), "{err}");
    std::fs::write(empty.join("a.txt"), "").unwrap();
    std::fs::write(empty.join("b.txt"), "").unwrap();
    let err = error_after_progress(&tokenize(
        &[("xx", &empty)],
        &out,
        &["--train-vocab", "300"],
    ));
    assert!(err.contains("no text to train a tokenizer on"), "{err}");
    gone("empty");

    // A file the trainer reads that is not UTF-8 is named with its line.
    let bad = dirs[1].1.join("f00.txt");
    let original = std::fs::read(&bad).unwrap();
    let mut bytes = original.clone();
    bytes.extend_from_slice(b"\nbad \xff byte\n");
    std::fs::write(&bad, bytes).unwrap();
    let both = dirs[1].1.join("f01.txt");
    std::fs::copy(&bad, &both).unwrap();
    let err = error_after_progress(&tokenize(&langs, &out, &["--train-vocab", "300"]));
    assert!(err.contains("not UTF-8") && err.contains("line 5"), "{err}");
    assert!(err.contains(&dirs[1].1.display().to_string()), "{err}");
    gone("utf8");
    std::fs::write(&bad, &original).unwrap();
    std::fs::write(&both, &original).unwrap();

    // A tokenizer.json already beside --out is kept unless --force.
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    std::fs::write(&tok, "keep me").unwrap();
    let err = error_after_progress(&tokenize(&langs, &out, &["--train-vocab", "300"]));
    assert!(
        err.contains("tokenizer.json: exists") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(std::fs::read(&tok).unwrap(), b"keep me");
    assert!(!out.exists());
    cli::assert_ok(&tokenize(
        &langs,
        &out,
        &["--train-vocab", "300", "--force"],
    ));
    assert!(Tokenizer::from_file(&tok).is_ok());
    let err = error_after_progress(&tokenize(
        &langs,
        &tok,
        &["--train-vocab", "300", "--force"],
    ));
    assert!(err.contains("where the trained tokenizer goes"), "{err}");

    // More vocabulary than the text has pairs for: the smaller one, said.
    let small = dir.join("small/corpus.npz");
    let run = tokenize(&langs[..1], &small, &["--train-vocab", "5000"]);
    cli::assert_ok(&run);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.contains("of 5000 asked"), "{stdout}");
    let leftovers: Vec<_> = crate::io_common::listing(out.parent().unwrap())
        .into_iter()
        .filter(|n| n != "corpus.npz" && n != "tokenizer.json")
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_single_file_gives_the_tokenizer_its_head() {
    let dir = scratch("single");
    let folder = dir.join("en");
    std::fs::create_dir_all(&folder).unwrap();
    let mut text = String::new();
    for i in 0..200 {
        text.push_str(&format!(
            "Line {i} of the only file, with {} in it.\n",
            marker(0, i % 3)
        ));
    }
    std::fs::write(folder.join("only.txt"), &text).unwrap();
    let out = dir.join("corpus.npz");
    let run = tokenize(&[("en", &folder)], &out, &["--train-vocab", "300"]);
    cli::assert_ok(&run);
    let stdout = String::from_utf8_lossy(&run.stdout);
    // The tail train holds out (a tenth) is left out of the tokenizer's text.
    let tail = (text.len() as f64 * 0.1).round() as usize;
    assert!(tail < 1024);
    assert!(stdout.contains(&format!("({tail} B)")), "{stdout}");
    assert!(stdout.contains("left out: 0 files"), "{stdout}");
    assert_eq!(load_corpus(&out).unwrap().n_sequences(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}
