"""Atomic writes of files and folders: a reader (or a resumed run) never sees half of one.

Both write into a temporary sibling named `.NAME.tmp-PID` (what checkpoint.clean_partial_writes removes after a
kill) and rename it into place.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _temporary_sibling(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write to a temporary sibling, fsync it, then rename it over `path`."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """`atomic_write_text` for bytes (the temporary sibling is this process's: writers side by side never share it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_sibling(path)
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


@contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary sibling folder to fill; when the block ends without an error, fsync its files and
    rename it to `path`. An existing `path` is replaced: set aside first and removed only once the new one is in
    place, so a kill never leaves neither."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_sibling(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    yield tmp
    for file in tmp.rglob("*"):
        if file.is_file():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())
    if not path.exists():
        os.replace(tmp, path)
        return
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old)


def disk_full(error: BaseException | None) -> bool:
    """Whether `error`, or an error it was raised from or during, is a full disk (or quota): an OSError ENOSPC /
    EDQUOT, or a library's own error whose message carries the OS's words (safetensors writes from Rust)."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(error) or "Disk quota exceeded" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def keep_iterations_before(path: str | Path, iteration: int) -> None:
    """Drop the JSONL lines of `path` (if it exists) whose "iteration" is `iteration` or later, and the lines cut by a
    kill: on resume those iterations run again, and a killed run wrote them after its checkpoint."""
    path = Path(path)
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines(keepends=True):
        try:
            if json.loads(line)["iteration"] < iteration:
                kept.append(line.rstrip("\n") + "\n")  # the next append starts on a line of its own
        except (ValueError, KeyError, TypeError):  # a line cut by the kill
            pass
    atomic_write_text(path, "".join(kept))
