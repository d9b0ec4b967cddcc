"""Padded against packed (`padding_free`) scoring and update passes on one fixed SmolLM2 rollout, alternating in one
process (ABBA), so that the replies, and so the padding, are the same on both sides; min and median of each.

    .venv/bin/python bench/padding_free_passes.py --alternations 6

Scoring: `PPOLoop.score` of the batch (log pi_old, reference, values, reward scores); step: one
`minibatch_step` (forward + backward of the policy and value losses) over 8 of the 16 rows, its gradients
discarded. The rollout: the first seed whose 16 replies to bench/common.py's prompts average 36-41 tokens (the
mean bench/padding_share.py measured at cap 48 is 38.7). Timing a pass rather than an iteration (bench/ab.py) leaves
out generation, whose replies differ from iteration to iteration.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts OpenMP (see bench/HISTORY.md)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alternations", type=int, default=6, help="pairs of (padded, packed) passes, order ABBA")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()
    import torch
    from common import PROMPTS, prepare_model

    from ppo_rlhf.config import build_config
    from ppo_rlhf.ppo.train_config import TrainConfig
    from ppo_rlhf.ppo.trainer import PPOLoop

    path = prepare_model("smollm2")
    work = Path(tempfile.mkdtemp(prefix="padding_free_"))
    (work / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    cfg = build_config(TrainConfig, dict(policy_model=path, reward_model=path, prompts=str(work / "prompts.jsonl"),
                                         init_score_head=True,  # the policy as reward model: a speed comparison
                                         out=str(work / "run"), batch_size=16, minibatch_size=8,
                                         max_new_tokens=args.max_new_tokens, tensorboard=False, quiet=True,
                                         device="cpu", dtype=args.dtype))
    trainer = PPOLoop(cfg)
    trainer.reward_mean, trainer.reward_std = 0.0, 1.0
    for seed in range(1, 8):
        torch.manual_seed(seed)
        rollout = trainer.rollout(PROMPTS)
        if 36 <= float(rollout.reply_lengths.float().mean()) <= 41:
            break
    print("reply lengths", rollout.reply_lengths.tolist(), flush=True)

    def use(packed: bool) -> None:  # the actor reads its config at every call; the critic keeps its own flag
        trainer.cfg.padding_free = trainer.reward_model.padding_free = packed

    use(False)
    experience = trainer.score(rollout)
    minibatch = torch.randperm(16).tolist()[:8]
    times = {label: {"score": [], "step": []} for label in ("padded", "packed")}
    for i in range(args.alternations):
        for label in (("padded", "packed") if i % 2 == 0 else ("packed", "padded")):
            use(label == "packed")
            start = time.perf_counter()
            trainer.score(rollout)
            times[label]["score"].append(time.perf_counter() - start)
            trainer.set_training(True)
            start = time.perf_counter()
            trainer.minibatch_step(experience, minibatch, trainer.roles)
            times[label]["step"].append(time.perf_counter() - start)
            for role in trainer.roles.values():
                role.step.discard()
            trainer.set_training(False)
            print(label, {k: round(v[-1], 2) for k, v in times[label].items()}, flush=True)
    for key in ("score", "step"):
        padded, packed = times["padded"][key], times["packed"][key]
        print(f"{key}: padded min {min(padded):.2f} median {statistics.median(padded):.2f} s, packed min "
              f"{min(packed):.2f} median {statistics.median(packed):.2f} s; packed/padded: mins "
              f"{min(packed) / min(padded):.3f}, medians {statistics.median(packed) / statistics.median(padded):.3f}")


if __name__ == "__main__":
    main()
