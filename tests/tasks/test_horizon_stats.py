"""The critic-horizon comparison's statistics (ppo_rlhf/tasks/horizon_stats.py) against references."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ppo_rlhf.tasks.horizon_stats import (
    crossover_horizon,
    mean_explained_variance,
    success_at_tokens,
    success_table,
    two_level_bootstrap,
    two_level_samples,
)


def reference_two_level(values: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """The two-level bootstrap written out draw by draw: seeds for every draw first, then, for each draw and each of
    its seeds in turn, that seed's problems."""
    rng = np.random.default_rng(seed)
    n_seeds, n_problems = values.shape
    seeds = rng.integers(0, n_seeds, size=(n_boot, n_seeds))
    problems = rng.integers(0, n_problems, size=(n_boot, n_seeds, n_problems))
    means = []
    for b in range(n_boot):
        cells = [values[seeds[b, i], problems[b, i, j]] for i in range(n_seeds) for j in range(n_problems)]
        means.append(sum(cells) / len(cells))
    return np.array(means)


def test_the_pooled_bootstrap_is_the_reference_computation_and_repeats_with_its_seed():
    values = np.random.default_rng(3).integers(0, 2, size=(3, 17)).astype(float)
    ours = two_level_samples(values, n_boot=1200, seed=7)  # more than one block of draws
    assert np.allclose(ours, reference_two_level(values, 1200, 7), rtol=0, atol=1e-12)
    assert two_level_bootstrap(values, 1200, 7) == two_level_bootstrap(values, 1200, 7)
    assert two_level_bootstrap(values, 1200, 7) != two_level_bootstrap(values, 1200, 8)


def test_the_two_level_interval_has_the_known_spread_of_seeds_and_problems():
    # 8 seeds whose runs differ (true means 0.3 .. 0.65) and 300 problems each: the bootstrap mean's variance is
    # var_between / S + mean(var_within) / (S P) (population variances: the bootstrap draws from the sample itself)
    rng = np.random.default_rng(0)
    means = np.linspace(0.3, 0.65, 8)
    values = (rng.random((8, 300)) < means[:, None]).astype(float)
    n_seeds, n_problems = values.shape
    expected_sd = math.sqrt(values.mean(1).var() / n_seeds + values.var(1).mean() / (n_seeds * n_problems))
    samples = two_level_samples(values, n_boot=20000, seed=1)
    assert samples.std() == pytest.approx(expected_sd, rel=0.03)
    interval = two_level_bootstrap(values, n_boot=20000, seed=1)
    assert interval["mean"] == pytest.approx(values.mean())
    assert interval["lo"] == pytest.approx(values.mean() - 1.96 * expected_sd, abs=0.15 * expected_sd)
    assert interval["hi"] == pytest.approx(values.mean() + 1.96 * expected_sd, abs=0.15 * expected_sd)
    # seeds alone (each run the same on every problem): the exact distribution of the mean of 3 draws from
    # {0.2, 0.5, 0.8}, whose 2.5% and 97.5% points are its ends (each has probability 1/27 > 2.5%)
    constant = np.repeat([[0.2], [0.5], [0.8]], 5, axis=1)
    assert two_level_bootstrap(constant, 4000, 2) == pytest.approx({"mean": 0.5, "lo": 0.2, "hi": 0.8})


def test_success_table_averages_each_problems_replies_per_model():
    records = [{"model": m, "prompt_index": p, "reply_index": r, "correct": c}
               for m, p, r, c in [("a", 0, 0, True), ("a", 0, 1, False), ("a", 1, 0, True), ("a", 1, 1, True),
                                  ("b", 1, 0, False), ("b", 1, 1, False), ("b", 0, 0, True), ("b", 0, 1, True),
                                  ("start", 0, 0, False)]]
    assert success_table(records, ["a", "b"]).tolist() == [[0.5, 1.0], [1.0, 0.0]]


def test_crossover_is_the_shortest_horizon_whose_interval_is_above_zero():
    rows = [{"horizon": 2, "ci95": [-5.0, 3.0]}, {"horizon": 8, "ci95": [1.0, 20.0]},
            {"horizon": 4, "ci95": [0.5, 9.0]}, {"horizon": 16, "ci95": [0.0, 9.0]}]
    assert crossover_horizon(rows) == 4
    assert crossover_horizon(rows[:1]) is None


def test_success_at_tokens_interpolates_the_curve():
    curve = [(0.0, 0.2), (1000.0, 0.4), (3000.0, 0.8)]
    assert success_at_tokens(curve, 2000.0) == pytest.approx(0.6)
    assert success_at_tokens(curve, 3000.0) == pytest.approx(0.8)


def test_mean_explained_variance_skips_iterations_without_one():
    histories = [[{"ev": 0.5}, {"ev": float("nan")}], [{"ev": -0.1}, {}]]
    assert mean_explained_variance(histories) == pytest.approx(0.2)
    assert mean_explained_variance([[{"ev": float("nan")}]]) is None
