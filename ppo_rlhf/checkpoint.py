"""Atomic checkpoints and resume.

A checkpoint is a folder `checkpoints/iter_NNNNNN/` written under a temporary name and renamed when
complete; `checkpoints/latest` names the newest complete one and is replaced atomically last. A run
killed at any moment therefore leaves `latest` pointing at a whole checkpoint. Weights are PEFT adapters
in safetensors; optimiser and RNG states load with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from peft import PeftModel, set_peft_model_state_dict
from safetensors.torch import load_file

from ppo_rlhf.errors import UsageError

CHECKPOINTS = "checkpoints"
LATEST = "latest"


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def checkpoint_name(iteration: int) -> str:
    return f"iter_{iteration:06d}"


@dataclass
class TrainingState:
    """Everything besides adapters, optimisers and RNGs that a resumed run needs to continue exactly."""

    iteration: int
    """Iterations completed."""
    sampler: dict[str, Any]
    """The prompt sampler's order, position and generator state."""
    beta: float
    """The KL coefficient now (changes only with the adaptive controller)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else (counters of skipped steps, controller state)."""


def rng_state() -> dict[str, Any]:
    """torch, numpy and Python RNG states as plain types, so that `torch.load(weights_only=True)` accepts them."""
    name, keys, position, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": [name, keys.tolist(), position, has_gauss, cached],
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), position, has_gauss, cached))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    run_dir: Path,
    state: TrainingState,
    models: dict[str, PeftModel],
    optimizers: dict[str, torch.optim.Optimizer],
    history_lines: list[str],
) -> Path:
    """Write checkpoint `iter_{state.iteration}` atomically and point `latest` at it."""
    root = run_dir / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(state.iteration)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name, model in models.items():
        model.save_pretrained(tmp / name)
    torch.save(
        {
            "state": state.__dict__,
            "optimizers": {name: opt.state_dict() for name, opt in optimizers.items()},
            "rng": rng_state(),
        },
        tmp / "state.pt",
    )
    (tmp / "history.jsonl").write_text("".join(history_lines))
    _fsync_tree(tmp)
    if final.exists():  # a checkpoint of the same iteration from a run that was killed after writing it
        shutil.rmtree(final)
    os.replace(tmp, final)
    atomic_write_text(root / LATEST, final.name + "\n")
    return final


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = Path(run_dir) / CHECKPOINTS / LATEST
    if not pointer.is_file():
        return None
    folder = pointer.parent / pointer.read_text().strip()
    return folder if (folder / "state.pt").is_file() else None


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    found = []
    for folder in sorted(root.glob("iter_*")) if root.is_dir() else []:
        if (folder / "state.pt").is_file():
            found.append((int(folder.name.split("_")[1]), folder))
    return found


def load_checkpoint(
    folder: Path, models: dict[str, PeftModel], optimizers: dict[str, torch.optim.Optimizer]
) -> tuple[TrainingState, list[str]]:
    """Restore adapters, optimisers and RNG states in place; return the training state and the history lines."""
    for name, model in models.items():
        weights = folder / name / "adapter_model.safetensors"
        if not weights.is_file():
            raise UsageError(f"checkpoint {folder} has no {name} adapter")
        result = set_peft_model_state_dict(model, load_file(weights))
        if getattr(result, "unexpected_keys", None):
            raise UsageError(f"checkpoint {folder}: {name} adapter does not fit this model")
    saved = torch.load(folder / "state.pt", weights_only=True)
    for name, opt in optimizers.items():
        opt.load_state_dict(saved["optimizers"][name])
    set_rng_state(saved["rng"])
    history = (folder / "history.jsonl").read_text().splitlines(keepends=True)
    return TrainingState(**saved["state"]), history
