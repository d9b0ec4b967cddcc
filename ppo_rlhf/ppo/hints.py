"""Where a run came from -- the command line or Python -- and the words its hints use: a run started by `ppo-rlhf
train` continues with `--resume RUN_DIR`, one built in Python with `PPOTrainer(..., resume=True)` (its reward
functions and dataset are objects of the user's script, which no command can rebuild). The CLI marks what it runs
(`from_command_line`); everything else is Python's."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

_COMMAND_LINE: ContextVar[bool] = ContextVar("command_line", default=False)


@contextmanager
def from_command_line() -> Iterator[None]:
    """The block runs a command of the CLI: its hints name flags."""
    token = _COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def on_command_line() -> bool:
    return _COMMAND_LINE.get()


def continue_run(run_dir: str | Path) -> str:
    """How to continue the run in `run_dir` from its latest checkpoint."""
    if on_command_line():
        return f"ppo-rlhf train --resume {shlex.quote(str(run_dir))}"
    return "PPOTrainer(config, ..., resume=True).train() with the same rewards and dataset"


def continue_or_replace(run_dir: str | Path) -> str:
    """How to continue the run in `run_dir`, or to replace it."""
    if on_command_line():
        return f"use --resume {run_dir} to continue it or --overwrite to replace it"
    return "use PPOTrainer(config, ..., resume=True) to continue it or PPOConfig(..., overwrite=True) to replace it"


def start_again() -> str:
    return "run the same command again" if on_command_line() else "run the same code again"
