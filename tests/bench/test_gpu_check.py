"""bench/gpu_check.py --dry-run: the GPU check's code path on this CPU with tiny models, so that it cannot rot before
a GPU runs it (issue 30)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from ppo_rlhf.models.precision import cpu_has_native_bf16

ROOT = Path(__file__).resolve().parents[2]
PARTS = ["gemm", "ours", "trl", "fsdp", "zero2", "tests"]


def test_dry_run_writes_every_part(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--dry-run", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert {"started", "dry_run", "device_name", "config", "versions", "memory", "parts", "wall_s"} <= report.keys()
    assert report["dry_run"] and list(report["parts"]) == PARTS
    parts = report["parts"]
    # each part ran, or (TRL alone, when TRL 1.12.0 is not installed) says why not
    for name, part in parts.items():
        if name == "trl" and part["status"] == "skipped":
            assert "TRL 1.12.0 is not installed" in part["reason"]
            continue
        assert part["status"] == "ok", (name, part.get("error"), (tmp_path / "gpu_check.log").read_text()[-3000:])
    assert parts["gemm"]["result"]["peak_gflops"] > 0
    ours = parts["ours"]["result"]
    assert ours["iterations"] == 1 and ours["dtype"] == "torch.bfloat16" and ours["device"] == "cpu"
    phases = ("gen", "score", "update_6N", "update_4N")
    assert all(ours["mfu"][phase] > 0 for phase in phases), ours["mfu"]
    if cpu_has_native_bf16():  # without it the bf16 "peak" is an emulated GEMM's, no ceiling (AVX2: gen 3.7-5.9)
        assert all(ours["mfu"][phase] < 1 for phase in phases), ours["mfu"]
    assert set(ours["seconds"]) == {"gen", "score", "update", "total"}
    # FSDP really sharded layers; ZeRO-2 really stepped through DeepSpeed's engines; both gathered a checkpoint
    assert parts["fsdp"]["result"]["sharded_parameters"] > 0 and parts["fsdp"]["result"]["finite"]
    assert parts["zero2"]["result"]["steps"] == {"policy": "ZeroStep", "value": "ZeroStep"}
    for name in ("fsdp", "zero2"):
        assert "weights" in parts[name]["result"]["state_parts"] and parts[name]["result"]["backend"] == "gloo"
    assert parts["tests"]["result"]["passed"] == 1 and not parts["tests"]["result"]["failures"]
    assert report["memory"]["estimate_gb"] > 0
    summary = (tmp_path / "gpu_check.txt").read_text()
    assert all(f"{name} " in summary for name in PARTS) and "memory estimate" in summary


def test_a_failing_or_overrunning_part_is_recorded_and_leaves_nothing_running():
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_check

    log: list[str] = []
    result, error = gpu_check.run_child("broken", [sys.executable, "-c", "raise ValueError('boom')"], 60, log,
                                        dict(os.environ))
    assert result == {} and error.startswith("exit 1: ") and "ValueError: boom" in error
    # out of time: the part's whole session is killed, also a grandchild in a process group of its own (as ninja
    # starts compilers), which would otherwise keep running and hold locks
    code = ("import os, subprocess, time\n"
            "child = subprocess.Popen(['sleep', '120'], preexec_fn=os.setpgrp)\n"
            "print(f'grandchild={child.pid}', flush=True)\ntime.sleep(120)\n")
    result, error = gpu_check.run_child("slow", [sys.executable, "-c", code], 5, log, dict(os.environ))
    assert result == {} and error == "timed out after 5 s (its time box)"
    grandchild = int(re.search(r"^grandchild=(\d+)$", log[-1], re.MULTILINE).group(1))
    stat = Path(f"/proc/{grandchild}/stat")

    def still_running() -> bool:  # the kill is delivered asynchronously: alive means a live `sleep`, not a zombie
        try:
            text = stat.read_text()
        except OSError:  # gone
            return False
        return "(sleep)" in text and text.rsplit(")", 1)[1].split()[0] != "Z"

    deadline = time.monotonic() + 10
    while still_running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not still_running()
