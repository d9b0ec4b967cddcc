"""PPO-ptx and learning-rate schedules (section 8.12's "what we did not do"; both off by default).

PPO-ptx (InstructGPT): a language-modelling loss on given text mixed into every optimiser step,
    loss = policy loss + ptx_coef * mean next-token NLL of a batch of `ptx_batch_size` texts,
the NLL at temperature 1 (it is ordinary language modelling, not the sampling distribution). The texts come from
`ptx_data`, a JSONL file with one {"text": ...} per line or a plain text file with one text per line, shuffled
with the run's seed and cycled through; the position is saved in checkpoints.

Schedules: `lr_schedule` constant | linear | cosine with `warmup_iterations` of linear warm-up, a
torch.optim.lr_scheduler.LambdaLR stepped once per optimiser step.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ppo_rlhf.errors import require
from ppo_rlhf.paths import require_file

SCHEDULES = ("constant", "linear", "cosine")


def read_texts(path: str | Path) -> list[str]:
    path = require_file("ptx_data", str(path))
    texts = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                require(False, f"{path}:{number}: not valid JSON")
            text = row.get("text") if isinstance(row, dict) else None
            require(isinstance(text, str) and text.strip() != "", f'{path}:{number}: needs a non-empty "text" string')
            texts.append(text)
        else:
            texts.append(line)
    require(len(texts) > 0, f"{path} has no texts")
    return texts


class PtxData:
    """Cycling batches of tokenised texts (right-padded; the mask is 1 on text tokens)."""

    def __init__(self, texts: list[str], tokenizer, batch_size: int, max_tokens: int, seed: int):
        self.tokenizer, self.batch_size, self.max_tokens = tokenizer, batch_size, max_tokens
        self.ids = []
        for text in texts:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"][:max_tokens]
            if len(ids) >= 2:  # at least one next-token prediction
                self.ids.append(ids)
        require(len(self.ids) > 0, "no ptx text is at least 2 tokens long")
        self.generator = np.random.default_rng(seed)
        self.order = self.generator.permutation(len(self.ids)).tolist()
        self.position = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = []
        while len(rows) < self.batch_size:
            if self.position == len(self.order):
                self.order, self.position = self.generator.permutation(len(self.ids)).tolist(), 0
            rows.append(self.ids[self.order[self.position]])
            self.position += 1
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        attention_mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        return input_ids, attention_mask

    def state(self) -> dict[str, Any]:
        return {"order": self.order, "position": self.position, "generator": self.generator.bit_generator.state}

    def load(self, state: dict[str, Any]) -> None:
        self.order, self.position = state["order"], state["position"]
        self.generator.bit_generator.state = state["generator"]


def ptx_nll(policy: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
            chunk_size: int | None = 64) -> torch.Tensor:
    """Mean next-token negative log-likelihood over the text tokens, logits at temperature 1 (with gradients)."""
    from ppo_rlhf.objectives import masked_mean
    from ppo_rlhf.rollout import token_logprobs

    logprobs = token_logprobs(policy, input_ids, attention_mask, 1.0, chunk_size=chunk_size)
    target_mask = attention_mask[:, 1:].to(logprobs.dtype)  # position t predicts token t+1
    return -masked_mean(logprobs, target_mask)


def lr_lambda(schedule: str, warmup_steps: int, total_steps: int):
    """The LR multiplier after `step` optimiser steps: linear warm-up from 1/warmup to 1, then constant,
    linear decay to 0, or cosine decay to 0 at `total_steps`."""
    require(schedule in SCHEDULES, f"lr_schedule must be one of {SCHEDULES}, got {schedule!r}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def make_scheduler(optimizer: torch.optim.Optimizer, schedule: str, warmup_steps: int, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(schedule, warmup_steps, total_steps))
