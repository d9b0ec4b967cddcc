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


def test_the_goal_reads_our_checkpoint_within_half_of_trls_time_against_trls_final_paired():
    """ours_against_target on made-up records: our step 2 (at 0.4x TRL's seconds) is right on 150 of 200 problems, TRL's
    final on 100 of the same problems, so ours minus TRL is +25 points with an interval above zero; step 3 (0.6x) is
    past half of TRL's time and is not the one read there, but is our final against TRL's."""
    problems = range(200)

    def records(model: str, right: int) -> list[dict]:
        return [{"model": model, "prompt_index": i, "reply_index": 0, "correct": i < right} for i in problems]

    trl = [{"label": "trl-lora step 40", "iteration": 40, "seconds": 1000.0, "tokens": 8000,
            "accuracy": {"mean": 0.5, "lo": 0.43, "hi": 0.57}}]
    ours = [{"label": f"ours-ppo step {i}", "iteration": i, "seconds": s, "tokens": 1000 * i,
             "accuracy": {"mean": a, "lo": a - 0.07, "hi": a + 0.07}}
            for i, s, a in ((1, 200.0, 0.3), (2, 400.0, 0.75), (3, 600.0, 0.8))]
    every = (records("trl-lora step 40", 100) + records("ours-ppo step 2", 150) + records("ours-ppo step 1", 60)
             + records("ours-ppo step 3", 160))
    result = peer_grpo.ours_against_target("ours-ppo", ours, trl, every, target=0.5)
    assert result["first_reaching"]["iteration"] == 2 and result["first_reaching"]["time_ratio"] == 0.4
    half = result["at_half_time"]
    assert half["iteration"] == 2
    assert half["minus_trl_final"]["mean"] == 0.25 and 0 < half["minus_trl_final"]["lo"] < 0.25
    assert result["final_minus_trl_final"]["mean"] == 0.3  # step 3, the same budget spent: 160 against 100 right
    # a side that never gets there: no first checkpoint, and its half-time reading is below TRL's
    slow = [{**ours[0], "accuracy": {"mean": 0.3, "lo": 0.23, "hi": 0.37}}]
    result = peer_grpo.ours_against_target("ours-ppo", slow, trl, every, target=0.5)
    assert result["first_reaching"] is None and result["at_half_time"]["minus_trl_final"]["hi"] < 0
