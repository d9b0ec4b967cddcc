"""The over-optimisation turn of Gao et al. (2022): the fit of gold against distance, its predicted peak, and the fall.

Gao et al. found that, optimised by RL against a proxy reward model, the gold reward follows

    R(d) = d (alpha - beta log d),        d = sqrt(KL(policy || start policy))

(their R_RL, with R(0) = 0: the change from the start policy). The model is linear in (alpha, beta), so least squares
on the columns d and -d log d fits it exactly, no iteration. With beta > 0 it rises, peaks where dR/dd = alpha -
beta (log d + 1) = 0, i.e. at d* = exp(alpha / beta - 1) (KL* = d*^2, R(d*) = beta d*), and falls; with beta <= 0 it
never turns, and then, or when the peak lies beyond the range the runs cover, the honest prediction is "no turn
within X nats" rather than a number extrapolated from a curve that has not bent.

Uncertainty comes from the held-out prompts: every checkpoint answers the same prompts, so a bootstrap resample
draws prompts (with replacement, every checkpoint's replies to a drawn prompt together) and recomputes each
checkpoint's mean KL and mean gold change from them, then the fit and its peak.

The fall is gold at a later checkpoint minus gold at the peak. The peak is the checkpoint with the highest mean gold
change, chosen on the very data the fall is measured on, so each resample chooses it again (the bootstrap of the
whole procedure): a fixed peak would carry into the interval none of the luck that made it the highest. Pure numpy,
tested on synthetic curves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ppo_rlhf.study.stats import expanded_level


@dataclass(frozen=True)
class GaoFit:
    """R(d) = d (alpha - beta log d) fitted to `points` (KL, gold change) pairs."""

    alpha: float
    beta: float
    points: int

    def gold(self, kl: float | np.ndarray) -> float | np.ndarray:
        """The fitted gold change at KL `kl` (0 at 0)."""
        d = np.sqrt(np.asarray(kl, dtype=np.float64))
        with np.errstate(divide="ignore", invalid="ignore"):
            value = np.where(d > 0, d * (self.alpha - self.beta * np.log(np.where(d > 0, d, 1.0))), 0.0)
        return float(value) if value.ndim == 0 else value

    @property
    def peak_d(self) -> float:
        """d* = exp(alpha / beta - 1) when beta > 0, else inf (the curve never turns)."""
        if self.beta <= 0:
            return math.inf
        exponent = self.alpha / self.beta - 1.0
        return math.exp(exponent) if exponent < 700 else math.inf  # (beyond any KL, and exp would overflow)

    @property
    def peak_kl(self) -> float:
        """KL* = d*^2 (inf: no turn)."""
        return self.peak_d**2

    @property
    def peak_gold(self) -> float:
        """R(d*) = beta d* (inf with no turn: the curve rises for ever)."""
        return self.beta * self.peak_d if math.isfinite(self.peak_d) else math.inf


def fit_gao(kls: np.ndarray | list[float], gold: np.ndarray | list[float]) -> GaoFit:
    """Least squares of gold = alpha d - beta d log d over the points with KL > 0 (d = sqrt(KL); a point at KL 0
    says nothing: the model is 0 there). Needs two such points at different KLs."""
    kl = np.asarray(kls, dtype=np.float64)
    y = np.asarray(gold, dtype=np.float64)
    if kl.shape != y.shape or kl.ndim != 1:
        raise ValueError(f"fit_gao needs one gold change per KL, got shapes {kl.shape} and {y.shape}")
    keep = np.isfinite(kl) & np.isfinite(y) & (kl > 0)
    d = np.sqrt(kl[keep])
    if np.unique(d).size < 2:
        raise ValueError(f"fit_gao needs points at two different KLs above 0, got {np.unique(d).size}")
    design = np.column_stack([d, -d * np.log(d)])
    (alpha, beta), *_ = np.linalg.lstsq(design, y[keep], rcond=None)
    return GaoFit(float(alpha), float(beta), int(keep.sum()))


def turn_words(fit: GaoFit, within_kl: float) -> str:
    """The prediction in words: the peak's KL, or "no turn predicted within X nats" (beta <= 0, or a peak beyond)."""
    if fit.peak_kl > within_kl:
        why = "beta <= 0: the fitted curve never turns" if fit.beta <= 0 else \
            f"the fitted peak lies at {fit.peak_kl:.3g} nats"
        return f"no turn predicted within {within_kl:g} nats ({why})"
    return f"gold peaks at KL {fit.peak_kl:.2f} nats (d = {fit.peak_d:.2f}), {fit.peak_gold:+.3f} above the start"


def prompt_draws(prompts: int, n_boot: int, seed: int) -> np.ndarray:
    """[n_boot, prompts] indices of resampled prompts (the draws `stats.bootstrap_mean` makes with this seed)."""
    return np.random.default_rng(seed).integers(0, prompts, size=(n_boot, prompts))


def _resampled_means(values: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """[n_boot, checkpoints] means of `values[checkpoint, prompt, reply]` over each resample's drawn prompts."""
    per_prompt = values.mean(axis=2)  # [checkpoints, prompts]; every prompt has the same number of replies
    n_boot, prompts = draws.shape
    counts = np.zeros((n_boot, prompts))  # how often each prompt is drawn per resample
    np.add.at(counts, (np.arange(n_boot)[:, None], draws), 1.0)
    return counts @ per_prompt.T / prompts


def _quantiles(samples: np.ndarray, level: float, prompts: int,
               method: Literal["linear", "inverted_cdf"] = "linear") -> tuple[float, float]:
    """The percentile interval at `bootstrap_mean`'s expanded level for this many prompts."""
    tail = (1.0 - expanded_level(level, prompts)) / 2.0
    lo, hi = np.quantile(samples, [tail, 1.0 - tail], method=method)
    return float(lo), float(hi)


def check_shapes(kls: np.ndarray, gold: np.ndarray) -> None:
    if kls.shape != gold.shape or kls.ndim != 3 or 0 in kls.shape:
        raise ValueError(f"need equal non-empty [checkpoints, prompts, replies] arrays, got {kls.shape} and "
                         f"{gold.shape}")


def predict_peak(kls: np.ndarray, gold: np.ndarray, within_kl: float, n_boot: int = 2000, level: float = 0.95,
                 seed: int = 0) -> dict:
    """The fit to each checkpoint's mean KL and mean gold change, and its peak with a bootstrap interval.

    `kls[c, p, r]`, `gold[c, p, r]`: checkpoint c's reply r to held-out prompt p, its KL to the start model and its
    gold change against the start model's reply r to p. Each resample draws prompts (every checkpoint's together),
    fits again and takes the peak's KL (inf where the resample's curve does not turn). Returns {"alpha", "beta",
    "points", "peak_kl" (None: no turn within `within_kl`), "peak_d", "peak_gold", "fitted_peak_kl" (the peak
    wherever it lies; None with beta <= 0), "within_kl", "words", "peak_kl_ci95": [lo, hi] (a bound is None where
    the resamples' quantile lies beyond within_kl or has no turn), "turn_share" (resamples whose peak lies within
    within_kl), "resampled": "prompts", "n_boot"}."""
    kls, gold = np.asarray(kls, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    check_shapes(kls, gold)
    fit = fit_gao(kls.mean(axis=(1, 2)), gold.mean(axis=(1, 2)))
    draws = prompt_draws(kls.shape[1], n_boot, seed)
    kl_means, gold_means = _resampled_means(kls, draws), _resampled_means(gold, draws)
    peaks = np.empty(n_boot)
    for b in range(n_boot):
        try:
            peaks[b] = fit_gao(kl_means[b], gold_means[b]).peak_kl
        except ValueError:  # every drawn KL equal: no curve to fit, no turn seen
            peaks[b] = math.inf
    # a quantile that is one of the resamples' peaks: no interpolation between a peak and a resample without one
    lo, hi = _quantiles(peaks, level, kls.shape[1], method="inverted_cdf")
    within = fit.peak_kl <= within_kl
    return {
        "alpha": fit.alpha, "beta": fit.beta, "points": fit.points,
        "peak_kl": fit.peak_kl if within else None,
        "peak_d": fit.peak_d if within else None,
        "peak_gold": fit.peak_gold if within else None,
        "fitted_peak_kl": fit.peak_kl if math.isfinite(fit.peak_kl) else None,
        "within_kl": within_kl,
        "words": turn_words(fit, within_kl),
        "peak_kl_ci95": [bound if bound <= within_kl else None for bound in (lo, hi)],
        "turn_share": float(np.mean(peaks <= within_kl)),
        "resampled": "prompts",
        "n_boot": n_boot,
    }


def fall(gold: np.ndarray, kls: list[float] | np.ndarray, max_kl: float, n_boot: int = 10000, level: float = 0.95,
         seed: int = 0) -> dict:
    """Gold at the later checkpoint minus gold at the peak, with its bootstrap interval (prompts resampled).

    `gold[c, p, r]`: checkpoint c's gold change on reply r of prompt p, checkpoints in increasing KL; `kls[c]` their
    KLs. The later checkpoint is the last whose KL is at most `max_kl`; the peak is the checkpoint up to it with
    the highest mean gold. Each resample draws prompts and chooses the peak again, so the interval includes the
    chance of calling a checkpoint the peak; the difference is never above 0 (the later checkpoint is a candidate
    for the peak), and the interval excludes 0 only when some earlier checkpoint beats it in nearly every resample.
    Returns {"kl" (the later checkpoint's), "peak_kl", "peak_index", "later_index", "diff", "ci95": [lo, hi],
    "resampled": "prompts"}."""
    gold = np.asarray(gold, dtype=np.float64)
    kl = np.asarray(kls, dtype=np.float64)
    if gold.ndim != 3 or 0 in gold.shape or kl.shape != gold.shape[:1]:
        raise ValueError(f"need a [checkpoints, prompts, replies] array and one KL per checkpoint, got {gold.shape} "
                         f"and {kl.shape}")
    eligible = np.flatnonzero(kl <= max_kl)
    if eligible.size == 0:
        raise ValueError(f"no checkpoint within {max_kl:g} nats")
    later = int(eligible[-1])
    means = gold.mean(axis=(1, 2))
    peak = int(np.argmax(means[: later + 1]))
    resampled = _resampled_means(gold[: later + 1], prompt_draws(gold.shape[1], n_boot, seed))
    diffs = resampled[:, later] - resampled.max(axis=1)
    lo, hi = _quantiles(diffs, level, gold.shape[1])
    return {"kl": float(kl[later]), "peak_kl": float(kl[peak]), "peak_index": peak, "later_index": later,
            "diff": float(means[later] - means[peak]), "ci95": [lo, hi], "resampled": "prompts"}
