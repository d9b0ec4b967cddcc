"""Finding a run's checkpoints on disk -- which are complete, which one `latest` names -- without loading torch, so
that `evaluate`, `export` and a run's hints check a checkpoint's name before any model loads (what a checkpoint holds,
and writing and reading it: checkpoint.py)."""

from __future__ import annotations

from pathlib import Path

CHECKPOINTS = "checkpoints"
LATEST = "latest"


def checkpoint_name(iteration: int) -> str:
    return f"iter_{iteration:06d}"


ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
MODEL_FILES = ("config.json", "model.safetensors")
"""A plain transformers model folder (one weights file): a fully fine-tuned policy saved by another trainer, e.g.
TRL's GRPOTrainer in bench/peer_grpo.py, which `ppo-rlhf task evaluate` reads beside our adapters."""


def is_complete(folder: Path, models: tuple[str, ...] | None = None) -> bool:
    """The files evaluation needs (state.pt + the policy: an adapter or a plain model folder), or, given the names of
    the trained `models`, every file a resumed run needs (their adapters + history.jsonl). A folder half-deleted by a
    killed run is not complete."""
    folder = Path(folder)
    if not models:
        policy = folder / "policy"
        return (folder / "state.pt").is_file() and any(all((policy / name).is_file() for name in files)
                                                       for files in (ADAPTER_FILES, MODEL_FILES))
    names = ["state.pt", "history.jsonl"] + [f"{m}/{f}" for m in models for f in ADAPTER_FILES]
    return all((folder / name).is_file() for name in names)


def latest_checkpoint(run_dir: Path, models: tuple[str, ...] | None = None) -> Path | None:
    """The checkpoint `latest` names; if the pointer is missing or names an incomplete folder (a run killed
    between renaming its first checkpoint into place and writing the pointer), the newest complete one."""
    pointer = Path(run_dir) / CHECKPOINTS / LATEST
    if pointer.is_file():
        name = pointer.read_text().strip()
        folder = pointer.parent / name
        if name.startswith("iter_") and is_complete(folder, models):
            return folder
    found = list_checkpoints(run_dir, models)
    return found[-1][1] if found else None


def list_checkpoints(run_dir: Path, models: tuple[str, ...] | None = None) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    found = []
    for folder in sorted(root.glob("iter_*")) if root.is_dir() else []:
        suffix = folder.name.split("_", 1)[1]
        if suffix.isdigit() and is_complete(folder, models):
            found.append((int(suffix), folder))
    return found
