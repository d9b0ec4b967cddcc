"""A horizon comparison's finished stages kept outside its folder (`compare --horizons ... --archive DIR`), so that
one comparison can span machines whose disks do not last: hours of training end in a few small files per run (its
config.yaml, history.jsonl, process.json and its held-out records), which the archive keeps, gzipped, with the stage's
record (its key, settings and seconds). A comparison started with the same --archive on a fresh machine takes every
archived stage its own folder has not finished as done (`restore`): its runs are not trained again, and the report is
written from their records. Checkpoints are never archived (a run's evaluation needs them, the report does not).

Layout: DIR/stages/NAME.json (the stage's record, the files it keeps) and DIR/PATH.gz for each kept file, PATH as in
the comparison's folder. Each stage has its own files, so comparisons running side by side (e.g. one per group of
variants, each with its own OUT) can share one archive.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from ppo_rlhf.study.demo import Stages
from ppo_rlhf.utils.files import atomic_write_bytes, atomic_write_text


def record_file(archive: Path, name: str) -> Path:
    """DIR/stages/NAME.json, the stage's name made a file name ("run h8 ppo_s0" -> run_h8_ppo_s0.json)."""
    return archive / "stages" / (re.sub(r"[^A-Za-z0-9_.-]+", "_", name) + ".json")


def keep(stages: Stages, name: str, out: Path, archive: Path, files: list[Path]) -> None:
    """Copy a finished stage's `files` (paths relative to OUT) into the archive, gzipped, then its record (last: a
    record in the archive means every file it names is there)."""
    for relative in files:  # (two comparisons sharing the archive write the start model's stage: each its own temp)
        atomic_write_bytes(archive / f"{relative}.gz", gzip.compress((out / relative).read_bytes(), mtime=0))
    record = {"name": name, **stages.records[name], "files": [str(relative) for relative in files]}
    atomic_write_text(record_file(archive, name), json.dumps(record, indent=1) + "\n")


def restore(stages: Stages, out: Path, archive: Path) -> list[str]:
    """Every archived stage this folder has not finished: its files unpacked into OUT and its record adopted, so that
    `Stages.run` skips it when its key is the same (and runs it again, naming what changed, when not). Returns the
    names restored."""
    restored = []
    for path in sorted((archive / "stages").glob("*.json")):
        record = json.loads(path.read_text())
        name, files = record.pop("name"), record.pop("files")
        local = stages.records.get(name)
        if local is not None and local.get("finished"):
            continue  # this folder's own result stands
        for relative in files:
            with gzip.open(archive / f"{relative}.gz", "rb") as packed:
                atomic_write_text(out / relative, packed.read().decode())
        stages.adopt(name, record)
        restored.append(name)
    return restored
