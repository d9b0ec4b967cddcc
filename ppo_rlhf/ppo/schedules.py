"""Learning-rate schedules: `lr_schedule` constant | linear | cosine with `warmup_iterations` of linear warm-up,
a torch.optim.lr_scheduler.LambdaLR per optimiser, stepped once per accepted optimiser step (off by default)."""

from __future__ import annotations

import math

import torch

from ppo_rlhf.errors import require

SCHEDULES = ("constant", "linear", "cosine")


def lr_lambda(schedule: str, warmup_steps: int, total_steps: int):
    """The LR multiplier after `step` optimiser steps: linear warm-up from 1/warmup to 1, then constant,
    linear decay to 0, or cosine decay to 0 at `total_steps`."""
    require(schedule in SCHEDULES, f"lr_schedule must be one of {SCHEDULES}, got {schedule!r}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def make_scheduler(optimizer: torch.optim.Optimizer, schedule: str, warmup_steps: int, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(schedule, warmup_steps, total_steps))
