"""Sampling a rollout: one reply per prompt by KV-cached batched generation, with the log-probs and entropies
generation saw (SampledTokenLogprobs), in the right-padded layout PPO works on.

Tensor conventions (docs/DESIGN.md): sequences are RIGHT-padded [B, L]; per-token tensors are [B, L-1] and
entry t is about choosing token t+1 after tokens 0..t. Masks come from known lengths, never from `token == pad`
(for SmolLM2 pad == eos).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, PreTrainedTokenizerBase

from ppo_rlhf.chat import chat_prompt_ids
from ppo_rlhf.distributed import current
from ppo_rlhf.errors import require
from ppo_rlhf.objectives import entropy_from_logits
from ppo_rlhf.padding import right_pad


def build_batch(
    prompt_ids: list[list[int]], reply_ids: list[list[int]], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids [B, L], attention_mask [B, L], action_mask [B, L-1]) with L the longest row."""
    require(len(prompt_ids) == len(reply_ids) and len(prompt_ids) > 0, "need as many replies as prompts, at least one")
    require(all(len(p) > 0 for p in prompt_ids), "every prompt needs at least one token")
    # at least width 2: one per-token position
    input_ids, attention_mask = right_pad([p + r for p, r in zip(prompt_ids, reply_ids)], pad_token_id, min_width=2)
    action_mask = torch.zeros((len(prompt_ids), input_ids.shape[1] - 1), dtype=torch.float32)
    for row, (prompt, reply) in enumerate(zip(prompt_ids, reply_ids)):
        # position t predicts token t+1: reply tokens sit at len(prompt) .. len(prompt)+len(reply)-1
        action_mask[row, len(prompt) - 1 : len(prompt) + len(reply) - 1] = 1.0
    return input_ids, attention_mask, action_mask


@dataclass
class Rollout:
    """One reply per prompt, with the right-padded tensors PPO works on."""

    prompts: list[str]
    prompt_ids: list[list[int]]
    reply_ids: list[list[int]]  # includes the closing EOS when finished
    reply_texts: list[str]  # decoded without special tokens
    finished: torch.Tensor  # [B] bool: emitted an EOS within the cap
    input_ids: torch.Tensor  # [B, L] long, right-padded prompt + reply
    attention_mask: torch.Tensor  # [B, L] long
    action_mask: torch.Tensor  # [B, L-1] float, 1 where input_ids[:, t+1] is a reply token
    logprobs: torch.Tensor | None = None  # [B, L-1] log pi(token) at the sampling temperature, recorded by generate
    entropy: torch.Tensor | None = None  # [B, L-1] entropy of that distribution; both 0 off the reply tokens

    @property
    def reply_lengths(self) -> torch.Tensor:
        return torch.tensor([len(r) for r in self.reply_ids], dtype=torch.long)

    def select(self, index: list[int] | torch.Tensor | slice) -> Rollout:
        """A subset of rows (list, tensor or slice), re-trimmed to its own longest sequence."""
        rows = torch.arange(len(self.prompts))[index].reshape(-1).tolist()
        width = max(max(len(self.prompt_ids[i]) + len(self.reply_ids[i]) for i in rows), 2)
        return Rollout(
            prompts=[self.prompts[i] for i in rows],
            prompt_ids=[self.prompt_ids[i] for i in rows],
            reply_ids=[self.reply_ids[i] for i in rows],
            reply_texts=[self.reply_texts[i] for i in rows],
            finished=self.finished[rows],
            input_ids=self.input_ids[rows, :width],
            attention_mask=self.attention_mask[rows, :width],
            action_mask=self.action_mask[rows, : width - 1],
            logprobs=None if self.logprobs is None else self.logprobs[rows, : width - 1],
            entropy=None if self.entropy is None else self.entropy[rows, : width - 1],
        )


def eos_token_ids(model: nn.Module, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Every token that ends a reply: the model's generation_config EOS ids plus the tokenizer's EOS."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = set(configured if isinstance(configured, list) else [configured]) | {tokenizer.eos_token_id}
    ids.discard(None)
    return sorted(ids)


def _sampling_config(max_new_tokens: int, temperature: float, top_p: float, eos: list[int], pad: int):
    # transformers fills every field we leave unset from the model's own generation_config (a hub model may
    # ship repetition_penalty, top_k, min_p, ...), so set every distribution-changing field to its neutral value:
    # the tokens must come from softmax(logits / temperature), the distribution token_logprobs computes.
    return GenerationConfig(
        do_sample=True,
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        temperature=temperature,
        top_p=top_p,
        top_k=0,  # HF's default of 50 would truncate the distribution
        min_p=0.0,
        typical_p=1.0,
        epsilon_cutoff=0.0,
        eta_cutoff=0.0,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        num_beams=1,
        use_cache=True,
        eos_token_id=eos,
        pad_token_id=pad,
    )


class SampledTokenLogprobs(LogitsProcessor):
    """Records, at every step of `generate`, log pi(sampled token) and the entropy of softmax(logits / temperature).

    It sees the raw logits: Hugging Face runs custom processors before its temperature and top-p warpers, so the
    distribution is the one token_logprobs computes. The token drawn at step s is known only at step s+1 (as
    input_ids[:, -1]), so one step's log-softmax waits in `pending`: [B, V] memory, never [B, steps, V].
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.logprobs: list[torch.Tensor] = []  # one [B] per resolved step
        self.entropies: list[torch.Tensor] = []  # one [B] per step seen
        self.pending: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.pending is not None:
            self.resolve(input_ids[:, -1])
        logits = scores.float() / self.temperature
        # a banned token's -inf logit (an HF processor ran first) made finite, so that its 0 * logit term is 0
        self.entropies.append(entropy_from_logits(logits.clamp(min=torch.finfo(logits.dtype).min)))
        self.pending = torch.log_softmax(logits, dim=-1)
        return scores

    def resolve(self, tokens: torch.Tensor) -> None:
        self.logprobs.append(self.pending.gather(-1, tokens[:, None]).squeeze(-1))
        self.pending = None

    def finish(self, new_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """([b, steps], [b, steps]) for the `new_tokens` [b, steps] generate returned (it may drop a last step)."""
        steps = new_tokens.shape[1]
        if self.pending is not None and len(self.logprobs) < steps:
            self.resolve(new_tokens[:, len(self.logprobs)])
        return torch.stack(self.logprobs[:steps], dim=1), torch.stack(self.entropies[:steps], dim=1)


def per_token_layout(prompt_ids: list[list[int]], values: list[list[float]], width: int) -> torch.Tensor:
    """Per-reply-token values placed in the [B, width - 1] per-token layout (entry len(prompt) - 1 + s for reply
    token s)."""
    out = torch.zeros((len(prompt_ids), width - 1), dtype=torch.float32)
    for row, (prompt, row_values) in enumerate(zip(prompt_ids, values)):
        out[row, len(prompt) - 1 : len(prompt) - 1 + len(row_values)] = torch.tensor(row_values, dtype=torch.float32)
    return out


@torch.no_grad()
def generate_rollout(
    policy: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    max_new_tokens: int,
    temperature: float,
    batch_size: int | None = None,
    top_p: float = 1.0,
    record_logprobs: bool = False,
) -> Rollout:
    """Sample one reply per prompt and build the right-padded batch (CPU tensors).

    Random numbers come from torch's global RNG. Tokens are drawn from softmax(logits / temperature), the
    distribution token_logprobs computes, unless top_p < 1 truncates it. With `record_logprobs` the rollout also
    carries log pi(token) and the entropy of the untruncated tempered distribution, from the logits generation
    computed anyway (KV-cached, left-padded: equal to token_logprobs up to float rounding).
    """
    require(len(prompts) > 0, "no prompts to generate from")
    require(max_new_tokens >= 1, f"max_new_tokens must be >= 1, got {max_new_tokens}")
    require(temperature > 0, f"temperature must be > 0, got {temperature}")
    require(0 < top_p <= 1, f"top_p must be in (0, 1], got {top_p}")
    batch_size = batch_size or len(prompts)
    require(batch_size >= 1, f"batch_size must be >= 1, got {batch_size}")
    policy.eval()
    device = next(policy.parameters()).device
    pad = tokenizer.pad_token_id
    eos = eos_token_ids(policy, tokenizer)
    config = _sampling_config(max_new_tokens, temperature, top_p, eos, pad)

    prompt_ids = [chat_prompt_ids(tokenizer, p) for p in prompts]
    reply_ids: list[list[int]] = []
    finished: list[bool] = []
    reply_logprobs: list[list[float]] = []
    reply_entropies: list[list[float]] = []
    # FSDP: a process whose replies all ended keeps stepping until every process's have, so that the sharded
    # layers' all-gathers match up
    synced = current().fsdp
    for start in range(0, len(prompts), batch_size):
        chunk = prompt_ids[start : start + batch_size]
        prompt_width = max(len(p) for p in chunk)
        # Left padding for generation, so every row's next token is appended at the same column.
        ids = torch.tensor([[pad] * (prompt_width - len(p)) + p for p in chunk], device=device)
        mask = torch.tensor([[0] * (prompt_width - len(p)) + [1] * len(p) for p in chunk], device=device)
        recorder = SampledTokenLogprobs(temperature) if record_logprobs else None
        out = policy.generate(input_ids=ids, attention_mask=mask, generation_config=config, synced_gpus=synced,
                              logits_processor=LogitsProcessorList([recorder] if recorder else []))
        new_tokens = out[:, prompt_width:]
        if recorder is not None:
            logprobs, entropies = (t.tolist() for t in recorder.finish(new_tokens))
        for i, row in enumerate(new_tokens.tolist()):
            # Cut at the first EOS (kept): HF pads finished rows with pad, which may equal EOS.
            end = next((j for j, token in enumerate(row) if token in eos), None)
            reply_ids.append(row if end is None else row[: end + 1])
            finished.append(end is not None)
            if recorder is not None:
                reply_logprobs.append(logprobs[i][: len(reply_ids[-1])])
                reply_entropies.append(entropies[i][: len(reply_ids[-1])])

    input_ids, attention_mask, action_mask = build_batch(prompt_ids, reply_ids, pad)
    width = input_ids.shape[1]
    return Rollout(
        prompts=list(prompts),
        prompt_ids=prompt_ids,
        reply_ids=reply_ids,
        reply_texts=tokenizer.batch_decode(reply_ids, skip_special_tokens=True),
        finished=torch.tensor(finished, dtype=torch.bool),
        input_ids=input_ids,
        attention_mask=attention_mask,
        action_mask=action_mask,
        logprobs=per_token_layout(prompt_ids, reply_logprobs, width) if record_logprobs else None,
        entropy=per_token_layout(prompt_ids, reply_entropies, width) if record_logprobs else None,
    )
