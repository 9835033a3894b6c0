//! The corpus fingerprint a checkpoint keeps, so that a run is never
//! resumed on other data.

use rayon::prelude::*;

use crate::app::corpus::Corpus;

/// A fingerprint of a corpus, kept in checkpoints so that a run is never
/// resumed on other data: FNV-1a over 64-bit words, of each fixed block
/// of 2¹⁶ ids of each array (hashed in parallel, in
/// four interleaved chains of every fourth id), of
/// the blocks' hashes in order, of the lengths and of the sequence
/// starts. The value depends on the ids alone, not on their widths or the
/// threads.
pub fn corpus_fingerprint(c: &Corpus) -> u64 {
    const PRIME: u64 = 0x0100_0000_01b3;
    const BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    let words =
        |h: u64, xs: &mut dyn Iterator<Item = u64>| xs.fold(h, |h, x| (h ^ x).wrapping_mul(PRIME));
    let column = |col: &crate::io::Column| -> Vec<u64> {
        fn blocks<X: Copy + Into<u64> + Sync>(v: &[X]) -> Vec<u64> {
            // Four interleaved chains a block (their multiplications
            // overlap), folded into one.
            v.par_chunks(FINGERPRINT_BLOCK)
                .map(|b| {
                    let mut lanes = [BASIS, BASIS ^ 1, BASIS ^ 2, BASIS ^ 3];
                    let quads = b.chunks_exact(4);
                    let rest = quads.remainder();
                    for q in quads {
                        for (h, &x) in lanes.iter_mut().zip(q) {
                            *h = (*h ^ x.into()).wrapping_mul(PRIME);
                        }
                    }
                    let h = lanes
                        .into_iter()
                        .fold(BASIS, |h, x| (h ^ x).wrapping_mul(PRIME));
                    rest.iter()
                        .fold(h, |h, &x| (h ^ x.into()).wrapping_mul(PRIME))
                })
                .collect()
        }
        if let Some(v) = col.as_u8() {
            blocks(v)
        } else if let Some(v) = col.as_u16() {
            blocks(v)
        } else {
            blocks(col.as_u32().unwrap_or_default())
        }
    };
    let mut h = words(
        BASIS,
        &mut [c.token_ids.len() as u64, c.language_ids.len() as u64].into_iter(),
    );
    for col in [&c.token_ids, &c.language_ids] {
        h = words(h, &mut column(col).into_iter());
    }
    words(h, &mut c.sequence_starts.iter().map(|&s| s as u64))
}

/// Ids a block of [`corpus_fingerprint`] hashes.
const FINGERPRINT_BLOCK: usize = 1 << 16;

/// What the checkpoint's `corpus_fingerprint` begins with: the
/// [`corpus_fingerprint`] of this version (earlier ones wrote the hex
/// digits alone, of another hash).
pub(super) const FINGERPRINT_VERSION: &str = "v2:";
