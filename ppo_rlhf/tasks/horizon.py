"""The multi-turn environment tasks with a horizon knob: `key-door-H` (ppo_rlhf.tasks.key_door, a delayed-credit
probe) and `guess-T` (ppo_rlhf.tasks.guess_number, a stochastic search game). A task's name is its family and its
horizon in turns (`key-door-8`), so every command that takes a task name (`task write`, `task evaluate --level`,
`demo --task`, `compare --task`) takes any horizon.

Their reward is the environment's (reward 1 at the end on success); a run still needs a reward function, and
`environment_reward_only` is the one that adds nothing to it.

Torch-free.
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

from ppo_rlhf.tasks import guess_number, key_door

FAMILIES: dict[str, ModuleType] = {key_door.NAME: key_door, guess_number.NAME: guess_number}
NAMED = re.compile(r"(?P<family>[a-z-]+?)-(?P<horizon>\d+)")
DESCRIPTIONS = {
    key_door.NAME: "take the key a note names, walk H-2 corridor steps, open the door: reward 1 at turn H for the "
                   "right key (delayed credit)",
    guess_number.NAME: f"guess a secret number from 1 to {guess_number.RANGE_PER_TURN}H in at most H turns told "
                       "higher or lower: reward 1 on success (stochastic)",
}


def task_name(family: str, horizon: int) -> str:
    return f"{family}-{horizon}"


def parse(name: str) -> tuple[ModuleType, int] | None:
    """(the family's module, the horizon) of a task name such as "key-door-8" whose horizon is in the family's range;
    None for any other name."""
    match = NAMED.fullmatch(name)
    if match is None or match["family"] not in FAMILIES:
        return None
    family = FAMILIES[match["family"]]
    horizon = int(match["horizon"])
    return (family, horizon) if family.MIN_HORIZON <= horizon <= family.MAX_HORIZON else None


def listed_names() -> list[str]:
    """The names the task list shows: each family at its standard horizons."""
    return [task_name(name, h) for name, family in FAMILIES.items() for h in family.HORIZONS]


def families_hint() -> str:
    """How the families' names are formed, for error and help messages."""
    return ", ".join(f"{name}-H (H {family.MIN_HORIZON}-{family.MAX_HORIZON})" for name, family in FAMILIES.items())


def problems(name: str, split: str, n: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    found = parse(name)
    assert found is not None  # (callers check the name first)
    family, horizon = found
    return family.problems(split, horizon, n, seed)


def environment_factory(name: str):
    """The task's environment factory."""
    found = parse(name)
    assert found is not None
    return found[0].environment


def environment_reward_only(prompts: list, completions: list, completion_ids: list, **columns: Any) -> list[float]:
    """0.0 for every episode: the environment's reward (given at the end of the episode) is the whole reward, and a
    run needs at least one reward function."""
    return [0.0] * len(completions)
