"""`Experience`: one iteration's sampled replies (the `Rollout` it extends) and everything scored about them, fixed
during the update (OpenRLHF's name for it). `PPOLoop.make_experience(prompts)` makes it; `PPOLoop.update(experience)`
reads it.

Sequences are right-padded [B, L]; per-token tensors are [B, L-1] (entry t is about choosing token t+1) and hold
anything off the reply tokens (`action_mask` 0): the loss math masks them (docs/DESIGN.md).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from ppo_rlhf.models.rollout import Rollout


@dataclass
class Experience(Rollout):
    """The rollout's fields (prompts, ids, texts, finished, the padded tensors, the log-probs `logprobs` generate
    recorded and sampled with: mismatch_kl's and truncated IS's pi_rollout; None from vLLM), then what is scored."""

    # --- scored (steps 2-4 of an iteration; None until scored); `entropy` (the rollout's) becomes pi_old's
    old_logprobs: torch.Tensor | None = None  # log pi_old, tempered (recorded by generate, or recomputed)
    ref_logprobs: torch.Tensor | None = None  # log pi_ref, tempered (the policy with its adapter off)
    old_values: torch.Tensor | None = None  # value model, normalised like the reward; 0 without a critic
    raw_scores: torch.Tensor | None = None  # [B] reward model on its own scale
    scores: torch.Tensor | None = None  # [B] normalised, EOS rule applied
    rewards: torch.Tensor | None = None  # per-token rewards (-beta * KL, + the score at the last token)
    kl: torch.Tensor | None = None  # log pi_old - log pi_ref on reply tokens
    advantages: torch.Tensor | None = None  # what the policy loss uses (GAE whitened; rloo / grpo per reply)
    raw_advantages: torch.Tensor | None = None  # before whitening (GAE's A_t, with return = A_t + V)
    returns: torch.Tensor | None = None  # value targets
    tis_weights: torch.Tensor | None = None  # the policy loss's per-token weights (truncated IS; ones unless tis_cap)

    @classmethod
    def sampled(cls, rollout: Rollout) -> Experience:
        """The rollout's replies, with log pi_old when generation recorded it."""
        return cls(**{field.name: getattr(rollout, field.name) for field in fields(rollout)},
                   old_logprobs=rollout.logprobs)
