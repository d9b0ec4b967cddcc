"""Kills: `kill -9` of a `python -m ppo_rlhf train` subprocess (while generating, while writing a checkpoint, at a
random moment), each followed by `--resume`: `latest` always names a complete checkpoint and the final history equals
an uninterrupted run's."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from reliability import RELIABILITY_SURVIVAL, REPO, TIME_KEYS, flags, read_history, small, survival


def check_latest(run: Path) -> str | None:
    """`latest`, if present, names a complete, readable checkpoint whose history has its iteration count."""
    from safetensors.torch import load_file

    pointer = run / "checkpoints" / "latest"
    if not pointer.exists():  # killed before its first checkpoint was complete
        return None
    name = pointer.read_text().strip()
    folder = run / "checkpoints" / name
    saved = torch.load(folder / "state.pt", weights_only=True)
    assert saved["iteration"] == int(name.split("_")[1])
    for model in ("policy", "value"):
        assert load_file(folder / model / "adapter_model.safetensors")
        json.loads((folder / model / "adapter_config.json").read_text())
    assert len((folder / "history.jsonl").read_text().splitlines()) == saved["iteration"]
    return name


def test_kill_9_and_resume_gives_the_uninterrupted_history(env, tmp_path):
    values = small(env, None, iterations=6, sample_every=5)
    del values["out"]
    child_env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                 "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}

    def launch(*args: str) -> subprocess.Popen:
        log = open(tmp_path / f"stderr_{time.monotonic_ns()}.txt", "w")
        return subprocess.Popen([sys.executable, "-m", "ppo_rlhf", "train", *args], cwd=REPO, env=child_env,
                                stdout=subprocess.DEVNULL, stderr=log)

    uninterrupted = tmp_path / "a"
    killed = tmp_path / "b"
    reference = launch(*flags(values), f"--out={uninterrupted}")  # runs alongside the killed one
    rng = random.Random(20240607)
    checkpoints = killed / "checkpoints"

    def writing_checkpoint() -> bool:
        return checkpoints.is_dir() and any(".tmp-" in p.name for p in os.scandir(checkpoints))

    # (when to kill, after the history file of this launch appeared)
    plans = [("while generating the first batch, before any checkpoint", lambda started: True),
             ("while writing a checkpoint", lambda started: writing_checkpoint()),
             ("at a random moment", lambda started, delay=rng.uniform(0.2, 2.0): time.monotonic() - started > delay)]
    proc = launch(*flags(values), f"--out={killed}")
    for what, due in plans:
        launched = time.time_ns()
        started = None
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            history = killed / "history.jsonl"
            if started is None and history.exists() and history.stat().st_mtime_ns > launched:  # written by this launch
                started = time.monotonic()
            if started is not None and due(started):
                break
            time.sleep(0.002)
        if proc.poll() is not None:  # finished before the kill: nothing to survive
            break
        with survival("kills"):
            in_checkpoint = writing_checkpoint()
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            print(f"killed {what} (checkpoint write in progress: {in_checkpoint}); latest = {check_latest(killed)}")
        proc = launch("--resume", str(killed))
    assert proc.wait(timeout=300) == 0
    assert reference.wait(timeout=300) == 0

    def history(run: Path) -> list[dict]:
        return [{k: v for k, v in row.items() if k not in TIME_KEYS} for row in read_history(run)]

    assert RELIABILITY_SURVIVAL["kills"][0] >= 2, "the run finished before it could be killed"
    assert check_latest(killed) == "iter_000006"
    assert history(killed) == history(uninterrupted)
    assert (killed / "samples.jsonl").read_text() == (uninterrupted / "samples.jsonl").read_text()
    assert not [p for p in checkpoints.iterdir() if ".tmp-" in p.name], "leftovers of a killed checkpoint write"


def test_sigterm_from_outside_checkpoints_and_exits_143(env, tmp_path):
    """SIGTERM sent to a `python -m ppo_rlhf train` process (a scheduler's preemption) after its second iteration:
    the run writes the checkpoint of its last finished iteration (none was due: checkpoint_every 100), says how to
    continue, exits with 143, and `--resume` finishes it."""
    run = tmp_path / "run"
    values = small(env, run, iterations=40, checkpoint_every=100)
    child_env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                 "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "ppo_rlhf", "train", *flags(values)], cwd=REPO, env=child_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    history = run / "history.jsonl"
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        if history.exists() and len(history.read_text().splitlines()) >= 2:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be terminated"
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 143, err[-2000:]
    done = len(history.read_text().splitlines())
    assert err.splitlines()[-1] == (f"ppo-rlhf train: terminated (SIGTERM); the latest checkpoint is iter_{done:06d}; "
                                    f"continue with: ppo-rlhf train --resume {run}")
    assert check_latest(run) == f"iter_{done:06d}"
    resumed = subprocess.run([sys.executable, "-m", "ppo_rlhf", "train", "--resume", str(run), "--iterations",
                              str(done + 1)], cwd=REPO, env=child_env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert len(read_history(run)) == done + 1
