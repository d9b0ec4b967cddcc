"""bench/peer_grpo.py --dry-run: our trainer and TRL's GRPOTrainer (bench/.venv-grpo) each start on tiny random
models and take one step, and `ppo-rlhf task evaluate` reads every side's checkpoint, TRL's full fine-tune (a plain
transformers folder) and TRL's LoRA adapter included (issue 45). Skipped, with the reason, where `make venv-grpo` did
not install TRL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import peer_grpo  # noqa: E402


def trl_installed() -> str | None:
    """None when bench/.venv-grpo runs TRL peer_grpo.TRL_VERSION, else why not."""
    if not peer_grpo.GRPO_PY.exists():
        failed = peer_grpo.GRPO_PY.parent.parent / ".failed"
        return (f"TRL's GRPO environment did not install (see {failed.parent / 'install.log'})" if failed.exists()
                else f"{peer_grpo.GRPO_PY} is missing (`make venv-grpo`)")
    proc = subprocess.run([str(peer_grpo.GRPO_PY), "-c", "import trl; print(trl.__version__)"], capture_output=True,
                          text=True)
    version = proc.stdout.strip()
    return None if version == peer_grpo.TRL_VERSION else \
        f"bench/.venv-grpo has TRL {version or 'not importable'}, not {peer_grpo.TRL_VERSION} (`make venv-grpo`)"


SKIP = trl_installed()
SIDES = ["ours-ppo", "ours-grpo", "trl-default", "trl-lora"]


@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
def test_dry_run_both_sides_step_and_trl_checkpoints_are_evaluated(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "peer_grpo.py"), "--dry-run", "--out", str(tmp_path),
                           "--sides", ",".join(SIDES)], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "peer_grpo.json").read_text())
    for side in SIDES:  # every side started, took its one step and wrote one checkpoint with its numbers
        run = result["sides"][side]
        assert run["steps"] == 1 and run["tokens"] > 0 and run["peak_rss_gb"] > 0, side
        [point] = result["curves"][side]
        assert point["iteration"] == 1 and 0 < point["seconds"] <= run["seconds"]
        assert 0 <= point["accuracy"]["mean"] <= 1
    assert result["sides"]["trl-default"]["versions"]["trl"] == peer_grpo.TRL_VERSION
    # TRL's checkpoints as TRL saved them: a full model folder (its default) and a LoRA adapter, both evaluated
    policy = tmp_path / "eval" / "trl-default" / "checkpoints" / "iter_000001" / "policy"
    assert (policy / "model.safetensors").is_file() and not (policy / "adapter_config.json").exists()
    assert (tmp_path / "eval" / "trl-lora" / "checkpoints" / "iter_000001" / "policy" / "adapter_config.json").is_file()
    evaluation = json.loads((tmp_path / "evaluation" / "task_eval.json").read_text())
    assert [s["model"] for s in evaluation["summary"]] == ["start"] + [f"{side} step 1" for side in SIDES]
    assert all(s["problems"] == 4 for s in evaluation["summary"])  # the same held-out problems for every side
    assert "TRL's best run" in proc.stdout and "GRPO at equal settings" in proc.stdout
