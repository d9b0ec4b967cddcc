"""Sampling a rollout: one reply per prompt by KV-cached batched generation, with the log-probs and entropies
generation saw (TokenSampler), in the right-padded layout PPO works on.

Tensor conventions (docs/DESIGN.md): sequences are RIGHT-padded [B, L]; per-token tensors are [B, L-1] and
entry t is about choosing token t+1 after tokens 0..t. Masks come from known lengths, never from `token == pad`
(for SmolLM2 pad == eos).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

import torch
from torch import nn
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, PreTrainedTokenizerBase

from ppo_rlhf.data import Prompt
from ppo_rlhf.errors import require
from ppo_rlhf.models.chat import chat_prompt_ids
from ppo_rlhf.models.decode import decode_dropping_finished
from ppo_rlhf.models.padding import right_pad
from ppo_rlhf.parallel.distributed import current


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


SEQUENCE_FIELDS = ("input_ids", "attention_mask")  # [B, L]; every other 2-D field is per-token, [B, L-1]
Selected = TypeVar("Selected", bound="Rollout")


@dataclass
class Rollout:
    """One reply per prompt, with the right-padded tensors PPO works on (`ppo.experience.Experience` adds what is
    scored about them)."""

    prompts: list[Prompt]  # strings or chat-message lists (data.Prompt)
    prompt_ids: list[list[int]]
    reply_ids: list[list[int]]  # includes the closing EOS when finished
    reply_texts: list[str]  # decoded without special tokens
    finished: torch.Tensor  # [B] bool: emitted an EOS within the cap
    input_ids: torch.Tensor  # [B, L] long, right-padded prompt + reply
    attention_mask: torch.Tensor  # [B, L] long
    action_mask: torch.Tensor  # [B, L-1] float, 1 where input_ids[:, t+1] is a reply token
    logprobs: torch.Tensor | None = None  # [B, L-1] log pi(token) at the sampling temperature, recorded by generate
    entropy: torch.Tensor | None = None  # [B, L-1] entropy of that distribution; both 0 off the reply tokens
    env_rewards: torch.Tensor | None = None  # [B, L-1] a multi-turn environment's reward of each turn, at its end
    # each row's other dataset columns, carried from where the prompts were drawn to every reader (the reward
    # functions, the monitor's judges): the prompt itself may change on the way (a multi-turn environment's reset
    # appends its observation), so it cannot identify the row. Empty dicts for prompts from no dataset.
    columns: list[dict[str, Any]] = field(default_factory=list)
    # what the reward functions get as `completion_ids`, the ids of `reply_texts`: the reply (multi-turn: its last
    # turn; reply_ids is then the whole trajectory after the prompt, observations included)
    completion_ids: list[list[int]] = field(default_factory=list)
    # a multi-turn rollout's episodes, one per row (multiturn.episodes.Episode: its turns, tool calls and errors, which
    # of its tokens are the policy's), for the dashboard and `ppo-rlhf check`; None for single replies
    episodes: list[Any] | None = None

    def __post_init__(self) -> None:
        self.columns = self.columns or [{} for _ in self.prompts]
        self.completion_ids = self.completion_ids or self.reply_ids

    @property
    def reply_lengths(self) -> torch.Tensor:
        return torch.tensor([len(r) for r in self.reply_ids], dtype=torch.long)

    def select(self: Selected, index: list[int] | torch.Tensor | slice) -> Selected:
        """A subset of rows (list, tensor or slice), every field (a subclass's too), re-trimmed to its own longest
        sequence (short replies cost no padding)."""
        rows = torch.arange(len(self.prompts))[index].reshape(-1).tolist()
        width = max(max(len(self.prompt_ids[i]) + len(self.reply_ids[i]) for i in rows), 2)
        picked = {}
        for member in fields(self):
            value = getattr(self, member.name)
            if isinstance(value, list):
                picked[member.name] = [value[i] for i in rows]
            elif value is not None:
                value = value[rows]
                cut = width if member.name in SEQUENCE_FIELDS else width - 1
                picked[member.name] = value[:, :cut] if value.dim() == 2 else value
        return replace(self, **picked)


def cut_at_eos(row: list[int], eos: list[int]) -> tuple[list[int], bool]:
    """A reply's token ids cut after its first EOS (kept), and whether it had one (finished). After it come only
    what a backend pads finished rows with (HF: pad, which may equal EOS)."""
    end = next((j for j, token in enumerate(row) if token in eos), None)
    return (row if end is None else row[: end + 1]), end is not None


def eos_token_ids(model: nn.Module, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Every token that ends a reply: the model's generation_config EOS ids plus the tokenizer's EOS."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = set(configured if isinstance(configured, list) else [configured]) | {tokenizer.eos_token_id}
    ids.discard(None)
    return sorted(ids)


def _sampling_config(max_new_tokens: int, eos: list[int], pad: int):
    # generate runs greedy: TokenSampler has drawn the token and left it the only finite score, so argmax picks it.
    # transformers fills every field we leave unset from the model's own generation_config (a hub model may
    # ship repetition_penalty, temperature, top_k, ...), so set every distribution-changing field to its neutral
    # value: the scores reaching TokenSampler must be the model's logits, the ones token_logprobs computes.
    return GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        min_p=None,
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


def top_p_nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs with every token outside the top-p nucleus set to 0 (not renormalised): a token stays when the tokens
    more probable than it hold less than top_p of the mass, so the most probable always stays (HF's TopP rule)."""
    if top_p >= 1.0:
        return probs
    ranked, order = probs.sort(dim=-1, descending=True)
    mass_before = ranked.cumsum(dim=-1) - ranked
    return torch.zeros_like(probs).scatter_(-1, order, ranked.masked_fill(mass_before >= top_p, 0.0))


def sample_from_(weights: torch.Tensor, uniform: torch.Tensor | None = None) -> torch.Tensor:
    """One index per row, drawn with probability proportional to `weights` [B, V] (>= 0), which it overwrites with
    their running sum: inverse CDF, one uniform per row (`uniform` [B, 1] in [0, 1); None draws them from torch's
    global RNG) (torch.multinomial draws V exponentials per row; its exponential_ was 19% of a bf16 SmolLM2 generate
    here). torch's CPU cumsum adds in float64 and rounds each entry to float32, so a token's share is within ~1e-7 of
    its probability."""
    cdf = weights.cumsum_(dim=-1)
    if uniform is None:
        uniform = torch.rand(weights.shape[0], 1, device=weights.device)
    threshold = uniform * cdf[:, -1:]
    return torch.searchsorted(cdf, threshold, right=True).clamp_(max=weights.shape[-1] - 1).squeeze(-1)


class TokenSampler(LogitsProcessor):
    """Draws each step's token from softmax(logits / temperature), truncated to the top-p nucleus, and returns
    scores in which only that token is finite, so greedy `generate` appends it.

    Sampling here instead of in HF's warpers and multinomial does the vocabulary-wide work once per step, in place
    on generate's own float32 copy of the logits and one reused buffer (fresh [B, V] tensors each step cost page
    faults that outweighed the arithmetic). With `record` it keeps, from the same log-softmax, log pi(token) and the
    entropy of the untruncated tempered distribution: what token_logprobs computes.
    """

    def __init__(self, temperature: float, top_p: float = 1.0, record: bool = False):
        self.temperature, self.top_p, self.record = temperature, top_p, record
        self.logprobs: list[torch.Tensor] = []  # one [B] per step
        self.entropies: list[torch.Tensor] = []  # one [B] per step
        self.probs: torch.Tensor | None = None  # the [B, V] buffer every step reuses

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        logits, tokens = self._draw(scores)
        return logits.fill_(float("-inf")).scatter_(-1, tokens[:, None], 0.0)

    def draw(self, scores: torch.Tensor, rows: torch.Tensor, batch_size: int) -> torch.Tensor:
        """The tokens [b] drawn from `scores` [b, V] (overwritten), the logits of rows `rows` of a batch of
        `batch_size` (decode.decode_dropping_finished, which drops finished rows): the uniforms are drawn for the
        whole batch and each row takes its own, so the random stream and each row's token are what `generate` with
        every row present gives; the record keeps the whole batch's layout (0 in the absent rows)."""
        return self._draw(scores, rows, batch_size)[1]

    def _draw(self, scores: torch.Tensor, rows: torch.Tensor | None = None,
              batch_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        # a banned token's -inf (an HF processor ran first) made finite: probability 0 and no 0 * inf in the entropy
        logits = scores.float().div_(self.temperature).clamp_(min=torch.finfo(torch.float32).min)
        logz = torch.logsumexp(logits, dim=-1, keepdim=True)
        if self.probs is None or self.probs.shape != logits.shape:
            self.probs = torch.empty_like(logits)
        probs = torch.sub(logits, logz, out=self.probs).exp_()
        if self.record:  # logprobs.entropy_from_logits's formula, on the probabilities already in the buffer
            self.entropies.append(self._in_batch(logz.squeeze(-1) - torch.linalg.vecdot(probs, logits), rows,
                                                 batch_size))
        uniform = torch.rand(batch_size or logits.shape[0], 1, device=logits.device)
        tokens = sample_from_(top_p_nucleus(probs, self.top_p), uniform if rows is None else uniform[rows])
        if self.record:
            self.logprobs.append(self._in_batch(logits.gather(-1, tokens[:, None]).squeeze(-1) - logz.squeeze(-1),
                                                rows, batch_size))
        return logits, tokens

    @staticmethod
    def _in_batch(values: torch.Tensor, rows: torch.Tensor | None, batch_size: int | None) -> torch.Tensor:
        if rows is None:
            return values
        return values.new_zeros(batch_size).index_copy_(0, rows, values)

    def finish(self, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """([b, steps], [b, steps]): the recorded log-probs and entropies of the `steps` tokens generate returned."""
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
    prompts: list[Prompt],
    max_new_tokens: int,
    temperature: float,
    batch_size: int | None = None,
    top_p: float = 1.0,
    record_logprobs: bool = False,
    drop_finished: bool = False,
) -> Rollout:
    """Sample one reply per prompt and build the right-padded batch (CPU tensors).

    Random numbers come from torch's global RNG. Tokens are drawn from softmax(logits / temperature), the
    distribution token_logprobs computes, unless top_p < 1 truncates it. With `record_logprobs` the rollout also
    carries log pi(token) and the entropy of the untruncated tempered distribution, from the logits generation
    computed anyway (KV-cached, left-padded: equal to token_logprobs up to float rounding). `drop_finished` decodes
    with decode.decode_dropping_finished instead of `generate`: finished rows leave the batch and its KV cache; the
    same random stream, so the same tokens up to the rounding of a smaller batch's matmuls (decode.py).
    """
    require(len(prompts) > 0, "no prompts to generate from")
    prompt_ids = [chat_prompt_ids(tokenizer, p) for p in prompts]
    replies = sample_replies(policy, tokenizer, prompt_ids, max_new_tokens, temperature, batch_size, top_p,
                             record_logprobs, drop_finished)
    input_ids, attention_mask, action_mask = build_batch(prompt_ids, replies.ids, tokenizer.pad_token_id)
    width = input_ids.shape[1]
    return Rollout(
        prompts=list(prompts),
        prompt_ids=prompt_ids,
        reply_ids=replies.ids,
        reply_texts=tokenizer.batch_decode(replies.ids, skip_special_tokens=True),
        finished=torch.tensor(replies.finished, dtype=torch.bool),
        input_ids=input_ids,
        attention_mask=attention_mask,
        action_mask=action_mask,
        logprobs=per_token_layout(prompt_ids, replies.logprobs, width) if record_logprobs else None,
        entropy=per_token_layout(prompt_ids, replies.entropies, width) if record_logprobs else None,
    )


@dataclass
class Replies:
    """What `sample_replies` drew: per row the token ids (cut after the first EOS, kept), whether an EOS came within
    the cap, and (recorded) each token's log-prob and entropy; empty lists when not recorded."""

    ids: list[list[int]]
    finished: list[bool]
    logprobs: list[list[float]]
    entropies: list[list[float]]


@torch.no_grad()
def sample_replies(
    policy: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: list[list[int]],
    max_new_tokens: int,
    temperature: float,
    batch_size: int | None = None,
    top_p: float = 1.0,
    record_logprobs: bool = False,
    drop_finished: bool = False,
) -> Replies:
    """One reply per row of token ids (`generate_rollout` from chat-templated prompts; a multi-turn rollout from a
    trajectory so far), sampled as `generate_rollout` describes."""
    require(len(prompt_ids) > 0, "no prompts to generate from")
    require(max_new_tokens >= 1, f"max_new_tokens must be >= 1, got {max_new_tokens}")
    require(temperature > 0, f"temperature must be > 0, got {temperature}")
    require(0 < top_p <= 1, f"top_p must be in (0, 1], got {top_p}")
    batch_size = batch_size or len(prompt_ids)
    require(batch_size >= 1, f"batch_size must be >= 1, got {batch_size}")
    policy.eval()
    device = next(policy.parameters()).device
    pad = tokenizer.pad_token_id
    eos = eos_token_ids(policy, tokenizer)
    config = _sampling_config(max_new_tokens, eos, pad)

    replies = Replies([], [], [], [])
    # FSDP: a process whose replies all ended keeps stepping until every process's have, so that the sharded
    # layers' all-gathers match up
    synced = current().fsdp
    for start in range(0, len(prompt_ids), batch_size):
        chunk = prompt_ids[start : start + batch_size]
        prompt_width = max(len(p) for p in chunk)
        # Left padding for generation, so every row's next token is appended at the same column.
        ids = torch.tensor([[pad] * (prompt_width - len(p)) + p for p in chunk], device=device)
        mask = torch.tensor([[0] * (prompt_width - len(p)) + [1] * len(p) for p in chunk], device=device)
        sampler = TokenSampler(temperature, top_p, record=record_logprobs)
        if drop_finished:
            new_tokens = decode_dropping_finished(policy, ids, mask, sampler, max_new_tokens, eos, pad, synced)
        else:
            out = policy.generate(input_ids=ids, attention_mask=mask, generation_config=config, synced_gpus=synced,
                                  logits_processor=LogitsProcessorList([sampler]))
            new_tokens = out[:, prompt_width:]
        if record_logprobs:
            logprobs, entropies = (t.tolist() for t in sampler.finish(new_tokens.shape[1]))
        for i, row in enumerate(new_tokens.tolist()):
            ids, finished = cut_at_eos(row, eos)
            replies.ids.append(ids)
            replies.finished.append(finished)
            if record_logprobs:
                replies.logprobs.append(logprobs[i][: len(replies.ids[-1])])
                replies.entropies.append(entropies[i][: len(replies.ids[-1])])
    return replies
