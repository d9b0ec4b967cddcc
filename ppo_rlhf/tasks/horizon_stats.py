"""The numbers of the critic-horizon comparison (`ppo-rlhf compare --task NAME --horizons ...`), pure numpy.

A run's held-out success varies for two reasons: the training run (its seed: the prompts it drew, its samples) and the
problems it is scored on. An interval over problems alone (one run) says nothing about the next seed; one over seeds
alone (3 means) ignores that 200 problems are a sample too. `two_level_bootstrap` resamples both, the way the data
were made: draw S seeds with replacement from the S runs, then, within each drawn seed, P problems with replacement
from that run's P problems; the statistic is the mean over all S x P drawn cells. Its percentile interval covers the
mean success a new seed would reach on new problems of the same kind.

A difference between two variants is paired: every variant answers the same held-out problems, and seed k of each
variant trained with the same seed (the same prompts drawn), so the cells are (seed k, problem p) of variant A minus
the same cell of variant B, and the bootstrap resamples those differences.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

N_BOOT = 10000
BOOT_CHUNK = 500  # bootstrap draws per block: S x P x BOOT_CHUNK indices in memory at a time


def two_level_samples(values: np.ndarray, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """[n_boot] bootstrap means of `values` [S seeds, P problems]: first every draw's S seeds (rng.integers(0, S,
    (n_boot, S))), then its problems, S x P per draw (rng.integers(0, P, (n_boot, S, P)), drawn in blocks of
    BOOT_CHUNK draws: the same numbers as one call)."""
    values = np.asarray(values, dtype=float)
    assert values.ndim == 2 and values.size > 0, f"values must be [seeds, problems], got shape {values.shape}"
    n_seeds, n_problems = values.shape
    rng = np.random.default_rng(seed)
    seeds = rng.integers(0, n_seeds, size=(n_boot, n_seeds))
    means = np.empty(n_boot)
    for start in range(0, n_boot, BOOT_CHUNK):
        block = seeds[start:start + BOOT_CHUNK]
        problems = rng.integers(0, n_problems, size=(len(block), n_seeds, n_problems))
        means[start:start + len(block)] = values[block[:, :, None], problems].mean(axis=(1, 2))
    return means


def two_level_bootstrap(values: np.ndarray, n_boot: int = N_BOOT, seed: int = 0) -> dict[str, float]:
    """{"mean", "lo", "hi"}: the mean of `values` [S, P] and its 95% percentile interval over seeds and problems."""
    samples = two_level_samples(values, n_boot, seed)
    lo, hi = np.percentile(samples, [2.5, 97.5])
    return {"mean": float(np.mean(values)), "lo": float(lo), "hi": float(hi)}


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
