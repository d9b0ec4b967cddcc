"""How an iteration turns rewards into advantages: one strategy per `advantage_estimator`.

Each is called with the per-token `rewards` (section 8.6's shaped reward), the normalised `values` (0 without a
critic), the per-reply `scores`, the per-token `kl` and the reply-token `mask`, and returns (advantages used by the
policy loss, raw advantages before any whitening, returns = the value targets), all [B, L-1].
"""

from __future__ import annotations

from typing import Protocol

from torch import Tensor

from ppo_rlhf.distributed import Dist
from ppo_rlhf.objectives import broadcast_to_tokens, gae, grpo_advantages, rloo_advantages, sequence_rewards
from ppo_rlhf.train_config import TrainConfig


class Advantages(Protocol):
    needs_critic: bool  # GAE learns a value model; the group estimators use the other replies to a prompt instead

    def __call__(self, rewards: Tensor, values: Tensor, scores: Tensor, kl: Tensor, mask: Tensor,
                 beta: float) -> tuple[Tensor, Tensor, Tensor]: ...


class GAEAdvantages:
    """GAE (gamma, lambda) over the per-token rewards, whitened over the global batch's reply tokens."""

    needs_critic = True

    def __init__(self, gamma: float, lam: float, dist: Dist):
        self.gamma, self.lam, self.dist = gamma, lam, dist

    def __call__(self, rewards, values, scores, kl, mask, beta):
        raw, returns = gae(rewards, values, mask, gamma=self.gamma, lam=self.lam)
        return self.dist.masked_whiten(raw, mask), raw, returns


class RLOOAdvantages:
    """One advantage per reply, on every reply token: its sequence reward (score - beta * summed KL) minus the mean
    of the other replies to the same prompt; the return is the sequence reward. Not whitened again."""

    needs_critic = False

    def __init__(self, group_size: int):
        self.group_size = group_size

    def __call__(self, rewards, values, scores, kl, mask, beta):
        totals = sequence_rewards(scores, kl, mask, beta)
        per_reply = broadcast_to_tokens(self.per_reply(totals), mask)
        return per_reply, per_reply, broadcast_to_tokens(totals, mask)

    def per_reply(self, totals: Tensor) -> Tensor:
        return rloo_advantages(totals, self.group_size)


class GRPOAdvantages(RLOOAdvantages):
    """GRPO's group normalisation: (R - group mean) / (group std + eps)."""

    def __init__(self, group_size: int, eps: float):
        super().__init__(group_size)
        self.eps = eps

    def per_reply(self, totals: Tensor) -> Tensor:
        return grpo_advantages(totals, self.group_size, self.eps)


def make_advantages(cfg: TrainConfig, dist: Dist) -> Advantages:
    if cfg.advantage_estimator == "gae":
        return GAEAdvantages(cfg.gamma, cfg.lam, dist)
    if cfg.advantage_estimator == "rloo":
        return RLOOAdvantages(cfg.group_size)
    return GRPOAdvantages(cfg.group_size, cfg.grpo_eps)
