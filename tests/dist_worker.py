"""One process of tests/test_distributed.py: a fixed global rollout, this rank's rows, score + update; the losses,
the whitened advantages and the trained parameters go to OUT/rank{R}.pt. WORLD_SIZE=1 is the single-process run."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from ppo_rlhf.config import build_config  # noqa: E402
from ppo_rlhf.rollout import generate_rollout  # noqa: E402
from ppo_rlhf.train_config import TrainConfig  # noqa: E402
from ppo_rlhf.trainer import PPOTrainer  # noqa: E402


def main(policy: str, reward: str, prompts: str, out: str) -> None:
    cfg = build_config(TrainConfig, dict(policy_model=policy, reward_model=reward, prompts=prompts, out=out,
                                         batch_size=4, minibatch_size=4, epochs=2, max_new_tokens=5, lora_rank=4,
                                         reward_norm_samples=4, policy_lr=1e-2, value_lr=1e-2, quiet=True,
                                         tensorboard=False, device="cpu"))
    trainer = PPOTrainer(cfg)
    dist = trainer.dist
    # the same global batch everywhere: sampled from the base model with a fixed seed, then this rank's rows
    torch.manual_seed(0)
    with trainer.policy.disable_adapter():
        texts = ["Tell me a story", "Hello! How are you?", "Once upon a time", "This is terrible"]
        full = generate_rollout(trainer.policy, trainer.tokenizer, texts, cfg.max_new_tokens, cfg.temperature)
    rollout = full.select(dist.shard(list(range(4))))
    trainer.reward_mean, trainer.reward_std = 0.1, 2.0
    batch = trainer.score(rollout)
    torch.manual_seed(1)
    stats = trainer.update(rollout, batch)
    params = {name: p.detach().clone() for model in trainer.models.values() for name, p in model.named_parameters()
              if p.requires_grad}
    scores = dist.gather_1d(batch.scores)
    torch.save({"stats": stats, "params": params, "advantages": batch.advantages, "act": batch.action_mask,
                "scores": scores, "rows": dist.shard(list(range(4)))}, Path(out) / f"rank{dist.rank}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:5])
