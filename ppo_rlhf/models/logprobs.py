"""Per-token log-probs (and entropies) of a sequence at a temperature, with the LM head run over chunks of
positions so the full [B, L, V] logits never exist at once.

Tensor conventions (docs/DESIGN.md): per-token tensors are [B, L-1] and entry t is about choosing token t+1.
"""

from __future__ import annotations

from typing import Literal, overload

import torch
from peft import PeftModel
from torch import nn
from torch.utils.checkpoint import checkpoint

from ppo_rlhf.errors import require
from ppo_rlhf.models.packing import Packing


def entropy_from_logits(logits: torch.Tensor, logz: torch.Tensor | None = None) -> torch.Tensor:
    """Entropy in nats of softmax(logits) over the last dim: logsumexp(z) - sum p z, stable for large logits.
    `logz`: logsumexp(logits) when the caller has it already (the log-probs share it; a second one would round the
    gradient differently)."""
    probs = torch.softmax(logits, dim=-1)
    return (torch.logsumexp(logits, dim=-1) if logz is None else logz) - (probs * logits).sum(-1)


def body_and_lm_head(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    # LoRA layers are injected in place, so the inner model's body and head run with the adapter
    # (or without it inside `with policy.disable_adapter():`).
    inner = model.base_model.model if isinstance(model, PeftModel) else model
    # Models that transform logits after the head (Gemma 2 soft-capping, Cohere scaling) would need their own code.
    plain_head = all(getattr(inner.config, key, None) is None for key in ("final_logit_softcapping", "logit_scale"))
    require(plain_head, f"{type(inner).__name__} post-processes its logits; token_logprobs needs a plain LM head")
    body = getattr(inner, inner.base_model_prefix, None) or inner.get_decoder()
    return body, inner.get_output_embeddings()


class FrozenHeadLogprobs(torch.autograd.Function):
    """log softmax(hidden @ W^T / T) at the targets, for a frozen LM head (LoRA never trains it), with the
    gradient with respect to `hidden` formed in forward: d log p(y) / d h = (W[y] - p @ W) / T.

    Checkpointing would run the head three times per chunk (forward, recompute, backward); this runs it twice
    (logits, p @ W) and keeps only a [B, C, D] tensor for backward, never the [B, C, V] logits.
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float):
        precise = torch.promote_types(hidden.dtype, torch.float32)  # bf16 -> fp32, fp64 stays (gradcheck)
        logits = (hidden @ weight.T).to(precise) / temperature
        logz = logits.logsumexp(-1)
        logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logz
        probs = torch.exp(logits - logz.unsqueeze(-1))
        del logits
        expected_row = (probs.to(weight.dtype) @ weight).to(precise)  # E_p[W[y']], [B, C, D]
        ctx.save_for_backward((weight[targets].to(precise) - expected_row) / temperature)
        ctx.hidden_dtype = hidden.dtype
        return logprobs

    @staticmethod
    def backward(ctx, grad_logprobs: torch.Tensor):
        (grad_hidden,) = ctx.saved_tensors
        return (grad_logprobs.unsqueeze(-1) * grad_hidden).to(ctx.hidden_dtype), None, None, None


def _frozen_plain_head(head: nn.Module) -> bool:
    return isinstance(head, nn.Linear) and head.bias is None and not head.weight.requires_grad


def _chunk_logprobs(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, entropy: bool):
    logits = head(hidden).float() / temperature  # [B, C, V], only C positions at a time
    logz = logits.logsumexp(-1)
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logz
    if not entropy:
        return logprobs, None
    return logprobs, entropy_from_logits(logits, logz)  # logz shared with the log-probs


def _head_logprobs(head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                   with_entropy: bool, chunk_size: int | None, step: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log-probs (and entropies) of `targets` [B, N] from `hidden` [B, N, D], the head run over `step` positions at
    a time: [B, N] each."""
    logprobs, entropies = [], []  # entropies holds Nones unless with_entropy
    for start in range(0, hidden.shape[1], step):
        # contiguous: torch's CPU matmul of a strided [B, C, D] slice by the [V, D] head copies the head once per row
        # in bf16 (6x slower on SmolLM2: bench/HISTORY.md, "A strided slice before the LM head")
        h, tgt = hidden[:, start : start + step].contiguous(), targets[:, start : start + step]
        with_grad = torch.is_grad_enabled() and h.requires_grad
        if with_grad and not with_entropy and _frozen_plain_head(head):
            lp, ent = FrozenHeadLogprobs.apply(h, head.weight, tgt, temperature), None
        elif with_grad and chunk_size is not None:
            lp, ent = checkpoint(_chunk_logprobs, head, h, tgt, temperature, with_entropy, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(head, h, tgt, temperature, with_entropy)
        logprobs.append(lp)
        entropies.append(ent)
    return torch.cat(logprobs, dim=1), torch.cat(entropies, dim=1) if with_entropy else None


def _chunk_positions(chunk_size: int | None, positions: int, rows: int, vocabulary: int, chunk_mb: float) -> int:
    """Positions per LM-head chunk: `chunk_size` (None: all of them), and at most `chunk_mb` MB of fp32 logits."""
    step = chunk_size or positions
    if chunk_size is not None and chunk_mb > 0:
        step = min(step, int(chunk_mb * 2**20 / (4 * rows * vocabulary)))
    return max(1, step)


@overload
def token_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float,
                   with_entropy: Literal[False] = ..., chunk_size: int | None = ..., first: int = ...,
                   chunk_mb: float = ..., padding_free: bool = ...) -> torch.Tensor: ...
@overload
def token_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float,
                   with_entropy: bool, chunk_size: int | None = ..., first: int = ..., chunk_mb: float = ...,
                   padding_free: bool = ...) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...
def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float,
    with_entropy: bool = False,
    chunk_size: int | None = 64,
    first: int = 0,
    chunk_mb: float = 128.0,
    padding_free: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log pi(input_ids[:, t+1] | tokens 0..t) from logits / temperature, [B, L-1] (and the entropy, [B, L-1]).

    The body runs once; the LM head and the softmax run over chunks of positions, so the full [B, L, V]
    logits never exist at once. With gradients on, a frozen plain head gives its gradient in forward
    (`FrozenHeadLogprobs`); otherwise (a trained head, or the entropy asked for) each chunk is checkpointed: only
    hidden states are kept and the chunk's logits are recomputed in backward. Positions before `first` (e.g.
    `first_reply_position`: prompt positions, where no row has a reply token) skip the LM head and are returned as 0.
    A chunk also holds at most `chunk_mb` MB of fp32 logits (0: no limit): many rows over a wide vocabulary get
    fewer positions per chunk (16 rows x 64 positions x Qwen's 151,936 ids would be 622 MB, and the softmax keeps
    about three such tensors at once).

    `padding_free`: the body runs over the real tokens packed into one row (`packing.Packing`) and the head over
    the positions from `first` whose next token is real, B x `chunk_size` of them per chunk; the same numbers at
    those positions, 0 at padding (the padded path leaves there whatever the model computed).
    """
    require(temperature > 0, f"temperature must be > 0, got {temperature}")
    require(chunk_size is None or chunk_size >= 1, f"chunk_size must be >= 1 or None, got {chunk_size}")
    body, head = body_and_lm_head(model)
    vocabulary = head.weight.shape[0]
    if padding_free:
        packing = Packing.of(attention_mask)
        hidden = packing.hidden_states(body, input_ids)  # [T, D]
        # packed token p's target is packed token p + 1, except at a sequence's last token (no target)
        keep = (packing.cols >= first) & (packing.cols < packing.lengths[packing.rows] - 1)
        index = keep.nonzero().squeeze(1)
        targets = input_ids[packing.rows[index], packing.cols[index] + 1]
        step = _chunk_positions(chunk_size and chunk_size * len(input_ids), len(index), 1, vocabulary, chunk_mb)
        logprobs, entropies = _head_logprobs(head, hidden[index][None], targets[None], temperature, with_entropy,
                                             chunk_size, step)
        at = (packing.rows[index], packing.cols[index])  # where each lands in the [B, L-1] layout
        shape = (len(input_ids), input_ids.shape[1] - 1)
        logprobs, entropies = (None if x is None else x.new_zeros(shape).index_put(at, x[0])
                               for x in (logprobs, entropies))
    else:
        hidden = body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, :-1]
        first = max(0, min(first, hidden.shape[1] - 1))
        step = _chunk_positions(chunk_size, hidden.shape[1] - first, hidden.shape[0], vocabulary, chunk_mb)
        logprobs, entropies = _head_logprobs(head, hidden[:, first:], input_ids[:, 1 + first :], temperature,
                                             with_entropy, chunk_size, step)
        logprobs, entropies = (None if x is None else nn.functional.pad(x, (first, 0)) for x in (logprobs, entropies))
    return (logprobs, entropies) if with_entropy else logprobs


def first_reply_position(prompt_ids: list[list[int]]) -> int:
    """The first per-token position that can hold a reply token in a batch of these prompts (its shortest - 1)."""
    return min(len(p) for p in prompt_ids) - 1
