"""Reply tokens per second of today's generation (HF `generate`: finished rows are stepped with pad until the longest
reply ends) against the decode loop that drops finished rows from the batch and its KV cache
(`generation_drop_finished`, ppo_rlhf/models/decode.py), side by side in one process, alternating which goes first.

    .venv/bin/python bench/generation_drop.py                      # SmolLM2, batch 8, 32, 64, caps 48 and 128
    .venv/bin/python bench/generation_drop.py --model /tmp/tiny --rounds 1 --batches 2 --caps 4   # a dry run

What one measurement is: `rollout.generate_rollout` of `batch` prompts (bench/common.py's 16 prompts, repeated to
fill the batch) at temperature 0.7, log-probs recorded (as the trainer samples), the whole batch in one call; the
seconds of the call and its reply tokens (EOS included). Each round runs every (cap, batch) once per side with the
same seed, today's first in even rounds and the new loop first in odd ones; both sides draw the same random numbers,
so in float32 they write the same replies (in bf16 the logits of a smaller batch round differently and replies can
part ways; the "same replies" column counts the rows that stayed equal). Per configuration it prints the median
tokens/s of each side, the median of the rounds' new/today time ratios (< 1: the new loop is faster), and the share
of today's decode row-steps spent on finished rows (1 - sum(reply - 1) / (batch x (longest reply - 1)), as
bench/padding_share.py counts it). The model runs in `--dtype` (auto: bf16 where the CPU has native bf16, else fp32)
with torch's default threads: run it on a quiet machine.

Last run (2026-12-05 11:46-12:03 UTC, AVX2-only AMD EPYC, fp32, `--rounds 2`): drop/today time 0.75-0.96 at every
batch and cap, 415 of 416 replies the same tokens (bench/HISTORY.md, 2026-12-05, on an AVX2-only CPU).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts OpenMP (see bench/HISTORY.md)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def finished_share(lengths: list[int]) -> float:
    """The share of decode row-steps (forwards after the prefill) that step a reply which already ended."""
    steps = max(lengths) - 1
    return 0.0 if steps == 0 else 1.0 - sum(n - 1 for n in lengths) / (len(lengths) * steps)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 (offline) or a model folder")
    parser.add_argument("--batches", default="8,32,64", help="comma-separated batch sizes")
    parser.add_argument("--caps", default="48,128", help="comma-separated reply caps")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each runs every configuration on both sides")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    import torch
    from common import PROMPTS

    from ppo_rlhf.models.loading import load_causal_lm, load_tokenizer, resolve_model_path
    from ppo_rlhf.models.precision import describe_dtype, resolve_dtype
    from ppo_rlhf.models.rollout import generate_rollout

    path = resolve_model_path(args.model)
    tokenizer = load_tokenizer(path)
    policy = load_causal_lm(path, resolve_dtype(args.dtype, torch.device("cpu")))
    batches = [int(b) for b in args.batches.split(",")]
    caps = [int(c) for c in args.caps.split(",")]
    print(f"model {args.model}, dtype {describe_dtype(args.dtype, torch.device('cpu'))}, "
          f"threads {torch.get_num_threads()}, rounds {args.rounds}", flush=True)

    def run(prompts: list[str], cap: int, drop: bool, seed: int):
        torch.manual_seed(seed)
        start = time.perf_counter()
        rollout = generate_rollout(policy, tokenizer, prompts, cap, 0.7, record_logprobs=True, drop_finished=drop)
        return time.perf_counter() - start, rollout

    run(PROMPTS[:2], 4, False, 0), run(PROMPTS[:2], 4, True, 0)  # warm-up: first calls pay one-off costs
    sides = ("today", "drop")
    results: dict = {}
    for round_ in range(args.rounds):
        for cap in caps:
            for batch in batches:
                prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
                seed = args.seed + round_
                runs = {}
                for side in sides if round_ % 2 == 0 else sides[::-1]:
                    runs[side] = run(prompts, cap, side == "drop", seed)
                entry = results.setdefault((cap, batch), {"today": [], "drop": [], "ratio": [], "share": [],
                                                          "same": [0, 0]})
                for side, (seconds, rollout) in runs.items():
                    entry[side].append(int(rollout.reply_lengths.sum()) / seconds)
                entry["ratio"].append(runs["drop"][0] / runs["today"][0])
                entry["share"].append(finished_share(runs["today"][1].reply_lengths.tolist()))
                same = [a == b for a, b in zip(runs["today"][1].reply_ids, runs["drop"][1].reply_ids)]
                entry["same"] = [entry["same"][0] + sum(same), entry["same"][1] + len(same)]
                print(f"round {round_} cap {cap} batch {batch}: today {entry['today'][-1]:.1f} tok/s, drop "
                      f"{entry['drop'][-1]:.1f} tok/s, time ratio {entry['ratio'][-1]:.2f}, finished row-steps "
                      f"{entry['share'][-1]:.0%}", flush=True)
    print("\n| cap | batch | today tok/s | drop tok/s | drop/today time | finished row-steps | same replies |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (cap, batch), entry in results.items():
        print(f"| {cap} | {batch} | {statistics.median(entry['today']):.1f} | {statistics.median(entry['drop']):.1f} "
              f"| {statistics.median(entry['ratio']):.2f} | {statistics.mean(entry['share']):.0%} "
              f"| {entry['same'][0]}/{entry['same'][1]} |")
    return results


if __name__ == "__main__":
    main()
