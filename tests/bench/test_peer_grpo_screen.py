"""bench/peer_grpo_screen.py: the validation slice and the screening's training file are disjoint from each other and
from the held-out problems (never read); a cell's score, the choice with its tie rule and the JSON on made-up
evaluations; and --dry-run, every cell one step on tiny models through bench/peer_grpo.py's run_side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import peer_grpo_screen as screen  # noqa: E402
from test_peer_grpo import trl_installed  # noqa: E402

from ppo_rlhf.tasks import arithmetic  # noqa: E402


def prompts(rows: list[dict]) -> set[str]:
    return {row["prompt"] for row in rows}


def test_the_validation_slice_is_the_first_training_problems_and_disjoint_from_training_and_heldout():
    validation, training = screen.validation_rows(), screen.screening_training_rows()
    every_training = arithmetic.problems(screen.LEVEL, "train")  # bench/peer_grpo.py's train.jsonl, in its order
    assert validation == every_training[:screen.VALIDATION] and len(prompts(validation)) == 150
    assert not prompts(validation) & prompts(training)
    assert prompts(validation) | prompts(training) == prompts(every_training)
    assert len(training) == len(every_training) - 150
    heldout = prompts(arithmetic.problems(screen.LEVEL, "heldout"))
    assert heldout and not heldout & prompts(validation) and not heldout & prompts(training)


def test_the_screening_data_never_reads_the_heldout_split(tmp_path, monkeypatch):
    real = arithmetic.split_problems

    def training_only(name, split):
        assert split != "heldout", "the screening read the held-out problems"
        return real(name, split)

    monkeypatch.setattr(arithmetic, "split_problems", training_only)
    train_file = screen.write_screening_data(tmp_path / "data")
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["screen_train.jsonl", "validation.jsonl"]
    written = [json.loads(line) for line in train_file.read_text().splitlines()]
    assert written == screen.screening_training_rows()
    validation = [json.loads(line) for line in (tmp_path / "data" / "validation.jsonl").read_text().splitlines()]
    assert validation == screen.validation_rows() and not prompts(validation) & prompts(written)


def test_the_grid_is_the_plans():
    ours, trl = screen.cells("ours-ppo"), screen.cells("trl-lora")
    assert [(c["settings"]["policy_lr"], c["settings"]["value_lr"], c["replies_per_step"]) for c in ours] == [
        (5e-5, 5e-5, 16), (5e-5, 5e-5, 32), (1e-4, 1e-4, 16), (1e-4, 1e-4, 32), (2e-4, 2e-4, 16), (2e-4, 2e-4, 32)]
    assert all(c["settings"]["group_size"] == 2 for c in ours)
    assert [(c["settings"]["learning_rate"], c["replies_per_step"]) for c in trl] == [
        (5e-5, 8), (5e-5, 32), (1e-4, 8), (1e-4, 32), (2e-4, 8), (2e-4, 32)]
    assert all(c["settings"]["num_generations"] == 8 for c in trl)
    names = [c["name"] for c in ours + trl]
    assert len(set(names)) == 12 and names[0] == "ours-ppo_lr5e-05_b16"


def summary(label: str, accuracy: float) -> dict:
    return {"model": label, "accuracy": {"mean": accuracy, "lo": accuracy, "hi": accuracy}}


def test_a_cells_score_is_the_mean_of_its_last_two_checkpoints():
    checkpoints = [{"iteration": i, "seconds": 40.0 * i} for i in (5, 10, 15)]
    summaries = {s["model"]: s for s in (summary("c step 5", 0.9), summary("c step 10", 0.4),
                                         summary("c step 15", 0.6))}
    scored = screen.cell_score("c", checkpoints, summaries)
    assert scored["score"] == pytest.approx(0.5)
    assert [c["iteration"] for c in scored["scored_checkpoints"]] == [10, 15]
    assert screen.cell_score("c", checkpoints[:1], summaries)["score"] == pytest.approx(0.9)  # one checkpoint: it


def cell(name: str, batch: int, score: float) -> dict:
    return {"name": name, "replies_per_step": batch, "score": score}


def test_the_choice_gives_ties_within_two_points_to_the_larger_batch():
    # 58.5% at batch 32 ties with 60% at 16 (1.5 points): the larger batch
    assert screen.choose([cell("a", 16, 0.60), cell("b", 32, 0.585), cell("c", 16, 0.30)])["name"] == "b"
    # 2.0 points is still a tie; 2.1 is not
    assert screen.choose([cell("a", 16, 0.60), cell("b", 32, 0.58)])["name"] == "b"
    assert screen.choose([cell("a", 16, 0.60), cell("b", 32, 0.579)])["name"] == "a"
    # two of the larger batch in the tie: the higher score of them; equal in both: the first in the grid
    assert screen.choose([cell("a", 16, 0.61), cell("b", 32, 0.595), cell("c", 32, 0.60)])["name"] == "c"
    assert screen.choose([cell("a", 32, 0.60), cell("b", 32, 0.60)])["name"] == "a"


def made_up_screening(trl_scores: list[float]) -> tuple[dict, dict]:
    """Every cell run with checkpoints at steps 10 and 20; ours' cells score 30-55% (5-point steps, each cell's two
    checkpoints 2 points apart around it), TRL's `trl_scores`; the start model 20%."""
    results, summaries = {}, [summary("start", 0.20)]
    for side, scores in (("ours-ppo", [0.30, 0.35, 0.40, 0.45, 0.50, 0.55]), ("trl-lora", trl_scores)):
        for c, score in zip(screen.cells(side), scores):
            checkpoints = [{"iteration": 10, "seconds": 300.5}, {"iteration": 20, "seconds": 601.0}]
            results[c["name"]] = {"steps": 20, "seconds": 601.0, "checkpoints": checkpoints,
                                  "settings": {"precision": "bf16-weights"}}
            summaries += [summary(f"{c['name']} step 10", score - 0.01), summary(f"{c['name']} step 20", score + 0.01)]
    settings = {"n_heldout": 150, "split": "train", "temperature": 0.7, "max_new_tokens": 64, "dtype": "float32",
                "seed": 1234}
    return results, {"settings": settings, "summary": summaries}


def test_the_screening_json_holds_every_cell_and_the_choice(tmp_path, capsys):
    # TRL's best is 2e-4 at batch 8 (41%); 1e-4 at batch 32 (39.5%) ties with it and has the larger batch
    results, evaluation = made_up_screening([0.25, 0.30, 0.35, 0.395, 0.41, 0.20])
    screen.finish(tmp_path, results, evaluation)
    written = json.loads((tmp_path / "screening.json").read_text())
    assert written["validation"]["split"] == "train" and written["validation"]["problems"] == 150
    assert written["start_score"] == pytest.approx(0.20) and written["seed"] == 11
    assert written["trl_precision_screened"] == "bf16-weights" and "TRL in bf16-weights" in written["paste"][0]
    ours, trl = written["sides"]["ours-ppo"], written["sides"]["trl-lora"]
    assert [c["score"] for c in ours["cells"]] == pytest.approx([0.30, 0.35, 0.40, 0.45, 0.50, 0.55])
    assert ours["chosen"] == "ours-ppo_lr2e-04_b32" and ours["chosen_settings"] == {
        "policy_lr": 2e-4, "value_lr": 2e-4, "batch_size": 32, "group_size": 2}
    assert trl["chosen"] == "trl-lora_lr1e-04_b32" and trl["chosen_score"] == pytest.approx(0.395)
    assert trl["learns"] and written["trl_precision_timed"] == "bf16-weights"  # 19.5 points above the start's 20%
    assert all(c["steps"] == 20 and c["settings"] for c in ours["cells"] + trl["cells"])
    printed = capsys.readouterr().out
    assert written["paste"][0] in printed and len([line for line in written["paste"] if line.startswith("| ")]) == 14
    assert ("- **trl-lora** chosen: learning_rate 1e-4, per_device_train_batch_size 32, num_generations 8 (39.5%; "
            "ties within 2 points go to the larger batch)") in written["paste"]
    assert any("`--trl-precision bf16-weights`" in line for line in written["paste"])


def test_the_timed_runs_read_the_choice_back(tmp_path):
    """bench/peer_grpo.py --screening OUT/screening.json: each screened side's chosen settings, over its own."""
    import peer_grpo

    results, evaluation = made_up_screening([0.25, 0.30, 0.35, 0.395, 0.41, 0.20])
    screen.finish(tmp_path, results, evaluation)
    assert peer_grpo.screened_settings(tmp_path / "screening.json") == {
        "ours-ppo": {"policy_lr": 2e-4, "value_lr": 2e-4, "batch_size": 32, "group_size": 2},
        "trl-lora": {"learning_rate": 1e-4, "per_device_train_batch_size": 32, "num_generations": 8},
        # the equal-settings side follows TRL's chosen cell: its rate, its 32 replies a step (4 prompts x 8)
        "ours-grpo": {"policy_lr": 1e-4, "batch_size": 32, "minibatch_size": 32, "group_size": 8}}


def test_trl_keeps_its_default_precision_when_its_chosen_cell_does_not_learn():
    results, evaluation = made_up_screening([0.21, 0.22, 0.25, 0.29, 0.23, 0.24])  # best 29%: 9 points up
    written = screen.screening_result(results, evaluation)
    assert not written["sides"]["trl-lora"]["learns"] and written["trl_precision_timed"] == "bf16"


SKIP = trl_installed()


def test_dry_run_steps_two_cells_a_side_and_scores_them_on_the_validation_slice(tmp_path):
    """The first and last cell of ours (and of TRL's, where bench/.venv-grpo has TRL) take one step with their
    settings (both batches, two rates) and their checkpoints are scored on the first validation problems."""
    sides = ["ours-ppo"] + (["trl-lora"] if SKIP is None else [])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "peer_grpo_screen.py"), "--dry-run", "--out",
                           str(tmp_path), "--sides", ",".join(sides)], capture_output=True, text=True, timeout=1200,
                          env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    written = json.loads((tmp_path / "screening.json").read_text())
    assert written["validation"]["split"] == "train" and written["validation"]["problems"] == screen.DRY_VALIDATION
    assert not (tmp_path / "data" / "heldout.jsonl").exists()
    for side in sides:
        assert [c["name"] for c in written["sides"][side]["cells"]] == [screen.cells(side)[0]["name"],
                                                                          screen.cells(side)[-1]["name"]]
        for c in written["sides"][side]["cells"]:
            run = json.loads((tmp_path / "eval" / c["name"] / "side.json").read_text())
            assert run["steps"] == 1 and run["cell_settings"] == c["settings"] and 0 <= c["score"] <= 1
            rate = "policy_lr" if side == "ours-ppo" else "learning_rate"
            assert run["settings"][rate] == c["settings"][rate]  # the cell's settings reached its trainer
    assert written["paste"][0] in proc.stdout
