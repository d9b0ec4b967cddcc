"""`Experience`: one iteration's sampled replies (the `Rollout` it extends) and everything scored about them, fixed
during the update (OpenRLHF's name for it). `PPOLoop.make_experience(prompts)` makes it; `PPOLoop.update(experience)`
reads it.

Sequences are right-padded [B, L]; per-token tensors are [B, L-1] (entry t is about choosing token t+1) and hold
anything off the reply tokens (`action_mask` 0): the loss math masks them (docs/DESIGN.md).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from ppo_rlhf.models.rollout import Rollout


@dataclass(kw_only=True)
class Experience(Rollout):
    """The rollout's fields (prompts, ids, texts, finished, the padded tensors, the log-probs `logprobs` generate
    recorded and sampled with: mismatch_kl's and truncated IS's pi_rollout; None from vLLM), then what is scored
    (steps 2-4 of an iteration, `PPOLoop.score`); `entropy` is pi_old's."""

    old_logprobs: torch.Tensor  # log pi_old, tempered (recorded by generate, or recomputed)
    ref_logprobs: torch.Tensor  # log pi_ref, tempered (the policy with its adapter off)
    old_values: torch.Tensor  # value model, normalised like the reward; 0 without a critic
    raw_scores: torch.Tensor  # [B] reward model on its own scale
    scores: torch.Tensor  # [B] normalised, EOS rule applied
    rewards: torch.Tensor  # per-token rewards (-beta * KL, + the score at the last token)
    kl: torch.Tensor  # log pi_old - log pi_ref on reply tokens
    advantages: torch.Tensor  # what the policy loss uses (GAE whitened; rloo / grpo per reply)
    raw_advantages: torch.Tensor  # before whitening (GAE's A_t, with return = A_t + V)
    returns: torch.Tensor  # value targets
    tis_weights: torch.Tensor  # the policy loss's per-token weights (truncated IS; ones unless tis_cap)
    entropy: torch.Tensor  # entropy of pi_old per position, tempered


def rollout_fields(rollout: Rollout) -> dict[str, Any]:
    """The rollout's own fields, for the `Experience` of it."""
    return {field.name: getattr(rollout, field.name) for field in fields(rollout)}
