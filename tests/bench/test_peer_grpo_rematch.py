"""bench/peer_grpo_rematch.py: results only from a committed plan and a clean tree, and the plan's statistics on
made-up seeds' curves against a hand computation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import peer_grpo_rematch as rematch  # noqa: E402


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def test_results_need_a_committed_plan_and_a_clean_tree(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    (repo / "code.py").write_text("x = 1\n")
    git(repo, "add", "code.py")
    git(repo, "commit", "-qm", "code")
    plan = repo / "plan.md"
    plan.write_text("the rule\n")
    with pytest.raises(rematch.PlanError, match="not committed"):
        rematch.plan_commit(plan, repo)  # (an untracked plan leaves the tracked tree clean)
    git(repo, "add", "plan.md")
    git(repo, "commit", "-qm", "plan")
    commit = git(repo, "rev-parse", "HEAD").strip()
    assert rematch.plan_commit(plan, repo) == commit
    (repo / "code.py").write_text("x = 2\n")
    with pytest.raises(rematch.PlanError, match="uncommitted changes"):
        rematch.plan_commit(plan, repo)


def seed_run(side: str, seed: int, scores: list[int]) -> tuple[list[dict], list[dict]]:
    """Checkpoints at 100-600 s (600-s budget) scoring `scores`%; on 20 problems x 1 reply, checkpoint s% is right
    on the first s/5 problems."""
    rows, records = [], []
    for step, score in enumerate(scores, start=1):
        label = f"{side} s{seed} step {step}"
        rows.append({"label": label, "iteration": step, "seconds": 100.0 * step + seed, "tokens": 1000 * step,
                     "accuracy": {"mean": score / 100}})
        records += [{"model": label, "prompt_index": i, "reply_index": 0, "correct": i < score // 5}
                    for i in range(20)]
    return rows, records


def test_the_plans_statistics_on_made_up_seeds():
    """TRL's two seeds score 40,60,60,80,60,80 and 40,60,70,80,60,70: averaged 40,60,65,80,60,75, plateau (from 300 s)
    (65+80+60+75)/4 = 70%, the moving average first at 70% at the 6th checkpoint ((80+60+75)/3 = 71.7). Ours: 30,50,
    90,70,90,80 twice: plateau 82.5%, moving average at 70% at the 4th checkpoint ((50+90+70)/3 = 70). Seconds are the
    seeds' mean (seed 1 at +1 s, seed 2 at +2 s): 401.5 over 601.5. Plateau difference 12.5 points, every seed and
    problem alike in sign."""
    theirs = [seed_run("trl", 1, [40, 60, 60, 80, 60, 80]), seed_run("trl", 2, [40, 60, 70, 80, 60, 70])]
    ours = [seed_run("ours", 1, [30, 50, 90, 70, 90, 80]), seed_run("ours", 2, [30, 50, 90, 70, 90, 80])]
    stats = rematch.rematch_statistics(ours, theirs, budget_s=600)
    assert stats["level"] == pytest.approx(0.70) and stats["plateau_ours"] == pytest.approx(0.825)
    assert stats["time_ratio"] == pytest.approx(401.5 / 601.5)
    assert stats["plateau_diff_points"] == pytest.approx(12.5)
    lo, hi = stats["plateau_diff_ci95"]
    assert lo <= 12.5 <= hi and stats["paired_seeds"] == 2
    assert [round(point["accuracy"]["mean"], 4) for point in stats["curves"]["theirs"]] == [0.4, 0.6, 0.65, 0.8, 0.6,
                                                                                           0.75]


def test_no_results_without_finished_runs(tmp_path, capsys):
    assert rematch.main([str(tmp_path)]) == 2
    assert "no finished peer_grpo.json" in capsys.readouterr().err
