"""`ppo-rlhf train`: PPO for a causal language model against a reward model (sections 8.6-8.9).

One iteration, in the order of the chapter's listing:
  1. rollout      sample one reply per prompt with the current policy (temperature, token cap)
  2. score        log pi_old, log pi_ref (same network, adapter off) and values, no gradients, logits / temperature;
                  the reward model's score, normalised by start-policy replies, with the EOS rule
  3. rewards      -beta * (log pi_old - log pi_ref) on every reply token, plus the score at the last one
  4. advantages   GAE (gamma 1, lambda 0.95), whitened over reply tokens
  5. update       K epochs x minibatches of the clipped policy loss and the clipped value loss, averaged over
                  reply tokens; separate AdamW optimisers, gradient norm clipped to 1 for each model
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ppo_rlhf.config import add_config_arguments, build_config, config_from_args, read_yaml, to_yaml
from ppo_rlhf.errors import UsageError, require


@dataclass
class TrainConfig:
    # --- models and data
    policy_model: str = "smollm2"
    """Policy to train: a Hugging Face id, a local folder, a .gguf file, or "smollm2" (offline default)."""
    reward_model: str = ""
    """Reward model (frozen) and initialisation of the value model: a folder written by `ppo-rlhf reward-model train` or any sequence-classification model with one output."""
    prompts: str = ""
    """Training prompts: a JSONL file with one {"prompt": ...} per line (see `ppo-rlhf prompts`)."""
    out: str = "runs/ppo"
    """Run directory: config, history, token table, TensorBoard and checkpoints go here."""
    overwrite: bool = False
    """Replace an existing run directory instead of refusing to touch it."""
    trust_remote_code: bool = False
    """Allow model code from the model's repository (off unless you trust it)."""
    seed: int = 1
    """Seed of every random number: prompt order, sampling, initialisation of the LoRA adapters."""
    device: str = "auto"
    """"auto" (CUDA if available, else CPU), "cpu", "cuda" or "cuda:N"."""
    dtype: str = "float32"
    """Weights and compute dtype: float32 (the chapter's run), bfloat16 or float16 (GPU)."""
    # --- the loop
    iterations: int = 20
    """PPO iterations; each samples `batch_size` fresh replies."""
    batch_size: int = 32
    """Replies per iteration: batch_size // group_size prompts, group_size replies to each."""
    minibatch_size: int = 16
    """Replies per optimiser step."""
    micro_batch_size: int = 0
    """Replies per forward/backward pass inside a minibatch (gradient accumulation, the per-token mean kept exact); 0 = the whole minibatch."""
    epochs: int = 2
    """Passes over each batch (the chapter's K)."""
    # --- sampling
    temperature: float = 0.7
    """Sampling temperature; the same temperature divides the logits in every log-probability (detail 4)."""
    top_p: float = 1.0
    """Nucleus sampling; 1.0 samples from the full tempered distribution, as PPO's log-probs assume."""
    max_new_tokens: int = 128
    """Reply cap in tokens; a reply without EOS by then is unfinished."""
    max_prompt_tokens: int = 512
    """Longest chat-templated training prompt in tokens; a longer one is an error naming its line (prompt + max_new_tokens must also fit the models' context)."""
    generation_batch_size: int = 0
    """Prompts per generate call; 0 = the whole batch."""
    generation_backend: str = "hf"
    """"hf" (Hugging Face generate on the policy) or "vllm" (GPU, extra [vllm]; weights synced from the policy each iteration, LoRA merged); log-probs are always recomputed by the trainer."""
    # --- rewards
    reward_norm_samples: int = 192
    """Start-policy replies used to measure the mean and std that normalise the reward model's score (detail 1)."""
    eos_rule: bool = True
    """Give a reply that never emitted EOS within the cap the fixed score `unfinished_score` (the EOS trick, detail 3)."""
    unfinished_score: float = -1.0
    """Normalised score of an unfinished reply under the EOS rule."""
    beta: float = 0.05
    """Per-token KL penalty coefficient against the reference (adapter off)."""
    adaptive_kl: bool = False
    """Adapt beta towards `kl_target` with Ziegler et al.'s proportional controller."""
    kl_target: float = 6.0
    """Target KL (nats per reply) of the adaptive controller."""
    kl_horizon: int = 10000
    """Horizon (in replies) of the adaptive controller."""
    whiten_rewards: bool = False
    """Whiten the per-token rewards before GAE (detail 7; optional, off)."""
    # --- advantages and losses
    gamma: float = 1.0
    """Discount in GAE."""
    lam: float = 0.95
    """GAE lambda."""
    clip_range: float = 0.2
    """PPO clip range epsilon: ratios are clipped to [1-eps, 1+eps]."""
    value_clip_range: float = 0.2
    """Value clip range: the value may move at most this far from its old estimate per batch."""
    entropy_coef: float = 0.0
    """Entropy bonus c2 (usually 0 in RLHF)."""
    loss_aggregation: str = "token"
    """"token": mean over all reply tokens of the minibatch (detail 8); "sequence": mean per reply, then over replies."""
    advantage_estimator: str = "gae"
    """"gae": GAE with a value model (PPO); "rloo": REINFORCE leave-one-out baseline over the group_size replies to a prompt (Chapter 6, no value model); "grpo": group-normalised rewards (no value model)."""
    group_size: int = 1
    """Replies sampled per prompt (consecutive rows of a batch); rloo and grpo need >= 2."""
    grpo_eps: float = 1e-6
    """Added to the group std in GRPO's normalisation."""
    # --- optimisers
    policy_lr: float = 2e-5
    """AdamW learning rate of the policy's LoRA adapter."""
    value_lr: float = 5e-5
    """AdamW learning rate of the value model's LoRA adapter and score head."""
    adam_eps: float = 1e-5
    """Adam epsilon (detail 9)."""
    max_grad_norm: float = 1.0
    """Gradient norm clip, applied to each model separately (detail 9)."""
    lora_rank: int = 16
    """LoRA rank of the policy and value adapters (all seven linear layers of every block)."""
    lora_alpha: float = 32.0
    """LoRA alpha (scale = alpha / rank)."""
    lr_schedule: str = "constant"
    """Learning-rate schedule of both optimisers, stepped per optimiser step: constant, linear (to 0) or cosine (to 0) over the run."""
    warmup_iterations: int = 0
    """Iterations of linear learning-rate warm-up at the start of the schedule."""
    # --- PPO-ptx (section 8.12)
    ptx_coef: float = 0.0
    """Coefficient of the language-modelling loss on ptx_data added to every policy step (InstructGPT's PPO-ptx); 0 = off."""
    ptx_data: str = ""
    """Texts for the ptx loss: a JSONL file of {"text": ...} lines or a text file with one text per line."""
    ptx_batch_size: int = 8
    """Texts per optimiser step in the ptx loss (cycling through ptx_data)."""
    ptx_max_tokens: int = 256
    """Each ptx text is cut to this many tokens."""
    # --- speed and memory
    logprob_chunk: int = 64
    """Positions per chunk of the LM head when computing log-probs (never the full-vocabulary log-softmax at once); 0 = one pass."""
    # --- observability and checkpoints
    checkpoint_every: int = 10
    """Save a checkpoint every N iterations (and always at the end)."""
    sample_every: int = 5
    """Write sample replies every N iterations to samples.jsonl (and show one)."""
    tensorboard: bool = True
    """Write TensorBoard scalars under RUN_DIR/tb."""
    max_skipped_steps: int = 3
    """Stop after this many consecutive skipped (non-finite) optimiser steps; the last good checkpoint stays."""
    quiet: bool = False
    """No progress bar and no dashboard lines on stdout (history.jsonl is still written)."""

    def validate(self) -> None:
        require(bool(self.reward_model), "reward_model is required (a folder from `ppo-rlhf reward-model train` or a model id)")
        require(bool(self.prompts), "prompts is required (a JSONL file, see `ppo-rlhf prompts`)")
        for name in ("iterations", "batch_size", "minibatch_size", "epochs", "max_new_tokens", "reward_norm_samples",
                     "lora_rank", "checkpoint_every", "sample_every", "max_skipped_steps"):
            require(getattr(self, name) > 0, f"{name} must be positive, got {getattr(self, name)}")
        for name in ("micro_batch_size", "generation_batch_size", "logprob_chunk"):
            require(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("policy_lr", "value_lr", "adam_eps", "max_grad_norm", "temperature", "kl_target", "kl_horizon"):
            value = getattr(self, name)
            require(math.isfinite(value) and value > 0, f"{name} must be a positive number, got {value}")
        require(0 < self.clip_range < 1, f"clip_range must be in (0, 1), got {self.clip_range}")
        require(self.value_clip_range > 0, f"value_clip_range must be positive, got {self.value_clip_range}")
        require(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        require(0 <= self.gamma <= 1 and 0 <= self.lam <= 1, "gamma and lam must be in [0, 1]")
        require(self.beta >= 0 and math.isfinite(self.beta), f"beta must be >= 0, got {self.beta}")
        require(self.entropy_coef >= 0, f"entropy_coef must be >= 0, got {self.entropy_coef}")
        require(math.isfinite(self.unfinished_score), "unfinished_score must be finite")
        require(self.minibatch_size <= self.batch_size, "minibatch_size must not exceed batch_size")
        require(self.batch_size % self.minibatch_size == 0, "batch_size must be a multiple of minibatch_size")
        require(self.micro_batch_size <= self.minibatch_size, "micro_batch_size must not exceed minibatch_size")
        require(self.loss_aggregation in ("token", "sequence"), "loss_aggregation must be 'token' or 'sequence'")
        require(self.dtype in ("float32", "bfloat16", "float16"), "dtype must be float32, bfloat16 or float16")
        require(self.max_prompt_tokens > 0, f"max_prompt_tokens must be positive, got {self.max_prompt_tokens}")
        resolve_device(self.device)  # an unknown device or missing CUDA fails here, before anything is loaded
        self._validate_extensions()

    def _validate_extensions(self) -> None:
        """Estimators, group sampling, schedules, PPO-ptx and the generation backend."""
        from ppo_rlhf.generation import BACKENDS
        from ppo_rlhf.objectives import ESTIMATORS
        from ppo_rlhf.ptx import SCHEDULES

        require(self.advantage_estimator in ESTIMATORS, f"advantage_estimator must be one of {ESTIMATORS}, got {self.advantage_estimator!r}")
        require(self.group_size >= 1, f"group_size must be positive, got {self.group_size}")
        require(self.advantage_estimator == "gae" or self.group_size >= 2,
                f"advantage_estimator {self.advantage_estimator} needs group_size >= 2 replies per prompt")
        require(self.batch_size % self.group_size == 0, "batch_size (replies) must be a multiple of group_size")
        require(self.grpo_eps > 0, f"grpo_eps must be positive, got {self.grpo_eps}")
        require(self.lr_schedule in SCHEDULES, f"lr_schedule must be one of {SCHEDULES}, got {self.lr_schedule!r}")
        require(0 <= self.warmup_iterations <= self.iterations, "warmup_iterations must be in [0, iterations]")
        require(self.ptx_coef >= 0 and math.isfinite(self.ptx_coef), f"ptx_coef must be >= 0, got {self.ptx_coef}")
        require(self.ptx_coef == 0 or bool(self.ptx_data), "ptx_coef > 0 needs ptx_data (a file of texts)")
        require(self.ptx_batch_size > 0 and self.ptx_max_tokens >= 2, "ptx_batch_size must be positive and ptx_max_tokens >= 2")
        require(self.generation_backend in BACKENDS, f"generation_backend must be one of {BACKENDS}, got {self.generation_backend!r}")

    @property
    def has_value_model(self) -> bool:
        """Only GAE needs a critic; rloo and grpo neither load, train nor checkpoint one."""
        return self.advantage_estimator == "gae"


# ------------------------------------------------------------------------------------------------ helpers


class PromptSampler:
    """Prompts drawn without replacement, reshuffled when used up (detail 10)."""

    def __init__(self, n_prompts: int, seed: int):
        self.n_prompts = n_prompts
        self.generator = np.random.default_rng(seed)
        self.order = self.generator.permutation(n_prompts).tolist()
        self.position = 0
        self.reshuffles = 0

    def next(self, count: int) -> list[int]:
        chosen: list[int] = []
        while len(chosen) < count:
            if self.position == self.n_prompts:
                self.order = self.generator.permutation(self.n_prompts).tolist()
                self.position, self.reshuffles = 0, self.reshuffles + 1
            take = min(count - len(chosen), self.n_prompts - self.position)
            chosen += self.order[self.position : self.position + take]
            self.position += take
        return chosen

    def state(self) -> dict[str, Any]:
        return {"order": self.order, "position": self.position, "reshuffles": self.reshuffles,
                "generator": self.generator.bit_generator.state}

    def load(self, state: dict[str, Any]) -> None:
        self.order, self.position, self.reshuffles = state["order"], state["position"], state["reshuffles"]
        self.generator.bit_generator.state = state["generator"]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"unknown device {name!r}") from None
    require(device.type != "cuda" or torch.cuda.is_available(), f"device {name!r} asked for, but CUDA is not available")
    return device


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def make_optimizer(model: torch.nn.Module, lr: float, cfg: TrainConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(trainable_parameters(model), lr=lr, eps=cfg.adam_eps, weight_decay=0.0)


def row_chunks(rows: list[int] | int, size: int) -> list[list[int]]:
    rows = list(range(rows)) if isinstance(rows, int) else rows
    return [rows[start : start + size] for start in range(0, len(rows), size)]


def per_token_in_chunks(fn, rollout, size: int) -> tuple[torch.Tensor, ...]:
    """Apply fn(input_ids, attention_mask) -> tuple of [b, l-1] tensors to row chunks of a rollout (each chunk
    trimmed to its own longest row, so short replies cost no padding), then pad back to the batch width."""
    width = rollout.action_mask.shape[1]
    pieces: list[tuple[torch.Tensor, ...]] = []
    for rows in row_chunks(len(rollout.prompts), size):
        part = rollout.select(rows)
        pieces.append(fn(part.input_ids, part.attention_mask))
    pad = torch.nn.functional.pad
    return tuple(torch.cat([pad(piece[k], (0, width - piece[k].shape[1])) for piece in pieces]) for k in range(len(pieces[0])))


@dataclass
class Batch:
    """What steps 2-4 compute for one rollout, fixed during the update. Per-token tensors are [B, L-1]."""

    action_mask: torch.Tensor  # 1 on the reply tokens the policy chose
    old_logprobs: torch.Tensor  # log pi_old, tempered
    ref_logprobs: torch.Tensor  # log pi_ref, tempered
    entropy: torch.Tensor  # entropy of pi_old per position, tempered
    old_values: torch.Tensor  # value model, normalised like the reward, 0 off reply tokens
    raw_scores: torch.Tensor  # [B] reward model on its own scale
    scores: torch.Tensor  # [B] normalised, EOS rule applied
    rewards: torch.Tensor  # per-token rewards
    kl: torch.Tensor  # log pi_old - log pi_ref on reply tokens
    advantages: torch.Tensor  # GAE, whitened
    returns: torch.Tensor  # value targets, before whitening

    def rows(self, rows: list[int], width: int) -> dict[str, torch.Tensor]:
        """The per-token tensors of some rows, trimmed to `width` positions."""
        names = ("action_mask", "old_logprobs", "old_values", "advantages", "returns")
        return {name: getattr(self, name)[rows, :width] for name in names}


def check_prompt_lengths(cfg: TrainConfig, tokenizer, models: list[torch.nn.Module]) -> None:
    """Every chat-templated prompt within `max_prompt_tokens`, and prompt + reply cap within every model's context:
    a UsageError naming the first line that is not."""
    from ppo_rlhf.prompts import read_numbered_prompts
    from ppo_rlhf.rollout import chat_prompt_ids

    contexts = [getattr(getattr(m, "config", None), "max_position_embeddings", None) for m in models]
    context = min((c for c in contexts if isinstance(c, int) and c > 0), default=None)
    for number, prompt in read_numbered_prompts(cfg.prompts):
        n = len(chat_prompt_ids(tokenizer, prompt))
        require(n <= cfg.max_prompt_tokens, f"{cfg.prompts}:{number}: the prompt has {n} tokens (chat-templated), "
                                            f"more than max_prompt_tokens={cfg.max_prompt_tokens}")
        require(context is None or n + cfg.max_new_tokens <= context,
                f"{cfg.prompts}:{number}: the prompt ({n} tokens) + max_new_tokens={cfg.max_new_tokens} exceed the "
                f"models' context of {context} tokens")


class TrainingStopped(UsageError):
    """Too many consecutive non-finite steps: the run stops, its last good checkpoint intact."""


class PPOTrainer:
    """The four models (the reference is the policy with its adapter off), their optimisers and one iteration."""

    def __init__(self, cfg: TrainConfig):
        from ppo_rlhf.distributed import current
        from ppo_rlhf.models import LoraSettings, load_policy, load_reward_model, load_tokenizer, load_value_model
        from ppo_rlhf.prompts import read_prompts

        self.cfg = cfg
        self.dist = current()  # this process's rank among the data-parallel processes (one: a no-op)
        self.device = self.dist.device(cfg.device) if self.dist.world_size > 1 else resolve_device(cfg.device)
        dtype = getattr(torch, cfg.dtype)
        remote = cfg.trust_remote_code
        self.prompts = read_prompts(cfg.prompts)
        seed_everything(cfg.seed)
        lora = LoraSettings(rank=cfg.lora_rank, alpha=cfg.lora_alpha)
        self.tokenizer = load_tokenizer(cfg.policy_model, trust_remote_code=remote)
        self.reward_tokenizer = load_tokenizer(cfg.reward_model, trust_remote_code=remote)
        require(
            self.reward_tokenizer.get_vocab() == self.tokenizer.get_vocab(),
            "the value model reads every position of the policy's sequences, so the reward model must use the policy's tokenizer",
        )
        self.policy = load_policy(cfg.policy_model, lora, dtype=dtype, trust_remote_code=remote).to(self.device)
        self.reward_model = load_reward_model(cfg.reward_model, dtype=dtype, trust_remote_code=remote).to(self.device)
        check_prompt_lengths(cfg, self.tokenizer, [self.policy, self.reward_model])
        # rloo / grpo are critic-free: no value model is loaded, trained or checkpointed
        self.value_model = (load_value_model(cfg.reward_model, lora, dtype=dtype, trust_remote_code=remote).to(self.device)
                            if cfg.has_value_model else None)
        self.policy_optimizer = make_optimizer(self.policy, cfg.policy_lr, cfg)
        self.value_optimizer = make_optimizer(self.value_model, cfg.value_lr, cfg) if cfg.has_value_model else None
        self.schedulers = self._make_schedulers()
        self.ptx = None
        if cfg.ptx_coef > 0:
            from ppo_rlhf.ptx import PtxData, read_texts

            self.ptx = PtxData(read_texts(cfg.ptx_data), self.tokenizer, cfg.ptx_batch_size, cfg.ptx_max_tokens, cfg.seed + 2)
        from ppo_rlhf.generation import make_generator

        self.generator = make_generator(cfg, self.policy, self.tokenizer)
        self.policy_version, self.synced_version = 0, -1  # optimiser steps taken / copied into the generator
        if self.dist.world_size > 1:  # identical initial weights everywhere; now different samples per process
            seed_everything(cfg.seed + 7919 * self.dist.rank)
        self.sampler = PromptSampler(len(self.prompts), cfg.seed)
        self.beta = cfg.beta
        self.kl_controller = None
        if cfg.adaptive_kl:
            from ppo_rlhf.objectives import AdaptiveKLController

            self.kl_controller = AdaptiveKLController(cfg.beta, cfg.kl_target, cfg.kl_horizon)
        self.reward_mean, self.reward_std = 0.0, 1.0
        self.consecutive_skips = 0

    @property
    def micro_size(self) -> int:
        return self.cfg.micro_batch_size or self.cfg.minibatch_size

    @property
    def models(self) -> dict[str, torch.nn.Module]:
        """The trained models by checkpoint folder name (no "value" for the critic-free estimators)."""
        return {"policy": self.policy, **({"value": self.value_model} if self.value_model is not None else {})}

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"policy": self.policy_optimizer,
                **({"value": self.value_optimizer} if self.value_optimizer is not None else {})}

    def _make_schedulers(self) -> dict[str, Any]:
        """LambdaLR per optimiser, stepped per optimiser step; none for the constant schedule without warm-up."""
        from ppo_rlhf.ptx import make_scheduler

        cfg = self.cfg
        if cfg.lr_schedule == "constant" and cfg.warmup_iterations == 0:
            return {}
        steps = cfg.epochs * (cfg.batch_size // cfg.minibatch_size)  # optimiser steps per iteration
        return {name: make_scheduler(opt, cfg.lr_schedule, cfg.warmup_iterations * steps, cfg.iterations * steps)
                for name, opt in self.optimizers.items()}

    # ----------------------------------------------------------------------------------------- 1. rollout
    def rollout(self, prompts: list[str]):
        # the backend (generation.py) only returns token ids; score() recomputes every log-prob itself
        if self.synced_version != self.policy_version:  # the policy changed since the engine last copied it
            self.generator.sync(self.policy)
            self.synced_version = self.policy_version
        return self.generator.generate(prompts)

    def raw_scores(self, rollout) -> torch.Tensor:
        from ppo_rlhf.rollout import score_texts

        return score_texts(self.reward_model, self.reward_tokenizer, rollout.prompts, rollout.reply_texts,
                           batch_size=self.micro_size)

    def measure_reward_norm(self) -> dict[str, float]:
        """Mean and std of the reward model's scores of start-policy replies to training prompts (detail 1)."""
        n = self.cfg.reward_norm_samples
        picks = np.random.default_rng(self.cfg.seed + 1).choice(len(self.prompts), size=n, replace=n > len(self.prompts))
        picks = self.dist.shard(picks.tolist())  # this process's share (all of them in one process)
        scores, finished = [], []
        for rows in tqdm(row_chunks(len(picks), self.cfg.batch_size), desc="reward normalisation", disable=self.cfg.quiet, leave=False):
            rollout = self.rollout([self.prompts[picks[i]] for i in rows])
            scores.append(self.raw_scores(rollout))
            finished.append(rollout.finished)
        scores = torch.cat(scores)
        if self.dist.world_size > 1:
            scores, finished = self.dist.gather_1d(scores), [self.dist.gather_1d(torch.cat(finished))]
        require(bool(torch.isfinite(scores).all()), "the reward model gave non-finite scores to start-policy replies")
        std = float(scores.std()) if n > 1 else 1.0
        require(std > 0, "the reward model gave every start-policy reply the same score: it cannot be normalised")
        return {"mean": float(scores.mean()), "std": std, "n": n, "finished": float(torch.cat(finished).float().mean())}

    # ------------------------------------------------------------------------------ 2-4. score, rewards, GAE
    @torch.no_grad()
    def score(self, rollout) -> Batch:
        from ppo_rlhf.objectives import gae, per_token_rewards
        from ppo_rlhf.rollout import first_reply_position, sequence_values, token_logprobs

        cfg, dev, chunk = self.cfg, self.device, self.cfg.logprob_chunk or None
        act = rollout.action_mask.to(dev)
        first = first_reply_position(rollout.prompt_ids)  # no LM head over positions that are prompt in every row

        def policy_pass(ids, att):
            return token_logprobs(self.policy, ids.to(dev), att.to(dev), cfg.temperature, with_entropy=True,
                                  chunk_size=chunk, first=first)

        def reference_pass(ids, att):
            with self.policy.disable_adapter():  # the reference: the same weights with the adapter off
                return (token_logprobs(self.policy, ids.to(dev), att.to(dev), cfg.temperature, chunk_size=chunk,
                                       first=first),)

        def value_pass(ids, att):
            return (sequence_values(self.value_model, ids.to(dev), att.to(dev)),)

        old_logprobs, entropy = per_token_in_chunks(policy_pass, rollout, self.micro_size)
        (ref_logprobs,) = per_token_in_chunks(reference_pass, rollout, self.micro_size)
        if self.value_model is not None:
            (values,) = per_token_in_chunks(value_pass, rollout, self.micro_size)
            old_values = (values - self.reward_mean) / self.reward_std * act
        else:  # critic-free estimators
            old_values = torch.zeros_like(act)

        raw = self.raw_scores(rollout).to(dev)
        scores = (raw - self.reward_mean) / self.reward_std
        if cfg.eos_rule:
            finished = rollout.finished.to(dev)
            scores = torch.where(finished, scores, torch.full_like(scores, cfg.unfinished_score))

        rewards, kl = per_token_rewards(scores, old_logprobs, ref_logprobs, act, self.beta)  # 3. rewards
        if cfg.whiten_rewards:
            rewards = self.dist.masked_whiten(rewards, act, shift_mean=False)
        if cfg.advantage_estimator == "gae":
            advantages, returns = gae(rewards, old_values, act, gamma=cfg.gamma, lam=cfg.lam)  # 4. advantages
            advantages = self.dist.masked_whiten(advantages, act)  # over the global batch's reply tokens
        else:  # one advantage per reply from the other replies to the same prompt, on every reply token
            advantages, returns = self.group_advantages(scores, kl, act)
        return Batch(act, old_logprobs, ref_logprobs, entropy, old_values, raw, scores, rewards, kl, advantages, returns)

    def group_advantages(self, scores: torch.Tensor, kl: torch.Tensor, act: torch.Tensor):
        """rloo / grpo: (advantages, returns), both [B, L-1]; the return is the reply's sequence reward
        (score - beta * summed KL), the advantage is not whitened again."""
        from ppo_rlhf.objectives import broadcast_to_tokens, grpo_advantages, rloo_advantages, sequence_rewards

        cfg = self.cfg
        totals = sequence_rewards(scores, kl, act, self.beta)
        if cfg.advantage_estimator == "rloo":
            per_reply = rloo_advantages(totals, cfg.group_size)
        else:
            per_reply = grpo_advantages(totals, cfg.group_size, cfg.grpo_eps)
        return broadcast_to_tokens(per_reply, act), broadcast_to_tokens(totals, act)

    # ------------------------------------------------------------------------------------------- 5. update
    def update(self, rollout, batch: Batch) -> dict[str, float]:
        from ppo_rlhf.objectives import ValueLoss, clipped_policy_loss, clipped_value_loss, masked_sum
        from ppo_rlhf.rollout import first_reply_position, sequence_values, token_logprobs

        cfg, dev = self.cfg, self.device
        critic = self.value_model  # None for the critic-free estimators
        policy_params = trainable_parameters(self.policy)
        value_params = trainable_parameters(critic) if critic is not None else []
        totals: dict[str, list[float]] = {k: [] for k in ("pg_loss", "v_loss", "clipfrac", "approx_kl", "vclipfrac",
                                                          "grad_norm_policy", "grad_norm_value", "ptx_loss")}
        skipped = 0
        dist = self.dist  # data parallel: sums over every process's rows (a no-op in one process)
        self.policy.train()  # dropout is off (detail 5); train() only enables autograd paths
        if critic is not None:
            critic.train()
        for _epoch in range(cfg.epochs):
            order = torch.randperm(len(rollout.prompts)).tolist()
            for minibatch in row_chunks(order, cfg.minibatch_size // dist.world_size):  # this process's share
                self.policy_optimizer.zero_grad(set_to_none=True)
                if critic is not None:
                    self.value_optimizer.zero_grad(set_to_none=True)
                n_tokens = dist.sum(float(batch.action_mask[minibatch].sum()))  # over the global minibatch
                n_rows = dist.sum(float(len(minibatch)))
                sums = {"pg_loss": 0.0, "v_loss": 0.0, "clipfrac": 0.0, "approx_kl": 0.0, "vclipfrac": 0.0}
                for micro in row_chunks(minibatch, self.micro_size):
                    part = rollout.select(micro)
                    ids, att = part.input_ids.to(dev), part.attention_mask.to(dev)
                    mb = batch.rows(micro, ids.shape[1] - 1)
                    act = mb["action_mask"]
                    # the per-token mean over the whole minibatch, exact under gradient accumulation
                    normalizer = n_tokens if cfg.loss_aggregation == "token" else None
                    share = 1.0 if cfg.loss_aggregation == "token" else len(micro) / n_rows
                    out = token_logprobs(self.policy, ids, att, cfg.temperature, with_entropy=cfg.entropy_coef > 0,
                                         chunk_size=cfg.logprob_chunk or None, first=first_reply_position(part.prompt_ids))
                    new_logprobs, entropy = out if cfg.entropy_coef > 0 else (out, None)
                    pg = clipped_policy_loss(new_logprobs, mb["old_logprobs"], mb["advantages"], act, cfg.clip_range,
                                             cfg.loss_aggregation, normalizer)
                    if critic is not None:
                        values = (sequence_values(critic, ids, att) - self.reward_mean) / self.reward_std
                        vl = clipped_value_loss(values, mb["old_values"], mb["returns"], act, cfg.value_clip_range,
                                                cfg.loss_aggregation, normalizer)
                    else:
                        vl = ValueLoss(torch.zeros((), device=dev), torch.zeros((), device=dev))
                    loss = (pg.loss + vl.loss) * share
                    if entropy is not None:
                        loss = loss - cfg.entropy_coef * masked_sum(entropy, act) / n_tokens
                    loss.backward()
                    weight = float(act.sum()) / n_tokens  # token share of this micro-batch, for the logged means
                    sums["pg_loss"] += float(pg.loss.detach()) * share
                    sums["v_loss"] += float(vl.loss.detach()) * share
                    sums["clipfrac"] += float(pg.clip_fraction) * weight
                    sums["approx_kl"] += float(pg.approx_kl) * weight
                    sums["vclipfrac"] += float(vl.clip_fraction) * weight
                ptx_loss = self.ptx_step() if self.ptx is not None else float("nan")
                dist.all_reduce_grads(policy_params + value_params)  # the global minibatch's gradient
                sums = dist.sum_dict(sums)
                grad_policy = float(torch.nn.utils.clip_grad_norm_(policy_params, cfg.max_grad_norm))
                grad_value = (float(torch.nn.utils.clip_grad_norm_(value_params, cfg.max_grad_norm))
                              if critic is not None else 0.0)
                if not all(math.isfinite(x) for x in (grad_policy, grad_value, sums["pg_loss"], sums["v_loss"])):
                    skipped += 1  # a non-finite loss or gradient never reaches the weights
                    self.consecutive_skips += 1
                    if self.consecutive_skips >= cfg.max_skipped_steps:
                        raise TrainingStopped(f"{self.consecutive_skips} consecutive non-finite steps; stopping "
                                              "(the last checkpoint is intact)")
                    continue
                self.consecutive_skips = 0
                self.policy_optimizer.step()
                if critic is not None:
                    self.value_optimizer.step()
                for scheduler in self.schedulers.values():
                    scheduler.step()
                self.policy_version += 1
                for key, value in sums.items():
                    totals[key].append(value)
                totals["grad_norm_policy"].append(grad_policy)
                totals["grad_norm_value"].append(grad_value)
                totals["ptx_loss"].append(ptx_loss)
        self.policy.eval()
        if critic is not None:
            critic.eval()
        stats = {key: float(np.mean(values)) if values else float("nan") for key, values in totals.items()}
        if critic is None:  # no value model: its numbers do not exist
            stats.update(v_loss=float("nan"), vclipfrac=float("nan"), grad_norm_value=float("nan"))
        stats["skipped_steps"] = skipped
        return stats

    def ptx_step(self) -> float:
        """PPO-ptx: backward of ptx_coef * the next-token NLL of one batch of ptx texts (temperature 1), accumulated
        into this optimiser step's policy gradient. Returns the NLL."""
        from ppo_rlhf.ptx import ptx_nll

        ids, att = self.ptx.next_batch()
        nll = ptx_nll(self.policy, ids.to(self.device), att.to(self.device), self.cfg.logprob_chunk or None)
        # divided by the process count: the all-reduced gradient is then the mean over processes' ptx batches
        (self.cfg.ptx_coef * nll / self.dist.world_size).backward()
        return float(nll.detach())

    def next_prompts(self) -> list[str]:
        """This process's prompts of the next batch: batch_size // group_size prompts drawn (identically on every
        process), each repeated group_size times in consecutive rows, then this rank's contiguous share of whole groups."""
        cfg = self.cfg
        drawn = self.sampler.next(cfg.batch_size // cfg.group_size)
        drawn = self.dist.shard(drawn)
        return [self.prompts[i] for i in drawn for _ in range(cfg.group_size)]

    # ------------------------------------------------------------------------------------- one iteration
    def iteration(self, index: int) -> tuple[dict[str, Any], Any, Batch]:
        from ppo_rlhf.objectives import explained_variance, masked_mean, masked_sum

        cfg = self.cfg
        start = time.perf_counter()
        prompts = self.next_prompts()
        rollout = self.rollout(prompts)  # 1. rollout
        generated = time.perf_counter()
        batch = self.score(rollout)  # 2-4. score, rewards, advantages
        scored = time.perf_counter()
        finite = all(bool(torch.isfinite(t).all()) for t in (batch.scores, batch.advantages, batch.returns))
        if finite:
            update = self.update(rollout, batch)  # 5. update
        else:  # e.g. a reward model that returned NaN: nothing from this batch reaches the weights
            self.consecutive_skips += 1
            if self.consecutive_skips >= cfg.max_skipped_steps:
                raise TrainingStopped(f"{self.consecutive_skips} consecutive iterations with non-finite rewards; "
                                      "stopping (the last checkpoint is intact)")
            update = {k: float("nan") for k in ("pg_loss", "v_loss", "clipfrac", "approx_kl", "vclipfrac",
                                                "grad_norm_policy", "grad_norm_value")}
            update["skipped_steps"] = cfg.epochs * (cfg.batch_size // cfg.minibatch_size)
        updated = time.perf_counter()

        act = batch.action_mask
        kl_per_reply = masked_sum(batch.kl, act, dim=1)
        stats: dict[str, Any] = {
            "iteration": index,
            "score": float(batch.scores.mean()),
            "rm_raw": float(batch.raw_scores.mean()),
            "kl": float(kl_per_reply.mean()),
            "len": float(rollout.reply_lengths.float().mean()),
            "fin": float(rollout.finished.float().mean()),
            "ent": float(masked_mean(batch.entropy, act)),
            **{k: update[k] for k in ("clipfrac", "approx_kl", "v_loss")},
            "ev": explained_variance(batch.old_values, batch.returns, act) if self.value_model is not None else float("nan"),
            "vclipfrac": update["vclipfrac"],
            "pg_loss": update["pg_loss"],
            "grad_norm_policy": update["grad_norm_policy"],
            "grad_norm_value": update["grad_norm_value"],
            **({"ptx_loss": update.get("ptx_loss", float("nan"))} if cfg.ptx_coef > 0 else {}),
            **({"lr": self.policy_optimizer.param_groups[0]["lr"]} if self.schedulers else {}),
            "beta": self.beta,
            "skipped_steps": update["skipped_steps"],
            "time_gen": generated - start,
            "time_score": scored - generated,
            "time_update": updated - scored,
            "time_total": updated - start,
            "gen_tokens_per_s": float(rollout.reply_lengths.sum()) / max(generated - start, 1e-9),
        }
        if self.dist.world_size > 1:  # batch means over every process (equal replies each), identical everywhere
            keys = ("score", "rm_raw", "kl", "len", "fin", "ent")
            stats.update({k: v / self.dist.world_size for k, v in self.dist.sum_dict({k: stats[k] for k in keys}).items()})
        if self.kl_controller is not None:
            self.beta = self.kl_controller.update(stats["kl"], cfg.batch_size)
        return stats, rollout, batch


# ----------------------------------------------------------------------------------------------- the run


def token_table(trainer: PPOTrainer, rollout, batch: Batch) -> tuple[list[dict[str, Any]], int]:
    """Every number of one reply of the batch (section 8.6): the shortest finished one, or the first."""
    finished = [i for i in range(len(rollout.prompts)) if bool(rollout.finished[i])]
    row = min(finished, key=lambda i: len(rollout.reply_ids[i])) if finished else 0
    positions = batch.action_mask[row].nonzero().flatten().tolist()
    rows = []
    for t, position in enumerate(positions):
        token_id = int(rollout.input_ids[row, position + 1])
        rows.append({
            "t": t,
            "token": trainer.tokenizer.decode([token_id]),
            "token_id": token_id,
            "logp_old": float(batch.old_logprobs[row, position]),
            "logp_ref": float(batch.ref_logprobs[row, position]),
            "value": float(batch.old_values[row, position]),
            "reward": float(batch.rewards[row, position]),
            "advantage": float(batch.advantages[row, position]),
            "return": float(batch.returns[row, position]),
        })
    return rows, row


def write_token_table(run_dir: Path, trainer: PPOTrainer, rollout, batch: Batch) -> None:
    from ppo_rlhf.checkpoint import atomic_write_text
    from ppo_rlhf.dashboard import token_table_text

    rows, row = token_table(trainer, rollout, batch)
    info = {"prompt": rollout.prompts[row], "reply": rollout.reply_texts[row], "finished": bool(rollout.finished[row]),
            "raw_score": float(batch.raw_scores[row]), "score": float(batch.scores[row]),
            "note": "advantage is GAE after whitening over the batch; return = GAE advantage (before whitening) + V",
            "rows": rows}
    atomic_write_text(run_dir / "token_table.json", json.dumps(info, indent=1))
    header = (f"prompt: {info['prompt']!r}\nreply: {info['reply']!r}\n"
              f"raw score {info['raw_score']:+.3f}, normalised {info['score']:+.3f}, finished {info['finished']}\n")
    atomic_write_text(run_dir / "token_table.txt", token_table_text(rows, header))


def write_samples(run_dir: Path, index: int, rollout, batch: Batch, count: int = 4) -> str:
    lines = [json.dumps({"iteration": index, "prompt": rollout.prompts[i], "reply": rollout.reply_texts[i],
                         "finished": bool(rollout.finished[i]), "score": float(batch.scores[i])})
             for i in range(min(count, len(rollout.prompts)))]
    with open(run_dir / "samples.jsonl", "a") as handle:
        handle.write("\n".join(lines) + "\n")
    return f"sample [{float(batch.scores[0]):+.2f}] {rollout.prompts[0][:60]!r} -> {rollout.reply_texts[0][:120]!r}"


def check_run_dir(cfg: TrainConfig) -> None:
    """Refuse a non-empty run directory without --overwrite (before anything is loaded or removed)."""
    run_dir = Path(cfg.out)
    require(not run_dir.exists() or run_dir.is_dir(), f"run directory {run_dir} is a file")
    if run_dir.exists() and any(run_dir.iterdir()):
        require(cfg.overwrite, f"run directory {run_dir} is not empty; use --resume {run_dir} to continue it or --overwrite to replace it")


def keep_samples_before(run_dir: Path, iteration: int) -> None:
    """On resume, drop the sample lines of iterations that will run again (a killed run wrote them after its checkpoint)."""
    path = run_dir / "samples.jsonl"
    if path.is_file():
        from ppo_rlhf.checkpoint import atomic_write_text

        lines = path.read_text().splitlines(keepends=True)
        kept = []
        for line in lines:
            try:
                if json.loads(line)["iteration"] < iteration:
                    kept.append(line)
            except (ValueError, KeyError, TypeError):  # a line cut by the kill
                pass
        atomic_write_text(path, "".join(kept))


def prepare_run_dir(cfg: TrainConfig) -> Path:
    run_dir = Path(cfg.out)
    check_run_dir(cfg)
    if run_dir.exists() and any(run_dir.iterdir()):
        require(cfg.overwrite, f"run directory {run_dir} is not empty; use --resume {run_dir} to continue it or --overwrite to replace it")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def train(cfg: TrainConfig, resume: bool = False) -> Path:
    """Run (or continue) PPO; returns the run directory."""
    from ppo_rlhf.checkpoint import (
        TrainingState,
        atomic_write_text,
        latest_checkpoint,
        load_checkpoint,
        save_checkpoint,
    )
    from ppo_rlhf.dashboard import TensorBoard, dashboard_line, history_line
    from ppo_rlhf.models import resolve_model_path

    if not resume:
        check_run_dir(cfg)  # before the models load: a refusal is instant, and nothing is removed on bad input
    trainer = PPOTrainer(cfg)
    main = trainer.dist.is_main  # with several processes only rank 0 writes the run directory and logs
    run_dir = Path(cfg.out) if resume or not main else prepare_run_dir(cfg)
    trainer.dist.barrier()
    log = (lambda message: None) if cfg.quiet or not main else tqdm.write
    models, optimizers = trainer.models, trainer.optimizers  # no "value" for rloo / grpo

    checkpoint = latest_checkpoint(run_dir, tuple(models)) if resume else None
    if resume:
        from ppo_rlhf.checkpoint import clean_partial_writes

        if main:
            clean_partial_writes(run_dir)  # half-written checkpoints and files of a killed run
    norm_file = run_dir / "reward_norm.json"
    if checkpoint is not None:
        state, history = load_checkpoint(checkpoint, models, optimizers, trainer.schedulers)
        if trainer.ptx is not None and "ptx" in state.extra:
            trainer.ptx.load(state.extra["ptx"])
        trainer.sampler.load(state.sampler)
        trainer.beta = state.beta
        trainer.consecutive_skips = state.extra.get("consecutive_skips", 0)
        if trainer.kl_controller is not None:
            trainer.kl_controller.load_state_dict(state.extra["kl_controller"])
        norm = json.loads(norm_file.read_text())
        start = state.iteration
        log(f"resuming {run_dir} from {checkpoint.name} (iteration {start} of {cfg.iterations})")
    else:
        saved = {**vars(cfg), "policy_model": resolve_model_path(cfg.policy_model), "reward_model": resolve_model_path(cfg.reward_model)}
        if main:
            atomic_write_text(run_dir / "config.yaml", to_yaml(TrainConfig(**saved)))
        norm = trainer.measure_reward_norm()  # every process: the statistics are gathered over all of them
        if main:
            atomic_write_text(norm_file, json.dumps(norm, indent=1))
        history, start = [], 0
        log(f"reward normalisation over {norm['n']} start-policy replies: mean {norm['mean']:+.3f} std {norm['std']:.3f} "
            f"(finished {norm['finished']:.2f})")
    trainer.reward_mean, trainer.reward_std = norm["mean"], norm["std"]
    if main:
        atomic_write_text(run_dir / "history.jsonl", "".join(history))
    if resume and main:
        keep_samples_before(run_dir, start)

    board = TensorBoard(run_dir / "tb" if cfg.tensorboard and main else None)

    def checkpoint_now(iteration: int) -> None:
        extra = {"consecutive_skips": trainer.consecutive_skips}
        if trainer.kl_controller is not None:
            extra["kl_controller"] = trainer.kl_controller.state_dict()
        if trainer.ptx is not None:
            extra["ptx"] = trainer.ptx.state()
        state = TrainingState(iteration=iteration, sampler=trainer.sampler.state(), beta=trainer.beta, extra=extra)
        if main:
            save_checkpoint(run_dir, state, models, optimizers, history, trainer.schedulers)
        trainer.dist.barrier()  # nobody runs ahead of a checkpoint being written

    progress = tqdm(range(start, cfg.iterations), desc="ppo", initial=start, total=cfg.iterations, disable=cfg.quiet)
    try:
        for index in progress:
            stats, rollout, batch = trainer.iteration(index)
            if not main:
                history.append(history_line(stats))
                done = index + 1
                if done % cfg.checkpoint_every == 0 or done == cfg.iterations:
                    checkpoint_now(done)
                continue
            if index == 0:
                write_token_table(run_dir, trainer, rollout, batch)
            history.append(history_line(stats))
            with open(run_dir / "history.jsonl", "a") as handle:
                handle.write(history[-1])
            board.log(stats)
            log(dashboard_line(stats))
            progress.set_postfix(score=f"{stats['score']:+.2f}", kl=f"{stats['kl']:.2f}", fin=f"{stats['fin']:.2f}")
            if index % cfg.sample_every == 0:
                log(write_samples(run_dir, index, rollout, batch))
            done = index + 1
            if done % cfg.checkpoint_every == 0 or done == cfg.iterations:
                checkpoint_now(done)
    except TrainingStopped as error:  # history.jsonl holds every finished iteration; name the checkpoint to resume
        last = latest_checkpoint(run_dir, tuple(models))
        where = f"latest checkpoint {last.name}" if last else "no checkpoint was written yet"
        raise TrainingStopped(f"{error}; {where}") from None
    finally:
        board.close()
    return run_dir


# ------------------------------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML file with any of the fields below; flags override it")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint (its saved config; flags override)")
    add_config_arguments(parser, TrainConfig)


def run(args: argparse.Namespace) -> int:
    if args.resume:
        run_dir = Path(args.resume)
        require(run_dir.is_dir(), f"run directory {run_dir} not found")
        require((run_dir / "config.yaml").is_file(),
                f"{run_dir} is not a run directory (no config.yaml; if its run was stopped while loading, start it again without --resume)")
        saved = read_yaml(run_dir / "config.yaml")
        flags = {k: v for k, v in vars(args).items() if k in TrainConfig.__dataclass_fields__}
        cfg = build_config(TrainConfig, saved, flags, {"out": str(run_dir)})
        train(cfg, resume=True)
        return 0
    cfg = config_from_args(TrainConfig, args)
    if not cfg.quiet:
        print(to_yaml(cfg), end="")
    train(cfg)
    return 0
