//! The loaders' bodies (the index, the corpus, the checkpoint) and the
//! routing's.

use ndarray::Array2;
use splitgrad::Rng;
use splitgrad::app::corpus::{self, Corpus};
use splitgrad::app::model::{BigramModel, ModelConfig};
use splitgrad::app::train::{TrainConfig, Trainer};
use splitgrad::checkpoint::{Checkpoint, TensorData};
use splitgrad::io::{self, NpzReader, SplitIndex};
use splitgrad::kernels::routing::SplitRouting;
use splitgrad::layers::SplitTables;
use splitgrad::layers::{SplitVocabulary, SplitVocabularyConfig};

use super::{Bytes, ScratchFile, read_every_member, structured_npz};

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
        vec![corpus.language_ids.get(0) as usize],
        vec![corpus.token_ids.get(0) as usize],
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
        ..TrainConfig::default()
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
                    TensorData::BF16(a) => {
                        assert_eq!(finite.is_ok(), a.iter().all(|x| x.is_finite()));
                        assert!(ck.get_real::<f32>(name, &shape).is_err());
                    }
                    TensorData::F16(a) => {
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
