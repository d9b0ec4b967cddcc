"""The Python API, in the conventions of TRL's trainers: `PPOConfig` holds the settings, `PPOTrainer` loads the
models and runs PPO on your prompts against your rewards.

    from ppo_rlhf import PPOConfig, PPOTrainer

    def exact_match(prompts, completions, completion_ids, answer, **columns):
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    config = PPOConfig(policy_model="smollm2", iterations=20, batch_size=16, out="runs/mine")
    trainer = PPOTrainer(config, reward_funcs=[exact_match, "runs/rm"], train_dataset=dataset)
    trainer.train()                              # resumable: PPOTrainer(..., resume=True) or config.resume
    trainer.save_model("runs/mine/final")        # a PEFT adapter folder; merge=True: a plain transformers model

The `ppo-rlhf train` command builds the same `PPOTrainer` from YAML and flags, so a run started either way gives the
same history.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Protocol

from ppo_rlhf.errors import UsageError, require
from ppo_rlhf.ppo.train_config import TrainConfig

PPOConfig = TrainConfig
"""Every setting of a run (`ppo_rlhf.ppo.train_config.TrainConfig`, one docstring per field); checked when built."""


class TrainerCallback(Protocol):
    """What `PPOTrainer(callbacks=[...])` calls; a callback defines any of these methods (none is required).

    * `on_train_begin(trainer)`: the models are loaded and the run directory is ready (after the reward
      normalisation, or after the checkpoint is read back on resume).
    * `on_iteration_end(trainer, stats)`: after each iteration is recorded (stats: its history.jsonl line as a dict).
      Return True to stop the run: a checkpoint of that iteration is written first, so `resume=True` continues it.
    * `on_train_end(trainer)`: after the last iteration (or the stop).
    """

    def on_train_begin(self, trainer: PPOTrainer) -> None: ...

    def on_iteration_end(self, trainer: PPOTrainer, stats: dict[str, Any]) -> bool | None: ...

    def on_train_end(self, trainer: PPOTrainer) -> None: ...


def spec_name(spec: Any) -> str:
    """How config.yaml records a reward given to the trainer: a string as it is; a function as "module:name" (which
    `ppo-rlhf train --resume` can import again when its module is importable); a model by its folder or class."""
    if isinstance(spec, str | Path):
        return str(spec)
    if isinstance(spec, tuple) and spec:
        spec = spec[0]
    if hasattr(spec, "config") and hasattr(spec, "name_or_path"):  # a loaded model
        return spec.name_or_path or type(spec).__name__
    func = getattr(spec, "func", spec)  # functools.partial: the wrapped function
    name = getattr(func, "__qualname__", None) or type(func).__name__
    module = getattr(func, "__module__", None)
    return f"{module}:{name}" if module and name.isidentifier() else f"<function {name}>"  # (local: not importable)


def _as_list(given: Any) -> list | None:
    """One reward or judge, or a list of them, as a list (None stays None: the config's)."""
    return None if given is None else list(given) if isinstance(given, list) else [given]


class PPOTrainer:
    """PPO (or RLOO/GRPO, `advantage_estimator`) on a policy with a LoRA adapter.

    Args:
        config: the run's settings (`PPOConfig`); `config.out` is the run directory.
        reward_funcs: one reward or a list, used instead of `config.reward_funcs` (after `config.reward_model`, if
            set): callables `f(prompts, completions, completion_ids, **columns) -> list[float | None]` (TRL's
            GRPOTrainer convention; `columns`: the dataset's other columns; multi-turn: the last turn's completion and
            ids, and `trajectory_ids`), "file.py:function" or "module:function" strings, reward-model folders or hub
            ids, or loaded sequence-classification models (alone, or as `(model, tokenizer)`). Weighted by
            `config.reward_weights`.
        train_dataset: the prompts, instead of `config.prompts`: a `datasets.Dataset`, a list of strings, or a list
            of dicts, with the prompt in `config.prompt_column` (a string or a list of chat messages).
        monitor_judges: one judge or a list, used instead of `config.monitor_judges`, of the kinds `reward_funcs`
            takes: the reward-hacking monitor's second judges, scored beside the reward (`monitor/<name>` in the
            history) and never part of it.
        callbacks: objects with any of the methods of `TrainerCallback`, called in order.
        processing_class: the policy's tokenizer (needed with a loaded `policy_model` that was not loaded from a
            folder); default: the tokenizer of `config.policy_model`.
        policy_model: a loaded causal LM (`PreTrainedModel`) to train instead of loading `config.policy_model`, or a
            name that replaces it. A loaded model is changed in place (LoRA is added to it).
        resume: continue the run in `config.out` from its latest checkpoint (also `config.resume`); without one
            (a new run directory, or a run stopped before its first checkpoint) the run starts from iteration 0.
        tools: plain Python functions the policy may call, instead of `config.tools`; each returns text or a number.
            A chat template with a tool format describes them in the prompt and its `<tool_call>` JSON is parsed;
            otherwise the plain `<tool>name(arguments)</tool>`, which the prompt must teach (docs/multi-turn.md).
            Makes the run multi-turn.
        environment_factory: a callable returning a new environment per episode, instead of `config.environment`:
            `reset(**row) -> observation text or None` (row: the dataset row, its prompt as `prompt`) and
            `step(reply text) -> (observation text, reward or None, done)`. Makes the run multi-turn; its rewards
            alone may train it (no `reward_funcs`; docs/multi-turn.md says how the two add up).

    Bad settings, files or data raise `ppo_rlhf.UsageError` with one line, before any model loads where they can be
    seen without one. Models load here; `train()` runs.
    """

    def __init__(self, config: TrainConfig, reward_funcs: Any = None, train_dataset: Any = None,
                 callbacks: list | tuple | None = None, processing_class: Any = None, policy_model: Any = None,
                 resume: bool = False, monitor_judges: Any = None, tools: list | None = None,
                 environment_factory: Any = None):
        from ppo_rlhf.data import load_prompt_rows
        from ppo_rlhf.ppo.run import check_run_dir
        from ppo_rlhf.utils.lock import require_free

        require(isinstance(config, TrainConfig), f"config must be a PPOConfig, got {type(config).__name__}")
        specs, judges = _as_list(reward_funcs), _as_list(monitor_judges)
        loaded_policy = None if policy_model is None or isinstance(policy_model, str | Path) else policy_model
        cfg = self._config_with_arguments(config, specs, judges, policy_model, loaded_policy, train_dataset is not None,
                                          resume, tools, environment_factory)
        # resume=True where there is nothing to resume is a new run (config.yaml is the first file a run writes)
        self.resuming = cfg.resume and (Path(cfg.out) / "config.yaml").is_file()
        require_free(cfg.out)  # a run in progress is refused before the models load (train() takes the lock)
        if not self.resuming:
            check_run_dir(cfg)  # before the models load: a refusal is instant, and nothing is removed on bad input
        rows = load_prompt_rows(train_dataset if train_dataset is not None else cfg.prompts, cfg.prompt_column)
        if loaded_policy is not None and processing_class is None:
            from ppo_rlhf.models.loading import load_tokenizer

            require(bool(getattr(loaded_policy, "name_or_path", "")), "give the loaded policy's tokenizer as "
                    "processing_class= (the model does not name a folder to load it from)")
            processing_class = load_tokenizer(loaded_policy.name_or_path, cfg.trust_remote_code)

        from ppo_rlhf.ppo.trainer import PPOLoop  # lazy: torch, transformers and peft

        self.config = cfg
        self.callbacks = list(callbacks or [])
        self.loop = PPOLoop(cfg, reward_funcs=specs, prompt_rows=rows, policy=loaded_policy,
                            tokenizer=processing_class, monitor_judges=judges, tools=tools,
                            environment_factory=environment_factory)

    @staticmethod
    def _config_with_arguments(config: TrainConfig, specs: list | None, judges: list | None, policy_model: Any,
                               loaded_policy: Any, dataset: bool, resume: bool, tools: list | None,
                               environment_factory: Any) -> TrainConfig:
        """`config` with what the arguments replace, named as config.yaml records them (objects by `spec_name`), then
        checked: the inputs a run needs, and the files it names (objects are checked as they are used)."""
        changes: dict[str, Any] = {"resume": config.resume or resume}
        if specs is not None:
            changes["reward_funcs"] = [spec_name(spec) for spec in specs]
        if judges is not None:
            changes["monitor_judges"] = [spec_name(judge) for judge in judges]
        if isinstance(policy_model, str | Path):
            changes["policy_model"] = str(policy_model)
        elif loaded_policy is not None:
            changes["policy_model"] = getattr(loaded_policy, "name_or_path", "") or type(loaded_policy).__name__
        if dataset:
            changes["prompts"] = None  # the dataset replaces the file
        if tools is not None:  # config.yaml records their names, as it does the reward functions'
            require(all(callable(t) for t in tools), "tools must be Python functions")
            changes["tools"] = [spec_name(t) for t in tools]
        if environment_factory is not None:
            require(callable(environment_factory), "environment_factory must be a callable returning an environment")
            changes["environment"] = spec_name(environment_factory)
        cfg = dataclasses.replace(config, **changes)
        cfg.require_inputs(dataset=dataset)
        named: dict[str, Any] = {name: [str(s) for s in given if isinstance(s, str | Path)]
                 for name, given in (("reward_funcs", specs), ("monitor_judges", judges)) if given is not None}
        if loaded_policy is not None:  # its name need not be a folder any more
            named["policy_model"] = "loaded"
        if tools is not None:  # objects: their recorded names are no files to check
            named["tools"] = []
        if environment_factory is not None:
            named["environment"] = None
        dataclasses.replace(cfg, **named).check_files()
        return cfg

    # ------------------------------------------------------------------------------------------ what it holds
    @property
    def model(self):
        """The policy being trained: a PEFT model (the base with its LoRA adapter)."""
        return self.loop.policy

    @property
    def processing_class(self):
        """The policy's tokenizer."""
        return self.loop.tokenizer

    @property
    def value_model(self):
        """The critic (a PEFT sequence classifier), or None for the critic-free estimators."""
        return self.loop.value_model

    @property
    def run_dir(self) -> Path:
        return Path(self.config.out)

    @property
    def history(self) -> list[dict[str, Any]]:
        """Every finished iteration's numbers, as history.jsonl holds them."""
        import json

        path = self.run_dir / "history.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []

    # ------------------------------------------------------------------------------------------------- actions
    def train(self) -> Path:
        """Run PPO for `config.iterations` iterations (or the rest of them, resuming); then, when
        `config.push_to_hub` names a repository, upload the policy. Returns the run directory."""
        from ppo_rlhf.ppo.run import run_training

        run_dir = run_training(self.loop, self.resuming, self.callbacks, self)
        self.resuming = True  # a second train() continues (its iterations are done: it returns at once)
        if self.config.push_to_hub and self.loop.dist.is_main:
            self.push_to_hub()
        return run_dir

    def save_model(self, output_dir: str | Path, merge: bool = False) -> Path:
        """Write the policy to `output_dir`: its PEFT adapter folder (`merge=False`; loads with
        `peft.AutoPeftModelForCausalLM`), or the base with the adapter merged in, a plain `transformers` folder
        (`merge=True`); the tokenizer and a model card (README.md: base model, data, rewards, settings, the last
        dashboard numbers) either way. Returns the folder."""
        from ppo_rlhf.export import run_card, save_policy
        from ppo_rlhf.ppo.run import saved_config

        history = self.history
        card = run_card(dataclasses.asdict(saved_config(self.config)), history[-1] if history else None, merge)
        return save_policy(self.model, self.processing_class, output_dir, merge, card)

    def push_to_hub(self, repo_id: str | None = None) -> str:
        """Upload the policy (`save_model` into RUN_DIR/hub, an adapter folder) to `repo_id` (default
        `config.push_to_hub`). Returns the repository's URL."""
        from ppo_rlhf.export import push_to_hub

        repo_id = repo_id or self.config.push_to_hub
        if not repo_id:
            raise UsageError("push_to_hub needs a repository id (config.push_to_hub or the repo_id argument)")
        return push_to_hub(self.save_model(self.run_dir / "hub"), repo_id)
