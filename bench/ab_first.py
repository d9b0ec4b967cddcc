"""Before/after of one change, in one process, alternating: the LM head over prompt positions (before) or not (after).

    .venv/bin/python bench/ab_first.py --batch 8 --minibatch 4 --max-new-tokens 24 --pairs 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts OpenMP (see bench/README.md)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--minibatch", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    from peer_trl import PROMPTS, prepare_model

    import ppo_rlhf.rollout as rollout_module
    from ppo_rlhf.config import build_config
    from ppo_rlhf.train_config import TrainConfig
    from ppo_rlhf.trainer import PPOTrainer

    path = prepare_model("smollm2")
    work = Path(tempfile.mkdtemp(prefix="ab_"))
    (work / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    cfg = build_config(TrainConfig, dict(policy_model=path, reward_model=path, prompts=str(work / "prompts.jsonl"),
                                         out=str(work / "run"), batch_size=args.batch, minibatch_size=args.minibatch,
                                         max_new_tokens=args.max_new_tokens, tensorboard=False, quiet=True, device="cpu"))
    trainer = PPOTrainer(cfg)
    real = rollout_module.first_reply_position
    trainer.iteration(0)  # warm-up
    seen = {"before": [], "after": []}
    for i in range(args.pairs):
        for label in (("before", "after") if i % 2 == 0 else ("after", "before")):
            rollout_module.first_reply_position = (lambda ids: 0) if label == "before" else real
            stats, _, _ = trainer.iteration(1 + len(seen["before"]) + len(seen["after"]))
            seen[label].append({k: round(stats[f"time_{k}"], 2) for k in ("gen", "score", "update", "total")})
            print(label, seen[label][-1], "len", stats["len"], flush=True)
    for label, rows in seen.items():
        print(label, "mean", {k: round(sum(r[k] for r in rows) / len(rows), 2) for k in rows[0]})


if __name__ == "__main__":
    main()
