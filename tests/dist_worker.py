"""One process of tests/parallel/test_distributed.py: a fixed global rollout, this rank's rows, score + update, a
checkpoint written, one more update (weights and moments move on), the checkpoint read back, and an update from it;
the losses, the whitened advantages, the trained parameters (after the first update and after the resumed one) and
whether the checkpoint restored weights and moments go to OUT/rank{R}.pt. WORLD_SIZE=1 is the single-process run."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from ppo_rlhf.config import build_config  # noqa: E402
from ppo_rlhf.models.rollout import generate_rollout  # noqa: E402
from ppo_rlhf.parallel.distributed import is_sharded  # noqa: E402
from ppo_rlhf.ppo.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint  # noqa: E402
from ppo_rlhf.ppo.train_config import TrainConfig  # noqa: E402
from ppo_rlhf.ppo.trainer import PPOLoop  # noqa: E402


def main(policy: str, reward: str, prompts: str, out: str) -> None:
    cfg = build_config(TrainConfig, dict(policy_model=policy, reward_model=reward, prompts=prompts, out=out,
                                         batch_size=4, minibatch_size=4, epochs=2, max_new_tokens=5, lora_rank=4,
                                         reward_norm_samples=4, policy_lr=1e-2, value_lr=1e-2, quiet=True,
                                         tensorboard=False, device="cpu", dtype="float32"))
    trainer = PPOLoop(cfg)
    dist = trainer.dist
    # the same global batch everywhere: sampled from the base model with a fixed seed, then this rank's rows
    torch.manual_seed(0)
    with trainer.policy.disable_adapter():
        texts = ["Tell me a story", "Hello! How are you?", "Once upon a time", "This is terrible"]
        full = generate_rollout(trainer.policy, trainer.tokenizer, texts, cfg.max_new_tokens, cfg.temperature)
    rollout = full.select(dist.shard(list(range(4))))
    trainer.reward_mean, trainer.reward_std = 0.1, 2.0
    batch = trainer.score(rollout)
    # over the global batch, which is also its baseline (no normalisation)
    monitor = trainer.scoring.monitor_stats(0, batch)
    monitor["baseline"] = trainer.scoring.monitor.state_dict()["baseline"]
    torch.manual_seed(1)
    stats = trainer.update(batch)
    trained = trained_parameters(trainer)
    params = dist.full_tensors({name: p.detach().clone() for name, p in trained.items()})  # FSDP: the shards gathered
    sharded = sum(is_sharded(p) for model in trainer.models.values() for p in model.parameters())
    scores = dist.gather_1d(batch.scores)

    # a checkpoint round trip: gathered and written by rank 0; the run moves on, then reads it back (into this
    # process's shards or partitions) and continues from it
    state = trainer.state_dict()
    if dist.is_main:
        save_checkpoint(Path(out), 1, trainer.models, state, [])
    dist.barrier()
    saved_moments = copy.deepcopy(state["optimizers"])  # (one process: views of the live moments)
    trainer.update(batch)
    trainer.load_state_dict(load_checkpoint(latest_checkpoint(Path(out)), tuple(trainer.models))[1])
    reloaded = dist.full_tensors({name: p.detach() for name, p in trained.items()})
    moments = {name: role.step.state_dict() for name, role in trainer.roles.items()}
    restored = all(torch.equal(reloaded[k], params[k]) for k in params) and same(moments, saved_moments)
    torch.manual_seed(2)
    trainer.update(batch)
    resumed = dist.full_tensors({name: p.detach().clone() for name, p in trained.items()})
    skip = skipped_update_leaves_everything(trainer, batch)
    ent = trainer.batch_stats(batch)["ent"]  # a mean over every process's reply tokens
    torch.save({"stats": stats, "params": params, "advantages": batch.advantages, "act": batch.action_mask,
                "scores": scores, "sharded": sharded, "restored": restored, "resumed": resumed,
                "zero": [sorted(s) for s in state["optimizers"].values()] if dist.zero_stage else None,
                "skip": skip, "ent": ent, "monitor": monitor,
                "rows": dist.shard(list(range(4)))}, Path(out) / f"rank{dist.rank}.pt")


def skipped_update_leaves_everything(trainer, batch) -> dict:
    """An inf in one gradient of the value model only (its head copy, whole under every layout): every step of the
    update is skipped, and neither model's weights nor optimiser state moves (issue 13, item 15)."""
    dist = trainer.dist
    trained = trained_parameters(trainer)
    head = next(p for name, p in trainer.value_model.named_parameters() if p.requires_grad and "score" in name)
    before = dist.full_tensors({name: p.detach().clone() for name, p in trained.items()})
    moments = copy.deepcopy({name: role.step.state_dict() for name, role in trainer.roles.items()})
    handle = head.register_hook(lambda grad: torch.full_like(grad, float("inf")))
    stats = trainer.update(batch)
    handle.remove()
    after = dist.full_tensors({name: p.detach().clone() for name, p in trained.items()})
    return {"skipped": stats["skipped_steps"], "weights": same(before, after),
            "moments": same(moments, {name: role.step.state_dict() for name, role in trainer.roles.items()})}


def trained_parameters(trainer) -> dict[str, torch.Tensor]:
    """Every trained parameter under "role.name": policy and value LoRA share parameter names."""
    return {f"{role}.{name}": p for role, model in trainer.models.items() for name, p in model.named_parameters()
            if p.requires_grad}


def same(a, b) -> bool:
    """Nested dicts / lists of tensors and plain values, equal exactly."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


if __name__ == "__main__":
    main(*sys.argv[1:5])
