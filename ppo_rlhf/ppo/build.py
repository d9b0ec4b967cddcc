"""The models a PPO run trains and scores with, loaded once before the first iteration (`build_models`): the policy
with its LoRA adapter (an `Actor`), the value model for GAE (a `Critic`), the rewards combined, the hacking monitor's
judges, and the trained models' gradient steps and learning-rate schedulers. In the chapter's set-up two backbones
hold the four models: the reference is the policy with its adapter off, the reward model the value model with its
adapter off (`critic_source`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ppo_rlhf.data import PromptRow
from ppo_rlhf.errors import UsageError, require
from ppo_rlhf.models.chat import chat_prompt_ids
from ppo_rlhf.models.generation import Generator, HFGenerator, make_generator
from ppo_rlhf.models.loading import (
    LoraSettings,
    NoScoreHead,
    add_policy_lora,
    add_value_lora,
    check_chat_tokenizer,
    load_causal_lm,
    load_tokenizer,
    load_value_model,
    loaded_causal_lm,
    zero_head_classifier,
)
from ppo_rlhf.models.precision import resolve_dtype
from ppo_rlhf.models.rollout import eos_token_ids
from ppo_rlhf.models.scores import RewardModel
from ppo_rlhf.multiturn.calls import tool_name
from ppo_rlhf.multiturn.episodes import EpisodeLimits
from ppo_rlhf.multiturn.generator import EpisodeGenerator
from ppo_rlhf.parallel.distributed import Dist, is_sharded
from ppo_rlhf.ppo.roles import Actor, Critic
from ppo_rlhf.ppo.schedules import make_scheduler
from ppo_rlhf.ppo.train_config import TrainConfig
from ppo_rlhf.rewards import (
    CombinedReward,
    ModelReward,
    import_function,
    is_reward_model_spec,
    resolve_reward_funcs,
    reward_name,
)
from ppo_rlhf.utils.paths import function_spec

INIT_HEAD_HINT = " (init_score_head: true starts from a random head on purpose)"


@dataclass
class Models:
    """What `build_models` loaded. `critic` None for the critic-free estimators; `critic_source` the folder the critic
    started from (None: a cold critic, the policy's base with a zero head); `rewards` None when an environment's
    rewards are the run's; `reward_model` the one reward model's scorer (the critic when it is both), or None; `roles`
    the trained roles by checkpoint folder name (each backward, step and optimiser state goes through them)."""

    tokenizer: Any
    dtype: torch.dtype
    policy: torch.nn.Module
    actor: Actor
    critic: Critic | None
    critic_source: str | None
    rewards: CombinedReward | None
    reward_model: RewardModel | None
    judges: CombinedReward | None
    roles: dict[str, Actor | Critic]
    schedulers: dict[str, Any]


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def make_optimizer(model: torch.nn.Module, lr: float, cfg: TrainConfig) -> torch.optim.AdamW:
    params = trainable_parameters(model)
    # fused: one kernel for all parameters (CPU and CUDA); the per-tensor loop took ~4x as long over LoRA's many small
    # factors (bench/HISTORY.md), with the same numbers to float rounding. Not under FSDP, whose optimiser mixes
    # sharded (DTensor) and whole parameters, which the fused kernel refuses.
    fused = not any(is_sharded(p) for p in params)
    return torch.optim.AdamW(params, lr=lr, eps=cfg.adam_eps, weight_decay=0.0, fused=fused)


def micro_size(cfg: TrainConfig) -> int:
    """Rows per forward and backward pass of the update."""
    return cfg.micro_batch_size or cfg.minibatch_size


def score_size(cfg: TrainConfig) -> int:
    """Rows per forward pass of scoring (log-probs, values, reward models)."""
    return cfg.score_batch_size or micro_size(cfg)


def check_prompt_lengths(rows: list[PromptRow], tokenizer, models: list, max_new_tokens: int,
                         max_prompt_tokens: int | None = None, cap_name: str = "max_new_tokens") -> None:
    """Every chat-templated prompt of `rows` within `max_prompt_tokens` (training's cap; None: no cap), and prompt +
    reply cap within every model's context: a UsageError naming the first row that is not, and the cap by its setting
    `cap_name` (a multi-turn episode's is max_episode_tokens). (Also `ppo-rlhf evaluate`'s check; models without a
    config, like a word-count judge, have no context.)"""
    contexts = [getattr(getattr(m, "config", None), "max_position_embeddings", None) for m in models]
    context = min((c for c in contexts if isinstance(c, int) and c > 0), default=None)
    for row in rows:
        n = len(chat_prompt_ids(tokenizer, row.prompt))
        require(max_prompt_tokens is None or n <= max_prompt_tokens,
                f"{row.where}: the prompt has {n} tokens (chat-templated), more than "
                f"max_prompt_tokens={max_prompt_tokens}")
        require(context is None or n + max_new_tokens <= context,
                f"{row.where}: the prompt ({n} tokens) + {cap_name}={max_new_tokens} exceed the "
                f"models' context of {context} tokens")


def trajectory_cap(cfg: TrainConfig) -> tuple[int, str]:
    """Tokens after the prompt that a scored sequence may reach (the reply cap, or a multi-turn episode's), and the
    setting it comes from, as a message names it."""
    return (cfg.max_episode_tokens, "max_episode_tokens") if cfg.multi_turn else (cfg.max_new_tokens, "max_new_tokens")


def rng_untouched(device: torch.device):
    """A context after which torch's random numbers (CPU, and this process's GPU) are as before it."""
    return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])


def imported_callable(spec: str, what: str = "tool"):
    """The callable that a config's "file.py:name" or "module:name" names (a tool, an environment factory)."""
    parts = function_spec(spec)
    if parts is None:
        raise UsageError(f"{what} {spec}: expected 'file.py:function' or 'module:function'")
    found = import_function(spec, parts[0], parts[1], what=what)
    require(callable(found), f"{what} {spec} is a {type(found).__name__}, not a callable")
    return found


@dataclass
class EpisodeCode:
    """A multi-turn run's user code: the tools by name and the environment factory (None: none)."""

    tools: dict[str, Any]
    environment_factory: Any


def load_episode_code(cfg: TrainConfig, dist: Dist, tools: list | None, environment_factory=None) -> EpisodeCode:
    """The tools (None: cfg.tools) and environment factory (None: cfg.environment), objects or "file.py:name"
    imported; multi-turn refused under FSDP, before any model loads."""
    named = {tool_name(t): t for t in (tools if tools is not None else map(imported_callable, cfg.tools))}
    if environment_factory is None and cfg.environment is not None:
        environment_factory = imported_callable(cfg.environment, "environment")
    # FSDP's sharded generation needs every process in every decoding step, but one process's episodes may end
    # turns before another's: it would leave the others waiting for ever
    require(not (dist.fsdp and cfg.multi_turn),
            "multi-turn episodes are not supported under FSDP (a process whose episodes ended would leave the "
            "others' sharded generation waiting); use DDP or DeepSpeed")
    return EpisodeCode(named, environment_factory)


def make_rollout_generator(cfg: TrainConfig, dist: Dist, policy: torch.nn.Module, tokenizer,
                           code: EpisodeCode) -> Generator:
    """What samples a rollout: the backend `cfg.generation_backend` names, or for a multi-turn run the episodes'
    generator around the HF backend (TrainConfig refuses multi-turn with another backend)."""
    generator = make_generator(cfg, policy, tokenizer)
    if not cfg.multi_turn:
        return generator
    assert isinstance(generator, HFGenerator)
    limits = EpisodeLimits(cfg.max_turns, cfg.max_tool_calls, cfg.max_new_tokens, cfg.max_episode_tokens,
                           cfg.tool_timeout)
    # the user's code by the names they gave it (config.yaml's), for the line that stops the run when it fails
    names = {"environment": cfg.environment or "", **dict(zip(code.tools, cfg.tools))}
    return EpisodeGenerator(generator, eos_token_ids(policy, tokenizer), limits, code.tools, code.environment_factory,
                            names, says_warnings=dist.is_main)


def build_models(cfg: TrainConfig, dist: Dist, device: torch.device, needs_critic: bool, prompt_rows: list[PromptRow],
                 reward_funcs: list, policy: torch.nn.Module | None = None, tokenizer=None,
                 monitor_judges: list | None = None, has_environment: bool = False) -> Models:
    """The policy (Actor), the value model (Critic, when `needs_critic`; see `critic_source`), the rewards
    (cfg.reward_model then `reward_funcs`, combined), the monitor's judges, the gradient steps and the schedulers.
    `policy` a loaded causal LM to train instead of loading cfg.policy_model, `tokenizer` its tokenizer (None:
    cfg.policy_model's). The critic-free estimators with reward functions alone load only the policy."""
    return _Builder(cfg, dist, device, needs_critic, prompt_rows).build(reward_funcs, policy, tokenizer,
                                                                         monitor_judges or [], has_environment)


class _Builder:
    """`build_models`' steps, in the order they load (which the run's random numbers depend on)."""

    def __init__(self, cfg: TrainConfig, dist: Dist, device: torch.device, needs_critic: bool,
                 prompt_rows: list[PromptRow]):
        self.cfg, self.dist, self.device, self.needs_critic = cfg, dist, device, needs_critic
        self.prompt_rows = prompt_rows
        self.cap, self.cap_name = trajectory_cap(cfg)
        self.score_size = score_size(cfg)

    def build(self, reward_funcs: list, policy: torch.nn.Module | None, tokenizer, monitor_judges: list,
              has_environment: bool) -> Models:
        specs = [*([self.cfg.reward_model] if self.cfg.reward_model else []), *reward_funcs]
        self.load_policy_and_critic(specs, policy, tokenizer)
        funcs = self.load_rewards(specs, has_environment)
        actor, roles = self.place_roles(funcs)
        scorers = [f.scorer for f in funcs if isinstance(f, ModelReward)]
        return Models(tokenizer=self.tokenizer, dtype=self.dtype, policy=self.policy, actor=actor, critic=self.critic,
                      critic_source=self.source, rewards=self.rewards,
                      reward_model=scorers[0] if len(scorers) == 1 else None,
                      judges=self.load_judges(monitor_judges), roles=roles, schedulers=self.make_schedulers(roles))

    def load_policy_and_critic(self, specs: list, policy: torch.nn.Module | None, tokenizer) -> None:
        """The policy with its LoRA adapter and, for GAE, the critic."""
        cfg, remote = self.cfg, self.cfg.trust_remote_code
        dtype = self.dtype = resolve_dtype(cfg.dtype, self.device)  # the frozen weights'; trained ones stay fp32
        lora = LoraSettings(rank=cfg.lora_rank, alpha=cfg.lora_alpha)
        if tokenizer is None:
            tokenizer = load_tokenizer(cfg.policy_model, trust_remote_code=remote)
        self.tokenizer = check_chat_tokenizer(tokenizer, cfg.policy_model)
        source = self.source = self.critic_source(specs)  # (its tokenizer is read before any weights load)
        base = load_causal_lm(cfg.policy_model, dtype, remote) if policy is None else loaded_causal_lm(policy, dtype)
        # a cold critic copies the policy's base before LoRA wraps it
        cold = None
        if self.needs_critic and not source:
            cold = zero_head_classifier(base, self.tokenizer, dtype)
        self.policy = add_policy_lora(base, lora).to(self.device)
        self.critic: Critic | None = None
        if self.needs_critic:
            try:
                value = load_value_model(source, lora, dtype=dtype, trust_remote_code=remote,
                                         init_score_head=cfg.init_score_head) if source else add_value_lora(cold, lora)
            except NoScoreHead as error:
                field = "value_model" if source == cfg.value_model else "reward_model"
                raise NoScoreHead(f"{field}: {error}{INIT_HEAD_HINT}") from None
            value_tokenizer = load_tokenizer(source, trust_remote_code=remote) if source else self.tokenizer
            self.critic = Critic(value.to(self.device), value_tokenizer, None, cfg.padding_free)

    def critic_source(self, specs: list) -> str | None:
        """What the value model starts from (GAE only): value_model; else the run's one reward model when it is
        named (not a loaded object) and uses the policy's tokenizer (the chapter's: its adapter off is the reward
        model); else None, the policy's base with a new zero-initialised head."""
        cfg, remote = self.cfg, self.cfg.trust_remote_code
        if not self.needs_critic:
            return None
        if cfg.value_model is not None:
            vocab = load_tokenizer(cfg.value_model, trust_remote_code=remote).get_vocab()
            require(vocab == self.tokenizer.get_vocab(), f"value_model {cfg.value_model} reads every position of "
                    "the policy's sequences, so it must use the policy's tokenizer")
            return cfg.value_model
        models = [spec for spec in specs if is_reward_model_spec(spec)]
        if len(models) == 1 and isinstance(models[0], str):
            vocab = load_tokenizer(models[0], trust_remote_code=remote).get_vocab()
            if vocab == self.tokenizer.get_vocab():
                return models[0]
        return None

    def load_rewards(self, specs: list, has_environment: bool) -> list:
        """The reward functions, combined into `self.rewards`; returns them. The reward model the critic was
        initialised from scores through it, adapter off (one copy of its weights). None at all: an environment's
        rewards are the run's (`self.rewards` None, every score 0)."""
        cfg, source, critic = self.cfg, self.source, self.critic
        self.rewards: CombinedReward | None = None
        if not specs:
            require(has_environment,
                    "reward_model or reward_funcs is required (or an environment whose step returns rewards)")
            return []
        shared = source if critic is not None and source in specs and source != cfg.value_model else None
        specs = [ModelReward.from_scorer(critic, reward_name(spec), self.score_size) if critic and spec == shared
                 else spec for spec in specs]
        try:
            funcs = resolve_reward_funcs(specs, dtype=self.dtype, device=self.device,
                                         trust_remote_code=cfg.trust_remote_code, batch_size=self.score_size,
                                         init_score_head=cfg.init_score_head)
        except NoScoreHead as error:
            field = "reward_model" if cfg.reward_model and cfg.reward_model in str(error) else "reward_funcs"
            raise NoScoreHead(f"{field}: {error}{INIT_HEAD_HINT}") from None
        self.rewards = CombinedReward(funcs, cfg.reward_weights)
        return funcs

    def place_roles(self, funcs: list) -> tuple[Actor, dict[str, Actor | Critic]]:
        """Every model checked against the prompts' lengths, sharded under FSDP; the gradient steps of the trained
        ones. Returns the Actor and the trained roles by checkpoint folder name."""
        cfg, critic = self.cfg, self.critic
        frozen = [f.model for f in funcs if isinstance(f, ModelReward) and f.scorer is not critic]
        critic_model = [critic.model] if critic else []
        check_prompt_lengths(self.prompt_rows, self.tokenizer, [self.policy, *critic_model, *frozen], self.cap,
                             cfg.max_prompt_tokens, self.cap_name)
        require(not (self.dist.fsdp and cfg.generation_backend != "hf"),
                "FSDP shards the policy's layers: use generation_backend: hf (vLLM needs the whole policy per process)")
        for model in (self.policy, *critic_model, *frozen):  # FSDP: each process keeps a shard of every layer
            self.dist.shard_model(model)
        actor = Actor(self.policy, self.gradient_step(self.policy, cfg.policy_lr), cfg)
        if critic is not None:
            critic.step = self.gradient_step(critic.model, cfg.value_lr)
        return actor, {"policy": actor, **({"value": critic} if critic else {})}

    def gradient_step(self, model: torch.nn.Module, lr: float):
        """loss -> summed over processes -> clipped -> optimiser step (through DeepSpeed when launched so)."""
        return self.dist.gradient_step(model, make_optimizer(model, lr, self.cfg), self.cfg.max_grad_norm)

    def load_judges(self, specs: list) -> CombinedReward | None:
        """The monitor's second judges, resolved as rewards are (never summed into the reward); None without any."""
        if not specs:
            return None
        with rng_untouched(self.device):  # a judge loaded or not, the run samples the same replies
            try:
                judges = resolve_reward_funcs(specs, dtype=self.dtype, device=self.device, batch_size=self.score_size,
                                              trust_remote_code=self.cfg.trust_remote_code)
            except UsageError as error:
                raise UsageError(f"monitor_judges: {error}") from None
        models = [judge.model for judge in judges if isinstance(judge, ModelReward)]
        check_prompt_lengths(self.prompt_rows, self.tokenizer, models, self.cap, cap_name=self.cap_name)
        return CombinedReward(judges)

    def make_schedulers(self, roles: dict[str, Actor | Critic]) -> dict[str, Any]:
        """LambdaLR per optimiser, stepped per optimiser step; none for the constant schedule without warm-up. Each is
        sized over its own optimiser's steps: the policy takes none during the critic warm-up, so its schedule (warm-up
        included) starts after critic_warmup_iterations and still reaches its end at the last iteration."""
        cfg = self.cfg
        if cfg.lr_schedule == "constant" and cfg.warmup_iterations == 0:
            return {}
        steps = cfg.epochs * (cfg.batch_size // cfg.minibatch_size)  # optimiser steps per iteration
        iterations = {"policy": cfg.iterations - cfg.critic_warmup_iterations, "value": cfg.iterations}
        return {name: make_scheduler(role.step.optimizer, cfg.lr_schedule, cfg.warmup_iterations * steps,
                                     iterations[name] * steps) for name, role in roles.items()}
