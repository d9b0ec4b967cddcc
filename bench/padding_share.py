"""The share of padded positions in each phase of one PPO iteration: counted from real reply lengths, not timed.

    .venv/bin/python bench/padding_share.py                  # SmolLM2 replies at caps 48 and 128, then the table
    .venv/bin/python bench/padding_share.py --lengths /tmp/lengths.json   # the table again from saved lengths

Replies: the real SmolLM2-135M-Instruct ("smollm2", offline) in bf16 samples `--batches` batches of 16 replies to
bench/common.py's 16 prompts (the prompts every timed comparison in bench/HISTORY.md uses) at temperature 0.7, once
per cap; their token lengths are saved (`--save`) and every number below is counted from them.

What is counted (positions = token rows through the transformer body; the LM head is counted separately):
* generation: HF `generate` over the whole batch, prompts left-padded. Prefill: rows x longest prompt. Decode: every
  row is stepped until the longest reply ends, so a step spends a row on a reply that has already ended ("finished
  rows still decoded"). Real work: each prompt once, each reply token but the last fed back once.
* scoring: the policy (log pi_old), the reference and the value model run over right-padded chunks of
  `score_batch_size` rows, each chunk trimmed to its own longest sequence (`per_token_in_chunks`); the reward
  model over its re-tokenised conversations in chunks of the same size, trimmed likewise.
* update: `epochs` passes of shuffled minibatches (`torch.randperm`), each split into micro-batches trimmed to
  their own longest sequence: the expectation over `--shuffles` random orders.
* LM head: the log-prob passes run the head from the first position that is a reply token in some row
  (`first_reply_position`) to the chunk's width; real work: the positions from there whose next token is real.

Configurations: SmolLM2 batch 16 / minibatch 8 (micro-batch 8 and 4, scoring over the whole batch: bench/HISTORY.md's
runs); the GPU check's Qwen2.5-0.5B shape, batch 32 / minibatch 16 / micro-batch 8, scoring over the batch. The
Qwen-shaped model has random weights and never emits EOS, so as benchmarked every reply is exactly the cap (only
the prompts pad; the reward model's rows are counted as prompt + cap + 1 tokens); a real instruct model's replies
are not all at the cap, so the "stand-in" rows take SmolLM2's real replies at the same cap in place of
Qwen2.5-0.5B-Instruct's (two SmolLM2 batches make one batch of 32): an estimate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


# ------------------------------------------------------------------------------------------ sampling replies
def sample_lengths(caps: list[int], batches: int, seed: int) -> dict:
    """{"prompt": [...], "caps": {cap: [{"reply": [...], "reward": [...], "finished": [...]}, ...]}} token lengths."""
    import torch
    from common import PROMPTS

    from ppo_rlhf.models.chat import conversation_ids
    from ppo_rlhf.models.loading import load_causal_lm, load_tokenizer, resolve_model_path
    from ppo_rlhf.models.rollout import generate_rollout

    path = resolve_model_path("smollm2")
    tokenizer = load_tokenizer(path)
    policy = load_causal_lm(path, torch.bfloat16, False)  # the start policy: LoRA's B = 0 leaves it unchanged
    out: dict = {"prompts": PROMPTS, "caps": {}}
    for cap in caps:
        torch.manual_seed(seed)
        rows = []
        for _ in range(batches):
            rollout = generate_rollout(policy, tokenizer, PROMPTS, cap, temperature=0.7)
            rows.append({"prompt": [len(p) for p in rollout.prompt_ids], "reply": [len(r) for r in rollout.reply_ids],
                         "reward": [len(conversation_ids(tokenizer, p, r))
                                    for p, r in zip(rollout.prompts, rollout.reply_texts)],
                         "finished": rollout.finished.tolist()})
            print(f"cap {cap}: mean reply {np.mean(rows[-1]['reply']):.1f} tokens, "
                  f"finished {np.mean(rows[-1]['finished']):.2f}", flush=True)
        out["caps"][str(cap)] = rows
    return out


# ------------------------------------------------------------------------------------------------- counting
def chunked(lengths: np.ndarray, size: int) -> tuple[float, float]:
    """(positions run, real positions) of right-padded chunks of `size` rows, each trimmed to its longest row."""
    run = sum(len(c) * c.max() for c in (lengths[i : i + size] for i in range(0, len(lengths), size)))
    return float(run), float(lengths.sum())


def head_chunked(prompt: np.ndarray, total: np.ndarray, size: int) -> tuple[float, float]:
    """(LM-head positions run, positions with a real next token from the chunk's first reply position)."""
    run = real = 0.0
    for i in range(0, len(total), size):
        p, t = prompt[i : i + size], total[i : i + size]
        first = p.min() - 1
        run += len(t) * (t.max() - 1 - first)
        real += float((t - 1 - first).sum())
    return run, real


def count(batch: dict, minibatch: int, micro: int, score_size: int, epochs: int, shuffles: int,
          rng: np.random.Generator) -> dict[str, tuple[float, float]]:
    """(run, real) positions per phase for one batch of lengths."""
    prompt, reply, reward = (np.asarray(batch[k]) for k in ("prompt", "reply", "reward"))
    total = prompt + reply
    b = len(prompt)
    prefill = (b * prompt.max(), prompt.sum())
    decode = (b * (reply.max() - 1), (reply - 1).sum())
    scoring_one = chunked(total, score_size)  # one of the three passes over the rollout's layout
    scoring_reward = chunked(reward, score_size)
    scoring = (3 * scoring_one[0] + scoring_reward[0], 3 * scoring_one[1] + scoring_reward[1])
    head_score = head_chunked(prompt, total, score_size)
    update_run = update_real = head_run = head_real = 0.0
    for _ in range(shuffles):
        for _epoch in range(epochs):
            order = rng.permutation(b)
            for start in range(0, b, minibatch):
                rows = order[start : start + minibatch]
                run, real = chunked(total[rows], micro)
                h_run, h_real = head_chunked(prompt[rows], total[rows], micro)
                update_run, update_real = update_run + run, update_real + real
                head_run, head_real = head_run + h_run, head_real + h_real
    update = (update_run / shuffles, update_real / shuffles)
    head_update = (head_run / shuffles, head_real / shuffles)
    return {"prefill": prefill, "decode": decode, "scoring": scoring, "update": update,
            "head_score": head_score, "head_update": head_update}


def share(parts: list[dict], key: str) -> float:
    run = sum(p[key][0] for p in parts)
    real = sum(p[key][1] for p in parts)
    return 1.0 - real / run


def table(data: dict, shuffles: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    print("| configuration | replies | mean reply / cap | finished | generation: prefill / decode | scoring | update "
          "| LM head: scoring / update |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for cap, batches in data["caps"].items():
        cap = int(cap)
        finished = np.concatenate([b["finished"] for b in batches])
        pairs = [{k: batches[i][k] + batches[i + 1][k] for k in ("prompt", "reply", "reward")}
                 for i in range(0, len(batches) - 1, 2)]
        at_cap = [{"prompt": b["prompt"] * 2, "reply": [cap] * 32, "reward": [p + cap + 1 for p in b["prompt"] * 2]}
                  for b in batches[:1]]
        configs = []
        if cap == 48:
            configs += [("SmolLM2 b16/8, micro 8, score 16", batches, 8, 8, 16),
                        ("SmolLM2 b16/8, micro 4, score 16", batches, 8, 4, 16)]
        configs += [(f"Qwen shape b32/16, micro 8, score 32, random weights (every reply = cap {cap})", at_cap, 16, 8,
                     32),
                    ("Qwen shape b32/16, micro 8, score 32, SmolLM2's replies as a stand-in", pairs, 16, 8, 32)]
        for name, rows, minibatch, micro, score_size in configs:
            parts = [count(r, minibatch, micro, score_size, 2, shuffles, rng) for r in rows]
            lengths = np.concatenate([r["reply"] for r in rows])
            done = "0.00" if "random" in name else f"{finished.mean():.2f}"
            print(f"| {name} | {len(lengths)} | {lengths.mean():.1f} / {cap} | {done} "
                  f"| {share(parts, 'prefill'):.1%} / {share(parts, 'decode'):.1%} | {share(parts, 'scoring'):.1%} "
                  f"| {share(parts, 'update'):.1%} "
                  f"| {share(parts, 'head_score'):.1%} / {share(parts, 'head_update'):.1%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--caps", default="48,128", help="comma-separated reply caps to sample at")
    parser.add_argument("--batches", type=int, default=4, help="batches of 16 replies per cap (even: pairs make 32)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shuffles", type=int, default=200, help="random minibatch orders averaged in the update")
    parser.add_argument("--save", help="write the sampled lengths here (JSON)")
    parser.add_argument("--lengths", help="count from lengths saved by --save instead of sampling")
    args = parser.parse_args()
    if args.lengths:
        data = json.loads(Path(args.lengths).read_text())
    else:
        data = sample_lengths([int(c) for c in args.caps.split(",")], args.batches, args.seed)
        if args.save:
            Path(args.save).write_text(json.dumps(data))
    table(data, args.shuffles, args.seed)


if __name__ == "__main__":
    main()
