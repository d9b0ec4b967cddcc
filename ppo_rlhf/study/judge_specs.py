"""The names a judge is given by (`--gold`, `--proxy`), checked without loading torch or a model: an unknown one is
refused before the slow imports (the judges themselves: judges.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from ppo_rlhf.errors import UsageError, require
from ppo_rlhf.utils.paths import check_function_spec, check_model_name, function_spec

NAMED_JUDGES = ("vader", "nontoxic", "gold")
JUDGE_SPECS = ("vader, nontoxic, gold, rm:PATH_OR_HUB_ID (or a reward-model folder), rm-init-head:PATH_OR_HUB_ID, "
               "ensemble:FOLDER")
REWARD_SPECS = "file.py:function or module:function (a reward function, as train's --reward-funcs)"
MODEL_PREFIX = "rm:"
INIT_HEAD_PREFIX = "rm-init-head:"  # a model without a trained score head, given a random one on purpose
ENSEMBLE_PREFIX = "ensemble:"  # a proxy ensemble's folder (study/ensemble.py)


def check_judge_spec(spec: str, rewards: bool = False) -> None:
    """`spec` names a judge `judges.make_judge` makes: one of NAMED_JUDGES, "rm:NAME" or "rm-init-head:NAME" (NAME
    checked as `check_model_name` does), "ensemble:FOLDER", or a reward-model folder; with `rewards` (evaluate's
    judges, which pass the reward functions their keywords) also a reward function, "file.py:function" or
    "module:function"."""
    if spec in NAMED_JUDGES:
        return
    if spec.startswith(ENSEMBLE_PREFIX):
        folder = Path(spec.removeprefix(ENSEMBLE_PREFIX)).expanduser()
        require(folder.is_dir(), f"judge {spec}: no ensemble folder {folder} (study/ensemble.py writes one)")
        return
    prefix = next((known for known in (MODEL_PREFIX, INIT_HEAD_PREFIX) if spec.startswith(known)), None)
    if prefix is not None:
        name = spec.removeprefix(prefix)
        require(bool(name), f"judge {prefix} needs a reward-model folder or hub id, e.g. {prefix}runs/rm")
        check_model_name(name)
    elif rewards and (spec.endswith(".py") or ":" in spec and not Path(spec).expanduser().is_dir()):
        check_reward_function(spec)
    elif not Path(spec).expanduser().is_dir():
        choices = f"{JUDGE_SPECS}, {REWARD_SPECS}" if rewards else JUDGE_SPECS
        raise UsageError(f"unknown judge {spec!r}; choose from {choices}")


def check_reward_function(spec: str) -> None:
    """A reward function as a judge: "file.py:function" whose file exists and compiles, or "module:function" whose
    top-level module is installed (neither is run here: the function is imported when the judges load)."""
    require(not spec.endswith(".py"), f"reward function {spec} needs its function: {spec}:NAME")
    parts = function_spec(spec)
    require(parts is not None, f"unknown judge {spec!r}; a reward function is {REWARD_SPECS}")
    assert parts is not None  # (for mypy: require raised otherwise)
    source, function = parts
    if source.endswith(".py"):
        check_function_spec(spec, "reward function")
    else:
        top = source.split(".")[0]
        require(importlib.util.find_spec(top) is not None, f"reward function {spec}: no module named {top!r}")


def check_run_rewards(run_dir: str | Path, rewards: dict[str, Any]) -> None:
    """A run's own rewards (`{"reward_funcs": [...], "reward_weights": ...}`, from its config.yaml) can be loaded
    again: each function importable, each reward model a model. A function defined in the script that trained the run
    (recorded as "__main__:name") or inside another function ("<function name>") cannot be imported again."""
    for spec in rewards["reward_funcs"]:
        parts = function_spec(spec) if ":" in spec else None
        if spec.startswith("<function") or (parts is not None and parts[0] == "__main__"):
            name = parts[1] if parts else spec.removeprefix("<function ").rstrip(">")
            count = len(rewards["reward_funcs"])
            summed = f"; the run summed {count} rewards ({', '.join(rewards['reward_funcs'])}, weights " \
                f"{rewards['reward_weights'] or 'all 1'}): give one function that sums them" if count > 1 else ""
            raise UsageError(f"{run_dir}: the run's reward function {spec} was defined in the script that trained it "
                             f"and cannot be imported again; give --proxy file.py:function (a file that defines "
                             f"{name}){summed}")
        try:
            if parts is not None:
                check_reward_function(spec)
            else:
                check_model_name(spec)
        except UsageError as error:
            raise UsageError(f"{run_dir}: the run's rewards: {error}; or give --proxy") from None
