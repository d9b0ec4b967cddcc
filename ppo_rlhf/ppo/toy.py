"""`ppo-rlhf toy`: the six-token bandit of sections 8.3 and 8.4 (the command's flags are in toy_command.py).

One state, six tokens with true mean rewards 0.3 ... -0.2, each reward observed with Gaussian noise (std 1.0).
The starting policy has logits (0, 0, 0.5, 0.5, 0, 0): a bump on the two middling tokens (means 0.1 and 0.0),
symmetric around the average reward, so its expected reward is exactly +0.050, like the chapter's.

Every experiment runs all seeds at once: the policy is a [seeds, 6] logits tensor, each seed's loss only touches
its own row, and Adam is elementwise, so summing the per-seed losses trains 500 independent policies in one go.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ppo_rlhf.ppo.objectives import clipped_policy_loss, cpi_objective, probability_ratio

TRUE_MEANS = torch.tensor([0.3, 0.2, 0.1, 0.0, -0.1, -0.2], dtype=torch.float64)
START_LOGITS = torch.tensor([0.0, 0.0, 0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
REWARD_NOISE = 1.0
CLIP_RANGE = 0.2
ONE_BATCH_STEPS = 60
# "Stuck": at the end, some token other than the best one holds more than this probability. Such a policy samples
# almost only that token, so every advantage is ~0 and no later batch can move it.
STUCK_PROBABILITY = 0.9

# Section 8.4's four cases: (label, p_new, advantage); p_old is 0.100 for all. Like the chapter's script we work
# from log-probs rounded to 3 decimals (log 0.100 = -2.303), which is why its ratios read 1.301 and 1.501.
FOUR_CASES = [
    ("A > 0, ratio went up a lot", 0.130, +1.5),
    ("A > 0, ratio went down", 0.090, +1.5),
    ("A < 0, ratio went down a lot", 0.070, -0.8),
    ("A < 0, ratio went up", 0.150, -0.8),
]
P_OLD = 0.100
# The clipping variants on the same tokens, plus one whose ratio grew 4x against a negative advantage
# (the case dual-clip exists for): (label, clipped_policy_loss keyword arguments)
CLIP_VARIANTS = [
    ("PPO (eps 0.2)", {}),
    ("clip-higher (0.2 / 0.28)", {"clip_range_high": 0.28}),
    ("dual-clip (c = 3)", {"dual_clip": 3.0}),
]
RUNAWAY_CASE = ("A < 0, ratio went up 4x", 0.400, -0.8)

# Loss of one batch for every seed: (logprobs of the sampled tokens, their old logprobs, advantages) -> scalar.
Objective = Callable[[Tensor, Tensor, Tensor], Tensor]


def reinforce_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor) -> Tensor:
    return -(advantages * logprobs).mean(1).sum()


def ratio_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor) -> Tensor:
    return -cpi_objective(probability_ratio(logprobs, old_logprobs), advantages).mean(1).sum()


def clip_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor) -> Tensor:
    # normalizer = batch size: the sum over seeds of each seed's per-token mean.
    mask = torch.ones_like(logprobs)
    return clipped_policy_loss(logprobs, old_logprobs, advantages, mask, CLIP_RANGE, normalizer=logprobs.shape[1]).loss


OBJECTIVES: dict[str, Objective] = {"reinforce": reinforce_loss, "ratio": ratio_loss, "clip": clip_loss}
LOOP_METHODS: dict[str, tuple[Objective, int]] = {
    "reinforce_K1": (reinforce_loss, 1),
    "reinforce_K10": (reinforce_loss, 10),
    "ratio_K10": (ratio_loss, 10),
    "clip_K10": (clip_loss, 10),
}


def expected_reward(logits: Tensor) -> Tensor:
    """[seeds] true expected reward of each policy."""
    return torch.softmax(logits, -1) @ TRUE_MEANS


def kl_old_new(old_logits: Tensor, new_logits: Tensor) -> Tensor:
    """[seeds] exact KL(old || new) over the six tokens."""
    old_logp, new_logp = torch.log_softmax(old_logits, -1), torch.log_softmax(new_logits, -1)
    return (old_logp.exp() * (old_logp - new_logp)).sum(-1)


def sample_batch(logits: Tensor, batch: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Sample `batch` tokens per seed; returns (tokens, advantages = noisy reward - batch mean)."""
    tokens = torch.multinomial(torch.softmax(logits, -1), batch, replacement=True, generator=generator)
    noise = torch.randn(tokens.shape, dtype=logits.dtype, generator=generator)
    rewards = TRUE_MEANS[tokens] + REWARD_NOISE * noise
    return tokens, rewards - rewards.mean(1, keepdim=True)


def train_on_batch(
    logits: Tensor, optimizer: torch.optim.Optimizer, objective: Objective, tokens: Tensor, advantages: Tensor,
    steps: int,
) -> None:
    """`steps` Adam steps of `objective` on one batch; log pi_old is the policy that sampled it."""
    with torch.no_grad():
        old_logprobs = torch.log_softmax(logits, -1).gather(1, tokens)
    for _ in range(steps):
        logprobs = torch.log_softmax(logits, -1).gather(1, tokens)
        optimizer.zero_grad()
        objective(logprobs, old_logprobs, advantages).backward()
        optimizer.step()


def percentile(x: Tensor, q: float) -> float:
    return torch.quantile(x, q).item()


def four_cases(clip_range: float = CLIP_RANGE, cases: list[tuple[str, float, float]] = FOUR_CASES,
               **variant: Any) -> list[dict]:
    """Section 8.4's table: each term of L^CLIP for one token and, by autograd, d objective / d log p_new.
    `variant`: clip_range_high and dual_clip of `clipped_policy_loss` (the clip(r)*A column stays PPO's)."""
    rows = []
    for label, p_new, advantage in cases:
        old_logprob = torch.tensor([round(math.log(P_OLD), 3)], dtype=torch.float64)
        new_logprob = torch.tensor([round(math.log(p_new), 3)], dtype=torch.float64, requires_grad=True)
        advantages = torch.tensor([advantage], dtype=torch.float64)
        ratio = probability_ratio(new_logprob, old_logprob)
        objective = -clipped_policy_loss(new_logprob, old_logprob, advantages, torch.ones(1), clip_range,
                                         **variant).loss
        (gradient,) = torch.autograd.grad(objective, new_logprob)
        rows.append({
            "case": label, "p_old": P_OLD, "p_new": p_new, "ratio": ratio.item(), "advantage": advantage,
            "ratio_times_advantage": cpi_objective(ratio, advantages).item(),
            "clipped_ratio_times_advantage": (ratio.clamp(1 - clip_range, 1 + clip_range) * advantages).item(),
            "min": objective.item(), "gradient": gradient.item(),
        })
    return rows


def clip_variants() -> dict[str, list[dict]]:
    """The four cases and the runaway token under each clipping variant: the objective and its gradient."""
    return {name: four_cases(CLIP_RANGE, FOUR_CASES + [RUNAWAY_CASE], **variant) for name, variant in CLIP_VARIANTS}


def one_batch(seeds: int, batch: int, lr: float, seed: int) -> dict[str, dict]:
    """Section 8.3's first experiment: one batch per seed, reused for 60 Adam steps by each objective."""
    generator = torch.Generator().manual_seed(seed)
    start = START_LOGITS.expand(seeds, -1).clone()
    tokens, advantages = sample_batch(start, batch, generator)  # the same batches for all three objectives
    results = {}
    for name, objective in OBJECTIVES.items():
        logits = start.clone().requires_grad_()
        train_on_batch(logits, torch.optim.Adam([logits], lr=lr), objective, tokens, advantages, ONE_BATCH_STEPS)
        final = logits.detach()
        reward = expected_reward(final)
        results[name] = {
            "expected_reward": reward.mean().item(),
            "p10": percentile(reward, 0.1),
            "kl_old_new": kl_old_new(start, final).mean().item(),
            "worse_share": (reward < expected_reward(start)).double().mean().item(),
        }
    return results


def loop(seeds: int, iterations: int, batch: int, lr: float, seed: int) -> dict[str, dict]:
    """Section 8.3's second experiment: a fresh batch from the current policy every iteration, K steps on each."""
    checkpoints = sorted({min(10, iterations), min(20, iterations), iterations})
    results = {}
    for name, (objective, steps) in LOOP_METHODS.items():
        generator = torch.Generator().manual_seed(seed)
        logits = START_LOGITS.expand(seeds, -1).clone().requires_grad_()
        optimizer = torch.optim.Adam([logits], lr=lr)  # one optimiser for the whole run, as in real training
        reward_at = {}
        for iteration in range(1, iterations + 1):
            tokens, advantages = sample_batch(logits.detach(), batch, generator)
            train_on_batch(logits, optimizer, objective, tokens, advantages, steps)
            if iteration in checkpoints:
                reward_at[iteration] = expected_reward(logits.detach()).mean().item()
        probs = torch.softmax(logits.detach(), -1)
        final_reward = expected_reward(logits.detach())
        results[name] = {
            "expected_reward": reward_at,
            "p10": percentile(final_reward, 0.1),
            "p_best": probs[:, 0].mean().item(),
            "stuck_share": (probs[:, 1:].max(-1).values > STUCK_PROBABILITY).double().mean().item(),
        }
    return results


def format_cases(rows: list[dict]) -> str:
    lines = [f"== 1. the clipped objective for one token (epsilon = {CLIP_RANGE})"]
    for row in rows:
        lines.append(
            f"  {row['case']:<30} p_old {row['p_old']:.3f} p_new {row['p_new']:.3f} ratio {row['ratio']:.3f}"
            f"  A {row['advantage']:+.1f}  r*A {row['ratio_times_advantage']:+.3f}"
            f"  clip(r)*A {row['clipped_ratio_times_advantage']:+.3f}  min {row['min']:+.3f}"
            f"  d objective / d log p {row['gradient']:+.3f}"
        )
    return "\n".join(lines)


def format_variants(variants: dict[str, list[dict]]) -> str:
    """One line per token: its ratio and advantage, then each variant's objective and gradient side by side."""
    names = list(variants)
    lines = ["== 1b. clipping variants on the same tokens: objective (d objective / d log p)",
             f"  {'':<30} {'ratio':>6} {'A':>5}  " + "  ".join(f"{name:<24}" for name in names).rstrip()]
    for k, row in enumerate(variants[names[0]]):
        cells = "  ".join(f"{variants[name][k]['min']:+.3f} ({variants[name][k]['gradient']:+.3f})".ljust(24)
                          for name in names)
        lines.append(f"  {row['case']:<30} {row['ratio']:6.3f} {row['advantage']:+5.1f}  {cells}".rstrip())
    return "\n".join(lines)


def format_one_batch(results: dict[str, dict], seeds: int, batch: int) -> str:
    lines = [f"== 2. one batch of {batch}, reused for {ONE_BATCH_STEPS} Adam steps ({seeds} seeds)"]
    for name, r in results.items():
        lines.append(
            f"  {name:<9} after {ONE_BATCH_STEPS} steps: true expected reward {r['expected_reward']:+.3f}"
            f" (10th percentile {r['p10']:+.3f}), KL(old||new) {r['kl_old_new']:.3f},"
            f" worse than before in {r['worse_share']:.0%} of seeds"
        )
    return "\n".join(lines)


def format_loop(results: dict[str, dict], seeds: int, batch: int) -> str:
    first = next(iter(results.values()))
    at = sorted(first["expected_reward"])
    last = at[-1]
    lines = [f"== 3. the full loop: a fresh batch of {batch} every iteration ({seeds} seeds)"]
    for name, r in results.items():
        rewards = " / ".join(f"{r['expected_reward'][i]:+.3f}" for i in at)
        lines.append(
            f"  {name:<13} expected reward after {'/'.join(map(str, at))} iterations: {rewards}"
            f"   10th percentile at {last}: {r['p10']:+.3f}   P(best token) at {last}: {r['p_best']:.2f}"
            f"   stuck on a worse token: {r['stuck_share']:.0%}"
        )
    return "\n".join(lines)


def run_experiments(args: argparse.Namespace) -> tuple[dict, list[str]]:
    """The experiments `args` (toy_command's flags) ask for: (the JSON report, the tables)."""
    report: dict = {"config": {k: getattr(args, k) for k in ("seeds", "iterations", "batch", "lr", "seed")}}
    texts = []
    if args.experiment in ("all", "cases"):
        report["cases"] = four_cases()
        report["clip_variants"] = clip_variants()
        texts += [format_cases(report["cases"]), format_variants(report["clip_variants"])]
    if args.experiment in ("all", "one-batch"):
        report["one_batch"] = one_batch(args.seeds, args.batch, args.lr, args.seed)
        texts.append(format_one_batch(report["one_batch"], args.seeds, args.batch))
    if args.experiment in ("all", "loop"):
        report["loop"] = loop(args.seeds, args.iterations, args.batch, args.lr, args.seed)
        texts.append(format_loop(report["loop"], args.seeds, args.batch))
    return report, texts
