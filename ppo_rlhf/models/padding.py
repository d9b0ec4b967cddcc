"""Right padding of token-id rows into the [B, L] tensors the models take."""

from __future__ import annotations

import torch


def right_pad(rows: list[list[int]], pad_id: int, min_width: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [B, L] long, attention_mask [B, L] long) with L the longest row, at least `min_width`. The mask
    comes from the rows' lengths, never from `id == pad_id` (for SmolLM2 pad == eos)."""
    width = max(max(len(row) for row in rows), min_width)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        input_ids[index, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention_mask[index, : len(row)] = 1
    return input_ids, attention_mask
