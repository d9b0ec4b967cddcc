"""Value-head and reward-model outputs: V at every position of a sequence, and one score per (prompt, reply)
(`RewardModel`: a frozen reward model as the trainer and the reward functions use it)."""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from ppo_rlhf.data import Prompt
from ppo_rlhf.errors import require
from ppo_rlhf.models.chat import conversation_ids
from ppo_rlhf.models.loading import backbone_and_head
from ppo_rlhf.models.packing import Packing
from ppo_rlhf.models.padding import right_pad


def sequence_values(value_model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    padding_free: bool = False) -> torch.Tensor:
    """The score head at every position, [B, L-1]: entry t is V of the state before choosing token t+1.
    `padding_free`: the real tokens packed into one row (`packing.Packing`); 0 at padding."""
    body, head = backbone_and_head(value_model)
    if padding_free:
        packing = Packing.of(attention_mask)
        return packing.unpack(head(packing.hidden_states(body, input_ids))[:, 0].float())[:, :-1]
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
    reward_model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    batch_size: int | None = None,
    padding_free: bool = False,
) -> torch.Tensor:
    """[B] float scores read at each row's last attention_mask == 1 position (gradients as the caller sets them).

    We find that position from the mask: HF's own lookup searches for the pad token, which finds the
    closing EOS when pad == eos. `padding_free`: each sub-batch's real tokens packed into one row.
    """
    body, head = backbone_and_head(reward_model)
    batch_size = batch_size or len(input_ids)
    scores = []
    for start in range(0, len(input_ids), batch_size):
        mask, ids = attention_mask[start : start + batch_size], input_ids[start : start + batch_size]
        if padding_free:
            # packed, each sequence's last token sits at the running total of the lengths - 1
            last_hidden = Packing.of(mask).hidden_states(body, ids)[mask.sum(dim=1).cumsum(0) - 1]
        else:
            positions = torch.arange(mask.shape[1], device=mask.device)
            last = (mask * positions).argmax(dim=1)
            width = int(last.max()) + 1  # drop columns that are padding in every row of this sub-batch
            hidden = body(input_ids=ids[:, :width], attention_mask=mask[:, :width]).last_hidden_state
            last_hidden = hidden[torch.arange(len(mask), device=mask.device), last]
        scores.append(head(last_hidden)[:, 0].float())
    return torch.cat(scores)


@torch.no_grad()
def score_texts(
    reward_model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    replies: list[str],
    batch_size: int = 16,
    padding_free: bool = False,
) -> torch.Tensor:
    """Reward-model scores [B] of (prompt, reply) texts."""
    device = next(reward_model.parameters()).device
    input_ids, attention_mask = reward_inputs(tokenizer, prompts, replies)
    return reward_scores(reward_model, input_ids.to(device), attention_mask.to(device), batch_size,
                         padding_free).cpu()


class RewardModel:
    """A frozen reward model: one score per (prompt, reply); `padding_free`: its passes packed (`packing.py`)."""

    def __init__(self, model: nn.Module, tokenizer, padding_free: bool = False):
        self.model, self.tokenizer, self.padding_free = model, tokenizer, padding_free

    def score_texts(self, prompts: list[Prompt], replies: list[str], batch_size: int) -> torch.Tensor:
        """[B] raw scores (on the reward model's own scale), on the CPU."""
        return score_texts(self.model, self.tokenizer, prompts, replies, batch_size=batch_size,
                           padding_free=self.padding_free)
