"""Numerical faults: a reward scorer that returns NaN, an injected inf gradient, a NaN loss: the step is skipped and
logged, the weights do not move, and too many in a row stop the run with its last checkpoint intact."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ppo_rlhf.config import build_config
from ppo_rlhf.ppo.scoring import Scoring
from ppo_rlhf.ppo.train_config import TrainConfig
from ppo_rlhf.ppo.trainer import PPOLoop
from ppo_rlhf.train import train

from reliability import expect_usage_error, flags, read_history, small, survival


def adapters(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    found = {}
    for name in ("policy", "value"):
        found |= {f"{name}.{k}": v for k, v in load_file(folder / name / "adapter_model.safetensors").items()}
    return found


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def nan_scores(monkeypatch):
    """Make the reward model return NaN during the iterations in the returned set (not while measuring the norm)."""
    poisoned: set[int] = set()
    raw, iteration = Scoring.raw_scores, PPOLoop.iteration

    def scores(self, rollout):
        result = raw(self, rollout)
        return torch.full_like(result, float("nan")) if getattr(self, "_poisoned", False) else result

    def one_iteration(self, index):
        self.scoring._poisoned = index in poisoned
        try:
            return iteration(self, index)
        finally:
            self.scoring._poisoned = False

    monkeypatch.setattr(Scoring, "raw_scores", scores)
    monkeypatch.setattr(PPOLoop, "iteration", one_iteration)
    return poisoned


def test_nan_reward_batch_is_skipped_and_the_run_continues(env, tmp_path, nan_scores):
    from ppo_rlhf.ppo.dashboard import dashboard_line

    with survival("numerical faults"):
        nan_scores.add(1)  # (eos_rule off: it would replace the NaN score of an unfinished reply by a fixed one)
        cfg = build_config(TrainConfig, small(env, tmp_path / "run", iterations=4, epochs=2, eos_rule=False))
        run = train(cfg)
        history = read_history(run)
        assert [row["iteration"] for row in history] == [0, 1, 2, 3]
        assert [row["skipped_steps"] for row in history] == [0, 4, 0, 0]  # 2 epochs x 2 minibatches skipped
        assert "skipped 4" in dashboard_line(history[1]) and "skipped" not in dashboard_line(history[0])
        ckpt = run / "checkpoints"
        assert same(adapters(ckpt / "iter_000001"), adapters(ckpt / "iter_000002")), "a NaN batch moved the weights"
        assert not same(adapters(ckpt / "iter_000002"), adapters(ckpt / "iter_000003")), "training stopped moving"


def test_always_nan_stops_with_the_last_good_checkpoint(env, tmp_path, nan_scores):
    from ppo_rlhf.ppo.checkpoint import latest_checkpoint, load_checkpoint

    with survival("numerical faults"):
        nan_scores.update(range(1, 10))
        out = tmp_path / "run"
        text = expect_usage_error(["train", *flags(small(env, out, iterations=6, max_skipped_steps=2, eos_rule=False))],
                                  "consecutive")
        assert "iter_000002" in text
        assert [row["iteration"] for row in read_history(out)] == [0, 1]  # every finished iteration is logged
        latest = latest_checkpoint(out, ("policy", "value"))
        pointer = (out / "checkpoints" / "latest").read_text().strip()
        assert latest is not None and latest.name == pointer == "iter_000002"
        assert same(adapters(out / "checkpoints" / "iter_000001"), adapters(latest))
        trainer = PPOLoop(build_config(TrainConfig, small(env, out)))
        iteration, state, history = load_checkpoint(latest, ("policy", "value"))
        trainer.load_state_dict(state)
        assert iteration == 2 and len(history) == 2


def test_inf_gradient_and_nan_loss_never_reach_the_weights(env, tmp_path, monkeypatch):
    cfg = build_config(TrainConfig, small(env, tmp_path / "run", epochs=2, max_skipped_steps=100))
    trainer = PPOLoop(cfg)
    params = {f"policy.{n}": p for n, p in trainer.policy.named_parameters() if p.requires_grad}
    params |= {f"value.{n}": p for n, p in trainer.value_model.named_parameters() if p.requires_grad}

    def snapshot():
        return {n: p.detach().clone() for n, p in params.items()}

    lora = next(p for n, p in params.items() if "lora_B" in n and n.startswith("policy."))
    with survival("numerical faults"):  # an inf gradient on one LoRA matrix
        before = snapshot()
        handle = lora.register_hook(lambda grad: torch.full_like(grad, float("inf")))
        stats, _ = trainer.iteration(0)
        handle.remove()
        assert stats["skipped_steps"] == 4 and trainer.consecutive_skips == 4
        assert same(before, snapshot()) and not trainer.policy_optimizer.state and not trainer.value_optimizer.state

    with survival("numerical faults"):  # a NaN policy loss (the trainer's own method, so the patch surely applies)
        policy_loss = trainer.policy_loss

        def nan_loss(*args, **kwargs):
            loss, numbers = policy_loss(*args, **kwargs)
            return loss * float("nan"), {**numbers, "pg_loss": float("nan")}

        monkeypatch.setattr(trainer, "policy_loss", nan_loss)
        stats, _ = trainer.iteration(1)
        monkeypatch.undo()
        assert stats["skipped_steps"] == 4 and same(before, snapshot())

    stats, _ = trainer.iteration(2)  # and a healthy step moves the weights again
    assert stats["skipped_steps"] == 0 and trainer.consecutive_skips == 0 and not same(before, snapshot())
