"""What a horizon comparison runs (`compare --task NAME --horizons`): planned by tasks/horizons.py, read by its screen
(tasks/screen.py) as well."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ppo_rlhf.ppo.train_config import TrainConfig


@dataclasses.dataclass
class Comparison:
    """What a horizon comparison runs: per horizon, its task instance and the config of each (variant, seed)."""

    task: str
    out: Path
    horizons: list[int]
    seeds: int
    variants: list[str]
    instances: dict[int, str]
    configs: dict[int, dict[tuple[str, int], TrainConfig]]
