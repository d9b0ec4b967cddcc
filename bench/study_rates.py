"""Per-stage rates of the offline study (`ppo-rlhf demo`) on this machine, at small size, to size its presets.

Measures, for the real SmolLM2 in the given dtype: sampling (replies of up to --cap tokens, --batch at once, the
pairs and evaluation stages' work) in replies/s, and one reward-model training step (--rm-batch pairs, forward and
backward) in pairs/s plus a held-out scoring pass in pairs/s. The PPO iteration's time comes from
`ppo-rlhf train` itself (its dashboard's time_total); bench/README.md turns the rates into the preset's minutes.

    .venv/bin/python bench/study_rates.py --dtype bfloat16 --batch 16 --cap 64
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--batch", type=int, default=16, help="replies sampled at once")
    parser.add_argument("--cap", type=int, default=64, help="reply cap in tokens")
    parser.add_argument("--rm-batch", type=int, default=8, help="pairs per reward-model step")
    args = parser.parse_args()

    from ppo_rlhf.models import LoraSettings, add_value_lora, load_causal_lm, load_sequence_classifier, load_tokenizer
    from ppo_rlhf.reward_model import pair_scores
    from ppo_rlhf.rollout import generate_rollout

    dtype = getattr(torch, args.dtype)
    tokenizer = load_tokenizer("smollm2")
    policy = load_causal_lm("smollm2", dtype)
    prompts = [f"Write one sentence about topic number {i} and the weather." for i in range(args.batch)]
    torch.manual_seed(0)
    start = time.perf_counter()
    rollout = generate_rollout(policy, tokenizer, prompts, args.cap, 0.7, args.batch)
    seconds = time.perf_counter() - start
    tokens = int(rollout.reply_lengths.sum())
    print(f"sampling: {args.batch} replies, {tokens} tokens in {seconds:.1f}s = {args.batch / seconds:.2f} replies/s "
          f"(mean {tokens / args.batch:.0f} tokens, {rollout.finished.float().mean():.2f} finished)")
    del policy

    model = add_value_lora(load_sequence_classifier("smollm2", dtype, init_score_head=True),  # a random head: speed
                           LoraSettings(rank=16, alpha=32.0))
    pairs = [{"prompt": p, "chosen": t, "rejected": t[: len(t) // 2] or "No."}
             for p, t in zip(prompts, rollout.reply_texts)][: args.rm_batch]
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, fused=True)
    for label in ("warm-up", "timed"):
        start = time.perf_counter()
        chosen, rejected, _ = pair_scores(model, tokenizer, pairs)
        loss = -F.logsigmoid(chosen - rejected).float().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seconds = time.perf_counter() - start
        if label == "timed":
            print(f"reward-model step: {len(pairs)} pairs in {seconds:.2f}s = {len(pairs) / seconds:.1f} pairs/s")
    with torch.no_grad():
        start = time.perf_counter()
        pair_scores(model, tokenizer, pairs)
        seconds = time.perf_counter() - start
    print(f"reward-model scoring: {len(pairs)} pairs in {seconds:.2f}s = {len(pairs) / seconds:.1f} pairs/s")


if __name__ == "__main__":
    main()
