//! Saving a corpus holds a block of its columns at a time, never a second
//! copy of its token ids: a corpus of 16 M tokens (64 MiB of `uint32` ids,
//! 16 MiB of `uint8` languages) is written at a peak of its sequence starts
//! plus a few MiB, and reads back equal. A counting global allocator
//! measures it; this file holds exactly one test so that nothing else
//! allocates while it measures.

#[path = "common/counting.rs"]
mod counting;
use counting::measure;

use splitgrad::app::corpus::{Corpus, CorpusFormat, load_corpus, save_corpus_as};

#[test]
fn a_corpus_is_saved_a_block_at_a_time() {
    const MIB: usize = 1 << 20;
    let dir = std::env::temp_dir().join(format!("splitgrad-corpus-memory-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let n = 16 * MIB;
    // Ids past 65,535 keep the column `uint32`; sequences of 4,096 tokens.
    let tokens: Vec<u32> = (0..n as u32).map(|i| (i * 7919) % 70_000).collect();
    let languages: Vec<u32> = (0..n as u32).map(|i| (i / 4096) % 5).collect();
    let mut corpus = Corpus::new(tokens, languages);
    corpus.sequence_starts = (0..n).step_by(4096).collect();
    let ids_bytes = 4 * n;
    let starts_bytes = 8 * corpus.sequence_starts.len();

    for format in [
        CorpusFormat::default(),
        CorpusFormat {
            per_sequence_languages: true,
            deflate: false,
        },
    ] {
        let path = dir.join("corpus.npz");
        let (peak, largest, saved) = measure(|| save_corpus_as(&path, &corpus, format));
        saved.unwrap();
        eprintln!("{format:?}: peak {peak} bytes, largest allocation {largest}");
        assert!(
            std::fs::metadata(&path).unwrap().len() as usize > ids_bytes,
            "{format:?}"
        );
        // The sequence starts (as i64), a block of encoded values, the
        // zip writer's buffers and the per-sequence languages (4 KiB).
        let allowed = starts_bytes + 4 * MIB;
        assert!(
            peak <= allowed,
            "{format:?}: saving held {peak} bytes (largest {largest}), more than {allowed}: \
             a copy of the {ids_bytes} bytes of token ids?"
        );
        assert_eq!(load_corpus(&path).unwrap(), corpus, "{format:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
