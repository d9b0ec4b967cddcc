"""The numbers of the critic-horizon comparison (`ppo-rlhf compare --task NAME --horizons ...`), pure numpy.

A run's held-out success varies for two reasons: the training run (its seed: the prompts it drew, its samples) and the
problems it is scored on. An interval over problems alone (one run) says nothing about the next seed; one over seeds
alone (3 means) ignores that 200 problems are a sample too. Every run of a horizon answers the same held-out problems,
so the two are crossed, not nested: `seed_problem_interval` is the study's `pooled_bootstrap` (one method in the
project for every interval over seeds and problems): each draw takes the problems with replacement once for all seeds
and the seeds with replacement independently. Resampling problems within each seed separately would treat a hard
problem as hard for one seed only and narrow the interval.

A difference between two variants is paired: every variant answers the same held-out problems, and seed k of each
variant trained with the same seed (the same prompts drawn), so the cells are (seed k, problem p) of variant A minus
the same cell of variant B, and the bootstrap resamples those differences.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ppo_rlhf.study.stats import pooled_bootstrap

N_BOOT = 10000


def seed_problem_interval(values: np.ndarray, n_boot: int = N_BOOT, seed: int = 0) -> dict[str, float]:
    """{"mean", "lo", "hi"}: the mean of `values` [S seeds, P problems] (each cell a problem's success, its replies
    averaged) and its 95% interval over seeds and problems, crossed (`study.stats.pooled_bootstrap`)."""
    values = np.asarray(values, dtype=float)
    assert values.ndim == 2 and values.size > 0, f"values must be [seeds, problems], got shape {values.shape}"
    mean, lo, hi = pooled_bootstrap(values[:, :, None], n_boot=n_boot, seed=seed)
    return {"mean": mean, "lo": lo, "hi": hi}


def success_table(records: Iterable[dict[str, Any]], models: Sequence[str]) -> np.ndarray:
    """[len(models), P]: each model's exact-match share per held-out problem (its replies averaged), from
    `task_eval.json`'s records (model, prompt_index, reply_index, correct); every model must have answered the same
    problems."""
    by_model: dict[str, dict[int, list[float]]] = {model: {} for model in models}
    for record in records:
        if record["model"] in by_model:
            by_model[record["model"]].setdefault(int(record["prompt_index"]), []).append(float(record["correct"]))
    problems = sorted(by_model[models[0]])
    for model in models:
        assert sorted(by_model[model]) == problems, f"{model} answered other problems than {models[0]}"
    return np.array([[np.mean(by_model[model][p]) for p in problems] for model in models])


def crossover_horizon(differences: Sequence[dict[str, Any]]) -> int | None:
    """The shortest horizon whose best-critic-minus-best-free difference has its 95% interval above 0, else None."""
    ahead = [row["horizon"] for row in differences if row["ci95"][0] > 0]
    return min(ahead) if ahead else None


def success_at_tokens(curve: Sequence[tuple[float, float]], tokens: float) -> float:
    """Held-out success at `tokens` sampled tokens, linearly between the evaluated points (tokens, success) of a run's
    curve (the start at 0 tokens first); the budget must lie within the curve."""
    xs, ys = zip(*sorted(curve))
    assert xs[0] <= tokens <= xs[-1] * (1 + 1e-9), f"{tokens} tokens is outside the curve ({xs[0]}..{xs[-1]})"
    return float(np.interp(tokens, xs, ys))


def mean_explained_variance(histories: Iterable[Sequence[dict[str, Any]]]) -> float | None:
    """The critic's explained variance averaged over every iteration of the given runs' histories (history.jsonl's
    `ev`); None when no iteration has one (critic-free runs, or returns that never varied)."""
    values = [float(row["ev"]) for history in histories for row in history
              if row.get("ev") is not None and math.isfinite(float(row["ev"]))]
    return float(np.mean(values)) if values else None
