"""PPO-ptx (section 8.12's "what we did not do"; off by default).

PPO-ptx (InstructGPT): a language-modelling loss on given text mixed into every optimiser step,
    loss = policy loss + ptx_coef * mean next-token NLL of a batch of `ptx_batch_size` texts,
the NLL at temperature 1 (it is ordinary language modelling, not the sampling distribution). The texts come from
`ptx_data`, a JSONL file with one {"text": ...} per line or a plain text file with one text per line, shuffled
with the run's seed and cycled through; the position is saved in checkpoints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ppo_rlhf.errors import require
from ppo_rlhf.models.logprobs import token_logprobs
from ppo_rlhf.models.padding import right_pad
from ppo_rlhf.ppo.objectives import normalise_loss
from ppo_rlhf.utils.paths import require_file


def read_texts(path: str | Path) -> list[str]:
    path = require_file("ptx_data", str(path))
    texts: list[str] = []
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
            texts.append(str(text))
        else:
            texts.append(line)
    require(len(texts) > 0, f"{path} has no texts")
    return texts


def ptx_data(cfg, tokenizer) -> PtxData | None:
    """A TrainConfig's PPO-ptx batches (its ptx_data, ptx_batch_size, ptx_max_tokens), None with ptx_coef 0."""
    if not cfg.ptx_coef > 0:
        return None
    assert cfg.ptx_data is not None  # (TrainConfig.validate: ptx_coef needs ptx_data)
    return PtxData(read_texts(cfg.ptx_data), tokenizer, cfg.ptx_batch_size, cfg.ptx_max_tokens, cfg.seed + 2)


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
        rows: list[list[int]] = []
        while len(rows) < self.batch_size:
            if self.position == len(self.order):
                self.order, self.position = self.generator.permutation(len(self.ids)).tolist(), 0
            rows.append(self.ids[self.order[self.position]])
            self.position += 1
        return right_pad(rows, self.tokenizer.pad_token_id)

    def state(self) -> dict[str, Any]:
        return {"order": self.order, "position": self.position, "generator": self.generator.bit_generator.state}

    def load(self, state: dict[str, Any]) -> None:
        self.order, self.position = state["order"], state["position"]
        self.generator.bit_generator.state = state["generator"]


def ptx_targets(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, L-1] 1 where a next-token prediction has a text token to predict (position t predicts token t+1)."""
    return attention_mask[:, 1:].float()


def ptx_nll(policy: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
            chunk_size: int | None = 64, count: float | None = None) -> torch.Tensor:
    """Next-token negative log-likelihood summed over the text tokens / `count` (the global count of those tokens;
    None: this batch's, i.e. its mean), logits at temperature 1 (with gradients)."""
    logprobs = token_logprobs(policy, input_ids, attention_mask, 1.0, chunk_size=chunk_size)
    return normalise_loss(-logprobs, ptx_targets(attention_mask).to(logprobs.dtype), "token", count)
