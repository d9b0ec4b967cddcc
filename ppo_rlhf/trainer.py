"""PPO for a causal language model against a reward model (sections 8.6-8.9): the algorithm, one iteration at a time.

One iteration, in the order of the chapter's listing:
  1. rollout      sample one reply per prompt with the current policy (temperature, token cap)
  2. score        log pi_old, log pi_ref (same network, adapter off) and values, no gradients, logits / temperature;
                  the reward model's score, normalised by start-policy replies, with the EOS rule
  3. rewards      -beta * (log pi_old - log pi_ref) on every reply token, plus the score at the last one
  4. advantages   GAE (gamma 1, lambda 0.95), whitened over reply tokens
  5. update       K epochs x minibatches of the clipped policy loss and the clipped value loss, averaged over
                  reply tokens; separate AdamW optimisers, gradient norm clipped to 1 for each model

The run around it (run directory, checkpoints, logging, resume, the `train` command) is in `train.py`.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ppo_rlhf.errors import UsageError, require
from ppo_rlhf.train_config import TrainConfig, resolve_device


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


# what update() reports (means over its optimiser steps), besides skipped_steps
UPDATE_STATS = ("pg_loss", "v_loss", "clipfrac", "approx_kl", "vclipfrac", "grad_norm_policy", "grad_norm_value", "ptx_loss")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def make_optimizer(model: torch.nn.Module, lr: float, cfg: TrainConfig) -> torch.optim.AdamW:
    from ppo_rlhf.distributed import is_sharded

    params = trainable_parameters(model)
    # fused: one kernel for all parameters (CPU and CUDA); the per-tensor loop took ~4x as long over LoRA's many small
    # factors (bench/README.md), with the same numbers to float rounding. Not under FSDP, whose optimiser mixes
    # sharded (DTensor) and whole parameters, which the fused kernel refuses.
    fused = not any(is_sharded(p) for p in params)
    return torch.optim.AdamW(params, lr=lr, eps=cfg.adam_eps, weight_decay=0.0, fused=fused)


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
    raw_advantages: torch.Tensor  # before whitening (GAE: returns - old_values), for the per-token table

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
    """The four models in two backbones (the reference is the policy with its adapter off, the reward model the value
    model with its adapter off), their optimisers and one iteration."""

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
        # The value model is the reward model + LoRA + a trained copy of its head, so the reward model is the value
        # model with its adapter off (`reward_scoring`), as the reference is the policy's: one backbone, not two.
        # rloo / grpo are critic-free: no value model is loaded, trained or checkpointed, the reward model is its own.
        if cfg.has_value_model:
            self.value_model = load_value_model(cfg.reward_model, lora, dtype=dtype, trust_remote_code=remote).to(self.device)
            self.reward_model = self.value_model
        else:
            self.value_model = None
            self.reward_model = load_reward_model(cfg.reward_model, dtype=dtype, trust_remote_code=remote).to(self.device)
        check_prompt_lengths(cfg, self.tokenizer, [self.policy, self.reward_model])
        require(not (self.dist.fsdp and cfg.generation_backend != "hf"),
                "FSDP shards the policy's layers: use generation_backend: hf (vLLM needs the whole policy per process)")
        for model in (self.policy, self.reward_model):  # FSDP: each process keeps a shard of every layer
            self.dist.shard_model(model)
        self.policy_optimizer = make_optimizer(self.policy, cfg.policy_lr, cfg)
        self.value_optimizer = make_optimizer(self.value_model, cfg.value_lr, cfg) if cfg.has_value_model else None
        # loss -> summed over processes -> clipped -> optimiser step, per model (through DeepSpeed when launched so)
        self.steps = {name: self.dist.gradient_step(model, self.optimizers[name], cfg.max_grad_norm)
                      for name, model in self.models.items()}
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
    def score_size(self) -> int:
        return self.cfg.score_batch_size or self.micro_size

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
        # token ids from the backend (generation.py); score() recomputes the log-probs the rollout does not carry
        if self.synced_version != self.policy_version:  # the policy changed since the engine last copied it
            self.generator.sync(self.policy)
            self.synced_version = self.policy_version
        return self.generator.generate(prompts)

    def reward_scoring(self):
        """A context in which `self.reward_model` is the frozen reward model (the value model's adapter and trained
        head copy off; nothing to switch without a value model)."""
        return self.value_model.disable_adapter() if self.value_model is not None else contextlib.nullcontext()

    def raw_scores(self, rollout) -> torch.Tensor:
        from ppo_rlhf.rollout import score_texts

        with self.reward_scoring():
            return score_texts(self.reward_model, self.reward_tokenizer, rollout.prompts, rollout.reply_texts,
                               batch_size=self.score_size)

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
                                  chunk_size=chunk, first=first, chunk_mb=cfg.logprob_chunk_mb)

        def reference_pass(ids, att):
            with self.policy.disable_adapter():  # the reference: the same weights with the adapter off
                return (token_logprobs(self.policy, ids.to(dev), att.to(dev), cfg.temperature, chunk_size=chunk,
                                       first=first, chunk_mb=cfg.logprob_chunk_mb),)

        def value_pass(ids, att):
            return (sequence_values(self.value_model, ids.to(dev), att.to(dev)),)

        if rollout.logprobs is not None:  # recorded by generate from the same weights (old_logprobs: generation)
            old_logprobs, entropy = rollout.logprobs.to(dev), rollout.entropy.to(dev)
        else:
            old_logprobs, entropy = per_token_in_chunks(policy_pass, rollout, self.score_size)
        (ref_logprobs,) = per_token_in_chunks(reference_pass, rollout, self.score_size)
        if self.value_model is not None:
            (values,) = per_token_in_chunks(value_pass, rollout, self.score_size)
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
            raw_advantages, returns = gae(rewards, old_values, act, gamma=cfg.gamma, lam=cfg.lam)  # 4. advantages
            advantages = self.dist.masked_whiten(raw_advantages, act)  # over the global batch's reply tokens
        else:  # one advantage per reply from the other replies to the same prompt, on every reply token
            advantages, returns = self.group_advantages(scores, kl, act)
            raw_advantages = advantages
        return Batch(act, old_logprobs, ref_logprobs, entropy, old_values, raw, scores, rewards, kl, advantages, returns,
                     raw_advantages)

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
        totals: dict[str, list[float]] = {k: [] for k in UPDATE_STATS}
        skipped = 0
        dist = self.dist  # data parallel: sums over every process's rows (a no-op in one process)
        self.policy.train()  # dropout is off (detail 5); train() only enables autograd paths
        if critic is not None:
            critic.train()
        for _epoch in range(cfg.epochs):
            order = torch.randperm(len(rollout.prompts)).tolist()
            for minibatch in row_chunks(order, cfg.minibatch_size // dist.world_size):  # this process's share
                for step in self.steps.values():
                    step.zero_grad()
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
                                         chunk_size=cfg.logprob_chunk or None, first=first_reply_position(part.prompt_ids),
                                         chunk_mb=cfg.logprob_chunk_mb)
                    new_logprobs, entropy = out if cfg.entropy_coef > 0 else (out, None)
                    pg = clipped_policy_loss(new_logprobs, mb["old_logprobs"], mb["advantages"], act, cfg.clip_range,
                                             cfg.loss_aggregation, normalizer)
                    policy_loss = pg.loss * share
                    if entropy is not None:
                        policy_loss = policy_loss - cfg.entropy_coef * masked_sum(entropy, act) / n_tokens
                    # The two models share no parameters: one backward each, so the policy's activations are freed
                    # before the value model's exist (peak memory = one model's, not both)
                    self.steps["policy"].backward(policy_loss)
                    if critic is not None:
                        values = (sequence_values(critic, ids, att) - self.reward_mean) / self.reward_std
                        vl = clipped_value_loss(values, mb["old_values"], mb["returns"], act, cfg.value_clip_range,
                                                cfg.loss_aggregation, normalizer)
                        self.steps["value"].backward(vl.loss * share)
                    else:
                        vl = ValueLoss(torch.zeros((), device=dev), torch.zeros((), device=dev))
                    weight = float(act.sum()) / n_tokens  # token share of this micro-batch, for the logged means
                    sums["pg_loss"] += float(pg.loss.detach()) * share
                    sums["v_loss"] += float(vl.loss.detach()) * share
                    sums["clipfrac"] += float(pg.clip_fraction) * weight
                    sums["approx_kl"] += float(pg.approx_kl) * weight
                    sums["vclipfrac"] += float(vl.clip_fraction) * weight
                ptx_loss = self.ptx_step() if self.ptx is not None else float("nan")
                sums = dist.sum_dict(sums)
                # the global minibatch's gradients, clipped (DeepSpeed: its whole step, skipping a non-finite one)
                grad_norms = {name: step.finish() for name, step in self.steps.items()}
                grad_policy, grad_value = grad_norms["policy"], grad_norms.get("value", 0.0)
                if not all(math.isfinite(x) for x in (grad_policy, grad_value, sums["pg_loss"], sums["v_loss"])):
                    skipped += 1  # a non-finite loss or gradient never reaches the weights
                    self.consecutive_skips += 1
                    if self.consecutive_skips >= cfg.max_skipped_steps:
                        raise TrainingStopped(f"{self.consecutive_skips} consecutive non-finite steps; stopping "
                                              "(the last checkpoint is intact)")
                    continue
                self.consecutive_skips = 0
                for step in self.steps.values():
                    step.apply()
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
        self.steps["policy"].backward(self.cfg.ptx_coef * nll / self.dist.world_size)
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
            update = {k: float("nan") for k in UPDATE_STATS}
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
            **({"ptx_loss": update["ptx_loss"]} if cfg.ptx_coef > 0 else {}),
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
        if self.kl_controller is not None and math.isfinite(stats["kl"]):  # a skipped batch must not move beta
            self.beta = self.kl_controller.update(stats["kl"], cfg.batch_size)
        return stats, rollout, batch
