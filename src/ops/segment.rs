//! Segment sum and segment mean over groups given by an index (the
//! centroid of a split vocabulary's fusion penalty).
//!
//! `sum[s] = Σ_{i : seg[i] = s} x[i]`, backward `∂x[i] += ∂sum[seg[i]]`;
//! `mean[s] = sum[s] / max(count[s], 1)` — computed as
//! `x[f] + Σ_{i ∈ s} (x[i] − x[f]) / count[s]` with f the first member, the
//! same function, so that a segment of identical rows has exactly that row
//! as its mean (the fusion penalty's deviations are then exactly 0 after
//! `seed_from`) — backward
//! `∂x[i] += ∂mean[seg[i]] / count[seg[i]]`. An empty segment's mean is 0
//! (as the seed's `count.clamp(min=1)`).
//! Derivation: `docs/gradients.md#segment-sum-and-mean`.

use ndarray::{ArrayD, ArrayViewD, Axis, IxDyn};

use crate::kernels::Real;
use crate::tape::{Tape, Var};

/// A zero array of the output's shape, (n_segments, …) for x: (n, …),
/// after checking that there is one segment id per row and each is in
/// range.
#[track_caller]
fn zero_output<T: Real>(shape: &[usize], segments: &[usize], n_segments: usize) -> ArrayD<T> {
    assert!(
        !shape.is_empty() && shape[0] == segments.len(),
        "segment: {} segment ids for rows of {shape:?}",
        segments.len()
    );
    if let Some(&bad) = segments.iter().find(|&&s| s >= n_segments) {
        panic!("segment: segment id {bad} is out of range 0..{n_segments}");
    }
    let mut out = shape.to_vec();
    out[0] = n_segments;
    ArrayD::zeros(IxDyn(&out))
}

/// `out[s] = Σ_{i : seg[i] = s} x[i]`, summed in increasing i.
/// x: (n, …), segments: (n) → (n_segments, …).
///
/// **Panics** if a segment id is ≥ n_segments or the lengths differ.
#[track_caller]
pub fn segment_sum_forward<T: Real>(
    x: ArrayViewD<'_, T>,
    segments: &[usize],
    n_segments: usize,
) -> ArrayD<T> {
    let mut out = zero_output(x.shape(), segments, n_segments);
    for (row, &s) in x.axis_iter(Axis(0)).zip(segments) {
        let mut o = out.index_axis_mut(Axis(0), s);
        o += &row;
    }
    out
}

/// `out[s] = x[f_s] + Σ_{i : seg[i] = s} (x[i] − x[f_s]) / count[s]`, with
/// f_s the first member of segment s: the mean, exact when every member is
/// equal; 0 for an empty segment. x: (n, …), segments: (n) → (n_segments, …).
///
/// **Panics** if a segment id is ≥ n_segments or the lengths differ.
#[track_caller]
pub fn segment_mean_forward<T: Real>(
    x: ArrayViewD<'_, T>,
    segments: &[usize],
    n_segments: usize,
) -> ArrayD<T> {
    let mut dev = zero_output::<T>(x.shape(), segments, n_segments);
    let mut first = vec![usize::MAX; n_segments];
    for (i, &s) in segments.iter().enumerate() {
        if first[s] == usize::MAX {
            first[s] = i;
        }
    }
    for (row, &s) in x.axis_iter(Axis(0)).zip(segments) {
        let base = x.index_axis(Axis(0), first[s]);
        let mut o = dev.index_axis_mut(Axis(0), s);
        ndarray::Zip::from(&mut o)
            .and(&row)
            .and(&base)
            .for_each(|o, &v, &b| *o += v - b);
    }
    let counts = segment_counts(segments, n_segments);
    for (s, mut o) in dev.axis_iter_mut(Axis(0)).enumerate() {
        if counts[s] > 0 {
            let c = T::from_f64(counts[s] as f64);
            let base = x.index_axis(Axis(0), first[s]);
            o.zip_mut_with(&base, |o, &b| *o = b + *o / c);
        }
    }
    dev
}

/// Members of each segment.
pub fn segment_counts(segments: &[usize], n_segments: usize) -> Vec<usize> {
    let mut counts = vec![0; n_segments];
    for &s in segments {
        counts[s] += 1;
    }
    counts
}

/// `g[i] += gy[seg[i]]`.
pub fn segment_sum_backward<T: Real>(segments: &[usize], gy: ArrayViewD<'_, T>, g: &mut ArrayD<T>) {
    for (mut row, &s) in g.axis_iter_mut(Axis(0)).zip(segments) {
        row += &gy.index_axis(Axis(0), s);
    }
}

/// `g[i] += gy[seg[i]] / count[seg[i]]`.
pub fn segment_mean_backward<T: Real>(
    segments: &[usize],
    counts: &[usize],
    gy: ArrayViewD<'_, T>,
    g: &mut ArrayD<T>,
) {
    for (mut row, &s) in g.axis_iter_mut(Axis(0)).zip(segments) {
        let c = T::from_f64(counts[s] as f64);
        row.zip_mut_with(&gy.index_axis(Axis(0), s), |g, &gy| *g += gy / c);
    }
}

/// The saved state of `segment_sum`: its input and each row's segment.
struct SegmentSum {
    x: Var,
    segments: Vec<usize>,
}

backward!(SegmentSum, |s, _y, gy, grads| {
    grads.accumulate(gy, &[s.x], |_, gy, g| {
        segment_sum_backward(&s.segments, gy, g)
    });
});

/// The saved state of `segment_mean`: its input, each row's segment and
/// the size of each segment.
struct SegmentMean {
    x: Var,
    segments: Vec<usize>,
    counts: Vec<usize>,
}

backward!(SegmentMean, |s, _y, gy, grads| {
    grads.accumulate(gy, &[s.x], |_, gy, g| {
        segment_mean_backward(&s.segments, &s.counts, gy, g)
    });
});

impl<'p, T: Real> Tape<'p, T> {
    /// Sums rows by segment: `out[s] = Σ_{i : segments[i] = s} x[i]`.
    ///
    /// x: (n, …), segments: (n) → (n_segments, …).
    ///
    /// **Panics** if a segment id is ≥ n_segments or there is not one per row.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::Tape;
    /// let mut t = Tape::<f64>::new();
    /// let x = t.input(array![[1.0], [2.0], [4.0]].into_dyn());
    /// let s = t.segment_sum(x, &[1, 0, 1], 2);
    /// assert_eq!(t.value(s), array![[2.0], [5.0]].into_dyn());
    /// ```
    #[track_caller]
    pub fn segment_sum(&mut self, x: Var, segments: &[usize], n_segments: usize) -> Var {
        let y = segment_sum_forward(self.value(x), segments, n_segments);
        self.push_op_with(y, &[x], || SegmentSum {
            x,
            segments: segments.to_vec(),
        })
    }

    /// Averages rows by segment: `out[s] = mean_{i : segments[i] = s} x[i]`,
    /// 0 for an empty segment.
    ///
    /// x: (n, …), segments: (n) → (n_segments, …).
    ///
    /// **Panics** if a segment id is ≥ n_segments or there is not one per row.
    ///
    /// ```
    /// use ndarray::array;
    /// use splitgrad::Tape;
    /// let mut t = Tape::<f64>::new();
    /// let x = t.input(array![[1.0], [2.0], [4.0]].into_dyn());
    /// let m = t.segment_mean(x, &[1, 0, 1], 3);
    /// assert_eq!(t.value(m), array![[2.0], [2.5], [0.0]].into_dyn());
    /// ```
    #[track_caller]
    pub fn segment_mean(&mut self, x: Var, segments: &[usize], n_segments: usize) -> Var {
        let y = segment_mean_forward(self.value(x), segments, n_segments);
        self.push_op_with(y, &[x], || SegmentMean {
            x,
            segments: segments.to_vec(),
            counts: segment_counts(segments, n_segments),
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::input_grads;
    use ndarray::array;

    #[test]
    fn hand_case_mean() {
        // mean[1] = (x0 + x2)/2, mean[0] = x1: with ∂mean = [[1], [1]],
        // ∂x = [1/2, 1, 1/2].
        let x = array![[1.0], [2.0], [4.0]].into_dyn();
        let g = input_grads(vec![x], |t, x| {
            let m = t.segment_mean(x[0], &[1, 0, 1], 2);
            t.sum(m)
        });
        assert_eq!(g, [array![[0.5], [1.0], [0.5]].into_dyn()]);
    }
}
