"""`Experience`: one iteration's sampled replies and everything scored about them, fixed during the update
(OpenRLHF's name for it). `PPOLoop.make_experience(prompts)` makes it; `PPOLoop.update(experience)` reads it.

Sequences are right-padded [B, L]; per-token tensors are [B, L-1] (entry t is about choosing token t+1) and hold
anything off the reply tokens (`action_mask` 0): the loss math masks them (docs/DESIGN.md).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from ppo_rlhf.models.rollout import Rollout

# per-token fields, trimmed with the sequences by `select`
PER_TOKEN = ("action_mask", "old_logprobs", "ref_logprobs", "entropy", "old_values", "rewards", "kl", "advantages",
             "raw_advantages", "returns", "rollout_logprobs", "tis_weights")


@dataclass
class Experience:
    # --- sampled (the rollout)
    prompts: list[str]
    prompt_ids: list[list[int]]
    reply_ids: list[list[int]]  # includes the closing EOS when finished
    reply_texts: list[str]  # decoded without special tokens
    finished: torch.Tensor  # [B] bool: emitted an EOS within the cap
    input_ids: torch.Tensor  # [B, L] long, right-padded prompt + reply
    attention_mask: torch.Tensor  # [B, L] long
    action_mask: torch.Tensor  # [B, L-1] float, 1 on the reply tokens the policy chose
    # --- scored (steps 2-4 of an iteration; None until scored)
    old_logprobs: torch.Tensor | None = None  # log pi_old, tempered (recorded by generate, or recomputed)
    entropy: torch.Tensor | None = None  # entropy of pi_old per position, tempered
    ref_logprobs: torch.Tensor | None = None  # log pi_ref, tempered (the policy with its adapter off)
    old_values: torch.Tensor | None = None  # value model, normalised like the reward; 0 without a critic
    raw_scores: torch.Tensor | None = None  # [B] reward model on its own scale
    scores: torch.Tensor | None = None  # [B] normalised, EOS rule applied
    rewards: torch.Tensor | None = None  # per-token rewards (-beta * KL, + the score at the last token)
    kl: torch.Tensor | None = None  # log pi_old - log pi_ref on reply tokens
    advantages: torch.Tensor | None = None  # what the policy loss uses (GAE whitened; rloo / grpo per reply)
    raw_advantages: torch.Tensor | None = None  # before whitening (GAE's A_t, with return = A_t + V)
    returns: torch.Tensor | None = None  # value targets
    rollout_logprobs: torch.Tensor | None = None  # what generate sampled with (hf; None from vLLM): mismatch_kl's
    tis_weights: torch.Tensor | None = None  # the policy loss's per-token weights (truncated IS; ones unless tis_cap)

    @classmethod
    def sampled(cls, rollout: Rollout) -> Experience:
        """The rollout's replies, with log pi_old and the entropy when generation recorded them."""
        return cls(rollout.prompts, rollout.prompt_ids, rollout.reply_ids, rollout.reply_texts, rollout.finished,
                   rollout.input_ids, rollout.attention_mask, rollout.action_mask, old_logprobs=rollout.logprobs,
                   entropy=rollout.entropy)

    @property
    def reply_lengths(self) -> torch.Tensor:
        return torch.tensor([len(r) for r in self.reply_ids], dtype=torch.long)

    def select(self, rows: list[int]) -> Experience:
        """Some rows, re-trimmed to their own longest sequence (short replies cost no padding)."""
        width = max(max(len(self.prompt_ids[i]) + len(self.reply_ids[i]) for i in rows), 2)
        picked = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, list):
                picked[field.name] = [value[i] for i in rows]
            elif value is not None:
                value = value[rows]
                cut = width - 1 if field.name in PER_TOKEN else width
                picked[field.name] = value[:, :cut] if value.dim() == 2 else value
        return replace(self, **picked)
