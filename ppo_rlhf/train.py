"""`ppo-rlhf train`: a thin layer over the public API -- the config from YAML and flags, its files checked before
anything heavy is imported, then `ppo_rlhf.PPOTrainer(cfg).train()` (the run itself: ppo/run.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ppo_rlhf.config import add_config_arguments, build_config, config_from_args, read_yaml, to_yaml
from ppo_rlhf.ppo.run import check_run_dir
from ppo_rlhf.ppo.train_config import TrainConfig
from ppo_rlhf.utils.lock import require_free
from ppo_rlhf.utils.paths import require_run_dir


def train(cfg: TrainConfig, resume: bool = False) -> Path:
    """Run (or continue) PPO; returns the run directory. The same as `ppo_rlhf.PPOTrainer(cfg, resume=resume)
    .train()`, which the `train` command runs too: a run directory in use by another process is refused before the
    models load."""
    from ppo_rlhf.api import PPOTrainer  # lazy: torch, transformers and peft load after the config is checked

    return PPOTrainer(cfg, resume=resume).train()


USAGE = "%(prog)s [--config FILE] [--resume RUN_DIR] [--OPTION VALUE ...]"
DESCRIPTION = """\
Run PPO: a LoRA adapter on the policy, trained on your prompts against a reward model or reward functions.

examples:
  ppo-rlhf train --config configs/smollm2_offline.yaml --out runs/mine
  ppo-rlhf train --prompts data.jsonl --reward-funcs rewards.py:exact_match --max-new-tokens 32 --out runs/mine
  ppo-rlhf train --resume runs/mine          (continue a stopped run from its latest checkpoint)

data.jsonl holds one {"prompt": ...} object a line; its other keys reach the reward functions as keyword arguments.
Every option below is also a key of the --config YAML file (with underscores: max_new_tokens); flags override it."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage, parser.description = USAGE, DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--config", metavar="FILE", help="YAML file with any of the settings below; flags override it")
    parser.add_argument("--resume", metavar="RUN_DIR",
                        help="continue a run from its latest checkpoint (its saved config; flags override)")
    # (--resume names the run: the field is set from it)
    add_config_arguments(parser, TrainConfig, skip=("resume",), title="training: {}")


def run(args: argparse.Namespace) -> int:
    if args.resume:
        run_dir = require_run_dir(args.resume)
        saved = read_yaml(run_dir / "config.yaml")
        flags = {k: v for k, v in vars(args).items() if k in TrainConfig.__dataclass_fields__ and k != "resume"}
        cfg = build_config(TrainConfig, saved, flags, {"out": str(run_dir), "resume": True},
                           origin={key: str(run_dir / "config.yaml") for key in saved if key not in flags}, flags=True)
    else:
        cfg = config_from_args(TrainConfig, args, extra=("resume",))  # (args.resume is --resume RUN_DIR)
    cfg.require_inputs(flags=True)
    cfg.check_files()  # before the config is printed and before anything heavy is imported
    if not cfg.resume:
        require_free(cfg.out)  # a run in progress is named before "not empty"
        check_run_dir(cfg)
        if not cfg.quiet:
            print(to_yaml(cfg), end="")
    train(cfg)
    return 0
