"""A decode loop that drops finished rows (`generation_drop_finished`): after each step the rows that emitted an
EOS leave the batch and its KV cache, so later steps compute only the rows still writing.

Hugging Face `generate` keeps every row to the last step and appends pad to the finished ones: at SmolLM2 batch 16,
20% of the decode row-steps at cap 48 and 34% at cap 128 are finished rows (bench/HISTORY.md). This loop does what
`generate` does for our greedy-over-TokenSampler set-up (rollout._sampling_config): one prefill of the left-padded
prompts, then one token per step through a DynamicCache, position ids from the attention mask (generate's rule),
the LM head on the last position only, and returns the same [B, steps] tokens, pad after each row's EOS.
TokenSampler draws one uniform per row of the WHOLE batch each step and hands each live row its own, so the random
stream is generate's, and so are the tokens as long as the live rows' logits are: a matmul over fewer rows may round
differently (CPU GEMM kernels change with the row count: on an AMX CPU fp32 [M, 576] x [576, 1536] rows differ
from the 64-row product's for M <= 15, bf16 ones at other M), and a row whose draw falls within that rounding of a
token boundary then takes the neighbouring token. Measured: the same tokens in float32 and bf16 on SmolLM2 (two
batches of 8, cap 40) and in float32 on the tests' tiny models, where only a last row alone (M = 1) rounds its
log-probs differently (4e-6; tests/models/test_generation_drop.py).

Dropping a row selects the surviving rows of every cached key and value (a copy of the cache, once per step in
which some row finished); the columns of left padding stay, masked as before.
"""

from __future__ import annotations

import inspect
from typing import Protocol

import torch
from torch import nn
from transformers import DynamicCache


class Sampler(Protocol):
    """What the loop asks of its sampler (`rollout.TokenSampler`): the tokens of the live rows `rows` of a batch."""

    def draw(self, scores: torch.Tensor, rows: torch.Tensor, batch_size: int) -> torch.Tensor: ...


def _forward_keywords(model: nn.Module) -> tuple[str, dict]:
    """(the cache keyword, the keywords for the LM head on the last position only) the model's forward takes:
    transformers 5 names the cache `cache`, 4.x `past_key_values`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT: the transformers model
    parameters = inspect.signature(base.forward).parameters
    cache = "cache" if "cache" in parameters else "past_key_values"
    return cache, {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}


def _new_cache(model: nn.Module) -> DynamicCache:
    """The cache `generate` makes (transformers 5 builds its layer types from the config)."""
    if "config" in inspect.signature(DynamicCache).parameters:
        return DynamicCache(config=model.config.get_text_config(decoder=True))
    return DynamicCache()


def _anyone_writing(writing_here: bool, synced: bool, device: torch.device) -> bool:
    """Whether a row is still writing here or, under FSDP (`synced`), in any process: their forwards must pair up
    for the sharded layers' all-gathers (generate's synced_gpus rule)."""
    if not synced:
        return writing_here
    import torch.distributed as dist

    flag = torch.tensor(1.0 if writing_here else 0.0, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.SUM)
    return flag.item() > 0


@torch.no_grad()
def decode_dropping_finished(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                             sampler: Sampler, max_new_tokens: int, eos: list[int], pad: int,
                             synced: bool = False) -> torch.Tensor:
    """The new tokens [B, steps] for left-padded prompts `input_ids` [B, P] (pad after a row's EOS; steps = the
    steps until every row has an EOS or the cap), sampled by `sampler`, each step computing only the rows without
    an EOS yet. `synced` (FSDP): a process whose rows all ended keeps one row and steps on, without sampling, until
    every process's have (generate's synced_gpus)."""
    batch, device = input_ids.shape[0], input_ids.device
    cache_keyword, head = _forward_keywords(model)
    cache = _new_cache(model)
    out = torch.full((batch, max_new_tokens), pad, dtype=torch.long, device=device)
    eos_ids = torch.tensor(eos, device=device)
    # generate's position ids: count of real tokens before each one (left padding gets 0)
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
    step_ids, mask = input_ids, attention_mask
    rows = torch.arange(batch, device=device)  # which batch rows the forward's rows are
    writing = True  # False once this process's rows all ended and it only keeps pace with the others (synced)
    steps = 0
    for step in range(max_new_tokens):
        logits = model(input_ids=step_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                       **{cache_keyword: cache}, **head).logits
        if writing:
            tokens = sampler.draw(logits[:, -1].to(copy=True, dtype=torch.float32), rows, batch)
            out[rows, step] = tokens
            steps = step + 1
            going = ~torch.isin(tokens, eos_ids)
        if step + 1 == max_new_tokens:  # the cap: every process stops here together
            break
        writing = writing and bool(going.any())
        if not _anyone_writing(writing, synced, device):
            break
        if not writing:  # (synced only) keep one row to step with; its outputs are never read
            going = torch.zeros_like(going).index_fill_(0, torch.tensor([0], device=device), True)
        if not going.all():
            keep = going.nonzero().squeeze(-1)
            cache.batch_select_indices(keep)
            rows, tokens, mask, positions = rows[keep], tokens[keep], mask[keep], positions[keep]
        step_ids = tokens[:, None]
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
        positions = positions[:, -1:] + 1
    return out[:, :steps]
