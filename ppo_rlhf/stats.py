"""Small statistics for evaluation: bootstrap intervals, distinct-n, correlation, standardisation.

numpy only, so these functions are cheap to import and easy to test.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def bootstrap_mean(
    values: Sequence[float], n_boot: int = 10000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """Mean of `values` and its percentile bootstrap interval at `level`: (mean, lo, hi).

    All resamples are drawn at once as an [n_boot, n] index matrix, so 10,000 resamples of a few hundred
    values take milliseconds.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError("bootstrap_mean needs a non-empty 1-d sequence")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    return float(x.mean()), float(lo), float(hi)


def paired_bootstrap(
    diffs: Sequence[float], n_boot: int = 10000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """Mean paired difference with its percentile bootstrap interval: (mean, lo, hi).

    `diffs[k]` is one pair's difference (model reply k minus the start model's reply k). Resampling pairs,
    not the two sides separately, keeps the shared prompt difficulty out of the interval.
    """
    return bootstrap_mean(diffs, n_boot=n_boot, level=level, seed=seed)


def distinct_n(texts: Sequence[str], n: int = 2) -> float:
    """Unique n-grams over total n-grams, pooled over all texts (whitespace tokens); nan when there are none.

    Pooling over replies is what makes it measure collapse: a policy that repeats the same phrase in every
    reply scores low even if each reply on its own is varied.
    """
    grams: list[tuple[str, ...]] = []
    for text in texts:
        words = text.split()
        grams.extend(tuple(words[i : i + n]) for i in range(len(words) - n + 1))
    return len(set(grams)) / len(grams) if grams else float("nan")


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation over the pairs where both values are finite; nan if fewer than 2 or one is constant."""
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"pearson needs equal lengths, got {a.shape} and {b.shape}")
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    # compare extremes rather than the centred sum of squares, which rounding can leave a hair above zero
    if a.size < 2 or a.min() == a.max() or b.min() == b.max():
        return float("nan")
    a = a - a.mean()
    b = b - b.mean()
    return float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum()))


def standardize(scores: Sequence[float], mean: float, std: float) -> np.ndarray:
    """(scores - mean) / std; a zero or non-finite std (all reference scores equal) leaves the scale at 1."""
    scale = std if np.isfinite(std) and std > 0 else 1.0
    return (np.asarray(scores, dtype=np.float64) - mean) / scale
