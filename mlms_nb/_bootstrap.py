"""The bootstrap of the median, written once (bottom layer: the evaluation's statistics and the pure analyses
both use it).

Each bootstrap resample draws ``n`` indices with replacement; its median only depends on the order statistics
of those indices. With the samples sorted, the k-th smallest of ``n`` uniform indices is ``floor(n * U_(k))``
where ``U_(k) ~ Beta(k, n - k + 1)``; for even ``n`` the median is the mean of the k-th and (k+1)-th, and the
(k+1)-th given the k-th is ``U_(k) + (1 - U_(k)) * Beta(1, n - k)``. Drawing those directly has the distribution
of resampling the whole array, in O(resamples) instead of O(resamples * n) time and memory, which matters for
loops of 100 000 calls (``scipy.stats.bootstrap`` costs O(n * resamples)).
"""
from __future__ import annotations

import numpy as np

RESAMPLES = 2000
CI_LEVEL = 0.95


def bootstrap_medians(samples, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """The medians of ``resamples`` bootstrap resamples of ``samples`` (any unit; at least one value)."""
    x = np.sort(np.asarray(samples, dtype=np.float64).reshape(-1))
    n = x.size
    if n == 0:
        raise ValueError("no samples to bootstrap")
    if n % 2:  # odd: the median is the k-th order statistic, k = (n + 1) / 2
        k = (n + 1) // 2
        u = rng.beta(k, n - k + 1, size=resamples)
        return x[np.minimum((u * n).astype(np.int64), n - 1)]
    k = n // 2  # even: the mean of the k-th and (k+1)-th order statistics
    u1 = rng.beta(k, n - k + 1, size=resamples)
    u2 = u1 + (1.0 - u1) * rng.beta(1, n - k, size=resamples)
    i1 = np.minimum((u1 * n).astype(np.int64), n - 1)
    i2 = np.minimum((u2 * n).astype(np.int64), n - 1)
    return 0.5 * (x[i1] + x[i2])


def median_ci(samples, resamples: int = RESAMPLES, level: float = CI_LEVEL, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the median, in the samples' unit; seeded, so the same
    samples and seed give the same interval. One sample gives ``(x, x)``."""
    x = np.asarray(samples, dtype=np.float64).reshape(-1)
    if x.size == 1:
        return float(x[0]), float(x[0])
    medians = bootstrap_medians(x, resamples, np.random.default_rng(seed))
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(medians, [alpha, 1.0 - alpha])
    return float(low), float(high)
