"""The tensor math of PPO for RLHF (sections 8.2 to 8.6): ratio, clipped policy and value losses, GAE, per-token
KL rewards, masked statistics. Pure torch: no models, no transformers.

Per-token tensors are [B, T] with a float `mask` that is 1 on reply tokens and 0 on prompt and padding positions.
Masked-out entries may hold anything (even nan or inf): every function selects with `torch.where`, never `x * mask`,
so garbage there never leaks into a result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from ppo_rlhf.errors import require

AGGREGATIONS = ("token", "sequence")


def _zero_masked(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    masked = _zero_masked(x, mask)
    return masked.sum() if dim is None else masked.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean over the entries where mask is 1 (nan if there are none)."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / count


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance over the masked entries; a single entry has variance 0 (no Bessel correction to divide by zero)."""
    mean = masked_mean(x, mask)
    variance = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        count = mask.sum()
        variance = variance * count / (count - 1).clamp(min=1)
    return variance


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """(x - mean) / std over the masked entries; shift_mean=False adds the mean back (unit variance, same mean).
    Result is 0 where mask == 0."""
    return whiten_with(x, mask, masked_mean(x, mask), masked_var(x, mask), shift_mean)


def whiten_with(x: Tensor, mask: Tensor, mean: Tensor | float, variance: Tensor, shift_mean: bool = True) -> Tensor:
    """(x - mean) / sqrt(variance + 1e-8) with given statistics (this batch's, or every process's:
    `advantages.masked_whiten_over`); the mean added back when not `shift_mean`; 0 where mask == 0."""
    whitened = (x - mean) * torch.rsqrt(variance + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return _zero_masked(whitened, mask)


def probability_ratio(new_logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    """pi_new / pi_old from log-probs: safer than dividing two small probabilities."""
    return torch.exp(new_logprobs - old_logprobs)


def cpi_objective(ratio: Tensor, advantages: Tensor) -> Tensor:
    """The surrogate L^CPI per token, r * A (to be maximised)."""
    return ratio * advantages


def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token log p - log q: unbiased for KL(p || q) on samples from p, but any single value can be negative."""
    return logprobs - ref_logprobs


def kl_k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token 0.5 * (log p - log q)^2: biased for KL(p || q) but never negative, with low variance; its gradient
    on samples from p is the gradient of KL(p || q) (Schulman 2020, "Approximating KL divergence")."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


def kl_k3(new_logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    """Per-token (r - 1) - log r, r = p_new / p_old: unbiased for KL(old || new) on samples from old, never negative."""
    log_ratio = new_logprobs - old_logprobs
    return torch.expm1(log_ratio) - log_ratio


KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, estimator: str, mask: Tensor) -> Tensor:
    """Per-token estimate of KL(p || ref) on tokens sampled from p: k1 = log p - log ref, k2 = 0.5 (log p - log ref)^2,
    k3 = ref/p - 1 - log(ref/p) (`kl_k3` with r = ref / p); 0 where mask == 0.

    Positions off the reply are zeroed before the estimate, as in `clipped_policy_loss`: a padding position whose two
    log-probs differ by more than ~88 nats would overflow k3's exp to inf, and inf times the zero gradient a masked
    loss sends there is nan, in every gradient of the step. Reply positions compute exactly the same floats."""
    require(estimator in KL_ESTIMATORS, f"kl_estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")
    logprobs, ref_logprobs = _zero_masked(logprobs, mask), _zero_masked(ref_logprobs, mask)
    if estimator == "k1":
        return kl_k1(logprobs, ref_logprobs)
    if estimator == "k2":
        return kl_k2(logprobs, ref_logprobs)
    return kl_k3(ref_logprobs, logprobs)


def normalise_loss(per_token: Tensor, mask: Tensor, aggregation: str = "token", count: float | None = None) -> Tensor:
    """A batch's share of a loss averaged over `count` tokens ("token") or replies ("sequence": each reply's own
    token mean, then the mean over replies). With `count` the global count (the whole minibatch, every process),
    the gradient-accumulation micro-batches' shares add up to the minibatch's mean; None: this batch's own count.
    Every loss term goes through here: policy, value, entropy bonus and PPO-ptx."""
    require(aggregation in AGGREGATIONS, f"loss aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if aggregation == "token":
        return masked_sum(per_token, mask) / (mask.sum() if count is None else count)
    has_tokens = mask.sum(1) > 0
    per_reply = masked_mean(per_token[has_tokens], mask[has_tokens], dim=1)
    return per_reply.sum() / (per_reply.numel() if count is None else count)


class PolicyLoss(NamedTuple):
    loss: Tensor
    clip_fraction: Tensor
    approx_kl: Tensor
    ratio_spread: Tensor  # max |ratio - 1| over the reply tokens: 0 before the first step unless the forwards differ


def truncated_importance_weights(old_logprobs: Tensor, rollout_logprobs: Tensor, cap: float) -> Tensor:
    """Truncated importance sampling (Yao et al. 2025): min(pi_old / pi_rollout, cap) per token, a constant (no
    gradient). It corrects for tokens sampled by a rollout engine whose probabilities differ from the trainer's own
    (bf16 kernels, KV cache, another batch shape); cap bounds the variance a rare large ratio would bring."""
    return torch.exp(old_logprobs - rollout_logprobs).clamp(max=cap).detach()


def policy_token_weights(old_logprobs: Tensor, rollout_logprobs: Tensor | None, tis_cap: float) -> Tensor:
    """The policy loss's per-token weights: `truncated_importance_weights` of the tokens generate sampled (with the
    log-probs it recorded while sampling) when tis_cap > 0, else ones."""
    if tis_cap == 0:
        return torch.ones_like(old_logprobs)
    require(rollout_logprobs is not None, "truncated importance sampling needs the rollout's recorded log-probs")
    return truncated_importance_weights(old_logprobs, rollout_logprobs, tis_cap)


def clipped_policy_loss(
    new_logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_range: float = 0.2,
    aggregation: str = "token",
    normalizer: float | None = None,
    clip_range_high: float | None = None,
    dual_clip: float | None = None,
    token_weights: Tensor | None = None,
) -> PolicyLoss:
    """Minus L^CLIP (section 8.4): the max of the negated terms is the min of the objectives.

    The ratio is clipped to [1 - clip_range, 1 + clip_range_high] (None: clip_range; a larger upper range is DAPO's
    "clip-higher", which lets unlikely tokens with A > 0 grow further). `dual_clip` c > 1 (Ye et al. 2020) also
    bounds the loss of a token with A < 0 by -c * A: without it, a token whose ratio has grown far above 1 + eps
    keeps a loss of -r * A, unbounded in r. `token_weights` (e.g. `truncated_importance_weights`) multiply each
    token's term."""
    clip_high = clip_range if clip_range_high is None else clip_range_high
    # Zeroing masked inputs first keeps exp() of garbage from turning the backward pass into nan.
    new_logprobs, old_logprobs = _zero_masked(new_logprobs, mask), _zero_masked(old_logprobs, mask)
    advantages = _zero_masked(advantages, mask)
    ratio = probability_ratio(new_logprobs, old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_range, 1 + clip_high)
    per_token = torch.max(unclipped, clipped)
    if dual_clip is not None:
        per_token = torch.where(advantages < 0, torch.min(per_token, -dual_clip * advantages), per_token)
    if token_weights is not None:
        per_token = per_token * _zero_masked(token_weights, mask)
    loss = normalise_loss(per_token, mask, aggregation, normalizer)
    with torch.no_grad():
        deviation = _zero_masked((ratio - 1).abs(), mask)
        clip_fraction = masked_mean(((ratio < 1 - clip_range) | (ratio > 1 + clip_high)).float(), mask)
        approx_kl = masked_mean(kl_k3(new_logprobs, old_logprobs), mask)
        spread = deviation.max() if deviation.numel() else torch.zeros(())
    return PolicyLoss(loss, clip_fraction, approx_kl, spread)


class ValueLoss(NamedTuple):
    loss: Tensor
    clip_fraction: Tensor


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip_range: float = 0.2,
    aggregation: str = "token",
    normalizer: float | None = None,
) -> ValueLoss:
    """Section 8.5: 0.5 * max of the plain and the clipped squared error. clip_fraction is the chapter's value-clip
    fraction: the share of reply tokens with |V - V_old| > clip_range (whether or not the clipped term is the larger
    one, so not the share of tokens where clipping changed the loss)."""
    values, old_values, returns = (_zero_masked(x, mask) for x in (values, old_values, returns))
    clipped_values = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    squared_error = torch.max((values - returns) ** 2, (clipped_values - returns) ** 2)
    loss = 0.5 * normalise_loss(squared_error, mask, aggregation, normalizer)
    with torch.no_grad():
        clip_fraction = masked_mean(((values - old_values).abs() > clip_range).float(), mask)
    return ValueLoss(loss, clip_fraction)


@torch.no_grad()
def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0,
        lam: float | Tensor = 0.95) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over right-padded rows (section 8.6). Returns (advantages, returns).

    delta_t = r_t + gamma V(s_{t'}) - V(s_t), A_t = delta_t + gamma lam A_{t'}, with t' the row's NEXT position where
    mask == 1, and V = 0 and A = 0 after a row's last one (the episode is over). Positions where mask == 0 are skipped,
    not treated as ends: in a multi-turn trajectory (docs/multi-turn.md) the environment's tokens between two turns
    are masked, and each policy token still links to the next policy token, so the final reward reaches every turn;
    the rewards and values of masked positions never enter. A single reply (prompt, reply, padding) has no masked
    position between two reply tokens, so this is the chapter's recursion exactly. Both outputs are 0 where
    mask == 0. `lam` is one number or one per row ([B], e.g. `length_adaptive_lam`).
    """
    rewards, values = _zero_masked(rewards, mask), _zero_masked(values, mask)
    lam = lam.to(values) if isinstance(lam, Tensor) else lam
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        on = mask[:, t].bool()
        advantages[:, t] = _zero_masked(advantage, on)
        # a masked position passes the next policy token's value and advantage on, unchanged
        next_value = torch.where(on, values[:, t], next_value)
        next_advantage = torch.where(on, advantage, next_advantage)
    return advantages, _zero_masked(advantages + values, mask)


def turn_index(mask: Tensor) -> Tensor:
    """[B, T] long: which turn of its row each position where mask == 1 belongs to (0, 1, ...), -1 elsewhere. A turn
    is a maximal run of consecutive 1s: in a multi-turn trajectory the environment's tokens (masked) separate them."""
    on = mask.bool()
    before = torch.nn.functional.pad(on[:, :-1], (1, 0), value=False)
    starts = on & ~before
    return torch.where(on, starts.long().cumsum(1) - 1, -1)


@torch.no_grad()
def turn_level_gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0,
                   lam: float = 0.95) -> tuple[Tensor, Tensor]:
    """GAE with one step per turn instead of per token (oat/GEM's and AReaL's turn-level credit assignment):
    turn k's reward R_k is the sum of its tokens' rewards, its value V_k the value read at its first token (the
    state the turn starts from: the prompt, the earlier turns and the observations), and
    delta_k = R_k + gamma V_{k+1} - V_k, A_k = delta_k + gamma lam A_{k+1}, V = A = 0 after the last turn. Every token
    of turn k gets A_k as its advantage and A_k + V_k as its return. Turns are the runs of 1s of `mask`
    (`turn_index`). Returns (advantages, returns), 0 where mask == 0."""
    index = turn_index(mask)
    on = index >= 0
    first = on & (torch.nn.functional.pad(index[:, :-1], (1, 0), value=-1) != index)
    slot = index.clamp(min=0)
    turns = int(index.max()) + 1
    per_turn = torch.zeros((mask.shape[0], max(turns, 1)), dtype=values.dtype, device=values.device)
    turn_rewards = per_turn.clone().scatter_add_(1, slot, _zero_masked(rewards, on).to(values.dtype))
    turn_values = per_turn.clone().scatter_add_(1, slot, _zero_masked(values, first))
    turn_mask = (torch.arange(per_turn.shape[1], device=mask.device) < (index.max(1).values + 1)[:, None]).float()
    advantages, returns = gae(turn_rewards, turn_values, turn_mask, gamma=gamma, lam=lam)
    return _zero_masked(advantages.gather(1, slot), on), _zero_masked(returns.gather(1, slot), on)


def length_adaptive_lam(lengths: Tensor, alpha: float) -> Tensor:
    """VAPO's length-adaptive GAE lambda per reply (Yue et al. 2025): 1 - 1 / (alpha * length), floored at 0. A
    fixed lambda discounts a reward l tokens away by lambda^l, so the final score barely reaches the first tokens of
    a long reply; this lambda keeps the effective horizon 1 / (1 - lambda) = alpha * length proportional to it."""
    return (1 - 1 / (alpha * lengths.float())).clamp(min=0)


def last_token_index(mask: Tensor) -> Tensor:
    """[B] position of the last 1 in each row of mask (the reply's final token, where the score goes)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask.bool(), positions, -1).max(dim=1).values
    if bool((last < 0).any()):
        raise ValueError("every row of the mask needs at least one reply token")
    return last


@dataclass(frozen=True)
class ShapedRewards:
    """Section 8.6's KL-shaped reward of a batch, built once (`shape_rewards`) for whichever advantage estimator
    reads it: GAE the per-token rewards, the critic-free estimators one total per reply, both from the same scores,
    KL and beta. The total is what the per-token rewards add up to, unless the trainer whitened those
    (`whiten_rewards`, which only GAE reads)."""

    per_token: Tensor  # [B, T] -beta * KL_t, the score at the last token, a turn reward at each turn's end; 0 off mask
    scores: Tensor  # [B] each reply's score (a multi-turn environment's turn rewards added)
    kl: Tensor  # [B, T] the kl_estimator's KL_t (`kl_estimate`)
    mask: Tensor  # [B, T] 1 on the tokens the policy chose
    beta: float  # the KL coefficient in the reward: 0 with `kl_in: loss`

    @property
    def sequence_totals(self) -> Tensor:
        """[B] one reward per reply: its score minus beta times its summed per-token KL."""
        return self.scores.to(self.kl.dtype) - self.beta * masked_sum(self.kl, self.mask, dim=1)


@torch.no_grad()
def shape_rewards(scores: Tensor, kl: Tensor, mask: Tensor, beta: float,
                  env_rewards: Tensor | None = None) -> ShapedRewards:
    """Section 8.6's shaped reward: -beta * KL_t on every reply token, plus the score on the last one; a multi-turn
    environment's `env_rewards` ([B, T], each turn's reward at its last policy token) are added where they stand and
    to the reply's score. beta = 0 leaves the KL out of the rewards (`kl_in: loss`)."""
    per_token = _zero_masked(-beta * kl, mask)
    rows = torch.arange(per_token.shape[0], device=per_token.device)
    per_token[rows, last_token_index(mask)] += scores.to(per_token.dtype)
    if env_rewards is not None:
        turn_rewards = _zero_masked(env_rewards, mask)
        per_token, scores = per_token + turn_rewards, scores + turn_rewards.sum(1)
    return ShapedRewards(per_token=per_token, scores=scores, kl=kl, mask=mask, beta=beta)


@torch.no_grad()
def explained_variance(predictions: Tensor, targets: Tensor, mask: Tensor) -> float:
    """1 - Var[targets - predictions] / Var[targets] over the mask: 1 is perfect, 0 is no better than the mean,
    negative is worse. nan when the targets do not vary."""
    target_variance = masked_var(targets, mask).item()
    if target_variance == 0:
        return math.nan
    return 1 - masked_var(targets - predictions, mask).item() / target_variance


class FixedKLController:
    """beta as set (the default, `adaptive_kl` off), behind the interface of `AdaptiveKLController`: the trainer
    holds one controller either way, and reads the coefficient from it alone."""

    def __init__(self, beta: float) -> None:
        self.beta = beta

    def update(self, current_kl: float, n_steps: int) -> float:
        return self.beta

    def state_dict(self) -> dict[str, float]:
        return {"beta": self.beta}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.beta = state["beta"]


class AdaptiveKLController:
    """Ziegler et al. (2019): nudge beta so the measured KL approaches a target.

    error = clip(KL / target - 1, -0.2, 0.2); beta <- beta * (1 + error * n_steps / horizon).
    """

    def __init__(self, init_beta: float, target: float, horizon: float) -> None:
        require(init_beta > 0, f"the initial KL coefficient must be positive, got {init_beta}")
        require(target > 0, f"the KL target must be positive, got {target}")
        require(horizon > 0, f"the KL horizon must be positive, got {horizon}")
        self.beta, self.target, self.horizon = float(init_beta), float(target), float(horizon)

    def update(self, current_kl: float, n_steps: int) -> float:
        error = min(max(current_kl / self.target - 1, -0.2), 0.2)
        self.beta *= 1 + error * n_steps / self.horizon
        return self.beta

    def state_dict(self) -> dict[str, float]:
        return {"beta": self.beta, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.beta, self.target, self.horizon = float(state["beta"]), float(state["target"]), float(state["horizon"])


# ------------------------------------------------------------------ critic-free advantage estimators (Chapter 6)

ESTIMATORS = ("gae", "rloo", "grpo", "ev-gated")


def _groups(rewards: Tensor, group_size: int) -> Tensor:
    require(rewards.dim() == 1, f"sequence rewards must be [B], got shape {tuple(rewards.shape)}")
    require(group_size >= 2, f"a group needs at least 2 replies per prompt, got group_size={group_size}")
    require(rewards.shape[0] % group_size == 0,
            f"{rewards.shape[0]} replies do not split into groups of {group_size}")
    # rows are grouped consecutively: replies 0..k-1 answer prompt 0, k..2k-1 prompt 1, ...
    return rewards.reshape(-1, group_size)


@torch.no_grad()
def rloo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """REINFORCE with a leave-one-out baseline (Kool et al. 2019; Ahmadian et al. 2024): [B] advantages
    A_i = R_i - mean_{j != i} R_j over the other replies to the same prompt = k / (k - 1) * (R_i - mean_j R_j)."""
    grouped = _groups(rewards, group_size)
    others = (grouped.sum(1, keepdim=True) - grouped) / (group_size - 1)
    return (grouped - others).reshape(-1)


@torch.no_grad()
def grpo_advantages(rewards: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """GRPO's group normalisation (Shao et al. 2024): [B] advantages (R_i - mean_group) / (std_group + eps),
    the std with Bessel's correction (as TRL's GRPOTrainer); a group of equal rewards gets advantage 0."""
    grouped = _groups(rewards, group_size)
    mean, std = grouped.mean(1, keepdim=True), grouped.std(1, keepdim=True)
    return ((grouped - mean) / (std + eps)).reshape(-1)


def broadcast_to_tokens(per_sequence: Tensor, mask: Tensor) -> Tensor:
    """[B] -> [B, T]: every reply token of a row carries its reply's value; 0 where mask == 0."""
    return _zero_masked(per_sequence.to(mask.dtype)[:, None].expand_as(mask), mask)
