"""PPO for a causal language model against a reward model (sections 8.6-8.9): the algorithm, one iteration at a time.

One iteration, in the order of the chapter's listing:
  1. rollout      sample one reply per prompt with the current policy (temperature, token cap)
  2. score        log pi_old, log pi_ref (same network, adapter off) and values, no gradients, logits / temperature;
                  the reward model's score, normalised by start-policy replies, with the EOS rule
  3. rewards      -beta * (log pi_old - log pi_ref) on every reply token, plus the score at the last one
  4. advantages   GAE (gamma 1, lambda 0.95), whitened over reply tokens
  5. update       K epochs x minibatches of the clipped policy loss and the clipped value loss, averaged over
                  reply tokens; separate AdamW optimisers, gradient norm clipped to 1 for each model

Steps 1-4 make one `Experience` (`rollout`, then `score`), step 5 reads it (`update`). The models are loaded by
`build.py` and act through their roles (`roles.py`: Actor, Critic; `models.scores.RewardModel`); the rewards, their
normalisation and the hacking monitor are `scoring.py`'s; the advantages come from one strategy per estimator
(`advantages.py`). The run around it (run directory, checkpoints, logging, resume) is in `run.py`.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from ppo_rlhf.data import Prompt, PromptRow, load_prompt_rows
from ppo_rlhf.errors import UsageError, require
from ppo_rlhf.models.logprobs import first_reply_position
from ppo_rlhf.models.rollout import Rollout
from ppo_rlhf.parallel.distributed import current
from ppo_rlhf.ppo.advantages import make_advantages, masked_whiten_over
from ppo_rlhf.ppo.build import build_models, load_episode_code, make_rollout_generator, micro_size, score_size
from ppo_rlhf.ppo.build import check_prompt_lengths as check_prompt_lengths  # (its older address)
from ppo_rlhf.ppo.build import trainable_parameters as trainable_parameters  # (its older address)
from ppo_rlhf.ppo.checkpoint import load_adapter, trained_weights
from ppo_rlhf.ppo.experience import Experience, per_token_in_chunks, rollout_fields, row_chunks
from ppo_rlhf.ppo.objectives import (
    AdaptiveKLController,
    FixedKLController,
    clipped_policy_loss,
    clipped_value_loss,
    kl_estimate,
    normalise_loss,
    policy_token_weights,
    shape_rewards,
)
from ppo_rlhf.ppo.ptx import ptx_data, ptx_nll, ptx_targets
from ppo_rlhf.ppo.scoring import Scoring
from ppo_rlhf.ppo.stats import HISTORY_ORDER, batch_stats
from ppo_rlhf.ppo.train_config import TrainConfig


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
def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def clock(device: torch.device) -> float:
    """time.perf_counter() once this process's queued GPU work is done: CUDA kernels run asynchronously, so without
    the wait a phase's time would include the previous phase's tail (the time_* statistics)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def delegated(name: str, settable: bool = False) -> property:
    """The loop's `scoring.<name>`, read (and, settable, set) as an attribute of the loop."""

    def set_it(loop: PPOLoop, value: Any) -> None:
        setattr(loop.scoring, name, value)

    return property(lambda loop: getattr(loop.scoring, name), set_it if settable else None)


class TrainingStopped(UsageError):
    """Too many consecutive non-finite steps: the run stops, its last good checkpoint intact."""


class PPOLoop:
    """One iteration of PPO over the models `build.build_models` loads (an Actor, a Critic for GAE, their
    optimisers) and the rewards `scoring.Scoring` computes. In the chapter's set-up two backbones hold the four
    models: the reference is the policy with its adapter off, the reward model the value model with its adapter off.

    `reward_funcs` (None: cfg.reward_funcs) are added after cfg.reward_model; `prompt_rows` (None: read from
    cfg.prompts); `policy` a loaded causal LM to train instead of loading cfg.policy_model, `tokenizer` its tokenizer
    (None: cfg.policy_model's); `monitor_judges` (None: cfg.monitor_judges) the reward-hacking monitor's second judges.
    The public, documented entry point is `ppo_rlhf.PPOTrainer` (api.py)."""

    def __init__(self, cfg: TrainConfig, reward_funcs: list | None = None, prompt_rows: list[PromptRow] | None = None,
                 policy: torch.nn.Module | None = None, tokenizer=None, monitor_judges: list | None = None,
                 tools: list | None = None, environment_factory=None):
        self.cfg, self.micro_size, self.score_size = cfg, micro_size(cfg), score_size(cfg)
        if cfg.threads:  # before the models load; 0 keeps torch's default
            torch.set_num_threads(cfg.threads)
        self.dist = current()  # this process's rank among the data-parallel processes (one: a no-op)
        episode_code = load_episode_code(cfg, self.dist, tools, environment_factory)  # a multi-turn run's tools
        self.device = self.dist.device(cfg.device)
        self.prompt_rows = prompt_rows if prompt_rows is not None else load_prompt_rows(cfg.prompts, cfg.prompt_column)
        self.prompts = [row.prompt for row in self.prompt_rows]
        seed_everything(cfg.seed)
        self.advantages = make_advantages(cfg, self.dist)
        built = build_models(cfg, self.dist, self.device, self.advantages.needs_critic, self.prompt_rows,
                             list(cfg.reward_funcs) if reward_funcs is None else list(reward_funcs), policy, tokenizer,
                             list(cfg.monitor_judges) if monitor_judges is None else list(monitor_judges),
                             has_environment=episode_code.environment_factory is not None)
        self.tokenizer, self.dtype, self.policy, self.actor = built.tokenizer, built.dtype, built.policy, built.actor
        self.critic, self.reward_model, self.roles, self.schedulers = (built.critic, built.reward_model, built.roles,
                                                                       built.schedulers)
        self.value_model = self.critic.model if self.critic else None
        self.scoring = Scoring(cfg, self.dist, self.device, built)  # the rewards, normalised, and the monitor
        self.ptx = ptx_data(cfg, self.tokenizer)  # PPO-ptx's texts, or None
        self.generator = make_rollout_generator(cfg, self.dist, self.policy, self.tokenizer, episode_code)
        self.policy_version, self.synced_version = 0, -1  # optimiser steps taken / copied into the generator
        self.dist.diverge_rngs(cfg.seed)  # identical initial weights everywhere; now different samples per process
        self.sampler = PromptSampler(len(self.prompts), cfg.seed)
        # the KL coefficient beta: its one owner (`kl_controller.beta`), moved after each iteration when adaptive
        self.kl_controller = (AdaptiveKLController(cfg.beta, cfg.kl_target, cfg.kl_horizon) if cfg.adaptive_kl
                              else FixedKLController(cfg.beta))
        self.consecutive_skips = 0
        self.policy_started = False  # set once past the critic warm-up (`phase`), checkpointed

    # ------------------------------------------------------------------------------------- one iteration
    def iteration(self, index: int) -> tuple[dict[str, Any], Experience]:
        cfg = self.cfg
        start = clock(self.device)
        rollout = self.rollout(self.next_prompts())  # 1. rollout
        generated = clock(self.device)
        experience = self.score(rollout)  # 2-4. score, rewards, advantages
        monitor = self.scoring.monitor_stats(index, experience)  # beside the rewards: nothing of it reaches the update
        scored = clock(self.device)
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
        updated = clock(self.device)
        stats = {"iteration": index, "phase": phase, **batch, "kl_used": f"{cfg.kl_kind} in {cfg.kl_placement}",
                 **update, **({"lr": self.policy_optimizer.param_groups[0]["lr"]} if self.schedulers else {}),
                 "beta": self.kl_controller.beta, "time_gen": generated - start, "time_score": scored - generated,
                 "time_update": updated - scored, "time_total": updated - start,
                 "gen_tokens_per_s": float(experience.reply_lengths.sum()) / max(generated - start, 1e-9)}
        if not cfg.ptx_coef > 0:
            del stats["ptx_loss"]
        # a skipped batch must not move beta, nor a warm-up batch (the policy, hence its KL, did not move)
        if math.isfinite(stats["kl"]) and phase == "policy":
            self.kl_controller.update(stats["kl"], cfg.batch_size)
        # then each reward's mean (reward/<name>) and the reward-hacking monitor
        ordered = {key: stats[key] for key in HISTORY_ORDER if key in stats}
        return {**ordered, **self.scoring.reward_means(), **monitor}, experience

    def phase(self, index: int, ev: float) -> str:
        """"critic-warmup" (value model only) for the first critic_warmup_iterations, then until a batch's explained
        variance (mean over processes, so every process agrees) reaches policy_start_ev; "policy" from then on."""
        if index < self.cfg.critic_warmup_iterations:
            return "critic-warmup"
        if not self.policy_started:
            mean_ev = self.dist.sum(ev) / self.dist.world_size
            self.policy_started = self.cfg.policy_start_ev is None or mean_ev >= self.cfg.policy_start_ev  # nan: no
        return "policy" if self.policy_started else "critic-warmup"

    # ----------------------------------------------------------------------------------------- 1. rollout
    def rollout(self, prompts: Sequence[Prompt | PromptRow]) -> Rollout:
        """One reply (multi-turn: one episode) per prompt; a dataset row's other columns ride along in the rollout's
        `columns` (a bare prompt has none)."""
        rows = [p if isinstance(p, PromptRow) else PromptRow(p) for p in prompts]
        # token ids from the backend (generation.py); score() recomputes the log-probs the rollout does not carry
        if self.synced_version != self.policy_version:  # the policy changed since the engine last copied it
            self.generator.sync(self.policy)
            self.synced_version = self.policy_version
        return self.generator.generate([row.prompt for row in rows], [row.columns for row in rows])

    def next_prompts(self) -> list[PromptRow]:
        """This process's prompts of the next batch: batch_size // group_size prompts drawn (identically on every
        process), each repeated group_size times in consecutive rows, then this rank's contiguous share of whole
        groups."""
        cfg = self.cfg
        drawn = self.dist.shard(self.sampler.next(cfg.batch_size // cfg.group_size))
        return self.batch_prompts([i for i in drawn for _ in range(cfg.group_size)])

    def batch_prompts(self, rows: list[int]) -> list[PromptRow]:
        """Dataset rows `rows` as `rollout` takes them: each prompt with its other columns."""
        return [self.prompt_rows[i] for i in rows]

    # ------------------------------------------------------------------------------ 2-4. score, rewards, advantages
    @torch.no_grad()
    def score(self, rollout: Rollout) -> Experience:
        cfg, dev, size = self.cfg, self.device, self.score_size
        act = rollout.action_mask.to(dev)
        first = first_reply_position(rollout.prompt_ids)  # no LM head over positions that are prompt in every row
        if cfg.old_logprobs == "generation":  # recorded by generate from the same weights
            assert rollout.logprobs is not None and rollout.entropy is not None  # (make_generator records them)
            old_logprobs, entropy = rollout.logprobs.to(dev), rollout.entropy.to(dev)
        else:
            old_logprobs, entropy = per_token_in_chunks(
                lambda ids, att: self.actor.logprobs(ids, att, first, with_entropy=True), rollout, size)
        (ref_logprobs,) = per_token_in_chunks(
            lambda ids, att: (self.actor.reference_logprobs(ids, att, first),), rollout, size)
        old_values = torch.zeros_like(act)  # critic-free estimators: no values
        if self.critic is not None:
            (values,) = per_token_in_chunks(lambda ids, att: (self.critic.values(ids, att),), rollout, size)
            old_values = self.scoring.normalised_values(values) * act
        raw = self.scoring.raw_scores(rollout).to(dev)
        scores = self.scoring.normalised(raw)
        if cfg.eos_rule:
            scores = torch.where(rollout.finished.to(dev), scores, torch.full_like(scores, cfg.unfinished_score))
        kl = kl_estimate(old_logprobs, ref_logprobs, cfg.kl_kind, act)
        env_rewards = rollout.env_rewards.to(dev) if rollout.env_rewards is not None else None  # multi-turn
        shaped = shape_rewards(scores, kl, act, self.reward_beta, env_rewards)  # 3.
        if cfg.whiten_rewards:  # GAE's per-token rewards only; the per-reply totals stay as shaped
            shaped = replace(shaped, per_token=masked_whiten_over(self.dist, shaped.per_token, act, shift_mean=False))
        advantages, raw_advantages, returns = self.advantages(shaped, old_values)  # 4.
        recorded = rollout.logprobs.to(dev) if rollout.logprobs is not None else None  # what generate sampled with
        sampled = rollout_fields(rollout) | {"action_mask": act, "logprobs": recorded, "entropy": entropy}
        return Experience(**sampled, old_logprobs=old_logprobs, ref_logprobs=ref_logprobs, old_values=old_values,
                          raw_scores=raw, scores=scores, rewards=shaped.per_token, kl=kl, advantages=advantages,
                          raw_advantages=raw_advantages, returns=returns,
                          tis_weights=policy_token_weights(old_logprobs, recorded, cfg.tis_cap))

    @property
    def reward_beta(self) -> float:
        """The KL coefficient inside the rewards: beta with `kl_in: reward`; 0 with `kl_in: loss`, which keeps the
        rewards KL-free and adds beta * KL as a loss term instead (`policy_loss`)."""
        return self.kl_controller.beta if self.cfg.kl_placement == "reward" else 0.0


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
                self.roles["value"].step.backward(value_loss)
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
            kl = kl_estimate(new_logprobs, part.ref_logprobs, cfg.kl_kind, act)
            loss = loss + self.kl_controller.beta * normalise_loss(kl, act, cfg.loss_aggregation, count)
        if entropy is not None:
            loss = loss - cfg.entropy_coef * normalise_loss(entropy, act, cfg.loss_aggregation, count)
        return loss, {"pg_loss": float(pg.loss.detach()), "clipfrac": float(pg.clip_fraction) * token_share,
                      "approx_kl": float(pg.approx_kl) * token_share, "ratio_spread": float(pg.ratio_spread)}

    def value_loss(self, part: Experience, count: float, token_share: float) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped value loss of a micro-batch, values on the normalised reward scale: its share of the mean."""
        cfg, critic = self.cfg, self.critic
        assert critic is not None  # (only GAE, which has one, computes a value loss)
        values = self.scoring.normalised_values(critic.values(part.input_ids, part.attention_mask))
        vl = clipped_value_loss(values, part.old_values, part.returns, part.action_mask, cfg.value_clip_range,
                                cfg.loss_aggregation, count)
        return vl.loss, {"v_loss": float(vl.loss.detach()), "vclipfrac": float(vl.clip_fraction) * token_share}

    def ptx_step(self) -> float:
        """PPO-ptx: backward of ptx_coef * the next-token NLL of one batch of ptx texts (temperature 1), averaged over
        every process's ptx tokens and accumulated into this optimiser step's policy gradient. Returns this process's
        share of the mean NLL (summed over processes: the mean)."""
        assert self.ptx is not None  # (called only with ptx_coef > 0)
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

    # ------------------------------------------------------------------------------------------- the dashboard
    def batch_stats(self, experience: Experience) -> dict[str, float]:
        """The batch's numbers on the dashboard (stats.py), then which advantages it used (the ev gate's)."""
        return batch_stats(experience, self.dist, self.critic is not None) | self.advantages.stats()

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
            "consecutive_skips": self.consecutive_skips,
            "policy_started": self.policy_started,
            "kl_controller": self.kl_controller.state_dict(),
            "ptx": self.ptx.state() if self.ptx else None,
            **self.scoring.state_dict(),  # "monitor"
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
        self.consecutive_skips = state["consecutive_skips"]
        self.policy_started = state.get("policy_started", True)  # checkpoints from before the warm-up option
        # (checkpoints from before the fixed controller kept a fixed beta beside a None controller state)
        self.kl_controller.load_state_dict(state["kl_controller"] or {"beta": state["beta"]})
        if self.ptx is not None and state["ptx"] is not None:
            self.ptx.load(state["ptx"])
        self.scoring.load_state_dict(state)

    # ------------------------------------------------------------------------------------------------ parts
    @property
    def models(self) -> dict[str, torch.nn.Module]:
        """The trained models by checkpoint folder name (no "value" for the critic-free estimators)."""
        return {name: role.model for name, role in self.roles.items()}

    @property
    def policy_optimizer(self) -> torch.optim.Optimizer:
        return self.actor.step.optimizer

    @property
    def value_optimizer(self) -> torch.optim.Optimizer | None:
        return self.critic.step.optimizer if self.critic else None

    # the reward pipeline's state and steps, read (and the normalisation set) through the loop as before scoring.py
    reward_mean = delegated("reward_mean", settable=True)
    reward_std = delegated("reward_std", settable=True)
    value_norm = delegated("value_norm", settable=True)
    critic_scale = delegated("critic_scale")
    last_token_values = delegated("last_token_values")

    def measure_reward_norm(self) -> dict[str, float]:
        """Mean and std of the reward model's scores of start-policy replies to training prompts (detail 1)."""
        return self.scoring.measure_reward_norm(lambda rows: self.rollout(self.batch_prompts(rows)), len(self.prompts))
