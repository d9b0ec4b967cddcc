"""The device and dtype a setting names: the dtype names every command accepts, and `resolve_device`. Torch-free to
import, so that commands check their flags before torch loads (models/precision.py, which imports torch, resolves
"auto" to a dtype)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

from ppo_rlhf.errors import UsageError, require

if TYPE_CHECKING:
    import torch

DtypeName = Literal["auto", "float32", "bfloat16", "float16"]
DTYPE_NAMES: tuple[str, ...] = get_args(DtypeName)


def resolve_device(name: str) -> torch.device:
    import torch  # here, not at the top: a config is checked (and its files) before torch is imported

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"unknown device {name!r}") from None
    require(device.type != "cuda" or torch.cuda.is_available(), f"device {name!r} asked for, but CUDA is not available")
    return device
