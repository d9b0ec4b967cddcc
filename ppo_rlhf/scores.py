"""Value-head and reward-model outputs: V at every position of a sequence, and one score per (prompt, reply)."""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from ppo_rlhf.chat import conversation_ids
from ppo_rlhf.errors import require
from ppo_rlhf.models import backbone_and_head
from ppo_rlhf.padding import right_pad


def sequence_values(value_model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The score head at every position, [B, L-1]: entry t is V of the state before choosing token t+1."""
    body, head = backbone_and_head(value_model)
    hidden = body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    return head(hidden)[..., 0].float()[:, :-1]


def reward_inputs(
    tokenizer: PreTrainedTokenizerBase, prompts: list[str], replies: list[str]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded chat-formatted (prompt, reply) conversations, each ending at the assistant's closing EOS."""
    require(len(prompts) == len(replies) and len(prompts) > 0, "need as many replies as prompts, at least one")
    rows = [conversation_ids(tokenizer, prompt, reply) for prompt, reply in zip(prompts, replies)]
    return right_pad(rows, tokenizer.pad_token_id)


def reward_scores(
    reward_model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, batch_size: int | None = None
) -> torch.Tensor:
    """[B] float scores read at each row's last attention_mask == 1 position (gradients as the caller sets them).

    We find that position from the mask: HF's own lookup searches for the pad token, which finds the
    closing EOS when pad == eos.
    """
    body, head = backbone_and_head(reward_model)
    batch_size = batch_size or len(input_ids)
    scores = []
    for start in range(0, len(input_ids), batch_size):
        mask = attention_mask[start : start + batch_size]
        positions = torch.arange(mask.shape[1], device=mask.device)
        last = (mask * positions).argmax(dim=1)
        width = int(last.max()) + 1  # drop columns that are padding in every row of this sub-batch
        hidden = body(input_ids=input_ids[start : start + batch_size, :width], attention_mask=mask[:, :width])
        rows = torch.arange(len(mask), device=mask.device)
        scores.append(head(hidden.last_hidden_state[rows, last])[:, 0].float())
    return torch.cat(scores)


@torch.no_grad()
def score_texts(
    reward_model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    replies: list[str],
    batch_size: int = 16,
) -> torch.Tensor:
    """Reward-model scores [B] of (prompt, reply) texts."""
    device = next(reward_model.parameters()).device
    input_ids, attention_mask = reward_inputs(tokenizer, prompts, replies)
    return reward_scores(reward_model, input_ids.to(device), attention_mask.to(device), batch_size).cpu()
