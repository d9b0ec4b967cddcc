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
    kl_in_loss: bool  # the KL penalty is a loss term on the policy (GRPO), not part of the reward

    def __call__(self, rewards: Tensor, values: Tensor, scores: Tensor, kl: Tensor, mask: Tensor,
                 beta: float) -> tuple[Tensor, Tensor, Tensor]: ...


class GAEAdvantages:
    """GAE (gamma, lambda) over the per-token rewards, whitened over the global batch's reply tokens."""

    needs_critic = True
    kl_in_loss = False

    def __init__(self, gamma: float, lam: float, dist: Dist):
        self.gamma, self.lam, self.dist = gamma, lam, dist

    def __call__(self, rewards, values, scores, kl, mask, beta):
        raw, returns = gae(rewards, values, mask, gamma=self.gamma, lam=self.lam)
        return self.dist.masked_whiten(raw, mask), raw, returns


class RLOOAdvantages:
    """One advantage per reply, on every reply token: its sequence reward (score - beta * summed KL) minus the mean
    of the other replies to the same prompt; the return is the sequence reward. Not whitened again."""

    needs_critic = False
    kl_in_loss = False

    def __init__(self, group_size: int):
        self.group_size = group_size

    def __call__(self, rewards, values, scores, kl, mask, beta):
        totals = sequence_rewards(scores, kl, mask, beta)
        per_reply = broadcast_to_tokens(self.per_reply(totals), mask)
        return per_reply, per_reply, broadcast_to_tokens(totals, mask)

    def per_reply(self, totals: Tensor) -> Tensor:
        return rloo_advantages(totals, self.group_size)


class GRPOAdvantages:
    """GRPO (Shao et al. 2024): the reply's score normalised within its group, (score - group mean) / (group std +
    eps), on every reply token; the return is the score. The KL penalty is NOT in this reward: dividing by the group
    std would blow tiny KL differences between tied scores up to full-size advantages (scores [0.5, 0.5], summed KL
    [1.0, 1.1], beta 0.05: +-0.707 instead of RLOO's +-0.005). As in the paper, it is a separate loss term instead:
    beta * the k3 estimate of KL(pi || pi_ref), per token, added to the policy loss (`kl_in_loss`)."""

    needs_critic = False
    kl_in_loss = True

    def __init__(self, group_size: int, eps: float):
        self.group_size, self.eps = group_size, eps

    def __call__(self, rewards, values, scores, kl, mask, beta):
        per_reply = broadcast_to_tokens(grpo_advantages(scores.to(kl.dtype), self.group_size, self.eps), mask)
        return per_reply, per_reply, broadcast_to_tokens(scores, mask)


def make_advantages(cfg: TrainConfig, dist: Dist) -> Advantages:
    if cfg.advantage_estimator == "gae":
        return GAEAdvantages(cfg.gamma, cfg.lam, dist)
    if cfg.advantage_estimator == "rloo":
        return RLOOAdvantages(cfg.group_size)
    return GRPOAdvantages(cfg.group_size, cfg.grpo_eps)
