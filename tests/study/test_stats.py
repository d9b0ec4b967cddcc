import math

import numpy as np
import pytest

from ppo_rlhf.study.stats import (
    bootstrap_mean,
    distinct_n,
    expanded_level,
    paired_bootstrap,
    pearson,
    pooled_bootstrap,
    standardize,
)


def test_bootstrap_interval_matches_normal_theory():
    rng = np.random.default_rng(7)
    diffs = rng.normal(0.3, 2.0, size=2000)
    mean, lo, hi = paired_bootstrap(diffs, n_boot=4000, seed=1)
    half = 1.96 * diffs.std(ddof=1) / math.sqrt(diffs.size)
    assert mean == pytest.approx(diffs.mean())
    assert lo == pytest.approx(mean - half, abs=0.15 * half)
    assert hi == pytest.approx(mean + half, abs=0.15 * half)


def test_bootstrap_constant_differences_have_zero_width():
    assert paired_bootstrap([0.25] * 30) == pytest.approx((0.25, 0.25, 0.25))
    assert paired_bootstrap([0.0] * 5) == (0.0, 0.0, 0.0)


def test_bootstrap_reproducible_with_seed():
    x = np.random.default_rng(0).normal(size=50)
    assert bootstrap_mean(x, seed=3) == bootstrap_mean(x, seed=3)
    assert bootstrap_mean(x, seed=3) != bootstrap_mean(x, seed=4)


def test_bootstrap_rejects_empty():
    with pytest.raises(ValueError):
        paired_bootstrap([])


def coverage(n_sets: int, clustered: bool, prompts: int = 40, replies: int = 2, seed: int = 0) -> float:
    """Share of `n_sets` simulated evaluations whose 95% interval holds the true mean change.

    Every reply's change is the true mean + its prompt's effect (sd 1, shared by the prompt's replies) + the
    reply's own noise (sd 0.5): how a checkpoint that improved some prompts more than others looks.
    """
    true_mean = 0.3
    rng = np.random.default_rng(seed)
    prompt_effect = np.repeat(rng.normal(0.0, 1.0, size=(n_sets, prompts)), replies, axis=1)
    data = true_mean + prompt_effect + rng.normal(0.0, 0.5, size=(n_sets, prompts * replies))
    clusters = np.repeat(np.arange(prompts), replies) if clustered else None
    hits = 0
    for k, diffs in enumerate(data):
        _, lo, hi = paired_bootstrap(diffs, clusters, n_boot=1000, seed=k)
        hits += lo <= true_mean <= hi
    return hits / n_sets


def test_cluster_bootstrap_covers_at_nominal_rate_where_reply_bootstrap_does_not():
    clustered, per_reply = coverage(1000, clustered=True), coverage(1000, clustered=False)
    print(f"95% interval coverage, 40 prompts x 2 replies, 1000 data sets: prompts resampled {clustered:.3f}, "
          f"replies resampled {per_reply:.3f}")
    assert clustered >= 0.93
    assert per_reply < 0.90  # the reply-level bootstrap evaluate used before: the test sees the defect


def test_cluster_bootstrap_resamples_whole_groups():
    # two groups of very different size: every resample's mean is a ratio of drawn totals over drawn counts
    values = [1.0, 1.0, 1.0, 5.0]
    mean, lo, hi = bootstrap_mean(values, clusters=[7, 7, 7, 3], n_boot=2000)
    assert mean == 2.0
    assert lo == pytest.approx(1.0) and hi == pytest.approx(5.0)  # all of group 7, or all of group 3
    # each value its own group is the reply-level bootstrap
    x = np.random.default_rng(2).normal(size=30)
    assert bootstrap_mean(x, clusters=range(30), seed=5) == pytest.approx(bootstrap_mean(x, seed=5))
    # one group: every resample is the whole sample
    assert bootstrap_mean([0.0, 2.0], clusters=[1, 1]) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="one cluster per value"):
        bootstrap_mean([1.0, 2.0], clusters=[0])


def test_expanded_level_is_wider_for_few_groups():
    assert expanded_level(0.95, 40) > expanded_level(0.95, 400) > 0.95
    assert expanded_level(0.95, 10**6) == pytest.approx(0.95, abs=1e-4)
    assert expanded_level(0.95, 1) == 0.95


def test_distinct_2_exact():
    assert distinct_n(["a b c d"]) == 1.0  # ab bc cd
    assert distinct_n(["a b a b"]) == pytest.approx(2 / 3)  # ab ba ab
    assert distinct_n(["a b", "a b", "b c"]) == pytest.approx(2 / 3)  # pooled over replies
    assert distinct_n(["the cat sat"], n=1) == 1.0
    assert math.isnan(distinct_n(["one", ""]))


def test_pearson_matches_numpy():
    rng = np.random.default_rng(1)
    x = rng.normal(size=40)
    y = 0.5 * x + rng.normal(size=40)
    assert pearson(x, y) == pytest.approx(np.corrcoef(x, y)[0, 1])


def test_pearson_ignores_nan_and_constant_is_nan():
    assert pearson([1, 2, float("nan"), 4], [2, 4, 5, 8]) == pytest.approx(1.0)
    assert math.isnan(pearson([0.1] * 7, range(7)))
    assert math.isnan(pearson([1.0], [2.0]))


def test_standardize():
    assert standardize([1.0, 3.0], 2.0, 0.5).tolist() == [-2.0, 2.0]
    assert standardize([1.0, 3.0], 1.0, 0.0).tolist() == [0.0, 2.0]


def reference_pooled(values: np.ndarray, n_boot: int, seed: int, level: float = 0.95) -> tuple[float, float, float]:
    """The pooled bootstrap written out resample by resample: the same draws (prompts first, then seeds), the drawn
    replies gathered one by one and averaged."""
    seeds, prompts, _ = values.shape
    rng = np.random.default_rng(seed)
    prompt_draws = rng.integers(0, prompts, size=(n_boot, prompts))
    seed_draws = rng.integers(0, seeds, size=(n_boot, seeds))
    means = []
    for b in range(n_boot):
        drawn = [reply for s in seed_draws[b] for p in prompt_draws[b] for reply in values[s, p]]
        means.append(sum(drawn) / len(drawn))
    tail = (1 - expanded_level(level, prompts)) / 2
    lo, hi = np.quantile(means, [tail, 1 - tail])
    return float(values.mean()), float(lo), float(hi)


def test_pooled_bootstrap_matches_the_reference_resample_by_resample():
    rng = np.random.default_rng(5)
    # 3 seeds x 12 prompts x 2 replies: a seed effect, a prompt effect shared by the seeds, reply noise
    values = (rng.normal(0, 0.5, size=(3, 1, 1)) + rng.normal(0, 1, size=(1, 12, 1))
              + rng.normal(0.2, 0.3, size=(3, 12, 2)))
    assert pooled_bootstrap(values, n_boot=500, seed=2) == pytest.approx(reference_pooled(values, 500, 2), rel=1e-12)


def test_pooled_bootstrap_with_one_seed_is_the_prompt_clustered_interval():
    values = np.random.default_rng(1).normal(0.1, 1.0, size=(1, 30, 2))
    clusters = np.repeat(np.arange(30), 2)
    assert pooled_bootstrap(values, n_boot=2000, seed=4) == pytest.approx(
        paired_bootstrap(values.ravel(), clusters, n_boot=2000, seed=4), rel=1e-12)


def test_pooled_bootstrap_counts_the_spread_between_seeds():
    """Seeds that disagree as a whole (one run moved gold, another did not) widen the interval beyond what averaging
    the seeds per prompt and resampling prompts gives: the run-to-run spread is part of the uncertainty."""
    rng = np.random.default_rng(0)
    prompt_effect = rng.normal(0, 0.3, size=(1, 100, 1))
    values = np.array([0.0, 0.5, 1.0]).reshape(3, 1, 1) + prompt_effect + rng.normal(0, 0.1, size=(3, 100, 2))
    mean, lo, hi = pooled_bootstrap(values, seed=0)
    per_prompt = values.mean(axis=(0, 2))
    _, prompt_lo, prompt_hi = paired_bootstrap(per_prompt, seed=0)
    assert mean == pytest.approx(values.mean())
    assert hi - lo > 3 * (prompt_hi - prompt_lo)
    with pytest.raises(ValueError, match="seeds, prompts, replies"):
        pooled_bootstrap(np.zeros((2, 3)))


def test_the_unit_interval_is_students_t_over_the_units():
    """Three pools' differences 0.22, 0.04, -0.03: mean 0.0767, sd 0.1290, t(0.975, 2) = 4.3027, so the half width is
    4.3027 x 0.1290 / sqrt(3) = 0.3205 (computed by hand from the formula)."""
    from ppo_rlhf.study.stats import unit_interval

    mean, lo, hi = unit_interval([0.22, 0.04, -0.03])
    sd = (sum((v - 0.23 / 3) ** 2 for v in (0.22, 0.04, -0.03)) / 2) ** 0.5
    half = 4.302652729911275 * sd / 3 ** 0.5
    assert mean == pytest.approx(0.23 / 3)
    assert lo == pytest.approx(0.23 / 3 - half) and hi == pytest.approx(0.23 / 3 + half)
    assert half == pytest.approx(0.3205, abs=1e-3)
    one = unit_interval([0.1])
    assert one[0] == 0.1 and all(b != b for b in one[1:])  # one unit: no interval
