"""The reward-hacking monitor (on every run's dashboard): is the reward PPO gains the reply's length?

A reward model that learnt "longer is better" is a well-documented reward hack (Singhal et al. 2023, "A Long Way to
Go"). Per iteration, from the batch's raw combined rewards r_i (the rewards' weighted sum before normalisation and
the EOS rule, `rm_raw`'s numbers) and reply lengths l_i (tokens, `len`'s numbers), over every process's replies:

* `reward_length_corr`: Pearson's correlation of r and l over the batch,
  sum((r_i - mean r)(l_i - mean l)) / sqrt(sum((r_i - mean r)^2) * sum((l_i - mean l)^2));
  None when either is constant (no correlation is defined) or a reward is not finite (a skipped batch).
* `length_share`: the share of the reward gained since the start that the start policy's own reward-length trend
  explains. The baseline is a least-squares line r = a + b * l over start-policy replies (the reward-normalisation
  samples when the run measures them, else the first iteration's batch), with their means r_0 and l_0. At iteration
  t, with batch means r_t and l_t:

      length_share = b * (l_t - l_0) / (r_t - r_0)

  1: the whole gain is what the longer replies would have earned at the start; 0: none of it; above 1: the replies
  grew more than the gain (the rest got worse); negative: length moved against the gain. None when the gain is within
  GAIN_STANDARD_ERRORS standard errors of zero, se = sqrt(s_0^2 / n_0 + s_t^2 / n_t) (s: the sample standard
  deviations of the rewards, n: the counts): two batches of the same policy differ by that much about 95% of the
  time, so such a gain is sampling noise, and a share of noise is any number of either sign. None too when every
  baseline reply had one length (no slope b can be fitted) or a reward is not finite.

The baseline is kept in `state_dict`, so a resumed run gives the same numbers. The second judges of
`monitor_judges` (scored beside the reward, never part of it) are the trainer's: this module is the arithmetic alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

GAIN_STANDARD_ERRORS = 2.0  # a gain smaller than this many standard errors is not divided by (see above)


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _centred_products(x: Sequence[float], y: Sequence[float]) -> float:
    """sum((x_i - mean x)(y_i - mean y))."""
    mean_x, mean_y = _mean(x), _mean(y)
    return math.fsum((a - mean_x) * (b - mean_y) for a, b in zip(x, y))


def _sample_variance(values: Sequence[float]) -> float:
    """Unbiased (n - 1) variance; 0 for a single value."""
    return _centred_products(values, values) / (len(values) - 1) if len(values) > 1 else 0.0


def _finite(values: Sequence[float]) -> bool:
    return all(math.isfinite(value) for value in values)


def pearson(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Pearson's correlation of x and y; None for fewer than two pairs, a constant x or y, or a non-finite value."""
    if len(x) != len(y) or len(x) < 2 or not (_finite(x) and _finite(y)):
        return None
    sxx, syy = _centred_products(x, x), _centred_products(y, y)
    if sxx == 0 or syy == 0:
        return None
    return _centred_products(x, y) / math.sqrt(sxx * syy)


@dataclass
class LengthBaseline:
    """The start policy's rewards against its reply lengths."""

    mean_reward: float  # r_0
    mean_length: float  # l_0, tokens
    slope: float | None  # b: reward per token of the least-squares line; None when every reply had one length
    reward_variance: float  # s_0^2, unbiased
    count: int  # n_0

    @classmethod
    def fit(cls, rewards: Sequence[float], lengths: Sequence[float]) -> LengthBaseline:
        """The baseline of these start-policy replies (finite rewards, one length each)."""
        lengths = [float(length) for length in lengths]
        sll = _centred_products(lengths, lengths)
        slope = _centred_products(lengths, rewards) / sll if sll > 0 else None
        return cls(_mean(rewards), _mean(lengths), slope, _sample_variance(rewards), len(rewards))


def length_share(baseline: LengthBaseline, rewards: Sequence[float], lengths: Sequence[float]) -> float | None:
    """b * (l_t - l_0) / (r_t - r_0) of this batch, or None (see the module docstring for when, and why)."""
    if baseline.slope is None or not rewards or not _finite(rewards):
        return None
    gain = _mean(rewards) - baseline.mean_reward
    standard_error = math.sqrt(baseline.reward_variance / baseline.count + _sample_variance(rewards) / len(rewards))
    if abs(gain) <= GAIN_STANDARD_ERRORS * standard_error:  # (a zero gain too, whatever the error)
        return None
    return baseline.slope * (_mean([float(length) for length in lengths]) - baseline.mean_length) / gain


class HackingMonitor:
    """Holds the baseline (set once, from start-policy replies) and gives each batch's numbers."""

    def __init__(self) -> None:
        self.baseline: LengthBaseline | None = None

    def start(self, rewards: Sequence[float], lengths: Sequence[float]) -> None:
        """Fit the baseline to start-policy replies; replies with a non-finite reward leave it unset."""
        if rewards and _finite(rewards):
            self.baseline = LengthBaseline.fit(rewards, lengths)

    def stats(self, rewards: Sequence[float], lengths: Sequence[float]) -> dict[str, float | None]:
        """{"reward_length_corr", "length_share"} of one batch (None where undefined, or before a baseline)."""
        lengths = [float(length) for length in lengths]
        share = length_share(self.baseline, rewards, lengths) if self.baseline is not None else None
        return {"reward_length_corr": pearson(rewards, lengths), "length_share": share}

    def state_dict(self) -> dict[str, Any]:
        return {"baseline": asdict(self.baseline) if self.baseline is not None else None}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """A saved `state_dict`; None (a checkpoint from before the monitor) leaves no baseline: no length share."""
        baseline = (state or {}).get("baseline")
        self.baseline = LengthBaseline(**baseline) if baseline is not None else None
