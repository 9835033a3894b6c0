//! The `(language, token) → row` map of a split vocabulary: [`PairLookup`].

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The Fx hash (rustc's), with a final rotation so that the low bits the
/// table indexes by depend on every input bit. Keys are small integers
/// chosen by us, not by an adversary, so no DoS-resistant hash is needed.
#[derive(Default)]
pub(crate) struct PairHasher(u64);

impl Hasher for PairHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    #[inline]
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0.rotate_left(26)
    }
}

/// A hash map keyed by `(language, token)`.
pub(crate) type PairMap<V> = HashMap<(usize, usize), V, BuildHasherDefault<PairHasher>>;

/// Marks an empty cell of the dense table.
const NONE: u32 = u32::MAX;

#[derive(Clone, Debug)]
enum Table {
    /// `cells[language · V + token]` = row, or [`NONE`]: 4 bytes a cell.
    Dense(Vec<u32>),
    /// Only the pairs that have a row: a few dozen bytes a row.
    Sparse(PairMap<u32>),
}

/// An O(1) map from a `(language, token)` pair to the split-vocabulary row
/// that specialises it, if any.
///
/// Two forms with one API: a dense table of `u32` (4 bytes per cell, L·V
/// cells) and a hash map of the pairs present. [`new`](Self::new) picks the
/// sparse form when the table would be both large (more than 2²² cells)
/// and mostly empty (more than 16 cells per row).
///
/// ```
/// use splitgrad::io::PairLookup;
/// // Rows: 0 = (language 1, token 4), 1 = (language 0, token 4).
/// let lookup = PairLookup::new(&[1, 0], &[4, 4], 2, 10);
/// assert!(lookup.is_dense());
/// assert_eq!(lookup.get(1, 4), Some(0));
/// assert_eq!(lookup.get(0, 4), Some(1));
/// assert_eq!(lookup.get(0, 5), None);
/// assert_eq!(lookup.get(7, 4), None); // out of range: no row
/// ```
#[derive(Clone, Debug)]
pub struct PairLookup {
    n_languages: usize,
    vocab_size: usize,
    n_rows: usize,
    table: Table,
}

impl PairLookup {
    /// The lookup of rows `i` = `(language_index[i], token_index[i])`, in
    /// whichever form suits the sizes. Build it from an index that has
    /// passed [`SplitIndex::validate`](super::SplitIndex::validate); should
    /// a pair repeat, its last row wins.
    ///
    /// **Panics** if the slices differ in length, if there are `u32::MAX`
    /// rows or more, or if a language is not below `n_languages` or a token
    /// not below `vocab_size`.
    #[track_caller]
    pub fn new(
        language_index: &[usize],
        token_index: &[usize],
        n_languages: usize,
        vocab_size: usize,
    ) -> Self {
        let cells = n_languages.saturating_mul(vocab_size);
        let n_rows = language_index.len();
        if cells > 1 << 22 && cells > n_rows.saturating_mul(16) {
            Self::sparse(language_index, token_index, n_languages, vocab_size)
        } else {
            Self::dense(language_index, token_index, n_languages, vocab_size)
        }
    }

    /// As [`new`](Self::new), always in the dense form.
    ///
    /// **Panics** as [`new`](Self::new) does, and if L·V overflows `usize`.
    #[track_caller]
    pub fn dense(
        language_index: &[usize],
        token_index: &[usize],
        n_languages: usize,
        vocab_size: usize,
    ) -> Self {
        let n_rows = check_rows(language_index, token_index, n_languages, vocab_size);
        let cells = n_languages
            .checked_mul(vocab_size)
            .expect("PairLookup::dense: n_languages · vocab_size overflows usize");
        let mut table = vec![NONE; cells];
        for (row, (&l, &t)) in language_index.iter().zip(token_index).enumerate() {
            table[l * vocab_size + t] = row as u32;
        }
        PairLookup {
            n_languages,
            vocab_size,
            n_rows,
            table: Table::Dense(table),
        }
    }

    /// As [`new`](Self::new), always in the sparse form.
    ///
    /// **Panics** as [`new`](Self::new) does.
    #[track_caller]
    pub fn sparse(
        language_index: &[usize],
        token_index: &[usize],
        n_languages: usize,
        vocab_size: usize,
    ) -> Self {
        let n_rows = check_rows(language_index, token_index, n_languages, vocab_size);
        let mut map = PairMap::with_capacity_and_hasher(n_rows, Default::default());
        for (row, (&l, &t)) in language_index.iter().zip(token_index).enumerate() {
            map.insert((l, t), row as u32);
        }
        PairLookup {
            n_languages,
            vocab_size,
            n_rows,
            table: Table::Sparse(map),
        }
    }

    /// The row of `(language, token)`, or `None` if the pair has none
    /// (including a language or token out of range).
    #[inline]
    pub fn get(&self, language: usize, token: usize) -> Option<usize> {
        if language >= self.n_languages || token >= self.vocab_size {
            return None;
        }
        let row = match &self.table {
            Table::Dense(cells) => cells[language * self.vocab_size + token],
            Table::Sparse(map) => *map.get(&(language, token))?,
        };
        (row != NONE).then_some(row as usize)
    }

    /// Whether this is the dense form.
    pub fn is_dense(&self) -> bool {
        matches!(self.table, Table::Dense(_))
    }

    /// The number of rows the lookup was built from.
    pub fn n_rows(&self) -> usize {
        self.n_rows
    }

    /// L, the number of languages.
    pub fn n_languages(&self) -> usize {
        self.n_languages
    }

    /// V, the vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }
}

#[track_caller]
fn check_rows(
    language_index: &[usize],
    token_index: &[usize],
    n_languages: usize,
    vocab_size: usize,
) -> usize {
    assert_eq!(
        language_index.len(),
        token_index.len(),
        "PairLookup: language_index and token_index differ in length"
    );
    assert!(
        language_index.len() < NONE as usize,
        "PairLookup: {} rows do not fit the u32 row ids",
        language_index.len()
    );
    for (i, (&l, &t)) in language_index.iter().zip(token_index).enumerate() {
        assert!(
            l < n_languages && t < vocab_size,
            "PairLookup: pair {i} (language {l}, token {t}) is outside {n_languages} languages × {vocab_size} tokens"
        );
    }
    language_index.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rng;
    use std::collections::hash_map::Entry;

    #[test]
    fn dense_and_sparse_agree_on_every_cell() {
        let (l, v) = (5, 300);
        let mut rng = Rng::new(11);
        let mut seen = PairMap::default();
        let (mut langs, mut toks) = (Vec::new(), Vec::new());
        while langs.len() < 200 {
            let pair = (
                (rng.next_u64() % l as u64) as usize,
                (rng.next_u64() % v as u64) as usize,
            );
            if let Entry::Vacant(cell) = seen.entry(pair) {
                cell.insert(langs.len());
                langs.push(pair.0);
                toks.push(pair.1);
            }
        }
        let dense = PairLookup::dense(&langs, &toks, l, v);
        let sparse = PairLookup::sparse(&langs, &toks, l, v);
        assert!(dense.is_dense() && !sparse.is_dense());
        let mut found = 0;
        for a in 0..l + 1 {
            for b in 0..v + 1 {
                let expected = seen.get(&(a, b)).copied();
                assert_eq!(dense.get(a, b), expected, "dense ({a}, {b})");
                assert_eq!(sparse.get(a, b), expected, "sparse ({a}, {b})");
                found += usize::from(expected.is_some());
            }
        }
        assert_eq!(found, 200);
    }

    #[test]
    fn form_follows_sizes() {
        // 8 × 32000 = 256 000 cells ≤ 2²²: dense whatever the rows.
        assert!(PairLookup::new(&[0], &[0], 8, 32000).is_dense());
        // 64 × 151936 ≈ 9.7 M cells > 2²², and > 16 per row: sparse.
        assert!(!PairLookup::new(&[3], &[151935], 64, 151936).is_dense());
        assert_eq!(
            PairLookup::new(&[3], &[151935], 64, 151936).get(3, 151935),
            Some(0)
        );
        // Huge L·V that would overflow a dense table still works sparse.
        let huge = PairLookup::new(&[1 << 40], &[1 << 40], usize::MAX, usize::MAX);
        assert_eq!(huge.get(1 << 40, 1 << 40), Some(0));
    }

    #[test]
    fn threshold_is_sixteen_cells_per_row_above_four_million_cells() {
        let n_rows = (1 << 18) + 1;
        let languages = vec![0; n_rows];
        let tokens: Vec<usize> = (0..n_rows).collect();
        // L·V = 16·n_rows = 2²² + 16 cells: dense; one cell more: sparse.
        assert!(PairLookup::new(&languages, &tokens, 1, 16 * n_rows).is_dense());
        let sparse = PairLookup::new(&languages, &tokens, 1, 16 * n_rows + 1);
        assert!(!sparse.is_dense());
        assert_eq!(sparse.get(0, n_rows - 1), Some(n_rows - 1));
        assert_eq!(sparse.get(0, n_rows), None);
    }

    #[test]
    #[should_panic(expected = "pair 1 (language 2, token 0) is outside 2 languages")]
    fn out_of_range_pair_panics() {
        PairLookup::new(&[0, 2], &[0, 0], 2, 4);
    }
}
