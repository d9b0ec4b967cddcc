"""`Experience`: one iteration's sampled replies (the `Rollout` it extends) and everything scored about them, fixed
during the update (OpenRLHF's name for it). `PPOLoop.score(PPOLoop.rollout(prompts))` makes it;
`PPOLoop.update(experience)` reads it.

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


def row_chunks(rows: list[int] | int, size: int) -> list[list[int]]:
    """`rows` (a count: 0..rows-1) in consecutive chunks of at most `size`."""
    rows = list(range(rows)) if isinstance(rows, int) else rows
    return [rows[start : start + size] for start in range(0, len(rows), size)]


def per_token_in_chunks(fn, rollout: Rollout, size: int) -> tuple[torch.Tensor, ...]:
    """Apply fn(input_ids, attention_mask) -> tuple of [b, l-1] tensors to row chunks of a rollout (each chunk
    trimmed to its own longest row, so short replies cost no padding), then pad back to the batch width."""
    width = rollout.action_mask.shape[1]
    pieces: list[tuple[torch.Tensor, ...]] = []
    for rows in row_chunks(len(rollout.prompts), size):
        part = rollout.select(rows)
        pieces.append(fn(part.input_ids, part.attention_mask))
    pad = torch.nn.functional.pad
    return tuple(torch.cat([pad(piece[k], (0, width - piece[k].shape[1])) for piece in pieces])
                 for k in range(len(pieces[0])))
