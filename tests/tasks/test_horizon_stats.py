"""The critic-horizon comparison's statistics (ppo_rlhf/tasks/horizon_stats.py) against references."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ppo_rlhf.study.stats import pooled_bootstrap
from ppo_rlhf.tasks.horizon_stats import (
    crossover_horizon,
    mean_explained_variance,
    seed_problem_interval,
    success_at_tokens,
    success_table,
)


def test_the_interval_is_the_studys_pooled_bootstrap_over_seeds_and_problems():
    values = np.random.default_rng(3).integers(0, 2, size=(3, 17)).astype(float)
    mean, lo, hi = pooled_bootstrap(values[:, :, None], n_boot=1200, seed=7)
    assert seed_problem_interval(values, 1200, 7) == {"mean": mean, "lo": lo, "hi": hi}
    assert seed_problem_interval(values, 1200, 7) != seed_problem_interval(values, 1200, 8)


def test_a_problem_shared_by_every_seed_counts_once_not_once_per_seed():
    # 3 seeds that agree on every problem (a problem is easy or hard for all of them): the seeds add nothing, so the
    # interval is the one of 200 problems answered once, about 2 x 1.96 x sd(problems) / sqrt(200) wide. Drawing
    # problems within each seed separately would shrink it by sqrt(3) (as if 600 problems had been answered).
    rng = np.random.default_rng(0)
    one_seed = (rng.random(200) < 0.5).astype(float)
    values = np.repeat(one_seed[None, :], 3, axis=0)
    interval = seed_problem_interval(values, 20000, 1)
    expected_width = 2 * 1.96 * one_seed.std() / math.sqrt(200)
    assert interval["hi"] - interval["lo"] == pytest.approx(expected_width, rel=0.12)
    # seeds alone (each run the same on every problem): means of 3 draws from {0.2, 0.5, 0.8}; the interval's ends
    # are the extremes, each drawn with probability 1/27 > 2.5%
    constant = np.repeat([[0.2], [0.5], [0.8]], 5, axis=1)
    assert seed_problem_interval(constant, 4000, 2) == pytest.approx({"mean": 0.5, "lo": 0.2, "hi": 0.8})


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
