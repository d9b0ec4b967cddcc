"""`--threads N` reaches torch in every command that trains or samples: torch runs its operations on N threads when
the command's work starts (set before torch loads, OMP_NUM_THREADS, or on a loaded torch)."""

from __future__ import annotations

import pytest
import torch

import ppo_rlhf.study.compare
import ppo_rlhf.study.demo
import ppo_rlhf.study.evaluate
import ppo_rlhf.study.pairs
import ppo_rlhf.study.prompts
import ppo_rlhf.study.reward_model
import ppo_rlhf.tasks.evaluate
from ppo_rlhf.cli import main


class Started(Exception):
    """The command's work began: with torch on `threads` threads."""

    def __init__(self, threads: int):
        super().__init__(threads)
        self.threads = threads


def started(*args, **kwargs):
    raise Started(torch.get_num_threads())


@pytest.mark.parametrize("argv, module, work", [
    (["demo", "--quick"], ppo_rlhf.study.demo, "demo"),
    (["evaluate", "RUN", "--prompts", "p.jsonl", "--out", "e"], ppo_rlhf.study.evaluate, "evaluate_runs"),
    (["task", "evaluate", "RUN", "--level", "add-tiny", "--out", "e"], ppo_rlhf.tasks.evaluate, "evaluate_task_runs"),
    (["compare"], ppo_rlhf.study.compare, "compare"),
    (["prompts", "--out", "p"], ppo_rlhf.study.prompts, "build_prompts"),
    (["pairs", "--prompts", "p.jsonl", "--out", "p.jsonl"], ppo_rlhf.study.pairs, "make_pairs"),
    (["reward-model", "train", "--pairs", "p.jsonl", "--out", "rm"], ppo_rlhf.study.reward_model,
     "train_reward_model"),
])
def test_threads_reach_torch_in_every_command_that_trains_or_samples(argv, module, work, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(module, work, started)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    wanted = before + 1  # (not torch's default, whatever that is here)
    try:
        with pytest.raises(Started) as begun:
            main([*argv, "--threads", str(wanted)])
        assert begun.value.threads == wanted
    finally:
        torch.set_num_threads(before)
