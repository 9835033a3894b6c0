"""The ids of the benchmark workloads (docs/spec.md §5), shared by the
benchmark scripts beside this file, so that each draws the same batches."""

import numpy as np


def zipf(rng, n, size, s=1.2):
    """k in 0..n with P(k) ∝ (k + 1)^−s."""
    w = np.arange(1, n + 1, dtype=np.float64) ** -s
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, rng.random(size)), n - 1).astype(np.int64)
