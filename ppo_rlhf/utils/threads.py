"""torch's CPU threads for a command that trains or samples (`--threads N`), set without loading torch: a command
checks its input before torch loads, and torch reads OMP_NUM_THREADS when it loads (so do the processes a command
starts, e.g. `compare --task`'s runs). On a machine whose cores other jobs share, threads that wait for each other
cost more than they gain: 1 thread was 5x faster on a loaded 2-core machine (docs/usage.md)."""

from __future__ import annotations

import os
import sys


def use_threads(count: int | None) -> None:
    """Run torch's operations on `count` CPU threads (None or 0: leave torch's default)."""
    if not count:
        return
    os.environ["OMP_NUM_THREADS"] = str(count)  # torch, when it loads, and child processes
    if "torch" in sys.modules:  # already loaded: its own setting
        sys.modules["torch"].set_num_threads(count)
