"""A run directory stands on its own: its saved config names every file by an absolute path (so `evaluate RUN` and
`train --resume RUN` work from any directory), and resuming a run that has no checkpoint yet says so."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

from ppo_rlhf.cli import main
from ppo_rlhf.config import read_yaml
from ppo_rlhf.ppo.checkpoint import clean_partial_writes, prune_checkpoints
from ppo_rlhf.ppo.trainer import PPOLoop
from ppo_rlhf.utils.files import atomic_directory, disk_full
from ppo_rlhf.utils.lock import lock_file

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
    original = PPOLoop.iteration

    def dies_at_0(self, index):  # killed during the first iteration: config.yaml written, no checkpoint yet
        if index == 0:
            raise KeyboardInterrupt
        return original(self, index)

    monkeypatch.setattr(PPOLoop, "iteration", dies_at_0)
    assert main(relative_run("runs/k") + ["--tensorboard"]) == 130
    monkeypatch.setattr(PPOLoop, "iteration", original)
    run_dir = workdir / "runs" / "k"
    assert (run_dir / "config.yaml").is_file() and not (run_dir / "checkpoints" / "latest").exists()
    assert capsys.readouterr().err.splitlines()[-1] == (
        "ppo-rlhf train: interrupted; no checkpoint yet (it starts again from iteration 0); continue with: "
        "ppo-rlhf train --resume runs/k")
    assert len(list((run_dir / "tb").glob("events.*"))) == 1

    assert main(["train", "--resume", "runs/k", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "no checkpoint yet in runs/k: starting from iteration 0" in err.splitlines()
    assert history_length(run_dir) == 2
    assert len(list((run_dir / "tb").glob("events.*"))) == 1  # the first start's step 0 is gone, not shown twice

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


def test_one_train_at_a_time_in_a_run_directory(workdir, capsys):
    """A second process's train, --resume or --overwrite of a run directory in use is one line naming its PID, and
    touches nothing; a lock left by a killed process is taken over; the lock goes when the run ends."""
    run_dir = workdir / "runs" / "r"
    lock = lock_file(run_dir)
    with tiny.locked_by_another_process(run_dir) as other:
        assert main(relative_run("runs/r")) == 2
        assert capsys.readouterr().err == (f"ppo-rlhf train: error: run directory runs/r is in use by process "
                                           f"{other.pid} (lock file {lock}); wait until it ends or stop it\n")
        assert not run_dir.exists()
    assert lock.read_text().strip() == str(other.pid)  # killed with -9: its lock file stays, its flock is gone
    assert main(relative_run("runs/r")) == 0 and history_length(run_dir) == 2
    assert not lock.exists()
    capsys.readouterr()
    with tiny.locked_by_another_process(run_dir) as other:
        for argv in (["train", "--resume", "runs/r", "--iterations", "3"], relative_run("runs/r") + ["--overwrite"]):
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and f"in use by process {other.pid}" in err, err
    assert history_length(run_dir) == 2 and (run_dir / "checkpoints" / "iter_000002").is_dir()


def test_ctrl_c_mid_iteration_checkpoints_the_last_finished_one(workdir, monkeypatch, capsys):
    """checkpoint_every 10: Ctrl-C during iteration 2's update (weights, optimisers, prompt order and RNGs already
    moved on) writes iteration 2's checkpoint as it was when iteration 2 finished, so that the resumed run is the
    uninterrupted one."""
    flags = ["--iterations", "4", "--checkpoint-every", "10"]
    assert main(relative_run("runs/whole") + flags) == 0
    original, updates = PPOLoop.update, []

    def interrupted_in_the_third_update(self, experience, train_policy=True):
        result = original(self, experience, train_policy)
        updates.append(1)
        if len(updates) == 3:
            raise KeyboardInterrupt
        return result

    monkeypatch.setattr(PPOLoop, "update", interrupted_in_the_third_update)
    assert main(relative_run("runs/c") + flags) == 130
    monkeypatch.setattr(PPOLoop, "update", original)
    assert capsys.readouterr().err.splitlines()[-1] == (
        "ppo-rlhf train: interrupted; the latest checkpoint is iter_000002; continue with: ppo-rlhf train --resume "
        "runs/c")
    run_dir = workdir / "runs" / "c"
    assert [p.name for p in sorted((run_dir / "checkpoints").iterdir())] == ["iter_000002", "latest"]
    assert not lock_file(run_dir).exists()
    assert main(["train", "--resume", "runs/c", "--quiet"]) == 0

    def history(run: Path) -> list[dict]:
        rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
        return [{k: v for k, v in row.items() if not k.startswith("time_") and k != "gen_tokens_per_s"} for row in rows]

    assert len(history(run_dir)) == 4 and history(run_dir) == history(workdir / "runs" / "whole")


def test_a_full_disk_while_checkpointing_is_one_line_and_leaves_no_partial_folder(workdir, monkeypatch, capsys):
    import torch

    real_save, saves = torch.save, []

    def second_save_fills_the_disk(obj, handle, *args, **kwargs):
        saves.append(1)
        if len(saves) == 2:
            handle.write(b"PK\x03\x04 half a file")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, handle, *args, **kwargs)

    monkeypatch.setattr(torch, "save", second_save_fills_the_disk)
    assert main(relative_run("runs/full")) == 1
    run_dir = workdir / "runs" / "full"
    assert capsys.readouterr().err.splitlines()[-1] + "\n" == (  # (the line before: the EOS rule's warning)
        "ppo-rlhf train: error: no space left on device writing runs/full/checkpoints/iter_000002; the latest good "
        "checkpoint is iter_000001\n")
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["iter_000001", "latest"]
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".")] and not lock_file(run_dir).exists()
    assert disk_full(RuntimeError("safetensors: IoError(Os { code: 28, message: \"No space left on device\" })"))
    assert not disk_full(RuntimeError("file write failed")) and not disk_full(OSError(errno.EACCES, "denied"))


def test_keep_last_checkpoints_keeps_exactly_that_many(workdir):
    assert main(relative_run("runs/keep") + ["--iterations", "4", "--keep-last-checkpoints", "2"]) == 0
    checkpoints = workdir / "runs" / "keep" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["iter_000003", "iter_000004", "latest"]
    # never the one just written, nor a killed run's later ones (about to be written again)
    for name in ("iter_000001", "iter_000002", "iter_000005"):
        shutil.copytree(checkpoints / "iter_000004", checkpoints / name)
    deleted = prune_checkpoints(checkpoints.parent, 2, 4, ("policy", "value"))
    assert deleted == [checkpoints / "iter_000001", checkpoints / "iter_000002"]
    assert sorted(p.name for p in checkpoints.iterdir()) == ["iter_000003", "iter_000004", "iter_000005", "latest"]
    assert prune_checkpoints(checkpoints.parent, 0, 5, ("policy",)) == []  # 0: keep all


def test_sigterm_mid_iteration_is_ctrl_c_with_exit_143(workdir, monkeypatch, capsys):
    """SIGTERM (a scheduler's preemption) during iteration 2's update keeps what Ctrl-C keeps: iteration 2's checkpoint
    and the line that says how to continue; the exit code is 143; SIGTERM's own handler is back afterwards."""
    original, updates = PPOLoop.update, []

    def terminated_in_the_third_update(self, experience, train_policy=True):
        result = original(self, experience, train_policy)
        updates.append(1)
        if len(updates) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return result

    monkeypatch.setattr(PPOLoop, "update", terminated_in_the_third_update)
    flags = ["--iterations", "4", "--checkpoint-every", "10"]
    assert main(relative_run("runs/t") + flags) == 143
    monkeypatch.setattr(PPOLoop, "update", original)
    assert capsys.readouterr().err.splitlines()[-1] == (
        "ppo-rlhf train: terminated (SIGTERM); the latest checkpoint is iter_000002; continue with: ppo-rlhf train "
        "--resume runs/t")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    run_dir = workdir / "runs" / "t"
    assert [p.name for p in sorted((run_dir / "checkpoints").iterdir())] == ["iter_000002", "latest"]
    assert main(["train", "--resume", "runs/t", "--quiet"]) == 0 and history_length(run_dir) == 4


def test_a_run_that_fails_before_its_first_iteration_can_be_run_again(workdir, capsys):
    """A reward that returns one score for a batch fails during the reward normalisation: nothing was trained, so
    the run leaves no run directory behind and the same command, once the reward is fixed, just works. A folder the
    user made beforehand (empty: a run refuses any other) stays."""
    rewards = workdir / "rewards.py"
    rewards.write_text("def score(completions, **kw):\n    return [1.0]\n")
    argv = ["train", "--policy-model", "models/policy", "--reward-funcs", "rewards.py:score", "--prompts",
            "prompts.jsonl", "--out", "runs/f", *TRAIN_FLAGS]
    assert main(argv) != 0
    assert "returned 1 values for 4 completions" in capsys.readouterr().err
    assert not (workdir / "runs" / "f").exists()
    (workdir / "runs" / "mine").mkdir()
    assert main(argv[:-len(TRAIN_FLAGS) - 1] + ["runs/mine", *TRAIN_FLAGS]) != 0
    assert list((workdir / "runs" / "mine").iterdir()) == []
    rewards.write_text("def score(completions, **kw):\n    return [1.0] * len(completions)\n")
    for name in [name for name in sys.modules if name.startswith("ppo_rlhf_reward_rewards_")]:
        del sys.modules[name]  # as a new process would, import the fixed file
    code = main(argv)
    assert code == 0, capsys.readouterr().err
    assert history_length(workdir / "runs" / "f") == 2
