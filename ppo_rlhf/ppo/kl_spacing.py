"""Checkpoints spaced by KL, not by step: which of a run's checkpoints the evaluation scores.

Runs move away from the start model at different speeds (an arm whose reward is easy to raise moves faster, and
beta 0 faster than beta 0.05), so the same steps would compare different distances. For each KL target the
evaluation picks the first checkpoint whose training KL reached it, and always the last checkpoint; checkpoints of
different seeds and arms are then compared at the same target.

A checkpoint's training KL comes from the run's history: history row k holds the batch that checkpoint iter_k's
policy sampled (row k is iteration index k, sampled after k updates), its `kl` the mean over that batch of the
summed per-token KL to the start model. One batch is a few replies, so the rows within one iteration of k are
averaged (the last checkpoint, which sampled no batch, gets the row before it).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

LAST = "last"


def parse_targets(text: str) -> list[float]:
    """KL targets of a comma list: positive numbers, increasing."""
    from ppo_rlhf.errors import UsageError, require

    try:
        targets = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"KL targets must be comma-separated numbers, got {text!r}") from None
    require(bool(targets) and all(math.isfinite(t) and t > 0 for t in targets),
            f"KL targets must be positive numbers, got {text!r}")
    require(targets == sorted(set(targets)), f"KL targets must increase, got {text!r}")
    return targets


def read_kls(run_dir: Path) -> dict[int, float]:
    """{iteration: training KL} of a run's history.jsonl (rows with a non-finite KL left out)."""
    kls = {}
    for line in (Path(run_dir) / "history.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            value = row.get("kl")
            if isinstance(value, int | float) and math.isfinite(value):
                kls[int(row["iteration"])] = float(value)
    return kls


def checkpoint_kl(kls: dict[int, float], iteration: int) -> float:
    """The training KL of checkpoint iter_`iteration`: the mean of the history's KL at iterations within one of it
    (nan when there is none)."""
    near = [kls[i] for i in (iteration - 1, iteration, iteration + 1) if i in kls]
    return sum(near) / len(near) if near else math.nan


def pick_by_kl(kls: dict[int, float], iterations: list[int], targets: list[float]) -> dict[int, list[float | str]]:
    """{checkpoint iteration: the targets it stands for} for the checkpoints `iterations`: per target the first whose
    training KL reached it (a target no checkpoint reached is left out), and the last checkpoint as LAST."""
    ordered = sorted(iterations)
    picked: dict[int, list[float | str]] = {}
    for target in targets:
        first = next((i for i in ordered if checkpoint_kl(kls, i) >= target), None)
        if first is not None:
            picked.setdefault(first, []).append(target)
    picked.setdefault(ordered[-1], []).append(LAST)
    return dict(sorted(picked.items()))
