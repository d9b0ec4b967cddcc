"""Atomic checkpoints and resume.

A checkpoint is a folder `checkpoints/iter_NNNNNN/` written under a temporary name and renamed when
complete; `checkpoints/latest` names the newest complete one and is replaced atomically last. A run
killed at any moment therefore leaves `latest` pointing at a whole checkpoint. Weights are PEFT adapters
in safetensors; the rest of the trainer's state (`PPOLoop.state_dict()`: optimisers, schedulers, sampler, KL
coefficient, ...) and the RNG states load with `torch.load(weights_only=True)`. Under FSDP the shards are
gathered first (each gradient step's `state_dict`), so a checkpoint is the same whatever the number of
processes that wrote or read it; under DeepSpeed ZeRO it holds every process's optimiser partition and
resumes with the same launch (`zero.py`).
This module only writes and reads files: what goes in them is the trainer's business.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from peft import PeftModel, get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file

from ppo_rlhf.errors import RunError, UsageError
from ppo_rlhf.parallel.distributed import Dist, as_shard_of, is_sharded
from ppo_rlhf.ppo.checkpoint_files import CHECKPOINTS, LATEST, checkpoint_name, latest_checkpoint, list_checkpoints
from ppo_rlhf.utils.files import atomic_directory, atomic_write_text, disk_full


def rng_state() -> dict[str, Any]:
    """torch, numpy and Python RNG states as plain types, so that `torch.load(weights_only=True)` accepts them."""
    name, keys, position, has_gauss, cached = cast(tuple, np.random.get_state())  # (legacy=True: the tuple)
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


def trained_weights(model: PeftModel, dist: Dist) -> dict[str, torch.Tensor]:
    """The trained parameters (adapter and head copy) as whole CPU tensors. Under FSDP it gathers the shards: every
    process calls it, in the same order."""
    trained = {key for key, p in model.named_parameters() if p.requires_grad}
    return dist.full_tensors({k: v for k, v in model.state_dict().items() if k in trained})


def save_checkpoint(run_dir: Path, iteration: int, models: dict[str, PeftModel], state: dict[str, Any],
                    history_lines: list[str], rng: dict[str, Any] | None = None) -> Path:
    """Write checkpoint `iter_{iteration}` atomically and point `latest` at it: the trainer's `state`
    (`PPOLoop.state_dict()`), its "weights" as one PEFT adapter folder per model (what `evaluate` reads), the rest
    with the RNG states (`rng`, by default the current ones) in state.pt, and the history so far. A full disk is a
    `RunError` naming the latest good checkpoint, the partial folder removed."""
    root = run_dir / CHECKPOINTS
    final = root / checkpoint_name(iteration)
    try:
        # an existing `final`: a checkpoint of the same iteration from a run that was killed after writing it
        with atomic_directory(final) as tmp:
            for name, model in models.items():
                model.save_pretrained(tmp / name, state_dict=state["weights"][name])
            rest = {key: value for key, value in state.items() if key != "weights"}
            with open(tmp / "state.pt", "wb") as handle:  # a Python file: a full disk is an OSError, not torch's
                torch.save({"iteration": iteration, "trainer": rest, "rng": rng or rng_state()}, handle)
            (tmp / "history.jsonl").write_text("".join(history_lines))
        atomic_write_text(root / LATEST, final.name + "\n")
    except Exception as error:
        if not disk_full(error):
            raise
        clean_partial_writes(run_dir)
        last = latest_checkpoint(run_dir, tuple(models))
        good = f"the latest good checkpoint is {last.name}" if last else "no checkpoint was written before it"
        raise RunError(f"no space left on device writing {final}; {good}") from None
    return final


def prune_checkpoints(run_dir: Path, keep: int, newest: int, models: tuple[str, ...]) -> list[Path]:
    """Delete the complete checkpoints older than the `keep` newest up to iteration `newest` (the one just written,
    never deleted; any after it are a killed run's, about to be written again); `keep` 0 deletes none. Each is renamed
    aside first (`.NAME.old-PID`, what clean_partial_writes removes), so a kill mid-delete never leaves half of one
    that looks like a checkpoint. Returns the deleted ones."""
    if keep == 0:
        return []
    older = [folder for iteration, folder in list_checkpoints(run_dir, models) if iteration <= newest][:-keep]
    for folder in older:
        aside = folder.with_name(f".{folder.name}.old-{os.getpid()}")
        os.replace(folder, aside)
        shutil.rmtree(aside)
    return older


def clean_partial_writes(run_dir: Path) -> list[Path]:
    """Remove what a killed run left half-written or set aside (files.py): `.NAME.tmp-PID` and `.NAME.old-PID` files
    and folders. Never needed for correctness (nothing reads them), only to keep the run directory clean; returns
    them."""
    run_dir = Path(run_dir)
    leftovers = [path for folder in (run_dir, run_dir / CHECKPOINTS) for pattern in (".*.tmp-*", ".*.old-*")
                 for path in folder.glob(pattern)]
    for path in leftovers:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return leftovers


def load_checkpoint(folder: Path, models: tuple[str, ...]) -> tuple[int, dict[str, Any], list[str]]:
    """(iterations done, the trainer's state for `PPOLoop.load_state_dict`, the history lines) of a checkpoint
    with adapters for `models`; the RNG states are restored in place."""
    weights = {}
    for name in models:
        path = folder / name / "adapter_model.safetensors"
        if not path.is_file():
            raise UsageError(f"checkpoint {folder} has no {name} adapter")
        weights[name] = load_file(path)
    try:
        saved = torch.load(folder / "state.pt", weights_only=True)
    except Exception as error:  # truncated or foreign file: unpickling errors of many types
        raise UsageError(f"checkpoint {folder}: state.pt is not readable ({type(error).__name__})") from error
    set_rng_state(saved["rng"])
    history = (folder / "history.jsonl").read_text().splitlines(keepends=True)
    return saved["iteration"], {**saved["trainer"], "weights": weights}, history


def load_adapter(model: PeftModel, weights: dict[str, torch.Tensor], mismatch: str) -> None:
    """Copy saved adapter `weights` into `model`; under FSDP, into this process's shards of them."""
    if not any(is_sharded(p) for p in model.parameters()):
        result = set_peft_model_state_dict(model, weights)
        if getattr(result, "unexpected_keys", None):
            raise UsageError(mismatch)
        return
    # the keys as saved (peft 0.22 gathers sharded entries into whole copies, so its values are no views to copy into)
    if set(get_peft_model_state_dict(model)) != set(weights):
        raise UsageError(mismatch)
    live = adapter_parameters(model)
    with torch.no_grad():
        for key, whole in weights.items():
            target = live[key]
            target.copy_(as_shard_of(target, whole) if is_sharded(target) else whole)


def adapter_parameters(model: PeftModel) -> dict[str, torch.Tensor]:
    """The model's own parameters (this process's shards under FSDP) under the keys peft saves them by: the adapter's
    name dropped ("lora_A.default.weight" -> "lora_A.weight", "score.modules_to_save.default.weight" ->
    "score.weight")."""
    adapter = model.active_adapter
    return {name.replace(f".modules_to_save.{adapter}", "").replace(f".{adapter}", ""): param
            for name, param in model.named_parameters() if f".{adapter}" in name}
