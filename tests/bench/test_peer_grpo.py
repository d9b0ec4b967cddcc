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
    assert "TRL's best side by its plateau" in proc.stdout and "GRPO at equal settings" in proc.stdout


def test_the_statistics_apply_one_rule_to_both_sides_on_made_up_curves():
    """symmetric_statistics on two made-up curves, against a hand computation. TRL's checkpoints at 100-600 s score
    40, 60, 65, 80, 60, 75%: its plateau (checkpoints from 300 s, half the 600-s budget, on) is (65+80+60+75)/4 = 70%.
    Ours at 100-600 s score 30, 50, 90, 70, 90, 80%: plateau (90+70+90+80)/4 = 82.5%. The 3-checkpoint moving average
    first reaches 70% at 400 s for ours ((50+90+70)/3) and at 600 s for TRL's ((80+60+75)/3 = 71.7): 2/3 of its
    seconds; the first single checkpoint at 70% is ours' 300 s and TRL's 400 s: 0.75x. Every held-out reply of a
    checkpoint scoring s% is right on the first s/5 of 20 problems, so the paired plateau difference is exactly the
    difference of the plateaus."""
    problems = range(20)

    def curve(side: str, scores: list[int]) -> tuple[list[dict], list[dict]]:
        rows, records = [], []
        for step, score in enumerate(scores, start=1):
            label = f"{side} step {step}"
            rows.append({"label": label, "iteration": step, "seconds": 100.0 * step, "tokens": 1000 * step,
                         "accuracy": {"mean": score / 100}})
            records += [{"model": label, "prompt_index": i, "reply_index": 0, "correct": i < score // 5}
                        for i in problems]
        return rows, records

    trl, trl_records = curve("trl-lora", [40, 60, 65, 80, 60, 75])
    ours, our_records = curve("ours-ppo", [30, 50, 90, 70, 90, 80])
    stats = peer_grpo.symmetric_statistics(ours, trl, trl_records + our_records, budget_s=600)
    assert stats["level"] == pytest.approx(0.70) and stats["plateau_ours"] == pytest.approx(0.825)
    assert stats["time_ours"]["seconds"] == 400 and stats["time_theirs"]["seconds"] == 600
    assert stats["time_ratio"] == pytest.approx(2 / 3) and stats["time_token_ratio"] == pytest.approx(2 / 3)
    assert stats["first_checkpoint_ratio"] == pytest.approx(0.75)
    assert stats["plateau_diff"]["mean"] == pytest.approx(0.125)
    assert stats["plateau_diff"]["lo"] <= 0.125 <= stats["plateau_diff"]["hi"]
    # the same function with the sides swapped: the level is now ours, and TRL's never reaches it
    swapped = peer_grpo.symmetric_statistics(trl, ours, trl_records + our_records, budget_s=600)
    assert swapped["level"] == pytest.approx(0.825) and swapped["time_ours"] is None
    assert swapped["time_ratio"] is None and swapped["plateau_diff"]["mean"] == pytest.approx(-0.125)
