//! The fused head's extra memory does not grow with N × V (`docs/spec.md#22-splitlanguagemodellinghead`: "the
//! N × V logits matrix is never materialised").
//!
//! A counting global allocator (the System allocator plus atomics for the
//! bytes live now, the peak, and the largest single allocation) measures a
//! fused forward + backward at (N, V) = (256, 4096) and (2048, 32768) with
//! the same chunk sizes, and the naive head for contrast. This file holds
//! exactly one test so that nothing else allocates while it measures.

#[path = "common/counting.rs"]
mod counting;
use counting::measure;

use ndarray::{Array1, Array2};
use splitgrad::layers::SplitLanguageModellingHead;
use splitgrad::ops::fused_ce::ChunkSizes;
use splitgrad::state::Module;
use splitgrad::{Rng, Tape};

type T = f32;
const SIZE: usize = std::mem::size_of::<T>();
const H: usize = 64;
const CHUNKS: ChunkSizes = ChunkSizes {
    tokens: 128,
    vocab: 1024,
};

/// A head of V = 15/16·V + 1/16·V rows, H = 64, its hidden states and
/// labels (one in ten −100), built before any measurement.
fn setup(n: usize, v: usize) -> (SplitLanguageModellingHead<T>, Array2<T>, Array1<i64>) {
    let mut head = SplitLanguageModellingHead::new(
        &[("orig", v - v / 16), ("new", v / 16)],
        &["orig", "new"],
        H,
    )
    .unwrap();
    let mut rng = Rng::new(n as u64 ^ v as u64);
    head.reset_parameters(&mut rng);
    head.set_chunks(CHUNKS);
    let hidden = Array2::from_shape_simple_fn((n, H), || rng.normal() as T);
    let labels = (0..n)
        .map(|i| {
            if i % 10 == 9 {
                -100
            } else {
                rng.below(v as u64) as i64
            }
        })
        .collect();
    (head, hidden, labels)
}

/// Peak extra bytes and largest allocation of one forward + backward
/// (everything the pass allocates, gradients included, is live at the end).
fn peak_of_pass(n: usize, v: usize, naive: bool) -> (usize, usize) {
    let (head, hidden, labels) = setup(n, v);
    let labels = labels.into_dyn();
    let mut tape = Tape::new();
    let h = tape.input(hidden.into_dyn());
    let (peak, largest, loss) = measure(|| {
        let loss = if naive {
            head.forward_naive(&mut tape, h, labels.view())
        } else {
            head.forward(&mut tape, h, labels.view())
        }
        .unwrap();
        let total = tape.sum(loss);
        let grads = tape.backward(total);
        assert!(grads.input(h).is_some());
        assert!(head.parameters().iter().all(|p| grads.param(p).is_some()));
        tape.scalar(total)
    });
    assert!(loss.is_finite());
    (peak, largest)
}

/// What the fused pass may hold besides its workspace: the gradients it
/// returns (∂hidden (N, H), ∂W (V, H)) and may hold twice while adding,
/// and O(N) bookkeeping (labels, targets, log-sum-exps, losses: under 64
/// bytes a token), plus 1 MiB for the allocator's and the thread pools'
/// own small buffers.
fn allowance(n: usize, v: usize) -> usize {
    2 * (n * H + v * H) * SIZE + 64 * n + (1 << 20)
}

#[test]
fn fused_head_peak_memory_does_not_grow_with_n_times_v() {
    // Warm up thread pools and lazily initialised state.
    peak_of_pass(64, 512, false);
    peak_of_pass(64, 512, true);

    let ws = CHUNKS.workspace_bytes::<T>(H);
    let bound = |n: usize, v: usize| 4 * ws + allowance(n, v);
    let mut lines = Vec::new();
    for (n, v) in [(256, 4096), (2048, 32768)] {
        let (peak, largest) = peak_of_pass(n, v, false);
        let logits = n * v * SIZE;
        lines.push(format!(
            "fused N={n} V={v}: peak extra {peak} B, largest allocation {largest} B, \
             bound {} B, workspace {ws} B, N·V·size {logits} B",
            bound(n, v)
        ));
        assert!(
            peak <= bound(n, v),
            "fused pass at N={n}, V={v} peaked at {peak} B > {} B",
            bound(n, v)
        );
        // No single buffer of logits: the largest allocation is a weight
        // gradient (V, H), W packed for the tile kernel (V rounded up to
        // whole tiles, with its padding), or a workspace block, never N × V.
        let packed_w = v.div_ceil(16) * 16 * (H + 8) * SIZE;
        assert!(
            largest <= (v * H * SIZE).max(packed_w).max(ws),
            "largest allocation {largest} B at N={n}, V={v}"
        );
        if n == 2048 {
            // The large case's logits alone would be over 10× the bound.
            assert!(logits > 10 * bound(n, v), "{logits} vs {}", bound(n, v));
        }
    }
    // The naive head holds at least the N × V logits.
    for (n, v) in [(256, 4096), (1024, 8192)] {
        let (peak, largest) = peak_of_pass(n, v, true);
        lines.push(format!(
            "naive N={n} V={v}: peak extra {peak} B, largest allocation {largest} B, N·V·size {} B",
            n * v * SIZE
        ));
        assert!(peak >= n * v * SIZE, "naive pass at N={n}, V={v}: {peak} B");
    }
    println!("{}", lines.join("\n"));
}
