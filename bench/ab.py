"""Before/after of one change, in one process, alternating iterations (noise on a shared machine hits both alike).

    .venv/bin/python bench/ab.py --change frozen-head --batch 8 --minibatch 4 --max-new-tokens 24 --pairs 2

Changes (before -> after):
  first         the LM head over every position -> skipped over positions that are prompt in every row
  frozen-head   checkpointed LM-head chunks in training -> FrozenHeadLogprobs (the head's gradient formed in forward)
  old-logprobs  old_logprobs: recompute (one more policy forward) -> generation (recorded by generate)
  score-batch   scoring passes of micro_batch_size rows -> of the whole batch (score_batch_size = batch_size)
  half-lora     LoRA products in fp32 (PEFT casts bf16 activations) -> in bf16 from fp32 factors (bfloat16 only)
  padding-free  scoring and update passes over right-padded rows -> over the real tokens packed (padding_free)

Last run (bench/HISTORY.md, eighth session), 2026-12-04 ~02:35 UTC, SmolLM2, quiet machine:

    .venv/bin/python bench/ab.py --change half-lora --dtype bfloat16 --batch 16 --minibatch 8 \
        --max-new-tokens 48 --pairs 2

    before (fp32 products) / after (bf16 products): generation 10.44 / 8.77 s (0.84), scoring 8.38 / 7.25 s (0.87),
    update 26.79 / 19.18 s (0.72), iteration 45.60 / 35.19 s (0.77); replies 42.6 / 39.8 tokens
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts OpenMP (see bench/HISTORY.md)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def switch(trainer, change: str, after: bool, originals: dict) -> None:
    """Put the trainer in the before (after=False) or after state of `change`."""
    import ppo_rlhf.models.logprobs as logprobs_module
    import ppo_rlhf.ppo.trainer as trainer_module
    from ppo_rlhf.models.precision import half_lora_products

    if change == "first":  # patched where it is called: the trainer imported it by name
        trainer_module.first_reply_position = originals["first"] if after else (lambda prompt_ids: 0)
        assert trainer_module.first_reply_position is not logprobs_module.first_reply_position or after
    elif change == "frozen-head":  # token_logprobs looks it up in its own module at every call
        logprobs_module._frozen_plain_head = originals["frozen"] if after else (lambda head: False)
    elif change == "half-lora":
        for model in (trainer.policy, trainer.value_model):
            half_lora_products(model, enabled=after)
    elif change == "padding-free":  # the actor reads its config at every call; the critic keeps its own flag
        trainer.cfg.padding_free = trainer.reward_model.padding_free = after
    elif change == "score-batch":
        trainer.cfg.score_batch_size = trainer.cfg.batch_size if after else 0
    else:
        trainer.cfg.old_logprobs = "generation" if after else "recompute"
        trainer.generator.record_logprobs = after


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--change", required=True,
                        choices=["first", "frozen-head", "old-logprobs", "score-batch", "half-lora", "padding-free"])
    parser.add_argument("--model", default="smollm2", help="smollm2 or qwen-shape (bench/peer_trl.py)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--minibatch", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="float32: bench/HISTORY.md's measurements before bf16 weights; half-lora needs bfloat16")
    args = parser.parse_args()
    if args.change == "half-lora" and args.dtype != "bfloat16":
        parser.error("--change half-lora compares bf16 paths: add --dtype bfloat16")
    from common import PROMPTS, prepare_model

    import ppo_rlhf.models.logprobs as logprobs_module
    from ppo_rlhf.config import build_config
    from ppo_rlhf.ppo.train_config import TrainConfig
    from ppo_rlhf.ppo.trainer import PPOLoop

    path = prepare_model(args.model)
    work = Path(tempfile.mkdtemp(prefix="ab_"))
    (work / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    cfg = build_config(TrainConfig, dict(policy_model=path, reward_model=path, prompts=str(work / "prompts.jsonl"),
                                         out=str(work / "run"), batch_size=args.batch, minibatch_size=args.minibatch,
                                         max_new_tokens=args.max_new_tokens, tensorboard=False, quiet=True,
                                         device="cpu", dtype=args.dtype, init_score_head=True))  # speed only
    trainer = PPOLoop(cfg)
    trainer.reward_mean, trainer.reward_std = 0.0, 1.0
    originals = {"first": logprobs_module.first_reply_position, "frozen": logprobs_module._frozen_plain_head}
    trainer.iteration(0)  # warm-up
    seen = {"before": [], "after": []}
    for i in range(args.pairs):
        for label in (("before", "after") if i % 2 == 0 else ("after", "before")):
            switch(trainer, args.change, label == "after", originals)
            stats, _ = trainer.iteration(1 + len(seen["before"]) + len(seen["after"]))
            seen[label].append({k: round(stats[f"time_{k}"], 2) for k in ("gen", "score", "update", "total")})
            print(label, seen[label][-1], "len", stats["len"], flush=True)
    means = {label: {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]} for label, rows in seen.items()}
    for label, mean in means.items():
        print(label, "mean", {k: round(v, 2) for k, v in mean.items()})
    print("after/before", {k: round(means["after"][k] / means["before"][k], 3) for k in means["after"]})


if __name__ == "__main__":
    main()
