"""PPO for a causal language model against a reward model (sections 8.6-8.9): the algorithm, one iteration at a time.

One iteration, in the order of the chapter's listing:
  1. rollout      sample one reply per prompt with the current policy (temperature, token cap)
  2. score        log pi_old, log pi_ref (same network, adapter off) and values, no gradients, logits / temperature;
                  the reward model's score, normalised by start-policy replies, with the EOS rule
  3. rewards      -beta * (log pi_old - log pi_ref) on every reply token, plus the score at the last one
  4. advantages   GAE (gamma 1, lambda 0.95), whitened over reply tokens
  5. update       K epochs x minibatches of the clipped policy loss and the clipped value loss, averaged over
                  reply tokens; separate AdamW optimisers, gradient norm clipped to 1 for each model

Steps 1-4 make one `Experience` (`make_experience`), step 5 reads it (`update`); the models act through their roles
(`roles.py`: Actor, Critic, RewardModel) and the advantages through one strategy per estimator (`advantages.py`).
The run around it (run directory, checkpoints, logging, resume, the `train` command) is in `train.py`.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ppo_rlhf.advantages import make_advantages
from ppo_rlhf.chat import chat_prompt_ids
from ppo_rlhf.checkpoint import load_adapter, trained_weights
from ppo_rlhf.distributed import current, is_sharded
from ppo_rlhf.errors import UsageError, require
from ppo_rlhf.experience import Experience
from ppo_rlhf.generation import make_generator
from ppo_rlhf.logprobs import first_reply_position
from ppo_rlhf.models import LoraSettings, load_policy, load_reward_model, load_tokenizer, load_value_model
from ppo_rlhf.objectives import (
    AdaptiveKLController,
    clipped_policy_loss,
    clipped_value_loss,
    explained_variance,
    kl_estimate,
    kl_k3,
    masked_sum,
    normalise_loss,
    per_token_rewards,
    policy_token_weights,
)
from ppo_rlhf.precision import resolve_dtype
from ppo_rlhf.prompts import read_numbered_prompts, read_prompts
from ppo_rlhf.ptx import PtxData, ptx_nll, ptx_targets, read_texts
from ppo_rlhf.roles import Actor, Critic, RewardModel
from ppo_rlhf.rollout import Rollout
from ppo_rlhf.schedules import make_scheduler
from ppo_rlhf.train_config import TrainConfig


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


# what update() reports (means over its optimiser steps; ratio_spread: the first minibatch's), besides skipped_steps
UPDATE_STATS = ("pg_loss", "v_loss", "clipfrac", "approx_kl", "vclipfrac", "grad_norm_policy", "grad_norm_value",
                "ptx_loss", "ratio_spread")
# the order of an iteration's numbers in history.jsonl; "phase" is "critic-warmup" or "policy", "kl_used" names the
# estimator and placement of "kl" (mean over replies of the summed per-token estimate at pi_old), e.g. "k1 in reward"
HISTORY_ORDER = ("iteration", "phase", "score", "rm_raw", "kl", "kl_used", "len", "fin", "ent", "clipfrac",
                 "approx_kl", "v_loss", "ev", "vclipfrac", "mismatch_kl", "ratio_spread", "pg_loss",
                 "grad_norm_policy", "grad_norm_value", "ptx_loss", "lr", "beta", "skipped_steps", "time_gen",
                 "time_score", "time_update", "time_total", "gen_tokens_per_s")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def make_optimizer(model: torch.nn.Module, lr: float, cfg: TrainConfig) -> torch.optim.AdamW:
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
    return tuple(torch.cat([pad(piece[k], (0, width - piece[k].shape[1])) for piece in pieces])
                 for k in range(len(pieces[0])))


def check_prompt_lengths(cfg: TrainConfig, tokenizer, models: list[torch.nn.Module]) -> None:
    """Every chat-templated prompt within `max_prompt_tokens`, and prompt + reply cap within every model's context:
    a UsageError naming the first line that is not."""
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
    """The roles (an Actor, a Critic for GAE, else a frozen RewardModel), their optimisers and one iteration.
    Two backbones hold the four models: the reference is the policy with its adapter off, the reward model the value
    model with its adapter off."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.dist = current()  # this process's rank among the data-parallel processes (one: a no-op)
        self.device = self.dist.device(cfg.device)
        self.prompts = read_prompts(cfg.prompts)
        seed_everything(cfg.seed)
        self.advantages = make_advantages(cfg, self.dist)
        self._load_roles()
        self.schedulers = self._make_schedulers()
        self.ptx = None
        if cfg.ptx_coef > 0:
            self.ptx = PtxData(read_texts(cfg.ptx_data), self.tokenizer, cfg.ptx_batch_size, cfg.ptx_max_tokens,
                               cfg.seed + 2)
        self.generator = make_generator(cfg, self.policy, self.tokenizer)
        self.policy_version, self.synced_version = 0, -1  # optimiser steps taken / copied into the generator
        self.dist.diverge_rngs(cfg.seed)  # identical initial weights everywhere; now different samples per process
        self.sampler = PromptSampler(len(self.prompts), cfg.seed)
        self.beta = cfg.beta
        self.kl_controller = AdaptiveKLController(cfg.beta, cfg.kl_target, cfg.kl_horizon) if cfg.adaptive_kl else None
        self.reward_mean, self.reward_std = 0.0, 1.0
        self.consecutive_skips = 0
        self.policy_started = False  # set once past the critic warm-up (`phase`), checkpointed

    def _load_roles(self) -> None:
        """The policy (Actor) and either the value model (Critic, whose adapter off is the reward model) or, for the
        critic-free estimators, the frozen reward model alone."""
        cfg, remote = self.cfg, self.cfg.trust_remote_code
        dtype = self.dtype = resolve_dtype(cfg.dtype, self.device)  # the frozen weights'; trained ones stay fp32
        lora = LoraSettings(rank=cfg.lora_rank, alpha=cfg.lora_alpha)
        self.tokenizer = load_tokenizer(cfg.policy_model, trust_remote_code=remote)
        reward_tokenizer = load_tokenizer(cfg.reward_model, trust_remote_code=remote)
        require(reward_tokenizer.get_vocab() == self.tokenizer.get_vocab(), "the value model reads every position of "
                "the policy's sequences, so the reward model must use the policy's tokenizer")
        self.policy = load_policy(cfg.policy_model, lora, dtype=dtype, trust_remote_code=remote).to(self.device)
        load = load_value_model if self.advantages.needs_critic else load_reward_model
        args = (cfg.reward_model, lora) if self.advantages.needs_critic else (cfg.reward_model,)
        scorer = load(*args, dtype=dtype, trust_remote_code=remote).to(self.device)
        check_prompt_lengths(cfg, self.tokenizer, [self.policy, scorer])
        require(not (self.dist.fsdp and cfg.generation_backend != "hf"),
                "FSDP shards the policy's layers: use generation_backend: hf (vLLM needs the whole policy per process)")
        for model in (self.policy, scorer):  # FSDP: each process keeps a shard of every layer
            self.dist.shard_model(model)
        self.actor = Actor(self.policy, self.gradient_step(self.policy, cfg.policy_lr), cfg)
        self.critic = Critic(scorer, reward_tokenizer, self.gradient_step(scorer, cfg.value_lr), cfg.padding_free) \
            if self.advantages.needs_critic else None
        self.reward_model = self.critic or RewardModel(scorer, reward_tokenizer, cfg.padding_free)
        self.value_model = self.critic.model if self.critic else None
        # the trained roles by checkpoint folder name: each backward, step and optimiser state goes through them
        self.roles = {"policy": self.actor, **({"value": self.critic} if self.critic else {})}

    def gradient_step(self, model: torch.nn.Module, lr: float):
        """loss -> summed over processes -> clipped -> optimiser step (through DeepSpeed when launched so)."""
        return self.dist.gradient_step(model, make_optimizer(model, lr, self.cfg), self.cfg.max_grad_norm)

    @property
    def micro_size(self) -> int:
        return self.cfg.micro_batch_size or self.cfg.minibatch_size

    @property
    def score_size(self) -> int:
        return self.cfg.score_batch_size or self.micro_size

    @property
    def models(self) -> dict[str, torch.nn.Module]:
        """The trained models by checkpoint folder name (no "value" for the critic-free estimators)."""
        return {name: role.model for name, role in self.roles.items()}

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {name: role.step.optimizer for name, role in self.roles.items()}

    @property
    def policy_optimizer(self) -> torch.optim.Optimizer:
        return self.actor.step.optimizer

    @property
    def value_optimizer(self) -> torch.optim.Optimizer | None:
        return self.critic.step.optimizer if self.critic else None

    def _make_schedulers(self) -> dict[str, Any]:
        """LambdaLR per optimiser, stepped per optimiser step; none for the constant schedule without warm-up."""
        cfg = self.cfg
        if cfg.lr_schedule == "constant" and cfg.warmup_iterations == 0:
            return {}
        steps = cfg.epochs * (cfg.batch_size // cfg.minibatch_size)  # optimiser steps per iteration
        return {name: make_scheduler(opt, cfg.lr_schedule, cfg.warmup_iterations * steps, cfg.iterations * steps)
                for name, opt in self.optimizers.items()}

    # ------------------------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs besides the RNG states: trained weights (whole tensors), each gradient
        step's optimiser state, schedulers, prompt order, KL coefficient and counters. A collective under FSDP and
        DeepSpeed (shards and partitions are gathered): every process calls it."""
        return {
            "weights": {name: trained_weights(model, self.dist) for name, model in self.models.items()},
            "optimizers": {name: role.step.state_dict() for name, role in self.roles.items()},
            "schedulers": {name: scheduler.state_dict() for name, scheduler in self.schedulers.items()},
            "sampler": self.sampler.state(),
            "beta": self.beta,
            "consecutive_skips": self.consecutive_skips,
            "policy_started": self.policy_started,
            "kl_controller": self.kl_controller.state_dict() if self.kl_controller else None,
            "ptx": self.ptx.state() if self.ptx else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A saved `state_dict` into this trainer (into FSDP shards and DeepSpeed partitions too)."""
        for name, model in self.models.items():  # the weights first: DeepSpeed refreshes its master copy from them
            load_adapter(model, state["weights"][name], f"its {name} adapter does not fit this model")
        for name, role in self.roles.items():
            role.step.load_state_dict(state["optimizers"][name])
        for name, scheduler in self.schedulers.items():
            require(name in state["schedulers"], f"it has no {name} learning-rate scheduler state")
            scheduler.load_state_dict(state["schedulers"][name])
        self.sampler.load(state["sampler"])
        self.beta, self.consecutive_skips = state["beta"], state["consecutive_skips"]
        self.policy_started = state.get("policy_started", True)  # checkpoints from before the warm-up option
        if self.kl_controller is not None:
            self.kl_controller.load_state_dict(state["kl_controller"])
        if self.ptx is not None and state["ptx"] is not None:
            self.ptx.load(state["ptx"])

    # ----------------------------------------------------------------------------------------- 1. rollout
    def rollout(self, prompts: list[str]) -> Rollout:
        # token ids from the backend (generation.py); score() recomputes the log-probs the rollout does not carry
        if self.synced_version != self.policy_version:  # the policy changed since the engine last copied it
            self.generator.sync(self.policy)
            self.synced_version = self.policy_version
        return self.generator.generate(prompts)

    def raw_scores(self, rollout: Rollout) -> torch.Tensor:
        return self.reward_model.reward_scores(rollout.prompts, rollout.reply_texts, self.score_size)

    def measure_reward_norm(self) -> dict[str, float]:
        """Mean and std of the reward model's scores of start-policy replies to training prompts (detail 1)."""
        n = self.cfg.reward_norm_samples
        rng = np.random.default_rng(self.cfg.seed + 1)
        picks = rng.choice(len(self.prompts), size=n, replace=n > len(self.prompts))
        picks = self.dist.shard(picks.tolist())  # this process's share (all of them in one process)
        scores, finished = [], []
        for rows in tqdm(row_chunks(len(picks), self.cfg.batch_size), desc="reward normalisation",
                         disable=self.cfg.quiet, leave=False):
            rollout = self.rollout([self.prompts[picks[i]] for i in rows])
            scores.append(self.raw_scores(rollout))
            finished.append(rollout.finished)
        scores, finished = self.dist.gather_1d(torch.cat(scores)), self.dist.gather_1d(torch.cat(finished))
        require(bool(torch.isfinite(scores).all()), "the reward model gave non-finite scores to start-policy replies")
        std = float(scores.std()) if n > 1 else 1.0
        require(std > 0, "the reward model gave every start-policy reply the same score: it cannot be normalised")
        return {"mean": float(scores.mean()), "std": std, "n": n, "finished": float(finished.float().mean())}

    # ------------------------------------------------------------------------------ 2-4. score, rewards, advantages
    def make_experience(self, prompts: list[str]) -> Experience:
        """Steps 1-4: sample one reply per prompt, then score it."""
        return self.score(self.rollout(prompts))

    @torch.no_grad()
    def score(self, rollout: Rollout) -> Experience:
        cfg, dev, size = self.cfg, self.device, self.score_size
        experience = Experience.sampled(rollout)
        act = rollout.action_mask.to(dev)
        first = first_reply_position(rollout.prompt_ids)  # no LM head over positions that are prompt in every row
        if cfg.old_logprobs == "generation":  # recorded by generate from the same weights
            old_logprobs, entropy = rollout.logprobs.to(dev), rollout.entropy.to(dev)
        else:
            old_logprobs, entropy = per_token_in_chunks(
                lambda ids, att: self.actor.logprobs(ids, att, first, with_entropy=True), rollout, size)
        (ref_logprobs,) = per_token_in_chunks(
            lambda ids, att: (self.actor.reference_logprobs(ids, att, first),), rollout, size)
        old_values = torch.zeros_like(act)  # critic-free estimators: no values
        if self.critic is not None:
            (values,) = per_token_in_chunks(lambda ids, att: (self.critic.values(ids, att),), rollout, size)
            old_values = self.normalised(values) * act
        raw = self.raw_scores(rollout).to(dev)
        scores = self.normalised(raw)
        if cfg.eos_rule:
            scores = torch.where(rollout.finished.to(dev), scores, torch.full_like(scores, cfg.unfinished_score))
        reward_beta = self.beta if cfg.kl_placement == "reward" else 0.0  # kl_in: loss keeps the rewards KL-free
        rewards, kl = per_token_rewards(scores, old_logprobs, ref_logprobs, act, reward_beta, cfg.kl_kind)  # 3.
        if cfg.whiten_rewards:
            rewards = self.dist.masked_whiten(rewards, act, shift_mean=False)
        advantages, raw_advantages, returns = self.advantages(rewards, old_values, scores, kl, act, reward_beta)  # 4.
        recorded = rollout.logprobs.to(dev) if rollout.logprobs is not None else None  # what generate sampled with
        return replace(experience, action_mask=act, old_logprobs=old_logprobs, entropy=entropy,
                       ref_logprobs=ref_logprobs, old_values=old_values, raw_scores=raw, scores=scores,
                       rewards=rewards, kl=kl, advantages=advantages, raw_advantages=raw_advantages, returns=returns,
                       rollout_logprobs=recorded, tis_weights=policy_token_weights(old_logprobs, recorded, cfg.tis_cap))

    def normalised(self, raw: torch.Tensor) -> torch.Tensor:
        """Reward-model outputs (scores or values) on the scale of start-policy replies' scores (detail 1)."""
        return (raw - self.reward_mean) / self.reward_std

    # ------------------------------------------------------------------------------------------- 5. update
    def update(self, experience: Experience, train_policy: bool = True) -> dict[str, float]:
        """K epochs over the batch in shuffled minibatches, one optimiser step per model per minibatch (or a skip of
        them all). train_policy=False (critic warm-up): the value model alone; the policy's weights do not move."""
        cfg = self.cfg
        roles = {name: role for name, role in self.roles.items() if train_policy or name != "policy"}
        accepted: list[dict[str, float]] = []
        first_spread = None  # max |ratio - 1| over the first minibatch: before any step, only rounding moves it
        self.set_training(True)  # dropout is off (detail 5); train() only enables autograd paths
        for _epoch in range(cfg.epochs):
            order = torch.randperm(len(experience.prompts)).tolist()
            for minibatch in row_chunks(order, cfg.minibatch_size // self.dist.world_size):  # this process's share
                stats = self.minibatch_step(experience, minibatch, roles)
                if first_spread is None and "ratio_spread" in stats:
                    first_spread = stats["ratio_spread"]
                if self.accept_step(stats, roles):
                    accepted.append(stats)
        self.set_training(False)
        stats = {key: float(np.mean([s[key] for s in accepted])) if accepted and key in accepted[0] else float("nan")
                 for key in UPDATE_STATS}
        return {**stats, "ratio_spread": float("nan") if first_spread is None else first_spread,  # nan: no policy step
                "skipped_steps": cfg.epochs * (cfg.batch_size // cfg.minibatch_size) - len(accepted)}

    def minibatch_step(self, experience: Experience, minibatch: list[int], roles: dict[str, Any]) -> dict[str, float]:
        """Per micro-batch: new log-probs, the policy loss, the value loss, one backward per trained model; then each
        model's gradient summed over processes and clipped. Returns the minibatch's numbers (not yet applied)."""
        for role in roles.values():
            role.step.zero_grad()
        tokens, count = self.global_counts(experience, minibatch)
        sums: dict[str, float] = {}
        spread = 0.0  # max |ratio - 1| over the minibatch (a max, not a sum, over micro-batches)
        for micro in row_chunks(minibatch, self.micro_size):
            part = experience.select(micro)
            token_share = float(part.action_mask.sum()) / tokens  # weight of its token means in the logs
            numbers: dict[str, float] = {}
            # The two models share no parameters: one backward each, so the policy's activations are freed before
            # the value model's exist (peak memory = one model's, not both)
            if "policy" in roles:
                policy_loss, numbers = self.policy_loss(part, count, token_share)
                spread = max(spread, numbers.pop("ratio_spread"))
                self.actor.step.backward(policy_loss)
            if "value" in roles:
                value_loss, value_numbers = self.value_loss(part, count, token_share)
                self.critic.step.backward(value_loss)
                numbers |= value_numbers
            for key, value in numbers.items():
                sums[key] = sums.get(key, 0.0) + value
        if self.ptx is not None and "policy" in roles:
            sums["ptx_loss"] = self.ptx_step()
        stats = self.dist.sum_dict(sums)  # statistics reduced once per step
        if "policy" in roles:
            stats["ratio_spread"] = self.dist.max(spread)
        # the global minibatch's gradients, clipped (DeepSpeed: its whole step, skipping a non-finite one)
        return stats | {f"grad_norm_{name}": role.step.finish() for name, role in roles.items()}

    def global_counts(self, experience: Experience, minibatch: list[int]) -> tuple[float, float]:
        """(reply tokens in the global minibatch, the count its losses are averaged over: tokens or replies)."""
        tokens = self.dist.sum(float(experience.action_mask[minibatch].sum()))
        rows = self.dist.sum(float(len(minibatch)))
        return tokens, tokens if self.cfg.loss_aggregation == "token" else rows

    def policy_loss(self, part: Experience, count: float, token_share: float) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped policy loss (minus the entropy bonus) of a micro-batch, each token weighted by its truncated
        importance weight: its share of the global mean. Its numbers add up over micro-batches (ratio_spread: a max)."""
        cfg, act = self.cfg, part.action_mask
        out = self.actor.logprobs(part.input_ids, part.attention_mask, first_reply_position(part.prompt_ids),
                                  with_entropy=cfg.entropy_coef > 0)
        new_logprobs, entropy = out if cfg.entropy_coef > 0 else (out, None)
        pg = clipped_policy_loss(new_logprobs, part.old_logprobs, part.advantages, act,
                                 cfg.clip_range_low or cfg.clip_range, cfg.loss_aggregation, count,
                                 clip_range_high=cfg.clip_range_high or cfg.clip_range, dual_clip=cfg.dual_clip,
                                 token_weights=part.tis_weights)
        loss = pg.loss
        if cfg.kl_placement == "loss":  # beta * KL(pi || pi_ref) of the current policy, a loss term (GRPO's default)
            kl = kl_estimate(new_logprobs, part.ref_logprobs, cfg.kl_kind)
            loss = loss + self.beta * normalise_loss(kl, act, cfg.loss_aggregation, count)
        if entropy is not None:
            loss = loss - cfg.entropy_coef * normalise_loss(entropy, act, cfg.loss_aggregation, count)
        return loss, {"pg_loss": float(pg.loss.detach()), "clipfrac": float(pg.clip_fraction) * token_share,
                      "approx_kl": float(pg.approx_kl) * token_share, "ratio_spread": float(pg.ratio_spread)}

    def value_loss(self, part: Experience, count: float, token_share: float) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped value loss of a micro-batch, values on the normalised reward scale: its share of the mean."""
        cfg = self.cfg
        values = self.normalised(self.critic.values(part.input_ids, part.attention_mask))
        vl = clipped_value_loss(values, part.old_values, part.returns, part.action_mask, cfg.value_clip_range,
                                cfg.loss_aggregation, count)
        return vl.loss, {"v_loss": float(vl.loss.detach()), "vclipfrac": float(vl.clip_fraction) * token_share}

    def ptx_step(self) -> float:
        """PPO-ptx: backward of ptx_coef * the next-token NLL of one batch of ptx texts (temperature 1), averaged over
        every process's ptx tokens and accumulated into this optimiser step's policy gradient. Returns this process's
        share of the mean NLL (summed over processes: the mean)."""
        ids, att = self.ptx.next_batch()
        count = self.dist.sum(float(ptx_targets(att).sum()))
        nll = ptx_nll(self.policy, ids.to(self.device), att.to(self.device), self.cfg.logprob_chunk or None, count)
        self.actor.step.backward(self.cfg.ptx_coef * nll)
        return float(nll.detach())

    def accept_step(self, stats: dict[str, float], roles: dict[str, Any]) -> bool:
        """Apply every trained model's step, or none: a non-finite loss or gradient never reaches the weights."""
        if not all(math.isfinite(value) for value in stats.values()):
            for role in roles.values():
                role.step.discard()
            self.count_skip("consecutive non-finite steps")
            return False
        self.consecutive_skips = 0
        for name, role in roles.items():
            role.step.apply()
            if name in self.schedulers:
                self.schedulers[name].step()
        if "policy" in roles:
            self.policy_version += 1
        return True

    def count_skip(self, what: str) -> None:
        self.consecutive_skips += 1
        if self.consecutive_skips >= self.cfg.max_skipped_steps:
            raise TrainingStopped(f"{self.consecutive_skips} {what}; stopping (the last checkpoint is intact)")

    def set_training(self, on: bool) -> None:
        for model in self.models.values():
            model.train(on)

    def next_prompts(self) -> list[str]:
        """This process's prompts of the next batch: batch_size // group_size prompts drawn (identically on every
        process), each repeated group_size times in consecutive rows, then this rank's contiguous share of whole
        groups."""
        cfg = self.cfg
        drawn = self.sampler.next(cfg.batch_size // cfg.group_size)
        drawn = self.dist.shard(drawn)
        return [self.prompts[i] for i in drawn for _ in range(cfg.group_size)]

    # ------------------------------------------------------------------------------------- one iteration
    def iteration(self, index: int) -> tuple[dict[str, Any], Experience]:
        cfg = self.cfg
        start = time.perf_counter()
        rollout = self.rollout(self.next_prompts())  # 1. rollout
        generated = time.perf_counter()
        experience = self.score(rollout)  # 2-4. score, rewards, advantages
        scored = time.perf_counter()
        batch = self.batch_stats(experience)
        phase = self.phase(index, batch["ev"])
        scored_numbers = (experience.scores, experience.advantages, experience.returns)
        finite = all(bool(torch.isfinite(t).all()) for t in scored_numbers)
        if finite:
            update = self.update(experience, train_policy=phase == "policy")  # 5. update
        else:  # e.g. a reward model that returned NaN: nothing from this batch reaches the weights
            self.count_skip("consecutive iterations with non-finite rewards")
            update = {k: float("nan") for k in UPDATE_STATS}
            update["skipped_steps"] = cfg.epochs * (cfg.batch_size // cfg.minibatch_size)
        updated = time.perf_counter()
        stats = {"iteration": index, "phase": phase, **batch, "kl_used": f"{cfg.kl_kind} in {cfg.kl_placement}",
                 **update, **({"lr": self.policy_optimizer.param_groups[0]["lr"]} if self.schedulers else {}),
                 "beta": self.beta, "time_gen": generated - start, "time_score": scored - generated,
                 "time_update": updated - scored, "time_total": updated - start,
                 "gen_tokens_per_s": float(experience.reply_lengths.sum()) / max(generated - start, 1e-9)}
        if not cfg.ptx_coef > 0:
            del stats["ptx_loss"]
        # a skipped batch must not move beta, nor a warm-up batch (the policy, hence its KL, did not move)
        if self.kl_controller is not None and math.isfinite(stats["kl"]) and phase == "policy":
            self.beta = self.kl_controller.update(stats["kl"], cfg.batch_size)
        return {key: stats[key] for key in HISTORY_ORDER if key in stats}, experience

    def phase(self, index: int, ev: float) -> str:
        """"critic-warmup" (value model only) for the first critic_warmup_iterations, then until a batch's explained
        variance (mean over processes, so every process agrees) reaches policy_start_ev; "policy" from then on."""
        if index < self.cfg.critic_warmup_iterations:
            return "critic-warmup"
        if not self.policy_started:
            mean_ev = self.dist.sum(ev) / self.dist.world_size
            self.policy_started = self.cfg.policy_start_ev is None or mean_ev >= self.cfg.policy_start_ev  # nan: no
        return "policy" if self.policy_started else "critic-warmup"

    def batch_stats(self, experience: Experience) -> dict[str, float]:
        """The batch's numbers on the dashboard, means over every process's replies (equal counts each)."""
        act = experience.action_mask
        means = {"score": float(experience.scores.mean()), "rm_raw": float(experience.raw_scores.mean()),
                 "kl": float(masked_sum(experience.kl, act, dim=1).mean()),
                 "len": float(experience.reply_lengths.float().mean()),
                 "fin": float(experience.finished.float().mean())}
        means = {key: value / self.dist.world_size for key, value in self.dist.sum_dict(means).items()}
        # means over reply tokens, summed and counted over every process (their counts differ): the entropy, and the
        # k3 estimate of KL(generate's recorded log-probs || the trainer's log pi_old) of the same tokens
        recorded = experience.rollout_logprobs
        mismatch = float("nan") if recorded is None else masked_sum(kl_k3(experience.old_logprobs, recorded), act)
        sums = self.dist.sum_dict({"ent": float(masked_sum(experience.entropy, act)), "mismatch_kl": float(mismatch),
                                   "tokens": float(act.sum())})
        means |= {key: sums[key] / sums["tokens"] for key in ("ent", "mismatch_kl")}
        ev = explained_variance(experience.old_values, experience.returns, act) if self.critic else float("nan")
        return {**means, "ev": ev}
