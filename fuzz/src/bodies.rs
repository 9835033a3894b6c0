//! The fuzz target bodies: plain functions of bytes, free of libFuzzer
//! types, so the same code runs under `cargo fuzz` (one `fuzz_target!` per
//! function) and in the main crate's `tests/fuzz_replay.rs`, which replays
//! the committed corpora and the regressions with stable Rust.
//!
//! A body returns normally for every input; a panic is a finding. Inputs
//! from files may be rejected with an `Err` (that is the point), but an
//! `Ok` result must satisfy the invariants asserted here.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use ndarray::{Array1, Array2, ArrayView2, ArrayViewMut2, Axis};
use splitgrad::app::corpus::{self, Corpus};
use splitgrad::app::model::{BigramModel, ModelConfig};
use splitgrad::app::train::{TrainConfig, Trainer};
use splitgrad::checkpoint::{Checkpoint, TensorData};
use splitgrad::io::{self, NpzReader, SplitIndex};
use splitgrad::kernels::routing::SplitRouting;
use splitgrad::kernels::scatter::{coalesce_rows, coalesce_rows_naive};
use splitgrad::layers::SplitTables;
use splitgrad::layers::{SplitVocabulary, SplitVocabularyConfig};
use splitgrad::ops::cross_entropy::IGNORE_INDEX;
use splitgrad::ops::fused_ce::{
    ChunkSizes, Targets, fused_ce_backward, fused_ce_forward, naive_ce_backward, naive_ce_forward,
};
use splitgrad::ops::gated_mix::gated_mix_forward;
use splitgrad::optim::{Adam, AdamConfig, LazyAdam, LazyAdamConfig, Optimizer};
use splitgrad::{ParamGrad, Parameter, Real, Rng, RowSparse, Tape};

// ---------------------------------------------------------------------------
// Helpers

/// Reads fuzz bytes as small numbers; past the end it yields zeros, so
/// every input decodes to something.
struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    fn new(data: &'a [u8]) -> Self {
        Bytes { data }
    }

    fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        b.iter_mut().for_each(|x| *x = self.u8());
        u64::from_le_bytes(b)
    }

    /// A number in `0..n` (n ≥ 1).
    fn below(&mut self, n: usize) -> usize {
        if n <= 256 {
            self.u8() as usize % n
        } else {
            self.u16() as usize % n
        }
    }

    fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// A finite real in `[-scale, scale]`, on a grid of 2^-14 of the scale.
    fn real(&mut self, scale: f64) -> f64 {
        f64::from(self.u16() as i16) / 32768.0 * scale
    }

    fn rest(&self) -> &'a [u8] {
        self.data
    }
}

static NEXT_FILE: AtomicU64 = AtomicU64::new(0);

/// A scratch file that is removed when dropped. Names are unique per
/// process and call, so replay tests may run in parallel.
struct ScratchFile(PathBuf);

impl ScratchFile {
    fn with(tag: &str, bytes: &[u8]) -> Self {
        let dir = std::env::temp_dir().join(format!("splitgrad-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp folder");
        let n = NEXT_FILE.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("{tag}-{n}"));
        std::fs::write(&path, bytes).expect("write a scratch file");
        ScratchFile(path)
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Touches every array of an archive the way the loaders do; errors are
/// fine, panics are not.
fn read_every_member(npz: &mut NpzReader) {
    for name in npz.names().to_vec() {
        let _ = npz.dtype(&name);
        let _ = npz.shape(&name);
        let _ = npz.ints(&name);
        let _ = npz.ints_1d(&name);
        let _ = npz.reals::<f32>(&name);
        let _ = npz.finite_reals::<f64>(&name);
        let _ = npz.real_dtype(&name);
        let _ = npz.strings_1d(&name);
        let _ = npz.string_scalar(&name);
    }
}

/// One element type a structured member may have: numpy's `descr`, its
/// size, whether it is a float, an integer (and signed) or neither.
const DTYPES: [(&str, usize, char); 10] = [
    ("<i8", 8, 'i'),
    ("<i4", 4, 'i'),
    ("|u1", 1, 'u'),
    ("<u8", 8, 'u'),
    (">i2", 2, 'i'),
    ("<f8", 8, 'f'),
    ("<f4", 4, 'f'),
    (">f8", 8, 'f'),
    ("|b1", 1, 'b'),
    ("<U2", 8, 'o'),
];

/// One element, mostly small (a valid id), sometimes extreme.
fn element(b: &mut Bytes, kind: char, size: usize, big_endian: bool) -> Vec<u8> {
    let x = b.u8();
    let int: i64 = match x {
        0..=199 => i64::from(x % 12),
        200 => -1,
        201 => i64::MAX,
        202 => i64::MIN,
        203 => 1 << 32,
        204 => -(1 << 40),
        _ => i64::from(x),
    };
    let float: f64 = match x {
        0..=199 => f64::from(x % 12) / 2.0,
        200 => f64::NAN,
        201 => f64::INFINITY,
        202 => f64::NEG_INFINITY,
        203 => 1e300,
        204 => -0.0,
        _ => f64::from(x),
    };
    let mut bytes = match (kind, size) {
        ('f', 4) => (float as f32).to_le_bytes().to_vec(),
        ('f', _) => float.to_le_bytes().to_vec(),
        (_, 8) => int.to_le_bytes().to_vec(),
        (_, 4) => (int as i32).to_le_bytes().to_vec(),
        (_, 2) => (int as i16).to_le_bytes().to_vec(),
        (_, n) => int.to_le_bytes()[..n].to_vec(),
    };
    if big_endian {
        bytes.reverse();
    }
    bytes
}

/// An `.npz` built from fuzz bytes, so that inputs reach past the zip
/// layer (whose CRCs a byte-level mutation rarely keeps): members named
/// from `names`, each a `.npy` v1.0 member with a header of a chosen dtype,
/// order and shape (now and then raw fuzz text instead), and data of the
/// size the header promises (now and then a byte short or long), stored
/// or deflated.
fn structured_npz(b: &mut Bytes, names: &[&str]) -> Vec<u8> {
    use npyz::zip::write::FileOptions;
    use npyz::zip::{CompressionMethod, ZipWriter};
    use std::io::Write;

    let mut zip = ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let n_members = b.below(names.len() + 1) + 1;
    for _ in 0..n_members {
        let name = names[b.below(names.len())];
        let (descr, size, kind) = DTYPES[b.below(DTYPES.len())];
        let fortran = b.bool();
        let ndim = b.below(3);
        let shape: Vec<usize> = (0..ndim).map(|_| b.below(9)).collect();
        let n: usize = shape.iter().product();
        let shape_text = match shape.as_slice() {
            [d] => format!("({d},)"),
            _ => format!(
                "({})",
                shape
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let flaw = b.u8() % 16;
        let dict = if flaw == 0 {
            let len = b.below(48);
            let raw: Vec<u8> = (0..len).map(|_| b.u8()).collect();
            String::from_utf8_lossy(&raw).into_owned()
        } else {
            let order = if fortran { "True" } else { "False" };
            format!("{{'descr': '{descr}', 'fortran_order': {order}, 'shape': {shape_text}, }}")
        };
        let text_len = (10 + dict.len() + 1).div_ceil(64) * 64 - 10;
        let mut member = b"\x93NUMPY\x01\x00".to_vec();
        member.extend_from_slice(&(text_len as u16).to_le_bytes());
        member.extend_from_slice(dict.as_bytes());
        member.resize(10 + text_len - 1, b' ');
        member.push(b'\n');
        for _ in 0..n {
            member.extend(element(b, kind, size, descr.starts_with('>')));
        }
        match flaw {
            1 => {
                member.pop();
            }
            2 => member.push(0),
            _ => {}
        }
        let method = if b.bool() {
            CompressionMethod::Deflated
        } else {
            CompressionMethod::Stored
        };
        let options = FileOptions::default().compression_method(method);
        if zip.start_file(format!("{name}.npy"), options).is_ok() {
            zip.write_all(&member).expect("write to memory");
        }
    }
    zip.finish().expect("finish in memory").into_inner()
}

// ---------------------------------------------------------------------------
// index_loader

/// Bytes: `[L selector, V selector, npz bytes…]`, L in 1..=8, V in 1..=64;
/// with the top bit of the L selector set, the rest describes the arrays
/// ([`structured_npz`]) instead of being the file.
///
/// The index is read twice — from memory through [`NpzReader::from_bytes`]
/// and [`SplitIndex::validate`], and from a file through
/// [`io::load_index`] — and the two must agree. A valid index must give
/// a working pair lookup and [`SplitVocabulary`].
pub fn index_loader(data: &[u8]) {
    let structured = data.first().is_some_and(|&x| x & 0x80 != 0);
    let mut b = Bytes::new(data);
    let n_languages = b.below(8) + 1;
    let vocab_size = b.below(64) + 1;
    let names = ["language_index", "token_index", "score", "other"];
    let npz_bytes: &[u8] = &if structured {
        structured_npz(&mut b, &names)
    } else {
        b.rest().to_vec()
    };

    let from_memory = index_from_bytes(npz_bytes, n_languages, vocab_size);
    let file = ScratchFile::with("index.npz", npz_bytes);
    let from_file = io::load_index(&file.0, n_languages, vocab_size);
    match (&from_memory, &from_file) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "the two index paths disagree"),
        (Err(_), Err(e)) => {
            assert_eq!(e.file(), Some(file.0.as_path()), "error names no file: {e}");
        }
        _ => panic!(
            "one index path accepts what the other rejects: memory {:?}, file {:?}",
            from_memory.as_ref().map(|_| ()),
            from_file.as_ref().map(|_| ())
        ),
    }
    if let Ok(mut npz) = NpzReader::from_bytes("fuzz.npz", npz_bytes.to_vec()) {
        read_every_member(&mut npz);
    }
    let Ok(index) = from_file else { return };
    index
        .validate(n_languages, vocab_size)
        .expect("a loaded index validates");
    let lookup = index.lookup(n_languages, vocab_size);
    for (i, (&l, &t)) in index
        .language_index
        .iter()
        .zip(&index.token_index)
        .enumerate()
    {
        assert_eq!(lookup.get(l, t), Some(i), "lookup of row {i}");
    }
    let rows = index.n_rows();
    let mut sv = SplitVocabulary::<f32>::new(
        index,
        &SplitVocabularyConfig {
            vocab_size,
            dim: 2,
            n_languages,
            gate_init: 0.0,
        },
    )
    .expect("a valid index builds the layer");
    let table = Array2::from_shape_fn((vocab_size, 2), |(i, j)| (i * 2 + j) as f32);
    sv.seed_from(table.view()).expect("seed");
    assert_eq!(sv.n_rows(), rows);
    assert_eq!(sv.fusion_penalty(), 0.0, "seeded rows equal their centroid");
}

/// [`io::load_index`] on bytes in memory: the same arrays and checks.
fn index_from_bytes(
    bytes: &[u8],
    n_languages: usize,
    vocab_size: usize,
) -> splitgrad::Result<SplitIndex> {
    let mut npz = NpzReader::from_bytes("fuzz.npz", bytes.to_vec())?;
    let languages = npz.ints_1d("language_index")?;
    let tokens = npz.ints_1d("token_index")?;
    let to_usize = |v: &[i64]| -> splitgrad::Result<Vec<usize>> {
        v.iter()
            .map(|&x| usize::try_from(x).map_err(|_| splitgrad::Error::config("negative")))
            .collect()
    };
    let mut index = SplitIndex::new(to_usize(&languages)?, to_usize(&tokens)?);
    if npz.contains("score") {
        let score = npz.reals::<f64>("score")?;
        if score.ndim() != 1 {
            return Err(splitgrad::Error::config("score not 1-D"));
        }
        index.score = Some(score.into_iter().collect());
    }
    index.validate(n_languages, vocab_size)?;
    Ok(index)
}

// ---------------------------------------------------------------------------
// corpus_loader

/// Bytes: an npz file (starting `PK`), or else a description of its arrays
/// ([`structured_npz`]). A corpus that loads must validate against its own
/// sizes, have consistent sequences and bigrams, survive a save/load round
/// trip, and train one small step when it holds a bigram.
pub fn corpus_loader(data: &[u8]) {
    let names = [
        "token_ids",
        "language_ids",
        "sequence_starts",
        "other",
        "vocab_size",
        "n_languages",
        "language_names",
        "token_strings",
        "tokenizer_hash",
    ];
    let data: &[u8] = &if data.starts_with(b"PK") {
        data.to_vec()
    } else {
        structured_npz(&mut Bytes::new(data), &names)
    };
    let file = ScratchFile::with("corpus.npz", data);
    if let Ok(mut npz) = NpzReader::open(&file.0) {
        read_every_member(&mut npz);
    }
    let corpus = match corpus::load_corpus(&file.0) {
        Ok(c) => c,
        Err(e) => {
            assert_eq!(e.file(), Some(file.0.as_path()), "error names no file: {e}");
            return;
        }
    };
    let (v, l) = (corpus.vocab_size(), corpus.n_languages());
    corpus.validate(v, l).expect("a loaded corpus validates");
    let seqs: Vec<_> = corpus.sequences().collect();
    assert_eq!(seqs.first().map(|r| r.start), Some(0));
    assert_eq!(seqs.last().map(|r| r.end), Some(corpus.len()));
    assert!(
        seqs.windows(2)
            .all(|w| w[0].end == w[1].start && !w[0].is_empty())
    );
    assert_eq!(corpus.bigrams().count(), corpus.n_bigrams());
    assert_eq!(corpus.n_bigrams(), corpus.len() - corpus.n_sequences());
    if let Some(short) = corpus.validate(v.saturating_sub(1), l).err() {
        assert!(matches!(
            short.kind(),
            splitgrad::ErrorKind::OutOfRange { .. }
        ));
    }

    let copy = ScratchFile::with("corpus-copy.npz", &[]);
    corpus::save_corpus(&copy.0, &corpus).expect("save a corpus");
    assert_eq!(corpus::load_corpus(&copy.0).expect("reload"), corpus);

    // One training step on a tiny model, when the sizes keep it tiny.
    if corpus.n_bigrams() == 0 || v > 512 || l > 16 || corpus.len() > 1 << 16 {
        return;
    }
    let index = SplitIndex::new(
        vec![corpus.language_ids[0] as usize],
        vec![corpus.token_ids[0] as usize],
    );
    let config = ModelConfig {
        vocab_size: v,
        n_languages: l,
        dim: 2,
        gate_init: 0.0,
    };
    let mut model = BigramModel::<f32>::new(config, index).expect("model");
    model.reset_parameters(&mut Rng::new(0)).expect("init");
    let mut trainer = Trainer::new(model, corpus, train_config(1)).expect("trainer");
    trainer.step().expect("one finite step");
}

fn train_config(steps: u64) -> TrainConfig {
    TrainConfig {
        steps,
        batch: 8,
        lr: 1e-2,
        gate_penalty: 0.05,
        fusion_penalty: 0.01,
        use_gate: true,
        seed: 0,
    }
}

// ---------------------------------------------------------------------------
// checkpoint_loader

/// The corpus the checkpoint target's trainer runs on; the checkpoint
/// seeds are written by [`checkpoint_trainer`] for it.
pub fn checkpoint_corpus() -> Corpus {
    let mut c = Corpus::new(
        vec![0, 1, 2, 3, 4, 5, 1, 2, 0, 3],
        vec![0, 0, 1, 1, 0, 1, 1, 0, 0, 1],
    );
    c.sequence_starts = vec![0, 6];
    c
}

/// A trainer (V 6, L 2, D 3, f32) at step 0, on [`checkpoint_corpus`].
pub fn checkpoint_trainer() -> Trainer<f32> {
    let config = ModelConfig {
        vocab_size: 6,
        n_languages: 2,
        dim: 3,
        gate_init: 0.0,
    };
    let index = SplitIndex::new(vec![0, 1, 1], vec![1, 2, 4]);
    let mut model = BigramModel::<f32>::new(config, index).expect("model");
    model.reset_parameters(&mut Rng::new(3)).expect("init");
    Trainer::new(model, checkpoint_corpus(), train_config(4)).expect("trainer")
}

/// Bytes: a safetensors file. It is opened and every tensor read back in
/// its own dtype and shape; then it is loaded into
/// [`checkpoint_trainer`]'s model and optimisers, and a trainer that
/// accepted it must step, save and reload.
pub fn checkpoint_loader(data: &[u8]) {
    let file = ScratchFile::with("model.safetensors", data);
    let ck = match Checkpoint::open(&file.0) {
        Ok(ck) => ck,
        Err(e) => {
            assert_eq!(e.file(), Some(file.0.as_path()), "error names no file: {e}");
            return;
        }
    };
    let names: Vec<String> = ck.names().iter().map(|s| s.to_string()).collect();
    let _ = ck.metadata();
    ck.expect_names(&names, true).expect("its own names");
    for name in &names {
        let shape = ck.shape(name).expect("listed").to_vec();
        match ck.get(name) {
            Ok(t) => {
                assert_eq!(t.shape(), shape.as_slice());
                let finite = ck.check_finite(name);
                match &t {
                    TensorData::F32(a) => {
                        assert_eq!(finite.is_ok(), a.iter().all(|x| x.is_finite()));
                        let again = ck.get_real::<f32>(name, &shape).expect("same tensor");
                        assert!(again.iter().zip(a).all(|(x, y)| x.to_bits() == y.to_bits()));
                        assert!(ck.get_real::<f64>(name, &shape).is_err());
                    }
                    TensorData::F64(a) => {
                        assert_eq!(finite.is_ok(), a.iter().all(|x| x.is_finite()));
                        assert!(ck.get_real::<f32>(name, &shape).is_err());
                    }
                    TensorData::I64(_) => {
                        assert!(finite.is_err());
                        assert!(ck.get_i64(name, &shape).is_ok());
                    }
                    TensorData::U64(_) => {
                        assert!(finite.is_err());
                        assert!(ck.get_u64(name, &shape).is_ok());
                    }
                }
            }
            Err(_) => {
                let _ = ck.check_finite(name);
            }
        }
        let mut other = shape.clone();
        other.push(1);
        assert!(
            ck.get_u64(name, &other).is_err(),
            "{name} read in a shape not its own"
        );
    }

    let mut trainer = checkpoint_trainer();
    if trainer.load(&file.0).is_err() {
        return;
    }
    if trainer.is_done() {
        return;
    }
    if trainer.step().is_err() {
        return; // Diverged, named by step: allowed for absurd weights
    }
    let copy = ScratchFile::with("model-copy.safetensors", &[]);
    if trainer.save(&copy.0).is_ok() {
        let mut again = checkpoint_trainer();
        again.load(&copy.0).expect("a saved checkpoint loads");
        assert_eq!(again.step_index(), trainer.step_index());
    }
}

// ---------------------------------------------------------------------------
// routing

/// Bytes: split sizes, then ids. Every id that routes goes to the split
/// whose range holds it (`start_k ≤ id < start_k + size_k`, local row
/// `id − start_k`); every other id is an error naming it.
pub fn routing(data: &[u8]) {
    let mut b = Bytes::new(data);
    let n_splits = b.below(6) + 1;
    let wide = b.u8();
    // Mostly small sizes; some inputs ask for sizes anywhere in u64.
    let sizes: Vec<usize> = (0..n_splits)
        .map(|k| {
            if wide & (1 << k) != 0 {
                b.u64() as usize
            } else {
                b.below(40)
            }
        })
        .collect();
    let Some(total) = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s)) else {
        return; // SplitRouting::new's documented panic
    };
    let r = SplitRouting::new(&sizes);
    assert_eq!(r.vocab_size(), total);
    assert_eq!(r.n_splits(), n_splits);
    let mut ids = Vec::new();
    while !b.rest().is_empty() && ids.len() < 64 {
        let id = match b.u8() % 4 {
            0 => i64::from(b.u8() as i8),
            1 => b.u64() as i64,
            2 => (total as i64)
                .wrapping_sub(2)
                .wrapping_add(b.below(5) as i64),
            _ => b.below(total.max(1).saturating_add(8)) as i64,
        };
        ids.push(id);
    }
    for &id in &ids {
        let inside = id >= 0 && (id as u64) < total as u64;
        match r.route(id) {
            Some((k, local)) => {
                let id = id as usize;
                assert!(inside, "id {id} outside 0..{total} routed");
                assert!(
                    r.start(k) <= id && id < r.start(k) + r.size(k),
                    "id {id} → split {k}"
                );
                assert_eq!(local, id - r.start(k));
            }
            None => assert!(!inside, "id {id} inside 0..{total} not routed"),
        }
    }
    let first_bad = ids.iter().position(|&id| r.route(id).is_none());
    match (r.route_all_as(&ids, "id"), first_bad) {
        (Ok(routed), None) => {
            assert_eq!(routed.n_ids(), ids.len());
            for (p, &(k, local)) in routed.owners().iter().enumerate() {
                assert_eq!(r.route(ids[p]), Some((k, local)));
            }
        }
        (Err(e), Some(p)) => assert_eq!((e.position, e.id), (p, ids[p])),
        (got, want) => panic!(
            "route_all: {:?} but first bad id at {want:?}",
            got.map(|_| ())
        ),
    }

    // The same through the layers' tables, ids as a 2-D array.
    if total > 4096 || ids.is_empty() {
        return;
    }
    let named: Vec<(String, usize)> = sizes
        .iter()
        .enumerate()
        .map(|(k, &s)| (format!("s{k}"), s))
        .collect();
    let order: Vec<&str> = named.iter().map(|(n, _)| n.as_str()).collect();
    let tables = SplitTables::<f32>::new("t", &named, &order, 1).expect("valid splits");
    let cols = if ids.len() % 2 == 0 { 2 } else { 1 };
    let grid = Array2::from_shape_vec((ids.len() / cols, cols), ids.clone())
        .expect("shape")
        .into_dyn();
    match tables.route(grid.view(), "input id") {
        Ok(routed) => {
            assert!(first_bad.is_none());
            let direct = r.route_all(&ids).expect("in range");
            assert_eq!(routed, direct);
        }
        Err(e) => {
            let p = first_bad.expect("an id out of range");
            match e.kind() {
                splitgrad::ErrorKind::OutOfRange { position, .. } => {
                    assert_eq!(position, &vec![p / cols, p % cols]);
                }
                other => panic!("unexpected error {other:?}"),
            }
        }
    }
}

// ---------------------------------------------------------------------------
// differential

/// `|a − b| ≤ tol·max(1, scale)`.
fn close(a: f64, b: f64, tol: f64, scale: f64) -> bool {
    (a - b).abs() <= tol * scale.max(1.0) || (a.is_nan() && b.is_nan())
}

fn assert_close<'a>(
    what: &str,
    a: impl IntoIterator<Item = &'a f64>,
    b: impl IntoIterator<Item = &'a f64>,
    tol: f64,
    scale: f64,
) {
    for (i, (x, y)) in a.into_iter().zip(b).enumerate() {
        assert!(
            close(*x, *y, tol, scale),
            "{what}[{i}]: fast {x} vs naive {y}"
        );
    }
}

/// Bytes: a kernel selector, then the sizes and values of a small case.
/// Each fast kernel is run against its naive twin: scatter coalescing and
/// the optimisers bit for bit, the fused cross-entropy, the gated mix and
/// the fusion penalty (forward and backward) within a tolerance.
pub fn differential(data: &[u8]) {
    let mut b = Bytes::new(data);
    match b.u8() % 6 {
        0 => diff_coalesce(&mut b),
        1 => diff_fused_ce(&mut b),
        2 => diff_lazy_adam(&mut b),
        3 => diff_adam(&mut b),
        4 => diff_gated_mix(&mut b),
        _ => diff_fusion_penalty(&mut b),
    }
}

fn diff_coalesce(b: &mut Bytes) {
    let n_rows = b.below(16) + 1;
    let width = b.below(9);
    let n = b.below(64);
    // Tiled past 4096 contributions the kernel sorts in parallel.
    let tile = if b.u8() == 255 { 80 } else { 1 };
    let ids: Vec<usize> = (0..n).map(|_| b.below(n_rows)).collect();
    let values: Vec<f64> = (0..n * width).map(|_| b.real(100.0)).collect();
    let ids: Vec<usize> = ids.iter().copied().cycle().take(n * tile).collect();
    let values: Vec<f64> = values
        .iter()
        .copied()
        .cycle()
        .take(n * width * tile)
        .collect();
    let v = Array2::from_shape_vec((n * tile, width), values).expect("shape");
    let fast = coalesce_rows(n_rows, &ids, v.view());
    let naive = coalesce_rows_naive(n_rows, &ids, v.view());
    assert_eq!(fast.rows, naive.rows);
    assert!(
        fast.values
            .iter()
            .zip(naive.values.iter())
            .all(|(x, y)| x.to_bits() == y.to_bits()),
        "coalesce_rows differs from its naive twin"
    );
    let v32 = v.mapv(|x| x as f32);
    assert_eq!(
        coalesce_rows(n_rows, &ids, v32.view()),
        coalesce_rows_naive(n_rows, &ids, v32.view())
    );
}

fn diff_fused_ce(b: &mut Bytes) {
    let m = b.below(6) + 1;
    let h = b.below(6) + 1;
    let n_splits = b.below(3) + 1;
    let sizes: Vec<usize> = (0..n_splits).map(|_| b.below(7)).collect();
    let v: usize = sizes.iter().sum();
    let scale = [1.0, 4.0, 30.0][b.below(3)];
    let n = b.below(12);
    let chunks = ChunkSizes {
        tokens: b.below(4) + 1,
        vocab: b.below(5) + 1,
    };
    let labels: Vec<i64> = (0..n)
        .map(|_| {
            let x = b.u8();
            if v == 0 || x & 0x80 != 0 {
                IGNORE_INDEX
            } else {
                (x as usize % v) as i64
            }
        })
        .collect();
    let row_of: Vec<usize> = (0..n).map(|_| b.below(m)).collect();
    let hid = Array2::from_shape_fn((m, h), |_| b.real(scale));
    let ws: Vec<Array2<f64>> = sizes
        .iter()
        .map(|&s| Array2::from_shape_fn((s, h), |_| b.real(scale)))
        .collect();
    let gy: Vec<f64> = (0..n).map(|_| b.real(2.0)).collect();
    let targets = Targets::grouped(labels, row_of, m);
    let wv: Vec<ArrayView2<'_, f64>> = ws.iter().map(|w| w.view()).collect();

    // Logits are at most H·scale² in size; the tolerance follows them.
    let size = h as f64 * scale * scale;
    let (l0, s0) = naive_ce_forward(hid.view(), &wv, &targets);
    let (l1, s1) = fused_ce_forward(hid.view(), &wv, &targets, chunks);
    assert_close("loss", &l1, &l0, 1e-12, size);
    assert_close("lse", &s1.lse(), &s0.lse(), 1e-12, size);
    assert!(
        l1.iter()
            .all(|x| x.is_finite() && *x >= -1e-9 * size.max(1.0))
    );

    let (gh0, gw0) = naive_ce_backward(hid.view(), &wv, &targets, &gy);
    let mut gh = Array2::zeros(hid.dim());
    let mut gws: Vec<Array2<f64>> = ws.iter().map(|w| Array2::zeros(w.dim())).collect();
    let mut views: Vec<Option<ArrayViewMut2<'_, f64>>> =
        gws.iter_mut().map(|g| Some(g.view_mut())).collect();
    fused_ce_backward(
        hid.view(),
        &wv,
        &targets,
        &s1,
        &gy,
        chunks,
        Some(gh.view_mut()),
        &mut views,
    );
    let gsize = 2.0 * n as f64 * scale;
    assert_close("grad hidden", gh.iter(), gh0.iter(), 1e-10, gsize);
    for (k, (a, b)) in gws.iter().zip(&gw0).enumerate() {
        assert_close(
            &format!("grad weight {k}"),
            a.iter(),
            b.iter(),
            1e-10,
            gsize,
        );
    }
}

/// A parameter and a sequence of gradients for the optimiser twins.
fn optimiser_case(b: &mut Bytes, sparse: bool) -> (Array2<f64>, Vec<ParamGrad<f64>>) {
    let rows = b.below(8) + 1;
    let width = b.below(4) + 1;
    let p = Array2::from_shape_fn((rows, width), |_| b.real(4.0));
    let steps = b.below(4) + 1;
    let grads = (0..steps)
        .map(|_| {
            if sparse && b.bool() {
                let mask = b.u8();
                let picked: Vec<usize> = (0..rows).filter(|r| mask & (1 << r) != 0).collect();
                let values = Array2::from_shape_fn((picked.len(), width), |_| b.real(10.0));
                ParamGrad::RowSparse(RowSparse {
                    n_rows: rows,
                    rows: picked,
                    values,
                })
            } else {
                ParamGrad::Dense(Array2::from_shape_fn((rows, width), |_| b.real(10.0)).into_dyn())
            }
        })
        .collect();
    (p, grads)
}

fn bits_equal<T: Real>(a: &Parameter<T>, b: &Parameter<T>) -> bool {
    a.value()
        .iter()
        .zip(b.value().iter())
        .all(|(x, y)| Real::to_f64(*x).to_bits() == Real::to_f64(*y).to_bits())
}

fn diff_lazy_adam(b: &mut Bytes) {
    let config = LazyAdamConfig {
        lr: [1e-3, 0.1, 1.0][b.below(3)],
        beta1: [0.9, 0.0, 0.5][b.below(3)],
        beta2: [0.999, 0.0, 0.9][b.below(3)],
        eps: [1e-8, 1e-3][b.below(2)],
    };
    let (p, grads) = optimiser_case(b, true);
    let mut fast_p = Parameter::new("t", p.clone().into_dyn());
    let mut naive_p = Parameter::new("t", p.into_dyn());
    let mut fast = LazyAdam::new(config).expect("valid config");
    let mut naive = LazyAdam::new(config).expect("valid config");
    for g in &grads {
        fast.update(&mut fast_p, g).expect("update");
        naive.update_naive(&mut naive_p, g).expect("update_naive");
        assert!(
            bits_equal(&fast_p, &naive_p),
            "lazy Adam: update ≠ update_naive"
        );
    }
    assert_eq!(fast.state(), naive.state());
}

fn diff_adam(b: &mut Bytes) {
    let config = AdamConfig {
        lr: [1e-3, 0.1, 0.0][b.below(3)],
        beta1: [0.9, 0.0][b.below(2)],
        beta2: [0.999, 0.5][b.below(2)],
        eps: [1e-8, 0.0][b.below(2)],
        weight_decay: [0.0, 1e-2][b.below(2)],
        decoupled_weight_decay: b.bool(),
    };
    let (p, grads) = optimiser_case(b, true);
    let mut fast_p = Parameter::new("t", p.clone().into_dyn());
    let mut naive_p = Parameter::new("t", p.into_dyn());
    let mut fast = Adam::new(config).expect("valid config");
    let mut naive = Adam::new(config).expect("valid config");
    for g in &grads {
        fast.update(&mut fast_p, g).expect("update");
        naive.update_naive(&mut naive_p, g).expect("update_naive");
        assert!(bits_equal(&fast_p, &naive_p), "Adam: update ≠ update_naive");
    }
}

/// A small split vocabulary with random rows and gates, and a batch.
struct MixCase {
    sv: SplitVocabulary<f64>,
    tokens: Vec<i64>,
    languages: Vec<i64>,
    shared: Array2<f64>,
    upstream: Array2<f64>,
}

fn mix_case(b: &mut Bytes) -> Option<MixCase> {
    let (l, v, d) = (b.below(3) + 1, b.below(6) + 1, b.below(4) + 1);
    // Rows: the distinct cells picked by a bit mask over the L × V grid.
    let mask = b.u16() as usize | (b.u16() as usize) << 16;
    let (mut langs, mut toks) = (Vec::new(), Vec::new());
    for cell in 0..l * v {
        if mask & (1 << (cell % 32)) != 0 && langs.len() < 12 {
            langs.push(cell / v);
            toks.push(cell % v);
        }
    }
    if langs.is_empty() {
        return None;
    }
    let n_rows = langs.len();
    let mut sv = SplitVocabulary::<f64>::new(
        SplitIndex::new(langs, toks),
        &SplitVocabularyConfig {
            vocab_size: v,
            dim: d,
            n_languages: l,
            gate_init: 0.0,
        },
    )
    .expect("valid");
    {
        sv.rows_mut().value_mut().mapv_inplace(|_| b.real(3.0));
        sv.gate_logit_mut()
            .value_mut()
            .mapv_inplace(|_| b.real(8.0));
    }
    // Sometimes a row equal to another row of its token: a deviation of
    // exactly zero, where the norm's gradient is taken to be 0.
    let twin = (1..n_rows).find(|&j| sv.index().token_index[j] == sv.index().token_index[0]);
    if let (true, Some(j)) = (b.bool(), twin) {
        let rows = sv.rows_mut();
        let first = rows.value().index_axis(Axis(0), 0).to_owned();
        rows.value_mut().index_axis_mut(Axis(0), j).assign(&first);
    }
    let n = b.below(10);
    let tokens: Vec<i64> = (0..n).map(|_| b.below(v) as i64).collect();
    let languages: Vec<i64> = (0..n).map(|_| b.below(l) as i64).collect();
    let shared = Array2::from_shape_fn((n, d), |_| b.real(3.0));
    let upstream = Array2::from_shape_fn((n, d), |_| b.real(1.0));
    Some(MixCase {
        sv,
        tokens,
        languages,
        shared,
        upstream,
    })
}

fn diff_gated_mix(b: &mut Bytes) {
    let Some(c) = mix_case(b) else { return };
    let use_gate = b.bool();
    let sv = &c.sv;
    let mut tape = Tape::new();
    let s = tape.input(c.shared.clone().into_dyn());
    let out = sv
        .forward(&mut tape, &c.tokens, &c.languages, s, use_gate)
        .expect("valid batch");
    let loss = tape.dot_const(out, c.upstream.clone().into_dyn());
    let grads = tape.backward(loss);

    // The naive twin: token by token, from the formulas of `docs/spec.md#23-splitvocabulary`.
    let rows = sv
        .rows()
        .value()
        .clone()
        .into_dimensionality::<ndarray::Ix2>()
        .expect("2-D");
    let gate: Vec<f64> = sv.gate().to_vec();
    let (n, d) = c.shared.dim();
    let mut want = c.shared.clone();
    let mut g_shared = c.upstream.clone();
    let mut g_rows = Array2::<f64>::zeros(rows.dim());
    let mut g_logit = vec![0.0; gate.len()];
    for i in 0..n {
        let Some(r) = sv.row_of(c.languages[i] as usize, c.tokens[i] as usize) else {
            continue;
        };
        for j in 0..d {
            let (sh, x, u) = (c.shared[[i, j]], rows[[r, j]], c.upstream[[i, j]]);
            if use_gate {
                let g = gate[r];
                want[[i, j]] = (1.0 - g) * sh + g * x;
                g_shared[[i, j]] = (1.0 - g) * u;
                g_rows[[r, j]] += g * u;
                g_logit[r] += u * (x - sh) * g * (1.0 - g);
            } else {
                want[[i, j]] = x;
                g_shared[[i, j]] = 0.0;
                g_rows[[r, j]] += u;
            }
        }
    }
    let fast_out = tape.value(out).to_owned();
    assert_close("gated mix", fast_out.iter(), want.iter(), 1e-12, 3.0);
    let direct = gated_mix_forward(
        c.shared.view(),
        rows.view(),
        use_gate.then_some(gate.as_slice()),
        &c.tokens
            .iter()
            .zip(&c.languages)
            .map(|(&t, &l)| {
                sv.row_of(l as usize, t as usize)
                    .map_or(u32::MAX, |r| r as u32)
            })
            .collect::<Vec<_>>(),
    );
    assert_eq!(
        direct.into_dyn(),
        fast_out,
        "the kernel and the layer differ"
    );
    let gs = grads.input(s).expect("shared gradient");
    assert_close("grad shared", gs.iter(), g_shared.iter(), 1e-12, 3.0);
    assert_close(
        "grad rows",
        grads.dense(sv.rows()).iter(),
        g_rows.iter(),
        1e-12,
        30.0,
    );
    if use_gate {
        let gl = grads.dense(sv.gate_logit());
        assert_close("grad gate_logit", gl.iter(), g_logit.iter(), 1e-12, 30.0);
    } else {
        assert!(grads.param(sv.gate_logit()).is_none());
    }
}

fn diff_fusion_penalty(b: &mut Bytes) {
    let Some(c) = mix_case(b) else { return };
    let sv = &c.sv;
    let mut tape = Tape::new();
    let p = sv.fusion_penalty_var(&mut tape);
    let value = tape.scalar(p);
    let grads = tape.backward(p);
    assert_eq!(value.to_bits(), sv.fusion_penalty().to_bits());

    // The naive twin: centroids by token, unit deviations, and the
    // gradient (1/n)(u_i − mean of u over rows of token t_i).
    let rows = sv
        .rows()
        .value()
        .clone()
        .into_dimensionality::<ndarray::Ix2>()
        .expect("2-D");
    let tokens = &sv.index().token_index;
    let (n, d) = rows.dim();
    let centroid = |t: usize| -> Array1<f64> {
        let members: Vec<usize> = (0..n).filter(|&i| tokens[i] == t).collect();
        let mut c = Array1::zeros(d);
        for &i in &members {
            c += &rows.row(i);
        }
        c / members.len() as f64
    };
    let mut total = 0.0;
    let mut units = Array2::<f64>::zeros((n, d));
    let mut ill_conditioned = false;
    for (i, &t) in tokens.iter().enumerate() {
        let dev = &rows.row(i) - &centroid(t);
        let norm = dev.dot(&dev).sqrt();
        total += norm;
        // A deviation of a few ulps is zero or not depending on the order
        // of the centroid's sum: its unit vector is noise.
        ill_conditioned |= norm > 0.0 && norm < 1e-9;
        if norm >= 1e-9 {
            units.row_mut(i).assign(&(dev / norm));
        }
    }
    let want = total / n as f64;
    assert!(
        close(value, want, 1e-12, 3.0),
        "fusion penalty: fast {value} vs naive {want}"
    );
    let mut g = Array2::<f64>::zeros((n, d));
    for i in 0..n {
        let same: Vec<usize> = (0..n).filter(|&j| tokens[j] == tokens[i]).collect();
        let mut mean_u = Array1::<f64>::zeros(d);
        for &j in &same {
            mean_u += &units.row(j);
        }
        mean_u /= same.len() as f64;
        g.row_mut(i).assign(&((&units.row(i) - &mean_u) / n as f64));
    }
    if ill_conditioned {
        return;
    }
    let fast = grads.dense(sv.rows());
    assert_close("grad fusion rows", fast.iter(), g.iter(), 1e-9, 1.0);
}

// ---------------------------------------------------------------------------
// golden eval

/// `golden eval` on one case, in three modes chosen by the first byte's
/// top bits: a zip file as given (`PK…`), a structured npz built from the
/// input with the layer's array names (wrong dtypes, shapes and values),
/// or a valid generated case whose evaluation must reproduce its stored
/// results bit for bit. Never a panic; an `Ok` result is an npz whose
/// arrays are finite.
pub fn golden_eval(data: &[u8]) {
    use splitgrad::app::golden::{Layer, evaluate_bytes, generate_case};
    use splitgrad::io::RealDtype;

    let mut b = Bytes::new(data);
    let head = b.u8();
    let layer = Layer::ALL[head as usize % 3];
    let names: &[&str] = match layer {
        Layer::SplitEmbeddings => &[
            "split_sizes",
            "split_trainable",
            "weight_0",
            "weight_1",
            "input_ids",
            "upstream",
        ],
        Layer::SplitVocabulary => &[
            "vocab_size",
            "n_languages",
            "language_index",
            "token_index",
            "rows",
            "gate_logit",
            "token_ids",
            "language_ids",
            "shared",
            "upstream",
            "use_gate",
            "penalty_weight",
            "fusion_weight",
        ],
        Layer::LmHead => &[
            "split_sizes",
            "weight_0",
            "weight_1",
            "hidden",
            "labels",
            "upstream",
        ],
    };
    let rest = b.data;
    let (bytes, generated) = if rest.starts_with(b"PK") {
        (rest.to_vec(), false)
    } else if head & 0x80 != 0 {
        (structured_npz(&mut b, names), false)
    } else {
        let seed = b.u64();
        let dtype = if b.bool() {
            RealDtype::F32
        } else {
            RealDtype::F64
        };
        (generate_case(layer, &mut Rng::new(seed), dtype), true)
    };
    let result = evaluate_bytes(layer, "fuzz-case.npz", bytes.clone());
    if generated {
        let out = result.unwrap_or_else(|e| panic!("a generated case fails: {e}"));
        let mut got = NpzReader::from_bytes("result", out).expect("results are an npz");
        let mut case = NpzReader::from_bytes("case", bytes).expect("cases are an npz");
        for name in got.names().to_vec() {
            let a = got.reals::<f64>(&name).expect("a real result");
            let want = case
                .reals::<f64>(&name)
                .expect("the case stores its results");
            assert_eq!(a.shape(), want.shape(), "{name}");
            assert!(
                a.iter()
                    .zip(want.iter())
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{name} differs from the stored result"
            );
        }
    } else if let Ok(out) = result {
        let mut got = NpzReader::from_bytes("result", out).expect("results are an npz");
        for name in got.names().to_vec() {
            let a = got.reals::<f64>(&name).expect("a real result");
            assert!(a.iter().all(|x| x.is_finite()), "{name} is not finite");
        }
    }
}
