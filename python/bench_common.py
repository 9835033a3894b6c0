"""What the benchmark scripts beside this file share: the workloads' ids
(docs/spec.md §5), so that each draws the same batches, and the timing of
a step. numpy and the standard library only."""

import time

import numpy as np


def zipf(rng, n, size, s=1.2):
    """k in 0..n with P(k) ∝ (k + 1)^−s."""
    w = np.arange(1, n + 1, dtype=np.float64) ** -s
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, rng.random(size)), n - 1).astype(np.int64)


def timed(step, k):
    """The seconds of each of ``k`` calls of ``step``."""
    out = []
    for _ in range(k):
        t = time.perf_counter()
        step()
        out.append(time.perf_counter() - t)
    return out
