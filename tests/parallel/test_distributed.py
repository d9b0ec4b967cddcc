"""Data parallel over 2 CPU processes (gloo) equals one process on the same global batch; so do its checkpoints."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ppo_rlhf.parallel.distributed import Dist
from ppo_rlhf.ppo.advantages import masked_whiten_over
from ppo_rlhf.ppo.objectives import masked_whiten

import tiny

WORKER = Path(__file__).parents[1] / "dist_worker.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world: int, args: list[str], program: list[str] | None = None, **extra_env: str) -> None:
    """`world` processes of python PROGRAM ARGS (default dist_worker.py), ranked as torchrun ranks them."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, **extra_env, "WORLD_SIZE": str(world), "RANK": str(rank), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "CUDA_VISIBLE_DEVICES": ""}
        procs.append(subprocess.Popen([sys.executable, *(program or [str(WORKER)]), *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for proc in procs:
        output, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, output[-3000:]


def test_shard_is_contiguous_and_even():
    assert Dist(1, 2).shard([0, 1, 2, 3]) == [2, 3] and Dist().shard([5, 6, 7]) == [5, 6, 7]
    with pytest.raises(Exception, match="split evenly"):
        Dist(0, 2).shard([1, 2, 3])


LAUNCH = {"ddp": {}, "fsdp": {"ACCELERATE_USE_FSDP": "true"},
          "deepspeed": {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"}}


@pytest.mark.parametrize("sharding", ["ddp", "fsdp", "deepspeed"])
def test_two_processes_equal_one(tmp_path, tokenizer, sharding):
    """Whole models on every process (DDP's layout), every decoder layer sharded over the two (FSDP2), or the
    optimiser state and gradients partitioned by DeepSpeed ZeRO-2."""
    inputs = worker_inputs(tmp_path, tokenizer)
    single, double = tmp_path / "single", tmp_path / "double"
    single.mkdir(), double.mkdir()
    launch(1, [*inputs, str(single)])
    launch(2, [*inputs, str(double)], **LAUNCH[sharding])
    assert_same_steps_as_one(single, double, sharding)


def worker_inputs(tmp_path: Path, tokenizer) -> list[str]:
    """dist_worker.py's model and prompt arguments: a tiny policy, reward model and four prompts."""
    policy = tiny.save_tiny(tiny.tiny_causal_lm(tokenizer, initializer_range=0.3), tokenizer, tmp_path / "policy")
    reward = tiny.save_tiny(tiny.tiny_reward_model(tokenizer), tokenizer, tmp_path / "reward")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["a", "b", "c", "d"]))
    return [str(policy), str(reward), str(prompts)]


def assert_same_steps_as_one(single: Path, double: Path, sharding: str = "ddp") -> None:
    """The two processes' results (rank0.pt, rank1.pt in `double`) against the single process's (`single`)."""
    one = torch.load(single / "rank0.pt", weights_only=True)
    ranks = [torch.load(double / f"rank{r}.pt", weights_only=True) for r in range(2)]

    # advantages whitened over the global batch: each rank's rows equal the single process's rows
    for part in ranks:
        rows, width = part["rows"], part["act"].shape[1]
        mask = part["act"].bool()
        assert torch.allclose(part["advantages"][mask], one["advantages"][rows, :width][mask], atol=1e-5)
    assert torch.allclose(ranks[0]["scores"], one["scores"], atol=1e-6)  # gathered in rank order
    # the same losses (all-reduced) and the same parameters after 2 epochs of updates, on every rank
    for key in ("pg_loss", "v_loss", "clipfrac", "approx_kl", "grad_norm_policy", "grad_norm_value"):
        for part in ranks:
            assert part["stats"][key] == pytest.approx(one["stats"][key], rel=1e-4, abs=1e-6), key
    # Adam divides each gradient element by its own size, so the float-order difference of a near-zero element
    # (one process sums the rows, two all-reduce them) moves its weight by a sliver of a step: 1/100 of lr 1e-2
    step_tolerance = 1e-4
    for name, value in one["params"].items():
        for part in ranks:
            assert torch.allclose(part["params"][name], value, atol=step_tolerance), name
    assert one["stats"]["grad_norm_policy"] > 0
    # the checkpoint holds whole tensors (the single process's), and reading it back restored weights and moments
    from safetensors.torch import load_file

    saved = load_file(double / "checkpoints" / "iter_000001" / "policy" / "adapter_model.safetensors")
    reference = load_file(single / "checkpoints" / "iter_000001" / "policy" / "adapter_model.safetensors")
    assert saved.keys() == reference.keys()
    assert all(torch.allclose(saved[k], reference[k], atol=step_tolerance) for k in saved)
    assert one["restored"] and all(part["restored"] for part in ranks)
    # resumed from that checkpoint after the weights and moments had moved on: the same next step as one process
    for name, value in one["resumed"].items():
        assert not torch.allclose(value, one["params"][name]), name
        for part in ranks:
            assert torch.allclose(part["resumed"][name], value, atol=step_tolerance), name
    # FSDP: the layers' weights (frozen and LoRA) really are split between the processes
    assert all((part["sharded"] > 0) == (sharding == "fsdp") for part in ranks) and one["sharded"] == 0
    # DeepSpeed: the optimisers really ran in ZeRO engines, and the checkpoint holds their partitions
    assert all((part["zero"] == [["ranks", "zero_stage"]] * 2) == (sharding == "deepspeed") for part in ranks)
    # the entropy on the dashboard is the mean over all reply tokens (the processes' token counts differ)
    assert all(part["ent"] == pytest.approx(one["ent"], rel=1e-5) for part in ranks)
    # the reward-hacking monitor sees the global batch: all four replies in its baseline, the same correlation
    baseline = one["monitor"]["baseline"]
    assert baseline["count"] == 4 and baseline["mean_length"] == float(one["act"].sum()) / 4
    for part in ranks:
        got = part["monitor"]["baseline"]
        keys = ("mean_reward", "reward_variance", "count")
        assert [got[key] for key in keys] == pytest.approx([baseline[key] for key in keys], rel=1e-5)
        # (None when every reply has one length, as these 5-token replies at the cap do)
        for ours, theirs in ((got["slope"], baseline["slope"]),
                             (part["monitor"]["reward_length_corr"], one["monitor"]["reward_length_corr"])):
            assert ours is theirs is None or ours == pytest.approx(theirs, rel=1e-5)
    # an inf in the value model's gradient alone: every step skipped, neither model nor optimiser state moved
    for part in [one, *ranks]:
        assert part["skip"] == {"skipped": 2, "weights": True, "moments": True}, part["skip"]


EPISODES = '''
import json, os


class Stops:
    """Ends an episode when a reply has an even length; logs (its index in this process, turn, done) per step."""
    made = 0

    def __init__(self):
        self.index, self.turns, Stops.made = Stops.made, 0, Stops.made + 1

    def reset(self, prompt, **row):
        return None

    def step(self, text):
        self.turns += 1
        with open(os.environ["EPISODE_LOG"] + os.environ["RANK"], "a") as log:
            log.write(json.dumps([self.index, self.turns]) + "\\n")
        return "Go on.", None, len(text) % 2 == 0


def length(completions, **columns):
    return [len(c) / 10 for c in completions]
'''


def test_multi_turn_episodes_under_ddp_report_the_global_batch(tmp_path, tokenizer):
    """Two processes, each with its own episodes of different lengths (no collective waits on another's turns): the
    run ends, and the dashboard's turns per episode is the mean over both processes' episodes of the iteration."""
    policy, _, prompts = worker_inputs(tmp_path, tokenizer)
    (tmp_path / "episodes.py").write_text(EPISODES)
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({
        "policy_model": policy, "prompts": prompts, "out": str(tmp_path / "run"), "iterations": 1, "batch_size": 4,
        "minibatch_size": 4, "epochs": 1, "max_new_tokens": 5, "max_turns": 3, "max_episode_tokens": 60,
        "reward_norm_samples": 4, "lora_rank": 4, "quiet": True, "tensorboard": False, "device": "cpu",
        "dtype": "float32", "environment": f"{tmp_path / 'episodes.py'}:Stops",
        "reward_funcs": [f"{tmp_path / 'episodes.py'}:length"]}))
    launch(2, ["train", "--config", str(config)], ["-m", "ppo_rlhf"], EPISODE_LOG=str(tmp_path / "log"))
    turns = []
    for rank in range(2):
        steps = [json.loads(line) for line in (tmp_path / f"log{rank}").read_text().splitlines()]
        episodes = sorted({index for index, _ in steps})
        assert len(episodes) == 4  # 2 for the reward normalisation, then this process's 2 of the iteration's 4
        turns += [max(turn for index, turn in steps if index == i) for i in episodes[-2:]]
    row = json.loads((tmp_path / "run" / "history.jsonl").read_text())
    assert row["turns"] == pytest.approx(sum(turns) / 4) and 0 < row["masked_share"] < 1


@pytest.mark.parametrize("env, message", [
    ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}, "ZeRO stage 3 is not supported"),
    ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_USE_FSDP": "true"}, "FSDP or DeepSpeed, not both"),
])
def test_unsupported_launches_are_refused_in_one_line(monkeypatch, env, message):
    from ppo_rlhf.errors import UsageError
    from ppo_rlhf.parallel import distributed

    monkeypatch.setenv("WORLD_SIZE", "2")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(distributed, "_CURRENT", None)  # forget the cached group; restored after the test
    with pytest.raises(UsageError, match=message):
        distributed.current()


def test_global_whitening_over_two_processes_is_whitening_of_the_whole_batch():
    """Two processes, each holding one row of the batch, whiten with the statistics of both (their sums all-reduced):
    the same numbers as one process whitening the whole batch. Simulated with two threads whose `sum` is an
    all-reduce over a shared board; one process alone takes masked_whiten's own path."""
    import threading

    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    barrier, board = threading.Barrier(2), {}

    class TwoProcesses:
        world_size = 2

        def __init__(self, rank: int):
            self.rank, self.calls = rank, 0

        def sum(self, value: float) -> float:
            call, self.calls = self.calls, self.calls + 1
            board.setdefault(call, [0.0, 0.0])[self.rank] = value
            barrier.wait()
            return sum(board[call])

    shards: dict[int, torch.Tensor] = {}

    def process(rank: int) -> None:
        shards[rank] = masked_whiten_over(TwoProcesses(rank), x[rank:rank + 1], mask[rank:rank + 1])

    threads = [threading.Thread(target=process, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    whole = masked_whiten(x, mask)
    assert torch.allclose(torch.cat([shards[0], shards[1]]) * mask, whole * mask, atol=1e-6)
    # each shard alone would whiten by its own statistics, which differ: the all-reduce is what makes them agree
    assert not torch.allclose(masked_whiten(x[:1], mask[:1]) * mask[:1], whole[:1] * mask[:1], atol=1e-3)
    assert torch.equal(masked_whiten_over(Dist(), x, mask), masked_whiten(x, mask))
