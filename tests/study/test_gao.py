"""The Gao et al. fit, its predicted peak with a bootstrap interval, and the fall's interval, on synthetic curves."""

import math

import numpy as np
import pytest

from ppo_rlhf.study.gao import GaoFit, fall, fit_gao, predict_peak, turn_words
from ppo_rlhf.study.stats import expanded_level, paired_bootstrap

ALPHA, BETA = 0.6, 0.25  # peak at d* = exp(0.6 / 0.25 - 1) = e^1.4 = 4.06, KL* = e^2.8 = 16.4 nats


def test_the_fit_recovers_alpha_beta_and_the_peak_of_an_exact_curve():
    kls = np.array([0.5, 1, 2, 4, 6, 8, 12, 16, 20, 25, 30, 40])
    d = np.sqrt(kls)
    fit = fit_gao(kls, d * (ALPHA - BETA * np.log(d)))
    assert (fit.alpha, fit.beta) == pytest.approx((ALPHA, BETA), abs=1e-12)
    assert fit.peak_d == pytest.approx(math.exp(1.4))
    assert fit.peak_kl == pytest.approx(math.exp(2.8))
    assert fit.peak_gold == pytest.approx(BETA * math.exp(1.4))
    # the peak is where the fitted curve is highest, and R(d*) = beta d*
    grid = np.linspace(0.01, 40, 40000)
    assert grid[np.argmax(fit.gold(grid))] == pytest.approx(fit.peak_kl, abs=0.01)
    assert fit.gold(fit.peak_kl) == pytest.approx(fit.peak_gold)
    assert fit.gold(0.0) == 0.0


def test_a_noisy_curve_gives_the_peak_within_its_interval():
    rng = np.random.default_rng(3)
    kls = np.array([1, 2, 4, 6, 8, 10, 12, 16, 20, 25, 30, 35, 40.0])
    d = np.sqrt(kls)
    truth = d * (ALPHA - BETA * np.log(d))
    prompts, replies = 200, 1
    # each checkpoint's reply: the true change + its prompt's effect (shared by every checkpoint) + its own noise
    prompt_effect = rng.normal(0, 0.5, size=(1, prompts, replies))
    gold = truth[:, None, None] + prompt_effect + rng.normal(0, 0.5, size=(kls.size, prompts, replies))
    kl = np.broadcast_to(kls[:, None, None], gold.shape) + rng.normal(0, 0.5, size=gold.shape)
    prediction = predict_peak(kl, gold, within_kl=40, n_boot=500, seed=1)
    assert prediction["alpha"] == pytest.approx(ALPHA, abs=0.1)
    assert prediction["beta"] == pytest.approx(BETA, abs=0.05)
    lo, hi = prediction["peak_kl_ci95"]
    assert lo < math.exp(2.8) < hi and hi - lo < 15
    assert prediction["turn_share"] > 0.95 and prediction["resampled"] == "prompts"
    assert prediction["words"].startswith("gold peaks at KL ")


def test_no_turn_is_predicted_when_beta_is_not_positive_or_the_peak_lies_beyond():
    rising = GaoFit(alpha=0.3, beta=-0.01, points=5)
    assert rising.peak_kl == math.inf and rising.peak_gold == math.inf
    assert turn_words(rising, 20) == "no turn predicted within 20 nats (beta <= 0: the fitted curve never turns)"
    late = GaoFit(alpha=1.0, beta=0.2, points=5)  # d* = e^4, KL* = e^8 = 2981 nats
    assert turn_words(late, 40) == "no turn predicted within 40 nats (the fitted peak lies at 2.98e+03 nats)"
    # a linear rise in d (Gao's regressional term alone): the fit finds beta ~ 0 and predicts nothing
    kls = np.array([1, 2, 4, 8, 12.0])
    gold = np.broadcast_to((0.14 * np.sqrt(kls))[:, None, None], (5, 10, 1)).copy()
    prediction = predict_peak(np.broadcast_to(kls[:, None, None], gold.shape), gold, within_kl=20, n_boot=50)
    assert prediction["peak_kl"] is None and prediction["words"].startswith("no turn predicted within 20 nats")
    assert prediction["beta"] == pytest.approx(0.0, abs=1e-9) and prediction["peak_kl_ci95"][1] is None


def test_the_fit_needs_two_kls_above_zero():
    with pytest.raises(ValueError, match="two different KLs above 0"):
        fit_gao([0.0, 4.0, 4.0], [0.0, 0.3, 0.3])


def reference_fall(gold: np.ndarray, later: int, n_boot: int, seed: int, level: float = 0.95) -> tuple[float, float]:
    """The fall's interval the slow, obvious way: per resample of prompts, each checkpoint's mean, the peak chosen
    again among the checkpoints up to the later one, later minus peak."""
    rng = np.random.default_rng(seed)
    prompts = gold.shape[1]
    draws = rng.integers(0, prompts, size=(n_boot, prompts))
    diffs = []
    for drawn in draws:
        means = [gold[c, drawn].mean() for c in range(later + 1)]
        diffs.append(means[later] - max(means))
    tail = (1 - expanded_level(level, prompts)) / 2
    return tuple(np.quantile(diffs, [tail, 1 - tail]))


def test_the_fall_interval_matches_a_reference_bootstrap():
    rng = np.random.default_rng(5)
    truth = np.array([0.0, 0.3, 0.45, 0.5, 0.42, 0.35, 0.3])  # peaks at the fourth checkpoint, then falls
    kls = [1, 2, 4, 8, 16, 30, 50]
    gold = truth[:, None, None] + rng.normal(0, 0.6, size=(7, 120, 2))
    result = fall(gold, kls, max_kl=40, n_boot=3000, seed=2)
    assert result["later_index"] == 5 and result["kl"] == 30  # the last checkpoint within 40 nats
    means = gold.mean(axis=(1, 2))
    assert result["peak_index"] == int(np.argmax(means[:6])) and result["peak_kl"] == kls[result["peak_index"]]
    assert result["diff"] == pytest.approx(means[5] - means[: 6].max())
    assert result["ci95"] == pytest.approx(reference_fall(gold, 5, 3000, 2), abs=1e-12)


def test_with_an_unmistakable_peak_the_fall_interval_is_the_paired_one():
    """When no resample could choose another peak, the interval is the prompt-clustered paired bootstrap of later
    minus peak (stats.paired_bootstrap, the evaluation's), draw for draw."""
    rng = np.random.default_rng(8)
    gold = np.array([0.0, 5.0, 1.0])[:, None, None] + rng.normal(0, 0.3, size=(3, 60, 2))
    result = fall(gold, [2, 8, 20], max_kl=40, n_boot=2000, seed=4)
    assert result["peak_index"] == 1 and result["later_index"] == 2
    diffs = (gold[2] - gold[1]).ravel()
    prompts = np.repeat(np.arange(60), 2)
    mean, lo, hi = paired_bootstrap(diffs, prompts, n_boot=2000, seed=4)
    assert result["diff"] == pytest.approx(mean)
    assert result["ci95"] == pytest.approx([lo, hi], abs=1e-12)


def test_a_gold_that_still_rises_has_no_fall():
    gold = np.array([0.1, 0.2, 0.3, 0.4])[:, None, None] + np.zeros((4, 30, 1))
    result = fall(gold, [1, 2, 4, 8], max_kl=40, n_boot=200)
    assert result["diff"] == 0.0 and result["ci95"] == [0.0, 0.0] and result["peak_index"] == 3
    with pytest.raises(ValueError, match="no checkpoint within 0.5 nats"):
        fall(gold, [1, 2, 4, 8], max_kl=0.5)
