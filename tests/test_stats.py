import math

import numpy as np
import pytest

from ppo_rlhf.stats import bootstrap_mean, distinct_n, paired_bootstrap, pearson, standardize


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
