"""One process at a time in a run directory or a demo's folder: two `train --resume` of one run would both append
every iteration to its history.

`hold(folder)` holds an exclusive `flock` on a sibling file `.NAME.lock`, which holds the holder's PID, while its block
runs. The kernel releases a flock when its process ends, however it ends (an error, Ctrl-C, kill -9), so a lock file
left by a dead process is simply taken over. The file lies beside the folder, not in it, so that `--overwrite` can
replace the folder while holding it.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ppo_rlhf.errors import UsageError

_HELD: set[Path] = set()  # lock files this process holds: a nested hold of one folder is the same hold


def lock_file(folder: str | Path) -> Path:
    folder = Path(folder).expanduser().resolve()
    return folder.with_name(f".{folder.name}.lock")


def launched_as_main() -> bool:
    """Rank 0, or the only process: of the processes of one `accelerate launch` / torchrun (RANK in the environment,
    as `distributed.current()` reads it) only rank 0 holds the run directory, which they share; the launcher stops
    the others when rank 0 exits refused."""
    return os.environ.get("RANK", "0") == "0"


@contextmanager
def hold(folder: str | Path, what: str = "run directory") -> Iterator[None]:
    """Hold `folder`'s lock while the block runs, or refuse in one line naming the process that holds it."""
    path = lock_file(folder)
    if path in _HELD or not launched_as_main():
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = _acquire(path, f"{what} {folder}")
    _HELD.add(path)
    try:
        yield
    finally:
        _HELD.discard(path)
        path.unlink(missing_ok=True)  # still locked: a process that opened this file meanwhile sees it is gone
        os.close(descriptor)


def require_free(folder: str | Path, what: str = "run directory") -> None:
    """Refuse now, in `hold`'s one line, when another process holds `folder`; nothing stays held. A run checks this
    before its models load, and takes the lock itself (`hold`) only where it starts writing."""
    with hold(folder, what):
        pass


def _acquire(path: Path, what: str) -> int:
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(descriptor, 32).decode(errors="replace").strip()
            os.close(descriptor)
            by = f"process {holder}" if holder.isdigit() else "another process"
            raise UsageError(f"{what} is in use by {by} (lock file {path}); wait until it ends or stop it") from None
        try:
            current = os.stat(path).st_ino == os.fstat(descriptor).st_ino
        except FileNotFoundError:
            current = False
        if current:
            os.ftruncate(descriptor, 0)
            os.write(descriptor, f"{os.getpid()}\n".encode())
            return descriptor
        os.close(descriptor)  # its holder removed this file as it ended: lock the file that is there now
