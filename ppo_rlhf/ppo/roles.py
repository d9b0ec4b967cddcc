"""The models' roles in PPO for RLHF, each with its own forward passes and (when trained) its gradient step.

* `Actor`: the policy. Log-probs of its tokens at the sampling temperature, the LM head in chunks of positions;
  the reference is the same network with its LoRA adapter off.
* `Critic`: the value model (reward model + LoRA + a trained copy of its head). Its values at every position; with
  its adapter off it *is* the reward model, so it scores replies too.

The frozen reward model alone (the critic-free estimators' and a reward function's) is `models.scores.RewardModel`.
"""

from __future__ import annotations

import torch
from torch import nn

from ppo_rlhf.data import Prompt
from ppo_rlhf.models.logprobs import token_logprobs
from ppo_rlhf.models.scores import RewardModel, sequence_values
from ppo_rlhf.ppo.train_config import TrainConfig


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


class Actor:
    """The policy, its reference (adapter off) and its gradient step (`distributed.GradientStep` or `zero.ZeroStep`)."""

    def __init__(self, model: nn.Module, step, cfg: TrainConfig):
        self.model, self.step, self.cfg = model, step, cfg

    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, first: int, with_entropy: bool = False):
        """log pi(token) at the sampling temperature [b, l-1] (and the entropy); gradients as the caller sets them.
        Positions before `first` (prompt in every row) are 0."""
        cfg, device = self.cfg, model_device(self.model)
        return token_logprobs(self.model, input_ids.to(device), attention_mask.to(device), cfg.temperature,
                              with_entropy=with_entropy, chunk_size=cfg.logprob_chunk or None, first=first,
                              chunk_mb=cfg.logprob_chunk_mb, padding_free=cfg.padding_free)

    def reference_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, first: int) -> torch.Tensor:
        with self.model.disable_adapter():  # the reference: the same weights with the adapter off
            return self.logprobs(input_ids, attention_mask, first)


class Critic(RewardModel):
    """The value model and its gradient step; with its adapter (and trained head copy) off, the reward model."""

    def __init__(self, model: nn.Module, tokenizer, step, padding_free: bool = False):
        super().__init__(model, tokenizer, padding_free)
        self.step = step

    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """V at every position [b, l-1] on the reward model's raw scale (gradients as the caller sets them)."""
        device = model_device(self.model)
        return sequence_values(self.model, input_ids.to(device), attention_mask.to(device), self.padding_free)

    def score_texts(self, prompts: list[Prompt], replies: list[str], batch_size: int) -> torch.Tensor:
        with self.model.disable_adapter():
            return super().score_texts(prompts, replies, batch_size)
