"""Padding-free forward passes: a right-padded batch's real tokens packed into one row, the model run once over it,
and per-token outputs put back in the [b, l] layout (`padding_free` in TrainConfig).

A right-padded micro-batch of b rows runs b x l positions through every layer, however short most rows are. Packed,
it runs only the real tokens: position ids restart at 0 at each sequence (the positions each row has in the padded
layout, so rotary embeddings see the same angles), and each token attends only to the earlier tokens of its own
sequence.

Attention, by the implementation the model was loaded with:
* flash-attention (GPU): the body gets `position_ids` and the sequences' boundaries (`cu_seq_lens_q/k`,
  `max_length_q/k`, transformers' FlashAttentionKwargs) and runs the variable-length kernel. Present, not tested
  here (written on a CPU machine without flash-attn).
* anything else (SDPA, eager; CPU): `packed_sdpa` for the packed pass: attention alone runs on the sequences laid out
  right-padded again, one causal SDPA call (the padded path's attention work), every other layer on the packed row.
  Two other ways were slower on this CPU: transformers 5.25 builds a block-diagonal causal mask itself from
  restarting `position_ids` (no attention mask, and `use_cache=False`: with the config's default `use_cache=True` it
  makes a KV cache and then silently skips that detection), but SDPA then scores all T x T pairs of the packed row
  (8 sequences of ~66 tokens: 2.2x the attention time, bf16, one thread); one SDPA call per sequence left the
  update's forward+backward no faster than the padded one (its 8 x 30 calls per pass, and each slice's gradient a
  full-size zero tensor, summed).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from transformers import AttentionInterface

from ppo_rlhf.errors import require

# Architectures whose forward passes position ids to the rotary embedding and attention kwargs to each attention
# call, checked against the padded path by tests/models/test_packing.py (SmolLM2 is llama, Qwen2.5 is qwen2). Another
# architecture may not: refused rather than trusted.
PACKED_MODEL_TYPES = ("llama", "qwen2")
PACKED_SDPA = "ppo_rlhf_packed_sdpa"  # its name among transformers' attention implementations


def packed_sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                cu_seq_lens_q: torch.Tensor | None = None, max_length_q: int | None = None,
                **kwargs) -> tuple[torch.Tensor, None]:
    """Causal SDPA of the sequences of a packed row: query [1, heads, T, d], key/value [1, kv_heads, T, d] ->
    [1, T, heads, d] (transformers' attention-function contract).

    Attention alone runs with the sequences laid out right-padded again, [b, heads, l, d], in one causal SDPA call:
    right padding sits after every real token, so causality alone keeps it out of every real token's attention. That
    is the padded path's attention work (b x l^2, no mask), while every other layer runs on the T real tokens."""
    require(getattr(module, "sliding_window", None) is None, "padding_free does not do sliding-window attention")
    assert cu_seq_lens_q is not None  # (transformers passes the packing's boundaries with the position ids)
    lengths = cu_seq_lens_q.diff()
    rows = torch.repeat_interleave(torch.arange(len(lengths), device=query.device), lengths)
    cols = torch.arange(query.shape[2], device=query.device) - cu_seq_lens_q[:-1].to(query.device)[rows]

    def padded(x: torch.Tensor) -> torch.Tensor:  # [1, h, T, d] -> [b, h, l, d], zeros at padding
        out = x.new_zeros((len(lengths), max_length_q, x.shape[1], x.shape[3]))
        return out.index_put((rows, cols), x[0].transpose(0, 1)).transpose(1, 2)

    out = nn.functional.scaled_dot_product_attention(padded(query), padded(key), padded(value), dropout_p=dropout,
                                                     is_causal=True, scale=scaling,
                                                     enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2)[rows, cols][None], None


AttentionInterface.register(PACKED_SDPA, packed_sdpa)


@contextmanager
def packed_attention(config) -> Iterator[None]:
    """The model's attention made `packed_sdpa` for one packed pass (flash-attention's variable-length kernel already
    reads the packed sequences: left alone)."""
    original = config._attn_implementation
    if (original or "").startswith("flash"):
        yield
        return
    # a name without a mask function: transformers builds no mask at all (the T x T one would go unused)
    config._attn_implementation = PACKED_SDPA
    try:
        yield
    finally:
        config._attn_implementation = original


@dataclass(frozen=True)
class Packing:
    """Where each real token of a right-padded [b, l] batch sits in the packed row of its T real tokens."""

    rows: torch.Tensor  # [T] long, the token's row in the padded layout
    cols: torch.Tensor  # [T] long, its column there, which is also its position id
    lengths: torch.Tensor  # [b] long, each row's real tokens
    width: int  # l

    @classmethod
    def of(cls, attention_mask: torch.Tensor) -> Packing:
        # nonzero walks row by row, so each sequence's tokens stay together and in order
        rows, cols = attention_mask.nonzero(as_tuple=True)
        return cls(rows, cols, attention_mask.sum(dim=1), attention_mask.shape[1])

    def pack(self, padded: torch.Tensor) -> torch.Tensor:
        """[b, l, ...] -> [T, ...]: the real tokens' entries, sequence after sequence."""
        return padded[self.rows, self.cols]

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """[T, ...] -> [b, l, ...]: back in the padded layout, 0 at padding (differentiable)."""
        shape = (len(self.lengths), self.width, *packed.shape[1:])
        return packed.new_zeros(shape).index_put((self.rows, self.cols), packed)

    def hidden_states(self, body: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
        """The body's last hidden states of the real tokens, [T, D], from one forward over the packed row."""
        config = body.config
        checked = ", ".join(PACKED_MODEL_TYPES)
        require(config.model_type in PACKED_MODEL_TYPES,
                f"padding_free is checked on {checked} models only, not {config.model_type}: set padding_free: false")
        bounds = nn.functional.pad(self.lengths.cumsum(0), (1, 0)).to(torch.int32)  # each sequence's start, then T
        longest = int(self.lengths.max())
        with packed_attention(config):
            out = body(input_ids=self.pack(input_ids)[None], position_ids=self.cols[None], use_cache=False,
                       cu_seq_lens_q=bounds, cu_seq_lens_k=bounds, max_length_q=longest, max_length_k=longest)
        return out.last_hidden_state[0]
