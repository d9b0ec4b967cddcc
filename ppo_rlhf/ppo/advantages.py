"""How an iteration turns rewards into advantages: one strategy per `advantage_estimator`.

Each is called with the batch's `ShapedRewards` (section 8.6's shaped reward, built once by the trainer: GAE reads
its per-token rewards, the critic-free estimators its per-reply totals) and the normalised `values` (0 without a
critic), and returns (advantages used by the policy loss, raw advantages before any whitening, returns = the value
targets), all [B, L-1]. Where the KL goes is the trainer's choice (`TrainConfig.kl_placement`: its beta in the
record is 0 when the KL is a loss term, `kl_in: loss`), the same for every estimator.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from ppo_rlhf.parallel.distributed import Dist
from ppo_rlhf.ppo.objectives import (
    ShapedRewards,
    broadcast_to_tokens,
    explained_variance,
    gae,
    grpo_advantages,
    length_adaptive_lam,
    masked_sum,
    masked_whiten,
    rloo_advantages,
    turn_level_gae,
    whiten_with,
)
from ppo_rlhf.ppo.train_config import TrainConfig


def masked_whiten_over(dist: Dist, x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """objectives.masked_whiten with the mean and (unbiased) variance of all of `dist`'s processes' masked entries."""
    if dist.world_size == 1:
        return masked_whiten(x, mask, shift_mean)
    count, total = dist.sum(float(mask.sum())), dist.sum(float(masked_sum(x.double(), mask)))
    mean = total / count
    squares = dist.sum(float(masked_sum((x.double() - mean) ** 2, mask)))
    variance = squares / count * count / max(count - 1, 1)
    return whiten_with(x, mask, mean, torch.tensor(variance, dtype=x.dtype, device=x.device), shift_mean)


class Advantages(Protocol):
    needs_critic: bool  # GAE learns a value model; the group estimators use the other replies to a prompt instead

    def __call__(self, shaped: ShapedRewards, values: Tensor) -> tuple[Tensor, Tensor, Tensor]: ...

    def stats(self) -> dict[str, float]:
        """What the last call chose, for the history (empty for the estimators that choose nothing)."""
        ...


class GAEAdvantages:
    """GAE (gamma, lambda) over the per-token rewards, whitened over the global batch's reply tokens. The advantages
    use `lam` (or, with `length_alpha`, VAPO's length-adaptive lambda per reply), the value targets `critic_lam`
    (decoupled GAE, VC-PPO/VAPO: a critic trained on lambda-1 returns has unbiased targets, while the policy keeps a
    lower-variance lambda); raw advantages + values = returns only when the two lambdas are the same. `turn_level`:
    one GAE step per turn of a multi-turn trajectory (`turn_level_gae`) instead of one per token."""

    needs_critic = True

    def __init__(self, gamma: float, lam: float, dist: Dist, critic_lam: float | None = None,
                 length_alpha: float | None = None, turn_level: bool = False):
        self.gamma, self.lam, self.dist = gamma, lam, dist
        self.critic_lam = lam if critic_lam is None else critic_lam
        self.length_alpha = length_alpha
        self.estimate = turn_level_gae if turn_level else gae

    def __call__(self, shaped, values):
        rewards, mask = shaped.per_token, shaped.mask
        lam = self.lam if self.length_alpha is None else length_adaptive_lam(mask.sum(1), self.length_alpha)
        raw, returns = self.estimate(rewards, values, mask, gamma=self.gamma, lam=lam)
        if self.length_alpha is not None or self.critic_lam != self.lam:
            _, returns = self.estimate(rewards, values, mask, gamma=self.gamma, lam=self.critic_lam)
        return masked_whiten_over(self.dist, raw, mask), raw, returns

    def stats(self) -> dict[str, float]:
        return {}


class RLOOAdvantages:
    """One advantage per reply, on every reply token: its sequence reward (score - beta * summed KL) minus the mean
    of the other replies to the same prompt; the return is the sequence reward. Not whitened again."""

    needs_critic = False

    def __init__(self, group_size: int):
        self.group_size = group_size

    def __call__(self, shaped, values):
        totals = shaped.sequence_totals
        per_reply = broadcast_to_tokens(self.per_reply(totals), shaped.mask)
        return per_reply, per_reply, broadcast_to_tokens(totals, shaped.mask)

    def per_reply(self, totals: Tensor) -> Tensor:
        return rloo_advantages(totals, self.group_size)

    def stats(self) -> dict[str, float]:
        return {}


class GRPOAdvantages:
    """GRPO (Shao et al. 2024): the reply's sequence reward normalised within its group, (R - group mean) / (group
    std + eps), on every reply token; the return is R. By default (`kl_in: loss`, `kl_estimator: k3`, as in the paper)
    R is the score alone (beta here is 0) and the KL is a loss term of its own, beta * k3 per token: folding the KL
    into R before dividing by the group std would blow tiny KL differences between tied scores up to full-size
    advantages (scores [0.5, 0.5], summed KL [1.0, 1.1], beta 0.05: +-0.707 instead of RLOO's +-0.005)."""

    needs_critic = False

    def __init__(self, group_size: int, eps: float):
        self.group_size, self.eps = group_size, eps

    def __call__(self, shaped, values):
        totals = shaped.sequence_totals
        per_reply = broadcast_to_tokens(grpo_advantages(totals, self.group_size, self.eps), shaped.mask)
        return per_reply, per_reply, broadcast_to_tokens(totals, shaped.mask)

    def stats(self) -> dict[str, float]:
        return {}


def critic_is_trusted(ev: float) -> bool:
    """EVPO's gate: the critic's advantages are used while its batch explained variance is above 0, i.e. while its
    values predict the returns better than their mean does (nan, returns that do not vary: not trusted)."""
    return ev > 0


class EVGatedAdvantages:
    """EVPO (arXiv 2604.19485): per batch, GAE's advantages when the critic's explained variance on that batch (its
    old values against the GAE returns over the policy's tokens, the dashboard's `ev`, mean over processes so every
    process chooses alike) is above 0, else the group baseline of `rloo` (each reply's sequence reward minus the mean
    of the other replies to its prompt, not whitened, exactly as advantage_estimator rloo). The returns are GAE's
    either way: the critic trains every iteration, and the gate can open once it has learnt. `stats` reports the
    choice as ev_gate (1: the critic's advantages, 0: the group baseline)."""

    needs_critic = True

    def __init__(self, critic: GAEAdvantages, group: RLOOAdvantages, dist: Dist):
        self.critic, self.group, self.dist = critic, group, dist
        self.gate = float("nan")  # no batch yet

    def __call__(self, shaped, values):
        advantages, raw, returns = self.critic(shaped, values)
        ev = self.dist.sum(explained_variance(values, returns, shaped.mask)) / self.dist.world_size
        self.gate = float(critic_is_trusted(ev))
        if not self.gate:
            advantages = raw = self.group(shaped, values)[0]
        return advantages, raw, returns

    def stats(self) -> dict[str, float]:
        return {"ev_gate": self.gate}


def make_advantages(cfg: TrainConfig, dist: Dist) -> Advantages:
    if cfg.has_value_model:  # gae, ev-gated
        critic = GAEAdvantages(cfg.gamma, cfg.lam, dist, cfg.critic_lam, cfg.lam_length_alpha, cfg.turn_level_gae)
        gated = cfg.advantage_estimator == "ev-gated"
        return EVGatedAdvantages(critic, RLOOAdvantages(cfg.group_size), dist) if gated else critic
    if cfg.advantage_estimator == "rloo":
        return RLOOAdvantages(cfg.group_size)
    return GRPOAdvantages(cfg.group_size, cfg.grpo_eps)
