"""Small statistics for evaluation: cluster bootstrap intervals, distinct-n, correlation, standardisation.

numpy (and scipy.special for one quantile, imported when used), so these functions are cheap to import and easy to test.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def bootstrap_mean(
    values: Sequence[float] | np.ndarray,
    clusters: Sequence[int] | None = None,
    n_boot: int = 10000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Mean of `values` and its expanded percentile bootstrap interval at `level`: (mean, lo, hi).

    `clusters[k]` names the group value k belongs to (the prompt of a reply). Values of one group share the
    group's effect, so they are not independent draws: resampling them one by one treats 40 prompts x 2 replies
    as 80 independent values and gives too narrow an interval. The cluster bootstrap resamples whole groups
    instead, every value of a drawn group together. Without `clusters` every value is its own group.

    With few groups the plain percentile interval is too narrow (the bootstrap spread of a mean is sd/sqrt(n)
    with the (n-1)/n variance, and a normal rather than a t quantile): 40 prompts give about 93.7% coverage for
    a nominal 95%. The expanded percentile interval (Hesterberg 2015, "What teachers should know about the
    bootstrap") takes the quantiles at the wider level whose normal quantile is sqrt(n/(n-1)) * t_{n-1}.

    All resamples are drawn at once as an [n_boot, groups] index matrix into per-group sums and counts, so
    10,000 resamples of a few hundred values take milliseconds.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError("bootstrap_mean needs a non-empty 1-d sequence")
    if clusters is None:
        group = np.arange(x.size)
    else:
        labels = np.asarray(clusters)
        if labels.shape != x.shape:
            raise ValueError(f"bootstrap_mean needs one cluster per value, got {labels.shape} for {x.shape}")
        group = np.unique(labels, return_inverse=True)[1]
    sums, counts = np.bincount(group, weights=x), np.bincount(group)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, sums.size, size=(n_boot, sums.size))
    # groups may differ in size: a resample's mean is its values' total over its values' count
    means = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    tail = (1.0 - expanded_level(level, sums.size)) / 2.0
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    return float(x.mean()), float(lo), float(hi)


def expanded_level(level: float, n: int) -> float:
    """The level whose normal quantile is sqrt(n / (n - 1)) times the t quantile of `level` with n - 1 degrees
    of freedom; `level` itself for n < 2 (one group: every resample is the sample, the interval has no width)."""
    if n < 2:
        return level
    # lazy: scipy is slow to import, and the commands that import stats answer --help before it is needed
    from scipy.special import ndtr, stdtrit

    z = np.sqrt(n / (n - 1)) * stdtrit(n - 1, (1.0 + level) / 2.0)
    return float(2.0 * ndtr(z) - 1.0)


def paired_bootstrap(
    diffs: Sequence[float] | np.ndarray,
    clusters: Sequence[int] | None = None,
    n_boot: int = 10000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Mean paired difference with its percentile bootstrap interval: (mean, lo, hi).

    `diffs[k]` is one pair's difference (model reply k minus the start model's reply k), `clusters[k]` its
    prompt. Resampling pairs, not the two sides separately, keeps the shared prompt difficulty out of the
    interval; resampling prompts, not pairs, keeps in it how differently the model changed on each prompt.
    """
    return bootstrap_mean(diffs, clusters, n_boot=n_boot, level=level, seed=seed)


def pooled_bootstrap(
    values: np.ndarray,
    n_boot: int = 10000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Mean of `values[s, p, r]` (seed s, prompt p, reply r: one paired change each) and its 95% interval pooled over
    prompts and seeds: (mean, lo, hi).

    Every seed's checkpoint answers the same held-out prompts, so the two sources of uncertainty are crossed, not
    nested: a prompt's effect is shared by every seed, and a seed's (a training run's luck) by every prompt. Each
    resample therefore draws the prompts with replacement once, jointly for all seeds (a drawn prompt brings every
    seed's replies to it), and the seeds with replacement independently of the prompts, and takes the mean of the
    drawn cells (Owen 2007's pigeonhole bootstrap). Its variance slightly exceeds the true one (it counts the
    seed x prompt interaction twice): a conservative interval, which is the safer error for a claim that gold moved.
    Averaging the seeds per prompt and resampling prompts alone would leave the seed-to-seed spread out of the
    interval; resampling seeds alone, with 3 of them, would leave 10 distinct resamples.

    The quantiles are taken at the expanded level of `bootstrap_mean` for the number of prompts. With one seed every
    seed draw is that seed, and the prompt draws are the ones `bootstrap_mean` makes with the same `seed`: the
    interval is the prompt-clustered one of `paired_bootstrap` (to float rounding).
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 3 or 0 in x.shape:
        raise ValueError(f"pooled_bootstrap needs a non-empty [seeds, prompts, replies] array, got shape {x.shape}")
    seeds, prompts = x.shape[:2]
    sums = x.sum(axis=2)  # [seeds, prompts]; every cell holds the same number of replies
    rng = np.random.default_rng(seed)
    prompt_draws = rng.integers(0, prompts, size=(n_boot, prompts))  # drawn first: bootstrap_mean's draws
    seed_draws = rng.integers(0, seeds, size=(n_boot, seeds))
    # how often each prompt and each seed is drawn per resample: the resample's total is w_seed . sums . w_prompt
    prompt_weights = np.zeros((n_boot, prompts))
    np.add.at(prompt_weights, (np.arange(n_boot)[:, None], prompt_draws), 1.0)
    seed_weights = np.zeros((n_boot, seeds))
    np.add.at(seed_weights, (np.arange(n_boot)[:, None], seed_draws), 1.0)
    means = np.einsum("bs,sp,bp->b", seed_weights, sums, prompt_weights) / (seeds * prompts * x.shape[2])
    tail = (1.0 - expanded_level(level, prompts)) / 2.0
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    return float(x.mean()), float(lo), float(hi)


def unit_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean of one number per independent unit (a pool of prompts and pairs, a training seed) and its Student-t
    interval over the units: (mean, lo, hi), the bounds nan with fewer than two units. With a handful of units a
    bootstrap over them has few distinct resamples (10 for 3) and too narrow an interval; t with n - 1 degrees of
    freedom is the honest width for so few."""
    from scipy import stats as scipy_stats  # lazy: the study extra

    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("unit_interval needs at least one value")
    mean = float(x.mean())
    if x.size < 2:
        return mean, float("nan"), float("nan")
    half = float(scipy_stats.t.ppf(0.5 + level / 2, x.size - 1)) * float(x.std(ddof=1)) / np.sqrt(x.size)
    return mean, mean - half, mean + half


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
