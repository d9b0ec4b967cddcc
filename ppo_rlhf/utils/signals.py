"""SIGTERM (a scheduler's preemption, `kill`, a container stop) handled as Ctrl-C: while `sigterm_as_interrupt()`
holds, SIGTERM raises `Terminated`, a KeyboardInterrupt, in the main thread, so every place that keeps work on Ctrl-C
(a run's checkpoint of its last finished iteration, the demo's stages, atomic writes) keeps it on SIGTERM too. The
command line then exits with 143 (128 + SIGTERM, what a shell reports for a process SIGTERM ended; Ctrl-C: 130).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from ppo_rlhf.errors import Terminated

EXIT_CODE = 128 + signal.SIGTERM  # 143


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated("SIGTERM")


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises `Terminated` while the block runs; the previous handler is restored after. Only in the main
    thread (the one Python delivers signals to) and only where SIGTERM has its default action: a handler of the
    caller's own is left alone."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def by_sigterm(error: BaseException | None) -> bool:
    """Whether `error`, or an exception it was raised while handling (an `Interrupted` that names the checkpoint),
    is a `Terminated`."""
    while error is not None:
        if isinstance(error, Terminated):
            return True
        error = error.__cause__ or error.__context__
    return False
