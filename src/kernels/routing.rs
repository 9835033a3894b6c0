//! Split offset routing: a global id → (split, local row) for splits that
//! own contiguous ranges of one vocabulary.
//!
//! Split k owns global ids `[start_k, start_k + size_k)` with
//! `start_k = Σ_{j<k} size_j`. Routing is not differentiable (ids are
//! integers); the layers use it to gather from, and send gradient to, the
//! one split that owns each id and no other.

/// An id that no split owns, found by [`SplitRouting::route_all_as`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unrouted {
    /// What the ids are (`"input id"`, `"label"`).
    pub what: &'static str,
    /// Its position in the ids.
    pub position: usize,
    /// The id.
    pub id: i64,
    /// V, the end of the valid range `[0, V)`, as an `i64` (saturated).
    pub vocab_size: i64,
}

impl std::fmt::Display for Unrouted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} at position [{}] is out of range 0..{}",
            self.what, self.id, self.position, self.vocab_size
        )
    }
}

impl std::error::Error for Unrouted {}

/// The contiguous ranges of a split vocabulary.
///
/// ```
/// use splitgrad::kernels::routing::SplitRouting;
/// let r = SplitRouting::new(&[3, 0, 2]);
/// assert_eq!(r.vocab_size(), 5);
/// assert_eq!(r.route(3), Some((2, 0)));
/// assert_eq!(r.route(5), None);
/// let routed = r.route_all(&[4, 0, 3]).unwrap();
/// assert_eq!(routed.positions[2], vec![0, 2]);
/// assert_eq!(routed.local[2], vec![1, 0]);
/// assert!(r.route_all(&[1, -1]).is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitRouting {
    starts: Vec<usize>,
    sizes: Vec<usize>,
    total: usize,
}

/// Ids grouped by the split that owns them.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Routed {
    /// For each split, the positions (in the flattened input) of its ids,
    /// increasing.
    pub positions: Vec<Vec<usize>>,
    /// For each split, the local row of each of those ids.
    pub local: Vec<Vec<usize>>,
}

impl Routed {
    /// Number of ids routed.
    pub fn n_ids(&self) -> usize {
        self.positions.iter().map(Vec::len).sum()
    }

    /// `(split, local row)` of each id, in input order.
    pub fn owners(&self) -> Vec<(usize, usize)> {
        let mut out = vec![(0, 0); self.n_ids()];
        for (k, (pos, loc)) in self.positions.iter().zip(&self.local).enumerate() {
            for (&p, &l) in pos.iter().zip(loc) {
                out[p] = (k, l);
            }
        }
        out
    }
}

impl SplitRouting {
    /// Routing for splits of these sizes, in order.
    ///
    /// **Panics** if the sizes add up to more than `usize::MAX` (no table
    /// of that many rows can exist).
    #[track_caller]
    pub fn new(sizes: &[usize]) -> Self {
        let mut starts = Vec::with_capacity(sizes.len());
        let mut total = 0usize;
        for &s in sizes {
            starts.push(total);
            total = total
                .checked_add(s)
                .expect("SplitRouting::new: the split sizes add up to more than usize::MAX");
        }
        SplitRouting {
            starts,
            sizes: sizes.to_vec(),
            total,
        }
    }

    /// V, the size of the global vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.total
    }

    /// Number of splits.
    pub fn n_splits(&self) -> usize {
        self.sizes.len()
    }

    /// The first global id of split k.
    pub fn start(&self, k: usize) -> usize {
        self.starts[k]
    }

    /// The size of split k.
    pub fn size(&self, k: usize) -> usize {
        self.sizes[k]
    }

    /// `(split, local row)` of a global id, `None` outside `[0, V)`.
    pub fn route(&self, id: i64) -> Option<(usize, usize)> {
        if id < 0 || id as u64 >= self.total as u64 {
            return None;
        }
        let id = id as usize;
        // The last split starting at or before `id`: splits of size 0 share
        // their start with the next split, which is the one that owns it.
        let k = self.starts.partition_point(|&s| s <= id) - 1;
        Some((k, id - self.starts[k]))
    }

    /// Routes every id; the error names the first id outside `[0, V)`
    /// (`what` says what the ids are, e.g. `"input id"` or `"label"`).
    pub fn route_all_as(&self, ids: &[i64], what: &'static str) -> Result<Routed, Unrouted> {
        let k = self.sizes.len();
        let mut routed = Routed {
            positions: vec![Vec::new(); k],
            local: vec![Vec::new(); k],
        };
        for (pos, &id) in ids.iter().enumerate() {
            match self.route(id) {
                Some((s, l)) => {
                    routed.positions[s].push(pos);
                    routed.local[s].push(l);
                }
                None => {
                    return Err(Unrouted {
                        what,
                        position: pos,
                        id,
                        vocab_size: i64::try_from(self.total).unwrap_or(i64::MAX),
                    });
                }
            }
        }
        Ok(routed)
    }

    /// [`SplitRouting::route_all_as`] for input ids.
    pub fn route_all(&self, ids: &[i64]) -> Result<Routed, Unrouted> {
        self.route_all_as(ids, "input id")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_id_goes_to_its_owner() {
        let r = SplitRouting::new(&[0, 3, 0, 0, 2, 0]);
        let expect = [(1, 0), (1, 1), (1, 2), (4, 0), (4, 1)];
        for (id, e) in expect.iter().enumerate() {
            assert_eq!(r.route(id as i64), Some(*e));
        }
        assert_eq!(r.route(5), None);
        assert_eq!(r.route(-1), None);
        assert_eq!(r.route(i64::MAX), None);
    }

    #[test]
    fn error_names_id_position_and_range() {
        let r = SplitRouting::new(&[2, 2]);
        let e = r.route_all(&[0, 3, 4]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "input id 4 at position [2] is out of range 0..4"
        );
    }

    /// Found by the `routing` fuzz target: the running start overflowed
    /// (a wrong routing in a release build).
    #[test]
    #[should_panic(expected = "the split sizes add up to more than usize::MAX")]
    fn sizes_that_overflow_are_a_documented_panic() {
        SplitRouting::new(&[usize::MAX, 1]);
    }

    /// Seen beside it: V above i64::MAX printed a negative upper bound.
    #[test]
    fn huge_vocabulary_names_a_positive_bound() {
        let r = SplitRouting::new(&[usize::MAX - 1]);
        let e = r.route_all(&[-1]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "input id -1 at position [0] is out of range 0..{}",
                i64::MAX
            )
        );
    }

    #[test]
    fn all_empty() {
        let r = SplitRouting::new(&[0, 0]);
        assert_eq!(r.route(0), None);
    }
}
