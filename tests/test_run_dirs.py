"""A run directory stands on its own: its saved config names every file by an absolute path (so `evaluate RUN` and
`train --resume RUN` work from any directory), and resuming a run that has no checkpoint yet says so."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ppo_rlhf.checkpoint import clean_partial_writes
from ppo_rlhf.cli import main
from ppo_rlhf.config import read_yaml
from ppo_rlhf.files import atomic_directory
from ppo_rlhf.trainer import PPOTrainer

import tiny

PROMPTS = ["Tell me a story", "Hello! How are you?", "What is the source of energy?", "Once upon a time"]
TRAIN_FLAGS = ["--iterations", "2", "--batch-size", "4", "--minibatch-size", "2", "--max-new-tokens", "6",
               "--reward-norm-samples", "4", "--lora-rank", "4", "--checkpoint-every", "1", "--no-tensorboard",
               "--quiet"]


@pytest.fixture
def workdir(tmp_path, monkeypatch, tokenizer) -> Path:
    """A folder holding tiny models and prompts, made the current directory so that relative paths name them."""
    work = tmp_path / "work"
    tiny.save_tiny(tiny.tiny_causal_lm(tokenizer), tokenizer, work / "models" / "policy")
    tiny.save_tiny(tiny.tiny_reward_model(tokenizer), tokenizer, work / "models" / "reward")
    (work / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    monkeypatch.chdir(work)
    return work


def relative_run(out: str) -> list[str]:
    return ["train", "--policy-model", "models/policy", "--reward-model", "models/reward", "--prompts", "prompts.jsonl",
            "--ptx-data", "prompts.jsonl", "--out", out, *TRAIN_FLAGS]


def history_length(run_dir: Path) -> int:
    return len((run_dir / "history.jsonl").read_text().splitlines())


def test_saved_paths_are_absolute_and_the_run_works_from_elsewhere(workdir, tmp_path, monkeypatch):
    assert main(relative_run("runs/r")) == 0
    run_dir = workdir / "runs" / "r"
    saved = read_yaml(run_dir / "config.yaml")
    for field in ("policy_model", "reward_model", "prompts", "ptx_data", "out"):
        assert Path(saved[field]).is_absolute() and Path(saved[field]).exists(), (field, saved[field])
    assert saved["reward_model"] == str(workdir / "models" / "reward")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["evaluate", str(run_dir), "--prompts", str(workdir / "prompts.jsonl"), "--gold", "vader",
                 "--out", "eval", "--checkpoints", "latest", "--replies-per-prompt", "1", "--batch-size", "4"]) == 0
    evaluation = json.loads((elsewhere / "eval" / "evaluation.json").read_text())
    assert evaluation["settings"]["proxy"] == f"rm:{workdir / 'models' / 'reward'}"
    assert evaluation["settings"]["runs"] == {"r": str(run_dir)}
    assert main(["train", "--resume", str(run_dir), "--iterations", "3", "--quiet"]) == 0
    assert history_length(run_dir) == 3
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "iter_000003"


def test_resume_without_a_checkpoint_says_it_starts_over(workdir, monkeypatch, capsys):
    original = PPOTrainer.iteration

    def dies_at_0(self, index):  # killed during the first iteration: config.yaml written, no checkpoint yet
        if index == 0:
            raise KeyboardInterrupt
        return original(self, index)

    monkeypatch.setattr(PPOTrainer, "iteration", dies_at_0)
    assert main(relative_run("runs/k")) == 130
    monkeypatch.setattr(PPOTrainer, "iteration", original)
    run_dir = workdir / "runs" / "k"
    assert (run_dir / "config.yaml").is_file() and not (run_dir / "checkpoints" / "latest").exists()
    capsys.readouterr()

    assert main(["train", "--resume", "runs/k", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "no checkpoint yet in runs/k: starting from iteration 0" in err.splitlines()
    assert history_length(run_dir) == 2

    # a run with a checkpoint resumes from it without that line
    assert main(["train", "--resume", "runs/k", "--iterations", "3", "--quiet"]) == 0
    assert "no checkpoint yet" not in capsys.readouterr().err
    assert history_length(run_dir) == 3


def test_atomic_directory_replaces_a_folder_only_when_the_new_one_is_whole(tmp_path):
    target = tmp_path / "out"
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("first")
    assert (target / "a.txt").read_text() == "first"
    with pytest.raises(RuntimeError):
        with atomic_directory(target) as tmp:
            (tmp / "a.txt").write_text("half")
            raise RuntimeError("killed while writing")
    assert (target / "a.txt").read_text() == "first"  # the failed write never replaced it
    assert clean_partial_writes(tmp_path) == [tmp_path / f".out.tmp-{os.getpid()}"]
    with atomic_directory(target) as tmp:
        (tmp / "b.txt").write_text("second")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the old folder set aside and removed
    assert [p.name for p in target.iterdir()] == ["b.txt"]
